"""The Prefect UI path as a researcher lives it (issue 15), against a real Prefect test server: a
deployment's run stops at a gate without a traceback, a Retry after a gate-bound edit reuses the
pilot, names say what runs, and the deployment's own run page shows the report and decision."""

from __future__ import annotations

import json
import logging
import os
import re

import fixtures.flow_env  # noqa: F401  (registers the token_threshold env)
from fixtures import prefect_api as api
from fixtures.tiny_model import tiny_model_dir  # noqa: F401
from test_flow import flow_spec


def _run_by_runner(flow, flow_run_id):
    """What a runner (`gs1 serve`) does with a scheduled flow run, in the process it starts for it
    (`prefect.flow_engine._run_flow_from_runtime_entrypoint`): run the flow under that id asking for
    its result, with the run's logger for errors; a Failed run raises there. Returns the run's state."""
    from prefect.flow_engine import run_flow
    from prefect.logging.loggers import flow_run_logger

    flow_run = api.flow_run(flow_run_id)
    try:
        run_flow(flow, flow_run=flow_run, error_logger=flow_run_logger(flow_run=flow_run))
    except Exception:  # the runner's process exits 1 here; what the UI shows is the run's state and logs
        pass
    return api.flow_run(flow_run_id).state


def test_a_crash_in_a_judging_stage_keeps_its_traceback_a_gate_stop_has_none(prefect_harness):
    from prefect import flow

    from schemas.errors import GateFailed
    from schemas.gate_text import GateRow
    from tasks.judging import judging_task

    row = GateRow(gate="toy", metric="toy_metric", value=0.25, op="min", bound="0.5", passed=False)

    @judging_task(name="toy gate", task_run_name="toy gate")
    def toy_gate(crash: bool) -> int:
        if crash:
            raise ValueError("boom in the toy gate")
        raise GateFailed("toy gate", [row])

    @flow
    def crashing() -> int:
        return toy_gate(True)

    @flow
    def stopping() -> str:
        try:
            toy_gate(False)
        except GateFailed as failed:  # the GateFailed still reaches the flow, where it was called
            return f"caught {failed}"
        return "not stopped"

    crashed = crashing(return_state=True)
    stopped = stopping(return_state=True)
    assert crashed.is_failed() and stopped.result() == "caught toy_metric = 0.25 (needs ≥ 0.5): toy gate failed"
    crash_logs = [r.message for r in api.logs([crashed.state_details.flow_run_id])]
    assert any("Traceback" in m and "ValueError: boom in the toy gate" in m for m in crash_logs), crash_logs
    stop_logs = api.logs([stopped.state_details.flow_run_id])
    assert not any("Traceback" in r.message for r in stop_logs), [r.message for r in stop_logs]
    errors = [r.message for r in stop_logs if r.level >= logging.ERROR]
    assert errors == ["Finished in state Failed('toy_metric = 0.25 (needs ≥ 0.5): toy gate failed')"]
    assert api.task_states(stopped.state_details.flow_run_id) == {"toy gate": ["Failed"]}


