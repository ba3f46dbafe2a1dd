"""The run directory's layout: the one place that names its stage, gate and arm folders.

    <run_dir>/spec/{spec,plan}.json          validate spec
    <run_dir>/spec/revisions/NNN.json         each edit of the spec (old, new, field by field)
    <run_dir>/preflight/                      correctness preflight (record.json, gate_report.parquet)
    <run_dir>/unit_checks/                    offline unit checks
    <run_dir>/pilot/<arm>/                    pilot logs (steps/step-NNNNN.{rollouts,metrics}.parquet,
                                              rollouts.parquet); pilot/heldout.parquet
    <run_dir>/audit/pilot/                    audit of the pilot logs (gate_report, mismatches)
    <run_dir>/gate/                           activation gate on the pilot
    <run_dir>/calibration/<arm>/ ...          the calibration pilot (+ revised_spec.json)
    <run_dir>/audit/calibration/              audit of the calibration pilot
    <run_dir>/calibration/gate/               activation gate on the calibration pilot
    <run_dir>/feasibility/                    feasibility
    <run_dir>/train/<unit>/                   training logs, checkpoints, final.json, costs.parquet
    <run_dir>/audit/train/                    audit of the training logs, before the decision
    <run_dir>/eval/<unit>/                    eval.jsonl, eval.parquet
    <run_dir>/nonfinite/<unit>/<step>/        a non-finite step's reproducer (`gs1 replay`; pilots: <stage>-<arm>)
    <run_dir>/decision/                       decision.{json,parquet,md}
    <run_dir>/report/                         report.{md,html} + plots
    <run_dir>/.stage-results/                 Prefect's persisted stage results (the resume cache)

A *unit* is one arm run at one seed (`unit_name`): the arm's own name in a single-seed spec (the
layout of every run so far), `<arm>-s<seed>` for each seed of a spec with several.

A sweep too long for one machine session is run a few units at a time (`gs1 run --units`) and its
units gathered in a *units folder* (`UnitsLayout`, what `gs1 decide --units` reads and writes):

    <units_dir>/<unit>/                       rollouts.parquet, step_metrics.parquet, costs.parquet,
                                              final.json, eval.jsonl (copied from a run's train/ and eval/)
    <units_dir>/decision/                     decision.{json,parquet,md}, once every unit is in
    <units_dir>/comparison.md                 the comparison table, and the units still missing
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

PilotStage = Literal["pilot", "calibration"]  # a pilot stage: the pilot, or the calibration's re-pilot
AuditStage = Literal["pilot", "calibration", "train"]  # whose logs an audit reads
PILOT_STAGES: tuple[PilotStage, ...] = ("pilot", "calibration")


# ---------------------------------------------------------------------------------------------
# Stage names: one name per stage, the same as the task run, in its artifact key (`artifact_key`),
# in a failed gate's message and in the report.

VALIDATE_SPEC = "validate spec"
PREFLIGHT = "correctness preflight"
UNIT_CHECKS = "offline unit checks"
CALIBRATED_SPEC = "calibrated spec"
FEASIBILITY = "feasibility"
DECISION = "decision"
REPORT = "report"


def pilot_name(stage: PilotStage) -> str:
    """`pilot`, `calibration pilot`."""
    return "pilot" if stage == "pilot" else f"{stage} pilot"


def gate_name(stage: PilotStage) -> str:
    """The activation gate on a pilot stage's logs: `activation gate`, `calibration gate`."""
    return "activation gate" if stage == "pilot" else f"{stage} gate"


def audit_name(stage: AuditStage) -> str:
    """`pilot audit`, `calibration audit`, `train audit`."""
    return f"{stage} audit"


def arm_stage_name(stage: Literal["train", "eval"], arm: str) -> str:
    """An arm's own stage: `train grpo_gs8`, `eval gs1_kernel`."""
    return f"{stage} {arm}"


def artifact_key(name: str) -> str:
    """A stage name as a Prefect artifact key (lower case, digits and dashes): `calibration-gate`."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def steps_dir(arm_dir: Path) -> Path:
    """An arm folder's per-step logs: `step-NNNNN.{rollouts,metrics,costs}.parquet`."""
    return Path(arm_dir) / "steps"


def step_log(arm_dir: Path, step: int, kind: Literal["rollouts", "metrics", "costs"]) -> Path:
    return steps_dir(arm_dir) / f"step-{step:05d}.{kind}.parquet"


def step_of(path: Path) -> int:
    """The step a step-log file holds (`step-00012.rollouts.parquet` -> 12)."""
    return int(Path(path).name.split(".")[0].split("-")[1])


