"""Dispatch: a sweep's units run as flow runs of a deployment on a Prefect `process` work pool, a
seed's units in one flow run (`dispatch_groups`), picked up by two local workers, one a fake GPU
(`CUDA_VISIBLE_DEVICES`, as on a host of two); the experiment's audit and decision wait for every
unit. The grouping itself: `design.plan.unit_groups`, tested without Prefect."""

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


def _deploy_units(repo_root: Path, pool: str, env: dict[str, str] | None = None) -> str:
    """A `process` pool and a deployment of the unit flow on it; the flow runs the workers start
    register the test env first (the job's command, a Prefect job variable), and load the fake lost
    GPU (`fixtures.lost_gpu`, idle unless `env` names its unit)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    from flows.units import UNIT_FLOW, arm_unit

    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
    command = (f"{sys.executable} -c \"import fixtures.flow_env, fixtures.lost_gpu, runpy; "
               "runpy.run_module('prefect.engine', run_name='__main__')\"")
    arm_unit.from_source(source=str(repo_root), entrypoint="flows/units.py:arm_unit").deploy(
        name="units", work_pool_name=pool, build=False, push=False, print_next_steps=False,
        job_variables={"command": command, "env": {"PYTHONPATH": f"{TESTS}{os.pathsep}{repo_root}", **(env or {})}},
    )
    return f"{UNIT_FLOW}/units"


def _start_worker(pool: str, name: str, api_url: str, log: Path, gpu: int) -> subprocess.Popen:
    # one worker a GPU, as scripts/h200/multi_gpu_device_run.sh starts them (this machine has none:
    # the variable is what each worker's flow runs inherit, and the CPU engine ignores it)
    env = {**os.environ, "PREFECT_API_URL": api_url, "PREFECT_WORKER_QUERY_SECONDS": "1",
           "PREFECT_WORKER_PREFETCH_SECONDS": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1",
           "CUDA_VISIBLE_DEVICES": str(gpu)}
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
    workers = [_start_worker(pool, f"worker-{k}", api_url, tmp_path / f"worker-{k}.log", gpu=k) for k in range(2)]
    try:
        spec = multiarm_spec(repo_root, tiny_model_dir)
        spec["arms"] = spec["arms"][:2]  # grpo_gs8 (baseline) and gs1_kernel, at seeds 0 and 1: four units
        spec_path = tmp_path / "spec.json"
        spec_path.write_text(json.dumps(spec))
        run_dir = tmp_path / "run"
        state = experiment_in(run_dir)(spec_path=str(spec_path), run_dir=str(run_dir), backend="local",
                                       dispatch=deployment, dispatch_groups=2, return_state=True)
    finally:
        _stop(workers)
    logs = "\n".join((tmp_path / f"worker-{k}.log").read_text()[-3000:] for k in range(2))
    assert state.is_completed(), f"{state.message}\n{logs}"

    units = [f"{arm}-s{seed}" for arm in ("grpo_gs8", "gs1_kernel") for seed in (0, 1)]
    groups = {f"grpo_gs8-s{seed},gs1_kernel-s{seed}" for seed in (0, 1)}
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs()
    group_runs = [r for r in runs if r.deployment_id is not None and r.name.split(" ")[0] in groups]
    # One flow run of the deployment per seed (its two units side by side), both completed, one a worker.
    assert sorted(r.name.split(" ")[0] for r in group_runs) == sorted(groups)
    assert all(r.state.is_completed() for r in group_runs)
    assert {r.work_pool_name for r in group_runs} == {pool}
    ran = [[run for run in group_runs if run.id.hex[:8] in (tmp_path / f"worker-{k}.log").read_text().lower().replace("-", "")]
           for k in range(2)]
    assert sorted(len(r) for r in ran) == [1, 1], logs  # each worker (one flow run at a time) ran one group
    for unit in units:  # a seed's two units trained at once, in one process
        steps = read_rows("step_metrics", run_dir / "train" / unit / "step_metrics.parquet")
        other = unit.replace("grpo_gs8", "gs1_kernel") if unit.startswith("grpo") else unit.replace("gs1_kernel", "grpo_gs8")
        theirs = read_rows("step_metrics", run_dir / "train" / other / "step_metrics.parquet")
        assert steps[0]["wall_time"] - steps[0]["step_seconds"] < theirs[-1]["wall_time"]
    # The decision came after every unit: it read all four eval files the units wrote.
    decision = json.loads((run_dir / "decision" / "decision.json").read_text())
    assert decision["seeds"] == [0, 1] and [p["arm"] for p in decision["comparisons"]] == ["gs1_kernel"]
    decision_written = (run_dir / "decision" / "decision.json").stat().st_mtime
    for unit in units:
        assert (run_dir / "eval" / unit / "eval.jsonl").stat().st_mtime <= decision_written
        cost = read_rows("arm_costs", run_dir / "train" / unit / "costs.parquet")[0]
        assert cost["steps"] == 2 and cost["device"].endswith("/cpu")
    base = {s: eval_map(run_dir / "eval" / f"grpo_gs8-s{s}" / "eval.jsonl") for s in (0, 1)}
    mine = {s: eval_map(run_dir / "eval" / f"gs1_kernel-s{s}" / "eval.jsonl") for s in (0, 1)}
    expected = sum(sum(mine[s][i] - base[s][i] for i in base[s]) / len(base[s]) for s in (0, 1)) / 2
    assert abs(decision["mean_diff"] - expected) < 1e-12
    # The training audit read every unit's logs.
    audit = {r["metric"] for r in read_rows("gate_report", run_dir / "audit" / "train" / "gate_report.parquet")}
    assert audit == {f"{u}.max_abs_diff" for u in units}


def _stop(workers: list[subprocess.Popen]) -> None:
    for worker in workers:
        worker.terminate()
    for worker in workers:
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()


def test_a_group_whose_gpu_is_lost_is_named_and_the_same_run_resumes_it(prefect_harness, tmp_path, repo_root,
                                                                       tiny_model_dir):
    """A worker's GPU lost mid-sweep (`fixtures.lost_gpu`: seed 1's flow run dies at once, as a
    process on a GPU that fell off the bus does): the other group finishes, and only then the
    experiment fails, naming the lost group's units; nothing it finished is lost. The same run
    started again re-dispatches both groups: seed 0's units come from their cached stages
    (not trained again), seed 1's train, and the decision reads all four."""
    from prefect.settings import PREFECT_API_URL

    from flows.experiment import experiment_in

    pool = f"gs1-units-{uuid.uuid4().hex[:6]}"
    deployment = _deploy_units(repo_root, pool, env={"GS1_TEST_LOSE_GPU_ONCE": str(tmp_path / "lost"),
                                                     "GS1_TEST_LOSE_GPU_UNIT": "grpo_gs8-s1"})
    api_url = PREFECT_API_URL.value()
    spec = multiarm_spec(repo_root, tiny_model_dir)
    spec["arms"] = spec["arms"][:2]
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    run_dir = tmp_path / "run"
    states = []
    for attempt in range(2):
        workers = [_start_worker(pool, f"worker-{attempt}-{k}", api_url, tmp_path / f"worker-{attempt}-{k}.log", gpu=k)
                   for k in range(2)]
        try:
            states.append(experiment_in(run_dir)(spec_path=str(spec_path), run_dir=str(run_dir), backend="local",
                                                 dispatch=deployment, dispatch_groups=2, return_state=True))
        finally:
            _stop(workers)
        if attempt == 0:
            lost, done = states[0], {u: (run_dir / "train" / u / "final.json").stat().st_mtime
                                     for u in ("grpo_gs8-s0", "gs1_kernel-s0")}
    logs = "\n".join(p.read_text()[-2000:] for p in sorted(tmp_path.glob("worker-*.log")))
    assert (tmp_path / "lost").is_file() and not lost.is_completed(), logs
    assert "units grpo_gs8-s1,gs1_kernel-s1 ended Crashed" in lost.message, lost.message
    assert "grpo_gs8-s0" not in lost.message  # the group that finished is not named
    assert all((run_dir / "eval" / u / "eval.jsonl").is_file() for u in done)
    assert states[1].is_completed(), f"{states[1].message}\n{logs}"
    # seed 0's units were not trained again (their final records are the first attempt's)
    assert {u: (run_dir / "train" / u / "final.json").stat().st_mtime for u in done} == done
    decision = json.loads((run_dir / "decision" / "decision.json").read_text())
    assert decision["seeds"] == [0, 1] and [p["arm"] for p in decision["comparisons"]] == ["gs1_kernel"]


