"""`gs1 validate SPEC`: check a spec and print a one-screen summary of the experiment.

Exit 0 when valid. An invalid spec prints one `field.path: reason` line per problem on stderr
and exits 2; a missing file or malformed JSON prints one line and exits 2.
"""

from __future__ import annotations

import sys

from schemas.errors import UserError


# a summary is one screen: a spec of many arms shows this many, the compared pair among them
ARMS_SHOWN = 12


def register(subparsers) -> None:
    p = subparsers.add_parser("validate", help="check a spec file and summarise the experiment")
    p.add_argument("spec", metavar="SPEC", help="path to the spec JSON")
    p.set_defaults(func=run)


def _names(arms) -> str:
    names = [a.name for a in arms]
    return ", ".join(names) if len(names) <= ARMS_SHOWN else f"{', '.join(names[:3])} and {len(names) - 3} more arms"


def _bounds(check) -> str:
    if check.one_of is not None:
        return f"one of {{{', '.join(check.one_of)}}}"
    if check.min is not None and check.max is not None:
        return f"in [{check.min:g}, {check.max:g}]"
    if check.min is not None:
        return f">= {check.min:g}"
    return f"<= {check.max:g}"


def _weighted(crit) -> str:
    terms = []
    for key, w in sorted(crit.weights.items(), key=lambda kw: -kw[1]):
        sign = "-" if w < 0 else "+"
        mag = "" if abs(w) == 1 else f"{abs(w):g}*"
        terms.append(f"{sign} {mag}{key}")
    text = " ".join(terms)
    return text[2:] if text.startswith("+ ") else text


def summary(spec, path: str) -> str:
    # lazy: start-up time
    from design.plan import DecisionPlan
    from design.spec import (baseline_arm, compared_arms, resolve_base_model_path, resolve_renderer_name, spec_hash,
                             treatment_arm)

    treatment, baseline = treatment_arm(spec), baseline_arm(spec)
    renderer = resolve_renderer_name(spec)
    renderer_note = "" if spec.renderer else " (cookbook default)"
    weights = ""
    if spec.base_model_path:
        try:
            weights = f"\n  weights     {spec.base_model_path} -> {resolve_base_model_path(spec)}"
        except UserError as e:
            weights = f"\n  weights     {spec.base_model_path} (not found here: {e})"
    ds = spec.dataset
    n_train = f", {ds.n_examples} train prompts" if ds.n_examples else ""
    n_eval = spec.eval.n_examples if spec.eval.n_examples else "all"
    lines = [
        f"spec        {path}  (hash {spec_hash(spec)})",
        f"title       {spec.title}",
        f"model       {spec.base_model}, LoRA rank {spec.lora_rank}, renderer {renderer}{renderer_note}{weights}",
        f"data        {ds.name}{n_train}; eval {n_eval} test items (greedy)",
        f"training    {spec.steps} steps x {spec.batch_size} rollouts, max_tokens {spec.sampling.max_tokens}, "
        f"temperature {spec.sampling.temperature:g}, {spec.optimizer.name} lr {spec.optimizer.lr:g}",
        "arms        (prompts x group = rollouts per step)",
    ]
    width = max(len(a.name) for a in spec.arms[:ARMS_SHOWN])
    shown = spec.arms if len(spec.arms) <= ARMS_SHOWN else [a for a in spec.arms[:ARMS_SHOWN - 1]]
    shown += [a for a in (treatment, baseline) if a not in shown]  # the compared pair is always shown
    for arm in shown:
        role = "treatment" if arm.name == treatment.name else "baseline" if arm.name == baseline.name else ""
        lines.append(
            f"  {arm.name:<{width}}  {arm.batch_shape:<9} {arm.advantage}, "
            f"lr {arm.lr:g}, seed {arm.seed}  {role}".rstrip()
        )
        recipe = arm.estimator.recipe_of(arm)
        if (described := arm.estimator.describe(recipe, lora_rank=spec.lora_rank)) is not None:
            lines.append(f"  {'':<{width}}  {described}")
    if len(shown) < len(spec.arms):
        kinds = sorted({a.advantage for a in spec.arms if a not in shown})
        lines.append(f"  ... and {len(spec.arms) - len(shown)} more arms ({', '.join(kinds)}): the spec's `arms` lists them")
    p = spec.pilot
    gate = spec.activation_gate
    lines.append(
        f"pilot       {p.steps} treatment steps; held-out reward {p.heldout_prompts} prompts x {p.heldout_samples} samples; "
        f"a calibration pilot within {p.calibration_wall_minutes:g} wall minutes"
    )
    lines.append(f"gates       activation_gate{'' if gate.applicable else ' (not applicable)'}: {len(gate.checks)} checks")
    mwidth = max((len(c.metric) for c in gate.checks), default=0)
    for c in gate.checks:
        lines.append(f"  {c.metric:<{mwidth}}  {_bounds(c)}")
    dr = spec.decision_rule
    lines.append(f"decision    {dr.method}, alpha {dr.alpha:g}, seeds {dr.seeds}")
    compared = compared_arms(spec)
    if len(compared) > 1 or len(dr.seeds) > 1:
        lines.append(f"  every arm at each of {len(dr.seeds)} seed(s) ({len(spec.arms) * len(dr.seeds)} runs); "
                     f"{_names(compared)} each against {baseline.name}, paired within seed, "
                     f"Holm over the {len(compared)}")
    for crit in dr.criteria:
        lines.append(
            f"  {crit.id}: {crit.metric} in {list(crit.bounds)}; D = {_weighted(crit)}; "
            f"noninferior if lower bound > {crit.margin:g}, inferior if upper bound < {crit.margin:g}"
        )
    power = DecisionPlan.of_spec(spec).power_reading(None, len(dr.seeds))
    if power is not None and power.why_not is None:  # `gs1 power SPEC` gives the whole reading and its design table
        at = ", ".join(f"{p.p_conclusive:.0%} at {p.true_diff:+.3f}" for p in power.points)
        lines.append(f"  power: noninferior above {power.noninferior_threshold:+.4f}; P(conclusive) {at}"
                     + ("" if power.design.min_power is None else
                        f"; gate needs {power.design.min_power:.0%}: {'passes' if power.gate_passed else 'FAILS'}")
                     + " (gs1 power SPEC)")
    cp = spec.correctness_preflight
    if cp is not None:
        lines.append(f"preflight   correctness {'required' if cp.required else 'optional'}: {len(cp.paths)} path(s)"
                     + (f" [{', '.join(x.id for x in cp.paths)}]" if cp.paths else ""))
    lines.append(f"budget      {spec.budget.gpu_hours:g} GPU hours, {spec.budget.max_wall_minutes:g} wall minutes")
    return "\n".join(lines)


def run(args) -> int:
    from design.spec import SpecError, load_spec  # lazy: start-up time

    try:
        spec = load_spec(args.spec)
    except SpecError as e:
        for line in e.problems:
            sys.stderr.write(f"{line}\n")
        return 2
    print(summary(spec, args.spec))
    print("valid")
    return 0
