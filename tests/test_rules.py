"""The decision rules (`rules/`): each against its independent reference, the committed decisions
recomputed to the bit, a seeded simulation of coverage and power, the power reading and its CLI,
the secondary readings of a units folder, and the one-line refusals. Fast tier: no model, no flow."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rules import RULES, SeededPairs, rule_for
from rules.power import PowerDesign
from rules.simulation import draw_study, simulate

ROOT = Path(__file__).resolve().parents[1]


def _pairs(rng, seeds: int, items: int, true_diff=-0.01, run_sd=0.0167) -> SeededPairs:
    return draw_study(rng, seeds=seeds, items=items, true_diff=true_diff, run_sd=run_sd)[0]


def _readable(rule, seeds) -> int:
    """The first seed count in `seeds` the rule reads."""
    return next(s for s in seeds if rule.seeds_problem(s) is None)


# ------------------------------------------------------------------ each rule against its reference


@pytest.mark.parametrize("method", list(RULES))
@pytest.mark.parametrize("items", [64, 1319])  # the demo's eval items and the user's
def test_each_rule_agrees_with_its_independent_reference(method, items):
    rule = rule_for(method)
    rng = np.random.default_rng(items)
    for seeds in {_readable(rule, (1, 3)), _readable(rule, (8, 1))}:
        pairs = _pairs(rng, seeds, items if method != "hierarchical_bootstrap" else min(items, 64))
        settings = rule.settings(**({"n_resamples": 2000, "rng_seed": 5} if method == "hierarchical_bootstrap" else {}))
        for alpha, margin in ((0.05, -0.03), (0.01, 0.0)):
            reading = rule.read(pairs, alpha=alpha, margin=margin, settings=settings)
            ref = rule.reference(pairs.treatment_S_N.tolist(), pairs.baseline_S_N.tolist(), alpha=alpha, margin=margin,
                                 bounds=(0.0, 1.0), settings=settings)
            # Monte Carlo against Monte Carlo (two generators): within a few resampling SEs; exact otherwise
            tol = 4 * float(np.std(pairs.seed_means())) / math.sqrt(seeds) / math.sqrt(2000) + 0.006 \
                if ref.get("monte_carlo") else 1e-7
            p_tol = 0.03 if ref.get("monte_carlo") else 1e-7
            assert reading.lower == pytest.approx(ref["lower"], abs=tol), (method, seeds, alpha)
            assert reading.upper == pytest.approx(ref["upper"], abs=tol), (method, seeds, alpha)
            assert reading.p_noninferior == pytest.approx(ref["p_noninferior"], abs=p_tol)
            assert reading.p_inferior == pytest.approx(ref["p_inferior"], abs=p_tol)
            assert reading.lower <= reading.mean_diff <= reading.upper or method == "hierarchical_bootstrap"
            # the verdict and the p-values tell the same story at level alpha
            assert (reading.verdict == "noninferior") == (reading.p_noninferior < alpha) or \
                abs(reading.p_noninferior - alpha) < 2e-3


def test_the_bootstrap_is_pinned_by_its_spec_seed():
    rule = rule_for("hierarchical_bootstrap")
    pairs = _pairs(np.random.default_rng(1), 4, 100)
    a = rule.read(pairs, alpha=0.05, margin=-0.03, settings=rule.settings(n_resamples=500, rng_seed=3))
    b = rule.read(pairs, alpha=0.05, margin=-0.03, settings=rule.settings(n_resamples=500, rng_seed=3))
    c = rule.read(pairs, alpha=0.05, margin=-0.03, settings=rule.settings(n_resamples=500, rng_seed=4))
    assert a == b and (a.lower, a.upper) != (c.lower, c.upper)


def test_the_seed_t_rule_reads_the_seeds_not_the_items():
    """Three seeds whose mean differences are -0.02, 0.00, +0.02 over any number of items: the bound
    is Student's at df 2 around their mean, whatever the item count."""
    rule = rule_for("paired_seed_t")
    for items in (50, 1000):
        t = np.zeros((3, items))
        b = np.zeros((3, items))
        k = items // 50
        t[0, :k] = 0  # seed 0: -k/items
        b[0, :k] = 1
        t[2, :k] = 1  # seed 2: +k/items
        pairs = SeededPairs((0, 1, 2), tuple(map(str, range(items))), t, b)
        reading = rule.read(pairs, alpha=0.05, margin=-0.03)
        half = 2.919986 * 0.02 / math.sqrt(3)  # t(0.95; 2) * sd / sqrt(3)
        assert reading.lower == pytest.approx(-half, abs=1e-5) and reading.upper == pytest.approx(half, abs=1e-5)
        assert reading.details["df"] == 2


