"""Do the learner's LoRA paths give the same gradients on this device? A table, one row a path.

    python benchmarks/learner_agreement.py --config tiny --batch 8 --prompt-tokens 16 --new-tokens 16 --rank 8
    python benchmarks/learner_agreement.py --config qwen2.5-1.5b --device cuda --batch 64 \
        --prompt-tokens 160 --new-tokens 512 --rank 32 --tokenizer-dir .data/qwen-tokenizer

Why: on the H100 (results/h200-engine/h100-s28/learner-fused-base) `learner_lora="fused-base"`
ran a forward_backward in 0.91 s against the float32 sum's 1.20 s, at a peak of 6.6 against
34.2 GiB, with no attention backward in its profile: faster and far smaller than its saved
activations allow. This check, run there (h100-s28/agree-fused-base), found why: through the
compiled layers it got no LoRA gradient at all. The CPU tests (float32 and bf16) had said the
gradients agree: a device's compiled graph is its own.

One random-weight base (benchmarks/engine_speed.py's configs), `--batch` datums of random prompt
and completion tokens (advantages +-1 a datum), one LoRA adapter of `--rank` with B drawn
non-zero (peft starts it at zero, and A's gradient with it), the same in every service. For each
LoRA path (`engine.settings.LEARNER_LORA`) and each of eager and compiled decoder layers: a
service of its own, two forward_backwards (the first compiles), the second's gradient compared
with the first row's (peft's own path, eager) tensor by tensor: the smallest cosine, the largest
relative error ||g - g_ref|| / ||g_ref||, and how many tensors got no gradient at all. With it the
second call's seconds and peak memory, on CUDA the attention-backward kernels it launched
(`--profile`), and what autograd saved for backward in a third call, by dtype and width (a
tensor counted each time it is saved; where the peak's gigabytes should be). `--json PATH`
writes the rows. Exit 1 when a row disagrees (min cosine below `--min-cos`) or a tensor got no
gradient: the check can fail, and says which path and tensor.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))

# kernels of an attention backward, by name, in the kernels CUDA reports (flash, memory-efficient,
# cuDNN, FlexAttention's template and the math path's own softmax backward)
ATTENTION_BACKWARD = ("flash_bwd", "fmha_cutlassB", "attention_backward", "flex_attention_backward",
                      "sdpa_bprop", "_softmax_backward")


@dataclass(frozen=True)
class Row:
    """One LoRA path's gradients against the reference row's."""

    path: str
    compiled: bool
    loss: float
    seconds: float  # the second forward_backward (the first compiles)
    peak_gib: float  # its peak GPU memory (nan on the CPU)
    min_cos: float  # the smallest cosine of a LoRA tensor's gradient with the reference's
    worst_tensor: str  # the tensor it belongs to
    max_rel_err: float  # the largest ||g - g_ref|| / ||g_ref||
    no_gradient: int  # LoRA tensors whose gradient is missing or all zero
    attention_backward_kernels: int  # -1: not profiled
    saved_gib: float  # what autograd kept for backward in a third call (saved-tensor hooks)
    saved_by_width: str  # ... by dtype and last dimension, largest first


def datums(batch: int, prompt_tokens: int, new_tokens: int, seed: int = 0):
    from tinker import types

    rng = random.Random(seed)
    out = []
    for i in range(batch):
        toks = [rng.randrange(1000, 150000) for _ in range(prompt_tokens + new_tokens)]
        ob = prompt_tokens - 1
        n = len(toks) - 1
        out.append(types.Datum(model_input=types.ModelInput.from_ints(toks[:-1]), loss_fn_inputs={
            "target_tokens": toks[1:], "logprobs": [0.0] * ob + [-12.0] * (n - ob),
            "advantages": [0.0] * ob + [1.0 if i % 2 else -1.0] * (n - ob)}))
    return out


def named_gradients(tc) -> dict[str, torch.Tensor]:
    """The trained adapter's LoRA gradients by parameter name, float64 on the CPU (zeros where none)."""
    name = tc._engine.name
    out = {}
    for n, p in sorted(tc._engine.base.peft.named_parameters()):
        if f".{name}." in n and "lora_" in n:
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            out[n.replace(f".{name}.", ".").removeprefix("base_model.model.")] = g.detach().to(torch.float64).cpu()
    return out


def set_adapter(tc, seed: int) -> None:
    """B (and A) redrawn from one generator, the same in every service: B non-zero so that A's
    gradient is non-zero too."""
    g = torch.Generator().manual_seed(seed)
    name = tc._engine.name
    with torch.no_grad():
        for n, p in sorted(tc._engine.base.peft.named_parameters()):
            if f".{name}." in n and "lora_" in n:
                w = torch.randn(p.shape, generator=g) * (0.02 if "lora_B" in n else 1.0 / p.shape[1] ** 0.5)
                p.copy_(w.to(p.dtype))


def attention_backward_kernels(prof) -> int:
    return sum(e.count for e in prof.key_averages()
               if any(k in e.key for k in ATTENTION_BACKWARD) and e.device_type == torch.autograd.DeviceType.CUDA)


def saved_for_backward(tc, data) -> dict[tuple[str, int], int]:
    """Bytes autograd saves for backward in one forward_backward, by (dtype, last dimension): the
    engine's own call on this thread (saved-tensor hooks are thread-local; the worker is idle)."""
    kept: dict[tuple[str, int], int] = {}

    def pack(t):
        key = (str(t.dtype).removeprefix("torch."), int(t.shape[-1]) if t.dim() else 0)
        kept[key] = kept.get(key, 0) + t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        tc._engine.forward_backward(data, "importance_sampling", False)
    tc.discard_gradients()
    return kept


