"""Parquet artifact tables: their pyarrow schemas, and checked atomic write / read.

Each schema carries its name in the schema metadata (`gs1.artifact`), so a file read back as the
wrong kind of table is caught. Columns are documented in docs/contracts.md; a field marked
non-nullable must have a value in every row.

    write_artifact("rollouts", rows_or_table, path)   # atomic: temp file + rename
    table = read_artifact("rollouts", path)           # schema checked -> UserError on mismatch
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import pyarrow as pa

from schemas.errors import UserError
from schemas.io import read_parquet, write_parquet_atomic

NAME_KEY = b"gs1.artifact"


def _schema(name: str, *fields: pa.Field) -> pa.Schema:
    return pa.schema(list(fields), metadata={NAME_KEY: name.encode()})


def _req(name: str, type_: pa.DataType) -> pa.Field:
    return pa.field(name, type_, nullable=False)


def _opt(name: str, type_: pa.DataType) -> pa.Field:
    return pa.field(name, type_, nullable=True)


# One row per rollout, in rollout order.
ROLLOUTS = _schema(
    "rollouts",
    _req("step", pa.int32()),  # training step (0-based)
    _req("arm", pa.string()),
    _req("seed", pa.int32()),
    _req("prompt_id", pa.string()),  # e.g. gsm8k/train/123 (index in the source file)
    _req("group_id", pa.int32()),  # index of the prompt within the step
    _req("sample_idx", pa.int32()),  # index of the rollout within its group
    _req("prompt_num_tokens", pa.int32()),
    _req("prompt_mean_logprob", pa.float64()),  # mean sampler logprob over prompt tokens 2..n
    _req("reward", pa.float64()),
    _req("num_tokens", pa.int32()),  # response tokens
    _req("stop_reason", pa.string()),  # "stop" or "length"
    _req("baseline", pa.float64()),  # b_i
    _req("advantage", pa.float64()),  # r_i - b_i
    _opt("kernel_mass", pa.float64()),  # sum_j w_ij (gs1_kernel only)
    _opt("effective_neighbors", pa.float64()),  # (sum w)^2 / sum w^2 (gs1_kernel only)
    _opt("fallback", pa.bool_()),  # mass < min_mass -> window-mean baseline (gs1_kernel only)
    _req("response", pa.string()),  # decoded response text
    # flash_reinforce only: each response token's sampler and learner logprob, the trust gate's
    # per-trajectory mean Bernoulli KL, whether it admitted the rollout, and the per-token
    # advantage its datum carried (A * admitted / (T * B))
    _opt("sampler_logprobs", pa.list_(pa.float64())),
    _opt("learner_logprobs", pa.list_(pa.float64())),
    _opt("sequence_kl", pa.float64()),
    _opt("admitted", pa.bool_()),
    _opt("token_advantage", pa.float64()),
    # critic only: the critic's log P(yes), log P(no) after the prompt (baseline = their softmax)
    _opt("critic_yes_logprob", pa.float64()),
    _opt("critic_no_logprob", pa.float64()),
)



@dataclasses.dataclass(frozen=True)
class RolloutRow:
    """One row of ROLLOUTS as the loop builds it: its fields are the schema's columns, in order
    (a test holds them equal); a kind's own columns stay None in the other kinds' rows."""

    step: int
    arm: str
    seed: int
    prompt_id: str
    group_id: int
    sample_idx: int
    prompt_num_tokens: int
    prompt_mean_logprob: float
    reward: float
    num_tokens: int
    stop_reason: str
    baseline: float | None  # set once the step's advantages are known
    advantage: float | None
    kernel_mass: float | None
    effective_neighbors: float | None
    fallback: bool | None
    response: str
    sampler_logprobs: list[float] | None
    learner_logprobs: list[float] | None
    sequence_kl: float | None
    admitted: bool | None
    token_advantage: float | None
    critic_yes_logprob: float | None
    critic_no_logprob: float | None

    @classmethod
    def sampled(cls, **columns) -> RolloutRow:
        """A rollout as sampling and grading give it: every column after them None until set."""
        return cls(**{**dict.fromkeys(f.name for f in dataclasses.fields(cls)), **columns})

    def with_columns(self, **columns) -> RolloutRow:
        return dataclasses.replace(self, **columns)

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def rollout_columns(rows: Sequence[RolloutRow]) -> dict[str, list]:
    """Rows as the ROLLOUTS table's columns (name -> values, in schema order)."""
    return {f.name: [getattr(r, f.name) for r in rows] for f in dataclasses.fields(RolloutRow)}