def test_the_score_test_is_tighter_than_hoeffding_and_exact_on_a_hand_case():
    """b = 10 items right only under the treatment, c = 30 only under the baseline, n = 200: the
    restricted MLE at D = -0.03 solves 400 q^2 + B q + C = 0 by hand."""
    b, c, n = 10, 30, 200
    t = np.array([1] * b + [0] * c + [1] * 100 + [0] * (n - b - c - 100), dtype=float)
    s = np.array([0] * b + [1] * c + [1] * 100 + [0] * (n - b - c - 100), dtype=float)
    pairs = SeededPairs.one_seed(t, s)
    delta = -0.03
    big_b = -(b + c) + delta * (2 * n - b + c)
    big_c = -c * delta * (1 - delta)
    q = (-big_b + math.sqrt(big_b ** 2 - 8 * n * big_c)) / (4 * n)
    z = (b - c - n * delta) / math.sqrt(n * (2 * q + delta * (1 - delta)))
    score = rule_for("paired_score").read(pairs, alpha=0.05, margin=delta)
    hoeffding = rule_for("paired_hoeffding").read(pairs, alpha=0.05, margin=delta)
    assert score.p_inferior == pytest.approx(0.5 * math.erfc(-z / math.sqrt(2)), abs=1e-12)
    assert hoeffding.lower < score.lower < score.mean_diff < score.upper < hoeffding.upper
    with pytest.raises(ValueError, match="0/1"):
        rule_for("paired_score").read(SeededPairs.one_seed([0.5, 1.0], [1.0, 0.0]), alpha=0.05, margin=-0.03)


# --------------------------------------------------------- the committed decisions, recomputed to the bit


def test_the_committed_family_decision_recomputes_bit_for_bit():
    """results/h200-comparison's twelve units decided again by the decision stage's code: every
    verdict, bound, p-value and descriptive number equals decision.json's."""
    from design.plan import plan_from_spec
    from design.spec import load_spec
    from schemas.layout import UnitsLayout
    from decision.records import family_record

    folder = UnitsLayout(ROOT / "results" / "h200-comparison")
    plan = plan_from_spec(load_spec(folder.root / "spec_revised.json"))
    every = plan.units()
    record = family_record([str(folder.eval_jsonl(u.unit)) for u in every], [(u.name, u.order_seed) for u in every],
                           plan.decision, {"treatment": plan.run.treatment, "baseline": plan.run.baseline})
    committed = json.loads(folder.decision.json.read_text())
    keys = ("verdict", "n", "seeds", "mean_diff", "lower", "upper", "p_noninferior", "p_inferior", "holm_p_noninferior",
            "holm_p_inferior", "holm_level", "holm_lower", "holm_upper", "treatment_mean", "baseline_mean",
            "bootstrap_lower", "bootstrap_upper", "mean_diff_by_seed")
    assert len(record["comparisons"]) == len(committed["comparisons"]) == 5
    for mine, theirs in zip(record["comparisons"], committed["comparisons"]):
        assert {k: mine[k] for k in keys} == {k: theirs[k] for k in keys}, mine["arm"]
        assert mine["noninferior_threshold"] == theirs.get("noninferior_threshold", theirs.get("min_noninferior_true_diff"))
        assert mine["method"] == "paired_hoeffding"


def test_the_committed_single_run_decision_recomputes_bit_for_bit():
    """results/h200-gsm8k/run: the two-arm decision stage's record from its own eval files and plan."""
    from design.plan import RunPlan
    from rl.stats import paired_decision

    run = ROOT / "results" / "h200-gsm8k" / "run"
    plan = RunPlan.model_validate_json((run / "spec" / "plan.json").read_text())
    d = plan.decision
    record = paired_decision(run / "eval" / plan.run.treatment / "eval.jsonl", run / "eval" / plan.run.baseline / "eval.jsonl",
                             alpha=d.alpha, margin=d.margin, bounds=tuple(d.bounds), rule=d.rule, design=d.power)
    committed = json.loads((run / "decision" / "decision.json").read_text())
    for key in ("verdict", "n", "mean_diff", "lower", "upper", "treatment_mean", "baseline_mean", "mcnemar_p",
                "bootstrap_lower", "bootstrap_upper"):
        assert record[key] == committed[key], key
    assert record["noninferior_threshold"] == committed["min_noninferior_true_diff"]


