"""Advantage estimators: one module per arm kind (float64 numpy, small pure functions), and the
registry the rest of gs1 asks (`estimator_for`). Semantics are pinned in DESIGN.md ("Spec
semantics pinned here"); each kind module's docstring states its b_i.

The RL loop calls the arm's `Estimator.advantages` once per step: a pure function of the step's
batch, the arm's recipe and (for a kind that needs one) the `KernelWindow` of earlier rollouts.
The loop alone advances the window (`Estimator.advance_window`), once per step.
"""

from estimators.base import (CRITIC, LEARNER_LOGPROBS, WINDOW, AuditInputMissing, Estimator, KernelWindow, RolloutLog,
                             StepAdvantages, StepBatch, step_batches)
from estimators.batch_mean import batch_mean_advantages
from estimators.critic import CriticSpec, critic_advantages, critic_targets, critic_values
from estimators.flash_reinforce import (DEFAULT_TRUST_DELTA, TRUST_PROB_CLAMP, bernoulli_kl, flash_reinforce_coefficients,
                                        flash_reinforce_gate, flash_reinforce_token_advantages)
from estimators.group_mean import grpo_advantages
from estimators.kernel_cross_prompt_baseline import PINNED_KERNEL, KernelAdvantages, gs1_kernel_log, gs1_kernel_step
from estimators.leave_one_out import rloo_advantages
from estimators.registry import ESTIMATORS, KINDS, Recipe, estimator_for

__all__ = [
    "CRITIC", "DEFAULT_TRUST_DELTA", "ESTIMATORS", "KINDS", "LEARNER_LOGPROBS", "PINNED_KERNEL", "TRUST_PROB_CLAMP", "WINDOW",
    "AuditInputMissing", "CriticSpec", "Estimator", "KernelAdvantages", "KernelWindow", "Recipe", "RolloutLog",
    "StepAdvantages", "StepBatch", "batch_mean_advantages", "bernoulli_kl", "critic_advantages", "critic_targets",
    "critic_values", "estimator_for", "flash_reinforce_coefficients", "flash_reinforce_gate",
    "flash_reinforce_token_advantages", "gs1_kernel_log", "gs1_kernel_step", "grpo_advantages", "rloo_advantages",
    "step_batches",
]