# One row per training step of an arm.
STEP_METRICS = _schema(
    "step_metrics",
    _req("step", pa.int32()),
    _req("arm", pa.string()),
    _req("seed", pa.int32()),
    _req("reward_mean", pa.float64()),
    _req("reward_std", pa.float64()),
    _req("advantage_abs_mean", pa.float64()),
    _req("frac_nonzero_advantage", pa.float64()),  # |advantage| > 1e-6
    _req("baseline_mean", pa.float64()),
    _opt("loss", pa.float64()),  # as the training client reports it, when it does
    _req("num_datums", pa.int32()),
    _req("num_tokens", pa.int64()),  # prompt + response tokens trained on
    _opt("effective_neighbors_p10", pa.float64()),  # gs1_kernel only
    _req("sample_seconds", pa.float64()),
    _req("train_seconds", pa.float64()),
    _req("step_seconds", pa.float64()),
    _req("wall_time", pa.float64()),  # unix seconds at the end of the step
    # every arm, when the service reports them: the policy gradient's norm before the update, and
    # the largest |learner - sampler| logprob gap over the sampled tokens trained on
    _opt("grad_norm", pa.float64()),
    _opt("logprob_gap_max", pa.float64()),
    # flash_reinforce only: the trust gate's admit rate and mean KL, the learner forward's cost
    _opt("trust_admit_rate", pa.float64()),
    _opt("sequence_kl_mean", pa.float64()),
    _opt("learner_forward_seconds", pa.float64()),
    _opt("learner_forward_tokens", pa.int64()),
    # critic only: the value model's extra cost per step (forward for the baselines, one training
    # step on the step's rewards) and its training loss
    _opt("critic_forward_seconds", pa.float64()),
    _opt("critic_forward_tokens", pa.int64()),
    _opt("critic_train_seconds", pa.float64()),
    _opt("critic_train_tokens", pa.int64()),
    _opt("critic_loss", pa.float64()),
)

# Step metrics that may be None besides loss and the kernel's p10: grad_norm and logprob_gap_max
# when the service does not report them, a kind's own metrics (Estimator.step_metric_names) in
# the other kinds' arms, the cost of what a kind needs (a learner forward, a critic).
STEP_EXTRA_METRICS = tuple(f.name for f in STEP_METRICS if f.nullable and f.name not in ("loss", "effective_neighbors_p10"))

# One row per eval item per arm.
EVAL_ITEMS = _schema(
    "eval_items",
    _req("item_id", pa.string()),  # the test problem's id, e.g. gsm8k/test/5
    _req("arm", pa.string()),
    _req("correct", pa.bool_()),
    _req("extracted_answer", pa.string()),  # "" when none was found
    _req("reference", pa.string()),
    _req("response", pa.string()),
    _req("num_tokens", pa.int32()),
)

# One row per gate check.
GATE_REPORT = _schema(
    "gate_report",
    _req("gate", pa.string()),  # e.g. activation_gate
    _req("metric", pa.string()),
    _opt("value", pa.float64()),  # null when the metric could not be computed (fails)
    _req("op", pa.string()),  # "one_of", "min" or "max"
    _req("bound", pa.string()),  # the bound as written, e.g. "0.1" or "[\"8\"]"
    _req("passed", pa.bool_()),
    _opt("observed", pa.string()),  # the raw metric when it is not one number (e.g. per-step sizes)
)

