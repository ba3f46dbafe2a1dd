"""Batched generation with a KV cache, counter-based sampling, and token scoring.

`generate(model, rows, ...)` runs one left-padded batch: one prefill per distinct prompt (the
rows of a `num_samples > 1` request, or any rows with equal prompts, share it: its KV cache and
last logits are copied out to each of them), then one decode step per new token over the whole
batch with the KV cache (`DynamicCache` on CPU; on CUDA a preallocated static KV cache whose
decode step is captured once as a CUDA graph and replayed for every later token and batch of
the same shape). Rows that ask for `prompt_logprobs` get them from the same prefill.

`Generator._generate` in steps, after gpt-fast's generate.py: `_pack` (prompts to the device),
the decoder (one interface, `step(tok_B, pos_B, cur) -> logits_B`: `_EagerDecoder` on a
DynamicCache, or `_GraphedDecoder` on a static cache, replaying its CUDA graph) and `_prefill`
(a static cache is made first and filled a chunk of prompts at a time: `PREFILL_POSITIONS`), the loop
`_decode` (sample_step, `_Progress.record` -- the stop check --, decoder step), and
`_Progress.results` (unpack). A static decoder whose rows still decoding fit in half of its rows
hands them to a smaller one (`_compacted`): rows that stop early stop costing decode steps.

Randomness is counter-based: row r draws its step-t uniform from splitmix64(key_r, t), so a
row's tokens depend only on its own key and logits, never on which other requests shared its
batch or on a global RNG. Sampling is inverse-CDF over softmax(logits / T) in float64.

Logprobs returned for sampled tokens are those of the distribution the token was drawn from:
log_softmax(logits / T) (after top-k / top-p truncation, when asked). At T = 1 that is exactly
the learner's log-probability. At T = 0 (greedy) they are the untempered log_softmax(logits).
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections import Counter
from dataclasses import dataclass, field

import torch

from engine.lora_bank import tile_layout

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _signed(x: int) -> int:
    x &= _MASK64
    return x - (1 << 64) if x >= (1 << 63) else x


def splitmix64(x: int) -> int:
    """The splitmix64 finaliser on Python ints (uint64 semantics)."""
    z = (x + _GOLDEN) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def _srl(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 tensors (torch's >> is arithmetic)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def splitmix64_t(x: torch.Tensor) -> torch.Tensor:
    """splitmix64 on int64 tensors (two's-complement wraparound == uint64 arithmetic)."""
    z = x + _signed(_GOLDEN)
    z = (z ^ _srl(z, 30)) * _signed(0xBF58476D1CE4E5B9)
    z = (z ^ _srl(z, 27)) * _signed(0x94D049BB133111EB)
    return z ^ _srl(z, 31)


def row_key(request_key: int, sample_idx: int) -> int:
    return _signed(splitmix64(splitmix64(request_key & _MASK64) ^ sample_idx))


def uniforms(keys_B: torch.Tensor, step: int) -> torch.Tensor:
    """One U[0,1) float64 per row for decode step `step`."""
    h = splitmix64_t(keys_B + _signed(step * _GOLDEN))
    return _srl(h, 11).to(torch.float64) * (2.0**-53)


@dataclass
class Row:
    prompt: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    stop_ids: tuple[int, ...] = ()
    stop_strs: tuple[str, ...] = ()
    key: int = 0
    prompt_logprobs: bool = False  # also return the prompt's own logprobs (first entry None)
    adapter: object = None  # its LoRA adapter's weights (`lora_bank.AdapterWeights`); None: the base


@dataclass
class RowResult:
    tokens: list[int]
    logprobs: list[float]
    stop_reason: str  # "stop" | "length"
    prompt_logprobs: list[float | None] | None = None


@dataclass
class GenStats:
    batches: int = 0
    rows: int = 0
    prefill_rows: int = 0  # distinct prompts prefilled
    decode_steps: int = 0
    sampled_tokens: int = 0
    graphed_batches: int = 0
    row_steps: int = 0  # decode steps x the decoder's rows (pads included): the decode's work
    compactions: int = 0  # times a batch's live rows moved to a smaller static decoder
    prefill_s: float = 0.0
    decode_s: float = 0.0
    extra: dict = field(default_factory=dict)


def _truncate(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask logits outside each row's top-k / nucleus (top_k <= 0 and top_p >= 1 keep all)."""
    V = scaled.shape[-1]
    sorted_l, idx = scaled.sort(dim=-1, descending=True)
    rank = torch.arange(V, device=scaled.device)[None, :]
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, V))
    drop = rank >= k[:, None]
    probs = sorted_l.softmax(-1)
    before = probs.cumsum(-1) - probs  # mass strictly above this token
    drop |= before >= top_p[:, None]
    drop[:, 0] = False
    sorted_l = sorted_l.masked_fill(drop, float("-inf"))
    return torch.empty_like(scaled).scatter_(-1, idx, sorted_l)


DRAW_BLOCK_MAX = 1024  # the blocked draw's block: the largest power of two up to this dividing V
DRAW_BLOCK_MIN = 64  # ... and at least this (else the one scan over V)


def _draw_block(V: int) -> int | None:
    b = min(V & -V, DRAW_BLOCK_MAX)
    return b if b >= DRAW_BLOCK_MIN else None


