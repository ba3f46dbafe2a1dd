"""Rows of many LoRA adapters in one batch on one base model: the adapter bank.

Each adapted projection computes, for a row n of adapter a(n), `y_n = W x_n + s_a B_a (A_a x_n)`
(peft's LoRA: A [r, in], B [out, r], s = alpha / r). For one batch the bank stacks the adapters
of its rows into slots, per projection `A_K = [A_0; A_1; ...]` [K, in] and `B_K = [B_0 B_1 ...]`
[out, K] (K = slots x rank, each adapter's rank padded with zeros), and gives each row a one-hot
over the K stacked ranks that selects its own slot:

    y_n = W x_n + s_n * ((x_n A_K^T) * onehot_n) B_K^T

Two matmuls per projection whatever the number of adapters, and static shapes, so the decode
step stays one CUDA graph. The products of the other slots' columns are exact zeros, so a row's
addon is its own adapter's. The price is FLOPs: rows x K instead of rows x rank (Punica's BGMV
and S-LoRA gather each row's own adapter in one kernel instead). Measured on an H200 with the
stacks in float32 (results/h200-multi-adapter): 8.4 ms per step at 2 adapters x 64 rows, 24.7 ms
at 6 x 64, where the dense addon's float32 matmuls are a large part (`bank_dtype`).

The bank serves inference only (`serving`): peft's own per-adapter path is switched off for its
length and a forward hook on every peft `lora.Linear` adds the bank's addon. Training never sees
it: there each client's adapter is peft's active one, on its own.
"""

from __future__ import annotations

import functools
import itertools
from contextlib import contextmanager
from dataclasses import dataclass

import torch

_ids = itertools.count()
# Slots the stacks hold at least: a run's preflight and two arms share one bank width, so one
# compiled decode graph per row count (a width change is a new graph to compile).
MIN_SLOTS = 2


def bank_dtype(base_dtype: torch.dtype) -> torch.dtype:
    """The stacks' precision: float32 (float64 on a float64 base), as peft keeps the adapters.
    Not the base's half precision: on a bf16 base that moved the sampled logprobs 0.025 from
    peft's path on average, against 3e-6 in float32 (tests/test_multi_adapter.py's adapters)."""
    return torch.promote_types(base_dtype, torch.float32)


@dataclass(frozen=True, eq=False)
class AdapterWeights:
    """One adapter's LoRA weights as the sampler reads them (a sampling client's snapshot):
    copies, so later optim steps never change them. `layers[i]` is (A [r, in], B [out, r]) of
    the bank's projection `names[i]`, or None where the adapter has none."""

    names: tuple[str, ...]
    layers: tuple[tuple[torch.Tensor, torch.Tensor] | None, ...]
    rank: int
    scale: float
    id: int = -1

    @classmethod
    def of(cls, names, layers, rank: int, scale: float) -> "AdapterWeights":
        return cls(tuple(names), tuple(layers), int(rank), float(scale), next(_ids))


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


