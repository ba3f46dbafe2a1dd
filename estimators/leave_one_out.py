"""leave_one_out (RLOO): b_i = mean reward of the other rollouts of i's group; a group of one
gets advantage 0."""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from estimators import reference
from estimators.base import Estimator, RolloutLog, StepAdvantages, StepBatch, finite_rewards
from estimators.group_mean import group_sums


def rloo_advantages(rewards_R, group_ids_R) -> tuple[np.ndarray, np.ndarray]:
    """b_i = mean reward of the other rollouts of i's group; a group of one gets b_i = r_i."""
    rewards_R = finite_rewards(rewards_R)
    group_R, sums_G, sizes_G = group_sums(rewards_R, group_ids_R)
    others_R = sizes_G[group_R] - 1
    loo_R = (sums_G[group_R] - rewards_R) / np.maximum(others_R, 1)
    baseline_R = np.where(others_R > 0, loo_R, rewards_R)
    return baseline_R, rewards_R - baseline_R


class LeaveOneOutRecipe(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    advantage: Literal["leave_one_out"] = "leave_one_out"


class LeaveOneOut(Estimator):
    kind = "leave_one_out"
    cli_aliases = ("rloo",)
    recipe_type = LeaveOneOutRecipe
    summary = "b_i = mean reward of the other rollouts of i's group"
    rollouts_per_prompt = "at least two"
    reference_name = "estimators.reference.rloo_log_reference"

    def advantages(self, recipe, batch: StepBatch, window) -> StepAdvantages:
        return StepAdvantages(*rloo_advantages(batch.rewards_B, batch.group_ids_B))

    def reference(self, recipe, log: RolloutLog) -> dict[str, list]:
        return reference.rloo_log_reference(log.step_R.tolist(), log.group_id_R.tolist(), log.reward_R.tolist())


ESTIMATOR = LeaveOneOut()
