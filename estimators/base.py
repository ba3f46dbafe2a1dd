"""What an arm kind is: the `Estimator` every kind module under `estimators/` subclasses, and
the typed batches it reads and writes (float64 numpy; no torch, tinker or prefect here).

Every estimator gives each rollout a baseline b_i and the advantage r_i - b_i. A kind module owns,
for its kind (the spec's `advantage` name, the only name a kind has):

- its recipe: a frozen pydantic model keyed by `advantage` (ArmConfig.recipe is their union), and
  how it is read from the spec's arm (`recipe_of`) with the arm's spec problems (`spec_problems`);
- what it needs from a step (`needs`: a learner forward pass, a critic client, the window of
  earlier rollouts) and its own logged inputs (`input_columns`);
- its advantages (`advantages`, pure), and the window it threads from step to step;
- its independent float64 reference (`reference`), which shares no code with `advantages`;
- its audit columns (`columns`), gate metrics that mean nothing for it (`gate_not_applicable`),
  its extra step metrics (`step_metrics`), and the preflight's seeded stand-ins for its inputs.

The registry (`estimators.registry`) maps each kind to its Estimator; the loop, audit,
preflight, spec validation, `gs1 validate`, `gs1 advantages` and the report ask it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np

from estimators.kernels import prompt_features
from schemas.errors import AuditInputMissing  # noqa: F401  (raised by the kinds' references)
from schemas.kernel import FEATURE_NAMES

# What an estimator may need from a step besides the sampled, graded rollouts.
LEARNER_LOGPROBS = "learner_logprobs"  # the training client's forward pass on the step's rollouts
CRITIC = "critic"  # a value model: its forward pass before the advantages, its training after
WINDOW = "window"  # the earlier rollouts (KernelWindow), threaded by the loop from step to step
NEEDS = (LEARNER_LOGPROBS, CRITIC, WINDOW)

RolloutsPerPrompt = Literal["any", "one", "at least two"]


# ---------------------------------------------------------------------------- shared checks


def finite_rewards(rewards_R) -> np.ndarray:
    rewards_R = np.asarray(rewards_R, dtype=np.float64)
    if rewards_R.ndim != 1:
        raise ValueError("rewards must be a 1-d array")
    if not np.all(np.isfinite(rewards_R)):
        raise ValueError("rewards must be finite")
    return rewards_R


def finite_features(features_R_F, n: int, name: str) -> np.ndarray:
    features_R_F = np.asarray(features_R_F, dtype=np.float64)
    if features_R_F.ndim == 1 and n == 0:
        features_R_F = features_R_F.reshape(0, 0)
    if features_R_F.ndim != 2 or features_R_F.shape[0] != n:
        raise ValueError(f"{name} must be 2-d with one row per reward")
    if not np.all(np.isfinite(features_R_F)):
        raise ValueError(f"{name} must be finite")
    return features_R_F


def step_batches(steps_R) -> list[tuple[int, int]]:
    """[start, stop) row ranges of the consecutive runs of equal step values, in row order.

    A step whose rows are not consecutive is an error: rows of one step form one batch.
    """
    steps_R = np.asarray(steps_R)
    if steps_R.ndim != 1:
        raise ValueError("steps must be a 1-d array")
    if steps_R.size == 0:
        return []
    change = np.flatnonzero(steps_R[1:] != steps_R[:-1]) + 1
    starts = np.concatenate([[0], change])
    stops = np.concatenate([change, [steps_R.size]])
    if len(np.unique(steps_R[starts])) != len(starts):
        raise ValueError("the rows of each step must be consecutive (row order = rollout order)")
    return [(int(a), int(b)) for a, b in zip(starts, stops)]


# ---------------------------------------------------------------------------- what flows through


@dataclass(frozen=True)
class StepBatch:
    """One step's rollouts as an estimator sees them, in rollout order (float64 / int arrays)."""

    rewards_B: np.ndarray
    group_ids_B: np.ndarray
    prompt_num_tokens_B: np.ndarray
    prompt_mean_logprob_B: np.ndarray
    # LEARNER_LOGPROBS: per-token logprobs of each rollout under the sampler and the learner
    sampler_logprobs_B_T: tuple[np.ndarray, ...] | None = None
    learner_logprobs_B_T: tuple[np.ndarray, ...] | None = None
    # CRITIC: log P(yes) and log P(no) of the answer token after each rollout's prompt
    critic_yes_logprob_B: np.ndarray | None = None
    critic_no_logprob_B: np.ndarray | None = None

    def features(self, names: Sequence[str] = FEATURE_NAMES) -> np.ndarray:
        """features_B_F: the named prompt features, one column per name, in its order."""
        return prompt_features(self.prompt_num_tokens_B, self.prompt_mean_logprob_B, names)

    def kernel_features(self, kernel) -> np.ndarray:
        return self.features(kernel.features)


