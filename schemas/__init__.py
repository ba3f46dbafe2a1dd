"""Schemas, the bottom layer: every exception type (`schemas.errors`), the names a spec may use
(`schemas.names`), the experiment spec (pydantic, `schemas.spec`), artifact tables (pyarrow,
`schemas.artifacts`) and atomic artifact IO (`schemas.io`).

The common names are re-exported lazily, so `import schemas.io` stays light.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "ExperimentSpec": "schemas.spec",
    "KernelSpec": "schemas.kernel",
    "SpecError": "schemas.spec",
    "load_spec": "schemas.spec",
    "parse_spec": "schemas.spec",
    "spec_hash": "schemas.spec",
    "slug": "schemas.spec",
    "treatment_arm": "schemas.spec",
    "baseline_arm": "schemas.spec",
    "resolve_renderer_name": "schemas.spec",
    "resolve_base_model_path": "schemas.spec",
    "schema_for": "schemas.artifacts",
    "write_artifact": "schemas.artifacts",
    "read_artifact": "schemas.artifacts",
    "UserError": "schemas.errors",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'schemas' has no attribute {name!r}")