# One row per decision criterion: the spec's rule (`method`, rules.registry) and its reading.
DECISION = _schema(
    "decision",
    _req("criterion", pa.string()),
    _req("n", pa.int64()),  # paired items
    _req("mean_diff", pa.float64()),  # the difference the rule's bounds are around (treatment - baseline)
    _req("lower", pa.float64()),  # the rule's one-sided lower bound at alpha
    _req("upper", pa.float64()),  # the rule's one-sided upper bound at alpha
    _req("alpha", pa.float64()),
    _req("margin", pa.float64()),
    _req("verdict", pa.string()),  # noninferior / inferior / inconclusive
    _opt("method", pa.string()),  # the rule that read it (null in a decision from before rules were named)
    # secondary, descriptive statistics (null when not computed)
    _opt("treatment_mean", pa.float64()),
    _opt("baseline_mean", pa.float64()),
    _opt("paired_t_lower", pa.float64()),
    _opt("paired_t_upper", pa.float64()),
    _opt("bootstrap_lower", pa.float64()),
    _opt("bootstrap_upper", pa.float64()),
    _opt("mcnemar_p", pa.float64()),
    _opt("noninferior_threshold", pa.float64()),  # the smallest observed difference the rule calls noninferior at n
    _opt("treatment", pa.string()),  # arm names
    _opt("baseline", pa.string()),
)

# One row per training-arm checkpoint (save_state), the loop state needed to resume from it.
CHECKPOINTS = _schema(
    "checkpoints",
    _req("next_step", pa.int32()),  # the first step to run after loading this state
    _req("state_path", pa.string()),  # save_state path (a local dir or a tinker:// path)
    _req("wall_time", pa.float64()),
    _opt("critic_state_path", pa.string()),  # a critic arm's value model, saved at the same step
)

# One row per held-out sample of a pilot prompt (the baseline_reward_corr gate's target).
HELDOUT = _schema(
    "heldout",
    _req("prompt_id", pa.string()),
    _req("sample_idx", pa.int32()),
    _req("reward", pa.float64()),
)

# One row per logged value the audit could not reproduce (rl.audit): where, and both values.
AUDIT_MISMATCHES = _schema(
    "audit_mismatches",
    _req("arm", pa.string()),
    _req("step", pa.int64()),  # -1: the column as a whole (missing, or of the wrong length)
    _req("row", pa.int64()),  # row of the arm's rollouts.parquet (0-based, rollout order)
    _req("column", pa.string()),  # baseline, advantage, kernel_mass, effective_neighbors, fallback
    _req("logged", pa.float64()),
    _req("recomputed", pa.float64()),
)

_COST_FIELDS = (
    _req("arm", pa.string()),
    _req("seed", pa.int32()),
    _req("wall_seconds", pa.float64()),
    _req("sample_seconds", pa.float64()),
    _req("train_seconds", pa.float64()),
    _req("sampler_tokens", pa.int64()),  # prompt tokens prefilled + tokens generated
    _req("trainer_tokens", pa.int64()),  # tokens of the datums sent to forward_backward
    _req("model_calls", pa.int64()),  # sampler refresh, sample, forward_backward, optim_step requests
    _opt("critic_seconds", pa.float64()),  # a critic arm's share (null: no critic)
    _opt("critic_tokens", pa.int64()),
    _opt("critic_calls", pa.int64()),
)

# One row per training step of an arm: what the step cost (schemas.cost.StepCost).
STEP_COSTS = _schema("step_costs", _req("step", pa.int32()), *_COST_FIELDS)

# One row: one unit's (arm x seed) training cost, its steps summed (schemas.cost.ArmCost).
# `device`: the physical device that trained it (`engine.settings.device_identity`; null: not known,
# a hosted service or a unit from before it was kept).
ARM_COSTS = _schema("arm_costs", _req("unit", pa.string()), _req("steps", pa.int32()), *_COST_FIELDS,
                    _opt("device", pa.string()))

