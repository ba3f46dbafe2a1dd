"""What a step of many units costs when they train together in one process (issue 46, item 5):
read from a run directory's `train/<unit>/step_metrics.parquet`, one table row per step.

    python benchmarks/unit_steps.py RUN_DIR [--steps 40]

Units in one process on one base take their steps side by side, so a step of all of them is the
span from the end of the step before (its last unit's `wall_time`) to this step's last unit's end;
the first step from its earliest unit's start (`wall_time - step_seconds`). Each row: the units
that logged the step, that span, the span per unit, and the units' mean sample and train seconds
(each unit's own clock: they overlap, so they do not add up to the span). Below the table, the
projection to `--steps` steps: the steps after the first `--warmup` (3: they compile, the decode
graphs on a shape's COMPILE_AFTER_BATCHES-th batch and the learner on its COMPILE_LEARNER_AFTER-th
call) at their median span, plus the warm-up steps as measured. A projection from
four steps is a rough guide: the rollouts' lengths, so the step's cost, change as the policy trains.

Units of one run on several GPUs (issue 52) step on each GPU apart: where their cost records
(`train/<unit>/costs.parquet`) name more than one device, a table and projection follow for each
device's units alone, beside the one over all of them.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from schemas.artifacts import read_rows
from schemas.layout import STEP_METRICS_FILE, RunLayout

WARMUP_STEPS = 3  # the steps whose span includes compiling (the learner compiles on its 3rd train call)


@dataclass(frozen=True)
class UnitStep:
    """One unit's logged step."""
    unit: str
    step: int
    start: float  # epoch seconds
    end: float
    sample_seconds: float
    train_seconds: float
    device: str | None = None  # the unit's cost record's (`schemas.cost.ArmCost.device`); None: not known


@dataclass(frozen=True)
class StepSpan:
    """A step of every unit that logged it."""
    step: int
    units: int
    seconds: float
    sample_seconds_mean: float
    train_seconds_mean: float

    @property
    def seconds_per_unit(self) -> float:
        return self.seconds / self.units


def unit_steps(run_dir: Path) -> list[UnitStep]:
    """Every unit's steps under the run directory's train folder."""
    layout = RunLayout(run_dir)
    rows: list[UnitStep] = []
    for path in sorted(layout.train_dir.glob(f"*/{STEP_METRICS_FILE}")):
        unit = path.parent.name
        costs = layout.costs_path(unit)  # written when the unit's training ended
        device = read_rows("arm_costs", costs)[0]["device"] if costs.is_file() else None
        table = pq.read_table(path, columns=["step", "step_seconds", "wall_time", "sample_seconds", "train_seconds"])
        for r in table.to_pylist():
            rows.append(UnitStep(unit, r["step"], r["wall_time"] - r["step_seconds"], r["wall_time"],
                                 r["sample_seconds"], r["train_seconds"], device))
    return rows


def step_spans(rows: list[UnitStep]) -> list[StepSpan]:
    spans: list[StepSpan] = []
    previous_end: float | None = None
    for step in sorted({r.step for r in rows}):
        of_step = [r for r in rows if r.step == step]
        end = max(r.end for r in of_step)
        start = min(r.start for r in of_step) if previous_end is None else previous_end
        spans.append(StepSpan(step, len(of_step), end - start, statistics.fmean(r.sample_seconds for r in of_step),
                              statistics.fmean(r.train_seconds for r in of_step)))
        previous_end = end
    return spans


def projected_seconds(spans: list[StepSpan], steps: int, warmup: int = WARMUP_STEPS) -> float | None:
    """`steps` steps: the first `warmup` as measured, the rest at the median span after them (None
    when no step after the warm-up was logged)."""
    later = [s.seconds for s in spans[warmup:]]
    if not later:
        return None
    return sum(s.seconds for s in spans[:warmup]) + (steps - warmup) * statistics.median(later)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--steps", type=int, default=40, help="steps to project to")
    ap.add_argument("--warmup", type=int, default=WARMUP_STEPS, help="first steps taken as measured (they compile)")
    args = ap.parse_args(argv)
    rows = unit_steps(args.run_dir)
    if not rows:
        print(f"unit_steps: no {STEP_METRICS_FILE} under {args.run_dir}/train", file=sys.stderr)
        return 2
    print_steps(step_spans(rows), args.steps, args.warmup)
    devices = sorted({r.device for r in rows if r.device is not None})
    if len(devices) > 1:
        for device in devices:
            print(f"\n### {device}: {len({r.unit for r in rows if r.device == device})} units\n")
            print_steps(step_spans([r for r in rows if r.device == device]), args.steps, args.warmup)
    return 0


def print_steps(spans: list[StepSpan], steps: int, warmup: int) -> None:
    """The step table and, after the warm-up, its projection to `steps` steps."""
    print("| step | units | s (all units) | s per unit | unit sample s (mean) | unit train s (mean) |")
    print("|---|---|---|---|---|---|")
    for s in spans:
        print(f"| {s.step} | {s.units} | {s.seconds:.1f} | {s.seconds_per_unit:.2f} | {s.sample_seconds_mean:.1f} "
              f"| {s.train_seconds_mean:.1f} |")
    projected = projected_seconds(spans, steps, warmup)
    if projected is None:
        print(f"\nno step after the first {warmup}: no projection")
    else:
        print(f"\n{steps} steps of {max(s.units for s in spans)} units: {projected:.0f} s "
              f"({projected / 60:.1f} min; the first {warmup} steps as measured, the rest at the median "
              f"of steps {spans[warmup].step}-{spans[-1].step})")


if __name__ == "__main__":
    sys.exit(main())
