"""What a run directory holds, as typed objects: the flow's stages, what each left on disk.

    data = load_run(run_dir)     # RunData; a stage that did not run is simply absent

The flow's stages the report shows are `STAGES`, read from the one stage table
(`schemas.layout.STAGES`: id, name, folder, order). A gate stage (`GateStage`) names its
gate_report.parquet; adding one to the list is all it takes for the report to read its table,
give it a row in the stage table and a table in the Gates section, and stop there when it failed.
Any stage may be missing (a failed gate stops the flow); an unreadable file is named in
`problems` and treated as absent.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, ValidationError

from design.arm import ArmConfig
from design.plan import RunPlan
from design.revision import SpecRevision
from design.spec import GateCheck
from rules import DEFAULT_METHOD, Rule, rule_for
from schemas.artifacts import read_artifact
from schemas.cost import ArmCost
from schemas.errors import UserError
from schemas.gate_text import GateRow, failing_text, fmt, gate_passed
from schemas.kernel import CALIBRATION
from schemas.layout import (
    FINAL_FILE, MISMATCHES_FILE, PILOT_STAGES, RunLayout, gate_report_path, merged_logs, stage_info, steps_dir,
)

KERNEL_P10_METRIC = CALIBRATION.metric  # the check the pre-registered calibration answers


# ---------------------------------------------------------------------------------------------
# The flow's stages (schemas.layout's stage table), in flow order


@dataclass(frozen=True)
class Stage:
    key: str
    title: str  # as people read it in the stage table

    @property
    def heading(self) -> str:
        return self.title


@dataclass(frozen=True)
class DetailSource:
    """A table a gate writes beside its gate_report, listed under the gate's table."""

    kind: str  # its artifact schema (schemas/artifacts.py)
    file: str  # in the gate's folder
    title: str  # what its rows are, for people


@dataclass(frozen=True)
class GateStage(Stage):
    """A stage that judges: its gate_report.parquet holds one row per check."""

    gate_dir: Callable[[RunLayout], Path]  # where it writes gate_report.parquet (schemas.layout names it)
    table_title: str = ""  # heading of its table in the Gates section (default: `title`)
    observed_label: str = ""  # when set, its table shows the rows' `observed` column under this heading
    runs_with: str = ""  # the stage it runs only as part of: skipped or not run with it, for its reason
    detail: DetailSource | None = None

    @property
    def heading(self) -> str:
        return self.table_title or self.title


AUDIT_MISMATCHES = DetailSource("audit_mismatches", MISMATCHES_FILE, "logged values the audit could not reproduce")


def _stage(id: str) -> Stage:
    info = stage_info(id)
    return Stage(info.id, info.name)


def _gate(id: str, **options) -> GateStage:
    info = stage_info(id)
    return GateStage(info.id, info.name, lambda run, folder=info.folder: run.root / folder, **options)


# Keys, titles and folders are the stage table's (the stages' one names, as the task runs and
# artifacts are named); which stages judge, and how their tables read, is the report's own.
STAGES: tuple[Stage, ...] = (
    _stage("spec"),
    _gate("preflight"),
    _gate("unit_checks"),
    _stage("pilot"),
    _gate("audit_pilot", detail=AUDIT_MISMATCHES),
    _gate("activation_gate"),
    _gate("calibration_pilot", runs_with="calibration"),  # its gate: the pre-registered wall cap
    _gate("audit_calibration", runs_with="calibration", detail=AUDIT_MISMATCHES),
    _gate("calibration"),
    _gate("feasibility"),
    _stage("train"),
    _gate("audit_train", detail=AUDIT_MISMATCHES),
    _stage("eval"),
    _stage("decision"),
)
LOG_SOURCES = (*PILOT_STAGES, "train")  # stages that train arms and log their steps
# The calibration's stages (its pilot's logs are the log source "calibration"): part of a run only
# when its activation gate failed the check the calibration answers.
CALIBRATION_STAGES = ("calibration_pilot", "audit_calibration", "calibration")


