"""Gate metrics computed from logged rollouts, and the check of a metric against a spec bound.

Inputs are rollout logs (docs/contracts.md "Rollout log"): a pyarrow Table or a dict of columns.
Held-out samples are a table with prompt_id, sample_idx and reward. Metrics are plain floats;
NaN means "could not be measured" and never passes a check.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from estimators.registry import estimator_for
from schemas.gate_text import NOT_APPLICABLE
from schemas.names import GATE_METRICS  # noqa: F401  (re-exported: the gate metrics this module computes)


def _column(rollouts, name: str, dtype=None) -> np.ndarray:
    """One column as a numpy array (nulls become NaN for floats, None for objects)."""
    if isinstance(rollouts, Mapping):
        if name not in rollouts:
            raise ValueError(f"rollouts have no column {name!r}")
        values = rollouts[name]
        if hasattr(values, "to_pylist"):
            values = values.to_pylist()
    else:  # a pyarrow Table
        if name not in rollouts.column_names:
            raise ValueError(f"rollouts have no column {name!r}")
        values = rollouts.column(name).to_pylist()
    if dtype is np.float64:
        return np.array([np.nan if v is None else v for v in values], dtype=np.float64)
    return np.asarray(values, dtype=dtype)


def _num_rows(rollouts) -> int:
    if isinstance(rollouts, Mapping):
        return len(next(iter(rollouts.values()))) if rollouts else 0
    return rollouts.num_rows


def first_steps_mask(steps_R: np.ndarray, n_steps: int) -> np.ndarray:
    """Rows whose step is among the n_steps smallest distinct steps."""
    kept = np.unique(steps_R)[:n_steps]
    return np.isin(steps_R, kept)


def _select(rollouts, mask: np.ndarray) -> dict:
    names = list(rollouts.keys()) if isinstance(rollouts, Mapping) else rollouts.column_names
    return {name: np.asarray(_column(rollouts, name, dtype=object))[mask] for name in names}


def executed_group_size(rollouts) -> float | list:
    """Rollouts per distinct prompt per step.

    The group size as a float when every (step, prompt) has the same number of rollouts;
    otherwise the per-step list (a step's entry is its group size, or the sorted distinct sizes
    when its prompts differ), which never passes a check. An empty log gives NaN.
    """
    steps_R = _column(rollouts, "step")
    prompts_R = _column(rollouts, "prompt_id").astype(str)
    if steps_R.size == 0:
        return float("nan")
    per_step: list = []
    sizes_all: set[int] = set()
    for step in np.unique(steps_R):
        _, counts = np.unique(prompts_R[steps_R == step], return_counts=True)
        sizes = sorted({int(c) for c in counts})
        sizes_all.update(sizes)
        per_step.append(float(sizes[0]) if len(sizes) == 1 else [float(s) for s in sizes])
    if len(sizes_all) == 1:
        return float(sizes_all.pop())
    return per_step


def pilot_mean_reward(treatment, n_steps: int = 2) -> float:
    """Mean training reward over the first n_steps steps of the log."""
    steps_R = _column(treatment, "step")
    rewards_R = _column(treatment, "reward", np.float64)
    rewards = rewards_R[first_steps_mask(steps_R, n_steps)]
    return float(np.mean(rewards)) if rewards.size else float("nan")


def kernel_effective_neighbors_p10(treatment) -> float:
    """10th percentile (numpy's linear interpolation) over rollouts of the effective neighbours;
    NaN when no rollout has a kernel value."""
    neighbors_R = _column(treatment, "effective_neighbors", np.float64)
    neighbors_R = neighbors_R[~np.isnan(neighbors_R)]
    return float(np.percentile(neighbors_R, 10)) if neighbors_R.size else float("nan")


def frac_nonzero_advantage(treatment, tol: float = 1e-6) -> float:
    """Fraction of rollouts with |advantage| > tol (a null advantage counts as zero)."""
    advantage_R = _column(treatment, "advantage", np.float64)
    if advantage_R.size == 0:
        return float("nan")
    return float(np.mean(np.abs(np.nan_to_num(advantage_R, nan=0.0)) > tol))


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    if x.size < 2:
        return float("nan")
    dx, dy = x - x.mean(), y - y.mean()
    denominator = math.sqrt(float(dx @ dx) * float(dy @ dy))
    return float(dx @ dy) / denominator if denominator > 0 else float("nan")


def baseline_reward_corr(treatment, heldout) -> float:
    """Pearson correlation of b_i with the held-out per-prompt mean reward, over the treatment
    rollouts whose prompt has held-out samples. NaN with fewer than 2 pairs or no variance."""
    heldout_prompts_S = _column(heldout, "prompt_id").astype(str)
    heldout_rewards_S = _column(heldout, "reward", np.float64)
    prompts, inverse = np.unique(heldout_prompts_S, return_inverse=True)
    heldout_mean_P = np.bincount(inverse, weights=heldout_rewards_S, minlength=len(prompts)) / np.bincount(
        inverse, minlength=len(prompts)
    )
    prompts_R = _column(treatment, "prompt_id").astype(str)
    baseline_R = _column(treatment, "baseline", np.float64)
    position_R = np.searchsorted(prompts, prompts_R)
    has_heldout_R = (position_R < len(prompts)) & (prompts[np.minimum(position_R, len(prompts) - 1)] == prompts_R)
    has_heldout_R &= ~np.isnan(baseline_R)
    if len(prompts) == 0 or not has_heldout_R.any():
        return float("nan")
    return _pearson(baseline_R[has_heldout_R], heldout_mean_P[position_R[has_heldout_R]])


@dataclass(frozen=True)
class NotApplicable:
    """A gate metric that has no meaning for the treatment's kind of arm: its check passes, marked so."""

    reason: str

    def __str__(self) -> str:
        return f"{NOT_APPLICABLE}: {self.reason}"


def not_applicable_reason(metric: str, kind: str | None) -> str | None:
    """Why `metric` means nothing for a treatment arm of `kind` (its Estimator says); None when it
    applies (or the kind is not told)."""
    return None if kind is None else estimator_for(kind).gate_not_applicable(metric)


def compute_gate_metrics(treatment, baseline, heldout, n_pilot_steps: int = 2, treatment_estimator: str | None = None) -> dict:
    """The activation gate's metrics (GATE_METRICS), from the treatment arm's pilot log (its first
    n_pilot_steps steps), the baseline arm's log and the held-out samples of pilot prompts.

    Values are floats, except an executed group size that varies (a list, see executed_group_size),
    and a metric that means nothing for the treatment's estimator (`NotApplicable`).
    """
    pilot = _select(treatment, first_steps_mask(_column(treatment, "step"), n_pilot_steps))
    metrics = {
        "executed_group_size_treatment": executed_group_size(pilot),
        "executed_group_size_baseline": executed_group_size(baseline),
        "pilot_mean_reward": pilot_mean_reward(pilot, n_steps=n_pilot_steps),
        "kernel_effective_neighbors_p10": kernel_effective_neighbors_p10(pilot),
        "frac_nonzero_advantage_treatment": frac_nonzero_advantage(pilot),
        "baseline_reward_corr": baseline_reward_corr(pilot, heldout),
    }
    for metric in metrics:
        if (reason := not_applicable_reason(metric, treatment_estimator)) is not None:
            metrics[metric] = NotApplicable(reason)
    return metrics


@dataclass(frozen=True)
class GateCheckResult:
    metric: str
    value: float  # the metric as a float; NaN when missing or not a number
    op: str  # "one_of", "min" (value >= bound) or "max" (value <= bound)
    bound: float | tuple
    passed: bool
    observed: object = None  # the metric as computed (e.g. a per-step list of group sizes)


def _field(check, name: str):
    if isinstance(check, Mapping):
        return check.get(name)
    return getattr(check, name, None)


def _is_number(value) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool) and not math.isnan(value)


