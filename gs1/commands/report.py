"""`gs1 report RUN_DIR [--out DIR]`: plots, one self-contained HTML page and a markdown summary.

Renders whatever stages of the run exist (a failed gate stops the flow; the page says which gate,
with its metric, value and bound). Writes into RUN_DIR/report/ unless --out names a directory.
Prints the HTML path and the verdict line. A missing or non-run directory exits 2 with one line.
"""

from __future__ import annotations


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "report",
        help="render a run directory as plots + one HTML page",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (runs/<title>-<hash>/)")
    parser.add_argument("--out", metavar="DIR", default=None, help="output directory (default RUN_DIR/report)")
    parser.set_defaults(func=run)


def run(args) -> int:
    from report import write_report  # lazy: matplotlib loads only for this command, not for `gs1 --help`

    result = write_report(args.run_dir, out_dir=args.out)
    print(result.html)
    print(result.headline)
    return 0
