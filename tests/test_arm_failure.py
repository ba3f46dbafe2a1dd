"""An arm that fails says what failed: stage, arm, step and cause. The fakes here force the
failure inside the loop's real step (`rl.loop.run_step`); `gs1 run`'s one line and the resume
after it are tested in tests/test_flow.py."""

from __future__ import annotations

import pytest
import torch

import fixtures.flow_env  # noqa: F401  (registers the token_threshold env)
from fixtures.tiny_model import tiny_model_dir, tiny_service_client  # noqa: F401

OOM_TEXT = "CUDA out of memory. Tried to allocate 4.60 GiB. GPU 0 has a total capacity of 139.81 GiB"


def out_of_memory_on_forward_backward(training_client):
    """A fake failure on the arm's real client: its forward_backward fails as it does on a GPU that
    runs out of memory (the future raises torch.OutOfMemoryError). Returns the client."""
    from rl.backends.futures import failed

    training_client.forward_backward = lambda *args, **kwargs: failed(torch.OutOfMemoryError(OOM_TEXT))
    return training_client


def nan_loss_on_forward_backward(training_client):
    """A fake failure on the arm's real client: forward_backward runs, but the loss it reports is NaN."""
    from rl.backends.futures import completed

    real = training_client.forward_backward

    def forward_backward(*args, **kwargs):
        output = real(*args, **kwargs).result()
        output.metrics["loss:sum"] = float("nan")
        return completed(output)

    training_client.forward_backward = forward_backward
    return training_client


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
        train_arm(arm, training_client=nan_loss_on_forward_backward(tc), env=env, renderer=renderer,
                  order=env.train_order(seed=0), steps=range(3), window=new_window(arm), on_step=logs.append,
                  stage="pilot")
    assert str(failed.value).startswith("pilot grpo_gs8 failed at step 1/3: FloatingPointError: the training loss is "
                                        "nan (forward_backward; non-finite logprobs: 0 from the sampler, "
                                        "0 from the learner, over ")
    assert logs == []  # the failed step's log is not written: a resume runs it again
