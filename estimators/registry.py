"""The arm kinds: one Estimator per spec `advantage` name, and the union of their recipes.

A kind is one module of this package with an `ESTIMATOR`; adding a kind is adding its module
to `KIND_MODULES`. Everything that treats arms differently asks `estimator_for(kind)`.
"""

from __future__ import annotations

from typing import Annotated, Union

import numpy as np
from pydantic import Field

from estimators import batch_mean, critic, flash_reinforce, group_mean, kernel_cross_prompt_baseline, leave_one_out, ridge
from estimators.base import Estimator, RolloutLog

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


def rollout_log(table) -> RolloutLog:
    """The audited columns of a rollouts table (pyarrow): rewards, features, the logged baseline,
    advantage and every kind's own columns, and the kinds' inputs; an input any row lacks is None."""

    def column(name, dtype=np.float64):
        return np.asarray(table.column(name).to_pylist(), dtype=dtype)

    def present(name):  # a column every row has a value in, else None
        values = table.column(name).to_pylist() if name in table.column_names else []
        return values if values and all(v is not None for v in values) else None

    logged = {"baseline": column("baseline"), "advantage": column("advantage")}
    for name in own_columns():
        if (values := present(name)) is not None:
            logged[name] = np.asarray(values, dtype=np.float64)
    yes, no = present("critic_yes_logprob"), present("critic_no_logprob")
    return RolloutLog(column("step", np.int64), column("group_id", np.int64), column("reward"),
                      column("prompt_num_tokens"), column("prompt_mean_logprob"), logged,
                      sampler_logprobs_R_T=present("sampler_logprobs"), learner_logprobs_R_T=present("learner_logprobs"),
                      critic_yes_logprob_R=None if yes is None else np.asarray(yes, dtype=np.float64),
                      critic_no_logprob_R=None if no is None else np.asarray(no, dtype=np.float64))
