"""The learner's LoRA path (`lora_bank.LoraAddon`): the trained adapter's addon with peft's float32
arithmetic in fewer passes, and the checkpointing rule (`settings.checkpoint_learner`).

Checked against two independent things: a float64 evaluation of peft's LoRA formula (the Function
alone), and peft's own path through the same engine (`learner_lora="peft"`): logprobs, loss and
every LoRA gradient of a forward_backward at the demo's shape and the user's (64 datums), with
and without gradient checkpointing.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
from tinker import types

from fixtures.tiny_model import tiny_model_dir, tiny_tokenizer  # noqa: F401
from engine import LocalServiceClient, checkpoint_learner, learner_activation_bytes, use_tf32
from engine import settings
from engine.learner import Learner
from engine.settings import COMPILE_LEARNER_AFTER, LEARNER_LENGTH_MULTIPLE
from engine.lora_bank import LoraAddon, lora_addon


@pytest.mark.parametrize("scale", [1.0, 0.25])
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16])
def test_the_addon_and_its_gradients_match_peft_formula_in_float64(scale, x_dtype):
    g = torch.Generator().manual_seed(0)
    N, d_in, d_out, r = 37, 24, 40, 4
    x = torch.randn(2, N, d_in, generator=g).to(x_dtype).requires_grad_()
    W = torch.randn(d_out, d_in, generator=g).to(x_dtype)
    A = (torch.randn(r, d_in, generator=g) * 0.3).requires_grad_()
    B = (torch.randn(d_out, r, generator=g) * 0.3).requires_grad_()
    out = x @ W.T
    y = lora_addon(x, out, A, B, scale)
    grad_y = torch.randn(y.shape, generator=g).to(x_dtype)
    gx, gA, gB = torch.autograd.grad(y, (x, A, B), grad_y)
    # float64: y = x W^T + s (x A^T) B^T
    x64, W64, A64, B64, g64 = (t.detach().double() for t in (x, W, A, B, grad_y))
    y64 = x64 @ W64.T + scale * (x64 @ A64.T) @ B64.T
    gx64 = g64 @ W64 + scale * (g64 @ B64) @ A64
    gA64 = scale * ((g64 @ B64).reshape(-1, r).T @ x64.reshape(-1, d_in))
    gB64 = scale * (g64.reshape(-1, d_out).T @ (x64 @ A64.T).reshape(-1, r))
    tol = 1e-5 if x_dtype == torch.float32 else 2e-2  # bf16: the output's and x's own roundings
    assert y.dtype == x_dtype and gx.dtype == x_dtype and gA.dtype == gB.dtype == torch.float32
    for got, want in ((y, y64), (gx, gx64), (gA, gA64), (gB, gB64)):
        assert torch.allclose(got.double(), want, atol=tol * (1 + want.abs().max()), rtol=0)


@pytest.mark.parametrize("in_out_dtype", [False, True], ids=["fused", "fused-base"])
def test_the_addon_writes_nothing_in_place_and_its_output_may_be_written(in_out_dtype):
    """torch 2.11's compiled autograd.Function can send the gradient of an output its forward
    wrote in place to the wrong slot (pytorch/pytorch#180642; the H100's fused-base profile,
    results/h200-engine/h100-s28): the Function's forward and backward run no aten op that writes
    an argument (the earlier `addmm(..., out=)` would be caught here), and a caller may still change
    the output in place and backpropagate through it (as the LM head's chunked logprobs do)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Writes(TorchDispatchMode):  # every aten op whose schema writes one of its arguments
        def __init__(self):
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func._schema.is_mutable:
                self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 7, 6, generator=g).to(torch.bfloat16).requires_grad_()
    W = torch.randn(10, 6, generator=g).to(torch.bfloat16)
    A = (torch.randn(4, 6, generator=g) * 0.3).requires_grad_()
    B = (torch.randn(10, 4, generator=g) * 0.3).requires_grad_()
    out = x @ W.T
    with Writes() as forward:
        y = lora_addon(x, out, A, B, 0.5, in_out_dtype)
    assert forward.ops == [] and y.shape == out.shape and y.dtype == torch.bfloat16
    with Writes() as backward:
        grads = torch.autograd.grad(y.float().sum(), (x, A, B), retain_graph=True)
    assert backward.ops == []
    y.mul_(2)  # in place, after the Function: its gradients double
    for got, want in zip(torch.autograd.grad(y.float().sum(), (x, A, B)), grads):
        assert torch.equal(got, 2 * want) and want.abs().max() > 0


