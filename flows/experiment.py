"""The experiment flow: only wiring. Stages and what they write are in `tasks/`.

validate spec -> correctness preflight -> offline unit checks -> pilot -> pilot audit ->
activation gate -> [bandwidth calibration: pilot -> audit -> gate] -> feasibility -> full runs
(every arm at every seed: a *unit*, in parallel) -> train audit -> eval -> decision -> report

The pilot and its gates are about the treatment (the kernel arm) and the baseline at seed 0. With
`dispatch` naming a deployment of `flows.units.arm_unit`, each unit trains and evaluates as its own
flow run on that deployment's work pool, and the audit and the decision wait for all of them.
"""

from __future__ import annotations

from pathlib import Path

from prefect import Flow, flow, get_run_logger
from prefect.futures import wait
from prefect.states import Failed

from flows.memory import bound_malloc
from flows.units import dispatched_units
from pipeline.services import engine_usage, log_engine_usage
from rl.backends import DEFAULT_BACKEND
from schemas.errors import CalibrationStopped, GateFailed
from schemas.kernel import CALIBRATION
from schemas.layout import RunLayout
from schemas.names import env_data_dir
from tasks.arms import eval_items, pilot_rollouts, trained_arm
from tasks.gates import (activation_gate, audit_gate, family_decision_record, feasibility, offline_unit_checks,
                         paired_decision_record)
from tasks.preflight import correctness_preflight
from tasks.run_report import run_report
from tasks.spec import calibrated_plan, flow_run_name, validated_plan


def _run_name() -> str:
    from prefect.runtime import flow_run

    return flow_run_name(flow_run.parameters["spec_path"], flow_run.parameters.get("backend", DEFAULT_BACKEND))


@flow(name="gs1-experiment", flow_run_name=_run_name)
def experiment(spec_path: str, run_dir: str, backend: str = DEFAULT_BACKEND, data_dir: str | None = None,
               dispatch: str | None = None, units: list[str] | None = None,
               dispatch_groups: int | None = None) -> dict:
    """Run a pre-registered GS1-vs-baseline experiment end to end; returns the decision record.

    `dispatch_groups`: the dispatched units as that many flow runs, whole seeds each
    (`design.plan.unit_groups`: one a worker and its GPU); by default one flow run a unit.

    `units` (arm x seed names, `grpo_gs8-s0`): train and evaluate only these after the gates, and
    return {"units_done", "waiting_for"} instead of a decision; `gs1 decide --units` decides once
    every unit, from this run and others, is in.

    A failed gate ends the flow run Failed with the gate's message (metric, value, bound first),
    returned as a state: an expected stop, so no traceback is logged. Anything else is raised.

    `run_dir` stays a path here (what the CLI and the UI's form pass); every stage is handed its
    `RunLayout`."""
    bound_malloc()
    layout = RunLayout(run_dir)
    layout.claim()  # a run started from the UI takes only a gs1 run directory too (`gs1 run` took it already)
    try:
        decision = _stages(spec_path, layout, backend, data_dir, dispatch, units, dispatch_groups)
    except GateFailed as failed:
        # The report renders whatever ran, so a run stopped at a gate still gets its page.
        run_report(layout, str(failed), return_state=True)
        return Failed(message=str(failed), data=failed)
    except BaseException as exc:
        run_report(layout, str(exc) or type(exc).__name__, return_state=True)  # never masks the exception
        raise
    run_report(layout, None, return_state=True)
    return decision


