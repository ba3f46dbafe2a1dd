"""The pre-registered experiment spec (`specs/*.json`) as pydantic v2 models.

Every field of the user's spec is modelled and the file validates unchanged. Unknown keys at the
top level are kept (the spec is a record: they come back out of `model_dump`); inside a section
an unknown key is an error naming the closest known key. NaN, Infinity and a key given twice are
errors (`schemas.io.loads_strict`).

Optional fields this project adds (defaults make the user's spec valid as it is):
- `sampling`: `{max_tokens: 512, temperature: 1.0}` for training rollouts. When `sampling` is
  absent, `max_tokens` is taken from `feasibility.effective_config.max_tokens` if recorded.
- `renderer`: a tinker-cookbook renderer name; None means the cookbook's recommended renderer for
  `base_model` (see `resolve_renderer_name`).
- `base_model_path`: where the local engine loads weights from: a directory, a `.gguf` file, or
  `pkg:<python_package>/<file>` for a file shipped inside an installed package
  (see `resolve_base_model_path`). None means `base_model` is used as it is.
- `pilot`: `{steps: 2, heldout_prompts: 64, heldout_samples: 8}`: the activation pilot's length
  and the held-out per-prompt reward estimate behind the `baseline_reward_corr` gate.
- `arms[].kernel`: a `schemas.kernel.KernelSpec`; its defaults are the user's pinned kernel.
- `arms[].kernel_file`: instead of `kernel`, a `kernel.json` that `gs1 hillclimb` wrote
  (`{"kernel": {...}}`), relative to the spec file's folder; read and validated as a KernelSpec
  when the spec loads (its recipe then counts in the spec's hash), recorded in the run plan.
- `arms[].trust_delta`: FlashREINFORCE's trust threshold (default 3e-3; flash_reinforce arms).
- `arms[].critic`: a `design.arm.CriticSpec` (critic arms).
- `decision_rule.method`: any rule of `rules.registry`, with that rule's own keys beside it
  (`Rule.own_spec_keys`, e.g. a bootstrap's `n_resamples` and `rng_seed`) and the seeds it needs; `decision_rule.between_seed_sd`
  and `item_sd` (the spread `gs1 power` assumes; None: `rules.power`'s measured defaults),
  `min_power` (a power gate at feasibility) and `power_difference` (where it reads; None: half the margin).

Problems are reported as `field.path: reason` lines (`load_spec` raises `SpecError`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic.json_schema import SkipJsonSchema
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_serializer, PrivateAttr, ValidationError, ValidationInfo, field_validator, model_validator

from estimators.critic import CriticSpec
from estimators.flash_reinforce import DEFAULT_TRUST_DELTA
from estimators.registry import ESTIMATORS, KINDS, estimator_for
from rules.base import RuleSettings
from rules.power import PowerDesign
from rules.registry import RULES, own_spec_keys, rule_for
from schemas.errors import FieldProblems, SpecError, UserError, known_keys_only
from schemas.kernel import KernelSpec
from schemas.names import GATE_METRICS, env_names, env_test_items, unknown_env_options

# ---------------------------------------------------------------------------------------------
# names the validators check against
# ---------------------------------------------------------------------------------------------

TREATMENT_ADVANTAGE = "kernel_cross_prompt_baseline"
BASELINE_ADVANTAGE = "group_mean"
OPTIMIZERS = ("adam", "adamw")  # both backends run Adam(W) with AdamParams
ROLES = ("treatment", "baseline")




class Record(BaseModel):
    """Base of every spec model. Inside a section the schema defines, an unknown key is an error
    naming the closest known key (a typo such as `sampling.temprature` would otherwise leave the
    default in force). The spec's top level also keeps the record keys it names
    (`record_keys`: the revision records the pipeline writes, and free notes), which come back
    out of `model_dump`; any other unknown key there is an error too (`"stepz": 3` names `steps`).
    Non-finite numbers are errors everywhere."""

    model_config = ConfigDict(extra="allow", populate_by_name=True, allow_inf_nan=False)
    record_keys: ClassVar[frozenset[str]] = frozenset()

    @model_validator(mode="before")
    @classmethod
    def _known_keys_only(cls, data):
        if not isinstance(data, dict):
            return data
        return known_keys_only(cls, data, also=cls.record_keys)


def _bound(holds, what: str) -> AfterValidator:
    """A field check that passes None and raises `what` when `holds(v)` is false (NaN fails)."""

    def check(v):
        if v is not None and not holds(v):
            raise ValueError(what)
        return v

    return AfterValidator(check)


Positive = _bound(lambda v: v > 0, "must be > 0")
# the calibration pilot's wall cap in the user's spec (its activation-failure plan (c))
CALIBRATION_WALL_MINUTES = 10.0
AtLeast1 = _bound(lambda v: v >= 1, "must be >= 1")
AtLeast2 = _bound(lambda v: v >= 2, "must be >= 2")
NonNegative = _bound(lambda v: v >= 0, "must be >= 0")
Cosine = _bound(lambda v: -1 <= v <= 1, "must lie in [-1, 1]")
Probability = _bound(lambda v: 0 < v < 1, "must lie in (0, 1)")
NonEmpty = _bound(lambda v: len(v) > 0, "must not be empty")


# ---------------------------------------------------------------------------------------------
# arms
# ---------------------------------------------------------------------------------------------


class Arm(Record):
    name: str
    advantage: str  # an arm kind (estimators.registry.KINDS)
    group_size: Annotated[int, AtLeast1]  # rollouts per prompt
    groups_per_batch: Annotated[int, AtLeast1]  # prompts per step
    lr: Annotated[float, Positive]
    seed: int = 0
    # Recipe fields: each read by the kinds that name it in `Estimator.spec_fields` (every arm
    # holds their defaults: the hashed form of a spec has always had them).
    kernel: KernelSpec = Field(default_factory=KernelSpec)
    kernel_file: str | None = None  # a hill-climbed kernel.json instead of `kernel`
    trust_delta: Annotated[float, NonNegative] = DEFAULT_TRUST_DELTA
    critic: CriticSpec = Field(default_factory=CriticSpec)
    _kernel_source: str | None = PrivateAttr(default=None)
    # Keys a kind owns beyond these fields (`Estimator.own_spec_keys`): kept, and checked by the kind.
    record_keys: ClassVar[frozenset[str]] = frozenset(k for e in ESTIMATORS.values() for k in e.own_spec_keys)
    # In a spec of more than two arms: "baseline" names the arm every other arm is decided against,
    # "treatment" the one arm the pilot and the activation gate are about (a kernel arm's default).
    role: Literal["treatment", "baseline"] | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v):
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", v):
            raise ValueError("must be letters, digits, '_', '.', '-' (it names folders)")
        return v

    @field_validator("advantage")
    @classmethod
    def _advantage(cls, v):
        if v not in KINDS:
            raise ValueError(f"no estimator implements {v!r} (known: {', '.join(KINDS)})")
        return v

    @model_validator(mode="after")
    def _arm_kind(self, info: ValidationInfo):
        """The arm's kind checks it; the kind's own keys get their defaults; a kernel file is read
        into the recipe fields it sets (which then enter the canonical form, hence the hash)."""
        estimator = estimator_for(self.advantage)
        problems = list(estimator.spec_problems(self))
        extra = self.__pydantic_extra__
        given = set(self.model_fields_set) | set(extra)
        for key in [k for k in extra if k not in estimator.own_spec_keys]:
            problems.append((key, f"a {self.advantage} arm reads no {key}"))
        for key, model in estimator.own_spec_keys.items():
            try:
                extra[key] = model.model_validate(extra.get(key, {}))
            except ValidationError as e:  # each of its problems as its own line under the key
                for path, msg in (line.split(": ", 1) for line in spec_problems(e)):
                    problems.append((key if path == "(spec)" else f"{key}.{path}", msg))
        if self.kernel_file is not None:
            both = [k for k in estimator.spec_fields if k != "kernel_file" and k in given]
            if "kernel_file" not in estimator.spec_fields:
                problems.append(("kernel_file", f"a {self.advantage} arm reads no kernel file"))
            elif both:
                problems.append(("kernel_file", f"give {both[0]} or kernel_file, not both"))
            else:
                try:
                    fields, source = read_kernel_file(self.kernel_file, (info.context or {}).get("spec_dir"), estimator)
                except ValueError as e:
                    problems.append(("kernel_file", str(e)))
                else:
                    for key, value in fields.items():
                        (self.__dict__ if key in type(self).model_fields else extra)[key] = value
                    self._kernel_source = source
        if problems:
            raise FieldProblems(problems)
        return self

    def spec_value(self, key: str):
        """A recipe field of the arm: one of its own fields, or a key its kind owns."""
        return getattr(self, key) if key in type(self).model_fields else self.__pydantic_extra__[key]

    @property
    def kernel_source(self) -> str | None:
        """`<path> sha256:<hex>` of the kernel file this arm's kernel was read from; None otherwise."""
        return self._kernel_source

    @property
    def estimator(self):
        """Its kind's Estimator (estimators.registry)."""
        return estimator_for(self.advantage)

    @property
    def batch_shape(self) -> str:
        """`P x G = B`: prompts per step x rollouts per prompt = rollouts per step."""
        return f"{self.groups_per_batch}x{self.group_size}={self.groups_per_batch * self.group_size}"


