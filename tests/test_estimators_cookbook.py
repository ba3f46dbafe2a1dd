"""Advantage estimators against the stock tinker cookbook (needs torch and tinker; the pure-numpy
estimator tests are in tests/test_estimators.py)."""

from __future__ import annotations

import numpy as np
import pytest
import tinker
import torch
from tinker_cookbook.completers import TokensWithLogprobs
from tinker_cookbook.rl.data_processing import compute_advantages
from tinker_cookbook.rl.types import Trajectory, TrajectoryGroup, Transition

from estimators import grpo_advantages
from estimators.reference import gs1_kernel_reference
from rl import checks


def _trajectory_groups(rewards_P_G):
    ob = tinker.ModelInput.from_ints([11, 12])
    return [
        TrajectoryGroup(
            trajectories_G=[
                Trajectory(
                    transitions=[Transition(ob=ob, ac=TokensWithLogprobs([7, 8], [-0.1, -0.2]), reward=float(r), episode_done=True)],
                    final_ob=ob,
                )
                for r in rewards_G
            ],
            final_rewards_G=[0.0] * len(rewards_G),
            metrics_G=[{} for _ in rewards_G],
        )
        for rewards_G in rewards_P_G
    ]


@pytest.mark.parametrize("seed", range(5))
def test_grpo_equals_cookbook_compute_advantages(seed):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 9, size=6)  # includes groups of one
    rewards_P_G = [rng.random(s) * rng.choice([1.0, 5.0]) for s in sizes]
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # the cookbook builds its tensors in the default dtype
    try:
        cookbook_P = compute_advantages(_trajectory_groups(rewards_P_G))
    finally:
        torch.set_default_dtype(previous)
    cookbook_R = torch.cat(cookbook_P).numpy()
    baseline_R, advantage_R = grpo_advantages(np.concatenate(rewards_P_G), np.repeat(np.arange(len(sizes)), sizes))
    np.testing.assert_allclose(advantage_R, cookbook_R, rtol=0, atol=1e-12)
    np.testing.assert_allclose(baseline_R + advantage_R, np.concatenate(rewards_P_G), rtol=0, atol=1e-15)


def test_offline_checks_pass_with_the_reference():
    results = checks.run_offline_checks(gs1_kernel_reference)
    assert [r.name for r in results] == [
        "forced_activation", "forced_nonactivation", "fallback_path", "grpo_matches_cookbook", "kernel_matches_reference",
    ]
    assert all(r.passed for r in results), results
    assert all(isinstance(r.passed, bool) for r in results)
