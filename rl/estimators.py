"""Advantage estimators (float64 numpy, small pure functions over plain arrays).

Every estimator gives each rollout a baseline b_i and the advantage r_i - b_i. Semantics are
pinned in DESIGN.md ("Spec semantics pinned here"):

- grpo: b_i = mean reward of i's group (same prompt, same step), no std division; equal to
  `tinker_cookbook.rl.data_processing.compute_advantages`.
- batch_mean: b_i = mean reward of the step's batch, i included (FlashREINFORCE's baseline).
- rloo: b_i = mean reward of the other rollouts of i's group; a group of one gets advantage 0.
- gs1_kernel: b_i = kernel-weighted mean reward over a window of rollouts without i (below).
- flash_reinforce: batch_mean's b_i, plus the FlashREINFORCE trust gate (per-trajectory mean
  Bernoulli KL between sampler and learner token probabilities <= delta) and the per-token
  advantage A_i * admitted_i / (T_i * B) its datum carries (below).
- critic: b_i = the trained critic's P(yes) / (P(yes) + P(no)) for i's prompt.

The RL loop calls `advantages_for_step` once per step: a pure function of the step's batch and,
for gs1_kernel, the arm's `KernelSpec` and the `KernelWindow` of earlier rollouts. The loop alone
advances the window (`KernelWindow.extended`), once per step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rl.kernels import (
    effective_neighbors,
    kernel_weights,
    prompt_features,
    scaled_sq_distances,
    squared_distances,
    standardize,
)
from schemas.arm import estimator_id
from schemas.kernel import KernelSpec

PINNED_KERNEL = KernelSpec()  # the user's pre-registered kernel (schemas/kernel.py holds the defaults)


# ---------------------------------------------------------------------------- group baselines


def _rewards(rewards_R) -> np.ndarray:
    rewards_R = np.asarray(rewards_R, dtype=np.float64)
    if rewards_R.ndim != 1:
        raise ValueError("rewards must be a 1-d array")
    if not np.all(np.isfinite(rewards_R)):
        raise ValueError("rewards must be finite")
    return rewards_R


def _group_sums(rewards_R: np.ndarray, group_ids_R) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(group index per rollout, reward sum per group, size per group)."""
    group_ids_R = np.asarray(group_ids_R)
    if group_ids_R.shape != rewards_R.shape:
        raise ValueError("group_ids must have one entry per reward")
    _, group_R = np.unique(group_ids_R, return_inverse=True)
    group_R = group_R.reshape(-1)
    sums_G = np.bincount(group_R, weights=rewards_R)
    sizes_G = np.bincount(group_R)
    return group_R, sums_G, sizes_G


def grpo_advantages(rewards_R, group_ids_R) -> tuple[np.ndarray, np.ndarray]:
    """b_i = mean reward of i's group (self included). Returns (baseline_R, advantage_R)."""
    rewards_R = _rewards(rewards_R)
    group_R, sums_G, sizes_G = _group_sums(rewards_R, group_ids_R)
    baseline_R = sums_G[group_R] / sizes_G[group_R]
    return baseline_R, rewards_R - baseline_R


def batch_mean_advantages(rewards_R) -> tuple[np.ndarray, np.ndarray]:
    """b_i = mean reward of the whole batch (self included). Returns (baseline_R, advantage_R)."""
    rewards_R = _rewards(rewards_R)
    baseline_R = np.full_like(rewards_R, rewards_R.mean()) if rewards_R.size else rewards_R.copy()
    return baseline_R, rewards_R - baseline_R


def rloo_advantages(rewards_R, group_ids_R) -> tuple[np.ndarray, np.ndarray]:
    """b_i = mean reward of the other rollouts of i's group; a group of one gets b_i = r_i."""
    rewards_R = _rewards(rewards_R)
    group_R, sums_G, sizes_G = _group_sums(rewards_R, group_ids_R)
    others_R = sizes_G[group_R] - 1
    loo_R = (sums_G[group_R] - rewards_R) / np.maximum(others_R, 1)
    baseline_R = np.where(others_R > 0, loo_R, rewards_R)
    return baseline_R, rewards_R - baseline_R


