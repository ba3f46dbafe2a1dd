"""What the page says, as typed objects the templates lay out: the headline, the spec's facts, the
arms, the decision's numbers with their meaning, one table per gate, the stage table, the plots.

    page = build_page(data, statuses, plots)      # Page; rendered by report.render
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from design.arm import ArmConfig
from report.model import Decision, GateTable, RunData
from report.palette import PENDING_COLOUR, STOPPED_COLOUR, verdict_colour
from report.plots import RenderedPlot
from report.status import Status, StageStatus, stop_message
from rules import rule_for
from schemas.cost import ArmCost
from schemas.gate_text import fmt, is_gate_failure

# Stage status -> (badge text, CSS class in report.css)
BADGES = {
    Status.PASSED: ("PASSED", "pass"),
    Status.FAILED: ("FAILED", "fail"),
    Status.DONE: ("DONE", "done"),
    Status.SKIPPED: ("SKIPPED", "skip"),
    Status.NOT_RUN: ("NOT RUN", "notrun"),
    Status.INCOMPLETE: ("INCOMPLETE", "incomplete"),
    Status.EARLIER_RUN: ("EARLIER RUN", "notrun"),
}


@dataclass(frozen=True)
class Headline:
    label: str  # the verdict in capitals, or why there is none
    colour: str
    text: str

    @property
    def line(self) -> str:
        return f"{self.label}: {self.text}"


@dataclass(frozen=True)
class StageRow:
    title: str
    badge: str
    badge_class: str
    detail: str
    failed: bool


@dataclass(frozen=True)
class ArmRow:
    """One arm as the Arms table shows it (column headings in ARM_COLUMNS)."""

    arm: str
    role: str
    advantage: str
    per_step: str
    steps: str
    lr: str
    lora_rank: str
    max_tokens: str
    temperature: str
    seed: str
    kernel: str


# (heading, ArmRow field, right-aligned number)
ARM_COLUMNS = (
    ("arm", "arm", False),
    ("role", "role", False),
    ("advantage", "advantage", False),
    ("prompts × rollouts per step", "per_step", False),
    ("steps", "steps", True),
    ("lr", "lr", True),
    ("LoRA rank", "lora_rank", True),
    ("max tokens", "max_tokens", True),
    ("temperature", "temperature", True),
    ("seed", "seed", True),
    ("kernel", "kernel", False),
)


@dataclass(frozen=True)
class ComparisonRow:
    """One arm in the comparison table: accuracy, its paired difference from the baseline with the
    rule's bounds, the verdict, and its training cost relative to the baseline's."""

    arm: str
    role: str
    accuracy: str
    difference: str
    interval: str
    holm_p: str
    verdict: str
    wall: str
    sampler_tokens: str
    trainer_tokens: str
    model_calls: str
    critic_share: str


# (heading, ComparisonRow field)
COMPARISON_COLUMNS = (
    ("arm", "arm"),
    ("role", "role"),
    ("accuracy", "accuracy"),
    ("difference vs baseline", "difference"),
    ("the rule's bounds", "interval"),
    ("Holm p (noninferior)", "holm_p"),
    ("verdict", "verdict"),
    ("wall time", "wall"),
    ("sampler tokens", "sampler_tokens"),
    ("trainer tokens", "trainer_tokens"),
    ("model calls", "model_calls"),
    ("critic share", "critic_share"),
)


@dataclass(frozen=True)
class ComparisonView:
    rows: tuple[ComparisonRow, ...] = ()
    note: str = ""  # what the table's numbers are
    costs: tuple[tuple[str, ...], ...] = ()  # per unit: unit, steps, wall s, sampler tokens, trainer tokens, calls

    @property
    def shown(self) -> bool:
        return bool(self.rows or self.costs)


COST_COLUMNS = ("unit", "steps", "wall seconds", "sampler tokens", "trainer tokens", "model calls", "critic seconds")


@dataclass(frozen=True)
class GateSection:
    heading: str
    table: GateTable
    measures: tuple[str, ...]  # per check, what the spec says it measures ('' when it does not)

    @property
    def passed(self) -> bool:
        return self.table.passed

    @property
    def observed_label(self) -> str:
        return self.table.stage.observed_label

    @property
    def with_measures(self) -> bool:
        return any(self.measures)

    @property
    def rows(self):
        return list(zip(self.table.checks, self.measures))

    @property
    def detail(self):
        """The gate's detail table when it has rows (an audit's mismatches), else None."""
        detail = self.table.detail
        return detail if detail is not None and detail.rows else None


@dataclass(frozen=True)
class DecisionView:
    """The decision section: this run's verdict with its numbers, an earlier run's, or why none."""

    verdict: str | None = None  # this run's
    lines: tuple[tuple[str, str], ...] = ()  # (quantity, value and meaning)
    earlier: str | None = None  # a decision.json on file from an earlier run
    missing: str | None = None  # why there is no decision


@dataclass(frozen=True)
class Page:
    title: str
    run_dir_name: str
    headline: Headline
    problems: tuple[str, ...]
    stages: tuple[StageRow, ...]
    facts: tuple[tuple[str, str], ...]
    arms: tuple[ArmRow, ...]
    decision: DecisionView
    comparison: ComparisonView
    gates: tuple[GateSection, ...]
    gates_missing: tuple[tuple[str, str], ...]  # (gate heading, why it has no table)
    plots: tuple[RenderedPlot, ...]
    reused: str = ""  # which stages this run served from cache, in one line ('' when none or not known)
    revisions: tuple[str, ...] = ()  # each edit of the spec in this directory, one line each


def reused_text(data: RunData) -> str:
    """'Reused from cache (inputs unchanged): correctness preflight, pilot, ...'."""
    return f"Reused from cache (inputs unchanged): {', '.join(data.reused)}" if data.reused else ""


def revision_lines(data: RunData) -> list[str]:
    """'revision 1 (2026-11-30T23:40:00+00:00): activation_gate.checks[pilot_mean_reward].min 0.95 -> 0.1'."""
    return [
        f"revision {r.number} ({r.at}, {r.old_spec_hash} -> {r.new_spec_hash}): "
        + "; ".join(f"{c.field} {json.dumps(c.old)} -> {json.dumps(c.new)}" for c in r.changes)
        for r in data.spec_revisions
    ]


def headline(data: RunData, statuses: list[StageStatus]) -> Headline:
    """The verdict line: the decision when there is one, else where and why the flow stopped."""
    d = data.decision
    stop = stop_message(data)  # the flow's own message for the gate that stopped it, from its records
    if data.stopped:
        earlier = " A decision.json in this directory is from an earlier run, not this one." if d else ""
        gate_stop = is_gate_failure(data.stopped)
        label = "NO DECISION: STOPPED AT A GATE" if gate_stop else "NO DECISION: THE RUN FAILED"
        why = stop if gate_stop and stop else data.stopped
        return Headline(label, STOPPED_COLOUR, f"This run ended Failed: {why}.{earlier}")
    if d and d.family and d.holm_p_noninferior is not None:
        others = f"; {d.family.m - 1} other arm(s) in the comparison table" if d.family.m > 1 else ""
        return Headline(
            d.verdict.upper(), verdict_colour(d.verdict),
            f"{d.treatment} − {d.baseline} accuracy: mean difference {d.mean_diff:+.4f} over {d.n} items x "
            f"{len(d.seeds)} seed(s); Holm-adjusted p {fmt(d.holm_p_noninferior)} (noninferior) and "
            f"{fmt(d.holm_p_inferior)} (inferior) against α={d.alpha:g}, margin {d.margin:+.4f}{others}.",
        )
    if d:
        how = {
            "noninferior": f"the lower bound {d.lower:+.4f} is above the margin {d.margin:+.4f}",
            "inferior": f"the upper bound {d.upper:+.4f} is below the margin {d.margin:+.4f}",
            "inconclusive": f"the margin {d.margin:+.4f} lies between the bounds [{d.lower:+.4f}, {d.upper:+.4f}]",
        }.get(d.verdict, "")
        return Headline(
            d.verdict.upper(), verdict_colour(d.verdict),
            f"{d.treatment} − {d.baseline} accuracy: mean difference {d.mean_diff:+.4f}; {how} "
            f"({d.rule.method}, n={d.n}, α={d.alpha:g}).",
        )
    if stop:
        return Headline("NO DECISION: STOPPED AT A GATE", STOPPED_COLOUR, f"This run ended Failed: {stop}.")
    last = next((s for s in reversed(statuses) if s.status not in (Status.NOT_RUN, Status.SKIPPED)), statuses[0])
    return Headline(
        "NO DECISION YET", PENDING_COLOUR,
        f"No stage failed a gate; the last stage with a record is {last.title} ({last.status}). "
        "The flow may still be running, or stopped with an error (see the flow run's logs).",
    )


def earlier_decision_text(d: Decision) -> str:
    """For a run that ended Failed: the decision.json on file is an earlier run's."""
    return (f"No decision in this run (it ended Failed). This directory holds an earlier run's decision.json: "
            f"{d.verdict.upper()}, mean difference {d.mean_diff:+.4f}, n={d.n}.")


