"""Local engine throughput: sampled tokens/s, ms per decode step, trained tokens/s.

    python benchmarks/engine_speed.py --config tiny --batch 8 --new-tokens 64 --prompt-tokens 32
    python benchmarks/engine_speed.py --config qwen3-0.6b --batch 64 --new-tokens 512 \
        --prompt-tokens 160 --rank 32 --device cuda
    python benchmarks/engine_speed.py --config qwen2.5-1.5b --batch 64 --new-tokens 512 \
        --prompt-tokens 160 --rank 32 --device cuda --skip-sample

Builds a random-weight model from a config (`tiny`: the test fixture's Qwen3; `qwen3-0.6b`:
hidden 1024, 28 layers, 16 heads, 8 KV heads, intermediate 3072, vocab 151936;
`qwen2.5-1.5b`: hidden 1536, 28 layers, 12 heads, 2 KV heads, intermediate 8960, vocab 151936,
tied embeddings -- random weights take the memory the real ones do), then through the public
local-backend surface: `--batch` concurrent `sample` requests of one sequence each (random
prompt tokens, no stop, so every row runs `--new-tokens`), one warm-up round and `--repeats`
timed rounds; then `forward_backward(importance_sampling)` + `optim_step` over `--batch`
datums of prompt+new tokens, with the peak GPU memory (torch.cuda.max_memory_allocated) of each
forward_backward. `--skip-sample` trains on random completions instead of sampled ones.
Prints one table row per measurement.

`--adapters 1,2,6,12`: one base, N training clients (arms) on it, N = each value in turn. Per N:
one RL step of all N arms as the pipeline runs it -- every arm's `--batch` sample rows submitted,
then awaited (one batched decode across the adapters), then every arm's forward_backward and
optim_step submitted back to back -- a warm-up step (compiles the batch's decode shape: `compile_after_batches=1`), then
`--repeats` timed ones. Prints ms per decode step, train seconds per adapter step, the step's
seconds, each against one adapter's, and GPU memory: held after the step (the static KV cache of
the step's decode shape included), an arm's own adapter and AdamW state, and the step's peak.
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
sys.path.insert(0, str(REPO / "tests"))

QWEN3_06B = dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, intermediate_size=3072,
                 vocab_size=151936, max_position_embeddings=40960, tie_word_embeddings=True,
                 rope_theta=1_000_000.0, rms_norm_eps=1e-6)
QWEN25_15B = dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12,
                  num_key_value_heads=2, intermediate_size=8960, vocab_size=151936,
                  max_position_embeddings=32768, tie_word_embeddings=True,
                  rope_theta=1_000_000.0, rms_norm_eps=1e-6)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed_ms(fn, n: int = 10) -> float:
    fn()
    if not torch.cuda.is_available():  # a CPU smoke run of the script
        t = time.perf_counter()
        for _ in range(n):
            fn()
        return 1000 * (time.perf_counter() - t) / n
    sync()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(n):
        fn()
    b.record()
    sync()
    return a.elapsed_time(b) / n


def build_model(config: str, out: Path, tokenizer_dir: str | None, device: str) -> Path:
    from fixtures.tiny_model import build_qwen_tokenizer, build_tiny_qwen3

    if config == "tiny":
        return build_tiny_qwen3(out, seed=0)
    from transformers import (AutoTokenizer, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                              Qwen3ForCausalLM)

    if config == "qwen2.5-1.5b":
        cfg, cls = Qwen2Config(eos_token_id=151645, pad_token_id=151643, **QWEN25_15B), Qwen2ForCausalLM
    else:
        cfg, cls = Qwen3Config(eos_token_id=151645, pad_token_id=151643, **QWEN3_06B), Qwen3ForCausalLM
    torch.manual_seed(0)
    with torch.device(device):
        model = cls(cfg).to(torch.bfloat16)
    model.save_pretrained(out)
    del model
    tok = AutoTokenizer.from_pretrained(tokenizer_dir) if tokenizer_dir else build_qwen_tokenizer()
    tok.save_pretrained(out)
    return out


@torch.no_grad()
def decode_diagnostics(gen, config, prompt_tokens: int) -> dict[tuple[int, int], dict[str, float]]:
    """Where a decode step's time goes, for the largest graphed shape of each cache length (CUDA
    only; prints the eager step's kernel profile): the graph's replay; the eager step; the
    sampling outside the graph at the graph's rows; the decode attention of every layer as the
    step calls it (GQA heads along the query axis, a boolean mask over every static position)
    against one reading only the live positions (the prompt and half the new tokens)."""
    from torch.profiler import ProfilerActivity, profile

    from engine.generate import sample_step

    if not gen._graphs or gen.device.type != "cuda":
        return {}
    largest: dict[int, object] = {}
    for dec in gen._graphs.values():
        if dec.max_len not in largest or dec.B > largest[dec.max_len].B:
            largest[dec.max_len] = dec
    out = {}
    dev = gen.device
    kvh = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    groups = config.num_attention_heads // kvh
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    layers = config.num_hidden_layers
    for max_len, dec in sorted(largest.items()):
        B, d = dec.B, {}
        out[(B, max_len)] = d
        if dec.graphed:
            dec.set_length(prompt_tokens)
            d["graph replay ms"] = timed_ms(dec.replay)
        dec.set_length(prompt_tokens)
        d["eager step ms"] = timed_ms(dec._step, 5)
        dec.set_length(prompt_tokens)
        lg = torch.randn(B, config.vocab_size, device=dev)
        tt, kk = torch.ones(B, device=dev), torch.arange(B, device=dev)
        d["sample_step ms"] = timed_ms(lambda: sample_step(lg, tt, kk, 0, any_greedy=False))
        live = min(max_len, prompt_tokens + (max_len - prompt_tokens) // 2)
        f = torch.nn.functional.scaled_dot_product_attention
        q = torch.randn(B, kvh, groups, head_dim, device=dev, dtype=torch.bfloat16)
        kv = torch.randn(B, kvh, max_len, head_dim, device=dev, dtype=torch.bfloat16)
        m = torch.zeros(B, 1, 1, max_len, device=dev, dtype=torch.bool)
        m[..., :live] = True
        d[f"attention masked {max_len} positions x{layers} ms"] = layers * timed_ms(lambda: f(q, kv, kv, attn_mask=m))
        kv_live = kv[:, :, :live].contiguous()
        d[f"attention live {live} positions x{layers} ms"] = layers * timed_ms(lambda: f(q, kv_live, kv_live))
        dec.set_length(prompt_tokens)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            dec._step()
            torch.cuda.synchronize()
        print(f"\n{B} rows x {max_len} positions: the eager decode step's kernels")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=18, max_name_column_width=60))
    return out


def print_diagnostics(diag: dict[tuple[int, int], dict[str, float]]) -> None:
    for (rows, positions), d in diag.items():
        print(f"diagnostics, {rows} rows x {positions} positions:", {k: round(v, 3) for k, v in d.items()})


def main(argv=None) -> int:
    from engine.generate import DECODE_ATTENTIONS
    from engine.settings import LEARNER_LORA

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", choices=["tiny", "qwen3-0.6b", "qwen2.5-1.5b"], default="tiny")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=512)
    ap.add_argument("--prompt-tokens", type=int, default=160)
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--no-cuda-graphs", action="store_true")
    ap.add_argument("--adapters", default=None, help="e.g. 1,2,6,12: the multi-adapter table (see above)")
    ap.add_argument("--no-compile", action="store_true", help="capture the eager decode step (no torch.compile)")
    ap.add_argument("--tokenizer-dir", default=None, help="a saved Qwen tokenizer to reuse")
    ap.add_argument("--skip-train", action="store_true")
    ap.add_argument("--skip-sample", action="store_true", help="train on random completions")
    ap.add_argument("--gradient-checkpointing", choices=["auto", "on", "off"], default="auto",
                    help="checkpoint the decoder layers in training (auto: the engine's rule, engine.settings.learner_memory)")
    ap.add_argument("--learner-lora", choices=LEARNER_LORA, default="fused",
                    help="the learner's LoRA path (engine.settings.LEARNER_LORA; fused-base: the addon in the base's dtype)")
    ap.add_argument("--compile-learner", choices=["auto", "on", "off"], default="auto",
                    help="the learner's decoder layers through torch.compile (auto: the engine's default, on CUDA "
                         "unless checkpointed); compiled from the warm-up step on")
    ap.add_argument("--lr", type=float, default=1e-4, help="Adam learning rate of the timed train steps")
    ap.add_argument("--profile-train", action="store_true",
                    help="on CUDA, one more forward_backward under torch.profiler: the learner's kernels by CUDA time")
    ap.add_argument("--diagnose", action="store_true", help="on CUDA, where a decode step goes: graph replay, sampling, attention, a kernel profile (decode_diagnostics)")
    ap.add_argument("--decode-length-bucket", type=int, default=None,
                    help="a static decode cache's positions are a multiple of this (default: the engine's, generate.DECODE_LENGTH_BUCKET)")
    ap.add_argument("--decode-attention", choices=DECODE_ATTENTIONS, default=None,
                    help="a static decode step's attention (generate.DECODE_ATTENTIONS; default: the engine's)")
    ap.add_argument("--bank-decode", choices=["dense", "tiled"], default=None,
                    help="the adapter bank's decode form (lora_bank.DECODE_FORMS; default: the engine's)")
    args = ap.parse_args(argv)
    # the engine's own lines (compiles and recompiles with the guard that failed, captures, loads)
    # on stderr beside the table: a timed row that holds a compile says so
    logging.basicConfig(format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("gs1.engine").setLevel(logging.INFO)

    from tinker import types

    from rl.backends import make_service_client
    from schemas.optimizer import ADAM

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    work = Path(tempfile.mkdtemp(prefix="gs1-bench-"))
    t0 = time.perf_counter()
    model_dir = build_model(args.config, work / "model", args.tokenizer_dir, device)
    t_build = time.perf_counter() - t0
    extra = {"gradient_checkpointing": {"auto": None, "on": True, "off": False}[args.gradient_checkpointing],
             "learner_lora": args.learner_lora,
             "compile_learner": {"auto": None, "on": True, "off": False}[args.compile_learner]}
    svc = make_service_client("local", device=device, dtype=args.dtype, cache_dir=work / "cache",
                              use_cuda_graphs=False if args.no_cuda_graphs else None,
                              max_batch_rows=max(args.batch, 1) * max(_counts(args.adapters) or [1]),
                              compile_decode=not args.no_compile,
                              batch_across_clients=True if args.adapters else None,
                              bank_decode=args.bank_decode, decode_length_bucket=args.decode_length_bucket,
                              decode_attention=args.decode_attention,
                              # a benchmark compiles a shape on its first batch: it times warm steps
                              compile_after_batches=1, compile_learner_after=1, **extra)
    if args.adapters:
        return adapters_table(args, svc, model_dir, device)
    t0 = time.perf_counter()
    tc = svc.create_lora_training_client(str(model_dir), rank=args.rank, seed=0).result()
    t_load = time.perf_counter() - t0
    gen = tc._engine.sampler.generator
    rng = random.Random(0)
    prompts = [types.ModelInput.from_ints([rng.randrange(1000, 150000) for _ in range(args.prompt_tokens)])
               for _ in range(args.batch)]
    sp = types.SamplingParams(max_tokens=args.new_tokens, temperature=1.0, stop=[])
    sync = (lambda: torch.cuda.synchronize()) if device.startswith("cuda") else (lambda: None)

    def sample_round():
        sc = tc.save_weights_and_get_sampling_client().result()
        before = (gen.stats.prefill_s, gen.stats.decode_s, gen.stats.decode_steps, gen.stats.sampled_tokens)
        t = time.perf_counter()
        futs = [sc.sample(p, 1, sp) for p in prompts]
        res = [f.result() for f in futs]
        sync()
        wall = time.perf_counter() - t
        pre = gen.stats.prefill_s - before[0]
        dec = gen.stats.decode_s - before[1]
        steps = gen.stats.decode_steps - before[2]
        toks = gen.stats.sampled_tokens - before[3]
        return wall, pre, dec, steps, toks, res

    rows = []
    if args.skip_sample:
        last_res = [types.SampleResponse(sequences=[types.SampledSequence(
            stop_reason="length", sequence_id="random", _tokens_list=[rng.randrange(1000, 150000) for _ in range(args.new_tokens)],
            _logprobs_list=[-12.0] * args.new_tokens)], _prompt_logprobs_list=None) for _ in prompts]
    for r in range(0 if args.skip_sample else args.repeats + 1):
        wall, pre, dec, steps, toks, res = sample_round()
        rows.append(("sample" + (" (warm-up)" if r == 0 else ""), wall, pre, dec, steps, toks))
        last_res = res
    cuda = device.startswith("cuda")

    train_rows = []
    if not args.skip_train:
        def _datum(p, s, adv):
            ob = p.length - 1
            return types.Datum(
                model_input=p.append(types.EncodedTextChunk(tokens=s.tokens[:-1])),
                loss_fn_inputs={"target_tokens": [0] * ob + s.tokens,
                                "logprobs": [0.0] * ob + s.logprobs,
                                "advantages": [0.0] * ob + [adv] * len(s.tokens)})

        datums = [_datum(p, r.sequences[0], 1.0 if i % 2 else -1.0)
                  for i, (p, r) in enumerate(zip(prompts, last_res))]
        n_tok = sum(d.model_input.length for d in datums)
        adam = types.AdamParams(learning_rate=args.lr, **ADAM.model_dump())
        gib = 2.0**30
        for r in range(args.repeats + 1):
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            mem_start = torch.cuda.memory_allocated() / gib if cuda else float("nan")
            t = time.perf_counter()
            fb = tc.forward_backward(datums, "importance_sampling").result()
            sync()
            t_fb = time.perf_counter() - t
            mem_peak = torch.cuda.max_memory_allocated() / gib if cuda else float("nan")
            if r == 0 and not args.skip_sample:  # weights still equal the sampler's
                diffs = torch.cat([(o["logprobs"].to_torch()[p.length - 1:] -
                                    torch.tensor(res_i.sequences[0].logprobs)).abs()
                                   for o, p, res_i in zip(fb.loss_fn_outputs, prompts, last_res)])
                agree = (float(diffs.max()), float(diffs.mean()))
            tc.optim_step(adam).result()
            sync()
            t_all = time.perf_counter() - t
            train_rows.append(("train" + (" (warm-up)" if r == 0 else ""), t_fb, t_all, n_tok,
                               mem_start, mem_peak))
        if args.profile_train and cuda:  # where a learner's step goes, after the timed rounds
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                tc.forward_backward(datums, "importance_sampling").result()
                sync()
            print("\nthe learner's forward_backward: its kernels by CUDA time")
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=70))
        del fb
        if args.skip_sample:
            agree = agree_trained = (float("nan"), float("nan"))
        # After the optimizer steps the adapters are non-zero: agreement now also shows whether
        # the sampler carries the learner's update.
        else:
            *_, res2 = sample_round()
            fwd = tc.forward([_datum(p, r.sequences[0], 0.0) for p, r in zip(prompts, res2)],
                             "importance_sampling").result()
            diffs = torch.cat([(o["logprobs"].to_torch()[p.length - 1:] -
                                torch.tensor(r.sequences[0].logprobs)).abs()
                               for o, p, r in zip(fwd.loss_fn_outputs, prompts, res2)])
            agree_trained = (float(diffs.max()), float(diffs.mean()))

    diag = decode_diagnostics(gen, tc._engine.model.config, args.prompt_tokens) if args.diagnose else {}
    dtype = str(tc._engine.dtype).replace("torch.", "")
    name = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
    print(f"\nconfig={args.config} device={device} ({name}) dtype={dtype} batch={args.batch} "
          f"prompt={args.prompt_tokens} new={args.new_tokens} rank={args.rank} "
          f"cuda_graphs={gen.use_cuda_graphs} decode_length_bucket={gen.length_bucket} "
          f"decode_attention={gen.decode_attention} "
          f"compiled={gen.compile_decode} build={t_build:.1f}s load={t_load:.1f}s "
          f"torch={torch.__version__}")
    if gen.stats.extra:
        print("notes:", gen.stats.extra)
    print_diagnostics(diag)
    if train_rows and not args.skip_sample:
        print(f"sampler vs learner logprobs on the sampled tokens: max |diff| {agree[0]:.2e}, "
              f"mean {agree[1]:.2e}; after {len(train_rows)} optimizer steps: max |diff| "
              f"{agree_trained[0]:.2e}, mean {agree_trained[1]:.2e}")
    if rows:
        print("| phase | wall s | prefill s | decode s | decode steps | ms / decode step | sampled tok/s |")
        print("|---|---|---|---|---|---|---|")
        for ph, wall, pre, dec, steps, toks in rows:
            print(f"| {ph} | {wall:.3f} | {pre:.3f} | {dec:.3f} | {steps} | {1000 * dec / max(steps, 1):.2f} "
                  f"| {toks / wall:.0f} |")
    if train_rows:
        from engine import learner_activation_bytes

        eng = tc._engine
        est = learner_activation_bytes(eng.lm.config, eng.learner.tokens_per_microbatch, eng.dtype) / 2**30
        print(f"\ngradient checkpointing: {eng.learner.gradient_checkpointing} ({args.gradient_checkpointing}); "
              f"learner LoRA: {eng.learner.learner_lora}; compiled layers: {eng.learner.compile_learner}; "
              f"TF32 float32 matmuls: {eng.base.settings.tf32} (GS1_TF32); "
              f"tokens per microbatch: {eng.learner.tokens_per_microbatch}; "
              f"estimated unchecked activations of a full microbatch: {est:.1f} GiB")
        print("| phase | fwd+bwd s | fwd+bwd+optim s | trained tokens | trained tok/s "
              "| GPU GiB at start | peak GPU GiB in fwd+bwd |")
        print("|---|---|---|---|---|---|---|")
        for ph, t_fb, t_all, n_tok, m0, m1 in train_rows:
            print(f"| {ph} | {t_fb:.3f} | {t_all:.3f} | {n_tok} | {n_tok / t_all:.0f} "
                  f"| {m0:.2f} | {m1:.2f} |")
    return 0


def _counts(spec: str | None) -> list[int]:
    return [int(x) for x in spec.split(",")] if spec else []


def own_bytes(tc) -> int:
    """What one arm holds on the base: its adapter's weights and its AdamW state."""
    state = [t for s in tc._opt.state.values() for t in s.values() if torch.is_tensor(t)]
    return sum(t.numel() * t.element_size() for t in [*tc._engine.params, *state])


