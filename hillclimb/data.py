"""Rollout logs for the offline kernel hill-climb: loading, checking, the prompt split, the streams.

A hill-climb log is Parquet with one row per rollout: `prompt_id`, `sample_idx` (K >= 3 samples
per prompt; collection uses K >= 8), `reward`, and prompt-level feature columns:

| column | feature (kernel name) |
|---|---|
| `prompt_num_tokens` | `log_prompt_num_tokens` (its log) |
| `prompt_mean_logprob` | `prompt_mean_logprob` |
| `value_*` (float) | the same name: the policy's cheap value signals |
| `text_*` (float) | the same name: text statistics of the question and reference answer (`text_features`) |
| `emb_0 .. emb_{d-1}` or list column `prompt_embedding` | `embedding` (one group of d columns) |
| list column `question_embedding` | `question_embedding`: the question text embedded by a small packaged model (`question_embedding.py`) |

A list column needs its vector on each prompt's first row only (collection writes it there, in
float16, and leaves the other rows null: the log stays small).

Response-level columns (`response_num_tokens`, `num_tokens`) are read but never used as kernel
features: they depend on the rollout's own action, and a baseline that depends on the action
biases the policy gradient.

Prompt-level features are taken from each prompt's first row (lowest sample_idx); they are the
same for every sample of a prompt.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from hillclimb.geff import HeldOut, held_out_stats
from schemas.errors import UserError
from schemas.io import read_parquet

EMBEDDING = "embedding"
QUESTION_EMBEDDING = "question_embedding"
LIST_FEATURES = {"prompt_embedding": EMBEDDING, QUESTION_EMBEDDING: QUESTION_EMBEDDING}  # list column -> feature
MIN_SAMPLES_PER_PROMPT = 3  # the drawn rollout plus 2 held-out samples (a held-out variance)
REQUIRED_COLUMNS = ("prompt_id", "sample_idx", "reward")
SCALAR_FEATURE_PREFIXES = ("value_", "text_")  # prompt-level float columns kept under their own name


@dataclass(frozen=True)
class FeatureFamily:
    """A group of kernel features one kind of client computes at sampling time (issue 26): the
    frontier searches each family alone. `who` says which clients can have it."""

    name: str
    names: tuple[str, ...] = ()  # features taken by exact name
    prefixes: tuple[str, ...] = ()  # ... and by prefix
    who: str = ""

    def of(self, feature_names) -> tuple[str, ...]:
        """This family's features among `feature_names` (a log's), in their order."""
        return tuple(f for f in feature_names if f in self.names or f.startswith(self.prefixes))


FEATURE_FAMILIES = (
    FeatureFamily("length_logprob", names=("log_prompt_num_tokens", "prompt_mean_logprob"),
                  who="any client: the prompt's length, and its logprob from one compute_logprobs call (Tinker has it); "
                      "what the training loop logs, hence all the gs1_kernel arm runs on"),
    FeatureFamily("text", prefixes=("text_",),
                  who="any client, no model call: statistics of the question's text and of the env's gold answer "
                      "(where the env has one)"),
    FeatureFamily("value_probe", prefixes=("value_",),
                  who="any client: compute_logprobs of the prompt plus a fixed \"easy\" answer (Tinker has it)"),
    FeatureFamily("policy_embedding", names=(EMBEDDING,),
                  who="the local engine only: the policy's hidden states (a Tinker sampler returns none)"),
    FeatureFamily("question_embedding", names=(QUESTION_EMBEDDING,),
                  who="any client: a small packaged model (SmolLM2-135M) embeds the question on the client's machine"),
)


@dataclass
class RolloutLog:
    """A hill-climb log gathered per prompt (P prompts, up to K samples each)."""

    name: str
    prompt_ids_P: np.ndarray  # str, first-appearance order
    rewards_P_K: np.ndarray  # float64, NaN padded
    n_samples_P: np.ndarray  # int
    features: dict[str, np.ndarray]  # feature name -> (P, d) float64, d = 1 for scalars
    metadata: dict[str, str]

    @property
    def feature_names(self) -> list[str]:
        return list(self.features)


def load_log(path: str | Path, name: str | None = None) -> RolloutLog:
    """Read and check a hill-climb log; any problem is a one-line UserError."""
    path = Path(path)
    table = read_parquet(path)
    meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items() if not k.startswith(b"ARROW")}
    return log_from_table(table, name or meta.get("gs1.env") or path.stem, meta, where=str(path))


def log_from_table(table: pa.Table, name: str, metadata: dict | None = None, where: str = "log") -> RolloutLog:
    missing = [c for c in REQUIRED_COLUMNS if c not in table.column_names]
    if missing:
        raise UserError(f"{where}: missing column(s) {', '.join(missing)}")
    if table.num_rows == 0:
        raise UserError(f"{where}: the log is empty")
    prompt_ids = np.asarray(table.column("prompt_id").cast(pa.string()).to_pylist(), dtype=object)
    sample_idx = _numeric(table, "sample_idx", where).astype(np.int64)
    reward = _numeric(table, "reward", where)
    if not np.all(np.isfinite(reward)):
        raise UserError(f"{where}: column reward has missing or non-finite values")
    if any(p is None for p in prompt_ids):
        raise UserError(f"{where}: column prompt_id has missing values")

    # group rows by prompt (first-appearance order), samples by sample_idx
    uniq, first, inverse = np.unique(prompt_ids.astype(str), return_index=True, return_inverse=True)
    order_P = np.argsort(first, kind="stable")
    rank = np.empty_like(order_P)
    rank[order_P] = np.arange(len(order_P))
    prompt_of_row = rank[inverse]
    P = len(uniq)
    rows = np.lexsort((sample_idx, prompt_of_row))
    counts = np.bincount(prompt_of_row, minlength=P)
    if counts.min() < MIN_SAMPLES_PER_PROMPT:
        bad = uniq[order_P][counts.argmin()]
        raise UserError(
            f"{where}: prompt {bad!r} has {counts.min()} sample(s); the hill-climb needs K >= "
            f"{MIN_SAMPLES_PER_PROMPT} per prompt (one drawn, the rest held out)"
        )
    K = int(counts.max())
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    pos_in_prompt = np.arange(len(rows)) - np.repeat(starts, counts)
    rewards_P_K = np.full((P, K), np.nan)
    rewards_P_K[prompt_of_row[rows], pos_in_prompt] = reward[rows]
    first_row_P = rows[starts]

    features: dict[str, np.ndarray] = {}
    if "prompt_num_tokens" in table.column_names:
        n = _numeric(table, "prompt_num_tokens", where)[first_row_P]
        if np.any(~(n > 0)):
            raise UserError(f"{where}: column prompt_num_tokens must be positive")
        features["log_prompt_num_tokens"] = np.log(n)[:, None]
    if "prompt_mean_logprob" in table.column_names:
        features["prompt_mean_logprob"] = _numeric(table, "prompt_mean_logprob", where)[first_row_P][:, None]
    for col in table.column_names:
        if col.startswith(SCALAR_FEATURE_PREFIXES):
            features[col] = _numeric(table, col, where)[first_row_P][:, None]
    emb_cols = sorted((c for c in table.column_names if c.startswith("emb_") and c[4:].isdigit()), key=lambda c: int(c[4:]))
    if emb_cols:
        features[EMBEDDING] = np.stack([_numeric(table, c, where)[first_row_P] for c in emb_cols], axis=1)
    for column, fname in LIST_FEATURES.items():
        if column not in table.column_names or fname in features:
            continue
        col = table.column(column).combine_chunks()
        try:
            emb = np.asarray(col.take(pa.array(first_row_P)).to_pylist(), dtype=np.float64)
        except (TypeError, ValueError):
            raise UserError(f"{where}: column {column} must be a list of equal-length float vectors") from None
        if emb.ndim != 2:
            raise UserError(f"{where}: column {column} must be a list of equal-length float vectors")
        features[fname] = emb
    for fname, values in features.items():
        if not np.all(np.isfinite(values)):
            raise UserError(f"{where}: feature {fname} has missing or non-finite values")
    if not features:
        raise UserError(
            f"{where}: no feature columns (prompt_num_tokens, prompt_mean_logprob, value_*, text_*, emb_*, "
            "prompt_embedding or question_embedding)"
        )
    return RolloutLog(
        name=name,
        prompt_ids_P=uniq[order_P],
        rewards_P_K=rewards_P_K,
        n_samples_P=counts,
        features=features,
        metadata=dict(metadata or {}),
    )


def _numeric(table: pa.Table, col: str, where: str) -> np.ndarray:
    try:
        arr = table.column(col).cast(pa.float64()).to_numpy(zero_copy_only=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, TypeError):
        raise UserError(f"{where}: column {col} is not numeric") from None
    return np.asarray(arr, dtype=np.float64)


def split_prompts(prompt_ids_P: np.ndarray, seed: int) -> np.ndarray:
    """True for evaluation-split prompts: a seeded hash of the prompt id, about half of them."""
    out = np.empty(len(prompt_ids_P), dtype=bool)
    for i, pid in enumerate(prompt_ids_P):
        h = hashlib.sha256(f"gs1-hillclimb:{seed}:{pid}".encode()).digest()
        out[i] = h[0] & 1 == 1
    return out


@dataclass
class Stream:
    """One sample per prompt, drawn (seeded) into training order, with its held-out samples."""

    name: str
    prompt_ids_N: np.ndarray
    reward_N: np.ndarray  # the drawn rollout's reward (what the window sees)
    held: HeldOut  # the prompt's other samples (what b is judged against)
    sigma2_N: np.ndarray  # unbiased per-prompt reward variance over all samples
    rewards_N_K: np.ndarray  # all samples (NaN padded), for the GRPO references
    features: dict[str, np.ndarray]  # name -> (N, d)

    @property
    def n(self) -> int:
        return len(self.reward_N)


def make_stream(log: RolloutLog, mask_P: np.ndarray, seed: int, name: str) -> Stream:
    """Order the masked prompts by a seeded permutation and draw one sample of each."""
    idx = np.flatnonzero(mask_P)
    rng = np.random.default_rng([seed, len(name), sum(name.encode())])
    idx = idx[rng.permutation(len(idx))]
    r_N_K = log.rewards_P_K[idx]
    n_N = log.n_samples_P[idx]
    drawn_N = (rng.random(len(idx)) * n_N).astype(np.int64)  # sample slots are left-packed
    N, K = r_N_K.shape
    reward_N = r_N_K[np.arange(N), drawn_N]
    others = r_N_K.copy()
    others[np.arange(N), drawn_N] = np.nan
    # left-pack the held-out samples (NaN last) for held_out_stats
    others = np.take_along_axis(others, np.argsort(np.isnan(others), axis=1, kind="stable"), axis=1)[:, : K - 1]

    held = held_out_stats(others)
    sigma2 = held_out_stats(r_N_K).var_P
    return Stream(
        name=name,
        prompt_ids_N=log.prompt_ids_P[idx],
        reward_N=reward_N,
        held=held,
        sigma2_N=sigma2,
        rewards_N_K=r_N_K,
        features={k: v[idx] for k, v in log.features.items()},
    )


def make_streams(log: RolloutLog, seed: int) -> tuple[Stream, Stream]:
    """(search, eval) streams over disjoint prompt halves; both must be non-trivial."""
    is_eval = split_prompts(log.prompt_ids_P, seed)
    if is_eval.sum() < 2 or (~is_eval).sum() < 2:
        raise UserError(f"{log.name}: too few prompts ({len(is_eval)}) to split into search and eval halves")
    streams = make_stream(log, ~is_eval, seed, "search"), make_stream(log, is_eval, seed, "eval")
    for st in streams:
        if not st.sigma2_N.mean() > 0:
            raise UserError(
                f"{log.name}: every {st.name}-split prompt has a constant reward (mean reward "
                f"{st.reward_N.mean():.3f}), so G_eff is undefined"
            )
    return streams


def synthetic_log_table(n_prompts: int, k: int = 8, seed: int = 0, emb_dim: int = 8, signal: float = 2.0) -> pa.Table:
    """A hill-climb log with planted structure, for tests and the benchmark.

    Each prompt's success probability is sigmoid(signal * x - 0.3): `value_easy` = x + small noise
    predicts it strongly, `prompt_mean_logprob` = 0.5 x + noise weakly, `prompt_num_tokens` is pure
    noise, and `emb_0` carries x while the other embedding columns are noise. Rewards are Bernoulli.
    """
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n_prompts)
    mu = 1.0 / (1.0 + np.exp(-(signal * x - 0.3)))
    emb = rng.normal(size=(n_prompts, emb_dim))
    emb[:, 0] = x + 0.3 * rng.normal(size=n_prompts)
    cols = {
        "prompt_id": np.repeat(np.array([f"synth/{i}" for i in range(n_prompts)], dtype=object), k),
        "sample_idx": np.tile(np.arange(k, dtype=np.int32), n_prompts),
        "reward": (rng.random(n_prompts * k) < np.repeat(mu, k)).astype(np.float64),
        "prompt_num_tokens": np.repeat(rng.integers(20, 400, size=n_prompts).astype(np.int32), k),
        "prompt_mean_logprob": np.repeat(-2.0 + 0.5 * x + rng.normal(size=n_prompts), k),
        "value_easy": np.repeat(x + 0.2 * rng.normal(size=n_prompts), k),
        "response_num_tokens": rng.integers(5, 500, size=n_prompts * k).astype(np.int32),
    }
    for c in range(emb_dim):
        cols[f"emb_{c}"] = np.repeat(emb[:, c], k)
    return pa.table(cols)