def test_deployment_run_stops_at_a_gate_and_a_retry_after_the_fix_reuses_the_pilot(
    prefect_harness, tmp_path, repo_root, tiny_model_dir, monkeypatch
):
    from prefect.deployments import run_deployment
    from prefect.states import AwaitingRetry

    from flows.deployment import gs1_run
    from schemas.revision import experiment_hash
    from schemas.spec import parse_spec

    from flows.memory import MALLOC_ENVIRONMENT

    monkeypatch.chdir(tmp_path)  # the deployment's run directories go under ./runs
    for variable in MALLOC_ENVIRONMENT:  # as in a process `gs1 serve` starts, where the CLI never ran
        monkeypatch.delenv(variable, raising=False)
    spec_path = tmp_path / "spec.json"
    failing = flow_spec(repo_root, tiny_model_dir, bounds={"pilot_mean_reward": {"min": 0.95, "max": 1.0}})
    spec_path.write_text(json.dumps(failing))
    gs1_run.to_deployment(name="ui-path", parameters={"spec_path": str(spec_path)}).apply()
    flow_run = run_deployment("gs1-run/ui-path", timeout=0)  # scheduled, as `prefect deployment run` leaves it

    # 1. The gate stops the run: its state message starts with metric, value, bound.
    state = _run_by_runner(gs1_run, flow_run.id)
    assert state.is_failed()
    head = state.message.partition("; also ")[0]
    assert re.fullmatch(r"pilot_mean_reward = [0-9.]+ \(needs ≥ 0\.95\): activation gate failed", head), state.message
    assert len(head) <= 80
    # the flow applied the memory settings itself (and handed them to any child process)
    assert {v: os.environ.get(v) for v in MALLOC_ENVIRONMENT} == MALLOC_ENVIRONMENT
    name = f"flow-test-{experiment_hash(parse_spec(failing))}-local"
    assert api.flow_run(flow_run.id).name == name  # from the spec, not `sceptical-marmot`
    (experiment_run,) = api.subflow_runs(flow_run.id)
    assert experiment_run.name == name and experiment_run.state.message == state.message
    assert api.task_states(experiment_run.id) == {
        "validate spec": ["Completed"], "correctness preflight": ["Completed"], "offline unit checks": ["Completed"],
        "pilot": ["Completed"], "pilot audit": ["Completed"], "activation gate": ["Failed"], "report": ["Completed"],
    }
    # An expected stop: no traceback anywhere in the UI's logs; the failing gate's ERROR lines say it.
    records = api.logs([flow_run.id, experiment_run.id])
    assert not any("Traceback" in r.message or "exception" in r.message.lower() for r in records), \
        [r.message[:200] for r in records if "Traceback" in r.message]
    errors = [r.message for r in records if r.level >= logging.ERROR]
    assert errors and all(head in m for m in errors), errors
    # The deployment's own run page shows the report, and the gate's table.
    shown = api.artifacts(flow_run.id)
    assert {"report", "activation-gate"} <= set(shown), set(shown)
    report_md = shown["report"][-1].data
    assert "NO DECISION: STOPPED AT A GATE" in report_md and "file://" not in report_md
    pilot_progress = api.artifacts(experiment_run.id)
    assert {"pilot-gs1-kernel", "pilot-grpo-gs8"} <= set(pilot_progress)

    # 2. Fix the bound in the spec file and press Retry: the same flow run, run again.
    fixed = flow_spec(repo_root, tiny_model_dir)
    spec_path.write_text(json.dumps(fixed))
    from prefect import get_client
    import asyncio

    async def retry():
        async with get_client() as client:
            await client.set_flow_run_state(flow_run.id, AwaitingRetry(), force=True)

    asyncio.run(retry())
    state = _run_by_runner(gs1_run, flow_run.id)
    assert state.is_completed(), state.message
    retried = api.subflow_runs(flow_run.id)[-1]
    states = {name: runs[-1] for name, runs in api.task_states(retried.id).items()}
    for stage in ("correctness preflight", "offline unit checks", "pilot", "pilot audit"):
        assert states[stage] == "Cached", (stage, states)
    for stage in ("validate spec", "activation gate", "feasibility", "train gs1_kernel", "train grpo_gs8", "train audit",
                  "eval gs1_kernel", "eval grpo_gs8", "decision", "report"):
        assert states[stage] == "Completed", (stage, states)
    # The same run directory (the experiment did not change), with the revision recorded.
    run_dir = tmp_path / "runs" / f"flow-test-{experiment_hash(parse_spec(fixed))}"
    assert name == f"{run_dir.name}-local"
    (revision_file,) = sorted((run_dir / "spec" / "revisions").glob("*.json"))
    revision = json.loads(revision_file.read_text())
    bound = next(i for i, c in enumerate(fixed["activation_gate"]["checks"]) if c["metric"] == "pilot_mean_reward")
    assert [(c["field"], c["old"], c["new"]) for c in revision["changes"]] == [
        (f"activation_gate.checks[{bound}].max", 1.0, 0.9), (f"activation_gate.checks[{bound}].min", 0.95, 0.1)]
    assert revision["old"] == failing and revision["new"] == fixed
    # The report says which stages were reused and what was revised; the deployment's run shows it.
    report_md = (run_dir / "report" / "report.md").read_text()
    assert "Reused from cache (inputs unchanged): correctness preflight, offline unit checks, pilot, pilot audit" \
        in report_md
    assert f"activation_gate.checks[{bound}].min 0.95 -> 0.1" in report_md
    shown = api.artifacts(flow_run.id)
    assert {"decision", "report", "spec-revision"} <= set(shown), set(shown)
    assert shown["report"][-1].data.count("](data:image/png;base64,") >= 1
    verdict = json.loads((run_dir / "decision" / "decision.json").read_text())["verdict"]
    assert f"**{verdict}**" in shown["decision"][-1].data


def test_stages_before_training_do_not_key_on_the_training_length(repo_root):
    """Cache keys cover what a stage reads: the preflight and the pilot read every arm field but
    the number of training steps, so a `steps` edit keys only feasibility, training and later."""
    from tasks.arms import pilot_rollouts, trained_arm
    from tasks.cache import InputsRead
    from tasks.preflight import correctness_preflight
    from tasks.spec import plan_from_spec
    from schemas.layout import RunLayout
    from schemas.spec import load_spec

    arms = plan_from_spec(load_spec(repo_root / "specs" / "demo_local.json")).arms
    longer = tuple(a.model_copy(update={"steps": a.steps + 10}) for a in arms)
    faster = tuple(a.model_copy(update={"lr": a.lr * 2}) for a in arms)

    def policy(task) -> InputsRead:
        return next(p for p in task.cache_policy.inner.policies if isinstance(p, InputsRead))

    for stage in (pilot_rollouts, correctness_preflight):
        key = lambda arms: policy(stage).compute_key(None, {"arms": arms, "layout": RunLayout("/runs/x")}, {})  # noqa: E731
        assert key(longer) == key(arms) != key(faster), stage.name
    train_key = lambda arm: policy(trained_arm).compute_key(None, {"arm": arm, "layout": RunLayout("/runs/x")}, {})  # noqa: E731
    assert train_key(longer[0]) != train_key(arms[0])
