"""One base model, many adapters (issue 23): every training client of the local engine is a LoRA
adapter on one shared base, and one batched decode serves the rows of every client queued when it
runs, each row through its own adapter (`engine/lora_bank.py`).

Exactness on the CPU in fp32, against two independent paths: the same requests sampled per
client (each in its own batch), and peft's own forward with the adapter active scoring what
was sampled. Adapters of different ranks and target modules, with non-zero B matrices.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch
from tinker import types

from fixtures.tiny_model import tiny_model_dir, tiny_tokenizer  # noqa: F401
from engine import LocalServiceClient

# every test here loads the tiny model (the benchmark's test builds its own, without the fixture)
pytestmark = pytest.mark.slow

PROMPTS = ("Hello there", "A longer prompt than the first one", "x y z", "Hello there")


def _service(tmp_path, **kw) -> LocalServiceClient:
    return LocalServiceClient(device="cpu", cache_dir=tmp_path, batch_across_clients=True, **kw)


def _perturbed(service, model_dir, rank, seed, scale=0.3, **lora):
    """A training client whose adapter moves the model (B is zero at init)."""
    tc = service.create_lora_training_client(str(model_dir), rank=rank, seed=seed, **lora).result()
    g = torch.Generator().manual_seed(100 + seed)
    with torch.no_grad():
        for p in tc._engine.params:
            if p.shape[1] == rank:  # B [out, r]
                p.copy_(torch.randn(p.shape, generator=g) * scale)
    return tc


def _requests(tokenizer, n_samples=3, max_tokens=7):
    params = types.SamplingParams(max_tokens=max_tokens, temperature=1.0, stop=[])
    return [(types.ModelInput.from_ints(tokenizer.encode(t)), n_samples, params) for t in PROMPTS]


def _submit(sc, requests, seed0):
    return [sc.sample(p, n, params.model_copy(update={"seed": seed0 + i}), include_prompt_logprobs=True)
            for i, (p, n, params) in enumerate(requests)]


@pytest.fixture()
def clients(tmp_path, tiny_model_dir):
    service = _service(tmp_path)
    tcs = [_perturbed(service, tiny_model_dir, 4, 1),
           _perturbed(service, tiny_model_dir, 8, 2, train_mlp=False),  # attention only, another rank
           _perturbed(service, tiny_model_dir, 4, 3, train_attn=False)]  # MLP only
    return service, tcs


def test_clients_share_one_base_and_an_added_arm_costs_its_adapter_only(clients, tiny_model_dir):
    service, tcs = clients
    bases = {id(tc._engine.base) for tc in tcs}
    assert len(bases) == 1 and len(service._bases) == 1
    base = tcs[0]._engine.base
    base_params = [p for n, p in base.lm.named_parameters() if "lora_" not in n]
    # each adapter's parameters are its own rank's LoRA matrices, nothing of the base
    for tc, (rank, modules) in zip(tcs, ((4, 7), (8, 4), (4, 3))):
        shapes = {tuple(p.shape) for p in tc._engine.params}
        assert all(rank in s for s in shapes) and len(tc._engine.params) == 2 * modules * base.lm.config.num_hidden_layers
        assert not {id(p) for p in tc._engine.params} & {id(p) for p in base_params}
        assert all(p.dtype == torch.float32 for p in tc._engine.params)
    # a fourth client loads nothing: the same base tensors
    before = [p.data_ptr() for p in base_params]
    tc4 = service.create_lora_training_client(str(tiny_model_dir), rank=4, seed=9).result()
    assert tc4._engine.base is base and [p.data_ptr() for p in base_params] == before
    # releasing a client takes its adapter off the base
    name = tc4._engine.name
    tc4.release()
    base.worker.submit(lambda: None).result()
    assert name not in base.adapters and name not in base.peft.peft_config


def test_one_batch_across_adapters_matches_each_adapter_alone_and_peft(clients, tiny_tokenizer):
    service, tcs = clients
    base = tcs[0]._engine.base
    samplers = [tc.save_weights_and_get_sampling_client().result() for tc in tcs]
    samplers.append(service.create_sampling_client(base_model=str(base.src.spec)).result())  # the bare base
    requests = _requests(tiny_tokenizer)
    # each client alone: one batch per client
    alone = [[f.result() for f in _submit(sc, requests, 10 * k)] for k, sc in enumerate(samplers)]
    # every client's requests queued, then one wait: one batch
    batches = base.sampler.generator.stats.batches
    futures = [_submit(sc, requests, 10 * k) for k, sc in enumerate(samplers)]
    mixed = [[f.result() for f in fs] for fs in futures]
    assert base.sampler.generator.stats.batches == batches + 1
    for got_k, want_k in zip(mixed, alone):
        for got, want in zip(got_k, want_k):
            for a, b in zip(got.sequences, want.sequences):
                assert a.tokens == b.tokens and a.stop_reason == b.stop_reason
                assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-5
            assert max(abs(x - y) for x, y in zip(got.prompt_logprobs[1:], want.prompt_logprobs[1:])) < 1e-5
    # the adapters matter: the same seeds under another adapter sample something else
    assert len({tuple(round(x, 5) for x in mixed[k][0].prompt_logprobs[1:]) for k in range(4)}) == 4
    # peft's own path (the adapter active, nothing of the bank) scores the sampled tokens alike
    for tc, got_k in zip(tcs, mixed):
        for (prompt, _, _), resp in zip(requests, got_k):
            for seq in resp.sequences:
                ids = torch.tensor([prompt.to_ints() + seq.tokens])
                with torch.no_grad():
                    logits = tc._engine.model(input_ids=ids).logits[0].double()
                lp = torch.log_softmax(logits, -1)
                n = prompt.length
                ref = [float(lp[n - 1 + t, tok]) for t, tok in enumerate(seq.tokens)]
                assert max(abs(x - y) for x, y in zip(seq.logprobs, ref)) < 1e-4
    # the batch's composition is its submission order: the same submissions give the same bits
    again = [[f.result() for f in fs] for fs in [_submit(sc, requests, 10 * k) for k, sc in enumerate(samplers)]]
    assert [[[s.logprobs for s in r.sequences] for r in k] for k in again] == \
           [[[s.logprobs for s in r.sequences] for r in k] for k in mixed]


def test_scoring_across_adapters_matches_scoring_alone(clients, tiny_tokenizer):
    service, tcs = clients
    samplers = [tc.save_weights_and_get_sampling_client().result() for tc in tcs]
    prompts = [types.ModelInput.from_ints(tiny_tokenizer.encode(t)) for t in PROMPTS]
    alone = [[sc.compute_logprobs(p).result() for p in prompts] for sc in samplers]
    futures = [[sc.compute_logprobs(p) for p in prompts] for sc in samplers]
    mixed = [[f.result() for f in fs] for fs in futures]
    for got_k, want_k in zip(mixed, alone):
        for got, want in zip(got_k, want_k):
            assert got[0] is None and max(abs(x - y) for x, y in zip(got[1:], want[1:])) < 1e-5
    assert mixed[0] != mixed[1]


def _datums(tokenizer, n=4):
    data = []
    for i, t in enumerate(PROMPTS[:n]):
        toks = tokenizer.encode(t) + [5, 6, 7]
        data.append(types.Datum(model_input=types.ModelInput.from_ints(toks[:-1]), loss_fn_inputs={
            "target_tokens": toks[1:], "logprobs": [0.0] * (len(toks) - 1),
            "advantages": [0.5 - 0.3 * i] * (len(toks) - 1)}))
    return data


def test_a_released_client_gives_back_its_weights_gradients_and_moments_while_its_sampler_lives(
        tmp_path, tiny_model_dir, tiny_tokenizer):
    """A run's units train, then evaluate in the same process: a unit done training must not keep
    its adapter's memory because something still holds its client or a sampling client taken from
    it (the sampler names the adapter as its owner). After `release` (and the worker's removal
    job) the adapter's parameters, their last gradients and AdamW's moments are all unreachable;
    another client on the base still trains."""
    import gc
    import weakref

    service = _service(tmp_path)
    tc = service.create_lora_training_client(str(tiny_model_dir), rank=4, seed=3).result()
    other = service.create_lora_training_client(str(tiny_model_dir), rank=4, seed=4).result()
    data = _datums(tiny_tokenizer)
    tc.forward_backward(data, "importance_sampling").result()
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    tc.forward_backward(data, "importance_sampling").result()  # gradients held again
    sampler = tc.save_weights_and_get_sampling_client().result()
    params = list(tc._engine.params)
    moments = [t for st in tc._opt.state.values() for t in st.values() if torch.is_tensor(t) and t.numel() > 1]
    assert params and len(moments) == 2 * len(params) and all(p.grad is not None for p in params)
    refs = [weakref.ref(t) for t in params + [p.grad for p in params] + moments]
    del params, moments
    tc.release()
    base = other._engine.base
    base.worker.submit(lambda: None).result()
    gc.collect()
    assert sampler._owner is tc._engine  # the sampler (and the client) live on ...
    assert [r for r in refs if r() is not None] == []  # ... none of the adapter's tensors do
    assert other.forward_backward(data, "importance_sampling").result().metrics["loss:sum"] != 0.0


def test_training_stays_per_adapter_and_matches_an_adapter_alone(tmp_path, tiny_model_dir, tiny_tokenizer):
    data = _datums(tiny_tokenizer)
    adam = types.AdamParams(learning_rate=1e-2)
    shared = _service(tmp_path / "shared")
    a = shared.create_lora_training_client(str(tiny_model_dir), rank=4, seed=7).result()
    b = shared.create_lora_training_client(str(tiny_model_dir), rank=8, seed=8).result()
    b_before = [p.detach().clone() for p in b._engine.params]
    # interleaved: a's forward_backward, b's, then a's optim_step; b's gradient never reaches a
    fa = a.forward_backward(data, "importance_sampling")
    fb = b.forward_backward(data[:2], "importance_sampling")
    fa.result(), fb.result()
    a.optim_step(adam).result()
    assert all(torch.equal(x, y) for x, y in zip(b_before, b._engine.params))  # b's step not taken yet
    b.optim_step(adam).result()
    # a alone on a base of its own: the same update, to float32 rounding
    alone = LocalServiceClient(device="cpu", cache_dir=tmp_path / "alone").create_lora_training_client(
        str(tiny_model_dir), rank=4, seed=7).result()
    out = alone.forward_backward(data, "importance_sampling").result()
    alone.optim_step(adam).result()
    for x, y in zip(a._engine.params, alone._engine.params):
        assert torch.allclose(x, y, atol=1e-6, rtol=0)
    assert out.metrics["loss:sum"] == pytest.approx(fa.result().metrics["loss:sum"], abs=1e-6)
    assert any(not torch.equal(x, y) for x, y in zip(b_before, b._engine.params))


def test_a_flush_waits_for_a_busy_client_and_batches_both(tmp_path, tiny_model_dir, tiny_tokenizer):
    """Arms in parallel threads: arm A waits on its samples while arm B's training job still
    runs; the flush waits for B's samples and one batch serves both."""
    service = _service(tmp_path)
    a = _perturbed(service, tiny_model_dir, 4, 1)
    b = _perturbed(service, tiny_model_dir, 4, 2)
    base = a._engine.base
    sa, sb = a.save_weights_and_get_sampling_client().result(), b.save_weights_and_get_sampling_client().result()
    requests = _requests(tiny_tokenizer, n_samples=1, max_tokens=3)
    for sc in (sa, sb):  # both have sampled before: both take part in a flush
        [f.result() for f in _submit(sc, requests, 0)]
    release = threading.Event()
    busy = b._engine.submit(release.wait, 30)  # B's "training" holds the worker
    batches = base.sampler.generator.stats.batches
    got: dict = {}
    thread = threading.Thread(target=lambda: got.update(a=[f.result() for f in _submit(sa, requests, 1)]))
    thread.start()
    thread.join(0.5)
    assert thread.is_alive()  # A waits: B is busy and has nothing queued
    futures_b = _submit(sb, requests, 2)
    release.set()
    busy.result()
    got["b"] = [f.result() for f in futures_b]  # B waits on its samples: ready
    thread.join(30)
    assert base.sampler.generator.stats.batches == batches + 1
    assert len(got["a"]) == len(got["b"]) == len(requests)


