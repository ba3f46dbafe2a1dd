"""The run report: synthetic run directories written with the artifact schemas, rendered to PNG
plots, one self-contained HTML page and a markdown summary; `gs1 report` exit codes."""

from __future__ import annotations

import base64
import html
import json
import re
from pathlib import Path

import numpy as np
import pytest

from gs1.cli import main
from report import PLOTS, load_run, stage_statuses, write_report
from rl.stats import paired_decision
from schemas.artifacts import STEP_EXTRA_METRICS, RolloutRow
from schemas.artifacts import read_rows, write_artifact
from schemas.errors import UserError
from schemas.io import write_json_atomic, write_jsonl_atomic

TREATMENT, BASELINE = "gs1_kernel", "grpo_gs8"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

CHECKS = [
    {"metric": "executed_group_size_treatment", "one_of": ["1"], "measures": "rollouts per distinct prompt in treatment batches"},
    {"metric": "executed_group_size_baseline", "one_of": ["8"], "measures": "rollouts per distinct prompt in baseline batches"},
    {"metric": "pilot_mean_reward", "min": 0.1, "max": 0.9, "measures": "mean training reward over the first 2 treatment steps"},
    {"metric": "kernel_effective_neighbors_p10", "min": 8.0, "measures": "10th percentile over rollouts of (sum w)^2/sum w^2"},
    {"metric": "frac_nonzero_advantage_treatment", "min": 0.5, "measures": "fraction of treatment rollouts with |advantage|>1e-6"},
]


def _plan() -> dict:
    kernel = {"family": "gaussian", "features": ["log_prompt_num_tokens", "prompt_mean_logprob"], "scales": None,
              "bandwidth": 0.5, "window": 64, "min_mass": 1e-3}
    common = {"base_model": "HuggingFaceTB/SmolLM2-135M-Instruct", "lora_rank": 8, "lr": 1e-4, "max_tokens": 16,
              "seed": 0, "steps": 4, "temperature": 1.0}
    return {
        "title": "Synthetic report run",
        "run": {"env": "arithmetic", "env_options": {}, "renderer": "qwen3_instruct", "base_model": common["base_model"],
                "treatment": TREATMENT, "baseline": BASELINE},
        "arms": [
            {**common, "name": BASELINE, "advantage": "group_mean", "group_size": 8, "groups_per_batch": 2},
            {**common, "name": TREATMENT, "advantage": "kernel_cross_prompt_baseline", "group_size": 1, "groups_per_batch": 16,
             "kernel": kernel},
        ],
        "pilot": {"steps": 2, "heldout_prompts": 8, "heldout_samples": 8},
        "checks": CHECKS,
        "n_eval": 40,
        "decision": {"alpha": 0.05, "margin": -0.03, "bounds": [0.0, 1.0], "criterion": "primary", "method": "paired_hoeffding"},
        "budget": {"gpu_hours": 0.5, "max_wall_minutes": 30.0},
        "preflight": {"paths": []},
    }


def _rollouts(arm: str, steps: range, rng) -> list[dict]:
    kernel = arm == TREATMENT
    group_size, groups = (1, 16) if kernel else (8, 2)
    rows = []
    for step in steps:
        for g in range(groups):
            for s in range(group_size):
                reward = float(rng.random() < 0.4 + 0.05 * step)
                baseline = float(rng.uniform(0.2, 0.6))
                rows.append(RolloutRow.sampled(
                    step=step, arm=arm, seed=0, prompt_id=f"arithmetic/train/{step * groups + g}",
                    group_id=g, sample_idx=s, prompt_num_tokens=int(rng.integers(20, 40)),
                    prompt_mean_logprob=float(rng.normal(-2.0, 0.3)), reward=reward, num_tokens=8,
                    stop_reason="stop", baseline=baseline, advantage=reward - baseline,
                    kernel_mass=float(rng.uniform(5, 20)) if kernel else None,
                    effective_neighbors=float(rng.uniform(5, 30)) if kernel else None,
                    fallback=False if kernel else None, response=f"{step}-{g}-{s}",
                ).as_dict())
    return rows


