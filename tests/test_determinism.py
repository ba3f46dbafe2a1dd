"""Runs that reproduce, on request (issue 46, engine/determinism.py).

On the CPU the engine is deterministic already, so these tests prove the mode's mechanism: the
sampler's integer scan draws what the float64 scan draws (against an independent integer
reference), a decode batch's rows come in one order whatever order the arms queued them in (the
engine's own batch path, 64 rows of two adapters of different ranks), and the mode is recorded.
The GPU's proof is benchmarks/reproduce.py's on the H200 (results/h200-engine/README.md).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from tinker import types

from fixtures.tiny_model import tiny_model_dir, tiny_tokenizer  # noqa: F401
from engine import determinism
from engine.generate import FIXED_POINT_BITS, _draw_fixed_point, sample_step, uniforms


@pytest.fixture()
def deterministic_process():
    """The mode's process-wide flags, put back after the test."""
    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
              torch.backends.cudnn.benchmark, os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
    yield
    torch.use_deterministic_algorithms(before[0])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[1], before[2]
    if before[3] is None:
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)


def _logits(B: int, V: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, V, generator=g) * 3.0


def _reference_draw(lp_B_V: torch.Tensor, u_B: torch.Tensor) -> list[int]:
    """The integer scan in Python integers, row by row: the first token whose cumulative mass
    (in units of 2^-50) exceeds floor(u * total)."""
    out = []
    for lp_V, u in zip(lp_B_V.tolist(), u_B.tolist()):
        mass = [int(np.floor(np.exp(np.float64(np.float32(x))) * 2.0**FIXED_POINT_BITS)) for x in lp_V]
        target = int(np.floor(u * float(sum(mass))))
        running = 0
        for i, m in enumerate(mass):
            running += m
            if running > target:
                out.append(i)
                break
        else:
            out.append(len(mass) - 1)
    return out


def test_the_integer_scan_draws_the_reference_token():
    lp = torch.log_softmax(_logits(64, 300), dim=-1)
    keys = torch.arange(64, dtype=torch.int64) * 7919 + 11
    u = uniforms(keys, step=5)
    assert _draw_fixed_point(lp, u).tolist() == _reference_draw(lp, u)


@pytest.mark.parametrize("top", [None, (40, 0.9)])
def test_the_mode_draws_what_the_default_draws(deterministic_process, top):
    """B = 64 rows (the user's batch), sampled, greedy and truncated rows mixed: the mode's draw and
    the default's give the same tokens and logprobs (a boundary hit is ~V * 2^-50 a row)."""
    B, V = 64, 1000
    logits = _logits(B, V, seed=1)
    temps = torch.tensor([0.0 if b % 9 == 0 else 0.7 + (b % 3) * 0.3 for b in range(B)])
    keys = torch.arange(B, dtype=torch.int64) * 104729 + 3
    top_k = top_p = None
    if top is not None:
        top_k, top_p = torch.full((B,), top[0]), torch.full((B,), top[1])
    draws = {}
    for mode in (False, True):
        torch.use_deterministic_algorithms(mode)
        draws[mode] = [sample_step(logits, temps, keys, step, top_k, top_p) for step in range(4)]
    for (tok0, lp0), (tok1, lp1) in zip(draws[False], draws[True]):
        assert torch.equal(tok0, tok1) and torch.equal(lp0, lp1)
    assert len({tuple(t.tolist()) for t, _ in draws[True]}) == 4  # the steps draw differently


def test_the_service_turns_the_mode_on_and_records_it(deterministic_process, tmp_path, monkeypatch):
    from engine import LocalServiceClient

    monkeypatch.delenv(determinism.ENV, raising=False)
    plain = LocalServiceClient(device="cpu", cache_dir=tmp_path / "a")
    assert plain.numerics().record() == {
        "backend": "local", "deterministic": False, "device": "cpu", "dtype": "float32", "tf32": False,
        "cublas_workspace": None, "torch": torch.__version__, "decode_attention": "flex"}
    assert not torch.are_deterministic_algorithms_enabled()
    monkeypatch.setenv(determinism.ENV, "1")
    asked = LocalServiceClient(device="cpu", cache_dir=tmp_path / "b")
    assert asked.settings.deterministic and asked.numerics().deterministic
    assert torch.are_deterministic_algorithms_enabled()
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == determinism.CUBLAS_WORKSPACE