def _datums(tokenizer, n: int, seed: int = 0) -> list[types.Datum]:
    rng = random.Random(seed)
    data = []
    for i in range(n):
        prompt = tokenizer.encode(f"question {i}: {rng.randrange(1000)} plus {rng.randrange(1000)}?")
        toks = prompt + [rng.randrange(5, 200) for _ in range(rng.randrange(3, 30))]
        ob = len(prompt) - 1
        data.append(types.Datum(model_input=types.ModelInput.from_ints(toks[:-1]), loss_fn_inputs={
            "target_tokens": toks[1:], "logprobs": [0.0] * ob + [-2.0] * (len(toks) - 1 - ob),
            "advantages": [0.0] * ob + [rng.uniform(-1, 1)] * (len(toks) - 1 - ob)}))
    return data


def _client(tmp_path, model_dir, **kw):
    tc = LocalServiceClient(device="cpu", cache_dir=tmp_path, **kw).create_lora_training_client(
        str(model_dir), rank=8, seed=3).result()
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():  # B is zero at init: move the model so the addon and A's gradient matter
        for p in tc._engine.params:
            if p.shape[1] == 8:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return tc


@pytest.mark.slow
@pytest.mark.parametrize("n", [8, 64], ids=["demo_8", "user_B64"])
@pytest.mark.parametrize("checkpointing", [True, False])
def test_the_fused_learner_matches_peft_path(n, checkpointing, tmp_path, tiny_model_dir, tiny_tokenizer):
    data = _datums(tiny_tokenizer, n)
    runs = {}
    for path in ("fused", "peft"):
        tc = _client(tmp_path / path, tiny_model_dir, learner_lora=path, gradient_checkpointing=checkpointing)
        assert tc._engine.learner.learner_lora == path and tc._engine.learner.gradient_checkpointing is checkpointing
        out = tc.forward_backward(data, "importance_sampling").result()
        runs[path] = (out, tc.lora_gradient())
        if path == "fused":  # the engine's microbatching splits the user's shape
            assert n < 64 or len(tc._engine.microbatches(data)) > 1
    (fused, g_fused), (peft, g_peft) = runs["fused"], runs["peft"]
    assert fused.metrics["loss:sum"] == pytest.approx(peft.metrics["loss:sum"], rel=1e-5, abs=1e-5)
    for a, b in zip(fused.loss_fn_outputs, peft.loss_fn_outputs):
        assert torch.allclose(a["logprobs"].to_torch(), b["logprobs"].to_torch(), atol=1e-5, rtol=0)
    assert abs(g_peft).max() > 0
    assert abs(g_fused - g_peft).max() <= 1e-5 * abs(g_peft).max()


@pytest.mark.slow
def test_peft_path_stays_peft_own_and_the_fused_path_leaves_it_on(tmp_path, tiny_model_dir, tiny_tokenizer):
    """The fused path switches peft's own addon off for its forward_backward only: a reference
    forward through peft afterwards sees the adapter."""
    tc = _client(tmp_path, tiny_model_dir)
    base = tc._engine.base
    tc.forward_backward(_datums(tiny_tokenizer, 4), "importance_sampling").result()
    assert base.bank.train_adapter is None
    assert not any(m._disable_adapters for m in base.bank.layers)
    ids = torch.tensor([tiny_tokenizer.encode("Hello there")])
    with torch.no_grad():
        with_adapter = tc._engine.model(input_ids=ids).logits
        with tc._engine.model.disable_adapter():
            bare = tc._engine.model(input_ids=ids).logits
    assert not torch.allclose(with_adapter, bare)


