"""group_mean (GRPO): b_i = mean reward of i's group (same prompt, same step), no std division;
equal to `tinker_cookbook.rl.data_processing.compute_advantages`, which is its reference."""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from estimators.base import Estimator, RolloutLog, StepAdvantages, StepBatch, finite_rewards


def group_sums(rewards_R: np.ndarray, group_ids_R) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(group index per rollout, reward sum per group, size per group)."""
    group_ids_R = np.asarray(group_ids_R)
    if group_ids_R.shape != rewards_R.shape:
        raise ValueError("group_ids must have one entry per reward")
    _, group_R = np.unique(group_ids_R, return_inverse=True)
    group_R = group_R.reshape(-1)
    return group_R, np.bincount(group_R, weights=rewards_R), np.bincount(group_R)


def grpo_advantages(rewards_R, group_ids_R) -> tuple[np.ndarray, np.ndarray]:
    """b_i = mean reward of i's group (self included). Returns (baseline_R, advantage_R)."""
    rewards_R = finite_rewards(rewards_R)
    group_R, sums_G, sizes_G = group_sums(rewards_R, group_ids_R)
    baseline_R = sums_G[group_R] / sizes_G[group_R]
    return baseline_R, rewards_R - baseline_R


class GroupMeanRecipe(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    advantage: Literal["group_mean"] = "group_mean"


class GroupMean(Estimator):
    kind = "group_mean"
    cli_aliases = ("grpo",)
    recipe_type = GroupMeanRecipe
    summary = "b_i = mean reward of i's group (GRPO, no std division)"
    reference_name = "tinker_cookbook.rl.data_processing.compute_advantages"
    float32_reference = True

    def advantages(self, recipe, batch: StepBatch, window) -> StepAdvantages:
        return StepAdvantages(*grpo_advantages(batch.rewards_B, batch.group_ids_B))

    def reference(self, recipe, log: RolloutLog) -> dict[str, list]:
        """GRPO through the stock cookbook: one TrajectoryGroup per (step, group), its advantages."""
        import tinker
        from tinker_cookbook.completers import TokensWithLogprobs
        from tinker_cookbook.rl.data_processing import compute_advantages
        from tinker_cookbook.rl.types import Trajectory, TrajectoryGroup, Transition

        ob = tinker.ModelInput.from_ints([0])
        keys = list(dict.fromkeys(zip(log.step_R.tolist(), log.group_id_R.tolist())))  # first-seen order
        rows_of = {key: [] for key in keys}
        for row, key in enumerate(zip(log.step_R.tolist(), log.group_id_R.tolist())):
            rows_of[key].append(row)
        groups_P = [
            TrajectoryGroup(
                trajectories_G=[
                    Trajectory(transitions=[Transition(ob=ob, ac=TokensWithLogprobs([0], [0.0]), reward=float(log.reward_R[r]),
                                                       episode_done=True)], final_ob=ob)
                    for r in rows_of[key]
                ],
                final_rewards_G=[0.0] * len(rows_of[key]),
                metrics_G=[{} for _ in rows_of[key]],
            )
            for key in keys
        ]
        advantage = [0.0] * len(log)
        for key, advantages_G in zip(keys, compute_advantages(groups_P)):
            for r, a in zip(rows_of[key], advantages_G.tolist()):
                advantage[r] = float(a)
        return {"advantage": advantage, "baseline": [float(r) - a for r, a in zip(log.reward_R.tolist(), advantage)]}


ESTIMATOR = GroupMean()
