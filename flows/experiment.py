"""The experiment flow: only wiring. Stages and what they write are in `tasks/`.

validate spec -> correctness preflight -> offline unit checks -> pilot -> pilot audit ->
activation gate -> [bandwidth calibration: pilot -> audit -> gate] -> feasibility -> full runs
(arms in parallel) -> train audit -> eval -> decision -> report
"""

from __future__ import annotations

from pathlib import Path

from prefect import Flow, flow, get_run_logger
from prefect.futures import wait
from prefect.states import Failed

from flows.memory import bound_malloc
from schemas.layout import RunLayout
from tasks.arms import eval_items, pilot_rollouts, trained_arm
from tasks.common import GateFailed
from tasks.gates import activation_gate, audit_gate, feasibility, offline_unit_checks, paired_decision_record
from tasks.preflight import correctness_preflight
from tasks.report import run_report
from tasks.spec import calibrated_plan, flow_run_name, validated_plan

# The spec's single pre-registered calibration: the other bandwidth of {0.5, 1.0}.
CALIBRATION_BANDWIDTHS = (0.5, 1.0)
CALIBRATED_METRIC = "kernel_effective_neighbors_p10"
CALIBRATION_WALL_LIMIT_S = 600  # the spec's cap: at most 2 pilot steps and 10 wall minutes


def _run_name() -> str:
    from prefect.runtime import flow_run

    return flow_run_name(flow_run.parameters["spec_path"], flow_run.parameters.get("backend", "local"))


@flow(name="gs1-experiment", flow_run_name=_run_name)
def experiment(spec_path: str, run_dir: str, backend: str = "local", data_dir: str | None = None) -> dict:
    """Run a pre-registered GS1-vs-baseline experiment end to end; returns the decision record.

    A failed gate ends the flow run Failed with the gate's message (metric, value, bound first),
    returned as a state: an expected stop, so no traceback is logged. Anything else is raised."""
    bound_malloc()
    try:
        decision = _stages(spec_path, run_dir, backend, data_dir)
    except GateFailed as failed:
        # The report renders whatever ran, so a run stopped at a gate still gets its page.
        run_report(run_dir, str(failed), return_state=True)
        return Failed(message=str(failed), data=failed)
    except BaseException as exc:
        run_report(run_dir, str(exc) or type(exc).__name__, return_state=True)  # never masks the exception
        raise
    run_report(run_dir, None, return_state=True)
    return decision


def _stages(spec_path: str, run_dir: str, backend: str, data_dir: str | None) -> dict:
    plan = validated_plan(spec_path, run_dir)
    run = plan.run
    piloted = (plan.treatment, plan.baseline)  # the arms a pilot runs, in its logs' order
    correctness_preflight(plan.arms, run, plan.preflight, run_dir, backend, data_dir)
    offline_unit_checks(run_dir)

    pilot = pilot_rollouts(plan.arms, plan.pilot, run, run_dir, backend, data_dir)
    audit_gate(piloted, [pilot.treatment, pilot.baseline], run_dir, stage="pilot")
    try:
        activation_gate(plan.checks, pilot.treatment, pilot.baseline, pilot.heldout, plan.pilot.steps, run_dir,
                        treatment_estimator=plan.treatment.estimator)
    except GateFailed as failed:
        if CALIBRATED_METRIC not in {r["metric"] for r in failed.failing}:
            raise
        # Calibration: re-pilot with the other pre-registered bandwidth (the failed pilot's logs
        # stay in pilot/), audit and gate it, and record the revised spec before anything else runs.
        bandwidth = next(h for h in CALIBRATION_BANDWIDTHS if h != plan.treatment.kernel.bandwidth)
        get_run_logger().warning(
            f"{failed}; the spec pre-registers one calibration for {CALIBRATED_METRIC}: re-piloting at "
            f"bandwidth {bandwidth} (at most {plan.pilot.steps} steps, "
            f"{CALIBRATION_WALL_LIMIT_S // 60} minutes); the run continues only if that gate passes")
        pilot = pilot_rollouts(plan.arms, plan.pilot, run, run_dir, backend, data_dir,
                               stage="calibration", bandwidth=bandwidth, wall_limit_s=CALIBRATION_WALL_LIMIT_S)
        calibrated = (plan.treatment.with_kernel_bandwidth(bandwidth), plan.baseline)
        audit_gate(calibrated, [pilot.treatment, pilot.baseline], run_dir, stage="calibration")
        activation_gate(plan.checks, pilot.treatment, pilot.baseline, pilot.heldout, plan.pilot.steps, run_dir,
                        stage="calibration",
                        treatment_estimator=plan.treatment.estimator)
        plan = calibrated_plan(plan, spec_path, bandwidth, run_dir)

    feasibility(pilot.timings, plan.steps, plan.n_eval, plan.budget, backend, str(RunLayout(run_dir).feasibility_dir))

    trained = {arm.name: trained_arm.submit(arm, run, run_dir, backend, data_dir) for arm in plan.arms}
    # Every arm finishes (and is cached) before a failed one ends the run: a resume retrains
    # only the failed arm. The audit reads them all.
    wait(list(trained.values()))
    trained = {name: future.result() for name, future in trained.items()}
    audit_gate(plan.arms, [trained[arm.name].rollouts for arm in plan.arms], run_dir, stage="train")
    evals = {
        arm.name: eval_items.submit(trained[arm.name], arm, run, plan.n_eval, run_dir, backend, data_dir)
        for arm in plan.arms
    }
    wait(list(evals.values()))
    evals = {name: future.result() for name, future in evals.items()}
    return paired_decision_record(
        evals[run.treatment].jsonl, evals[run.baseline].jsonl, plan.decision,
        {"treatment": run.treatment, "baseline": run.baseline}, str(RunLayout(run_dir).decision_dir),
    )


def experiment_in(run_dir: str | Path) -> Flow:
    """The experiment flow with every stage's persisted result under `<run_dir>/.stage-results/`:
    deleting a run directory deletes its cache, and no run reads another's stored results."""
    return experiment.with_options(result_storage=RunLayout(Path(run_dir).resolve()).stage_results)
