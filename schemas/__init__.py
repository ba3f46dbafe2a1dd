"""Schemas, the ground floor: every exception type (`schemas.errors`), the names a spec may use
(`schemas.names`), the kernel spec (`schemas.kernel`), the run layout (`schemas.layout`), artifact
tables (pyarrow, `schemas.artifacts`), gate wording and atomic artifact IO (`schemas.io`). It
imports nothing of gs1's above it; the experiment spec, its arms and its plan are `design/`.
"""