# ---------------------------------------------------------------------------- gs1 kernel


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


def _features(features_R_F, n: int, name: str) -> np.ndarray:
    features_R_F = np.asarray(features_R_F, dtype=np.float64)
    if features_R_F.ndim == 1 and n == 0:
        features_R_F = features_R_F.reshape(0, 0)
    if features_R_F.ndim != 2 or features_R_F.shape[0] != n:
        raise ValueError(f"{name} must be 2-d with one row per reward")
    if not np.all(np.isfinite(features_R_F)):
        raise ValueError(f"{name} must be finite")
    return features_R_F


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
    rewards_B = _rewards(rewards_B)
    B = rewards_B.shape[0]
    features_B_F = _features(features_B_F, B, "features_B_F")
    history_rewards_H = _rewards(history_rewards_H)
    H = history_rewards_H.shape[0]
    if H == 0:  # the first step: no history (its features may be None or empty)
        history_features_H_F = np.zeros((0, features_B_F.shape[1]))
    elif history_features_H_F is None:
        raise ValueError("history_features_H_F is required with history rewards")
    history_features_H_F = _features(history_features_H_F, H, "history_features_H_F")
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
    else:  # laplace, knn: distances built as rl/hillclimb/climb.py builds them; self is no neighbour
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


def step_batches(steps_R) -> list[tuple[int, int]]:
    """[start, stop) row ranges of the consecutive runs of equal step values, in row order.

    A step whose rows are not consecutive is an error: rows of one step form one batch.
    """
    steps_R = np.asarray(steps_R)
    if steps_R.ndim != 1:
        raise ValueError("steps must be a 1-d array")
    if steps_R.size == 0:
        return []
    change = np.flatnonzero(steps_R[1:] != steps_R[:-1]) + 1
    starts = np.concatenate([[0], change])
    stops = np.concatenate([change, [steps_R.size]])
    if len(np.unique(steps_R[starts])) != len(starts):
        raise ValueError("the rows of each step must be consecutive (row order = rollout order)")
    return [(int(a), int(b)) for a, b in zip(starts, stops)]


def gs1_kernel_log(steps_R, rewards_R, features_R_F, kernel: KernelSpec = PINNED_KERNEL) -> KernelAdvantages:
    """GS1 kernel baselines over a whole rollout log (rows in rollout order).

    Consecutive rows of one step form its batch; the history of a step is every earlier row, read
    straight from the log (not through a `KernelWindow`: this is the loop's offline cross-check).
    """
    rewards_R = _rewards(rewards_R)
    features_R_F = _features(features_R_F, rewards_R.shape[0], "features_R_F")
    if len(steps_R) != rewards_R.shape[0]:
        raise ValueError("steps and rewards must have the same length")
    batches = step_batches(steps_R)
    window = kernel.window
    out = {k: np.zeros(rewards_R.shape[0]) for k in ("baseline", "advantage", "kernel_mass", "effective_neighbors")}
    fallback_R = np.zeros(rewards_R.shape[0], dtype=bool)
    for start, stop in batches:
        history_start = max(0, start - max(0, window - (stop - start)))
        step = gs1_kernel_step(
            rewards_R[start:stop],
            features_R_F[start:stop],
            rewards_R[history_start:start],
            features_R_F[history_start:start],
            kernel=kernel,
        )
        for k, column in out.items():
            column[start:stop] = getattr(step, k)
        fallback_R[start:stop] = step.fallback
    return KernelAdvantages(fallback=fallback_R, **out)