def _metrics(arm: str, rollouts: list[dict]) -> list[dict]:
    rows = []
    for step in sorted({r["step"] for r in rollouts}):
        of_step = [r for r in rollouts if r["step"] == step]
        rewards = np.array([r["reward"] for r in of_step])
        adv = np.array([r["advantage"] for r in of_step])
        eff = [r["effective_neighbors"] for r in of_step if r["effective_neighbors"] is not None]
        rows.append({
            "step": step, "arm": arm, "seed": 0, "reward_mean": float(rewards.mean()), "reward_std": float(rewards.std()),
            "advantage_abs_mean": float(np.abs(adv).mean()), "frac_nonzero_advantage": float(np.mean(np.abs(adv) > 1e-6)),
            "baseline_mean": float(np.mean([r["baseline"] for r in of_step])), "loss": 0.1, "num_datums": len(of_step),
            "num_tokens": 40 * len(of_step), "effective_neighbors_p10": float(np.percentile(eff, 10)) if eff else None,
            "sample_seconds": 2.0, "train_seconds": 3.0, "step_seconds": 5.5, "wall_time": 1.7e9 + 10 * step,
            **dict.fromkeys(STEP_EXTRA_METRICS),
        })
    return rows


def _write_arm_logs(arm_dir: Path, arm: str, steps: range, rng, merged: bool = True) -> None:
    rollouts = _rollouts(arm, steps, rng)
    metrics = _metrics(arm, rollouts)
    for step in steps:
        write_artifact("rollouts", [r for r in rollouts if r["step"] == step], arm_dir / "steps" / f"step-{step:05d}.rollouts.parquet")
        write_artifact("step_metrics", [m for m in metrics if m["step"] == step], arm_dir / "steps" / f"step-{step:05d}.metrics.parquet")
    if merged:
        write_artifact("rollouts", rollouts, arm_dir / "rollouts.parquet")
        write_artifact("step_metrics", metrics, arm_dir / "step_metrics.parquet")


def _gate(gate: str, rows: list[tuple], out: Path) -> None:
    write_artifact("gate_report", [
        {"gate": gate, "metric": m, "value": v, "op": op, "bound": b, "passed": ok, "observed": None} for m, v, op, b, ok in rows
    ], out / "gate_report.parquet")


def _activation_rows(frac_nonzero: float, p10: float = 11.5) -> list[tuple]:
    return [
        ("executed_group_size_treatment", 1.0, "one_of", "(1.0,)", True),
        ("executed_group_size_baseline", 8.0, "one_of", "(8.0,)", True),
        ("pilot_mean_reward", 0.42, "min", "0.1", True),
        ("pilot_mean_reward", 0.42, "max", "0.9", True),
        ("kernel_effective_neighbors_p10", p10, "min", "8.0", p10 >= 8.0),
        ("frac_nonzero_advantage_treatment", frac_nonzero, "min", "0.5", frac_nonzero >= 0.5),
    ]


def _audit(out: Path, passed: bool = True) -> None:
    """An audit's gate_report as tasks/gates.py writes it: one row per arm, its largest
    |logged - recomputed| against the tolerance."""
    rows = [(f"{TREATMENT}.max_abs_diff", 0.0 if passed else 0.25, "max", "1e-09", passed),
            (f"{BASELINE}.max_abs_diff", 0.0, "max", "1e-09 + float32 rounding of the cookbook", True)]
    _gate("audit", rows, out)


