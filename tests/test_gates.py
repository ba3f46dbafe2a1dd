"""Gate metrics from logged rollouts, and checks against the user's activation gate."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pytest

from estimators import gs1_kernel_log
from estimators.kernels import prompt_features
from rl.gates import (
    GATE_METRICS,
    baseline_reward_corr,
    compute_gate_metrics,
    evaluate_checks,
    executed_group_size,
    frac_nonzero_advantage,
    kernel_effective_neighbors_p10,
    pilot_mean_reward,
)


def _rollout_log(n_steps, prompts_per_step, group_size, seed=0, kernel=True):
    rng = np.random.default_rng(seed)
    rows = n_steps * prompts_per_step * group_size
    step = np.repeat(np.arange(n_steps), prompts_per_step * group_size)
    group_id = np.tile(np.repeat(np.arange(prompts_per_step), group_size), n_steps)
    prompt_index = step * prompts_per_step + group_id
    num_tokens = rng.integers(40, 300, n_steps * prompts_per_step)[prompt_index]
    mean_logprob = rng.normal(-1.2, 0.4, n_steps * prompts_per_step)[prompt_index]
    reward = (rng.random(rows) < 1 / (1 + np.exp((np.log(num_tokens) - 5) * 3))).astype(float)
    table = {
        "step": step.astype(np.int32),
        "prompt_id": np.array([f"gsm8k/train/{k}" for k in prompt_index]),
        "group_id": group_id.astype(np.int32),
        "sample_idx": np.tile(np.arange(group_size), n_steps * prompts_per_step).astype(np.int32),
        "prompt_num_tokens": num_tokens.astype(np.int32),
        "prompt_mean_logprob": mean_logprob,
        "reward": reward,
    }
    if kernel:
        out = gs1_kernel_log(step, reward, prompt_features(num_tokens, mean_logprob))
        table.update(baseline=out.baseline, advantage=out.advantage, kernel_mass=out.kernel_mass,
                     effective_neighbors=out.effective_neighbors, fallback=out.fallback)
    else:
        groups = step * prompts_per_step + group_id
        means = np.bincount(groups, weights=reward) / np.bincount(groups)
        table.update(baseline=means[groups], advantage=reward - means[groups], kernel_mass=[None] * rows,
                     effective_neighbors=[None] * rows, fallback=[None] * rows)
    return pa.table(table)


def _heldout(treatment: pa.Table, samples=8, seed=1):
    rng = np.random.default_rng(seed)
    prompts = sorted(set(treatment.column("prompt_id").to_pylist()))
    tokens = dict(zip(treatment.column("prompt_id").to_pylist(), treatment.column("prompt_num_tokens").to_pylist()))
    rows = {"prompt_id": [], "sample_idx": [], "reward": []}
    for p in prompts:
        p_correct = 1 / (1 + math.exp((math.log(tokens[p]) - 5) * 3))
        for s in range(samples):
            rows["prompt_id"].append(p)
            rows["sample_idx"].append(s)
            rows["reward"].append(float(rng.random() < p_correct))
    return pa.table(rows)


def test_executed_group_size():
    assert executed_group_size(_rollout_log(2, 64, 1)) == 1.0
    assert executed_group_size(_rollout_log(3, 8, 8, kernel=False)) == 8.0
    # a step with uneven groups is reported per step and never passes
    uneven = {"step": [0, 0, 0, 1, 1, 1, 1], "prompt_id": ["a", "a", "b", "c", "c", "d", "d"]}
    assert executed_group_size(uneven) == [[1.0, 2.0], 2.0]
    varying = {"step": [0, 0, 1, 1], "prompt_id": ["a", "b", "c", "c"]}
    assert executed_group_size(varying) == [1.0, 2.0]
    assert math.isnan(executed_group_size({"step": [], "prompt_id": []}))


def test_pilot_mean_reward_uses_first_steps_only():
    log = {"step": [3, 3, 5, 5, 9, 9], "reward": [1.0, 0.0, 1.0, 1.0, 0.0, 0.0]}
    assert pilot_mean_reward(log, n_steps=2) == 0.75
    assert pilot_mean_reward(log, n_steps=1) == 0.5
    assert pilot_mean_reward(log, n_steps=10) == 0.5


def test_kernel_and_advantage_metrics_by_hand():
    log = {"effective_neighbors": [float(k) for k in range(1, 11)] + [None], "advantage": [0.0, 1e-7, -2e-6, 0.5] + [0.0] * 7}
    assert abs(kernel_effective_neighbors_p10(log) - 1.9) < 1e-12  # numpy linear: 1 + 0.1 * 9
    assert frac_nonzero_advantage(log) == 2 / 11
    assert math.isnan(kernel_effective_neighbors_p10({"effective_neighbors": [None, None]}))


def test_baseline_reward_corr_by_hand():
    treatment = {"prompt_id": ["a", "b", "c", "d"], "baseline": [0.1, 0.4, 0.2, 0.9]}
    heldout = {"prompt_id": ["a", "a", "b", "b", "c", "c", "x"], "sample_idx": [0, 1, 0, 1, 0, 1, 0],
               "reward": [0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0]}
    # pairs: (0.1, 0.5), (0.4, 1.0), (0.2, 0.0); d has no held-out samples
    x, y = [0.1, 0.4, 0.2], [0.5, 1.0, 0.0]
    mx, my = sum(x) / 3, sum(y) / 3
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    want = sxy / math.sqrt(sum((a - mx) ** 2 for a in x) * sum((b - my) ** 2 for b in y))
    assert abs(baseline_reward_corr(treatment, heldout) - want) < 1e-12
    assert math.isnan(baseline_reward_corr({"prompt_id": ["a"], "baseline": [0.3]}, heldout))


def test_compute_gate_metrics_on_a_synthetic_pilot(repo_root):
    treatment = _rollout_log(3, 64, 1)  # three steps: only the first two are the pilot
    baseline = _rollout_log(2, 8, 8, kernel=False, seed=5)
    metrics = compute_gate_metrics(treatment, baseline, _heldout(treatment))
    assert set(metrics) == set(GATE_METRICS)
    pilot_rewards = treatment.column("reward").to_numpy()[:128]
    assert metrics["executed_group_size_treatment"] == 1.0
    assert metrics["executed_group_size_baseline"] == 8.0
    assert metrics["pilot_mean_reward"] == pytest.approx(pilot_rewards.mean(), abs=1e-15)
    neighbors = treatment.column("effective_neighbors").to_numpy()[:128]
    assert metrics["kernel_effective_neighbors_p10"] == pytest.approx(np.percentile(neighbors, 10), abs=1e-12)
    assert metrics["baseline_reward_corr"] > 0.1  # the kernel baseline tracks a reward tied to phi

    spec = json.loads((repo_root / "specs" / "gs1_vs_grpo_gsm8k.json").read_text())
    results = evaluate_checks(spec["activation_gate"]["checks"], metrics)
    by_metric = {(r.metric, r.op): r for r in results}
    assert len(results) == 7  # pilot_mean_reward has a min and a max
    assert by_metric[("executed_group_size_treatment", "one_of")].passed
    assert by_metric[("executed_group_size_baseline", "one_of")].passed
    assert by_metric[("baseline_reward_corr", "min")].passed

    swapped = evaluate_checks(spec["activation_gate"]["checks"], {**metrics, "executed_group_size_treatment": 8.0})
    assert not {(r.metric, r.op): r for r in swapped}[("executed_group_size_treatment", "one_of")].passed


def test_evaluate_checks_bounds_inclusive_and_nan_never_passes():
    checks = [{"metric": "m", "min": 0.1, "max": 0.9}, {"metric": "g", "one_of": ["1", "8"]}]
    def passed(metrics):
        return [r.passed for r in evaluate_checks(checks, metrics)]
    assert passed({"m": 0.1, "g": 8}) == [True, True, True]
    assert passed({"m": 0.9, "g": 1.0}) == [True, True, True]
    assert passed({"m": 0.95, "g": 2}) == [True, False, False]
    assert passed({"m": float("nan"), "g": [1.0, 8.0]}) == [False, False, False]
    varying = evaluate_checks(checks, {"m": 0.5, "g": [1.0, [1.0, 2.0]]})[2]
    assert math.isnan(varying.value) and varying.observed == [1.0, [1.0, 2.0]] and not varying.passed
    assert passed({}) == [False, False, False]
    result = evaluate_checks([{"metric": "g", "one_of": ["1"]}], {"g": 1.0})[0]
    assert (result.op, result.bound, result.value) == ("one_of", (1.0,), 1.0)
    with pytest.raises(ValueError):
        evaluate_checks([{"metric": "m"}], {"m": 1.0})


def test_evaluate_checks_accepts_objects_with_attributes():
    class Check:
        metric, one_of, min, max = "m", None, 8.0, None

    assert evaluate_checks([Check()], {"m": 8.0})[0].passed
    assert not evaluate_checks([Check()], {"m": 7.99})[0].passed
