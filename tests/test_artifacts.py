"""Artifact schemas: column contracts, round trips, schema checks on read, atomic writes."""

from __future__ import annotations

import math
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from schemas import artifacts
from schemas.artifacts import SCHEMAS, read_artifact, read_rows, schema_for, to_table, write_artifact
from schemas.errors import UserError

ROLLOUT_COLUMNS = [
    ("step", pa.int32()),
    ("arm", pa.string()),
    ("seed", pa.int32()),
    ("prompt_id", pa.string()),
    ("group_id", pa.int32()),
    ("sample_idx", pa.int32()),
    ("prompt_num_tokens", pa.int32()),
    ("prompt_mean_logprob", pa.float64()),
    ("reward", pa.float64()),
    ("num_tokens", pa.int32()),
    ("stop_reason", pa.string()),
    ("baseline", pa.float64()),
    ("advantage", pa.float64()),
    ("kernel_mass", pa.float64()),
    ("effective_neighbors", pa.float64()),
    ("fallback", pa.bool_()),
    ("response", pa.string()),
    ("sampler_logprobs", pa.list_(pa.float64())),
    ("learner_logprobs", pa.list_(pa.float64())),
    ("sequence_kl", pa.float64()),
    ("admitted", pa.bool_()),
    ("token_advantage", pa.float64()),
    ("critic_yes_logprob", pa.float64()),
    ("critic_no_logprob", pa.float64()),
]
ARM_KIND_COLUMNS = ("sampler_logprobs", "learner_logprobs", "sequence_kl", "admitted", "token_advantage",
                    "critic_yes_logprob", "critic_no_logprob")


def rollout(i: int, kernel: bool = True) -> dict:
    return {
        "step": i // 4,
        "arm": "gs1_kernel" if kernel else "grpo_gs8",
        "seed": 0,
        "prompt_id": f"gsm8k/train/{100 + i}",
        "group_id": i % 4,
        "sample_idx": 0,
        "prompt_num_tokens": 50 + i,
        "prompt_mean_logprob": -1.25 - i / 8,
        "reward": float(i % 2),
        "num_tokens": 10 + i,
        "stop_reason": "stop" if i % 3 else "length",
        "baseline": 0.5,
        "advantage": float(i % 2) - 0.5,
        "kernel_mass": 3.5 if kernel else None,
        "effective_neighbors": 2.25 if kernel else None,
        "fallback": (i == 0) if kernel else None,
        "response": f"answer \\boxed{{{i}}} ✓",
        **dict.fromkeys(ARM_KIND_COLUMNS),
    }


def test_rollouts_schema_is_the_contract():
    schema = schema_for("rollouts")
    assert [(f.name, f.type) for f in schema] == ROLLOUT_COLUMNS
    nullable = {f.name for f in schema if f.nullable}
    assert nullable == {"kernel_mass", "effective_neighbors", "fallback", *ARM_KIND_COLUMNS}


def test_other_schemas_have_their_columns():
    assert schema_for("eval_items").names == [
        "item_id", "arm", "correct", "extracted_answer", "reference", "response", "num_tokens"
    ]
    assert schema_for("gate_report").names == ["gate", "metric", "value", "op", "bound", "passed", "observed"]
    assert schema_for("heldout").names == ["prompt_id", "sample_idx", "reward"]
    decision = schema_for("decision")
    assert decision.names[:8] == ["criterion", "n", "mean_diff", "lower", "upper", "alpha", "margin", "verdict"]
    assert all(f.nullable for f in decision if f.name not in decision.names[:8])
    assert schema_for("checkpoints").names == ["next_step", "state_path", "wall_time", "critic_state_path"]
    metrics = schema_for("step_metrics")
    assert metrics.field("effective_neighbors_p10").nullable
    for name in ["reward_mean", "advantage_abs_mean", "frac_nonzero_advantage", "baseline_mean", "sample_seconds",
                 "train_seconds", "step_seconds", "wall_time", "num_datums", "num_tokens"]:
        assert name in metrics.names
    for name, schema in SCHEMAS.items():
        assert schema.metadata[b"gs1.artifact"] == name.encode()
    with pytest.raises(KeyError, match="unknown artifact"):
        schema_for("nope")


