"""ridge: b_i = a ridge regression of reward on the z-scored prompt features, fitted on earlier
steps only -- the hill-climb's `ridge` family (`hillclimb/climb.py: ridge_baselines`), which
until now no arm could run. One rollout per prompt.

For step t with batch B (rows in rollout order), the fit rows are the window: the `history` most
recent rollouts of the steps before t (never a row of step t itself, so no rollout's own reward
enters its baseline, and nothing of step t is looked ahead at). With n fit rows:

    n < 2:    b_i = mean reward of the step's other rollouts (r_i when i is alone)
    else:     z_f   = (x_f - mean_f) / std_f over the fit rows, population std; a feature whose
                      fit values are all equal has z = 0 (fit and step rows alike)
              beta  = argmin sum_fit (y - ybar - z beta)^2 + penalty * n * ||beta||^2
              b_i   = clip(ybar + z_i beta, min y_fit, max y_fit)

The penalty is the spec's `ridge.penalty` (lambda; the hill-climb's bandwidth for this family),
the fit window `ridge.history` (its window), the features `ridge.features` (of the two the loop
logs). A `gs1 hillclimb` kernel object of family ridge, `{"kernel": {...}}`, runs as is
(`kernel_file`). Its reference, `ridge_log_reference` below, is plain Python (no numpy): the
normal equations solved by Gauss-Jordan elimination.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from estimators import reference
from estimators.base import WINDOW, Estimator, KernelWindow, RolloutLog, StepAdvantages, StepBatch, finite_rewards
from schemas.errors import FieldProblems, known_keys_only
from schemas.kernel import FEATURE_NAMES


class RidgeSpec(BaseModel):
    """The spec arm's `ridge` object: the penalty, the fit window and the features."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    penalty: float = 1.0  # lambda: the ridge term is penalty * n * ||beta||^2 over n fit rows
    history: int = 256  # fit rows: the most recent rollouts of earlier steps
    features: tuple[str, ...] = FEATURE_NAMES

    @model_validator(mode="before")
    @classmethod
    def _known_keys_only(cls, data):
        return known_keys_only(cls, data)

    @field_validator("features")
    @classmethod
    def _features(cls, v):
        unknown = [f for f in v if f not in FEATURE_NAMES]
        if not v or unknown or len(set(v)) != len(v):
            raise ValueError(f"must name distinct features among {', '.join(FEATURE_NAMES)}")
        return tuple(v)

    @model_validator(mode="after")
    def _bounds(self):
        problems = []
        if not (math.isfinite(self.penalty) and self.penalty > 0):
            problems.append(("penalty", "must be > 0"))
        if self.history < 2:
            problems.append(("history", "must be >= 2"))
        if problems:
            raise FieldProblems(problems)
        return self

    @classmethod
    def from_kernel_object(cls, kernel: dict) -> RidgeSpec:
        """A `gs1 hillclimb` recipe of family ridge (its bandwidth the penalty, its window the history)."""
        if not isinstance(kernel, dict) or kernel.get("family") != "ridge":
            family = kernel.get("family") if isinstance(kernel, dict) else None
            raise ValueError(f"a ridge arm runs a recipe of family 'ridge', not {family!r}")
        scales = kernel.get("scales")
        if scales is not None and any(float(s) != 1.0 for s in scales):
            raise ValueError("a ridge recipe has no feature scales (z-scoring undoes them)")
        return cls.model_validate({"penalty": kernel.get("bandwidth"), "history": kernel.get("window"),
                                   "features": kernel.get("features", FEATURE_NAMES)})