def decision_lines(d: Decision) -> list[tuple[str, str]]:
    """The decision's numbers, each with a one-line explanation."""
    lines = [
        ("mean difference", f"{d.mean_diff:+.4f}: mean over {d.n} paired eval items of (treatment correct − baseline correct)"),
        (d.rule.bounds_name, f"[{d.lower:+.4f}, {d.upper:+.4f}]: one-sided bounds at α={d.alpha:g} each ({d.rule.method}: "
                             f"{d.rule.summary}); they cover {d.rule.covers}"),
        ("margin", f"{d.margin:+.4f}: the pre-registered noninferiority margin"),
        ("n", f"{d.n} eval items answered by both arms"),
    ]
    if d.treatment_mean is not None and d.baseline_mean is not None:
        lines.append(("arm accuracies", f"{d.treatment} {d.treatment_mean:.4f}, {d.baseline} {d.baseline_mean:.4f}"))
    if d.bootstrap_lower is not None and d.bootstrap_upper is not None:
        boot = d.bootstrap_ci
        confidence = boot.confidence if boot and boot.confidence is not None else 1 - 2 * d.alpha
        resamples = boot.n_resamples if boot and boot.n_resamples is not None else "n/a"
        lines.append(("bootstrap CI", f"[{d.bootstrap_lower:+.4f}, {d.bootstrap_upper:+.4f}]: percentile CI at {confidence:.0%} "
                      f"from {resamples} paired resamples over items; descriptive, does not decide"))
    if d.mcnemar_p is not None:
        mc = d.mcnemar
        b, c, n = (("?" if v is None else v) for v in ((mc.b, mc.c, mc.n_discordant) if mc else (None, None, None)))
        lines.append(("McNemar p", f"{d.mcnemar_p:.4g}: exact two-sided test of any difference on the {n} items the arms disagree on "
                      f"({b} only treatment right, {c} only baseline right); not a noninferiority test"))
    if d.family and d.holm_level is not None:
        lines.append(("Holm", f"adjusted p {fmt(d.holm_p_noninferior)} (noninferior), {fmt(d.holm_p_inferior)} (inferior): "
                      f"{d.family.statement} At Holm's level {fmt(d.holm_level)} for this arm the bounds are "
                      f"[{d.holm_lower:+.4f}, {d.holm_upper:+.4f}]; the verdict is Holm's"))
    if d.seeds and len(d.seeds) > 1:
        lines.append(("seeds", f"{', '.join(map(str, d.seeds))}: each item's difference is paired within a seed and averaged over seeds"))
    if d.noninferior_threshold is not None:
        lines.append(("smallest detectable", f"{d.noninferior_threshold:+.4f}: the smallest observed difference the rule calls "
                      f"noninferior at n={d.n}" + (" (at the pre-registered between-seed spread)" if d.rule.seed_aware else "")))
    return lines