def test_unit_groups_deal_whole_seeds_over_the_groups(repo_root, tiny_model_dir):
    """A sweep's dispatch groups (`design.plan.unit_groups`), on a plan's own units: whole seeds
    dealt round-robin, so a seed's arms share a flow run (one process, one base, one GPU), in plan
    order within a group; more groups than seeds deal the units; by default one unit a group; fewer
    than 1 is refused."""
    import pytest

    from design.plan import plan_from_spec, unit_groups
    from design.spec import parse_spec
    from schemas.errors import UserError

    spec = multiarm_spec(repo_root, tiny_model_dir, seeds=(0, 1, 2))
    spec["arms"] = spec["arms"][:3]
    units = plan_from_spec(parse_spec(spec)).units()
    assert [u.unit for u in units][:4] == ["grpo_gs8-s0", "grpo_gs8-s1", "grpo_gs8-s2", "gs1_kernel-s0"]

    def names(groups):
        return [[u.unit for u in group] for group in groups]

    assert names(unit_groups(units, 2)) == [
        ["grpo_gs8-s0", "grpo_gs8-s2", "gs1_kernel-s0", "gs1_kernel-s2", "batch_mean-s0", "batch_mean-s2"],
        ["grpo_gs8-s1", "gs1_kernel-s1", "batch_mean-s1"]]
    assert names(unit_groups(units, 3))[1] == ["grpo_gs8-s1", "gs1_kernel-s1", "batch_mean-s1"]
    assert names(unit_groups(units, 1)) == [[u.unit for u in units]]
    assert [len(g) for g in unit_groups(units, 4)] == [3, 2, 2, 2]  # more groups than seeds: the units dealt
    assert names(unit_groups(units, None)) == [[u.unit] for u in units]
    with pytest.raises(UserError, match="at least 1"):
        unit_groups(units, 0)


