"""The learner's attention (engine/attention.py): right-padded microbatches go through the
decoder with no mask, which is exact against the masked path it replaced (same loss, logprobs and
LoRA gradients at L % 128 == 64 and at mixed lengths, fp32 and fp64), and the start-up backstop
refuses to train when the defect's reproduction gives a non-finite gradient."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tinker import types

from fixtures.tiny_model import tiny_model_dir  # noqa: F401


def random_datum(n: int, seed: int) -> types.Datum:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 5000, (n + 1,), generator=g).tolist()
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs={
        "target_tokens": types.TensorData.from_torch(torch.tensor(tokens[1:])),
        "logprobs": types.TensorData.from_torch(-torch.rand(n, generator=g) * 3),
        "advantages": types.TensorData.from_torch(torch.randn(n, generator=g)),
    })


def client(model_dir, tmp_path, dtype, mask: bool, tokens_per_microbatch: int):
    from engine import LocalServiceClient

    service = LocalServiceClient(device="cpu", dtype=dtype, cache_dir=tmp_path / f"mask{int(mask)}",
                                 tokens_per_microbatch=tokens_per_microbatch, learner_attention_mask=mask)
    tc = service.create_lora_training_client(str(model_dir), rank=4, seed=0).result()
    g = torch.Generator().manual_seed(1)  # non-zero B matrices: every LoRA gradient is non-trivial
    with torch.no_grad():
        for p in tc._engine.params:
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.05)
    return tc


# (datum lengths, token budget): one microbatch padded to 192 (192 % 128 == 64); then mixed
# lengths split over several microbatches, two of them padded to L % 128 == 64 (320, 192); then
# the user's step size, B = 64 rollouts (short ones: the tiny model on CPU), the longest 192 (fp32)
USER_B64 = [*np.random.default_rng(64).integers(20, 192, 63).tolist(), 192]
SHAPES = [([192, 150, 100, 37], 1024), ([320, 7, 64, 192, 191, 130, 5, 250], 700)]
CASES = [(dtype, *shape) for dtype in (torch.float32, torch.float64) for shape in SHAPES] + [(torch.float32, USER_B64, 2048)]


@pytest.mark.parametrize("dtype,lengths,budget", CASES, ids=["fp32-L192", "fp32-mixed", "fp64-L192", "fp64-mixed", "fp32-user_B64"])
def test_the_unmasked_learner_matches_the_masked_path(tiny_model_dir, tmp_path, dtype, lengths, budget):
    data = [random_datum(n, seed) for seed, n in enumerate(lengths)]
    results = {}
    for mask in (False, True):
        tc = client(tiny_model_dir, tmp_path, dtype, mask, budget)
        padded = [mb.padded_length for mb in tc._engine.microbatches(data)]
        out = tc.forward_backward(data, "importance_sampling").result()
        lps = [np.asarray(o["logprobs"].tolist()) for o in out.loss_fn_outputs]
        results[mask] = (out.metrics["loss:sum"], lps, tc.lora_gradient())
    assert any(L % 128 == 64 for L in padded), padded
    (loss, lps, grad), (loss_m, lps_m, grad_m) = results[False], results[True]
    rtol = 1e-5 if dtype == torch.float32 else 1e-10
    assert loss == pytest.approx(loss_m, rel=rtol, abs=rtol)
    for a, b in zip(lps, lps_m, strict=True):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol)
    assert np.abs(grad).max() > 0
    np.testing.assert_allclose(grad, grad_m, rtol=rtol * 10, atol=rtol * np.abs(grad_m).max())


def test_the_learner_passes_no_mask_to_attention(tiny_model_dir, tmp_path, monkeypatch):
    """What reaches transformers' sdpa attention during training: no mask at all (so is_causal)."""
    import transformers.integrations.sdpa_attention as sdpa

    seen = []
    real = sdpa.sdpa_attention_forward

    def spy(module, query, key, value, attention_mask, **kwargs):
        seen.append((query.shape[2], attention_mask))
        return real(module, query, key, value, attention_mask, **kwargs)

    tc = client(tiny_model_dir, tmp_path, torch.float32, False, 1024)
    monkeypatch.setattr(sdpa, "sdpa_attention_forward", spy)
    tc.forward_backward([random_datum(n, n) for n in (192, 60)], "importance_sampling").result()
    assert seen and all(L == 192 and mask is None for L, mask in seen), [(L, type(m)) for L, m in seen]


