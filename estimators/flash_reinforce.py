"""flash_reinforce: batch_mean's b_i, plus the FlashREINFORCE trust gate (per-trajectory mean
Bernoulli KL between sampler and learner token probabilities <= delta) and the per-token
advantage A_i * admitted_i / (T_i * B) its datum carries. It needs the learner's logprobs of the
sampled tokens: a forward pass of the training client on the weights the step updates."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, field_validator

from estimators import reference
from estimators.base import (LEARNER_LOGPROBS, AuditInputMissing, Estimator, RolloutLog, StepAdvantages, StepBatch,
                             finite_rewards)
from estimators.batch_mean import batch_mean_advantages

# FlashREINFORCE's default trust threshold on the per-trajectory mean Bernoulli KL.
DEFAULT_TRUST_DELTA = 3e-3
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
    advantage_B = finite_rewards(advantage_B)
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


class FlashReinforceRecipe(BaseModel):
    """The trust threshold on the per-trajectory mean Bernoulli KL."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    advantage: Literal["flash_reinforce"] = "flash_reinforce"
    trust_delta: float = DEFAULT_TRUST_DELTA

    @field_validator("trust_delta")
    @classmethod
    def _delta(cls, v):
        if not (math.isfinite(v) and v >= 0):
            raise ValueError("must be >= 0")
        return v


class FlashReinforce(Estimator):
    kind = "flash_reinforce"
    recipe_type = FlashReinforceRecipe
    summary = "batch_mean's b_i; datums gated by the per-trajectory sampler/learner KL (FlashREINFORCE)"
    rollouts_per_prompt = "one"
    needs = frozenset({LEARNER_LOGPROBS})
    columns = ("sequence_kl", "admitted")
    input_columns = ("sampler_logprobs", "learner_logprobs")
    step_metric_names = ("trust_admit_rate", "sequence_kl_mean")
    prompt_blind = True
    reference_name = "estimators.reference.flash_reinforce_log_reference"
    spec_fields = ("trust_delta",)

    def recipe_of(self, arm_spec) -> FlashReinforceRecipe:
        return FlashReinforceRecipe(trust_delta=arm_spec.trust_delta)

    def describe(self, recipe, *, lora_rank: int) -> str:
        return f"trust gate: mean Bernoulli KL per trajectory <= {recipe.trust_delta:g}"

    def label(self, recipe) -> str:
        return f"trust delta {recipe.trust_delta:g}"

    def advantages(self, recipe, batch: StepBatch, window) -> StepAdvantages:
        if batch.sampler_logprobs_B_T is None or batch.learner_logprobs_B_T is None:
            raise ValueError("flash_reinforce needs the batch's sampler and learner logprobs")
        baseline_B, advantage_B = batch_mean_advantages(batch.rewards_B)
        kl_B, admitted_B = flash_reinforce_gate(batch.sampler_logprobs_B_T, batch.learner_logprobs_B_T,
                                                delta=recipe.trust_delta)
        num_tokens_B = [len(t) for t in batch.sampler_logprobs_B_T]
        return StepAdvantages(baseline_B, advantage_B, {"sequence_kl": kl_B, "admitted": admitted_B},
                              token_advantage=flash_reinforce_token_advantages(advantage_B, num_tokens_B, admitted_B))

    def step_metrics(self, advantages: StepAdvantages) -> dict[str, float]:
        B = len(advantages.baseline)
        return {"trust_admit_rate": float(np.mean(advantages.admitted)) if B else float("nan"),
                "sequence_kl_mean": float(np.mean(advantages.sequence_kl)) if B else float("nan")}

    def reference(self, recipe, log: RolloutLog) -> dict[str, list]:
        if log.sampler_logprobs_R_T is None or log.learner_logprobs_R_T is None:
            raise AuditInputMissing("the log has no sampler/learner token logprobs to recompute the trust gate from")
        return reference.flash_reinforce_log_reference(log.step_R.tolist(), log.reward_R.tolist(), log.sampler_logprobs_R_T,
                                                       log.learner_logprobs_R_T, recipe.trust_delta)

    def stand_in_inputs(self, recipe, batch_size: int, rng: np.random.Generator) -> dict:
        """Token logprobs of varied lengths (one of the lengths 0), the learner's drawn at drift
        scales around the gate's threshold, so the gate admits some trajectories and rejects
        others, with near-certain tokens among them (the probability clamp)."""
        lengths_B = rng.integers(1, 40, batch_size)
        lengths_B[rng.integers(0, batch_size)] = 0
        sampler_B_T, learner_B_T = [], []
        scales = (0.0, 0.01, 0.05, 0.2, 1.0)
        for b, T in enumerate(lengths_B):
            sampler_T = np.log(rng.uniform(0.02, 1.0, T))
            sampler_T[rng.random(T) < 0.2] = -1e-9  # near-certain tokens
            learner_T = np.minimum(sampler_T + rng.normal(0.0, scales[b % len(scales)], T), 0.0)
            sampler_B_T.append(sampler_T)
            learner_B_T.append(learner_T)
        return {"sampler_logprobs_B_T": tuple(sampler_B_T), "learner_logprobs_B_T": tuple(learner_B_T)}


ESTIMATOR = FlashReinforce()