def read_kernel_file(path: str, spec_dir: str | None, estimator) -> tuple[dict, str]:
    """A `gs1 hillclimb` kernel.json (`{"kernel": {...}}`) as the arm fields it sets for the arm's
    kind (`Estimator.kernel_file_fields`), and `<path> sha256:<hex>`.

    A relative path is taken from `spec_dir` (the spec file's folder; the working folder when the
    spec did not come from a file). Any problem is a ValueError of one line.
    """
    from schemas.io import loads_strict

    file = Path(path).expanduser()
    if not file.is_absolute() and spec_dir is not None:
        file = Path(spec_dir) / file
    if file.is_dir():
        raise ValueError(f"kernel file {str(file)!r} is a directory, not a kernel file")
    if not file.is_file():
        raise ValueError(f"no such kernel file {str(file)!r}")
    raw = file.read_bytes()
    try:
        data = loads_strict(raw.decode("utf-8"), str(file))
    except (UserError, UnicodeDecodeError) as e:
        raise ValueError(f"{file}: not a JSON kernel file ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    if not isinstance(data, dict) or set(data) != {"kernel"} or not isinstance(data["kernel"], dict):
        raise ValueError(f"{file}: expected {{\"kernel\": {{...}}}} as `gs1 hillclimb` writes it")
    try:
        fields = estimator.kernel_file_fields(data["kernel"])
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "kernel"
        raise ValueError(f"{file}: kernel.{where}: {first['msg'].removeprefix('Value error, ')}") from None
    return fields, f"{file.resolve()} sha256:{hashlib.sha256(raw).hexdigest()}"


# ---------------------------------------------------------------------------------------------
# gates, preflights, decision
# ---------------------------------------------------------------------------------------------


class GateCheck(Record):
    metric: str  # a name in schemas.names.GATE_METRICS
    measures: str | None = None
    one_of: list[str] | None = None  # passes when str(value) is one of these
    min: float | None = None
    max: float | None = None

    @field_validator("metric")
    @classmethod
    def _metric(cls, v):
        known = GATE_METRICS
        if v not in known:
            raise ValueError(f"unknown gate metric {v!r} (known: {', '.join(known)})")
        return v

    @model_validator(mode="after")
    def _bounds(self):
        if self.one_of is None and self.min is None and self.max is None:
            raise FieldProblems([("", "needs one_of, min or max")])
        if self.one_of is not None and (self.min is not None or self.max is not None):
            raise FieldProblems([("", "use one_of or min/max, not both")])
        if self.one_of is not None and not self.one_of:
            raise FieldProblems([("one_of", "must not be empty")])
        if self.min is not None and self.max is not None and self.min > self.max:
            raise FieldProblems([("min", f"must be <= max ({self.min} > {self.max})")])
        return self


class ActivationGate(Record):
    applicable: bool = True
    checks: list[GateCheck] = Field(default_factory=list)
    reason: str | None = None


class Tolerance(Record):
    atol: Annotated[float | None, NonNegative] = None
    rtol: Annotated[float | None, NonNegative] = None
    min_cosine: Annotated[float | None, Cosine] = None


class CorrectnessPath(Record):
    id: str
    kind: str
    baseline_revision: str | None = None
    reference_revision: str | None = None
    tolerances: dict[str, Tolerance] = Field(default_factory=dict)


class CorrectnessPreflight(Record):
    paths: list[CorrectnessPath] = Field(default_factory=list)
    required: bool = True
    status: str | None = None


class Criterion(Record):
    id: str
    metric: str
    bounds: tuple[float, float]  # range of the per-item metric
    margin: float  # on the weighted difference, e.g. treatment - baseline
    weights: Annotated[dict[str, float], NonEmpty]  # role ("treatment"/"baseline") or arm name -> weight

    @field_validator("bounds")
    @classmethod
    def _bounds(cls, v):
        if not v[0] < v[1]:
            raise ValueError(f"lower bound {v[0]} must be < upper bound {v[1]}")
        return v

    def difference_range(self) -> tuple[float, float]:
        """Range of sum_k w_k * metric_k with each metric in `bounds`."""
        lo, hi = self.bounds
        return (
            sum(min(w * lo, w * hi) for w in self.weights.values()),
            sum(max(w * lo, w * hi) for w in self.weights.values()),
        )

    @model_validator(mode="after")
    def _margin(self):
        lo, hi = self.difference_range()
        if not lo < self.margin < hi:
            raise FieldProblems([("margin", f"{self.margin} lies outside ({lo:g}, {hi:g}), the range of the weighted difference for bounds {list(self.bounds)}")])
        return self


class DecisionRule(Record):
    """The pre-registered decision. `method` names a rule (`rules.registry`): its own keys
    (`Rule.own_spec_keys`, e.g. a bootstrap's `n_resamples`) sit here beside the common ones and
    are validated by the rule, as are the seeds it needs. The power fields are this project's:
    the between-run spread the power reading assumes (`rules.power`), and an optional power
    gate (`min_power`: P(conclusive) at `power_difference`, default half the margin)."""

    method: str
    alpha: Annotated[float, Probability]
    criteria: Annotated[list[Criterion], NonEmpty]
    seeds: Annotated[list[int], NonEmpty]
    estimand: str | None = None
    unit: str | None = None
    version: int | None = None
    # added by this project (optional; None: rules.power's measured defaults)
    between_seed_sd: Annotated[float | None, Positive] = None
    item_sd: Annotated[float | None, Positive] = None
    min_power: Annotated[float | None, Probability] = None
    power_difference: float | None = None
    record_keys: ClassVar[frozenset[str]] = own_spec_keys()
    _settings: RuleSettings | None = PrivateAttr(default=None)

    @field_validator("method")
    @classmethod
    def _method(cls, v):
        rule_for(v)  # ValueError naming the known rules
        return v

    @model_validator(mode="after")
    def _unique_ids(self):
        seen: set[str] = set()
        problems = []
        for i, c in enumerate(self.criteria):
            if c.id in seen:
                problems.append((f"criteria.{i}.id", f"duplicate criterion id {c.id!r}"))
            seen.add(c.id)
        if len(set(self.seeds)) != len(self.seeds):
            problems.append(("seeds", "duplicate seed"))
        rule = rule_for(self.method)
        extra = self.model_extra or {}
        problems += [(k, f"read only by the {', '.join(m for m, r in RULES.items() if k in r.own_spec_keys)} rule, "
                         f"not {self.method}") for k in sorted(extra) if k not in rule.own_spec_keys]
        if (why := rule.seeds_problem(len(self.seeds))) is not None:
            problems.append(("seeds", why))
        try:
            self._settings = rule.settings(**{k: v for k, v in extra.items() if k in rule.own_spec_keys})
        except ValidationError as e:
            problems += [(".".join(str(x) for x in err["loc"]), err["msg"].removeprefix("Value error, ")) for err in e.errors()]
        if problems:
            raise FieldProblems(problems)
        return self

    @property
    def settings(self) -> RuleSettings:
        """The rule's own settings (its spec keys, validated)."""
        return self._settings

    def power_design(self, n_eval: int) -> PowerDesign:
        """The spread the power reading assumes at the spec's n_eval items: the spec's own where it
        gives one, else `rules.power`'s measured defaults; and the power gate, if any."""
        given = {k: v for k in ("between_seed_sd", "item_sd") if (v := getattr(self, k)) is not None}
        return PowerDesign(n_eval=n_eval, min_power=self.min_power, power_difference=self.power_difference,
                           from_spec=bool(given), **given)


# ---------------------------------------------------------------------------------------------
# everything else in the record
# ---------------------------------------------------------------------------------------------


class Budget(Record):
    gpu_hours: Annotated[float, Positive]
    max_wall_minutes: Annotated[float, Positive]


class Dataset(Record):
    name: str  # selects the env: schemas.names.env_names()
    hf_path: str | None = None
    split: str | None = None
    n_examples: Annotated[int | None, AtLeast1] = None  # training prompts drawn, in the seed-0 order
    options: dict[str, Any] = Field(default_factory=dict)  # keyword options of the env (schemas.names.env_options)

    @field_validator("name")
    @classmethod
    def _name(cls, v):
        if v not in env_names():
            raise ValueError(f"no env for dataset {v!r} (known: {', '.join(env_names())})")
        return v

    @model_validator(mode="after")
    def _options(self):
        unknown = unknown_env_options(self.name, self.options) if self.name in env_names() else []
        if unknown:
            raise ValueError(f"options {', '.join(unknown)} are not options of env {self.name!r}")
        return self


class Eval(Record):
    benchmark: str | None = None
    metric: str | None = None
    n_examples: Annotated[int | None, AtLeast1] = None  # test items scored (first n in file order); None = all
    aggregation: Any = None


class ExperimentFeatures(Record):
    adaptive_selection: bool = False
    checkpoint_restore: bool = False
    custom_loss: bool = False
    custom_optimizer: bool = False
    generated_training_data: bool = False
    heldout_loss: bool = False
    learned_generator: bool = False
    paired_comparison: bool = False
    paired_training_arms: bool = False
    warmup_adaptation: bool = False


class EffectiveConfig(Record):
    arms: list[str] | None = None
    base_model: str | None = None
    batch_size: int | None = None
    max_seq_len: int | None = None
    max_tokens: int | None = None
    n_eval: int | None = None
    steps: int | None = None


class Feasibility(Record):
    config: Any = None
    effective_config: EffectiveConfig | None = None
    generation: Any = None
    measurements: Any = None
    primary_endpoint: str | None = None
    recovery: Any = None
    source: Any = None


class GenerationApplicability(Record):
    check: str | None = None
    enforce: bool | None = None
    features: dict[str, bool] = Field(default_factory=dict)
    reasons: list[str] = Field(default_factory=list)
    status: str | None = None


class FeasibilityCheck(Record):
    generation_applicability: GenerationApplicability | None = None
    generation_counts: Any = None
    gpu_hours: float | None = None
    known_gpu_hours: float | None = None
    phases: dict[str, Any] = Field(default_factory=dict)
    problems: list[str] = Field(default_factory=list)
    status: str | None = None
    wall_seconds: float | None = None


class GenerationAudit(Record):
    answer_comparison: str | None = None
    max_eval_overlaps: int | None = None
    max_label_errors: int | None = None
    min_sample_size: int | None = None
    required: bool = False


class Optimizer(Record):
    name: str
    lr: Annotated[float, Positive]

    @field_validator("name")
    @classmethod
    def _name(cls, v):
        if v.lower() not in OPTIMIZERS:
            raise ValueError(f"unsupported optimizer {v!r} (supported: {', '.join(OPTIMIZERS)})")
        return v


class Preflight(Record):
    probe: str | None = None
    riskiest_assumption: str | None = None
    tuning: str | None = None


class OptimizerConfig(Record):
    beta1: float | None = None
    beta2: float | None = None
    eps: float | None = None
    lora_rank: int | None = None
    lr: float | None = None
    seed: int | None = None


class RestorationArm(Record):
    name: str
    optimizer: str | None = None
    optimizer_config: OptimizerConfig | None = None


class RestorationGroup(Record):
    arms: list[RestorationArm] = Field(default_factory=list)


class RestorationPreflight(Record):
    applicable: bool = False
    fixed_batch_required: bool = False
    groups: list[RestorationGroup] = Field(default_factory=list)
    reason: str | None = None


class SpecPreflight(Record):
    findings: list[Any] = Field(default_factory=list)
    status: str | None = None


class Sampling(Record):
    """Training rollouts' sampling parameters (eval decodes greedily)."""

    max_tokens: Annotated[int, AtLeast1] = 512
    temperature: Annotated[float, NonNegative] = 1.0


class Pilot(Record):
    """The activation pilot: `steps` treatment steps, and the held-out reward estimate."""

    steps: Annotated[int, AtLeast1] = 2
    heldout_prompts: Annotated[int, AtLeast1] = 64  # pilot prompts whose per-prompt mean reward is estimated
    heldout_samples: Annotated[int, AtLeast1] = 8  # samples per held-out prompt
    # the pre-registered calibration pilot's wall cap (the user's plan (c): 10 minutes); a spec
    # written for a slower machine sizes it for that machine and says why in its notes
    calibration_wall_minutes: Annotated[float, Positive] = CALIBRATION_WALL_MINUTES


# ---------------------------------------------------------------------------------------------
# the spec
# ---------------------------------------------------------------------------------------------


class ExperimentSpec(Record):
    # the top level is the user's record: revision records (`revision`, the calibrated spec's
    # `revisions`, the overrides applied) and `notes` are kept as they are
    record_keys: ClassVar[frozenset[str]] = frozenset({"revision", "revisions", "overrides", "notes"})

    title: str
    hypothesis: str | None = None
    training_type: str = "rl"
    base_model: str
    baseline: str | None = None
    method: str | None = None
    command: str | None = None
    arms: Annotated[list[Arm], NonEmpty]
    batch_size: Annotated[int, AtLeast1]  # rollouts per step, the same in every arm
    steps: Annotated[int, AtLeast1]
    lora_rank: Annotated[int, AtLeast1]
    max_seq_len: Annotated[int | None, AtLeast1] = None
    optimizer: Optimizer
    dataset: Dataset
    eval: Eval = Field(default_factory=Eval)
    activation_gate: ActivationGate = Field(default_factory=ActivationGate)
    correctness_preflight: CorrectnessPreflight | None = None
    decision_rule: DecisionRule
    budget: Budget
    experiment_features: ExperimentFeatures = Field(default_factory=ExperimentFeatures)
    feasibility: Feasibility | None = None
    feasibility_check: FeasibilityCheck | None = None
    feasibility_required: bool = True
    generation_audit: GenerationAudit | None = None
    preflight: Preflight | None = None
    primary_endpoint: str | None = None
    restoration_preflight: RestorationPreflight | None = None
    spec_preflight: SpecPreflight | None = None
    success_criterion: str | None = None

    # added by this project (optional; see the module docstring)
    sampling: Sampling = Field(default_factory=Sampling)
    renderer: str | None = None
    base_model_path: str | None = None
    pilot: Pilot = Field(default_factory=Pilot)

    @field_validator("base_model_path")
    @classmethod
    def _base_model_path(cls, v):
        if v is not None and v.startswith("pkg:") and not re.fullmatch(r"pkg:[A-Za-z_][\w.]*/.+", v):
            raise ValueError("a package path is 'pkg:<python_package>/<file>'")
        return v

    @model_validator(mode="after")
    def _derive_sampling(self):
        # The user's spec states max_tokens only in feasibility.effective_config (and its prose):
        # take it from there when `sampling` was not given. Written into __dict__ so the derived
        # value does not count as set by the user (exclude_unset dumps give back the file).
        if "sampling" not in self.model_fields_set:
            eff = self.feasibility.effective_config if self.feasibility else None
            if eff is not None and eff.max_tokens is not None:
                self.__dict__["sampling"] = Sampling(max_tokens=eff.max_tokens)
        return self

    @model_validator(mode="after")
    def _cross_checks(self):
        problems: list[tuple[str, str]] = []
        names: set[str] = set()
        for i, arm in enumerate(self.arms):
            if arm.name in names:
                problems.append((f"arms.{i}.name", f"duplicate arm name {arm.name!r}"))
            names.add(arm.name)
            if arm.group_size * arm.groups_per_batch != self.batch_size:
                problems.append((
                    f"arms.{i}",
                    f"group_size x groups_per_batch = {arm.group_size} x {arm.groups_per_batch} = "
                    f"{arm.group_size * arm.groups_per_batch} differs from batch_size {self.batch_size}",
                ))
        for c_i, crit in enumerate(self.decision_rule.criteria):
            for key in crit.weights:
                if key not in ROLES and key not in names:
                    problems.append((f"decision_rule.criteria.{c_i}.weights.{key}", "neither a role (treatment, baseline) nor an arm name"))
        if not problems:
            try:
                t, b = _find_treatment(self), _find_baseline(self)
                if t.name == b.name:
                    problems.append(("arms", f"arm {t.name!r} is both treatment and baseline"))
            except ValueError as e:
                problems.append(("arms", str(e)))
        if self.restoration_preflight is not None:
            for g_i, group in enumerate(self.restoration_preflight.groups):
                for a_i, ra in enumerate(group.arms):
                    if ra.name not in names:
                        problems.append((f"restoration_preflight.groups.{g_i}.arms.{a_i}.name", f"no arm named {ra.name!r}"))
        test_items = env_test_items(self.dataset.name, self.dataset.options)
        if self.eval.n_examples is not None and test_items is not None and self.eval.n_examples > test_items:
            problems.append(("eval.n_examples", f"{self.eval.n_examples} is more than the {test_items} test items "
                                                f"{self.dataset.name} has"))
        if self.max_seq_len is not None and self.sampling.max_tokens >= self.max_seq_len:
            problems.append(("sampling.max_tokens", f"{self.sampling.max_tokens} leaves no room for the prompt in max_seq_len {self.max_seq_len}"))
        eff = self.feasibility.effective_config if self.feasibility else None
        if eff is not None:
            recorded = {
                "arms": [a.name for a in self.arms],
                "base_model": self.base_model,
                "batch_size": self.batch_size,
                "max_seq_len": self.max_seq_len,
                "max_tokens": self.sampling.max_tokens,
                "n_eval": self.eval.n_examples,
                "steps": self.steps,
            }
            where = {"max_tokens": "sampling.max_tokens", "n_eval": "eval.n_examples", "arms": "arm names"}
            for key, value in recorded.items():
                stated = getattr(eff, key)
                same = sorted(stated) == sorted(value) if key == "arms" and stated and value else stated == value
                if stated is not None and value is not None and not same:
                    problems.append((f"feasibility.effective_config.{key}", f"{stated!r} differs from {where.get(key, key)} {value!r}"))
        if self.renderer is None:
            try:
                resolve_renderer_name(self)
            except UserError as e:
                problems.append(("renderer", str(e)))
        if problems:
            raise FieldProblems(problems)
        return self

    def arm(self, name: str) -> Arm:
        for a in self.arms:
            if a.name == name:
                return a
        raise KeyError(name)


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


def _role_arm(spec: ExperimentSpec, role: str) -> Arm | None:
    """The arm a criterion's weights name, by arm name with the role's sign."""
    sign = 1 if role == "treatment" else -1
    for crit in spec.decision_rule.criteria:
        named = [spec.arm(k) for k, w in crit.weights.items() if k not in ROLES and w * sign > 0 and any(a.name == k for a in spec.arms)]
        if len(named) == 1:
            return named[0]
    return None


def _with_role(spec: ExperimentSpec, role: str) -> Arm | None:
    named = [a for a in spec.arms if a.role == role]
    if len(named) > 1:
        raise ValueError(f"{len(named)} arms have role {role!r} ({', '.join(a.name for a in named)}); at most one may")
    return named[0] if named else None


def _find_treatment(spec: ExperimentSpec) -> Arm:
    if (arm := _with_role(spec, "treatment")) is not None:
        return arm
    kernel = [a for a in spec.arms if a.advantage == TREATMENT_ADVANTAGE]
    if len(kernel) == 1:
        return kernel[0]
    if (arm := _role_arm(spec, "treatment")) is not None:
        return arm
    others = [a for a in spec.arms if a.advantage != BASELINE_ADVANTAGE]
    if len(spec.arms) == 2 and len(others) == 1:
        return others[0]
    raise ValueError(f"cannot tell the treatment arm: give exactly one arm advantage {TREATMENT_ADVANTAGE!r}, "
                     "role \"treatment\" to one arm, or name it in decision_rule weights")


def _find_baseline(spec: ExperimentSpec) -> Arm:
    if (arm := _with_role(spec, "baseline")) is not None:
        return arm
    grpo = [a for a in spec.arms if a.advantage == BASELINE_ADVANTAGE]
    if len(grpo) == 1:
        return grpo[0]
    if (arm := _role_arm(spec, "baseline")) is not None:
        return arm
    treatment = _find_treatment(spec)
    others = [a for a in spec.arms if a.name != treatment.name]
    if len(others) == 1:
        return others[0]
    raise ValueError(f"cannot tell the baseline arm: give exactly one arm advantage {BASELINE_ADVANTAGE!r}, "
                     "role \"baseline\" to one arm, or name it in decision_rule weights")


def treatment_arm(spec: ExperimentSpec) -> Arm:
    """The arm the pilot and the activation gate are about: the arm with role "treatment", else the
    one kernel-baseline arm, else the arm with positive decision weight."""
    return _find_treatment(spec)


def baseline_arm(spec: ExperimentSpec) -> Arm:
    """The comparison arm: the arm with role "baseline", else the group-mean (GRPO) arm, else the
    arm with negative decision weight."""
    return _find_baseline(spec)


def compared_arms(spec: ExperimentSpec) -> list[Arm]:
    """Every arm decided against the baseline, in spec order: all arms but the baseline (in a
    two-arm spec, the treatment)."""
    baseline = _find_baseline(spec)
    return [a for a in spec.arms if a.name != baseline.name]


def _model_registry(org: str) -> dict:
    from tinker_cookbook import model_info

    getters = {
        "meta-llama": "get_llama_info",
        "Qwen": "get_qwen_info",
        "deepseek-ai": "get_deepseek_info",
        "openai": "get_gpt_oss_info",
        "moonshotai": "get_moonshot_info",
        "zai-org": "get_zai_info",
        "nvidia": "get_nvidia_info",
    }
    getter = getattr(model_info, getters.get(org, ""), None)
    return getter() if getter is not None else {}


def resolve_renderer_name(spec: ExperimentSpec) -> str:
    """The renderer to use: `spec.renderer`, else the cookbook's recommendation for `base_model`.

    A model the cookbook's table lacks (e.g. `Qwen/Qwen3.5-2B` in tinker-cookbook 0.5.8) gets
    its family's renderer when every listed sibling of the same kind (same name up to the size,
    chat vs `-Base`) recommends the same one; otherwise it is a UserError asking for `renderer`.
    """
    if spec.renderer is not None:
        return spec.renderer
    from tinker_cookbook.model_info import get_recommended_renderer_name

    model = spec.base_model
    try:
        return get_recommended_renderer_name(model)
    except Exception:
        pass
    org, _, version = model.split(":", 1)[0].partition("/")
    family = version.split("-", 1)[0]
    is_base = version.endswith("-Base")
    siblings = {
        attrs.recommended_renderers[0]
        for name, attrs in _model_registry(org).items()
        if name.split("-", 1)[0] == family and name.endswith("-Base") == is_base and attrs.recommended_renderers
    }
    if len(siblings) == 1:
        return siblings.pop()
    raise UserError(f"not set, and tinker-cookbook recommends no renderer for base_model {model!r}; set \"renderer\"")


def resolve_base_model_path(spec: ExperimentSpec) -> str | None:
    """`base_model_path` as a filesystem path (`pkg:` resolved without importing the package).

    None when the spec gives none (load `base_model`). A path that does not exist is a UserError.
    """
    value = spec.base_model_path
    if value is None:
        return None
    if value.startswith("pkg:"):
        package, _, rel = value[4:].partition("/")
        try:
            found = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            found = None
        if found is None or not found.submodule_search_locations:
            raise UserError(f"base_model_path: package {package!r} is not installed")
        path = Path(list(found.submodule_search_locations)[0]) / rel
    else:
        path = Path(value).expanduser()
    if not path.exists():
        raise UserError(f"base_model_path: {path} does not exist")
    return str(path)


def eval_items(spec: ExperimentSpec) -> int | None:
    """The eval items a run of `spec` scores: `eval.n_examples`, else the env's whole test set where
    that is known without loading it (`schemas.names.env_test_items`)."""
    return spec.eval.n_examples or env_test_items(spec.dataset.name, spec.dataset.options)


def hashed_dump(spec: ExperimentSpec) -> dict:
    """The spec as its hashes see it: every default filled in, and a hill-climbed kernel as the
    recipe it holds, not the path it was read from (the same spec hashes the same from any folder)."""
    data = spec.model_dump(mode="json")
    for arm in data["arms"]:
        arm.pop("kernel_file", None)
    if data["pilot"]["calibration_wall_minutes"] == CALIBRATION_WALL_MINUTES:  # hashes as before the cap was a field
        data["pilot"].pop("calibration_wall_minutes")
    return data


def canonical_json(spec: ExperimentSpec) -> str:
    """The spec with every default filled in, as sorted compact JSON (the hashed form)."""
    data = hashed_dump(spec)
    for arm in data["arms"]:  # an arm without a role hashes as before roles existed (same run directory)
        if arm.get("role") is None:
            arm.pop("role", None)
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def spec_hash(spec_or_path: ExperimentSpec | str | Path) -> str:
    """First 12 hex of the sha256 of the canonical JSON (equal for equal effective specs)."""
    spec = spec_or_path if isinstance(spec_or_path, ExperimentSpec) else load_spec(spec_or_path)
    return hashlib.sha256(canonical_json(spec).encode("utf-8")).hexdigest()[:12]


def slug(title: str, max_len: int = 60) -> str:
    """`"GS1 vs GRPO demo (local)"` -> `"gs1-vs-grpo-demo-local"`: safe for folder and flow names."""
    s = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
    return s[:max_len].rstrip("-") or "spec"


# ---------------------------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------------------------


def _format_loc(loc: tuple) -> str:
    return ".".join(str(p) for p in loc)


def spec_problems(err: ValidationError) -> list[str]:
    """One `field.path: reason` line per problem in a pydantic ValidationError."""
    lines = []
    for e in err.errors(include_url=False):
        loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        cause = (e.get("ctx") or {}).get("error")
        if isinstance(cause, FieldProblems):
            for rel, msg in cause.problems:
                path = _format_loc(loc + tuple(rel.split("."))) if rel else _format_loc(loc)
                lines.append(f"{path or '(spec)'}: {msg}")
            continue
        msg = e["msg"]
        if e["type"] == "missing":
            msg = "required field is missing"
        elif e["type"] == "value_error":
            msg = msg.removeprefix("Value error, ")
        lines.append(f"{_format_loc(loc) or '(spec)'}: {msg}")
    return lines


def parse_spec(data: Any, source: str | None = None) -> ExperimentSpec:
    """Validate a spec dict; a SpecError lists every problem found."""
    if not isinstance(data, dict):
        raise UserError(f"{source or 'spec'}: expected a JSON object at the top level")
    try:
        spec_dir = str(Path(source).parent) if source and Path(source).is_file() else None
        return ExperimentSpec.model_validate(data, context={"spec_dir": spec_dir})
    except ValidationError as e:
        raise SpecError(spec_problems(e), source) from None
    except RecursionError:
        raise UserError(f"{source or 'spec'}: nested too deeply to read") from None


def load_spec(path: str | Path) -> ExperimentSpec:
    """Read and validate a spec file. Missing file or bad JSON: a one-line UserError."""
    from schemas.io import loads_strict

    path = Path(path)
    if path.is_dir():
        raise UserError(f"{path}: is a directory, not a spec file")
    if not path.is_file():
        raise UserError(f"{path}: no such spec file")
    try:
        text = path.read_text(encoding="utf-8-sig")  # an editor's byte-order mark is read, not refused
    except UnicodeDecodeError:
        raise UserError(f"{path}: not UTF-8 text") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror or type(e).__name__})") from None
    return parse_spec(loads_strict(text, str(path)), str(path))