def test_an_unknown_learner_lora_path_is_refused(tmp_path):
    from schemas.errors import UserError

    with pytest.raises(UserError, match="learner LoRA path 'bf16'"):
        LocalServiceClient(device="cpu", cache_dir=tmp_path, learner_lora="bf16")


QWEN25_15B = SimpleNamespace(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28)


def test_checkpointing_is_on_where_activations_would_crowd_the_memory_and_off_where_they_fit(monkeypatch):
    # the estimate: 16k tokens of the 1.5B model in bf16, 8 x 1536 + 4 x 8960 values per layer and token
    est = learner_activation_bytes(QWEN25_15B, 16384, torch.bfloat16)
    assert est == 16384 * 28 * (8 * 1536 + 4 * 8960) * 2
    assert checkpoint_learner(QWEN25_15B, torch.device("cpu"), torch.bfloat16, 16384)
    # the CPU: by the machine's memory; the demo's SmolLM2-135M at the CPU's 1024 tokens (1.3 GB in
    # float32) trains unchecked on a machine of 16 GiB, checkpointed on one of 8
    smollm2 = SimpleNamespace(hidden_size=576, intermediate_size=1536, num_hidden_layers=30)
    cpu = torch.device("cpu")
    monkeypatch.setattr(settings, "cpu_memory_bytes", lambda: 16 * 2**30)
    assert not checkpoint_learner(smollm2, cpu, torch.float32, 1024)
    assert checkpoint_learner(QWEN25_15B, cpu, torch.float32, 1024)  # 5.5 GB
    monkeypatch.setattr(settings, "cpu_memory_bytes", lambda: 8 * 2**30)
    assert checkpoint_learner(smollm2, cpu, torch.float32, 1024)
    monkeypatch.setattr(settings, "cpu_memory_bytes", lambda: 0)  # a platform that does not say: checkpointed
    assert checkpoint_learner(smollm2, cpu, torch.float32, 1024)

    def gpu_of(gib):
        monkeypatch.setattr(torch.cuda, "get_device_properties",
                            lambda device: SimpleNamespace(total_memory=int(gib * 2**30)))

    cuda = torch.device("cuda", 0)
    gpu_of(139)  # an H200: 41 GiB of activations fit in 35 % of it
    assert est / 2**30 < 0.35 * 139 and not checkpoint_learner(QWEN25_15B, cuda, torch.bfloat16, 16384)
    gpu_of(80)  # an 80 GiB card: checkpointed
    assert checkpoint_learner(QWEN25_15B, cuda, torch.bfloat16, 16384)
    assert not checkpoint_learner(QWEN25_15B, cuda, torch.bfloat16, 4096)  # a quarter of the tokens fit


def test_an_80gb_card_cuts_the_microbatch_to_fit_before_it_checkpoints(monkeypatch):
    """`learner_memory`: on CUDA a microbatch that would crowd the memory is cut to the largest
    aligned size within the share (the H100 measured 1.34 s unchecked and compiled against 2.79 s
    checkpointed); only below LEARNER_MIN_UNCHECKED_TOKENS does it checkpoint; the CPU keeps the
    plain rule and its token budget."""
    def gpu_of(gib):
        monkeypatch.setattr(torch.cuda, "get_device_properties",
                            lambda device: SimpleNamespace(total_memory=int(gib * 2**30)))

    cuda, bf16 = torch.device("cuda", 0), torch.bfloat16
    per_token = learner_activation_bytes(QWEN25_15B, 1, bf16)
    gpu_of(139)  # fits as asked
    assert settings.learner_memory(QWEN25_15B, cuda, bf16, 16384) == settings.LearnerMemory(False, 16384)
    gpu_of(79.18)  # the H100 80GB as torch reports it
    plan = settings.learner_memory(QWEN25_15B, cuda, bf16, 16384)
    assert not plan.checkpoint and plan.tokens_per_microbatch % LEARNER_LENGTH_MULTIPLE == 0
    share = 0.35 * 79.18 * 2**30
    assert plan.tokens_per_microbatch * per_token <= share < (plan.tokens_per_microbatch + LEARNER_LENGTH_MULTIPLE) * per_token
    assert 10_000 < plan.tokens_per_microbatch < 16384
    gpu_of(16)  # a card where even the floor would crowd it: checkpointed, at the asked size
    assert settings.learner_memory(QWEN25_15B, cuda, bf16, 16384) == settings.LearnerMemory(True, 16384)
    monkeypatch.setattr(settings, "cpu_memory_bytes", lambda: 16 * 2**30)
    assert settings.learner_memory(QWEN25_15B, torch.device("cpu"), torch.float32, 1024) == settings.LearnerMemory(True, 1024)


