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

    from pipeline.judging import judging_task
    from schemas.errors import GateFailed
    from schemas.gate_text import GateRow

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

    from design.revision import experiment_hash
    from design.spec import parse_spec
    from flows.deployment import gs1_run

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
    assert {"report-attempt-1", "activation-gate-attempt-1"} <= set(shown), set(shown)
    report_md = shown["report-attempt-1"][-1].data
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
    # checks named by their metric, not their place in the list
    assert [(c["field"], c["old"], c["new"]) for c in revision["changes"]] == [
        ("activation_gate.checks[pilot_mean_reward].max", 1.0, 0.9),
        ("activation_gate.checks[pilot_mean_reward].min", 0.95, 0.1)]
    assert revision["old"] == failing and revision["new"] == fixed
    # The report says which stages were reused and what was revised; the deployment's run shows it.
    report_md = (run_dir / "report" / "report.md").read_text()
    assert "Reused from cache (inputs unchanged): correctness preflight, offline unit checks, pilot, pilot audit" \
        in report_md
    assert "activation_gate.checks[pilot_mean_reward].min 0.95 -> 0.1" in report_md
    shown = api.artifacts(flow_run.id)
    # each attempt's artifacts on the deployment's run, named by their attempt
    assert {"decision-attempt-2", "report-attempt-2", "spec-revision-attempt-2", "report-attempt-1"} <= set(shown), \
        set(shown)
    assert not {"decision", "report", "spec-revision"} & set(shown)
    keyed = {key: arts for key, arts in shown.items() if key}
    assert all(re.search(r"-attempt-[12]$", key) for key in keyed), set(keyed)
    assert all(a.description.startswith(f"attempt {key[-1]}: ") for key, arts in keyed.items() for a in arts)
    assert shown["report-attempt-2"][-1].data.count("](data:image/png;base64,") >= 1
    verdict = json.loads((run_dir / "decision" / "decision.json").read_text())["verdict"]
    assert f"**{verdict}**" in shown["decision-attempt-2"][-1].data


def test_stages_before_training_do_not_key_on_the_training_length(repo_root):
    """Cache keys cover what a stage reads: the preflight and the pilot read every arm field but
    the number of training steps, so a `steps` edit keys only feasibility, training and later."""
    from design.plan import plan_from_spec
    from design.spec import load_spec
    from pipeline.cache import InputsRead
    from schemas.layout import RunLayout
    from tasks.arms import pilot_rollouts, trained_arm
    from tasks.preflight import correctness_preflight

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


def _retry(flow_run_id) -> None:
    """What the UI's Retry button does: the flow run set AwaitingRetry (a runner picks it up again)."""
    import asyncio

    from prefect import get_client
    from prefect.states import AwaitingRetry

    async def retry():
        async with get_client() as client:
            await client.set_flow_run_state(flow_run_id, AwaitingRetry(), force=True)

    asyncio.run(retry())