_Unset = SkipJsonSchema[None]  # an override left out: valid, and not in the form's schema


def _override(description: str):
    """An override field: None unless set; its schema has no default (the form leaves it empty)."""
    return Field(None, description=description, json_schema_extra=lambda schema: schema.pop("default", None))


class SpecOverrides(BaseModel):
    """Changes a run started from the UI may make to a spec file; each one changes the spec's hash.

    Overriding is a revision of the pre-registered spec, not a hidden knob: the revised spec is
    written in full (with an `overrides` record) and the run directory is named by its hash.
    """

    model_config = ConfigDict(extra="forbid")

    # Each field's JSON schema is its own type and bound alone (no `null` branch), so the UI's run
    # form validates field by field and names the bound: "Validation failed for field
    # 'overrides.steps'. Failure reason: -1 is less than or equal to the minimum of 0". Left empty,
    # a field is not sent and stays None.
    title: str | _Unset = _override("A new title (the run directory is named by it)")
    steps: Annotated[int, Field(gt=0)] | _Unset = _override("Training steps per arm (> 0)")
    n_eval: Annotated[int, Field(gt=0)] | _Unset = _override("Eval items, the first n of the test split (> 0)")
    lr: Annotated[float, Field(gt=0)] | _Unset = _override("Learning rate of every arm (> 0)")
    bandwidth: Annotated[float, Field(gt=0)] | _Unset = _override("Kernel bandwidth of the kernel arms (> 0)")
    base_model: str | _Unset = _override("Model id (hub id or local directory)")
    base_model_path: str | _Unset = _override("Where the local engine loads weights from (a path on the serving machine)")

    @model_serializer(mode="wrap")
    def _set_fields_only(self, handler):
        """Only the fields set: the empty overrides are `{}` (the run form's default, valid)."""
        return {k: v for k, v in handler(self).items() if v is not None}

    def is_empty(self) -> bool:
        return not self.model_dump(exclude_none=True)