def test_a_flush_waits_for_a_client_in_its_step_until_it_waits_on_its_next_samples(tmp_path, tiny_model_dir, tiny_tokenizer):
    """A client whose samples came back is in its step (grading, training) until it waits on new
    samples, however long that takes: a flush waits for it, and one batch serves both. Requests it
    has queued but not yet waited on (still submitting its step) do not end the wait."""
    service = _service(tmp_path)
    a = _perturbed(service, tiny_model_dir, 4, 1)
    b = _perturbed(service, tiny_model_dir, 4, 2)
    base = a._engine.base
    sa, sb = a.save_weights_and_get_sampling_client().result(), b.save_weights_and_get_sampling_client().result()
    requests = _requests(tiny_tokenizer, n_samples=1, max_tokens=3)
    futures = [_submit(sc, requests, 0) for sc in (sa, sb)]  # both have sampled, in one batch:
    [f.result() for fs in futures for f in fs]  # their samples came back just now
    threading.Event().wait(0.5)  # B grades for longer than the old 0.25 s window
    batches = base.sampler.generator.stats.batches
    got: dict = {}
    thread = threading.Thread(target=lambda: got.update(a=[f.result() for f in _submit(sa, requests, 1)]))
    thread.start()
    thread.join(1.0)
    assert thread.is_alive()  # A waits: B is in its step
    futures_b = _submit(sb, requests[:2], 2)  # B's step half submitted: not ready yet
    thread.join(0.5)
    assert thread.is_alive()
    futures_b += _submit(sb, requests[2:], 4)
    got["b"] = [f.result() for f in futures_b]  # B waits on its samples: ready
    thread.join(30)
    assert base.sampler.generator.stats.batches == batches + 1
    assert len(got["a"]) == len(got["b"]) == len(requests)