@pytest.mark.parametrize("n", [8, 64], ids=["demo_8", "user_B64"])
def test_the_engine_learner_takes_its_microbatch_and_checkpointing_from_the_memory_plan(
        n, tmp_path, tiny_model_dir, tiny_tokenizer, monkeypatch):
    """The path that runs: a learner left to decide (gradient_checkpointing=None) trains at the
    plan's microbatch size, unchecked, to the loss and LoRA gradient of uncut microbatches within
    float32 rounding; one told to checkpoint keeps its own token budget."""
    from engine import learner as learner_module

    asked = []

    def plan(config, device, dtype, tokens):  # a stand-in plan, as a card that must cut would make
        asked.append(tokens)
        return settings.LearnerMemory(False, 48)

    monkeypatch.setattr(learner_module, "learner_memory", plan)
    tc = _client(tmp_path / "planned", tiny_model_dir, gradient_checkpointing=None, tokens_per_microbatch=1024)
    learner = tc._engine.learner
    assert asked == [1024] and learner.tokens_per_microbatch == 48 and not learner.gradient_checkpointing
    data = _datums(tiny_tokenizer, n)
    mbs = learner.microbatches(data)
    assert len(mbs) > 1 and all(mb.size * mb.padded_length <= 48 or mb.size == 1 for mb in mbs)
    got = tc.forward_backward(data, "importance_sampling").result().metrics["loss:sum"]
    uncut = _client(tmp_path / "uncut", tiny_model_dir, gradient_checkpointing=False, tokens_per_microbatch=4096)
    assert len(uncut._engine.learner.microbatches(data)) < len(mbs)
    want = uncut.forward_backward(data, "importance_sampling").result().metrics["loss:sum"]
    assert got != 0 and got == pytest.approx(want, rel=1e-5, abs=1e-5)
    g, g_uncut = tc.lora_gradient(), uncut.lora_gradient()
    assert abs(g_uncut).max() > 0 and abs(g - g_uncut).max() <= 1e-5 * abs(g_uncut).max()
    told = _client(tmp_path / "told", tiny_model_dir, gradient_checkpointing=True, tokens_per_microbatch=1024)
    assert told._engine.learner.tokens_per_microbatch == 1024 and told._engine.learner.gradient_checkpointing
    assert asked == [1024]


def test_microbatches_round_their_length_up_within_the_token_budget():
    # `Learner.microbatches` reads only the token budget: a bare object stands for the learner
    learner = SimpleNamespace(tokens_per_microbatch=90)
    data = [types.Datum(model_input=types.ModelInput.from_ints(list(range(n))), loss_fn_inputs={})
            for n in (13, 17, 30, 5, 40)]
    as_they_are = Learner.microbatches(learner, data)
    rounded = Learner.microbatches(learner, data, 16)
    # longest first: 40 and 30 pad to 40 (80 positions), then 17, 13 and 5 to 17 (51): 131
    # positions, where arrival order (13 17 30 | 5 40) padded 90 + 80 = 170
    assert [(mb.datums, mb.padded_length) for mb in as_they_are] == [((4, 2), 40), ((1, 0, 3), 17)]
    # two rows of 48 would not fit the 90 positions, two of 32 do: the rounded length decides the split
    assert [(mb.datums, mb.padded_length) for mb in rounded] == [((4,), 48), ((2, 1), 32), ((0, 3), 16)]
    for mb in rounded:
        assert mb.padded_length % 16 == 0 and mb.size * mb.padded_length <= 90
        assert mb.padded_length >= max(mb.lengths) and mb.tokens == sum(mb.lengths)