def make_run(root: Path, *, stop_at_activation: bool = False, calibrated: bool = False) -> Path:
    """A run directory as the flow writes it: complete, or stopped by a failed activation gate."""
    rng = np.random.default_rng(0)
    run = root / "synthetic-run-0123456789ab"
    plan = _plan()
    write_json_atomic(run / "spec" / "plan.json", plan)
    write_json_atomic(run / "spec" / "spec.json", {"title": plan["title"], "hypothesis": "GS1 is noninferior to GRPO."})
    _gate("correctness_preflight", [("reference_loss", -1e-6, "max", "0 (excess over tolerance)", True),
                                    ("probe_gs1_kernel", 0.0, "max", "finite", True)], run / "preflight")
    write_json_atomic(run / "preflight" / "record.json", {"backend": "local", "checks": []})
    _gate("offline_unit_checks", [("forced_activation", 1.0, "min", "1", True)], run / "unit_checks")
    for arm, n_steps in ((TREATMENT, 2), (BASELINE, 1)):
        _write_arm_logs(run / "pilot" / arm, arm, range(n_steps), rng)
    _audit(run / "audit" / "pilot")
    write_artifact("heldout", [{"prompt_id": f"arithmetic/train/{k}", "sample_idx": 0, "reward": 1.0} for k in range(8)],
                   run / "pilot" / "heldout.parquet")
    write_json_atomic(run / "pilot" / "timings.json", {"setup_seconds": {TREATMENT: 12.0, BASELINE: 11.0},
                      "step_seconds": {TREATMENT: 5.5, BASELINE: 5.5}, "eval_seconds_per_item": 0.2, "bandwidth": None})
    if stop_at_activation:
        _gate("activation_gate", _activation_rows(frac_nonzero=0.3125), run / "gate")
        return run
    if calibrated:
        _gate("activation_gate", _activation_rows(frac_nonzero=0.9, p10=3.25), run / "gate")
        _write_arm_logs(run / "calibration" / TREATMENT, TREATMENT, range(2), rng)
        _audit(run / "audit" / "calibration")
        _gate("activation_gate", _activation_rows(frac_nonzero=0.9, p10=9.5), run / "calibration" / "gate")
        write_json_atomic(run / "calibration" / "revised_spec.json",
                          {"revisions": [{"change": {"arm": TREATMENT, "kernel.bandwidth": 1.0}}]})
    else:
        _gate("activation_gate", _activation_rows(frac_nonzero=0.9), run / "gate")
    write_json_atomic(run / "feasibility" / "feasibility.json", {
        "phases": {"setup": 12.0, "train": 22.0, "eval": 16.0, "reserve": 12.5}, "wall_seconds": 62.5,
        "gpu_hours": 0.0, "budget_wall_seconds": 1800.0, "budget_gpu_hours": 0.5, "status": "feasible"})
    _gate("feasibility", [("projected_wall_minutes", 62.5 / 60, "max", "30.0", True),
                          ("projected_gpu_hours", 0.0, "max", "0.5", True)], run / "feasibility")
    for arm in (BASELINE, TREATMENT):
        _write_arm_logs(run / "train" / arm, arm, range(4), rng)
        write_json_atomic(run / "train" / arm / "final.json", {"arm": arm, "sampler_path": "/tmp/x"})
        write_artifact("checkpoints", [{"next_step": 2, "state_path": "/tmp/state", "wall_time": 1.7e9, "critic_state_path": None}],
                       run / "train" / arm / "checkpoints.parquet")
    _audit(run / "audit" / "train")
    correct = {TREATMENT: rng.random(40) < 0.7, BASELINE: rng.random(40) < 0.5}
    for arm, flags in correct.items():
        rows = [{"item_id": f"arithmetic/test/{k}", "arm": arm, "correct": bool(c), "extracted_answer": "3",
                 "reference": "3", "response": "3", "num_tokens": 4} for k, c in enumerate(flags)]
        write_artifact("eval_items", rows, run / "eval" / arm / "eval.parquet")
        write_jsonl_atomic(run / "eval" / arm / "eval.jsonl", [{"item_id": r["item_id"], "correct": r["correct"]} for r in rows])
    record = paired_decision(run / "eval" / TREATMENT / "eval.jsonl", run / "eval" / BASELINE / "eval.jsonl",
                             alpha=0.05, margin=-0.03, n_resamples=500)
    record = {**record, "criterion": "primary", "treatment": TREATMENT, "baseline": BASELINE}
    write_json_atomic(run / "decision" / "decision.json", record)
    return run


def _external_urls(text: str) -> list[str]:
    return re.findall(r"https?://[^\s\"'<>)]+", text)


