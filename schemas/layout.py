"""The run directory's layout: the one place that names the flow's stages (`STAGES`, the stage
table: id, name, folder, order), their gate and arm folders and the files in them (`RunLayout`).

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
                                              final.json, eval.jsonl (copied from a run's train/ and eval/),
                                              unit.json: the unit's proof (schemas.unit_proof)
    <units_dir>/runs/<run>/                   the gates' records of each run collected from (every
                                              stage folder before training, and the train audit),
                                              named by the run directory's folder name
    <units_dir>/decision/                     decision.{json,parquet,md}, once every unit is in
                                              (written whole: a temp sibling renamed into place)
    <units_dir>/comparison.md                 the comparison table, and the units still missing
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from schemas.errors import UserError

PilotStage = Literal["pilot", "calibration"]  # a pilot stage: the pilot, or the calibration's re-pilot
AuditStage = Literal["pilot", "calibration", "train"]  # whose logs an audit reads
PILOT_STAGES: tuple[PilotStage, ...] = ("pilot", "calibration")


# ---------------------------------------------------------------------------------------------
# The stage table: the experiment flow's stages, once, in the order the flow runs them
# (flows/experiment.py). A stage's `name` is its one name: its task (run) name, in its artifact
# key (`artifact_key`), in a failed gate's message and in the report; `id` is the report's key
# for it (in `ReportFiles.stages`); `folder` is where it writes, under the run directory.


@dataclass(frozen=True)
class StageInfo:
    """One stage of the experiment flow."""

    id: str
    name: str
    folder: str
    order: int  # its place in the flow (0 first); the calibration stages run only when it is triggered


def _table(*rows: tuple[str, str, str]) -> tuple[StageInfo, ...]:
    return tuple(StageInfo(id, name, folder, order) for order, (id, name, folder) in enumerate(rows))


STAGES: tuple[StageInfo, ...] = _table(
    ("spec", "validate spec", "spec"),
    ("preflight", "correctness preflight", "preflight"),
    ("unit_checks", "offline unit checks", "unit_checks"),
    ("pilot", "pilot", "pilot"),
    ("audit_pilot", "pilot audit", "audit/pilot"),
    ("activation_gate", "activation gate", "gate"),
    # the pre-registered bandwidth calibration: re-pilot, its audit, its gate, the revised spec
    ("calibration_pilot", "calibration pilot", "calibration"),
    ("audit_calibration", "calibration audit", "audit/calibration"),
    ("calibration", "calibration gate", "calibration/gate"),
    ("calibrated_spec", "calibrated spec", "calibration"),
    ("feasibility", "feasibility", "feasibility"),
    ("train", "train", "train"),  # one task run per unit: `train <unit>`
    ("audit_train", "train audit", "audit/train"),
    ("eval", "eval", "eval"),  # one task run per unit: `eval <unit>`
    ("decision", "decision", "decision"),
    ("report", "report", "report"),
)
_BY_ID = {s.id: s for s in STAGES}


def stage_info(id: str) -> StageInfo:
    """The stage table's row of `id` (a KeyError names an id the table does not have)."""
    return _BY_ID[id]


def stage_of_run(task_run_name: str) -> StageInfo | None:
    """The stage a task run of the experiment flow belongs to, by its name (`train grpo_gs8` is
    the train stage, `paired decision (Holm)` the decision's), or None for a task of no stage."""
    if task_run_name == FAMILY_DECISION_RUN:
        return stage_info("decision")
    exact = next((s for s in STAGES if s.name == task_run_name), None)
    if exact is not None:
        return exact
    head = task_run_name.split(" ", 1)[0]
    return next((s for s in STAGES if s.id in ("train", "eval") and s.name == head), None)


VALIDATE_SPEC = stage_info("spec").name
PREFLIGHT = stage_info("preflight").name
UNIT_CHECKS = stage_info("unit_checks").name
CALIBRATED_SPEC = stage_info("calibrated_spec").name
FEASIBILITY = stage_info("feasibility").name
DECISION = stage_info("decision").name
REPORT = stage_info("report").name
# The decision of several arms or seeds (Holm over the family) is the decision stage too; its
# task keeps the name it has always had in the UI.
FAMILY_DECISION = f"paired {DECISION}"
FAMILY_DECISION_RUN = f"{FAMILY_DECISION} (Holm)"
AUDIT = "audit"  # the one task of the three audit stages (its runs are named by `audit_name`)