def anchored(spec_json: dict, spec_dir: str | Path | None) -> dict:
    """A copy of the spec JSON that reads the same from any folder: each arm's relative
    `kernel_file` made absolute from `spec_dir`, the folder of the file it came from (a revision
    the pipeline writes elsewhere would otherwise lose its hill-climbed kernel)."""
    out = json.loads(json.dumps(spec_json))
    if spec_dir is None:
        return out
    for arm in out.get("arms", []) if isinstance(out.get("arms"), list) else []:
        file = arm.get("kernel_file") if isinstance(arm, dict) else None
        if isinstance(file, str) and not Path(file).expanduser().is_absolute():
            arm["kernel_file"] = str((Path(spec_dir) / file).resolve())
    return out


def set_arm_kernel(arm_json: dict, kernel: KernelSpec) -> None:
    """Make one arm of a spec JSON run `kernel`, written in full; a hill-climbed `kernel_file` is
    replaced by the recipe (an arm takes one or the other, and the revision reads the same from
    any folder). Its hash is unchanged: the spec's hashes already see the recipe, not the file."""
    arm_json.pop("kernel_file", None)
    arm_json["kernel"] = kernel.model_dump(mode="json")


def overrides_from(value: SpecOverrides | dict | None) -> SpecOverrides:
    """The overrides a run was started with (the UI's form sends a JSON object), or a UserError of
    one line naming each bad field, its value and its bound:
    "overrides.steps = -1: Input should be greater than 0"."""
    if isinstance(value, SpecOverrides):
        return value
    if value is None:
        return SpecOverrides()
    try:
        return SpecOverrides.model_validate(value)
    except ValidationError as e:
        problems = {}
        for err in e.errors():
            loc = [str(p) for p in err["loc"]]
            if loc[-1:] == ["none"] and len(loc) > 1:  # the left-out branch of a field: says nothing
                continue
            name = f"overrides.{loc[0]}" if loc else "overrides"
            shown = f" = {json.dumps(err['input'], default=str)}" if err["type"] != "extra_forbidden" else ""
            problems.setdefault(name, f"{name}{shown}: {err['msg']}")
        raise UserError("; ".join(problems.values()) or f"overrides: {e.errors()[0]['msg']}") from None