def test_complete_run_report(tmp_path):
    run = make_run(tmp_path)
    verdict = json.loads((run / "decision" / "decision.json").read_text())["verdict"]
    result = write_report(run)

    out = run / "report"
    assert result.out_dir == out and result.verdict == verdict and result.stopped_at is None
    assert sorted(result.plots) == sorted(PLOTS) and result.not_drawn == {}
    for name in PLOTS:
        png = (out / f"{name}.png").read_bytes()
        assert png.startswith(PNG_MAGIC) and len(png) > 5000, name
    page = (out / "report.html").read_text()
    # The verdict, large, near the top (before the stage table), and the arms and their budgets.
    assert page.index(f">{verdict.upper()}<") < page.index("<h2>Stages</h2>")
    for arm in (TREATMENT, BASELINE):
        assert arm in page
    assert "<td>16 × 1 = 16</td>" in page and "<td>2 × 8 = 16</td>" in page
    assert "h=0.5, window 64" in page
    # Every stage ran; every gate has its table; no missing-stage message.
    assert set(result.stages.values()) <= {"done", "passed", "skipped"}
    assert result.stages["calibration"] == result.stages["audit_calibration"] == "skipped"
    assert result.stages["audit_pilot"] == result.stages["audit_train"] == "passed"
    gates = ("correctness preflight", "offline unit checks", "pilot audit", "activation gate", "feasibility",
             "train audit")
    for gate in gates:
        assert f"<h3>{gate} " in page
    assert "NOT RUN" not in page and "FAIL<" not in page
    # The embedded images are exactly the PNG files; nothing is fetched from anywhere.
    uris = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert sorted(base64.b64decode(u) for u in uris) == sorted((out / f"{n}.png").read_bytes() for n in PLOTS)
    assert not _external_urls(page)
    assert not re.search(r'(?:src|href)="(?!data:)', page) and "<script" not in page
    # The decision, with each secondary statistic explained.
    for label in ("mean difference", "Hoeffding bounds", "margin", "bootstrap CI", "McNemar p", "smallest detectable"):
        assert f"<th>{label}</th>" in page
    md = (out / "report.md").read_text()
    assert verdict.upper() in md and all(f"]({n}.png)" in md for n in PLOTS) and not _external_urls(md)


def test_report_is_deterministic(tmp_path):
    run = make_run(tmp_path)
    first = write_report(run, out_dir=tmp_path / "a")
    second = write_report(run, out_dir=tmp_path / "b")
    for name in ["report.html", "report.md", *(f"{p}.png" for p in PLOTS)]:
        assert (Path(first.out_dir) / name).read_bytes() == (Path(second.out_dir) / name).read_bytes(), name


def test_failed_activation_gate_report(tmp_path):
    run = make_run(tmp_path, stop_at_activation=True)
    result = write_report(run)
    page = Path(result.html).read_text()

    assert result.verdict is None and result.stopped_at == "activation_gate"
    assert "NO DECISION: STOPPED AT A GATE" in page
    # The failing check: metric, value and bound, in the headline and as a red FAIL row.
    assert "frac_nonzero_advantage_treatment = 0.3125 (needs ≥ 0.5)" in page
    row = re.search(r'<tr class="failrow"><td>frac_nonzero_advantage_treatment</td>.*?</tr>', page)
    assert row and "0.3125" in row.group(0) and "≥ 0.5" in row.group(0) and ">FAIL<" in row.group(0)
    assert page.count('class="failrow"><td>frac_nonzero') == 1 and 'class="passrow"><td>pilot_mean_reward' in page
    # Every later stage says it did not run and why; calibration was not the answer to this failure.
    stages = result.stages
    assert stages["activation_gate"] == "failed" and stages["pilot"] == "done"
    for key in ("feasibility", "train", "eval", "decision"):
        assert stages[key] == "not run", key
    assert page.count("not run: the flow stopped at the activation gate") >= 4
    assert "the pre-registered calibration only answers a failed kernel_effective_neighbors_p10" in page
    # Plots from what exists (the pilot); eval is not drawn, and the page says why.
    assert set(result.plots) == {"reward_per_step", "advantage_baseline", "effective_neighbours", "wall_time"}
    assert "eval did not run" in result.not_drawn["eval_accuracy"]
    assert len(re.findall(r'src="data:image/png;base64,', page)) == 4
    assert "Not drawn: no eval results (eval did not run)." in page
    for arm in (TREATMENT, BASELINE):
        assert arm in page
    assert not _external_urls(page)
    md = Path(result.markdown).read_text()
    assert "| frac_nonzero_advantage_treatment | 0.3125 | ≥ 0.5 | **FAIL** |" in md


def test_calibrated_run_continues_past_the_failed_activation_gate(tmp_path):
    run = make_run(tmp_path, calibrated=True)
    result = write_report(run)
    page = Path(result.html).read_text()
    assert result.stopped_at is None and result.verdict is not None
    assert result.stages["activation_gate"] == "failed" and result.stages["calibration"] == "passed"
    assert result.stages["audit_calibration"] == "passed"
    assert "the pre-registered bandwidth calibration then passed" in page
    assert "h=0.5 → 1 (calibration)" in page
    assert "<h3>activation gate " in page and "<h3>calibration gate " in page
    assert "kernel_effective_neighbors_p10 = 3.25 (needs ≥ 8)" in page


