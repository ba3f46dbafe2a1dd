"""Stages that judge: offline unit checks, the activation gate, feasibility (and the power reading), the decision.

Every gate writes its metrics (Parquet + a table artifact) before it raises `GateFailed`, so the
values are in plain sight whether the gate passed or not.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from prefect import task

from decision.records import write_family_decision, write_paired_decision
from design.arm import ArmConfig
from design.plan import DecisionPlan
from design.spec import Budget, GateCheck
from estimators.reference import gs1_kernel_reference
from estimators.registry import rollout_log
from pipeline.artifacts import publish_markdown, publish_table
from pipeline.cache import stage_cache
from pipeline.judging import judging_task
from pipeline.running import stage_end_hooks
from rl.audit import audit_log
from rl.backends import backend_named
from rl.checks import run_offline_checks
from rl.feasibility import PilotTimings, project_full_run
from rl.gates import NotApplicable, compute_gate_metrics, evaluate_checks
from schemas.artifacts import read_artifact, write_artifact
from schemas.errors import GateFailed
from schemas.gate_text import GateRow, failing_text, fmt
from schemas.io import write_json_atomic
from schemas.layout import DECISION as DECISION_STAGE
from schemas.layout import (
    AUDIT, FAMILY_DECISION, FAMILY_DECISION_RUN, FEASIBILITY, MISMATCHES_FILE, UNIT_CHECKS, AuditStage,
    PilotStage, RunLayout, artifact_key, audit_name, gate_name, gate_report_path,
)


def _gate_rows(gate: str, results) -> list[dict]:
    return [
        {"gate": gate, "metric": r.metric, "value": float(r.value), "op": r.op, "bound": str(r.bound),
         "passed": bool(r.passed), "observed": str(r.observed)}
        for r in results
    ]


def record_gate(name: str, rows: list[dict], out_dir: Path, table: list[dict] | None = None) -> None:
    """Write the gate report (Parquet + table artifact); raise GateFailed if any check failed.

    `name` is the stage's one name (schemas.layout: `activation gate`, `calibration gate`,
    `pilot audit`, ...), told by the caller (never read from a path): the artifact key is
    `artifact_key(name)` and the failure message names it. The artifact reads as the report's
    gate tables do: metric, value, what it needs, PASS/FAIL -- or `table`, when the gate has a
    better one. Each row's `gate` column is that name too."""
    rows = [{"observed": None, **r, "gate": name} for r in rows]
    write_artifact("gate_report", rows, gate_report_path(out_dir))
    checks = [GateRow.from_row(r) for r in rows]
    failing = failing_text(checks)
    publish_table(
        artifact_key(name),
        table or [{"metric": c.metric, "value": c.value_text, "needs": c.needs, "result": c.result} for c in checks],
        description=f"{name}: " + (f"FAILED on {failing}" if failing else f"passed, {len(rows)} checks"),
        on_deployment_run=bool(failing),  # a failed gate is what the run page must show
    )
    if failing:
        raise GateFailed(name, checks)


@judging_task(name=UNIT_CHECKS, task_run_name=UNIT_CHECKS, **stage_end_hooks(), cache_policy=stage_cache(), persist_result=True)
def offline_unit_checks(layout: RunLayout) -> list[dict]:
    """The spec's offline checks of the estimator (forced (non)activation, fallback, GRPO)."""
    results = run_offline_checks(reference_fn=gs1_kernel_reference)
    rows = [
        {"gate": "offline_unit_checks", "metric": r.name, "value": 1.0 if r.passed else 0.0, "op": "min",
         "bound": "1", "passed": bool(r.passed)}
        for r in results
    ]
    out = layout.unit_checks_dir
    write_json_atomic(layout.unit_checks_details, [{"name": r.name, **r.details} for r in results])
    record_gate(UNIT_CHECKS, rows, out)
    return rows


def _stage_parameter() -> str:
    """The `stage` parameter of the task run being named (its default when not passed)."""
    from prefect.runtime import task_run

    return task_run.parameters.get("stage", "pilot")


@judging_task(name=gate_name("pilot"), task_run_name=lambda: gate_name(_stage_parameter()),
              **stage_end_hooks(), cache_policy=stage_cache("treatment_path", "baseline_path", "heldout_path"), persist_result=True)