def evaluate_checks(checks: Sequence, metrics: Mapping) -> list[GateCheckResult]:
    """Compare each check's metric against its bounds: one result per bound.

    A check has `metric` and any of `one_of` (numbers or numeric strings such as "1"; compared
    numerically), `min` (value >= min) and `max` (value <= max). A missing metric, NaN or a
    non-number (a varying group size) never passes.
    """
    results: list[GateCheckResult] = []
    for check in checks:
        metric = _field(check, "metric")
        value = metrics.get(metric, float("nan"))
        one_of, low, high = _field(check, "one_of"), _field(check, "min"), _field(check, "max")
        if one_of is None and low is None and high is None:
            raise ValueError(f"gate check for {metric!r} has none of one_of, min, max")
        if isinstance(value, NotApplicable):  # one passing row per check, saying why it was not held
            op, bound = ("one_of", tuple(one_of)) if one_of is not None else ("min", float(low)) if low is not None else ("max", float(high))
            results.append(GateCheckResult(metric, float("nan"), op, bound, True, str(value)))
            continue
        ok = _is_number(value)
        number = float(value) if ok else float("nan")
        if one_of is not None:
            allowed = tuple(float(v) for v in one_of)
            passed = ok and any(math.isclose(number, a, rel_tol=1e-12, abs_tol=1e-12) for a in allowed)
            results.append(GateCheckResult(metric, number, "one_of", allowed, bool(passed), value))
        if low is not None:
            results.append(GateCheckResult(metric, number, "min", float(low), bool(ok and number >= float(low)), value))
        if high is not None:
            results.append(GateCheckResult(metric, number, "max", float(high), bool(ok and number <= float(high)), value))
    return results
