"""tinker's client surface over the engine: the service (`LocalServiceClient`: one base per
(model, device), placed on the GPUs), training clients (`LocalTrainingClient`: one adapter each,
its optimizer, checkpoints and non-finite dumps) and sampling clients (`LocalSamplingClient`:
queued sample, score and embedding requests on a snapshot of an adapter's weights)."""

from __future__ import annotations

import contextlib
import errno
import gc
import itertools
import json
import math
import os
import shutil
import tempfile
import threading
import uuid
import warnings
import weakref
import zlib
from collections import Counter
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Sequence

import torch
from tinker import types

from engine import determinism
from engine.attention import sdpa_flags, versions
from engine.base import _Adapter, _Base, _Request
from engine.futures import LocalClientFuture, LocalFuture, WorkerUsage
from engine.generate import COMPILE_AFTER_BATCHES, splitmix64
from engine.learner import Microbatch, _NonFinite
from engine.lora_bank import DECODE_FORMS, DEFAULT_DECODE_FORM, AdapterWeights
from engine.models import own_tokenizer, resolve_model
from engine.settings import (
    COMPILE_LEARNER_AFTER,
    LEARNER_LORA,
    EngineSettings,
    LoraSpec,
    device_identity,
    pick_device,
    pick_dtype,
    pin_compile_cache,
    quick_gil_handoff,
    resolve_decode_attention,
    resolve_decode_length_bucket,
    use_tf32,
)
from schemas.errors import NonFiniteStep, UserError

META_FILE = "gs1_local.json"
# tinker 0.38 deprecates TrainingClient.load_state*(); the engine warns the same way (as a FutureWarning)
LOAD_STATE_DEPRECATED = (
    "DEPRECATED: TrainingClient.load_state*() is deprecated in tinker; create a new training client from "
    "the checkpoint with create_training_client_from_state() or create_training_client_from_state_with_optimizer()"
)
# a non-finite forward_backward's dump (`LocalTrainingClient._dump_nonfinite`, read by engine/replay.py)
NONFINITE_DATUMS, NONFINITE_LAYOUT, NONFINITE_SETTINGS = "datums.pt", "layout.json", "settings.json"


def datum_tensors(d: types.Datum) -> dict:
    """A datum as plain tensors (torch.save with weights_only loads it back; NaN kept exactly)."""
    return {"tokens": torch.tensor(d.model_input.to_ints(), dtype=torch.long),
            **{k: v.to_torch() for k, v in d.loss_fn_inputs.items()}}


def datum_from_tensors(t: dict) -> types.Datum:
    return types.Datum(model_input=types.ModelInput.from_ints([int(x) for x in t["tokens"]]),
                       loss_fn_inputs={k: types.TensorData.from_torch(v) for k, v in t.items() if k != "tokens"})