PROMPTS = ("Hello there", "A longer prompt than the first one", "x y z", "Two plus two is")


def _batch_rows(tmp_path, model_dir, tokenizer, deterministic: bool, arms_order: tuple[int, int]):
    """Two arms (LoRA ranks 4 and 8) queue 4 prompts x 8 samples each (64 rows) from one thread in
    `arms_order`, then wait: one batch. Returns the rows' (key, arm) in the order the generator got
    them and each arm's sampled tokens."""
    from engine import LocalServiceClient

    service = LocalServiceClient(device="cpu", cache_dir=tmp_path, batch_across_clients=True,
                                 deterministic=deterministic)
    tcs = [service.create_lora_training_client(str(model_dir), rank=r, seed=s, user_metadata={"unit": f"arm{s}"}).result()
           for r, s in ((4, 1), (8, 2))]
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():  # B is zero at init: move each adapter so the arms' rows differ
        for tc in tcs:
            for p in tc._engine.params:
                p.add_(torch.randn(p.shape, generator=g) * 0.2)
    samplers = [tc.save_weights_and_get_sampling_client().result() for tc in tcs]
    base = tcs[0]._engine.base
    arm_of = {sc._snapshot.id: arm for arm, sc in enumerate(samplers)}
    seen: list[list[tuple[int, int]]] = []  # per batch, its rows' (key, arm)
    generate = base.sampler.generate  # what the engine hands the sampler (engine/sampler.py)
    base.sampler.generate = lambda rows: (seen.append([(r.key, arm_of[r.adapter.id]) for r in rows]), generate(rows))[1]
    params = types.SamplingParams(max_tokens=5, temperature=1.0, stop=[])
    futures: dict[int, list] = {}
    for arm in arms_order:  # the step's requests carry seeds (rl.loop.sample_params): both arms the same
        futures[arm] = [samplers[arm].sample(types.ModelInput.from_ints(tokenizer.encode(t)), 8,
                                             params.model_copy(update={"seed": 100 + i}))
                        for i, t in enumerate(PROMPTS)]
    tokens = {arm: [[s.tokens for s in f.result().sequences] for f in fs] for arm, fs in futures.items()}
    return seen, tokens


@pytest.mark.slow  # two engines on the tiny model
def test_a_batch_has_one_order_whatever_order_the_arms_queued_in(deterministic_process, tmp_path,
                                                                 tiny_model_dir, tiny_tokenizer):
    got = {}
    for deterministic in (False, True):
        for order in ((0, 1), (1, 0)):
            got[deterministic, order] = _batch_rows(tmp_path / f"{deterministic}-{order}", tiny_model_dir,
                                                    tiny_tokenizer, deterministic, order)
            torch.use_deterministic_algorithms(False)
    for deterministic in (False, True):
        (rows_a, tokens_a), (rows_b, tokens_b) = got[deterministic, (0, 1)], got[deterministic, (1, 0)]
        assert [len(r) for r in rows_a] == [64] and [len(r) for r in rows_b] == [64]  # one batch of 64 rows
        assert tokens_a == tokens_b  # per row the numbers never depended on the order (CPU)
        assert (rows_a == rows_b) is deterministic  # the default batches in queue order
    assert sorted(got[True, (0, 1)][0][0]) == sorted(got[False, (0, 1)][0][0])  # the same rows


def test_the_engine_hands_the_gil_back_quickly(tmp_path):
    """The worker's small ops beside other Python threads (benchmarks/busy_thread.py: 44x slower at
    Python's 5 ms switch interval): a service shortens the interval, and never lengthens it."""
    import sys

    from engine import LocalServiceClient
    from engine.settings import GIL_SWITCH_INTERVAL_S

    before = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.005)
        LocalServiceClient(device="cpu", cache_dir=tmp_path / "a")
        assert sys.getswitchinterval() == GIL_SWITCH_INTERVAL_S
        sys.setswitchinterval(GIL_SWITCH_INTERVAL_S / 10)
        shorter = sys.getswitchinterval()  # as the interpreter stores it
        LocalServiceClient(device="cpu", cache_dir=tmp_path / "b")
        assert sys.getswitchinterval() == shorter
    finally:
        sys.setswitchinterval(before)