def _calibration_stopped_at_its_wall_cap(root: Path) -> Path:
    """The issue-48 walk on disk: the activation gate failed on a check of the user's and on the
    kernel's p10, the pre-registered calibration re-piloted at bandwidth 1 and its pilot ran over
    the wall cap."""
    run = make_run(root, stop_at_activation=True)
    _gate("activation gate", _activation_rows(frac_nonzero=0.3125, p10=6.843), run / "gate")
    rng = np.random.default_rng(1)
    for arm, n_steps in ((TREATMENT, 2), (BASELINE, 1)):
        _write_arm_logs(run / "calibration" / arm, arm, range(n_steps), rng)
    write_json_atomic(run / "calibration" / "timings.json", {"setup_seconds": {TREATMENT: 12.0, BASELINE: 11.0},
                      "step_seconds": {TREATMENT: 5.5, BASELINE: 5.5}, "eval_seconds_per_item": 0.2, "bandwidth": 1.0,
                      "wall_seconds": 782.4})
    _gate("calibration pilot", [("calibration_wall_minutes", 13.04, "max", "10.0", False)], run / "calibration")
    return run


def test_a_calibration_stopped_at_its_wall_cap_leads_with_the_activation_gate_in_every_report(tmp_path):
    from schemas.errors import CalibrationStopped, GateFailed
    from schemas.gate_text import GateRow

    run = _calibration_stopped_at_its_wall_cap(tmp_path)
    # the flow's state message, built from the gates' own rows (flows/experiment.py)
    rows = lambda folder: [GateRow.from_row(r) for r in read_rows("gate_report", run / folder / "gate_report.parquet")]  # noqa: E731
    message = str(CalibrationStopped(GateFailed("activation gate", rows("gate")),
                                     GateFailed("calibration pilot", rows("calibration")),
                                     "kernel_effective_neighbors_p10", 1.0))
    assert message == ("frac_nonzero_advantage_treatment = 0.3125 (needs ≥ 0.5): activation gate failed; also "
                       "kernel_effective_neighbors_p10 = 6.843 (needs ≥ 8); the pre-registered calibration (bandwidth 1) "
                       "then stopped at the calibration pilot: calibration_wall_minutes = 13.04 (needs ≤ 10)")
    flows_own = write_report(run, stopped=message)
    later = write_report(run, out_dir=tmp_path / "later")  # `gs1 report RUN_DIR`, rendered afterwards
    assert flows_own.headline == later.headline == f"NO DECISION: STOPPED AT A GATE: This run ended Failed: {message}."
    for result in (flows_own, later):
        # the stage rows agree with the headline: the calibration pilot is where it stopped
        assert result.stopped_at == "calibration_pilot"
        assert result.stages["activation_gate"] == result.stages["calibration_pilot"] == "failed"
        assert result.stages["audit_calibration"] == result.stages["calibration"] == "not run"
        for key in ("feasibility", "train", "eval", "decision"):
            assert result.stages[key] == "not run", key
        page = Path(result.html).read_text()
        assert "not run: the flow stopped at the calibration pilot" in page
        assert "<h3>calibration pilot " in page and "calibration_wall_minutes" in page
    assert Path(flows_own.markdown).read_text() == Path(later.markdown).read_text()


def test_a_retry_that_passes_the_activation_gate_shows_no_earlier_calibration_attempt(tmp_path):
    """Calibration records an earlier attempt left behind are not this run's: the stage table says
    the calibration was skipped, and neither the gate tables nor the plots show those records."""
    from report.plots import _time_rows

    run = make_run(tmp_path)  # the activation gate passed at the spec's bandwidth: a decision
    earlier = _calibration_stopped_at_its_wall_cap(tmp_path / "earlier")
    import shutil

    shutil.copytree(earlier / "calibration", run / "calibration")
    _gate("calibration gate", _activation_rows(frac_nonzero=0.3125, p10=3.0), run / "calibration" / "gate")
    data = load_run(run)
    assert "calibration" not in data.logs and not {"calibration_pilot", "calibration"} & set(data.gates)
    assert data.earlier_attempt == ("calibration pilot", "calibration gate")
    assert not [label for label, _ in _time_rows(data) if "calibration" in label]
    result = write_report(run)
    assert result.stopped_at is None and result.verdict is not None
    assert result.stages["calibration_pilot"] == result.stages["calibration"] == "skipped"
    page = Path(result.html).read_text()
    assert "<h3>calibration" not in page
    assert "an earlier attempt's calibration pilot, calibration gate records are on file, not shown" in html.unescape(page)


