"""The run plan: what the spec means for each stage, typed. Written to `spec/plan.json`.

`plan_from_spec` builds it once from a validated spec; the flow hands each stage its
slice (a stage's cache key is its slice, so changing a gate bound re-keys only the gate).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from rules.power import PowerDesign, PowerReading, power_reading
from rules.registry import RuleSettingsUnion, rule_for

from design.arm import ArmConfig
from design.spec import (Budget, CorrectnessPreflight, ExperimentSpec, GateCheck, Pilot, baseline_arm, compared_arms, eval_items,
                         treatment_arm)
from schemas.errors import UserError


class _Plan(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RunContext(_Plan):
    """What every arm-running stage needs, and nothing a gate bound could change."""

    env: str
    env_options: dict[str, Any]
    renderer: str | None
    base_model: str
    treatment: str
    baseline: str


class DecisionPlan(_Plan):
    alpha: float
    margin: float
    bounds: tuple[float, float]
    criterion: str
    method: str  # the rule (rules.registry); `rule` holds its settings
    # Every arm decided against the baseline (spec order); more than one: Holm over them.
    # Empty in a plan written before multi-arm specs: the treatment alone.
    compared: tuple[str, ...] = ()
    rule: RuleSettingsUnion = None  # filled from `method` in a plan written before rules had settings
    power: PowerDesign | None = None  # the spread the power reading assumes (None: a plan from before)

    @model_validator(mode="before")
    @classmethod
    def _rule_of_method(cls, data):
        if isinstance(data, dict) and data.get("rule") is None and "method" in data:
            data = {**data, "rule": {"method": data["method"]}}
        return data

    @model_validator(mode="after")
    def _one_method(self):
        if self.rule.method != self.method:
            raise ValueError(f"rule settings are {self.rule.method}'s, the plan's method is {self.method}")
        return self

    @classmethod
    def of_spec(cls, spec: ExperimentSpec) -> DecisionPlan:
        """What the spec's decision_rule means for the decision stage (its first criterion)."""
        rule, criterion = spec.decision_rule, spec.decision_rule.criteria[0]
        return cls(alpha=rule.alpha, margin=criterion.margin, bounds=tuple(criterion.bounds), criterion=criterion.id,
                   method=rule.method, rule=rule.settings, compared=tuple(a.name for a in compared_arms(spec)),
                   power=rule.power_design(n) if (n := eval_items(spec)) else None)

    def power_design(self, n_eval: int) -> PowerDesign:
        """The plan's power design (the measured defaults at n_eval items for a plan from before)."""
        return self.power or PowerDesign(n_eval=n_eval)

    def power_reading(self, n_eval: int | None, seeds: int, items: tuple[int, ...] = (),
                      rule: str | None = None) -> PowerReading | None:
        """What this rule (or `rule`) can tell at the eval items, `seeds` seeds and the margin, with
        the design table over `items` (the plan's own when empty); None without an item count."""
        if self.power is None and not n_eval:
            return None
        design = self.power_design(n_eval)
        the_rule = rule_for(rule or self.method)
        settings = self.rule if the_rule.method == self.method else the_rule.settings()
        return power_reading(the_rule, settings, n=design.n_eval, seeds=seeds, alpha=self.alpha, margin=self.margin,
                             compared=max(len(self.compared), 1), design=design, bounds=tuple(self.bounds),
                             items=items or (design.n_eval,))


class RunPlan(_Plan):
    title: str
    run: RunContext
    arms: tuple[ArmConfig, ...]
    pilot: Pilot
    checks: tuple[GateCheck, ...]
    n_eval: int
    decision: DecisionPlan
    budget: Budget
    preflight: CorrectnessPreflight
    revised_spec: str | None = None  # set when the pre-registered calibration revised the spec
    seeds: tuple[int, ...] = (0,)  # decision_rule.seeds: every arm runs once per seed when several

    @property
    def compared(self) -> tuple[str, ...]:
        """The arms decided against the baseline."""
        return self.decision.compared or (self.run.treatment,)

    @property
    def multi_seed(self) -> bool:
        return len(self.seeds) > 1

    def units(self) -> tuple[ArmConfig, ...]:
        """Every arm at every seed (arm-major): the arms themselves in a single-seed plan."""
        if not self.multi_seed:
            return self.arms
        return tuple(a.at_seed(s) for a in self.arms for s in self.seeds)

    def selected_units(self, names: list[str] | None) -> tuple[ArmConfig, ...]:
        """The units named (every unit when `names` is None), in plan order; an unknown name is a
        UserError listing the plan's units."""
        every = self.units()
        if names is None:
            return every
        known = {u.unit for u in every}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise UserError(f"units: no unit {unknown[0]!r} in this spec (its units: {', '.join(u.unit for u in every)})")
        if not names:
            raise UserError("units: name at least one unit")
        return tuple(u for u in every if u.unit in set(names))

    def units_of(self, arm: str) -> tuple[ArmConfig, ...]:
        return tuple(u for u in self.units() if u.name == arm)

    def arm(self, name: str) -> ArmConfig:
        return next(a for a in self.arms if a.name == name)

    @property
    def treatment(self) -> ArmConfig:
        return self.arm(self.run.treatment)

    @property
    def baseline(self) -> ArmConfig:
        return self.arm(self.run.baseline)

    @property
    def steps(self) -> int:
        return self.arms[0].steps

    def power_reading(self, items: tuple[int, ...] = (), rule: str | None = None) -> PowerReading | None:
        """What the plan's rule (or `rule`) can tell at its eval items, seeds and margin, before any
        GPU time (`DecisionPlan.power_reading`)."""
        return self.decision.power_reading(self.n_eval, len(self.seeds), items, rule)

    def calibrated(self, bandwidth: float) -> RunPlan:
        """This plan with the treatment's kernel at the calibrated bandwidth: the one place the
        calibration changes a plan (the calibration pilot, its audit, the revised spec and the
        training arms all read what this returns)."""
        arms = tuple(a.with_kernel_bandwidth(bandwidth) if a.name == self.run.treatment else a for a in self.arms)
        return self.model_copy(update={"arms": arms})


