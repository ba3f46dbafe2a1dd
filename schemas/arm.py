"""A training arm as the run executes it: the estimator names a spec may use, and `ArmConfig`.

`ArmConfig` is built once from the spec (`tasks.spec.plan_from_spec`), carried in the run plan,
handed to every stage that runs the arm (preflight, pilot, training, audit) and to the RL loop.

Each estimator holds exactly the recipe it reads, and no other arm holds one: a gs1_kernel arm its
`KernelSpec`, a flash_reinforce arm its trust threshold `trust_delta`, a critic arm its
`CriticSpec`. One rollout per prompt is what flash_reinforce and critic mean
(`ONE_ROLLOUT_PER_PROMPT`); a leave-one-out baseline needs at least two rollouts per prompt.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, model_validator

from schemas.errors import FieldProblems, known_keys_only
from schemas.kernel import KernelSpec
from schemas.layout import unit_name
from schemas.optimizer import ADAM

# Spec `advantage` name -> estimator id (rl.estimators implements each id).
ADVANTAGE_ESTIMATORS = {
    "group_mean": "grpo",
    "kernel_cross_prompt_baseline": "gs1_kernel",
    "batch_mean": "batch_mean",
    "leave_one_out": "rloo",
    "flash_reinforce": "flash_reinforce",
    "critic": "critic",
}

# Estimators whose arm samples one rollout per prompt by definition (spec validation enforces it).
ONE_ROLLOUT_PER_PROMPT = ("gs1_kernel", "flash_reinforce", "critic")
# Estimators whose baseline is the same number for every prompt of a step (no per-prompt signal).
PROMPT_BLIND_BASELINE = ("batch_mean", "flash_reinforce")
# FlashREINFORCE's default trust threshold on the per-trajectory mean Bernoulli KL.
DEFAULT_TRUST_DELTA = 3e-3


class CriticSpec(BaseModel):
    """The critic arm's value model: a second LoRA client on the arm's base model.

    Its value for a prompt is P(yes) / (P(yes) + P(no)) for the answer token after the prompt
    followed by `question`; after each step it is trained with cross-entropy on that step's
    (prompt, reward) pairs, target min(max(reward, 0), 1), by one Adam step at `lr`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    lr: float = 1e-4
    lora_rank: int | None = None  # None: the policy's rank
    question: str = "\nWill this problem be answered correctly? Answer yes or no:"
    yes: str = " yes"
    no: str = " no"

    @model_validator(mode="before")
    @classmethod
    def _known_keys_only(cls, data):
        return known_keys_only(cls, data)

    @model_validator(mode="after")
    def _recipe(self):
        problems = []
        if not (math.isfinite(self.lr) and self.lr > 0):
            problems.append(("lr", "must be > 0"))
        if self.lora_rank is not None and self.lora_rank < 1:
            problems.append(("lora_rank", "must be >= 1"))
        if self.yes == self.no:
            problems.append(("no", "must differ from yes"))
        if problems:
            raise FieldProblems(problems)
        return self


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
    kernel_source: str | None = None  # the `kernel.json` the kernel was read from, with its sha256
    trust_delta: float | None = None  # flash_reinforce only
    critic: CriticSpec | None = None  # critic only
    beta1: float = ADAM.beta1
    beta2: float = ADAM.beta2
    eps: float = ADAM.eps
    # The decision seed this unit runs at, in a spec of several seeds (None: a single-seed spec,
    # where the arm runs at its own `seed` on the shared seed-0 prompt order, as it always has).
    run_seed: int | None = None

    @model_validator(mode="after")
    def _recipe_iff_its_estimator(self):
        if (self.estimator == "gs1_kernel") != (self.kernel is not None):
            raise ValueError(f"arm {self.name}: a kernel is held by, and only by, a gs1_kernel arm")
        if self.kernel_source is not None and self.kernel is None:
            raise ValueError(f"arm {self.name}: a kernel source without a kernel")
        if (self.estimator == "flash_reinforce") != (self.trust_delta is not None):
            raise ValueError(f"arm {self.name}: trust_delta is held by, and only by, a flash_reinforce arm")
        if (self.estimator == "critic") != (self.critic is not None):
            raise ValueError(f"arm {self.name}: a CriticSpec is held by, and only by, a critic arm")
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