def test_training_in_progress_reads_per_step_logs(tmp_path):
    run = make_run(tmp_path)
    for arm in (TREATMENT, BASELINE):
        arm_dir = run / "train" / arm
        for name in ("rollouts.parquet", "step_metrics.parquet", "final.json"):
            (arm_dir / name).unlink()
        for f in sorted((arm_dir / "steps").glob("step-0000[23].*")):
            f.unlink()  # 2 of 4 steps logged
    for d in ("eval", "decision"):
        for f in sorted((run / d).rglob("*"), reverse=True):
            f.unlink() if f.is_file() else f.rmdir()
    statuses = {s.key: s for s in stage_statuses(load_run(run))}
    assert statuses["train"].status == "incomplete"
    assert f"{TREATMENT}: 2/4 steps (unfinished)" in statuses["train"].detail
    for key in ("eval", "decision"):  # the frontier is training, still running
        assert statuses[key].status == "not run" and statuses[key].detail == "not run yet: comes after train"
    result = write_report(run)
    assert "reward_per_step" in result.plots and "NO DECISION YET" in Path(result.html).read_text()


def test_unreadable_artifact_is_named_and_the_rest_renders(tmp_path):
    run = make_run(tmp_path)
    (run / "feasibility" / "gate_report.parquet").write_bytes(b"not parquet")
    result = write_report(run)
    page = Path(result.html).read_text()
    assert result.problems and "gate_report.parquet: not a readable Parquet file" in result.problems[0]
    assert "Unreadable files (treated as missing)" in page and result.verdict in page.lower()


def test_rerender_removes_plots_whose_data_is_gone(tmp_path):
    run = make_run(tmp_path)
    write_report(run)
    assert (run / "report" / "eval_accuracy.png").is_file()
    for f in sorted((run / "eval").rglob("*"), reverse=True):
        f.unlink() if f.is_file() else f.rmdir()
    write_report(run)
    assert not (run / "report" / "eval_accuracy.png").exists()


def _cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_report(tmp_path, capsys):
    run = make_run(tmp_path, stop_at_activation=True)
    code, out, err = _cli(capsys, "report", str(run), "--out", str(tmp_path / "elsewhere"))
    assert code == 0, err
    assert out.splitlines()[0] == str(tmp_path / "elsewhere" / "report.html")
    assert "frac_nonzero_advantage_treatment = 0.3125" in out
    assert (tmp_path / "elsewhere" / "report.html").is_file() and not (run / "report").exists()


@pytest.mark.parametrize("case", ["missing", "not_a_run", "out_is_file"])
def test_cli_report_bad_input_is_one_line_exit_2(tmp_path, capsys, case):
    argv = ["report", str(tmp_path / "nope")]
    if case == "not_a_run":
        (tmp_path / "empty").mkdir()
        argv = ["report", str(tmp_path / "empty")]
    if case == "out_is_file":
        run = make_run(tmp_path, stop_at_activation=True)
        (tmp_path / "file").write_text("keep me")
        argv = ["report", str(run), "--out", str(tmp_path / "file")]
    code, out, err = _cli(capsys, *argv)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("gs1: error: ") and "Traceback" not in err
    if case == "out_is_file":
        assert (tmp_path / "file").read_text() == "keep me"


def test_load_run_errors_name_the_directory(tmp_path):
    with pytest.raises(UserError, match="no such run directory"):
        load_run(tmp_path / "missing")
    (tmp_path / "r" / "spec").mkdir(parents=True)
    (tmp_path / "r" / "spec" / "plan.json").write_text("{not json")
    with pytest.raises(UserError, match="not a gs1 run directory.*not readable JSON"):
        load_run(tmp_path / "r")


def test_report_task_publishes_markdown_artifact(tmp_path, prefect_harness):
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from schemas.layout import RunLayout
    from tasks.run_report import run_report

    run = make_run(tmp_path)

    @flow
    def report_flow(run_dir: str) -> dict:
        return run_report(RunLayout(run_dir))

    state = report_flow(str(run), return_state=True)
    result = state.result()
    assert Path(result.html).is_file()
    flow_run_id = state.state_details.flow_run_id

    async def latest():
        async with get_client() as client:
            found = await client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["report"])))
            return [a for a in found if a.flow_run_id == flow_run_id][-1]  # other tests publish reports too

    import asyncio

    artifact = asyncio.run(latest())
    assert artifact.type == "markdown"
    assert result.verdict.upper() in artifact.data
    assert artifact.data.count("](data:image/png;base64,") == len(PLOTS)
    # the HTML page's path as text, never a file:// link (a browser will not open it from the UI)
    assert f"`{(run / 'report' / 'report.html').resolve()}`" in artifact.data and "file://" not in artifact.data


