"""What creating a LoRA training client costs on a loaded base, and the tokenizer copy's share.

    python benchmarks/client_setup.py --config qwen2.5-1.5b --tokenizer-dir .tok [--device cuda] [--clients 3]

Builds the model from its config (random weights, bf16; `engine.py`'s `build_model`), loads it
with a first client (not timed as a client), then times `--clients` more
`create_lora_training_client(...).result()` calls, rank `--rank`. Beside them, the copy each
client makes of the base's tokenizer (`models.own_tokenizer`), against the deep copy it used to
make. Prints a table of seconds (median and range).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))


def _timed(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", choices=["tiny", "qwen3-0.6b", "qwen2.5-1.5b"], default="tiny")
    ap.add_argument("--tokenizer-dir", default=None, help="a saved Qwen tokenizer to reuse")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--clients", type=int, default=3)
    ap.add_argument("--rank", type=int, default=32)
    args = ap.parse_args(argv)

    import torch

    from benchmarks.engine_speed import build_model
    from engine import LocalServiceClient
    from engine.models import own_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_model(args.config, Path(tmp) / "model", args.tokenizer_dir, args.device)
        svc = LocalServiceClient(device=args.device, cache_dir=Path(tmp) / "cache", dtype=torch.bfloat16)
        t = time.perf_counter()
        first = svc.create_lora_training_client(str(model_dir), rank=args.rank, seed=0).result()
        load_s = time.perf_counter() - t
        seeds = iter(range(1, args.clients + 1))
        clients = _timed(lambda: svc.create_lora_training_client(str(model_dir), rank=args.rank,
                                                                 seed=next(seeds)).result(), args.clients)
        base_tokenizer = first._engine.base.tokenizer
        own = _timed(lambda: own_tokenizer(base_tokenizer), args.clients)
        deep = _timed(lambda: copy.deepcopy(base_tokenizer), args.clients)
    print(f"config={args.config} device={args.device} rank={args.rank} torch={torch.__version__}; "
          f"first client (loads the model) {load_s:.2f} s")
    print("| | median s | min s | max s |\n|---|---|---|---|")
    for name, runs in ((f"create_lora_training_client (x{args.clients})", clients),
                       ("tokenizer copy: models.own_tokenizer", own), ("tokenizer copy: copy.deepcopy (before)", deep)):
        print(f"| {name} | {statistics.median(runs):.3f} | {min(runs):.3f} | {max(runs):.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