def test_rollouts_round_trip(tmp_path):
    rows = [rollout(i) for i in range(6)] + [rollout(i, kernel=False) for i in range(6, 10)]
    path = write_artifact("rollouts", rows, tmp_path / "rollouts.parquet")
    table = read_artifact("rollouts", path)
    assert table.schema.equals(schema_for("rollouts"))
    assert read_rows("rollouts", path) == rows  # values, None and row order intact
    assert pq.read_schema(path).field("step").type == pa.int32()


def test_round_trip_from_a_table_and_empty(tmp_path):
    table = pa.table({
        "prompt_id": ["a/train/1", "a/train/1", "a/train/2"],
        "sample_idx": pa.array([0, 1, 0], pa.int64()),  # widened ints are cast down
        "reward": [1.0, 0.0, math.nan],
    })
    path = write_artifact("heldout", table.select(["reward", "sample_idx", "prompt_id"]), tmp_path / "h.parquet")
    out = read_artifact("heldout", path)
    assert out.column("sample_idx").type == pa.int32()
    assert out.column("prompt_id").to_pylist() == ["a/train/1", "a/train/1", "a/train/2"]
    assert math.isnan(out.column("reward").to_pylist()[2])
    empty = write_artifact("gate_report", [], tmp_path / "g.parquet")
    assert read_artifact("gate_report", empty).num_rows == 0


def test_bad_rows_are_rejected_before_writing(tmp_path):
    good = [rollout(0)]
    bad_rows = [
        [{**rollout(0), "extra": 1}],
        [{k: v for k, v in rollout(0).items() if k != "reward"}],
        [{**rollout(0), "reward": None}],  # non-nullable
        [{**rollout(0), "step": "first"}],
    ]
    for rows in bad_rows:
        with pytest.raises(ValueError):
            to_table("rollouts", rows)
    with pytest.raises(ValueError, match="missing columns"):
        write_artifact("rollouts", pa.table({"step": [1]}), tmp_path / "r.parquet")
    assert not (tmp_path / "r.parquet").exists()
    write_artifact("rollouts", good, tmp_path / "r.parquet")
    assert read_rows("rollouts", tmp_path / "r.parquet") == good


def test_reading_the_wrong_table_or_a_broken_file_is_a_user_error(tmp_path):
    path = write_artifact("heldout", [{"prompt_id": "x", "sample_idx": 0, "reward": 1.0}], tmp_path / "h.parquet")
    with pytest.raises(UserError, match="holds a 'heldout' table, expected 'eval_items'"):
        read_artifact("eval_items", path)

    foreign = tmp_path / "foreign.parquet"  # a parquet written by something else
    pq.write_table(pa.table({"prompt_id": ["x"], "reward": [1.0]}), foreign)
    with pytest.raises(UserError, match=r"not a 'heldout' table: missing column\(s\) sample_idx"):
        read_artifact("heldout", foreign)

    wrong_type = tmp_path / "wrong_type.parquet"
    pq.write_table(pa.table({"prompt_id": ["x"], "sample_idx": ["zero"], "reward": [1.0]}), wrong_type)
    with pytest.raises(UserError, match="columns do not match the 'heldout' schema"):
        read_artifact("heldout", wrong_type)

    nulls = tmp_path / "nulls.parquet"
    pq.write_table(pa.table({"prompt_id": [None], "sample_idx": [0], "reward": [1.0]}), nulls)
    with pytest.raises(UserError) as exc:
        read_artifact("heldout", nulls)
    assert "\n" not in str(exc.value)

    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"not parquet at all")
    with pytest.raises(UserError, match="not a readable Parquet file"):
        read_artifact("heldout", garbage)
    with pytest.raises(UserError, match="no such file"):
        read_artifact("heldout", tmp_path / "missing.parquet")


def test_a_failed_write_leaves_the_previous_file_intact(tmp_path, monkeypatch):
    path = tmp_path / "rollouts.parquet"
    first = [rollout(i) for i in range(3)]
    write_artifact("rollouts", first, path)
    before = path.read_bytes()

    real_write_table = pq.write_table

    def write_half_then_crash(table, where, **kw):
        real_write_table(table.slice(0, 1), where, **kw)  # the temp file gets partial content
        raise OSError("disk full")

    monkeypatch.setattr(pq, "write_table", write_half_then_crash)
    with pytest.raises(OSError, match="disk full"):
        write_artifact("rollouts", [rollout(i) for i in range(8)], path)
    monkeypatch.setattr(pq, "write_table", real_write_table)

    assert path.read_bytes() == before
    assert read_rows("rollouts", path) == first
    assert sorted(os.listdir(tmp_path)) == ["rollouts.parquet"]  # no temp file left behind