# ------------------------------------------------------------------ the simulation: coverage and power


# (method, seeds, items, studies, settings): the user's items where the rule is cheap to read
SIMULATED = [
    ("paired_hoeffding", 1, 1319, 2000, {}),
    ("paired_score", 1, 1319, 2000, {}),
    ("paired_seed_t", 3, 1319, 2000, {}),
    ("paired_seed_t", 8, 1319, 2000, {}),
    ("hierarchical_bootstrap", 5, 200, 400, {"n_resamples": 400}),
]


@pytest.mark.parametrize("method,seeds,items,studies,fields", SIMULATED)
def test_each_rules_lower_bound_covers_the_truth(method, seeds, items, studies, fields):
    """Synthetic studies at the pre-registered spread (between-seed SD 0.02 at 1,319 items): each
    rule's lower bound at alpha 0.05 lies below its truth in >= 95 % of them, within Monte Carlo
    error; seed-aware rules cover the difference over runs, the others these checkpoints'."""
    rule = rule_for(method)
    design = PowerDesign(n_eval=1319)
    sim = simulate(rule, rule.settings(**fields), seeds=seeds, items=items, true_diff=-0.01, run_sd=design.run_sd(),
                   studies=studies, rng_seed=11)
    assert sim.coverage >= 0.95 - 2.5 * sim.coverage_se(), sim


def test_the_bootstrap_is_optimistic_where_the_run_spread_dominates():
    """The documented limit: three seeds, a run-level SD of 0.06 against the items' 0.02 at 400
    items: the percentile bootstrap covers clearly less than 95 %, the seed-t rule does not."""
    boot, seed_t = rule_for("hierarchical_bootstrap"), rule_for("paired_seed_t")
    kw = dict(seeds=3, items=400, true_diff=-0.01, run_sd=0.06, rng_seed=2)
    sim = simulate(boot, boot.settings(n_resamples=300), studies=400, **kw)
    assert sim.coverage < 0.95 - 2 * sim.coverage_se()
    assert simulate(seed_t, studies=2000, **kw).coverage >= 0.95 - 2.5 * 0.005


@pytest.mark.parametrize("method,seeds", [("paired_seed_t", 8), ("paired_hoeffding", 1), ("paired_score", 1)])
def test_the_power_reading_matches_the_simulated_power(method, seeds):
    """`Rule.power` (analytic, before any GPU time) against the share of simulated studies that
    conclude noninferior, at the user's items and the pre-registered spread."""
    rule = rule_for(method)
    design = PowerDesign(n_eval=1319)
    true_diff = 0.02 if method != "paired_seed_t" else -0.01  # where each rule has power worth checking
    sim = simulate(rule, seeds=seeds, items=1319, true_diff=true_diff, run_sd=design.run_sd(), studies=1500, rng_seed=7)
    analytic, _ = rule.power(design, true_diff, 1319, seeds, 0.05, -0.03, (0.0, 1.0), rule.settings())
    assert sim.p_noninferior == pytest.approx(analytic, abs=0.05), (sim, analytic)


# ------------------------------------------------------------------ gs1 power, validate, decide --rule