# One row per arm compared with the baseline (a multi-arm or multi-seed decision, or a secondary reading).
COMPARISONS = _schema(
    "comparisons",
    _req("arm", pa.string()),
    _req("baseline", pa.string()),
    _req("n", pa.int64()),  # paired items per seed
    _req("seeds", pa.int32()),
    _req("mean_diff", pa.float64()),
    _req("lower", pa.float64()),  # the rule's one-sided bounds at the unadjusted alpha
    _req("upper", pa.float64()),
    _req("p_noninferior", pa.float64()),  # the rule's p-value of H0: difference <= margin
    _req("p_inferior", pa.float64()),  # of H0: difference >= margin
    _req("holm_p_noninferior", pa.float64()),  # Holm-adjusted over the compared arms
    _req("holm_p_inferior", pa.float64()),
    _req("verdict", pa.string()),
    _opt("treatment_mean", pa.float64()),
    _opt("baseline_mean", pa.float64()),
    _opt("method", pa.string()),  # the rule (null in a decision from before rules were named)
)

SCHEMAS: dict[str, pa.Schema] = {
    s.metadata[NAME_KEY].decode(): s
    for s in (ROLLOUTS, STEP_METRICS, EVAL_ITEMS, GATE_REPORT, DECISION, HELDOUT, CHECKPOINTS, AUDIT_MISMATCHES,
              STEP_COSTS, ARM_COSTS, COMPARISONS)
}


def schema_for(name: str) -> pa.Schema:
    try:
        return SCHEMAS[name]
    except KeyError:
        raise KeyError(f"unknown artifact {name!r} (known: {', '.join(SCHEMAS)})") from None


def to_table(name: str, rows_or_table: Iterable[Mapping] | pa.Table) -> pa.Table:
    """Rows (dicts) or a table as a table of the artifact's schema.

    A missing or unknown column, a value of the wrong type, or a null in a non-nullable column is
    a ValueError: these are bugs in the writer, not user input.
    """
    schema = schema_for(name)
    if isinstance(rows_or_table, pa.Table):
        table = rows_or_table
        missing = [c for c in schema.names if c not in table.column_names]
        unknown = [c for c in table.column_names if c not in schema.names]
        if missing or unknown:
            raise ValueError(f"{name}: missing columns {missing}, unknown columns {unknown}")
        table = table.select(schema.names)
    else:
        rows = list(rows_or_table)
        for i, row in enumerate(rows):
            missing = [c for c in schema.names if c not in row]
            unknown = [c for c in row if c not in schema.names]
            if missing or unknown:
                raise ValueError(f"{name} row {i}: missing columns {missing}, unknown columns {unknown}")
    try:
        if not isinstance(rows_or_table, pa.Table):
            table = pa.Table.from_pylist(rows, schema=schema.remove_metadata())
        return table.cast(schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, ValueError) as e:
        raise ValueError(f"{name}: {e}") from None


def write_artifact(name: str, rows_or_table: Iterable[Mapping] | pa.Table, path: str | Path) -> Path:
    """Write an artifact as Parquet, atomically (a failed write leaves the old file as it was)."""
    return write_parquet_atomic(to_table(name, rows_or_table), path)


def read_artifact(name: str, path: str | Path) -> pa.Table:
    """Read an artifact and check it is the `name` table; any mismatch is a one-line UserError."""
    schema = schema_for(name)
    table = read_parquet(path)
    stored = (table.schema.metadata or {}).get(NAME_KEY)
    if stored is not None and stored.decode() != name:
        raise UserError(f"{path}: holds a {stored.decode()!r} table, expected {name!r}")
    missing = [c for c in schema.names if c not in table.column_names]
    for column in [c for c in missing if schema.field(c).nullable]:  # a log from before an optional column
        table = table.append_column(schema.field(column), pa.nulls(table.num_rows, schema.field(column).type))
    missing = [c for c in missing if not schema.field(c).nullable]
    if missing:
        raise UserError(f"{path}: not a {name!r} table: missing column(s) {', '.join(missing)}")
    try:
        return table.select(schema.names).cast(schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, ValueError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"{path}: columns do not match the {name!r} schema ({first})") from None


def read_rows(name: str, path: str | Path) -> list[dict]:
    return read_artifact(name, path).to_pylist()
