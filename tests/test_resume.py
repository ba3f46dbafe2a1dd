"""Resume: stages served from cache on a re-run (only while their outputs verify), and a killed
training arm resumed from its checkpoint."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from fixtures.tiny_model import tiny_model_dir  # noqa: F401
from fixtures import prefect_api as api
from test_flow import flow_spec, run_flow

TESTS = Path(__file__).resolve().parent

# With a 4th argument N the arm parks after writing its N-th checkpoint, so the test's
# SIGKILL lands at a known point however slowly the machine runs.
TRAIN_SCRIPT = """
import json, sys, time
import fixtures.flow_env  # registers the test env
import tasks.arms
from design.arm import ArmConfig
from schemas.layout import RunLayout
from design.plan import RunContext
arm, run, layout = ArmConfig.model_validate_json(sys.argv[1]), RunContext.model_validate_json(sys.argv[2]), RunLayout(sys.argv[3])
park_after = int(sys.argv[4]) if len(sys.argv) > 4 else 0
write_artifact = tasks.arms.write_artifact
def write_then_park(kind, rows, path):
    out = write_artifact(kind, rows, path)
    if park_after and kind == "checkpoints" and len(rows) >= park_after:
        while True:
            time.sleep(1)
    return out
tasks.arms.write_artifact = write_then_park
tasks.arms.train_with_checkpoints(arm, run, layout, "local", None, checkpoint_every=1)
"""

ARMS_STAGES = ("train gs1_kernel", "train grpo_gs8", "eval gs1_kernel", "eval grpo_gs8")
TIMING_COLUMNS = {"sample_seconds", "train_seconds", "step_seconds", "wall_time"}


def _arm_and_run(model_dir: Path, steps: int) -> tuple[dict, dict]:
    arm = {
        "name": "gs1_kernel", "advantage": "kernel_cross_prompt_baseline", "group_size": 1, "groups_per_batch": 16,
        "lr": 1e-2, "seed": 0, "steps": steps, "lora_rank": 4, "base_model": str(model_dir), "base_model_path": None,
        "max_tokens": 3, "temperature": 1.0,
        # W = 4B: from step 4 on the window holds 3 earlier steps, so a step entered twice, or a
        # resumed window rebuilt differently from the live one, changes the logged baselines.
        "kernel": {"family": "gaussian", "features": ["log_prompt_num_tokens", "prompt_mean_logprob"], "scales": None,
                   "bandwidth": 1.0, "window": 64, "min_mass": 1e-3},
    }
    run = {"env": "token_threshold", "env_options": {}, "renderer": "qwen3_instruct", "base_model": str(model_dir),
           "treatment": "gs1_kernel", "baseline": "grpo_gs8"}
    return arm, run


def _start(arm: dict, run: dict, run_dir: Path, cache: Path, park_after: int = 0) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(TESTS), "GS1_LOCAL_CACHE": str(cache)}
    return subprocess.Popen(
        [sys.executable, "-c", TRAIN_SCRIPT, json.dumps(arm), json.dumps(run), str(run_dir), str(park_after)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )


def _step_logs(run_dir: Path, kind: str) -> list[dict]:
    rows = []
    for f in sorted((run_dir / "train" / "gs1_kernel" / "steps").glob(f"step-*.{kind}.parquet")):
        rows += [{k: v for k, v in r.items() if k not in TIMING_COLUMNS} for r in pq.read_table(f).to_pylist()]
    return rows


def test_killed_arm_resumes_from_its_checkpoint_with_identical_logs(tmp_path, tiny_model_dir):
    arm, run = _arm_and_run(tiny_model_dir, steps=7)
    straight = _start(arm, run, tmp_path / "straight", tmp_path / "cache-a")
    assert straight.wait(timeout=600) == 0, straight.stderr.read().decode()[-2000:]

    killed_dir = tmp_path / "killed"
    proc = _start(arm, run, killed_dir, tmp_path / "cache-b", park_after=4)  # the rebuilt window then holds 4 full steps
    checkpoints = killed_dir / "train" / "gs1_kernel" / "checkpoints.parquet"
    deadline = time.time() + 600
    while time.time() < deadline:
        # one read of the bytes: pq.read_table(path) may open the file twice (footer, then pages)
        # and meet the next checkpoint's file, renamed into place between the two opens
        if checkpoints.exists() and pq.read_table(pa.BufferReader(checkpoints.read_bytes())).num_rows >= 4:
            break
        assert proc.poll() is None, "the arm finished before it could be killed"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    resumed_from = pq.read_table(checkpoints).to_pylist()[-1]["next_step"]
    assert resumed_from == 4
    assert not (killed_dir / "train" / "gs1_kernel" / "final.json").exists()

    again = _start(arm, run, killed_dir, tmp_path / "cache-b")
    assert again.wait(timeout=600) == 0, again.stderr.read().decode()[-2000:]
    assert json.loads((killed_dir / "train/gs1_kernel/final.json").read_text())["arm"] == "gs1_kernel"
    rollouts = _step_logs(killed_dir, "rollouts")
    assert sorted({r["step"] for r in rollouts}) == list(range(7))
    assert rollouts == _step_logs(tmp_path / "straight", "rollouts")
    assert _step_logs(killed_dir, "metrics") == _step_logs(tmp_path / "straight", "metrics")


def _task_states(flow_state) -> dict[str, list[str]]:
    return api.task_states(flow_state.state_details.flow_run_id)


def test_rerun_is_served_from_cache_and_a_changed_gate_bound_reruns_only_the_gate(
    prefect_harness, tmp_path, repo_root, tiny_model_dir
):
    spec = flow_spec(repo_root, tiny_model_dir)
    first, run_dir = run_flow(tmp_path, spec)
    assert first.is_completed(), first.message
    decision = (run_dir / "decision" / "decision.json").read_text()
    # Stage results are stored in the run dir, so deleting a run deletes its cache.
    from prefect.settings import PREFECT_LOCAL_STORAGE_PATH

    stored = list((run_dir / ".stage-results").iterdir())
    assert len(stored) >= 9, stored
    default_store = Path(PREFECT_LOCAL_STORAGE_PATH.value())
    assert not any((default_store / f.name).exists() for f in stored)

    second, _ = run_flow(tmp_path, spec)
    assert second.is_completed()
    states = _task_states(second)
    for stage in ("correctness preflight", "offline unit checks", "pilot", "pilot audit", "activation gate",
                  "feasibility", *ARMS_STAGES, "train audit", "decision"):
        assert states[stage] == ["Cached"], (stage, states[stage])
    # the spec is validated (and recorded) on every run, and the report always re-renders
    assert states["validate spec"] == states["report"] == ["Completed"]
    assert (run_dir / "decision" / "decision.json").read_text() == decision

    damaged_outputs_rerun_their_stage(tmp_path, spec, run_dir)

    # Change only a gate bound: the gate re-evaluates on the cached pilot; training is untouched.
    changed = flow_spec(repo_root, tiny_model_dir, bounds={"frac_nonzero_advantage_treatment": {"min": 0.4}})
    third, _ = run_flow(tmp_path, changed)
    assert third.is_completed()
    states = _task_states(third)
    assert states["validate spec"] == ["Completed"]
    assert states["activation gate"] == ["Completed"]
    for stage in ("correctness preflight", "pilot", *ARMS_STAGES):
        assert states[stage] == ["Cached"], (stage, states[stage])


class _Warnings(logging.Handler):
    """Collects the cache's warnings from Prefect's run loggers (they do not reach caplog)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record):
        if "running the stage" in record.getMessage():
            self.lines.append(record.getMessage())


