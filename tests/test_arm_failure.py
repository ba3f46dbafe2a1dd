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
    from engine.futures import failed

    training_client.forward_backward = lambda *args, **kwargs: failed(torch.OutOfMemoryError(OOM_TEXT))
    return training_client


def nan_loss_on_forward_backward(training_client):
    """A fake failure on the arm's real client: forward_backward runs, but the loss it reports is NaN."""
    from engine.futures import completed

    real = training_client.forward_backward

    def forward_backward(*args, **kwargs):
        output = real(*args, **kwargs).result()
        output.metrics["loss:sum"] = float("nan")
        return completed(output)

    training_client.forward_backward = forward_backward
    return training_client


def three_step_grpo_arm(service_client, model_dir):
    """A 3-step GRPO arm (2 prompts x 4) on the tiny model: its config, env, real client, renderer."""
    from tinker_cookbook import renderers

    from design.arm import ArmConfig
    from rl.envs import get_env

    arm = ArmConfig(name="grpo_gs8", advantage="group_mean", group_size=4, groups_per_batch=2, lr=1e-3, seed=0,
                    steps=3, lora_rank=4, base_model=str(model_dir), max_tokens=2)
    env = get_env("token_threshold", n_train=16, n_test=4)
    tc = service_client.create_lora_training_client(str(model_dir), rank=4, seed=0).result()
    return arm, env, tc, renderers.get_renderer("qwen3_instruct", tc.get_tokenizer())


def test_a_non_finite_loss_stops_the_arm_naming_the_step(tiny_service_client, tiny_model_dir):
    from rl.loop import new_window, train_arm
    from schemas.errors import ArmFailed

    arm, env, tc, renderer = three_step_grpo_arm(tiny_service_client, tiny_model_dir)
    logs = []
    with pytest.raises(ArmFailed) as failed:
        train_arm(arm, training_client=nan_loss_on_forward_backward(tc), env=env, renderer=renderer,
                  order=env.train_order(seed=0), steps=range(3), window=new_window(arm), on_step=logs.append,
                  stage="pilot")
    assert str(failed.value).startswith("pilot grpo_gs8 failed at step 1/3: FloatingPointError: the training loss is "
                                        "nan (forward_backward; non-finite logprobs: 0 from the sampler, "
                                        "0 from the learner, over ")
    assert logs == []  # the failed step's log is not written: a resume runs it again


def nan_gradient_on_forward_backward(training_client):
    """A fake failure on the arm's real client: forward_backward runs, then one adapter gradient
    holds a NaN (as a bf16 overflow in backward would leave it); the loss stays finite."""
    from engine.futures import completed

    real = training_client.forward_backward

    def forward_backward(*args, **kwargs):
        output = real(*args, **kwargs).result()
        next(p for p in training_client._engine.params if p.grad is not None).grad.view(-1)[0] = float("nan")
        return completed(output)

    training_client.forward_backward = forward_backward
    return training_client


def test_a_non_finite_gradient_is_refused_and_the_weights_stay_finite(tiny_service_client, tiny_model_dir):
    """The local engine's optim_step applies no non-finite gradient (Adam would put NaN into every
    adapter weight); the arm stops on one line naming the gradient and the loss, and the step's
    metrics of the steps before it carry the gradient norm and the sampler/learner logprob gap."""
    from rl.loop import new_window, train_arm
    from schemas.errors import ArmFailed

    arm, env, tc, renderer = three_step_grpo_arm(tiny_service_client, tiny_model_dir)
    logs = []
    train_arm(arm, training_client=tc, env=env, renderer=renderer, order=env.train_order(seed=0), steps=range(1),
              window=new_window(arm), on_step=logs.append, stage="train")
    metrics = logs[0].metrics
    assert metrics["grad_norm"] > 0 and 0 <= metrics["logprob_gap_max"] < 1e-3, metrics  # fp32 on CPU: one policy
    before = [p.detach().clone() for p in tc._engine.params]
    with pytest.raises(ArmFailed) as failed:
        train_arm(arm, training_client=nan_gradient_on_forward_backward(tc), env=env, renderer=renderer,
                  order=env.train_order(seed=0), steps=range(1, 3), window=logs[0].next_window, on_step=logs.append,
                  stage="train")
    assert str(failed.value).startswith("train grpo_gs8 failed at step 2/3: FloatingPointError: optim_step: the gradient "
                                        "is not finite (norm nan); the update was not applied; the training loss was ")
    assert all(torch.equal(a, b) for a, b in zip(before, tc._engine.params))
    assert len(logs) == 1