@dataclass(frozen=True, eq=False)
class KernelWindow:
    """The kernel's history: the most recent earlier rollouts, oldest first. Immutable.

    The RL loop owns it: a step's advantages are computed against a window, and the loop then
    moves on to `window.extended(step rewards, step features)`, the window of the next step. It
    keeps at most `size` rollouts (a step never draws on more than size - 1 history rows).
    """

    size: int
    rewards_H: np.ndarray
    features_H_F: np.ndarray | None  # None before the first step

    @classmethod
    def empty(cls, size: int) -> KernelWindow:
        if int(size) != size or size < 1:
            raise ValueError(f"window must be an integer >= 1, got {size}")
        return cls(int(size), np.zeros(0), None)

    def __len__(self) -> int:
        return self.rewards_H.shape[0]

    def extended(self, rewards_B, features_B_F) -> KernelWindow:
        """The window after one more step: its rollouts appended, the oldest beyond `size` dropped."""
        rewards_B = _rewards(rewards_B)
        features_B_F = _features(features_B_F, rewards_B.shape[0], "features_B_F")
        features_H_F = np.zeros((0, features_B_F.shape[1])) if self.features_H_F is None else self.features_H_F
        if features_B_F.shape[1] != features_H_F.shape[1]:
            raise ValueError("features must keep the same number of columns across steps")
        return KernelWindow(
            self.size,
            np.concatenate([self.rewards_H, rewards_B])[-self.size :],
            np.concatenate([features_H_F, features_B_F], axis=0)[-self.size :],
        )


# ---------------------------------------------------------------------------- dispatch


@dataclass(frozen=True)
class StepBatch:
    """One step's rollouts as an estimator sees them, in rollout order (float64 / int arrays)."""

    rewards_B: np.ndarray
    group_ids_B: np.ndarray
    prompt_num_tokens_B: np.ndarray
    prompt_mean_logprob_B: np.ndarray
    # flash_reinforce: per-token logprobs of each rollout under the sampler and the learner
    sampler_logprobs_B_T: tuple[np.ndarray, ...] | None = None
    learner_logprobs_B_T: tuple[np.ndarray, ...] | None = None
    # critic: log P(yes) and log P(no) of the answer token after each rollout's prompt
    critic_yes_logprob_B: np.ndarray | None = None
    critic_no_logprob_B: np.ndarray | None = None

    def kernel_features(self, kernel: KernelSpec) -> np.ndarray:
        """features_B_F: the kernel's prompt features, one column per name, in its order."""
        return prompt_features(self.prompt_num_tokens_B, self.prompt_mean_logprob_B, kernel.features)


@dataclass(frozen=True)
class StepAdvantages:
    """One step's advantages; an estimator's own columns are None for the others."""

    baseline: np.ndarray
    advantage: np.ndarray
    kernel_mass: np.ndarray | None = None
    effective_neighbors: np.ndarray | None = None
    fallback: np.ndarray | None = None
    sequence_kl: np.ndarray | None = None  # flash_reinforce: the trust gate's per-trajectory KL
    admitted: np.ndarray | None = None  # flash_reinforce: kl <= delta
    token_advantage: np.ndarray | None = None  # flash_reinforce: what each token of the datum carries

    @property
    def datum_advantage(self) -> np.ndarray:
        """The per-token advantage of each rollout's datum: the advantage itself, or FlashREINFORCE's
        gated, sample-mean weighted one."""
        return self.advantage if self.token_advantage is None else self.token_advantage


