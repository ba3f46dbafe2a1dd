"""Benchmark: each decision rule's coverage and power over synthetic studies, against seeds and items.

    python benchmarks/decision_rules.py [--studies 1000] [--bootstrap-studies 200] [--seeds 1,3,5,8,16]
                                        [--items 200,1319] [--run-sd 0.0167,0.04] [--true-diff -0.01]

Prints a table: for every rule (rules.registry) at every seed count it can read, item count and
run-level spread, the share of studies whose lower bound covers the rule's truth (the difference
over runs for a seed-aware rule, the study's own checkpoints' otherwise), the share concluding
noninferior at the -0.03 margin and alpha 0.05 (simulated, and the rule's analytic `power` before
any GPU time), and the seconds taken. The studies are `rules.simulation`'s (16 % discordant
items); run_sd 0.0167 is the measured spread's run-level part (`rules.power`).
"""

from __future__ import annotations

import argparse
import math
import time

from rules import RULES
from rules.power import PowerDesign
from rules.simulation import simulate


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",")]


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--studies", type=int, default=1000)
    parser.add_argument("--bootstrap-studies", type=int, default=200)
    parser.add_argument("--bootstrap-resamples", type=int, default=400)
    parser.add_argument("--seeds", type=_ints, default=[1, 3, 5, 8, 16])
    parser.add_argument("--items", type=_ints, default=[200, 1319])
    parser.add_argument("--run-sd", type=_floats, default=[0.0167, 0.04])
    parser.add_argument("--true-diff", type=_floats, default=[-0.01])
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--margin", type=float, default=-0.03)
    args = parser.parse_args()

    print("| rule | seeds | items | run SD | true diff | studies | coverage (SE) | P(noninferior) simulated | "
          "P(noninferior) analytic | seconds |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for method, rule in RULES.items():
        bootstrap = "n_resamples" in rule.own_spec_keys  # a resampling rule: fewer studies, fewer resamples
        settings = rule.settings(n_resamples=args.bootstrap_resamples) if bootstrap else rule.settings()
        studies = args.bootstrap_studies if bootstrap else args.studies
        for seeds in args.seeds:
            if rule.seeds_problem(seeds) is not None:
                continue
            for items in args.items:
                for run_sd in args.run_sd:
                    # the power model's design with this run-level spread at these items
                    design = PowerDesign(n_eval=items, between_seed_sd=math.sqrt(run_sd ** 2 + 0.16 / items), item_sd=0.4)
                    for true_diff in args.true_diff:
                        start = time.perf_counter()
                        sim = simulate(rule, settings, seeds=seeds, items=items, true_diff=true_diff, run_sd=run_sd,
                                       studies=studies, alpha=args.alpha, margin=args.margin, rng_seed=seeds * 1000 + items)
                        seconds = time.perf_counter() - start
                        analytic, _ = rule.power(design, true_diff, items, seeds, args.alpha, args.margin, (0.0, 1.0),
                                                 settings)
                        print(f"| {method} | {seeds} | {items} | {run_sd:g} | {true_diff:+g} | {studies} | "
                              f"{sim.coverage:.3f} ({sim.coverage_se():.3f}) | {sim.p_noninferior:.3f} | {analytic:.3f} | "
                              f"{seconds:.1f} |", flush=True)


if __name__ == "__main__":
    main()
