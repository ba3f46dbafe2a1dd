"""`gs1 power SPEC`: what the spec's decision rule can tell before any GPU time.

    gs1 power SPEC [--json] [--rule R] [--items N,...]

For the spec's rule (or R), its eval items, seeds, alpha and margin: the smallest observed
difference the rule would call noninferior (and the largest it would call inferior), and the
probability of a conclusive verdict at a true difference of 0, at half the margin and at the
power gate's difference, under the between-run spread the spec pre-registers
(`decision_rule.between_seed_sd`, `item_sd`; else the measured defaults, named). Then the design
table: seeds 1/2/4/8/16 x the items (the spec's, or --items). No model, no data, no service.
"""

from __future__ import annotations

import json

from schemas.errors import UserError


def register(subparsers) -> None:
    parser = subparsers.add_parser("power", help="the power of a spec's decision rule, before any GPU time",
                                   description=__doc__.splitlines()[0])
    parser.add_argument("spec", metavar="SPEC", help="the spec JSON")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--rule", metavar="R", help="another decision rule than the spec's")
    parser.add_argument("--items", metavar="N,...", help="the design table's item counts (default: the spec's)")
    parser.set_defaults(func=run)


def _items(text: str | None) -> tuple[int, ...]:
    if not text:
        return ()
    try:
        items = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise UserError(f"--items {text}: give whole numbers separated by commas") from None
    if any(n < 1 for n in items):
        raise UserError(f"--items {text}: every item count must be >= 1")
    return items


def run(args) -> int:
    from design.plan import DecisionPlan
    from design.spec import load_spec
    from rules import rule_for  # lazy: start-up time

    items = _items(args.items)
    if args.rule:
        try:
            rule_for(args.rule)
        except ValueError as e:
            raise UserError(f"--rule: {e}") from None
    spec = load_spec(args.spec)  # a bad spec: its problems, exit 2
    reading = DecisionPlan.of_spec(spec).power_reading(None, len(spec.decision_rule.seeds), items, args.rule)
    if reading is None:
        raise UserError(f"{args.spec}: eval.n_examples is not set and the env's test set size is not known "
                        "without loading it: set eval.n_examples")
    if args.json:
        print(json.dumps(reading.record(), sort_keys=True))
        return 0
    print(f"gs1 power: {spec.title}")
    print(reading.summary())
    print()
    print(reading.table_markdown(), end="")
    return 0