def test_the_training_stage_asks_for_its_seeds_placement(monkeypatch, repo_root, tiny_model_dir):
    """The training stage's client request (`tasks.arms._lora_client`, fresh or from a checkpoint)
    names the unit and, in a spec of several seeds, the seed's placement, so that on several GPUs the
    engine keeps a seed's units on one; a single-seed spec's arms ask for none (they spread). A fake
    service client records what it was asked."""
    from design.plan import plan_from_spec
    from design.spec import parse_spec
    from tasks import arms as arms_stage

    asked = []

    class FakeService:
        def create_lora_training_client(self, **kwargs):
            asked.append(kwargs["user_metadata"])
            return _Done()

        def create_training_client_from_state_with_optimizer(self, path, user_metadata=None):
            asked.append(user_metadata)
            return _Done()

    class _Done:
        def result(self, timeout=None):
            return object()

    monkeypatch.setattr(arms_stage, "service_client", lambda backend: FakeService())
    many = plan_from_spec(parse_spec(multiarm_spec(repo_root, tiny_model_dir)))
    one = plan_from_spec(parse_spec(multiarm_spec(repo_root, tiny_model_dir, seeds=(0,))))
    unit = many.units_of("gs1_kernel")[1]
    arms_stage._lora_client(unit, "local", 4, None)
    arms_stage._lora_client(unit, "local", 4, "/checkpoint")
    arms_stage._lora_client(one.arm("gs1_kernel"), "local", 4, None)
    assert asked == [{"unit": "gs1_kernel-s1", "placement": "seed 1"}] * 2 + [{"unit": "gs1_kernel"}]
