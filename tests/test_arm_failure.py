"""An arm that fails says what failed: stage, arm, step and cause on one line, exit 1, and the
run directory resumes. The failure is forced inside the loop's real step (`rl.loop.run_step`),
through a training client whose forward_backward fails as a GPU out of memory does."""

from __future__ import annotations

import json
import logging
import sys

import pytest
import torch

import fixtures.flow_env  # noqa: F401  (registers the token_threshold env)
from fixtures.tiny_model import tiny_model_dir, tiny_service_client  # noqa: F401
from test_flow import flow_spec

OOM_TEXT = "CUDA out of memory. Tried to allocate 4.60 GiB. GPU 0 has a total capacity of 139.81 GiB"


class OutOfMemoryClientFake:
    """A fake: the arm's real training client, except that forward_backward fails as it does on a
    GPU that runs out of memory (the future raises torch.OutOfMemoryError)."""

    def __init__(self, training_client):
        self._training_client = training_client

    def __getattr__(self, name):
        return getattr(self._training_client, name)

    def forward_backward(self, *args, **kwargs):
        from rl.backends.futures import failed

        return failed(torch.OutOfMemoryError(OOM_TEXT))


class NonFiniteLossClientFake(OutOfMemoryClientFake):
    """A fake: the real training client, but the loss it reports is NaN."""

    def forward_backward(self, *args, **kwargs):
        output = self._training_client.forward_backward(*args, **kwargs).result()
        from rl.backends.futures import completed

        output.metrics["loss:sum"] = float("nan")
        return completed(output)


def _run(spec_path, run_dir):
    from gs1.cli import main

    terminal = logging.StreamHandler(sys.stderr)
    logging.getLogger().addHandler(terminal)
    try:
        return main(["run", str(spec_path), "--run-dir", str(run_dir)])
    finally:
        logging.getLogger().removeHandler(terminal)


def test_an_arm_out_of_memory_ends_gs1_run_on_one_line_and_the_run_resumes(
    prefect_harness, tmp_path, repo_root, tiny_model_dir, capfd, monkeypatch
):
    import rl.loop

    real_run_step = rl.loop.run_step

    def run_step(step, arm, **kw):
        # the training stage only (the pilot's treatment steps carry a held-out request)
        if arm.name == "gs1_kernel" and kw.get("heldout") is None and step == 1:
            kw["training_client"] = OutOfMemoryClientFake(kw["training_client"])
        return real_run_step(step, arm, **kw)

    monkeypatch.setattr(rl.loop, "run_step", run_step)
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(flow_spec(repo_root, tiny_model_dir)))
    run_dir = tmp_path / "run"
    rc = _run(spec_path, run_dir)
    out, err = capfd.readouterr()
    assert rc == 1
    last = err.strip().splitlines()[-1]
    assert last.startswith("gs1: train gs1_kernel failed at step 2/3: out of memory (OutOfMemoryError: "
                           + OOM_TEXT), last
    assert last.endswith("the same command resumes it")
    assert "Traceback" not in out + err
    # the other arm finished and its stage result is kept; the failed arm's first step is logged
    baseline_final = run_dir / "train" / "grpo_gs8" / "final.json"
    assert baseline_final.is_file()
    assert (run_dir / "train" / "gs1_kernel" / "steps" / "step-00000.rollouts.parquet").is_file()
    assert not (run_dir / "decision" / "decision.json").exists()

    # The fault cleared, the same command resumes: the finished arm is not trained again.
    monkeypatch.setattr(rl.loop, "run_step", real_run_step)
    finished_at = baseline_final.stat().st_mtime_ns
    assert _run(spec_path, run_dir) == 0
    assert (run_dir / "decision" / "decision.json").is_file()
    assert baseline_final.stat().st_mtime_ns == finished_at


def test_a_non_finite_loss_stops_the_arm_naming_the_step(tiny_service_client, tiny_model_dir):
    from tinker_cookbook import renderers

    from rl.envs import get_env
    from rl.loop import new_window, train_arm
    from schemas.arm import ArmConfig
    from schemas.errors import ArmFailed

    arm = ArmConfig(name="grpo_gs8", advantage="group_mean", group_size=4, groups_per_batch=2, lr=1e-3, seed=0,
                    steps=3, lora_rank=4, base_model=str(tiny_model_dir), max_tokens=2)
    env = get_env("token_threshold", n_train=16, n_test=4)
    tc = tiny_service_client.create_lora_training_client(str(tiny_model_dir), rank=4, seed=0).result()
    renderer = renderers.get_renderer("qwen3_instruct", tc.get_tokenizer())
    logs = []
    with pytest.raises(ArmFailed) as failed:
        train_arm(arm, training_client=NonFiniteLossClientFake(tc), env=env, renderer=renderer,
                  order=env.train_order(seed=0), steps=range(3), window=new_window(arm), on_step=logs.append,
                  stage="pilot")
    assert str(failed.value).startswith("pilot grpo_gs8 failed at step 1/3: FloatingPointError: the training loss is "
                                        "nan (forward_backward's loss:sum; non-finite logprobs: 0 from the sampler, "
                                        "0 from the learner, over ")
    assert logs == []  # the failed step's log is not written: a resume runs it again
