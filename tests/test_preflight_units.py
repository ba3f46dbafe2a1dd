"""The preflight's building blocks and the feasibility projection, without Prefect."""

from __future__ import annotations

import contextlib
import math

import numpy as np
import pytest
from tinker import types

from fixtures.tiny_model import tiny_model_dir, tiny_service_client  # noqa: F401
from rl.feasibility import PilotTimings, project_full_run
from rl.preflight import (
    Rollout, arm_step_advantages, check_arm_steps, compare_arrays, compare_loss_and_gradient, cookbook_grpo_datums,
    fixed_step_batches, loop_datums, sampled_batch, with_varied_rewards,
)
from design.arm import ArmConfig
from schemas.kernel import KernelSpec

GRPO_ARM = ArmConfig(name="grpo_gs8", advantage="group_mean", group_size=8, groups_per_batch=8, lr=1e-3, seed=0,
                     steps=1, lora_rank=4, base_model="tiny")

TOL = {
    "baseline_loss": {"atol": 1e-6, "rtol": 1e-5},
    "baseline_gradient": {"atol": 1e-5, "rtol": 1e-4, "min_cosine": 0.99999},
}


def _batch(rewards_G_P):
    rng = np.random.default_rng(0)
    rollouts = []
    for p, rewards in enumerate(rewards_G_P):
        prompt = types.ModelInput.from_ints([int(t) for t in rng.integers(100, 5000, size=5 + p)])
        for r in rewards:
            n = int(rng.integers(2, 6))
            rollouts.append(Rollout(prompt, [int(t) for t in rng.integers(100, 5000, size=n)],
                                    [float(x) for x in -rng.random(n)], float(r), p))
    return rollouts


def test_compare_arrays_tolerances_and_vacuous_gradients():
    assert compare_arrays("x", [1.0, 2.0], [1.0, 2.0 + 1e-7], atol=1e-6, rtol=0).passed
    assert not compare_arrays("x", [1.0, 2.0], [1.0, 2.1], atol=1e-6, rtol=1e-3).passed
    assert not compare_arrays("x", [1.0], [1.0, 2.0], atol=1, rtol=1).passed
    assert not compare_arrays("x", [np.nan], [np.nan], atol=1, rtol=1).passed
    # Two zero gradients agree elementwise but compare nothing: that must fail.
    zero = compare_arrays("g", np.zeros(4), np.zeros(4), atol=1e-5, rtol=1e-4, min_cosine=0.99999)
    assert not zero.passed and math.isnan(zero.details["cosine"])
    assert not compare_arrays("g", [1.0, 0.0], [0.0, 1.0], atol=10, rtol=0, min_cosine=0.99999).passed


def test_with_varied_rewards_keeps_a_varied_batch_and_replaces_a_flat_one():
    varied = _batch([[0, 1, 1], [0, 0, 0]])
    kept, source = with_varied_rewards(varied)
    assert source == "env" and [r.reward for r in kept] == [r.reward for r in varied]
    flat = _batch([[0, 0, 0], [1, 1, 1]])
    replaced, source = with_varied_rewards(flat)
    assert source.startswith("seeded")
    for gid in (0, 1):
        assert {r.reward for r in replaced if r.group_id == gid} == {0.0, 1.0}
    assert [r.tokens for r in replaced] == [r.tokens for r in flat]


def test_loop_grpo_datums_match_the_cookbook_path_on_the_local_engine(tiny_service_client, tiny_model_dir):
    rollouts = _batch([[0, 1, 1, 0], [1, 0, 0, 0]])
    batch = sampled_batch(rollouts, [-1.0] * len(rollouts))
    ours = loop_datums(rollouts, arm_step_advantages(GRPO_ARM, batch))
    stock = cookbook_grpo_datums(rollouts)
    assert [d.model_input.to_ints() for d in ours] == [d.model_input.to_ints() for d in stock]

    def fresh():
        return contextlib.nullcontext(tiny_service_client.create_lora_training_client(str(tiny_model_dir), rank=4, seed=0).result())

    results = compare_loss_and_gradient("baseline", fresh, ours, stock, TOL)
    assert [r.name for r in results] == ["baseline_loss", "baseline_gradient"]
    assert all(r.passed for r in results), results
    assert results[1].details["norm"] > 0
    # A wrong advantage (std-normalised GRPO) changes the gradient and is caught.
    adv = arm_step_advantages(GRPO_ARM, batch)
    wrong = loop_datums(rollouts, adv / (np.std(adv) + 1e-6))
    assert not all(r.passed for r in compare_loss_and_gradient("baseline", fresh, wrong, stock, TOL))


def test_feasibility_projection_arithmetic_and_budget():
    timings = PilotTimings(setup_seconds=60, step_seconds={"a": 30.0, "b": 20.0}, eval_seconds_per_item=0.5, gpus=1)
    p = project_full_run(timings, steps=40, n_eval=100, budget_gpu_hours=2, budget_wall_minutes=120,
                         arms_in_parallel=True, recovery_reserve=0.25)
    base = 60 + 40 * 30 + 2 * 100 * 0.5
    assert p.wall_seconds == pytest.approx(1.25 * base)
    assert p.gpu_hours == pytest.approx(1.25 * base / 3600)
    assert p.feasible and p.as_record()["status"] == "feasible"
    serial = project_full_run(timings, steps=40, n_eval=100, budget_gpu_hours=2, budget_wall_minutes=30,
                              arms_in_parallel=False, recovery_reserve=0.25)
    assert serial.phases["train"] == 40 * 50 and serial.phases["setup"] == 120
    assert not serial.feasible and "exceeds the budget of 30 min" in serial.problems[0]
    with pytest.raises(ValueError):
        project_full_run(timings, steps=1, n_eval=1, budget_gpu_hours=1, budget_wall_minutes=1,
                         arms_in_parallel=True, recovery_reserve=0.0)
