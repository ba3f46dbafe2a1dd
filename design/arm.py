"""A training arm as the run executes it: `ArmConfig`.

`ArmConfig` is built once from the spec (`design.plan.plan_from_spec`), carried in the run plan,
handed to every stage that runs the arm (preflight, pilot, training, audit) and to the RL loop.

Its `recipe` is its kind's recipe (`estimators.registry.Recipe`: a union discriminated by the
spec's `advantage` name, the one name a kind has): a kernel_cross_prompt_baseline arm holds its
`KernelSpec`, a flash_reinforce arm its trust threshold, a critic arm its `CriticSpec`, the rest
nothing. What the arm's kind does is its `estimator` (the registry's Estimator for that name).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from estimators.base import Estimator
from estimators.critic import CriticSpec
from estimators.registry import Recipe, estimator_for
from schemas.kernel import KernelSpec
from schemas.layout import unit_name
from schemas.optimizer import ADAM

__all__ = ["ArmConfig", "CriticSpec"]

# Recipe fields that plans written before recipes (and callers of that time) hold beside `advantage`.
_FLAT_RECIPE_KEYS = ("kernel", "kernel_source", "trust_delta", "critic")


class ArmConfig(BaseModel):
    """Everything that defines one training arm."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    recipe: Recipe
    group_size: int
    groups_per_batch: int
    lr: float
    seed: int
    steps: int
    lora_rank: int
    base_model: str
    base_model_path: str | None = None
    max_tokens: int = 512
    temperature: float = 1.0
    beta1: float = ADAM.beta1
    beta2: float = ADAM.beta2
    eps: float = ADAM.eps
    # The decision seed this unit runs at, in a spec of several seeds (None: a single-seed spec,
    # where the arm runs at its own `seed` on the shared seed-0 prompt order, as it always has).
    run_seed: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _flat_recipe(cls, data: Any):
        """`advantage` and its recipe's fields beside it (a plan written before recipes) -> `recipe`."""
        if not isinstance(data, dict) or "recipe" in data or "advantage" not in data:
            return data
        data = dict(data)
        recipe = {"advantage": data.pop("advantage")}
        for key in _FLAT_RECIPE_KEYS:
            if (value := data.pop(key, None)) is not None:
                recipe[key] = value
        return {**data, "recipe": recipe}

    @property
    def advantage(self) -> str:
        """The spec's name of its kind."""
        return self.recipe.advantage

    @property
    def estimator(self) -> Estimator:
        return estimator_for(self.recipe.advantage)

    @property
    def kernel(self) -> KernelSpec | None:
        """The kernel its recipe holds (None for a kind without one)."""
        return self.estimator.kernel_of(self.recipe)

    @property
    def critic(self) -> CriticSpec | None:
        """Its value model's spec when its kind needs one (None otherwise)."""
        return self.estimator.critic_of(self.recipe)

    @property
    def unit(self) -> str:
        """Its folder under train/ and eval/ (schemas.layout.unit_name)."""
        return unit_name(self.name, self.run_seed)

    @property
    def order_seed(self) -> int:
        """The seed of its prompt order: 0 in a single-seed spec (shared by every arm), else the
        decision seed (shared by every arm at that seed)."""
        return self.run_seed or 0

    def at_seed(self, run_seed: int) -> ArmConfig:
        """This arm as one unit of a multi-seed run: its own init and sampling seed offset by the
        decision seed, and that seed's prompt order."""
        return self.model_copy(update={"run_seed": run_seed, "seed": self.seed + run_seed})

    @property
    def batch_size(self) -> int:
        return self.group_size * self.groups_per_batch

    def with_kernel_bandwidth(self, bandwidth: float) -> ArmConfig:
        """This arm with its kernel at another bandwidth (the pre-registered calibration)."""
        assert self.kernel is not None, f"arm {self.name} has no kernel"
        return self.model_copy(update={"recipe": self.estimator.with_kernel(self.recipe, self.kernel.with_bandwidth(bandwidth))})
