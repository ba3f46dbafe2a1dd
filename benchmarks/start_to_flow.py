"""Seconds from `gs1 run`'s start to its first stage's end (issue 46 item 3: start through
feasibility, its first part): the imports, the spec, data and model checks and the temporary
Prefect server, before any stage's work.

    python benchmarks/start_to_flow.py [SPEC] [--draws 3] [--work DIR]

Each draw is a fresh `gs1 run SPEC` (default the demo spec) in its own run directory under
`--work`, stopped by SIGTERM as soon as its 'validate spec' stage has finished (the stop is
gs1 run's own: one line, the server stopped); its seconds are `benchmarks/stage_timings.py`'s for
that stage, counted from the process's start. One table row a draw, then the median. The stage
itself is instant: the row is the process's start-up. A CPU table proves an ordering's effect
on this machine; the GPU run's logs (`e2e/*-stages.txt`) give the card's.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stage_timings import stage_table  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FIRST_STAGE = "validate spec"
WAIT_S = 300.0  # a draw that has not reached its first stage by then failed


def one_draw(spec: str, run_dir: Path) -> float:
    """One fresh `gs1 run`: seconds from its start to FIRST_STAGE's end, read from its log."""
    log = run_dir.with_suffix(".log")
    start = time.time()
    with open(log, "w") as out:
        process = subprocess.Popen([sys.executable, "-m", "gs1", "run", spec, "--run-dir", str(run_dir)], cwd=ROOT,
                                   stdout=out, stderr=subprocess.STDOUT,  # on its own temporary server
                                   env={k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"})
        try:
            while time.time() - start < WAIT_S and process.poll() is None:
                rows = {r["stage"]: r for r in stage_table(log.read_text(), start)}
                if FIRST_STAGE in rows:
                    return rows[FIRST_STAGE]["seconds"]
                time.sleep(0.1)
            raise SystemExit(f"start_to_flow: {spec} did not finish '{FIRST_STAGE}' (log {log})")
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", nargs="?", default="specs/demo_local.json")
    parser.add_argument("--draws", type=int, default=3)
    parser.add_argument("--work", help="folder for the draws' run directories and logs (default: a temporary one)")
    args = parser.parse_args(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="gs1-start-"))
    work.mkdir(parents=True, exist_ok=True)
    seconds = [one_draw(args.spec, work / f"draw{i}") for i in range(args.draws)]
    print(f"| {args.spec}: draw | seconds to '{FIRST_STAGE}' finished |")
    print("|---|---|")
    for i, s in enumerate(seconds):
        print(f"| {i} | {s:.1f} |")
    print(f"| median | {statistics.median(seconds):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
