"""The audit: recompute an arm's logged advantages with the independent references.

Before the activation gate (pilot logs) and before the decision (training logs), every row an arm
logged is recomputed from its own rollout log -- rewards, groups, prompt features -- by a reference
that shares no code with the training path:

- gs1_kernel: `rl.reference` (plain loops) with the arm's `KernelSpec`, over the whole log in
  rollout order (each step's window = the step + the most recent earlier rows);
- grpo: the stock tinker-cookbook `compute_advantages` on cookbook TrajectoryGroups;
- batch_mean, rloo: `rl.reference`'s plain loops;
- flash_reinforce: `rl.reference`'s plain loops over the logged sampler and learner token logprobs
  (baseline, advantage, the trust gate's KL and verdict, the per-token advantage trained on);
- critic: `rl.reference`'s plain loop over the logged critic logprobs (baseline, advantage).

A row whose logged value differs from the recomputed one by more than the tolerance is a
`Mismatch` naming the arm, the step, the row and both values. The correctness preflight uses the
same comparison on the log that driving the arm's own step function produced.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from rl import reference
from schemas.arm import ArmConfig
from schemas.errors import AuditInputMissing

TOLERANCE = 1e-9
# The cookbook computes GRPO in torch's default dtype, float32: its value of r - mean(r) carries
# float32 rounding, so the GRPO audit allows that on top of TOLERANCE (|x| * 2^-22 per operand).
FLOAT32_RELATIVE = 2.0**-22

KERNEL_COLUMNS = ("kernel_mass", "effective_neighbors", "fallback")
FLASH_COLUMNS = ("sequence_kl", "admitted", "token_advantage")


@dataclass(frozen=True)
class RolloutLog:
    """The columns of a rollout log the audit reads and checks, in rollout order."""

    step_R: np.ndarray
    group_id_R: np.ndarray
    reward_R: np.ndarray
    prompt_num_tokens_R: np.ndarray
    prompt_mean_logprob_R: np.ndarray
    logged: dict[str, np.ndarray]  # baseline, advantage (+ an estimator's own columns)
    # an estimator's inputs besides the rewards (None when the log has none)
    sampler_logprobs_R_T: list[list[float]] | None = None  # flash_reinforce
    learner_logprobs_R_T: list[list[float]] | None = None  # flash_reinforce
    critic_yes_logprob_R: np.ndarray | None = None  # critic
    critic_no_logprob_R: np.ndarray | None = None  # critic

    @classmethod
    def from_table(cls, table: pa.Table) -> RolloutLog:
        def column(name, dtype=np.float64):
            return np.asarray(table.column(name).to_pylist(), dtype=dtype)

        def present(name):  # a column every row has a value in, else None
            values = table.column(name).to_pylist() if name in table.column_names else []
            return values if values and all(v is not None for v in values) else None

        logged = {"baseline": column("baseline"), "advantage": column("advantage")}
        for name in KERNEL_COLUMNS + FLASH_COLUMNS:
            if (values := present(name)) is not None:
                logged[name] = np.asarray(values, dtype=np.float64)
        yes, no = present("critic_yes_logprob"), present("critic_no_logprob")
        return cls(column("step", np.int64), column("group_id", np.int64), column("reward"),
                   column("prompt_num_tokens"), column("prompt_mean_logprob"), logged,
                   sampler_logprobs_R_T=present("sampler_logprobs"), learner_logprobs_R_T=present("learner_logprobs"),
                   critic_yes_logprob_R=None if yes is None else np.asarray(yes, dtype=np.float64),
                   critic_no_logprob_R=None if no is None else np.asarray(no, dtype=np.float64))

    def __len__(self) -> int:
        return self.reward_R.shape[0]


@dataclass(frozen=True)
class Mismatch:
    arm: str
    step: int
    row: int  # row of the rollout log (0-based, rollout order)
    column: str
    logged: float
    recomputed: float


@dataclass(frozen=True)
class AuditResult:
    """One arm's audit: per column, the largest |logged - recomputed| and every row beyond tolerance."""

    arm: str
    estimator: str
    reference: str
    rows: int
    steps: int
    max_abs_diff: dict[str, float]
    n_mismatches: int
    mismatches: tuple[Mismatch, ...]  # the first ones, in row order
    tolerance: str

    @property
    def passed(self) -> bool:
        return self.rows > 0 and self.n_mismatches == 0