class RidgeRecipe(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    advantage: Literal["ridge"] = "ridge"
    ridge: RidgeSpec = Field(default_factory=RidgeSpec)
    kernel_source: str | None = None  # the kernel.json it was read from, with its sha256


def ridge_baselines_step(rewards_B, features_B_F, fit_rewards_H, fit_features_H_F, *, penalty: float) -> np.ndarray:
    """One step's ridge baselines (the module docstring), fitted on the H fit rows."""
    rewards_B = finite_rewards(rewards_B)
    B = rewards_B.shape[0]
    y_H = finite_rewards(fit_rewards_H)
    n = y_H.shape[0]
    if n < 2:
        return (rewards_B.sum() - rewards_B) / (B - 1) if B > 1 else rewards_B.copy()
    X_H = np.asarray(fit_features_H_F, dtype=np.float64)
    X_B = np.asarray(features_B_F, dtype=np.float64)
    constant_F = np.all(X_H == X_H[:1], axis=0)
    mean_F = X_H.mean(axis=0)
    std_F = np.where(constant_F, 1.0, X_H.std(axis=0))
    Z_H = np.where(constant_F, 0.0, (X_H - mean_F) / std_F)
    Z_B = np.where(constant_F, 0.0, (X_B - mean_F) / std_F)
    y_bar = y_H.mean()
    beta_F = np.linalg.solve(Z_H.T @ Z_H + penalty * n * np.eye(Z_H.shape[1]), Z_H.T @ (y_H - y_bar))
    return np.clip(y_bar + Z_B @ beta_F, y_H.min(), y_H.max())


def ridge_log_reference(steps, rewards, features, *, penalty: float, history: int) -> dict[str, list]:
    """The ridge baselines over a whole log in rollout order, in plain Python (the reference):
    each step's fit rows are the `history` rows of the log before the step's first row."""
    out = {"baseline": [], "advantage": []}
    for start, stop in reference._step_runs(steps):  # the references' own split of a log into steps
        lo = max(0, start - history)
        fit = list(range(lo, start))
        n = len(fit)
        for i in range(start, stop):
            if n < 2:
                others = [float(rewards[j]) for j in range(start, stop) if j != i]
                baseline = sum(others) / len(others) if others else float(rewards[i])
            else:
                baseline = _ridge_prediction([features[j] for j in fit], [float(rewards[j]) for j in fit], features[i], penalty)
            out["baseline"].append(baseline)
            out["advantage"].append(float(rewards[i]) - baseline)
    return out


def _ridge_prediction(fit_rows, fit_y, row, penalty):
    n, p = len(fit_rows), len(row)
    z_fit = [[0.0] * p for _ in range(n)]
    z_row = [0.0] * p
    for f in range(p):
        column = [float(r[f]) for r in fit_rows]
        if all(v == column[0] for v in column):
            continue  # a constant feature carries no signal
        mean = sum(column) / n
        std = math.sqrt(sum((v - mean) ** 2 for v in column) / n)
        for k in range(n):
            z_fit[k][f] = (column[k] - mean) / std
        z_row[f] = (float(row[f]) - mean) / std
    y_bar = sum(fit_y) / n
    # normal equations (Z'Z + penalty * n * I) beta = Z'(y - ybar), solved by Gauss-Jordan
    a = [[sum(z_fit[k][f] * z_fit[k][g] for k in range(n)) + (penalty * n if f == g else 0.0) for g in range(p)]
         + [sum(z_fit[k][f] * (fit_y[k] - y_bar) for k in range(n))] for f in range(p)]
    for col in range(p):
        pivot = max(range(col, p), key=lambda r: abs(a[r][col]))
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(p):
            if r != col:
                factor = a[r][col] / a[col][col]
                a[r] = [x - factor * y for x, y in zip(a[r], a[col])]
    prediction = y_bar + sum(z_row[f] * a[f][p] / a[f][f] for f in range(p))
    return min(max(prediction, min(fit_y)), max(fit_y))


class Ridge(Estimator):
    kind = "ridge"
    recipe_type = RidgeRecipe
    summary = "b_i = a ridge regression of reward on the z-scored prompt features, fitted on earlier steps"
    rollouts_per_prompt = "one"
    needs = frozenset({WINDOW})
    reads_prompt_features = True
    reference_name = "estimators.ridge.ridge_log_reference"
    spec_fields = ("ridge", "kernel_file")
    own_spec_keys = {"ridge": RidgeSpec}

    def recipe_of(self, arm_spec) -> RidgeRecipe:
        return RidgeRecipe(ridge=arm_spec.spec_value("ridge"), kernel_source=arm_spec.kernel_source)

    def kernel_file_fields(self, kernel: dict) -> dict:
        return {"ridge": RidgeSpec.from_kernel_object(kernel)}

    def describe(self, recipe, *, lora_rank: int) -> str:
        r = recipe.ridge
        return (f"ridge of reward on {', '.join(r.features)} (z-scored), penalty {r.penalty:g}, fitted on the "
                f"{r.history} most recent earlier rollouts" + (f", from {recipe.kernel_source}" if recipe.kernel_source else ""))

    def label(self, recipe) -> str:
        return f"ridge lam={recipe.ridge.penalty:g} W={recipe.ridge.history}"

    def new_window(self, recipe) -> KernelWindow:
        return KernelWindow.empty(recipe.ridge.history)

    def advance_window(self, recipe, window, batch: StepBatch) -> KernelWindow:
        return window.extended(batch.rewards_B, batch.features(recipe.ridge.features))

    def advantages(self, recipe, batch: StepBatch, window: KernelWindow | None) -> StepAdvantages:
        if window is None or window.size != recipe.ridge.history:
            raise ValueError(f"a ridge step needs the KernelWindow of its {recipe.ridge.history} fit rows")
        features_H_F = window.features_H_F if window.features_H_F is not None else np.zeros((0, len(recipe.ridge.features)))
        baseline_B = ridge_baselines_step(batch.rewards_B, batch.features(recipe.ridge.features), window.rewards_H,
                                          features_H_F, penalty=recipe.ridge.penalty)
        return StepAdvantages(baseline_B, np.asarray(batch.rewards_B, dtype=np.float64) - baseline_B)

    def reference(self, recipe, log: RolloutLog) -> dict[str, list]:
        features = [[math.log(float(n)) if name == "log_prompt_num_tokens" else float(m) for name in recipe.ridge.features]
                    for n, m in zip(log.prompt_num_tokens_R.tolist(), log.prompt_mean_logprob_R.tolist())]
        return ridge_log_reference(log.step_R.tolist(), log.reward_R.tolist(), features, penalty=recipe.ridge.penalty,
                                   history=recipe.ridge.history)


ESTIMATOR = Ridge()
