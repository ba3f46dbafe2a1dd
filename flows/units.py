"""Units (arm x seed) as a flow of their own: what a sweep dispatches to a work pool.

When a sweep outgrows one machine, the experiment flow (`dispatch=<deployment>`) hands its units
to a deployment of `arm_unit` with Prefect's own `run_deployment`, a group of units a flow run
(`design.plan.unit_groups`: one unit each by default; `dispatch_groups=N`, whole seeds dealt over N
flow runs, one a worker and its GPU, each training its units side by side on one base as a run in
one process does); workers of the deployment's pool, on many machines or one per GPU
(`CUDA_VISIBLE_DEVICES`), pick them up, and the experiment's decision waits for every one. A
group trains and evaluates its units and leaves what they made in the run directory
(`train/<unit>/final.json`, `eval/<unit>/eval.jsonl`), which workers and the experiment must
therefore share (one filesystem, or a mount of it at the same path).
"""

from __future__ import annotations

import time

from prefect import flow, get_run_logger
from prefect.client.orchestration import get_client
from prefect.deployments import run_deployment
from prefect.futures import wait

from design.arm import ArmConfig
from design.plan import EvalResult, RunContext, TrainedArm, unit_groups
from rl.backends import DEFAULT_BACKEND
from schemas.errors import UserError
from schemas.layout import RunLayout
from tasks.arms import eval_items, trained_arm, unit_results

UNIT_FLOW = "gs1-arm-unit"


@flow(name=UNIT_FLOW)
def arm_unit(arms: list[ArmConfig], run: RunContext, n_eval: int, run_dir: str, backend: str = DEFAULT_BACKEND,
             data_dir: str | None = None) -> dict:
    """Train a group of units side by side in this process, then evaluate each one's final
    weights; their stages cache in the run's store. `run_dir` stays a path: the parameter a
    sweep's `run_deployment` sends as JSON."""
    layout = RunLayout(run_dir)
    stages = _unit_stages.with_options(result_storage=layout.resolved().stage_results)
    return stages(arms, run, n_eval, layout, backend, data_dir)


@flow(name="gs1-arm-unit-stages")
def _unit_stages(arms: list[ArmConfig], run: RunContext, n_eval: int, layout: RunLayout, backend: str,
                 data_dir: str | None) -> dict:
    # as the experiment's own full runs: every unit's training at once (one base: their samples
    # batch together), each finished and cached before a failed one ends the flow run
    training = {a.unit: trained_arm.submit(a, run, layout, backend, data_dir) for a in arms}
    wait(list(training.values()))
    trained = {unit: future.result() for unit, future in training.items()}
    evaluating = {a.unit: eval_items.submit(trained[a.unit], a, run, n_eval, layout, backend, data_dir) for a in arms}
    wait(list(evaluating.values()))
    return {unit: {"trained": trained[unit].model_dump(), "eval": future.result().model_dump()}
            for unit, future in evaluating.items()}


def dispatched_units(deployment: str, units: tuple[ArmConfig, ...], run: RunContext, n_eval: int, layout: RunLayout,
                     backend: str, data_dir: str | None, groups: int | None = None, poll_seconds: float = 2.0,
                     timeout_seconds: float | None = None) -> tuple[dict[str, TrainedArm], dict[str, EvalResult]]:
    """Start one flow run of `deployment` per group of units (`unit_groups`), wait for all, and
    read what each unit left.

    A group whose flow run did not complete is the error, its units named (after every flow run has
    ended, so none is left running unseen)."""
    logger = get_run_logger()
    runs = {}
    for group in unit_groups(units, groups):
        name = ",".join(u.unit for u in group)
        flow_run = run_deployment(
            name=deployment, timeout=0, as_subflow=True, flow_run_name=f"{name} ({layout.root.name})",
            parameters={"arms": [u.model_dump(mode="json") for u in group], "run": run.model_dump(mode="json"),
                        "n_eval": n_eval, "run_dir": str(layout.root.resolve()), "backend": backend,
                        "data_dir": data_dir},
        )
        runs[name] = (flow_run.id, "unit" if len(group) == 1 else "units")
        logger.info(f"dispatched {name} to {deployment}: flow run {flow_run.id}")
    started, ended = time.time(), {}
    with get_client(sync_client=True) as client:
        while len(ended) < len(runs):
            for unit, (run_id, _) in runs.items():
                if unit not in ended:
                    state = client.read_flow_run(run_id).state
                    if state is not None and state.is_final():
                        ended[unit] = state
                        logger.info(f"{unit}: {state.name}")
            if len(ended) < len(runs):
                if timeout_seconds is not None and time.time() - started > timeout_seconds:
                    waiting = ", ".join(u for u in runs if u not in ended)
                    raise UserError(f"dispatched units still not finished after {timeout_seconds:.0f} s: {waiting}")
                time.sleep(poll_seconds)
    failed = {u: s for u, s in ended.items() if not s.is_completed()}
    if failed:
        raise RuntimeError("; ".join(f"{runs[u][1]} {u} ended {s.name}: {s.message or 'no message'}"
                                     for u, s in failed.items()))
    results = {unit.unit: unit_results(unit, layout) for unit in units}
    return {u: r[0] for u, r in results.items()}, {u: r[1] for u, r in results.items()}
