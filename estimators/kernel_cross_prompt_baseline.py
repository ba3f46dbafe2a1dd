"""kernel_cross_prompt_baseline (GS1): b_i = kernel-weighted mean reward over a window of
rollouts without i; the arm samples one rollout per prompt. Semantics pinned in DESIGN.md; its
reference is `estimators.reference.gs1_kernel_log_reference` (plain loops)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from estimators import reference
from estimators.base import (WINDOW, Estimator, KernelWindow, RolloutLog, StepAdvantages, StepBatch, finite_features,
                             finite_rewards, step_batches)
from estimators.kernels import effective_neighbors, kernel_weights, scaled_sq_distances, squared_distances, standardize
from schemas.kernel import KernelSpec

PINNED_KERNEL = KernelSpec()  # the user's pre-registered kernel (schemas/kernel.py holds the defaults)
KERNEL_COLUMNS = ("kernel_mass", "effective_neighbors", "fallback")


@dataclass(frozen=True)
class KernelAdvantages:
    """Per-rollout output of the GS1 kernel estimator (float64 arrays; fallback is bool)."""

    baseline: np.ndarray
    advantage: np.ndarray
    kernel_mass: np.ndarray  # sum_j w_ij over the window without i
    effective_neighbors: np.ndarray  # (sum_j w_ij)^2 / sum_j w_ij^2; 0 when there is no weight
    fallback: np.ndarray  # kernel_mass < min_mass (window-mean or lone-rollout baseline used)

    def __len__(self) -> int:
        return len(self.baseline)


def gs1_kernel_step(
    rewards_B,
    features_B_F,
    history_rewards_H=(),
    history_features_H_F=None,
    *,
    kernel: KernelSpec = PINNED_KERNEL,
) -> KernelAdvantages:
    """GS1 kernel baselines for one step's batch of B rollouts under `kernel`.

    The window is the whole current batch plus the most recent max(0, window - B) history
    rollouts (history is the earlier rollouts, oldest first). When window < B the window is the
    current batch alone: every rollout of the step is always in it. For rollout i of the batch:

        z = standardize(window features) * scales       (mean, population std over the window)
        w_ij = exp(-||z_i - z_j||^2 / (2 h^2))           gaussian, for j in the window, j != i
             = exp(-||z_i - z_j|| / h)                   laplace
             = 1 for the round(h) nearest j, else 0      knn (ties: older rollout first)
        mass_i = sum_j w_ij
        b_i = sum_j w_ij r_j / mass_i                    if mass_i >= min_mass
            = mean of r_j over the window without i      otherwise (fallback)
            = r_i                                        if i is alone in its window

    Returns per-rollout baseline, advantage r - b, kernel mass, effective neighbours
    (sum w)^2 / sum w^2 and the fallback flag (mass < min_mass).
    """
    rewards_B = finite_rewards(rewards_B)
    B = rewards_B.shape[0]
    features_B_F = finite_features(features_B_F, B, "features_B_F")
    history_rewards_H = finite_rewards(history_rewards_H)
    H = history_rewards_H.shape[0]
    if H == 0:  # the first step: no history (its features may be None or empty)
        history_features_H_F = np.zeros((0, features_B_F.shape[1]))
    elif history_features_H_F is None:
        raise ValueError("history_features_H_F is required with history rewards")
    history_features_H_F = finite_features(history_features_H_F, H, "history_features_H_F")
    if history_features_H_F.shape[1] != features_B_F.shape[1]:
        raise ValueError("history and batch features must have the same number of columns")
    if B == 0:
        empty = np.zeros(0)
        return KernelAdvantages(empty, empty, empty, empty, np.zeros(0, dtype=bool))

    if features_B_F.shape[1] != len(kernel.features):
        raise ValueError(f"features_B_F must have {len(kernel.features)} columns (one per kernel feature)")
    n_history = min(H, max(0, kernel.window - B))
    rewards_W = np.concatenate([history_rewards_H[H - n_history :], rewards_B])
    features_W_F = np.concatenate([history_features_H_F[H - n_history :], features_B_F], axis=0)
    W = rewards_W.shape[0]

    self_B = (np.arange(B), n_history + np.arange(B))
    if kernel.family == "gaussian":  # the pinned kernel's original arithmetic, unchanged
        z_W_F = standardize(features_W_F, kernel.scales)
        z_B_F = z_W_F[n_history:]
        w_B_W = kernel_weights(squared_distances(z_B_F, z_W_F), kernel.bandwidth, kernel.family)
        w_B_W[self_B] = 0.0  # leave self out
    else:  # laplace, knn: distances built as hillclimb/climb.py builds them; self is no neighbour
        sq_dist_B_W = scaled_sq_distances(features_W_F, n_history + np.arange(B), kernel.scales)
        sq_dist_B_W[self_B] = np.inf
        w_B_W = kernel_weights(sq_dist_B_W, kernel.bandwidth, kernel.family)

    mass_B = w_B_W.sum(axis=1)
    fallback_B = mass_B < kernel.min_mass
    kernel_mean_B = (w_B_W @ rewards_W) / np.where(fallback_B, 1.0, mass_B)
    loo_mean_B = (rewards_W.sum() - rewards_B) / max(W - 1, 1)
    baseline_B = np.where(fallback_B, loo_mean_B, kernel_mean_B)
    if W == 1:
        baseline_B = rewards_B.copy()  # alone in its window: advantage 0
    return KernelAdvantages(
        baseline=baseline_B,
        advantage=rewards_B - baseline_B,
        kernel_mass=mass_B,
        effective_neighbors=effective_neighbors(w_B_W),
        fallback=fallback_B,
    )


def gs1_kernel_log(steps_R, rewards_R, features_R_F, kernel: KernelSpec = PINNED_KERNEL) -> KernelAdvantages:
    """GS1 kernel baselines over a whole rollout log (rows in rollout order).

    Consecutive rows of one step form its batch; the history of a step is every earlier row, read
    straight from the log (not through a `KernelWindow`: this is the loop's offline cross-check).
    """
    rewards_R = finite_rewards(rewards_R)
    features_R_F = finite_features(features_R_F, rewards_R.shape[0], "features_R_F")
    if len(steps_R) != rewards_R.shape[0]:
        raise ValueError("steps and rewards must have the same length")
    out = {k: np.zeros(rewards_R.shape[0]) for k in ("baseline", "advantage", "kernel_mass", "effective_neighbors")}
    fallback_R = np.zeros(rewards_R.shape[0], dtype=bool)
    for start, stop in step_batches(steps_R):
        history_start = max(0, start - max(0, kernel.window - (stop - start)))
        step = gs1_kernel_step(rewards_R[start:stop], features_R_F[start:stop], rewards_R[history_start:start],
                               features_R_F[history_start:start], kernel=kernel)
        for k, column in out.items():
            column[start:stop] = getattr(step, k)
        fallback_R[start:stop] = step.fallback
    return KernelAdvantages(fallback=fallback_R, **out)


class KernelBaselineRecipe(BaseModel):
    """The arm's kernel, and the `kernel.json` it was read from with its sha256 (or None)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    advantage: Literal["kernel_cross_prompt_baseline"] = "kernel_cross_prompt_baseline"
    kernel: KernelSpec = PINNED_KERNEL
    kernel_source: str | None = None


class KernelCrossPromptBaseline(Estimator):
    kind = "kernel_cross_prompt_baseline"
    cli_aliases = ("gs1_kernel",)
    recipe_type = KernelBaselineRecipe
    summary = "b_i = kernel-weighted mean reward of the window's other rollouts (GS1)"
    rollouts_per_prompt = "one"
    needs = frozenset({WINDOW})
    columns = KERNEL_COLUMNS
    reference_name = "estimators.reference.gs1_kernel_log_reference"
    spec_fields = ("kernel", "kernel_file")
    reads_prompt_features = True

    def recipe_of(self, arm_spec) -> KernelBaselineRecipe:
        return KernelBaselineRecipe(kernel=arm_spec.kernel, kernel_source=arm_spec.kernel_source)

    def kernel_file_fields(self, kernel: dict) -> dict:
        return {"kernel": KernelSpec.model_validate(kernel)}

    def describe(self, recipe, *, lora_rank: int) -> str:
        k = recipe.kernel
        return (f"kernel {k.family}, bandwidth {k.bandwidth:g}, window {k.window}, min_mass {k.min_mass:g}, "
                f"features {', '.join(k.features)}" + (f", from {recipe.kernel_source}" if recipe.kernel_source else ""))

    def label(self, recipe) -> str:
        return recipe.kernel.label() + ("" if recipe.kernel_source is None else ", from " + recipe.kernel_source)

    def kernel_of(self, recipe) -> KernelSpec:
        return recipe.kernel

    def with_kernel(self, recipe, kernel: KernelSpec) -> KernelBaselineRecipe:
        return recipe.model_copy(update={"kernel": kernel})

    def new_window(self, recipe) -> KernelWindow:
        return KernelWindow.empty(recipe.kernel.window)

    def advance_window(self, recipe, window, batch: StepBatch) -> KernelWindow:
        return window.extended(batch.rewards_B, batch.kernel_features(recipe.kernel))

    def advantages(self, recipe, batch: StepBatch, window: KernelWindow | None) -> StepAdvantages:
        kernel = recipe.kernel
        if window is None:
            raise ValueError("a kernel_cross_prompt_baseline step needs a KernelWindow")
        if window.size != kernel.window:
            raise ValueError(f"kernel window {kernel.window} != KernelWindow size {window.size}")
        step = gs1_kernel_step(batch.rewards_B, batch.kernel_features(kernel), window.rewards_H, window.features_H_F,
                               kernel=kernel)
        return StepAdvantages(step.baseline, step.advantage, {name: getattr(step, name) for name in KERNEL_COLUMNS})

    def reference(self, recipe, log: RolloutLog) -> dict[str, list]:
        features = reference.reference_features(log.prompt_num_tokens_R.tolist(), log.prompt_mean_logprob_R.tolist(),
                                                recipe.kernel)
        return reference.gs1_kernel_log_reference(log.step_R.tolist(), log.reward_R.tolist(), features, recipe.kernel)


ESTIMATOR = KernelCrossPromptBaseline()