def _kernel_text(data: RunData, arm: ArmConfig) -> str:
    k = arm.kernel  # held by the recipe of a kind with a kernel
    if k is None:
        return "—"
    bw = fmt(k.bandwidth)
    if data.revision and data.revision.arm == arm.name:
        bw = f"{bw} → {fmt(data.revision.bandwidth)} (calibration)"
    return f"{k.family}, h={bw}, window {k.window}, features {', '.join(k.features)}"


def arm_rows(data: RunData) -> list[ArmRow]:
    return [
        ArmRow(
            arm=arm.name, role=data.role(arm.name) or "", advantage=str(arm.advantage),
            per_step=f"{arm.groups_per_batch} × {arm.group_size} = {arm.batch_size}",
            steps=fmt(arm.steps), lr=fmt(arm.lr), lora_rank=fmt(arm.lora_rank), max_tokens=fmt(arm.max_tokens),
            temperature=fmt(arm.temperature), seed=fmt(arm.seed), kernel=_kernel_text(data, arm),
        )
        for arm in data.plan.arms
    ]


def spec_facts(data: RunData) -> list[tuple[str, str]]:
    plan = data.plan
    run, rule, budget = plan.run, plan.decision, plan.budget
    facts = [
        ("title", plan.title),
        ("model", f"{run.base_model} (renderer {run.renderer})"),
        ("environment", str(run.env)),
        ("treatment vs baseline", f"{run.treatment} vs {run.baseline}"),
        ("eval items", fmt(plan.n_eval)),
        ("decision rule", f"{rule.method} at α={fmt(rule.alpha)}, margin {fmt(rule.margin)}: {rule_for(rule.method).summary}"),
        ("budget", f"{fmt(budget.max_wall_minutes)} wall minutes, {fmt(budget.gpu_hours)} GPU hours"),
    ]
    power = plan.power_reading()
    if power is not None:  # the feasibility stage records the same reading (feasibility.json's `power`)
        facts.append(("power (before any GPU time)", power.summary()))
    if data.spec.hypothesis:
        facts.append(("hypothesis", data.spec.hypothesis))
    return facts


def _ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}×"


def _arm_cost(data: RunData, arm: str) -> ArmCost | None:
    costs = [data.costs[u.unit] for u in data.plan.units_of(arm) if u.unit in data.costs]
    return ArmCost.summed(arm, costs) if costs else None


