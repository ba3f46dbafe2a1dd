"""The arm kinds: one Estimator per spec `advantage` name, and the union of their recipes.

A kind is one module of this package with an `ESTIMATOR`; adding a kind is adding its module
to `KIND_MODULES`. Everything that treats arms differently asks `estimator_for(kind)`.
"""

from __future__ import annotations

from typing import Annotated, Union

from pydantic import Field

from rl.estimators import batch_mean, critic, flash_reinforce, group_mean, kernel_cross_prompt_baseline, leave_one_out, ridge
from rl.estimators.base import Estimator

KIND_MODULES = (group_mean, kernel_cross_prompt_baseline, batch_mean, leave_one_out, flash_reinforce, critic, ridge)
ESTIMATORS: dict[str, Estimator] = {module.ESTIMATOR.kind: module.ESTIMATOR for module in KIND_MODULES}
KINDS = tuple(ESTIMATORS)

# ArmConfig.recipe: the recipe of the arm's kind, discriminated by its `advantage` name.
Recipe = Annotated[Union[tuple(e.recipe_type for e in ESTIMATORS.values())], Field(discriminator="advantage")]  # noqa: UP007


def estimator_for(kind: str) -> Estimator:
    """The Estimator of a spec `advantage` name; ValueError naming the known ones otherwise."""
    try:
        return ESTIMATORS[kind]
    except KeyError:
        raise ValueError(f"no estimator implements {kind!r} (known: {', '.join(KINDS)})") from None


def own_columns() -> tuple[str, ...]:
    """Every kind's own logged output columns and the per-token advantage, each once: what an
    audit compares besides baseline and advantage."""
    return tuple(dict.fromkeys([c for e in ESTIMATORS.values() for c in e.columns] + ["token_advantage"]))


def input_columns() -> tuple[str, ...]:
    """Every kind's own logged input columns, each once."""
    return tuple(dict.fromkeys(c for e in ESTIMATORS.values() for c in e.input_columns))

