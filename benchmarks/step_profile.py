"""Where a multi-adapter RL step's time goes on the local engine: decode step and training, by part.

    python benchmarks/step_profile.py --config qwen2.5-1.5b --device cuda --adapters 1,6,12

A random-weight model (`benchmarks/engine_speed.py`'s configs), N arms on one base. For each N: one
decode batch of every arm's `--batch` rows (`--new-tokens`, eager CUDA graph: no compiling), then
on that batch's static decoder, at a mid-decode length:
- ms per step: the captured graph; the eager step with the bank; the eager step with no adapter
  rows (the base alone); `sample_step` alone; the masked decode attention alone (x layers);
- the eager step's top kernels by CUDA time (torch.profiler).
Then one arm's forward_backward of the `--batch` datums (prompt + new tokens) under the profiler:
wall seconds, its top kernels and its CUDA time by kind of kernel (`kernel_kind`). The learner is
the engine's: compiled on CUDA (its first call compiles, before anything is timed), TF32 unless
`GS1_TF32=0`. `--skip-decode` profiles the learner alone:

    python benchmarks/step_profile.py --config qwen2.5-1.5b --device cuda --skip-decode

Prints tables only; nothing is written.
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main(argv=None) -> int:
    from benchmarks.engine_speed import build_model, sync, timed_ms

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", choices=["tiny", "qwen3-0.6b", "qwen2.5-1.5b"], default="qwen2.5-1.5b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--adapters", default="1,6,12")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=160)
    ap.add_argument("--new-tokens", type=int, default=32, help="decode steps of the batch that builds the decoder")
    ap.add_argument("--train-new-tokens", type=int, default=512)
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--bank-decode", choices=["dense", "tiled"], default=None,
                    help="the adapter bank's decode form (default: the engine's, lora_bank.DEFAULT_DECODE_FORM)")
    ap.add_argument("--tokenizer-dir", default=None, help="a saved Qwen tokenizer (default: the test fixture's)")
    ap.add_argument("--skip-train", action="store_true", help="the decode step only")
    ap.add_argument("--skip-decode", action="store_true", help="the learner only")
    args = ap.parse_args(argv)
    logging.basicConfig(format="%(asctime)s %(name)s: %(message)s")  # the engine's compile lines
    logging.getLogger("gs1.engine").setLevel(logging.INFO)

    from torch.profiler import ProfilerActivity, profile
    from tinker import types

    from engine.generate import sample_step
    from rl.backends import make_service_client

    cuda = args.device.startswith("cuda")
    acts = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    sort = "cuda_time_total" if cuda else "cpu_time_total"
    work = Path(tempfile.mkdtemp(prefix="gs1-profile-"))
    model_dir = build_model(args.config, work / "model", args.tokenizer_dir, args.device)
    counts = [int(x) for x in args.adapters.split(",")]
    # the learner compiles on its first call (the profile's warm-up), as a run's does from its third
    svc = make_service_client("local", device=args.device, cache_dir=work / "cache", compile_decode=False,
                              max_batch_rows=args.batch * max(counts), batch_across_clients=True,
                              bank_decode=args.bank_decode, compile_learner_after=1)
    rng = random.Random(0)
    sp = types.SamplingParams(max_tokens=args.new_tokens, temperature=1.0, stop=[])
    arms, prompts_A = [], []
    summary = []
    for n in [] if args.skip_decode else counts:
        while len(arms) < n:
            arms.append(svc.create_lora_training_client(str(model_dir), rank=args.rank, seed=len(arms)).result())
            prompts_A.append([types.ModelInput.from_ints([rng.randrange(1000, 150000) for _ in range(args.prompt_tokens)])
                              for _ in range(args.batch)])
        base = arms[0]._engine.base
        if not cuda:  # a smoke run: the static-cache decoder CUDA uses, run eagerly
            base.sampler.generator.static_cache = True
        for _ in range(2):  # the second batch replays the captured graph
            samplers = [tc.save_weights_and_get_sampling_client().result() for tc in arms[:n]]
            futs = [[sc.sample(p, 1, sp) for p in ps] for sc, ps in zip(samplers, prompts_A)]
            [[f.result() for f in fs] for fs in futs]
        gen, bank = base.sampler.generator, base.bank
        dec = next(iter(gen._graphs.values()))
        mid = min(args.prompt_tokens + 256, dec.max_len - 1)  # mid-decode, inside a small bucket too
        res = {"adapters": n, "rows": dec.B, "bank": bank.decode_form}
        sync()

        def at_mid(fn):
            def run():
                dec.set_length(mid)
                return fn()
            return run

        with torch.no_grad(), bank.serving():
            res["graph replay ms"] = timed_ms(at_mid(dec.replay)) if dec.graph is not None else float("nan")
            res["eager step ms"] = timed_ms(at_mid(dec._step), 5)
            saved, bank.decode_bufs = bank.decode_bufs, None
            res["eager base-only ms"] = timed_ms(at_mid(dec._step), 5)
            bank.decode_bufs = saved
            with profile(activities=acts) as prof:
                at_mid(dec._step)()
                sync()
        lg = torch.randn(dec.B, base.lm.config.vocab_size, device=args.device)
        tt, kk = torch.ones(dec.B, device=args.device), torch.arange(dec.B, device=args.device)
        res["sample_step ms"] = timed_ms(lambda: sample_step(lg, tt, kk, 0, any_greedy=False))
        cfg = base.lm.config
        hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        kvh = cfg.num_key_value_heads
        q = torch.randn(dec.B, kvh, cfg.num_attention_heads // kvh, hd, device=args.device, dtype=torch.bfloat16)
        kv = torch.randn(dec.B, kvh, dec.max_len, hd, device=args.device, dtype=torch.bfloat16)
        m = torch.ones(dec.B, 1, 1, dec.max_len, device=args.device, dtype=torch.bool)
        f = torch.nn.functional.scaled_dot_product_attention
        res["decode attention x layers ms"] = cfg.num_hidden_layers * timed_ms(lambda: f(q, kv, kv, attn_mask=m))
        res["attention, live half x layers ms"] = cfg.num_hidden_layers * timed_ms(
            lambda: f(q, kv[:, :, : dec.max_len // 2], kv[:, :, : dec.max_len // 2], attn_mask=m[..., : dec.max_len // 2]))
        summary.append(res)
        print(f"\n== {n} adapters: {res}", flush=True)
        print(prof.key_averages().table(sort_by=sort, row_limit=22, max_name_column_width=70))

    if not args.skip_train:
        tc = arms[0] if arms else svc.create_lora_training_client(str(model_dir), rank=args.rank, seed=0).result()
        train_profile(args, tc, rng, acts, sort)
    print(f"\ndevice {torch.cuda.get_device_name() if cuda else 'cpu'} torch {torch.__version__}")
    if not summary:
        return 0
    keys = list(summary[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for r in summary:
        print("| " + " | ".join(f"{r[k]:.2f}" if isinstance(r[k], float) else str(r[k]) for k in keys) + " |")
    return 0


def train_profile(args, tc, rng, acts, sort) -> None:
    """One arm's forward_backward at the RL step's shape: wall seconds (median of 3 after a warm-up)
    and its top kernels."""
    from benchmarks.engine_speed import sync
    from torch.profiler import profile
    from tinker import types

    toks = [[rng.randrange(1000, 150000) for _ in range(args.prompt_tokens + args.train_new_tokens)]
            for _ in range(args.batch)]
    ob = args.prompt_tokens - 1
    datums = [types.Datum(model_input=types.ModelInput.from_ints(t[:-1]),
                          loss_fn_inputs={"target_tokens": t[1:], "logprobs": [0.0] * (len(t) - 1),
                                          "advantages": [0.0] * ob + [1.0] * (len(t) - 1 - ob)}) for t in toks]
    tc.forward_backward(datums, "importance_sampling").result()  # warm-up (the compile)
    times = []
    for _ in range(3):
        sync()
        t = time.perf_counter()
        tc.forward_backward(datums, "importance_sampling").result()
        sync()
        times.append(time.perf_counter() - t)
    t_fb = sorted(times)[1]
    with profile(activities=acts) as prof:
        tc.forward_backward(datums, "importance_sampling").result()
        sync()
    eng = tc._engine.base
    print(f"\n== training: forward_backward of {args.batch} datums x {len(toks[0]) - 1} tokens: {t_fb:.3f} s "
          f"(median of {', '.join(f'{x:.3f}' for x in times)}; {args.batch * (len(toks[0]) - 1) / t_fb:.0f} tok/s); compiled layers: {eng.learner.compile_learner}, "
          f"checkpointing: {eng.learner.gradient_checkpointing}, TF32: {eng.settings.tf32}, LoRA path: {eng.learner.learner_lora}")
    print(prof.key_averages().table(sort_by=sort, row_limit=30, max_name_column_width=70))
    print(kind_table(prof, cuda=args.device.startswith("cuda")))


# A kernel's kind from its name (cuBLAS, cuDNN, flash, inductor's Triton): the fragments below,
# first match wins. GEMMs by operand type: bf16 (the base), TF32 or IEEE float32 (the adapters').
KINDS = (
    ("attention", ("flash", "fmha", "attention", "sdpa")),
    ("GEMM tf32", ("tf32",)),
    ("GEMM bf16", ("bf16", "bfloat16")),
    ("GEMM nvjet (cuBLASLt: the operand type is not in its name)", ("nvjet",)),
    ("GEMM float32", ("gemm", "sgemm", "cutlass", "xmma", "cublas")),
    ("triton (fused elementwise, reductions)", ("triton",)),
    ("copies, casts, fills", ("copy", "cast", "fill", "memcpy", "memset", "to_copy")),
)


def kernel_kind(name: str) -> str:
    low = name.lower()
    gemm = any(f in low for f in ("gemm", "nvjet", "cutlass", "xmma", "matmul", "_mm", "cublas"))
    for kind, fragments in KINDS:
        if kind.startswith("GEMM") and not gemm:
            continue
        if any(f in low for f in fragments):
            return kind
    return "other"


def kind_table(prof, cuda: bool) -> str:
    """Self device time by kernel kind: on CUDA the kernels' own events alone (an op's self
    device time also holds the kernels it launched: counted there, a kernel would count twice);
    on the CPU, the ops'."""
    from torch.autograd import DeviceType

    totals: dict[str, float] = {}
    for e in prof.key_averages():
        if cuda and (e.device_type != DeviceType.CUDA or getattr(e, "is_user_annotation", False)):
            continue
        us = e.self_device_time_total if cuda else e.self_cpu_time_total
        if us <= 0:
            continue
        k = kernel_kind(e.key)
        totals[k] = totals.get(k, 0.0) + us / 1e6
    whole = sum(totals.values())
    if not whole:  # a CPU smoke run: the worker thread's ops are not in this thread's profile
        return "(no kernel events recorded)"
    rows = [f"| {k} | {s:.3f} | {100 * s / whole:.0f} % |" for k, s in sorted(totals.items(), key=lambda kv: -kv[1])]
    return "\n".join(["| kind | self s | share |", "|---|---|---|", *rows, f"| all | {whole:.3f} | 100 % |"])


if __name__ == "__main__":
    raise SystemExit(main())