def _arm_accuracy(data: RunData, arm: str) -> float | None:
    accs = [data.evals[u.unit].accuracy for u in data.plan.units_of(arm) if u.unit in data.evals]
    return sum(accs) / len(accs) if accs else None


def comparison_view(data: RunData) -> ComparisonView:
    """Every arm against the baseline: the decision's numbers (this run's), and the cost of each
    arm's training summed over its seeds, divided by the baseline's."""
    baseline = data.plan.run.baseline
    d = data.decision if data.decision and not data.stopped else None
    pairs = {c.arm: c for c in d.comparisons} if d else {}
    if d and not pairs and d.treatment:  # a two-arm decision: its one pair
        pairs = {d.treatment: d}
    base_cost = _arm_cost(data, baseline)
    rows = []
    for arm in [baseline, *[a for a in data.plan.compared if a != baseline]]:
        pair = pairs.get(arm)
        acc = _arm_accuracy(data, arm)
        cost = _arm_cost(data, arm)
        rel = cost.relative_to(base_cost) if cost and base_cost else {}
        holm = getattr(pair, "holm_p_noninferior", None) if pair else None
        critic = "—" if not cost or cost.critic_seconds is None else f"{cost.critic_seconds / cost.wall_seconds:.0%} of wall"
        rows.append(ComparisonRow(
            arm=arm, role=data.role(arm) or "",
            accuracy="—" if acc is None else f"{acc:.4f}",
            difference="—" if pair is None else f"{pair.mean_diff:+.4f}",
            interval="—" if pair is None else f"[{pair.lower:+.4f}, {pair.upper:+.4f}]",
            holm_p="—" if holm is None else f"{holm:.3g}",
            verdict="" if pair is None else pair.verdict,
            wall=_ratio(rel.get("wall_seconds")), sampler_tokens=_ratio(rel.get("sampler_tokens")),
            trainer_tokens=_ratio(rel.get("trainer_tokens")), model_calls=_ratio(rel.get("model_calls")),
            critic_share=critic,
        ))
    seeds = len(data.plan.seeds)
    note = (f"Accuracy: mean over {seeds} seed(s). Difference: the arm minus {baseline}, paired within each seed over the "
            f"same eval items, with the one-sided {rule_for(data.plan.decision.method).bounds_name} at "
            f"α={fmt(data.plan.decision.alpha)} each (rule {data.plan.decision.method}). Costs: the arm's training "
            "(every seed) divided by the baseline's.")
    if d and d.family:
        note += f" {d.family.statement}"
    costs = tuple(
        (u, fmt(c.steps), f"{c.wall_seconds:.1f}", str(c.sampler_tokens), str(c.trainer_tokens), str(c.model_calls),
         "—" if c.critic_seconds is None else f"{c.critic_seconds:.1f}")
        for u, c in data.costs.items()
    )
    if not pairs and not costs:
        return ComparisonView()
    return ComparisonView(rows=tuple(rows), note=note, costs=costs)


def gate_sections(data: RunData) -> list[GateSection]:
    """One per gate stage with a gate_report on file, in flow order."""
    out = []
    for stage in data.gate_stages:
        table = data.gates.get(stage.key)
        if table is None:
            continue
        measures = []
        for check in table.checks:
            plan = data.check_for(check.metric)
            measures.append(plan.measures if plan else "")
        out.append(GateSection(stage.heading, table, tuple(measures)))
    return out


def _decision_view(data: RunData, statuses: list[StageStatus]) -> DecisionView:
    d = data.decision
    if d and data.stopped:
        return DecisionView(earlier=earlier_decision_text(d))
    if d:
        return DecisionView(verdict=d.verdict.upper(), lines=tuple(decision_lines(d)))
    why = next(s for s in statuses if s.key == "decision").detail.removeprefix("not run: ")
    return DecisionView(missing=f"No decision: {why}.")


def build_page(data: RunData, statuses: list[StageStatus], plots: list[RenderedPlot]) -> Page:
    gate_keys = {s.key for s in data.gate_stages}
    return Page(
        title=data.plan.title or data.run_dir.name,
        run_dir_name=data.run_dir.name,
        headline=headline(data, statuses),
        problems=tuple(data.problems),
        stages=tuple(StageRow(s.title, *BADGES[s.status], s.detail, s.status == Status.FAILED) for s in statuses),
        facts=tuple(spec_facts(data)),
        arms=tuple(arm_rows(data)),
        decision=_decision_view(data, statuses),
        comparison=comparison_view(data),
        gates=tuple(gate_sections(data)),
        gates_missing=tuple((s.stage.heading, s.detail) for s in statuses if s.key in gate_keys and s.key not in data.gates),
        plots=tuple(plots),
        reused=reused_text(data),
        revisions=tuple(revision_lines(data)),
    )
