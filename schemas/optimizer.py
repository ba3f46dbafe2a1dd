"""Adam's settings every training client steps with: the one owner of the optimiser defaults.

Both backends run Adam(W) from a `tinker.types.AdamParams` (DESIGN.md, "Backends"); the run's
betas and eps are the cookbook's, `AdamParams(lr, beta1=0.9, beta2=0.95, eps=1e-8)`, and the
learning rate is the arm's. An arm (`design.arm.ArmConfig`) defaults to these; the preflight
probe and the engine benchmark step with them too. (The SDK's own eps default is 1e-12: never
rely on it.)
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class AdamDefaults(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8


ADAM = AdamDefaults()