def run_path(model_dir: Path, data, args, path: str, compiled: bool, work: Path):
    from rl.backends import make_service_client

    svc = make_service_client("local", device=args.device, dtype=args.dtype, cache_dir=work / f"cache-{path}-{compiled}",
                              gradient_checkpointing=None, learner_lora=path, compile_learner=compiled,
                              compile_learner_after=1, use_cuda_graphs=False)
    tc = svc.create_lora_training_client(str(model_dir), rank=args.rank, seed=0).result()
    set_adapter(tc, args.seed)
    cuda = args.device.startswith("cuda")
    tc.forward_backward(data, "importance_sampling").result()  # compiles the layers when `compiled`
    tc.discard_gradients()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    kernels = -1
    t = time.perf_counter()
    if args.profile and cuda:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            out = tc.forward_backward(data, "importance_sampling").result()
            torch.cuda.synchronize()
        kernels = attention_backward_kernels(prof)
    else:
        out = tc.forward_backward(data, "importance_sampling").result()
        if cuda:
            torch.cuda.synchronize()
    seconds = time.perf_counter() - t
    peak = torch.cuda.max_memory_allocated() / 2.0**30 if cuda else float("nan")
    grads = named_gradients(tc)
    kept = saved_for_backward(tc, data)
    del tc, svc
    if cuda:
        torch.cuda.empty_cache()
    return float(out.metrics["loss:sum"]), seconds, peak, kernels, grads, kept


def compare(path: str, compiled: bool, got, ref: dict[str, torch.Tensor]) -> Row:
    loss, seconds, peak, kernels, grads, kept = got
    worst, min_cos, max_err, none = "", 1.0, 0.0, 0
    for n, r in ref.items():
        g = grads[n]
        if not g.abs().max() > 0:
            none += 1
        cos = float((g * r).sum() / (g.norm() * r.norm())) if g.norm() > 0 and r.norm() > 0 else 0.0
        if cos < min_cos or not worst:
            worst, min_cos = n, min(cos, min_cos)
        max_err = max(max_err, float((g - r).norm() / r.norm()) if r.norm() > 0 else float("inf"))
    widths = " ".join(f"{d}x{w}:{b / 2.0**30:.3f}" for (d, w), b in sorted(kept.items(), key=lambda kv: -kv[1])[:4])
    return Row(path, compiled, loss, seconds, peak, min_cos, worst, max_err, none, kernels,
               sum(kept.values()) / 2.0**30, widths)


def main(argv=None) -> int:
    from engine.settings import LEARNER_LORA
    from engine_speed import build_model

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="tiny", choices=["tiny", "qwen3-0.6b", "qwen2.5-1.5b"])
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default=None, help="the base's dtype (default: the engine's, bf16 on CUDA)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--paths", default="peft," + ",".join(p for p in LEARNER_LORA if p != "peft"),
                    help="LoRA paths, the first (eager) the reference: peft's own path by default")
    ap.add_argument("--compiled", default="off,on", help="the decoder layers: off (eager), on (compiled), or both")
    ap.add_argument("--tokenizer-dir", default=None)
    ap.add_argument("--profile", action="store_true", help="on CUDA, count the attention-backward kernels")
    ap.add_argument("--min-cos", type=float, default=0.99)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    paths = [p for p in args.paths.split(",") if p]
    modes = [{"off": False, "on": True}[m] for m in args.compiled.split(",") if m]
    if any(p not in LEARNER_LORA for p in paths) or not paths or not modes:
        print(f"learner_agreement: --paths from {', '.join(LEARNER_LORA)}, --compiled from off,on", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="gs1-agree-"))
    model_dir = build_model(args.config, work / "model", args.tokenizer_dir, args.device)
    data = datums(args.batch, args.prompt_tokens, args.new_tokens)
    runs = [(p, c) for p in paths for c in modes]
    print(f"config={args.config} device={args.device} batch={args.batch} prompt={args.prompt_tokens} "
          f"new={args.new_tokens} rank={args.rank} torch={torch.__version__}; reference: {runs[0][0]} "
          f"(compiled={runs[0][1]}): each row's LoRA gradients against its")
    print("| LoRA path | compiled | loss | fwd+bwd s | peak GiB | min cos | its tensor | max rel err "
          "| tensors with no gradient | attention-backward kernels | saved for backward GiB | largest (dtype x width: GiB) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    ref = None
    rows = []
    for path, compiled in runs:  # a row as each path ends: a run cut short keeps the rows it made
        got = run_path(model_dir, data, args, path, compiled, work)
        ref = ref if ref is not None else got[4]
        r = compare(path, compiled, got, ref)
        rows.append(r)
        print(f"| {r.path} | {r.compiled} | {r.loss:.6g} | {r.seconds:.3f} | {r.peak_gib:.2f} | {r.min_cos:.5f} "
              f"| {r.worst_tensor} | {r.max_rel_err:.2e} | {r.no_gradient} | {r.attention_backward_kernels} "
              f"| {r.saved_gib:.3f} | {r.saved_by_width} |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in rows], indent=1))
    bad = [r for r in rows if r.min_cos < args.min_cos or r.no_gradient]
    for r in bad:
        print(f"learner_agreement: {r.path} (compiled={r.compiled}) disagrees with {runs[0][0]}: "
              f"cosine {r.min_cos:.4f} at {r.worst_tensor}, {r.no_gradient} tensors with no gradient", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
