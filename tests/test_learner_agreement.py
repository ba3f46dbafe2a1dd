"""benchmarks/learner_agreement.py: the device check that the learner's LoRA paths give one
gradient. Driven here on the CPU at bf16 (where `fused-base` is its own arithmetic), and against
a fake backward that stops at each adapted projection: the check must catch that."""

from __future__ import annotations

import json

import pytest

from fixtures.benchmarks import load_benchmark
from fixtures.tiny_model import tiny_model_dir  # noqa: F401  (builds the tokenizer once per session)

def _script():
    return load_benchmark("learner_agreement")


ARGS = ["--config", "tiny", "--device", "cpu", "--dtype", "bfloat16", "--prompt-tokens", "8",
        "--new-tokens", "8", "--rank", "8", "--compiled", "off", "--batch", "4"]


@pytest.mark.parametrize("batch", ["4", "64"], ids=["demo", "user_B64"])
def test_the_lora_paths_agree_at_bf16_and_the_rows_say_so(batch, tmp_path, capsys):
    out = tmp_path / "rows.json"
    assert _script().main(ARGS + ["--batch", batch, "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["path"] for r in rows] == ["peft", "fused", "fused-base"]
    ref, fused, base = rows
    assert ref["min_cos"] == pytest.approx(1.0, abs=1e-12) and ref["max_rel_err"] == 0.0  # itself
    # fused is peft's float32 arithmetic; fused-base rounds in bf16: close, not equal (so it could fail)
    assert fused["max_rel_err"] < 1e-3 and 0 < base["max_rel_err"] < 0.1 and base["min_cos"] > 0.99
    assert all(r["no_gradient"] == 0 and r["attention_backward_kernels"] == -1 for r in rows)
    # what autograd kept for backward, by dtype and width: the decoder's bf16 activations among it
    assert all(r["saved_gib"] > 0 and "bfloat16x" in r["saved_by_width"] for r in rows)
    table = capsys.readouterr().out
    assert "| fused-base | False |" in table and "reference: peft" in table


def test_a_backward_that_stops_at_the_adapters_is_caught(tmp_path, monkeypatch, capsys):
    from engine.lora_bank import LoraAddon

    real = LoraAddon.backward

    def fake_backward(ctx, grad_y):  # a fake: the adapters' own gradients, nothing below them
        _, _, grad_A, grad_B, *rest = real(ctx, grad_y)
        return None, None, grad_A, grad_B, *rest

    monkeypatch.setattr(LoraAddon, "backward", staticmethod(fake_backward))
    out = tmp_path / "rows.json"
    assert _script().main(ARGS + ["--paths", "peft,fused-base", "--json", str(out)]) == 1
    err = capsys.readouterr().err
    assert "fused-base (compiled=False) disagrees with peft" in err and "tensors with no gradient" in err
    ref, cut = json.loads(out.read_text())
    # the gradient reaches the adapters of the last layer only (B of each, A where B's path is
    # non-zero): the earlier layer's 14 tensors get none
    assert ref["no_gradient"] == 0 and cut["no_gradient"] >= 14 and cut["min_cos"] < 0.99
