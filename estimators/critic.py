"""critic: b_i = a trained value model's P(yes) / (P(yes) + P(no)) for i's prompt, read before the
step's rewards train it. The value model is a second LoRA client on the arm's base model (CRITIC):
the loop takes its forward pass before the advantages and its training step after."""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from estimators import reference
from estimators.base import CRITIC, AuditInputMissing, Estimator, RolloutLog, StepAdvantages, StepBatch, finite_rewards
from schemas.errors import FieldProblems, known_keys_only


class CriticSpec(BaseModel):
    """The critic arm's value model: a second LoRA client on the arm's base model.

    Its value for a prompt is P(yes) / (P(yes) + P(no)) for the answer token after the prompt
    followed by `question`; after each step it is trained with cross-entropy on that step's
    (prompt, reward) pairs, target min(max(reward, 0), 1), by one Adam step at `lr`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    lr: float = 1e-4
    lora_rank: int | None = None  # None: the policy's rank
    question: str = "\nWill this problem be answered correctly? Answer yes or no:"
    yes: str = " yes"
    no: str = " no"

    @model_validator(mode="before")
    @classmethod
    def _known_keys_only(cls, data):
        return known_keys_only(cls, data)

    @model_validator(mode="after")
    def _recipe(self):
        problems = []
        if not (math.isfinite(self.lr) and self.lr > 0):
            problems.append(("lr", "must be > 0"))
        if self.lora_rank is not None and self.lora_rank < 1:
            problems.append(("lora_rank", "must be >= 1"))
        if self.yes == self.no:
            problems.append(("no", "must differ from yes"))
        if problems:
            raise FieldProblems(problems)
        return self


def critic_values(yes_logprob_B, no_logprob_B) -> np.ndarray:
    """The critic's value of each prompt: P(yes) / (P(yes) + P(no)) = sigmoid(log P(yes) - log P(no))."""
    yes_B = np.asarray(yes_logprob_B, dtype=np.float64)
    no_B = np.asarray(no_logprob_B, dtype=np.float64)
    if yes_B.shape != no_B.shape or yes_B.ndim != 1 or not (np.all(np.isfinite(yes_B)) and np.all(np.isfinite(no_B))):
        raise ValueError("critic logprobs must be finite 1-d arrays of equal length")
    d_B = yes_B - no_B
    e_B = np.exp(-np.abs(d_B))
    return np.where(d_B >= 0, 1.0 / (1.0 + e_B), e_B / (1.0 + e_B))


def critic_advantages(rewards_B, yes_logprob_B, no_logprob_B) -> tuple[np.ndarray, np.ndarray]:
    """b_i = the critic's value of i's prompt, read before the step's rewards train it."""
    rewards_B = finite_rewards(rewards_B)
    baseline_B = critic_values(yes_logprob_B, no_logprob_B)
    if baseline_B.shape != rewards_B.shape:
        raise ValueError("critic logprobs need one entry per reward")
    return baseline_B, rewards_B - baseline_B


def critic_targets(rewards_B) -> np.ndarray:
    """What the critic is trained towards: each reward clipped into [0, 1] (a yes-probability)."""
    return np.clip(finite_rewards(rewards_B), 0.0, 1.0)


class CriticRecipe(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    advantage: Literal["critic"] = "critic"
    critic: CriticSpec = Field(default_factory=CriticSpec)


class Critic(Estimator):
    kind = "critic"
    recipe_type = CriticRecipe
    summary = "b_i = a trained value model's P(yes) / (P(yes) + P(no)) for i's prompt"
    rollouts_per_prompt = "one"
    needs = frozenset({CRITIC})
    input_columns = ("critic_yes_logprob", "critic_no_logprob")
    reference_name = "estimators.reference.critic_log_reference"
    spec_fields = ("critic",)

    def recipe_of(self, arm_spec) -> CriticRecipe:
        return CriticRecipe(critic=arm_spec.critic)

    def describe(self, recipe, *, lora_rank: int) -> str:
        c = recipe.critic
        return f"critic: second LoRA client (rank {c.lora_rank or lora_rank}), lr {c.lr:g}, answers {c.yes!r}/{c.no!r}"

    def label(self, recipe) -> str:
        return f"critic lr {recipe.critic.lr:g}"

    def critic_of(self, recipe) -> CriticSpec:
        return recipe.critic

    def advantages(self, recipe, batch: StepBatch, window) -> StepAdvantages:
        if batch.critic_yes_logprob_B is None or batch.critic_no_logprob_B is None:
            raise ValueError("critic needs the batch's critic logprobs")
        return StepAdvantages(*critic_advantages(batch.rewards_B, batch.critic_yes_logprob_B, batch.critic_no_logprob_B))

    def reference(self, recipe, log: RolloutLog) -> dict[str, list]:
        if log.critic_yes_logprob_R is None or log.critic_no_logprob_R is None:
            raise AuditInputMissing("the log has no critic logprobs to recompute the baseline from")
        return reference.critic_log_reference(log.reward_R.tolist(), log.critic_yes_logprob_R.tolist(),
                                              log.critic_no_logprob_R.tolist())

    def stand_in_inputs(self, recipe, batch_size: int, rng: np.random.Generator) -> dict:
        """yes/no logprobs spread over a wide range (P(yes) / (P(yes) + P(no)) from ~0 to ~1), and
        pairs whose probabilities both underflow."""
        both_B = rng.choice([0.0, 800.0], batch_size, p=[0.8, 0.2])  # both probabilities underflow
        return {"critic_yes_logprob_B": -rng.exponential(3.0, batch_size) - both_B - rng.choice([0.0, 40.0], batch_size, p=[0.8, 0.2]),
                "critic_no_logprob_B": -rng.exponential(3.0, batch_size) - both_B}


ESTIMATOR = Critic()
