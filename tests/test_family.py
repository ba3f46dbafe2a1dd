"""Many arms against one baseline: Hoeffding p-values, Holm's step-down, seed-averaged pairing."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from rl.stats import family_decision, holm_adjust, paired_decision
from rules import SeededPairs
from rules.paired_hoeffding import hoeffding_p_value, hoeffding_radius, paired_hoeffding
from schemas.errors import EvalDataError


def outcomes(correct: list[int]) -> dict[str, float]:
    return {f"item/{i}": float(c) for i, c in enumerate(correct)}


@pytest.mark.parametrize("n,alpha,margin", [(100, 0.05, -0.03), (1319, 0.01, 0.0), (40, 0.2, -0.1)])
def test_hoeffding_p_value_is_below_alpha_exactly_when_the_bound_clears_the_margin(n, alpha, margin):
    radius = hoeffding_radius(n, alpha)
    for mean_diff in np.linspace(-0.6, 0.6, 241):
        p_ni = hoeffding_p_value(float(mean_diff), n, margin, side="noninferior")
        p_inf = hoeffding_p_value(float(mean_diff), n, margin, side="inferior")
        gap = abs(mean_diff - margin) - radius
        if abs(gap) > 1e-9:  # away from the boundary itself
            assert (p_ni < alpha) == (mean_diff - radius > margin)
            assert (p_inf < alpha) == (mean_diff + radius < margin)
        assert 0 < p_ni <= 1 and 0 < p_inf <= 1


def test_holm_adjust_matches_the_step_down_definition():
    rng = np.random.default_rng(3)
    for m in (1, 2, 3, 5):
        for _ in range(30):
            p = rng.uniform(0, 0.2, size=m).tolist()
            adjusted = holm_adjust(p)
            # Holm by its definition: walk the sorted p-values, reject while p_(k) <= alpha / (m - k).
            for alpha in (0.01, 0.05, 0.1):
                rejected = set()
                for k, i in enumerate(sorted(range(m), key=lambda j: p[j])):
                    if p[i] > alpha / (m - k):
                        break
                    rejected.add(i)
                assert {i for i in range(m) if adjusted[i] <= alpha} == rejected
            assert all(a >= q for a, q in zip(adjusted, p)) and max(adjusted) <= 1
    assert holm_adjust([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    with pytest.raises(ValueError):
        holm_adjust([])
    with pytest.raises(ValueError):
        holm_adjust([1.5])


def test_one_arm_one_seed_family_agrees_with_the_pinned_pair():
    rng = np.random.default_rng(0)
    for _ in range(20):
        t, b = outcomes(rng.integers(0, 2, 300).tolist()), outcomes(rng.integers(0, 2, 300).tolist())
        family = family_decision({"gs1": {0: t}}, {0: b}, alpha=0.05, margin=-0.03)
        pair = family["comparisons"][0]
        pinned = paired_decision(t, b, alpha=0.05, margin=-0.03)
        for key in ("n", "mean_diff", "lower", "upper", "mcnemar_p", "bootstrap_lower"):
            assert pair[key] == pinned[key]
        assert pair["verdict"] == pinned["verdict"] and pair["holm_p_noninferior"] == pair["p_noninferior"]


def test_holm_can_withhold_a_verdict_the_unadjusted_rule_gives():
    """Three arms each just past the unadjusted bound: Holm keeps the family-wise error at alpha,
    so the two weakest lose their noninferior verdict."""
    n, alpha, margin = 400, 0.05, -0.03
    base = [1] * 200 + [0] * 200
    radius = hoeffding_radius(n, alpha)

    def arm(extra_right: int) -> dict[str, float]:
        # the baseline's outcomes, with `extra_right` items flipped from wrong to right
        return outcomes([1 if i >= 200 and i < 200 + extra_right else c for i, c in enumerate(base)])

    needed = math.floor((radius + margin) * n) + 1  # smallest count whose mean diff clears the unadjusted bound
    arms = {"a": arm(needed + 20), "b": arm(needed + 1), "c": arm(needed)}
    family = family_decision({k: {0: v} for k, v in arms.items()}, {0: outcomes(base)}, alpha=alpha, margin=margin)
    by_arm = {p["arm"]: p for p in family["comparisons"]}
    assert all(paired_hoeffding(list(v.values()), base, alpha=alpha, margin=margin)["verdict"] == "noninferior"
               for v in arms.values())
    assert by_arm["a"]["verdict"] == "noninferior"
    assert by_arm["b"]["verdict"] == by_arm["c"]["verdict"] == "inconclusive"
    assert by_arm["a"]["holm_level"] == pytest.approx(alpha / 3)
    assert family["family"]["m"] == 3 and "family-wise" in family["family"]["statement"]


def test_seeds_pair_items_within_seed_and_average_per_item():
    rng = np.random.default_rng(1)
    t = {s: outcomes(rng.integers(0, 2, 50).tolist()) for s in (0, 1, 2)}
    b = {s: outcomes(rng.integers(0, 2, 50).tolist()) for s in (0, 1, 2)}
    family = family_decision({"x": t}, b, alpha=0.05, margin=-0.03)
    pair = family["comparisons"][0]
    per_seed = {s: np.mean([t[s][i] - b[s][i] for i in t[s]]) for s in t}
    assert pair["mean_diff_by_seed"] == {str(s): pytest.approx(v) for s, v in per_seed.items()}
    assert pair["mean_diff"] == pytest.approx(np.mean(list(per_seed.values())))
    assert pair["n"] == 50 and pair["seeds"] == 3 and family["seeds"] == [0, 1, 2]
    # Items stay the unit: the Hoeffding radius is that of 50 items, not 150 item-seeds.
    assert pair["upper"] - pair["mean_diff"] == pytest.approx(hoeffding_radius(50, 0.05))
    assert pair["mcnemar_p"] is None  # averaged outcomes are not 0/1


def test_mismatched_seeds_or_items_are_named():
    t, b = outcomes([1, 0, 1]), outcomes([0, 0, 1])
    with pytest.raises(EvalDataError, match="seeds"):
        family_decision({"x": {0: t, 1: t}}, {0: b}, alpha=0.05, margin=0.0)
    with pytest.raises(EvalDataError, match="seed 1 holds other eval items"):
        SeededPairs.of({0: t, 1: outcomes([1, 0])}, {0: t, 1: t}, "x")
    with pytest.raises(ValueError):
        family_decision({}, {0: b}, alpha=0.05, margin=0.0)


def test_unit_layout_and_seeded_configs():
    from design.arm import ArmConfig
    from schemas.layout import RunLayout, unit_name

    arm = ArmConfig(name="rloo", advantage="leave_one_out", group_size=8, groups_per_batch=2, lr=1e-3, seed=3, steps=2,
                    lora_rank=4, base_model="m")
    assert (arm.unit, arm.order_seed, arm.seed) == ("rloo", 0, 3)
    s1 = arm.at_seed(1)
    assert (s1.unit, s1.order_seed, s1.seed) == ("rloo-s1", 1, 4)
    assert RunLayout("r").train_arm_dir(s1.unit).as_posix() == "r/train/rloo-s1"
    assert RunLayout("r").costs_path(s1.unit).as_posix() == "r/train/rloo-s1/costs.parquet"
    names = {unit_name(a, s) for a, s in itertools.product(["a", "a-s1", "b"], [0, 1, 2])}
    assert len(names) == 9  # no two units of a multi-seed run share a folder