def pilot_stage(stage: PilotStage) -> StageInfo:
    return stage_info("pilot" if stage == "pilot" else f"{stage}_pilot")


def gate_stage(stage: PilotStage) -> StageInfo:
    """The activation gate on a pilot stage's logs."""
    return stage_info("activation_gate" if stage == "pilot" else stage)


def audit_stage(stage: AuditStage) -> StageInfo:
    return stage_info(f"audit_{stage}")


def pilot_name(stage: PilotStage) -> str:
    """`pilot`, `calibration pilot`."""
    return pilot_stage(stage).name


def gate_name(stage: PilotStage) -> str:
    """The activation gate on a pilot stage's logs: `activation gate`, `calibration gate`."""
    return gate_stage(stage).name


def audit_name(stage: AuditStage) -> str:
    """`pilot audit`, `calibration audit`, `train audit`."""
    return audit_stage(stage).name


def arm_stage_name(stage: Literal["train", "eval"], arm: str) -> str:
    """An arm's own stage: `train grpo_gs8`, `eval gs1_kernel`."""
    return f"{stage_info(stage).name} {arm}"


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


# File names (each stage writes them in its folder; a units folder copies some of them).
NONFINITE_STEP_FILE = "step.json"  # the loop's part of a non-finite step's dump: arm, step, datum -> rollout
RUN_DIR_MARKER = ".gs1-run-dir"  # in every run directory gs1 made or took (`RunLayout.claim`)
COSTS_FILE = "costs.parquet"  # a training unit's cost record (schemas.cost.ArmCost), in its train folder
GATE_REPORT_FILE = "gate_report.parquet"  # a judging stage's checks, one row each
MISMATCHES_FILE = "mismatches.parquet"  # an audit's logged values it could not reproduce
ROLLOUTS_FILE = "rollouts.parquet"  # an arm's merged rollout log
STEP_METRICS_FILE = "step_metrics.parquet"  # an arm's merged step metrics
CHECKPOINTS_FILE = "checkpoints.parquet"
PILOT_ARM_FILE = "pilot_arm.json"  # an arm's finished part of a pilot stage (design.plan.PilotArmRun)
FINAL_FILE = "final.json"  # a trained unit's TrainedArm record: its training finished
EVAL_JSONL_FILE = "eval.jsonl"  # per item: item_id, correct (what the decision pairs)
EVAL_PARQUET_FILE = "eval.parquet"
REPORT_HTML_FILE, REPORT_MARKDOWN_FILE = "report.html", "report.md"  # in the report folder (or where asked)


@dataclass(frozen=True)
class DecisionFiles:
    """A decision's files: a run directory's decision stage, or a units folder's decision."""

    root: Path

    def __post_init__(self):
        object.__setattr__(self, "root", Path(self.root))

    @property
    def json(self) -> Path:
        return self.root / "decision.json"

    @property
    def parquet(self) -> Path:
        return self.root / "decision.parquet"

    @property
    def markdown(self) -> Path:
        return self.root / "decision.md"

    @property
    def comparisons(self) -> Path:
        """Every compared arm's pair (a decision of several arms or seeds)."""
        return self.root / "comparisons.parquet"


