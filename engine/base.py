"""The engine: one base model on one device (`_Base`), shared by every client of a service on
that (model, device). Loads the model and its tokenizer, runs the one worker thread, queues sample
and score requests and gathers them into batches across clients, manages the LoRA adapters
(`_Adapter`: a training client's peft adapter), and turns requests into the sampler's rows
(`sampler.Sampler`) and its results into `types.SampleResponse`. The learner is `learner.Learner`."""

from __future__ import annotations

import copy
import functools
import itertools
import json
import logging
import math
import os
import threading
import time
import warnings
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch
from tinker import types

from engine import determinism
from engine.attention import check_training_attention, configure_cuda_attention
from engine.futures import LocalFuture, SerialWorker
from engine.generate import Row, install_gqa_decode_attention, row_key
from engine.learner import Learner, Microbatch
from engine.lora_bank import AdapterBank, AdapterWeights
from engine.models import ModelSource, load_causal_lm, load_tokenizer_beside, own_tokenizer
from engine.sampler import GeneratorSampler, Sampler
from engine.settings import ATTN_MODULES, LORA_ALPHA, MLP_MODULES, UNEMBED_MODULES, EngineSettings, LoraSpec
from schemas.errors import UserError

_log = logging.getLogger("gs1.engine")

DEFAULT_MAX_TOKENS = 1024


def _use_stream(device: torch.device, stream) -> None:
    """Make `device` and its engine's `stream` current in the engine's worker thread (both are
    per thread in torch). A plain function, so the worker holds no reference to the engine."""
    if stream is not None:
        torch.cuda.set_device(device)
        torch.cuda.set_stream(stream)


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
    sample queue, the sampler (`sampler`: generation, scoring, embeddings), the learner
    (`learner`) and the one worker thread that runs every device job of every client in
    submission order."""

    def __init__(self, src: ModelSource, device: torch.device, dtype, settings: EngineSettings):
        self.src, self.device, self.dtype, self.settings = src, device, dtype, settings
        if device.type == "cuda":  # before any forward picks a kernel (engine/attention.py)
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
        self.sampler: Sampler = GeneratorSampler(self.lm, self.pad_id, self.tokenizer, self.bank, settings)
        self.learner = Learner(self)
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
        if gone is not None:  # its sampling clients may live on (they hold it as owner): not its tensors
            for p in gone.params:
                p.grad = None
            gone.params = []

    def activate(self, name: str) -> None:
        """Make adapter `name` the one peft trains (the others get no gradient)."""
        if self.peft.active_adapters != [name]:
            self.peft.set_adapter(name)

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
            # compute_logprobs: the sampler's scoring, all of the job's requests at once. (A sample
            # request's prompt logprobs come from its own prefill, in `_generate`.)
            scored = [j for j in jobs if j.kind == "score"]
            if scored:
                lps = self.sampler.score([j.prompt for j in scored], [j.adapter for j in scored])
                for j, lp in zip(scored, lps):
                    j.future.set_result(lp)
            # Generation: consecutive requests packed into batches of at most max_batch_rows rows.
            samples = [j for j in jobs if j.kind == "sample"]
            if self.settings.deterministic:  # the batches' rows whatever order the threads queued them in
                samples.sort(key=lambda j: determinism.request_order(j.key, j.owner, j.prompt, j.num_samples))
            batch: list[_Request] = []
            for j in samples:
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
        the worker, through the sampler as a sampling client's requests are (`Sampler.embed`)."""
        def prompt_embedding():
            return self.sampler.embed(adapter, prompts)

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
        results = self.sampler.generate(rows)
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
    the base the client and the tests read (`model`, `params`, `sampler`, ...)."""

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
        self.unit = ""  # the arm it trains, as the caller named it (the deterministic mode's batch order)

    def __getattr__(self, name: str):
        """The base's parts (device, dtype, tokenizer, sampler, learner, worker, settings), as each
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
        return self.base.learner.learner_attention_mask

    @learner_attention_mask.setter
    def learner_attention_mask(self, on: bool) -> None:
        self.base.learner.learner_attention_mask = on

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
        return self.base.learner.microbatches(data, multiple)

    def forward_backward(self, data, loss_fn: str, forward_only: bool, layout=None) -> types.ForwardBackwardOutput:
        return self.base.learner.forward_backward(self, data, loss_fn, forward_only, layout)

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
