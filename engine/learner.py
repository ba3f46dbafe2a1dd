"""The learner: a base's forward_backward (`Learner`), its microbatches (`Microbatch`), the
compiled decoder layers, and the non-finite checks (`_NonFinite`, `HiddenStateGradients`).

It runs the decoder, then the LM head a chunk of tokens at a time (`target_logprobs`), each
chunk's logits as large as the sampler's prompt-logprob chunks (`Sampler.max_logit_elems`)."""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import torch
from tinker import types

from engine.attention import LEARNER_ATTENTION_MASK
from engine.generate import CacheReads, dynamo_graphs, guard_failures, guard_failures_since
from engine.lora_bank import AdapterBank
from engine.sampler import Sampler
from engine.settings import (LEARNER_LENGTH_MULTIPLE, EngineSettings, LearnerMemory, cache_learner_graphs,
                             learner_lora_caveat, learner_memory)
from engine.token_logprobs import lm_head_fn, target_logprobs

_log = logging.getLogger("gs1.engine")


class LearnerBase(Protocol):
    """What the learner reads of the base it trains on (`engine.base._Base`): the model, its
    adapters' bank, its settings and device, and which adapter is live."""

    settings: EngineSettings
    lm: Any  # the transformers causal LM
    bank: AdapterBank
    sampler: Sampler
    device: torch.device
    dtype: torch.dtype
    pad_id: int

    def activate(self, name: str) -> None: ...


class TrainedAdapter(Protocol):
    """What the learner reads of the adapter it trains (`engine.base._Adapter`)."""

    name: str
    params: list[torch.nn.Parameter]
    train_calls: int


