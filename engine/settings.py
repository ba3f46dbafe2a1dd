"""How a local engine is set up: its settings (`EngineSettings`), a LoRA's shape (`LoraSpec`), the
learner's constants and rules (checkpointing, TF32, the compiled learner's lengths), the device and
dtype a service picks, and where torch.compile keeps its kernels between processes."""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.generate import COMPILE_AFTER_BATCHES, DECODE_ATTENTIONS, DECODE_LENGTH_BUCKET, DEFAULT_DECODE_ATTENTION
from engine.lora_bank import DEFAULT_DECODE_FORM
from schemas.errors import UserError

ATTN_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
UNEMBED_MODULES = ("lm_head",)
LORA_ALPHA = 32


def compile_cache_dir() -> Path:
    """Where torch.compile keeps compiled graphs and kernels between processes:
    `$GS1_COMPILE_CACHE`, else `~/.cache/gs1/torch-compile`."""
    return Path(os.environ.get("GS1_COMPILE_CACHE") or Path.home() / ".cache" / "gs1" / "torch-compile")


# The engine's worker thread dispatches thousands of small torch ops a step, releasing the GIL in
# each: while another thread of the process runs Python (an arm grading its rollouts, a preflight's
# reference), every release costs up to the switch interval (5 ms by default) before the worker
# gets it back. On the 2-core demo machine a busy thread beside it made a GS1 step 44x slower
# (648 s against 14.7 s), 8.5x at 0.5 ms (benchmarks/busy_thread.py); the flow's other threads are
# mostly waiting, so the interval bounds the worst case.
GIL_SWITCH_INTERVAL_S = 0.0005


def quick_gil_handoff() -> None:
    """Shorten the interpreter's switch interval to GIL_SWITCH_INTERVAL_S (never lengthen it):
    process-wide, as the interval is."""
    if sys.getswitchinterval() > GIL_SWITCH_INTERVAL_S:
        sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)


def pin_compile_cache() -> Path:
    """Point inductor's on-disk caches at `compile_cache_dir()`, unless `$TORCHINDUCTOR_CACHE_DIR`
    names another folder outright; returns the folder inductor uses. A plain `setdefault` is not
    enough: torch's first cache lookup (an import does one) writes its own default,
    `/tmp/torchinductor_<user>`, into that variable, and the engine's folder would never reach
    inductor. That default is taken as unset (a user who names it outright gets the engine's)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    named = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if named is None or os.path.abspath(named) == os.path.abspath(default_cache_dir()):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(compile_cache_dir())
    return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])


def cache_learner_graphs() -> bool:
    """Let AOTAutograd's on-disk cache keep graphs that hold a custom autograd.Function, as the
    learner's compiled layers do (`lora_bank.LoraAddon`); returns whether this torch has the switch.
    Without it every such graph bypasses that cache, and a warm process re-traces the layers'
    joint forward and backward before inductor's cache finds its kernels: 36.7 s of a warm run's
    learner compile on the H100 (results/h200-engine/h100-s29, e2e/warm.log). torch checks the
    HOP of an autograd.Function pure in its inputs (pytorch#149751) but keeps the switch off by
    default pending wider testing; `tests/test_compile_cache.py` shows a second process hit the
    cache with the same gradients. Process-wide, as torch's config is."""
    import torch._functorch.config as functorch_config

    if not hasattr(functorch_config, "autograd_cache_allow_custom_autograd_functions"):
        return False
    functorch_config.autograd_cache_allow_custom_autograd_functions = True
    return True


def pick_device(device) -> torch.device:
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device)


def device_identity(device: torch.device) -> str:
    """The physical device `device` is on this host, the same whichever process names it: a GPU by
    its UUID (a worker started with `CUDA_VISIBLE_DEVICES=1` calls the host's second GPU `cuda:0`),
    the CPU as the host's. Two units shared a GPU only where this is the same (`decision.units`)."""
    host = socket.gethostname()
    if device.type != "cuda":
        return f"{host}/{device.type}"
    index = torch.cuda.current_device() if device.index is None else device.index
    return f"{host}/GPU-{torch.cuda.get_device_properties(index).uuid}"


