"""The sampler seam: what the local engine needs from whatever decodes, scores and embeds its rows
(`Sampler`), and the one implementation there is, over `generate.Generator` and the adapter
bank (`GeneratorSampler`). The engine (`engine._Base`) holds one as `sampler` and reaches
generation, `compute_logprobs` and `prompt_embeddings` through it alone."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from engine.generate import Generator, Row, RowResult, mean_hidden_states, score_tokens
from engine.lora_bank import AdapterBank, AdapterWeights
from engine.settings import EngineSettings


@runtime_checkable
class Sampler(Protocol):
    """What the engine asks of a sampler; every call runs on the engine's worker thread, one at a
    time. Another implementation (a FlashInfer batch decode, a vLLM engine) must honour:

    - the sampling keys: row k's draw at decode step t is `generate.uniforms(row_key, t)` of
      its `Row.key` (`generate.row_key(request key, sample index)`), so the same seeds give
      the same tokens whatever else shares the batch;
    - logprobs of the distribution sampled from: a sampled token's logprob is under the
      temperature-scaled (top-k / top-p truncated) distribution it was drawn from, so at
      temperature 1 it is the learner's; a row's `prompt_logprobs` are the model's own (first
      entry None), as `score` gives them;
    - per-row adapters: each row (and each scored prompt) runs under its own `AdapterWeights`
      snapshot from the engine's `AdapterBank` (None: the bare base model), many in one batch;
    - stops: a row ends at any of its `stop_ids` (the token kept) or once its text holds one of its
      `stop_strs`, else at `max_tokens`; `RowResult.stop_reason` says which ("stop" or "length").
    """

    # the most logits one forward may hold (batch x positions x vocabulary); the learner's
    # chunks of LM-head logits are as large
    max_logit_elems: int

    def generate(self, rows: list[Row]) -> list[RowResult]:
        """One result per row, in order (rows of one request share its prompt's prefill)."""
        ...

    def score(self, prompts: list[list[int]], adapters: list[AdapterWeights | None]) -> list[list[float | None]]:
        """Each prompt's per-position logprobs of its own tokens (first entry None), prompt k under
        `adapters[k]`."""
        ...

    def embed(self, adapter: AdapterWeights | None, prompts: list[list[int]]) -> torch.Tensor:
        """(len(prompts), d) float32 on the CPU: each prompt's last hidden state averaged over its
        own tokens, under `adapter`."""
        ...


class GeneratorSampler:
    """The engine's sampler: `generate.Generator` (batched decode, shared prefills, its
    compiled decode graphs) for generation, `score_tokens` and `mean_hidden_states` for scoring
    and embedding, each through the adapter bank held serving."""

    def __init__(self, lm, pad_id: int, tokenizer, bank: AdapterBank, settings: EngineSettings):
        self.lm, self.pad_id, self.bank = lm, pad_id, bank
        self.generator = Generator(lm, pad_id, tokenizer, settings.use_cuda_graphs,
                                   compile_decode=settings.compile_decode, bank=bank,
                                   compile_after=settings.compile_after_batches,
                                   length_bucket=settings.decode_length_bucket,
                                   decode_attention=settings.decode_attention)

    @property
    def max_logit_elems(self) -> int:
        return self.generator.max_logit_elems

    def generate(self, rows: list[Row]) -> list[RowResult]:
        with self.bank.serving():
            return self.generator.generate(rows)

    def score(self, prompts: list[list[int]], adapters: list[AdapterWeights | None]) -> list[list[float | None]]:
        # one padded forward per chunk of prompts (a sample request's prompt logprobs come from its
        # own prefill, in `generate`)
        with self.bank.serving():
            return score_tokens(self.lm, prompts, self.pad_id, self.max_logit_elems, self.bank, adapters)

    def embed(self, adapter: AdapterWeights | None, prompts: list[list[int]]) -> torch.Tensor:
        with self.bank.serving():
            return mean_hidden_states(self.lm, prompts, self.bank, adapter)
