"""`gs1 decide`: the pre-registered paired decision from two arms' eval files.

    gs1 decide --treatment T --baseline B [--alpha 0.05] [--margin -0.03]

T and B are eval files: `.jsonl` rows with item_id and correct, or an eval Parquet with those
columns. Items are matched by item_id whatever the row order. Prints one JSON object: the paired
Hoeffding rule (n, mean_diff, lower, upper, verdict, alpha, margin) and the secondary reports
(mcnemar, bootstrap_ci, min_noninferior_true_diff).
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
        help="paired Hoeffding decision from two eval files",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument("--treatment", required=True, metavar="T", help="treatment eval (.jsonl or .parquet)")
    parser.add_argument("--baseline", required=True, metavar="B", help="baseline eval (.jsonl or .parquet)")
    parser.add_argument("--alpha", type=_alpha, default=0.05)
    parser.add_argument("--margin", type=finite_float, default=-0.03)
    parser.set_defaults(func=run)


def run(args) -> int:
    from rl.stats import paired_decision  # lazy: start-up time

    try:
        report = paired_decision(args.treatment, args.baseline, alpha=args.alpha, margin=args.margin)
    except EvalDataError as e:
        raise UserError(str(e)) from None
    print(json.dumps(report, sort_keys=True))
    return 0