def _strip_scheme(path: str) -> Path:
    return Path(path[len("local://") :] if path.startswith("local://") else path)


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
        """Give the adapter's memory back now (the client is not used after): its weights and
        gradients leave the base (a worker job, `_Base.remove_adapter`) and the optimizer lets go
        of them and of its moments, whoever still holds this client or a sampling client of it
        (a run's many units train, then evaluate in the same process)."""
        self._opt.state.clear()
        for group in self._opt.param_groups:
            group["params"] = []
        self._finalizer()

    def device_identity(self) -> str:
        """The physical device the adapter's base is on (`engine.settings.device_identity`)."""
        return device_identity(self._engine.base.device)

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
        self._submit(setattr, self._engine.base.learner, "learner_attention_mask", bool(on)).result()

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
        """What `gs1 replay` needs to rerun the call exactly (engine/replay.py reads it): the adapter and
        optimizer state before the update (a state directory, loadable as a checkpoint), the datums,
        the microbatch layout, and the engine's settings and versions."""
        engine, learner = self._engine, self._engine.base.learner
        name = f"nonfinite-{self._optim_steps:05d}-{uuid.uuid4().hex[:6]}"
        dump = self._write_dir("nonfinite", name, True)
        torch.save([datum_tensors(d) for d in data], dump / NONFINITE_DATUMS)
        (dump / NONFINITE_LAYOUT).write_text(json.dumps({
            "loss_fn": loss_fn, "microbatches": [mb.to_json() for mb in bad.layout],
            "failed": {"what": bad.what, "microbatch": bad.microbatch, "datum": bad.datum, "token": bad.token},
        }, indent=1))
        (dump / NONFINITE_SETTINGS).write_text(json.dumps({
            "device": str(engine.device), "dtype": str(engine.dtype).removeprefix("torch."),
            "tokens_per_microbatch": learner.tokens_per_microbatch,
            "gradient_checkpointing": learner.gradient_checkpointing,
            "learner_lora": learner.learner_lora,
            "compile_learner": learner.compile_learner,  # replay runs eagerly
            "learner_attention_mask": learner.learner_attention_mask,
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
                 compile_learner_after: int | None = None, tf32: bool | None = None,
                 deterministic: bool | None = None, decode_length_bucket: int | None = None,
                 decode_attention: str | None = None):
        deterministic = determinism.requested(deterministic)
        if deterministic:  # before anything runs on the device (cuBLAS sizes its workspace once)
            determinism.enable()
        self.device = pick_device(device)
        self.dtype = pick_dtype(dtype, self.device)
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
            decode_length_bucket=resolve_decode_length_bucket(decode_length_bucket),
            decode_attention=resolve_decode_attention(decode_attention),
            learner_lora=learner_lora, compile_learner=bool(compile_learner),
            compile_learner_after=compile_learner_after or COMPILE_LEARNER_AFTER,
            tf32=use_tf32(self.device, tf32), deterministic=deterministic)
        if learner_lora not in LEARNER_LORA:
            raise UserError(f"learner LoRA path {learner_lora!r}: one of {', '.join(LEARNER_LORA)}")
        if self.settings.bank_decode not in DECODE_FORMS:
            raise UserError(f"bank decode form {self.settings.bank_decode!r}: one of {', '.join(DECODE_FORMS)}")
        if cuda and (compile_decode or compile_learner):
            # inductor's on-disk caches: a later process finds every shape's kernels compiled
            pin_compile_cache()
        quick_gil_handoff()  # the worker's many small ops beside the arms' own Python threads
        self._ids = itertools.count()
        self._bases: dict[tuple, _Base] = {}  # (model path, gguf file, device) -> its base
        self._placing = threading.Lock()
        self._placements: dict[str, torch.device] = {}  # a placement key -> the GPU its first client got

    @property
    def max_batch_rows(self) -> int:
        return self.settings.max_batch_rows

    def numerics(self) -> determinism.Numerics:
        """How this engine's numbers are made (a unit's record carries it)."""
        return determinism.Numerics(
            backend="local", deterministic=self.settings.deterministic and determinism.enabled(),
            device=str(self.device), dtype=str(self.dtype).removeprefix("torch."), tf32=self.settings.tf32,
            cublas_workspace=os.environ.get("CUBLAS_WORKSPACE_CONFIG") if self.device.type == "cuda" else None,
            torch=torch.__version__, decode_attention=self.settings.decode_attention)

    def place(self, placement: str | None = None) -> torch.device:
        """The device of the next client. `device="cuda"` (or None) on a machine with several
        GPUs: the GPU of an earlier client with the same `placement` key (a run gives the units of
        one seed one key, so that they share a base: their samples batch together and their wall
        times compare), else the GPU with the fewest live adapters (lowest index first), so arms
        created together spread over the GPUs, one base on each; an explicit `cuda:N`, a single
        GPU, or the CPU: that device."""
        if self.device.type != "cuda" or self.device.index is not None:
            return self.device
        if torch.cuda.device_count() < 2:
            return torch.device("cuda", torch.cuda.current_device())  # an index: the worker sets it
        if placement in self._placements:
            return self._placements[placement]
        gc.collect()  # adapters of clients a stage is done with count no more
        live = Counter()
        for base in list(self._bases.values()):
            live[base.device.index] += len(base.adapters)
        device = torch.device("cuda", min(range(torch.cuda.device_count()), key=lambda i: (live[i], i)))
        if placement is not None:
            self._placements[placement] = device
        return device

    def base(self, base_model: str, device: torch.device | None = None, placement: str | None = None) -> _Base:
        """The base of `base_model` on `device` (placed by `place`, with `placement`, when None),
        loaded once."""
        src = resolve_model(base_model)
        with self._placing:  # one placement at a time: two arms creating theirs at once see each other's
            device = device or self.place(placement)
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
                                    base_model_path: str | None = None,
                                    user_metadata: dict[str, str] | None = None, **_: Any
                                    ) -> LocalClientFuture[LocalTrainingClient]:
        """`base_model` names the model; weights load from `base_model_path` when given.
        `user_metadata["unit"]` names the client's arm for the deterministic mode's batch order;
        `user_metadata["placement"]` keeps clients of one key on one GPU (`place`)."""
        lora = LoraSpec(int(rank), train_mlp, train_attn, train_unembed)
        lora.target_modules()  # a LoRA on nothing is refused here, not on the worker
        base = self.base(base_model_path or base_model, placement=(user_metadata or {}).get("placement"))
        adapter = base.worker.submit(base.add_adapter, lora, seed).result()
        adapter.unit = (user_metadata or {}).get("unit", "")
        model_id = f"local-{next(self._ids):04d}-{uuid.uuid4().hex[:8]}"
        run_dir = self.cache_dir / "runs" / model_id
        run_dir.mkdir(parents=True, exist_ok=True)
        tc = LocalTrainingClient(self, adapter, base_model, seed, model_id, run_dir,
                                 base_model_path)
        f: Future = Future()
        f.set_result(tc)
        return LocalClientFuture(f)

    def _client_from_state(self, path: str, optimizer: bool,
                           user_metadata: dict[str, str] | None) -> LocalClientFuture[LocalTrainingClient]:
        d = _strip_scheme(path)
        meta_f = d / META_FILE
        if not meta_f.is_file():
            raise UserError(f"no local training state at {path}")
        meta = json.loads(meta_f.read_text())
        tc = self.create_lora_training_client(
            meta["base_model"], meta["rank"], meta.get("seed"), meta["train_mlp"],
            meta["train_attn"], meta["train_unembed"],
            base_model_path=meta.get("base_model_path"), user_metadata=user_metadata).result()
        tc._submit(tc._load, path, optimizer).result()
        f: Future = Future()
        f.set_result(tc)
        return LocalClientFuture(f)

    def create_training_client_from_state(self, path: str, user_metadata: dict[str, str] | None = None, **_: Any):
        return self._client_from_state(path, optimizer=False, user_metadata=user_metadata)

    def create_training_client_from_state_with_optimizer(self, path: str, user_metadata: dict[str, str] | None = None,
                                                        **_: Any):
        return self._client_from_state(path, optimizer=True, user_metadata=user_metadata)

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