def pick_dtype(dtype, device: torch.device) -> torch.dtype:
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, str):
        try:
            return {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
                    "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}[dtype]
        except KeyError:
            raise UserError(f"unknown dtype {dtype!r}: use float32, bfloat16 or float16") from None
    return dtype


@dataclass(frozen=True)
class LoraSpec:
    rank: int = 32
    train_mlp: bool = True
    train_attn: bool = True
    train_unembed: bool = False

    def target_modules(self) -> list[str]:
        mods: list[str] = []
        if self.train_attn:
            mods += ATTN_MODULES
        if self.train_mlp:
            mods += MLP_MODULES
        if self.train_unembed:
            mods += UNEMBED_MODULES
        if not mods:
            raise UserError("LoRA needs at least one of train_mlp, train_attn, train_unembed")
        return mods


# A client's first two forward_backward calls run eagerly: the preflight's checks (one call per
# fresh client) and a two-step pilot never pay the learner's compile; a training run's arms
# compile on their third step (once per process: the layers share one graph).
COMPILE_LEARNER_AFTER = 3
# The compiled learner's microbatches are padded to a multiple of this many positions
# (`Learner.microbatches`): inductor guards on a length's alignment, so one graph serves every
# length only if they all align (on the H200 a graph compiled at 722 positions recompiled at 640,
# `not (L % 8 == 0 ...)`, 11 s). The pads follow every real token: exact under causal attention.
LEARNER_LENGTH_MULTIPLE = 16


@dataclass(frozen=True)
class EngineSettings:
    """How a base's engine batches and trains (one per service; `LocalServiceClient` owns the defaults)."""
    max_batch_rows: int
    batch_window_s: float
    tokens_per_microbatch: int
    use_cuda_graphs: bool | None
    compile_decode: bool
    # None: decided per base by `checkpoint_learner` (the model, the device's memory)
    gradient_checkpointing: bool | None
    learner_attention_mask: bool
    # one batch takes the queued requests of every client (else each sampling client's alone)
    batch_across_clients: bool
    # a flush waits for the other sampling clients still in their step (`_Base._gather`) at most
    # this long; one that did not queue its next samples by then is not waited for again until it does
    gather_busy_s: float = 60.0
    # the adapter bank's form in the static-cache decode step (`lora_bank.DECODE_FORMS`)
    bank_decode: str = DEFAULT_DECODE_FORM
    # batches of a decode shape before it is compiled (`generate.COMPILE_AFTER_BATCHES`)
    compile_after_batches: int = COMPILE_AFTER_BATCHES
    # a static decode cache holds a multiple of this many positions (`generate.DECODE_LENGTH_BUCKET`)
    decode_length_bucket: int = DECODE_LENGTH_BUCKET
    # how a static decode step attends: over every position, or only the live blocks (`generate.DECODE_ATTENTIONS`)
    decode_attention: str = DEFAULT_DECODE_ATTENTION
    # how the learner adds the trained adapter (LEARNER_LORA): "fused" (`lora_bank.LoraAddon`, peft's
    # float32 sum), "fused-base" (the same in the base's dtype) or "peft" (peft's own path)
    learner_lora: str = "fused"
    # the learner's decoder layers run through torch.compile (`Learner.compiled_layers`), from a
    # client's `compile_learner_after`-th forward_backward on
    compile_learner: bool = False
    compile_learner_after: int = COMPILE_LEARNER_AFTER
    # float32 matmuls (the LoRA's in the learner, the bank's in decode) on TF32 tensor cores
    # (`use_tf32`): set process-wide by a CUDA base; no effect on the CPU
    tf32: bool = False
    # runs that reproduce (engine/determinism.py): set process-wide when the service is made
    deterministic: bool = False


def resolve_decode_length_bucket(bucket: int | None) -> int:
    """The static decode cache's length bucket: `bucket`, else `$GS1_DECODE_LENGTH_BUCKET`, else
    `generate.DECODE_LENGTH_BUCKET`; a positive multiple of LEARNER_LENGTH_MULTIPLE (16: positions
    that inductor's kernels see aligned), else a UserError naming the value and where it came from."""
    where, value = ("decode_length_bucket", bucket) if bucket is not None else (
        "GS1_DECODE_LENGTH_BUCKET", os.environ.get("GS1_DECODE_LENGTH_BUCKET") or DECODE_LENGTH_BUCKET)
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = 0
    if n <= 0 or n % LEARNER_LENGTH_MULTIPLE or str(value).strip() != str(n):
        raise UserError(f"{where}={value!r}: a decode length bucket is a positive multiple of "
                        f"{LEARNER_LENGTH_MULTIPLE} positions (default {DECODE_LENGTH_BUCKET})")
    return n


def resolve_decode_attention(attention: str | None) -> str:
    """A static decode step's attention: `attention`, else `$GS1_DECODE_ATTENTION`, else
    `generate.DEFAULT_DECODE_ATTENTION`; one of `generate.DECODE_ATTENTIONS`, else a UserError
    naming the value and where it came from."""
    where, value = ("decode_attention", attention) if attention is not None else (
        "GS1_DECODE_ATTENTION", os.environ.get("GS1_DECODE_ATTENTION") or DEFAULT_DECODE_ATTENTION)
    if value not in DECODE_ATTENTIONS:
        raise UserError(f"{where}={value!r}: a decode attention is one of {', '.join(DECODE_ATTENTIONS)} "
                        f"(default {DEFAULT_DECODE_ATTENTION})")
    return value


LEARNER_LORA = ("fused", "fused-base", "peft")


def learner_lora_caveat(learner_lora: str, device_type: str, compiled: bool) -> str | None:
    """What is known against a learner LoRA path on this device, for a warning; None when nothing
    is. `fused-base` through compiled decoder layers on an H100 (torch 2.11) got no LoRA gradient
    at all, 392 tensors of 392, where `fused` got every one (results/h200-engine/h100-s28/
    agree-fused-base): it trains nothing there; eager on CUDA it is unmeasured."""
    if learner_lora == "fused-base" and device_type == "cuda" and compiled:
        return ("learner_lora='fused-base' with compiled decoder layers on CUDA got no LoRA gradient on an "
                "H100 with torch 2.11 (results/h200-engine/h100-s28/agree-fused-base): use 'fused'")
    return None


# Without checkpointing a microbatch keeps, per decoder layer and token, about 8 hidden-sized and 4
# intermediate-sized tensors in the model's dtype (a Qwen2-style layer through `LoraAddon`: the
# norms' inputs and outputs, q, k, v, the attention output, the MLP's gate, up, activation and
# product). Checkpointing is left off when that estimate is at most this share of the GPU's memory.
LEARNER_MEMORY_SHARE = 0.35
# On the CPU, the share of the machine's physical memory. The demo's SmolLM2-135M at the CPU's
# 1024-token microbatches is estimated at 1.3 GB in float32; unchecked, its learner ran a GS1 step's
# forward_backward in 5.7 s against 7.8 s checkpointed on the 2-core machine (issue 47), so a
# machine of 13 GB or more trains it unchecked. A 1.5B model's 1024 tokens (5.5 GB) stay checkpointed
# below 55 GB.
LEARNER_CPU_MEMORY_SHARE = 0.1


def use_tf32(device: torch.device, tf32: bool | None) -> bool:
    """Whether a base on `device` runs float32 matmuls as TF32: on CUDA unless `GS1_TF32=0` (or
    `tf32=False`); never on the CPU. The adapters' float32 matmuls are thin (rank 32) and read
    [tokens x width] float32 operands; in IEEE float32 they run without tensor cores (1.36 of a
    1-adapter decode step's 7.34 ms of CUDA time, results/h200-engine/h100-s25). TF32 rounds only
    the LoRA addon's products (10-bit mantissa, float32 accumulation); the base's matmuls are bf16
    (8-bit) either way, and the sampler and the learner round alike. Measured on the H100
    (results/h200-engine/h100-s27, one draw each): the learner's 42,944-token step 1.22 s against
    1.41, a 1-adapter decode step 6.47 ms against 7.84; its learner compile 58 s after float32's
    71 s on the same cache (not isolated, as session7's ~20 s more on the H200 was not)."""
    if device.type != "cuda":
        return False
    return os.environ.get("GS1_TF32", "1") != "0" if tf32 is None else bool(tf32)


def learner_activation_bytes(config, tokens: int, dtype: torch.dtype) -> int:
    """The estimate above: what a microbatch of `tokens` tokens keeps for backward, unchecked."""
    per_layer = 8 * config.hidden_size + 4 * getattr(config, "intermediate_size", 4 * config.hidden_size)
    return int(tokens) * config.num_hidden_layers * per_layer * dtype.itemsize


# On CUDA a microbatch too large to keep its activations is first cut down to what fits
# LEARNER_MEMORY_SHARE, and checkpointing comes only when that would be under this many tokens.
# Measured on an H100 at the issue-46 shape (64 rows of 160 + 512 tokens, one rank-32 adapter,
# results/h200-engine): checkpointed eager 2.79 s a forward_backward, unchecked eager 2.03 s,
# unchecked compiled 1.34 s -- the 80 GB card checkpointed its 16,384-token microbatches
# (41 GiB estimated against 27.7), and so never ran the compiled learner either.
LEARNER_MIN_UNCHECKED_TOKENS = 4096


@dataclass(frozen=True)
class LearnerMemory:
    """How the learner keeps a microbatch's activations: checkpointed or not, and the tokens a
    microbatch holds (`learner_memory`)."""
    checkpoint: bool
    tokens_per_microbatch: int


def learner_memory(config, device: torch.device, dtype: torch.dtype, tokens: int) -> LearnerMemory:
    """The learner's memory plan for microbatches of at most `tokens` tokens. Unchecked when they
    fit (`checkpoint_learner`); on CUDA, when they do not, unchecked at the largest multiple of
    LEARNER_LENGTH_MULTIPLE tokens that fits LEARNER_MEMORY_SHARE of the GPU, if that is at least
    LEARNER_MIN_UNCHECKED_TOKENS; else checkpointed at `tokens`. Smaller microbatches change only
    the order the gradient's sums are taken in, not what is summed. On the CPU the plan is
    `checkpoint_learner`'s alone (the tests' and the demo's layouts stay as they are)."""
    if not checkpoint_learner(config, device, dtype, tokens):
        return LearnerMemory(False, tokens)
    if device.type == "cuda":
        share = LEARNER_MEMORY_SHARE * torch.cuda.get_device_properties(device).total_memory
        fit = int(share // learner_activation_bytes(config, 1, dtype))
        fit -= fit % LEARNER_LENGTH_MULTIPLE
        if fit >= LEARNER_MIN_UNCHECKED_TOKENS:
            return LearnerMemory(False, fit)
    return LearnerMemory(True, tokens)


def cpu_memory_bytes() -> int:
    """The machine's physical memory (0 where the platform does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return 0


def checkpoint_learner(config, device: torch.device, dtype: torch.dtype, tokens: int) -> bool:
    """Whether the learner checkpoints its decoder layers: when a microbatch's activations
    (`learner_activation_bytes`) would take more than `LEARNER_MEMORY_SHARE` of the GPU's memory,
    or `LEARNER_CPU_MEMORY_SHARE` of the machine's on the CPU (where the share is smaller: the
    memory is the process's and everyone else's). Checkpointing changes no number (the recompute
    runs the same ops: the demo's forward_backward gave bit-identical logprobs and gradients
    either way on the CPU), only time and memory."""
    if device.type != "cuda":
        total = cpu_memory_bytes()
        return not total or learner_activation_bytes(config, tokens, dtype) > LEARNER_CPU_MEMORY_SHARE * total
    total = torch.cuda.get_device_properties(device).total_memory
    return learner_activation_bytes(config, tokens, dtype) > LEARNER_MEMORY_SHARE * total
