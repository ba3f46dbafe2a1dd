"""Rough edges a hostile user met (issue 27): each is one line and exit 2, before the flow starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def gs1(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    full = {**os.environ, "DO_NOT_TRACK": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false", **(env or {})}
    return subprocess.run([sys.executable, "-m", "gs1", *args], cwd=ROOT, env=full, capture_output=True, text=True,
                          timeout=timeout)


def test_an_unknown_top_level_key_is_refused_with_the_closest_name(tmp_path):
    spec = json.loads((ROOT / "specs" / "demo_local.json").read_text())
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**spec, "stepz": 3}))
    done = gs1("validate", str(bad))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["stepz: unknown key (did you mean 'steps'?)"], done.stderr
    kept = tmp_path / "kept.json"  # the records a spec may carry at its top level stay accepted
    kept.write_text(json.dumps({**spec, "notes": "why", "revision": {"why": "a test"}}))
    assert gs1("validate", str(kept)).returncode == 0


class _NotPrefect(BaseHTTPRequestHandler):
    def do_GET(self):  # 200 with a body that is no Prefect server's answer
        body = b"<html>welcome</html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def not_a_prefect_api():
    server = HTTPServer(("127.0.0.1", 0), _NotPrefect)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/api"
    server.shutdown()


@pytest.mark.slow  # spawns `gs1 run`
def test_a_health_answer_that_is_not_prefects_is_one_line_exit_2(not_a_prefect_api, tmp_path):
    done = gs1("run", "specs/demo_local.json", "--run-dir", str(tmp_path / "run"),
               env={"PREFECT_API_URL": not_a_prefect_api})
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"gs1: error: the Prefect API at {not_a_prefect_api} "
                                                   "(PREFECT_API_URL) answered /health with '<html>welcome</html>'")


@pytest.mark.slow  # spawns `gs1 run` on the user's spec, four times (about 10 s each on 2 cores)
@pytest.mark.parametrize("train,line", [
    ('{"question": "q", "answer": "#### 1"}\n{"question": "q", "answer": "#### 2"}\n{"question": oops\n', 3),
    ('{"question": "q", "answer": "#### 1"}\n{"q": "q", "a": "#### 2"}\n', 2),
    ('{"question": "q", "answer": "no final answer"}\n', 1),
    ("", None),
], ids=["broken-json", "wrong-keys", "no-answer", "empty"])
def test_the_data_files_are_read_and_checked_before_the_flow_starts(tmp_path, gsm8k_dir, train, line):
    data = tmp_path / "data"
    data.mkdir()
    (data / "test.jsonl").write_text((gsm8k_dir / "test.jsonl").read_text())
    (data / "train.jsonl").write_text(train)
    done = gs1("run", "specs/gs1_vs_grpo_gsm8k.json", "--run-dir", str(tmp_path / "run"), "--data-dir", str(data))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    where = f"{data / 'train.jsonl'}:{line}:" if line else f"{data / 'train.jsonl'}: no rows"
    assert len(lines) == 1 and lines[0].startswith(f"gs1: error: {where}"), done.stderr
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").rglob("*.parquet"))


def test_a_failed_gate_is_not_named_among_the_running_stages(prefect_harness, tmp_path):
    """A gate that failed (calibrated past, say) stores no result, and is not running for that: the
    stages a stop names come from what is running (issue 27, item 1 of the rough edges)."""
    from prefect import flow

    from pipeline.cache import stage_cache
    from pipeline.judging import judging_task
    from pipeline.running import running_stages, stage_end_hooks
    from schemas.errors import GateFailed
    from schemas.gate_text import GateRow

    seen = {}

    @judging_task(name="a gate", task_run_name="a gate", **stage_end_hooks(), cache_policy=stage_cache(),
                  persist_result=True)
    def a_gate(x: int):
        raise GateFailed("a gate", [GateRow("a gate", "m", 1.0, "min", "2", False)])

    @judging_task(name="a stage", task_run_name="a stage", **stage_end_hooks(), cache_policy=stage_cache(),
                  persist_result=True)
    def a_stage(x: int) -> int:
        seen["during"] = running_stages()
        return x

    @flow
    def the_flow():
        try:
            a_gate(1)
        except GateFailed:
            pass
        return a_stage(2)

    assert the_flow.with_options(result_storage=tmp_path / "results")() == 2
    assert seen["during"] == ["a stage"]
    assert running_stages() == []


def test_a_stored_result_and_its_manifest_prove_each_other(tmp_path):
    """The checks OutputsVerified makes before serving a stored stage result: the manifest names
    its own key and the record names its storage key; anything else is damage, said in words.
    (The whole path, a run resumed with each kind of separated proof: tests/test_faults.py.)"""
    from pipeline.cache import manifest_problem, record_problem

    key, other = "a" * 32, "b" * 32
    record, manifest = tmp_path / key, tmp_path / f"{key}.outputs.json"
    assert manifest_problem(manifest, key) == "is missing"
    manifest.write_text("{not json")
    assert manifest_problem(manifest, key).startswith("cannot be read")
    manifest.write_text(json.dumps({"/run/eval.jsonl": "00"}))  # the format before manifests named their key
    assert manifest_problem(manifest, key) == "is stale (not this version's format)"
    manifest.write_text(json.dumps({"key": other, "outputs": {}}))
    assert manifest_problem(manifest, key) == f"belongs to another stage result ({other})"
    manifest.write_text(json.dumps({"key": key, "outputs": {}}))
    assert manifest_problem(manifest, key) is None
    record.write_text(json.dumps({"metadata": {"storage_key": str(tmp_path / other)}, "result": ""}))
    assert record_problem(record, key) == f"is the stored result of another stage ({other})"
    record.write_text(json.dumps({"metadata": {"storage_key": str(tmp_path / key)}, "result": ""}))
    assert record_problem(record, key) is None