def unit_name(arm: str, run_seed: int | None) -> str:
    """The folder of an arm at one seed: `<arm>` in a single-seed run (`run_seed` None), else
    `<arm>-s<seed>` (an arm name cannot end in `-s<seed>` ambiguously: every unit of a
    multi-seed run carries the suffix, and a seed is an integer)."""
    return arm if run_seed is None else f"{arm}-s{run_seed}"


NONFINITE_STEP_FILE = "step.json"  # the loop's part of a non-finite step's dump: arm, step, datum -> rollout
COSTS_FILE = "costs.parquet"  # a training unit's cost record (schemas.cost.ArmCost), in its train folder


@dataclass(frozen=True)
class RunLayout:
    root: Path

    def __post_init__(self):
        object.__setattr__(self, "root", Path(self.root))

    # stages that run once
    @property
    def spec_dir(self) -> Path:
        return self.root / "spec"

    @property
    def spec_json(self) -> Path:
        return self.spec_dir / "spec.json"

    @property
    def plan_json(self) -> Path:
        return self.spec_dir / "plan.json"

    @property
    def revisions_dir(self) -> Path:
        """`NNN.json` per edit of the spec this directory runs (schemas.revision.SpecRevision)."""
        return self.spec_dir / "revisions"

    @property
    def preflight_dir(self) -> Path:
        return self.root / "preflight"

    @property
    def unit_checks_dir(self) -> Path:
        return self.root / "unit_checks"

    @property
    def feasibility_dir(self) -> Path:
        return self.root / "feasibility"

    @property
    def decision_dir(self) -> Path:
        return self.root / "decision"

    @property
    def report_dir(self) -> Path:
        return self.root / "report"

    @property
    def stage_results(self) -> Path:
        return self.root / ".stage-results"

    @property
    def revised_spec_json(self) -> Path:
        return self.pilot_dir("calibration") / "revised_spec.json"

    # pilot stages and their gates
    def pilot_dir(self, stage: PilotStage) -> Path:
        return self.root / stage

    def pilot_arm_dir(self, stage: PilotStage, arm: str) -> Path:
        return self.pilot_dir(stage) / arm

    def gate_dir(self, stage: PilotStage) -> Path:
        """The activation gate of a pilot stage."""
        return self.root / "gate" if stage == "pilot" else self.pilot_dir(stage) / "gate"

    def audit_dir(self, stage: AuditStage) -> Path:
        return self.root / "audit" / stage

    # arms (an `arm` here is a unit name: `unit_name(arm, seed)`, the arm's name when single-seed)
    def train_arm_dir(self, arm: str) -> Path:
        return self.root / "train" / arm

    def eval_arm_dir(self, arm: str) -> Path:
        return self.root / "eval" / arm

    def nonfinite_dir(self, arm: str) -> Path:
        """Where a unit's non-finite steps leave their reproducer: `nonfinite/<arm>/<step>/`
        (`<step>` 1-based, as the failure line counts it; `gs1 replay` reruns one). A pilot's
        arm is named `<stage>-<arm>`."""
        return self.root / "nonfinite" / arm

    def costs_path(self, arm: str) -> Path:
        """A training unit's cost record: wall time, tokens, model calls (schemas.cost)."""
        return self.train_arm_dir(arm) / COSTS_FILE

    def arm_dir(self, stage: AuditStage, arm: str) -> Path:
        """Where an arm of a stage logs its steps: a pilot stage's arm folder or the training one."""
        return self.train_arm_dir(arm) if stage == "train" else self.pilot_arm_dir(stage, arm)


# A unit's files in a units folder, each copied from the run directory folder named beside it.
UNIT_TRAIN_FILES = ("rollouts.parquet", "step_metrics.parquet", COSTS_FILE, "final.json")
UNIT_EVAL_FILES = ("eval.jsonl",)


@dataclass(frozen=True)
class UnitsLayout:
    """A units folder: finished units of one sweep, gathered from the runs that made them."""

    root: Path

    def __post_init__(self):
        object.__setattr__(self, "root", Path(self.root))

    def unit_dir(self, unit: str) -> Path:
        return self.root / unit

    def eval_jsonl(self, unit: str) -> Path:
        return self.unit_dir(unit) / "eval.jsonl"

    def costs_path(self, unit: str) -> Path:
        return self.unit_dir(unit) / COSTS_FILE

    @property
    def decision_dir(self) -> Path:
        return self.root / "decision"

    @property
    def comparison_md(self) -> Path:
        return self.root / "comparison.md"