def test_a_failed_rerun_does_not_show_an_earlier_runs_decision_as_its_own(tmp_path):
    """A run that stops at a gate in a directory where an earlier run reached a decision (a
    changed bound, a Retry): the headline is this run's failure, the old verdict is labelled."""
    run = make_run(tmp_path)
    old = json.loads((run / "decision" / "decision.json").read_text())
    why = "pilot_mean_reward = 0.1875 (needs ≥ 0.3): activation gate failed"  # as GateFailed words it
    result = write_report(run, stopped=why)
    page = Path(result.html).read_text()
    assert result.verdict is None
    assert "NO DECISION: STOPPED AT A GATE" in page and f"This run ended Failed: {why}" in html.unescape(page)
    assert page.index("NO DECISION: STOPPED AT A GATE") < page.index("<h2>Stages</h2>")
    assert "holds an earlier run's decision.json" in html.unescape(page)
    assert f">{old['verdict'].upper()}<" not in page  # no big verdict for this run
    md = Path(result.markdown).read_text()
    assert "No decision in this run" in md and "earlier run" in md
    # this run's activation gate failed (a stricter bound, say): the later stages on file are
    # labelled as an earlier run's, not shown as done
    _gate("activation_gate", _activation_rows(frac_nonzero=0.3125), run / "gate")
    stages = write_report(run, stopped=why).stages
    assert stages["activation_gate"] == "failed" and stages["pilot"] == "done"
    for key in ("feasibility", "train", "eval", "decision"):
        assert stages[key] == "earlier run", key
    page = (run / "report" / "report.html").read_text()
    assert html.unescape(page).count("not this run's (it stopped at the activation gate)") >= 4
    # without `stopped` the directory renders as what it holds
    assert write_report(run).verdict == old["verdict"]


def test_gate_artifact_reads_like_the_report(tmp_path, prefect_harness):
    """The gate table artifact: metric, value, what it needs, PASS/FAIL; a calibration's gate has
    its own key; the description names the failing check."""
    import asyncio

    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    from schemas.errors import GateFailed
    from schemas.layout import RunLayout, gate_name
    from tasks.gates import record_gate

    rows = [
        {"gate": "activation_gate", "metric": "pilot_mean_reward", "value": 0.1875, "op": "min", "bound": "0.3",
         "passed": False, "observed": "0.1875"},
        {"gate": "activation_gate", "metric": "executed_group_size_treatment", "value": 1.0, "op": "one_of",
         "bound": "(1.0,)", "passed": True, "observed": "1.0"},
    ]

    @flow
    def gates_flow() -> None:
        run_dir = tmp_path / "calibration" / "run"  # a run dir under a folder so named is not the calibration
        for stage in ("pilot", "calibration"):
            try:  # the stage is told by its name, never read from the path
                record_gate(gate_name(stage), rows, RunLayout(run_dir).gate_dir(stage))
            except GateFailed:
                pass

    state = gates_flow(return_state=True)

    async def read():
        async with get_client() as client:
            return await client.read_artifacts(artifact_filter=ArtifactFilter(
                flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id])))

    arts = {a.key: a for a in asyncio.run(read())}
    assert set(arts) == {"activation-gate", "calibration-gate"}
    table = json.loads(arts["activation-gate"].data)
    assert table == [
        {"metric": "pilot_mean_reward", "value": "0.1875", "needs": "≥ 0.3", "result": "FAIL"},
        {"metric": "executed_group_size_treatment", "value": "1", "needs": "one of {1}", "result": "PASS"},
    ]
    assert "FAILED on pilot_mean_reward = 0.1875 (needs ≥ 0.3)" in arts["activation-gate"].description
    assert arts["calibration-gate"].description.startswith("calibration gate: FAILED")


