"""Compile once, arms side by side: what a run's decode shapes cost on one process's engines.

    python benchmarks/decode_shapes.py --config qwen2.5-1.5b --device cuda [--dynamic]

A random-weight model (`benchmarks/engine_speed.py`'s configs), two training clients (two arms' engines)
on one local service, as `gs1 run` makes them. Prints three tables:
1. every decode graph the process made ready (rows x positions, compiled or only captured,
   seconds) while engine A samples 64 rows, then 512 rows, and engine B (another arm) 64 rows;
2. ms per decode step of each round once warm;
3. arms side by side: engine A sampling 64 rows while engine B runs a forward_backward +
   optim_step of 64 datums, each alone and both at once (wall seconds). With two GPUs visible
   the engines sit on different GPUs (`LocalServiceClient.place`); with one, on two streams.
Run it twice on one machine: the second process finds the kernels in the on-disk compile cache
(`engine.compile_cache_dir`, or `$GS1_COMPILE_CACHE`).
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", choices=["tiny", "qwen3-0.6b", "qwen2.5-1.5b"], default="tiny")
    ap.add_argument("--device", default=None)
    ap.add_argument("--new-tokens", type=int, default=512)
    ap.add_argument("--prompt-tokens", type=int, default=160)
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--model-dir", default=None, help="reuse a model engine.py built")
    args = ap.parse_args(argv)

    from tinker import types

    from benchmarks.engine_speed import build_model
    from engine.generate import COMPILE_EVENTS
    from rl.backends import make_service_client
    from rl.loop import rollout_datum

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    work = Path(tempfile.mkdtemp(prefix="gs1-shapes-"))
    model_dir = Path(args.model_dir) if args.model_dir else build_model(args.config, work / "model", None, device)
    t0 = time.perf_counter()
    svc = make_service_client("local", device=device, cache_dir=work / "cache")
    tc_a = svc.create_lora_training_client(str(model_dir), rank=args.rank, seed=0).result()
    tc_b = svc.create_lora_training_client(str(model_dir), rank=args.rank, seed=1).result()
    print(f"two engines ready in {time.perf_counter() - t0:.1f} s: engine A on {tc_a._engine.device}, "
          f"engine B on {tc_b._engine.device} ({torch.cuda.device_count() if device.startswith('cuda') else 0} GPUs "
          "visible)", flush=True)
    rng = random.Random(0)
    sp = types.SamplingParams(max_tokens=args.new_tokens, temperature=1.0, stop=[])
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def prompts(n):
        return [types.ModelInput.from_ints([rng.randrange(1000, 150000) for _ in range(args.prompt_tokens)])
                for _ in range(n)]

    def sample(tc, n):
        gen = tc._engine.sampler.generator
        sc = tc.save_weights_and_get_sampling_client().result()
        steps0, dec0 = gen.stats.decode_steps, gen.stats.decode_s
        t = time.perf_counter()
        responses = [f.result() for f in [sc.sample(p, 1, sp) for p in prompts(n)]]
        sync()
        return time.perf_counter() - t, (gen.stats.decode_s - dec0) / max(gen.stats.decode_steps - steps0, 1), responses

    rounds = []
    for name, tc, n in [("A", tc_a, 64), ("A", tc_a, 64), ("A", tc_a, 512), ("A", tc_a, 512), ("B", tc_b, 64),
                        ("B", tc_b, 64)]:
        wall, ms, responses = sample(tc, n)
        rounds.append((name, n, wall, 1000 * ms))
        print(f"engine {name} sampled {n} rows in {wall:.1f} s", flush=True)

    print("\n| decode graph | rows x positions | compiled | seconds |\n|---|---|---|---|")
    for i, e in enumerate(COMPILE_EVENTS):
        print(f"| {i + 1} | {e.rows} x {e.positions} | {'yes' if e.compiled else 'no (shared)'} | {e.seconds:.1f} |")
    print("\n| engine | rows | round wall s | ms / decode step |\n|---|---|---|---|")
    for name, n, wall, ms in rounds:
        print(f"| {name} | {n} | {wall:.2f} | {ms:.2f} |")

    prompt = types.ModelInput.from_ints(list(range(1000, 1000 + args.prompt_tokens)))
    datums_D = [rollout_datum(prompt, list(r.sequences[0].tokens), list(r.sequences[0].logprobs), 1.0)
                for r in sample(tc_b, 64)[2]]

    def train():
        t = time.perf_counter()
        tc_b.forward_backward(datums_D, loss_fn="importance_sampling").result()
        tc_b.optim_step(types.AdamParams(learning_rate=1e-6)).result()
        sync()
        return time.perf_counter() - t

    train()  # warm
    alone_sample, _, _ = sample(tc_a, 64)
    alone_train = train()
    both: dict[str, float] = {}
    t = time.perf_counter()
    threads = [threading.Thread(target=lambda: both.__setitem__("sample", sample(tc_a, 64)[0])),
               threading.Thread(target=lambda: both.__setitem__("train", train()))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    together = time.perf_counter() - t
    print("\n| work | alone s | side by side s |\n|---|---|---|")
    print(f"| engine A samples 64 x {args.new_tokens} | {alone_sample:.2f} | {both['sample']:.2f} |")
    print(f"| engine B forward_backward + optim_step, 64 datums | {alone_train:.2f} | {both['train']:.2f} |")
    print(f"| both, wall | {alone_sample + alone_train:.2f} (one after the other) | {together:.2f} |")
    if device.startswith("cuda"):
        print(f"\npeak GPU memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
