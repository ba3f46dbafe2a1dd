"""A sweep gathered unit by unit: what `gs1 decide --spec SPEC --units DIR [--collect RUN_DIR]` does.

A spec of many arms and seeds can outgrow one machine session. Its units (arm x seed) then run a
few at a time (`gs1 run SPEC --units grpo_gs8-s0,critic-s0`, each run passing the same gates), and
each finished unit is copied into one units folder (`schemas.layout.UnitsLayout`, committed as it
lands) with its proof (`unit.json`, `schemas.unit_proof.UnitProof`). Every read checks each unit
against its proof and the spec first (`check_units`) and computes everything before it writes; the
decision and reading folders are written whole. From that folder:

- every unit in: the family decision, written by the decision stage's own writer
  (`decision.records.write_family_decision`), so it is the decision the flow would have made;
- units missing: no decision. The comparison table shows, per arm, the seeds it has in common with
  the baseline so far and an interim paired difference with the rule's unadjusted bounds (none while
  the rule cannot read that few seeds), marked as such, and the folder says which units are still missing;
- `--rule R`: a secondary reading of the complete folder under another rule (`write_reading`), in
  `readings/<R>/`, labelled as such: the pre-registered rule's decision stays the decision.

Costs in the table are each arm's training over those common seeds divided by the baseline's over
the same seeds (a ratio of unequal seed sets would mislead). Wall time depends on how many units
shared the GPU, so its ratio is taken only over the seeds at which the arm's units trained side by
side with the baseline's (their steps' wall-clock spans overlap on one device, as units of one
`gs1 run --units` on one GPU do; each unit's cost record names its device). Beside the
pre-registered table: the treatment against each other arm (secondary, descriptive), what the rule
can tell at this number of items, and plots (`report.plots.UNITS_PLOT_SPECS`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from decision.records import family_markdown, family_record, write_decision_files
from design.arm import ArmConfig
from design.plan import RunPlan, plan_from_spec
from design.revision import experiment_hash
from design.spec import ExperimentSpec, anchored, eval_items, parse_spec
from report.plots import UNITS_PLOT_SPECS, RenderedPlot, render_plots
from report.render import write_plots
from report.units_model import ArmStanding, UnitSharing, UnitsStanding, VersusArm, seeds_text
from rules import rule_for
from schemas.artifacts import COMPARISONS, write_artifact
from schemas.cost import ArmCost
from schemas.errors import EvalDataError, UnitProofError, UserError
from schemas.io import (compact_copy, file_sha256, loads_strict, replace_dir_atomic, write_bytes_atomic, write_json_atomic,
                        write_text_atomic)
from schemas.layout import (COSTS_FILE, EVAL_JSONL_FILE, STEP_METRICS_FILE, UNIT_EVAL_FILES, UNIT_TRAIN_FILES,
                            DecisionFiles, RunLayout, UnitsLayout, gate_record_folders)
from schemas.unit_proof import COLLECTED, PROOF_FILE, UnitProof, item_ids_digest

# The files of a unit the folder's reading reads: a proof must list them (step metrics are optional:
# a folder from before they were kept has none).
READ_FILES = (EVAL_JSONL_FILE, COSTS_FILE)

def collect_units(spec: ExperimentSpec, run: RunLayout, out: UnitsLayout, spec_dir: Path) -> list[str]:
    """Copy every finished unit of the run directory `run` (its eval file written) into the units
    folder `out`, and the run's gates' records beside them (`keep_gate_records`; also when no unit
    has finished, as for a run stopped after its gates); returns the units' names.
    Each unit's folder is written whole, with its proof (`unit.json`, `prove_unit`), into a temp
    sibling renamed into place: a unit folder is complete or absent. A run directory of another
    experiment (another `experiment_hash`) is refused.

    `spec_dir`: the folder of the spec file `spec` was read from. The run keeps the spec file as it
    was given (`spec/spec.json`), so a relative `kernel_file` in it is read from there."""
    run_dir = run.root
    ran = run.spec_json
    if not ran.is_file():
        raise UserError(f"--collect {run_dir}: not a run directory (no {ran})")
    theirs, ours = experiment_hash(_ran_spec(ran, spec_dir)), experiment_hash(spec)
    if theirs != ours:
        raise UserError(f"--collect {run_dir}: that run directory ran another experiment "
                        f"(identity {theirs}, this spec's is {ours})")
    plan = plan_from_spec(spec)
    source_run = run_dir.resolve().name
    collected = []
    for unit in plan.units():
        evaluated = run.eval_arm_dir(unit.unit)
        if not run.eval_jsonl(unit.unit).is_file():
            continue
        trained = run.train_arm_dir(unit.unit)
        lacking = [f for f in UNIT_TRAIN_FILES if not (trained / f).is_file()]
        if lacking:
            raise UserError(f"--collect {run_dir}: unit {unit.unit} has an eval file but no train/{unit.unit}/{lacking[0]}")

        def fill(folder: Path, unit: ArmConfig = unit, trained: Path = trained, evaluated: Path = evaluated) -> None:
            for name in UNIT_TRAIN_FILES:
                write_bytes_atomic(folder / name, compact_copy(trained / name))
            for name in UNIT_EVAL_FILES:
                write_bytes_atomic(folder / name, (evaluated / name).read_bytes())
            prove_unit(spec, unit, folder, source_run, where=f"--collect {run_dir}")

        replace_dir_atomic(out.unit_dir(unit.unit), fill)
        collected.append(unit.unit)
    keep_gate_records(run, out)
    return collected


def prove_unit(spec: ExperimentSpec, unit: ArmConfig, folder: Path, source_run: str, source: str = COLLECTED,
               where: str = "") -> UnitProof:
    """Write the proof of the unit whose files lie in `folder` (`unit.json`: every file there by its
    sha256, the eval file's item count and ids, the unit, the run and the experiment they came from)
    and return it. `where`: what a refusal names (an eval file that cannot be read)."""
    from rl.stats import read_eval_items

    try:
        items = read_eval_items(folder / EVAL_JSONL_FILE)
    except EvalDataError as e:
        raise UserError(f"{where + ': ' if where else ''}unit {unit.unit}: {e}") from None
    files = {p.name: file_sha256(p) for p in sorted(folder.iterdir()) if p.is_file() and p.name != PROOF_FILE
             and not p.name.startswith(".")}
    proof = UnitProof(unit=unit.unit, arm=unit.name, seed=unit.order_seed, source_run=source_run, source=source,
                      experiment_hash=experiment_hash(spec), items=len(items), item_ids_sha256=item_ids_digest(items),
                      files=files)
    write_text_atomic(folder / PROOF_FILE, proof.model_dump_json(indent=2) + "\n")
    return proof


@dataclass(frozen=True)
class CheckedUnits:
    """A units folder's units that passed their proofs (`check_units`), read once: what every
    reading of the folder (the standing, the decision, a secondary reading) reads."""

    root: Path
    present: tuple[ArmConfig, ...]  # in plan order
    missing: tuple[str, ...]
    evals: dict[str, dict[str, float]]  # unit -> item_id -> correct
    costs: dict[str, ArmCost]
    steps: dict[str, list[dict]]  # unit -> its step metrics rows in step order (none before they were kept)

    @property
    def complete(self) -> bool:
        return not self.missing

    def eval_file(self, unit: str) -> str:
        return str(UnitsLayout(self.root).eval_jsonl(unit))


def check_units(spec: ExperimentSpec, folder: UnitsLayout) -> CheckedUnits:
    """Read the units folder, every unit of `spec` against its proof: a unit whose folder is absent
    is missing (no decision yet); one that is there must hold a proof of that unit (arm, seed) from a
    run of this experiment, every file the proof lists with its sha256 and those the reading reads,
    and exactly the eval items the spec registers (`design.spec.eval_items`), the same items as
    every other unit. Anything else is a UnitProofError naming the unit (nothing is written)."""
    from rl.stats import read_eval_items
    from schemas.artifacts import read_rows

    plan = plan_from_spec(spec)
    identity, registered = experiment_hash(spec), eval_items(spec)
    present, missing = [], []
    evals, costs, steps = {}, {}, {}
    first: tuple[str, str] | None = None  # (unit, its items' digest): every unit holds the same items
    for unit in plan.units():
        name, here = unit.unit, folder.unit_dir(unit.unit)
        if not here.exists():
            missing.append(name)
            continue
        proof = _read_proof(folder, unit)
        if proof.experiment_hash != identity:
            raise UnitProofError(name, f"copied from a run of another experiment (identity {proof.experiment_hash}, "
                                       f"this spec's is {identity})")
        for needed in READ_FILES:
            if needed not in proof.files:
                raise UnitProofError(name, f"its proof lists no {needed}")
        for file, digest in proof.files.items():
            path = here / file
            if not path.is_file():
                raise UnitProofError(name, f"lacks {file} (collected from {proof.source_run}); collect the unit again")
            if file_sha256(path) != digest:
                raise UnitProofError(name, f"{file} is not the file collected from {proof.source_run} (its sha256 "
                                           "differs from the proof's); collect the unit again")
        try:
            items = read_eval_items(here / EVAL_JSONL_FILE)
        except EvalDataError as e:
            raise UnitProofError(name, str(e)) from None
        digest = item_ids_digest(items)
        if len(items) != proof.items or digest != proof.item_ids_sha256:
            raise UnitProofError(name, f"its eval file holds {len(items)} items, not the {proof.items} its proof names")
        if registered is not None and len(items) != registered:
            raise UnitProofError(name, f"holds {len(items)} eval items; the spec registers {registered} "
                                       "(eval.n_examples, else the benchmark's test set)")
        if first is None:
            first = (name, digest)
        elif digest != first[1]:
            raise UnitProofError(name, f"holds other eval items than {first[0]} (the units must be scored on the same items)")
        try:
            costs[name] = ArmCost.model_validate(read_rows("arm_costs", folder.costs_path(name))[0])
        except (UserError, IndexError, ValueError) as e:
            raise UnitProofError(name, f"{COSTS_FILE} cannot be read ({e})") from None
        steps[name] = _step_rows(folder.step_metrics_path(name)) if STEP_METRICS_FILE in proof.files else []
        evals[name] = items
        present.append(unit)
    return CheckedUnits(root=folder.root, present=tuple(present), missing=tuple(missing), evals=evals, costs=costs,
                        steps=steps)


def _read_proof(folder: UnitsLayout, unit: ArmConfig) -> UnitProof:
    """The unit's proof, checked to be of this unit (folder name, arm, seed)."""
    from pydantic import ValidationError

    path = folder.proof_json(unit.unit)
    if not path.is_file():
        raise UnitProofError(unit.unit, f"no proof ({PROOF_FILE}): its files were not collected by gs1 decide "
                                        "--collect, or not whole; collect the unit again")
    try:
        proof = UnitProof.model_validate(loads_strict(path.read_text(encoding="utf-8"), str(path)))
    except (UserError, ValidationError, UnicodeDecodeError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UnitProofError(unit.unit, f"its proof {PROOF_FILE} cannot be read ({first})") from None
    theirs, ours = (proof.unit, proof.arm, proof.seed), (unit.unit, unit.name, unit.order_seed)
    if theirs != ours:
        raise UnitProofError(unit.unit, f"its proof is of unit {proof.unit} (arm {proof.arm}, seed {proof.seed}), "
                                        f"not of {unit.unit} (arm {unit.name}, seed {unit.order_seed})")
    return proof


def _ran_spec(ran: Path, spec_dir: Path) -> ExperimentSpec:
    """The spec a run directory ran, its relative kernel files read from `spec_dir` (where the spec
    it was started with lay; the run's own copy sits elsewhere)."""
    return parse_spec(anchored(loads_strict(ran.read_text(encoding="utf-8"), str(ran)), spec_dir), str(ran))


def keep_gate_records(run: RunLayout, out: UnitsLayout) -> Path:
    """Copy the run's gates' records (`schemas.layout.gate_record_folders`) into
    `out/runs/<run folder name>/`: the units' evidence that they passed the same gates as any run."""
    kept = out.run_record_dir(run.root.resolve().name)
    for folder in gate_record_folders():
        source = run.root / folder
        if not source.is_dir():
            continue
        for path in sorted(p for p in source.rglob("*") if p.is_file()):
            write_bytes_atomic(kept / path.relative_to(run.root), path.read_bytes())
    return kept


def units_standing(plan: RunPlan, units: CheckedUnits) -> UnitsStanding:
    """The folder's standing from its checked units, and the decision's record once every unit is
    in (`write_units_decision` writes it); nothing is written here."""
    from rl.stats import describe_pair, read_pairs
    from rules import SeededPairs

    every = plan.units()
    present, missing = list(units.present), units.missing
    baseline, treatment = plan.run.baseline, plan.run.treatment
    decision = None
    if not missing:
        decision = family_record([units.eval_file(u.unit) for u in every], [(u.name, u.order_seed) for u in every],
                                 plan.decision, {"treatment": treatment, "baseline": baseline})
    final = {p["arm"]: p for p in decision["comparisons"]} if decision else {}

    evals, costs, steps = units.evals, units.costs, units.steps
    admit = {unit: _admit_rates(rows) for unit, rows in steps.items()}
    sharing = _gpu_sharing(steps, {unit: cost.device for unit, cost in costs.items()})

    def units_at(arm: str) -> dict[int, str]:
        return {u.order_seed: u.unit for u in present if u.name == arm}

    rule = plan.decision.rule

    def paired(arm: str, other: str, seeds: list[int]) -> dict:
        """arm minus other, items paired within each seed, under the plan's rule at the unadjusted
        alpha; where the rule cannot read that few seeds, the differences without bounds."""
        mine, theirs = units_at(arm), units_at(other)
        mine_by_seed = {s: evals[mine[s]] for s in seeds}
        theirs_by_seed = {s: evals[theirs[s]] for s in seeds}
        pairs = SeededPairs.of(mine_by_seed, theirs_by_seed, arm)
        by_seed = pairs.mean_diff_by_seed()
        if (why := rule_for(rule.method).seeds_problem(len(seeds))) is not None:
            t_R, b_R = pairs.seed_averaged()
            return {"method": rule.method, "n": pairs.n, "mean_diff": float(np.mean(t_R - b_R)), "lower": None,
                    "upper": None, "margin": plan.decision.margin, "why_no_bounds": why, "mean_diff_by_seed": by_seed,
                    **describe_pair(t_R, b_R, alpha=plan.decision.alpha)}
        record = read_pairs(pairs, alpha=plan.decision.alpha, margin=plan.decision.margin, bounds=plan.decision.bounds,
                            rule=rule, design=plan.decision.power)
        return {**record, "mean_diff_by_seed": by_seed}

    def summed_cost(arm: str, seeds: list[int]) -> ArmCost:
        return ArmCost.summed(arm, [costs[units_at(arm)[s]] for s in seeds])

    def wall_against(arm: str, other: str, seeds: list[int]) -> tuple[tuple[int, ...], float | None]:
        """The seeds at which arm's and other's units trained side by side, and arm's wall time over
        other's at those seeds: units that trained apart carried other loads on the GPU."""
        mine, theirs = units_at(arm), units_at(other)
        shared = [s for s in seeds if mine[s] in sharing and theirs[s] in sharing[mine[s]].beside]
        if not shared:
            return (), None
        return tuple(shared), summed_cost(arm, shared).wall_seconds / summed_cost(other, shared).wall_seconds

    base_units = units_at(baseline)
    arms = []
    for arm in [baseline, *[a for a in plan.compared if a != baseline]]:
        mine = units_at(arm)
        common = sorted(mine.keys() & base_units.keys())
        seed_accuracy = {s: float(np.mean(list(evals[u].values()))) for s, u in sorted(mine.items())}
        accuracy = float(np.mean(list(seed_accuracy.values()))) if mine else None
        pair = final.get(arm)
        if pair is None and arm != baseline and common:
            # unadjusted, over the seeds in so far: not the decision
            pair = {**paired(arm, baseline, common), "verdict": "interim"}
        cost = summed_cost(arm, common) if common else None
        base_cost = summed_cost(baseline, common) if common else None
        if arm == baseline:
            wall_seeds, wall_ratio = tuple(common), (1.0 if common else None)
        else:
            wall_seeds, wall_ratio = wall_against(arm, baseline, common)
        arms.append(ArmStanding(
            arm=arm, role="baseline" if arm == baseline else "treatment" if arm == treatment else "",
            seeds=tuple(sorted(mine)), common_seeds=tuple(common), accuracy=accuracy, seed_accuracy=seed_accuracy,
            rewards={s: tuple(float(r["reward_mean"]) for r in steps[u]) for s, u in sorted(mine.items()) if steps[u]},
            pair=pair, cost=cost,
            relative_cost=cost.relative_to(base_cost) if cost and base_cost else {},
            admit_rates={s: admit[u] for s, u in sorted(mine.items()) if admit[u]},
            wall_seeds=wall_seeds, wall_ratio=wall_ratio))
    versus = []
    for arm in [a for a in plan.compared if a not in (baseline, treatment)]:
        common = sorted(units_at(treatment).keys() & units_at(arm).keys())
        if common:
            wall_seeds, wall_ratio = wall_against(treatment, arm, common)
            versus.append(VersusArm(
                arm=arm, common_seeds=tuple(common), pair=paired(treatment, arm, common),
                relative_cost=summed_cost(treatment, common).relative_to(summed_cost(arm, common)),
                wall_seeds=wall_seeds, wall_ratio=wall_ratio))
    return UnitsStanding(present=tuple(u.unit for u in present), missing=missing, arms=tuple(arms), decision=decision,
                         sharing=tuple(sharing.values()), versus=tuple(versus))


def _step_rows(step_metrics: Path) -> list[dict]:
    """A unit's step metrics rows in step order (none for a folder from before they were kept)."""
    from schemas.artifacts import read_rows

    if not step_metrics.is_file():
        return []
    return sorted(read_rows("step_metrics", step_metrics), key=lambda r: r["step"])


def _gpu_sharing(steps: dict[str, list[dict]], devices: dict[str, str | None]) -> dict[str, UnitSharing]:
    """Which units trained side by side: a unit's span runs from its first step's start to its last
    step's end (`wall_time` is when a step ended, `step_seconds` how long it took), and two units
    whose spans overlap on one device shared the GPU (`devices`: each unit's cost record's; where
    either's is not known, overlapping is taken as sharing, as on one GPU). Units on two GPUs of one
    run trained at once but shared nothing. Units without step metrics are left out (not known)."""
    spans = {unit: (rows[0]["wall_time"] - rows[0]["step_seconds"], rows[-1]["wall_time"])
             for unit, rows in steps.items() if rows}

    def same_device(unit: str, other: str) -> bool:
        mine, theirs = devices.get(unit), devices.get(other)
        return mine is None or theirs is None or mine == theirs

    return {unit: UnitSharing(
        unit=unit, median_step_seconds=float(np.median([r["step_seconds"] for r in steps[unit]])),
        beside=tuple(other for other, (start, end) in spans.items()
                     if other != unit and start < spans[unit][1] and spans[unit][0] < end and same_device(unit, other)),
        device=devices.get(unit))
        for unit in spans}


def _admit_rates(rows: list[dict]) -> tuple[float, ...]:
    """A unit's trust-gate admit rate per step, from its step rows in step order (empty for a kind
    without a gate, or a folder from before step metrics were kept)."""
    rates = [r["trust_admit_rate"] for r in rows]
    return tuple(float(r) for r in rates) if rates and all(r is not None for r in rates) else ()


def _ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}x"


def _accuracy_cell(arm: ArmStanding) -> str:
    """The arm's mean accuracy over its seeds, and each seed's where there are two or more: the
    difference beside it is over the common seeds only, so a seed the baseline lacks shows here."""
    if arm.accuracy is None:
        return "—"
    if len(arm.seed_accuracy) < 2:
        return f"{arm.accuracy:.4f}"
    per_seed = "; ".join(f"s{seed} {acc:.4f}" for seed, acc in sorted(arm.seed_accuracy.items()))
    return f"{arm.accuracy:.4f} ({per_seed})"


def _wall_cell(seeds: tuple[int, ...], wall_seeds: tuple[int, ...], ratio: float | None) -> str:
    """A wall-time ratio over the seeds at which the two trained side by side, naming them when
    they are not all the common seeds; "ran apart" when there is none."""
    if not wall_seeds or ratio is None:
        return "ran apart"
    if wall_seeds == seeds:
        return _ratio(ratio)
    return f"{_ratio(ratio)} at {seeds_text(wall_seeds)}"


def standing_markdown(plan: RunPlan, standing: UnitsStanding, folder: UnitsLayout,
                      plots: Sequence[RenderedPlot] = ()) -> str:
    """The comparison table and what is still missing (comparison.md, and the block `gs1 decide
    --units` keeps in the folder's README), with links to `plots` (drawn into UnitsLayout.PLOTS_FOLDER)."""
    baseline = plan.run.baseline
    rule = rule_for(plan.decision.method)
    rows = []
    for a in standing.arms:
        p, cost, rel = a.pair, a.cost, a.relative_cost
        dash = "—"
        cells = [
            a.arm, a.role, ", ".join(map(str, a.seeds)) or dash,
            _accuracy_cell(a),
            dash if p is None else f"{p['mean_diff']:+.4f}",
            dash if p is None else _bounds_text(p),
            dash if p is None or "holm_p_noninferior" not in p else f"{p['holm_p_noninferior']:.3g}",
            "" if p is None else p["verdict"],
        ]
        if cost is None:
            cells += [dash] * 4
        else:
            critic = "" if cost.critic_calls is None else f"; critic {cost.critic_calls}"
            wall = _wall_cell(a.common_seeds, a.wall_seeds, a.wall_ratio)
            cells += [f"{cost.wall_seconds:.0f} s, {cost.wall_seconds / cost.steps:.1f} s/step ({wall})",
                      f"{cost.sampler_tokens} ({_ratio(rel.get('sampler_tokens'))})",
                      f"{cost.trainer_tokens} ({_ratio(rel.get('trainer_tokens'))})",
                      f"{cost.model_calls} ({_ratio(rel.get('model_calls'))}{critic})"]
        rows.append("| " + " | ".join(cells) + " |")
    alpha = plan.decision.alpha
    if standing.complete:
        status = (f"Every unit is in ({len(standing.present)}): the decision below is the pre-registered one, "
                  f"Holm over {len(plan.compared)} arm(s) (`decision/decision.md`). {standing.decision['family']['statement']}")
    else:
        status = (f"**No decision yet: {len(standing.missing)} of {len(standing.present) + len(standing.missing)} units "
                  f"are missing** ({', '.join(standing.missing)}). Each difference below is interim: paired over the "
                  f"seeds the arm and {baseline} both have so far, with the unadjusted one-sided {rule.bounds_name} at "
                  f"α={alpha:g} where the rule can read that many seeds; no verdict is drawn from it.")
    return (
        f"## Comparison against {baseline}\n\n{status}\n\n{_power_line(plan, standing)}"
        "Accuracy: mean over the arm's seeds in the folder, each seed's in brackets where there are two or more "
        "(a seed the baseline lacks counts here, not in the difference). Difference: arm minus baseline on the same eval items, "
        "paired within each common seed and averaged over seeds. Costs: training over the common seeds, and in "
        "brackets divided by the baseline's over the same seeds (the wall time's ratio is its steps' cost relative "
        "to the baseline's steps: every arm runs the same number; it is taken over the seeds at which the arm's units "
        "trained side by side with the baseline's, sharing the GPU alike, named when not every seed, and reads "
        "\"ran apart\" where there is none: see GPU sharing below). Model calls count the service requests; a critic's value model's share is named apart.\n\n"
        f"| arm | role | seeds in | accuracy | difference | {rule.bounds_name} | Holm p (noninferior) | verdict | "
        "wall time | sampler tokens | trainer tokens | model calls |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n\n"
        + _versus_table(plan, standing) + _readings_section(folder) + _plots_section(plots) + _sharing_table(standing)
        + _admit_table(standing) +
        f"Units in ({len(standing.present)}): {', '.join(standing.present) or 'none'}.\n\n"
        f"Units missing ({len(standing.missing)}): {', '.join(standing.missing) or 'none'}.\n"
    )


def answers_markdown(plan: RunPlan, standing: UnitsStanding) -> str:
    """The folder's answers, one bullet per question the comparison asks, each with its number and
    interval, read from the same standing as the table: the treatment against the baseline (the
    pre-registered decision once every unit is in, else interim); each other arm against the
    baseline and against the treatment, with training costs and a critic's share; and what the
    units cannot tell. Written at the top of comparison.md and between its own markers in README."""
    baseline, treatment = plan.run.baseline, plan.run.treatment
    arms = {a.arm: a for a in standing.arms}
    versus = {v.arm: v for v in standing.versus}
    n_units = len(standing.present) + len(standing.missing)
    head = ("## The answers (every unit in: the pre-registered decision)\n\n" if standing.complete else
            f"## The answers so far ({len(standing.present)} of {n_units} units in: interim)\n\n")
    t = arms.get(treatment)
    lines = []
    if t is None or t.pair is None:
        lines.append(f"- **Does {treatment} match {baseline} at the same rollout budget?** No unit pair in yet.")
    else:
        budget = (f"{plan.treatment.batch_size} rollouts a step each: {plan.treatment.group_size} and "
                  f"{plan.baseline.group_size} per prompt")
        lines.append(
            f"- **Does {treatment} match {baseline} at the same rollout budget** ({budget})? "
            f"{_verdict_text(t.pair)}: {treatment} {t.pair['treatment_mean']:.4f} against {baseline} "
            f"{t.pair['baseline_mean']:.4f}, "
            f"{treatment} − {baseline} = **{_interval_text(t.pair)}**{_holm_text(t.pair)}, {seeds_text(t.common_seeds)}"
            f"{_by_seed_text(t.pair)}.")
    for name in [a for a in plan.compared if a not in (baseline, treatment)]:
        a, v = arms[name], versus.get(name)
        if a.pair is None and v is None:
            lines.append(f"- **{name}** ({plan.arm(name).advantage}): no unit pair in yet.")
            continue
        parts = []
        if a.pair is not None:
            parts.append(f"against {baseline}: {name} {a.pair['treatment_mean']:.4f}, {name} − {baseline} = {_interval_text(a.pair)}"
                         f"{_holm_text(a.pair)} ({a.pair['verdict']}, {seeds_text(a.common_seeds)})")
        if v is not None:
            p = v.pair
            counts = p.get("mcnemar")
            items = f"; items right only in {treatment} / only in {name}: {counts['b']} / {counts['c']}" if counts else ""
            parts.append(
                f"{treatment} − {name} = {_interval_text(p)} (bootstrap [{p['bootstrap_lower']:+.4f}, "
                f"{p['bootstrap_upper']:+.4f}]{items}, {seeds_text(v.common_seeds)})")
            rel = v.relative_cost
            parts.append(
                f"training, {treatment} over {name}: wall time {_wall_cell(v.common_seeds, v.wall_seeds, v.wall_ratio)}, "
                f"trainer tokens {_ratio(rel.get('trainer_tokens'))}, model calls {_ratio(rel.get('model_calls'))}")
        if a.cost is not None and a.cost.critic_tokens is not None:
            c = a.cost
            parts.append(f"its value model: {c.critic_tokens / c.trainer_tokens:.0%} of its trainer tokens, "
                         f"{c.critic_calls} of its {c.model_calls} model calls, {c.critic_seconds:.0f} s of its "
                         f"{c.wall_seconds:.0f} s ({seeds_text(a.common_seeds)})")
        lines.append(f"- **{treatment} and {name}** ({plan.arm(name).advantage}): " + "; ".join(parts) + ".")
    paired_seeds = t.common_seeds if t is not None else ()
    reach_text = _reach_text(plan, _first_pair(standing), len(paired_seeds))
    lines.append(
        f"- **What the units cannot tell:** one model ({plan.run.base_model}), one benchmark ({plan.run.env}), "
        f"{plan.steps} steps, {len(paired_seeds)} of {len(plan.seeds)} seeds paired{'' if standing.complete else ' so far'} ({treatment} with "
        f"{baseline}). Only the comparisons against "
        f"{baseline} are pre-registered (Holm over {len(plan.compared)}); {treatment} against the other arms is "
        "descriptive and unadjusted. Wall times compare only between units that trained side by side." + reach_text)
    rule = rule_for(plan.decision.method)
    legend = (f"Brackets: one-sided {rule.bounds_name} at α={plan.decision.alpha:g} (rule {rule.method}: {rule.summary}), "
              "items paired within each seed (Holm's p where the decision is in); the bootstrap interval over items is "
              "descriptive. The tables below give every number's source.\n\n")
    return head + legend + "\n".join(lines) + "\n\n"


def _interval_text(p: dict) -> str:
    return f"{p['mean_diff']:+.4f} {_bounds_text(p)}"


def _bounds_text(p: dict) -> str:
    """The pair's bounds, or why it has none yet (the rule cannot read so few seeds)."""
    if p.get("lower") is None:
        return f"(no bounds yet: {p.get('why_no_bounds', 'not read')})"
    return f"[{p['lower']:+.4f}, {p['upper']:+.4f}]"


def _reach_text(plan: RunPlan, reach: dict | None, seeds: int) -> str:
    """What the rule can tell: the smallest observed difference it calls noninferior at the pair's
    items and seeds, or, while it cannot read that few seeds, at the spec's own (its power reading)."""
    if reach is None:
        return ""
    threshold, at = reach.get("noninferior_threshold"), f"{reach['n']} paired items and {seeds} seed(s)"
    if threshold is None:
        power = plan.power_reading()
        if power is None or power.noninferior_threshold is None:
            return ""
        threshold, at = power.noninferior_threshold, f"{power.n} items and all {power.seeds} seeds (once they are in)"
    tail = (": an arm as good as the baseline most likely reads inconclusive." if threshold > 0 else ".")
    return (f" At {at} the rule calls an arm noninferior (margin {reach['margin']:+.2f}) only when its observed "
            f"difference is above {threshold:+.4f}{_threshold_basis(plan)}{tail}")


def _threshold_basis(plan: RunPlan) -> str:
    """For a seed-aware rule the threshold moves with the observed spread: say which spread it is at."""
    if not rule_for(plan.decision.method).seed_aware:
        return ""
    design = plan.decision.power_design(plan.n_eval or 0)
    return f" (at the pre-registered between-seed SD {design.between_seed_sd:g})"


def _by_seed_text(p: dict) -> str:
    """Each seed's difference and the descriptive bootstrap interval, in brackets: how far the seeds
    agree, and the interval a reader who does not need the rule's guarantee would quote."""
    parts = []
    by_seed = p.get("mean_diff_by_seed") or {}
    if len(by_seed) > 1:
        parts.append(", ".join(f"s{s} {d:+.4f}" for s, d in sorted(by_seed.items(), key=lambda kv: int(kv[0]))))
    if p.get("bootstrap_lower") is not None:
        parts.append(f"bootstrap [{p['bootstrap_lower']:+.4f}, {p['bootstrap_upper']:+.4f}]")
    return f" ({'; '.join(parts)})" if parts else ""


def _holm_text(p: dict) -> str:
    return f", Holm p {p['holm_p_noninferior']:.3g}" if "holm_p_noninferior" in p else ""


def _verdict_text(p: dict) -> str:
    return "Not decided yet (interim)" if p["verdict"] == "interim" else f"Decided: **{p['verdict']}**"


def _first_pair(standing: UnitsStanding) -> dict | None:
    """The first arm's paired record against the baseline: its n sets the rule's reach, the same for
    every arm (all are evaluated on the same items)."""
    return next((a.pair for a in standing.arms if a.pair is not None), None)


def _power_line(plan: RunPlan, standing: UnitsStanding) -> str:
    """What the pre-registered rule can tell at the folder's number of paired items and seeds: the
    smallest observed difference it would call noninferior (a tie reads inconclusive below it)."""
    p = _first_pair(standing)
    if p is None or p.get("noninferior_threshold") is None:
        return ""
    rule = rule_for(plan.decision.method)
    return (f"What the rule can tell: with {p['n']} paired items, the one-sided {rule.bounds_name} at "
            f"α={plan.decision.alpha:g} lie {p['noninferior_threshold'] - p['margin']:.4f} from the observed "
            f"difference{_threshold_basis(plan)}, so an arm is called noninferior (margin "
            f"{p['margin']:+.2f}) only when its observed difference is above {p['noninferior_threshold']:+.4f}"
            + ("; an arm as good as the baseline, or a little better, reads inconclusive.\n\n"
               if p["noninferior_threshold"] > 0 else ".\n\n"))


def _versus_table(plan: RunPlan, standing: UnitsStanding) -> str:
    """The treatment against each other arm (not the baseline): secondary and descriptive."""
    if not standing.versus:
        return ""
    treatment, baseline, alpha = plan.run.treatment, plan.run.baseline, plan.decision.alpha
    rule = rule_for(plan.decision.method)
    rows = []
    for v in standing.versus:
        p, rel = v.pair, v.relative_cost
        counts = p.get("mcnemar")
        wall = _wall_cell(v.common_seeds, v.wall_seeds, v.wall_ratio)
        rows.append(f"| {v.arm} | {', '.join(map(str, v.common_seeds))} | {p['mean_diff']:+.4f} | "
                    f"{_bounds_text(p)} | [{p['bootstrap_lower']:+.4f}, {p['bootstrap_upper']:+.4f}] | "
                    + (f"{counts['b']} / {counts['c']}" if counts else "—") + " | "
                    f"{wall} | {_ratio(rel.get('trainer_tokens'))} | {_ratio(rel.get('model_calls'))} |")
    return (
        f"### {treatment} against the other arms (secondary)\n\n"
        f"The pre-registered decision compares every arm with {baseline} only. Here {treatment} minus each other arm, "
        "on the same eval items paired within the seeds both have and averaged over them: descriptive, with "
        f"the rule's unadjusted one-sided {rule.bounds_name} at α={alpha:g} and a paired bootstrap interval over items at {1 - 2 * alpha:.0%}; "
        f"no verdict. Items: those {treatment} gets right and the other arm wrong / the reverse (one seed: an item's "
        f"outcome over several seeds is a mean). Costs: {treatment}'s training divided by the other arm's over the "
        "same seeds (wall time over the seeds at which they trained side by side).\n\n"
        f"| other arm | seeds | {treatment} − other | {rule.bounds_name} | bootstrap interval | items right only in "
        f"{treatment} / only in other | wall time | trainer tokens | model calls |\n"
        "|---|---|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n\n"
    )


def _plots_section(plots: Sequence[RenderedPlot]) -> str:
    if not plots:
        return ""
    parts = []
    for plot in plots:
        if plot.png is None:
            parts.append(f"- {plot.spec.title}: not drawn ({plot.why_not}).")
        else:
            parts.append(f"![{plot.spec.title}]({UnitsLayout.PLOTS_FOLDER}/{plot.name}.png)\n\n{plot.spec.caption}")
    return "### Plots\n\n" + "\n\n".join(parts) + "\n\n"


def _sharing_table(standing: UnitsStanding) -> str:
    """Each unit's GPU sharing: the units it trained side by side with, and its steps' median
    seconds (a unit's wall time holds its neighbours' load); nothing when no unit has step metrics."""
    if not standing.sharing:
        return ""
    known = sorted({s.device for s in standing.sharing if s.device is not None})
    if not known:  # no unit says where it trained: the table as it always was (one GPU)
        rows = [f"| {s.unit} | {', '.join(s.beside) or 'alone'} | {s.median_step_seconds:.1f} |"
                for s in standing.sharing]
        header, where = "| unit | trained beside | median step (s) |\n|---|---|---|\n", ""
    else:  # the devices named GPU 1, 2, ... in their order, each one's full identity below the table
        label = {device: f"{'GPU' if '/GPU-' in device else 'device'} {k + 1}" for k, device in enumerate(known)}
        rows = [f"| {s.unit} | {label.get(s.device, 'not known')} | {', '.join(s.beside) or 'alone'} | "
                f"{s.median_step_seconds:.1f} |" for s in standing.sharing]
        header = "| unit | device | trained beside | median step (s) |\n|---|---|---|---|\n"
        where = "".join(f"- {label[d]}: `{d}`\n" for d in known) + "\n"
    return (
        "### GPU sharing\n\n"
        "Units whose training overlapped in wall-clock time on one device shared its GPU (one `gs1 run --units` on a "
        "shared base); a unit's wall time holds its neighbours' load, so wall times compare only between units that "
        "trained side by side. Units on two GPUs of one run trained at once but shared nothing. The median step is "
        "barely moved by the few steps that compiled.\n\n" + header + "\n".join(rows) + "\n\n" + where
    )


def _admit_table(standing: UnitsStanding) -> str:
    """The trust gate's admit rate at each step of every trust-gated unit (flash_reinforce): one
    column per unit, its mean and minimum below; nothing when no unit in has a gate."""
    columns = [(f"{a.arm}-s{seed}", rates) for a in standing.arms for seed, rates in a.admit_rates.items()]
    if not columns:
        return ""
    steps = max(len(rates) for _, rates in columns)

    def cell(rates: tuple[float, ...], step: int) -> str:
        return f"{rates[step]:.3f}" if step < len(rates) else "—"

    rows = [f"| {step + 1} | " + " | ".join(cell(r, step) for _, r in columns) + " |" for step in range(steps)]
    rows.append("| mean | " + " | ".join(f"{np.mean(r):.3f}" for _, r in columns) + " |")
    rows.append("| min | " + " | ".join(f"{np.min(r):.3f}" for _, r in columns) + " |")
    return (
        "### Trust gate: admit rate per step\n\n"
        "The share of a step's rollouts the FlashREINFORCE gate admitted: its per-token mean Bernoulli KL between "
        "the sampler's and the learner's token probabilities within the arm's trust delta (a rollout not admitted "
        "carries no gradient).\n\n"
        "| step | " + " | ".join(name for name, _ in columns) + " |\n"
        "|---|" + "---|" * len(columns) + "\n" + "\n".join(rows) + "\n\n"
    )


def write_units_decision(folder: UnitsLayout, record: dict) -> DecisionFiles:
    """The decision's files (`decision.records.write_decision_files`) in the folder's `decision/`, written
    whole: into a temp sibling renamed into place, so a kill leaves the old decision or the new one."""
    replace_dir_atomic(folder.decision_dir, lambda tmp: write_decision_files(record, DecisionFiles(tmp)))
    return folder.decision


@dataclass(frozen=True)
class Reading:
    """A secondary reading of a complete units folder under one rule (`units_reading`)."""

    method: str
    record: dict  # reading.json
    markdown: str  # reading.md
    rows: tuple[dict, ...]  # comparisons.parquet


def units_reading(plan: RunPlan, units: CheckedUnits, method: str) -> Reading:
    """A secondary reading of a complete units folder under the rule `method` (its default
    settings), beside the pre-registered decision and never in its place, labelled as such. A rule
    that reads one seed reads each seed apart (a row per arm and seed); a rule that needs more seeds
    than the folder has says why it reads nothing. Nothing is written (`write_reading` does)."""
    rule = rule_for(method)
    every = plan.units()
    if units.missing:
        raise UserError(f"--rule {method}: a secondary reading needs every unit in; missing: {', '.join(units.missing)}")
    decision = plan.decision.model_copy(update={"method": method, "rule": rule.settings()})
    names = {"treatment": plan.run.treatment, "baseline": plan.run.baseline}
    label = (f"# Secondary reading under {method} (not the decision)\n\n"
             f"The pre-registered rule is {plan.decision.method}; its decision is `decision/decision.md` and stays the "
             f"decision. This reading asks what {method} makes of the same {len(every)} units: {rule.summary}; it covers "
             f"{rule.covers}.\n\n")
    groups: list[tuple[str, list]] = []
    why = rule.seeds_problem(len(plan.seeds))
    if why is None:
        groups.append(("", list(every)))
    elif rule.max_seeds == 1:
        groups += [(f"seed {s}", [u for u in every if u.order_seed == s]) for s in plan.seeds]
    records, parts = [], []
    for title, group in groups:
        record = family_record([units.eval_file(u.unit) for u in group], [(u.name, u.order_seed) for u in group],
                               decision, names)
        records.append(record)
        body = family_markdown(record).replace("# Decision:", "## Reading:", 1)
        parts.append(body.replace("## Reading:", f"## {title.capitalize()}:", 1) if title else body)
    if not groups:
        parts.append(f"**No reading:** {why}. With {len(plan.seeds)} seed(s) a seed-aware rule has "
                     f"{len(plan.seeds) - 1} degree(s) of freedom for the run-to-run spread: it can say nothing here.\n")
    record = {"method": method, "secondary": True, "decision_method": plan.decision.method,
              "why_not": None if groups else why, "readings": records}
    rows = tuple({**{c: p.get(c) for c in COMPARISONS.names},
                  "arm": p["arm"] if len(groups) < 2 else f"{p['arm']}-s{r['seeds'][0]}"}
                 for r in records for p in r["comparisons"])
    return Reading(method=method, record=record, markdown=label + "\n".join(parts), rows=rows)


def write_reading(folder: UnitsLayout, reading: Reading) -> Path:
    """`readings/<method>/` (reading.json, comparisons.parquet, reading.md), written whole: into a
    temp sibling renamed into place."""
    def fill(tmp: Path) -> None:
        write_json_atomic(tmp / folder.reading_json(reading.method).name, reading.record)
        write_artifact("comparisons", list(reading.rows), tmp / folder.reading_comparisons(reading.method).name)
        write_text_atomic(tmp / folder.reading_md(reading.method).name, reading.markdown)

    return replace_dir_atomic(folder.reading_dir(reading.method), fill)


def _readings_section(folder: UnitsLayout) -> str:
    """The folder's secondary readings (other rules than the spec's), linked, each in one line."""
    lines = []
    for method in folder.readings():
        record = loads_strict(folder.reading_json(method).read_text(encoding="utf-8"), str(folder.reading_json(method)))
        if record.get("why_not"):
            what = f"no reading ({record['why_not']})"
        else:
            per_seed = len(record["readings"]) > 1

            def seed_of(r: dict) -> str:
                return f" s{r['seeds'][0]}" if per_seed else ""

            what = "; ".join(f"{p['arm']}{seed_of(r)} {p['mean_diff']:+.4f} {_bounds_text(p)} {p['verdict']}"
                             for r in record["readings"] for p in r["comparisons"])
        lines.append(f"- [{method}]({UnitsLayout.READINGS_FOLDER}/{method}/reading.md): {what}")
    if not lines:
        return ""
    return ("### Secondary readings (other rules; not the decision)\n\n"
            "`gs1 decide --units DIR --rule R` reads the same units under another rule. The pre-registered decision above "
            "stays the decision.\n\n" + "\n".join(lines) + "\n\n")


README_BEGIN = "<!-- gs1 decide --units: begin (written by the command; edits inside are replaced) -->"
README_END = "<!-- gs1 decide --units: end -->"
# the answers' own block, at the top of the README (under its title) where a reader lands first
ANSWERS_BEGIN = "<!-- gs1 decide --units: answers begin (written by the command; edits inside are replaced) -->"
ANSWERS_END = "<!-- gs1 decide --units: answers end -->"


def _with_block(text: str, begin: str, end: str, body: str, *, top: bool) -> str:
    """text with body between begin and end: replaced where the markers are; else placed under the
    title (top) or at the end."""
    block = f"{begin}\n{body}{end}\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        tail = rest.split(end, 1)[1].lstrip("\n")
        return head + block + ("\n" + tail if tail else "")
    if top and text.startswith("# "):
        title, _, rest = text.partition("\n")
        return f"{title}\n\n{block}\n" + rest.lstrip("\n")
    return text.rstrip("\n") + "\n\n" + block


def write_standing(plan: RunPlan, standing: UnitsStanding, folder: UnitsLayout) -> Path:
    """comparison.md (the answers, then the tables), and the same two blocks in the folder's
    README.md, each between its markers (the answers under the title, the tables where they were;
    the rest of the README as its authors wrote it; a README is started when there is none), with
    the plots beside them."""
    plots = render_plots(standing, UNITS_PLOT_SPECS)
    write_plots(folder.plots_dir, plots)
    markdown, answers = standing_markdown(plan, standing, folder, plots), answers_markdown(plan, standing)
    write_text_atomic(folder.comparison_md, answers + markdown)
    readme = folder.root / "README.md"
    text = readme.read_text() if readme.is_file() else f"# {plan.title}: units\n"
    text = _with_block(text, ANSWERS_BEGIN, ANSWERS_END, answers, top=True)
    write_text_atomic(readme, _with_block(text, README_BEGIN, README_END, markdown, top=False))
    return folder.comparison_md
