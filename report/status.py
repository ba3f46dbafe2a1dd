"""Each stage's status, from what it left on disk: what ran, what failed, and why later stages
did not run.

    statuses = stage_statuses(data)      # one StageStatus per stage of data.stages, flow order
    stopping_gate(data)                  # the key of the gate stage that stopped the flow, or None
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from report.model import CALIBRATION_STAGES, KERNEL_P10_METRIC, GateStage, RunData, Stage
from schemas.gate_text import calibration_stop_message, fmt, gate_failed_message


class Status(StrEnum):
    PASSED = "passed"
    FAILED = "failed"
    DONE = "done"
    INCOMPLETE = "incomplete"
    SKIPPED = "skipped"
    NOT_RUN = "not run"
    EARLIER_RUN = "earlier run"  # on file, but from an earlier run: this one stopped before it


@dataclass(frozen=True)
class StageStatus:
    stage: Stage
    status: Status
    detail: str

    @property
    def key(self) -> str:
        return self.stage.key

    @property
    def title(self) -> str:
        return self.stage.title


def stopping_gate(data: RunData) -> str | None:
    """The first failed gate that stopped the flow (the activation gate does not stop it when the
    pre-registered calibration then passed)."""
    for stage in data.stages:
        gate = data.gates.get(stage.key)
        if gate is None or gate.passed:
            continue
        if stage.key == "activation_gate" and gate.fails(KERNEL_P10_METRIC) and _calibration_on_file(data):
            # the pre-registered calibration answered this failure: its own gates (later in the
            # list) say whether the flow went on or stopped there
            continue
        return stage.key
    return None


def stop_message(data: RunData) -> str | None:
    """Why the flow stopped, from the gate records: the flow's own state message for that stop
    (`schemas.gate_text`), so a report rendered later from the directory says what the run said.
    A stop in the calibration leads with the activation gate's failing checks."""
    stop = stopping_gate(data)
    if stop is None:
        return None
    gate = data.gates[stop]
    activation = data.gates.get("activation_gate")
    if stop in CALIBRATION_STAGES and activation is not None and not activation.passed:
        calibration = data.logs.get("calibration")
        bandwidth = calibration.timings.bandwidth if calibration and calibration.timings else None
        return calibration_stop_message(activation.stage.heading, activation.checks, KERNEL_P10_METRIC, bandwidth,
                                        data.stage(stop).heading, gate.checks)
    return gate_failed_message(data.stage(stop).heading, gate.checks)


def stage_statuses(data: RunData) -> list[StageStatus]:
    """One line per flow stage: what ran, what failed, and why later stages did not run."""
    stop = stopping_gate(data)
    stop_heading = data.stage(stop).heading if stop else None
    stop_reason = f"not run: the flow stopped at the {stop_heading}" if stop else None
    arms = [a.name for a in data.plan.arms]
    statuses: list[StageStatus] = []
    reached_stop = False
    first_missing = None  # the first stage with no record when no gate stopped the flow
    for stage in data.stages:
        status, detail = _stage_status(data, stage, arms)
        if reached_stop and data.stopped and status not in (Status.NOT_RUN, Status.SKIPPED):
            # this run stopped before the stage: what the directory holds came from an earlier run
            status, detail = Status.EARLIER_RUN, f"not this run's (it stopped at the {stop_heading}); on file: {detail}"
        if status == Status.NOT_RUN:
            if reached_stop and stop_reason:
                detail = stop_reason
            elif first_missing is not None:
                detail = f"not run yet: comes after {first_missing}"
            elif not detail:  # calibration explains itself; others are the frontier of the run
                first_missing = stage.title
                detail = (
                    "no record yet: the flow may still be running this stage, or stopped with an error "
                    "before it (see the flow run's logs)"
                )
        elif status == Status.INCOMPLETE and first_missing is None:
            first_missing = stage.title
        statuses.append(StageStatus(stage, status, detail))
        if stage.key == stop:
            reached_stop = True
    return statuses