def activation_gate(checks: tuple[GateCheck, ...], treatment_path: str, baseline_path: str, heldout_path: str,
                    n_pilot_steps: int, layout: RunLayout, stage: PilotStage = "pilot",
                    treatment_estimator: str | None = None) -> dict:
    """Every check of the spec's activation_gate on the logs of the pilot stage `stage`. A check of
    a metric that means nothing for the treatment's estimator passes as not applicable (rl.gates)."""
    metrics = compute_gate_metrics(
        read_artifact("rollouts", treatment_path),
        read_artifact("rollouts", baseline_path),
        read_artifact("heldout", heldout_path),
        n_pilot_steps=n_pilot_steps,
        treatment_estimator=treatment_estimator,
    )
    rows = _gate_rows("activation_gate", evaluate_checks(checks, metrics))
    record_gate(gate_name(stage), rows, layout.gate_dir(stage))
    return {k: str(v) if isinstance(v, NotApplicable) else v for k, v in metrics.items()}


@judging_task(name=AUDIT, task_run_name=lambda: audit_name(_stage_parameter()),
              **stage_end_hooks(), cache_policy=stage_cache("rollout_paths"), persist_result=True)
def audit_gate(arms: tuple[ArmConfig, ...], rollout_paths: list[str], layout: RunLayout, stage: AuditStage) -> list[dict]:
    """Recompute every logged advantage of each arm from its own rollout log with the independent
    reference (rl.audit); a row beyond tolerance fails the run before its logs are used."""
    # an arm at several seeds is audited once per seed, named by its unit
    results = [replace(audit_log(arm, rollout_log(read_artifact("rollouts", path))), arm=arm.unit)
               for arm, path in zip(arms, rollout_paths)]
    out = layout.audit_dir(stage)
    mismatches = [m.__dict__ for r in results for m in r.mismatches]
    write_artifact("audit_mismatches", mismatches, out / MISMATCHES_FILE)
    rows = [
        {"gate": "audit", "metric": f"{r.arm}.max_abs_diff", "value": max(r.max_abs_diff.values(), default=float("nan")),
         "op": "max", "bound": r.tolerance, "passed": r.passed,
         "observed": json.dumps({"arm": r.arm, "estimator": r.estimator, "reference": r.reference, "rows": r.rows,
                                 "steps": r.steps, "mismatches": r.n_mismatches, "max_abs_diff": r.max_abs_diff})}
        for r in results
    ]
    table = [
        {"arm": m["arm"], "step": m["step"], "row": m["row"], "column": m["column"], "logged": fmt(m["logged"], 12),
         "recomputed": fmt(m["recomputed"], 12)}
        for m in mismatches
    ] or [
        {"arm": r.arm, "estimator": r.estimator, "reference": r.reference, "rows": r.rows, "steps": r.steps,
         "max |logged - recomputed|": fmt(max(r.max_abs_diff.values(), default=float("nan"))), "needs": r.tolerance,
         "result": "PASS" if r.passed else "FAIL"}
        for r in results
    ]
    record_gate(audit_name(stage), rows, out, table=table)
    return rows