def _gs1(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gs1", *map(str, args)], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)


def test_gs1_power_of_the_users_spec_names_its_threshold():
    out = _gs1("power", "specs/gs1_vs_grpo_gsm8k.json", "--json")
    assert out.returncode == 0, out.stderr
    reading = json.loads(out.stdout)
    assert reading["noninferior_threshold"] == pytest.approx(-0.03 + math.sqrt(2 * math.log(20) / 1319), abs=1e-12)
    assert round(reading["noninferior_threshold"], 4) == 0.0374
    assert [p["true_diff"] for p in reading["power"]] == [0.0, -0.015]
    assert reading["power"][0]["p_conclusive"] < 0.05  # at 1,319 items the rule cannot resolve a tie
    assert {(c["seeds"], c["items"]) for c in reading["design"]} == {(s, 1319) for s in (1, 2, 4, 8, 16)}
    assert "three full seed-0 runs" in reading["assumptions"]["source"]
    text = _gs1("power", "specs/gs1_vs_grpo_gsm8k.json", "--rule", "paired_seed_t", "--items", "500,1319")
    assert text.returncode == 0 and "needs at least 3 seeds" in text.stdout
    assert re.search(r"\| 8 \| 1319 \| -0\.0\d+ \|", text.stdout)


@pytest.mark.parametrize("name,items", [("gsm8k_gs1_vs_grpo_seeds", ()), ("basic_arithmetic_gs1_vs_grpo", (1319, 2000, 4000, 8000))])
def test_the_seeds_specs_are_sized_by_their_power_tables(name, items):
    """specs/gsm8k_gs1_vs_grpo_seeds.json and specs/basic_arithmetic_gs1_vs_grpo.json: paired_seed_t
    concludes at the -0.03 margin with >= 80 % power at a true -0.01 (at Holm's first level over the
    two compared arms), one seed fewer would not; each committed power table is what `gs1 power`
    prints now."""
    from design.plan import DecisionPlan
    from design.spec import load_spec

    spec = ROOT / "specs" / f"{name}.json"
    reading = json.loads(_gs1("power", spec, "--json").stdout)
    assert reading["method"] == "paired_seed_t" and reading["compared"] == 2
    at = {p["true_diff"]: p for p in reading["power"]}
    assert at[-0.01]["p_conclusive"] >= 0.8 and reading["gate_passed"] is True
    rule = rule_for("paired_seed_t")
    design = DecisionPlan.of_spec(load_spec(spec)).power
    fewer, _ = rule.power(design, -0.01, reading["n"], reading["seeds"] - 1, reading["level"], -0.03, (0, 1),
                          rule.settings())
    assert fewer < 0.8
    committed = (ROOT / "specs" / f"{name}.power.md").read_text()
    args = ("--items", ",".join(map(str, items))) if items else ()
    assert _gs1("power", spec, *args).stdout.split("\n", 1)[1] in committed


def test_the_basic_arithmetic_spread_keeps_the_gsm8k_run_level_part():
    """The basic_arithmetic spec restates GSM8K's measured spread (0.02 at 1,319 items) at its own
    4,000 items: the same run-level part, so at 1,319 items its design table reads 0.02 again."""
    from design.plan import DecisionPlan
    from design.spec import load_spec

    design = DecisionPlan.of_spec(load_spec(ROOT / "specs" / "basic_arithmetic_gs1_vs_grpo.json")).power
    measured = PowerDesign(n_eval=1319)
    assert design.n_eval == 4000 and design.run_sd() == pytest.approx(measured.run_sd(), abs=2e-4)
    assert design.seed_sd(1319) == pytest.approx(0.02, abs=2e-4)


@pytest.mark.parametrize("change,line", [
    ({"method": "t_test"}, "decision_rule.method: unsupported decision method 't_test'"),
    ({"method": "paired_seed_t"}, "decision_rule.seeds: paired_seed_t needs at least 3 seeds (got 1)"),
    ({"method": "hierarchical_bootstrap", "seeds": [0, 1, 2], "n_resamples": 0}, "decision_rule.n_resamples: must be >= 1"),
    ({"n_resamples": 100}, "decision_rule.n_resamples: read only by the hierarchical_bootstrap rule, not paired_hoeffding"),
    ({"method": "paired_score", "seeds": [0, 1]}, "decision_rule.seeds: paired_score reads one seed (got 2)"),
])
def test_a_bad_rule_is_one_line_naming_the_field(tmp_path, change, line):
    raw = json.loads((ROOT / "specs" / "gs1_vs_grpo_gsm8k.json").read_text())
    raw["decision_rule"].update(change)
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(raw))
    for command in ("validate", "power"):
        out = _gs1(command, path)
        assert out.returncode == 2 and out.stdout == "", command
        assert len(out.stderr.splitlines()) == 1 and line in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_decide_with_a_rule_that_needs_seeds_given_two_files_is_one_line(tmp_path):
    for name in ("t", "b"):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps({"item_id": i, "correct": i % 2 == 0}) + "\n"
                                                         for i in range(20)))
    out = _gs1("decide", "--treatment", tmp_path / "t.jsonl", "--baseline", tmp_path / "b.jsonl", "--rule", "paired_seed_t")
    assert out.returncode == 2 and out.stderr.strip() == (
        "gs1: error: --rule: paired_seed_t needs at least 3 seeds (got 1); two eval files are one seed "
        "(a units folder holds several)")
    out = _gs1("decide", "--treatment", tmp_path / "t.jsonl", "--baseline", tmp_path / "b.jsonl", "--rule", "nope")
    assert out.returncode == 2 and "unsupported decision method 'nope'" in out.stderr
    out = _gs1("decide", "--treatment", tmp_path / "t.jsonl", "--baseline", tmp_path / "b.jsonl", "--rule", "paired_score")
    assert out.returncode == 0 and json.loads(out.stdout)["method"] == "paired_score"


