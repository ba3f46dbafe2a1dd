"""Advantage estimators against hand loops and the independent GS1 reference: pure numpy.

This module imports neither torch nor tinker (the fast tier's pure-numpy tests;
tests/test_fast_tier.py runs it in a fresh process and checks). The comparisons with the stock
tinker cookbook, which need torch and tinker, are in tests/test_estimators_cookbook.py.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from pydantic import ValidationError

from estimators import (
    KernelWindow,
    StepBatch,
    batch_mean_advantages,
    flash_reinforce_coefficients,
    grpo_advantages,
    gs1_kernel_log,
    gs1_kernel_step,
    rloo_advantages,
)
from estimators.kernel_cross_prompt_baseline import KernelBaselineRecipe
from estimators.kernels import effective_neighbors, prompt_features, prompt_mean_logprob, standardize
from estimators.reference import gs1_kernel_log_reference, gs1_kernel_reference
from estimators.registry import ESTIMATORS, KINDS, estimator_for
from rl import checks
from schemas.kernel import KernelSpec

KEYS = ("baseline", "advantage", "kernel_mass", "effective_neighbors")


# ---------------------------------------------------------------------------- group baselines


def test_grpo_groups_by_id_not_position():
    rewards = np.array([1.0, 0.0, 1.0, 1.0, 0.0])
    groups = np.array(["b", "a", "b", "a", "c"])
    baseline, advantage = grpo_advantages(rewards, groups)
    np.testing.assert_array_equal(baseline, [1.0, 0.5, 1.0, 0.5, 0.0])
    np.testing.assert_array_equal(advantage, [0.0, -0.5, 0.0, 0.5, 0.0])


def test_batch_mean_and_rloo_match_hand_loops():
    rng = np.random.default_rng(3)
    rewards = rng.random(40)
    groups = rng.integers(0, 12, 40)
    baseline, advantage = batch_mean_advantages(rewards)
    expected = sum(rewards) / len(rewards)
    assert np.all(np.abs(baseline - expected) < 1e-14)
    np.testing.assert_allclose(advantage, rewards - expected, atol=1e-14)

    baseline, advantage = rloo_advantages(rewards, groups)
    for i in range(len(rewards)):
        others = [rewards[j] for j in range(len(rewards)) if groups[j] == groups[i] and j != i]
        want = sum(others) / len(others) if others else rewards[i]
        assert abs(baseline[i] - want) < 1e-12
        assert abs(advantage[i] - (rewards[i] - want)) < 1e-12


def test_rloo_group_of_one_is_zero_and_nan_reward_rejected():
    _, advantage = rloo_advantages([0.3, 1.0, 0.0], [0, 1, 1])
    assert advantage[0] == 0.0 and advantage[1] == 1.0 and advantage[2] == -1.0
    with pytest.raises(ValueError):
        grpo_advantages([0.0, float("nan")], [0, 0])


# ---------------------------------------------------------------------------- gs1 kernel vs reference


def _draw(rng, n, *, ties=False, constant=None, n_features=2):
    features = np.stack([np.log(rng.integers(15, 500, n)), rng.normal(-1.3, 0.6, n)], axis=1)[:, :n_features]
    if ties:
        features = features[rng.integers(0, max(1, n // 5), n)]
    if constant is not None:
        features[:, constant] = 0.1  # 0.1 * n / n is not exactly 0.1: constancy must be by equality
    rewards = rng.integers(0, 2, n).astype(np.float64)
    if rng.random() < 0.3:
        rewards = rng.random(n)
    return rewards, features


def _assert_matches(ours, ref, tol=1e-12):
    for key in KEYS:
        expected = np.asarray(ref[key], dtype=np.float64)
        np.testing.assert_allclose(getattr(ours, key), expected, rtol=tol, atol=tol, err_msg=key)
    np.testing.assert_array_equal(ours.fallback, np.asarray(ref["fallback"], dtype=bool))


CASES = [
    # (B, H, window, bandwidth, ties, constant feature)
    (64, 192, 256, 0.5, False, None),
    (64, 500, 256, 0.5, False, None),
    (64, 0, 256, 0.5, False, None),  # first step: no history
    (1, 0, 256, 0.5, False, None),  # alone in its window
    (1, 1, 256, 0.5, False, None),
    (1, 300, 256, 1.0, False, None),  # one-row batch
    (40, 100, 16, 0.5, False, None),  # window smaller than the batch
    (40, 100, 40, 0.5, False, None),  # window equal to the batch
    (40, 100, 41, 0.5, False, None),
    (50, 120, 128, 0.4, True, None),  # ties
    (30, 60, 64, 0.5, False, 0),  # constant feature
    (30, 60, 64, 0.5, False, 1),
    (30, 60, 64, 0.5, True, 1),
    (25, 25, 64, 0.02, False, None),  # mostly fallback
    (25, 25, 64, 1e7, False, None),  # huge h
]


@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
@pytest.mark.parametrize("seed", range(3))
def test_gs1_kernel_step_matches_reference(case, seed):
    B, H, window, h, ties, constant = case
    rng = np.random.default_rng(seed)
    rewards_B, features_B = _draw(rng, B, ties=ties, constant=constant)
    rewards_H, features_H = _draw(rng, H, ties=ties, constant=constant)
    ours = gs1_kernel_step(rewards_B, features_B, rewards_H, features_H, kernel=KernelSpec(bandwidth=h, window=window))
    ref = gs1_kernel_reference(
        rewards_B.tolist(), features_B.tolist(), rewards_H.tolist(), features_H.tolist(), KernelSpec(bandwidth=h, window=window, min_mass=1e-3))
    _assert_matches(ours, ref)


def test_gs1_kernel_step_matches_reference_with_scales_and_min_mass():
    rng = np.random.default_rng(7)
    rewards_B, features_B = _draw(rng, 20)
    rewards_H, features_H = _draw(rng, 70)
    for scales in ([1.0, 1.0], [2.0, 0.5], [0.25, 1.0]):
        for min_mass in (0.0, 1e-3, 0.5):
            ours = gs1_kernel_step(rewards_B, features_B, rewards_H, features_H, kernel=KernelSpec(bandwidth=0.3, window=64, min_mass=min_mass, scales=scales))
            ref = gs1_kernel_reference(
                rewards_B.tolist(), features_B.tolist(), rewards_H.tolist(), features_H.tolist(), KernelSpec(bandwidth=0.3, window=64, min_mass=min_mass, scales=scales))
            _assert_matches(ours, ref)


# laplace: h as in CASES; knn: the bandwidth is k (rounded), so the case's h maps to a k
KNN_K = {0.5: 8, 1.0: 3, 0.4: 5, 0.02: 1, 1e7: 1000}


@pytest.mark.parametrize("family", ["laplace", "knn"])
@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
@pytest.mark.parametrize("seed", range(2))
def test_laplace_and_knn_steps_match_reference(family, case, seed):
    B, H, window, h, ties, constant = case
    bandwidth = KNN_K[h] if family == "knn" else h
    rng = np.random.default_rng(100 + seed)
    rewards_B, features_B = _draw(rng, B, ties=ties, constant=constant)
    rewards_H, features_H = _draw(rng, H, ties=ties, constant=constant)
    ours = gs1_kernel_step(rewards_B, features_B, rewards_H, features_H, kernel=KernelSpec(bandwidth=bandwidth, window=window, family=family))
    ref = gs1_kernel_reference(
        rewards_B.tolist(), features_B.tolist(), rewards_H.tolist(), features_H.tolist(), KernelSpec(bandwidth=bandwidth, window=window, min_mass=1e-3, family=family))
    _assert_matches(ours, ref)
    if family == "knn" and B + min(H, max(0, window - B)) > 1:
        n_window = B + min(H, max(0, window - B))
        np.testing.assert_array_equal(ours.kernel_mass, min(bandwidth, n_window - 1))  # k ones (all, if fewer)


@pytest.mark.parametrize("family", ["laplace", "knn"])
def test_laplace_and_knn_with_scales_and_min_mass_match_reference(family):
    rng = np.random.default_rng(8)
    rewards_B, features_B = _draw(rng, 20)
    rewards_H, features_H = _draw(rng, 70)
    for scales in ([1.0, 1.0], [2.0, 0.5], [0.25, 1.0]):
        for min_mass in (0.0, 1e-3, 0.5, 4.0):  # knn mass is k: min_mass 4 > k = 3 forces the fallback
            bandwidth = 3.4 if family == "knn" else 0.3  # knn: k = round(3.4) = 3
            ours = gs1_kernel_step(rewards_B, features_B, rewards_H, features_H, kernel=KernelSpec(bandwidth=bandwidth, window=64, min_mass=min_mass, scales=scales, family=family))
            ref = gs1_kernel_reference(
                rewards_B.tolist(), features_B.tolist(), rewards_H.tolist(), features_H.tolist(), KernelSpec(bandwidth=bandwidth, window=64, min_mass=min_mass, scales=scales, family=family))
            _assert_matches(ours, ref)
            if family == "knn":
                assert np.all(ours.fallback == (min_mass > 3))


def test_knn_ties_go_to_the_older_rollout():
    # window: history [a, b] then batch [c, d]; a, b and d share one feature value, c is far away
    features_H = np.array([[1.0, 0.0], [1.0, 0.0]])
    features_B = np.array([[5.0, 3.0], [1.0, 0.0]])
    out = gs1_kernel_step([0.0, 1.0], features_B, [0.3, 0.7], features_H, kernel=KernelSpec(bandwidth=1, window=4, family="knn"))
    assert out.baseline[1] == 0.3  # d's nearest: a and b tie at distance 0; a (older) wins
    out2 = gs1_kernel_step([0.0, 1.0], features_B, [0.3, 0.7], features_H, kernel=KernelSpec(bandwidth=2, window=4, family="knn"))
    assert out2.baseline[1] == pytest.approx(0.5)  # a and b
    assert out2.baseline[0] == pytest.approx(0.5)  # c: a and b tie with d; the two oldest win


def test_laplace_weights_are_exp_minus_distance_over_h():
    features = np.array([[0.0, 0.0], [1.0, 0.0], [3.0, 0.0]])
    out = gs1_kernel_step([1.0, 0.0, 0.0], features, kernel=KernelSpec(bandwidth=0.7, window=3, family="laplace"))
    z = (features[:, 0] - features[:, 0].mean()) / features[:, 0].std()
    w01, w02 = math.exp(-abs(z[0] - z[1]) / 0.7), math.exp(-abs(z[0] - z[2]) / 0.7)
    assert out.kernel_mass[0] == pytest.approx(w01 + w02, rel=1e-12)
    w10, w12 = math.exp(-abs(z[1] - z[0]) / 0.7), math.exp(-abs(z[1] - z[2]) / 0.7)
    assert out.baseline[1] == pytest.approx(w10 / (w10 + w12), rel=1e-12)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("window", [256, 50, 8])
def test_gs1_kernel_log_matches_reference_over_multi_step_logs(seed, window):
    rng = np.random.default_rng(seed)
    batch_sizes = [int(rng.integers(1, 40)) for _ in range(12)]
    steps = np.repeat(np.arange(len(batch_sizes)) * 3 + 5, batch_sizes)  # non-contiguous step numbers
    rewards, features = _draw(rng, len(steps), ties=seed == 1)
    ours = gs1_kernel_log(steps, rewards, features, KernelSpec(bandwidth=0.5, window=window))
    ref = gs1_kernel_log_reference(steps.tolist(), rewards.tolist(), features.tolist(), KernelSpec(bandwidth=0.5, window=window, min_mass=1e-3))
    _assert_matches(ours, ref)


def _batch(rewards_B, features_B_F, group_ids_B=None):
    """A StepBatch whose kernel features are `features_B_F` (log tokens, mean logprob)."""
    return StepBatch(np.asarray(rewards_B, dtype=np.float64),
                     np.arange(len(rewards_B)) if group_ids_B is None else np.asarray(group_ids_B),
                     np.exp(np.asarray(features_B_F)[:, 0]), np.asarray(features_B_F)[:, 1])


def test_kernel_window_and_dispatcher_reproduce_the_log():
    rng = np.random.default_rng(11)
    steps = np.repeat(np.arange(9), 64)
    rewards, features = _draw(rng, len(steps))
    window = KernelWindow.empty(256)
    columns = {k: [] for k in (*KEYS, "fallback")}
    for step in range(9):
        rows = steps == step
        batch = _batch(rewards[rows], features[rows])
        kind = estimator_for("kernel_cross_prompt_baseline")
        out = kind.advantages(KernelBaselineRecipe(), batch, window)
        again = kind.advantages(KernelBaselineRecipe(), batch, window)
        np.testing.assert_array_equal(again.baseline, out.baseline)  # computing a step changes no state
        window = window.extended(batch.rewards_B, batch.kernel_features(KernelSpec()))
        for k in columns:
            columns[k].append(getattr(out, k))
    assert len(window) == 256
    log = gs1_kernel_log(steps, rewards, features)
    for k in columns:
        np.testing.assert_allclose(np.concatenate(columns[k]), getattr(log, k), rtol=1e-13, atol=1e-13)


def test_kernel_window_keeps_the_most_recent_rollouts_once_each():
    window = KernelWindow.empty(5)
    for step in range(4):
        window2 = window.extended([float(step)] * 2, [[step, -step]] * 2)
        assert len(window) == min(5, 2 * step)  # the old window is untouched
        window = window2
    np.testing.assert_array_equal(window.rewards_H, [1.0, 2.0, 2.0, 3.0, 3.0])
    with pytest.raises(ValueError, match="columns"):
        window.extended([1.0], [[1.0]])


def test_step_rows_must_be_consecutive():
    with pytest.raises(ValueError, match="consecutive"):
        gs1_kernel_log([0, 1, 0], [1.0, 0.0, 1.0], np.ones((3, 2)))


# ---------------------------------------------------------------------------- kernel properties


def test_forced_activation_gives_nonconstant_baseline():
    result = checks.check_forced_activation()
    assert result.passed, result.details
    assert result.details["baseline_spread"] > 0.1


def test_forced_nonactivation_huge_bandwidth_is_leave_one_out_window_mean():
    assert checks.check_forced_nonactivation().passed
    rng = np.random.default_rng(5)
    rewards_B, features_B = _draw(rng, 64)
    rewards_H, features_H = _draw(rng, 400)
    out = gs1_kernel_step(rewards_B, features_B, rewards_H, features_H, kernel=KernelSpec(bandwidth=1e9, window=256))
    window_rewards = list(rewards_H[-192:]) + list(rewards_B)
    for b in range(64):
        others = window_rewards[:192 + b] + window_rewards[192 + b + 1:]
        assert abs(out.baseline[b] - sum(others) / len(others)) <= 1e-12
    assert not out.fallback.any()
    np.testing.assert_allclose(out.kernel_mass, 255.0, rtol=1e-12)
    np.testing.assert_allclose(out.effective_neighbors, 255.0, rtol=1e-12)


def test_fallback_path_uses_window_mean_and_flags_it():
    assert checks.check_fallback_path().passed
    # Two far-apart clusters of 3: h tiny -> every rollout's mass is ~0 except its own cluster's.
    features = np.array([[0.0, 0.0], [0.0, 0.0], [0.0, 0.0], [9.0, 1.0], [12.0, 1.0], [15.0, 1.0]])
    rewards = np.array([1.0, 0.0, 1.0, 0.0, 1.0, 1.0])
    out = gs1_kernel_step(rewards, features, kernel=KernelSpec(bandwidth=0.01))
    np.testing.assert_array_equal(out.fallback, [False, False, False, True, True, True])
    np.testing.assert_allclose(out.baseline[:3], [0.5, 1.0, 0.5], atol=1e-15)  # ties: weight 1
    np.testing.assert_allclose(out.baseline[3:], (rewards.sum() - rewards[3:]) / 5, atol=1e-15)


def test_lone_rollout_gets_zero_advantage():
    out = gs1_kernel_step([0.25], [[3.0, -1.0]])
    assert out.baseline[0] == 0.25 and out.advantage[0] == 0.0
    assert out.kernel_mass[0] == 0.0 and out.effective_neighbors[0] == 0.0 and out.fallback[0]
    out = gs1_kernel_step([0.25], [[3.0, -1.0]], [1.0, 0.0], [[1.0, 1.0], [2.0, 2.0]], kernel=KernelSpec(window=1))
    assert out.advantage[0] == 0.0  # window 1: the history is out of reach


def test_window_smaller_than_batch_ignores_history():
    rng = np.random.default_rng(2)
    rewards_B, features_B = _draw(rng, 30)
    rewards_H, features_H = _draw(rng, 50)
    with_history = gs1_kernel_step(rewards_B, features_B, rewards_H, features_H, kernel=KernelSpec(window=10))
    alone = gs1_kernel_step(rewards_B, features_B, kernel=KernelSpec(window=10))
    np.testing.assert_array_equal(with_history.baseline, alone.baseline)


def test_effective_neighbors_formula():
    w = np.array([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0], [0.5, 0.25, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    np.testing.assert_allclose(effective_neighbors(w), [4.0, 1.0, 0.75**2 / 0.3125, 0.0], rtol=1e-15)
    rng = np.random.default_rng(0)
    rewards_B, features_B = _draw(rng, 10)
    out = gs1_kernel_step(rewards_B, features_B)
    z = standardize(features_B)
    for i in range(10):
        w_i = [math.exp(-sum((z[i] - z[j]) ** 2) / 0.5) for j in range(10) if j != i]
        assert abs(out.effective_neighbors[i] - sum(w_i) ** 2 / sum(x * x for x in w_i)) < 1e-12


def test_single_feature_kernel_and_constant_feature_adds_no_distance():
    rng = np.random.default_rng(4)
    rewards, features = _draw(rng, 30)
    one_feature = gs1_kernel_step(rewards, features[:, :1], kernel=KernelSpec(features=("log_prompt_num_tokens",)))
    constant = features.copy()
    constant[:, 1] = 0.1
    np.testing.assert_allclose(gs1_kernel_step(rewards, constant).baseline, one_feature.baseline, atol=1e-14)
    with pytest.raises(ValueError, match="columns"):
        gs1_kernel_step(rewards, features[:, :1])  # two features named, one given


def test_standardize_constant_column_is_exactly_zero():
    z = standardize(np.array([[0.1, 1.0], [0.1, 2.0], [0.1, 3.0]]))
    assert np.all(z[:, 0] == 0.0)
    np.testing.assert_allclose(z[:, 1], [-math.sqrt(1.5), 0.0, math.sqrt(1.5)], rtol=1e-14)


def test_prompt_features():
    f = prompt_features([10, 100], [-1.0, -2.0])
    np.testing.assert_allclose(f, [[math.log(10), -1.0], [math.log(100), -2.0]])
    assert prompt_features([10], [-1.0], names=("prompt_mean_logprob",)).shape == (1, 1)
    with pytest.raises(ValueError):
        prompt_features([0], [-1.0])
    with pytest.raises(ValueError):
        prompt_features([5], [-1.0], names=("nope",))


# ---------------------------------------------------------------------------- dispatch


def test_the_registry_covers_every_kind():
    rewards = np.array([1.0, 0.0, 1.0, 1.0])
    groups = np.array([0, 0, 1, 1])
    batch = _batch(rewards, np.eye(4)[:, :2] + 1.0, groups)
    expected = {
        "group_mean": grpo_advantages(rewards, groups)[1],
        "leave_one_out": rloo_advantages(rewards, groups)[1],
        "batch_mean": batch_mean_advantages(rewards)[1],
    }
    assert set(KINDS) >= {"group_mean", "kernel_cross_prompt_baseline", "batch_mean", "leave_one_out", "flash_reinforce", "critic"}
    for kind, estimator in ESTIMATORS.items():
        assert estimator.kind == kind and estimator.recipe_type().advantage == kind  # one name per kind
        recipe = estimator.recipe_type()
        if kind == "kernel_cross_prompt_baseline":
            recipe = KernelBaselineRecipe(kernel=KernelSpec(window=8))
            out = estimator.advantages(recipe, batch, estimator.new_window(recipe))
            assert out.kernel_mass is not None and out.fallback.dtype == bool
        elif kind == "flash_reinforce":
            logprobs = tuple(np.full(3, -0.5) for _ in rewards)
            with pytest.raises(ValueError, match="sampler and learner logprobs"):
                estimator.advantages(recipe, batch, None)
            out = estimator.advantages(recipe.model_copy(update={"trust_delta": 1e-3}),
                                       dataclasses.replace(batch, sampler_logprobs_B_T=logprobs, learner_logprobs_B_T=logprobs), None)
            np.testing.assert_array_equal(out.advantage, batch_mean_advantages(rewards)[1])  # its baseline: the batch mean
            assert out.admitted.all() and np.allclose(out.token_advantage, out.advantage / (3 * 4))
        elif kind == "critic":
            with pytest.raises(ValueError, match="critic logprobs"):
                estimator.advantages(recipe, batch, None)
            yes, no = np.log([0.2, 0.5, 0.9, 0.7]), np.log([0.8, 0.5, 0.1, 0.3])
            out = estimator.advantages(recipe, dataclasses.replace(batch, critic_yes_logprob_B=yes, critic_no_logprob_B=no), None)
            np.testing.assert_allclose(out.baseline, [0.2, 0.5, 0.9, 0.7], rtol=1e-12)
        elif kind in expected:
            out = estimator.advantages(recipe, batch, estimator.new_window(recipe))
            np.testing.assert_array_equal(out.advantage, expected[kind])
            assert out.kernel_mass is None
    with pytest.raises(ValueError, match="no estimator implements 'ppo'"):
        estimator_for("ppo")
    kernel_kind = estimator_for("kernel_cross_prompt_baseline")
    with pytest.raises(ValueError, match="KernelWindow"):
        kernel_kind.advantages(KernelBaselineRecipe(), batch, None)
    with pytest.raises(ValueError, match="window"):  # the kernel's window must be the window's size
        kernel_kind.advantages(KernelBaselineRecipe(kernel=KernelSpec(window=16)), batch, KernelWindow.empty(8))


def test_kernel_spec_holds_the_defaults_and_validates_once():
    pinned = KernelSpec()
    assert (pinned.family, pinned.features, pinned.scales, pinned.bandwidth, pinned.window, pinned.min_mass) == (
        "gaussian", ("log_prompt_num_tokens", "prompt_mean_logprob"), None, 0.5, 256, 1e-3)
    assert KernelSpec(bandwidth=1.0).bandwidth == 1.0
    for bad in ({"bandwidth": 0}, {"window": 0}, {"colour": 1}, {"scales": [1.0]}, {"family": "ridge"},
                {"family": "knn", "bandwidth": 0.4}, {"bandwidth": float("inf")}, {"features": []}):
        with pytest.raises(ValidationError):
            KernelSpec.model_validate(bad)
    assert KernelSpec(family="knn", bandwidth=16.0).knn_k == 16
    with pytest.raises(ValidationError):
        pinned.bandwidth = 1.0  # frozen: nobody re-defaults or edits it downstream
    assert pinned.with_bandwidth(1.0).bandwidth == 1.0 and pinned.bandwidth == 0.5


def test_prompt_mean_logprob_takes_tokens_2_to_n_and_checks_lengths():
    assert prompt_mean_logprob([None, -1.0, -3.0], 3) == -2.0
    assert prompt_mean_logprob([-1.0, -3.0], 3) == -2.0  # a server that leaves out the leading None
    for bad in ([None, -1.0], [None, -1.0, -2.0, -3.0], [None, None, -1.0]):
        with pytest.raises(ValueError, match="prompt logprobs"):
            prompt_mean_logprob(bad, 3)


# ---------------------------------------------------------------------------- FlashREINFORCE


def test_flash_reinforce_coefficients_match_hand_loop():
    rng = np.random.default_rng(0)
    lengths = [5, 1, 12, 7]
    sampler = [np.log(rng.uniform(0.05, 0.99, T)) for T in lengths]
    learner = [s + rng.normal(0, 0.05 if i != 2 else 1.5, len(s)) for i, s in enumerate(sampler)]
    learner = [np.minimum(l, -1e-9) for l in learner]
    learner[1] = sampler[1].copy()  # identical policies: KL 0, ratio 1
    delta = 0.05
    coefficients, mask = flash_reinforce_coefficients(sampler, learner, delta=delta)
    B = len(lengths)
    for i in range(B):
        kl = 0.0
        for s, l in zip(sampler[i], learner[i]):
            p, q = math.exp(s), math.exp(l)
            kl += p * math.log(p / q) + (1 - p) * math.log((1 - p) / (1 - q))
        keep = kl / lengths[i] <= delta
        assert mask[i] == keep
        for t in range(lengths[i]):
            want = math.exp(learner[i][t] - sampler[i][t]) * keep / (lengths[i] * B)
            assert abs(coefficients[i][t] - want) <= 1e-15
    assert mask.tolist() == [True, True, False, True]
    assert coefficients[1][0] == 1.0 / B


def test_flash_reinforce_certain_token_and_bad_input():
    coefficients, mask = flash_reinforce_coefficients([[0.0, -0.1]], [[0.0, -0.1]], delta=0.0)
    assert mask[0] and np.allclose(coefficients[0], 0.5)
    # learner certain, sampler not: the gate's probabilities are clamped into [1e-6, 1 - 1e-6] (as the
    # paper's reference does), so the KL is large but finite
    p, q = math.exp(-0.5), 1 - 1e-6
    kl = p * math.log(p / q) + (1 - p) * math.log((1 - p) / (1 - q))
    _, mask = flash_reinforce_coefficients([[-0.5]], [[0.0]], delta=kl * (1 + 1e-9))
    assert mask[0]
    _, mask = flash_reinforce_coefficients([[-0.5]], [[0.0]], delta=kl * (1 - 1e-9))
    assert not mask[0]
    coefficients, mask = flash_reinforce_coefficients([[], [-0.1]], [[], [-0.1]], delta=0.1)
    assert mask.tolist() == [False, True] and coefficients[0].size == 0  # no tokens: no gradient, not admitted
    with pytest.raises(ValueError):
        flash_reinforce_coefficients([[-0.1]], [[-0.1, -0.2]], delta=0.1)


# ---------------------------------------------------------------------------- the offline checks


def test_reference_check_fails_on_a_wrong_reference():
    def off_by_a_bit(*args):
        out = gs1_kernel_reference(*args)
        return {**out, "baseline": [b + 1e-9 for b in out["baseline"]]}

    def window_mean_only(rewards_B, features_B_F, history_rewards_H, history_features_H_F, kernel):
        return gs1_kernel_reference(rewards_B, features_B_F, history_rewards_H, history_features_H_F, kernel.with_bandwidth(1e9))

    assert not checks.check_kernel_against_reference(off_by_a_bit).passed
    assert not checks.check_kernel_against_reference(window_mean_only).passed
