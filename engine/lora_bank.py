"""Rows of many LoRA adapters in one batch on one base model: the adapter bank.

Each adapted projection computes, for a row n of adapter a(n), `y_n = W x_n + s_a B_a (A_a x_n)`
(peft's LoRA: A [r, in], B [out, r], s = alpha / r). The bank gives every row its own adapter's
addon. A batch's distinct adapters are its slots.

- **Per slot** (eager forwards: prefill, scoring, CPU decode): per projection the addon of slot s
  is `F.linear(F.linear(x_s, A_s), B_s) * s_s` over that slot's rows alone (`index_select` /
  `index_copy_`) -- peft's own calls on those rows, at a row's own rank's FLOPs.

The static-cache decode step (captured as a CUDA graph) needs static shapes and reads its tensors
by address, so it has its own forms (`DECODE_FORMS`, `EngineSettings.bank_decode`):

- **dense**: the slots stacked, `A_K = [A_0; A_1; ...]` [K, in] and `B_K = [B_0 B_1 ...]` [out, K]
  (K = slots x R, ranks padded with zeros), and a one-hot per row over the K stacked ranks:
  `y_n = W x_n + s_n ((x_n A_K^T) * onehot_n) B_K^T`. Two matmuls whatever the slots; FLOPs rows x
  K. On an H200 (results/h200-multi-adapter) 8.4 ms per step at 2 adapters x 64 rows; at 12 the
  float32 stack matmuls are half of the step (eager-captured: 51.9 ms, session4).
- **tiled**: the generator lays rows out in tiles of `tile_rows` rows of one slot each
  (`tile_layout`), the bank copies each tile's adapter into per-tile stacks, and the addon is
  batched matmuls over the tiles: FLOPs rows x R. The shrink `x_T A_T^T` (output 64 x R, reduction
  over `in`) is split along `in` into chunks of `split_cols` summed after, because a batched GEMM
  runs one thread block per output tile and never splits the reduction: unsplit, the tiled step
  measured 22 ms at 2 adapters x 64 rows against dense's 8.4. Split, it is the default: compiled,
  8.7 / 15.1 / 25.0 ms per step at 1 / 6 / 12 adapters x 64 rows (session4).

The bank serves inference (`serving`): peft's own per-adapter path is switched off for its
length and a forward hook on every peft `lora.Linear` adds the bank's addon. The learner (`training`)
goes through the same hook with one adapter, the one being trained, as `LoraAddon`: peft's
arithmetic (input cast to the adapter's float32, shrink, expand, scale, one rounding of the sum to
the output's dtype) with the scaled add fused into the expand's GEMM and only the bf16 input kept
for backward -- peft's path writes and saves a float32 copy of every projection's input and makes
four elementwise passes over every output (half the learner's CUDA time on an H200,
results/h200-multi-adapter/session3).
"""

from __future__ import annotations

import functools
import itertools
from contextlib import contextmanager
from dataclasses import dataclass

import torch

_ids = itertools.count()


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


TILE_ROWS = 64  # rows per tile of the tiled decode: an arm's 64 rollouts of a step fill one
SPLIT_COLS = 256  # the tiled shrink's reduction chunk (columns of `in`)
DECODE_FORMS = ("dense", "tiled")
# tiled: on the H200 (results/h200-multi-adapter/session4) its captured step took 21.2 / 33.4 ms at 6 / 12
# adapters x 64 rows against dense's 25.2 / 51.9, and 13.7 against 12.6 at one adapter
DEFAULT_DECODE_FORM = "tiled"
MIN_SLOTS = 2  # the dense stacks' slots at least: a preflight and two arms share one width


def tile_layout(slots_N: list[int], tile_rows: int) -> list[int | None]:
    """The tiled decode's row order: row indices grouped by slot (first-appearance order, each
    group in its own order), each group padded with None to a multiple of `tile_rows`."""
    groups: dict[int, list[int | None]] = {}
    for n, s in enumerate(slots_N):
        groups.setdefault(s, []).append(n)
    order: list[int | None] = []
    for rows in groups.values():
        order += rows + [None] * (-len(rows) % tile_rows)
    return order


