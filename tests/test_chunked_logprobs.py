"""The learner's chunked LM-head loss (`engine.token_logprobs`) against the full-logits
computation it replaced (kept here, in the test, as the reference): same loss, per-token
logprobs and gradients, in float32 and float64, across several chunks."""

from __future__ import annotations

import copy

import pytest
import torch
from tinker import types

from fixtures.tiny_model import tiny_model_dir  # noqa: F401
from rl.backends import make_service_client
from engine.token_logprobs import lm_head_fn, target_logprobs

TOL = {torch.float32: dict(rtol=2e-5, atol=2e-6), torch.float64: dict(rtol=1e-10, atol=1e-12)}


def _full_logits_reference(head_fn, h_N_D, tgt_N, acc):
    return torch.log_softmax(head_fn(h_N_D).to(acc), dim=-1).gather(1, tgt_N[:, None]).squeeze(1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("softcap", [None, 3.0])
def test_target_logprobs_match_full_log_softmax_and_its_gradients(dtype, softcap):
    """A head with a trainable bias (as LoRA on the head would be), chunks of 3 rows over 10."""
    g = torch.Generator().manual_seed(0)
    N, D, V = 10, 6, 50
    head = torch.nn.Linear(D, V, bias=True).to(dtype)
    with torch.no_grad():
        head.weight.copy_(torch.randn(V, D, generator=g, dtype=dtype))
        head.bias.copy_(torch.randn(V, generator=g, dtype=dtype))
    head.weight.requires_grad_(False)

    def head_fn(h):
        z = head(h)
        return z if softcap is None else torch.tanh(z / softcap) * softcap

    h = torch.randn(N, D, generator=g, dtype=dtype, requires_grad=True)
    tgt = torch.randint(0, V, (N,), generator=g)
    up = torch.randn(N, generator=g, dtype=dtype)  # an arbitrary upstream gradient per token

    lp = target_logprobs(h, tgt, head_fn, [head.bias], chunk_rows=3, acc_dtype=dtype)
    (lp * up).sum().backward()
    got = (lp.detach(), h.grad.clone(), head.bias.grad.clone())
    h.grad = head.bias.grad = None
    ref = _full_logits_reference(head_fn, h, tgt, dtype)
    (ref * up).sum().backward()
    for a, b in zip(got, (ref.detach(), h.grad, head.bias.grad)):
        torch.testing.assert_close(a, b, **TOL[dtype])


def _batch(tokenizer) -> list[types.Datum]:
    """Four datums of unequal length (159 tokens, more than one chunk of 110 rows on CPU)."""
    g = torch.Generator().manual_seed(3)
    data = []
    for i, n in enumerate((23, 61, 40, 35)):
        toks = torch.randint(100, 20000, (n + 1,), generator=g).tolist()
        ob = n // 3
        data.append(types.Datum(
            model_input=types.ModelInput.from_ints(toks[:-1]),
            loss_fn_inputs={
                "target_tokens": toks[1:],
                "logprobs": [0.0] * ob + (-torch.rand(n - ob, generator=g) * 8).tolist(),
                "advantages": [0.0] * ob + [1.5 if i % 2 else -0.7] * (n - ob),
                "weights": [0.0] * ob + [1.0] * (n - ob),
            }))
    return data


def _reference_forward_backward(model, data, loss_fn, acc):
    """The full-vocabulary path forward_backward used before (one padded microbatch)."""
    L = max(d.model_input.length for d in data)
    ids = torch.zeros(len(data), L, dtype=torch.long)
    mask = torch.zeros(len(data), L, dtype=torch.long)
    tgt = torch.zeros(len(data), L, dtype=torch.long)
    coef = torch.zeros(len(data), L, dtype=acc)
    old = torch.zeros(len(data), L, dtype=acc)
    for b, d in enumerate(data):
        n = d.model_input.length
        ids[b, :n] = torch.tensor(d.model_input.to_ints())
        mask[b, :n] = 1
        tgt[b, :n] = d.loss_fn_inputs["target_tokens"].to_torch().long()
        key = "advantages" if loss_fn == "importance_sampling" else "weights"
        coef[b, :n] = d.loss_fn_inputs[key].to_torch().to(acc)
        old[b, :n] = d.loss_fn_inputs["logprobs"].to_torch().to(acc)
    logits = model(input_ids=ids, attention_mask=mask).logits.to(acc)
    lp = torch.log_softmax(logits, dim=-1).gather(2, tgt[:, :, None]).squeeze(2)
    per_tok = -torch.exp(lp - old) * coef if loss_fn == "importance_sampling" else -lp * coef
    loss = torch.where(mask.bool(), per_tok, torch.zeros_like(per_tok)).sum()
    loss.backward()
    return float(loss.detach()), [lp[b, : d.model_input.length].detach() for b, d in enumerate(data)]


# The decoder layers checkpointed (as on a GPU short of memory, or a CPU whose activations would
# crowd it) and not (the CPU's default at this size: `engine.settings.checkpoint_learner`)
@pytest.mark.parametrize("dtype,loss_fn,train_unembed,checkpointed", [
    (torch.float32, "importance_sampling", False, True),
    (torch.float64, "importance_sampling", False, True),
    (torch.float32, "cross_entropy", False, True),
    (torch.float64, "importance_sampling", True, True),  # LoRA on the LM head: the head's own grads
    (torch.float32, "importance_sampling", False, False),
])
def test_forward_backward_matches_the_full_logits_path(tiny_model_dir, tmp_path, dtype, loss_fn,  # noqa: F811
                                                       train_unembed, checkpointed):
    svc = make_service_client("local", device="cpu", dtype=dtype, cache_dir=tmp_path,
                              gradient_checkpointing=checkpointed)
    tc = svc.create_lora_training_client(str(tiny_model_dir), rank=4, seed=7,
                                         train_unembed=train_unembed).result()
    eng = tc._engine
    assert bool(eng.learner.checkpointed_layers) is checkpointed, "decoder layers checkpointed as asked"
    with torch.no_grad():  # non-zero B: every LoRA matrix gets a gradient
        g = torch.Generator().manual_seed(0)
        for n, p in eng.model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.05)
    ref_model = copy.deepcopy(eng.model)  # eval mode: its layers are not checkpointed
    data = _batch(tc.get_tokenizer())
    n_tokens = sum(d.model_input.length for d in data)
    assert n_tokens > eng.learner.logit_chunk_rows, "the batch spans more than one chunk of logits"

    out = tc.forward_backward(data, loss_fn).result()
    ref_loss, ref_lps = _reference_forward_backward(ref_model, data, loss_fn, dtype)

    tol = TOL[dtype]
    assert out.metrics["loss:sum"] == pytest.approx(ref_loss, rel=tol["rtol"] * 10, abs=tol["atol"])
    for o, ref in zip(out.loss_fn_outputs, ref_lps):
        # returned logprobs are float32 (tinker's TensorData) in both paths
        torch.testing.assert_close(o["logprobs"].to_torch(), ref.float(), rtol=1e-6, atol=1e-6)
    got = {n: p.grad for n, p in eng.model.named_parameters() if p.requires_grad}
    want = {n: p.grad for n, p in ref_model.named_parameters() if p.requires_grad}
    assert got.keys() == want.keys() and all(v is not None for v in want.values())
    if train_unembed:
        assert any("lm_head" in n for n in got)
    # float32 sums in another order (chunks, no padding): elementwise that moves entries near
    # zero by more than their own size, so the bound is relative to each tensor's largest entry
    scale = 1e-5 if dtype == torch.float32 else 1e-10
    for n in want:
        err = float((got[n] - want[n]).abs().max())
        assert err <= scale * float(want[n].abs().max()), (n, err)
    assert not any(m.training for m in eng.model.modules()), "back in eval mode after training"


def test_lm_head_fn_reproduces_the_models_own_logits(tiny_model_dir):  # noqa: F811
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float64)
    ids = torch.tensor([[5, 900, 12000, 7]])
    h = model.get_decoder()(input_ids=ids).last_hidden_state
    torch.testing.assert_close(lm_head_fn(model)(h), model(input_ids=ids).logits)
    model.config.final_logit_softcapping = 2.0  # as Gemma-2 configs have: applied after the head
    capped = lm_head_fn(model)(h)
    assert float(capped.detach().abs().max()) < 2.0
    torch.testing.assert_close(capped, torch.tanh(model.lm_head(h) / 2.0) * 2.0)
