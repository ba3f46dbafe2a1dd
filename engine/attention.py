"""The learner's attention on the local engine, and the start-up check that its backward is finite.

**The learner passes no attention mask.** A microbatch is right-padded: every datum starts at
position 0 and its pads come after its last token. Under causal attention a token at position j
attends only to keys at positions <= j, all of them its own datum's tokens, so the pads change
none of a datum's outputs, logprobs or gradients (the pads' own outputs are never read). With no
mask, transformers' sdpa path calls `scaled_dot_product_attention(..., is_causal=True)`:

- it never takes the masked kernel of torch 2.11 / cuDNN 9.19's defect (pytorch/pytorch#196678,
  huggingface/trl#7181: cuDNN's SDPA backward returns NaN for the query gradient when an explicit
  mask is passed, the length L % 128 == 64 and a row's logsumexp is below about -88.7, which
  Qwen2.5's massive-activation head reaches);
- on CUDA it runs flash attention, the fastest kernel, and builds no L x L mask.

Why not packing a microbatch's datums into one row with per-document attention (no padding at
all): transformers' sdpa path turns packed position ids into an explicit block mask (the masked
kernels again), and the mask-free alternatives (varlen flash attention, FlexAttention's document
mask) either do not run on the CPU the tests use or compile per shape. Right padding without a
mask is exact and runs the same code on both.

**cuDNN attention is off process-wide on CUDA** (`configure_cuda_attention`, when a CUDA engine
starts): a belt over the fix, for any masked call (the sampler's padded prefill and scoring).
The backend flags are read when a forward picks its kernel and autograd's backward (on its own
thread) runs the kernel its forward picked, so a process-wide flag covers it; a scoped
`sdpa_kernel` context in one thread would not cover a second arm's thread.

**The backstop** (`check_training_attention`, once per device and dtype): the defect's minimal
reproduction -- a sink head whose every row has logsumexp near -100, at L = 704 (704 % 128 == 64)
-- run forward and backward through the attention function the learner uses, with the mask the
learner passes (`LEARNER_ATTENTION_MASK`: none). A non-finite gradient refuses to train
(`AttentionDefect`, one line naming the backend and the versions).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from schemas.errors import AttentionDefect

DEFECT_LENGTH = 704  # 704 % 128 == 64: the lengths the cuDNN defect meets
LEARNER_ATTENTION_MASK = None  # what the learner passes the decoder (module doc)
SDPA_BACKENDS = ("flash", "efficient", "math", "cudnn")

_checked: set[tuple[str, str]] = set()
_lock = threading.Lock()


def sdpa_flags() -> dict[str, bool]:
    """Which SDPA backends torch may pick now (process-wide flags)."""
    b = torch.backends.cuda
    return {"flash": b.flash_sdp_enabled(), "efficient": b.mem_efficient_sdp_enabled(),
            "math": b.math_sdp_enabled(), "cudnn": b.cudnn_sdp_enabled()}


def set_sdpa_flags(flags: dict[str, bool]) -> None:
    b = torch.backends.cuda
    b.enable_flash_sdp(flags["flash"])
    b.enable_mem_efficient_sdp(flags["efficient"])
    b.enable_math_sdp(flags["math"])
    b.enable_cudnn_sdp(flags["cudnn"])


def configure_cuda_attention() -> None:
    """cuDNN's SDPA off for the whole process (module doc)."""
    torch.backends.cuda.enable_cudnn_sdp(False)


def versions() -> str:
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {cudnn}"


def learner_attention_fn():
    """transformers' sdpa attention, which the learner's decoder calls (the engine's registered
    `gs1_gqa_sdpa` hands every multi-token forward to it)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward


def sink_qkv(length: int, device, dtype, heads: int = 2, head_dim: int = 128, seed: int = 0):
    """q, k, v of shape [1, heads, length, head_dim]: head 0 random, head 1 a sink head whose
    every score is about -100 (q = c u, k = -c u + noise), so each row's logsumexp is far below
    -88.7, as Qwen2.5's massive-activation head makes it."""
    g = torch.Generator().manual_seed(seed)
    shape = (1, heads, length, head_dim)
    q = torch.randn(shape, generator=g)
    k = torch.randn(shape, generator=g)
    v = torch.randn(shape, generator=g)
    u = torch.ones(head_dim)
    c = (100.0 / head_dim ** 0.5) ** 0.5  # q.k * head_dim**-0.5 = -c^2 * sqrt(head_dim) = -100
    q[:, 1] = c * u + 0.01 * torch.randn((length, head_dim), generator=g)
    k[:, 1] = -c * u + 0.01 * torch.randn((length, head_dim), generator=g)
    return [t.to(device=device, dtype=dtype).requires_grad_(True) for t in (q, k, v)]


def padding_mask(length: int, real: int, device) -> torch.Tensor:
    """The 4-D boolean mask transformers builds for a right-padded row of `real` tokens: causal,
    pads masked as keys (what the learner passed before the fix)."""
    i = torch.arange(length, device=device)
    allowed = (i[None, :] <= i[:, None]) & (i[None, :] < real)
    return allowed[None, None]


@dataclass(frozen=True)
class ProbeResult:
    length: int
    masked: bool
    finite: bool
    error: str | None = None  # e.g. "no available kernel" when the only enabled backend cannot run it


def probe(device, dtype, length: int = DEFECT_LENGTH, mask: torch.Tensor | None = LEARNER_ATTENTION_MASK
          ) -> ProbeResult:
    """Forward and backward of the sink reproduction through the learner's attention function."""
    q, k, v = sink_qkv(length, device, dtype)
    module = SimpleNamespace(is_causal=True, num_key_value_groups=1, training=False)
    try:
        with torch.enable_grad():
            out, _ = learner_attention_fn()(module, q, k, v, mask, dropout=0.0, scaling=q.shape[-1] ** -0.5)
            out.float().square().sum().backward()
    except RuntimeError as e:
        return ProbeResult(length, mask is not None, False, str(e).splitlines()[0][:120])
    finite = bool(torch.isfinite(out).all()) and all(bool(torch.isfinite(t.grad).all()) for t in (q, k, v))
    return ProbeResult(length, mask is not None, finite)


def check_training_attention(device: torch.device, dtype: torch.dtype) -> None:
    """The backstop (module doc): once per (device, dtype) per process; raises AttentionDefect."""
    key = (str(device), str(dtype))
    with _lock:
        if key in _checked:
            return
        result = probe(device, dtype)
        if not result.finite:
            enabled = ", ".join(name for name, on in sdpa_flags().items() if on)
            raise AttentionDefect(
                f"the learner's attention backward is not finite on {device} in {dtype} (scaled_dot_product_attention, "
                f"no mask, L={result.length}, backends enabled: {enabled}; {versions()})"
                + (f": {result.error}" if result.error else "") + "; refusing to train")
        _checked.add(key)
        enabled = ", ".join(name for name, on in sdpa_flags().items() if on)
        logging.getLogger("gs1.engine").info(
            f"learner attention probe on {device} ({dtype}, no mask, L={result.length}, sink head): finite backward "
            f"(SDPA backends enabled: {enabled}; {versions()})")