def steps_text(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


def _stage_status(data: RunData, stage: Stage, arms: list[str]) -> tuple[Status, str]:
    if isinstance(stage, GateStage):
        return _gate_status(data, stage)
    return _STATUS_OF[stage.key](data, arms)


def _calibration_on_file(data: RunData) -> bool:
    """A gate of the calibration (its own, or one that runs with it) has a record."""
    return any(s.key in data.gates for s in data.gate_stages if "calibration" in (s.key, s.runs_with))


def _gate_status(data: RunData, stage: GateStage) -> tuple[Status, str]:
    gate = data.gates.get(stage.key)
    if gate is None:
        if stage.key == "calibration":
            return _calibration_not_on_file(data)
        if stage.runs_with:  # e.g. the calibration's audit: skipped when the calibration was
            status, detail = _gate_status(data, data.stage(stage.runs_with))
            if status in (Status.SKIPPED, Status.NOT_RUN):
                return status, detail
        return Status.NOT_RUN, ""
    n = len(gate.checks)
    if gate.passed:
        return Status.PASSED, f"all {n} checks passed"
    text = f"{len(gate.failing)} of {n} checks failed: {gate.failing_text}"
    calibration = data.gates.get("calibration")
    if stage.key == "activation_gate" and calibration is not None and calibration.passed:
        text += "; the pre-registered bandwidth calibration then passed"
    return Status.FAILED, text


def _calibration_not_on_file(data: RunData) -> tuple[Status, str]:
    """The calibration runs only when the activation gate fails the kernel's p10 check."""
    act = data.gates.get("activation_gate")
    earlier = (f" (an earlier attempt's {', '.join(data.earlier_attempt)} records are on file, not shown)"
               if data.earlier_attempt else "")
    if act is not None and act.passed:
        return Status.SKIPPED, f"not needed: the activation gate passed at the pre-registered bandwidth{earlier}"
    if act is not None and not act.fails(KERNEL_P10_METRIC):
        return Status.SKIPPED, (f"not triggered: the pre-registered calibration only answers a failed "
                                f"{KERNEL_P10_METRIC}{earlier}")
    pilot = data.gates.get("calibration_pilot")
    if pilot is not None and not pilot.passed:
        return Status.NOT_RUN, ""  # the calibration stopped at its pilot: the stage table says so
    if data.layout.pilot_dir("calibration").is_dir():
        return Status.INCOMPLETE, "calibration pilot started, its gate has no record yet"
    return Status.NOT_RUN, f"not run: only runs when the activation gate fails {KERNEL_P10_METRIC}"


def _spec_status(data: RunData, arms: list[str]) -> tuple[Status, str]:
    return Status.DONE, f"{len(arms)} arms; treatment {data.plan.run.treatment}, baseline {data.plan.run.baseline}"


def _pilot_status(data: RunData, arms: list[str]) -> tuple[Status, str]:
    pilot = data.logs.get("pilot")
    if pilot is not None and pilot.timings is not None:
        steps = ", ".join(f"{a}: {steps_text(pilot.arms[a].steps_logged)}" for a in arms if a in pilot.arms)
        return Status.DONE, steps or "timings recorded"
    if pilot is not None and pilot.arms:
        return Status.INCOMPLETE, ", ".join(f"{a}: {steps_text(logs.steps_logged)} logged" for a, logs in pilot.arms.items())
    return Status.NOT_RUN, ""


def _train_status(data: RunData, arms: list[str]) -> tuple[Status, str]:
    arms = data.units  # training runs every arm at every seed
    train = data.arm_logs("train")
    if not train:
        return Status.NOT_RUN, ""
    parts = []
    for a in arms:
        plan = data.arm_plan(a)
        total = plan.steps if plan and plan.steps is not None else "?"
        logs = train.get(a)
        parts.append(f"{a}: {logs.steps_logged if logs else 0}/{total} steps" + ("" if logs and logs.complete else " (unfinished)"))
    complete = all(a in train and train[a].complete for a in arms)
    return (Status.DONE if complete else Status.INCOMPLETE), ", ".join(parts)


def _eval_status(data: RunData, arms: list[str]) -> tuple[Status, str]:
    arms = data.units
    if not data.evals:
        return Status.NOT_RUN, ""
    parts = [f"{a}: accuracy {fmt(data.evals[a].accuracy)} on {data.evals[a].n} items" for a in arms if a in data.evals]
    missing = [a for a in arms if a not in data.evals]
    if missing:
        parts.append("no eval yet for " + ", ".join(missing))
        return Status.INCOMPLETE, "; ".join(parts)
    return Status.DONE, "; ".join(parts)


def _decision_status(data: RunData, arms: list[str]) -> tuple[Status, str]:
    d = data.decision
    if d is None:
        return Status.NOT_RUN, ""
    if d.comparisons:
        verdicts = ", ".join(f"{c.arm} {c.verdict}" for c in d.comparisons)
        family = f" (Holm over {d.family.m} arms)" if d.family else ""
        return Status.DONE, f"against {d.baseline}: {verdicts}{family}, {d.n} items x {len(d.seeds) or 1} seeds"
    return Status.DONE, f"{d.verdict}: lower bound {fmt(d.lower)} vs margin {fmt(d.margin)} over {d.n} items"


# The stages that are not gates, each with how it tells its status from what it left on disk.
_STATUS_OF = {
    "spec": _spec_status,
    "pilot": _pilot_status,
    "train": _train_status,
    "eval": _eval_status,
    "decision": _decision_status,
}
