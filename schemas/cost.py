"""What an arm costs: per training step (`StepCost`, logged by the loop beside the step's
metrics) and per unit (`ArmCost`: one arm at one seed, the sum over its steps).

    sampler_tokens  prompt tokens prefilled + tokens generated, over every sample request
    trainer_tokens  tokens of the datums sent to forward_backward
    model_calls     requests to the service: sampler refresh, sample, forward_backward, optim_step
    critic_*        a critic arm's share of the above (its value model's forward and training);
                    None for an arm without a critic

Both are Parquet artifacts (`step_costs`, `arm_costs` in schemas.artifacts); the report divides
each arm's by the baseline's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pydantic import BaseModel, ConfigDict

COUNTS = ("wall_seconds", "sample_seconds", "train_seconds", "sampler_tokens", "trainer_tokens", "model_calls")
CRITIC_COUNTS = ("critic_seconds", "critic_tokens", "critic_calls")


class _Cost(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    arm: str
    seed: int  # the arm's init and sampling seed
    wall_seconds: float  # the step(s) end to end
    sample_seconds: float
    train_seconds: float
    sampler_tokens: int
    trainer_tokens: int
    model_calls: int
    critic_seconds: float | None = None
    critic_tokens: int | None = None
    critic_calls: int | None = None


class StepCost(_Cost):
    """One training step's cost."""

    step: int


class ArmCost(_Cost):
    """One unit's (arm x seed) training cost: its steps' costs summed."""

    unit: str  # its folder (schemas.layout.unit_name)
    steps: int
    # the physical device that trained it (`engine.settings.device_identity`): units shared a GPU only
    # where theirs is the same; None where not known (a hosted service, a unit from before it was kept)
    device: str | None = None

    @classmethod
    def from_steps(cls, unit: str, steps: Iterable[Mapping], device: str | None = None) -> ArmCost:
        rows = list(steps)
        if not rows:
            raise ValueError(f"{unit}: no step costs to sum")
        sums = {c: sum(r[c] for r in rows) for c in COUNTS}
        for c in CRITIC_COUNTS:
            values = [r[c] for r in rows if r.get(c) is not None]
            sums[c] = sum(values) if values else None
        return cls(arm=rows[0]["arm"], seed=rows[0]["seed"], unit=unit, steps=len(rows), device=device, **sums)

    @classmethod
    def summed(cls, name: str, costs: Iterable[ArmCost]) -> ArmCost:
        """Several units' costs as one (an arm over its seeds), named `name`."""
        costs = list(costs)
        if not costs:
            raise ValueError(f"{name}: no costs to sum")
        rows = [c.model_dump() for c in costs]
        sums = {c: sum(r[c] for r in rows) for c in COUNTS}
        for c in CRITIC_COUNTS:
            values = [r[c] for r in rows if r[c] is not None]
            sums[c] = sum(values) if values else None
        devices = {c.device for c in costs}
        return cls(arm=costs[0].arm, seed=costs[0].seed, unit=name, steps=sum(r["steps"] for r in rows),
                   device=devices.pop() if len(devices) == 1 else None, **sums)

    def relative_to(self, baseline: ArmCost) -> dict[str, float | None]:
        """Each count divided by the baseline's (None where the baseline's is 0 or absent)."""
        out = {}
        for c in (*COUNTS, *CRITIC_COUNTS):
            mine, theirs = getattr(self, c), getattr(baseline, c)
            out[c] = None if mine is None or not theirs else mine / theirs
        return out
