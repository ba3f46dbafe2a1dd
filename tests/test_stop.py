"""`gs1 run` stopped from outside: Ctrl-C / SIGTERM end it within 10 s with one line saying where
and that re-running resumes; after SIGKILL too, no process of ours outlives it."""

from __future__ import annotations

import signal
import time

import pytest

from fixtures.gs1_process import alive, descendants, start_gs1_run, wait_for
from fixtures.tiny_model import tiny_model_dir  # noqa: F401
from test_flow import flow_spec


def test_ctrl_c_and_sigkill_leave_no_process_behind(tmp_path, repo_root, tiny_model_dir):
    spec = flow_spec(repo_root, tiny_model_dir)
    run_dir, cache = tmp_path / "run", tmp_path / "cache"

    # Ctrl-C while a stage runs (the preflight's files appear once the flow is under way).
    proc = start_gs1_run(spec, tmp_path, run_dir, cache, "first")
    wait_for(lambda: (run_dir / "spec" / "plan.json").exists(), 300, "the flow to start", proc)
    time.sleep(3.0)  # past the spec stage, into the preflight (seconds long on CPU)
    children = descendants(proc.pid)
    assert children, "the temporary Prefect server is a child of gs1 run"
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    rc = proc.wait(timeout=10)
    assert time.monotonic() - sent < 10
    assert rc == 128 + signal.SIGINT
    err = (tmp_path / "first.err").read_text().strip().splitlines()
    # where it stopped: the running stages, or "between stages" when the signal falls in the gap
    # between one stage's end and the next one's start (a loaded CI host can stretch that gap)
    assert err[-1].startswith(("gs1: stopped by SIGINT during ", "gs1: stopped by SIGINT between stages;")), err[-3:]
    assert "run the same command again to resume" in err[-1], err[-3:]
    assert "Traceback" not in "\n".join(err)
    wait_for(lambda: not any(alive(p) for p in children), 5, "gs1's children to end")

    # SIGKILL: gs1 cannot clean up, so the server must end by itself (parent-death signal).
    proc = start_gs1_run(spec, tmp_path, run_dir, cache, "second")
    children = wait_for(lambda: descendants(proc.pid), 120, "the temporary server to start", proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    wait_for(lambda: not any(alive(p) for p in children), 10, "the orphaned server to end")


def _gs1_run_with_api(url: str, run_dir) -> tuple[int, str, float]:
    import os
    import subprocess
    import sys

    env = {**os.environ, "PREFECT_API_URL": url}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "gs1", "run", "--run-dir", str(run_dir)], env=env,
                          capture_output=True, text=True, timeout=60)
    return done.returncode, done.stderr, time.monotonic() - started


@pytest.mark.slow  # spawns `gs1 run` twice, the second against an API that never answers
def test_a_prefect_api_down_or_never_answering_is_one_line_exit_2_within_15s(tmp_path):
    import socket

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    rc, err, seconds = _gs1_run_with_api(f"http://127.0.0.1:{port}/api", tmp_path / "run")
    assert rc == 2 and len(err.splitlines()) == 1 and "is unreachable" in err and seconds < 15, (rc, err, seconds)

    with socket.socket() as silent:  # accepts connections (the kernel's backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        rc, err, seconds = _gs1_run_with_api(f"http://127.0.0.1:{silent.getsockname()[1]}/api", tmp_path / "run")
    assert rc == 2 and len(err.splitlines()) == 1 and "did not answer within" in err and seconds < 15, (rc, err, seconds)
    assert not (tmp_path / "run").exists()


def test_a_second_gs1_run_on_a_held_run_dir_names_the_holder_and_exits_2(tmp_path, capsys):
    import os

    from gs1.cli import main
    from gs1.run_control import run_dir_lock

    run_dir = tmp_path / "run"
    with run_dir_lock(run_dir):
        rc = main(["run", "--run-dir", str(run_dir)])
        err = capsys.readouterr().err
    assert rc == 2 and len(err.splitlines()) == 1
    assert f"{run_dir} is in use by another gs1 run (pid {os.getpid()} on " in err
    with run_dir_lock(run_dir):  # released: the next run takes it
        pass