def test_module_exports_the_named_schemas():
    assert artifacts.ROLLOUTS is schema_for("rollouts")
    assert artifacts.STEP_METRICS is schema_for("step_metrics")
    assert artifacts.EVAL_ITEMS is schema_for("eval_items")
    assert artifacts.GATE_REPORT is schema_for("gate_report")
    assert artifacts.DECISION is schema_for("decision")
    assert artifacts.HELDOUT is schema_for("heldout")


def test_the_loops_rollout_record_is_the_schema_and_every_kinds_columns_are_in_it():
    import dataclasses

    from estimators.registry import ESTIMATORS
    from schemas.artifacts import ROLLOUTS, STEP_EXTRA_METRICS, STEP_METRICS, RolloutRow

    assert [f.name for f in dataclasses.fields(RolloutRow)] == ROLLOUTS.names  # the loop's rows are the table's
    row = RolloutRow.sampled(step=0, arm="a", seed=0, prompt_id="p", group_id=0, sample_idx=0, prompt_num_tokens=3,
                             prompt_mean_logprob=-1.0, reward=1.0, num_tokens=2, stop_reason="stop", response="x")
    assert row.baseline is None and row.with_columns(baseline=0.5).as_dict()["baseline"] == 0.5
    for estimator in ESTIMATORS.values():  # a kind logs only what the tables hold, nullable for the others
        for column in (*estimator.columns, *estimator.input_columns):
            assert ROLLOUTS.field(column).nullable, (estimator.kind, column)
        assert set(estimator.step_metric_names) <= set(STEP_EXTRA_METRICS), estimator.kind
    assert {"grad_norm", "trust_admit_rate", "critic_loss"} <= set(STEP_EXTRA_METRICS)
    assert not {"loss", "effective_neighbors_p10", "reward_mean"} & set(STEP_EXTRA_METRICS)
    assert all(STEP_METRICS.field(m).nullable for m in STEP_EXTRA_METRICS)


def test_a_plan_written_before_recipes_reads_back_with_each_arms_recipe(repo_root):
    """The committed H200 run's plan.json holds `advantage`, `kernel`, `trust_delta`, `critic`
    side by side, as every plan did before kinds were modules: it reads as recipes."""
    import json

    from design.plan import RunPlan

    raw = json.loads((repo_root / "results" / "h200-gsm8k" / "run" / "spec" / "plan.json").read_text())
    assert {"advantage", "kernel", "trust_delta", "critic"} <= set(raw["arms"][0])
    plan = RunPlan.model_validate(raw)
    kinds = {a.name: a.recipe for a in plan.arms}
    assert kinds["grpo_gs8"].model_dump() == {"advantage": "group_mean"}
    assert kinds["gs1_kernel"].advantage == "kernel_cross_prompt_baseline"
    assert kinds["gs1_kernel"].kernel.model_dump(mode="json") == raw["arms"][1]["kernel"]
    assert RunPlan.model_validate(plan.model_dump(mode="json")) == plan  # and a new plan round-trips


def test_a_compact_copy_reads_back_the_same_table_and_is_smaller(tmp_path):
    """schemas.io.compact_copy: a committed folder's Parquet, re-encoded with zstd and floats
    byte-stream split (lists of floats too), reads back equal with its metadata; other files are
    copied as they are."""
    import io

    import numpy as np

    from schemas.io import compact_copy

    rng = np.random.default_rng(0)
    logprobs = [list(rng.normal(-1.0, 0.5, size=int(n))) for n in rng.integers(50, 300, size=200)]
    table = pa.table({"prompt": [f"q{i % 7}" for i in range(200)], "reward": rng.random(200),
                      "logprobs": pa.array(logprobs, type=pa.list_(pa.float64()))}).replace_schema_metadata({"gs1.kind": "rollouts"})
    source = tmp_path / "rollouts.parquet"
    pq.write_table(table, source, compression="snappy")
    payload = compact_copy(source)
    back = pq.read_table(io.BytesIO(payload))
    assert back.equals(table) and back.schema.metadata == table.schema.metadata
    assert len(payload) < source.stat().st_size
    text = tmp_path / "eval.jsonl"
    text.write_text('{"correct": true}\n')
    assert compact_copy(text) == text.read_bytes()