def test_a_flush_never_waits_for_a_client_its_own_thread_used_before(tmp_path, tiny_model_dir, tiny_tokenizer):
    """One caller using two clients one after the other (a benchmark, a preflight): the first is
    in its step, but only this thread would queue its next samples, so there is nothing to wait for."""
    service = _service(tmp_path, gather_busy_s=30.0)
    a = _perturbed(service, tiny_model_dir, 4, 1)
    b = _perturbed(service, tiny_model_dir, 4, 2)
    sa, sb = a.save_weights_and_get_sampling_client().result(), b.save_weights_and_get_sampling_client().result()
    requests = _requests(tiny_tokenizer, n_samples=1, max_tokens=3)
    [f.result() for f in _submit(sa, requests, 0)]
    assert a._engine.stepping
    t = time.monotonic()
    [f.result() for f in _submit(sb, requests, 1)]
    assert time.monotonic() - t < 10 and not a._engine.stray


def test_a_flush_waits_neither_for_a_client_taken_off_the_base_nor_twice_for_a_stray(tmp_path, tiny_model_dir, tiny_tokenizer):
    """A client whose arm is done (released) is not waited for. One that stays in its step past
    `gather_busy_s` is waited for once: the batch goes without it, and the next flush does not
    wait for it until it waits on samples again."""
    service = _service(tmp_path, gather_busy_s=1.0)
    a = _perturbed(service, tiny_model_dir, 4, 1)
    b = _perturbed(service, tiny_model_dir, 4, 2)
    c = _perturbed(service, tiny_model_dir, 4, 3)
    base = a._engine.base
    samplers = [tc.save_weights_and_get_sampling_client().result() for tc in (a, b, c)]
    requests = _requests(tiny_tokenizer, n_samples=1, max_tokens=3)
    futures = [_submit(sc, requests, 0) for sc in samplers]
    helper = threading.Thread(target=lambda: [f.result() for f in futures[1]])  # B's own thread
    helper.start()
    helper.join(30)
    [f.result() for fs in futures for f in fs]  # all three in their step
    c.release()
    base.worker.submit(lambda: None).result()
    assert c._engine.name not in base.adapters
    t = time.monotonic()
    [f.result() for f in _submit(samplers[0], requests, 1)]  # waits for B (in its step) only, then goes
    assert 1.0 <= time.monotonic() - t < 10
    assert b._engine.stray and not a._engine.stray
    t = time.monotonic()
    [f.result() for f in _submit(samplers[0], requests, 2)]  # B is a stray: no wait
    assert time.monotonic() - t < 1.0
    helper = threading.Thread(target=lambda: [f.result() for f in _submit(samplers[1], requests, 3)])
    helper.start()  # B samples again: back in step
    helper.join(30)
    assert not b._engine.stray and b._engine.stepping


def test_a_new_bank_layout_never_reuses_a_decoder_built_on_the_old_one(tmp_path, tiny_model_dir, tiny_tokenizer):
    """A captured decode graph reads the bank's stacks by address: when an adapter adds projections
    (a new layout, new stacks), the static-cache decoder of the old layout is not used again."""
    import dataclasses

    from engine.generate import Generator, Row

    service = _service(tmp_path)
    a = _perturbed(service, tiny_model_dir, 4, 1, train_mlp=False)  # attention only
    base = a._engine.base
    gen = Generator(base.lm, base.pad_id, base.tokenizer, static_cache=True, bank=base.bank)
    rows = [Row(prompt=tiny_tokenizer.encode("Hello there"), max_tokens=5, key=3, adapter=a._engine.snapshot_live())]
    with base.bank.serving():
        first = gen.generate(rows)
    (key_before,) = gen._graphs
    version = base.bank.version
    b = _perturbed(service, tiny_model_dir, 4, 2, train_attn=False)  # MLP only: peft wraps new projections
    assert base.bank.version > version
    rows_ab = rows + [dataclasses.replace(rows[0], adapter=b._engine.snapshot_live(), key=4)]
    with base.bank.serving():
        again = gen.generate(rows_ab)
    (key_after,) = gen._graphs
    assert key_after != key_before
    fresh = Generator(base.lm, base.pad_id, base.tokenizer, static_cache=True, bank=base.bank)
    with base.bank.serving():
        want = fresh.generate(rows_ab)
    assert [r.tokens for r in again] == [r.tokens for r in want] and again[0].tokens == first[0].tokens


