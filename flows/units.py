"""One arm at one seed as a flow of its own: what a sweep dispatches to a work pool.

When a sweep outgrows one machine, the experiment flow (`dispatch=<deployment>`) hands each unit
(arm x seed) to a deployment of `arm_unit` with Prefect's own `run_deployment`; workers of the
deployment's pool, on many machines or one per GPU, pick the units up, and the experiment's
decision waits for every one. A unit trains and evaluates its arm and leaves what it made in the
run directory (`train/<unit>/final.json`, `eval/<unit>/eval.jsonl`), which workers and the
experiment must therefore share (one filesystem, or a mount of it at the same path).
"""

from __future__ import annotations

import time

from prefect import flow, get_run_logger
from prefect.client.orchestration import get_client
from prefect.deployments import run_deployment

from design.arm import ArmConfig
from design.plan import EvalResult, RunContext, TrainedArm
from rl.backends import DEFAULT_BACKEND
from schemas.errors import UserError
from schemas.layout import RunLayout
from tasks.arms import eval_items, trained_arm, unit_results

UNIT_FLOW = "gs1-arm-unit"


@flow(name=UNIT_FLOW)
def arm_unit(arm: ArmConfig, run: RunContext, n_eval: int, run_dir: str, backend: str = DEFAULT_BACKEND,
             data_dir: str | None = None) -> dict:
    """Train one unit and evaluate its final weights; its stages cache in the run's store.
    `run_dir` stays a path: the parameter a sweep's `run_deployment` sends as JSON."""
    layout = RunLayout(run_dir)
    stages = _unit_stages.with_options(result_storage=layout.resolved().stage_results)
    return stages(arm, run, n_eval, layout, backend, data_dir)


@flow(name="gs1-arm-unit-stages")
def _unit_stages(arm: ArmConfig, run: RunContext, n_eval: int, layout: RunLayout, backend: str,
                 data_dir: str | None) -> dict:
    trained = trained_arm(arm, run, layout, backend, data_dir)
    evaluated = eval_items(trained, arm, run, n_eval, layout, backend, data_dir)
    return {"trained": trained.model_dump(), "eval": evaluated.model_dump()}


def dispatched_units(deployment: str, units: tuple[ArmConfig, ...], run: RunContext, n_eval: int, layout: RunLayout,
                     backend: str, data_dir: str | None, poll_seconds: float = 2.0,
                     timeout_seconds: float | None = None) -> tuple[dict[str, TrainedArm], dict[str, EvalResult]]:
    """Start one flow run of `deployment` per unit, wait for all, and read what each left.

    A unit whose flow run did not complete is the error, named (after every unit has ended, so
    none is left running unseen)."""
    logger = get_run_logger()
    runs = {}
    for unit in units:
        flow_run = run_deployment(
            name=deployment, timeout=0, as_subflow=True, flow_run_name=f"{unit.unit} ({layout.root.name})",
            parameters={"arm": unit.model_dump(mode="json"), "run": run.model_dump(mode="json"), "n_eval": n_eval,
                        "run_dir": str(layout.root.resolve()), "backend": backend, "data_dir": data_dir},
        )
        runs[unit.unit] = flow_run.id
        logger.info(f"dispatched {unit.unit} to {deployment}: flow run {flow_run.id}")
    started, ended = time.time(), {}
    with get_client(sync_client=True) as client:
        while len(ended) < len(runs):
            for unit, run_id in runs.items():
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
        raise RuntimeError("; ".join(f"unit {u} ended {s.name}: {s.message or 'no message'}" for u, s in failed.items()))
    results = {unit.unit: unit_results(unit, layout) for unit in units}
    return {u: r[0] for u, r in results.items()}, {u: r[1] for u, r in results.items()}
