"""A units folder's standing, as `gs1 decide --units` reads it (`decision.units.units_standing`) and
its table and plots show it (`decision.units.standing_markdown`, `report.plots.UNITS_PLOT_SPECS`):
per arm, what its units in the folder say so far; per unit, how it shared the GPU; the treatment
against each other arm. Plain frozen dataclasses, so the plots (this layer) read what the task
layer computed without importing it."""

from __future__ import annotations

from dataclasses import dataclass

from schemas.cost import ArmCost


@dataclass(frozen=True)
class ArmStanding:
    """One arm of the table: what its units in the folder say so far."""

    arm: str
    role: str  # "baseline", "treatment" or ""
    seeds: tuple[int, ...]  # seeds with this arm's unit in the folder
    common_seeds: tuple[int, ...]  # ... that the baseline has too (what the pairing and costs use)
    accuracy: float | None  # mean over its seeds in the folder
    seed_accuracy: dict[int, float]  # seed -> that unit's accuracy
    rewards: dict[int, tuple[float, ...]]  # seed -> that unit's mean training reward at each step
    pair: dict | None  # the paired record against the baseline (final: Holm's verdict; else interim)
    cost: ArmCost | None  # training over the common seeds
    relative_cost: dict  # cost / the baseline's over the same seeds
    # a trust-gated kind (flash_reinforce): seed -> the gate's admit rate at each step; else empty
    admit_rates: dict[int, tuple[float, ...]]
    # the common seeds at which the arm's unit trained side by side with the baseline's (they shared
    # the GPU alike, so their wall times compare; every common seed for the baseline itself), and
    # the arm's wall time over the baseline's at those seeds (None when there is none)
    wall_seeds: tuple[int, ...]
    wall_ratio: float | None


@dataclass(frozen=True)
class UnitSharing:
    """How one unit's training shared the GPU: the other units in the folder whose training
    overlapped it in wall-clock time on the same device, and its steps' median seconds (a median, so the few steps
    that compiled barely move it)."""

    unit: str
    beside: tuple[str, ...]
    median_step_seconds: float
    device: str | None = None  # where it trained (`schemas.cost.ArmCost.device`); None: not known


@dataclass(frozen=True)
class VersusArm:
    """The treatment against one other arm that is not the baseline: secondary and descriptive (the
    pre-registered family compares every arm with the baseline only), so unadjusted and no verdict."""

    arm: str
    common_seeds: tuple[int, ...]  # seeds both the treatment's and this arm's units are in
    pair: dict  # the paired record, treatment minus this arm, over those seeds
    relative_cost: dict  # the treatment's cost / this arm's over those seeds
    wall_seeds: tuple[int, ...]  # those seeds at which their units trained side by side
    wall_ratio: float | None  # the treatment's wall time over this arm's at wall_seeds (None: none)


@dataclass(frozen=True)
class UnitsStanding:
    present: tuple[str, ...]
    missing: tuple[str, ...]
    arms: tuple[ArmStanding, ...]
    decision: dict | None  # the family decision record, once every unit is in
    sharing: tuple[UnitSharing, ...]  # the present units with step metrics, in plan order
    versus: tuple[VersusArm, ...]  # the treatment against each other arm, where both have units in

    @property
    def complete(self) -> bool:
        return not self.missing


def seeds_text(seeds: tuple[int, ...]) -> str:
    """Seeds as the table and the plots name them: "seed 0", "seeds 0, 1"."""
    return f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"