def test_a_decode_shape_is_compiled_on_its_compile_after_th_batch_only(tmp_path, tiny_model_dir, tiny_tokenizer):
    """A shape seen fewer than `compile_after` times (the fixed stages' pilots, an eval's few
    batches) runs the eager step; its `compile_after`-th batch gets a compiled decoder, and later
    batches keep it. The engine's default is COMPILE_AFTER_BATCHES, a benchmark's 1. (Only which
    decoder is built is checked: nothing compiles on this CPU.)"""
    from engine.generate import COMPILE_AFTER_BATCHES, Generator, Row, _pack

    service = _service(tmp_path)
    a = _perturbed(service, tiny_model_dir, 4, 1)
    base = a._engine.base
    assert base.sampler.generator.compile_after == COMPILE_AFTER_BATCHES == 8
    assert _service(tmp_path, compile_after_batches=1).settings.compile_after_batches == 1
    gen = Generator(base.lm, base.pad_id, base.tokenizer, static_cache=True, bank=base.bank, compile_after=3)
    gen.compile_decode = True  # as on CUDA

    snapshot = a._engine.snapshot_live()

    def decoder(n_rows):
        rows = [Row(prompt=tiny_tokenizer.encode("Hello there"), max_tokens=4, key=k, adapter=snapshot)
                for k in range(n_rows)]
        with base.bank.serving():
            b = _pack(rows, base.pad_id, True, gen.device)
            gen._use_rows([r.adapter for r in rows], decode=True)  # as `_generate` does: buffers, decoder, prefill
            dec = gen._decoder(b)
            gen._prefill(b, dec)
            return dec

    one_tile = base.bank.tile_rows  # the engine's tiled bank decodes whole tiles of one adapter
    first = decoder(one_tile)
    assert not first.compiled
    other = decoder(2 * one_tile)  # another shape, once: eager too
    assert not other.compiled
    assert not decoder(one_tile).compiled  # its second batch
    third = decoder(one_tile)
    assert third.compiled and third is not first
    assert decoder(one_tile) is third


def test_on_a_bf16_base_the_bank_stays_float32_and_matches_peft(tmp_path, tiny_model_dir, tiny_tokenizer):
    """On a half-precision base (CUDA's) the stacks stay float32, as peft keeps the adapters:
    a batch across adapters samples the logprobs peft's own path gives, to float32 rounding at
    nearly every token. Not at all of them: peft's reference is one full forward, the engine a
    prefill and decode steps, and where a bf16 hidden state lies near a rounding boundary the two
    GEMM shapes round it apart (an AVX2 CPU's kernels do at 2 of 40 tokens, up to 0.03 nats; an
    AVX-512 one's did at none). The other adapter's reference is off by nats: the bound still
    tells the adapters apart."""
    service = _service(tmp_path, dtype="bfloat16")
    tcs = [_perturbed(service, tiny_model_dir, 4, 1, scale=0.03), _perturbed(service, tiny_model_dir, 8, 2, scale=0.03)]
    base = tcs[0]._engine.base
    samplers = [tc.save_weights_and_get_sampling_client().result() for tc in tcs]
    futures = [_submit(sc, _requests(tiny_tokenizer, n_samples=1, max_tokens=5), 10 * k) for k, sc in enumerate(samplers)]
    mixed = [[f.result() for f in fs] for fs in futures]
    assert base.bank.dtype == torch.float32 and base.lm.get_input_embeddings().weight.dtype == torch.bfloat16
    def off(tc, prompt, seq) -> list[float]:  # |sampled logprob - peft's| at each token, under tc's adapter
        with torch.no_grad():
            logits = tc._engine.model(input_ids=torch.tensor([prompt.to_ints() + seq.tokens])).logits[0].double()
        lp = torch.log_softmax(logits, -1)
        return [abs(x - float(lp[prompt.length - 1 + t, tok])) for t, (x, tok) in enumerate(zip(seq.logprobs, seq.tokens))]

    own: list[float] = []
    for k, (tc, got_k) in enumerate(zip(tcs, mixed)):
        for (prompt, _, _), resp in zip(_requests(tiny_tokenizer), got_k):
            seq = resp.sequences[0]
            own += off(tc, prompt, seq)
            assert max(off(tcs[1 - k], prompt, seq)) > 1.0  # the other adapter's numbers are far off
    assert max(own) < 0.1 and sum(d < 1e-3 for d in own) >= 0.9 * len(own), sorted(own)[-5:]


def test_the_adapters_benchmark_runs_one_rl_step_of_every_arm_per_row(capsys):
    """`benchmarks/engine_speed.py --adapters` on the tiny model: one row per adapter count, every arm's
    step samples one batch."""
    from fixtures.benchmarks import load_benchmark

    engine = load_benchmark("engine_speed")
    assert engine.main(["--config", "tiny", "--batch", "2", "--new-tokens", "3", "--prompt-tokens", "6",
                        "--rank", "4", "--adapters", "1,3", "--repeats", "1", "--device", "cpu"]) == 0
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines()
            if line.startswith("| 1 |") or line.startswith("| 3 |")]
    assert [(int(r[0]), int(r[1]), float(r[2])) for r in rows] == [(1, 2, 1.0), (3, 6, 1.0)]  # one batch each


def _step_profile(argv: list[str]):
    """`benchmarks/step_profile.py` run on `argv` (the tiny model's CPU smoke path); its module."""
    import importlib.util
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[1] / "benchmarks"
    sys.path.insert(0, str(bench))
    try:
        spec = importlib.util.spec_from_file_location("step_profile", bench / "step_profile.py")
        profile = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(profile)
        assert profile.main(["--config", "tiny", "--device", "cpu", "--batch", "4", "--prompt-tokens", "8",
                             "--train-new-tokens", "8", *argv]) == 0
    finally:
        sys.path.remove(str(bench))
    return profile


@pytest.mark.parametrize("form", ["dense", "tiled"])
def test_the_step_profile_runs_each_bank_form_and_prints_its_table(form, capsys):
    """`benchmarks/step_profile.py` on the tiny model (its CPU smoke path): a row per adapter
    count, then the learner's profile."""
    _step_profile(["--adapters", "1,2", "--new-tokens", "4", "--bank-decode", form])
    out = capsys.readouterr().out
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| 1 |") or line.startswith("| 2 |")]
    assert [(int(r[0]), int(r[1]), r[2].strip()) for r in rows] == [(1, 64 if form == "tiled" else 4, form),
                                                                    (2, 128 if form == "tiled" else 8, form)]
    assert "== training: forward_backward of 4 datums" in out