def reference_columns(arm: ArmConfig, log: RolloutLog) -> tuple[dict[str, np.ndarray], str]:
    """Every checked column recomputed by the arm's independent reference, and the reference's name."""
    steps = log.step_R.tolist()
    rewards = log.reward_R.tolist()
    if arm.estimator == "gs1_kernel":
        features = reference.reference_features(log.prompt_num_tokens_R.tolist(), log.prompt_mean_logprob_R.tolist(), arm.kernel)
        out = reference.gs1_kernel_log_reference(steps, rewards, features, arm.kernel)
        name = "rl.reference.gs1_kernel_log_reference"
    elif arm.estimator == "grpo":
        out = _cookbook_grpo(log)
        name = "tinker_cookbook.rl.data_processing.compute_advantages"
    elif arm.estimator == "batch_mean":
        out = reference.batch_mean_log_reference(steps, rewards)
        name = "rl.reference.batch_mean_log_reference"
    elif arm.estimator == "rloo":
        out = reference.rloo_log_reference(steps, log.group_id_R.tolist(), rewards)
        name = "rl.reference.rloo_log_reference"
    elif arm.estimator == "flash_reinforce":
        if log.sampler_logprobs_R_T is None or log.learner_logprobs_R_T is None:
            raise AuditInputMissing(f"arm {arm.name}: the log has no sampler/learner token logprobs to recompute the trust gate from")
        out = reference.flash_reinforce_log_reference(steps, rewards, log.sampler_logprobs_R_T, log.learner_logprobs_R_T,
                                                      arm.trust_delta)
        name = "rl.reference.flash_reinforce_log_reference"
    elif arm.estimator == "critic":
        if log.critic_yes_logprob_R is None or log.critic_no_logprob_R is None:
            raise AuditInputMissing(f"arm {arm.name}: the log has no critic logprobs to recompute the baseline from")
        out = reference.critic_log_reference(rewards, log.critic_yes_logprob_R.tolist(), log.critic_no_logprob_R.tolist())
        name = "rl.reference.critic_log_reference"
    else:
        raise ValueError(f"no reference for estimator {arm.estimator!r}")
    return {k: np.asarray(v, dtype=np.float64) for k, v in out.items()}, name


def _cookbook_grpo(log: RolloutLog) -> dict[str, list[float]]:
    """GRPO through the stock cookbook: one TrajectoryGroup per (step, group), its advantages."""
    import tinker
    from tinker_cookbook.completers import TokensWithLogprobs
    from tinker_cookbook.rl.data_processing import compute_advantages
    from tinker_cookbook.rl.types import Trajectory, TrajectoryGroup, Transition

    ob = tinker.ModelInput.from_ints([0])
    keys = list(dict.fromkeys(zip(log.step_R.tolist(), log.group_id_R.tolist())))  # first-seen order
    rows_of = {key: [] for key in keys}
    for row, key in enumerate(zip(log.step_R.tolist(), log.group_id_R.tolist())):
        rows_of[key].append(row)
    groups_P = [
        TrajectoryGroup(
            trajectories_G=[
                Trajectory(transitions=[Transition(ob=ob, ac=TokensWithLogprobs([0], [0.0]), reward=float(log.reward_R[r]),
                                                   episode_done=True)], final_ob=ob)
                for r in rows_of[key]
            ],
            final_rewards_G=[0.0] * len(rows_of[key]),
            metrics_G=[{} for _ in rows_of[key]],
        )
        for key in keys
    ]
    advantage = [0.0] * len(log)
    for key, advantages_G in zip(keys, compute_advantages(groups_P)):
        for r, a in zip(rows_of[key], advantages_G.tolist()):
            advantage[r] = float(a)
    return {"advantage": advantage, "baseline": [float(r) - a for r, a in zip(log.reward_R.tolist(), advantage)]}


def audit_log(arm: ArmConfig, log: RolloutLog, tolerance: float = TOLERANCE, max_listed: int = 50) -> AuditResult:
    """Compare every logged column the reference recomputes; list at most `max_listed` mismatches.
    A log without the inputs the reference needs fails with one mismatch per missing input."""
    try:
        recomputed, name = reference_columns(arm, log)
    except AuditInputMissing as missing:
        return AuditResult(arm.name, arm.estimator, str(missing), len(log), len(np.unique(log.step_R)), {}, 1,
                           (Mismatch(arm.name, -1, -1, "inputs", math.nan, math.nan),), f"{tolerance:g}")
    float32 = arm.estimator == "grpo"
    max_abs_diff: dict[str, float] = {}
    mismatches: list[Mismatch] = []
    for column, expected_R in recomputed.items():
        if column not in log.logged:  # a column the arm's estimator produces was not logged at all
            mismatches.append(Mismatch(arm.name, -1, -1, column, math.nan, math.nan))
            continue
        logged_R = log.logged[column]
        if logged_R.shape != expected_R.shape:
            mismatches.append(Mismatch(arm.name, -1, -1, column, float(logged_R.size), float(expected_R.size)))
            continue
        diff_R = np.abs(logged_R - expected_R)
        diff_R = np.where(np.isnan(diff_R), np.inf, diff_R)  # a NaN on either side is a mismatch
        allowed_R = tolerance + (FLOAT32_RELATIVE * (np.abs(log.reward_R) + np.abs(expected_R)) if float32 else 0.0)
        max_abs_diff[column] = float(diff_R.max()) if diff_R.size else 0.0
        for row in np.flatnonzero(diff_R > allowed_R):
            mismatches.append(Mismatch(arm.name, int(log.step_R[row]), int(row), column, float(logged_R[row]), float(expected_R[row])))
    mismatches.sort(key=lambda m: (m.row, m.column))
    bound = f"{tolerance:g}" + (" + float32 rounding of the cookbook" if float32 else "")
    return AuditResult(arm.name, arm.estimator, name, len(log), len(np.unique(log.step_R)), max_abs_diff, len(mismatches), tuple(mismatches[:max_listed]), bound)