def test_a_calibration_stop_names_the_users_metric_first_and_retries_reuse_its_finished_pilot(
    prefect_harness, tmp_path, repo_root, tiny_model_dir, monkeypatch
):
    """Issue 48's walk: the activation gate fails on the user's bound and on the kernel's p10; the
    p10 check starts the pre-registered calibration, whose pilot runs over its wall cap. The run's
    state leads with the user's metric; a Retry after restoring that bound reuses the calibration
    pilot's finished steps (and their measured time: the cap still holds); a Retry that passes the
    activation gate reaches the decision, with a report that shows no earlier calibration attempt."""
    from prefect.deployments import run_deployment

    from flows.deployment import gs1_run
    from report import load_run, write_report
    def capped(spec: dict) -> dict:  # a calibration pilot cap any pilot is over (the spec's own field)
        spec.setdefault("pilot", {})["calibration_wall_minutes"] = 1e-4
        return spec

    monkeypatch.chdir(tmp_path)
    spec_path = tmp_path / "spec.json"
    p10_fails = {"kernel_effective_neighbors_p10": {"min": 1000.0}}
    spec_path.write_text(json.dumps(capped(flow_spec(
        repo_root, tiny_model_dir, bounds={"pilot_mean_reward": {"min": 0.95, "max": 1.0}, **p10_fails}))))
    gs1_run.to_deployment(name="calibration-walk", parameters={"spec_path": str(spec_path)}).apply()
    flow_run = run_deployment("gs1-run/calibration-walk", timeout=0)

    # 1. The user's metric first, then what the pre-registered calibration did and why it stopped.
    state = _run_by_runner(gs1_run, flow_run.id)
    assert state.is_failed()
    wall = r"calibration_wall_minutes = ([0-9.e-]+) \(needs ≤ 0\.0001\)"
    first = re.fullmatch(
        r"pilot_mean_reward = [0-9.]+ \(needs ≥ 0\.95\): activation gate failed; also kernel_effective_neighbors_p10 "
        r"= [0-9.]+ \(needs ≥ 1000\); the pre-registered calibration \(bandwidth 0\.5\) then stopped at the "
        r"calibration pilot: " + wall, state.message)
    assert first, state.message
    (attempt_1,) = api.subflow_runs(flow_run.id)
    assert api.task_states(attempt_1.id) == {
        "validate spec": ["Completed"], "correctness preflight": ["Completed"], "offline unit checks": ["Completed"],
        "pilot": ["Completed"], "pilot audit": ["Completed"], "activation gate": ["Failed"],
        "calibration pilot": ["Failed"], "report": ["Completed"],
    }
    records = api.logs([flow_run.id, attempt_1.id])
    assert not any("Traceback" in r.message for r in records), [r.message[:200] for r in records if "Traceback" in r.message]
    # The report's headline is the state message, and its stage rows say where the run stopped;
    # `gs1 report` rendered later from the directory says the same.
    run_dir = next((tmp_path / "runs").glob("flow-test-*"))
    report_md = (run_dir / "report" / "report.md").read_text()
    assert f"This run ended Failed: {state.message}." in report_md
    assert "not run: the flow stopped at the calibration pilot" in report_md
    later = write_report(run_dir, out_dir=tmp_path / "later")
    assert later.headline == f"NO DECISION: STOPPED AT A GATE: This run ended Failed: {state.message}."
    assert later.stopped_at == "calibration_pilot" and later.stages["calibration_pilot"] == "failed"
    shown = api.artifacts(flow_run.id)
    assert {"report-attempt-1", "activation-gate-attempt-1", "calibration-pilot-attempt-1"} <= set(shown), set(shown)
    steps = sorted((run_dir / "calibration").glob("*/steps/step-*.parquet"))
    assert steps
    # the calibration re-piloted only the treatment: the baseline's step is the pilot's, copied
    copied = [r.message for r in records if "in the pilot stage, on the same inputs" in r.message]
    assert len(copied) == 1 and "calibration pilot grpo_gs8: 1 step(s)" in copied[0], copied
    baseline_steps = sorted((run_dir / "pilot" / "grpo_gs8" / "steps").glob("step-*.parquet"))
    assert baseline_steps and [f.read_bytes() for f in baseline_steps] == [
        (run_dir / "calibration" / "grpo_gs8" / "steps" / f.name).read_bytes() for f in baseline_steps]
    written = {f: f.stat().st_mtime_ns for f in steps}

    # 2. The user's bound restored, Retry: the cached stages are Cached, the calibration pilot's
    # finished steps are reused (not run again) with their measured time, so the cap still stops it.
    spec_path.write_text(json.dumps(capped(flow_spec(repo_root, tiny_model_dir, bounds=p10_fails))))
    _retry(flow_run.id)
    state = _run_by_runner(gs1_run, flow_run.id)
    assert state.is_failed()
    second = re.fullmatch(
        r"kernel_effective_neighbors_p10 = [0-9.]+ \(needs ≥ 1000\): activation gate failed; the pre-registered "
        r"calibration \(bandwidth 0\.5\) then stopped at the calibration pilot: " + wall, state.message)
    assert second and second.group(1) == first.group(1), state.message
    attempt_2 = api.subflow_runs(flow_run.id)[-1]
    states = {name: runs[-1] for name, runs in api.task_states(attempt_2.id).items()}
    for stage in ("correctness preflight", "offline unit checks", "pilot", "pilot audit"):
        assert states[stage] == "Cached", (stage, states)
    assert states["calibration pilot"] == "Failed"
    assert {f: f.stat().st_mtime_ns for f in steps} == written  # not one step run again
    reused = [r.message for r in api.logs([attempt_2.id]) if "reused, not run again" in r.message]
    assert len(reused) == 2, reused  # the treatment's and the baseline's
    shown = api.artifacts(flow_run.id)
    assert {"report-attempt-2", "spec-revision-attempt-2", "calibration-pilot-attempt-2"} <= set(shown), set(shown)
    revision = shown["spec-revision-attempt-2"][-1]
    assert revision.description.startswith("attempt 2: ") and "activation_gate.checks[pilot_mean_reward].min" in revision.data

    # 3. The activation gate passes (its p10 bound edited back) and the cap is the spec's again:
    # Retry reaches the decision; the calibration is skipped in the report, its plots included.
    spec_path.write_text(json.dumps(flow_spec(repo_root, tiny_model_dir)))
    _retry(flow_run.id)
    state = _run_by_runner(gs1_run, flow_run.id)
    assert state.is_completed(), state.message
    data = load_run(run_dir)
    assert "calibration" not in data.logs and data.earlier_attempt
    report_md = (run_dir / "report" / "report.md").read_text()
    assert "calibration" not in "".join(line for line in report_md.splitlines() if "gate_report" in line)
    shown = api.artifacts(flow_run.id)
    assert {"decision-attempt-3", "report-attempt-3"} <= set(shown), set(shown)
    assert "NO DECISION" not in shown["report-attempt-3"][-1].data