def _draw(lp_B_V: torch.Tensor, u_B: torch.Tensor) -> torch.Tensor:
    """Each row's token by inverse CDF in float64: the first token whose cumulative probability
    exceeds u x the total. In two levels where V allows (`_draw_block`; Qwen's 151,936 = 1,187
    blocks of 128): the block by the scan over the blocks' float64 sums, then the token by the scan
    inside that block alone. The one float64 scan over V wrote and read 16 bytes a token a row
    (sampling was 4 ms of a 33.5 ms decode step at 1,024 rows, h100-s25). Same draw but for the
    summation order: u within ~1e-16 of a boundary may fall the other side (the CUDA scan's order
    was never fixed either: the deterministic mode has `_draw_fixed_point`)."""
    B, V = lp_B_V.shape
    blk = _draw_block(V)
    if blk is None:
        cdf_B_V = lp_B_V.exp().to(torch.float64).cumsum(-1)
        target_B = u_B * cdf_B_V[:, -1]
        return torch.searchsorted(cdf_B_V, target_B[:, None], right=True).squeeze(1).clamp_max(V - 1)
    p_B_N_K = lp_B_V.exp().view(B, V // blk, blk)
    cdf_B_N = p_B_N_K.sum(-1, dtype=torch.float64).cumsum(-1)
    target_B = u_B * cdf_B_N[:, -1]
    n_B = torch.searchsorted(cdf_B_N, target_B[:, None], right=True).squeeze(1).clamp_max(V // blk - 1)
    before_B = cdf_B_N.gather(1, (n_B - 1).clamp_min(0)[:, None]).squeeze(1).masked_fill(n_B == 0, 0.0)
    inner_B_K = p_B_N_K[torch.arange(B, device=n_B.device), n_B].to(torch.float64).cumsum(-1)
    k_B = torch.searchsorted(inner_B_K, (target_B - before_B)[:, None], right=True).squeeze(1).clamp_max(blk - 1)
    return n_B * blk + k_B


# The deterministic mode's draw (engine/determinism.py): probabilities in units of 2^-50, so
# the cumulative sum is an integer one (exact, any order; torch's float cumsum on CUDA has no
# deterministic form). It draws what the float64 scan draws unless u falls within ~V * 2^-50 of a
# token's boundary; a token below 2^-50 is never drawn.
FIXED_POINT_BITS = 50


def _draw_fixed_point(lp_all: torch.Tensor, u_B: torch.Tensor) -> torch.Tensor:
    mass = (lp_all.exp().to(torch.float64) * 2.0**FIXED_POINT_BITS).floor().to(torch.int64)
    cdf = mass.cumsum(-1)
    target = (u_B * cdf[:, -1].to(torch.float64)).floor().to(torch.int64)
    return torch.searchsorted(cdf, target[:, None], right=True).squeeze(1).clamp_max(lp_all.shape[-1] - 1)


def sample_step(
    logits: torch.Tensor,  # [B, V] float32
    temps: torch.Tensor,  # [B] float32, 0 = greedy
    keys: torch.Tensor,  # [B] int64
    step: int,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    any_greedy: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`any_greedy` (known on the host) saves a device sync per step."""
    greedy = temps <= 0
    scaled = logits / torch.where(greedy, torch.ones_like(temps), temps)[:, None]
    if top_k is not None:
        scaled = _truncate(scaled, top_k, top_p)
    lp_all = torch.log_softmax(scaled, dim=-1)
    if torch.are_deterministic_algorithms_enabled():
        tok = _draw_fixed_point(lp_all, uniforms(keys, step))
    else:
        tok = _draw(lp_all, uniforms(keys, step))
    tok = torch.where(greedy, logits.argmax(-1), tok)
    lp = lp_all.gather(1, tok[:, None]).squeeze(1)
    if any_greedy if any_greedy is not None else bool(greedy.any()):
        lp_raw = torch.log_softmax(logits, dim=-1).gather(1, tok[:, None]).squeeze(1)
        lp = torch.where(greedy, lp_raw, lp)
    return tok, lp


def _prefill_mask(prompt_mask: torch.Tensor, kv_len: int) -> torch.Tensor:
    """[B,1,Lp,kv_len] bool: causal, real keys only; pad queries see themselves (no NaN)."""
    B, Lp = prompt_mask.shape
    dev = prompt_mask.device
    causal = torch.ones(Lp, Lp, dtype=torch.bool, device=dev).tril()
    m = causal[None] & prompt_mask[:, None, :].bool()
    m |= torch.eye(Lp, dtype=torch.bool, device=dev)[None]
    full = torch.zeros(B, 1, Lp, kv_len, dtype=torch.bool, device=dev)
    full[:, 0, :, :Lp] = m
    return full


GQA_DECODE_ATTN = "gs1_gqa_sdpa"


def _gqa_decode_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                     is_causal=None, **kwargs):
    """transformers' sdpa attention, except one-token decode steps with grouped KV heads:
    with a mask, the stock path copies K and V out to every query head (`repeat_kv`: two
    full-cache copies per layer per step, measured at over half of an H200 decode step).
    Instead the query heads of each KV group are laid along the query axis, so SDPA reads
    the cache as it is. Same math, per query row. Given `LiveKV`'s BlockMask (the "flex"
    decode), FlexAttention over the live blocks instead."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if _is_block_mask(attention_mask):  # the static decode's live blocks (`LiveKV`)
        # the query heads of each KV group along the query axis, as below: FlexAttention takes its
        # decoding kernel for a short query without GQA (its GQA wants a power-of-two group, and
        # Qwen2.5-1.5B's is 6: the general kernel then ran 4x slower than SDPA, h100-s25)
        B, H, _, D = query.shape
        kvh = key.shape[1]
        out = _flex_attention(query.is_cuda)(query.reshape(B, kvh, H // kvh, D), key, value,
                                             block_mask=attention_mask, scale=scaling)
        return out.reshape(B, H, 1, D).transpose(1, 2).contiguous(), None
    groups = getattr(module, "num_key_value_groups", 1)
    if query.shape[2] != 1 or groups == 1 or (attention_mask is not None and attention_mask.dim() != 4):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    B, H, _, D = query.shape
    kvh = key.shape[1]
    q = query.reshape(B, kvh, groups, D)
    mask = attention_mask
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.to(q.dtype)
    out = torch.nn.functional.scaled_dot_product_attention(
        q, key, value, attn_mask=mask, dropout_p=0.0, scale=scaling)
    return out.reshape(B, H, 1, D).transpose(1, 2).contiguous(), None


def install_gqa_decode_attention(model) -> bool:
    """Switch `model` to `_gqa_decode_sdpa` when it uses sdpa; returns whether it did."""
    try:
        from transformers import AttentionInterface, AttentionMaskInterface
        from transformers.masking_utils import sdpa_mask
    except ImportError:  # pragma: no cover - older transformers
        return False
    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return False
    AttentionInterface.register(GQA_DECODE_ATTN, _gqa_decode_sdpa)
    AttentionMaskInterface.register(GQA_DECODE_ATTN, sdpa_mask)
    try:
        model.set_attn_implementation(GQA_DECODE_ATTN)
    except Exception:
        for m in model.modules():
            cfg = getattr(m, "config", None)
            if cfg is not None and hasattr(cfg, "_attn_implementation"):
                cfg._attn_implementation = GQA_DECODE_ATTN
    return True


# How a static decode step attends (`EngineSettings.decode_attention`, GS1_DECODE_ATTENTION):
# "sdpa" reads every position of the static cache through a boolean mask (the mask zeroes those
# past the step's slot, but the kernel still reads them: at 16 arms' 1,024 rows x 1,024 positions
# 28 GiB a step); "flex" is torch's FlexAttention over the cache in blocks of LIVE_KV_BLOCK
# positions, told how many blocks hold live keys (`LiveKV`), so it reads only those -- the same
# mask, the same math. Measured on the H100 (results/h200-engine/h100-s27, one draw each): a
# decode step 6.91 ms with "flex" against 7.84 with "sdpa" at 64 rows, 23.8 against 33.5 ms
# (h100-s24) at 16 arms' 1,024 rows, FlexAttention's kernel 8.2 ms over 28 layers there against
# SDPA's 14.1. Only a static cache (CUDA) reads this; the CPU's per-slot path never does.
DECODE_ATTENTIONS = ("sdpa", "flex")
DEFAULT_DECODE_ATTENTION = "flex"
LIVE_KV_BLOCK = 128


def _is_block_mask(mask) -> bool:
    try:
        from torch.nn.attention.flex_attention import BlockMask
    except ImportError:  # pragma: no cover - torch without FlexAttention
        return False
    return isinstance(mask, BlockMask)


_COMPILED_FLEX = None  # FlexAttention compiled once per process, for eager CUDA steps


def _flex_attention(cuda: bool):
    """FlexAttention as the step at hand calls it: inside a compiled decode step the function
    itself (dynamo lowers it to its block-sparse Triton kernel); in an eager CUDA step (a captured
    graph before its shape is compiled) its compiled form, made once; on the CPU the reference
    implementation (it applies the mask to every position: the blocks only save work)."""
    global _COMPILED_FLEX
    from torch.nn.attention.flex_attention import flex_attention

    if not cuda:
        return _flex_reference
    if torch.compiler.is_compiling():
        return flex_attention
    if _COMPILED_FLEX is None:
        _COMPILED_FLEX = torch.compile(flex_attention, dynamic=False)
    return _COMPILED_FLEX


def _flex_reference(*args, **kwargs):
    """FlexAttention uncompiled (the CPU's), without its once-a-process advice to compile."""
    import warnings

    from torch.nn.attention.flex_attention import flex_attention

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
        return flex_attention(*args, **kwargs)


def _key_is_live(mask_B_L: torch.Tensor, b, h, q_idx, kv_idx):
    """FlexAttention's mask_mod: row b may attend to position kv_idx when its mask says so."""
    return mask_B_L[b, kv_idx]


class LiveKV:
    """The static decode's keys as FlexAttention reads them: the decoder's boolean mask [B, L] (its
    prompt's real tokens and every slot written since) as the mask_mod, for `q_len` queries a row
    (a KV group's query heads, `_gqa_decode_sdpa`), and, per row, how many
    leading blocks of LIVE_KV_BLOCK positions can hold a live key -- `set_slot(cur)` after each
    new slot, in place, so a captured graph reads the new count. Positions past the slot are masked
    anyway; the count lets the kernel skip their blocks instead of reading them."""

    def __init__(self, mask_B_L: torch.Tensor, q_len: int = 1):
        from torch.nn.attention.flex_attention import BlockMask

        B, L = mask_B_L.shape
        n = -(-L // LIVE_KV_BLOCK)
        dev = mask_B_L.device
        self.blocks_B = torch.full((B, 1, 1), n, dtype=torch.int32, device=dev)
        indices = torch.arange(n, dtype=torch.int32, device=dev).expand(B, 1, 1, n).contiguous()
        # a partial of a module-level function: one compiled step serves every decoder of a shape
        self.block_mask = BlockMask.from_kv_blocks(
            self.blocks_B, indices, BLOCK_SIZE=LIVE_KV_BLOCK, seq_lengths=(q_len, L),
            mask_mod=functools.partial(_key_is_live, mask_B_L))

    def set_slot(self, cur: int) -> None:
        """Slot `cur` was just written: blocks 0 .. cur // LIVE_KV_BLOCK hold every live key."""
        self.blocks_B.fill_(cur // LIVE_KV_BLOCK + 1)


class _StaticKV:
    """A preallocated KV cache with the one method the attention layers call, `update`.

    transformers' own StaticCache (5.17) clones the whole cache on every update, which costs
    more than the rest of a decode step at 64 x 768 slots; this one returns views. The write
    position lives on the device and advances inside the (captured) step, after the last layer.
    """

    def __init__(self, n_layers: int, B: int, kv_heads: int, max_len: int, head_dim: int, dtype, device):
        self.k = [torch.zeros(B, kv_heads, max_len, head_dim, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v = [torch.zeros_like(t) for t in self.k]
        self.pos = torch.zeros(1, dtype=torch.long, device=device)
        self.n_layers = n_layers

    def update(self, key_states, value_states, layer_idx, cache_kwargs=None):
        q = key_states.shape[-2]
        idx = self.pos + torch.arange(q, device=self.pos.device)
        self.k[layer_idx].index_copy_(2, idx, key_states.to(self.k[layer_idx].dtype))
        self.v[layer_idx].index_copy_(2, idx, value_states.to(self.v[layer_idx].dtype))
        if layer_idx == self.n_layers - 1:
            self.pos.add_(q)
        return self.k[layer_idx], self.v[layer_idx]

    def get_seq_length(self, layer_idx: int = 0):
        return self.pos

    def reset(self) -> None:
        self.pos.zero_()

    def set_length(self, n: int) -> None:
        self.pos.fill_(n)


class _EagerDecoder:
    """Decode steps on transformers' DynamicCache, one plain model call each (CPU, or
    `static_cache=False`). Takes over the prefill's cache, its rows copied out to the batch's."""

    graphed = False

    def __init__(self, model, cache, b: "_Packed"):
        if b.src != list(range(b.B)):
            cache.batch_select_indices(b.src_B)
        self.model, self.cache, self.B = model, cache, b.B
        self.mask = torch.zeros(b.B, 1, 1, b.Lp + b.max_new, dtype=torch.bool, device=b.src_B.device)
        self.mask[:, 0, 0, : b.Lp] = b.pmask_B

    def step(self, tok_B: torch.Tensor, pos_B: torch.Tensor, cur: int) -> torch.Tensor:
        """Feed the token just sampled (cache slot `cur`); the next logits [B, V] float32."""
        self.mask[:, 0, 0, cur] = True
        out = self.model(input_ids=tok_B[:, None], position_ids=pos_B,
                         attention_mask=self.mask[:, :, :, : cur + 1],
                         past_key_values=self.cache, use_cache=True)
        return out.logits[:, -1].float()


class _GraphedDecoder:
    """Decode steps on a static KV cache for one (batch, max_len): captured once as a CUDA graph
    and replayed for every later step and batch of that shape (`capture`, set per batch by the
    Generator, captures it on the first step; without it the step runs eagerly on the static
    cache, as on CPU). Same interface as `_EagerDecoder`: `step(tok_B, pos_B, cur)`."""

    def __init__(self, model, B: int, max_len: int, compile_step: bool = False, attention: str = DEFAULT_DECODE_ATTENTION):
        self.model, self.B, self.max_len = model, B, max_len
        self.compiled = compile_step
        p = next(model.parameters())
        dev = p.device
        cfg = model.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        dtype = model.get_input_embeddings().weight.dtype
        self.cache = _StaticKV(cfg.num_hidden_layers, B, kv_heads, max_len, head_dim, dtype, dev)
        self.ids = torch.zeros(B, 1, dtype=torch.long, device=dev)
        self.pos = torch.zeros(B, 1, dtype=torch.long, device=dev)
        self.mask = torch.zeros(B, 1, 1, max_len, dtype=torch.bool, device=dev)
        # "flex": the step passes the live blocks over the same mask (`LiveKV`)
        groups = cfg.num_attention_heads // kv_heads  # a KV group's query heads: the flex step's queries
        self.live = LiveKV(self.mask[:, 0, 0], groups) if attention == "flex" else None
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None
        self.capture_with = None  # Generator._capture, or None: run the step eagerly

    @property
    def graphed(self) -> bool:
        return self.graph is not None

    def reset(self) -> None:
        self.cache.reset()

    def set_length(self, n: int) -> None:
        self.cache.set_length(n)

    def fill(self, cache, b: "_Packed", u0: int, u1: int) -> None:
        """Copy a DynamicCache prefilled with the batch's distinct prompts u0..u1-1 into every row
        of theirs (row b gets prompt src_B[b]'s keys and values). In place, so a captured graph
        stays valid; `start` once every prompt is in."""
        n = b.Lp
        assert len(cache.layers) == len(self.cache.k)
        rows = ((b.src_B >= u0) & (b.src_B < u1)).nonzero().squeeze(1)
        src = b.src_B.index_select(0, rows) - u0
        for layer, k, v in zip(cache.layers, self.cache.k, self.cache.v):
            if layer.keys.shape[2] != n:  # e.g. a sliding-window layer that dropped keys
                raise RuntimeError(f"prefill cache holds {layer.keys.shape[2]} positions, expected {n}")
            k[:, :, :n].index_copy_(0, rows, layer.keys.index_select(0, src))
            v[:, :, :n].index_copy_(0, rows, layer.values.index_select(0, src))

    def start(self, b: "_Packed") -> None:
        """The rows' prompts are in (`fill`): decoding starts at slot Lp, under their prompt masks."""
        n = b.Lp
        self.set_length(n)
        self.mask.zero_()
        self.mask[:, 0, 0, :n] = b.pmask_B

    def step(self, tok_B: torch.Tensor, pos_B: torch.Tensor, cur: int) -> torch.Tensor:
        self.ids.copy_(tok_B[:, None])
        self.pos.copy_(pos_B)
        self.mask[:, 0, 0, cur] = True
        if self.live is not None:
            self.live.set_slot(cur)
        if self.graph is None and self.capture_with is not None:
            capture, self.capture_with = self.capture_with, None  # one try per batch
            capture(self, cur)
        return self.replay() if self.graph is not None else self._step()

    def _step(self):
        forward = compiled_decode_step() if self.compiled else decode_step
        mask = self.mask if self.live is None else self.live.block_mask
        return forward(self.model, self.ids, self.pos, mask, self.cache)

    def use_eager(self) -> None:
        self.compiled = False

    def capture(self, cur_len: int) -> None:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                self._step()
                self.set_length(cur_len)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        # On this engine's GPU: torch.cuda.graph's default capture stream is one per process, made
        # on whichever GPU captured first. thread_local: other engines keep working meanwhile.
        with torch.cuda.graph(g, stream=s, capture_error_mode="thread_local"):
            self.logits = self._step()
        self.set_length(cur_len)
        self.graph = g

    def adopt(self, old: "_GraphedDecoder", src_K: torch.Tensor, cur: int) -> None:
        """Take over rows src_K of `old` (same positions) at write slot `cur`: their keys, values
        and mask, in place (a captured graph stays valid)."""
        for k, v, k_old, v_old in zip(self.cache.k, self.cache.v, old.cache.k, old.cache.v):
            k[:, :, :cur].copy_(k_old[:, :, :cur].index_select(0, src_K))
            v[:, :, :cur].copy_(v_old[:, :, :cur].index_select(0, src_K))
        self.mask.copy_(old.mask.index_select(0, src_K))
        self.set_length(cur)

    def replay(self) -> torch.Tensor:
        assert self.graph is not None and self.logits is not None
        self.graph.replay()
        return self.logits


def decode_step(model, ids_B, pos_B, mask_B, cache) -> torch.Tensor:
    """One decode step on a static KV cache: the next logits [B, V] float32. `mask_B`: a boolean
    [B, 1, 1, L] mask, or the BlockMask of `LiveKV` (FlexAttention reads only the live blocks)."""
    out = model(input_ids=ids_B, position_ids=pos_B, attention_mask=mask_B,
                past_key_values=cache, use_cache=True)
    return out.logits[:, -1].float()


# One compiled decode step per process. The model is an argument, not a closure or `self`:
# dynamo then guards on its type and shapes, not its identity, so every client of the process
# (preflight, pilot, each arm, eval) reuses the graph of a shape compiled once by any of them.
# Shapes are bucketed so that a run makes few graphs: GSM8K's prompts plus 512 new tokens fit
# 1024 positions (DECODE_LENGTH_BUCKET); a run's batches (the preflight's 16 rows, two arms' 128
# rows of a step, six arms' 384, the 1024-row held-out and eval batches) take a multiple of 128
# rows, a batch of 64 rows or fewer (a lone arm's step, the preflight's 16) 64; the adapter
# bank's decode buffers follow the row count and a width that only grows (`lora_bank`), so a
# run compiles about one shape per row count.
_COMPILED_DECODE = None
# Static caches hold a multiple of this many positions (`Generator.length_bucket`; an engine's
# `decode_length_bucket`, GS1_DECODE_LENGTH_BUCKET). 1024: every GSM8K batch is one shape.
# GSM8K's prompts as the loop builds them (the cookbook's few-shot prefix) run 131-331 tokens, 43
# of 7,473 train prompts over 256 (results/h200-engine/h100-s28/gsm8k_prompt_positions.txt,
# benchmarks/prompt_positions.py): at 256, 31 % of 64-row batches and 99.7 % of 1,024-row ones
# take 1,024 positions and the rest 768 -- two decode shapes, and no saving where many arms
# share a batch. The 768-position KV measured on the H100 (random 160-token prompts, 16 adapters:
# 2.66 -> 2.22 GiB an arm, the decode step unchanged) needs prompts that all fit.
DECODE_LENGTH_BUCKET = 1024
GRAPHED_ROWS_STEP = 128  # graphed batches of more than MIN_GRAPHED_ROWS hold a multiple of this many rows
# ... and none fewer than this: a lone arm's 64 rows (one tile of the bank's tiled form). At 128
# rows they read twice the KV and sample twice the rows a step (h100-s25: 9.29 ms a step at 128).
MIN_GRAPHED_ROWS = 64
# A decode shape is compiled on its 8th batch. Measured on the H200 (results/h200-multi-adapter):
# a compile costs 53-79 s cold (~20 s on a warm cache) and saves ~4 ms of a step at 128 rows
# (8.7 against 12.6 ms eager): 2 s a batch of 512 steps, so it pays back after ~40 batches cold
# (~10 warm). An eval's few batches never do, nor do the fixed stages: with a calibration they
# made 7 batches of the 128-row shape (the preflight's 1, now a 64-row batch; the pilot's baseline
# step, treatment step 2 and eval timing; the calibration pilot's same three -- a treatment's
# first step rides with its held-out samples in a larger shape). On its 6th batch,
# the user's spec compiled in its calibration pilot, 78.5 s before feasibility
# (results/h200-multi-adapter/session5). On the 8th, a training loop's first step compiles it.
COMPILE_AFTER_BATCHES = 8
# The most prompt positions (distinct prompts x padded length) one prefill forward holds; a
# batch's prompts beyond it prefill in chunks, each written straight into the static decoder's
# cache. An eval batch of 1,024 GSM8K prompts is 1,024 x 247 positions: in one forward the bank's
# float32 delta on a 1.5B model's MLP projections alone was an 8.44 GiB tensor, and the run ran out
# of memory on an 80 GB H100 with 16 units' state held (results/h200-engine/h100-s30/units). At
# 65,536 positions that tensor is 2.2 GiB and a chunk is still a full-width forward.
PREFILL_POSITIONS = 1 << 16


def compiled_decode_step():
    global _COMPILED_DECODE
    if _COMPILED_DECODE is None:
        import torch._dynamo

        # every shape of a run must stay compiled: past the limit dynamo silently runs eager
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        torch._dynamo.config.accumulated_recompile_limit = max(
            torch._dynamo.config.accumulated_recompile_limit, 512)
        dynamic = os.environ.get("GS1_COMPILE_DYNAMIC", "0") == "1"  # one graph for every shape
        _COMPILED_DECODE = torch.compile(decode_step, dynamic=dynamic)
    return _COMPILED_DECODE


@dataclass(frozen=True)
class CompileEvent:
    """One decode graph made ready: a shape compiled (or found compiled) and captured."""

    rows: int
    positions: int
    seconds: float
    compiled: bool  # dynamo compiled a new graph (False: an existing one, only captured)
    device: str


COMPILE_EVENTS: list[CompileEvent] = []  # this process's, in order
_log = logging.getLogger("gs1.engine")


def dynamo_graphs() -> int:
    """The graphs dynamo has compiled in this process so far (decode steps and the learner's)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


@dataclass(frozen=True)
class CacheReads:
    """What torch.compile's on-disk caches answered in this process (`now()`), or between two
    readings (`since`): AOTAutograd's graph cache (a hit skips tracing the forward and backward)
    and inductor's FX graph cache (a hit skips generating the kernels). A compile's log line
    carries them, so that a warm run says which cache it missed."""

    autograd_hit: int = 0
    autograd_miss: int = 0
    autograd_bypass: int = 0
    inductor_hit: int = 0
    inductor_miss: int = 0
    inductor_bypass: int = 0

    @classmethod
    def now(cls) -> "CacheReads":
        from torch._dynamo.utils import counters

        a, i = counters["aot_autograd"], counters["inductor"]
        return cls(a["autograd_cache_hit"], a["autograd_cache_miss"], a["autograd_cache_bypass"],
                   i["fxgraph_cache_hit"], i["fxgraph_cache_miss"], i["fxgraph_cache_bypass"])

    def since(self, before: "CacheReads") -> "CacheReads":
        return CacheReads(*(getattr(self, f) - getattr(before, f) for f in self.__dataclass_fields__))

    def __str__(self) -> str:
        return (f"autograd cache {self.autograd_hit} hit {self.autograd_miss} miss {self.autograd_bypass} bypass, "
                f"inductor cache {self.inductor_hit} hit {self.inductor_miss} miss {self.inductor_bypass} bypass")


def guard_failures() -> int:
    """The guard failures dynamo has recorded in this process so far (each made a recompile)."""
    from torch._dynamo.utils import guard_failures as failures

    return sum(len(reasons) for reasons in failures.values())


def guard_failures_since(n: int) -> list[str]:
    """The guard failures recorded after the first `n` (`guard_failures()`), oldest first: what
    changed between a graph and the call that recompiled it."""
    from torch._dynamo.utils import guard_failures as failures

    return [str(r) for reasons in failures.values() for r in reasons][n:]


def _bucket(n: int, q: int) -> int:
    return ((n + q - 1) // q) * q


def graphed_rows(n: int) -> int:
    """Rows of the graphed batch that holds n rows: MIN_GRAPHED_ROWS up to that many, else n
    rounded up to a multiple of GRAPHED_ROWS_STEP, so a run's batches of 128, 78 and 100 rows
    replay one graph, not one per size, and six arms' 384 rows decode as 384, not 512 (the step's
    cost grows with its rows: the KV cache and the adapter bank). The padding rows decode one
    token, then idle."""
    return MIN_GRAPHED_ROWS if n <= MIN_GRAPHED_ROWS else _bucket(n, GRAPHED_ROWS_STEP)


@dataclass
class _Packed:
    """One batch on the device. Rows with equal prompts (a request's samples) share one prefill
    row: prompt u of prompts_U is prefilled once, left-padded to Lp, and src[b] names row b's."""

    rows: list[Row]
    src: list[int]
    prompts_U: list[list[int]]
    adapters_U: list  # each prompt's adapter (`Row.adapter`)
    want_lp_U: list[bool]  # prompt logprobs asked for by any of the prompt's rows
    ids_U: torch.Tensor  # [U, Lp]
    pmask_U: torch.Tensor  # [U, Lp] bool, real tokens
    pos_U: torch.Tensor  # [U, Lp]
    src_B: torch.Tensor
    pmask_B: torch.Tensor  # [B, Lp]
    next_pos_B: torch.Tensor  # [B, 1] position of each row's first new token
    temps_B: torch.Tensor
    keys_B: torch.Tensor
    top_k_B: torch.Tensor | None
    top_p_B: torch.Tensor | None
    any_greedy: bool
    stop_tab_B_S: torch.Tensor  # stop token ids, -1 padded
    max_tok_B: torch.Tensor
    str_rows: list[int]  # rows with stop strings (checked on the host)
    max_new: int  # decode steps at most: the longest max_tokens

    @property
    def B(self) -> int:
        return len(self.rows)

    @property
    def Lp(self) -> int:
        return self.ids_U.shape[1]


def _pack(rows: list[Row], pad_id: int, share_prefill: bool, dev) -> _Packed:
    B = len(rows)
    if share_prefill:
        # equal prompts share a prefill only under the same adapter
        first: dict[tuple, int] = {}
        src = [first.setdefault((id(r.adapter), tuple(r.prompt)), len(first)) for r in rows]
        prompts_U = [list(p) for _, p in first]
    else:
        src = list(range(B))
        prompts_U = [r.prompt for r in rows]
    u_rows = {u: i for i, u in reversed(list(enumerate(src)))}  # each prompt's first row
    want_lp_U = [False] * len(prompts_U)
    for r, u in zip(rows, src):
        want_lp_U[u] |= r.prompt_logprobs
    Lp = max(len(p) for p in prompts_U)
    ids = torch.full((len(prompts_U), Lp), pad_id, dtype=torch.long)
    pmask = torch.zeros(len(prompts_U), Lp, dtype=torch.bool)
    for u, p in enumerate(prompts_U):
        ids[u, Lp - len(p) :] = torch.tensor(p, dtype=torch.long)
        pmask[u, Lp - len(p) :] = True
    ids, pmask = ids.to(dev), pmask.to(dev)
    pos = (pmask.long().cumsum(1) - 1).clamp_min(0)
    src_B = torch.tensor(src, dtype=torch.long, device=dev)
    top_k = top_p = None
    if any(r.top_k > 0 or r.top_p < 1.0 for r in rows):
        top_k = torch.tensor([r.top_k for r in rows], dtype=torch.long, device=dev)
        top_p = torch.tensor([r.top_p for r in rows], dtype=torch.float32, device=dev)
    S = max(1, max(len(r.stop_ids) for r in rows))
    stop_tab = torch.full((B, S), -1, dtype=torch.long)
    for i, r in enumerate(rows):
        if r.stop_ids:
            stop_tab[i, : len(r.stop_ids)] = torch.tensor(r.stop_ids, dtype=torch.long)
    return _Packed(
        rows=rows, src=src, prompts_U=prompts_U, adapters_U=[rows[u_rows[u]].adapter for u in range(len(prompts_U))], want_lp_U=want_lp_U, ids_U=ids, pmask_U=pmask,
        pos_U=pos, src_B=src_B, pmask_B=pmask.index_select(0, src_B),
        next_pos_B=pos[:, -1:].index_select(0, src_B) + 1,
        temps_B=torch.tensor([r.temperature for r in rows], dtype=torch.float32, device=dev),
        keys_B=torch.tensor([r.key for r in rows], dtype=torch.long, device=dev),
        top_k_B=top_k, top_p_B=top_p, any_greedy=any(r.temperature <= 0 for r in rows),
        stop_tab_B_S=stop_tab.to(dev),
        max_tok_B=torch.tensor([r.max_tokens for r in rows], dtype=torch.long, device=dev),
        str_rows=[i for i, r in enumerate(rows) if r.stop_strs],
        max_new=max(r.max_tokens for r in rows))


@dataclass(frozen=True)
class _Live:
    """The rows of a compacted static decoder (`Generator._compacted`): its row k decodes the
    batch's row rows_K[k]. A pad (filling a tile or the graphed row count) copies its neighbour's
    row and writes nowhere; write_K are the real rows, write_B the batch rows they write to. The
    rows' sampling settings, gathered once."""

    rows_K: torch.Tensor
    write_K: torch.Tensor
    write_B: torch.Tensor
    temps_K: torch.Tensor
    keys_K: torch.Tensor
    top_k_K: torch.Tensor | None
    top_p_K: torch.Tensor | None


class _Progress:
    """Each row's tokens and logprobs so far, and the stop check after every sampled token: a
    row stops at a stop token, a stop string (decoded on the host), or its max_tokens."""

    def __init__(self, b: _Packed, tokenizer):
        dev, T = b.src_B.device, max(b.max_new, 1)
        self.b, self.tokenizer = b, tokenizer
        self.tokens_B_T = torch.zeros(b.B, T, dtype=torch.long, device=dev)
        self.lps_B_T = torch.zeros(b.B, T, dtype=torch.float32, device=dev)
        self.n_out_B = torch.zeros(b.B, dtype=torch.long, device=dev)  # tokens kept per row
        self.done_B = b.max_tok_B <= 0
        self.by_stop_B = torch.zeros(b.B, dtype=torch.bool, device=dev)

    def record(self, step: int, tok_B: torch.Tensor, lp_B: torch.Tensor, live: "_Live | None" = None) -> None:
        """Record a step's tokens; with `live` (a compacted decoder's rows), `tok_B` and `lp_B`
        are that decoder's and go to the rows they decode (the others are done: zeros)."""
        b = self.b
        if live is not None:
            tok_B = torch.zeros_like(self.n_out_B).index_copy_(0, live.write_B, tok_B.index_select(0, live.write_K))
            lp_B = torch.zeros_like(self.lps_B_T[:, 0]).index_copy_(0, live.write_B, lp_B.index_select(0, live.write_K))
        active = ~self.done_B
        self.tokens_B_T[:, step] = tok_B
        self.lps_B_T[:, step] = lp_B
        self.n_out_B += active.long()
        hit = (tok_B[:, None] == b.stop_tab_B_S).any(1) & active
        if b.str_rows:
            hit = self._stop_strings(hit, active)
        self.by_stop_B |= hit
        self.done_B = self.done_B | hit | (self.n_out_B >= b.max_tok_B)

    def _stop_strings(self, hit: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        hit_cpu, n_cpu = hit.cpu(), self.n_out_B.cpu()
        for i in self.b.str_rows:
            if not active[i]:
                continue
            r = self.b.rows[i]
            n = int(n_cpu[i])
            tail_n = max(len(s) for s in r.stop_strs) + 4
            tail = self.tokenizer.decode(self.tokens_B_T[i, max(0, n - tail_n) : n].tolist())
            if any(s in tail for s in r.stop_strs):
                hit_cpu[i] = True
        return hit_cpu.to(hit.device)

    def all_done(self) -> bool:
        return bool(self.done_B.all())

    def results(self, prompt_lps_U) -> list[RowResult]:
        n_list = self.n_out_B.tolist()
        stop_list, tok_list, lp_list = self.by_stop_B.tolist(), self.tokens_B_T.tolist(), self.lps_B_T.tolist()
        return [RowResult(tok_list[i][:n], lp_list[i][:n], "stop" if stop_list[i] else "length",
                          prompt_lps_U[self.b.src[i]] if r.prompt_logprobs else None)
                for i, (r, n) in enumerate(zip(self.b.rows, n_list))]


class Generator:
    """Runs batches of rows on one model; keeps captured CUDA graphs between batches.

    `compile_decode` (CUDA only) runs the decode step through `torch.compile` before its CUDA
    graph is captured: the elementwise work around each matmul (norms, rotary, the adapters'
    casts and scaled adds) fuses into a few kernels; compile time is paid once per batch shape,
    on the shape's `compile_after`-th batch.
    `bank` (`lora_bank.AdapterBank`): rows carry their own adapter (`Row.adapter`) and a batch
    may mix adapters; the caller holds `bank.serving()` around `generate`. Without a bank the
    model runs as it is."""

    def __init__(self, model, pad_id: int, tokenizer=None, use_cuda_graphs: bool | None = None,
                 static_cache: bool | None = None, share_prefill: bool = True,
                 max_logit_elems: int | None = None, compile_decode: bool = False, bank=None,
                 compile_after: int = COMPILE_AFTER_BATCHES, compact: bool | None = None,
                 length_bucket: int = DECODE_LENGTH_BUCKET, decode_attention: str = DEFAULT_DECODE_ATTENTION,
                 prefill_positions: int = PREFILL_POSITIONS):
        self.model = model
        self.prefill_positions = prefill_positions  # a static-cache prefill's chunk: at most this many positions
        self.decode_attention = decode_attention  # a static decode step's attention (DECODE_ATTENTIONS)
        self.length_bucket = length_bucket  # a static cache's positions: a multiple of this
        self.share_prefill = share_prefill  # False: one prefill row per row (for comparisons)
        self.pad_id = pad_id
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        cuda = self.device.type == "cuda"
        # bounds a chunk of full-vocabulary fp32 logits (prompt logprobs here, the learner's loss in
        # `local`): 512 MB on CUDA, 64 MB on CPU
        self.max_logit_elems = max_logit_elems or (1 << 27 if cuda else 1 << 24)
        self.use_cuda_graphs = cuda if use_cuda_graphs is None else (use_cuda_graphs and cuda)
        self.static_cache = (self.use_cuda_graphs or cuda) if static_cache is None else static_cache
        self._graphs: dict[tuple[int, int, int], _GraphedDecoder] = {}
        self._batches_of: Counter[tuple[int, int]] = Counter()  # batches per (rows, positions)
        self.bank = bank
        self.compile_decode = compile_decode and cuda  # only the captured CUDA step is compiled
        self.compile_after = max(1, compile_after)  # batches of a shape before it is compiled
        # a static decoder's rows still decoding move to a smaller one (`_compacted`); GS1_COMPACT_DECODE=0: never
        self.compact = os.environ.get("GS1_COMPACT_DECODE", "1") != "0" if compact is None else compact
        self.stats = GenStats()

    def generate(self, rows: list[Row]) -> list[RowResult]:
        return self._generate(rows)

    def _use_rows(self, adapters: list, decode: bool = False) -> None:
        if self.bank is not None:
            slots = self.bank.load(adapters)
            self.bank.use_decode_rows(slots) if decode else self.bank.use_rows(slots)

    def _layout(self, rows: list[Row]) -> list[int | None]:
        """The batch's row order (None: a pad row). On the static-cache decode with the bank's tiled
        form, rows in tiles of one adapter each (`lora_bank.tile_layout`); graphed, padded to
        `graphed_rows`.
        Rows are independent (their own keys and KV), so the order changes none of their tokens."""
        order: list[int | None] = list(range(len(rows)))
        if self.static_cache and self.bank is not None and self.bank.tiled:
            ids: dict[int, int] = {}
            slots = [-1 if r.adapter is None else ids.setdefault(r.adapter.id, len(ids)) for r in rows]
            order = tile_layout(slots, self.bank.tile_rows)
        if self.static_cache and self.use_cuda_graphs:
            order += [None] * (graphed_rows(len(order)) - len(order))
        return order

    @torch.no_grad()
    def _generate(self, rows: list[Row]) -> list[RowResult]:
        """pack -> decoder and prefill -> decode (sample, stop check, one decoder step) -> unpack."""
        from transformers import DynamicCache

        t_start = time.perf_counter()
        n_rows = len(rows)
        order = self._layout(rows)
        rows = [rows[n] if n is not None else None for n in order]
        # Pads (a tile's or the graphed batch size's) copy a neighbouring row's prompt and
        # adapter, so they share its prefill and its tile; they decode one token, then idle.
        for k in range(len(rows)):
            if rows[k] is None:
                src = rows[k - 1]
                rows[k] = Row(prompt=src.prompt, max_tokens=1, temperature=src.temperature, key=src.key,
                              adapter=src.adapter)
        b = _pack(rows, self.pad_id, self.share_prefill, self.device)
        adapters_B = [r.adapter for r in rows]
        if self.static_cache:
            # The decoder first (its static cache replaces any other shape's before the prefill
            # needs memory), on the bank's decode buffers (a captured graph reads them by address,
            # so their version is part of its shape); the prefill writes into it chunk by chunk.
            self._use_rows(adapters_B, decode=True)
            dec = self._decoder(b)
            logits_U, prompt_lps_U = self._prefill(b, dec)
            self._use_rows(adapters_B, decode=True)  # the prefill ran in the per-slot form
        else:
            cache = DynamicCache(config=self.model.config)
            logits_U, prompt_lps_U = self._prefill(b, cache)
            self._use_rows(adapters_B)
            dec = _EagerDecoder(self.model, cache, b)
            del cache
        self._sync()
        t_decode = time.perf_counter()
        self.stats.prefill_s += t_decode - t_start
        progress = _Progress(b, self.tokenizer)
        steps = self._decode(b, dec, logits_U.index_select(0, b.src_B), progress)
        self._sync()
        self.stats.decode_s += time.perf_counter() - t_decode
        laid_out = progress.results(prompt_lps_U)
        results: list[RowResult] = [None] * n_rows  # type: ignore[list-item]
        for n, res in zip(order, laid_out):
            if n is not None:
                results[n] = res
        self.stats.batches += 1
        self.stats.graphed_batches += int(dec.graphed)
        self.stats.rows += n_rows
        self.stats.prefill_rows += len(b.prompts_U)
        self.stats.decode_steps += steps
        self.stats.sampled_tokens += sum(len(r.tokens) for r in results)
        return results

    def _sync(self) -> None:
        # this engine's stream only: another arm's engine works on its own stream meanwhile
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def _decode(self, b: _Packed, dec, logits_B: torch.Tensor, progress: _Progress) -> int:
        """The decode loop: sample a token per row, record it (stop check), step the decoder.
        Returns the steps run. Without stop strings on CUDA, whether every row is done is read
        back every 16 steps only (a device sync); there a static decoder also moves the rows
        still decoding to a smaller one when they fit in half its rows (`_compacted`)."""
        sync_every = 1 if (self.device.type != "cuda" or b.str_rows) else 16
        pos_B = b.next_pos_B
        live: _Live | None = None
        for step in range(b.max_new):
            if live is None:
                tok_B, lp_B = sample_step(logits_B, b.temps_B, b.keys_B, step, b.top_k_B, b.top_p_B, b.any_greedy)
            else:
                tok_B, lp_B = sample_step(logits_B, live.temps_K, live.keys_K, step, live.top_k_K, live.top_p_K,
                                          b.any_greedy)
            progress.record(step, tok_B, lp_B, live)
            if step + 1 == b.max_new or ((step + 1) % sync_every == 0 and progress.all_done()):
                return step + 1
            if (step + 1) % sync_every == 0:
                shrunk = self._compacted(b, dec, live, progress, b.Lp + step)
                if shrunk is not None:
                    dec, live, src_K = shrunk
                    tok_B, pos_B = tok_B.index_select(0, src_K), pos_B.index_select(0, src_K)
            self.stats.row_steps += dec.B
            logits_B = dec.step(tok_B, pos_B, b.Lp + step)  # b.Lp + step: the new token's slot
            pos_B = pos_B + 1
        return 0

    def _compacted(self, b: _Packed, dec, live: _Live | None, progress: _Progress, cur: int):
        """When the rows still decoding fit in at most half of a static decoder's rows (laid out
        by `_layout`, as a batch is), a decoder of that many rows holding their keys and values
        from here on: a greedy eval's 1,024 rows run 512 steps while half of them stop by ~270
        (GSM8K). Each row keeps its own key, KV and adapter, so its tokens are those the full
        batch gives. Returns (decoder, its rows, each one's row in `dec`), or None: keep `dec`."""
        # graphed, never under GRAPHED_ROWS_STEP rows: a training step's decoders share that shape
        # (compiled by its 8th batch), and a smaller one would replace its graph every step
        floor = GRAPHED_ROWS_STEP if self.use_cuda_graphs else 0
        if not (self.compact and isinstance(dec, _GraphedDecoder)) or max(len(self._layout([b.rows[0]])), floor) > dec.B // 2:
            return None  # a static decoder at its smallest layout (a training step's 128 rows): no read-back
        rows_K = live.rows_K if live is not None else torch.arange(b.B, device=b.src_B.device)
        decoding_K = (~progress.done_B).index_select(0, rows_K)
        if live is not None:  # a pad copies a live row: only real rows count
            decoding_K &= torch.zeros_like(decoding_K).index_fill_(0, live.write_K, True)
        keep = decoding_K.nonzero().squeeze(1).tolist()
        rows_host = rows_K.tolist()
        order = self._layout([b.rows[rows_host[k]] for k in keep])
        order += [None] * (floor - len(order))
        if not keep or len(order) > dec.B // 2:
            return None
        src: list[int] = []  # each new row's row in `dec`; a pad copies the row before it
        for j, o in enumerate(order):
            src.append(keep[o] if o is not None else src[j - 1])
        dev = rows_K.device
        src_K = torch.tensor(src, dtype=torch.long, device=dev)
        write_K = torch.tensor([j for j, o in enumerate(order) if o is not None], dtype=torch.long, device=dev)
        new_rows_K = rows_K.index_select(0, src_K)
        self._use_rows([b.rows[rows_host[k]].adapter for k in src], decode=True)
        new = self._static_decoder(len(order), dec.max_len, keep=dec)
        new.adopt(dec, src_K, cur)
        self._graphs = {k: d for k, d in self._graphs.items() if d is new}  # the old one's cache goes
        new.capture_with = self._capture if self.use_cuda_graphs else None
        pick = (lambda t: None if t is None else t.index_select(0, new_rows_K))
        self.stats.compactions += 1
        return new, _Live(new_rows_K, write_K, new_rows_K.index_select(0, write_K), pick(b.temps_B),
                          pick(b.keys_B), pick(b.top_k_B), pick(b.top_p_B)), src_K

    def _decoder(self, b: _Packed) -> "_GraphedDecoder":
        """The batch's static-KV decoder (graphed on CUDA, one per shape kept between batches),
        its cache still to be filled by the prefill (`_prefill`)."""
        total = _bucket(b.Lp + b.max_new, self.length_bucket)
        self._batches_of[(b.B, total)] += 1
        dec = self._static_decoder(b.B, total)
        dec.capture_with = self._capture if self.use_cuda_graphs else None
        return dec

    def _static_decoder(self, rows: int, total: int, keep: "_GraphedDecoder | None" = None) -> "_GraphedDecoder":
        """The static decoder of `rows` x `total` positions on the bank's decode buffers (read by
        address in a captured graph, so part of its shape), kept between batches and compiled
        from the shape's `compile_after`-th batch. A new one drops every other static cache but
        `keep` (the one a compaction copies from): one live cache at a time bounds memory."""
        shape = (rows, total, self.bank.version if self.bank is not None else 0)
        compile_now = self._compile_now((rows, total))
        dec = self._graphs.get(shape)
        if dec is None or (compile_now and not dec.compiled):
            self._graphs = {k: d for k, d in self._graphs.items() if d is keep}
            dec = self._graphs[shape] = _GraphedDecoder(self.model, rows, total, compile_now, self.decode_attention)
        return dec

    def _compile_now(self, rows_positions: tuple[int, int]) -> bool:
        """Compile a decode shape on its `compile_after`-th batch (`COMPILE_AFTER_BATCHES`);
        until then it decodes on the eager step's CUDA graph."""
        return self.compile_decode and self._batches_of[rows_positions] >= self.compile_after

    def _capture(self, dec: "_GraphedDecoder", cur: int) -> None:
        """Capture `dec`'s step as a CUDA graph. A compiled step that fails to compile or capture
        falls back to the eager step (and later decoders are not compiled); an eager step that
        cannot be captured leaves decoding eager. The errors are kept in `stats.extra`."""
        import traceback

        for kind in ("compiled", "eager") if dec.compiled else ("eager",):
            if kind == "eager" and dec.compiled:
                dec.use_eager()
                self.compile_decode = False
            try:
                graphs, reads, t0 = dynamo_graphs(), CacheReads.now(), time.perf_counter()
                dec.capture(cur)
                event = CompileEvent(dec.B, dec.max_len, time.perf_counter() - t0,
                                     dynamo_graphs() > graphs, str(self.device))
                COMPILE_EVENTS.append(event)
                _log.info(f"decode graph {dec.B} rows x {dec.max_len} positions on {event.device}: "
                          f"{'compiled and ' if event.compiled else ''}captured in {event.seconds:.1f} s "
                          f"({sum(e.compiled for e in COMPILE_EVENTS)} shapes compiled in this process"
                          + (f"; {CacheReads.now().since(reads)})" if event.compiled else ")"))
                return
            except Exception:
                self.stats.extra[f"{kind}_capture_error"] = traceback.format_exc()[-1500:]
                dec.graph = None
                dec.set_length(cur)
        self.use_cuda_graphs = False

    def _prefill_chunks(self, b: _Packed, into) -> list[tuple[int, int]]:
        """The distinct prompts' ranges [u0, u1) that prefill in one forward each: at most
        `prefill_positions` positions (prompts x Lp) a chunk when `into` is a static decoder,
        which takes each chunk's keys and values as it comes; one chunk into a DynamicCache (the
        eager decoder reads it whole)."""
        U = len(b.prompts_U)
        if not isinstance(into, _GraphedDecoder):
            return [(0, U)]
        step = max(1, self.prefill_positions // max(b.Lp, 1))
        return [(u0, min(u0 + step, U)) for u0 in range(0, U, step)]

    def _prefill(self, b: _Packed, into):
        """Forwards over the distinct prompts into `into` (a static decoder, filled chunk by
        chunk, `_prefill_chunks`; or a DynamicCache): the last position's logits [U, V] and, for
        prompts in want_lp_U, their own logprobs from the same forwards' hidden states (the
        final-norm output the LM head reads) -- the values `score_tokens` gives. Each prompt's
        forward is its own row's (attention never crosses rows), so the chunks change no value
        but by the matmuls' rounding at another row count."""
        from transformers import DynamicCache

        ids, pos, pmask, prompts_U, want_lp_U = b.ids_U, b.pos_U, b.pmask_U, b.prompts_U, b.want_lp_U
        Lp = ids.shape[1]
        hidden: list[torch.Tensor] = []
        hook = None
        if any(want_lp_U):
            def keep(_module, _args, out):
                hidden.append(out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0])

            hook = self.model.get_decoder().register_forward_hook(keep)
        logits: list[torch.Tensor] = []
        chunks = self._prefill_chunks(b, into)
        try:
            for u0, u1 in chunks:
                cache = DynamicCache(config=self.model.config) if isinstance(into, _GraphedDecoder) else into
                self._use_rows(b.adapters_U[u0:u1])
                out = self.model(
                    input_ids=ids[u0:u1], position_ids=pos[u0:u1], attention_mask=_prefill_mask(pmask[u0:u1], Lp),
                    past_key_values=cache, use_cache=True, logits_to_keep=1,
                )
                logits.append(out.logits[:, -1].float())
                if cache is not into:
                    into.fill(cache, b, u0, u1)
                del out, cache
        finally:
            if hook is not None:
                hook.remove()
        if isinstance(into, _GraphedDecoder):
            into.start(b)
        if len(chunks) > 1:  # the LM head below reads every prompt's row (an adapted head: each its own)
            self._use_rows(b.adapters_U)
        logits_U = torch.cat(logits) if len(logits) > 1 else logits[0]
        prompt_lps_U: list[list[float | None] | None] = [None] * len(prompts_U)
        if not hidden:
            return logits_U, prompt_lps_U
        head = self.model.get_output_embeddings()
        h_U = torch.cat(hidden) if len(hidden) > 1 else hidden[0]
        # The head alone must reproduce the model's own last logits (up to matmul rounding); a
        # model that does more (logit soft-capping, scaling) is scored with a separate forward.
        cfg = self.model.config
        plain = (head is not None and getattr(cfg, "final_logit_softcapping", None) is None
                 and getattr(cfg, "logit_scale", None) in (None, 1, 1.0))
        if plain:
            tol = max(4 * torch.finfo(h_U.dtype).eps, 1e-4) * (1.0 + float(logits_U.abs().max()))
            plain = float((head(h_U[:, -1]).float() - logits_U).abs().max()) <= tol
        if not plain:
            self.stats.extra["prompt_logprobs_by_separate_forward"] = (
                self.stats.extra.get("prompt_logprobs_by_separate_forward", 0) + 1)
            wanted = [u for u, w in enumerate(want_lp_U) if w]
            for u, lp in zip(wanted, score_tokens(self.model, [prompts_U[u] for u in wanted], self.pad_id,
                                                  bank=self.bank, adapters=[b.adapters_U[u] for u in wanted])):
                prompt_lps_U[u] = lp
            return logits_U, prompt_lps_U
        # Left-padded: prompt u of length n sits at Lp-n..Lp-1; positions Lp-n..Lp-2 predict it.
        h_N, tgt_N, spans = [], [], []
        for u, w in enumerate(want_lp_U):
            if w:
                n = len(prompts_U[u])
                h_N.append(h_U[u, Lp - n : Lp - 1])
                tgt_N.append(ids[u, Lp - n + 1 :])
                spans.append((u, n - 1))
        h_cat, tgt_cat = torch.cat(h_N), torch.cat(tgt_N)
        V = logits_U.shape[-1]
        step = max(1, self.max_logit_elems // V)
        lp_chunks = []
        for a in range(0, h_cat.shape[0], step):
            lg = head(h_cat[a : a + step]).float()
            lp_chunks.append(torch.log_softmax(lg, -1).gather(1, tgt_cat[a : a + step, None]).squeeze(1))
        lp_list = (torch.cat(lp_chunks) if lp_chunks else tgt_cat.float()).tolist()
        k = 0
        for u, m in spans:
            prompt_lps_U[u] = [None] + lp_list[k : k + m]
            k += m
        return logits_U, prompt_lps_U


@torch.no_grad()
def score_tokens(model, seqs: list[list[int]], pad_id: int, max_elems: int = 1 << 27,
                 bank=None, adapters: list | None = None) -> list[list[float | None]]:
    """Per-position logprobs of each sequence's own tokens (first entry None); with a `bank`
    (held serving), sequence k under adapter `adapters[k]`."""
    dev = next(model.parameters()).device
    V = model.config.vocab_size
    out: list[list[float | None]] = [[] for _ in seqs]
    order = list(range(len(seqs)))
    i = 0
    while i < len(order):
        L = len(seqs[order[i]])
        j = i + 1
        while j < len(order) and (j - i + 1) * max(L, len(seqs[order[j]])) * V <= max_elems:
            L = max(L, len(seqs[order[j]]))
            j += 1
        chunk = order[i:j]
        L = max(len(seqs[k]) for k in chunk)
        ids = torch.full((len(chunk), L), pad_id, dtype=torch.long)
        mask = torch.zeros(len(chunk), L, dtype=torch.long)
        for b, k in enumerate(chunk):
            ids[b, : len(seqs[k])] = torch.tensor(seqs[k])
            mask[b, : len(seqs[k])] = 1
        ids, mask = ids.to(dev), mask.to(dev)
        if bank is not None:
            bank.use_rows(bank.load([adapters[k] for k in chunk] if adapters else [None] * len(chunk)))
        logits = model(input_ids=ids, attention_mask=mask).logits.float()
        lp = torch.log_softmax(logits[:, :-1], -1).gather(2, ids[:, 1:, None]).squeeze(2)
        lp_list = lp.tolist()
        for b, k in enumerate(chunk):
            out[k] = [None] + lp_list[b][: len(seqs[k]) - 1]
        i = j
    return out


@torch.no_grad()
def mean_hidden_states(model, seqs: list[list[int]], bank=None, adapter=None) -> torch.Tensor:
    """Each sequence's last hidden state averaged over its own tokens, (len(seqs), d) float32 on
    the CPU: a prompt embedding. One sequence a forward, so padding never enters a mean; with a
    `bank` (held serving), every sequence under `adapter` (None: the bare base), loaded once."""
    dev = next(model.parameters()).device
    if bank is not None:
        bank.use_rows(bank.load([adapter]))
    means = []
    for seq in seqs:
        h = model(input_ids=torch.tensor([seq], device=dev), output_hidden_states=True).hidden_states[-1][0]
        means.append(h.float().mean(dim=0))
    return torch.stack(means).cpu()