@dataclass(frozen=True)
class RunLayout:
    """A run directory. Tasks and flows are handed this (never a path string to rebuild it from):
    frozen and picklable, and as a task input it hashes to its path alone (Prefect's INPUTS cache
    key JSON-encodes a dataclass field by field), so a resumed run keys its stages as before."""

    root: Path

    def __post_init__(self):
        object.__setattr__(self, "root", Path(self.root))

    @classmethod
    def of(cls, run_dir: RunLayout | str | Path) -> RunLayout:
        """`run_dir` as a layout: at an entry point that is handed a path (the CLI, a deployment)."""
        return run_dir if isinstance(run_dir, RunLayout) else cls(run_dir)

    def resolved(self) -> RunLayout:
        """The same directory by its absolute path (a result store, a path another process reads)."""
        return RunLayout(self.root.resolve())

    @property
    def marker(self) -> Path:
        """Written into every run directory gs1 makes or takes: what lets a later run take it again."""
        return self.root / RUN_DIR_MARKER

    def claim(self, legacy: str | None = None) -> None:
        """Make the run directory, or take an existing one that is empty or a gs1 run directory
        (its marker; an earlier gs1's: its stage results, or `legacy`, a file each of them holds),
        and mark it.
        A file, a foreign non-empty folder, or one gs1 cannot write: a UserError, one line,
        nothing in it touched."""
        root = self.root
        if root.exists() and not root.is_dir():
            raise UserError(f"run directory {root}: is a file, not a folder; name a new folder or a gs1 run directory")
        if root.is_dir():
            try:
                entries = {p.name for p in root.iterdir()}
            except OSError as e:
                raise UserError(f"run directory {root}: cannot read the folder ({e.strerror})") from None
            # an earlier gs1's run directory: its stage results, or `legacy`
            earlier = {self.stage_results.name} | ({legacy} if legacy else set())
            if entries and RUN_DIR_MARKER not in entries and not entries & earlier:
                shown = ", ".join(sorted(entries)[:3]) + (", ..." if len(entries) > 3 else "")
                raise UserError(f"run directory {root}: not a gs1 run directory (no {RUN_DIR_MARKER}; it holds "
                                f"{shown}); name a new or empty folder, or a run directory gs1 made")
        try:
            root.mkdir(parents=True, exist_ok=True)
            self.marker.touch()
        except OSError as e:
            raise UserError(f"run directory {root}: cannot write there ({e.strerror})") from None

    def _folder(self, stage_id: str) -> Path:
        return self.root / stage_info(stage_id).folder

    # stages that run once
    @property
    def spec_dir(self) -> Path:
        return self._folder("spec")

    @property
    def spec_json(self) -> Path:
        return self.spec_dir / "spec.json"

    @property
    def plan_json(self) -> Path:
        return self.spec_dir / "plan.json"

    @property
    def revisions_dir(self) -> Path:
        """`NNN.json` per edit of the spec this directory runs (design.revision.SpecRevision)."""
        return self.spec_dir / "revisions"

    @property
    def preflight_dir(self) -> Path:
        return self._folder("preflight")

    @property
    def preflight_record(self) -> Path:
        return self.preflight_dir / "record.json"

    @property
    def unit_checks_dir(self) -> Path:
        return self._folder("unit_checks")

    @property
    def unit_checks_details(self) -> Path:
        return self.unit_checks_dir / "details.json"

    @property
    def feasibility_dir(self) -> Path:
        return self._folder("feasibility")

    @property
    def feasibility_json(self) -> Path:
        return self.feasibility_dir / "feasibility.json"

    @property
    def spec_with_feasibility_json(self) -> Path:
        """The run's spec with its feasibility records filled from the pilot."""
        return self.feasibility_dir / "spec_with_feasibility.json"

    @property
    def decision_dir(self) -> Path:
        return self._folder("decision")

    @property
    def decision(self) -> DecisionFiles:
        return DecisionFiles(self.decision_dir)

    @property
    def report_dir(self) -> Path:
        return self._folder("report")

    @property
    def stage_results(self) -> Path:
        return self.root / ".stage-results"

    @property
    def revised_spec_json(self) -> Path:
        return self.root / stage_info("calibrated_spec").folder / "revised_spec.json"

    # pilot stages and their gates
    def pilot_dir(self, stage: PilotStage) -> Path:
        return self.root / pilot_stage(stage).folder

    def pilot_arm_dir(self, stage: PilotStage, arm: str) -> Path:
        return self.pilot_dir(stage) / arm

    def pilot_arm_record(self, stage: PilotStage, arm: str) -> Path:
        """An arm's finished part of a pilot stage (design.plan.PilotArmRun): what a Retry reuses."""
        return self.pilot_arm_dir(stage, arm) / PILOT_ARM_FILE

    def heldout_path(self, stage: PilotStage) -> Path:
        """The treatment's held-out samples of a pilot stage."""
        return self.pilot_dir(stage) / "heldout.parquet"

    def timings_json(self, stage: PilotStage) -> Path:
        """A pilot stage's timings (what feasibility projects from); written when the stage ends."""
        return self.pilot_dir(stage) / "timings.json"

    def gate_dir(self, stage: PilotStage) -> Path:
        """The activation gate of a pilot stage."""
        return self.root / gate_stage(stage).folder

    def audit_dir(self, stage: AuditStage) -> Path:
        return self.root / audit_stage(stage).folder

    # arms (an `arm` here is a unit name: `unit_name(arm, seed)`, the arm's name when single-seed)
    @property
    def train_dir(self) -> Path:
        """Every trained unit's folder (`train_arm_dir`)."""
        return self._folder("train")

    def train_arm_dir(self, arm: str) -> Path:
        return self.train_dir / arm

    def final_json(self, arm: str) -> Path:
        """A trained unit's record (design.plan.TrainedArm), written when its training finished."""
        return self.train_arm_dir(arm) / FINAL_FILE

    def checkpoints_path(self, arm: str) -> Path:
        return self.train_arm_dir(arm) / CHECKPOINTS_FILE

    def eval_arm_dir(self, arm: str) -> Path:
        return self._folder("eval") / arm

    def eval_jsonl(self, arm: str) -> Path:
        return self.eval_arm_dir(arm) / EVAL_JSONL_FILE

    def eval_parquet(self, arm: str) -> Path:
        return self.eval_arm_dir(arm) / EVAL_PARQUET_FILE

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


