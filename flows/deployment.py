"""The flow the UI starts: a spec file (plus optional overrides) -> the experiment flow.

The run form is built from this signature: `overrides` is the pydantic `SpecOverrides`, so the
UI shows its fields with their descriptions and bounds; `backend` is a drop-down.
"""

from __future__ import annotations

from typing import Literal

from prefect import flow

from flows.experiment import experiment_in
from schemas.spec import SpecOverrides
from tasks.spec import spec_with_overrides


@flow(name="gs1-run")
def gs1_run(
    spec_path: str = "specs/demo_local.json",
    backend: Literal["local", "tinker"] = "local",
    overrides: SpecOverrides | None = None,
    run_dir: str | None = None,
    data_dir: str | None = None,
    dispatch: str | None = None,
) -> dict:
    """Run a pre-registered spec (a path on the serving machine) end to end; `dispatch` names a
    deployment of gs1-arm-unit whose workers run the arm x seed units."""
    spec = spec_with_overrides(spec_path, overrides.model_dump(exclude_none=True) if overrides else {})
    run_dir = run_dir or spec["run_dir"]
    return experiment_in(run_dir)(spec_path=spec["spec_path"], run_dir=run_dir, backend=backend, data_dir=data_dir,
                                  dispatch=dispatch)
