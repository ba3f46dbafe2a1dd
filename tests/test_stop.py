"""`gs1 run` stopped from outside: Ctrl-C / SIGTERM end it within 10 s with one line saying where
and that re-running resumes; after SIGKILL too, no process of ours outlives it."""

from __future__ import annotations

import signal
import time

from fixtures.gs1_process import alive, descendants, start_gs1_run, wait_for
from fixtures.tiny_model import tiny_model_dir  # noqa: F401
from test_flow import flow_spec


def test_ctrl_c_and_sigkill_leave_no_process_behind(tmp_path, repo_root, tiny_model_dir):
    spec = flow_spec(repo_root, tiny_model_dir)
    run_dir, cache = tmp_path / "run", tmp_path / "cache"

    # Ctrl-C while a stage runs (the preflight's files appear once the flow is under way).
    proc = start_gs1_run(spec, tmp_path, run_dir, cache, "first")
    wait_for(lambda: (run_dir / "spec" / "plan.json").exists(), 300, "the flow to start", proc)
    children = descendants(proc.pid)
    assert children, "the temporary Prefect server is a child of gs1 run"
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    rc = proc.wait(timeout=10)
    assert time.monotonic() - sent < 10
    assert rc == 128 + signal.SIGINT
    err = (tmp_path / "first.err").read_text().strip().splitlines()
    assert err[-1].startswith("gs1: stopped by SIGINT during ") and "run the same command again to resume" in err[-1], err[-3:]
    assert "Traceback" not in "\n".join(err)
    wait_for(lambda: not any(alive(p) for p in children), 5, "gs1's children to end")

    # SIGKILL: gs1 cannot clean up, so the server must end by itself (parent-death signal).
    proc = start_gs1_run(spec, tmp_path, run_dir, cache, "second")
    children = wait_for(lambda: descendants(proc.pid), 120, "the temporary server to start", proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    wait_for(lambda: not any(alive(p) for p in children), 10, "the orphaned server to end")
