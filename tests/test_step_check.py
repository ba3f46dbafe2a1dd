"""The preflight's step check drives the arm's own advantage step over several fixed batches and
compares every row with the independent reference -- and fails when the window is broken on purpose.

Shapes: the user's (B=64, W=256: the window holds exactly 4 batches) and the demo's (B=32, W=64),
where the step check shrinks its batches so the window still holds 4 of them.
"""

from __future__ import annotations

import numpy as np
import pytest

import estimators
import rl.loop
from design.arm import ArmConfig
from estimators import KernelWindow, StepBatch, gs1_kernel_log
from rl.preflight import MIN_CHECK_STEPS, check_arm_steps, fixed_step_batches
from schemas.kernel import KernelSpec

# The sampled preflight batch's prompts: four prompts' lengths and mean logprobs.
PROMPT_NUM_TOKENS = [61, 75, 58, 90]
PROMPT_MEAN_LOGPROB = [-2.1, -1.4, -2.6, -1.8]


def kernel_arm(groups_per_batch: int = 64, **kernel) -> ArmConfig:
    return ArmConfig(name="gs1_kernel", advantage="kernel_cross_prompt_baseline", group_size=1,
                     groups_per_batch=groups_per_batch, lr=4e-5, seed=0, steps=40, lora_rank=32, base_model="m",
                     kernel=KernelSpec(**kernel))


def other_arm(advantage: str, group_size: int, groups_per_batch: int) -> ArmConfig:
    return ArmConfig(name=advantage, advantage=advantage, group_size=group_size, groups_per_batch=groups_per_batch,
                     lr=4e-5, seed=0, steps=40, lora_rank=32, base_model="m")


def batches_for(arm: ArmConfig):
    return fixed_step_batches(PROMPT_NUM_TOKENS, PROMPT_MEAN_LOGPROB, arm)


RECIPES = [
    {},  # the user's pinned kernel: gaussian, both features, h 0.5, W 256
    {"family": "laplace", "bandwidth": 0.7, "scales": (2.0, 0.5)},
    {"family": "knn", "bandwidth": 16},
    {"features": ("prompt_mean_logprob",), "bandwidth": 0.3},
    {"window": 64, "bandwidth": 1.0},  # the demo's window with the user's batch: batches shrink to 16
]


@pytest.mark.parametrize("recipe", RECIPES, ids=[str(r) for r in RECIPES])
def test_step_check_passes_on_the_arm_that_runs_and_covers_a_full_rolling_window(recipe):
    arm = kernel_arm(**recipe)
    batches = batches_for(arm)
    assert len(batches) >= MIN_CHECK_STEPS
    assert arm.kernel.window >= 4 * len(batches[0].rewards_B)  # the window holds at least 4 batches
    assert sum(len(b.rewards_B) for b in batches[:-1]) > arm.kernel.window  # the window fills and rolls over
    result = check_arm_steps(arm, batches)
    assert result.passed, result
    assert result.rows == sum(len(b.rewards_B) for b in batches) and result.steps == len(batches)
    assert set(result.max_abs_diff) == {"baseline", "advantage", "kernel_mass", "effective_neighbors", "fallback"}


@pytest.mark.parametrize("arm", [other_arm("group_mean", 8, 8), other_arm("batch_mean", 1, 64),
                                 other_arm("leave_one_out", 8, 8)], ids=lambda a: a.advantage)
def test_step_check_covers_every_other_estimator(arm):
    result = check_arm_steps(arm, batches_for(arm))
    assert result.passed, result
    assert result.reference.startswith("tinker_cookbook" if arm.advantage == "group_mean" else "estimators.reference")


def _double_append(self, rewards_B, features_B_F):
    once = _EXTENDED(self, rewards_B, features_B_F)
    return _EXTENDED(once, rewards_B, features_B_F)


def _drop_latest(self, rewards_B, features_B_F):  # off by one: the newest earlier rollout never enters
    return _EXTENDED(self, rewards_B[:-1], features_B_F[:-1])


_EXTENDED = KernelWindow.extended


def _self_included(rewards_B, features_B_F, history_rewards_H=(), history_features_H_F=None, *, kernel):
    """The kernel step with i counted among its own neighbours."""
    out = _STEP(rewards_B, features_B_F, history_rewards_H, history_features_H_F, kernel=kernel)
    baseline = (out.baseline * out.kernel_mass + np.asarray(rewards_B)) / (out.kernel_mass + 1.0)
    return estimators.KernelAdvantages(baseline, np.asarray(rewards_B) - baseline, out.kernel_mass + 1.0,
                                          out.effective_neighbors, out.fallback)


_STEP = estimators.gs1_kernel_step


@pytest.mark.parametrize("groups_per_batch", [64, 32])  # the user's B=64 and the demo's B=32
@pytest.mark.parametrize("breakage", ["double_append", "off_by_one_history", "self_included"])
def test_step_check_fails_when_the_window_is_broken(monkeypatch, breakage, groups_per_batch):
    arm = kernel_arm(groups_per_batch) if groups_per_batch == 64 else kernel_arm(groups_per_batch, window=64, bandwidth=1.0)
    if breakage == "double_append":
        monkeypatch.setattr(KernelWindow, "extended", _double_append)
    elif breakage == "off_by_one_history":
        monkeypatch.setattr(KernelWindow, "extended", _drop_latest)
    else:
        monkeypatch.setattr(estimators.kernel_cross_prompt_baseline, "gs1_kernel_step", _self_included)
    result = check_arm_steps(arm, batches_for(arm))
    assert not result.passed
    first = result.mismatches[0]
    assert first.arm == "gs1_kernel" and first.column in ("baseline", "advantage", "kernel_mass", "effective_neighbors")
    # a broken window shows from the second step on; a broken step from the first
    assert first.step == (0 if breakage == "self_included" else 1)
    assert abs(first.logged - first.recomputed) > 1e-9


def test_the_loop_double_append_found_at_the_users_shape_is_caught():
    """The bug this check exists for: each step entering the window twice. At B=64, W=256 the
    baselines of steps 1-3 differ from the pinned semantics by about 0.1 (the issue's 0.11, 0.08, 0.18)."""
    arm = kernel_arm(64)
    rng = np.random.default_rng(0)
    batches = [StepBatch(rng.integers(0, 2, 64).astype(float), np.arange(64), rng.integers(40, 200, 64).astype(float),
                         rng.normal(-2.0, 0.5, 64)) for _ in range(4)]
    once = [rl.loop.step_advantages(arm, b, w)[0].baseline for b, w in _windows(arm, batches, KernelWindow.extended)]
    twice = [rl.loop.step_advantages(arm, b, w)[0].baseline for b, w in _windows(arm, batches, _double_append)]
    gaps = [float(np.max(np.abs(a - b))) for a, b in zip(once, twice)]
    assert gaps[0] == 0.0 and min(gaps[1:]) > 0.05, gaps
    steps = np.repeat(np.arange(4), 64)
    features = np.stack([np.log(np.concatenate([b.prompt_num_tokens_B for b in batches])),
                         np.concatenate([b.prompt_mean_logprob_B for b in batches])], axis=1)
    log = gs1_kernel_log(steps, np.concatenate([b.rewards_B for b in batches]), features, arm.kernel)
    np.testing.assert_allclose(np.concatenate(once), log.baseline, rtol=0, atol=1e-12)


def _windows(arm, batches, extend):
    window = rl.loop.new_window(arm)
    for batch in batches:
        yield batch, window
        window = extend(window, batch.rewards_B, batch.kernel_features(arm.kernel))