@judging_task(name=FEASIBILITY, task_run_name=FEASIBILITY, **stage_end_hooks(), cache_policy=stage_cache("timings_path"), persist_result=True)
def feasibility(timings_path: str, steps: int, n_eval: int, budget: Budget, backend: str, layout: RunLayout,
                recovery_reserve: float = 0.25, units: dict[str, str] | None = None,
                decision: DecisionPlan | None = None, seeds: int = 1) -> dict:
    """Project the full run from the pilot's timings; over budget is a gate failure. `units`
    (unit -> arm) projects every arm x seed: an arm the pilot did not run is taken to step as
    slowly as the slowest one it did. Beside it, the power of the `decision` rule at `seeds` seeds
    (`DecisionPlan.power_reading`): recorded always, a gate only where the spec pre-registers
    `min_power`."""
    timings = json.loads(Path(timings_path).read_text())
    piloted = timings["step_seconds"]
    step_seconds = piloted if units is None else {u: piloted.get(arm, max(piloted.values())) for u, arm in units.items()}
    measured = PilotTimings(
        setup_seconds=max(timings["setup_seconds"].values()),
        step_seconds=step_seconds,
        eval_seconds_per_item=timings["eval_seconds_per_item"],
        gpus=backend_named(backend).devices(),
    )
    projection = project_full_run(
        measured, steps=steps, n_eval=n_eval, budget_gpu_hours=budget.gpu_hours,
        budget_wall_minutes=budget.max_wall_minutes, arms_in_parallel=True, recovery_reserve=recovery_reserve,
    )
    power = decision.power_reading(n_eval, seeds) if decision is not None else None
    record = {"source": str(timings_path), "measurements": timings, **projection.as_record(),
              "power": None if power is None else power.record()}
    write_json_atomic(layout.feasibility_json, record)
    write_json_atomic(layout.spec_with_feasibility_json, spec_with_feasibility(layout, record))
    rows = [
        {"gate": "feasibility", "metric": "projected_wall_minutes", "value": projection.wall_seconds / 60,
         "op": "max", "bound": str(budget.max_wall_minutes), "passed": projection.wall_seconds <= projection.budget_wall_seconds},
        {"gate": "feasibility", "metric": "projected_gpu_hours", "value": projection.gpu_hours,
         "op": "max", "bound": str(budget.gpu_hours), "passed": projection.gpu_hours <= budget.gpu_hours},
    ]
    if power is not None and (row := power.gate_row()) is not None:
        rows.append(row)
    if power is not None:
        publish_markdown(artifact_key(FEASIBILITY) + "-power", f"# Power of the decision rule\n\n{power.summary()}\n\n"
                         + power.table_markdown(), description=f"power: {power.method}")
    record_gate(FEASIBILITY, rows, layout.feasibility_dir)
    return record


def spec_with_feasibility(layout: RunLayout, record: dict) -> dict:
    """The run's spec with its `feasibility` and `feasibility_check` records filled from the pilot."""
    spec = json.loads(layout.spec_json.read_text())
    spec["feasibility"] = {
        **(spec.get("feasibility") or {}),
        "source": record["source"],
        "measurements": record["measurements"],
        "recovery": {"reserve_fraction": record["recovery_reserve"], "reserve_seconds": record["phases"]["reserve"]},
    }
    spec["feasibility_check"] = {
        **(spec.get("feasibility_check") or {}),
        "gpu_hours": record["gpu_hours"],
        "wall_seconds": record["wall_seconds"],
        "phases": record["phases"],
        "problems": record["problems"],
        "status": record["status"],
    }
    return spec


@task(name=DECISION_STAGE, task_run_name=DECISION_STAGE, **stage_end_hooks(), cache_policy=stage_cache("treatment_eval", "baseline_eval"),
      persist_result=True)
def paired_decision_record(treatment_eval: str, baseline_eval: str, decision: DecisionPlan, names: dict,
                           layout: RunLayout) -> dict:
    """The spec's rule (+ McNemar, bootstrap) on the two arms' per-item correctness."""
    record, markdown = write_paired_decision(treatment_eval, baseline_eval, decision, names, layout.decision)
    publish_markdown(artifact_key(DECISION_STAGE), markdown, description=f"Decision: {record['verdict']}")
    return record


@task(name=FAMILY_DECISION, task_run_name=FAMILY_DECISION_RUN,
      **stage_end_hooks(), cache_policy=stage_cache("eval_files"), persist_result=True)
def family_decision_record(eval_files: list[str], units: list[tuple[str, int]], decision: DecisionPlan, names: dict,
                           layout: RunLayout) -> dict:
    """Every compared arm against the baseline on the same items, paired within each seed, with
    Holm's control of the family-wise error; `eval_files[i]` is the eval of `units[i]` = (arm, seed).

    decision.json holds the treatment's pair at the top level (the fields a two-arm decision has,
    its verdict Holm's), the family statement, and every pair under `comparisons`; the per-pair
    verdicts are one table in comparisons.parquet and decision.md."""
    record, markdown = write_family_decision(eval_files, units, decision, names, layout.decision)
    verdicts = ", ".join(f"{p['arm']} {p['verdict']}" for p in record["comparisons"])
    publish_markdown(artifact_key(DECISION_STAGE), markdown, description=f"Decision: {verdicts}")
    return record