def test_the_learner_profile_runs_alone_and_sorts_kernels_by_kind(capsys):
    """`step_profile.py --skip-decode`: the learner's profile without any decode; its kernel kinds
    from names cuBLAS, flash attention and inductor give their kernels."""
    from types import SimpleNamespace

    profile = _step_profile(["--skip-decode"])
    out = capsys.readouterr().out
    assert "== training: forward_backward of 4 datums x 15 tokens" in out and "== 1 adapters" not in out
    kind = profile.kernel_kind
    assert kind("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32") == "GEMM tf32"
    assert kind("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n") == "GEMM bf16"
    assert kind("ampere_sgemm_128x64_tn") == "GEMM float32"
    assert kind("nvjet_sm90_tst_128x256_64x4_1x2_h_bz_coopB_NTT").startswith("GEMM nvjet")
    assert kind("pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel") == "attention"
    assert kind("triton_poi_fused__to_copy_add_mul_3") == "triton (fused elementwise, reductions)"
    assert kind("void at::native::elementwise_kernel<128, 2, direct_copy_kernel_cuda>") == "copies, casts, fills"
    assert kind("void at::native::reduce_kernel<512, 1>") == "other"

    from torch.autograd import DeviceType

    def event(key, us, device=DeviceType.CUDA):
        return SimpleNamespace(key=key, self_device_time_total=us, device_type=device, is_user_annotation=False)

    class FakeProfile:  # a fake profiler result: two GEMMs and a Triton kernel, in microseconds
        def key_averages(self):
            return [event("ampere_sgemm_128x64_tn", 300_000.0), event("sm90_xmma_gemm_bf16bf16_bf16f32", 600_000.0),
                    event("triton_red_fused_0", 100_000.0),
                    # the op that launched the float32 GEMM: its self device time is that kernel's again
                    event("aten::mm", 300_000.0, DeviceType.CPU)]

    table = profile.kind_table(FakeProfile(), cuda=True).splitlines()
    assert table[2:] == ["| GEMM bf16 | 0.600 | 60 % |", "| GEMM float32 | 0.300 | 30 % |",
                         "| triton (fused elementwise, reductions) | 0.100 | 10 % |", "| all | 1.000 | 100 % |"]


def test_tile_layout_groups_rows_by_slot_in_whole_tiles():
    from engine.lora_bank import tile_layout

    assert tile_layout([0, 1, 0, -1, 1, 0], 2) == [0, 2, 5, None, 1, 4, 3, None]
    assert tile_layout([3, 3, 3, 3], 4) == [0, 1, 2, 3]


def _same_draws(pairs, tol: float, max_forks: float = 0.02) -> None:
    """Each (got, reference) row drew the same tokens with logprobs within `tol`, up to where the
    two forked, if they did: a row's float sums differ in their last bits between a batch and the
    same rows alone wherever the CPU's GEMM blocks the two shapes differently (an AVX2 machine's
    kernels do; an AVX-512 one's gave bit-equal draws), and a draw that lands within that much
    of a token boundary takes the neighbouring token. So at most `max_forks` of the rows (at
    least one) may fork, each only after a shared prefix whose logprobs agree within `tol`;
    every other row matches whole."""
    forks = 0
    for got, ref in pairs:
        n = next((t for t, (a, b) in enumerate(zip(got.tokens, ref.tokens)) if a != b), None)
        if n is None:
            assert got.tokens == ref.tokens and got.stop_reason == ref.stop_reason
            n = len(got.tokens)
        else:
            forks += 1
        assert max((abs(x - y) for x, y in zip(got.logprobs[:n], ref.logprobs[:n])), default=0.0) < tol
    assert forks <= max(1, int(max_forks * len(pairs))), f"{forks} of {len(pairs)} rows forked"


@pytest.mark.parametrize("form", ["dense", "tiled"])
def test_the_static_decode_at_the_users_shape_matches_each_adapter_alone(form, tmp_path, tiny_model_dir, tiny_tokenizer):
    """The CUDA decode path (a static KV cache and the bank's decode form: dense stacks, or rows
    laid out in tiles of one adapter each with the shrink split along `in`), run eagerly on the
    CPU at the user's shape: two arms of different ranks and targets and the bare base, each 8
    prompts x 8 samples, their requests interleaved as a shared queue holds them. Every row gets
    the tokens and logprobs its adapter gives alone, wherever the layout put it."""
    from engine.generate import Generator, Row, row_key

    service = _service(tmp_path, bank_decode=form)
    tcs = [_perturbed(service, tiny_model_dir, 4, 1), _perturbed(service, tiny_model_dir, 8, 2, train_mlp=False)]
    base = tcs[0]._engine.base
    assert base.bank.decode_form == form and base.bank.tile_rows == 64
    base.bank.split_cols = 16  # the tiny model's 32- and 64-wide inputs split in 2 and 4 chunks
    snaps = [tc._engine.snapshot_live() for tc in tcs] + [None]
    prompts = [tiny_tokenizer.encode("question %d " % i * (1 + i % 3)) for i in range(8)]
    rows_A = [[Row(prompt=p, max_tokens=6, key=row_key(1000 * k + i, s), adapter=a)
               for i, p in enumerate(prompts) for s in range(8)] for k, a in enumerate(snaps)]
    queue = [row for i in range(8) for rows in rows_A for row in rows[8 * i:8 * i + 8]]
    static = Generator(base.lm, base.pad_id, base.tokenizer, static_cache=True, bank=base.bank)
    with base.bank.serving():
        got = static.generate(queue)
        if form == "tiled":  # 3 tiles of 64 rows, the shrink in chunks
            assert base.bank.decode_bufs.A_T[0].shape[:2] == (3, 2)
        else:
            assert base.bank.decode_bufs.onehot_N_K.shape[0] == 192
        # each arm alone on the same path, and on the per-slot path (a dynamic cache: other
        # attention shapes too, hence the looser bound)
        alone = [Generator(base.lm, base.pad_id, base.tokenizer, static_cache=True, bank=base.bank).generate(rows)
                 for rows in rows_A]
        per_slot = [Generator(base.lm, base.pad_id, base.tokenizer, static_cache=False, bank=base.bank).generate(rows)
                    for rows in rows_A]
    for refs, tol in ((alone, 1e-5), (per_slot, 5e-5)):
        want = {id(row): res for rows, results in zip(rows_A, refs) for row, res in zip(rows, results)}
        _same_draws([(res, want[id(row)]) for row, res in zip(queue, got)], tol)
    # the adapters matter: one prompt's first sample differs across the three
    assert len({tuple(alone[k][0].tokens) + tuple(round(x, 4) for x in alone[k][0].logprobs) for k in range(3)}) == 3


