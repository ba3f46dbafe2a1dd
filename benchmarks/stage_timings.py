"""Stage timings, decode-graph compiles and model loads of one `gs1 run`, read from its terminal log.

    python benchmarks/stage_timings.py results/h200-gsm8k/flow.log [--start EPOCH]

Prefect prints `HH:MM:SS.mmm | LEVEL | Task run 'NAME-abc' - Finished in state ...` when a stage
ends, and the local engine `... | gs1.engine - decode graph R rows x P positions on DEV:
[compiled and ]captured in S s`, `... | gs1.engine - learner: decoder layers [re]compiled on DEV in S s`
(engine/learner.py) and `... | gs1.engine - model SPEC loaded (HOW) in S s on DEV`
(HOW: gguf, converted, weights, reused, tokenizer or tokenizer-cached; engine/models.py).
A stage runs from the end of the one before it (arms run side by side: the training and eval rows
end when their last arm does); the first from `--start` (the epoch seconds
`scripts/h200/gsm8k_device_run.sh` logs as `gs1 run: ... start=`), else from the flow's first line.
Prints one table row per stage: seconds, graphs compiled (decode shapes and the learner's layers),
compile seconds, decode graphs captured,
model and tokenizer loads read from disk (a reuse of this process's tensors is no load) and the
seconds of all loads.
"""

from __future__ import annotations

import argparse
import re
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

LINE = re.compile(r"^(\d\d:\d\d:\d\d\.\d{3}) \| \w+\s*\| (.*)$")
FINISHED = re.compile(r"Task run '(.+?)(-[0-9a-f]{3})?' - Finished in state (\w+)")
COMPILE = re.compile(r"gs1\.engine - decode graph (\d+) rows x (\d+) positions on (\S+): (compiled and )?captured in ([\d.]+) s")
LEARNER = re.compile(r"gs1\.engine - learner: decoder layers (?:re)?compiled on (\S+) in ([\d.]+) s")
LOAD = re.compile(r"gs1\.engine - model (.+) loaded \(([\w-]+)\) in ([\d.]+) s on (\S+)")


def _clock(text: str, day: datetime) -> datetime:
    t = datetime.strptime(text, "%H:%M:%S.%f").time()
    return datetime.combine(day.date(), t, tzinfo=UTC)


def stage_table(log: str, start: float | None = None) -> list[dict]:
    lines = [m for m in (LINE.match(x) for x in log.splitlines()) if m]
    if not lines:
        return []
    first_day = datetime.fromtimestamp(start, UTC) if start else datetime.now(UTC)
    previous = datetime.fromtimestamp(start, UTC) if start else _clock(lines[0].group(1), first_day)
    stages: list[dict] = []
    compiles: list[tuple[float, bool]] = []
    loads: list[tuple[float, bool]] = []  # (seconds, read from disk)
    learner: list[float] = []  # the learner's compiles and recompiles (seconds of that microbatch)
    last = previous
    for m in lines:
        at = _clock(m.group(1), first_day)
        while at < last - timedelta(hours=12):  # past midnight
            at += timedelta(days=1)
        last = at
        if c := COMPILE.search(m.group(2)):
            compiles.append((float(c.group(5)), bool(c.group(4))))
        elif lc := LEARNER.search(m.group(2)):
            learner.append(float(lc.group(2)))
        elif ld := LOAD.search(m.group(2)):
            loads.append((float(ld.group(3)), ld.group(2) != "reused"))
        elif f := FINISHED.search(m.group(2)):
            name = re.sub(r"\s+\((\w+)\)$", r" (\1)", f.group(1))
            if stages and stages[-1]["stage"] == name:  # the second arm of a side-by-side stage
                stages[-1]["seconds"] += (at - previous).total_seconds()
            else:
                stages.append({"stage": name, "state": f.group(3), "seconds": (at - previous).total_seconds(),
                               "compiled": 0, "compile_seconds": 0.0, "captured": 0,
                               "loads": 0, "load_seconds": 0.0})
            stages[-1]["compiled"] += sum(1 for _, new in compiles if new) + len(learner)
            stages[-1]["compile_seconds"] += sum(s for s, new in compiles if new) + sum(learner)
            stages[-1]["captured"] += len(compiles)
            stages[-1]["loads"] += sum(1 for _, read in loads if read)
            stages[-1]["load_seconds"] += sum(s for s, _ in loads)
            compiles, loads, learner = [], [], []
            previous = at
    return stages


COLUMNS = (  # (header, row key, format)
    ("seconds", "seconds", ".1f"), ("graphs compiled (decode, learner)", "compiled", "d"),
    ("compile s", "compile_seconds", ".1f"), ("graphs captured", "captured", "d"),
    ("model loads", "loads", "d"), ("model load s", "load_seconds", ".1f"),
)


def format_table(rows: list[dict]) -> str:
    """The stage table as markdown, with a total row."""
    out = ["| stage | state | " + " | ".join(h for h, _, _ in COLUMNS) + " |",
           "|---|---|" + "---|" * len(COLUMNS)]
    for r in rows:
        out.append(f"| {r['stage']} | {r['state']} | " + " | ".join(format(r[k], f) for _, k, f in COLUMNS) + " |")
    out.append("| total | | " + " | ".join(format(sum(r[k] for r in rows), f) for _, k, f in COLUMNS) + " |")
    return "\n".join(out)


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
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
