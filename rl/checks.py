"""The spec's offline unit checks, as plain functions that pytest and the flow both call.

Each returns a `CheckResult(name, passed, details)`; nothing here raises on a failed check (the
gate task decides what a failure means). Synthetic data come from fixed seeds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from estimators import gs1_kernel_step, grpo_advantages
from schemas.kernel import KernelSpec

HUGE_BANDWIDTH = 1e8  # w_ij = exp(-d^2 / 2e16) rounds to 1 for any window of z-scores
TINY_BANDWIDTH = 1e-3


@dataclass(frozen=True)
class CheckResult:
    name: str
    passed: bool
    details: dict = field(default_factory=dict)


def _loo_window_mean(rewards_B: np.ndarray, history_rewards_H: np.ndarray, window: int) -> np.ndarray:
    n_history = min(len(history_rewards_H), max(0, window - len(rewards_B)))
    window_rewards = np.concatenate([history_rewards_H[len(history_rewards_H) - n_history :], rewards_B])
    return (window_rewards.sum() - rewards_B) / (len(window_rewards) - 1)


def _synthetic_step(seed: int, B: int = 64, H: int = 192):
    """Heterogeneous prompts: long prompts are hard, short ones easy (reward tied to phi)."""
    rng = np.random.default_rng(seed)
    n = H + B
    log_tokens = rng.normal(5.0, 0.6, n)
    mean_logprob = rng.normal(-1.5, 0.4, n)
    p_correct = 1.0 / (1.0 + np.exp(3.0 * (log_tokens - 5.0)))
    rewards = (rng.random(n) < p_correct).astype(np.float64)
    features = np.stack([log_tokens, mean_logprob], axis=1)
    return rewards[H:], features[H:], rewards[:H], features[:H]


def check_forced_activation(seed: int = 0) -> CheckResult:
    """Heterogeneous phi with the pinned kernel (h = 0.5) gives a non-constant baseline."""
    rewards_B, features_B_F, history_R, history_F = _synthetic_step(seed)
    out = gs1_kernel_step(rewards_B, features_B_F, history_R, history_F, kernel=KernelSpec(bandwidth=0.5, window=256))
    spread = float(np.ptp(out.baseline))
    loo = _loo_window_mean(rewards_B, history_R, 256)
    distance_from_window_mean = float(np.max(np.abs(out.baseline - loo)))
    passed = bool(spread > 1e-3 and distance_from_window_mean > 1e-3 and not out.fallback.all())
    return CheckResult(
        "forced_activation",
        passed,
        {
            "baseline_min": float(out.baseline.min()),
            "baseline_max": float(out.baseline.max()),
            "baseline_spread": spread,
            "max_abs_diff_from_window_mean": distance_from_window_mean,
            "frac_fallback": float(out.fallback.mean()),
        },
    )


def check_forced_nonactivation(seed: int = 0, tol: float = 1e-12) -> CheckResult:
    """A huge bandwidth makes b_i the leave-one-out window mean (a batch-mean REINFORCE baseline)."""
    rewards_B, features_B_F, history_R, history_F = _synthetic_step(seed)
    max_diff = 0.0
    for window in (256, 100, 32):  # history reaching back, partly, and not at all (window < B)
        out = gs1_kernel_step(rewards_B, features_B_F, history_R, history_F, kernel=KernelSpec(bandwidth=HUGE_BANDWIDTH, window=window))
        max_diff = max(max_diff, float(np.max(np.abs(out.baseline - _loo_window_mean(rewards_B, history_R, window)))))
    return CheckResult("forced_nonactivation", bool(max_diff <= tol), {"max_abs_diff": max_diff, "tol": tol})


def check_fallback_path(seed: int = 0, tol: float = 1e-12) -> CheckResult:
    """Distinct prompts with a tiny bandwidth: every mass < min_mass, so b_i falls back to the
    leave-one-out window mean; and a rollout alone in its window gets advantage 0."""
    rewards_B, features_B_F, history_R, history_F = _synthetic_step(seed)
    out = gs1_kernel_step(rewards_B, features_B_F, history_R, history_F, kernel=KernelSpec(bandwidth=TINY_BANDWIDTH))
    max_diff = float(np.max(np.abs(out.baseline - _loo_window_mean(rewards_B, history_R, 256))))
    lone = gs1_kernel_step(np.array([0.7]), np.array([[5.0, -1.0]]))
    passed = bool(out.fallback.all() and max_diff <= tol and lone.advantage[0] == 0.0 and lone.baseline[0] == 0.7)
    return CheckResult(
        "fallback_path",
        passed,
        {
            "frac_fallback": float(out.fallback.mean()),
            "max_kernel_mass": float(out.kernel_mass.max()),
            "max_abs_diff_from_window_mean": max_diff,
            "lone_rollout_advantage": float(lone.advantage[0]),
        },
    )


def check_grpo_matches_cookbook(seed: int = 0, tol: float = 1e-6) -> CheckResult:
    """grpo advantages equal the stock cookbook `compute_advantages` on cookbook TrajectoryGroups.

    The cookbook computes in torch's default dtype (float32), hence tol 1e-6 on rewards in [0, 1].
    """
    import tinker
    from tinker_cookbook.completers import TokensWithLogprobs
    from tinker_cookbook.rl.data_processing import compute_advantages
    from tinker_cookbook.rl.types import Trajectory, TrajectoryGroup, Transition

    rng = np.random.default_rng(seed)
    groups, group_size = 8, 8
    rewards_P_G = np.round(rng.random((groups, group_size)), 3)
    rewards_P_G[0] = 1.0  # a group with no reward variance
    ob = tinker.ModelInput.from_ints([1, 2, 3])
    trajectory_groups_P = [
        TrajectoryGroup(
            trajectories_G=[
                Trajectory(
                    transitions=[Transition(ob=ob, ac=TokensWithLogprobs([4], [-0.5]), reward=float(r), episode_done=True)],
                    final_ob=ob,
                )
                for r in rewards_G
            ],
            final_rewards_G=[0.0] * group_size,
            metrics_G=[{} for _ in range(group_size)],
        )
        for rewards_G in rewards_P_G
    ]
    cookbook_R = np.concatenate([a.numpy().astype(np.float64) for a in compute_advantages(trajectory_groups_P)])
    _, ours_R = grpo_advantages(rewards_P_G.reshape(-1), np.repeat(np.arange(groups), group_size))
    max_diff = float(np.max(np.abs(cookbook_R - ours_R)))
    return CheckResult("grpo_matches_cookbook", bool(max_diff <= tol), {"max_abs_diff": max_diff, "tol": tol})


def _reference_cases(seed: int):
    """Random windows covering ties, a constant feature, one-row batches, the first step and
    windows smaller than the batch: (rewards_B, features_B_F, history_R, history_F, kernel)."""
    rng = np.random.default_rng(seed)

    def draw(n, ties=False, constant=False):
        features = np.stack([np.log(rng.integers(20, 400, n)), rng.normal(-1.2, 0.5, n)], axis=1)
        if ties:
            features = features[rng.integers(0, max(1, n // 4), n)]
        if constant:
            features[:, 1] = -0.7
        return rng.integers(0, 2, n).astype(np.float64), features

    cases = []
    for B, H, window, h, ties, constant in [
        (64, 192, 256, 0.5, False, False),
        (64, 300, 256, 1.0, False, False),
        (64, 0, 256, 0.5, False, False),  # first step
        (1, 40, 256, 0.5, False, False),  # one-row batch
        (1, 0, 256, 0.5, False, False),  # alone in its window
        (16, 80, 8, 0.5, False, False),  # window smaller than the batch
        (32, 64, 64, 0.3, True, False),  # ties
        (24, 50, 60, 0.5, False, True),  # a constant feature
        (20, 30, 64, 0.05, False, False),  # mostly fallback
    ]:
        rewards_B, features_B = draw(B, ties, constant)
        rewards_H, features_H = draw(H, ties, constant)
        cases.append((rewards_B, features_B, rewards_H, features_H, KernelSpec(bandwidth=h, window=window, min_mass=1e-3)))
    return cases


def check_kernel_against_reference(reference_fn: Callable, seed: int = 0, tol: float = 1e-12) -> CheckResult:
    """Production gs1_kernel_step agrees with an independent reference on random windows.

    `reference_fn(rewards_B, features_B_F, history_rewards_H, history_features_H_F, kernel)` returns a mapping of sequences: baseline, advantage, kernel_mass,
    effective_neighbors, fallback. Tolerance: |a - b| <= tol * max(1, |b|).
    """
    worst = 0.0
    fallback_mismatches = 0
    for rewards_B, features_B, rewards_H, features_H, kernel in _reference_cases(seed):
        ours = gs1_kernel_step(rewards_B, features_B, rewards_H, features_H, kernel=kernel)
        ref = reference_fn(rewards_B.tolist(), features_B.tolist(), rewards_H.tolist(), features_H.tolist(), kernel)
        for key in ("baseline", "advantage", "kernel_mass", "effective_neighbors"):
            expected = np.asarray(ref[key], dtype=np.float64)
            error = np.abs(getattr(ours, key) - expected) / np.maximum(1.0, np.abs(expected))
            worst = max(worst, float(error.max()))
        fallback_mismatches += int(np.sum(ours.fallback != np.asarray(ref["fallback"], dtype=bool)))
    passed = bool(worst <= tol and fallback_mismatches == 0)
    return CheckResult(
        "kernel_matches_reference",
        passed,
        {"max_rel_error": worst, "tol": tol, "fallback_mismatches": fallback_mismatches},
    )


def run_offline_checks(reference_fn: Callable | None = None) -> list[CheckResult]:
    """All offline checks; the reference comparison runs when a reference is given."""
    results = [
        check_forced_activation(),
        check_forced_nonactivation(),
        check_fallback_path(),
        check_grpo_matches_cookbook(),
    ]
    if reference_fn is not None:
        results.append(check_kernel_against_reference(reference_fn))
    return results
