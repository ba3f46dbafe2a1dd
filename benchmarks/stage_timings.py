"""Stage timings and decode-graph compiles of one `gs1 run`, read from its terminal log.

    python benchmarks/stage_timings.py results/h200-gsm8k/flow.log [--start EPOCH]

Prefect prints `HH:MM:SS.mmm | LEVEL | Task run 'NAME-abc' - Finished in state ...` when a stage
ends, and the local engine `... | gs1.engine - decode graph R rows x P positions on DEV:
[compiled and ]captured in S s`. A stage runs from the end of the one before it (arms run side by
side: the training and eval rows end when their last arm does); the first from `--start` (the
epoch seconds `scripts/h200/gsm8k_device_run.sh` logs as `gs1 run: ... start=`), else from the flow's first line.
Prints one table row per stage: seconds, decode graphs compiled, and compile seconds.
"""

from __future__ import annotations

import argparse
import re
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

LINE = re.compile(r"^(\d\d:\d\d:\d\d\.\d{3}) \| \w+\s*\| (.*)$")
FINISHED = re.compile(r"Task run '(.+?)(-[0-9a-f]{3})?' - Finished in state (\w+)")
COMPILE = re.compile(r"gs1\.engine - decode graph (\d+) rows x (\d+) positions on (\S+): (compiled and )?captured in ([\d.]+) s")


def _clock(text: str, day: datetime) -> datetime:
    t = datetime.strptime(text, "%H:%M:%S.%f").time()
    return datetime.combine(day.date(), t, tzinfo=timezone.utc)


def stage_table(log: str, start: float | None = None) -> list[dict]:
    lines = [m for m in (LINE.match(x) for x in log.splitlines()) if m]
    if not lines:
        return []
    first_day = datetime.fromtimestamp(start, timezone.utc) if start else datetime.now(timezone.utc)
    previous = datetime.fromtimestamp(start, timezone.utc) if start else _clock(lines[0].group(1), first_day)
    stages: list[dict] = []
    compiles: list[tuple[float, bool]] = []
    last = previous
    for m in lines:
        at = _clock(m.group(1), first_day)
        while at < last - timedelta(hours=12):  # past midnight
            at += timedelta(days=1)
        last = at
        if c := COMPILE.search(m.group(2)):
            compiles.append((float(c.group(5)), bool(c.group(4))))
        elif f := FINISHED.search(m.group(2)):
            name = re.sub(r"\s+\((\w+)\)$", r" (\1)", f.group(1))
            if stages and stages[-1]["stage"] == name:  # the second arm of a side-by-side stage
                stages[-1]["seconds"] += (at - previous).total_seconds()
            else:
                stages.append({"stage": name, "state": f.group(3), "seconds": (at - previous).total_seconds(),
                               "compiled": 0, "compile_seconds": 0.0, "captured": 0})
            stages[-1]["compiled"] += sum(1 for _, new in compiles if new)
            stages[-1]["compile_seconds"] += sum(s for s, new in compiles if new)
            stages[-1]["captured"] += len(compiles)
            compiles = []
            previous = at
    return stages


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log")
    ap.add_argument("--start", type=float, default=None)
    args = ap.parse_args(argv)
    text = Path(args.log).read_text(errors="replace")
    start = args.start
    if start is None and (m := re.search(r"gs1 run: rc=\d+ start=([\d.]+)", text)):
        start = float(m.group(1))
    rows = stage_table(text, start)
    if not rows:
        print("no stage lines found", file=sys.stderr)
        return 1
    print("| stage | state | seconds | decode graphs compiled | compile s | graphs captured |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['stage']} | {r['state']} | {r['seconds']:.1f} | {r['compiled']} | {r['compile_seconds']:.1f} | {r['captured']} |")
    print(f"| total | | {sum(r['seconds'] for r in rows):.1f} | {sum(r['compiled'] for r in rows)} | "
          f"{sum(r['compile_seconds'] for r in rows):.1f} | {sum(r['captured'] for r in rows)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
