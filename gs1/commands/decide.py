"""`gs1 decide`: the paired decision from two arms' eval files, or a spec's family decision from
a folder of units gathered over several runs.

    gs1 decide --treatment T --baseline B [--alpha 0.05] [--margin -0.03] [--rule R]
    gs1 decide --spec SPEC --units DIR [--collect RUN_DIR ...] [--rule R]

T and B are eval files: `.jsonl` rows with item_id and correct, or an eval Parquet with those
columns. Items are matched by item_id whatever the row order. Prints one JSON object: the rule's
reading (method, n, mean_diff, lower, upper, p-values, verdict, alpha, margin; the rule is the
user's pre-registered one unless --rule names another that reads one seed) and the secondary
reports (mcnemar, bootstrap_ci, noninferior_threshold).

With --spec and --units: each `--collect` run directory's finished units (arm x seed, as `gs1 run
--units` leaves them) are copied into DIR/<unit>/ with its proof (DIR/<unit>/unit.json: the run, the
experiment, arm, seed, eval items and each file's sha256); every unit in DIR is checked against its
proof and the spec's eval items before anything is written (one that fails is named in one line,
exit 2, nothing written). Then, once DIR holds every unit of the spec, the
spec's decision (Holm over its arms, the decision stage's own writer) goes to DIR/decision/ (written
whole: the old decision or the new one, never a half one). Until then DIR/comparison.md (and a block of DIR/README.md) shows interim differences and the units
still missing; the command prints them and exits 0 either way. With --rule R (every unit in) the
folder is also read under rule R, a secondary reading labelled as such in DIR/readings/R/: the
spec's own rule keeps the decision.
"""

from __future__ import annotations

import json

from gs1.commands.argtypes import checked, finite_float
from schemas.errors import EvalDataError, UserError


# one-sided level; the bootstrap CI is at 1 - 2 alpha
_alpha = checked(float, lambda v: 0 < v < 0.5, "in (0, 0.5)")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "decide",
        help="the paired decision from two eval files, or a units folder's",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument("--treatment", metavar="T", help="treatment eval (.jsonl or .parquet)")
    parser.add_argument("--baseline", metavar="B", help="baseline eval (.jsonl or .parquet)")
    parser.add_argument("--alpha", type=_alpha, default=0.05)
    parser.add_argument("--margin", type=finite_float, default=-0.03)
    parser.add_argument("--spec", help="the sweep's spec JSON (with --units)")
    parser.add_argument("--units", metavar="DIR", help="the sweep's units folder: DIR/<arm>-s<seed>/ (with --spec)")
    parser.add_argument("--collect", metavar="RUN_DIR", action="append", default=[],
                        help="copy this run directory's finished units into DIR first (repeatable)")
    parser.add_argument("--rule", metavar="R", help="the decision rule (two eval files; default the user's "
                        "pre-registered one), or a secondary reading of a units folder under R")
    parser.set_defaults(func=run)


def run(args) -> int:
    if args.spec or args.units or args.collect:
        if args.treatment or args.baseline:
            raise UserError("give --treatment/--baseline (two eval files) or --spec/--units (a units folder), not both")
        if not (args.spec and args.units):
            raise UserError("--spec and --units go together (--collect needs both)")
        return _decide_units(args)
    if not (args.treatment and args.baseline):
        raise UserError("give --treatment T and --baseline B, or --spec SPEC --units DIR")
    from rl.stats import paired_decision  # lazy: start-up time

    rule = _rule(args.rule, seeds=1)
    try:
        report = paired_decision(args.treatment, args.baseline, alpha=args.alpha, margin=args.margin, rule=rule)
    except EvalDataError as e:
        raise UserError(str(e)) from None
    print(json.dumps(report, sort_keys=True))
    return 0


def _rule(method: str | None, seeds: int | None):
    """The settings of rule `method` (None: the user's pre-registered rule); a rule that cannot read
    `seeds` seeds (None: not known here) is a UserError naming it."""
    from rules import DEFAULT_METHOD, rule_for  # lazy: start-up time

    try:
        rule = rule_for(method or DEFAULT_METHOD)
    except ValueError as e:
        raise UserError(f"--rule: {e}") from None
    if seeds is not None and (why := rule.seeds_problem(seeds)) is not None:
        raise UserError(f"--rule: {why}; two eval files are one seed (a units folder holds several)")
    return rule.settings()


def _decide_units(args) -> int:
    from pathlib import Path

    from decision.units import (check_units, collect_units, units_reading, units_standing, write_reading,
                                write_standing, write_units_decision)
    from design.plan import plan_from_spec
    from design.spec import load_spec
    from schemas.layout import RunLayout, UnitsLayout

    if args.rule:
        _rule(args.rule, seeds=None)  # an unknown rule: one line, before anything is read or written
    spec = load_spec(args.spec)  # a bad spec: its problems, exit 2
    plan = plan_from_spec(spec)
    folder = UnitsLayout(args.units)
    for run_dir in args.collect:
        got = collect_units(spec, RunLayout(run_dir), folder, spec_dir=Path(args.spec).resolve().parent)
        print(f"gs1: collected {len(got)} unit(s) from {run_dir}: {', '.join(got) or 'none finished'}")
    if not Path(args.units).is_dir():
        raise UserError(f"--units {args.units}: no such folder")
    # Every input is checked and every result computed before the first file is written: a unit that
    # fails its proof (UnitProofError) or a pair that cannot be read leaves the folder as it was.
    units = check_units(spec, folder)
    try:
        standing = units_standing(plan, units)
        reading = units_reading(plan, units, args.rule) if args.rule else None
    except EvalDataError as e:
        raise UserError(str(e)) from None
    if standing.decision is not None:
        write_units_decision(folder, standing.decision)
    if reading is not None:
        write_reading(folder, reading)
        why_not = reading.record["why_not"]
        print(f"gs1: secondary reading under {args.rule} (not the decision) at {folder.reading_md(args.rule)}"
              + (f": no reading, {why_not}" if why_not else ""))
    table = write_standing(plan, standing, folder)
    from rules import rule_for  # lazy: start-up time

    bounds_name = rule_for(plan.decision.method).bounds_name
    for arm in standing.arms:
        if arm.pair is not None:
            p = arm.pair
            bounds = (f"[{p['lower']:+.4f}, {p['upper']:+.4f}]" if p.get("lower") is not None
                      else f"none yet: {p.get('why_no_bounds')}")
            print(f"gs1: {arm.arm} - {plan.run.baseline} = {p['mean_diff']:+.4f} "
                  f"({bounds_name} {bounds}, seeds {list(arm.common_seeds)}): {p['verdict']}")
    if standing.complete:
        print(f"gs1: every unit is in; the decision at {folder.decision.json}; "
              f"table {table}")
    else:
        print(f"gs1: no decision yet: {len(standing.missing)} unit(s) missing: {', '.join(standing.missing)}; table {table}")
    return 0
