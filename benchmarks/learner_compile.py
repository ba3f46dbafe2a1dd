"""What the learner's compiled layers cost to compile, cold and warm (issue 46, item 3): the
learner's own forward_backward, compiled, in one fresh process after another on one inductor cache.

    python benchmarks/learner_compile.py [--runs cold,warm] [--work DIR] [--device cpu]

Each run is a new Python on the same `TORCHINDUCTOR_CACHE_DIR` (`DIR/inductor`): the first fills
the caches, the next finds them as a warm process on a carried cache does. The model is the
engine's tiny test model (`engine_speed.build_model("tiny")`), four datums of 12 + 12 tokens, LoRA
rank 8 (`tests/learner_agreement.py`'s fused path). One table row a run: the seconds the learner's
compile line gives (`learner: decoder layers compiled on DEV in S s`), how many times dynamo
analysed the frame (`compile_attempt_N` in its metrics: a second attempt is a restart that threw the
first trace and its AOTAutograd lookup away), what AOTAutograd's cache answered and saved, what
inductor's answered, and the whole process's seconds. `tests/test_compile_cache.py` runs `PROBE`.
A CPU table proves the mechanism (how many lookups, what hits); a GPU run's log gives its seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# One fresh process: compile the learner's layers once through its own forward_backward, save the
# LoRA gradients (`WORK/RUN.pt`) and print what torch counted, as JSON, on stdout's last line.
PROBE = """
import json, logging, sys
logging.basicConfig(level=logging.INFO)  # the engine's compile lines, on stderr
sys.path.insert(0, "benchmarks"); sys.path.insert(0, "tests")
from pathlib import Path
import torch
from torch._dynamo.utils import compilation_time_metrics, counters
import learner_agreement as la
from engine_speed import build_model

class Args:  # learner_agreement.run_path's arguments
    dtype, rank, seed, profile = None, 8, 11, False
    device = sys.argv[3] if len(sys.argv) > 3 else "cpu"

work = Path(sys.argv[1])
model = work / "model"
if not model.exists():
    build_model("tiny", model, None, Args.device)
_, _, _, _, grads, _ = la.run_path(model, la.datums(4, 12, 12), Args, "fused", True, work / sys.argv[2])
torch.save(grads, work / (sys.argv[2] + ".pt"))
print(json.dumps({"aot_autograd": dict(counters["aot_autograd"]), "inductor": dict(counters["inductor"]),
                  "attempts": sum(1 for k in compilation_time_metrics if k.startswith("compile_attempt_"))}))
"""

LEARNER_LINE = re.compile(r"learner: decoder layers compiled on (\S+) in ([\d.]+) s")


@dataclass(frozen=True)
class CompileRun:
    """One fresh process's learner compile, as PROBE reports it."""

    run: str
    compile_s: float
    attempts: int
    autograd_hit: int
    autograd_miss: int
    autograd_saved: int
    inductor_hit: int
    inductor_miss: int
    process_s: float
    line: str  # the learner's compile line, as the engine logged it

    COLUMNS = ("run", "learner compile s", "dynamo attempts", "autograd hit", "autograd miss",
               "autograd saved", "inductor hit", "inductor miss", "process s")

    def row(self) -> str:
        return (f"| {self.run} | {self.compile_s:.1f} | {self.attempts} | {self.autograd_hit} | {self.autograd_miss} | "
                f"{self.autograd_saved} | {self.inductor_hit} | {self.inductor_miss} | {self.process_s:.1f} |")


def probe_env(work: Path) -> dict[str, str]:
    """The environment every run shares: one inductor cache, one HOME, no cache named elsewhere."""
    base = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "GS1_COMPILE_CACHE")}
    return {**base, "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor"), "HOME": str(work / "home")}


def run_probe(work: Path, run: str, device: str = "cpu", timeout: float = 900) -> CompileRun:
    """PROBE in a fresh Python on `work`'s caches; raises RuntimeError with the process's last
    lines when it fails or logs no learner compile."""
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", PROBE, str(work), run, device], capture_output=True, text=True,
                          timeout=timeout, env=probe_env(work), cwd=ROOT)
    seconds = time.perf_counter() - t0
    lines = [ln for ln in done.stderr.splitlines() if LEARNER_LINE.search(ln)]
    if done.returncode != 0 or len(lines) != 1:
        raise RuntimeError(f"learner compile probe '{run}' failed (rc {done.returncode}, {len(lines)} compile lines): "
                           + done.stderr[-2000:])
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    aot, ind = seen["aot_autograd"], seen["inductor"]
    return CompileRun(run, float(LEARNER_LINE.search(lines[0]).group(2)), seen["attempts"],
                      aot.get("autograd_cache_hit", 0), aot.get("autograd_cache_miss", 0),
                      aot.get("autograd_cache_saved", 0), ind.get("fxgraph_cache_hit", 0),
                      ind.get("fxgraph_cache_miss", 0), seconds, lines[0].split(" - ", 1)[-1].strip())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default="cold,warm", help="run names, in order, on one cache (default cold,warm)")
    ap.add_argument("--work", type=Path, help="the caches and the model (default: a new temporary folder)")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="learner_compile_"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        runs = [run_probe(work, run, args.device) for run in args.runs.split(",")]
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"learner_compile: {str(e).splitlines()[0]}", file=sys.stderr)
        return 1
    print("| " + " | ".join(CompileRun.COLUMNS) + " |")
    print("|" + "---|" * len(CompileRun.COLUMNS))
    for r in runs:
        print(r.row())
    print(f"\ncaches: {work / 'inductor'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
