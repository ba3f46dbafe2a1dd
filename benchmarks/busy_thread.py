"""What a busy Python thread beside the local engine costs one RL step on the CPU, by switch interval.

    python benchmarks/busy_thread.py [--arm gs1_kernel] [--spec specs/demo_local.json]

The engine's worker dispatches thousands of small torch ops a step and releases the GIL in each;
another thread running Python (an arm grading, a preflight's reference) then holds it for up to
the interpreter's switch interval before the worker gets it back. Each row is one process: the
demo arm's step 1 (step 0 warms up), quiet, then with a thread looping in Python beside it, at
Python's default interval (5 ms) and at the engine's (`GIL_SWITCH_INTERVAL_S`, which
`LocalServiceClient` sets). Measured on the 2-core development machine at issue 47: 14.7 s quiet,
647.7 s busy at 5 ms, 125.3 s busy at 0.5 ms.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def one(spec: str, arm_name: str, busy: bool, interval: float | None) -> float:
    """In this process: the arm's step 1 with the given interval and a busy thread or none."""
    sys.path.insert(0, str(ROOT))
    from design.plan import plan_from_spec
    from design.spec import load_spec
    from rl.loop import new_window, run_step
    from tasks.arms import env_for, open_arm

    plan = plan_from_spec(load_spec(spec))
    arm = next(a for a in plan.arms if a.name == arm_name)
    env = env_for(plan.run, None)
    training_client, renderer = open_arm(plan.run, arm, "local")  # the engine sets its own interval here
    if interval is not None:
        sys.setswitchinterval(interval)
    order = env.train_order(seed=0)
    log = run_step(0, arm, training_client=training_client, env=env, renderer=renderer, order=order,
                   window=new_window(arm))
    stop = threading.Event()

    def python_work():  # what a grader or a reference does between waits
        x = 0
        while not stop.is_set():
            for i in range(10_000):
                x += i * i

    if busy:
        threading.Thread(target=python_work, daemon=True).start()
    t0 = time.perf_counter()
    run_step(1, arm, training_client=training_client, env=env, renderer=renderer, order=order, window=log.next_window)
    stop.set()
    return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", default=str(ROOT / "specs" / "demo_local.json"))
    ap.add_argument("--arm", default="gs1_kernel")
    ap.add_argument("--one", nargs=2, metavar=("BUSY", "INTERVAL"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        interval = None if args.one[1] == "engine" else float(args.one[1])
        print(f"{one(args.spec, args.arm, args.one[0] == 'busy', interval):.1f}")
        return 0
    print("| beside the worker | switch interval | step seconds |")
    print("|---|---|---|")
    for busy, interval in (("quiet", "engine"), ("busy", "0.005"), ("busy", "engine")):
        done = subprocess.run([sys.executable, __file__, "--spec", args.spec, "--arm", args.arm, "--one", busy, interval],
                              capture_output=True, text=True)
        seconds = done.stdout.strip().splitlines()[-1] if done.returncode == 0 else f"failed: {done.stderr.strip()[-200:]}"
        shown = "0.5 ms (the engine's)" if interval == "engine" else f"{float(interval) * 1000:g} ms"
        print(f"| {'a Python thread' if busy == 'busy' else 'nothing'} | {shown} | {seconds} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
