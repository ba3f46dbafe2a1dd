"""The experiment flow end to end on a tiny model: gates stop it, a clean run reaches a decision."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

import fixtures.flow_env  # noqa: F401  (registers the token_threshold env)
from fixtures.tiny_model import tiny_model_dir  # noqa: F401
from schemas.artifacts import read_rows
from design.plan import RunPlan


def flow_spec(repo_root: Path, model_dir: Path, **changes) -> dict:
    spec = json.loads((repo_root / "specs" / "demo_local.json").read_text())
    spec.update(
        title="flow test", base_model=str(model_dir), base_model_path=None, renderer="qwen3_instruct",
        batch_size=16, steps=3, lora_rank=4, max_seq_len=64, sampling={"max_tokens": 2, "temperature": 1.0},
        pilot={"steps": 2, "heldout_prompts": 16, "heldout_samples": 8},
        budget={"gpu_hours": 1.0, "max_wall_minutes": 60},
    )
    spec["dataset"] = {"name": "token_threshold", "n_examples": 48}
    spec["eval"] = {**spec["eval"], "n_examples": 48}
    spec["feasibility"] = {**spec["feasibility"], "effective_config": None}
    spec["arms"] = [
        {"name": "grpo_gs8", "advantage": "group_mean", "group_size": 8, "groups_per_batch": 2, "lr": 1e-3, "seed": 0},
        {"name": "gs1_kernel", "advantage": "kernel_cross_prompt_baseline", "group_size": 1, "groups_per_batch": 16,
         "lr": 1e-3, "seed": 0, "kernel": {"bandwidth": 1.0, "window": 64}},  # W = 4B
    ]
    bounds = {"kernel_effective_neighbors_p10": {"min": 2.0}, **changes.pop("bounds", {})}
    for check in spec["activation_gate"]["checks"]:
        check.update(bounds.get(check["metric"], {}))
    spec.update(changes)
    return spec


def run_flow(tmp_path: Path, spec: dict):
    from flows.experiment import experiment_in

    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    run_dir = tmp_path / "run"
    state = experiment_in(run_dir)(spec_path=str(spec_path), run_dir=str(run_dir), backend="local", return_state=True)
    return state, run_dir


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def test_clean_run_reaches_a_paired_decision(prefect_harness, tmp_path, repo_root, tiny_model_dir):
    engine, lines = logging.getLogger("gs1.engine"), _Lines()
    level = engine.level
    engine.setLevel(logging.INFO)
    engine.addHandler(lines)
    try:
        state, run_dir = run_flow(tmp_path, flow_spec(repo_root, tiny_model_dir))
    finally:
        engine.removeHandler(lines)
        engine.setLevel(level)
    assert state.is_completed(), state.message
    # the training and eval stages each say how busy the engine's device queue was, and on what
    usage = {m.split(":")[0]: m for m in lines.lines if " busy " in m}
    assert set(usage) == {"train", "eval"}, usage
    assert "forward_backward" in usage["train"] and "optim_step" in usage["train"]
    assert "sampling batches" in usage["eval"] and "forward_backward" not in usage["eval"]
    decision = json.loads((run_dir / "decision" / "decision.json").read_text())
    assert decision["verdict"] in {"noninferior", "inferior", "inconclusive"}
    assert decision["n"] == 48
    # The decision is recomputable from the per-item eval files the flow wrote.
    t = {r["item_id"]: r["correct"] for r in map(json.loads, (run_dir / "eval/gs1_kernel/eval.jsonl").open())}
    b = {r["item_id"]: r["correct"] for r in map(json.loads, (run_dir / "eval/grpo_gs8/eval.jsonl").open())}
    assert set(t) == set(b) and len(t) == 48
    assert decision["mean_diff"] == pytest.approx(np.mean([float(t[i]) - float(b[i]) for i in t]), abs=1e-12)
    # Both arms trained every step with the executed group sizes of the spec, from the same prompt order.
    for arm, group in (("gs1_kernel", 1), ("grpo_gs8", 8)):
        rows = read_rows("rollouts", run_dir / "train" / arm / "rollouts.parquet")
        assert sorted({r["step"] for r in rows}) == [0, 1, 2]
        counts = {}
        for r in rows:
            counts[(r["step"], r["prompt_id"])] = counts.get((r["step"], r["prompt_id"]), 0) + 1
        assert set(counts.values()) == {group}
    gs1_first = [r["prompt_id"] for r in read_rows("rollouts", run_dir / "train/gs1_kernel/rollouts.parquet")][:2]
    grpo_first = [r["prompt_id"] for r in read_rows("rollouts", run_dir / "train/grpo_gs8/rollouts.parquet")][::8][:2]
    assert gs1_first == grpo_first  # the shared seed-0 order
    gate = read_rows("gate_report", run_dir / "gate" / "gate_report.parquet")
    assert gate and all(r["passed"] for r in gate)
    assert (run_dir / "preflight" / "record.json").is_file()
    # every gate report names its gate as the stage's one name (task run, artifact key, report)
    for folder, name in (("preflight", "correctness preflight"), ("unit_checks", "offline unit checks"),
                         ("gate", "activation gate"), ("audit/pilot", "pilot audit"), ("audit/train", "train audit"),
                         ("feasibility", "feasibility")):
        assert {r["gate"] for r in read_rows("gate_report", run_dir / folder / "gate_report.parquet")} == {name}
    # Both arms' logs were audited against the independent references before the gate and the decision.
    for stage, steps in (("pilot", {"gs1_kernel": 2, "grpo_gs8": 1}), ("train", {"gs1_kernel": 3, "grpo_gs8": 3})):
        audit = {r["metric"]: r for r in read_rows("gate_report", run_dir / "audit" / stage / "gate_report.parquet")}
        assert set(audit) == {"gs1_kernel.max_abs_diff", "grpo_gs8.max_abs_diff"}
        for arm, n_steps in steps.items():
            observed = json.loads(audit[f"{arm}.max_abs_diff"]["observed"])
            assert audit[f"{arm}.max_abs_diff"]["passed"] and observed["steps"] == n_steps and observed["mismatches"] == 0
        assert json.loads(audit["gs1_kernel.max_abs_diff"]["observed"])["reference"] == "estimators.reference.gs1_kernel_log_reference"
        assert "compute_advantages" in json.loads(audit["grpo_gs8.max_abs_diff"]["observed"])["reference"]
    feasibility = json.loads((run_dir / "feasibility" / "feasibility.json").read_text())
    assert feasibility["status"] == "feasible" and feasibility["wall_seconds"] > 0
    # the power of the spec's rule, recorded beside the projection (the spec has no power gate: no row for it)
    plan = RunPlan.model_validate_json((run_dir / "spec" / "plan.json").read_text())
    assert feasibility["power"] == json.loads(json.dumps(plan.power_reading().record()))
    assert "power" not in {r["metric"] for r in read_rows("gate_report", run_dir / "feasibility" / "gate_report.parquet")}
    # The pilot ran its two arms side by side: the baseline's step overlaps the treatment's steps.
    spans = {}
    for arm in ("gs1_kernel", "grpo_gs8"):
        m = read_rows("step_metrics", run_dir / "pilot" / arm / "step_metrics.parquet")
        spans[arm] = (min(r["wall_time"] - r["step_seconds"] for r in m), max(r["wall_time"] for r in m))
    assert max(a for a, _ in spans.values()) < min(b for _, b in spans.values()), spans
    # The flow ran its stages in the order of the one stage table (schemas.layout.STAGES), every
    # task run named by it; the same run's task runs, in the order they were started.
    assert_stages_in_table_order(state, expected={"spec", "preflight", "unit_checks", "pilot", "audit_pilot",
                                                  "activation_gate", "feasibility", "train", "audit_train", "eval",
                                                  "decision", "report"})


def assert_stages_in_table_order(state, expected: set[str]) -> None:
    from fixtures import prefect_api as api
    from schemas.layout import stage_of_run

    names = [r.name for r in api.task_runs([state.state_details.flow_run_id])]
    stages = [stage_of_run(name) for name in names]
    assert None not in stages, f"task runs the stage table does not name: {[n for n, s in zip(names, stages) if s is None]}"
    orders = [s.order for s in stages]
    assert orders == sorted(orders), f"stages out of the table's order: {names}"
    assert {s.id for s in stages} == expected, names


def test_failing_gate_stops_the_flow_with_the_metric_in_the_state(prefect_harness, tmp_path, repo_root, tiny_model_dir):
    spec = flow_spec(repo_root, tiny_model_dir, bounds={"pilot_mean_reward": {"min": 0.95, "max": 1.0}})
    state, run_dir = run_flow(tmp_path, spec)
    assert state.is_failed()
    assert "pilot_mean_reward" in state.message and "(needs ≥ 0.95)" in state.message
    gate = [r for r in read_rows("gate_report", run_dir / "gate" / "gate_report.parquet") if r["metric"] == "pilot_mean_reward"]
    failed = [r for r in gate if not r["passed"]]
    assert len(failed) == 1 and failed[0]["op"] == "min" and failed[0]["value"] < 0.95
    # Nothing after the gate ran.
    assert not (run_dir / "feasibility").exists()
    assert not (run_dir / "train").exists()
    assert not (run_dir / "decision").exists()


def test_preflight_catches_a_broken_estimator(prefect_harness, tmp_path, repo_root, tiny_model_dir, monkeypatch):
    import estimators.kernel_cross_prompt_baseline
    from estimators import KernelAdvantages, gs1_kernel_step

    def broken_gs1_kernel_step(rewards_B, features_B_F, *args, **kw):
        # A classic bug: the baseline keeps rollout i's own reward in its mean.
        good = gs1_kernel_step(rewards_B, features_B_F, *args, **kw)
        n = len(rewards_B)
        baseline = (good.baseline * (n - 1) + np.asarray(rewards_B)) / n
        return KernelAdvantages(baseline, np.asarray(rewards_B) - baseline, good.kernel_mass, good.effective_neighbors, good.fallback)

    monkeypatch.setattr(estimators.kernel_cross_prompt_baseline, "gs1_kernel_step", broken_gs1_kernel_step)
    state, run_dir = run_flow(tmp_path, flow_spec(repo_root, tiny_model_dir))
    assert state.is_failed()
    assert "correctness preflight failed" in state.message and state.message.startswith("step_check_gs1_kernel")
    assert not (run_dir / "pilot").exists()


def _logging_bug_from_step(monkeypatch, first_step: int):
    """A loop whose logged baselines drift from what it trained on, from `first_step` on (the
    advantages it trains with stay right: only an audit of the logs can see it)."""
    import rl.loop

    run_step = rl.loop.run_step

    def run_step_logging_wrong(step, arm, **kw):
        log = run_step(step, arm, **kw)
        if step >= first_step and arm.name == "gs1_kernel":
            log.rollouts = [row.with_columns(baseline=row.baseline + 0.03) for row in log.rollouts]
        return log

    monkeypatch.setattr(rl.loop, "run_step", run_step_logging_wrong)


def test_audit_of_the_pilot_stops_the_run_before_the_activation_gate(prefect_harness, tmp_path, repo_root, tiny_model_dir,
                                                                     monkeypatch):
    _logging_bug_from_step(monkeypatch, first_step=0)
    state, run_dir = run_flow(tmp_path, flow_spec(repo_root, tiny_model_dir))
    assert state.is_failed()
    assert state.message.startswith("gs1_kernel.max_abs_diff = ") and "pilot audit failed" in state.message
    mismatches = read_rows("audit_mismatches", run_dir / "audit" / "pilot" / "mismatches.parquet")
    assert {m["arm"] for m in mismatches} == {"gs1_kernel"} and {m["column"] for m in mismatches} == {"baseline"}
    assert mismatches[0]["step"] == 0 and mismatches[0]["row"] == 0
    assert abs(mismatches[0]["logged"] - mismatches[0]["recomputed"] - 0.03) < 1e-9
    assert not (run_dir / "gate").exists()


def test_audit_of_training_stops_the_run_before_the_decision(prefect_harness, tmp_path, repo_root, tiny_model_dir,
                                                             monkeypatch):
    _logging_bug_from_step(monkeypatch, first_step=2)  # the pilot (steps 0, 1) is clean
    state, run_dir = run_flow(tmp_path, flow_spec(repo_root, tiny_model_dir))
    assert state.is_failed()
    assert "train audit failed" in state.message
    assert all(r["passed"] for r in read_rows("gate_report", run_dir / "audit" / "pilot" / "gate_report.parquet"))
    rows = {r["metric"]: r for r in read_rows("gate_report", run_dir / "audit" / "train" / "gate_report.parquet")}
    assert rows["grpo_gs8.max_abs_diff"]["passed"] and not rows["gs1_kernel.max_abs_diff"]["passed"]
    mismatches = read_rows("audit_mismatches", run_dir / "audit" / "train" / "mismatches.parquet")
    assert mismatches and all(m["step"] == 2 and m["row"] >= 32 for m in mismatches)  # rows of step 2, B = 16
    assert not (run_dir / "decision").exists() and not (run_dir / "eval").exists()


def test_gs1_run_gate_failure_is_one_line_exit_1_without_traceback(prefect_harness, tmp_path, repo_root,
                                                                   tiny_model_dir, capfd):
    """`gs1 run` on a spec whose gate fails: exit 1, its last line names the metric, the value and
    the bound, and nothing on the terminal is a traceback (Prefect's task-failure log included)."""
    from gs1.cli import main

    import logging
    import sys

    spec = flow_spec(repo_root, tiny_model_dir, bounds={"pilot_mean_reward": {"min": 0.95, "max": 1.0}})
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    # A terminal handler on this test's stderr (Prefect's own console handler may hold an earlier
    # test's captured stream); `gs1 run` filters every console handler of the root logger.
    terminal = logging.StreamHandler(sys.stderr)
    logging.getLogger().addHandler(terminal)
    try:
        rc = main(["run", str(spec_path), "--run-dir", str(tmp_path / "run")])
    finally:
        logging.getLogger().removeHandler(terminal)
    out, err = capfd.readouterr()
    assert rc == 1
    last = err.strip().splitlines()[-1]
    assert last.startswith("gs1: pilot_mean_reward = ") and "(needs ≥ 0.95): activation gate failed" in last
    assert "Finished in state Failed('pilot_mean_reward = " in out + err  # Prefect's one line is still there
    assert "Traceback" not in out + err


def test_gs1_run_user_error_inside_the_flow_is_one_line_exit_2_without_traceback(
    prefect_harness, tmp_path, repo_root, tiny_model_dir, capfd
):
    """A malformed data line found by a stage: the run ends on that one line, exit 2, and no
    traceback of Prefect's (task or flow failure) reaches the terminal."""
    import logging
    import sys

    from gs1.cli import main

    data = tmp_path / "gsm8k"
    data.mkdir()
    good = json.dumps({"question": "What is 2 + 2?", "answer": "2 + 2 = 4\n#### 4"})
    (data / "train.jsonl").write_text(f"{good}\n{good}\n{{not json\n")
    (data / "test.jsonl").write_text(f"{good}\n")
    spec = flow_spec(repo_root, tiny_model_dir)
    spec["dataset"] = {"name": "gsm8k", "n_examples": 3}
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    terminal = logging.StreamHandler(sys.stderr)
    logging.getLogger().addHandler(terminal)
    try:
        rc = main(["run", str(spec_path), "--run-dir", str(tmp_path / "run"), "--data-dir", str(data)])
    finally:
        logging.getLogger().removeHandler(terminal)
    out, err = capfd.readouterr()
    assert rc == 2
    assert err.strip().splitlines()[-1].startswith(f"gs1: error: {data / 'train.jsonl'}:3: not valid JSON"), err[-500:]
    assert "Traceback" not in out + err


def _gs1_run(spec_path, run_dir):
    import logging
    import sys

    from gs1.cli import main

    terminal = logging.StreamHandler(sys.stderr)
    logging.getLogger().addHandler(terminal)
    try:
        return main(["run", str(spec_path), "--run-dir", str(run_dir)])
    finally:
        logging.getLogger().removeHandler(terminal)


def test_an_arm_out_of_memory_ends_gs1_run_on_one_line_and_the_run_resumes(
    prefect_harness, tmp_path, repo_root, tiny_model_dir, capfd, monkeypatch
):
    import rl.loop
    from test_arm_failure import OOM_TEXT, out_of_memory_on_forward_backward

    real_run_step = rl.loop.run_step

    def run_step(step, arm, **kw):
        # the training stage only (the pilot's treatment steps carry a held-out request)
        if arm.name == "gs1_kernel" and kw.get("heldout") is None and step == 1:
            kw["training_client"] = out_of_memory_on_forward_backward(kw["training_client"])
        return real_run_step(step, arm, **kw)

    monkeypatch.setattr(rl.loop, "run_step", run_step)
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(flow_spec(repo_root, tiny_model_dir)))
    run_dir = tmp_path / "run"
    rc = _gs1_run(spec_path, run_dir)
    out, err = capfd.readouterr()
    assert rc == 1
    last = err.strip().splitlines()[-1]
    assert last.startswith("gs1: train gs1_kernel failed at step 2/3: out of memory (OutOfMemoryError: "
                           + OOM_TEXT), last
    assert last.endswith("the same command resumes it")
    assert "Traceback" not in out + err
    # the other arm finished and its stage result is kept; the failed arm's first step is logged
    baseline_final = run_dir / "train" / "grpo_gs8" / "final.json"
    assert baseline_final.is_file()
    assert (run_dir / "train" / "gs1_kernel" / "steps" / "step-00000.rollouts.parquet").is_file()
    assert not (run_dir / "decision" / "decision.json").exists()

    # The fault cleared, the same command resumes: the finished arm is not trained again.
    monkeypatch.setattr(rl.loop, "run_step", real_run_step)
    finished_at = baseline_final.stat().st_mtime_ns
    assert _gs1_run(spec_path, run_dir) == 0
    assert (run_dir / "decision" / "decision.json").is_file()
    assert baseline_final.stat().st_mtime_ns == finished_at