def _chunks(cols: int, split_cols: int) -> int:
    """How many chunks the tiled shrink splits a reduction over `cols` columns into."""
    return cols // split_cols if cols > split_cols and cols % split_cols == 0 else 1


@dataclass
class _Dense:
    """The dense decode form's stacks and per-row one-hots, filled in place per batch."""

    A_K: list[torch.Tensor]  # per projection [S*R, in]
    B_K: list[torch.Tensor]  # per projection [out, S*R]
    onehot_N_K: torch.Tensor  # [rows, S*R]
    scale_N: torch.Tensor  # [rows, 1]
    loaded: tuple = ()


@dataclass
class _Tiles:
    """The tiled decode form's per-tile stacks, filled in place per batch."""

    A_T: list[torch.Tensor]  # per projection [tiles, chunks, in/chunks, R]: A^T split along `in`
    B_T: list[torch.Tensor]  # per projection [tiles, R, out]: B^T
    scale_N: torch.Tensor  # [rows, 1]
    loaded: tuple = ()


class AdapterBank:
    """The adapters of the batch being served, and the hooks that add them."""

    def __init__(self, decode_form: str = DEFAULT_DECODE_FORM, tile_rows: int = TILE_ROWS, split_cols: int = SPLIT_COLS) -> None:
        if decode_form not in DECODE_FORMS:
            raise ValueError(f"bank decode form {decode_form!r}: one of {', '.join(DECODE_FORMS)}")
        self.decode_form = decode_form
        self.layers: list[torch.nn.Module] = []  # peft lora.Linear modules, model order
        self.names: list[str] = []
        self.index: dict[str, int] = {}
        self.on = False
        self.tile_rows = tile_rows
        self.split_cols = split_cols
        # bumped whenever the decode buffers are new tensors: a captured decode graph reads them by
        # address, so the generator keys its graphs by this
        self.version = 0
        self.dtype = torch.float32
        self.slots: list[AdapterWeights] = []  # the batch's distinct adapters
        # per slot: its rows (None: every row of the forward), for the per-slot form
        self.groups: list[tuple[int, torch.Tensor | None]] = []
        # set: the forwards that follow are the static decode's, in its form
        self.decode_bufs: _Tiles | _Dense | None = None
        self._decode_bufs_by_shape: dict[tuple, _Tiles | _Dense] = {}
        self._rank = 8  # the decode stacks' rank: only grows (a new rank is a new decode graph)
        self._slots = MIN_SLOTS  # the dense stacks' slots: only grow
        self.train_adapter: str | None = None  # set: the learner's forwards (`training`)

    # --- the model's adapted projections -------------------------------------------------
    def refresh(self, model) -> None:
        """Find the model's peft lora.Linear modules (peft adds some when an adapter targets new
        ones) and hook the new ones; drops the decode buffers when the set changed."""
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
        self.slots, self.groups, self.decode_bufs = [], [], None
        self._decode_bufs_by_shape.clear()
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
        """The distinct adapters of a batch's rows (first appearance order) become its slots;
        returns each row's slot, -1 for the bare base model."""
        distinct: dict[int, AdapterWeights] = {}
        for a in adapters:
            if a is not None:
                distinct.setdefault(a.id, a if a.names == tuple(self.names) else self._realign(a))
        ids = list(distinct)
        self.slots = list(distinct.values())
        return [-1 if a is None else ids.index(a.id) for a in adapters]

    def _realign(self, a: AdapterWeights) -> AdapterWeights:
        """`a` laid out on this bank's projections (taken before peft wrapped more of them)."""
        layers: list = [None] * len(self.names)
        for name, w in zip(a.names, a.layers):
            layers[self.index[name]] = w
        return AdapterWeights(tuple(self.names), tuple(layers), a.rank, a.scale, a.id)

    def use_rows(self, row_slots: list[int]) -> None:
        """The per-slot form for the forwards that follow: each slot's rows."""
        self.decode_bufs = None
        self.groups = []
        if not self.layers:
            return
        dev = self.layers[0].base_layer.weight.device
        for s in range(len(self.slots)):
            rows = [n for n, t in enumerate(row_slots) if t == s]
            if rows:
                every = len(rows) == len(row_slots)
                self.groups.append((s, None if every else torch.tensor(rows, dtype=torch.long, device=dev)))

    @property
    def tiled(self) -> bool:
        """Whether the static decode wants its rows laid out in tiles (`tile_layout`)."""
        return self.decode_form == "tiled" and bool(self.layers)

    def use_decode_rows(self, row_slots: list[int]) -> None:
        """The static decode's form for the forwards that follow (a captured graph reads its
        buffers by address): they are filled in place, new tensors (a new version) only for a
        new shape. Tiled: the rows must be laid out by `tile_layout`."""
        self.groups = []
        if not self.layers:
            self.decode_bufs = None
            return
        self._rank = max(self._rank, _pow2(max((a.rank for a in self.slots), default=1)))
        self.decode_bufs = self._tiled(row_slots) if self.decode_form == "tiled" else self._dense(row_slots)

    def _buffers(self, shape: tuple, make):
        bufs = self._decode_bufs_by_shape.get(shape)
        if bufs is None:
            self._decode_bufs_by_shape.clear()  # one row count's buffers live at a time, as the decoder's cache
            bufs = self._decode_bufs_by_shape[shape] = make()
            self.version += 1
        return bufs

    def _dense(self, row_slots: list[int]) -> _Dense:
        self._slots = max(self._slots, _pow2(len(self.slots)))
        S, R, N = self._slots, self._rank, len(row_slots)
        dev = self.layers[0].base_layer.weight.device
        d = self._buffers(("dense", S, R, N), lambda: _Dense(
            A_K=[torch.zeros(S * R, m.in_features, dtype=self.dtype, device=dev) for m in self.layers],
            B_K=[torch.zeros(m.out_features, S * R, dtype=self.dtype, device=dev) for m in self.layers],
            onehot_N_K=torch.zeros(N, S * R, dtype=self.dtype, device=dev),
            scale_N=torch.zeros(N, 1, dtype=self.dtype, device=dev)))
        key = (tuple(a.id for a in self.slots), tuple(row_slots))
        if key != d.loaded:
            with torch.no_grad():
                for i in range(len(self.layers)):
                    d.A_K[i].zero_()
                    d.B_K[i].zero_()
                    for s, a in enumerate(self.slots):
                        w = a.layers[i]
                        if w is not None:
                            r = w[0].shape[0]
                            d.A_K[i][s * R:s * R + r].copy_(w[0])
                            d.B_K[i][:, s * R:s * R + r].copy_(w[1])
                onehot = torch.zeros(N, S * R, dtype=self.dtype)
                scale = torch.zeros(N, 1, dtype=self.dtype)
                for n, s in enumerate(row_slots):
                    if s >= 0:
                        onehot[n, s * R:(s + 1) * R] = 1.0
                        scale[n, 0] = self.slots[s].scale
                d.onehot_N_K.copy_(onehot)
                d.scale_N.copy_(scale)
            d.loaded = key
        return d

    def _tiled(self, row_slots: list[int]) -> _Tiles:
        T = self.tile_rows
        if len(row_slots) % T:
            raise ValueError(f"a tiled batch holds whole tiles of {T} rows, not {len(row_slots)}")
        tile_slots = tuple(row_slots[t * T] for t in range(len(row_slots) // T))
        for t, s in enumerate(tile_slots):
            if any(x != s for x in row_slots[t * T:(t + 1) * T]):
                raise ValueError(f"tile {t} mixes slots: rows must be laid out by `tile_layout`")
        n, R = len(tile_slots), self._rank
        dev = self.layers[0].base_layer.weight.device

        def make() -> _Tiles:
            A_T = []
            for m in self.layers:
                c = _chunks(m.in_features, self.split_cols)
                A_T.append(torch.zeros(n, c, m.in_features // c, R, dtype=self.dtype, device=dev))
            return _Tiles(A_T=A_T, B_T=[torch.zeros(n, R, m.out_features, dtype=self.dtype, device=dev) for m in self.layers],
                          scale_N=torch.zeros(len(row_slots), 1, dtype=self.dtype, device=dev))

        tiles = self._buffers(("tiled", n, R, len(row_slots)), make)
        key = tuple((s, self.slots[s].id if s >= 0 else None) for s in tile_slots)
        if key != tiles.loaded:
            with torch.no_grad():
                for i in range(len(self.layers)):
                    tiles.A_T[i].zero_()
                    tiles.B_T[i].zero_()
                    _, c, k, _ = tiles.A_T[i].shape
                    for t, s in enumerate(tile_slots):
                        w = self.slots[s].layers[i] if s >= 0 else None
                        if w is not None:
                            r = w[0].shape[0]
                            tiles.A_T[i][t, :, :, :r].copy_(w[0].T.reshape(c, k, r))
                            tiles.B_T[i][t, :r].copy_(w[1].T)
                scale = torch.tensor([[self.slots[s].scale if s >= 0 else 0.0] for s in row_slots], dtype=self.dtype)
                tiles.scale_N.copy_(scale)
            tiles.loaded = key
        return tiles

    @contextmanager
    def _hooks_only(self):
        """peft's own adapter path off on every adapted projection (the bank's hooks add instead)."""
        flags = [m._disable_adapters for m in self.layers]
        for m in self.layers:
            m._disable_adapters = True  # not disable_adapter_layers(): that flips requires_grad
        try:
            yield
        finally:
            for m, f in zip(self.layers, flags):
                m._disable_adapters = f

    @contextmanager
    def training(self, adapter: str, in_out_dtype: bool = False):
        """The learner's forwards through `LoraAddon` for peft adapter `adapter` alone (its
        gradients flow; peft's own path is off meanwhile). Spans forward and backward, so a
        checkpointed layer's recompute takes the same path. Each projection the adapter adapts
        holds it as `trained` (`_Trained`) meanwhile: the hook finds its weights there by position,
        not by the adapter's name, so a compiled learner (`local.learner.Learner.compiled_layers`)
        has one graph for every adapter. `in_out_dtype`: the addon in the base's dtype
        (`LoraAddon`)."""
        adapted = [m for m in self.layers if adapter in m.lora_A]
        with self._hooks_only():
            for m in adapted:
                m.trained = _Trained(m.lora_A[adapter], m.lora_B[adapter], float(m.scaling[adapter]), in_out_dtype)
            self.train_adapter = adapter
            try:
                yield self
            finally:
                self.train_adapter = None
                for m in adapted:
                    del m.trained

    @contextmanager
    def serving(self):
        """Inference through the bank: peft's adapter path off, the bank's hooks on."""
        with self._hooks_only():
            self.on = True
            try:
                yield self
            finally:
                self.on = False


class LoraAddon(torch.autograd.Function):
    """`out_N + scale * (x_N A^T) B^T` for one adapter over rows (`lora_addon` flattens them),
    rounded once to `out_N`'s dtype: peft's LoRA forward (x cast to A's dtype, the sum in float32)
    with the scaled add fused into the expand (`addmm`). Saves x as it came (the base projection
    keeps the same tensor) and the small shrink; backward recasts x for A's gradient. Gradients as
    peft's path gives them: `out_N` gets the output's gradient as it is, x the addon's gradient
    rounded to x's dtype.

    `in_out_dtype=True` (`learner_lora="fused-base"`): the same sum with every operand in `out_N`'s
    dtype (bf16 on CUDA), A and B cast down, their gradients cast back up: no [tokens x width]
    float32 copy of x, of the output or of its gradient. The expand still sums in float32 inside
    the GEMM and rounds the output once; the shrink and the gradients round to bf16. Where `out_N`
    is float32 (the CPU) both forms are the same arithmetic.

    The forward changes no tensor in place (no `out=`): torch 2.11's compiled autograd.Function
    can send the gradient of an output its forward wrote in place to the wrong slot, and the
    backward then sees zeros (pytorch/pytorch#180642, fixed in 2.12). Not the whole story on the
    H100's torch 2.11: `fused-base` through the compiled layers got no gradient before and after
    this form (results/h200-engine/h100-s28; `settings.learner_lora_caveat` warns of it)."""

    @staticmethod
    def forward(ctx, x_N, out_N, A, B, scale: float, in_out_dtype: bool = False):
        dt = out_N.dtype if in_out_dtype else torch.promote_types(out_N.dtype, A.dtype)
        h_N = torch.nn.functional.linear(x_N.to(dt), A.to(dt))
        y_N = torch.addmm(out_N.to(dt), h_N, B.T.to(dt), alpha=scale)
        ctx.save_for_backward(x_N, h_N, A, B)
        ctx.scale = scale
        return y_N.to(out_N.dtype)

    @staticmethod
    def backward(ctx, grad_y_N):
        x_N, h_N, A, B = ctx.saved_tensors
        s, dt = ctx.scale, h_N.dtype  # the shrink was made in the forward's arithmetic dtype
        need_x, need_out, need_A, need_B = ctx.needs_input_grad[:4]
        g_N = grad_y_N.to(dt)
        grad_x = grad_A = grad_B = None
        if need_B:
            grad_B = ((g_N.T @ h_N) * s).to(B.dtype)
        if need_x or need_A:
            gh_N = (g_N @ B.to(dt)) * s
            if need_A:
                grad_A = (gh_N.T @ x_N.to(dt)).to(A.dtype)
            if need_x:
                grad_x = (gh_N @ A.to(dt)).to(x_N.dtype)
        return grad_x, (grad_y_N if need_out else None), grad_A, grad_B, None, None


def lora_addon(x, out, A, B, scale: float, in_out_dtype: bool = False):
    """`LoraAddon` over x's and out's rows (every leading dimension flattened), given out's shape
    back as a view made here, outside the Function: a caller may change it in place (the LM
    head's chunked logprobs do), which autograd refuses for a view made inside one."""
    y_N = LoraAddon.apply(x.reshape(-1, x.shape[-1]), out.reshape(-1, out.shape[-1]), A, B, scale, in_out_dtype)
    return y_N.view(out.shape)


class _Trained(torch.nn.Module):
    """The trained adapter's shrink and expand of one projection, and its scale, while it trains
    (`AdapterBank.training`): the same modules as peft's, held at a fixed place."""

    def __init__(self, A: torch.nn.Module, B: torch.nn.Module, scale: float, in_out_dtype: bool = False):
        super().__init__()
        self.A, self.B, self.scale = A, B, scale
        self.in_out_dtype = in_out_dtype  # `LoraAddon` in the output's dtype (`learner_lora="fused-base"`)


def _add_bank(bank: AdapterBank, name: str, module, args, out):
    """The forward hook of one adapted projection: its rows' adapter addon, in peft's numerics
    (input cast to the bank's precision, one rounding of the sum to the output's dtype); in
    training, the trained adapter's (`LoraAddon`)."""
    t = getattr(module, "trained", None)  # never the adapter's name: a compiled learner would guard on it
    if t is not None:
        return lora_addon(args[0], out, t.A.weight, t.B.weight, t.scale, t.in_out_dtype)
    if not bank.on or (bank.decode_bufs is None and not bank.groups):
        return None
    i = bank.index[name]
    x = args[0].to(bank.dtype)
    F = torch.nn.functional
    view = (x.shape[0],) + (1,) * (x.dim() - 1)
    d = bank.decode_bufs
    if isinstance(d, _Tiles):
        A_T, B_T = d.A_T[i], d.B_T[i]
        n, c, k, _ = A_T.shape
        x_T = x.reshape(n, -1, c, k).transpose(1, 2)  # rows are tile-contiguous: [tiles, chunks, rows, k]
        h_T = torch.matmul(x_T, A_T).sum(1)  # the shrink, its reduction split in chunks
        addon = torch.bmm(h_T, B_T).reshape(out.shape) * d.scale_N.view(view)
    elif isinstance(d, _Dense):
        h = (x @ d.A_K[i].T) * d.onehot_N_K.view(view[:-1] + (-1,))
        addon = (h @ d.B_K[i].T) * d.scale_N.view(view)
    else:
        addon = None
        for s, rows in bank.groups:
            a = bank.slots[s]
            w = a.layers[i]
            if w is None:
                continue
            x_s = x if rows is None else x.index_select(0, rows)
            y_s = F.linear(F.linear(x_s, w[0]), w[1]) * a.scale
            if rows is None:
                addon = y_s
            else:
                if addon is None:
                    addon = torch.zeros(out.shape, dtype=y_s.dtype, device=y_s.device)
                addon.index_copy_(0, rows, y_s)
        if addon is None:
            return None
    acc = torch.promote_types(out.dtype, torch.float32)
    return (out.to(acc) + addon.to(acc)).to(out.dtype)
