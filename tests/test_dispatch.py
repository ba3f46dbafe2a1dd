"""Dispatch: each arm x seed runs as its own flow run of a deployment on a Prefect `process` work
pool, picked up by two local workers; the experiment's audit and decision wait for every unit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import fixtures.flow_env  # noqa: F401  (registers the token_threshold env in this process)
from fixtures.tiny_model import tiny_model_dir  # noqa: F401
from schemas.artifacts import read_rows
from test_multiarm import eval_map, multiarm_spec

TESTS = Path(__file__).resolve().parent


def _deploy_units(repo_root: Path, pool: str) -> str:
    """A `process` pool and a deployment of the unit flow on it; the flow runs the workers start
    register the test env first (the job's command, a Prefect job variable)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    from flows.units import UNIT_FLOW, arm_unit

    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
    command = (f"{sys.executable} -c \"import fixtures.flow_env, runpy; "
               "runpy.run_module('prefect.engine', run_name='__main__')\"")
    arm_unit.from_source(source=str(repo_root), entrypoint="flows/units.py:arm_unit").deploy(
        name="units", work_pool_name=pool, build=False, push=False, print_next_steps=False,
        job_variables={"command": command, "env": {"PYTHONPATH": f"{TESTS}{os.pathsep}{repo_root}"}},
    )
    return f"{UNIT_FLOW}/units"


def _start_worker(pool: str, name: str, api_url: str, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PREFECT_API_URL": api_url, "PREFECT_WORKER_QUERY_SECONDS": "1",
           "PREFECT_WORKER_PREFETCH_SECONDS": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool, "--type", "process", "--limit", "1",
         "--name", name],
        env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True,
    )


def test_units_run_on_two_process_workers_and_the_decision_waits_for_all(prefect_harness, tmp_path, repo_root,
                                                                        tiny_model_dir):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    from flows.experiment import experiment_in

    pool = f"gs1-units-{uuid.uuid4().hex[:6]}"
    deployment = _deploy_units(repo_root, pool)
    api_url = PREFECT_API_URL.value()
    workers = [_start_worker(pool, f"worker-{k}", api_url, tmp_path / f"worker-{k}.log") for k in range(2)]
    try:
        spec = multiarm_spec(repo_root, tiny_model_dir)
        spec["arms"] = spec["arms"][:2]  # grpo_gs8 (baseline) and gs1_kernel, at seeds 0 and 1: four units
        spec_path = tmp_path / "spec.json"
        spec_path.write_text(json.dumps(spec))
        run_dir = tmp_path / "run"
        state = experiment_in(run_dir)(spec_path=str(spec_path), run_dir=str(run_dir), backend="local",
                                       dispatch=deployment, return_state=True)
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
    logs = "\n".join((tmp_path / f"worker-{k}.log").read_text()[-3000:] for k in range(2))
    assert state.is_completed(), f"{state.message}\n{logs}"

    units = [f"{arm}-s{seed}" for arm in ("grpo_gs8", "gs1_kernel") for seed in (0, 1)]
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs()
    unit_runs = [r for r in runs if r.deployment_id is not None and r.name.split(" ")[0] in units]
    # One flow run of the deployment per unit, every one completed, shared by the two workers.
    assert sorted(r.name.split(" ")[0] for r in unit_runs) == sorted(units)
    assert all(r.state.is_completed() for r in unit_runs)
    assert {r.work_pool_name for r in unit_runs} == {pool}
    for k in range(2):  # each worker (one unit at a time) ran some of them
        log = (tmp_path / f"worker-{k}.log").read_text().lower()
        assert sum(run.id.hex[:8] in log.replace("-", "") for run in unit_runs) >= 1, log[-2000:]
    # The decision came after every unit: it read all four eval files the units wrote.
    decision = json.loads((run_dir / "decision" / "decision.json").read_text())
    assert decision["seeds"] == [0, 1] and [p["arm"] for p in decision["comparisons"]] == ["gs1_kernel"]
    decision_written = (run_dir / "decision" / "decision.json").stat().st_mtime
    for unit in units:
        assert (run_dir / "eval" / unit / "eval.jsonl").stat().st_mtime <= decision_written
        assert read_rows("arm_costs", run_dir / "train" / unit / "costs.parquet")[0]["steps"] == 2
    base = {s: eval_map(run_dir / "eval" / f"grpo_gs8-s{s}" / "eval.jsonl") for s in (0, 1)}
    mine = {s: eval_map(run_dir / "eval" / f"gs1_kernel-s{s}" / "eval.jsonl") for s in (0, 1)}
    expected = sum(sum(mine[s][i] - base[s][i] for i in base[s]) / len(base[s]) for s in (0, 1)) / 2
    assert abs(decision["mean_diff"] - expected) < 1e-12
    # The training audit read every unit's logs.
    audit = {r["metric"] for r in read_rows("gate_report", run_dir / "audit" / "train" / "gate_report.parquet")}
    assert audit == {f"{u}.max_abs_diff" for u in units}