def test_tf32_is_on_for_cuda_unless_turned_off_and_never_on_the_cpu(monkeypatch):
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    monkeypatch.delenv("GS1_TF32", raising=False)
    assert use_tf32(cuda, None) and not use_tf32(cpu, None) and not use_tf32(cpu, True)
    assert not use_tf32(cuda, False)
    monkeypatch.setenv("GS1_TF32", "0")
    assert not use_tf32(cuda, None) and use_tf32(cuda, True)  # an explicit setting wins over the variable
    assert not use_tf32(cpu, None)
    monkeypatch.setenv("GS1_TF32", "1")
    assert use_tf32(cuda, None) and not use_tf32(cuda, False)
    # the CPU engine's settings say so (its float32 matmuls are IEEE; the tests' numbers stay as they were)
    assert LocalServiceClient(device="cpu", tf32=True).settings.tf32 is False


def _stage_timings():
    from fixtures.benchmarks import load_benchmark

    return load_benchmark("stage_timings")


def _calls(tc, batches) -> list[tuple[types.ForwardBackwardOutput, object]]:
    """One forward_backward per batch, each call's own gradient (discarded after it is read)."""
    runs = []
    for data in batches:
        out = tc.forward_backward(data, "importance_sampling").result()
        runs.append((out, tc.lora_gradient()))
        tc.discard_gradients()
    return runs


def _same(a, b, tol: float) -> None:
    (out_a, g_a), (out_b, g_b) = a, b
    assert out_a.metrics["loss:sum"] == pytest.approx(out_b.metrics["loss:sum"], rel=tol, abs=tol)
    for x, y in zip(out_a.loss_fn_outputs, out_b.loss_fn_outputs, strict=True):
        assert torch.allclose(x["logprobs"].to_torch(), y["logprobs"].to_torch(), atol=tol, rtol=0)
    assert abs(g_b).max() > 0 and abs(g_a - g_b).max() <= tol * abs(g_b).max()


@pytest.mark.slow
@pytest.mark.parametrize("learner_lora", ["fused", "fused-base"])
def test_the_compiled_learner_matches_the_eager_one_from_a_clients_third_call(learner_lora, tmp_path, tiny_model_dir,
                                                                               tiny_tokenizer, caplog):
    """The layers run compiled from the third forward_backward on (`COMPILE_LEARNER_AFTER`), at
    the demo's 8 datums and the user's 64 (several microbatches of different padded lengths, one
    graph), with the same logprobs, loss and gradients as the eager layers; after each call the
    layers are the model's own again. Either fused addon form compiles (`LoraAddon`)."""
    assert COMPILE_LEARNER_AFTER == 3
    batches = [_datums(tiny_tokenizer, 8, seed=s) for s in range(3)] + [_datums(tiny_tokenizer, 64, seed=3)]
    eager = _client(tmp_path / "eager", tiny_model_dir, gradient_checkpointing=False, compile_learner=False,
                    learner_lora=learner_lora)
    compiled = _client(tmp_path / "compiled", tiny_model_dir, gradient_checkpointing=False, compile_learner=True,
                       learner_lora=learner_lora)
    learner = compiled._engine.learner
    assert learner.compile_learner and not eager._engine.learner.compile_learner
    want = _calls(eager, batches[:2])
    got = _calls(compiled, batches[:2])
    assert learner._compiled_forwards is None  # two eager calls: the preflight's and a pilot's shapes
    want += _calls(eager, batches[2:])
    with caplog.at_level("INFO", logger="gs1.engine"):
        got += _calls(compiled, batches[2:])
    # one compile line, as benchmarks/stage_timings.py reads it
    lines = [f"gs1.engine - {r.getMessage()}" for r in caplog.records if "learner:" in r.getMessage()]
    assert len(lines) == 1 and _stage_timings().LEARNER.search(lines[0]).group(1) == "cpu"
    assert learner._compiled_forwards is not None and learner.compile_learner  # compiled, and it held
    assert len(compiled._engine.microbatches(batches[3])) > 1
    assert not any("forward" in layer.__dict__ for layer in learner.decoder.layers)
    for a, b in zip(got, want):
        _same(a, b, 1e-5)