def test_the_defect_probe_is_finite_here_and_a_non_finite_one_refuses_to_train(monkeypatch):
    from engine import attention
    from schemas.errors import AttentionDefect

    assert attention.DEFECT_LENGTH % 128 == 64
    q, k, _ = attention.sink_qkv(attention.DEFECT_LENGTH, "cpu", torch.float32)
    lse = torch.logsumexp((q[:, 1] @ k[:, 1].transpose(-1, -2)).detach() * q.shape[-1] ** -0.5, dim=-1)
    assert float(lse.max()) < -88.7  # the sink head reaches the defect's condition on every row
    assert attention.probe("cpu", torch.float32).finite
    mask = attention.padding_mask(attention.DEFECT_LENGTH, attention.DEFECT_LENGTH - 40, "cpu")
    assert attention.probe("cpu", torch.float32, mask=mask).finite

    class NaNGrad(torch.autograd.Function):  # a fake kernel defect: finite forward, NaN backward
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            return g * float("nan")

    def defective(module, q, k, v, mask, **kwargs):
        return NaNGrad.apply(q.transpose(1, 2)), None

    monkeypatch.setattr(attention, "learner_attention_fn", lambda: defective)
    monkeypatch.setattr(attention, "_checked", set())
    with pytest.raises(AttentionDefect) as refused:
        attention.check_training_attention(torch.device("cpu"), torch.float32)
    text = str(refused.value)
    assert "not finite on cpu in torch.float32" in text and "L=704" in text and "torch " in text
    assert text.endswith("refusing to train")


def test_longest_first_microbatches_pad_less_and_train_the_same(tiny_model_dir, tmp_path):
    """The user's step, B = 64 rollouts of mixed lengths over several microbatches: the default
    layout (longest first, `Learner.microbatches`) pads fewer positions than arrival order and
    gives the same per-datum logprobs, loss and LoRA gradient (float32 rounding: only the
    gradient's summation order differs). Both go through the client's own forward_backward
    (`forward_backward_layout`: the layout given, as `gs1 replay` gives it)."""
    from engine.learner import cut_microbatches

    data = [random_datum(n, seed) for seed, n in enumerate(USER_B64)]
    tc = client(tiny_model_dir, tmp_path, torch.float32, False, 2048)
    sorted_mbs = tc._engine.microbatches(data)
    arrival = cut_microbatches(data, range(len(data)), 2048)  # the layout before: datums as they came
    assert sorted(i for m in sorted_mbs for i in m.datums) == list(range(64))
    assert all(m.size * m.padded_length <= 2048 for m in sorted_mbs)
    positions = {name: sum(m.size * m.padded_length for m in mbs) for name, mbs in
                 (("sorted", sorted_mbs), ("arrival", arrival))}
    assert positions["sorted"] < 0.85 * positions["arrival"], positions
    assert len(sorted_mbs) > 1

    runs = {}
    for name, out in (("sorted", lambda: tc.forward_backward(data, "importance_sampling")),
                      ("arrival", lambda: tc.forward_backward_layout(data, "importance_sampling", arrival))):
        out = out().result()
        runs[name] = (out.metrics["loss:sum"], [np.asarray(o["logprobs"].tolist()) for o in out.loss_fn_outputs],
                      tc.lora_gradient())
        tc.discard_gradients()
    (loss, lps, grad), (loss_a, lps_a, grad_a) = runs["sorted"], runs["arrival"]
    assert loss == pytest.approx(loss_a, rel=1e-5)
    for a, b in zip(lps, lps_a, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert np.abs(grad).max() > 0
    np.testing.assert_allclose(grad, grad_a, rtol=1e-4, atol=1e-5 * np.abs(grad_a).max())
