"""The one wording of a gate check (schemas/gate_text.py): what the gate artifacts, GateFailed's
message and the report all say."""

from __future__ import annotations

import math
import pickle

import pytest

from schemas.gate_text import GateRow, failing_text, fmt, gate_failed_message, is_gate_failure, needs_text
from schemas.errors import GateFailed


@pytest.mark.parametrize(
    ("op", "bound", "needs"),
    [
        ("min", "8.0", "≥ 8"),
        ("max", "0.9", "≤ 0.9"),
        ("one_of", "(1.0,)", "one of {1}"),
        ("one_of", "[8, 16]", "one of {8, 16}"),
        ("max", "0 (excess over tolerance)", "≤ 0 (excess over tolerance)"),
        ("max", "finite", "finite"),
    ],
)
def test_needs_text_reads_the_bound_as_written(op, bound, needs):
    assert needs_text(op, bound) == needs


def test_fmt_gives_four_significant_digits_and_na():
    assert [fmt(v) for v in (0.31254, 12345.6, 3, None, math.nan, True)] == ["0.3125", "1.235e+04", "3", "n/a", "n/a", "True"]


def _rows():
    return [
        {"gate": "activation_gate", "metric": "pilot_mean_reward", "value": 0.1875, "op": "min", "bound": "0.3", "passed": False},
        {"gate": "activation_gate", "metric": "executed_group_size_treatment", "value": 1.0, "op": "one_of",
         "bound": "(1.0,)", "passed": True},
        {"gate": "activation_gate", "metric": "baseline_reward_corr", "value": None, "op": "min", "bound": "0.1", "passed": False},
    ]


def test_failing_text_names_each_failing_check_and_what_it_needs():
    checks = [GateRow.from_row(r) for r in _rows()]
    assert failing_text(checks) == (
        "pilot_mean_reward = 0.1875 (needs ≥ 0.3); baseline_reward_corr = not computable (needs ≥ 0.1)"
    )
    assert [c.result for c in checks] == ["FAIL", "PASS", "FAIL"]


def test_gate_failed_says_what_the_report_says_and_survives_pickling():
    error = GateFailed("activation gate", [GateRow.from_row(r) for r in _rows()])
    expected = gate_failed_message("activation gate", [GateRow.from_row(r) for r in _rows()])
    assert str(error) == expected
    # metric, value and bound first: what the UI's state badge shows whole
    head, _, also = str(error).partition("; also ")
    assert head == "pilot_mean_reward = 0.1875 (needs ≥ 0.3): activation gate failed" and len(head) <= 80
    assert also == "baseline_reward_corr = not computable (needs ≥ 0.1)"
    assert is_gate_failure(str(error)) and not is_gate_failure("CUDA out of memory")
    again = pickle.loads(pickle.dumps(error))
    assert str(again) == str(error) and again.failing == error.failing