def advantages_for_step(
    advantage_name: str,
    batch: StepBatch,
    *,
    kernel: KernelSpec | None = None,
    window: KernelWindow | None = None,
    trust_delta: float | None = None,
) -> StepAdvantages:
    """One step's advantages for the spec's `advantage` name (schemas.arm.ADVANTAGE_ESTIMATORS).

    Pure: it reads `window` (gs1_kernel only; the earlier rollouts) and changes nothing.
    flash_reinforce reads the batch's sampler and learner logprobs and `trust_delta`; critic the
    batch's critic logprobs.
    """
    estimator = estimator_id(advantage_name)
    if estimator == "flash_reinforce":
        if trust_delta is None or batch.sampler_logprobs_B_T is None or batch.learner_logprobs_B_T is None:
            raise ValueError("flash_reinforce needs trust_delta and the batch's sampler and learner logprobs")
        baseline_B, advantage_B = batch_mean_advantages(batch.rewards_B)
        kl_B, admitted_B = flash_reinforce_gate(batch.sampler_logprobs_B_T, batch.learner_logprobs_B_T, delta=trust_delta)
        num_tokens_B = [len(t) for t in batch.sampler_logprobs_B_T]
        return StepAdvantages(baseline_B, advantage_B, sequence_kl=kl_B, admitted=admitted_B,
                              token_advantage=flash_reinforce_token_advantages(advantage_B, num_tokens_B, admitted_B))
    if estimator == "critic":
        if batch.critic_yes_logprob_B is None or batch.critic_no_logprob_B is None:
            raise ValueError("critic needs the batch's critic logprobs")
        return StepAdvantages(*critic_advantages(batch.rewards_B, batch.critic_yes_logprob_B, batch.critic_no_logprob_B))
    if estimator == "grpo":
        return StepAdvantages(*grpo_advantages(batch.rewards_B, batch.group_ids_B))
    if estimator == "rloo":
        return StepAdvantages(*rloo_advantages(batch.rewards_B, batch.group_ids_B))
    if estimator == "batch_mean":
        return StepAdvantages(*batch_mean_advantages(batch.rewards_B))
    # gs1_kernel
    if kernel is None or window is None:
        raise ValueError("gs1_kernel needs the arm's KernelSpec and a KernelWindow")
    if window.size != kernel.window:
        raise ValueError(f"kernel window {kernel.window} != KernelWindow size {window.size}")
    step = gs1_kernel_step(batch.rewards_B, batch.kernel_features(kernel), window.rewards_H, window.features_H_F, kernel=kernel)
    return StepAdvantages(
        baseline=step.baseline,
        advantage=step.advantage,
        kernel_mass=step.kernel_mass,
        effective_neighbors=step.effective_neighbors,
        fallback=step.fallback,
    )


# ---------------------------------------------------------------------------- FlashREINFORCE

# The paper's reference (flashreinforce/loss.py) clamps both Bernoulli probabilities into
# [1e-6, 1 - 1e-6] for the trust gate only, so a token the learner is certain of cannot make the
# KL infinite; the ratio itself is never clamped.
TRUST_PROB_CLAMP = 1e-6


def bernoulli_kl(p_logprob, q_logprob) -> np.ndarray:
    """KL(Bern(p) || Bern(q)) from log p and log q, elementwise, p and q clamped into
    [TRUST_PROB_CLAMP, 1 - TRUST_PROB_CLAMP]: p log(p/q) + (1-p) log((1-p)/(1-q))."""
    p = np.clip(np.exp(np.asarray(p_logprob, dtype=np.float64)), TRUST_PROB_CLAMP, 1 - TRUST_PROB_CLAMP)
    q = np.clip(np.exp(np.asarray(q_logprob, dtype=np.float64)), TRUST_PROB_CLAMP, 1 - TRUST_PROB_CLAMP)
    return p * (np.log(p) - np.log(q)) + (1 - p) * (np.log1p(-p) - np.log1p(-q))


def _trajectories(sampler_logprobs_B: Sequence, learner_logprobs_B: Sequence) -> list[tuple[np.ndarray, np.ndarray]]:
    if len(sampler_logprobs_B) != len(learner_logprobs_B):
        raise ValueError("sampler and learner logprobs need one entry per trajectory")
    out = []
    for i, (sampler_T, learner_T) in enumerate(zip(sampler_logprobs_B, learner_logprobs_B)):
        sampler_T = np.asarray(sampler_T, dtype=np.float64)
        learner_T = np.asarray(learner_T, dtype=np.float64)
        if sampler_T.shape != learner_T.shape or sampler_T.ndim != 1:
            raise ValueError(f"trajectory {i}: sampler and learner logprobs must be 1-d and of equal length")
        if not (np.all(np.isfinite(sampler_T)) and np.all(np.isfinite(learner_T))):
            raise ValueError(f"trajectory {i}: logprobs must be finite")
        out.append((sampler_T, learner_T))
    return out