def damaged_outputs_rerun_their_stage(tmp_path: Path, spec: dict, run_dir: Path) -> None:
    """Damage each kind of output in turn; each re-run redoes that stage (one warning naming the
    file), serves every other stage from cache, and ends on the same decision."""
    decision = (run_dir / "decision" / "decision.json").read_text()
    rollouts = run_dir / "train" / "gs1_kernel" / "rollouts.parquet"
    rows = pq.read_table(rollouts).to_pylist()
    eval_jsonl = run_dir / "eval" / "grpo_gs8" / "eval.jsonl"
    eval_text = eval_jsonl.read_text()
    final = json.loads((run_dir / "train" / "grpo_gs8" / "final.json").read_text())
    adapter = Path(final["sampler_path"]) / "adapter_model.safetensors"
    upstream = ("correctness preflight", "offline unit checks", "pilot", "pilot audit", "activation gate", "feasibility")
    warnings = _Warnings()
    logging.getLogger("prefect").addHandler(warnings)

    def rerun(damaged_file: Path, redone: str) -> dict:
        warnings.lines.clear()
        state, _ = run_flow(tmp_path, spec)
        assert state.is_completed(), state.message
        states = _task_states(state)
        for stage in upstream:
            assert states[stage] == ["Cached"], (stage, states[stage])
        assert states[redone] == ["Completed"], states[redone]
        kind = redone.split()[0]  # that arm only: the other arm's same stage is served from cache
        assert [states[s] for s in ARMS_STAGES if s.startswith(kind) and s != redone] == [["Cached"]]
        assert len(warnings.lines) == 1 and str(damaged_file.resolve()) in warnings.lines[0], warnings.lines
        assert (run_dir / "decision" / "decision.json").read_text() == decision
        return states

    try:
        # A truncated rollout log: the arm that wrote it trains again; the other arm is untouched.
        rollouts.write_bytes(rollouts.read_bytes()[:100])
        states = rerun(rollouts, "train gs1_kernel")
        assert states["eval grpo_gs8"] == ["Cached"]
        assert pq.read_table(rollouts).to_pylist() == rows

        # A cut eval file, then a deleted one: that arm's eval runs again; training is untouched,
        # and the decision (keyed on the eval files' content) is served from cache.
        eval_jsonl.write_text(eval_text[: len(eval_text) // 2])
        states = rerun(eval_jsonl, "eval grpo_gs8")
        assert states["train grpo_gs8"] == states["train gs1_kernel"] == states["decision"] == ["Cached"]
        assert eval_jsonl.read_text() == eval_text
        eval_jsonl.unlink()
        rerun(eval_jsonl, "eval grpo_gs8")
        assert eval_jsonl.read_text() == eval_text

        # A truncated sampler adapter under the local engine's cache: that arm trains again.
        adapter.write_bytes(adapter.read_bytes()[:100])
        rerun(adapter, "train grpo_gs8")
        from safetensors.torch import load_file

        final = json.loads((run_dir / "train" / "grpo_gs8" / "final.json").read_text())
        assert load_file(str(Path(final["sampler_path"]) / "adapter_model.safetensors"))  # whole

        # Nothing damaged: every stage is served from cache, with no warning.
        warnings.lines.clear()
        state, _ = run_flow(tmp_path, spec)
        assert all(v == ["Cached"] for k, v in _task_states(state).items() if k not in ("validate spec", "report"))
        assert warnings.lines == []
    finally:
        logging.getLogger("prefect").removeHandler(warnings)


def _finished_pilot_baseline(layout, inputs: str):
    """A pilot stage's finished baseline on disk (its merged log, one step's log, its record), as
    `_pilot_arm` leaves it."""
    from design.plan import PilotArmRun
    from pipeline.cache import digest_paths
    from schemas.io import write_json_atomic
    from schemas.layout import steps_dir

    arm_dir = layout.pilot_arm_dir("pilot", "grpo_gs8")
    steps_dir(arm_dir).mkdir(parents=True)
    pq.write_table(pa.table({"reward": [1.0, 0.0]}), steps_dir(arm_dir) / "step-00000.rollouts.parquet")
    rollouts = arm_dir / "rollouts.parquet"
    pq.write_table(pa.table({"reward": [1.0, 0.0]}), rollouts)
    ran = PilotArmRun(inputs=inputs, steps=1, setup_seconds=1.5, step_seconds=9.0, wall_seconds=10.5,
                      rollouts=str(rollouts), rollouts_digest=digest_paths(rollouts),
                      steps_digest=digest_paths(steps_dir(arm_dir)))
    write_json_atomic(layout.pilot_arm_record("pilot", "grpo_gs8"), ran.model_dump())
    return ran


def test_a_calibration_pilot_copies_the_pilots_baseline_only_when_it_ran_the_same_inputs(tmp_path):
    """The calibration changes only the treatment's kernel, so its pilot takes the baseline's step
    from the pilot stage: copied into its own folder with a record that verifies there (a Retry
    reuses it as its own), the measured times the pilot's. Another input (a changed arm, say), a
    damaged pilot log or the pilot stage itself copies nothing."""
    from design.arm import ArmConfig
    from schemas.layout import RunLayout, steps_dir
    from tasks.arms import _copied_from_the_pilot, _finished_pilot_arm

    layout = RunLayout(tmp_path / "run")
    arm = ArmConfig(name="grpo_gs8", advantage="group_mean", group_size=8, groups_per_batch=8, lr=4e-5, seed=0,
                    steps=40, lora_rank=32, base_model="a-model")
    ran = _finished_pilot_baseline(layout, "inputs-a")
    assert _copied_from_the_pilot(arm, "inputs-a", layout, "pilot") is None  # the pilot stage is the source
    assert _copied_from_the_pilot(arm, "inputs-b", layout, "calibration") is None
    assert not layout.pilot_arm_dir("calibration", "grpo_gs8").exists()

    copied = _copied_from_the_pilot(arm, "inputs-a", layout, "calibration")
    here = layout.pilot_arm_dir("calibration", "grpo_gs8")
    assert copied is not None and copied.rollouts == str(here / "rollouts.parquet")
    assert (copied.steps, copied.step_seconds, copied.wall_seconds) == (ran.steps, ran.step_seconds, ran.wall_seconds)
    assert (steps_dir(here) / "step-00000.rollouts.parquet").read_bytes() == \
        (steps_dir(layout.pilot_arm_dir("pilot", "grpo_gs8")) / "step-00000.rollouts.parquet").read_bytes()
    assert _finished_pilot_arm(layout.pilot_arm_record("calibration", "grpo_gs8"), "inputs-a") == copied

    # a pilot log changed after its record was written: nothing to copy, the calibration runs the arm
    import shutil

    shutil.rmtree(here)
    pq.write_table(pa.table({"reward": [0.0, 0.0]}),
                   steps_dir(layout.pilot_arm_dir("pilot", "grpo_gs8")) / "step-00000.rollouts.parquet")
    assert _copied_from_the_pilot(arm, "inputs-a", layout, "calibration") is None
    assert not here.exists()
