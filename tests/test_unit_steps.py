"""benchmarks/unit_steps.py: a step of many units in one process, read from their step metrics."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fixtures.benchmarks import load_benchmark
from schemas.layout import STEP_METRICS_FILE, RunLayout

unit_steps = load_benchmark("unit_steps")


def _unit(run: RunLayout, unit: str, ends: list[float], seconds: list[float]) -> None:
    folder = run.train_arm_dir(unit)
    folder.mkdir(parents=True)
    n = len(ends)
    pq.write_table(pa.table({"step": list(range(n)), "step_seconds": seconds, "wall_time": ends,
                             "sample_seconds": [s / 2 for s in seconds], "train_seconds": [s / 4 for s in seconds],
                             "reward_mean": [0.5] * n}), folder / STEP_METRICS_FILE)


def test_a_step_spans_from_the_last_unit_of_the_step_before_to_its_own_last(tmp_path, capsys):
    run = RunLayout(tmp_path)
    # two units side by side; the second ends each step later. Steps 2 and 3 take 10 and 14 s of all units.
    _unit(run, "grpo_gs8-s0", ends=[1030.0, 1060.0, 1068.0, 1085.0], seconds=[30.0, 29.0, 7.0, 16.0])
    _unit(run, "gs1_kernel-s0", ends=[1040.0, 1065.0, 1075.0, 1089.0], seconds=[38.0, 24.0, 9.0, 13.0])
    spans = unit_steps.step_spans(unit_steps.unit_steps(tmp_path))
    assert [s.units for s in spans] == [2, 2, 2, 2]
    # step 0 from the earliest start (1000 and 1002): 40 s; then 1040 -> 1065, 1065 -> 1075, 1075 -> 1089
    assert [s.seconds for s in spans] == pytest.approx([40.0, 25.0, 10.0, 14.0])
    assert spans[2].seconds_per_unit == pytest.approx(5.0)
    assert spans[0].sample_seconds_mean == pytest.approx(17.0)
    # 40 steps: the first two as measured, 38 at the median of 10 and 14; by default three, 37 at 14
    assert unit_steps.projected_seconds(spans, 40, warmup=2) == pytest.approx(65.0 + 38 * 12.0)
    assert unit_steps.projected_seconds(spans, 40) == pytest.approx(75.0 + 37 * 14.0)
    assert unit_steps.main([str(tmp_path), "--steps", "40", "--warmup", "2"]) == 0
    out = capsys.readouterr().out
    assert "| 2 | 2 | 10.0 | 5.00 |" in out and "40 steps of 2 units: 521 s" in out


def test_three_steps_give_no_projection_and_an_empty_run_is_an_input_error(tmp_path, capsys):
    run = RunLayout(tmp_path / "run")
    _unit(run, "a-s0", ends=[10.0, 20.0, 30.0], seconds=[10.0, 10.0, 10.0])
    spans = unit_steps.step_spans(unit_steps.unit_steps(run.root))
    assert unit_steps.projected_seconds(spans, 40) is None
    assert unit_steps.main([str(tmp_path / "empty")]) == 2
    assert "no step_metrics.parquet" in capsys.readouterr().err


def test_units_on_two_gpus_get_a_table_each_beside_the_whole(tmp_path, capsys):
    """A run's units on two GPUs (their cost records name the devices; made up here) step on each GPU
    apart: the table over all of them, then one a device, each with its own projection; units whose
    records name one device, or none, get the one table alone."""
    from schemas.artifacts import write_artifact
    from schemas.cost import ArmCost

    run = RunLayout(tmp_path)
    _unit(run, "grpo_gs8-s0", ends=[1030.0, 1060.0, 1068.0, 1085.0], seconds=[30.0, 29.0, 7.0, 16.0])
    _unit(run, "gs1_kernel-s0", ends=[1040.0, 1065.0, 1075.0, 1089.0], seconds=[38.0, 24.0, 9.0, 13.0])
    _unit(run, "grpo_gs8-s1", ends=[1020.0, 1030.0, 1040.0, 1050.0], seconds=[20.0, 10.0, 10.0, 10.0])
    assert unit_steps.main([str(tmp_path)]) == 0
    assert "###" not in capsys.readouterr().out  # no cost records: one table
    for unit, gpu in (("grpo_gs8-s0", "h/GPU-a"), ("gs1_kernel-s0", "h/GPU-a"), ("grpo_gs8-s1", "h/GPU-b")):
        cost = ArmCost(arm=unit.split("-")[0], seed=0, unit=unit, steps=4, wall_seconds=1.0, sample_seconds=1.0,
                       train_seconds=1.0, sampler_tokens=1, trainer_tokens=1, model_calls=1, device=gpu)
        write_artifact("arm_costs", [cost.model_dump()], run.costs_path(unit))
    assert unit_steps.main([str(tmp_path), "--warmup", "2"]) == 0
    out = capsys.readouterr().out
    whole, on_a = out.split("### h/GPU-a: 2 units")
    on_a, on_b = on_a.split("### h/GPU-b: 1 units")
    assert "| 0 | 3 | 40.0 | 13.33 |" in whole
    assert "| 2 | 2 | 10.0 | 5.00 |" in on_a and "40 steps of 2 units: 521 s" in on_a  # as the two alone
    assert "| 1 | 1 | 10.0 | 10.00 |" in on_b and "40 steps of 1 units: 410 s" in on_b