def adapters_table(args, svc, model_dir: Path, device: str) -> int:
    from tinker import types

    from schemas.optimizer import ADAM

    cuda = device.startswith("cuda")
    gib = 2.0**30
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    mem = (lambda: torch.cuda.memory_allocated() / gib) if cuda else (lambda: float("nan"))
    rng = random.Random(0)
    sp = types.SamplingParams(max_tokens=args.new_tokens, temperature=1.0, stop=[])
    adam = types.AdamParams(learning_rate=args.lr, **ADAM.model_dump())
    arms: list = []
    prompts_A: list[list[types.ModelInput]] = []
    table = []
    diag: dict[tuple[int, int], dict[str, float]] = {}
    t0 = time.perf_counter()
    mem_before = None

    def datum(p, s, adv):
        ob = p.length - 1
        return types.Datum(model_input=p.append(types.EncodedTextChunk(tokens=s.tokens[:-1])),
                           loss_fn_inputs={"target_tokens": [0] * ob + s.tokens,
                                           "logprobs": [0.0] * ob + s.logprobs,
                                           "advantages": [0.0] * ob + [adv] * len(s.tokens)})

    def rl_step(n: int) -> dict:
        gen = arms[0]._engine.sampler.generator
        before = (gen.stats.decode_s, gen.stats.decode_steps, gen.stats.batches)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        t = time.perf_counter()
        samplers = [tc.save_weights_and_get_sampling_client().result() for tc in arms[:n]]
        futures_A = [[sc.sample(p, 1, sp) for p in prompts] for sc, prompts in zip(samplers, prompts_A)]
        results_A = [[f.result() for f in fs] for fs in futures_A]
        t_sample = time.perf_counter() - t
        steps = [(tc.forward_backward([datum(p, r.sequences[0], 1.0 if i % 2 else -1.0)
                                       for i, (p, r) in enumerate(zip(prompts, results))], "importance_sampling"),
                  tc.optim_step(adam)) for tc, prompts, results in zip(arms[:n], prompts_A, results_A)]
        for fb, opt in steps:
            fb.result(), opt.result()
        sync()
        t_step = time.perf_counter() - t
        decode_s, decode_steps = gen.stats.decode_s - before[0], gen.stats.decode_steps - before[1]
        return {"sample_s": t_sample, "step_s": t_step, "train_s": (t_step - t_sample) / n,
                "decode_ms": 1000 * decode_s / max(decode_steps, 1), "batches": gen.stats.batches - before[2],
                "peak": torch.cuda.max_memory_allocated() / gib if cuda else float("nan")}

    for n in _counts(args.adapters):
        while len(arms) < n:
            if mem_before is None:
                mem_before = mem()
            arms.append(svc.create_lora_training_client(str(model_dir), rank=args.rank, seed=len(arms)).result())
            prompts_A.append([types.ModelInput.from_ints([rng.randrange(1000, 150000) for _ in range(args.prompt_tokens)])
                              for _ in range(args.batch)])
        rl_step(n)  # warm-up: this many rows' decode shape (compiled), and every new arm's AdamW state
        held = mem()
        timed = [rl_step(n) for _ in range(args.repeats)]
        row = {k: sum(t[k] for t in timed) / len(timed) for k in timed[0]}
        row.update(adapters=n, rows=n * args.batch, held=held, per_arm=(held - mem_before) / n,
                   own=own_bytes(arms[-1]) / gib)
        table.append(row)
        print(f"[{time.perf_counter() - t0:.0f} s] {n} adapters: {row}", flush=True)
        if args.diagnose:  # this count's decode shape, before the next count's replaces it
            try:
                diag.update(decode_diagnostics(arms[0]._engine.sampler.generator, arms[0]._engine.model.config,
                                               args.prompt_tokens))
            except Exception as e:  # a diagnostic that fails costs the table nothing
                print(f"diagnostics at {n} adapters failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
    one = table[0]
    name = torch.cuda.get_device_name() if cuda else "cpu"
    print(f"\nconfig={args.config} device={device} ({name}) batch={args.batch} per adapter, prompt={args.prompt_tokens} "
          f"new={args.new_tokens} rank={args.rank} compiled={arms[0]._engine.sampler.generator.compile_decode} "
          f"bank_decode={arms[0]._engine.settings.bank_decode} compiled_learner={arms[0]._engine.learner.compile_learner} "
          f"learner_lora={arms[0]._engine.learner.learner_lora} "
          f"gradient_checkpointing={arms[0]._engine.learner.gradient_checkpointing} "
          f"tf32={arms[0]._engine.base.settings.tf32} "
          f"decode_length_bucket={arms[0]._engine.settings.decode_length_bucket} "
          f"decode_attention={arms[0]._engine.settings.decode_attention} "
          f"torch={torch.__version__}; x: against the first row")
    print("| adapters | rows | batches | ms / decode step | x | sample s | train s per adapter | RL step s | x "
          "| GiB held | GiB held per arm | GiB adapter + AdamW of an arm | peak GiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in table:
        print(f"| {r['adapters']} | {r['rows']} | {r['batches']:.0f} | {r['decode_ms']:.2f} | {r['decode_ms'] / one['decode_ms']:.2f} "
              f"| {r['sample_s']:.2f} | {r['train_s']:.2f} | {r['step_s']:.2f} | {r['step_s'] / one['step_s']:.2f} "
              f"| {r['held']:.2f} | {r['per_arm']:.2f} | {r['own']:.3f} | {r['peak']:.2f} |")
    print_diagnostics(diag)
    return 0


if __name__ == "__main__":
    from schemas.errors import UserError

    try:
        raise SystemExit(main())
    except UserError as e:  # a bad setting: its one line, exit 2
        print(f"engine_speed: {e}", file=sys.stderr)
        raise SystemExit(2)