@dataclass(frozen=True)
class StepAdvantages:
    """One step's advantages, and the estimator's own logged columns (`Estimator.columns`)."""

    baseline: np.ndarray
    advantage: np.ndarray
    columns: Mapping[str, np.ndarray] = field(default_factory=dict)
    # What each token of a rollout's datum carries, when not the advantage itself (FlashREINFORCE)
    token_advantage: np.ndarray | None = None

    def __getattr__(self, name: str):  # an estimator's own column by name (None when it has none)
        if name.startswith("_"):
            raise AttributeError(name)
        return self.__dict__.get("columns", {}).get(name)

    @property
    def datum_advantage(self) -> np.ndarray:
        """The per-token advantage of each rollout's datum."""
        return self.advantage if self.token_advantage is None else self.token_advantage

    def logged(self) -> dict[str, np.ndarray]:
        """Every column this step logs beside the rollouts: baseline, advantage and its own."""
        out = {"baseline": self.baseline, "advantage": self.advantage, **self.columns}
        if self.token_advantage is not None:
            out["token_advantage"] = self.token_advantage
        return out


@dataclass(frozen=True, eq=False)
class KernelWindow:
    """The window: the most recent earlier rollouts (rewards and prompt features), oldest first.

    The RL loop owns it: a step's advantages are computed against a window, and the loop then
    moves on to `window.extended(step rewards, step features)`, the window of the next step. It
    keeps at most `size` rollouts (a step never draws on more than size - 1 history rows).
    """

    size: int
    rewards_H: np.ndarray
    features_H_F: np.ndarray | None  # None before the first step

    @classmethod
    def empty(cls, size: int) -> KernelWindow:
        if int(size) != size or size < 1:
            raise ValueError(f"window must be an integer >= 1, got {size}")
        return cls(int(size), np.zeros(0), None)

    def __len__(self) -> int:
        return self.rewards_H.shape[0]

    def extended(self, rewards_B, features_B_F) -> KernelWindow:
        """The window after one more step: its rollouts appended, the oldest beyond `size` dropped."""
        rewards_B = finite_rewards(rewards_B)
        features_B_F = finite_features(features_B_F, rewards_B.shape[0], "features_B_F")
        features_H_F = np.zeros((0, features_B_F.shape[1])) if self.features_H_F is None else self.features_H_F
        if features_B_F.shape[1] != features_H_F.shape[1]:
            raise ValueError("features must keep the same number of columns across steps")
        return KernelWindow(
            self.size,
            np.concatenate([self.rewards_H, rewards_B])[-self.size :],
            np.concatenate([features_H_F, features_B_F], axis=0)[-self.size :],
        )


@dataclass(frozen=True)
class RolloutLog:
    """The columns of a rollout log an audit reads and checks, in rollout order."""

    step_R: np.ndarray
    group_id_R: np.ndarray
    reward_R: np.ndarray
    prompt_num_tokens_R: np.ndarray
    prompt_mean_logprob_R: np.ndarray
    logged: dict[str, np.ndarray]  # baseline, advantage (+ an estimator's own columns)
    # an estimator's inputs besides the rewards (None when the log has none)
    sampler_logprobs_R_T: list[list[float]] | None = None  # LEARNER_LOGPROBS
    learner_logprobs_R_T: list[list[float]] | None = None  # LEARNER_LOGPROBS
    critic_yes_logprob_R: np.ndarray | None = None  # CRITIC
    critic_no_logprob_R: np.ndarray | None = None  # CRITIC

    def __len__(self) -> int:
        return self.reward_R.shape[0]



# ---------------------------------------------------------------------------- the kind


