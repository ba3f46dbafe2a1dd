"""`gs1 advantages`: baselines and advantages for a rollout log, offline.

    gs1 advantages --estimator {grpo,gs1_kernel,batch_mean,rloo} --rollouts IN.parquet
                   --out OUT.parquet [--bandwidth H] [--window N]

Input columns: step, prompt_id, reward, prompt_num_tokens, prompt_mean_logprob; row order is
rollout order. Output: the input columns plus float64 baseline and advantage (replacing any such
columns in the input), and for gs1_kernel kernel_mass, effective_neighbors and fallback.
grpo and rloo group by (step, prompt_id); batch_mean and gs1_kernel batch by step.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from gs1.commands.argtypes import positive_float, positive_int
from schemas.errors import UserError

ESTIMATORS = ("grpo", "gs1_kernel", "batch_mean", "rloo")
REQUIRED_COLUMNS = ("step", "prompt_id", "reward", "prompt_num_tokens", "prompt_mean_logprob")
OUTPUT_COLUMNS = ("baseline", "advantage", "kernel_mass", "effective_neighbors", "fallback")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "advantages",
        help="compute baselines and advantages for a rollout log (Parquet)",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument("--estimator", required=True, choices=ESTIMATORS)
    parser.add_argument("--rollouts", required=True, metavar="IN.parquet")
    parser.add_argument("--out", required=True, metavar="OUT.parquet")
    parser.add_argument("--bandwidth", type=positive_float, default=None, metavar="H", help="gs1_kernel only (default 0.5)")
    parser.add_argument("--window", type=positive_int, default=None, metavar="N", help="gs1_kernel only (default 256)")
    parser.set_defaults(func=run)


def _numeric(table: pa.Table, name: str, path) -> np.ndarray:
    column = table.column(name)
    if column.null_count:
        raise UserError(f"{path}: column {name} has {column.null_count} null value(s)")
    try:
        values = column.to_numpy().astype(np.float64)
    except (TypeError, ValueError, pa.ArrowInvalid):
        raise UserError(f"{path}: column {name} is not numeric ({column.type})") from None
    return values


def compute(table: pa.Table, estimator: str, *, bandwidth: float | None = None, window: int | None = None, path="rollouts") -> pa.Table:
    """The output table for `estimator` over a checked rollout table (UserError on bad input)."""
    # lazy: start-up time
    from rl.estimators import batch_mean_advantages, grpo_advantages, gs1_kernel_log, rloo_advantages, step_batches
    from rl.kernels import prompt_features
    from schemas.kernel import KernelSpec

    if table.num_rows == 0:
        raise UserError(f"{path}: the rollout table is empty")
    rewards_R = _numeric(table, "reward", path)
    bad = int(np.sum(~np.isfinite(rewards_R)))
    if bad:
        raise UserError(f"{path}: column reward has {bad} NaN or infinite value(s)")
    steps_R = _numeric(table, "step", path)
    if np.any(steps_R != np.round(steps_R)):
        raise UserError(f"{path}: column step must hold integers")
    steps_R = steps_R.astype(np.int64)
    if table.column("prompt_id").null_count:
        raise UserError(f"{path}: column prompt_id has null values")
    prompts_R = np.asarray(table.column("prompt_id").to_pylist()).astype(str)
    try:
        step_batches(steps_R)
    except ValueError as e:
        raise UserError(f"{path}: {e}") from None

    columns: dict[str, pa.Array] = {}
    if estimator in ("grpo", "rloo"):
        _, step_index_R = np.unique(steps_R, return_inverse=True)
        _, prompt_index_R = np.unique(prompts_R, return_inverse=True)
        group_ids_R = step_index_R.reshape(-1) * (int(prompt_index_R.max()) + 1) + prompt_index_R.reshape(-1)
        estimate = grpo_advantages if estimator == "grpo" else rloo_advantages
        baseline_R, advantage_R = estimate(rewards_R, group_ids_R)
    elif estimator == "batch_mean":
        baseline_R, advantage_R = np.empty_like(rewards_R), np.empty_like(rewards_R)
        for start, stop in step_batches(steps_R):
            baseline_R[start:stop], advantage_R[start:stop] = batch_mean_advantages(rewards_R[start:stop])
    else:
        num_tokens_R = _numeric(table, "prompt_num_tokens", path)
        mean_logprob_R = _numeric(table, "prompt_mean_logprob", path)
        if np.any(~(num_tokens_R > 0)):
            raise UserError(f"{path}: column prompt_num_tokens must be > 0")
        if not np.all(np.isfinite(mean_logprob_R)):
            raise UserError(f"{path}: column prompt_mean_logprob has NaN or infinite values")
        kernel = KernelSpec()  # the pre-registered kernel, changed only where a flag says so
        if bandwidth is not None:
            kernel = kernel.with_bandwidth(bandwidth)
        if window is not None:
            kernel = kernel.with_window(window)
        out = gs1_kernel_log(steps_R, rewards_R, prompt_features(num_tokens_R, mean_logprob_R, kernel.features), kernel)
        baseline_R, advantage_R = out.baseline, out.advantage
        columns["kernel_mass"] = pa.array(out.kernel_mass, pa.float64())
        columns["effective_neighbors"] = pa.array(out.effective_neighbors, pa.float64())
        columns["fallback"] = pa.array(out.fallback, pa.bool_())

    result = table.drop_columns([c for c in OUTPUT_COLUMNS if c in table.column_names])
    result = result.append_column("baseline", pa.array(baseline_R, pa.float64()))
    result = result.append_column("advantage", pa.array(advantage_R, pa.float64()))
    for name, array in columns.items():
        result = result.append_column(name, array)
    return result


def run(args) -> int:
    from schemas.io import read_parquet, write_parquet_atomic  # lazy: start-up time

    if args.estimator != "gs1_kernel" and (args.bandwidth is not None or args.window is not None):
        raise UserError(f"--bandwidth and --window apply only to --estimator gs1_kernel, not {args.estimator}")
    if Path(args.out).is_dir():  # checked before the work, not after it
        raise UserError(f"--out {args.out}: is a directory; name the Parquet file to write")
    table = read_parquet(args.rollouts, required=REQUIRED_COLUMNS)
    result = compute(table, args.estimator, bandwidth=args.bandwidth, window=args.window, path=args.rollouts)
    write_parquet_atomic(result, args.out)
    print(f"wrote {result.num_rows} rows to {args.out}")
    return 0
