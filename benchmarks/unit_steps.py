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
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

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
    train = RunLayout(run_dir).train_dir
    rows: list[UnitStep] = []
    for path in sorted(train.glob(f"*/{STEP_METRICS_FILE}")):
        table = pq.read_table(path, columns=["step", "step_seconds", "wall_time", "sample_seconds", "train_seconds"])
        for r in table.to_pylist():
            rows.append(UnitStep(path.parent.name, r["step"], r["wall_time"] - r["step_seconds"], r["wall_time"],
                                 r["sample_seconds"], r["train_seconds"]))
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
    spans = step_spans(rows)
    print("| step | units | s (all units) | s per unit | unit sample s (mean) | unit train s (mean) |")
    print("|---|---|---|---|---|---|")
    for s in spans:
        print(f"| {s.step} | {s.units} | {s.seconds:.1f} | {s.seconds_per_unit:.2f} | {s.sample_seconds_mean:.1f} "
              f"| {s.train_seconds_mean:.1f} |")
    projected = projected_seconds(spans, args.steps, args.warmup)
    if projected is None:
        print(f"\nno step after the first {args.warmup}: no projection")
    else:
        print(f"\n{args.steps} steps of {max(s.units for s in spans)} units: {projected:.0f} s "
              f"({projected / 60:.1f} min; the first {args.warmup} steps as measured, the rest at the median "
              f"of steps {spans[args.warmup].step}-{spans[-1].step})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
