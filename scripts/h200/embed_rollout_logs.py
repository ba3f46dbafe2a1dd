"""The policy's prompt embedding added to rollout logs collected without it (issue 26: the first
H200 logs, collected while the engine had lost its hidden-state hook), through the local engine
(`hillclimb.collect.add_prompt_embeddings`): one model load for every log.

    python scripts/h200/embed_rollout_logs.py --base-model-path /root/m/model.gguf --data-dir GSM8K_DIR \
        --out DIR LOG.parquet ...

Each log is rewritten into DIR under its own name with the `prompt_embedding` column on each
prompt's first row; its prompts are rebuilt from its own settings and checked against its prompt
ids and lengths. One line per log (prompts, seconds) and exit 1 if any failed.
"""

from __future__ import annotations

import argparse
import time
import traceback
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("logs", nargs="+", type=Path)
    p.add_argument("--base-model-path", required=True)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()

    import pyarrow.parquet as pq

    from hillclimb.collect import add_prompt_embeddings, write_rollout_log
    from rl.backends import make_service_client

    t0 = time.perf_counter()
    sampler = make_service_client("local").create_sampling_client(base_model=args.base_model_path).result()
    print(f"[embed] model loaded: {args.base_model_path} ({time.perf_counter() - t0:.1f}s)", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    failed = []
    for log in args.logs:
        t_log = time.perf_counter()
        try:
            table = add_prompt_embeddings(pq.read_table(log), sampler, args.data_dir)
        except Exception:
            print(f"[embed] {log.name} FAILED:\n{traceback.format_exc()}", flush=True)
            failed.append(log.name)
            continue
        path = write_rollout_log(table, args.out / log.name)
        n = sum(1 for v in table.column("prompt_embedding").to_pylist() if v is not None)
        print(f"[embed] {log.name}: {n} prompts -> {path} ({time.perf_counter() - t_log:.1f}s, "
              f"total {time.perf_counter() - t0:.1f}s)", flush=True)
    if failed:
        print(f"[embed] failed: {', '.join(failed)}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