def test_bad_parameters_end_the_run_on_one_line_before_anything_is_written(
    prefect_harness, tmp_path, repo_root, tiny_model_dir, monkeypatch
):
    """Bad form input: refused field by field by the form's validation; started without it, the
    run ends Failed on one line naming the field and its bound (named from the spec, not at
    random), and a model path that does not exist fails before a run directory or a revised spec
    is written. No traceback in the run's logs."""
    import pytest
    from prefect.deployments import run_deployment

    from flows.deployment import gs1_run

    monkeypatch.chdir(tmp_path)
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(flow_spec(repo_root, tiny_model_dir)))
    gs1_run.to_deployment(name="validated", parameters={"spec_path": str(spec_path)}).apply()
    with pytest.raises(Exception) as refused:  # the form's validation on: the server refuses the run
        run_deployment("gs1-run/validated", timeout=0, parameters={"overrides": {"steps": -1}})
    assert "Validation failed for field 'overrides.steps'. Failure reason: -1 is less than or equal to the minimum of 0" \
        in str(refused.value)

    gs1_run.to_deployment(name="unvalidated", parameters={"spec_path": str(spec_path)},
                          enforce_parameter_schema=False).apply()
    for overrides, message in (
        ({"steps": -1}, "overrides.steps = -1: Input should be greater than 0"),
        ({"base_model_path": str(tmp_path / "no-such-model")},
         f"base_model path {str(tmp_path / 'no-such-model')!r} does not exist"),
    ):
        flow_run = run_deployment("gs1-run/unvalidated", timeout=0, parameters={"overrides": overrides})
        state = _run_by_runner(gs1_run, flow_run.id)
        assert state.is_failed() and state.message == message, state.message
        name = api.flow_run(flow_run.id).name
        assert name.startswith(("spec-invalid-overrides-", "flow-test-")) and name.endswith("-local"), name  # not at random
        records = api.logs([flow_run.id])
        assert not any("Traceback" in r.message for r in records), [r.message[:300] for r in records]
        assert f"Finished in state Failed({message!r})" in [r.message for r in records]  # the one line
        assert not api.subflow_runs(flow_run.id)
        assert not (tmp_path / "runs").exists()  # no run directory, no revised spec