# ------------------------------------------------------------------ the secondary readings of a units folder


def _fake_units_folder(root: Path, spec: dict, n_items: int, rng_seed: int):
    """A made-up units folder (a fake, no training): every unit of the spec with random 0/1
    outcomes on n_items (the spec registering n_items) and a made-up training cost, each unit with its
    proof; returns the spec and its plan."""
    from decision.units import prove_unit
    from design.plan import plan_from_spec
    from design.spec import anchored, parse_spec
    from schemas.artifacts import write_artifact
    from schemas.cost import ArmCost

    spec["eval"]["n_examples"] = n_items  # the items the made-up units hold
    if (spec.get("feasibility") or {}).get("effective_config"):
        spec["feasibility"]["effective_config"]["n_eval"] = n_items
    parsed = parse_spec(anchored(spec, ROOT / "specs"))
    plan = plan_from_spec(parsed)
    rng = np.random.default_rng(rng_seed)
    for unit in plan.units():
        folder = root / unit.unit
        folder.mkdir(parents=True)
        correct = rng.random(n_items) < (0.6 if unit.name != plan.run.baseline else 0.62)
        (folder / "eval.jsonl").write_text("".join(json.dumps({"item_id": f"i{i}", "correct": bool(c)}) + "\n"
                                                   for i, c in enumerate(correct)))
        cost = ArmCost(arm=unit.name, seed=unit.order_seed, unit=unit.unit, steps=2, wall_seconds=10.0, sample_seconds=5.0,
                       train_seconds=5.0, sampler_tokens=1000, trainer_tokens=500, model_calls=8)
        write_artifact("arm_costs", [cost.model_dump()], folder / "costs.parquet")
        prove_unit(parsed, unit, folder, "fake-run", source="made up by the test")
    return parsed, plan


@pytest.mark.parametrize("seeds", [[0, 1], [0, 1, 2]])
def test_a_secondary_reading_is_labelled_and_never_the_decision(tmp_path, seeds):
    """`write_reading` under each rule the spec did not pre-register: a rule that reads one seed
    reads each seed apart; a seed-aware rule at two seeds reads nothing and says why; at three it
    reads the family. The reading's numbers are the rule's own on the same units."""
    from decision.units import _readings_section, check_units, units_reading, write_reading
    from schemas.layout import UnitsLayout
    from decision.records import family_record

    raw = json.loads((ROOT / "specs" / "gsm8k_comparison.json").read_text())
    raw["decision_rule"]["seeds"] = seeds
    spec, plan = _fake_units_folder(tmp_path, raw, 60, 1)
    folder = UnitsLayout(tmp_path)
    for method in ("paired_score", "paired_seed_t"):
        reading = units_reading(plan, check_units(spec, folder), method)
        write_reading(folder, reading)
        record, markdown = reading.record, reading.markdown
        assert markdown.startswith(f"# Secondary reading under {method} (not the decision)")
        assert record["secondary"] is True and record["decision_method"] == "paired_hoeffding"
        if method == "paired_score":
            assert [r["seeds"] for r in record["readings"]] == [[s] for s in seeds]
            one = [u for u in plan.units() if u.order_seed == seeds[-1]]
            decision = plan.decision.model_copy(update={"method": method, "rule": rule_for(method).settings()})
            alone = family_record([str(folder.eval_jsonl(u.unit)) for u in one], [(u.name, u.order_seed) for u in one],
                                  decision, {"treatment": plan.run.treatment, "baseline": plan.run.baseline})
            assert record["readings"][-1]["comparisons"] == json.loads(json.dumps(alone["comparisons"]))
        elif len(seeds) < 3:
            assert record["readings"] == [] and "needs at least 3 seeds" in record["why_not"]
            assert "1 degree(s) of freedom" in markdown
        else:
            assert record["readings"][0]["method"] == "paired_seed_t" and record["why_not"] is None
    section = _readings_section(folder)
    assert "not the decision" in section and "[paired_score](readings/paired_score/reading.md)" in section
    assert not (tmp_path / "decision").exists()  # a reading writes no decision