def gate_report_path(gate_dir: Path) -> Path:
    """A judging stage's gate_report.parquet in its folder."""
    return Path(gate_dir) / GATE_REPORT_FILE


def merged_logs(arm_dir: Path) -> tuple[Path, Path]:
    """An arm folder's merged logs: (rollouts.parquet, step_metrics.parquet)."""
    return Path(arm_dir) / ROLLOUTS_FILE, Path(arm_dir) / STEP_METRICS_FILE


# A unit's files in a units folder, each copied from the run directory folder named beside it.
UNIT_TRAIN_FILES = (ROLLOUTS_FILE, STEP_METRICS_FILE, COSTS_FILE, FINAL_FILE)
UNIT_EVAL_FILES = (EVAL_JSONL_FILE,)


def gate_record_folders() -> tuple[str, ...]:
    """The run directory's folders that hold its gates' records: every stage's before training
    (spec, preflight, unit checks, the pilots, their audits and gates, feasibility) and the train
    audit; what a units folder keeps of each run its units came from."""
    train = stage_info("train").order
    folders = [s.folder for s in STAGES if s.order < train] + [stage_info("audit_train").folder]
    # calibration's stages share a folder, and its gate's lies inside it: keep the outermost
    return tuple(f for f in dict.fromkeys(folders)
                 if not any(f != g and f.startswith(g + "/") for g in folders))


@dataclass(frozen=True)
class UnitsLayout:
    """A units folder: finished units of one sweep, gathered from the runs that made them."""

    root: Path

    def __post_init__(self):
        object.__setattr__(self, "root", Path(self.root))

    def unit_dir(self, unit: str) -> Path:
        return self.root / unit

    def eval_jsonl(self, unit: str) -> Path:
        return self.unit_dir(unit) / EVAL_JSONL_FILE

    def costs_path(self, unit: str) -> Path:
        return self.unit_dir(unit) / COSTS_FILE

    def proof_json(self, unit: str) -> Path:
        """The unit's proof (schemas.unit_proof.UnitProof): what was copied, from where, its hashes."""
        from schemas.unit_proof import PROOF_FILE

        return self.unit_dir(unit) / PROOF_FILE

    def step_metrics_path(self, unit: str) -> Path:
        return self.unit_dir(unit) / STEP_METRICS_FILE

    def run_record_dir(self, run_name: str) -> Path:
        """Where the gates' records of a run the units came from are kept."""
        return self.root / "runs" / run_name

    @property
    def decision_dir(self) -> Path:
        return self.root / "decision"

    @property
    def decision(self) -> DecisionFiles:
        return DecisionFiles(self.decision_dir)

    @property
    def comparison_md(self) -> Path:
        return self.root / "comparison.md"

    # secondary readings under another rule than the spec's (`gs1 decide --units DIR --rule R`)
    READINGS_FOLDER = "readings"

    def reading_dir(self, method: str) -> Path:
        return self.root / self.READINGS_FOLDER / method

    def reading_json(self, method: str) -> Path:
        return self.reading_dir(method) / "reading.json"

    def reading_md(self, method: str) -> Path:
        return self.reading_dir(method) / "reading.md"

    def reading_comparisons(self, method: str) -> Path:
        return self.reading_dir(method) / "comparisons.parquet"

    def readings(self) -> list[str]:
        """The rules a secondary reading of this folder was written under, by name."""
        folder = self.root / self.READINGS_FOLDER
        return sorted(p.parent.name for p in folder.glob("*/reading.json")) if folder.is_dir() else []

    # the plots' folder, relative to the units folder: the README links to PLOTS_FOLDER/<plot>.png
    PLOTS_FOLDER = "plots"

    @property
    def plots_dir(self) -> Path:
        return self.root / self.PLOTS_FOLDER
