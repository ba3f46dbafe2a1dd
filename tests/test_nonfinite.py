"""A non-finite value in training leaves a reproducer, and `gs1 replay` tells bad data from a bad
kernel. The NaNs are forced: a NaN advantage (bad data), and a fake attention kernel whose backward
puts a NaN into one query row at L % 128 == 64 (the shape of the cuDNN defect), both on the engine's
real forward_backward and through the loop's own step."""

from __future__ import annotations

import json

import pytest
import torch
from tinker import types

import fixtures.flow_env  # noqa: F401  (registers the token_threshold env)
from fixtures.tiny_model import tiny_model_dir, tiny_service_client  # noqa: F401
from test_arm_failure import three_step_grpo_arm
from test_learner_attention import client, random_datum

NAN_ROW, NAN_POSITION = 0, 120


class _NaNAtPosition(torch.autograd.Function):
    """Identity forward on a query [B, heads, L, head_dim]; backward puts a NaN into the query
    gradient of row NAN_ROW at position NAN_POSITION (what the cuDNN defect does)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        g = g.clone()
        g[NAN_ROW, :, NAN_POSITION] = float("nan")
        return g


@pytest.fixture
def fake_defect(monkeypatch):
    """A fake kernel defect on transformers' sdpa attention, which the learner calls: at padded
    lengths with L % 128 == 64 (or at every length once `always` is set) its backward is NaN at
    one query position; the forward and the loss stay finite."""
    import transformers.integrations.sdpa_attention as sdpa

    real = sdpa.sdpa_attention_forward
    state = {"always": False}

    def defective(module, query, key, value, attention_mask, **kwargs):
        L = query.shape[2]
        if torch.is_grad_enabled() and L > NAN_POSITION and (state["always"] or L % 128 == 64):
            query = _NaNAtPosition.apply(query)
        return real(module, query, key, value, attention_mask, **kwargs)

    monkeypatch.setattr(sdpa, "sdpa_attention_forward", defective)
    return state


def test_a_nan_advantage_reads_as_bad_data(tiny_model_dir, tmp_path):
    from engine.replay import replay, verdict
    from schemas.errors import NonFiniteStep

    tc = client(tiny_model_dir, tmp_path, torch.float32, False, 1024)
    data = [random_datum(n, seed) for seed, n in enumerate([150, 90, 120])]
    advantages = data[2].loss_fn_inputs["advantages"].to_torch().clone()
    advantages[37] = float("nan")
    data[2].loss_fn_inputs["advantages"] = types.TensorData.from_torch(advantages)
    before = [p.detach().clone() for p in tc._engine.params]
    fwd_bwd = tc.forward_backward(data, "importance_sampling")
    optim = tc.optim_step(types.AdamParams(learning_rate=1e-2))
    with pytest.raises(NonFiniteStep) as bad:
        fwd_bwd.result()
    e = bad.value
    assert (e.what, e.microbatch, e.microbatches, e.padded_length, e.size, e.datum, e.token) == (
        "loss", 1, 1, 150, 3, 2, 37)
    with pytest.raises(FloatingPointError, match="not applied: the forward_backward before it was not finite"):
        optim.result()
    assert all(torch.equal(a, b) for a, b in zip(before, tc._engine.params))  # nothing applied
    layout = json.loads((tmp_path / e.dump / "layout.json").read_text())
    # longest first (`Learner.microbatches`): the dump's layout is the one that ran
    assert layout["microbatches"] == [{"datums": [0, 2, 1], "lengths": [150, 120, 90], "padded_length": 150,
                                       "tokens": 360}]
    settings = json.loads((tmp_path / e.dump / "settings.json").read_text())
    assert settings["dtype"] == "float32" and settings["learner_attention_mask"] is False
    assert settings["tf32"] is False  # replay runs the float32 matmuls as the failing step did
    assert "torch " in settings["versions"]
    assert settings["gradient_checkpointing"] is tc._engine.base.learner.gradient_checkpointing  # as it ran
    dump, runs = replay(tmp_path / e.dump, device="cpu")
    assert [r.name for r in runs] == ["exact", "L+1", "L-1", "sdpa=flash", "sdpa=math", "mask=on"]
    assert all(r.finite is False for r in runs), runs
    assert runs[0].detail == "loss in microbatch 1: datum 2, token 37"
    assert verdict(runs).startswith("verdict: not finite under every length, backend and mask: the data")
    # a dump of a TF32 step replays under TF32: the engine replay makes is told so
    made = {}

    class FakeService:  # a fake service that records how replay makes it, then stops the replay
        def __init__(self, **kwargs):
            made.update(kwargs)
            raise LookupError("fake service: made")

    (tmp_path / e.dump / "settings.json").write_text(json.dumps({**settings, "tf32": True}))
    import engine.replay

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(engine.replay, "LocalServiceClient", FakeService)
        with pytest.raises(LookupError, match="fake service"):
            replay(tmp_path / e.dump, device="cpu")
    assert made["tf32"] is True and made["learner_attention_mask"] is False


def test_a_kernel_defect_at_one_shape_reads_as_the_kernel(tiny_model_dir, tmp_path, fake_defect):
    from engine.replay import replay, replay_table, verdict
    from schemas.errors import NonFiniteStep

    tc = client(tiny_model_dir, tmp_path, torch.float32, False, 1024)
    data = [random_datum(n, seed) for seed, n in enumerate([192, 150, 100])]  # padded to 192: 192 % 128 == 64
    with pytest.raises(NonFiniteStep) as bad:
        tc.forward_backward(data, "importance_sampling").result()
    e = bad.value
    # the hidden-state gradient hook finds the row and the latest non-finite position: the fake's
    assert (e.what, e.padded_length, e.datum, e.token) == ("gradient", 192, NAN_ROW, NAN_POSITION)
    dump, runs = replay(tmp_path / e.dump, device="cpu")
    finite = {r.name: r.finite for r in runs}
    assert finite == {"exact": False, "L+1": True, "L-1": True, "sdpa=flash": False, "sdpa=math": False,
                      "mask=on": False}, replay_table(dump, runs)
    assert [r.padded_length for r in runs[:3]] == [192, 193, 191]
    assert verdict(runs) == "verdict: finite under L+1, L-1: the attention kernel at this shape or backend, not the data"


@pytest.mark.parametrize("group_size,groups", [(4, 2), (8, 8)], ids=["demo", "user_B64"])
def test_the_loops_step_leaves_the_reproducer_in_the_run_directory(tiny_service_client, tiny_model_dir, tmp_path,
                                                                    fake_defect, capsys, group_size, groups):
    """Through `rl.loop.train_arm`: the failure line names the microbatch, the datum (its rollout
    and prompt), the token and the dump; the dump holds the step's rollouts beside the engine's part,
    and `gs1 replay DIR` reruns it."""
    import pyarrow.parquet as pq

    from gs1.cli import main
    from rl.loop import new_window, train_arm
    from schemas.errors import ArmFailed

    fake_defect["always"] = True
    arm, env, tc, renderer = three_step_grpo_arm(tiny_service_client, tiny_model_dir)
    # rollouts longer than the fake's position; the demo's step, or the user's 64 rollouts
    arm = arm.model_copy(update={"max_tokens": 140, "group_size": group_size, "groups_per_batch": groups})
    logs = []
    with pytest.raises(ArmFailed) as failed:
        train_arm(arm, training_client=tc, env=env, renderer=renderer, order=env.train_order(seed=0),
                  steps=range(3), window=new_window(arm), on_step=logs.append, stage="train",
                  nonfinite_dir=tmp_path / "nonfinite" / "grpo_gs8")
    text = str(failed.value)
    dump = tmp_path / "nonfinite" / "grpo_gs8" / "1"
    assert text.startswith("train grpo_gs8 failed at step 1/3: NonFiniteStep: the gradient is not finite in "
                           "microbatch 1/"), text
    assert f", token {NAN_POSITION}; nothing was applied; replay: gs1 replay {dump}" in text
    # the fake's row of microbatch 1 is the step's longest rollout (microbatches run longest first)
    first = json.loads((dump / "layout.json").read_text())["microbatches"][0]
    assert first["lengths"][NAN_ROW] == max(first["lengths"])
    assert f", datum {first['datums'][NAN_ROW]} (rollout " in text and ", prompt " in text
    assert logs == []  # the failed step is not logged as done: a resume runs it again
    rollouts = pq.read_table(dump / "rollouts.parquet")
    assert rollouts.num_rows == arm.batch_size and set(rollouts.column("step").to_pylist()) == {0}
    step = json.loads((dump / "step.json").read_text())
    assert step["arm"] == "grpo_gs8" and step["step"] == 0 and step["lr"] == arm.lr
    for name in ("adapter_model.safetensors", "optimizer.pt", "datums.pt", "layout.json", "settings.json"):
        assert (dump / name).is_file(), name
    capsys.readouterr()
    assert main(["replay", str(dump)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"replay of {dump}: the gradient was not finite in microbatch 1/")
    assert out[-1].startswith("verdict: not finite under every length")  # this fake fails at every length


def test_replay_of_a_folder_that_is_no_dump_is_one_line(tmp_path, capsys):
    from gs1.cli import main

    assert main(["replay", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == f"gs1: error: {tmp_path} is not a non-finite step dump: gs1_local.json is missing"