def plan_from_spec(spec: ExperimentSpec) -> RunPlan:
    """The run plan: every stage's inputs, typed. Each arm holds its kind's recipe, read from the
    spec's arm by the kind itself (`Estimator.recipe_of`): a kernel arm its validated KernelSpec and
    the kernel file it came from."""
    arms = tuple(
        ArmConfig(
            name=arm.name, recipe=arm.estimator.recipe_of(arm), group_size=arm.group_size,
            groups_per_batch=arm.groups_per_batch,
            lr=arm.lr, seed=arm.seed, steps=spec.steps, lora_rank=spec.lora_rank, base_model=spec.base_model,
            base_model_path=spec.base_model_path, max_tokens=spec.sampling.max_tokens,
            temperature=spec.sampling.temperature,
        )
        for arm in spec.arms
    )
    return RunPlan(
        title=spec.title,
        run=RunContext(
            env=spec.dataset.name, env_options=dict(spec.dataset.options), renderer=spec.renderer,
            base_model=spec.base_model, treatment=treatment_arm(spec).name, baseline=baseline_arm(spec).name,
        ),
        arms=arms,
        pilot=spec.pilot,
        checks=tuple(spec.activation_gate.checks),
        n_eval=spec.eval.n_examples,
        decision=DecisionPlan.of_spec(spec),
        budget=spec.budget,
        preflight=spec.correctness_preflight,
        seeds=tuple(spec.decision_rule.seeds),
    )


# ---------------------------------------------------------------------------------------------
# What the arm-running stages hand on (file paths under the run directory)


class PilotLogs(_Plan):
    """A pilot stage's logs: the two arms' rollouts, the held-out samples, the timings."""

    dir: str
    treatment: str
    baseline: str
    heldout: str
    timings: str

    def rollouts(self, arms: tuple[ArmConfig, ...], plan_run: RunContext) -> list[str]:
        """The rollout logs of `arms` (treatment or baseline), in their order."""
        return [self.treatment if a.name == plan_run.treatment else self.baseline for a in arms]


class PilotArmRun(_Plan):
    """One arm's finished part of a pilot stage, as `pilot_arm.json` in its folder records it
    (`RunLayout.pilot_arm_record`): what it measured and the logs it left, with `inputs`, the
    digest of what it ran (the arm, the pilot's settings, the run context, the backend, its role).
    A pilot stage run again after it failed (a Retry after the calibration's wall cap, an arm that
    crashed beside a finished one) reuses an arm whose record names the same inputs and whose logs
    still verify: its finished steps are not run again, and its measured times still count."""

    inputs: str
    steps: int  # the steps it logged
    setup_seconds: float
    step_seconds: float  # mean seconds per step
    wall_seconds: float  # the arm's own wall time: clients, steps, held-out samples, eval timing
    rollouts: str
    rollouts_digest: str
    steps_digest: str  # of its per-step logs
    heldout: str | None = None  # the treatment's held-out samples
    heldout_digest: str | None = None
    eval_seconds_per_item: float | None = None


class TrainedArm(_Plan):
    arm: str  # the unit: the arm's name, or `<arm>-s<seed>` in a multi-seed run
    sampler_path: str
    rollouts: str
    metrics: str
    sampler_digest: str  # content hash of the sampler weights: eval keys on the weights themselves
    costs: str | None = None  # its arm_costs record
    # how its numbers were made (engine.determinism.Numerics.record): whether a rerun repeats it
    numerics: dict | None = None


class EvalResult(_Plan):
    arm: str  # the unit, as in TrainedArm
    jsonl: str
    parquet: str
    accuracy: float


def unit_groups(units: tuple[ArmConfig, ...], groups: int | None) -> tuple[tuple[ArmConfig, ...], ...]:
    """`units` in `groups` groups for a dispatched sweep, one flow run (one process, one base, one
    worker's GPU) a group: whole seeds dealt round-robin (seed k to group k mod groups, in the order
    the seeds come), so that every arm of a seed trains on one GPU beside the others -- their samples
    batch together and their wall times compare side by side -- and the groups differ by at most one
    seed. More groups than seeds: the units themselves dealt round-robin. None: one unit a group (a
    flow run a unit, as a sweep over machines of one unit each runs). Each group keeps plan order."""
    if groups is None:
        return tuple((u,) for u in units)
    if groups < 1:
        raise UserError(f"dispatch groups: {groups}: at least 1")
    seeds = list(dict.fromkeys(u.order_seed for u in units))
    if groups <= len(seeds):
        group_of = {u.unit: seeds.index(u.order_seed) % groups for u in units}
    else:
        group_of = {u.unit: k % groups for k, u in enumerate(units)}
    dealt = tuple(tuple(u for u in units if group_of[u.unit] == g) for g in range(groups))
    return tuple(group for group in dealt if group)
