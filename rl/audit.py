"""The audit: recompute an arm's logged advantages with the independent references.

Before the activation gate (pilot logs) and before the decision (training logs), every row an arm
logged is recomputed from its own rollout log -- rewards, groups, prompt features, and the inputs
its kind logs -- by its kind's reference (`Estimator.reference`), which shares no code with the
training path: the stock tinker-cookbook `compute_advantages` for group_mean, `estimators.reference`'s
plain loops for the others.

A row whose logged value differs from the recomputed one by more than the tolerance is a
`Mismatch` naming the arm, the step, the row and both values. The correctness preflight uses the
same comparison on the log that driving the arm's own step function produced.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from design.arm import ArmConfig
from estimators.base import RolloutLog
from schemas.errors import AuditInputMissing

TOLERANCE = 1e-9
# The cookbook computes GRPO in torch's default dtype, float32: its value of r - mean(r) carries
# float32 rounding, so that audit allows it on top of TOLERANCE (|x| * 2^-22 per operand).
FLOAT32_RELATIVE = 2.0**-22


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
    try:
        out = arm.estimator.reference(arm.recipe, log)
    except AuditInputMissing as missing:
        raise AuditInputMissing(f"arm {arm.name}: {missing}") from None
    return {k: np.asarray(v, dtype=np.float64) for k, v in out.items()}, arm.estimator.reference_name


def audit_log(arm: ArmConfig, log: RolloutLog, tolerance: float = TOLERANCE, max_listed: int = 50) -> AuditResult:
    """Compare every logged column the reference recomputes; list at most `max_listed` mismatches.
    A log without the inputs the reference needs fails with one mismatch per missing input."""
    try:
        recomputed, name = reference_columns(arm, log)
    except AuditInputMissing as missing:
        return AuditResult(arm.name, arm.advantage, str(missing), len(log), len(np.unique(log.step_R)), {}, 1,
                           (Mismatch(arm.name, -1, -1, "inputs", math.nan, math.nan),), f"{tolerance:g}")
    float32 = arm.estimator.float32_reference
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
    return AuditResult(arm.name, arm.advantage, name, len(log), len(np.unique(log.step_R)), max_abs_diff, len(mismatches), tuple(mismatches[:max_listed]), bound)