# ------------------------------------------------------------------ the bar: one owner per rule


def test_no_module_outside_the_rules_names_a_rule():
    """Every rule's name (and Hoeffding's) appears only in rules/: the rest of gs1 asks the registry."""
    names = [*RULES, "hoeffding", "tango"]
    offenders = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in ("tests", ".venv", "rules"):
            continue
        text = path.read_text().lower()
        offenders += [f"{rel}: {n}" for n in names if n.lower() in text]
    assert not offenders, offenders


def test_a_power_gate_reads_where_the_spec_says_and_only_there():
    """`PowerReading.gate_row`: no row without `min_power` (the numbers are recorded, nothing is
    stopped); with it, P(conclusive) at `power_difference` against the bound, passing exactly when
    the reading reaches it."""
    from design.plan import DecisionPlan
    from design.spec import parse_spec

    raw = json.loads((ROOT / "specs" / "gsm8k_gs1_vs_grpo_seeds.json").read_text())
    seeds = len(raw["decision_rule"]["seeds"])
    reading = DecisionPlan.of_spec(parse_spec(raw)).power_reading(None, seeds)
    row = reading.gate_row()
    assert row["metric"] == "power" and row["op"] == "min" and row["bound"] == "0.8" and row["passed"]
    assert row["value"] == reading.point(-0.01).p_conclusive >= 0.8
    raw["decision_rule"]["min_power"] = 0.9  # ten seeds do not reach 90 % at -0.01
    assert DecisionPlan.of_spec(parse_spec(raw)).power_reading(None, seeds).gate_row()["passed"] is False
    del raw["decision_rule"]["min_power"]
    assert DecisionPlan.of_spec(parse_spec(raw)).power_reading(None, seeds).gate_row() is None


def test_an_interim_folder_under_a_seed_aware_rule_shows_differences_without_bounds(tmp_path):
    """Made-up units (a fake, no training) of a three-seed paired_seed_t spec with seed 2 missing:
    each arm's interim difference over the two seeds in, no bounds (the rule needs three) and why,
    in the table, the answers and the plot; once seed 2 is in, the decision is the rule's."""
    import shutil

    from decision.units import check_units, units_standing, write_standing
    from schemas.layout import UnitsLayout

    raw = json.loads((ROOT / "specs" / "gsm8k_gs1_vs_grpo_seeds.json").read_text())
    raw["decision_rule"]["seeds"] = [0, 1, 2]
    spec, plan = _fake_units_folder(tmp_path, raw, 80, 4)
    kept = tmp_path.parent / "kept"
    for unit in ("grpo_gs8-s2", "gs1_kernel-s2", "batch_mean-s2"):
        shutil.move(tmp_path / unit, kept / unit)
    folder = UnitsLayout(tmp_path)
    standing = units_standing(plan, check_units(spec, folder))
    pair = {a.arm: a.pair for a in standing.arms}["gs1_kernel"]
    assert pair["verdict"] == "interim" and pair["lower"] is None and "needs at least 3 seeds" in pair["why_no_bounds"]
    want = np.mean([pair["mean_diff_by_seed"][s] for s in ("0", "1")])
    assert pair["mean_diff"] == pytest.approx(want, abs=1e-12)
    write_standing(plan, standing, folder)
    text = folder.comparison_md.read_text()
    assert "(no bounds yet: paired_seed_t needs at least 3 seeds (got 2))" in text and "seed-t bounds" in text
    assert (folder.plots_dir / "units_accuracy.png").is_file()
    for unit in ("grpo_gs8-s2", "gs1_kernel-s2", "batch_mean-s2"):
        shutil.move(kept / unit, tmp_path / unit)
    decision = units_standing(plan, check_units(spec, folder)).decision
    assert decision["method"] == "paired_seed_t" and decision["seeds"] == [0, 1, 2]
    assert decision["rule_details"]["df"] == 2 and decision["verdict"] in ("noninferior", "inferior", "inconclusive")