def test_a_failing_learner_compile_falls_back_to_the_eager_layers(tmp_path, tiny_model_dir, tiny_tokenizer,
                                                                 monkeypatch, caplog):
    def fake_compile(fn, **_):  # a fake compiler whose graphs fail when run
        def broken(*args, **kwargs):
            raise RuntimeError("fake compiler failure")
        return broken

    batches = [_datums(tiny_tokenizer, 4, seed=s) for s in range(3)]
    want = _calls(_client(tmp_path / "eager", tiny_model_dir, gradient_checkpointing=False), batches)
    tc = _client(tmp_path / "compiled", tiny_model_dir, gradient_checkpointing=False, compile_learner=True)
    monkeypatch.setattr(torch, "compile", fake_compile)
    with caplog.at_level("WARNING", logger="gs1.engine"):
        got = _calls(tc, batches)
    assert not tc._engine.learner.compile_learner
    assert "compiled decoder layers failed" in caplog.text and "fake compiler failure" in caplog.text
    _same(got[0], want[0], 0.0)  # the two eager calls, as they were
    _same(got[1], want[1], 0.0)
    # the failed microbatch reran from the gradients it started with (a second accumulation would
    # double them), at the layout the compiled call made: lengths padded to a multiple of 16, so
    # the eager layers sum in another order than at the bare length
    _same(got[2], want[2], 1e-4)
    # checkpointed layers are never compiled
    ckpt = _client(tmp_path / "ckpt", tiny_model_dir, gradient_checkpointing=True, compile_learner=True)
    assert not ckpt._engine.learner.compile_learner