class AdapterBank:
    """The stacked adapters of the batch being served, and the hooks that add them."""

    def __init__(self) -> None:
        self.layers: list[torch.nn.Module] = []  # peft lora.Linear modules, model order
        self.names: list[str] = []
        self.index: dict[str, int] = {}
        self.on = False
        # bumped whenever the stacks or row buffers are new tensors: a captured decode graph
        # reads them by address, so the generator keys its graphs by this
        self.version = 0
        self.dtype = torch.float32
        self.A_K: list[torch.Tensor] = []  # per layer [K, in], the adapters' dtype
        self.B_K: list[torch.Tensor] = []  # per layer [out, K]
        self.K = 0
        self._loaded: tuple = ()
        self._stack_shape: tuple[int, int] = (0, 0)
        self.onehot_N_K: torch.Tensor | None = None
        self.scale_N: torch.Tensor | None = None
        self._rows: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}

    # --- the model's adapted projections -------------------------------------------------
    def refresh(self, model) -> None:
        """Find the model's peft lora.Linear modules (peft adds some when an adapter targets new
        ones) and hook the new ones; drops the stacks when the set changed."""
        from peft.tuners.lora import Linear as LoraLinear

        found = [(n, m) for n, m in model.named_modules() if isinstance(m, LoraLinear)]
        if [n for n, _ in found] == self.names:
            return
        known = {id(m) for m in self.layers}
        for name, m in found:
            if id(m) not in known:
                m.register_forward_hook(functools.partial(_add_bank, self, name))
        self.layers = [m for _, m in found]
        self.names = [n for n, _ in found]
        self.index = {n: i for i, n in enumerate(self.names)}
        self.dtype = bank_dtype(self.layers[0].base_layer.weight.dtype) if found else torch.float32
        self.A_K, self.B_K, self.K, self._loaded, self._stack_shape = [], [], 0, (), (0, 0)
        self._rows.clear()
        self.version += 1

    def weights_of(self, adapter: str) -> AdapterWeights:
        """A copy of peft adapter `adapter`'s current weights."""
        layers, rank, scale = [], 0, 0.0
        for m in self.layers:
            if adapter in m.lora_A:
                a = m.lora_A[adapter].weight.detach().to(self.dtype).clone()
                b = m.lora_B[adapter].weight.detach().to(self.dtype).clone()
                layers.append((a, b))
                rank, scale = a.shape[0], float(m.scaling[adapter])
            else:
                layers.append(None)
        return AdapterWeights.of(self.names, layers, rank, scale)

    # --- one batch ------------------------------------------------------------------------
    def load(self, adapters: list[AdapterWeights | None]) -> list[int]:
        """Stack the distinct adapters of a batch's rows (first appearance order) into slots;
        each row's slot, -1 for the bare base model."""
        distinct: dict[int, AdapterWeights] = {}
        for a in adapters:
            if a is not None:
                distinct.setdefault(a.id, a)
        slots = list(distinct)
        row_slots = [-1 if a is None else slots.index(a.id) for a in adapters]
        if not self.layers:
            return row_slots
        # Slots and rank only grow (powers of two): a change of K is a new decode graph to
        # compile, so a run settles on one K early and keeps it.
        S = max(self._stack_shape[0], _pow2(max(MIN_SLOTS, len(slots))))
        R = max(self._stack_shape[1], 8, _pow2(max((a.rank for a in distinct.values()), default=1)))
        if self._stack_shape != (S, R):
            dev = self.layers[0].base_layer.weight.device
            self.A_K = [torch.zeros(S * R, m.in_features, dtype=self.dtype, device=dev) for m in self.layers]
            self.B_K = [torch.zeros(m.out_features, S * R, dtype=self.dtype, device=dev) for m in self.layers]
            self.K, self._stack_shape, self._loaded = S * R, (S, R), ()
            self._rows.clear()
            self.version += 1
        key = tuple(slots)
        if key != self._loaded:
            with torch.no_grad():
                for i in range(len(self.layers)):
                    self.A_K[i].zero_()
                    self.B_K[i].zero_()
                for s, a in enumerate(distinct.values()):
                    if a.names != tuple(self.names):
                        a = self._realign(a)
                    for i, w in enumerate(a.layers):
                        if w is not None:
                            r = w[0].shape[0]
                            self.A_K[i][s * R : s * R + r].copy_(w[0])
                            self.B_K[i][:, s * R : s * R + r].copy_(w[1])
            self._loaded = key
        self._scales = [a.scale for a in distinct.values()]
        return row_slots

    def _realign(self, a: AdapterWeights) -> AdapterWeights:
        """`a` laid out on this bank's projections (taken before peft wrapped more of them)."""
        layers: list = [None] * len(self.names)
        for name, w in zip(a.names, a.layers):
            layers[self.index[name]] = w
        return AdapterWeights(tuple(self.names), tuple(layers), a.rank, a.scale, a.id)

    def use_rows(self, row_slots: list[int], persistent: bool = False) -> None:
        """Select each row's slot for the forwards that follow. `persistent`: in buffers kept per
        row count and filled in place, which a captured CUDA graph reads."""
        if not self.layers or self.K == 0:
            self.onehot_N_K = self.scale_N = None
            return
        n, R = len(row_slots), self._stack_shape[1]
        dev = self.A_K[0].device
        onehot = torch.zeros(n, self.K, dtype=self.dtype)
        scale = torch.zeros(n, 1, dtype=self.dtype)
        for row, s in enumerate(row_slots):
            if s >= 0:
                onehot[row, s * R : (s + 1) * R] = 1.0
                scale[row, 0] = self._scales[s]
        if persistent:
            buf = self._rows.get((n, self.K))
            if buf is None:
                buf = self._rows[(n, self.K)] = (torch.zeros(n, self.K, dtype=self.dtype, device=dev),
                                                 torch.zeros(n, 1, dtype=self.dtype, device=dev))
            buf[0].copy_(onehot)
            buf[1].copy_(scale)
            self.onehot_N_K, self.scale_N = buf
        else:
            self.onehot_N_K, self.scale_N = onehot.to(dev), scale.to(dev)

    @contextmanager
    def serving(self):
        """Inference through the bank: peft's adapter path off, the bank's hooks on."""
        flags = [m._disable_adapters for m in self.layers]
        for m in self.layers:
            m._disable_adapters = True  # not disable_adapter_layers(): that flips requires_grad
        self.on = True
        try:
            yield self
        finally:
            self.on = False
            for m, f in zip(self.layers, flags):
                m._disable_adapters = f


def _add_bank(bank: AdapterBank, name: str, module, args, out):
    """The forward hook of one adapted projection: its rows' adapter addon, in peft's numerics
    (input cast to the bank's precision, one rounding of the sum to the output's dtype)."""
    if not bank.on or bank.onehot_N_K is None:
        return None
    i = bank.index[name]
    x = args[0].to(bank.dtype)
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (-1,)
    h = (x @ bank.A_K[i].T) * bank.onehot_N_K.view(shape)
    addon = (h @ bank.B_K[i].T) * bank.scale_N.view(shape)
    acc = torch.promote_types(out.dtype, torch.float32)
    return (out.to(acc) + addon.to(acc)).to(out.dtype)
