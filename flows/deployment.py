"""The flow the UI starts: a spec file (plus optional overrides) -> the experiment flow.

The run form is built from this signature: `overrides` is the pydantic `SpecOverrides`, so the
UI shows its fields with their descriptions and bounds, and validates each on its own; `backend` is
a drop-down.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from prefect import flow
from prefect.states import Failed

from design.spec import SpecOverrides, overrides_from
from flows.experiment import experiment_in
from flows.memory import bound_malloc
from rl.backends import BACKENDS, DEFAULT_BACKEND
from schemas.errors import UserError
from tasks.spec import checked_request, flow_run_name, spec_with_overrides


def _run_name() -> str:
    from prefect.runtime import flow_run

    p = flow_run.parameters
    try:
        overrides = overrides_from(p.get("overrides")).model_dump(exclude_none=True)
    except UserError:
        return f"{Path(str(p.get('spec_path', 'spec'))).stem}-invalid-overrides-{p.get('backend', DEFAULT_BACKEND)}"
    return flow_run_name(p.get("spec_path", "specs/demo_local.json"), p.get("backend", DEFAULT_BACKEND), overrides or None)


# The form validates each parameter against the signature's schema (field by field: the overrides'
# fields have no `null` branch). A run started without that validation is checked here, by the
# flow, so bad input ends it Failed on one line (no Prefect traceback) with a name from the spec.
@flow(name="gs1-run", flow_run_name=_run_name, validate_parameters=False)
def gs1_run(
    spec_path: str = "specs/demo_local.json",
    backend: Literal[tuple(BACKENDS)] = DEFAULT_BACKEND,  # the form offers the backends by name
    overrides: SpecOverrides = SpecOverrides(),
    run_dir: str | None = None,
    data_dir: str | None = None,
    dispatch: str | None = None,
    units: list[str] | None = None,
    dispatch_groups: int | None = None,
) -> dict:
    """Run a pre-registered spec (a path on the serving machine) end to end.

    The experiment runs as a subflow (its stage results stored in its run directory); its
    decision, report and failed gate's table are published on this run too, and it ends as the
    experiment did, with its message (a gate stop without a traceback here either). `dispatch` names
    a deployment of gs1-arm-unit whose workers run the arm x seed units (`dispatch_groups` flow runs of
    whole seeds, one a worker and its GPU; by default one a unit); `units` runs only the named
    ones (`grpo_gs8-s0`), with no decision (`gs1 decide --units` gathers them).

    Bad input (the overrides, the spec, a model path that does not exist) ends the run Failed with
    one line before anything is written: no run directory, no revised spec."""
    bound_malloc()  # this flow run's own process when `gs1 serve` started it
    try:
        request = checked_request(spec_path, backend, overrides)
    except UserError as bad:  # Prefect's "Finished in state Failed('...')" is its one line
        return Failed(message=str(bad), data=bad)
    spec = spec_with_overrides(request.spec_path, request.overrides.model_dump(exclude_none=True))
    run_dir = run_dir or spec["run_dir"]
    state = experiment_in(run_dir)(spec_path=spec["spec_path"], run_dir=run_dir, backend=request.backend,
                                   data_dir=data_dir, dispatch=dispatch, units=units,
                                   dispatch_groups=dispatch_groups, return_state=True)
    if state.is_completed():
        return state.result()
    return Failed(message=state.message, data=state.result(raise_on_failure=False))