# ---------------------------------------------------------------------------------------------
# JSON records the flow writes (read leniently: absent fields are None)


class _Record(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class SpecNotes(_Record):
    """spec/spec.json, as far as the report shows it."""

    hypothesis: str | None = None


class BootstrapCI(_Record):
    confidence: float | None = None
    n_resamples: int | None = None


class McNemar(_Record):
    b: int | None = None
    c: int | None = None
    n_discordant: int | None = None


class Comparison(_Record):
    """One arm against the baseline in a multi-arm or multi-seed decision (rl.stats.family_decision)."""

    arm: str
    verdict: str
    n: int
    seeds: int = 1
    method: str | None = None  # None: a decision from before rules were named (the default rule)
    mean_diff: float
    lower: float
    upper: float
    treatment_mean: float | None = None
    baseline_mean: float | None = None
    p_noninferior: float | None = None
    holm_p_noninferior: float | None = None
    holm_p_inferior: float | None = None
    holm_level: float | None = None
    holm_lower: float | None = None
    holm_upper: float | None = None


class Family(_Record):
    method: str
    alpha: float
    m: int
    statement: str = ""


class Decision(_Record):
    """decision/decision.json (rl.stats.paired_decision + the arm names; a multi-arm or multi-seed
    decision adds the family statement, the seeds and every arm's comparison)."""

    verdict: str
    n: int
    mean_diff: float
    lower: float
    upper: float
    alpha: float
    margin: float
    method: str | None = None  # the rule; None: a decision from before rules were named
    treatment: str | None = None
    baseline: str | None = None
    treatment_mean: float | None = None
    baseline_mean: float | None = None
    bootstrap_lower: float | None = None
    bootstrap_upper: float | None = None
    bootstrap_ci: BootstrapCI | None = None
    mcnemar_p: float | None = None
    mcnemar: McNemar | None = None
    noninferior_threshold: float | None = None
    family: Family | None = None
    seeds: tuple[int, ...] = ()
    comparisons: tuple[Comparison, ...] = ()
    holm_p_noninferior: float | None = None
    holm_p_inferior: float | None = None
    holm_level: float | None = None
    holm_lower: float | None = None
    holm_upper: float | None = None

    @property
    def rule(self) -> Rule:
        """The rule that read it (`rules`): a decision from before rules were named was the
        user's pre-registered one."""
        return rule_for(self.method or DEFAULT_METHOD)


class Feasibility(_Record):
    """feasibility/feasibility.json: the projection of the full run from the pilot."""

    phases: dict[str, float] = {}
    wall_seconds: float = 0.0
    budget_wall_seconds: float | None = None
    status: str = "?"


class Timings(_Record):
    """<pilot|calibration>/timings.json."""

    setup_seconds: dict[str, float] = {}
    bandwidth: float | None = None  # the calibration's re-pilot bandwidth (None: the spec's own)


@dataclass(frozen=True)
class BandwidthRevision:
    """The calibration's revision of one arm's kernel bandwidth (calibration/revised_spec.json)."""

    arm: str
    bandwidth: float


# ---------------------------------------------------------------------------------------------
# Tables the flow writes


@dataclass(frozen=True)
class DetailTable:
    """A gate's detail table as text (floats to 12 significant digits: audits compare them)."""

    source: DetailSource
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class GateTable:
    """A gate stage's gate_report, one check per row, and its detail table when it has one."""

    stage: GateStage
    checks: tuple[GateRow, ...]
    detail: DetailTable | None = None

    @property
    def passed(self) -> bool:
        return gate_passed(self.checks)

    @property
    def failing(self) -> tuple[GateRow, ...]:
        return tuple(c for c in self.checks if not c.passed)

    @property
    def failing_text(self) -> str:
        return failing_text(self.checks)

    def fails(self, metric: str) -> bool:
        return any(c.metric == metric for c in self.failing)


@dataclass(frozen=True)
class ArmLogs:
    """One arm's logs in one stage (pilot, calibration or train); tables are None when absent."""

    rollouts: pa.Table | None = None
    metrics: pa.Table | None = None
    complete: bool = False  # the stage finished for this arm (merged logs / final.json)

    @property
    def steps_logged(self) -> int:
        return 0 if self.metrics is None else self.metrics.num_rows


@dataclass(frozen=True)
class StageLogs:
    """What one training stage logged: each arm's steps, and the stage's timings when it finished."""

    arms: dict[str, ArmLogs]
    timings: Timings | None = None


@dataclass(frozen=True)
class ArmEval:
    """One arm's eval: per item, whether it answered correctly."""

    arm: str
    correct: tuple[bool, ...]

    @property
    def n(self) -> int:
        return len(self.correct)

    @property
    def n_correct(self) -> int:
        return sum(self.correct)

    @property
    def accuracy(self) -> float:
        return self.n_correct / self.n if self.n else float("nan")


@dataclass(frozen=True)
class RunData:
    layout: RunLayout
    plan: RunPlan
    stages: tuple[Stage, ...] = STAGES  # the flow's stages this directory was read by
    spec: SpecNotes = SpecNotes()
    gates: dict[str, GateTable] = field(default_factory=dict)  # gate stage key -> its table
    logs: dict[str, StageLogs] = field(default_factory=dict)  # pilot / calibration / train -> logs
    evals: dict[str, ArmEval] = field(default_factory=dict)  # unit (the arm, when single-seed) -> eval
    costs: dict[str, ArmCost] = field(default_factory=dict)  # unit -> its training cost
    feasibility: Feasibility | None = None
    decision: Decision | None = None
    revision: BandwidthRevision | None = None
    spec_revisions: tuple[SpecRevision, ...] = ()  # edits of the spec this directory ran, oldest first
    reused: tuple[str, ...] = ()  # stages this run served from cache (their inputs had not changed)
    problems: tuple[str, ...] = ()  # unreadable files, named
    # calibration records on file from an earlier attempt, not shown: this run's activation gate did
    # not call for the calibration (stage titles)
    earlier_attempt: tuple[str, ...] = ()
    # the error's message when the flow run rendering this page ended Failed (`with_stopped`):
    # then a decision.json in the directory is an earlier run's and is not this run's verdict
    stopped: str | None = None

    @property
    def run_dir(self) -> Path:
        return self.layout.root

    def with_stopped(self, stopped: str | None) -> RunData:
        return replace(self, stopped=stopped)

    def with_reused(self, reused: tuple[str, ...]) -> RunData:
        return replace(self, reused=tuple(reused))

    @property
    def gate_stages(self) -> tuple[GateStage, ...]:
        return tuple(s for s in self.stages if isinstance(s, GateStage))

    def stage(self, key: str) -> Stage:
        return next(s for s in self.stages if s.key == key)

    @property
    def arm_names(self) -> list[str]:
        names = [a.name for a in self.plan.arms]
        for by_arm in [*(s.arms for s in self.logs.values()), self.evals]:
            names += [n for n in by_arm if n not in names]
        return names

    def role(self, arm: str) -> str | None:
        """The role of an arm, or of the arm a unit runs."""
        run = self.plan.run
        plan = self.arm_plan(arm)
        name = plan.name if plan else arm
        return "treatment" if name == run.treatment else "baseline" if name == run.baseline else None

    def arm_plan(self, arm: str) -> ArmConfig | None:
        """An arm's plan, or a unit's (the arm at one seed)."""
        return next((a for a in (*self.plan.arms, *self.plan.units()) if a.name == arm or a.unit == arm), None)

    @property
    def units(self) -> list[str]:
        """Every arm x seed the training and eval stages run (the arm names when single-seed)."""
        return [u.unit for u in self.plan.units()]

    def check_for(self, metric: str) -> GateCheck | None:
        return next((c for c in self.plan.checks if c.metric == metric), None)

    def arm_logs(self, source: str) -> dict[str, ArmLogs]:
        stage = self.logs.get(source)
        return stage.arms if stage else {}

    @property
    def verdict(self) -> str | None:
        """This run's verdict: none when it ended Failed (a decision.json on file is then older)."""
        return self.decision.verdict if self.decision and not self.stopped else None


# ---------------------------------------------------------------------------------------------
# Reading the run directory


def _read_json(path: Path, problems: list[str]):
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        problems.append(f"{path}: not readable JSON ({type(e).__name__})")
        return None


def _first_error(e: ValidationError) -> str:
    err = e.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "top level"
    return f"{where}: {err['msg']}"


def _read_record(model: type[BaseModel], path: Path, problems: list[str]):
    raw = _read_json(path, problems)
    if raw is None:
        return None
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        problems.append(f"{path}: not a {model.__name__} record ({_first_error(e)})")
        return None


def _read_table(kind: str, path: Path, problems: list[str]) -> pa.Table | None:
    if not path.is_file():
        return None
    try:
        return read_artifact(kind, path)
    except UserError as e:
        problems.append(str(e))
        return None


def _read_step_files(steps_dir: Path, kind: str, suffix: str, problems: list[str]) -> pa.Table | None:
    tables = [t for f in sorted(steps_dir.glob(f"step-*.{suffix}.parquet")) if (t := _read_table(kind, f, problems)) is not None]
    return pa.concat_tables(tables) if tables else None


def _read_arm_logs(arm_dir: Path, problems: list[str], done: bool) -> ArmLogs | None:
    """Merged logs when the stage merged them, else the per-step files of a stage in progress.
    `done`: the stage's own record that it finished for this arm (with the merged logs)."""
    merged_rollouts, merged_metrics = merged_logs(arm_dir)
    if merged_metrics.is_file():
        logs = ArmLogs(
            rollouts=_read_table("rollouts", merged_rollouts, problems),
            metrics=_read_table("step_metrics", merged_metrics, problems),
            complete=done,
        )
    else:
        logs = ArmLogs(
            rollouts=_read_step_files(steps_dir(arm_dir), "rollouts", "rollouts", problems),
            metrics=_read_step_files(steps_dir(arm_dir), "step_metrics", "metrics", problems),
        )
    return logs if logs.metrics is not None or logs.rollouts is not None else None


def _read_stage_logs(layout: RunLayout, source: str, arms: list[str], problems: list[str]) -> StageLogs | None:
    """The logs each planned arm left in a training stage (a pilot stage, or the full runs)."""
    # pilots finish with timings.json; a full run finishes each arm with its final.json
    timings = _read_record(Timings, layout.timings_json(source), problems) if source in PILOT_STAGES else None
    logs = {}
    for arm in arms:
        arm_dir = layout.arm_dir(source, arm)
        if not arm_dir.is_dir():
            continue
        done = (arm_dir / FINAL_FILE).is_file() if source == "train" else timings is not None
        found = _read_arm_logs(arm_dir, problems, done)
        if found is not None:
            logs[arm] = found
    if not logs and timings is None:
        return None
    return StageLogs(arms=logs, timings=timings)


def _read_revision(path: Path, problems: list[str]) -> BandwidthRevision | None:
    """The last revision of a kernel bandwidth in calibration/revised_spec.json."""
    raw = _read_json(path, problems)
    revision = None
    for rev in (raw or {}).get("revisions", []) if isinstance(raw, dict) else []:
        change = rev.get("change", {}) if isinstance(rev, dict) else {}
        if "arm" in change and isinstance(change.get("kernel.bandwidth"), (int, float)):
            revision = BandwidthRevision(arm=str(change["arm"]), bandwidth=float(change["kernel.bandwidth"]))
    return revision


def _read_detail(stage: GateStage, layout: RunLayout, problems: list[str]) -> DetailTable | None:
    source = stage.detail
    table = _read_table(source.kind, stage.gate_dir(layout) / source.file, problems)
    if table is None:
        return None
    rows = tuple(tuple(fmt(v, 12) for v in row.values()) for row in table.to_pylist())
    return DetailTable(source, tuple(table.column_names), rows)


def load_run(run_dir: RunLayout | str | Path, stages: tuple[Stage, ...] = STAGES) -> RunData:
    """Everything the flow wrote under `run_dir` (a run's layout, or its path) for `stages`; a
    missing stage is simply absent.

    A run directory needs `spec/plan.json` (written by the first stage); without it, or when the
    directory does not exist, this is a one-line UserError. An unreadable artifact is listed in
    `problems` and treated as absent.
    """
    layout = RunLayout.of(run_dir)
    run_dir = layout.root
    if not run_dir.is_dir():
        raise UserError(f"{run_dir}: no such run directory")
    problems: list[str] = []
    plan = _read_record(RunPlan, layout.plan_json, problems)  # the flow's own plan type: one owner
    if plan is None:
        why = f" ({problems[0]})" if problems else ""
        raise UserError(f"{run_dir}: not a gs1 run directory: no readable spec/plan.json{why}")
    stages = tuple(stages)
    spec = _read_record(SpecNotes, layout.spec_json, problems) or SpecNotes()
    gates = {}
    for stage in stages:
        if isinstance(stage, GateStage):
            table = _read_table("gate_report", gate_report_path(stage.gate_dir(layout)), problems)
            if table is not None:
                detail = _read_detail(stage, layout, problems) if stage.detail else None
                gates[stage.key] = GateTable(stage, tuple(GateRow.from_row(r) for r in table.to_pylist()), detail)
    arms = [a.name for a in plan.arms]  # the pilots run arms; training and eval run units (arm x seed)
    units = [u.unit for u in plan.units()]
    logs = {source: found for source in LOG_SOURCES
            if (found := _read_stage_logs(layout, source, units if source == "train" else arms, problems)) is not None}
    evals, costs = {}, {}
    for unit in units:
        table = _read_table("eval_items", layout.eval_parquet(unit), problems)
        if table is not None and table.num_rows:
            evals[unit] = ArmEval(unit, tuple(bool(c) for c in table.column("correct").to_pylist()))
        cost = _read_table("arm_costs", layout.costs_path(unit), problems)
        if cost is not None and cost.num_rows:
            costs[unit] = ArmCost.model_validate(cost.to_pylist()[0])
    gates, logs, earlier_attempt = _this_attempts_calibration(gates, logs, stages)
    feasibility = _read_record(Feasibility, layout.feasibility_json, problems)
    decision = _read_record(Decision, layout.decision.json, problems)
    revision = _read_revision(layout.revised_spec_json, problems) if "calibration" in logs else None
    spec_revisions = tuple(
        r for f in sorted(layout.revisions_dir.glob("[0-9][0-9][0-9].json"))
        if (r := _read_record(SpecRevision, f, problems)) is not None
    )
    return RunData(
        layout=layout, plan=plan, stages=stages, spec=spec, gates=gates, logs=logs, evals=evals, costs=costs,
        feasibility=feasibility, decision=decision, revision=revision, spec_revisions=spec_revisions,
        problems=tuple(problems), earlier_attempt=earlier_attempt,
    )


def _this_attempts_calibration(gates: dict[str, GateTable], logs: dict[str, StageLogs], stages: tuple[Stage, ...]):
    """(gates, logs, earlier) without the calibration's records when this run's activation gate did
    not fail the check the calibration answers (it passed, failed on other checks only, or has no
    record): what the calibration left then is an earlier attempt's, and the report's stage table,
    gate tables and plots would disagree if it were shown. `earlier` names the stages dropped."""
    activation = gates.get("activation_gate")
    if activation is not None and activation.fails(KERNEL_P10_METRIC):
        return gates, logs, ()
    titles = {s.key: s.title for s in stages}
    earlier = tuple(titles.get(k, k) for k in CALIBRATION_STAGES if k in gates)
    if "calibration" in logs:
        earlier = (titles.get("calibration_pilot", "calibration pilot"), *earlier)
    kept_gates = {k: g for k, g in gates.items() if k not in CALIBRATION_STAGES}
    kept_logs = {k: v for k, v in logs.items() if k != "calibration"}
    return kept_gates, kept_logs, tuple(dict.fromkeys(earlier))
