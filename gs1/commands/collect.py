"""`gs1 collect`: sample N prompts x K rollouts and log reward plus every candidate kernel feature.

    gs1 collect --env NAME --n-prompts N --k K --backend local --base-model M
                [--base-model-path P] [--renderer R] [--question-model Q] --out LOG.parquet

`--question-model` adds the `question_embedding` feature: each question embedded by a small model
of its own, outside the policy (`hillclimb.question_embedding`; `smollm2` names the packaged
SmolLM2-135M), which a Tinker client can compute too.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rl.backends import BACKENDS, DEFAULT_BACKEND
from schemas.errors import UserError


def register(subparsers) -> None:
    p = subparsers.add_parser("collect", help="collect a rollout log (N prompts x K samples) for gs1 hillclimb",
                              description=__doc__.splitlines()[0])
    p.add_argument("--env", required=True, help="env name (gsm8k, arithmetic, rg_basic_arithmetic, ...)")
    p.add_argument("--n-prompts", type=int, required=True)
    p.add_argument("--k", type=int, default=8, help="samples per prompt (>= 8)")
    p.add_argument("--backend", default=DEFAULT_BACKEND, choices=list(BACKENDS))
    p.add_argument("--base-model", required=True, help="model name (hub id)")
    p.add_argument("--base-model-path", default=None, help="where its weights are (dir, .gguf, pkg:...)")
    p.add_argument("--renderer", default=None, help="tinker-cookbook renderer (default: the cookbook's pick)")
    p.add_argument("--data-dir", default=None, help="local data for the env (GSM8K)")
    p.add_argument("--split", default="train", choices=["train", "test"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--chunk-prompts", type=int, default=32, help="prompts whose requests are in flight together")
    p.add_argument("--no-embedding", action="store_true", help="skip the prompt embedding")
    p.add_argument("--question-model", default=None,
                   help="embed each question with this model too (smollm2: the packaged SmolLM2-135M; "
                        "or a .gguf, a model folder, pkg:...)")
    p.add_argument("--question-device", default="cpu", help="where the question model runs (cpu, cuda)")
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(func=run)


def default_renderer(base_model: str) -> str:
    try:
        from tinker_cookbook.model_info import get_recommended_renderer_name  # lazy: start-up time

        return get_recommended_renderer_name(base_model)
    except Exception:  # the cookbook raises several types for an unknown model
        raise UserError(f"no recommended renderer for {base_model!r}: pass --renderer") from None


def run(args: argparse.Namespace) -> int:
    from hillclimb.collect import CollectSettings, run_collection, write_rollout_log  # lazy: start-up time
    from hillclimb.question_embedding import question_embedding_for

    if args.out.suffix != ".parquet":
        raise UserError(f"--out must be a .parquet file, got {args.out}")
    settings = CollectSettings(
        env=args.env, n_prompts=args.n_prompts, k=args.k, base_model=args.base_model, backend=args.backend,
        base_model_path=args.base_model_path, renderer=args.renderer or default_renderer(args.base_model),
        split=args.split, seed=args.seed, max_tokens=args.max_tokens, temperature=args.temperature,
        chunk_prompts=args.chunk_prompts,
    )
    question_embedder, question_source = question_embedding_for(args.question_model, args.question_device)
    table = run_collection(settings, data_dir=args.data_dir, embed=not args.no_embedding,
                           question_embedder=question_embedder, question_embedding_source=question_source)
    write_rollout_log(table, args.out)
    import numpy as np  # lazy: start-up time

    reward = np.asarray(table.column("reward").to_pylist())
    print(f"wrote {args.out}: {table.num_rows} rollouts, {args.n_prompts} prompts x {args.k}, "
          f"mean reward {reward.mean():.3f}")
    return 0
