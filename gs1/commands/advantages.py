"""`gs1 advantages`: baselines and advantages for a rollout log, offline.

    gs1 advantages --estimator KIND --rollouts IN.parquet --out OUT.parquet [--bandwidth H] [--window N]

KIND: an arm kind that needs nothing but the log (estimators.registry; the spec's `advantage`
names, or the short names the kinds still answer to here). Input columns: step, prompt_id, reward,
prompt_num_tokens, prompt_mean_logprob; row order is rollout order. Output: the input columns
plus float64 baseline and advantage (replacing any such columns in the input), and the kind's
own columns (a kernel kind: kernel_mass, effective_neighbors, fallback). A group is a (step,
prompt_id); a step's rows are its batch, each step computed as the training loop computes it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from gs1.commands.argtypes import positive_float, positive_int
from schemas.errors import UserError

PROMPT_FEATURE_COLUMNS = ("prompt_num_tokens", "prompt_mean_logprob")  # read by a kernel kind alone
REQUIRED_COLUMNS = ("step", "prompt_id", "reward", *PROMPT_FEATURE_COLUMNS)


def offline_kinds() -> dict[str, str]:
    """Name -> kind, for the kinds whose advantages a rollout log alone determines (no learner
    forward, no critic), under their spec names and the short names this command took before."""
    from estimators import WINDOW
    from estimators.registry import ESTIMATORS

    kinds = [e for e in ESTIMATORS.values() if e.needs <= {WINDOW} and not e.input_columns]
    return {**{e.kind: e.kind for e in kinds}, **{alias: e.kind for e in kinds for alias in e.cli_aliases}}


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "advantages",
        help="compute baselines and advantages for a rollout log (Parquet)",
        description=__doc__.splitlines()[0],
    )
    names = offline_kinds()
    parser.add_argument("--estimator", required=True, choices=tuple(names), metavar="KIND",
                        help=f"one of {', '.join(n for n, k in names.items() if n == k)} "
                             f"(or {', '.join(n for n, k in names.items() if n != k)})")
    parser.add_argument("--rollouts", required=True, metavar="IN.parquet")
    parser.add_argument("--out", required=True, metavar="OUT.parquet")
    parser.add_argument("--bandwidth", type=positive_float, default=None, metavar="H", help="a kernel kind only (default 0.5)")
    parser.add_argument("--window", type=positive_int, default=None, metavar="N", help="a kernel kind only (default 256)")
    parser.set_defaults(func=run)


def required_columns(kind) -> tuple[str, ...]:
    """The columns kind `kind` reads: the prompt features only where it reads them."""
    return tuple(c for c in REQUIRED_COLUMNS if kind.reads_prompt_features or c not in PROMPT_FEATURE_COLUMNS)


def _numeric(table: pa.Table, name: str, path) -> np.ndarray:
    column = table.column(name)
    if column.null_count:
        raise UserError(f"{path}: column {name} has {column.null_count} null value(s)")
    try:
        values = column.to_numpy().astype(np.float64)
    except (TypeError, ValueError, pa.ArrowInvalid):
        raise UserError(f"{path}: column {name} is not numeric ({column.type})") from None
    return values


def recipe_for(kind: str, *, bandwidth: float | None = None, window: int | None = None):
    """The kind's default recipe, its kernel at the given bandwidth and window."""
    from estimators.registry import estimator_for

    estimator = estimator_for(offline_kinds().get(kind, kind))
    recipe = estimator.recipe_type()
    kernel = estimator.kernel_of(recipe)
    if kernel is None:
        if bandwidth is not None or window is not None:
            raise UserError(f"--bandwidth and --window apply only to a kind with a kernel, not {kind}")
        return estimator, recipe
    if bandwidth is not None:  # the kind's default kernel, changed only where a flag says so
        kernel = kernel.with_bandwidth(bandwidth)
    if window is not None:
        kernel = kernel.with_window(window)
    return estimator, estimator.with_kernel(recipe, kernel)


def compute(table: pa.Table, estimator: str, *, bandwidth: float | None = None, window: int | None = None, path="rollouts") -> pa.Table:
    """The output table for the kind `estimator` over a checked rollout table (UserError on bad input)."""
    from estimators import StepBatch, step_batches  # lazy: start-up time
    from estimators.registry import own_columns

    kind, recipe = recipe_for(estimator, bandwidth=bandwidth, window=window)
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
        batches = step_batches(steps_R)
    except ValueError as e:
        raise UserError(f"{path}: {e}") from None
    num_tokens_R = np.ones_like(rewards_R)
    mean_logprob_R = np.zeros_like(rewards_R)
    if kind.reads_prompt_features:
        num_tokens_R = _numeric(table, "prompt_num_tokens", path)
        mean_logprob_R = _numeric(table, "prompt_mean_logprob", path)
        if np.any(~(num_tokens_R > 0)):
            raise UserError(f"{path}: column prompt_num_tokens must be > 0")
        if not np.all(np.isfinite(mean_logprob_R)):
            raise UserError(f"{path}: column prompt_mean_logprob has NaN or infinite values")
    _, group_R = np.unique(prompts_R, return_inverse=True)

    outputs: dict[str, list] = {}
    state = kind.new_window(recipe)
    for start, stop in batches:  # each step as the loop runs it, the window threaded through
        batch = StepBatch(rewards_R[start:stop], group_R.reshape(-1)[start:stop], num_tokens_R[start:stop],
                          mean_logprob_R[start:stop])
        step = kind.advantages(recipe, batch, state)
        state = kind.advance_window(recipe, state, batch)
        for name, values in step.logged().items():
            outputs.setdefault(name, []).append(np.asarray(values))

    result = table.drop_columns([c for c in ("baseline", "advantage", *own_columns()) if c in table.column_names])
    for name, parts in outputs.items():
        values = np.concatenate(parts)
        result = result.append_column(name, pa.array(values, pa.bool_() if values.dtype == bool else pa.float64()))
    return result


def run(args) -> int:
    from schemas.io import read_parquet, write_parquet_atomic  # lazy: start-up time

    kind, _ = recipe_for(args.estimator, bandwidth=args.bandwidth, window=args.window)  # flags checked before the work
    if Path(args.out).is_dir():  # checked before the work, not after it
        raise UserError(f"--out {args.out}: is a directory; name the Parquet file to write")
    table = read_parquet(args.rollouts, required=required_columns(kind))
    result = compute(table, args.estimator, bandwidth=args.bandwidth, window=args.window, path=args.rollouts)
    write_parquet_atomic(result, args.out)
    print(f"wrote {result.num_rows} rows to {args.out}")
    return 0