class Learner:
    """A base's learner: forward_backward for one adapter at a time (the others get no gradient),
    on the base's worker. Owns the learner's settings as the base resolved them (checkpointing,
    the LoRA path, the compiled layers) and the compiled layers' forwards."""

    def __init__(self, base: LearnerBase):
        from transformers.modeling_layers import GradientCheckpointingLayer

        settings = base.settings
        self.base, self.lm, self.bank, self.settings = base, base.lm, base.bank, settings
        self.device, self.dtype, self.pad_id = base.device, base.dtype, base.pad_id
        self.decoder = self.lm.get_decoder()
        self.learner_attention_mask = settings.learner_attention_mask  # True: the masked path before the fix (replay)
        # checkpointing named in the settings keeps their microbatches; else the memory plan picks both
        memory = (learner_memory(self.lm.config, base.device, base.dtype, settings.tokens_per_microbatch)
                  if settings.gradient_checkpointing is None
                  else LearnerMemory(settings.gradient_checkpointing, settings.tokens_per_microbatch))
        self.tokens_per_microbatch = memory.tokens_per_microbatch
        self.gradient_checkpointing = memory.checkpoint
        self.learner_lora = settings.learner_lora
        # Compiled decoder layers for training: not with checkpointing (its recompute would rerun
        # the compiled forward: untried), and off for good once a compile fails (`_learner_microbatch`).
        self.compile_learner = settings.compile_learner and not self.gradient_checkpointing
        caveat = learner_lora_caveat(self.learner_lora, self.device.type, self.compile_learner)
        if caveat:
            _log.warning(f"learner: {caveat}")
        self._compiled_forwards: list | None = None
        self._learner_graphs = 0  # dynamo graphs the compiled layers made (one, unless a guard failed)
        self.hidden_grads = HiddenStateGradients(self.decoder)
        self.logit_chunk_rows = max(1, base.sampler.max_logit_elems // self.lm.config.vocab_size)
        # Checkpointed decoder layers keep one hidden state per layer for backward and recompute
        # the rest: the 1.5B model's forward_backward at the spec's shape peaks at 7.9 instead of
        # 66 GiB, for one more decoder forward (results/issue13-memory).
        # transformers checkpoints a layer whose own `training` flag is set: forward_backward sets
        # it on those layers alone (not model.train()), so no dropout anywhere switches on.
        self.checkpointed_layers: list[torch.nn.Module] = []
        if self.gradient_checkpointing:
            self.lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            self.checkpointed_layers = [m for m in self.lm.modules() if isinstance(m, GradientCheckpointingLayer)]

    def head_params(self) -> list[torch.Tensor]:
        return [p for p in self.lm.get_output_embeddings().parameters() if p.requires_grad]

    def microbatches(self, data: Sequence[types.Datum], multiple: int = 1) -> list[Microbatch]:
        """The datums longest first, cut within the token budget (`cut_microbatches`); padded
        lengths rounded up to a multiple of `multiple` (the compiled learner's
        `LEARNER_LENGTH_MULTIPLE`: the length it runs is the one logged, dumped and replayed).
        Longest first because a microbatch is padded to its longest datum: in arrival order the
        H200 comparison's logged steps left 33.8 % of the learner's positions padding, longest
        first 18.1 % (benchmarks/learner_padding.py). The loss is a sum over datums, so the order
        changes only the gradient's float summation order. Ties keep arrival order."""
        return cut_microbatches(data, longest_first(data), self.tokens_per_microbatch, multiple)

    def forward_backward(self, adapter: TrainedAdapter, data: Sequence[types.Datum], loss_fn: str,
                         forward_only: bool, layout: Sequence[Microbatch] | None = None
                         ) -> types.ForwardBackwardOutput:
        """`adapter`'s forward_backward (it alone gets gradients). `layout`: the microbatches
        (datum indices, padded length) to run, for `gs1 replay`; by default `microbatches(data)`.
        Training checks each microbatch for a non-finite logprob, loss or gradient (`_NonFinite`)."""
        if loss_fn not in ("importance_sampling", "cross_entropy"):
            raise ValueError(f"local backend: unsupported loss_fn {loss_fn!r} "
                             "(importance_sampling, cross_entropy)")
        self.base.activate(adapter.name)
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
        lora = (contextlib.nullcontext() if self.learner_lora == "peft"
                else self.bank.training(adapter.name, in_out_dtype=self.learner_lora == "fused-base"))
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
        import torch._dynamo

        layers = list(self.decoder.layers)
        if self._compiled_forwards is None:
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
            cache_learner_graphs()  # a warm process loads the layers' forward and backward, not re-traces them
            self._compiled_forwards = [torch.compile(layer.forward, dynamic=True) for layer in layers]
        frozen = [p for layer in layers for n, p in layer.named_parameters()
                  if "lora_" in n and not p.requires_grad]
        embed = self.decoder.get_input_embeddings().register_forward_hook(_symbolic_trainable)
        for layer, forward in zip(layers, self._compiled_forwards):
            layer.forward = forward
        for p in frozen:
            p.requires_grad_(True)
        try:
            # The layers' Python floats (the LoRA scaling among them) as constants from the
            # start: traced symbolic, inductor's pass specialises them anyway and restarts the whole
            # analysis, so every process, warm or cold, threw away a trace and an AOTAutograd lookup
            # that missed (about half a warm compile on the CPU: `benchmarks/learner_compile.py`).
            with torch._dynamo.config.patch(specialize_float=True):
                yield
        finally:
            embed.remove()
            for p in frozen:
                p.requires_grad_(False)
            for layer in layers:
                layer.__dict__.pop("forward", None)

    def _learner_microbatch(self, adapter: TrainedAdapter, data, mb: Microbatch, loss_fn, forward_only,
                            outputs, compiled: bool) -> float:
        """`_microbatch`, through the compiled layers when `compiled`. A compile or run that fails
        there (not a non-finite value, not out of memory) turns the compiled learner off for this
        base with a warning and reruns the microbatch eagerly from the gradients it started with."""
        if not (compiled and self.compile_learner):
            return self._microbatch(adapter, data, mb, loss_fn, forward_only, outputs)
        grads = [None if p.grad is None else p.grad.clone() for p in adapter.params]
        first, graphs, failures = self._compiled_forwards is None, dynamo_graphs(), guard_failures()
        reads = CacheReads.now()
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
                      f"{self._learner_graphs} graphs so far; {CacheReads.now().since(reads)})"
                      + (f"; guard failed: {' | '.join(w.splitlines()[0][:300] for w in why)}" if why else ""))
        return loss

    def _microbatch(self, adapter: TrainedAdapter, data, mb: Microbatch, loss_fn, forward_only, outputs,
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
        # Right padding under causal attention needs no mask (engine/attention.py): no masked
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


def longest_first(data: Sequence[types.Datum]) -> list[int]:
    """The datums' indices, longest first; ties in arrival order."""
    return sorted(range(len(data)), key=lambda i: -data[i].model_input.length)


def cut_microbatches(data: Sequence[types.Datum], order: Sequence[int], budget: int,
                     multiple: int = 1) -> list[Microbatch]:
    """The datums in `order`, cut greedily into microbatches whose padded length x size fits
    `budget` tokens, each padded to its longest datum rounded up to a multiple of `multiple`."""
    def padded(length: int) -> int:
        return -(-length // multiple) * multiple

    mbs: list[Microbatch] = []
    mb: list[int] = []
    longest = 0  # mb's longest datum
    for i in order:
        L = data[i].model_input.length
        if mb and (len(mb) + 1) * padded(max(longest, L)) > budget:
            mbs.append(Microbatch.of(data, mb, padded(longest)))
            mb, longest = [], 0
        mb.append(i)
        longest = max(longest, L)
    if mb:
        mbs.append(Microbatch.of(data, mb, padded(longest)))
    return mbs


def _symbolic_trainable(module, args, embeds: torch.Tensor) -> torch.Tensor:
    """The embedding's output as the compiled layers take it (`Learner.compiled_layers`): requiring
    grad, as every later layer's input does, with its rows and positions symbolic from the first
    compile (else dynamo compiles the first shape static and a second graph for the next)."""
    import torch._dynamo

    torch._dynamo.maybe_mark_dynamic(embeds, 0)
    torch._dynamo.maybe_mark_dynamic(embeds, 1)
    return embeds.requires_grad_(True)


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