@pytest.mark.slow
def test_one_compiled_graph_serves_every_adapter_and_shape(tmp_path, tiny_model_dir, tiny_tokenizer, caplog):
    """Two arms on one base, calls of 8, 64 (several microbatches) and 1 datum: one compiled graph
    in all (no guard reads the adapter, the first layer's input or a batch size), each call as the
    eager layers give it, and an arm's call leaves the other arm's gradients alone."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    def arms(compiled: bool):
        svc = LocalServiceClient(device="cpu", cache_dir=tmp_path / str(compiled), gradient_checkpointing=False,
                                 compile_learner=compiled, compile_learner_after=1)
        return [svc.create_lora_training_client(str(tiny_model_dir), rank=8, seed=s).result() for s in (3, 4)]

    calls = [(0, _datums(tiny_tokenizer, 8, seed=0)), (1, _datums(tiny_tokenizer, 8, seed=1)),
             (0, _datums(tiny_tokenizer, 64, seed=2)), (1, _datums(tiny_tokenizer, 1, seed=3))]
    eager, compiled = arms(False), arms(True)
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():  # B is zero at init: give both arms an addon of their own, the same in both services
        for e, c in zip(eager, compiled):
            for pe, pc in zip(e._engine.params, c._engine.params):
                if pe.shape[1] == 8:
                    pe.copy_(torch.randn(pe.shape, generator=g) * 0.2)
                pc.copy_(pe)
    torch._dynamo.reset()  # no graph of an earlier test's layers (same code) is found compiled
    graphs = counters["stats"]["unique_graphs"]
    m = LEARNER_LENGTH_MULTIPLE
    assert len(compiled[0]._engine.microbatches(calls[2][1], m)) > 1  # the 64 datums: several microbatches
    as_they_are = {mb.padded_length for k, data in calls for mb in compiled[k]._engine.microbatches(data)}
    assert any(L % m for L in as_they_are)  # lengths the layers must not see as they are
    rounded = {mb.padded_length for k, data in calls for mb in compiled[k]._engine.microbatches(data, m)}
    seen: list[int] = []  # the positions each compiled call's first layer gets
    first = compiled[0]._engine.learner.decoder.layers[0]

    def note_length(module, args, kwargs):
        seen.append((args[0] if args else kwargs["hidden_states"]).shape[1])

    hook = first.register_forward_pre_hook(note_length, with_kwargs=True)
    try:
        for k, data in calls:
            want = _calls(eager[k], [data])[0]
            with caplog.at_level("INFO", logger="gs1.engine"):
                got = _calls(compiled[k], [data])[0]
            _same(got, want, 1e-5)
    finally:
        hook.remove()
    # the layers saw the rounded lengths alone: the ones the layout (and so a dump, a log line) records
    assert seen and all(L % m == 0 for L in seen) and set(seen) == rounded
    assert counters["stats"]["unique_graphs"] - graphs == 1
    said = [r.getMessage() for r in caplog.records if "learner: decoder layers" in r.getMessage()]
    assert len(said) == 1 and "layers compiled" in said[0] and "1 graphs so far" in said[0]  # never "recompiled"
    assert compiled[0]._engine.learner.compile_learner
    compiled[0].forward_backward(calls[0][1], "importance_sampling").result()
    assert all(p.grad is None for p in compiled[1]._engine.params)


def test_a_learner_recompile_says_which_guard_failed(tmp_path, tiny_model_dir, tiny_tokenizer, caplog):
    """A second graph is a guard that failed: an arm of another rank (its A has other rows, and its
    LoRA scale alpha / rank, a constant in the graph since `Learner.compiled_layers` specialises the
    layers' floats, is another) makes one, and the log line says so, with dynamo's own words for the
    first guard that failed: rank 8's scale, 4.0."""
    import torch._dynamo

    svc = LocalServiceClient(device="cpu", cache_dir=tmp_path, gradient_checkpointing=False, compile_learner=True,
                             compile_learner_after=1)
    arms = [svc.create_lora_training_client(str(tiny_model_dir), rank=r, seed=3).result() for r in (8, 16)]
    torch._dynamo.reset()
    with caplog.at_level("INFO", logger="gs1.engine"):
        for tc in arms:
            tc.forward_backward(_datums(tiny_tokenizer, 4), "importance_sampling").result()
    said = [r.getMessage() for r in caplog.records if "learner: decoder layers" in r.getMessage()]
    assert len(said) == 2 and "layers compiled" in said[0] and "guard failed" not in said[0]
    assert "recompiled" in said[1] and "2 graphs so far" in said[1]
    assert "guard failed: " in said[1] and ".scale == 4.0" in said[1] and "alpha=scale" in said[1]


@pytest.mark.parametrize("shape", [(2, 8, 64, 48), (1, 256, 96, 224)], ids=["demo", "window_256"])
def test_the_addon_in_the_base_dtype_is_the_float64_sum_within_bf16_rounding(shape):
    """`learner_lora="fused-base"`: `LoraAddon` with every operand in the output's dtype gives the
    float64 sum and gradients within bf16 rounding, differs from the float32 form (so the check
    could fail), and where the output is float32 is the float32 form bit for bit."""
    n_seq, n_tok, width, n_out = shape
    g = torch.Generator().manual_seed(5)
    x64 = torch.randn(n_seq, n_tok, width, generator=g, dtype=torch.float64)
    out64 = torch.randn(n_seq, n_tok, n_out, generator=g, dtype=torch.float64)
    A64 = torch.randn(8, width, generator=g, dtype=torch.float64) * 0.3
    B64 = torch.randn(n_out, 8, generator=g, dtype=torch.float64) * 0.3
    w64 = torch.randn(n_seq, n_tok, n_out, generator=g, dtype=torch.float64)
    s = 2.0

    def run(dtype, in_out_dtype):
        x, out = x64.to(dtype).requires_grad_(), out64.to(dtype).requires_grad_()
        A, B = A64.float().requires_grad_(), B64.float().requires_grad_()
        y = lora_addon(x, out, A, B, s, in_out_dtype)
        (y.double() * w64).sum().backward()
        return y.detach().double(), x.grad.double(), out.grad.double(), A.grad.double(), B.grad.double()

    # float64 reference, independent of the Function: y = out + s x A^T B^T, d(sum w y)
    xr = x64.to(torch.bfloat16).double()
    y_ref = out64.to(torch.bfloat16).double() + s * xr @ A64.float().double().T @ B64.float().double().T
    gh = s * w64 @ B64.float().double()
    ref = (y_ref, gh @ A64.float().double(), w64,
           gh.reshape(-1, 8).T @ xr.reshape(-1, width), s * w64.reshape(-1, n_out).T @ (xr @ A64.float().double().T).reshape(-1, 8))
    base = run(torch.bfloat16, True)
    fused = run(torch.bfloat16, False)
    for name, got, want in zip(("y", "grad_x", "grad_out", "grad_A", "grad_B"), base, ref):
        scale = want.abs().max()
        assert (got - want).abs().max() <= 2 ** -6 * scale, name  # a few bf16 roundings of the largest
    assert not torch.equal(base[0], fused[0]) and not torch.equal(base[3], fused[3])  # another arithmetic
    # the float32 form is the closer one: its operands and gradients stay float32
    assert (fused[3] - ref[3]).abs().max() < (base[3] - ref[3]).abs().max()
    for a, b in zip(run(torch.float32, True), run(torch.float32, False)):
        assert torch.equal(a, b)


def test_the_fused_base_path_reaches_the_addon_and_on_a_float32_base_is_the_fused_path(tmp_path, tiny_model_dir,
                                                                                     tiny_tokenizer, monkeypatch):
    from engine import lora_bank

    data = _datums(tiny_tokenizer, 4)
    seen, real = [], lora_bank.LoraAddon.apply

    def spy(*args):
        seen.append(args[5])
        return real(*args)

    monkeypatch.setattr(lora_bank.LoraAddon, "apply", spy)
    runs = {}
    for path in ("fused", "fused-base"):
        tc = _client(tmp_path / path, tiny_model_dir, learner_lora=path)
        assert tc._engine.learner.learner_lora == path
        seen.clear()
        out = tc.forward_backward(data, "importance_sampling").result()
        assert seen and set(seen) == {path == "fused-base"}  # every adapted projection, in the named form
        runs[path] = (out.metrics["loss:sum"], tc.lora_gradient())
    assert runs["fused"][0] == runs["fused-base"][0] and (runs["fused"][1] == runs["fused-base"][1]).all()
    assert abs(runs["fused"][1]).max() > 0


def test_the_learner_warns_of_what_is_known_against_its_lora_path(tmp_path, tiny_model_dir, monkeypatch, caplog):
    """A learner built with a LoRA path that `settings.learner_lora_caveat` knows a fault of (on
    CUDA: compiled fused-base got no gradient) says so in a warning, with what it was asked for."""
    from engine import learner as learner_module

    asked = []

    def fake_caveat(learner_lora, device_type, compiled):  # a fake: the CPU's fused-base has a caveat
        asked.append((learner_lora, device_type, compiled))
        return "a fake caveat" if learner_lora == "fused-base" else None

    monkeypatch.setattr(learner_module, "learner_lora_caveat", fake_caveat)
    with caplog.at_level("WARNING", logger="gs1.engine"):
        _client(tmp_path / "base", tiny_model_dir, learner_lora="fused-base", compile_learner=True,
                gradient_checkpointing=False)
    assert "learner: a fake caveat" in caplog.text and ("fused-base", "cpu", True) in asked
    caplog.clear()
    with caplog.at_level("WARNING", logger="gs1.engine"):
        _client(tmp_path / "fused", tiny_model_dir, gradient_checkpointing=False)
    assert "fake caveat" not in caplog.text
