"""`gs1 advantages` and `gs1 decide` end to end: real Parquet/JSONL files, exit codes, messages."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from estimators.reference import gs1_kernel_log_reference
from schemas.kernel import KernelSpec

from gs1.cli import main


def _rollouts(n_steps=4, per_step=16, seed=0, group_size=1):
    rng = np.random.default_rng(seed)
    rows = n_steps * per_step
    prompt = np.repeat(np.arange(rows // group_size), group_size)
    return pa.table({
        "step": pa.array(np.repeat(np.arange(n_steps), per_step), pa.int32()),
        "prompt_id": [f"gsm8k/train/{k}" for k in prompt],
        "reward": rng.integers(0, 2, rows).astype(float),
        "prompt_num_tokens": pa.array(rng.integers(30, 300, rows // group_size)[prompt], pa.int32()),
        "prompt_mean_logprob": rng.normal(-1.0, 0.3, rows // group_size)[prompt],
        "response": [f"r{k}" for k in range(rows)],
    })


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_advantages_gs1_kernel_matches_reference(tmp_path, capsys):
    table = _rollouts()
    pq.write_table(table, tmp_path / "in.parquet")
    code, _, err = _run(capsys, "advantages", "--estimator", "gs1_kernel", "--rollouts", str(tmp_path / "in.parquet"),
                        "--out", str(tmp_path / "out.parquet"), "--bandwidth", "1.0", "--window", "40")
    assert code == 0, err
    out = pq.read_table(tmp_path / "out.parquet")
    assert out.column_names == [*table.column_names, "baseline", "advantage", "kernel_mass", "effective_neighbors", "fallback"]
    assert out.schema.field("baseline").type == pa.float64() and out.schema.field("fallback").type == pa.bool_()
    assert out.select(table.column_names).equals(table)
    features = [[math.log(n), m] for n, m in zip(table.column("prompt_num_tokens").to_pylist(), table.column("prompt_mean_logprob").to_pylist())]
    ref = gs1_kernel_log_reference(table.column("step").to_pylist(), table.column("reward").to_pylist(), features, KernelSpec(bandwidth=1.0, window=40, min_mass=1e-3))
    for key in ("baseline", "advantage", "kernel_mass", "effective_neighbors"):
        np.testing.assert_allclose(out.column(key).to_numpy(), ref[key], rtol=1e-12, atol=1e-12)
    assert out.column("fallback").to_pylist() == ref["fallback"]


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "batch_mean"])
def test_advantages_group_estimators(tmp_path, capsys, estimator):
    table = _rollouts(n_steps=3, per_step=16, group_size=4)
    # the same prompt in two steps is two groups
    prompts = table.column("prompt_id").to_pylist()
    prompts[16:20] = prompts[0:4]
    table = table.set_column(1, "prompt_id", pa.array(prompts))
    pq.write_table(table, tmp_path / "in.parquet")
    code, _, err = _run(capsys, "advantages", "--estimator", estimator, "--rollouts", str(tmp_path / "in.parquet"),
                        "--out", str(tmp_path / "out.parquet"))
    assert code == 0, err
    out = pq.read_table(tmp_path / "out.parquet")
    assert "kernel_mass" not in out.column_names
    steps, rewards = table.column("step").to_pylist(), table.column("reward").to_pylist()
    baseline = out.column("baseline").to_pylist()
    for i in range(len(rewards)):
        if estimator == "batch_mean":
            peers = [j for j in range(len(rewards)) if steps[j] == steps[i]]
        else:
            peers = [j for j in range(len(rewards)) if steps[j] == steps[i] and prompts[j] == prompts[i]]
            if estimator == "rloo":
                peers.remove(i)
        assert abs(baseline[i] - sum(rewards[j] for j in peers) / len(peers)) < 1e-12
    np.testing.assert_allclose(out.column("advantage").to_numpy(), np.array(rewards) - np.array(baseline), atol=1e-15)


def _bad_input(case):
    """(table, estimator, extra flags, text the error names)"""
    good = _rollouts()
    nan_reward = pa.array([float("nan")] + good.column("reward").to_pylist()[1:])
    return {
        "missing column": (good.drop_columns(["prompt_mean_logprob"]), "gs1_kernel", [], "prompt_mean_logprob"),
        "NaN reward": (good.set_column(2, "reward", nan_reward), "gs1_kernel", [], "NaN"),
        "empty table": (good.slice(0, 0), "gs1_kernel", [], "empty"),
        "split step": (good.take([0, 20, 1]), "gs1_kernel", [], "consecutive"),
        "flag for another estimator": (good, "grpo", ["--bandwidth", "1.0"], "a kind with a kernel"),
        "bad bandwidth": (good, "gs1_kernel", ["--bandwidth", "-1"], "--bandwidth"),
        "bad window": (good, "gs1_kernel", ["--window", "0"], "--window"),
        "bad estimator": (good, "ppo", [], "--estimator"),
    }[case]


def _exit_code(capsys, argv):
    """main's return code, or argparse's exit code for a rejected flag; with stderr."""
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("case", ["missing column", "NaN reward", "empty table", "split step", "flag for another estimator",
                                  "bad bandwidth", "bad window", "bad estimator"])
def test_advantages_bad_input_exits_2_without_output(tmp_path, capsys, case):
    table, estimator, extra, needle = _bad_input(case)
    pq.write_table(table, tmp_path / "in.parquet")
    code, out, err = _exit_code(capsys, ["advantages", "--estimator", estimator, "--rollouts", str(tmp_path / "in.parquet"),
                                         "--out", str(tmp_path / "out.parquet"), *extra])
    assert code == 2 and out == ""
    assert needle in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert [p.name for p in tmp_path.iterdir()] == ["in.parquet"]  # no output, no temp file left


def test_advantages_missing_file_and_existing_output_kept(tmp_path, capsys):
    (tmp_path / "out.parquet").write_bytes(b"previous")
    code, _, err = _run(capsys, "advantages", "--estimator", "grpo", "--rollouts", str(tmp_path / "nope.parquet"),
                        "--out", str(tmp_path / "out.parquet"))
    assert code == 2 and "no such file" in err
    assert (tmp_path / "out.parquet").read_bytes() == b"previous"


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _eval_rows(n, p, seed):
    rng = np.random.default_rng(seed)
    return [{"item_id": f"gsm8k/test/{k}", "correct": bool(rng.random() < p)} for k in range(n)]


def test_decide_matches_rl_stats_and_ignores_row_order(tmp_path, capsys):
    treatment, baseline = _eval_rows(300, 0.8, 0), _eval_rows(300, 0.6, 1)
    _write_jsonl(tmp_path / "t.jsonl", treatment[::-1])
    pq.write_table(pa.table({"item_id": [r["item_id"] for r in baseline], "arm": ["grpo_gs8"] * 300,
                             "correct": [r["correct"] for r in baseline]}), tmp_path / "b.parquet")
    code, out, err = _run(capsys, "decide", "--treatment", str(tmp_path / "t.jsonl"), "--baseline", str(tmp_path / "b.parquet"))
    assert code == 0, err
    report = json.loads(out)
    t = [int(r["correct"]) for r in treatment]
    b = [int(r["correct"]) for r in baseline]
    mean = sum(x - y for x, y in zip(t, b)) / 300
    radius = math.sqrt(2 * math.log(20) / 300)
    assert report["n"] == 300 and report["alpha"] == 0.05 and report["margin"] == -0.03
    assert abs(report["mean_diff"] - mean) < 1e-12
    assert abs(report["lower"] - (mean - radius)) < 1e-12 and abs(report["upper"] - (mean + radius)) < 1e-12
    assert report["verdict"] == ("noninferior" if mean - radius > -0.03 else "inconclusive")
    assert report["mcnemar"]["b"] == sum(x == 1 and y == 0 for x, y in zip(t, b))
    assert report["mcnemar"]["c"] == sum(x == 0 and y == 1 for x, y in zip(t, b))
    assert report["bootstrap_ci"]["low"] < mean < report["bootstrap_ci"]["high"]
    assert abs(report["noninferior_threshold"] - (-0.03 + radius)) < 1e-12


def test_decide_flags(tmp_path, capsys):
    rows = _eval_rows(50, 0.5, 0)
    _write_jsonl(tmp_path / "t.jsonl", rows)
    _write_jsonl(tmp_path / "b.jsonl", rows)
    code, out, _ = _run(capsys, "decide", "--treatment", str(tmp_path / "t.jsonl"), "--baseline", str(tmp_path / "b.jsonl"),
                        "--alpha", "0.1", "--margin", "-0.5")
    report = json.loads(out)
    assert code == 0 and report["mean_diff"] == 0.0 and report["alpha"] == 0.1 and report["margin"] == -0.5
    assert report["verdict"] == "noninferior"  # 0 - sqrt(2 ln 10 / 50) = -0.30 > -0.5


@pytest.mark.parametrize("case", ["differ", "duplicate", "bad json", "bad correct", "missing file", "empty", "bad alpha",
                                  "not utf-8", "deep json", "a directory"])
def test_decide_bad_input_exits_2(tmp_path, capsys, case):
    rows = _eval_rows(20, 0.5, 0)
    _write_jsonl(tmp_path / "b.jsonl", rows)
    t_rows, extra, needle = rows, [], None
    if case == "differ":
        t_rows, needle = rows[:17] + [{"item_id": "other", "correct": True}], "4 item(s) differ"
    elif case == "duplicate":
        t_rows, needle = rows + [rows[3]], "duplicate item_id"
    elif case == "bad correct":
        t_rows, needle = rows[:-1] + [{"item_id": rows[-1]["item_id"], "correct": "yes"}], "correct"
    elif case == "empty":
        t_rows, needle = [], "no eval items"
    elif case == "bad alpha":
        extra, needle = ["--alpha", "1.5"], "--alpha"
    _write_jsonl(tmp_path / "t.jsonl", t_rows)
    if case == "bad json":
        (tmp_path / "t.jsonl").write_text('{"item_id": "a", "correct": true}\n{not json\n')
        needle = "line 2"
    elif case == "not utf-8":
        (tmp_path / "t.jsonl").write_bytes('{"item_id": "caf\u00e9", "correct": true}\n'.encode("latin-1"))
        needle = "not UTF-8"
    elif case == "deep json":
        (tmp_path / "t.jsonl").write_text("[" * 100_000 + "]" * 100_000 + "\n")
        needle = "line 1: not valid JSON"
    elif case == "a directory":
        (tmp_path / "t.jsonl").unlink()
        (tmp_path / "t.jsonl").mkdir()
        needle = "is a directory"
    treatment = str(tmp_path / ("nope.jsonl" if case == "missing file" else "t.jsonl"))
    needle = needle or "no such file"
    argv = ["decide", "--treatment", treatment, "--baseline", str(tmp_path / "b.jsonl"), *extra]
    code, out, err = _exit_code(capsys, argv)
    assert code == 2 and out == ""
    assert needle in err, err
    assert len(err.strip().splitlines()) == 1


def test_advantages_out_naming_a_directory_is_one_line_before_any_work(tmp_path, capsys):
    (tmp_path / "out").mkdir()
    code, out, err = _exit_code(capsys, ["advantages", "--estimator", "grpo", "--rollouts", str(tmp_path / "nope.parquet"),
                                         "--out", str(tmp_path / "out")])
    assert code == 2 and out == "" and "is a directory" in err and len(err.strip().splitlines()) == 1
    assert list((tmp_path / "out").iterdir()) == []


def test_console_script_exit_code(tmp_path):
    _write_jsonl(tmp_path / "t.jsonl", _eval_rows(5, 0.5, 0))
    _write_jsonl(tmp_path / "b.jsonl", _eval_rows(6, 0.5, 0))
    proc = subprocess.run([sys.executable, "-m", "gs1", "decide", "--treatment", str(tmp_path / "t.jsonl"),
                           "--baseline", str(tmp_path / "b.jsonl")], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "gs1: error: item sets differ: 1 item(s) differ (0 only in treatment, 1 only in baseline)"


def test_gs1_run_checks_the_data_dir_for_both_splits_before_anything_runs(tmp_path, capsys):
    data = tmp_path / "gsm8k"
    data.mkdir()
    (data / "train.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n')
    run_dir = tmp_path / "run"
    code, out, err = _exit_code(capsys, ["run", str(Path(__file__).parents[1] / "specs/gs1_vs_grpo_gsm8k.json"), "--data-dir", str(data), "--run-dir", str(run_dir)])
    assert code == 2 and "has no test.jsonl" in err and len(err.strip().splitlines()) == 1
    assert not run_dir.exists()  # nothing started


def test_validate_into_a_closed_pipe_ends_cleanly(repo_root):
    """`gs1 validate SPEC | head -1`: the reader goes away before gs1 writes; exit 0, nothing on
    stderr (no BrokenPipeError line)."""
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "gs1", "validate", str(repo_root / "specs" / "demo_local.json")],
        cwd=repo_root, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    proc.stdout.close()  # before gs1 has written anything
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0 and err == "", err
