"""Rollout logs for the transfer study, collected in one process on one GPU (issue 7: results/issue7/logs/;
issue 26: results/geff/logs/, through scripts/h200/geff_device_run.sh).

    python scripts/h200/collect_rollout_logs.py --base-model-path /root/m/model.gguf --out DIR \
        --data-dir GSM8K_DIR --envs gsm8k rg_basic_arithmetic ... [--n-prompts 128 --k 10] \
        [--question-model smollm2|PATH --question-device cuda]

Same as one `gs1 collect` per env (hillclimb.collect.run_collection), but the local engine and its
dequantised weights, and the question model, are built once and shared by every env. Envs run in
the given order; one whose collection fails is reported and skipped; none is started after
--deadline-s seconds. Each finished env appends one JSON line to DIR/summary.jsonl (rows, prompts,
mean reward, length-stopped share, seconds), the numbers a results README's table gives.
"""

from __future__ import annotations

import argparse
import time
import traceback
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--envs", nargs="+", required=True)
    p.add_argument("--base-model", default="Qwen/Qwen2.5-Coder-1.5B-Instruct")
    p.add_argument("--base-model-path", required=True)
    p.add_argument("--renderer", default="qwen3_instruct")  # Qwen chat format (im_start/im_end)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--n-prompts", type=int, default=128)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--chunk-prompts", type=int, default=48)
    p.add_argument("--deadline-s", type=float, default=1e9)
    p.add_argument("--question-model", default=None, help="as `gs1 collect --question-model`")
    p.add_argument("--question-device", default="cuda")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()

    import json

    import numpy as np

    from hillclimb.collect import CollectSettings, run_collection, write_rollout_log
    from hillclimb.question_embedding import question_embedding_for
    from rl.backends import make_service_client

    t0 = time.perf_counter()
    service = make_service_client("local")
    args.out.mkdir(parents=True, exist_ok=True)
    # the policy's weights load once, here, so that each env's seconds are its own collection
    service.create_sampling_client(base_model=args.base_model_path).result()
    print(f"[collect] model loaded: {args.base_model_path} ({time.perf_counter() - t0:.1f}s)", flush=True)
    question_embedder, question_source = question_embedding_for(args.question_model, args.question_device)
    if question_embedder is not None:
        print(f"[collect] question model loaded: {question_source} (total {time.perf_counter() - t0:.1f}s)", flush=True)
    failed = []
    for env in args.envs:
        if time.perf_counter() - t0 > args.deadline_s:
            print(f"[collect] deadline passed: {env} not collected", flush=True)
            continue
        t_env = time.perf_counter()
        settings = CollectSettings(
            env=env, n_prompts=args.n_prompts, k=args.k, base_model=args.base_model, backend="local",
            base_model_path=args.base_model_path, renderer=args.renderer, max_tokens=args.max_tokens,
            temperature=args.temperature, chunk_prompts=args.chunk_prompts,
        )
        try:
            table = run_collection(settings, service=service, data_dir=args.data_dir, embed=True,
                                   question_embedder=question_embedder, question_embedding_source=question_source)
        except Exception:
            print(f"[collect] {env} FAILED:\n{traceback.format_exc()}", flush=True)
            failed.append(env)
            continue
        path = write_rollout_log(table, args.out / f"{env}.parquet")
        r = np.asarray(table.column("reward").to_pylist())
        stop = table.column("stop_reason").to_pylist()
        line = {"env": env, "rows": table.num_rows, "prompts": args.n_prompts, "k": args.k,
                "max_tokens": args.max_tokens, "mean_reward": round(float(r.mean()), 4),
                "length_stopped": round(float(np.mean([s == "length" for s in stop])), 4),
                "seconds": round(time.perf_counter() - t_env, 1), "bytes": path.stat().st_size}
        with open(args.out / "summary.jsonl", "a") as f:
            f.write(json.dumps(line) + "\n")
        print(f"[collect] {env}: {table.num_rows} rows -> {path}; mean reward {r.mean():.3f}; "
              f"length-stopped {line['length_stopped']:.2f}; "
              f"{time.perf_counter() - t_env:.1f}s (total {time.perf_counter() - t0:.1f}s)", flush=True)
    if failed:
        print(f"[collect] failed: {', '.join(failed)}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