def test_a_failed_training_audit_stops_the_run_before_eval(tmp_path):
    run = make_run(tmp_path)
    for d in ("eval", "decision"):
        for f in sorted((run / d).rglob("*"), reverse=True):
            f.unlink() if f.is_file() else f.rmdir()
    _audit(run / "audit" / "train", passed=False)
    write_artifact("audit_mismatches", [
        {"arm": TREATMENT, "step": 3, "row": 51, "column": "advantage", "logged": 0.75, "recomputed": 0.5},
    ], run / "audit" / "train" / "mismatches.parquet")
    result = write_report(run)
    assert result.stopped_at == "audit_train" and result.stages["audit_train"] == "failed"
    page = Path(result.html).read_text()
    assert "This run ended Failed: gs1_kernel.max_abs_diff = 0.25 (needs ≤ 1e-09): train audit failed" in page
    assert page.count("not run: the flow stopped at the train audit") == 2  # eval, decision
    # each mismatch: where (arm, step, row, column) and both values
    assert "Logged values the audit could not reproduce (1):" in page
    assert "<tr><td>gs1_kernel</td><td>3</td><td>51</td><td>advantage</td><td>0.75</td><td>0.5</td></tr>" in page
    md = Path(result.markdown).read_text()
    assert "| arm | step | row | column | logged | recomputed |\n|---|---|---|---|---|---|\n| gs1_kernel | 3 | 51 | advantage | 0.75 | 0.5 |" in md


def test_a_gate_stage_added_to_the_list_gets_its_row_its_table_and_can_stop_the_flow(tmp_path):
    """A new gate (here a made-up audit of the eval answers) needs one GateStage in the stage
    list: its gate_report is read, the stage table has its row, the Gates section its table, and
    when it fails the flow is shown stopped there."""
    from report.model import STAGES, GateStage

    added = GateStage("eval_audit", "eval answer audit", lambda run: run.root / "eval_audit", observed_label="logged value")
    stages = tuple(s for stage in STAGES for s in ((stage, added) if stage.key == "eval" else (stage,)))
    run = make_run(tmp_path)
    for f in sorted((run / "decision").rglob("*"), reverse=True):
        f.unlink() if f.is_file() else f.rmdir()
    write_artifact("gate_report", [
        {"gate": "eval_audit", "metric": f"correct[arm={TREATMENT}, row=5]", "value": 0.0, "op": "one_of",
         "bound": "(1.0,)", "passed": False, "observed": "1.0"},
        {"gate": "eval_audit", "metric": f"correct[arm={BASELINE}, row=5]", "value": 1.0, "op": "one_of",
         "bound": "(1.0,)", "passed": True, "observed": "1.0"},
    ], run / "eval_audit" / "gate_report.parquet")

    result = write_report(run, stages=stages)
    assert list(result.stages) == [s.key for s in stages]
    assert result.stages["eval_audit"] == "failed" and result.stopped_at == "eval_audit"
    assert result.stages["decision"] == "not run"
    page = html.unescape(Path(result.html).read_text())
    assert "This run ended Failed: correct[arm=gs1_kernel, row=5] = 0 (needs one of {1}): eval answer audit failed" in page
    assert "<h3>eval answer audit " in page and "<th>logged value</th>" in page
    row = re.search(r'<tr class="failrow"><td>correct\[arm=gs1_kernel, row=5\]</td>.*?</tr>', page)
    assert row and '<td class="num">0</td><td>1.0</td><td>one of {1}</td>' in row.group(0)
    assert page.count("not run: the flow stopped at the eval answer audit") == 1
    md = Path(result.markdown).read_text()
    assert "### eval answer audit: FAILED" in md
    assert "| correct[arm=gs1_kernel, row=5] | 0 | 1.0 | one of {1} | **FAIL** |" in md
    # without the stage in the list, the same directory renders as before
    assert "eval_audit" not in write_report(run).stages


def test_artifact_markdown_embeds_the_plots_and_names_the_page(tmp_path):
    run = make_run(tmp_path, stop_at_activation=True)
    result = write_report(run)
    text = result.artifact_markdown
    embedded = re.findall(r"\]\(data:image/png;base64,([A-Za-z0-9+/=]+)\)", text)
    assert sorted(base64.b64decode(u) for u in embedded) == sorted(p.read_bytes() for p in result.plots.values())
    assert f"Full report (self-contained HTML, on the machine that ran it): `{result.html.resolve()}`" in text
    assert "file://" not in text
    # the same summary as report.md otherwise
    def without_links(markdown: str) -> list[str]:
        return [line for line in re.sub(r"\]\([^)]*\)", "]()", markdown).splitlines() if not line.startswith("Full report")]

    assert without_links(text) == without_links(Path(result.markdown).read_text())
