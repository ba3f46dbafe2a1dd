"""The audit on logs it must reject: a NaN, a value off by more than 1e-9, a column never logged,
a GRPO log whose rewards are not dyadic (the cookbook's float32 is allowed for, nothing more)."""

from __future__ import annotations

import numpy as np

from design.arm import ArmConfig
from estimators import grpo_advantages, gs1_kernel_log
from estimators.kernels import prompt_features
from rl.audit import RolloutLog, audit_log
from schemas.kernel import KernelSpec


def _arm(advantage: str, group_size: int = 1, kernel: KernelSpec | None = None) -> ArmConfig:
    return ArmConfig(name=advantage, advantage=advantage, group_size=group_size, groups_per_batch=8, lr=1e-3, seed=0,
                     steps=3, lora_rank=4, base_model="m", kernel=kernel)


def _kernel_log(rng, steps=4, B=8):
    step_R = np.repeat(np.arange(steps), B)
    reward_R = rng.choice([0.0, 1.0, -0.1, 0.9], size=steps * B)
    num_tokens_R = rng.integers(20, 90, steps * B).astype(float)
    mean_logprob_R = rng.normal(-2.0, 0.4, steps * B)
    kernel = KernelSpec(window=16, bandwidth=1.0)
    out = gs1_kernel_log(step_R, reward_R, prompt_features(num_tokens_R, mean_logprob_R), kernel)
    logged = {c: np.asarray(getattr(out, c), dtype=np.float64) for c in ("baseline", "advantage", "kernel_mass",
                                                                         "effective_neighbors", "fallback")}
    return _arm("kernel_cross_prompt_baseline", kernel=kernel), RolloutLog(
        step_R, np.zeros(steps * B, dtype=np.int64), reward_R, num_tokens_R, mean_logprob_R, logged)


def test_a_clean_kernel_log_passes_and_every_damage_is_named():
    arm, log = _kernel_log(np.random.default_rng(0))
    assert audit_log(arm, log).passed
    for column, row, damage in (("baseline", 17, 2e-9), ("kernel_mass", 3, np.nan), ("fallback", 30, 1.0)):
        logged = {k: v.copy() for k, v in log.logged.items()}
        logged[column][row] += damage
        result = audit_log(arm, RolloutLog(log.step_R, log.group_id_R, log.reward_R, log.prompt_num_tokens_R,
                                           log.prompt_mean_logprob_R, logged))
        assert not result.passed and result.n_mismatches == 1
        m = result.mismatches[0]
        assert (m.arm, m.step, m.row, m.column) == (arm.name, row // 8, row, column)
    missing = {k: v for k, v in log.logged.items() if k != "effective_neighbors"}
    result = audit_log(arm, RolloutLog(log.step_R, log.group_id_R, log.reward_R, log.prompt_num_tokens_R,
                                       log.prompt_mean_logprob_R, missing))
    assert not result.passed and result.mismatches[0].column == "effective_neighbors" and result.mismatches[0].step == -1


def test_grpo_is_held_to_the_cookbook_within_its_float32_and_no_more():
    rng = np.random.default_rng(1)
    step_R = np.repeat(np.arange(3), 16)
    group_R = np.tile(np.repeat(np.arange(2), 8), 3)
    reward_R = rng.choice([0.0, 1.0, -0.1, 0.9], size=48)
    baseline_R, advantage_R = [], []
    for s in range(3):
        rows = step_R == s
        b, a = grpo_advantages(reward_R[rows], group_R[rows])
        baseline_R.append(b)
        advantage_R.append(a)
    logged = {"baseline": np.concatenate(baseline_R), "advantage": np.concatenate(advantage_R)}
    arm = _arm("group_mean", group_size=8)
    log = RolloutLog(step_R, group_R, reward_R, np.full(48, 30.0), np.full(48, -1.0), logged)
    result = audit_log(arm, log)
    assert result.passed and result.reference.startswith("tinker_cookbook"), result
    assert "float32" in result.tolerance
    wrong = {k: v.copy() for k, v in logged.items()}
    wrong["advantage"][5] += 1e-6  # well beyond float32 rounding of values near 1
    assert not audit_log(arm, RolloutLog(step_R, group_R, reward_R, np.full(48, 30.0), np.full(48, -1.0), wrong)).passed