def flash_reinforce_gate(sampler_logprobs_B: Sequence, learner_logprobs_B: Sequence, *, delta: float
                         ) -> tuple[np.ndarray, np.ndarray]:
    """FlashREINFORCE's per-trajectory trust gate: (sequence_kl_B, admitted_B).

        kl_i       = max(0, (1 / T_i) sum_t KL(Bern(exp s_it) || Bern(exp l_it)))
        admitted_i = kl_i <= delta

    s the sampler's logprobs of the sampled tokens, l the learner's (the client's forward pass on
    the weights about to be updated). A trajectory without tokens carries no gradient: kl 0, not
    admitted.
    """
    if not delta >= 0:
        raise ValueError(f"delta must be >= 0, got {delta}")
    pairs = _trajectories(sampler_logprobs_B, learner_logprobs_B)
    kl_B = np.zeros(len(pairs))
    admitted_B = np.zeros(len(pairs), dtype=bool)
    for i, (sampler_T, learner_T) in enumerate(pairs):
        if sampler_T.size:
            kl_B[i] = max(0.0, float(bernoulli_kl(sampler_T, learner_T).mean()))
            admitted_B[i] = kl_B[i] <= delta
    return kl_B, admitted_B


def flash_reinforce_token_advantages(advantage_B, num_tokens_B, admitted_B) -> np.ndarray:
    """The per-token advantage each trajectory's datum carries: A_i * admitted_i / (T_i * B).

    With tinker's `importance_sampling` loss, -sum_t exp(l_t - s_t) * a_t, its gradient in l_t
    is -ratio_it * a_t: the FlashREINFORCE gradient -ratio_it * A_i * admitted_i / (T_i * B) with
    the ratio detached, since the forward pass that measured the gate ran on the same weights.
    """
    advantage_B = _rewards(advantage_B)
    num_tokens_B = np.asarray(num_tokens_B, dtype=np.float64)
    admitted_B = np.asarray(admitted_B, dtype=bool)
    B = advantage_B.shape[0]
    if num_tokens_B.shape != (B,) or admitted_B.shape != (B,):
        raise ValueError("advantages, token counts and admitted flags need one entry per trajectory")
    keep_B = admitted_B & (num_tokens_B > 0)
    return np.where(keep_B, advantage_B / (np.maximum(num_tokens_B, 1.0) * max(B, 1)), 0.0)


def flash_reinforce_coefficients(sampler_logprobs_B: Sequence, learner_logprobs_B: Sequence, *, delta: float
                                 ) -> tuple[list[np.ndarray], np.ndarray]:
    """FlashREINFORCE per-token loss coefficients for B trajectories of lengths T_i:

        coef_it = exp(l_it - s_it) * admitted_i / (T_i * B)      (the ratio detached)

    so that the loss is -sum_i A_i sum_t coef_it * logprob_it. Returns (coefficients_B, admitted_B).
    """
    _, admitted_B = flash_reinforce_gate(sampler_logprobs_B, learner_logprobs_B, delta=delta)
    pairs = _trajectories(sampler_logprobs_B, learner_logprobs_B)
    B = len(pairs)
    coefficients_B = []
    for (sampler_T, learner_T), keep in zip(pairs, admitted_B):
        ratio_T = np.exp(learner_T - sampler_T)
        coefficients_B.append(ratio_T / (max(sampler_T.size, 1) * B) if keep else np.zeros_like(ratio_T))
    return coefficients_B, admitted_B


# ---------------------------------------------------------------------------- critic


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
    rewards_B = _rewards(rewards_B)
    baseline_B = critic_values(yes_logprob_B, no_logprob_B)
    if baseline_B.shape != rewards_B.shape:
        raise ValueError("critic logprobs need one entry per reward")
    return baseline_B, rewards_B - baseline_B


def critic_targets(rewards_B) -> np.ndarray:
    """What the critic is trained towards: each reward clipped into [0, 1] (a yes-probability)."""
    return np.clip(_rewards(rewards_B), 0.0, 1.0)
