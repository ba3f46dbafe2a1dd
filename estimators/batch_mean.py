"""batch_mean: b_i = mean reward of the step's batch, i included (FlashREINFORCE's baseline)."""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from estimators import reference
from estimators.base import Estimator, RolloutLog, StepAdvantages, StepBatch, finite_rewards


def batch_mean_advantages(rewards_R) -> tuple[np.ndarray, np.ndarray]:
    """b_i = mean reward of the whole batch (self included). Returns (baseline_R, advantage_R)."""
    rewards_R = finite_rewards(rewards_R)
    baseline_R = np.full_like(rewards_R, rewards_R.mean()) if rewards_R.size else rewards_R.copy()
    return baseline_R, rewards_R - baseline_R


class BatchMeanRecipe(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    advantage: Literal["batch_mean"] = "batch_mean"


class BatchMean(Estimator):
    kind = "batch_mean"
    recipe_type = BatchMeanRecipe
    summary = "b_i = mean reward of the step's batch (i included)"
    prompt_blind = True
    reference_name = "estimators.reference.batch_mean_log_reference"

    def advantages(self, recipe, batch: StepBatch, window) -> StepAdvantages:
        return StepAdvantages(*batch_mean_advantages(batch.rewards_B))

    def reference(self, recipe, log: RolloutLog) -> dict[str, list]:
        return reference.batch_mean_log_reference(log.step_R.tolist(), log.reward_R.tolist())


ESTIMATOR = BatchMean()
