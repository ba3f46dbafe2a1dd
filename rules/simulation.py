"""Synthetic studies for the decision rules: does a rule's lower bound cover the truth at >= 1 - alpha,
and how often does it conclude? (`tests/test_rules.py` at a fixed seed; `benchmarks/decision_rules.py`
prints power against seeds and items.)

A study: S seeds x n items. Seed s draws its own effect delta_s = delta + run_sd * N(0, 1) (the
run-to-run spread), then each item's pair of 0/1 outcomes from the four cells (right under both,
only the treatment, only the baseline, neither) with P(only treatment) - P(only baseline) =
delta_s and P(discordant) = `discordance`. The truth a seed-aware rule's lower bound must cover is
delta (the difference over runs); a rule that reads the checkpoints it was given covers the mean
of that study's delta_s.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rules.base import SeededPairs

BOTH_RIGHT = 0.55  # P(right under both): GSM8K at ~0.66 accuracy with ~16 % discordant items


@dataclass(frozen=True)
class Simulated:
    method: str
    seeds: int
    items: int
    true_diff: float
    run_sd: float
    studies: int
    coverage: float  # P(lower <= the rule's truth)
    p_noninferior: float
    p_inferior: float

    @property
    def p_conclusive(self) -> float:
        return self.p_noninferior + self.p_inferior

    def coverage_se(self) -> float:
        return float(np.sqrt(max(self.coverage * (1 - self.coverage), 1e-12) / self.studies))


def draw_study(rng: np.random.Generator, *, seeds: int, items: int, true_diff: float, run_sd: float,
               discordance: float = 0.16) -> tuple[SeededPairs, float]:
    """One synthetic study's pairs, and the mean of its seeds' own effects."""
    delta_S = true_diff + run_sd * rng.standard_normal(seeds)
    delta_S = np.clip(delta_S, -discordance, discordance)
    only_t_S, only_b_S = (discordance + delta_S) / 2, (discordance - delta_S) / 2
    u_S_N = rng.random((seeds, items))
    only_t = u_S_N < only_t_S[:, None]
    only_b = (u_S_N >= only_t_S[:, None]) & (u_S_N < (only_t_S + only_b_S)[:, None])
    both = (u_S_N >= discordance) & (u_S_N < discordance + BOTH_RIGHT)
    t_S_N = (only_t | both).astype(np.float64)
    b_S_N = (only_b | both).astype(np.float64)
    pairs = SeededPairs(tuple(range(seeds)), tuple(f"{i:06d}" for i in range(items)), t_S_N, b_S_N)
    return pairs, float(delta_S.mean())


def simulate(rule, settings=None, *, seeds: int, items: int, true_diff: float, run_sd: float, studies: int,
             alpha: float = 0.05, margin: float = -0.03, discordance: float = 0.16, rng_seed: int = 0) -> Simulated:
    """`studies` synthetic studies read by `rule` (an `rules.base.Rule`) at level alpha."""
    settings = settings or rule.settings()
    rng = np.random.default_rng(rng_seed)
    covered = noninferior = inferior = 0
    for _ in range(studies):
        pairs, checkpoints = draw_study(rng, seeds=seeds, items=items, true_diff=true_diff, run_sd=run_sd,
                                        discordance=discordance)
        reading = rule.read(pairs, alpha=alpha, margin=margin, settings=settings)
        truth = true_diff if rule.seed_aware else checkpoints
        covered += reading.lower <= truth
        noninferior += reading.verdict == "noninferior"
        inferior += reading.verdict == "inferior"
    return Simulated(rule.method, seeds, items, true_diff, run_sd, studies, covered / studies, noninferior / studies,
                     inferior / studies)
