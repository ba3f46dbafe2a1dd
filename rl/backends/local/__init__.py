"""The `local` backend: tinker's client surface over torch + transformers + peft, in process.

    service = make_service_client("local", device=None, dtype=None, cache_dir=None)
    tc = service.create_lora_training_client(base_model, rank=32, seed=0).result()
    sc = tc.save_weights_and_get_sampling_client().result()
    resp = sc.sample(prompt, num_samples, types.SamplingParams(...)).result()

Every call returns a future (`LocalFuture`: `.result()`, `await`, `.future()`); values in and
out are real `tinker.types`. Client-creating calls return a `LocalClientFuture`, usable as the
client too, as tinker 0.38's are.

Execution: one *base* per (model, device) (`_Base`): the model loaded once, its tokenizer, and
one worker thread that runs every device job of every client in submission order (forward,
forward_backward, optim_step, save/load, sample batches). Each training client is a LoRA adapter
on that base (`_Adapter`: a named peft adapter with its own float32 weights; the client's AdamW
state is over those alone), so each added arm costs its adapter, optimizer state and
activations, never another model. Training stays per adapter: a client's forward_backward makes
its adapter peft's active one, and the others get no gradient. Sampling clients are snapshots
of an adapter's weights (`lora_bank.AdapterWeights`, copied at save time), so later optim steps
never change an existing sampling client.

Batching: `sample` and `compute_logprobs` only queue a request. The queue is flushed into
batched generation (left-padded rows, one prefill per distinct (adapter, prompt) shared by its
samples, which also gives `include_prompt_logprobs`, then one decode step per token with a KV
cache) when a caller first waits on any queued future (`.result()`, `await`, `.future()`), or
when `max_batch_rows` rows are queued. A batch may hold rows of many adapters: each row carries
its adapter and the adapter bank (`rl/backends/lora_bank.py`) adds every row's own LoRA addon
inside the one (captured, compiled) decode step, in the bank's decode form (`bank_decode`). On CUDA
(`batch_across_clients`) a batch takes every client's requests queued when it starts -- every
arm's and seed's step samples, held-out and eval requests -- and a flush first waits for the
other sampling training clients still in their step to queue theirs and wait on them
(`_Base._gather`: a client is in its step from the return of its samples until it next waits on
samples), so arms in parallel threads step together. On the CPU a batch holds one sampling client's requests alone:
its composition depends only on that client's submission order, so seeded runs are bit-identical
whatever the other threads do. A loop that submits every request of a step before awaiting any
(as the cookbook's does) gets one batch per step. `batch_window_s > 0` also waits that long
after a flush is asked for (thread-per-rollout callers).

Devices: with several GPUs and `device="cuda"`, each new client goes to the GPU holding the
fewest live adapters (`LocalServiceClient.place`), one base on each GPU it uses. The compiled
decode step is one per process (`local_sampler`), its kernels kept on disk between processes
(`compile_cache_dir`).

Numerics: fp32 on CPU, bf16 on CUDA (LoRA weights and AdamW state stay fp32); override with
`dtype=`. Loss "importance_sampling" is exactly `-sum_t exp(lp_t - sampler_lp_t) * A_t` over
every position of every datum, no normalisation; "cross_entropy" is `-sum_t w_t * lp_t`.
The learner never holds a microbatch's full-vocabulary logits: it runs the decoder, then the
LM head a chunk of tokens at a time, keeping each target token's logprob
(`token_logprobs.target_logprobs`, recomputed in backward). Each adapted projection adds the
trained adapter's LoRA through `lora_bank.LoraAddon` (peft's float32 arithmetic, fewer passes;
`learner_lora="peft"` runs peft's own path). On CUDA those float32 matmuls, and the adapter
bank's in decode, run as TF32 with `GS1_TF32=1` (`use_tf32`; IEEE float32 by default).
The decoder layers are gradient-checkpointed
(`gradient_checkpointing=True`: one more decoder forward, one hidden state per layer kept) on
the CPU, and on a GPU whose memory a microbatch's activations would crowd
(`checkpoint_learner`); otherwise they keep their activations, and on CUDA they run through
torch.compile (`compile_learner`, from a client's third forward_backward: one graph for every
layer and shape; a failed compile falls back to the eager layers).
The learner right-pads each microbatch and passes no attention mask: under causal attention
that is exact, and it keeps training off the masked SDPA kernels of the cuDNN backward defect
(`rl/backends/attention.py`; a CUDA engine also turns cuDNN attention off process-wide and
refuses to start when the defect's reproduction gives a non-finite gradient through the
learner's attention). Each microbatch's logprobs, loss and accumulated LoRA gradient are checked
after its backward: the first non-finite one drops the call's gradients, makes the next
`optim_step` refuse, writes a dump (`_dump_nonfinite`: adapter and optimizer state, datums,
microbatch layout, settings, versions) and raises `NonFiniteStep` naming the microbatch, the
datum and the token (`HiddenStateGradients`); `gs1 replay` reruns the dump (`rl/replay.py`).
Gradients accumulate over forward_backward calls until `optim_step`, which runs
torch.optim.AdamW with the AdamParams' lr, (beta1, beta2), eps, weight_decay, and clips the
global grad norm when `grad_clip_norm > 0`.

Paths: `save_state`, `save_weights_for_sampler` write real directories under
`<cache_dir>/runs/<model_id>/{state,sampler_weights}/<name>/` (a peft adapter directory plus,
for state, `optimizer.pt`) and return their absolute path; loaders take that path, with or
without a `local://` prefix. `cache_dir` defaults to `$GS1_LOCAL_CACHE` or a fresh temp dir.

Sampled logprobs are those of the distribution sampled from (temperature-scaled; see
`local_sampler`); at temperature 1 they equal the learner's logprobs.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import functools
import gc
import itertools
import json
import logging
import math
import os
import shutil
import tempfile
import threading
import time
import uuid
import warnings
import weakref
import zlib
from collections import Counter
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch
from tinker import types

from rl.backends.attention import (
    LEARNER_ATTENTION_MASK,
    check_training_attention,
    configure_cuda_attention,
    sdpa_flags,
    versions,
)
from rl.backends.futures import LocalClientFuture, LocalFuture, SerialWorker, WorkerUsage
from rl.backends.lora_bank import DECODE_FORMS, DEFAULT_DECODE_FORM, AdapterBank, AdapterWeights
from rl.backends.local_sampler import (
    COMPILE_AFTER_BATCHES,
    Generator,
    Row,
    dynamo_graphs,
    guard_failures,
    guard_failures_since,
    install_gqa_decode_attention,
    mean_hidden_states,
    row_key,
    score_tokens,
    splitmix64,
)
from rl.backends.models import ModelSource, load_causal_lm, load_tokenizer_beside, own_tokenizer, resolve_model
from rl.backends.token_logprobs import lm_head_fn, target_logprobs
from schemas.errors import NonFiniteStep, UserError

_log = logging.getLogger("gs1.engine")

ATTN_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
UNEMBED_MODULES = ("lm_head",)
LORA_ALPHA = 32
META_FILE = "gs1_local.json"
# tinker 0.38 deprecates TrainingClient.load_state*(); the engine warns the same way (as a FutureWarning)
LOAD_STATE_DEPRECATED = (
    "DEPRECATED: TrainingClient.load_state*() is deprecated in tinker; create a new training client from "
    "the checkpoint with create_training_client_from_state() or create_training_client_from_state_with_optimizer()"
)
DEFAULT_MAX_TOKENS = 1024
# a non-finite forward_backward's dump (`LocalTrainingClient._dump_nonfinite`, read by rl/replay.py)
NONFINITE_DATUMS, NONFINITE_LAYOUT, NONFINITE_SETTINGS = "datums.pt", "layout.json", "settings.json"


def datum_tensors(d: types.Datum) -> dict:
    """A datum as plain tensors (torch.save with weights_only loads it back; NaN kept exactly)."""
    return {"tokens": torch.tensor(d.model_input.to_ints(), dtype=torch.long),
            **{k: v.to_torch() for k, v in d.loss_fn_inputs.items()}}


def datum_from_tensors(t: dict) -> types.Datum:
    return types.Datum(model_input=types.ModelInput.from_ints([int(x) for x in t["tokens"]]),
                       loss_fn_inputs={k: types.TensorData.from_torch(v) for k, v in t.items() if k != "tokens"})


def _use_stream(device: torch.device, stream) -> None:
    """Make `device` and its engine's `stream` current in the engine's worker thread (both are
    per thread in torch). A plain function, so the worker holds no reference to the engine."""
    if stream is not None:
        torch.cuda.set_device(device)
        torch.cuda.set_stream(stream)


def compile_cache_dir() -> Path:
    """Where torch.compile keeps compiled graphs and kernels between processes:
    `$GS1_COMPILE_CACHE`, else `~/.cache/gs1/torch-compile`."""
    return Path(os.environ.get("GS1_COMPILE_CACHE") or Path.home() / ".cache" / "gs1" / "torch-compile")


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


def _strip_scheme(path: str) -> Path:
    return Path(path[len("local://") :] if path.startswith("local://") else path)


def _pick_device(device) -> torch.device:
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device)


def _pick_dtype(dtype, device: torch.device) -> torch.dtype:
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
# (`_Base.microbatches`): inductor guards on a length's alignment, so one graph serves every
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
    # batches of a decode shape before it is compiled (`local_sampler.COMPILE_AFTER_BATCHES`)
    compile_after_batches: int = COMPILE_AFTER_BATCHES
    # how the learner adds the trained adapter: "fused" (`lora_bank.LoraAddon`) or "peft" (peft's own path)
    learner_lora: str = "fused"
    # the learner's decoder layers run through torch.compile (`_Base.compiled_layers`), from a
    # client's `compile_learner_after`-th forward_backward on
    compile_learner: bool = False
    compile_learner_after: int = COMPILE_LEARNER_AFTER
    # float32 matmuls (the LoRA's in the learner, the bank's in decode) on TF32 tensor cores
    # (`use_tf32`): set process-wide by a CUDA base; no effect on the CPU
    tf32: bool = False


LEARNER_LORA = ("fused", "peft")
# Without checkpointing a microbatch keeps, per decoder layer and token, about 8 hidden-sized and 4
# intermediate-sized tensors in the model's dtype (a Qwen2-style layer through `LoraAddon`: the
# norms' inputs and outputs, q, k, v, the attention output, the MLP's gate, up, activation and
# product). Checkpointing is left off when that estimate is at most this share of the GPU's memory.
LEARNER_MEMORY_SHARE = 0.35


def use_tf32(device: torch.device, tf32: bool | None) -> bool:
    """Whether a base on `device` runs float32 matmuls as TF32: on CUDA with `GS1_TF32=1` (or
    `tf32=True`); never on the CPU. The adapters' float32 matmuls are thin (rank 32) and read
    [tokens x width] float32 operands; in IEEE float32 they run without tensor cores (session3's
    learner profile: 0.42 s of its 2.4 s of CUDA time). TF32 rounds only the LoRA addon's
    products (10-bit mantissa, float32 accumulation); the base's matmuls are bf16 either way.
    Off by default: on the H200 the learner's compile took 81.5 s with it (in a full run) against
    57.8-59.4 s without (observed, not isolated), and what it saves a step is not measured yet
    (results/h200-multi-adapter/session7)."""
    if device.type != "cuda":
        return False
    return os.environ.get("GS1_TF32", "0") == "1" if tf32 is None else bool(tf32)


def learner_activation_bytes(config, tokens: int, dtype: torch.dtype) -> int:
    """The estimate above: what a microbatch of `tokens` tokens keeps for backward, unchecked."""
    per_layer = 8 * config.hidden_size + 4 * getattr(config, "intermediate_size", 4 * config.hidden_size)
    return int(tokens) * config.num_hidden_layers * per_layer * dtype.itemsize


def checkpoint_learner(config, device: torch.device, dtype: torch.dtype, tokens: int) -> bool:
    """Whether the learner checkpoints its decoder layers: always on the CPU (small memory, and
    the tests' numbers); on a GPU when a microbatch's activations (`learner_activation_bytes`)
    would take more than `LEARNER_MEMORY_SHARE` of its memory."""
    if device.type != "cuda":
        return True
    total = torch.cuda.get_device_properties(device).total_memory
    return learner_activation_bytes(config, tokens, dtype) > LEARNER_MEMORY_SHARE * total


@dataclass
class _Request:
    kind: str  # "sample" | "score"
    adapter: AdapterWeights | None  # the sampling client's snapshot; None: the bare base model
    prompt: list[int]
    num_samples: int = 1
    params: types.SamplingParams | None = None
    include_prompt_logprobs: bool = False
    key: int = 0
    seq_prefix: str = ""
    owner: "_Adapter | None" = None  # the training client that sampled it, if any
    client: object = None  # the sampling client that made it
    future: Future = field(default_factory=Future)


class _Base:
    """One base model on one device, shared by every client of the service on that (model,
    device): each training client is a LoRA adapter on it (`_Adapter`), each sampling client a
    snapshot of one (`AdapterWeights`, read through the `AdapterBank`). Owns the tokenizer, the
    sample queue, the generator (its compiled decode graphs) and the one worker thread that runs
    every device job of every client in submission order."""

    def __init__(self, src: ModelSource, device: torch.device, dtype, settings: EngineSettings):
        from transformers.modeling_layers import GradientCheckpointingLayer

        self.src, self.device, self.dtype, self.settings = src, device, dtype, settings
        if device.type == "cuda":  # before any forward picks a kernel (rl/backends/attention.py)
            configure_cuda_attention()
            # process-wide, like the attention backends: set before any graph is captured or compiled
            torch.set_float32_matmul_precision("high" if settings.tf32 else "highest")
            check_training_attention(device, dtype)
        # The tokenizer (a GGUF's converted from its vocabulary: 30.9 s on the H200 machine's CPU)
        # loads beside the weights (51.1 s of dequantising), not before them.
        tokenizer = load_tokenizer_beside(src)
        self.lm = load_causal_lm(src, dtype, device)
        self.tokenizer = tokenizer.result()
        install_gqa_decode_attention(self.lm)
        self.peft = None  # the PeftModel around `lm`, made with the first adapter
        self.bank = AdapterBank(settings.bank_decode)
        self.adapters: dict[str, _Adapter] = {}
        self._names = itertools.count()
        self.pad_id = self._pad_id()
        self.eos_ids = self._eos_ids()
        self.generator = Generator(self.lm, self.pad_id, self.tokenizer, settings.use_cuda_graphs,
                                   compile_decode=settings.compile_decode, bank=self.bank,
                                   compile_after=settings.compile_after_batches)
        # The learner runs the decoder, then the LM head a chunk of tokens at a time
        # (`target_logprobs`), each chunk's logits as large as the sampler's prompt-logprob chunks.
        self.decoder = self.lm.get_decoder()
        self.learner_attention_mask = settings.learner_attention_mask  # True: the masked path before the fix (replay)
        self.tokens_per_microbatch = settings.tokens_per_microbatch
        self.gradient_checkpointing = (
            checkpoint_learner(self.lm.config, device, dtype, settings.tokens_per_microbatch)
            if settings.gradient_checkpointing is None else settings.gradient_checkpointing)
        self.learner_lora = settings.learner_lora
        # Compiled decoder layers for training: not with checkpointing (its recompute would rerun
        # the compiled forward: untried), and off for good once a compile fails (`_learner_microbatch`).
        self.compile_learner = settings.compile_learner and not self.gradient_checkpointing
        self._compiled_forwards: list | None = None
        self._learner_graphs = 0  # dynamo graphs the compiled layers made (one, unless a guard failed)
        self.hidden_grads = HiddenStateGradients(self.decoder)
        self.logit_chunk_rows = max(1, self.generator.max_logit_elems // self.lm.config.vocab_size)
        # Checkpointed decoder layers keep one hidden state per layer for backward and recompute
        # the rest: the 1.5B model's forward_backward at the spec's shape peaks at 7.9 instead of
        # 66 GiB, for one more decoder forward (results/issue13-memory).
        # transformers checkpoints a layer whose own `training` flag is set: forward_backward sets
        # it on those layers alone (not model.train()), so no dropout anywhere switches on.
        self.checkpointed_layers: list[torch.nn.Module] = []
        if self.gradient_checkpointing:
            self.lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            self.checkpointed_layers = [m for m in self.lm.modules() if isinstance(m, GradientCheckpointingLayer)]
        # On CUDA the base works on a stream of its own; the weights, loaded on the default
        # stream, are ready first.
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        if self.stream is not None:
            torch.cuda.current_stream(device).synchronize()
        self.worker = SerialWorker("gs1-local", initializer=functools.partial(_use_stream, device, self.stream))
        self.max_batch_rows = settings.max_batch_rows
        self._pending: list[_Request] = []
        self._cv = threading.Condition()
        self.max_positions = int(getattr(self.lm.config, "max_position_embeddings", 1 << 16))

    # --- helpers ---------------------------------------------------------------------------
    def _pad_id(self) -> int:
        tok = self.tokenizer
        for cand in (tok.pad_token_id, tok.eos_token_id, getattr(self.lm.config, "pad_token_id", None)):
            if isinstance(cand, int):
                return cand
        return 0

    def _eos_ids(self) -> tuple[int, ...]:
        ids: list[int] = []
        gen_cfg = getattr(self.lm, "generation_config", None)
        for src in (getattr(gen_cfg, "eos_token_id", None), self.tokenizer.eos_token_id):
            if isinstance(src, int):
                ids.append(src)
            elif isinstance(src, (list, tuple)):
                ids += [int(x) for x in src]
        return tuple(dict.fromkeys(ids))

    # --- adapters (worker jobs: they change the model's modules) ---------------------------
    def _add_peft_adapter(self, name: str, lora: LoraSpec) -> None:
        from peft import LoraConfig, get_peft_model

        cfg = LoraConfig(r=lora.rank, lora_alpha=LORA_ALPHA, lora_dropout=0.0,
                         target_modules=lora.target_modules(), bias="none")
        if self.peft is None:
            self.peft = get_peft_model(self.lm, cfg, adapter_name=name)
        else:
            self.peft.add_adapter(name, cfg)
        self.peft.eval()  # new modules start in training mode; no dropout anywhere, ever
        self.bank.refresh(self.lm)
        with torch.no_grad():  # LoRA weights (and so AdamW state) stay float32 on a bf16/fp16 base
            for p in self._peft_params(name):
                if p.dtype in (torch.float16, torch.bfloat16):
                    p.data = p.data.float()

    def _peft_params(self, name: str) -> list[torch.nn.Parameter]:
        """Adapter `name`'s parameters in name order (each A before its B)."""
        return [p for n, p in sorted(self.peft.named_parameters()) if f".{name}." in n]

    def add_adapter(self, lora: LoraSpec, seed: int | None) -> "_Adapter":
        name = f"c{next(self._names):04d}"
        self._add_peft_adapter(name, lora)
        adapter = _Adapter(self, name, lora, self._peft_params(name))
        adapter.init_weights(seed if seed is not None else int.from_bytes(os.urandom(4), "little"))
        with self._cv:  # the sample queue's gather reads the adapters from callers' threads
            self.adapters[name] = adapter
        return adapter

    def remove_adapter(self, name: str) -> None:
        with self._cv:
            gone = self.adapters.pop(name, None)
            self._cv.notify_all()
        if gone is not None and self.peft is not None:
            with warnings.catch_warnings():  # peft says which adapter it makes active instead: none is
                warnings.simplefilter("ignore", UserWarning)
                self.peft.delete_adapter(name)

    def activate(self, name: str) -> None:
        """Make adapter `name` the one peft trains (the others get no gradient)."""
        if self.peft.active_adapters != [name]:
            self.peft.set_adapter(name)

    def head_params(self) -> list[torch.Tensor]:
        return [p for p in self.lm.get_output_embeddings().parameters() if p.requires_grad]

    def weights_from_path(self, path: Path) -> AdapterWeights:
        """A saved adapter directory as sampler weights. Read straight onto the bank's
        projections; one that targets projections no live adapter has is loaded through a
        passing peft adapter (a worker job)."""

        sd = _read_adapter_weights(path, self.device)
        config = _adapter_config(path)  # a worker job: the fallback below changes the model
        if config is None:
            raise UserError(f"no adapter_config.json at {path}")
        rank, alpha = int(config["r"]), float(config.get("lora_alpha", LORA_ALPHA))
        layers: list = [None] * len(self.bank.names)
        for key, a in sd.items():
            if not key.endswith(".lora_A.weight"):
                continue
            module = key[: -len(".lora_A.weight")].removeprefix("base_model.model.")
            b = sd.get(key.replace(".lora_A.", ".lora_B."))
            i = self.bank.index.get(module)
            if i is None:
                return self._weights_via_peft(path, config)
            m = self.bank.layers[i]
            if b is None or a.shape != (rank, m.in_features) or b.shape != (m.out_features, rank):
                raise UserError(f"LoRA weights at {path} do not match this model ({key})")
            layers[i] = (a.float(), b.float())
        if not any(w is not None for w in layers):
            raise UserError(f"LoRA weights at {path} do not match this model (no LoRA layer found)")
        return AdapterWeights.of(self.bank.names, layers, rank, alpha / rank)

    def _weights_via_peft(self, path: Path, config: dict) -> AdapterWeights:
        name = f"load{next(self._names):04d}"
        modules = set(config.get("target_modules") or [])
        lora = LoraSpec(int(config["r"]), train_mlp=bool(modules & set(MLP_MODULES)),
                        train_attn=bool(modules & set(ATTN_MODULES)),
                        train_unembed=bool(modules & set(UNEMBED_MODULES)))
        self._add_peft_adapter(name, lora)
        try:
            _load_peft_weights(self.peft, path, name, self.device)
            return self.bank.weights_of(name)
        finally:
            self.peft.delete_adapter(name)

    # --- the sample queue -------------------------------------------------------------------
    # Without `batch_across_clients` a batch holds one sampling client's requests only, so its
    # composition (and every float of its logits) never depends on what another thread's client
    # submitted meanwhile: seeded CPU runs are bit-identical. With it (the CUDA default), a batch
    # holds every client's requests queued when it starts, in submission order: the arms' and
    # seeds' step samples, eval, as one decode.
    def enqueue(self, req: _Request) -> LocalFuture:
        with self._cv:
            self._pending.append(req)
            across = self.settings.batch_across_clients
            rows = sum(r.num_samples for r in self._pending if across or r.client is req.client)
            if req.owner is not None:
                req.owner.queued += 1
                req.owner.samples += req.kind == "sample"
                req.owner.thread = threading.get_ident()
            self._cv.notify_all()
        if rows >= self.max_batch_rows:
            self.flush(req)
        return LocalFuture(req.future, on_wait=lambda: self.flush(req))

    def flush(self, req: _Request) -> None:
        if req.future.done():  # served by another flush meanwhile
            return
        if self.settings.batch_window_s > 0:
            time.sleep(self.settings.batch_window_s)
        if not self.settings.batch_across_clients:
            with self._cv:
                jobs = [r for r in self._pending if r.client is req.client]
                self._pending = [r for r in self._pending if r.client is not req.client]
            if jobs:
                self.worker.submit_raw(self._run_requests, jobs)
            return
        if self._gather(req):
            self.worker.submit_raw(self._run_pending)

    def _gather(self, req: _Request) -> bool:
        """Wait until every other training client that samples and is in its step is ready too:
        its requests queued and a wait on them asked for (it has submitted the step's requests
        -- a loop submits them all before it waits on any). In its step: its samples are being
        decoded, or came back and it has not waited on new ones since (grading, advantages,
        training), or a job of its own runs. Not waited for: one that never sampled (a critic's
        value model), one taken off the base (its arm is done), one whose requests came from this
        very thread (a caller using clients one after another: nobody else would queue them),
        and one that did not get ready within `gather_busy_s` (a stray: not waited for again
        until it waits on samples). Returns whether `req` still waits for a batch (another
        flush's batch may have taken it meanwhile)."""
        owner, me = req.owner, threading.get_ident()
        with self._cv:
            if owner is not None:  # this client is ready: its requests are all submitted
                owner.flushed = owner.queued
                owner.stepping = owner.stray = False
                owner.thread = me
                self._cv.notify_all()
            start = time.monotonic()
            while True:
                if not any(r is req for r in self._pending):
                    return False
                pending = {id(r.owner) for r in self._pending}
                late = [a for a in self.adapters.values()
                        if a is not owner and a.samples and not a.stray and a.thread != me
                        and (a.decoding or a.stepping or a.jobs)
                        and not (id(a) in pending and a.flushed == a.queued)]
                if not late:
                    return True
                if time.monotonic() - start >= self.settings.gather_busy_s:
                    for a in late:
                        a.stray = True
                    _log.warning(f"a decode batch went without {', '.join(a.name for a in late)}: not ready "
                                 f"{self.settings.gather_busy_s:.0f} s after the batch was asked for")
                    return True
                self._cv.wait(timeout=0.05)

    def _run_pending(self) -> None:
        with self._cv:
            jobs, self._pending = self._pending, []
        if jobs:
            self._run_requests(jobs)

    def job_done(self) -> None:
        with self._cv:
            self._cv.notify_all()

    def _run_requests(self, jobs: list[_Request]) -> None:
        owners = {id(j.owner): j.owner for j in jobs if j.owner is not None}.values()
        sampled = {id(j.owner) for j in jobs if j.kind == "sample"}
        with self._cv:
            for a in owners:
                a.decoding += 1
        try:
            with self.bank.serving():
                # compute_logprobs: one padded forward per chunk of requests. (A sample request's
                # prompt logprobs come from its own prefill, in `_generate`.)
                scored = [j for j in jobs if j.kind == "score"]
                if scored:
                    lps = score_tokens(self.lm, [j.prompt for j in scored], self.pad_id,
                                       self.generator.max_logit_elems, self.bank, [j.adapter for j in scored])
                    for j, lp in zip(scored, lps):
                        j.future.set_result(lp)
                # Generation: consecutive requests packed into batches of at most max_batch_rows rows.
                batch: list[_Request] = []
                for j in (j for j in jobs if j.kind == "sample"):
                    if batch and sum(b.num_samples for b in batch) + j.num_samples > self.max_batch_rows:
                        self._generate(batch)
                        batch = []
                    batch.append(j)
                if batch:
                    self._generate(batch)
        except BaseException as e:  # never leave a caller waiting
            for j in jobs:
                if not j.future.done():
                    j.future.set_exception(e)
        finally:
            with self._cv:  # the gather: the clients whose samples came back are in their step
                for a in owners:
                    a.decoding -= 1
                    a.stepping = a.stepping or id(a) in sampled
                self._cv.notify_all()

    def prompt_embeddings(self, adapter: AdapterWeights | None, prompts: list[list[int]]) -> LocalFuture[torch.Tensor]:
        """Each prompt's mean-pooled last hidden state under `adapter` (None: the bare base), on
        the worker, through the bank as a sampling client's requests are (`mean_hidden_states`)."""
        def prompt_embedding():
            with self.bank.serving():
                return mean_hidden_states(self.lm, prompts, self.bank, adapter)

        return self.worker.submit(prompt_embedding)

    def _rows(self, j: _Request) -> list[Row]:
        p = j.params
        assert p is not None
        stop_ids: tuple[int, ...] = ()
        stop_strs: tuple[str, ...] = ()
        if p.stop is None:
            stop_ids = self.eos_ids
        elif isinstance(p.stop, str):
            stop_strs = (p.stop,)
        else:
            stop = list(p.stop)
            stop_ids = tuple(int(s) for s in stop if isinstance(s, int))
            stop_strs = tuple(s for s in stop if isinstance(s, str))
        room = self.max_positions - len(j.prompt)
        max_tokens = min(p.max_tokens if p.max_tokens is not None else DEFAULT_MAX_TOKENS, room)
        return [
            Row(prompt=j.prompt, max_tokens=max_tokens, temperature=float(p.temperature),
                top_k=int(p.top_k), top_p=float(p.top_p), stop_ids=stop_ids,
                stop_strs=stop_strs, key=row_key(j.key, s),
                prompt_logprobs=j.include_prompt_logprobs, adapter=j.adapter)
            for s in range(j.num_samples)
        ]

    def _generate(self, batch: list[_Request]) -> None:
        rows = [r for j in batch for r in self._rows(j)]
        results = self.generator.generate(rows)
        k = 0
        for j in batch:
            prompt_lps = results[k].prompt_logprobs  # the same list on each of j's rows
            seqs = []
            for s in range(j.num_samples):
                res = results[k]
                k += 1
                seqs.append(types.SampledSequence(
                    stop_reason=res.stop_reason, sequence_id=f"{j.seq_prefix}:{s}",
                    _tokens_list=res.tokens, _logprobs_list=res.logprobs))
            j.future.set_result(types.SampleResponse(
                sequences=seqs, _prompt_logprobs_list=prompt_lps))

    # --- learner ----------------------------------------------------------------------------
    def microbatches(self, data: Sequence[types.Datum], multiple: int = 1) -> list[Microbatch]:
        """Consecutive datums, each microbatch's padded length x size within the token budget;
        padded lengths rounded up to a multiple of `multiple` (the compiled learner's
        `LEARNER_LENGTH_MULTIPLE`: the length it runs is the one logged, dumped and replayed)."""
        def padded(length: int) -> int:
            return -(-length // multiple) * multiple

        mbs: list[Microbatch] = []
        mb: list[int] = []
        longest = 0  # mb's longest datum
        for i, d in enumerate(data):
            L = d.model_input.length
            if mb and (len(mb) + 1) * padded(max(longest, L)) > self.tokens_per_microbatch:
                mbs.append(Microbatch.of(data, mb, padded(longest)))
                mb, longest = [], 0
            mb.append(i)
            longest = max(longest, L)
        if mb:
            mbs.append(Microbatch.of(data, mb, padded(longest)))
        return mbs

    def forward_backward(self, adapter: "_Adapter", data: Sequence[types.Datum], loss_fn: str,
                         forward_only: bool, layout: Sequence[Microbatch] | None = None
                         ) -> types.ForwardBackwardOutput:
        """`adapter`'s forward_backward (it alone gets gradients). `layout`: the microbatches
        (datum indices, padded length) to run, for `gs1 replay`; by default `microbatches(data)`.
        Training checks each microbatch for a non-finite logprob, loss or gradient (`_NonFinite`)."""
        if loss_fn not in ("importance_sampling", "cross_entropy"):
            raise ValueError(f"local backend: unsupported loss_fn {loss_fn!r} "
                             "(importance_sampling, cross_entropy)")
        self.activate(adapter.name)
        outputs: list[dict[str, types.TensorData]] = [{} for _ in data]
        total = 0.0
        n_tokens = 0
        if not forward_only:
            adapter.train_calls += 1
        compiled = (not forward_only and self.compile_learner
                    and adapter.train_calls >= self.settings.compile_learner_after)
        mbs = (list(layout) if layout is not None
               else self.microbatches(data, LEARNER_LENGTH_MULTIPLE if compiled else 1))
        ctx = torch.no_grad() if forward_only else torch.enable_grad()
        lora = self.bank.training(adapter.name) if self.learner_lora == "fused" else contextlib.nullcontext()
        try:
            for layer in self.checkpointed_layers:
                layer.training = not forward_only
            with ctx, lora:
                for m, mb in enumerate(mbs):
                    try:
                        total += self._learner_microbatch(adapter, data, mb, loss_fn, forward_only, outputs, compiled)
                    except _NonFinite as bad:
                        bad.microbatch, bad.layout = m, mbs
                        raise
                    n_tokens += mb.tokens
        finally:
            for layer in self.checkpointed_layers:
                layer.training = False
        return types.ForwardBackwardOutput(
            loss_fn_output_type="ArrayRecord", loss_fn_outputs=outputs,
            metrics={"loss:sum": float(total), "num_tokens:sum": float(n_tokens)})

    @contextlib.contextmanager
    def compiled_layers(self):
        """The decoder layers' `forward` through torch.compile for the decoder forward's length
        (the worker runs one job at a time, so no sampler forward sees them); the layers' hooks
        stay outside the graph. One graph serves every layer, microbatch shape and adapter, so
        that nothing a guard reads differs between them:
        - the shapes are symbolic from the first compile (`_symbolic_trainable`; `_microbatch`
          keeps sizes of 1 out);
        - the first layer's input requires grad as the others' do (the embedding's output is
          marked; its gradient is computed and dropped);
        - every adapter's LoRA weights in the layers require grad, not the trained one's alone
          (peft's `set_adapter` turns the others off). Only the trained adapter's weights are
          in the graph, so the others get no gradient."""
        layers = list(self.decoder.layers)
        if self._compiled_forwards is None:
            import torch._dynamo

            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
            self._compiled_forwards = [torch.compile(layer.forward, dynamic=True) for layer in layers]
        frozen = [p for layer in layers for n, p in layer.named_parameters()
                  if "lora_" in n and not p.requires_grad]
        embed = self.decoder.get_input_embeddings().register_forward_hook(_symbolic_trainable)
        for layer, forward in zip(layers, self._compiled_forwards):
            layer.forward = forward
        for p in frozen:
            p.requires_grad_(True)
        try:
            yield
        finally:
            embed.remove()
            for p in frozen:
                p.requires_grad_(False)
            for layer in layers:
                layer.__dict__.pop("forward", None)

    def _learner_microbatch(self, adapter: "_Adapter", data, mb: Microbatch, loss_fn, forward_only,
                            outputs, compiled: bool) -> float:
        """`_microbatch`, through the compiled layers when `compiled`. A compile or run that fails
        there (not a non-finite value, not out of memory) turns the compiled learner off for this
        base with a warning and reruns the microbatch eagerly from the gradients it started with."""
        if not (compiled and self.compile_learner):
            return self._microbatch(adapter, data, mb, loss_fn, forward_only, outputs)
        grads = [None if p.grad is None else p.grad.clone() for p in adapter.params]
        first, graphs, failures = self._compiled_forwards is None, dynamo_graphs(), guard_failures()
        t0 = time.perf_counter()
        try:
            loss = self._microbatch(adapter, data, mb, loss_fn, forward_only, outputs, compiled=True)
        except (_NonFinite, torch.OutOfMemoryError):
            raise
        except Exception as e:  # noqa: BLE001 -- any compiler failure; the eager rerun shows a real error
            self.compile_learner = False
            msg = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
            _log.warning(f"learner: the compiled decoder layers failed on {self.device} "
                         f"({type(e).__name__}: {msg}); training eagerly from now on")
            for p, g in zip(adapter.params, grads):
                p.grad = g
            return self._microbatch(adapter, data, mb, loss_fn, forward_only, outputs)
        new = dynamo_graphs() - graphs
        if first or new:  # a recompile is a guard that failed: one graph should serve every call
            self._learner_graphs += new
            why = guard_failures_since(failures)
            _log.info(f"learner: decoder layers {'compiled' if first else 'recompiled'} on {self.device} in "
                      f"{time.perf_counter() - t0:.1f} s ({mb.size} datums x {mb.padded_length} positions; "
                      f"{self._learner_graphs} graphs so far)"
                      + (f"; guard failed: {' | '.join(w.splitlines()[0][:300] for w in why)}" if why else ""))
        return loss

    def _microbatch(self, adapter: "_Adapter", data, mb: Microbatch, loss_fn, forward_only, outputs,
                    compiled: bool = False) -> float:
        dev = self.device
        # Compiled layers see at least 2 rows and 2 positions: dynamo specialises a size of 1 into
        # a graph of its own (their lengths are already multiples of LEARNER_LENGTH_MULTIPLE,
        # `microbatches`). The extra rows and positions are pads, masked out of every logprob.
        rows, L = (max(mb.size, 2), max(mb.padded_length, 2)) if compiled else (mb.size, mb.padded_length)
        ids = torch.full((rows, L), self.pad_id, dtype=torch.long)
        mask = torch.zeros(rows, L, dtype=torch.long)
        tgt = torch.zeros(rows, L, dtype=torch.long)
        coef_a = torch.zeros(rows, L, dtype=torch.float64)  # advantages or weights
        old_lp = torch.zeros(rows, L, dtype=torch.float64)
        for b, i in enumerate(mb.datums):
            d = data[i]
            toks = d.model_input.to_ints()
            n = len(toks)
            ids[b, :n] = torch.tensor(toks, dtype=torch.long)
            mask[b, :n] = 1
            inp = d.loss_fn_inputs
            t = inp["target_tokens"].to_torch().long().reshape(-1)
            if t.numel() != n:
                raise ValueError(f"datum {i}: target_tokens has {t.numel()} entries, "
                                 f"model_input has {n} tokens")
            tgt[b, :n] = t
            if loss_fn == "importance_sampling":
                coef_a[b, :n] = inp["advantages"].to_torch().double().reshape(-1)
                old_lp[b, :n] = inp["logprobs"].to_torch().double().reshape(-1)
            else:
                w = inp.get("weights")
                coef_a[b, :n] = w.to_torch().double().reshape(-1) if w is not None else 1.0
        ids, mask, tgt = ids.to(dev), mask.to(dev), tgt.to(dev)
        # loss math in float32, or float64 when the model is float64
        acc = torch.float64 if self.dtype == torch.float64 else torch.float32
        valid = mask.bool()
        coef_N, old_lp_N = coef_a.to(dev, acc)[valid], old_lp.to(dev, acc)[valid]
        # Right padding under causal attention needs no mask (rl/backends/attention.py): no masked
        # SDPA kernel, so not the cuDNN backward defect, and flash attention on CUDA.
        attention_mask = mask if self.learner_attention_mask else LEARNER_ATTENTION_MASK
        check = not forward_only
        layers = self.compiled_layers() if compiled else contextlib.nullcontext()
        with self.hidden_grads.watching() if check else contextlib.nullcontext(), layers:
            hidden = self.decoder(input_ids=ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        # the real tokens only, row after row: datum b's n tokens are lp_N's next n entries
        lp_N = target_logprobs(hidden[valid], tgt[valid], lm_head_fn(self.lm), self.head_params(),
                               self.logit_chunk_rows, acc)
        if loss_fn == "importance_sampling":
            per_tok_N = -torch.exp(lp_N - old_lp_N) * coef_N
        else:
            per_tok_N = -lp_N * coef_N
        loss = per_tok_N.sum()
        if check:
            finite_N = torch.isfinite(lp_N.detach()) & torch.isfinite(per_tok_N.detach())
            if not bool(finite_N.all()):  # one sync on the clean path; which one, only when it fails
                for what, values_N in (("logprob", lp_N), ("loss", per_tok_N)):
                    bad_N = ~torch.isfinite(values_N.detach())
                    if bool(bad_N.any()):
                        raise _NonFinite(what, *mb.locate(int(bad_N.nonzero()[0, 0])))
            loss.backward()
            grads = [p.grad for p in adapter.params if p.grad is not None]
            if grads and not bool(torch.isfinite(torch.stack(torch._foreach_norm(grads))).all()):
                raise _NonFinite("gradient", *self.hidden_grads.origin(mask.bool(), mb))
        lp_cpu = lp_N.detach().float().cpu()  # tinker's TensorData is float32
        for i, lp_n in zip(mb.datums, lp_cpu.split(mb.lengths)):
            outputs[i] = {"logprobs": types.TensorData.from_torch(lp_n.clone())}
        return float(loss.detach())


def _symbolic_trainable(module, args, embeds: torch.Tensor) -> torch.Tensor:
    """The embedding's output as the compiled layers take it (`_Base.compiled_layers`): requiring
    grad, as every later layer's input does, with its rows and positions symbolic from the first
    compile (else dynamo compiles the first shape static and a second graph for the next)."""
    import torch._dynamo

    torch._dynamo.maybe_mark_dynamic(embeds, 0)
    torch._dynamo.maybe_mark_dynamic(embeds, 1)
    return embeds.requires_grad_(True)


# The worker's job names as a usage line says them (`usage_lines`); others go by their own name.
JOB_LABELS = {
    "_run_requests": "sampling batches", "_run_pending": "sampling batches",
    "_checked_forward_backward": "forward_backward", "forward_backward": "forward", "_optim_step": "optim_step",
    "<lambda>": "saves and sampling clients", "_load": "loads", "add_adapter": "clients created",
    "remove_adapter": "clients given back",
}


def usage_lines(before: dict[str, WorkerUsage], after: dict[str, WorkerUsage], seconds: float) -> list[str]:
    """One line per base used between two `LocalServiceClient.usage()` snapshots `seconds` apart:
    how long its worker (the device's one queue) was busy, and on what, busiest first. The rest of
    the interval the device waited on the callers (grading, advantages, a gather waiting for arms)."""
    lines = []
    for name, now in after.items():
        u = now.since(before.get(name) or WorkerUsage({}, {}))  # a base made meanwhile: all of it
        if not u.jobs:
            continue
        jobs: dict[str, list] = {}
        for k, n in u.jobs.items():
            j = jobs.setdefault(JOB_LABELS.get(k, k), [0, 0.0])
            j[0] += n
            j[1] += u.busy[k]
        busy = sum(s for _, s in jobs.values())
        parts = ", ".join(f"{label} {s:.1f} s ({n})" for label, (n, s) in sorted(jobs.items(), key=lambda kv: -kv[1][1]))
        lines.append(f"{name}: busy {busy:.1f} of {seconds:.1f} s ({100 * busy / max(seconds, 1e-9):.0f} %): {parts}")
    return lines


def _adapter_config(path: Path) -> dict | None:
    f = path / "adapter_config.json"
    return json.loads(f.read_text()) if f.is_file() else None


def _read_adapter_weights(path: Path, device) -> dict[str, torch.Tensor]:
    """A saved adapter directory's LoRA tensors on `device`; a missing or damaged file is the user's."""
    from safetensors.torch import load_file

    f = path / "adapter_model.safetensors"
    if not f.is_file():
        raise UserError(f"no LoRA weights at {path} (expected adapter_model.safetensors)")
    try:
        return load_file(str(f), device=str(device))
    except Exception as e:  # safetensors raises its own SafetensorError for a damaged file
        raise UserError(f"{f}: damaged LoRA weights file ({type(e).__name__}: {e})") from None


def _load_peft_weights(peft_model, path: Path, name: str, device) -> None:
    """Adapter directory `path` into peft adapter `name` (its keys must all match)."""
    from peft import set_peft_model_state_dict

    sd = _read_adapter_weights(path, device)
    try:
        res = set_peft_model_state_dict(peft_model, sd, adapter_name=name)
    except RuntimeError as e:  # a shape mismatch: another rank or model
        raise UserError(f"LoRA weights at {path} do not match this model ({str(e).splitlines()[0]})") from None
    missing = [k for k in getattr(res, "missing_keys", []) if "lora_" in k and f".{name}." in k]
    if missing:
        raise UserError(f"LoRA weights at {path} do not match this model ({missing[0]} missing)")


class _Adapter:
    """One training client's LoRA adapter on a shared base: its parameters (float32; the
    client's AdamW state is over these alone), its jobs on the base's worker, and the views of
    the base the client and the tests read (`model`, `params`, `generator`, ...)."""

    def __init__(self, base: _Base, name: str, lora: LoraSpec, params: list[torch.nn.Parameter]):
        self.base, self.name, self.lora, self.params = base, name, lora, params
        # The client's own tokenizer (made on the worker, which also uses the base's): a fast
        # tokenizer used from two threads at once fails ("Already borrowed"), and the arms on one
        # base run in parallel threads.
        self.tokenizer = own_tokenizer(base.tokenizer)
        # what the sample queue's gather reads (`_Base._gather`), under the base's lock
        self.jobs = 0  # submitted and not finished
        self.samples = 0  # sample requests made by its sampling clients
        self.queued = 0  # requests (sample or score) made by its sampling clients
        self.flushed = 0  # `queued` when it last asked to wait on one (all submitted up to there)
        self.decoding = 0  # batches running that hold its requests
        self.stepping = False  # its samples came back and it has not waited on new ones since
        self.stray = False  # not ready in time: not waited for until it waits on samples again
        self.thread: int | None = None  # the thread that last queued its requests or waited on them
        self.train_calls = 0  # forward_backward calls (the compiled learner starts at `compile_learner_after`)

    def __getattr__(self, name: str):
        """The base's parts (device, dtype, tokenizer, generator, worker, settings), as each
        of its clients sees them."""
        if name.startswith("__") or name == "base":
            raise AttributeError(name)
        return getattr(self.base, name)

    @property
    def model(self):
        """The PeftModel with this adapter active (what a reference forward should call)."""
        self.base.activate(self.name)
        return self.base.peft

    @property
    def learner_attention_mask(self) -> bool:
        return self.base.learner_attention_mask

    @learner_attention_mask.setter
    def learner_attention_mask(self, on: bool) -> None:
        self.base.learner_attention_mask = on

    def submit(self, fn, *args) -> LocalFuture:
        with self.base._cv:
            self.jobs += 1

        @functools.wraps(fn)  # the worker counts its seconds under fn's name
        def run():
            try:
                return fn(*args)
            finally:
                with self.base._cv:
                    self.jobs -= 1
                    self.base._cv.notify_all()

        return self.base.worker.submit(run)

    def init_weights(self, seed: int) -> None:
        """peft's init (A kaiming-uniform with a = sqrt(5), B zero) redrawn from a generator of
        this adapter's own: the same seed gives the same adapter whatever else runs in the process."""
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in sorted(self.base.peft.named_parameters()):
                if f".{self.name}." not in name:
                    continue
                if "lora_A" in name:
                    w = torch.empty(p.shape, dtype=torch.float32)
                    torch.nn.init.kaiming_uniform_(w, a=math.sqrt(5), generator=g)
                    p.copy_(w)
                elif "lora_B" in name:
                    p.zero_()

    def microbatches(self, data: Sequence[types.Datum], multiple: int = 1) -> list[Microbatch]:
        return self.base.microbatches(data, multiple)

    def forward_backward(self, data, loss_fn: str, forward_only: bool, layout=None) -> types.ForwardBackwardOutput:
        return self.base.forward_backward(self, data, loss_fn, forward_only, layout)

    def snapshot_live(self) -> AdapterWeights:
        return self.base.bank.weights_of(self.name)

    def load_adapter_into_live(self, path: Path) -> None:
        _load_peft_weights(self.base.peft, path, self.name, self.device)

    def state_dict(self) -> dict[str, torch.Tensor]:
        from peft import get_peft_model_state_dict

        return get_peft_model_state_dict(self.base.peft, adapter_name=self.name, save_embedding_layers=False)

    def save(self, out: Path, base_model: str) -> None:
        """A peft adapter directory (adapter_model.safetensors, adapter_config.json) of this adapter."""
        from safetensors.torch import save_file

        sd = {k: v.detach().contiguous() for k, v in self.state_dict().items()}
        save_file(sd, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
        config = copy.deepcopy(self.base.peft.peft_config[self.name])
        config.base_model_name_or_path = base_model
        config.save_pretrained(str(out))


@dataclass(frozen=True)
class Microbatch:
    """Datums (indices into a forward_backward's data) run as one right-padded batch."""
    datums: tuple[int, ...]
    lengths: tuple[int, ...]  # each datum's tokens
    padded_length: int

    @classmethod
    def of(cls, data, indices, padded_length: int | None = None) -> "Microbatch":
        lengths = tuple(data[i].model_input.length for i in indices)
        L = max(lengths) if padded_length is None else padded_length
        if L < max(lengths):
            raise ValueError(f"padded length {L} is shorter than the longest datum ({max(lengths)} tokens)")
        return cls(tuple(indices), lengths, L)

    @property
    def size(self) -> int:
        return len(self.datums)

    @property
    def tokens(self) -> int:
        return sum(self.lengths)

    def locate(self, n: int) -> tuple[int, int]:
        """(datum, token) of entry `n` of the microbatch's real tokens, row after row."""
        for i, length in zip(self.datums, self.lengths):
            if n < length:
                return i, n
            n -= length
        raise IndexError(n)

    def to_json(self) -> dict:
        return {"datums": list(self.datums), "lengths": list(self.lengths), "padded_length": self.padded_length,
                "tokens": self.tokens}


class _NonFinite(Exception):
    """A microbatch's non-finite value, inside the engine; the training client turns it into a
    dump and a NonFiniteStep."""

    def __init__(self, what: str, datum: int | None, token: int | None) -> None:
        super().__init__(what)
        self.what, self.datum, self.token = what, datum, token
        self.microbatch = 0
        self.layout: list[Microbatch] = []


class HiddenStateGradients:
    """Where a non-finite gradient starts. While the learner's forward runs (`watching`), hooks on
    each decoder layer put a hook on the gradient of its output (the embeddings are frozen and get
    none) that keeps, per row and position, whether it is finite. Backward runs the layers top
    down, so the highest layer whose output gradient is not finite is the one just below where
    the NaN entered; there it has spread through at most one layer's backward, and the latest
    non-finite position of its first such row is the token named. The module hooks exist only
    during the learner's forward: the sampler's compiled decode step never sees them."""

    def __init__(self, decoder) -> None:
        self._layers = list(decoder.layers)
        self.nonfinite: dict[int, torch.Tensor] = {}  # layer -> [B, L] bool

    @contextlib.contextmanager
    def watching(self):
        self.nonfinite = {}
        handles = [layer.register_forward_hook(functools.partial(self._on_forward, index))
                   for index, layer in enumerate(self._layers)]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def _on_forward(self, index: int, module, args, output) -> None:
        hidden = output[0] if isinstance(output, tuple) else output
        if torch.is_grad_enabled() and hidden.requires_grad:
            hidden.register_hook(functools.partial(self._on_grad, index))

    def _on_grad(self, index: int, grad: torch.Tensor) -> None:
        self.nonfinite[index] = ~torch.isfinite(grad).all(dim=-1)  # no sync: read only after a failure

    def origin(self, real_B_L: torch.Tensor, mb: Microbatch) -> tuple[int | None, int | None]:
        for index in sorted(self.nonfinite, reverse=True):
            bad_B_L = self.nonfinite[index] & real_B_L
            rows = bad_B_L.any(dim=-1).nonzero()
            if rows.numel():
                b = int(rows[0, 0])
                return mb.datums[b], int(bad_B_L[b].nonzero()[-1, 0])
        return None, None


def _release_adapter(base: _Base, name: str) -> None:
    """Take adapter `name` off its base (a worker job; never waited on: a finalizer may run on
    the worker itself)."""
    with contextlib.suppress(RuntimeError):  # the worker is gone at interpreter exit
        base.worker.submit_raw(base.remove_adapter, name)


class LocalSamplingClient:
    """A snapshot of LoRA weights on a shared base (None: the bare base model); `sample` /
    `compute_logprobs` queue requests. `owner`: the training client it was taken from, if any."""

    def __init__(self, engine: _Base, snapshot: AdapterWeights | None, base_model: str, base_key: int,
                 model_path: str | None = None, owner: "_Adapter | None" = None):
        self._engine = engine
        # made on the worker: its owner's tokenizer (the same caller's thread), else a copy of its own
        self._tokenizer = owner.tokenizer if owner is not None else own_tokenizer(engine.tokenizer)
        self._snapshot = snapshot
        self._owner = owner
        self._base_model = base_model
        self._base_key = base_key
        self._counter = itertools.count()
        self._lock = threading.Lock()
        self.model_path = model_path

    def _next_key(self) -> tuple[int, int]:
        with self._lock:
            n = next(self._counter)
        return n, splitmix64(self._base_key ^ splitmix64(n))

    def sample(self, prompt: types.ModelInput, num_samples: int,
               sampling_params: types.SamplingParams, include_prompt_logprobs: bool = False,
               topk_prompt_logprobs: int = 0) -> LocalFuture[types.SampleResponse]:
        if topk_prompt_logprobs:
            raise NotImplementedError("local backend: topk_prompt_logprobs is not supported")
        if num_samples < 1:
            raise ValueError("num_samples must be >= 1")
        n, key = self._next_key()
        if sampling_params.seed is not None:
            key = splitmix64(int(sampling_params.seed) & ((1 << 64) - 1))
        req = _Request("sample", self._snapshot, prompt.to_ints(), num_samples, sampling_params,
                       include_prompt_logprobs, key, f"{self._snapshot_id}:{n}", self._owner, self)
        return self._engine.enqueue(req)

    @property
    def _snapshot_id(self) -> int:
        return -1 if self._snapshot is None else self._snapshot.id

    def compute_logprobs(self, prompt: types.ModelInput) -> LocalFuture[list[float | None]]:
        n, key = self._next_key()
        return self._engine.enqueue(_Request("score", self._snapshot, prompt.to_ints(), key=key,
                                             owner=self._owner, client=self))

    def prompt_embeddings(self, prompts: list[types.ModelInput]) -> LocalFuture[torch.Tensor]:
        """(P, d) mean-pooled last hidden states of the prompts under this client's weights: a
        kernel feature only the local backend can give (a Tinker sampler returns no hidden states)."""
        return self._engine.prompt_embeddings(self._snapshot, [p.to_ints() for p in prompts])

    def get_tokenizer(self):
        return self._tokenizer

    def get_base_model(self) -> str:
        return self._base_model


class LocalTrainingClient:
    """tinker's TrainingClient surface for one LoRA model on the local engine."""

    def __init__(self, service: "LocalServiceClient", engine: "_Adapter", base_model: str,
                 seed: int | None, model_id: str, run_dir: Path,
                 base_model_path: str | None = None):
        self._service = service
        self._base_model_path = base_model_path
        self._engine = engine
        self._base_model = base_model
        self._seed = seed
        self.model_id = model_id
        self._run_dir = run_dir
        self._opt = self._new_optimizer()
        self._optim_steps = 0
        self._refuse_optim = False
        self._samplers = itertools.count()
        self._key_root = splitmix64(seed if seed is not None else int.from_bytes(os.urandom(8), "little"))
        # the adapter leaves the shared base with its client (or at `release`)
        self._finalizer = weakref.finalize(self, _release_adapter, engine.base, engine.name)

    def release(self) -> None:
        """Give the adapter's memory back to the base now (the client is not used after)."""
        self._finalizer()

    def _new_optimizer(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self._engine.params, lr=1e-4, betas=(0.9, 0.95), eps=1e-12,
                                 weight_decay=0.0, foreach=False)

    def _submit(self, fn, *args) -> LocalFuture:
        return self._engine.submit(fn, *args)

    # --- learner ------------------------------------------------------------------------
    def lora_gradient(self):
        """The LoRA gradient accumulated since the last optim_step, flat, float64 (numpy).

        Local engine only -- not part of tinker's surface. The correctness preflight compares
        our loop's gradient with the stock cookbook path's through it.
        """
        def collect():
            return torch.cat([
                (p.grad if p.grad is not None else torch.zeros_like(p)).detach().to(torch.float64).flatten().cpu()
                for p in self._engine.params
            ]).numpy()

        return self._submit(collect).result()

    def forward_backward(self, data: list[types.Datum], loss_fn: types.LossFnType = "cross_entropy",
                         loss_fn_config: dict | None = None) -> LocalFuture[types.ForwardBackwardOutput]:
        data = list(data)
        return self._submit(self._checked_forward_backward, data, loss_fn, None)

    def set_learner_attention_mask(self, on: bool) -> None:
        """The learner's mask setting (`gs1 replay`; not tinker's surface)."""
        self._submit(setattr, self._engine.base, "learner_attention_mask", bool(on)).result()

    def discard_gradients(self) -> None:
        """Drop the accumulated gradients, and a refusal pending from a non-finite call (`gs1 replay`)."""
        def discard():
            self._opt.zero_grad(set_to_none=True)
            self._refuse_optim = False
        self._submit(discard).result()

    def forward_backward_layout(self, data: list[types.Datum], loss_fn: str, layout: Sequence[Microbatch]
                                ) -> LocalFuture[types.ForwardBackwardOutput]:
        """forward_backward with the microbatches given (`gs1 replay`; not tinker's surface)."""
        return self._submit(self._checked_forward_backward, list(data), loss_fn, list(layout))

    def _checked_forward_backward(self, data, loss_fn, layout) -> types.ForwardBackwardOutput:
        try:
            return self._engine.forward_backward(data, loss_fn, False, layout)
        except _NonFinite as bad:
            # nothing of this call may reach the weights: its gradients go, and the optim_step
            # submitted after it refuses (`_refuse_optim`)
            dump = self._dump_nonfinite(data, loss_fn, bad)
            self._opt.zero_grad(set_to_none=True)
            self._refuse_optim = True
            mb = bad.layout[bad.microbatch]
            raise NonFiniteStep(bad.what, bad.microbatch + 1, len(bad.layout), mb.padded_length, mb.size,
                                bad.datum, bad.token, str(dump)) from None

    def _dump_nonfinite(self, data, loss_fn: str, bad: _NonFinite) -> Path:
        """What `gs1 replay` needs to rerun the call exactly (rl/replay.py reads it): the adapter and
        optimizer state before the update (a state directory, loadable as a checkpoint), the datums,
        the microbatch layout, and the engine's settings and versions."""
        engine = self._engine
        name = f"nonfinite-{self._optim_steps:05d}-{uuid.uuid4().hex[:6]}"
        dump = self._write_dir("nonfinite", name, True)
        torch.save([datum_tensors(d) for d in data], dump / NONFINITE_DATUMS)
        (dump / NONFINITE_LAYOUT).write_text(json.dumps({
            "loss_fn": loss_fn, "microbatches": [mb.to_json() for mb in bad.layout],
            "failed": {"what": bad.what, "microbatch": bad.microbatch, "datum": bad.datum, "token": bad.token},
        }, indent=1))
        (dump / NONFINITE_SETTINGS).write_text(json.dumps({
            "device": str(engine.device), "dtype": str(engine.dtype).removeprefix("torch."),
            "tokens_per_microbatch": engine.tokens_per_microbatch,
            "gradient_checkpointing": engine.gradient_checkpointing,
            "learner_lora": engine.learner_lora,
            "compile_learner": engine.compile_learner,  # replay runs eagerly
            "learner_attention_mask": engine.learner_attention_mask,
            "tf32": engine.base.settings.tf32,
            "attn_implementation": getattr(engine.base.lm.config, "_attn_implementation", None),
            "sdpa_backends": sdpa_flags(), "versions": versions(),
        }, indent=1))
        return dump

    def forward(self, data: list[types.Datum], loss_fn: types.LossFnType = "cross_entropy",
                loss_fn_config: dict | None = None) -> LocalFuture[types.ForwardBackwardOutput]:
        data = list(data)
        return self._submit(self._engine.forward_backward, data, loss_fn, True)

    def optim_step(self, optim_params: types.AdamParams | None = None, *,
                   adam_params: types.AdamParams | None = None) -> LocalFuture[types.OptimStepResponse]:
        params = optim_params if optim_params is not None else adam_params
        if not isinstance(params, types.AdamParams):
            raise TypeError("local backend: optim_step takes types.AdamParams")
        return self._submit(self._optim_step, params)

    def _optim_step(self, p: types.AdamParams) -> types.OptimStepResponse:
        if self._refuse_optim:
            self._refuse_optim = False
            raise FloatingPointError("optim_step: not applied: the forward_backward before it was not finite")
        for g in self._opt.param_groups:
            g["lr"] = p.learning_rate
            g["betas"] = (p.beta1, p.beta2)
            g["eps"] = p.eps
            g["weight_decay"] = p.weight_decay
        params = [q for q in self._engine.params if q.grad is not None]
        grad_norm = 0.0
        if params:
            total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(q.grad.float()) for q in params]))
            grad_norm = float(total)
            if not math.isfinite(grad_norm):
                # Adam would write NaN into every adapter weight: refuse, and keep the last finite ones
                self._opt.zero_grad(set_to_none=True)
                raise FloatingPointError(f"optim_step: the gradient is not finite (norm {grad_norm}); "
                                         "the update was not applied")
            if p.grad_clip_norm > 0:
                torch.nn.utils.clip_grads_with_norm_(params, p.grad_clip_norm, total)  # the norm just taken
        self._opt.step()
        self._opt.zero_grad(set_to_none=True)
        self._optim_steps += 1
        return types.OptimStepResponse(metrics={"optim/grad_norm": grad_norm,
                                                "optim/step": float(self._optim_steps)})

    # --- checkpoints --------------------------------------------------------------------
    def _meta(self) -> dict:
        lora = self._engine.lora
        return {"base_model": self._base_model, "base_model_path": self._base_model_path,
                "rank": lora.rank, "train_mlp": lora.train_mlp,
                "train_attn": lora.train_attn, "train_unembed": lora.train_unembed,
                "seed": self._seed, "optim_steps": self._optim_steps, "model_id": self.model_id}

    def _write_dir(self, kind: str, name: str, with_optimizer: bool) -> Path:
        if not name or "/" in name or name.startswith("."):
            raise UserError(f"checkpoint name {name!r} must be a plain file name")
        final = self._run_dir / kind / name
        tmp = self._run_dir / kind / f".{name}.tmp-{uuid.uuid4().hex[:8]}"
        try:
            tmp.mkdir(parents=True)
            # LoRA never touches the embeddings; saying so skips peft's vocabulary check, which looks
            # the base model up on the hub (and warns when it is a local directory).
            self._engine.save(tmp, self._base_model_path or self._base_model)
            if with_optimizer:
                torch.save(self._opt.state_dict(), tmp / "optimizer.pt")
            (tmp / META_FILE).write_text(json.dumps(self._meta(), indent=1))
        except Exception as e:  # torch (RuntimeError) and safetensors (SafetensorError) wrap ENOSPC
            shutil.rmtree(tmp, ignore_errors=True)
            if getattr(e, "errno", None) not in (errno.ENOSPC, errno.EDQUOT) and "No space left" not in str(e):
                raise
            raise UserError(f"no space left to save {kind} {name!r} under {self._run_dir}: free some and run again (it resumes)") from None
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        return final

    def save_state(self, name: str, ttl_seconds: int | None = None, **_: Any
                   ) -> LocalFuture[types.SaveWeightsResponse]:
        return self._submit(lambda: types.SaveWeightsResponse(
            path=str(self._write_dir("state", name, True))))

    def save_weights_for_sampler(self, name: str, ttl_seconds: int | None = None, **_: Any
                                 ) -> LocalFuture[types.SaveWeightsForSamplerResponse]:
        return self._submit(lambda: types.SaveWeightsForSamplerResponse(
            path=str(self._write_dir("sampler_weights", name, False))))

    def _load(self, path: str, optimizer: bool) -> types.LoadWeightsResponse:
        d = _strip_scheme(path)
        if not d.is_dir():
            raise UserError(f"no saved state at {path}")
        self._engine.load_adapter_into_live(d)
        for q in self._engine.params:
            q.grad = None
        self._opt = self._new_optimizer()
        if optimizer:
            f = d / "optimizer.pt"
            if not f.is_file():
                raise UserError(f"{path} holds no optimizer state (saved with save_weights_for_sampler?)")
            try:
                state = torch.load(f, map_location=self._engine.device, weights_only=True)
            except Exception as e:  # a truncated or overwritten file
                raise UserError(f"{f}: damaged optimizer state ({type(e).__name__})") from None
            self._opt.load_state_dict(state)
        meta_f = d / META_FILE
        if meta_f.is_file():
            self._optim_steps = int(json.loads(meta_f.read_text()).get("optim_steps", 0))
        return types.LoadWeightsResponse(path=path, model_id=self.model_id)

    def load_state(self, path: str, weights_access_token: str | None = None
                   ) -> LocalFuture[types.LoadWeightsResponse]:
        """Weights only; the optimizer starts fresh (tinker's semantics). Deprecated as in tinker."""
        warnings.warn(LOAD_STATE_DEPRECATED, FutureWarning, stacklevel=2)
        return self._submit(self._load, path, False)

    def load_state_with_optimizer(self, path: str, weights_access_token: str | None = None
                                  ) -> LocalFuture[types.LoadWeightsResponse]:
        warnings.warn(LOAD_STATE_DEPRECATED, FutureWarning, stacklevel=2)
        return self._submit(self._load, path, True)

    # --- sampling clients ---------------------------------------------------------------
    def _sampler_key(self) -> int:
        return splitmix64(self._key_root ^ splitmix64(next(self._samplers) + 1))

    def save_weights_and_get_sampling_client(self, name: str | None = None, **_: Any
                                             ) -> LocalClientFuture[LocalSamplingClient]:
        key = self._sampler_key()
        engine = self._engine
        fut = engine.worker.submit_raw(
            lambda: LocalSamplingClient(engine.base, engine.snapshot_live(), self._base_model, key,
                                        owner=engine))
        return LocalClientFuture(fut)

    def create_sampling_client(self, model_path: str, **_: Any) -> LocalClientFuture[LocalSamplingClient]:
        key = splitmix64(zlib.crc32(model_path.encode()))
        base = self._engine.base
        fut = base.worker.submit_raw(
            lambda: LocalSamplingClient(base, base.weights_from_path(_strip_scheme(model_path)),
                                        self._base_model, key, model_path))
        return LocalClientFuture(fut)

    # --- info ---------------------------------------------------------------------------
    def get_tokenizer(self):
        return self._engine.tokenizer

    def get_info(self) -> types.GetInfoResponse:
        arch = getattr(self._engine.base.lm.config, "model_type", None)
        return types.GetInfoResponse(
            model_data=types.ModelData(arch=arch, model_name=self._base_model,
                                       tokenizer_id=self._base_model),
            model_id=self.model_id, is_lora=True, lora_rank=self._engine.lora.rank,
            model_name=self._base_model)

    def get_base_model(self) -> str:
        return self._base_model


class LocalServiceClient:
    """tinker's ServiceClient surface for the in-process engine: one base model per (model,
    device), every client of it an adapter on that base (`_Base`)."""

    def __init__(self, device=None, dtype=None, cache_dir=None, *, max_batch_rows: int | None = None,
                 batch_window_s: float = 0.0, tokens_per_microbatch: int | None = None,
                 use_cuda_graphs: bool | None = None, compile_decode: bool | None = None,
                 gradient_checkpointing: bool | None = None, learner_attention_mask: bool = False,
                 batch_across_clients: bool | None = None, gather_busy_s: float | None = None,
                 bank_decode: str | None = None, compile_after_batches: int | None = None,
                 learner_lora: str = "fused", compile_learner: bool | None = None,
                 compile_learner_after: int | None = None, tf32: bool | None = None):
        self.device = _pick_device(device)
        self.dtype = _pick_dtype(dtype, self.device)
        cache = cache_dir or os.environ.get("GS1_LOCAL_CACHE")
        self.cache_dir = Path(cache) if cache else Path(tempfile.mkdtemp(prefix="gs1-local-"))
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        cuda = self.device.type == "cuda"
        # On CUDA the decode step is compiled unless GS1_COMPILE_DECODE=0 (or compile_decode=False):
        # ~1 minute per batch shape, then 11.6 -> 7.0 ms per step on an H200 (results/issue4).
        compile_decode = (os.environ.get("GS1_COMPILE_DECODE", "1") != "0"
                          if compile_decode is None else compile_decode)
        # ... and the learner's decoder layers unless GS1_COMPILE_LEARNER=0: the eager layers'
        # norms, rotary and casts were half of a forward_backward's CUDA time
        # (results/h200-multi-adapter/session3); on the CPU only when asked (the tests' numbers)
        compile_learner = (cuda and os.environ.get("GS1_COMPILE_LEARNER", "1") != "0"
                           if compile_learner is None else compile_learner)
        self.settings = EngineSettings(
            # CUDA: twelve arms' 64-row steps, or an eval's 1024 prompts, in one batch (30 GB of KV
            # cache for a 1.5B model); CPU: small batches keep a test's memory small
            max_batch_rows=max_batch_rows or (1024 if cuda else 64),
            batch_window_s=batch_window_s,
            # bounds a microbatch's activations (the logits are chunked within it, `target_logprobs`)
            tokens_per_microbatch=tokens_per_microbatch or (16384 if cuda else 1024),
            use_cuda_graphs=use_cuda_graphs, compile_decode=bool(compile_decode),
            gradient_checkpointing=None if gradient_checkpointing is None else bool(gradient_checkpointing),
            learner_attention_mask=bool(learner_attention_mask),  # the masked path before the fix (replay)
            # CPU: each client's batches alone, so seeded runs are bit-identical whatever the threads do
            batch_across_clients=cuda if batch_across_clients is None else bool(batch_across_clients),
            # a client is waited for from the return of its samples until it waits on new ones: with a
            # time window instead (2 s), the user's two arms on the H200 never shared a decode (the
            # GS1 arm grades 64 prompts' rollouts for longer; results/h200-multi-adapter/session4)
            gather_busy_s=gather_busy_s if gather_busy_s is not None else EngineSettings.gather_busy_s,
            bank_decode=bank_decode or os.environ.get("GS1_BANK_DECODE", DEFAULT_DECODE_FORM),
            compile_after_batches=compile_after_batches or COMPILE_AFTER_BATCHES,
            learner_lora=learner_lora, compile_learner=bool(compile_learner),
            compile_learner_after=compile_learner_after or COMPILE_LEARNER_AFTER,
            tf32=use_tf32(self.device, tf32))
        if learner_lora not in LEARNER_LORA:
            raise UserError(f"learner LoRA path {learner_lora!r}: one of {', '.join(LEARNER_LORA)}")
        if self.settings.bank_decode not in DECODE_FORMS:
            raise UserError(f"bank decode form {self.settings.bank_decode!r}: one of {', '.join(DECODE_FORMS)}")
        if cuda and (compile_decode or compile_learner):
            # inductor's on-disk caches: a later process finds every shape's kernels compiled
            pin_compile_cache()
        self._ids = itertools.count()
        self._bases: dict[tuple, _Base] = {}  # (model path, gguf file, device) -> its base
        self._placing = threading.Lock()

    @property
    def max_batch_rows(self) -> int:
        return self.settings.max_batch_rows

    def place(self) -> torch.device:
        """The device of the next client. `device="cuda"` (or None) on a machine with several
        GPUs: the GPU with the fewest live adapters (lowest index first), so arms created together
        spread over the GPUs, one base on each; an explicit `cuda:N`, a single GPU, or the CPU:
        that device."""
        if self.device.type != "cuda" or self.device.index is not None:
            return self.device
        if torch.cuda.device_count() < 2:
            return torch.device("cuda", torch.cuda.current_device())  # an index: the worker sets it
        gc.collect()  # adapters of clients a stage is done with count no more
        live = Counter()
        for base in list(self._bases.values()):
            live[base.device.index] += len(base.adapters)
        return torch.device("cuda", min(range(torch.cuda.device_count()), key=lambda i: (live[i], i)))

    def base(self, base_model: str, device: torch.device | None = None) -> _Base:
        """The base of `base_model` on `device` (placed by `place` when None), loaded once."""
        src = resolve_model(base_model)
        with self._placing:  # one placement at a time: two arms creating theirs at once see each other's
            device = device or self.place()
            key = (src.path, src.gguf_file, str(device))
            if key not in self._bases:
                self._bases[key] = _Base(src, device, self.dtype, self.settings)
            return self._bases[key]

    def usage(self) -> dict[str, WorkerUsage]:
        """Each base's worker so far (`SerialWorker.usage`), by "model on device"."""
        with self._placing:
            bases = list(self._bases.values())
        return {f"{b.src.spec} on {b.device}": b.worker.usage() for b in bases}

    def create_lora_training_client(self, base_model: str, rank: int = 32, seed: int | None = None,
                                    train_mlp: bool = True, train_attn: bool = True,
                                    train_unembed: bool = False, *,
                                    base_model_path: str | None = None, **_: Any
                                    ) -> LocalClientFuture[LocalTrainingClient]:
        """`base_model` names the model; weights load from `base_model_path` when given."""
        lora = LoraSpec(int(rank), train_mlp, train_attn, train_unembed)
        lora.target_modules()  # a LoRA on nothing is refused here, not on the worker
        base = self.base(base_model_path or base_model)
        adapter = base.worker.submit(base.add_adapter, lora, seed).result()
        model_id = f"local-{next(self._ids):04d}-{uuid.uuid4().hex[:8]}"
        run_dir = self.cache_dir / "runs" / model_id
        run_dir.mkdir(parents=True, exist_ok=True)
        tc = LocalTrainingClient(self, adapter, base_model, seed, model_id, run_dir,
                                 base_model_path)
        f: Future = Future()
        f.set_result(tc)
        return LocalClientFuture(f)

    def _client_from_state(self, path: str, optimizer: bool) -> LocalClientFuture[LocalTrainingClient]:
        d = _strip_scheme(path)
        meta_f = d / META_FILE
        if not meta_f.is_file():
            raise UserError(f"no local training state at {path}")
        meta = json.loads(meta_f.read_text())
        tc = self.create_lora_training_client(
            meta["base_model"], meta["rank"], meta.get("seed"), meta["train_mlp"],
            meta["train_attn"], meta["train_unembed"],
            base_model_path=meta.get("base_model_path")).result()
        tc._submit(tc._load, path, optimizer).result()
        f: Future = Future()
        f.set_result(tc)
        return LocalClientFuture(f)

    def create_training_client_from_state(self, path: str, **_: Any):
        return self._client_from_state(path, optimizer=False)

    def create_training_client_from_state_with_optimizer(self, path: str, **_: Any):
        return self._client_from_state(path, optimizer=True)

    def create_sampling_client(self, model_path: str | None = None, base_model: str | None = None,
                               **_: Any) -> LocalClientFuture[LocalSamplingClient]:
        if model_path is None and base_model is None:
            raise ValueError("Either model_path or base_model must be provided")
        if model_path is not None:
            meta_f = _strip_scheme(model_path) / META_FILE
            if not meta_f.is_file():
                raise UserError(f"no local sampler weights at {model_path}")
            meta = json.loads(meta_f.read_text())
            base_model = meta.get("base_model_path") or meta["base_model"]
        assert base_model is not None
        base = self.base(base_model)
        base_key = splitmix64(zlib.crc32((model_path or base_model).encode()))
        if model_path is not None:
            fut = base.worker.submit_raw(lambda: LocalSamplingClient(
                base, base.weights_from_path(_strip_scheme(model_path)), base_model, base_key, model_path))
        else:
            fut = base.worker.submit_raw(lambda: LocalSamplingClient(base, None, base_model, base_key))
        return LocalClientFuture(fut)

    def get_server_capabilities(self):
        return None
