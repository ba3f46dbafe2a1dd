"""The flow the UI starts: a spec file (plus optional overrides) -> the experiment flow.

The run form is built from this signature: `overrides` is the pydantic `SpecOverrides`, so the
UI shows its fields with their descriptions and bounds; `backend` is a drop-down.
"""

from __future__ import annotations

from typing import Literal

from prefect import flow
from prefect.states import Failed

from flows.experiment import experiment_in
from flows.memory import bound_malloc
from schemas.spec import SpecOverrides
from tasks.spec import flow_run_name, spec_with_overrides


def _run_name() -> str:
    from prefect.runtime import flow_run

    p = flow_run.parameters
    overrides = p.get("overrides")
    if isinstance(overrides, SpecOverrides):
        overrides = overrides.model_dump(exclude_none=True)
    return flow_run_name(p.get("spec_path", "specs/demo_local.json"), p.get("backend", "local"), overrides or None)


@flow(name="gs1-run", flow_run_name=_run_name)
def gs1_run(
    spec_path: str = "specs/demo_local.json",
    backend: Literal["local", "tinker"] = "local",
    overrides: SpecOverrides | None = None,
    run_dir: str | None = None,
    data_dir: str | None = None,
    dispatch: str | None = None,
    units: list[str] | None = None,
) -> dict:
    """Run a pre-registered spec (a path on the serving machine) end to end.

    The experiment runs as a subflow (its stage results stored in its run directory); its
    decision, report and failed gate's table are published on this run too, and it ends as the
    experiment did, with its message (a gate stop without a traceback here either). `dispatch` names
    a deployment of gs1-arm-unit whose workers run the arm x seed units; `units` runs only the named
    ones (`grpo_gs8-s0`), with no decision (`gs1 decide --units` gathers them)."""
    bound_malloc()  # this flow run's own process when `gs1 serve` started it
    spec = spec_with_overrides(spec_path, overrides.model_dump(exclude_none=True) if overrides else {})
    run_dir = run_dir or spec["run_dir"]
    state = experiment_in(run_dir)(spec_path=spec["spec_path"], run_dir=run_dir, backend=backend, data_dir=data_dir,
                                   dispatch=dispatch, units=units, return_state=True)
    if state.is_completed():
        return state.result()
    return Failed(message=state.message, data=state.result(raise_on_failure=False))
