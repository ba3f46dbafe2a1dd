"""A training arm as the run executes it: the estimator names a spec may use, and `ArmConfig`.

`ArmConfig` is built once from the spec (`tasks.spec.plan_from_spec`), carried in the run plan,
handed to every stage that runs the arm (preflight, pilot, training, audit) and to the RL loop.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, model_validator

from schemas.kernel import KernelSpec
from schemas.layout import unit_name

# Spec `advantage` name -> estimator id (rl.estimators implements each id).
ADVANTAGE_ESTIMATORS = {
    "group_mean": "grpo",
    "kernel_cross_prompt_baseline": "gs1_kernel",
    "batch_mean": "batch_mean",
    "leave_one_out": "rloo",
}


def estimator_id(advantage_name: str) -> str:
    """Spec advantage name (or an estimator id itself) -> estimator id; unknown -> ValueError."""
    if advantage_name in ADVANTAGE_ESTIMATORS:
        return ADVANTAGE_ESTIMATORS[advantage_name]
    if advantage_name in ADVANTAGE_ESTIMATORS.values():
        return advantage_name
    known = ", ".join(sorted(ADVANTAGE_ESTIMATORS))
    raise ValueError(f"unknown advantage estimator {advantage_name!r}; known: {known}")


class ArmConfig(BaseModel):
    """Everything that defines one training arm. A kernel arm holds its `KernelSpec`; others None."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    advantage: str  # a spec advantage name (ADVANTAGE_ESTIMATORS)
    group_size: int
    groups_per_batch: int
    lr: float
    seed: int
    steps: int
    lora_rank: int
    base_model: str
    base_model_path: str | None = None
    max_tokens: int = 512
    temperature: float = 1.0
    kernel: KernelSpec | None = None
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    # The decision seed this unit runs at, in a spec of several seeds (None: a single-seed spec,
    # where the arm runs at its own `seed` on the shared seed-0 prompt order, as it always has).
    run_seed: int | None = None

    @model_validator(mode="after")
    def _kernel_iff_kernel_arm(self):
        if (self.estimator == "gs1_kernel") != (self.kernel is not None):
            raise ValueError(f"arm {self.name}: a kernel is held by, and only by, a gs1_kernel arm")
        return self

    @property
    def estimator(self) -> str:
        return estimator_id(self.advantage)

    @property
    def unit(self) -> str:
        """Its folder under train/ and eval/ (schemas.layout.unit_name)."""
        return unit_name(self.name, self.run_seed)

    @property
    def order_seed(self) -> int:
        """The seed of its prompt order: 0 in a single-seed spec (shared by every arm), else the
        decision seed (shared by every arm at that seed)."""
        return self.run_seed or 0

    def at_seed(self, run_seed: int) -> ArmConfig:
        """This arm as one unit of a multi-seed run: its own init and sampling seed offset by the
        decision seed, and that seed's prompt order."""
        return self.model_copy(update={"run_seed": run_seed, "seed": self.seed + run_seed})

    @property
    def batch_size(self) -> int:
        return self.group_size * self.groups_per_batch

    def with_kernel_bandwidth(self, bandwidth: float) -> ArmConfig:
        """This arm with its kernel at another bandwidth (the pre-registered calibration)."""
        assert self.kernel is not None, f"arm {self.name} has no kernel"
        return self.model_copy(update={"kernel": self.kernel.with_bandwidth(bandwidth)})