@pytest.mark.parametrize("form", ["dense", "tiled"])
def test_a_static_prefill_in_chunks_gives_the_one_forward_tokens_and_never_exceeds_its_positions(
        form, tmp_path, tiny_model_dir, tiny_tokenizer):
    """A batch's prompts prefill in chunks of at most `prefill_positions` positions, each written
    into the static decoder's cache as it comes (an eval's 1,024 prompts in one forward ran an 80 GB
    H100 out of memory, results/h200-engine/h100-s30/units). At the user's shape (two arms of
    different ranks and targets and the bare base, 8 prompts x 8 samples each, interleaved) with
    chunks of a few prompts: every forward holds at most that many positions, the chunks cover
    the 24 distinct prompts once, and every row's tokens, logprobs and prompt logprobs are those of
    the same batch prefilled in one forward."""
    from engine.generate import Generator, Row, row_key

    service = _service(tmp_path, bank_decode=form)
    tcs = [_perturbed(service, tiny_model_dir, 4, 1), _perturbed(service, tiny_model_dir, 8, 2, train_mlp=False)]
    base = tcs[0]._engine.base
    base.bank.split_cols = 16
    snaps = [tc._engine.snapshot_live() for tc in tcs] + [None]
    prompts = [tiny_tokenizer.encode("question %d " % i * (1 + i % 3)) for i in range(8)]
    rows_A = [[Row(prompt=p, max_tokens=6, key=row_key(1000 * k + i, s), adapter=a, prompt_logprobs=s == 0)
               for i, p in enumerate(prompts) for s in range(8)] for k, a in enumerate(snaps)]
    queue = [row for i in range(8) for rows in rows_A for row in rows[8 * i:8 * i + 8]]
    Lp = max(len(p) for p in prompts)
    chunk_positions = 5 * Lp  # 5 prompts a forward: 24 distinct prompts in 5 chunks
    gen = Generator(base.lm, base.pad_id, base.tokenizer, static_cache=True, bank=base.bank,
                    prefill_positions=chunk_positions)
    prefill_inputs: list[tuple[int, int]] = []
    caches_alive: list[list[int]] = []  # the chunked generator's static decoders' rows, at each prefill forward

    def count(_module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None and ids.shape[1] > 1:  # a prefill (a decode step feeds one position)
            prefill_inputs.append(tuple(ids.shape))
            caches_alive.append(sorted(d.B for d in gen._graphs.values()))

    hook = base.lm.register_forward_pre_hook(count, with_kwargs=True)
    try:
        with base.bank.serving():
            one = Generator(base.lm, base.pad_id, base.tokenizer, static_cache=True, bank=base.bank).generate(queue)
            assert prefill_inputs == [(24, Lp)]
            gen.generate(queue[:8])  # another shape first (one arm's prompt, a tile): its cache must go
            small_rows = caches_alive[-1]
            prefill_inputs.clear()
            caches_alive.clear()
            chunked = gen.generate(queue)
    finally:
        hook.remove()
    assert prefill_inputs == [(5, Lp)] * 4 + [(4, Lp)]
    assert all(rows * length <= chunk_positions for rows, length in prefill_inputs)
    # while the batch prefills, its own decoder is the one static cache alive (the smaller shape's went first)
    assert caches_alive == [[len(gen._layout(queue))]] * 5 and small_rows != caches_alive[0]
    _same_draws(list(zip(chunked, one)), 1e-5)
    for got, want in zip(chunked, one):
        assert (got.prompt_logprobs is None) == (want.prompt_logprobs is None)
        if want.prompt_logprobs is not None:
            assert got.prompt_logprobs[0] is None and want.prompt_logprobs[0] is None
            assert max(abs(x - y) for x, y in zip(got.prompt_logprobs[1:], want.prompt_logprobs[1:])) < 1e-5
    assert sum(r.prompt_logprobs is not None for r in chunked) == 24  # each prompt's first sample asked


@pytest.mark.parametrize("form", ["dense", "tiled"])
@pytest.mark.parametrize("tile_rows,n_prompts", [(4, 6), (64, 64)], ids=["demo", "user_B64"])
def test_a_static_decode_moves_its_last_rows_to_a_smaller_decoder_and_keeps_their_tokens(
        form, tile_rows, n_prompts, tmp_path, tiny_model_dir, tiny_tokenizer):
    """Rows that stop early (their max_tokens here, a stop token in an eval) leave a static decoder
    mostly idle: once the rows still decoding fit in half its rows, they move to a decoder of that
    many (tiles of one adapter each, as a batch is laid out). Two arms and the bare base, 2 rows
    per prompt of 1 to 12 new tokens, greedy and sampled; small tiles, and the engine's 64-row
    tiles at 64 prompts (each adapter's 128 rows, as an eval's). Every row's tokens, stop reason
    and logprobs are those of the same batch never compacted, and the decode did less work."""
    from engine.generate import Generator, Row, row_key

    service = _service(tmp_path, bank_decode=form)
    tcs = [_perturbed(service, tiny_model_dir, 4, 1), _perturbed(service, tiny_model_dir, 8, 2, train_mlp=False)]
    base = tcs[0]._engine.base
    assert base.bank.tile_rows == 64
    base.bank.tile_rows = tile_rows
    snaps = [tc._engine.snapshot_live() for tc in tcs] + [None]
    prompts = [tiny_tokenizer.encode("question %d " % i * (1 + i % 3)) for i in range(n_prompts)]
    rows = [Row(prompt=p, max_tokens=1 + (5 * i + 3 * k + s) % 12, key=row_key(100 * k + i, s), adapter=a,
                temperature=(0.0 if (i + s) % 4 == 0 else 1.0))
            for i, p in enumerate(prompts) for k, a in enumerate(snaps) for s in range(2)]
    results = {}
    for compact in (False, True):
        gen = Generator(base.lm, base.pad_id, base.tokenizer, static_cache=True, bank=base.bank, compact=compact)
        with base.bank.serving():
            results[compact] = (gen.generate(rows), gen.stats)
    (plain, plain_stats), (compacted, stats) = results[False], results[True]
    assert plain_stats.compactions == 0 and stats.compactions >= 1
    assert stats.row_steps < 0.8 * plain_stats.row_steps
    for row, want, got in zip(rows, plain, compacted):
        assert got.tokens == want.tokens and got.stop_reason == want.stop_reason
        assert len(got.tokens) == row.max_tokens  # no stop tokens asked for: each runs to its length
        assert max(abs(x - y) for x, y in zip(got.logprobs, want.logprobs)) < 1e-5
    # the last decoder is the only static cache the generator keeps
    assert len(gen._graphs) == 1 and next(iter(gen._graphs.values())).B <= len(rows) // 2


def test_a_graphed_batch_holds_64_rows_at_least_and_a_multiple_of_128_above(tmp_path, tiny_model_dir, tiny_tokenizer):
    """A lone arm's 64 rows (one tile) graph as 64, not 128 (half the KV read and rows sampled a
    step); larger batches take a multiple of 128 rows, so a run's sizes share few graphs. Laid
    out through the generator's own `_layout` as the CUDA path pads a batch: the tiled bank's
    tiles first, then the graphed rows' pads."""
    from engine.generate import Generator, Row, graphed_rows, row_key

    assert [graphed_rows(n) for n in (1, 16, 64, 65, 128, 129, 384, 1000, 1024)] == [
        64, 64, 64, 128, 128, 256, 384, 1024, 1024]
    service = _service(tmp_path)
    tcs = [_perturbed(service, tiny_model_dir, 4, k) for k in (1, 2, 3)]
    base = tcs[0]._engine.base
    snaps = [tc._engine.snapshot_live() for tc in tcs]
    gen = Generator(base.lm, base.pad_id, base.tokenizer, static_cache=True, bank=base.bank)
    gen.use_cuda_graphs = True  # the CUDA path's layout; nothing here decodes
    prompt = tiny_tokenizer.encode("question")
    for counts, want in (((64,), 64), ((16,), 64), ((64, 64), 128), ((64, 1), 128), ((64, 64, 1), 256), ((100,), 128)):
        rows = [Row(prompt=prompt, max_tokens=4, key=row_key(i, k), adapter=snaps[k])
                for k, n in enumerate(counts) for i in range(n)]
        order = gen._layout(rows)
        assert len(order) == want, (counts, len(order))
        assert sorted(o for o in order if o is not None) == list(range(len(rows)))


def test_an_unknown_bank_decode_form_is_refused(tmp_path):
    from schemas.errors import UserError

    with pytest.raises(UserError, match="bank decode form 'sparse'"):
        _service(tmp_path, bank_decode="sparse")


@pytest.mark.parametrize("n_prompts,max_tokens", [(4, 6), (64, 12)], ids=["demo", "user_B64"])
def test_a_smaller_decode_length_bucket_keeps_every_token_and_holds_fewer_positions(
        n_prompts, max_tokens, tmp_path, tiny_model_dir, tiny_tokenizer):
    """`decode_length_bucket` sizes the static KV to the batch (a multiple of 16 positions, not
    1,024): every row of a two-adapter batch, at the demo's shape and the user's B = 64, gets the
    tokens it gets under the default 1,024 positions, logprobs within float32 rounding, from a cache
    of fewer positions."""
    from engine.generate import Generator, Row, row_key

    service = _service(tmp_path, decode_length_bucket=16)
    tcs = [_perturbed(service, tiny_model_dir, 4, 1), _perturbed(service, tiny_model_dir, 8, 2, train_mlp=False)]
    base = tcs[0]._engine.base
    assert base.sampler.generator.length_bucket == 16  # the service's setting reaches the engine's generator
    snaps = [tc._engine.snapshot_live() for tc in tcs]
    prompts = [tiny_tokenizer.encode("question %d " % i * (1 + i % 3)) for i in range(n_prompts)]
    rows = [Row(prompt=p, max_tokens=max_tokens, key=row_key(1000 * k + i, 0), adapter=a)
            for k, a in enumerate(snaps) for i, p in enumerate(prompts)]
    runs = {}
    engine_gen = base.sampler.generator
    engine_gen.static_cache = True  # as on CUDA: the engine's own sampler, at its bucket of 16
    reference = Generator(base.lm, base.pad_id, base.tokenizer, static_cache=True, bank=base.bank,
                          length_bucket=1024)  # the default, named
    for bucket, gen in ((1024, reference), (16, engine_gen)):
        if gen is engine_gen:
            runs[bucket] = base.sampler.generate(rows)
        else:
            with base.bank.serving():
                runs[bucket] = gen.generate(rows)
        (dec,) = gen._graphs.values()
        runs[bucket, "positions"] = dec.max_len
        runs[bucket, "kv_bytes"] = sum(t.numel() * t.element_size() for t in dec.cache.k + dec.cache.v)
    longest = max(len(p) for p in prompts) + max_tokens
    assert runs[1024, "positions"] == 1024
    assert runs[16, "positions"] == -(-longest // 16) * 16 < 1024
    assert runs[16, "kv_bytes"] * 1024 == runs[1024, "kv_bytes"] * runs[16, "positions"]
    assert engine_gen.decode_attention == reference.decode_attention == "flex"  # the default, as on CUDA
    for got, want in zip(runs[16], runs[1024]):
        assert got.tokens == want.tokens and got.stop_reason == want.stop_reason
        # FlexAttention's reference sums a row over all its cache's positions: another count of
        # masked positions, another order (the flex test's bound below)
        assert max(abs(x - y) for x, y in zip(got.logprobs, want.logprobs)) < 5e-5
    assert len({tuple(r.tokens) for r in runs[16]}) > 1  # rows differ: the check could fail


def test_the_decode_length_bucket_comes_from_the_service_or_the_environment_and_is_checked(tmp_path, monkeypatch):
    from engine.generate import DECODE_LENGTH_BUCKET
    from schemas.errors import UserError

    monkeypatch.delenv("GS1_DECODE_LENGTH_BUCKET", raising=False)
    assert _service(tmp_path / "a").settings.decode_length_bucket == DECODE_LENGTH_BUCKET == 1024
    assert _service(tmp_path / "b", decode_length_bucket=256).settings.decode_length_bucket == 256
    monkeypatch.setenv("GS1_DECODE_LENGTH_BUCKET", "768")
    assert _service(tmp_path / "c").settings.decode_length_bucket == 768
    assert _service(tmp_path / "d", decode_length_bucket=512).settings.decode_length_bucket == 512  # the argument wins
    for where, bad in (("env", "100"), ("env", "two"), ("arg", 0), ("arg", -16)):
        if where == "env":
            monkeypatch.setenv("GS1_DECODE_LENGTH_BUCKET", bad)
            with pytest.raises(UserError, match=r"GS1_DECODE_LENGTH_BUCKET=.*positive multiple of 16"):
                _service(tmp_path / "e")
        else:
            monkeypatch.delenv("GS1_DECODE_LENGTH_BUCKET", raising=False)
            with pytest.raises(UserError, match=r"decode_length_bucket=.*positive multiple of 16"):
                _service(tmp_path / "f", decode_length_bucket=bad)


@pytest.mark.parametrize("n_prompts,max_tokens", [(4, 6), (64, 12)], ids=["demo", "user_B64"])
def test_a_flex_decode_reads_live_blocks_and_keeps_every_token(n_prompts, max_tokens, tmp_path, tiny_model_dir,
                                                               tiny_tokenizer):
    """`decode_attention="flex"`: the static decode step attends through FlexAttention over the
    cache's live blocks (`LiveKV`) instead of SDPA over every position. Two adapters of ranks 4
    and 8 and the bare base, prompts of different lengths (left padding the mask must hide), one
    longer than a block so the decode reads two: every greedy row gets the tokens and stop reason
    it gets from the SDPA step, logprobs within float32 rounding (5e-5: another kernel's order of
    summation); every sampled row's logprobs are the scorer's for its tokens; every live key lies
    in a block the step reads, the last of them in its last block."""
    from engine.generate import LIVE_KV_BLOCK, Generator, Row, row_key

    service = _service(tmp_path, decode_attention="flex")
    tcs = [_perturbed(service, tiny_model_dir, 4, 1), _perturbed(service, tiny_model_dir, 8, 2, train_mlp=False)]
    base = tcs[0]._engine.base
    engine_gen = base.sampler.generator
    assert engine_gen.decode_attention == "flex"  # the service's setting reaches the engine's generator
    engine_gen.static_cache = True  # as on CUDA
    snaps = [tc._engine.snapshot_live() for tc in tcs] + [None]
    prompts = [tiny_tokenizer.encode("question %d " % i * (1 + i % 3)) for i in range(n_prompts)]
    prompts[1] = tiny_tokenizer.encode("a long question " * 60)
    assert len(prompts[1]) > LIVE_KV_BLOCK
    # greedy and sampled rows; a sampled row's later tokens are only comparable while its draws
    # agree (the tiny model's near-uniform 150k-token distributions put a draw within 1e-5 of a
    # neighbour's boundary now and then), so sampled rows are checked against the scored tokens
    rows = [Row(prompt=p, max_tokens=max_tokens, key=row_key(1000 * k + i, 0), adapter=a,
                temperature=0.0 if i % 2 == 0 else 1.0)
            for k, a in enumerate(snaps) for i, p in enumerate(prompts)]
    flex = base.sampler.generate(rows)
    (dec,) = engine_gen._graphs.values()
    assert dec.live is not None
    live_B_L = dec.mask[:, 0, 0]
    last_live = int(live_B_L.any(0).nonzero().max())
    blocks = dec.live.blocks_B.flatten()
    assert bool((blocks == blocks[0]).all()) and int(blocks[0]) == last_live // LIVE_KV_BLOCK + 1 == 2
    reference = Generator(base.lm, base.pad_id, base.tokenizer, static_cache=True, bank=base.bank,
                          decode_attention="sdpa")
    with base.bank.serving():
        sdpa = reference.generate(rows)
    (ref_dec,) = reference._graphs.values()
    assert ref_dec.live is None and ref_dec.max_len == dec.max_len
    greedy = [n for n, r in enumerate(rows) if r.temperature == 0.0]
    for n in greedy:
        got, want = flex[n], sdpa[n]
        assert got.tokens == want.tokens and got.stop_reason == want.stop_reason
        # another attention kernel sums in another order (the per-slot path's bound, above)
        assert max(abs(x - y) for x, y in zip(got.logprobs, want.logprobs)) < 5e-5
    sampled = [n for n in range(len(rows)) if n not in set(greedy)]
    scored = base.sampler.score([rows[n].prompt + flex[n].tokens for n in sampled], [rows[n].adapter for n in sampled])
    for n, lps in zip(sampled, scored):  # the scorer's logprobs of the tokens the flex step drew
        m = len(rows[n].prompt)
        assert max(abs(x - y) for x, y in zip(flex[n].logprobs, lps[m:])) < 5e-5
    assert len({tuple(flex[n].tokens) for n in greedy}) > 1  # rows differ: the check could fail


def test_the_decode_attention_comes_from_the_service_or_the_environment_and_is_checked(tmp_path, monkeypatch):
    from engine.generate import DEFAULT_DECODE_ATTENTION
    from schemas.errors import UserError

    monkeypatch.delenv("GS1_DECODE_ATTENTION", raising=False)
    assert _service(tmp_path / "a").settings.decode_attention == DEFAULT_DECODE_ATTENTION == "flex"
    assert _service(tmp_path / "b", decode_attention="sdpa").settings.decode_attention == "sdpa"
    monkeypatch.setenv("GS1_DECODE_ATTENTION", "sdpa")
    assert _service(tmp_path / "c").settings.decode_attention == "sdpa"
    assert _service(tmp_path / "d", decode_attention="flex").settings.decode_attention == "flex"  # the argument wins
    monkeypatch.setenv("GS1_DECODE_ATTENTION", "paged")
    with pytest.raises(UserError, match=r"GS1_DECODE_ATTENTION='paged': a decode attention is one of sdpa, flex"):
        _service(tmp_path / "e")
    monkeypatch.delenv("GS1_DECODE_ATTENTION")
    with pytest.raises(UserError, match=r"decode_attention='dense'"):
        _service(tmp_path / "f", decode_attention="dense")