def apply_overrides(spec_json: dict, overrides: SpecOverrides, spec_dir: str | Path | None = None) -> dict:
    """The spec JSON with `overrides` applied and recorded; validated like any spec. `spec_dir`:
    the folder the spec was read from (its relative kernel files are taken from there)."""
    changes = overrides.model_dump(exclude_none=True)
    out = anchored(spec_json, spec_dir)
    for key in ("title", "steps", "base_model", "base_model_path"):
        if key in changes:
            out[key] = changes[key]
    if "n_eval" in changes:
        out.setdefault("eval", {})["n_examples"] = changes["n_eval"]
    for arm in out.get("arms", []):
        if "lr" in changes:
            arm["lr"] = changes["lr"]
    if "lr" in changes and isinstance(out.get("optimizer"), dict):
        out["optimizer"]["lr"] = changes["lr"]
    effective = (out.get("feasibility") or {}).get("effective_config")
    if isinstance(effective, dict):  # keep the feasibility record consistent with the revision
        for key, value in (("steps", changes.get("steps")), ("n_eval", changes.get("n_eval")), ("base_model", changes.get("base_model"))):
            if value is not None and key in effective:
                effective[key] = value
    if overrides.bandwidth is not None:
        # the kernel arms and their kernels as the rest of the revision parses them (a hill-climbed
        # file's too), each changed by its typed method and written back whole
        parsed = parse_spec(out, source="spec with overrides")
        for arm_json, arm in zip(out["arms"], parsed.arms):
            if "kernel" in arm.estimator.spec_fields:  # a kind whose recipe holds a kernel
                set_arm_kernel(arm_json, arm.kernel.with_bandwidth(overrides.bandwidth))
    if changes:
        out.setdefault("overrides", []).append(changes)
    parse_spec(out, source="spec with overrides")
    return out
