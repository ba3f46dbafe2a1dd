"""How a gate check reads to people: the one wording shared by the gate table artifacts
(`tasks/gates.py`), `GateFailed`'s message and the run report (`report/`).

    row = GateRow.from_row(mapping)   # one gate_report row (schemas/artifacts.py GATE_REPORT)
    row.needs                            # '≥ 8', '≤ 0.9', 'one of {1}', or the bound's own text
    row.text                             # 'metric = 0.3125 (needs ≥ 0.5)'
    failing_text(checks)                 # every failing check's text, joined by '; '
    gate_failed_message(gate, checks)    # "pilot_mean_reward = 0.05 (needs ≥ 0.1): activation gate failed"
    calibration_stop_message(...)        # the activation gate's failure, then where its calibration stopped
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

NOT_COMPUTABLE = "not computable"
NOT_APPLICABLE = "not applicable"  # a metric that means nothing for the treatment's kind of arm (passes)
NEEDS_SYMBOLS = {"min": "≥", "max": "≤", "one_of": "one of"}


def fmt(value, digits: int = 4) -> str:
    """A number for people: 4 significant digits, 'n/a' for missing or NaN."""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        if math.isnan(value):
            return "n/a"
        return f"{value:.{digits}g}"
    return str(value)


def _bound_text(bound: str) -> str:
    """The gate_report's bound as written ("8.0", "(1.0,)", "0 (excess over tolerance)")."""
    text = str(bound).strip()
    try:
        return fmt(float(text))
    except ValueError:
        pass
    if text.startswith(("(", "[")):
        try:
            values = json.loads("[" + text.strip("()[]").rstrip(",") + "]")
            return "{" + ", ".join(fmt(float(v)) for v in values) + "}"
        except (ValueError, TypeError):
            return text
    return text


def needs_text(op: str, bound: str) -> str:
    """What a check needs, in symbols: '≥ 8', '≤ 0.9', 'one of {1}', or the bound's text."""
    shown = _bound_text(bound)
    starts_numeric = shown[:1].isdigit() or shown[:1] in "-+." or shown.startswith("{")
    if not starts_numeric:
        return shown  # e.g. "finite"
    return f"{NEEDS_SYMBOLS.get(op, op)} {shown}"


@dataclass(frozen=True)
class GateRow:
    """One row of a gate_report: a metric, its value, the bound it was held to, and the result."""

    gate: str
    metric: str
    value: float | None  # None (or NaN) when the metric could not be computed: the check fails
    op: str  # "min", "max" or "one_of"
    bound: str  # as written, e.g. "0.1" or "(1.0,)"
    passed: bool
    observed: str | None = None  # the raw metric when it is not one number

    @classmethod
    def from_row(cls, row: Mapping) -> GateRow:
        value = row.get("value")
        return cls(
            gate=str(row.get("gate", "")), metric=str(row["metric"]),
            value=None if value is None else float(value), op=str(row["op"]), bound=str(row["bound"]),
            passed=bool(row["passed"]), observed=None if row.get("observed") is None else str(row["observed"]),
        )

    @property
    def computable(self) -> bool:
        return self.value is not None and not math.isnan(self.value)

    @property
    def value_text(self) -> str:
        return fmt(self.value)

    @property
    def needs(self) -> str:
        return needs_text(self.op, self.bound)

    @property
    def result(self) -> str:
        if self.passed and self.observed is not None and self.observed.startswith(NOT_APPLICABLE):
            return "N/A"
        return "PASS" if self.passed else "FAIL"

    @property
    def text(self) -> str:
        """'metric = value (needs ≥ bound)'."""
        value = self.value_text if self.computable else NOT_COMPUTABLE
        return f"{self.metric} = {value} (needs {self.needs})"


def gate_passed(checks: Iterable[GateRow]) -> bool:
    return all(c.passed for c in checks)


def failing_text(checks: Iterable[GateRow]) -> str:
    """Every failing check as 'metric = value (needs ≥ bound)', joined by '; '."""
    return "; ".join(c.text for c in checks if not c.passed)


def gate_failed_message(gate: str, checks: Iterable[GateRow]) -> str:
    """A failed gate's message, first failing check first so that the front of it (what the
    Prefect UI's state badge shows) reads metric, value and bound:
    'pilot_mean_reward = 0.05 (needs ≥ 0.1): activation gate failed; also ...'."""
    checks = list(checks)
    failing = [c for c in checks if not c.passed] or checks
    also = "; ".join(c.text for c in failing[1:])
    return f"{failing[0].text}: {gate} failed" + (f"; also {also}" if also else "")


def calibration_stop_message(activation_gate: str, activation_checks: Iterable[GateRow], answered: str,
                             bandwidth: float | None, stop_gate: str, stop_checks: Iterable[GateRow]) -> str:
    """The message of a run whose activation gate failed the check `answered` (the metric the
    pre-registered calibration answers) and whose calibration then stopped too: the activation
    gate's failing checks first, those the calibration cannot answer before its own (what the
    user's spec judged: metric, value and bound), then what the calibration did and where it
    stopped. The flow's state message and the report's headline are both this text:
    'pilot_mean_reward = 0.2 (needs ≥ 0.99): activation gate failed; also kernel_effective_neighbors_p10
    = 6.8 (needs ≥ 8); the pre-registered calibration (bandwidth 1) then stopped at the calibration
    pilot: calibration_wall_minutes = 13.04 (needs ≤ 10)'."""
    failing = [c for c in activation_checks if not c.passed]
    ordered = [c for c in failing if c.metric != answered] + [c for c in failing if c.metric == answered]
    stop_checks = list(stop_checks)
    why = failing_text(stop_checks) or "; ".join(c.text for c in stop_checks)
    at = f" (bandwidth {fmt(bandwidth)})" if bandwidth is not None else ""
    return (f"{gate_failed_message(activation_gate, ordered)}; the pre-registered calibration{at} "
            f"then stopped at the {stop_gate}: {why}")


def is_gate_failure(message: str) -> bool:
    """Whether an error message (a flow run's, say) holds a failed gate's, as written above."""
    return re.search(r"\(needs [^)]*\): [^;:]* failed", message) is not None
