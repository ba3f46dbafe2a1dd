"""Paired statistics against independent hand computations (no scipy: exact sums by hand)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from rl.stats import mcnemar_exact, paired_bootstrap_ci
from rules.paired_hoeffding import hoeffding_radius, noninferior_threshold, paired_hoeffding


def _binary_pairs(seed, n, p_t=0.7, p_b=0.72):
    rng = np.random.default_rng(seed)
    return (rng.random(n) < p_t).astype(float), (rng.random(n) < p_b).astype(float)


def test_hoeffding_matches_the_pinned_formula():
    t, b = _binary_pairs(0, 1319)
    out = paired_hoeffding(t, b, alpha=0.05, margin=-0.03)
    n = 1319
    mean = sum(ti - bi for ti, bi in zip(t, b)) / n
    radius = math.sqrt(2 * math.log(1 / 0.05) / n)
    assert out["n"] == n
    assert abs(out["mean_diff"] - mean) < 1e-15
    assert abs(out["lower"] - (mean - radius)) < 1e-15
    assert abs(out["upper"] - (mean + radius)) < 1e-15
    assert out["alpha"] == 0.05 and out["margin"] == -0.03
    assert abs(radius - 0.06740) < 1e-5  # sqrt(2 ln 20 / 1319)


@pytest.mark.parametrize(
    "n_better, n_worse, n, verdict",
    [
        (400, 0, 1000, "noninferior"),  # mean 0.4, radius ~0.077
        (0, 400, 1000, "inferior"),
        (10, 10, 1000, "inconclusive"),
    ],
)
def test_hoeffding_verdicts(n_better, n_worse, n, verdict):
    t = np.zeros(n)
    b = np.zeros(n)
    t[:n_better] = 1
    b[n_better : n_better + n_worse] = 1
    assert paired_hoeffding(t, b, alpha=0.05, margin=-0.03)["verdict"] == verdict


def test_hoeffding_boundary_is_strict():
    # lower exactly equal to the margin is not noninferior
    t = np.ones(8)
    b = np.ones(8)
    radius = hoeffding_radius(8, 0.05)
    assert paired_hoeffding(t, b, alpha=0.05, margin=-radius)["verdict"] == "inconclusive"


def test_hoeffding_general_bounds_scale_by_range():
    rng = np.random.default_rng(1)
    t, b = rng.uniform(2, 6, 50), rng.uniform(2, 6, 50)
    out = paired_hoeffding(t, b, alpha=0.1, margin=0.0, bounds=(2, 6))
    radius = 4 * math.sqrt(2 * math.log(10) / 50)
    assert abs(out["lower"] - (np.mean(t - b) - radius)) < 1e-13
    with pytest.raises(ValueError, match="bounds"):
        paired_hoeffding(t, b, alpha=0.1, margin=0.0, bounds=(0, 1))


def test_hoeffding_rejects_bad_input():
    with pytest.raises(ValueError):
        paired_hoeffding([1.0], [1.0, 0.0], alpha=0.05, margin=0)
    with pytest.raises(ValueError):
        paired_hoeffding([], [], alpha=0.05, margin=0)
    with pytest.raises(ValueError):
        paired_hoeffding([1.0], [0.0], alpha=1.5, margin=0)
    with pytest.raises(ValueError):
        paired_hoeffding([float("nan")], [0.0], alpha=0.05, margin=0)


def test_noninferior_threshold():
    for n in (10, 1319, 100000):
        want = -0.03 + math.sqrt(2 * math.log(20) / n)
        assert abs(noninferior_threshold(n, 0.05, -0.03) - want) < 1e-15
    # an observed difference just above it is called noninferior, just below it is not
    n = 400
    threshold = noninferior_threshold(n, 0.05, -0.03)
    k = math.ceil((threshold + 1e-9) * n)
    t = np.zeros(n)
    t[:k] = 1
    assert paired_hoeffding(t, np.zeros(n), alpha=0.05, margin=-0.03)["verdict"] == "noninferior"
    t[k - 1] = 0
    assert paired_hoeffding(t, np.zeros(n), alpha=0.05, margin=-0.03)["verdict"] != "noninferior"


def _mcnemar_by_hand(b, c):
    n = b + c
    if n == 0:
        return 1.0
    # two-sided exact: sum of the probabilities of outcomes as or less likely than the observed
    observed = Fraction(math.comb(n, b), 2**n)
    total = sum(Fraction(math.comb(n, k), 2**n) for k in range(n + 1) if Fraction(math.comb(n, k), 2**n) <= observed)
    return float(min(total, Fraction(1)))


@pytest.mark.parametrize("b, c", [(0, 0), (1, 0), (5, 5), (3, 11), (40, 25), (0, 9), (120, 90)])
def test_mcnemar_exact_against_hand_binomial(b, c):
    t = np.array([1] * b + [0] * c + [1] * 7 + [0] * 4, dtype=float)
    base = np.array([0] * b + [1] * c + [1] * 7 + [0] * 4, dtype=float)
    order = np.random.default_rng(b * 31 + c).permutation(len(t))
    out = mcnemar_exact(t[order], base[order])
    assert (out["b"], out["c"], out["n_discordant"]) == (b, c, b + c)
    assert abs(out["p_value"] - _mcnemar_by_hand(b, c)) < 1e-15


def test_mcnemar_known_values_and_non_binary():
    # b=0, c=6: p = 2 / 64
    out = mcnemar_exact([0] * 6, [1] * 6)
    assert out["p_value"] == 2 / 64
    with pytest.raises(ValueError):
        mcnemar_exact([0.5], [1.0])


def test_bootstrap_ci_is_seeded_and_matches_a_loop():
    t, b = _binary_pairs(2, 200)
    out = paired_bootstrap_ci(t, b, n_resamples=500, seed=3, chunk=64)
    again = paired_bootstrap_ci(t, b, n_resamples=500, seed=3, chunk=64)
    assert out == again
    # the same draws, taken one resample at a time
    rng = np.random.default_rng(3)
    diff = t - b
    means = []
    for start in range(0, 500, 64):
        index = rng.integers(0, 200, size=(min(64, 500 - start), 200))
        for row in index:
            means.append(sum(diff[j] for j in row) / 200)
    means.sort()
    # numpy's default (linear) quantile by hand
    def quantile(q):
        position = q * (len(means) - 1)
        lo = math.floor(position)
        return means[lo] + (means[min(lo + 1, len(means) - 1)] - means[lo]) * (position - lo)

    assert abs(out["low"] - quantile(0.025)) < 1e-12
    assert abs(out["high"] - quantile(0.975)) < 1e-12
    assert out["low"] <= np.mean(diff) <= out["high"]
    assert paired_bootstrap_ci(t, b, n_resamples=500, seed=4) != out


def test_paired_decision_record_from_maps_and_files(tmp_path):
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from rl.stats import paired_decision, read_eval_items
    from schemas.errors import EvalDataError

    t, b = _binary_pairs(6, 120)
    treatment = {f"gsm8k/test/{k}": float(v) for k, v in enumerate(t)}
    baseline = {f"gsm8k/test/{k}": float(v) for k, v in enumerate(b)}
    record = paired_decision(treatment, baseline, alpha=0.05, margin=-0.03)
    hoeffding = paired_hoeffding(t, b, alpha=0.05, margin=-0.03)
    assert {k: record[k] for k in hoeffding} == hoeffding
    assert record["treatment_mean"] == t.mean() and record["baseline_mean"] == b.mean()
    assert record["mcnemar_p"] == mcnemar_exact(t, b)["p_value"] == record["mcnemar"]["p_value"]
    assert record["bootstrap_ci"]["confidence"] == pytest.approx(0.9)
    assert record["bootstrap_lower"] == record["bootstrap_ci"]["low"]
    assert record["noninferior_threshold"] == noninferior_threshold(120, 0.05, -0.03)

    # every column of the decision artifact but the criterion name is in the record
    from schemas.artifacts import DECISION

    assert set(DECISION.names) - {"criterion", "treatment", "baseline"} <= set(record)  # names come from the flow

    # the same items from files, in another order and format
    (tmp_path / "t.jsonl").write_text("".join(json.dumps({"item_id": k, "correct": bool(v)}) + "\n" for k, v in reversed(treatment.items())))
    pq.write_table(pa.table({"item_id": list(baseline), "correct": [bool(v) for v in baseline.values()]}), tmp_path / "b.parquet")
    assert read_eval_items(tmp_path / "b.parquet") == baseline
    from_files = paired_decision(tmp_path / "t.jsonl", str(tmp_path / "b.parquet"), alpha=0.05, margin=-0.03)
    assert from_files == record

    with pytest.raises(EvalDataError, match="1 item"):
        paired_decision({**treatment, "extra": 1.0}, baseline, alpha=0.05, margin=-0.03)
    pq.write_table(pa.table({"item_id": ["a"], "score": [1.0]}), tmp_path / "bad.parquet")
    with pytest.raises(EvalDataError, match="missing column"):
        read_eval_items(tmp_path / "bad.parquet")


def test_mean_diff_by_seed_pairs_items_within_each_seed():
    """SeededPairs.mean_diff_by_seed: per seed, treatment minus baseline on the same items, matched by
    id whatever their order; a seed whose item sets differ is an error, not a silent mean."""
    from rules import SeededPairs
    from schemas.errors import EvalDataError

    treatment = {0: {"a": 1.0, "b": 0.0, "c": 1.0}, 1: {"c": 0.0, "a": 1.0, "b": 1.0}}
    baseline = {1: {"a": 0.0, "b": 1.0, "c": 0.0}, 0: {"a": 1.0, "b": 1.0, "c": 0.0}}
    assert SeededPairs.of(treatment, baseline).mean_diff_by_seed() == {"0": pytest.approx(0.0), "1": pytest.approx(1 / 3)}
    with pytest.raises(EvalDataError, match="item sets differ"):
        SeededPairs.of({0: {"a": 1.0}}, {0: {"b": 1.0}})