class Estimator:
    """One arm kind. Subclasses set the class attributes and implement `advantages` and
    `reference`; the rest has the defaults of a kind that reads only rewards and groups."""

    kind: ClassVar[str]  # the spec's `advantage` name
    # Short names `gs1 advantages --estimator` took before kinds were modules (still accepted there)
    cli_aliases: ClassVar[tuple[str, ...]] = ()
    recipe_type: ClassVar[type]  # its recipe model (field `advantage: Literal[kind]`)
    summary: ClassVar[str]  # one line: what b_i is
    rollouts_per_prompt: ClassVar[RolloutsPerPrompt] = "any"
    needs: ClassVar[frozenset[str]] = frozenset()
    columns: ClassVar[tuple[str, ...]] = ()  # logged outputs besides baseline and advantage
    input_columns: ClassVar[tuple[str, ...]] = ()  # logged inputs besides rewards and prompt features
    step_metric_names: ClassVar[tuple[str, ...]] = ()  # its extra step metrics (may be None elsewhere)
    prompt_blind: ClassVar[bool] = False  # b_i is one number for every prompt of a step
    reads_prompt_features: ClassVar[bool] = False  # prompt_num_tokens, prompt_mean_logprob
    reference_name: ClassVar[str]
    # The cookbook computes GRPO in float32: its audit allows that rounding on top of the tolerance.
    float32_reference: ClassVar[bool] = False
    # The spec arm's fields this kind reads (recipe_of); "kernel_file" when it runs a kernel.json.
    spec_fields: ClassVar[tuple[str, ...]] = ()
    # Arm keys only this kind reads, beyond the spec Arm's own fields: key -> its model (defaults
    # filled in for an arm of this kind; refused on an arm of another kind).
    own_spec_keys: ClassVar[dict[str, type]] = {}

    # ---- recipe
    def recipe_of(self, arm_spec) -> Any:
        """Its recipe from the spec's validated arm (design.spec.Arm)."""
        return self.recipe_type()

    def spec_problems(self, arm_spec) -> list[tuple[str, str]]:
        """(field, problem) pairs of a spec arm of this kind: its rollouts per prompt."""
        if self.rollouts_per_prompt == "one" and arm_spec.group_size != 1:
            return [("group_size", f"a {self.kind} arm samples one rollout per prompt (group_size 1), got {arm_spec.group_size}")]
        if self.rollouts_per_prompt == "at least two" and arm_spec.group_size < 2:
            return [("group_size", f"a {self.kind} arm needs at least 2 rollouts per prompt")]
        return []

    def kernel_file_fields(self, kernel: dict) -> dict[str, Any]:
        """The arm fields a `gs1 hillclimb` kernel.json's kernel object sets (pydantic's
        ValidationError when it is not a recipe of this kind); only for a kind that reads one."""
        raise ValueError(f"a {self.kind} arm reads no kernel file")

    def describe(self, recipe, *, lora_rank: int) -> str | None:
        """Its recipe in one line (gs1 validate, the spec artifact); None when it has none."""
        return None

    def label(self, recipe) -> str:
        """Its recipe in a few words for tables ('' when it has none)."""
        return ""

    def kernel_of(self, recipe):
        """The KernelSpec its recipe holds (the pre-registered bandwidth calibration; report); None."""
        return None

    def with_kernel(self, recipe, kernel):
        """Its recipe with another kernel (only for a kind whose recipe holds one)."""
        raise ValueError(f"a {self.kind} arm holds no kernel")

    def critic_of(self, recipe):
        """The CriticSpec of its value model when it needs one (CRITIC); None."""
        return None

    # ---- the step
    def new_window(self, recipe) -> KernelWindow | None:
        """The window of its first step; None when it reads none."""
        return None

    def advance_window(self, recipe, window: KernelWindow | None, batch: StepBatch) -> KernelWindow | None:
        """The window after `batch`'s step: the one place a step's rollouts enter it."""
        return window

    def advantages(self, recipe, batch: StepBatch, window: KernelWindow | None) -> StepAdvantages:
        raise NotImplementedError

    def step_metrics(self, advantages: StepAdvantages) -> dict[str, float]:
        """Its extra step metrics from a step's advantages (names in step_metric_names)."""
        return {}

    # ---- the references and checks
    def reference(self, recipe, log: RolloutLog) -> dict[str, list]:
        """baseline, advantage and `columns` (and token_advantage) recomputed over a whole log by
        code that shares nothing with `advantages`; AuditInputMissing when the log lacks an input."""
        raise NotImplementedError

    def gate_not_applicable(self, metric: str) -> str | None:
        """Why an activation-gate metric means nothing for a treatment of this kind; None if it applies."""
        if metric == "kernel_effective_neighbors_p10" and "effective_neighbors" not in self.columns:
            return f"a {self.kind} treatment has no kernel"
        if metric == "baseline_reward_corr" and self.prompt_blind:
            return f"a {self.kind} baseline is the same for every prompt of a step"
        return None

    def stand_in_inputs(self, recipe, batch_size: int, rng: np.random.Generator) -> dict:
        """Seeded stand-ins for its inputs besides rewards and prompt features (StepBatch fields)."""
        return {}

    def check_window(self, recipe) -> int | None:
        """The window its preflight step check must fill and roll over (None: four batches)."""
        window = self.new_window(recipe)
        return None if window is None else window.size

    def __repr__(self) -> str:
        return f"<estimator {self.kind}>"
