"""Rollout logs for the kernel hill-climb: N prompts x K samples, every candidate feature per rollout.

Pure collection over the backend surface (docs/contracts.md): a sampling client's `sample` and
`compute_logprobs`, futures everywhere. Per chunk of prompts, every request (K samples, the prompt
logprobs, the value-signal logprobs) is submitted before any is awaited, so the local engine runs
each chunk as one batch and a hosted service sees them all in flight.

Per rollout (one Parquet row, `rollout_log_table`):
- `prompt_id`, `sample_idx`, `reward` (the env's training reward), `stop_reason`, `response`
- `prompt_num_tokens`; `prompt_mean_logprob`: mean sampler logprob over prompt tokens 2..n
- `response_num_tokens` (action-dependent: logged, never a kernel feature)
- `value_easy_logprob`: the policy's cheap value signal, the mean logprob of the fixed assistant
  continuation VALUE_CONTINUATION right after the prompt ("is this easy?" as the model sees it)
- `text_*`: text statistics of the problem's question and reference answer
  (`hillclimb.text_features`), computed from the problem alone, no model call
- `prompt_embedding`: the prompt embedding, the mean over prompt tokens of the model's last hidden
  state. Only the local backend exposes hidden states: the embedding is computed from the local
  engine's own torch model (base weights, on its worker thread) and the Parquet metadata says so;
  with other backends the column is absent.
- `question_embedding`: the question text embedded by a small model from a package
  (`hillclimb.question_embedding`), when a question embedder is given: what a client that
  cannot read the policy's hidden states (a Tinker client) can compute on its own.
Both embeddings are prompt-level: float16 vectors on each prompt's first sample row (sample_idx 0),
null on the others, so that a log of 512 prompts x K samples stays a few MB (`write_rollout_log`,
zstd). Metadata (`gs1.*` keys): env, model, backend, renderer, sampling settings, value
continuation, embedding sources.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
from tinker import types
from tinker_cookbook import renderers

from estimators.kernels import prompt_mean_logprob
from hillclimb.text_features import text_features
from rl.backends import DEFAULT_BACKEND, make_service_client
from rl.backends.responses import backend_of, resolved
from rl.envs import get_env
from schemas.errors import UserError
from schemas.io import write_parquet_atomic

VALUE_CONTINUATION = "This is easy."
MIN_K = 8


@dataclass(frozen=True)
class CollectSettings:
    env: str
    n_prompts: int
    k: int
    base_model: str
    backend: str = DEFAULT_BACKEND
    base_model_path: str | None = None
    renderer: str = ""
    split: str = "train"
    seed: int = 0
    max_tokens: int = 256
    temperature: float = 1.0
    chunk_prompts: int = 32  # prompts whose requests are in flight together


def continuation_logprob(logprobs: Sequence[float | None], n_continuation: int) -> float:
    """Mean logprob of the last `n_continuation` tokens of a scored sequence."""
    tail = [float(x) for x in logprobs[-n_continuation:] if x is not None]
    return float(np.mean(tail)) if tail else float("nan")


def local_prompt_embedder(sampling_client) -> Callable[[list[list[int]]], np.ndarray] | None:
    """Mean-pooled last hidden state under the sampling client's own weights
    (`LocalSamplingClient.prompt_embeddings`), or None off the local backend."""
    if not hasattr(sampling_client, "prompt_embeddings"):
        return None

    def embed_all(prompts_P: list[list[int]]) -> np.ndarray:
        inputs_P = [types.ModelInput.from_ints(ids) for ids in prompts_P]
        return sampling_client.prompt_embeddings(inputs_P).result().double().numpy()

    return embed_all


def collect_rollouts(
    sampling_client,
    env,
    renderer,
    problems: Sequence,
    k: int,
    sampling_params: types.SamplingParams,
    tokenizer,
    embedder: Callable[[list[list[int]]], np.ndarray] | None = None,
    chunk_prompts: int = 32,
    question_embedder: Callable[[list[str]], np.ndarray] | None = None,
) -> list[dict]:
    """One dict per rollout (module docstring), prompts in the given order, K samples each."""
    cont_tokens = tokenizer.encode(VALUE_CONTINUATION, add_special_tokens=False)
    backend = backend_of(sampling_client)
    rows: list[dict] = []
    for lo in range(0, len(problems), chunk_prompts):
        chunk = list(problems[lo : lo + chunk_prompts])
        prompts_P = [env.build_prompt(renderer, p) for p in chunk]
        # every request of the chunk in flight before any is awaited
        sample_futures_P = [sampling_client.sample(m, k, sampling_params) for m in prompts_P]
        prompt_lp_futures_P = [sampling_client.compute_logprobs(m) for m in prompts_P]
        value_lp_futures_P = [
            sampling_client.compute_logprobs(types.ModelInput.from_ints(m.to_ints() + list(cont_tokens)))
            for m in prompts_P
        ]
        tokens_P = [m.to_ints() for m in prompts_P]
        emb_P_d = embedder(tokens_P) if embedder is not None else None
        qemb_P_d = question_embedder([p.question for p in chunk]) if question_embedder is not None else None
        for i, (problem, prompt) in enumerate(zip(chunk, prompts_P)):
            # each answer awaited within the backend's per-call limit (`resolved`: a hung service is one line)
            response = resolved(sample_futures_P[i], backend=backend, call="sample", expected="a SampleResponse")
            prompt_lp = prompt_mean_logprob(resolved(prompt_lp_futures_P[i], backend=backend, call="compute_logprobs",
                                                     expected="a list of logprobs"), prompt.length)  # the loop's own feature
            value_lp = continuation_logprob(resolved(value_lp_futures_P[i], backend=backend, call="compute_logprobs",
                                                     expected="a list of logprobs"), len(cont_tokens))
            text = text_features(problem.question, problem.answer)
            for s, seq in enumerate(response.sequences):
                tokens = list(seq.tokens)
                row = {
                    "prompt_id": problem.id,
                    "sample_idx": s,
                    "reward": float(env.reward(renderer, problem, tokens)),
                    "prompt_num_tokens": prompt.length,
                    "prompt_mean_logprob": prompt_lp,
                    "response_num_tokens": len(tokens),
                    "stop_reason": str(seq.stop_reason),
                    "value_easy_logprob": value_lp,
                    "response": tokenizer.decode(tokens),
                    **text,
                }
                # prompt-level vectors once per prompt (the loader reads a prompt's first row)
                if emb_P_d is not None:
                    row["prompt_embedding"] = [float(v) for v in emb_P_d[i]] if s == 0 else None
                if qemb_P_d is not None:
                    row["question_embedding"] = [float(v) for v in qemb_P_d[i]] if s == 0 else None
                rows.append(row)
    return rows


EMBEDDING_COLUMNS = ("prompt_embedding", "question_embedding")


def rollout_log_table(rows: list[dict], settings: CollectSettings, embedding_source: str,
                      question_embedding_source: str = "none") -> pa.Table:
    """The rows as a Parquet-ready table with the settings in its schema metadata."""
    table = pa.Table.from_pylist(rows)
    types_ = {"sample_idx": pa.int32(), "prompt_num_tokens": pa.int32(), "response_num_tokens": pa.int32(),
              # float16 holds a bf16 model's hidden state without loss and halves the log
              **{c: pa.list_(pa.float16()) for c in EMBEDDING_COLUMNS}}
    for name, t in types_.items():
        if name in table.column_names:
            table = table.set_column(table.column_names.index(name), name, table.column(name).cast(t))
    meta = {
        "gs1.env": settings.env,
        "gs1.base_model": settings.base_model,
        "gs1.base_model_path": settings.base_model_path or "",
        "gs1.backend": settings.backend,
        "gs1.renderer": settings.renderer,
        "gs1.sampling": json.dumps(
            {"temperature": settings.temperature, "max_tokens": settings.max_tokens, "k": settings.k, "seed": settings.seed}
        ),
        "gs1.settings": json.dumps(asdict(settings), sort_keys=True),
        "gs1.value_continuation": VALUE_CONTINUATION,
        "gs1.embedding": embedding_source,
        "gs1.question_embedding": question_embedding_source,
    }
    return table.replace_schema_metadata(meta)


def write_rollout_log(table: pa.Table, path) -> Path:
    """A rollout log on disk: zstd (the responses' text and the embeddings compress 2-3x better)."""
    return write_parquet_atomic(table, path, compression="zstd")


LOCAL_EMBEDDING_SOURCE = "mean-pooled last hidden state of the local engine's model (sampler weights)"


def add_prompt_embeddings(table: pa.Table, sampler, data_dir=None, chunk_prompts: int = 128) -> pa.Table:
    """A log collected without the policy's prompt embedding, with it: the log's own settings
    (metadata) rebuild its prompts, each checked against the log's prompt id and length, and
    `sampler` (a local one, the log's policy) embeds them. For logs whose collection could not
    take the embedding (issue 26's first H200 logs: the engine had lost the hook)."""
    meta = dict(table.schema.metadata)
    settings = CollectSettings(**json.loads(meta[b"gs1.settings"]))
    embedder = local_prompt_embedder(sampler)
    if embedder is None:
        raise UserError(f"{type(sampler).__name__} gives no hidden states: prompt embeddings need the local backend")
    env = make_env(settings.env, data_dir)
    problems = pick_problems(env, settings.split, settings.n_prompts, settings.seed)
    renderer = renderers.get_renderer(settings.renderer, sampler.get_tokenizer())
    tokens_P = [env.build_prompt(renderer, p).to_ints() for p in problems]
    ids_R = table.column("prompt_id").to_pylist()
    first_R = [s == 0 for s in table.column("sample_idx").to_pylist()]
    lengths_R = table.column("prompt_num_tokens").to_pylist()
    index = {p.id: i for i, p in enumerate(problems)}
    for pid, length in zip(ids_R, lengths_R):
        if pid not in index or len(tokens_P[index[pid]]) != length:
            raise UserError(f"{settings.env}: prompt {pid} of the log is not rebuilt by its settings "
                            f"(length {length} in the log)")
    logged = list(dict.fromkeys(ids_R))  # the log's prompts, in its order
    emb_P_d = np.concatenate([embedder([tokens_P[index[pid]] for pid in logged[lo : lo + chunk_prompts]])
                              for lo in range(0, len(logged), chunk_prompts)])
    row_of = {pid: i for i, pid in enumerate(logged)}
    column = pa.array([[float(v) for v in emb_P_d[row_of[pid]]] if first else None for pid, first in zip(ids_R, first_R)],
                      type=pa.list_(pa.float16()))
    if "prompt_embedding" in table.column_names:
        table = table.drop_columns(["prompt_embedding"])
    table = table.append_column("prompt_embedding", column)
    return table.replace_schema_metadata({**meta, b"gs1.embedding": LOCAL_EMBEDDING_SOURCE.encode()})


def pick_problems(env, split: str, n_prompts: int, seed: int) -> list:
    """The first `n_prompts` of the seed-shuffled train order (or of the test split in file order)."""
    problems = env.train_order(seed) if split == "train" else env.test_problems()
    return problems[:n_prompts]


def make_env(name: str, data_dir=None):
    """`rl.envs.get_env` (the reasoning-gym envs are registered there)."""
    return get_env(name, data_dir)


def run_collection(settings: CollectSettings, service=None, data_dir=None, embed: bool = True,
                   question_embedder: Callable[[list[str]], np.ndarray] | None = None,
                   question_embedding_source: str = "none") -> pa.Table:
    """Build the env, renderer and sampling client for `settings`, collect, and return the table.

    `service`: a backend service client (`rl.backends.make_service_client`); built from
    `settings.backend` when None. `question_embedder`: texts -> (P, d) vectors
    (`hillclimb.question_embedding.question_embedder`), named in the metadata by
    `question_embedding_source`.
    """
    if settings.k < MIN_K:
        raise UserError(f"--k must be at least {MIN_K} (got {settings.k})")
    if settings.n_prompts < 1:
        raise UserError("--n-prompts must be at least 1")
    env = make_env(settings.env, data_dir)
    problems = pick_problems(env, settings.split, settings.n_prompts, settings.seed)
    if len(problems) < settings.n_prompts:
        raise UserError(f"{settings.env}/{settings.split} has only {len(problems)} problems")
    if service is None:
        service = make_service_client(settings.backend)
    sampler = resolved(service.create_sampling_client(base_model=settings.base_model_path or settings.base_model),
                       backend=settings.backend, call="create_sampling_client", expected="a sampling client")
    tokenizer = sampler.get_tokenizer()
    renderer = renderers.get_renderer(settings.renderer, tokenizer)
    embedder = local_prompt_embedder(sampler) if embed else None
    params = types.SamplingParams(
        max_tokens=settings.max_tokens, temperature=settings.temperature, stop=env.stop_sequences(renderer)
    )
    rows = collect_rollouts(sampler, env, renderer, problems, settings.k, params, tokenizer, embedder,
                            settings.chunk_prompts, question_embedder)
    source = LOCAL_EMBEDDING_SOURCE if embedder else "none"
    return rollout_log_table(rows, settings, source, question_embedding_source if question_embedder else "none")