def _stages(spec_path: str, layout: RunLayout, backend: str, data_dir: str | None, dispatch: str | None,
            only: list[str] | None, dispatch_groups: int | None) -> dict:
    plan = validated_plan(spec_path, layout)
    run = plan.run
    data_dir = env_data_dir(run.env, data_dir)  # none for an env that generates its problems: nor in its stages' keys
    piloted = (plan.treatment, plan.baseline)  # the arms a pilot runs, in its logs' order
    correctness_preflight(plan.arms, run, plan.preflight, layout, backend, data_dir)
    offline_unit_checks(layout)

    pilot = pilot_rollouts(plan.arms, plan.pilot, run, layout, backend, data_dir)
    audit_gate(piloted, [pilot.treatment, pilot.baseline], layout, stage="pilot")
    try:
        activation_gate(plan.checks, pilot.treatment, pilot.baseline, pilot.heldout, plan.pilot.steps, layout,
                        treatment_estimator=plan.treatment.advantage)
    except GateFailed as failed:
        if not failed.fails(CALIBRATION.metric):
            raise
        # Calibration: re-pilot with the other pre-registered bandwidth (the failed pilot's logs
        # stay in pilot/), audit and gate it, and record the revised spec before anything else runs.
        bandwidth = CALIBRATION.other_bandwidth(plan.treatment.kernel)
        calibration = plan.calibrated(bandwidth)  # the one calibrated plan: its pilot, audit, revision and runs
        get_run_logger().warning(
            f"{failed}; the spec pre-registers one calibration for {CALIBRATION.metric}: re-piloting at "
            f"bandwidth {bandwidth} (at most {plan.pilot.steps} steps, "
            f"{plan.pilot.calibration_wall_minutes:g} minutes); the run continues only if that gate passes")
        try:
            pilot = pilot_rollouts(calibration.arms, plan.pilot, run, layout, backend, data_dir,
                                   stage="calibration", wall_limit_s=plan.pilot.calibration_wall_minutes * 60)
            audit_gate((calibration.treatment, calibration.baseline), [pilot.treatment, pilot.baseline], layout,
                       stage="calibration")
            activation_gate(plan.checks, pilot.treatment, pilot.baseline, pilot.heldout, plan.pilot.steps, layout,
                            stage="calibration",
                            treatment_estimator=plan.treatment.advantage)
        except GateFailed as stopped:
            # the run's message leads with what the user's spec judged, then what its calibration did
            raise CalibrationStopped(failed, stopped, CALIBRATION.metric, bandwidth) from None
        plan = calibrated_plan(calibration, spec_path, layout)

    every_unit = plan.units()
    units = plan.selected_units(only)
    many = {"units": {u.unit: u.name for u in every_unit}} if len(every_unit) > 2 else {}  # two arms: projected as always
    feasibility(pilot.timings, plan.steps, plan.n_eval, plan.budget, backend, layout, decision=plan.decision,
                seeds=len(plan.seeds), **many)

    if dispatch:
        trained, evals = dispatched_units(dispatch, units, run, plan.n_eval, layout, backend, data_dir,
                                          groups=dispatch_groups)
        audit_gate(units, [trained[u.unit].rollouts for u in units], layout, stage="train")
    else:
        usage = engine_usage(backend)
        trained = {u.unit: trained_arm.submit(u, run, layout, backend, data_dir) for u in units}
        # Every unit finishes (and is cached) before a failed one ends the run: a resume retrains
        # only the failed unit. The audit reads them all.
        wait(list(trained.values()))
        log_engine_usage(backend, usage, "train")
        trained = {name: future.result() for name, future in trained.items()}
        audit_gate(units, [trained[u.unit].rollouts for u in units], layout, stage="train")
        usage = engine_usage(backend)
        evals = {u.unit: eval_items.submit(trained[u.unit], u, run, plan.n_eval, layout, backend, data_dir)
                 for u in units}
        wait(list(evals.values()))
        log_engine_usage(backend, usage, "eval")
        evals = {name: future.result() for name, future in evals.items()}
    if len(units) < len(every_unit):  # a share of the sweep: the decision waits for the others
        waiting = [u.unit for u in every_unit if u.unit not in evals]
        get_run_logger().info(f"units done: {', '.join(evals)}; the decision waits for: {', '.join(waiting)}")
        return {"units_done": list(evals), "waiting_for": waiting}
    names = {"treatment": run.treatment, "baseline": run.baseline}
    if len(plan.compared) == 1 and not plan.multi_seed:  # two arms, one seed: the pinned paired rule as it was
        return paired_decision_record(evals[run.treatment].jsonl, evals[run.baseline].jsonl, plan.decision,
                                      names, layout)
    return family_decision_record([evals[u.unit].jsonl for u in units], [(u.name, u.order_seed) for u in units],
                                  plan.decision, names, layout)


def experiment_in(run_dir: str | Path | RunLayout) -> Flow:
    """The experiment flow with every stage's persisted result under `<run_dir>/.stage-results/`:
    deleting a run directory deletes its cache, and no run reads another's stored results."""
    return experiment.with_options(result_storage=RunLayout.of(run_dir).resolved().stage_results)
