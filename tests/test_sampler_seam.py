"""The sampler seam (`engine.sampler`): the engine reaches generation, scoring and
prompt embeddings through its `Sampler` alone, and the generator-backed sampler is one."""

from __future__ import annotations

import torch
from tinker import types

from fixtures.tiny_model import tiny_model_dir, tiny_tokenizer  # noqa: F401
from engine import LocalServiceClient
from engine.sampler import GeneratorSampler, Sampler
from engine.generate import Row, RowResult, row_key, splitmix64


class FakeSampler:
    """A stand-in sampler: records each call and answers from the prompts alone."""

    max_logit_elems = 1 << 20

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def generate(self, rows: list[Row]) -> list[RowResult]:
        self.calls.append(("generate", rows))
        return [RowResult(tokens=[len(r.prompt), i], logprobs=[-0.5, -0.25], stop_reason="length",
                          prompt_logprobs=[None] + [-1.0] * (len(r.prompt) - 1) if r.prompt_logprobs else None)
                for i, r in enumerate(rows)]

    def score(self, prompts, adapters):
        self.calls.append(("score", prompts, adapters))
        return [[None] + [-float(t) for t in p[1:]] for p in prompts]

    def embed(self, adapter, prompts):
        self.calls.append(("embed", adapter, prompts))
        return torch.tensor([[float(len(p)), float(sum(p))] for p in prompts])


def test_the_engine_samples_scores_and_embeds_through_its_sampler(tiny_model_dir, tiny_tokenizer, tmp_path):
    svc = LocalServiceClient(device="cpu", cache_dir=tmp_path)  # a base of its own: its sampler is replaced
    tc = svc.create_lora_training_client(str(tiny_model_dir), rank=4, seed=0).result()
    base = tc._engine.base
    assert isinstance(base.sampler, GeneratorSampler) and isinstance(base.sampler, Sampler)
    fake = base.sampler = FakeSampler()
    assert isinstance(fake, Sampler)
    sc = tc.save_weights_and_get_sampling_client().result()
    prompt = types.ModelInput.from_ints(tiny_tokenizer.encode("The seam holds"))
    toks = prompt.to_ints()

    scored = sc.compute_logprobs(prompt)  # queued with the samples: one job, scoring first
    sampled = sc.sample(prompt, 2, types.SamplingParams(max_tokens=3, seed=5, stop=[]), include_prompt_logprobs=True)
    resp = sampled.result()
    assert scored.result() == [None] + [-float(t) for t in toks[1:]]
    assert [s.tokens for s in resp.sequences] == [[len(toks), 0], [len(toks), 1]]
    assert [s.logprobs for s in resp.sequences] == [[-0.5, -0.25]] * 2
    assert resp.prompt_logprobs == [None] + [-1.0] * (len(toks) - 1)
    assert [c[0] for c in fake.calls] == ["score", "generate"]
    _, prompts, adapters = fake.calls[0]
    assert prompts == [toks] and adapters == [sc._snapshot]
    rows = fake.calls[1][1]
    # the engine hands the sampler the sampling keys: the seed's, one per sample
    assert [r.key for r in rows] == [row_key(splitmix64(5), s) for s in range(2)]
    assert all(r.adapter is sc._snapshot and r.prompt == toks and r.max_tokens == 3 and r.prompt_logprobs
               for r in rows)

    emb = sc.prompt_embeddings([prompt]).result()
    assert fake.calls[-1] == ("embed", sc._snapshot, [toks])
    assert emb.tolist() == [[float(len(toks)), float(sum(toks))]]
