"""The training loop itself at the user's shape: 5 steps of B=64 rollouts with the pinned
W=256 window, on the tiny model through the local engine. Its logged baselines equal
`gs1_kernel_log` on its own log to 1e-12 (each step enters the window exactly once), the audit
reproduces every row, and the window a resumed arm rebuilds from the logs is the live one."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import fixtures.flow_env  # noqa: F401  (registers the token_threshold env)
from fixtures.tiny_model import tiny_model_dir, tiny_service_client  # noqa: F401
from estimators.registry import rollout_log
from rl.audit import audit_log
from rl.envs import get_env
from estimators import gs1_kernel_log
from estimators.kernels import prompt_features
from rl.loop import StepLog, new_window, train_arm, window_from_logs
from design.arm import ArmConfig
from schemas.kernel import KernelSpec

STEPS = 5


@pytest.fixture(scope="module")
def loop_log(tiny_service_client, tiny_model_dir):
    from tinker_cookbook import renderers

    arm = ArmConfig(name="gs1_kernel", advantage="kernel_cross_prompt_baseline", group_size=1, groups_per_batch=64,
                    lr=1e-3, seed=0, steps=STEPS, lora_rank=4, base_model=str(tiny_model_dir), max_tokens=1,
                    kernel=KernelSpec(bandwidth=1.0))  # the pinned W=256: 4 batches of 64
    client = tiny_service_client.create_lora_training_client(str(tiny_model_dir), rank=4, seed=0).result()
    renderer = renderers.get_renderer("qwen3_instruct", client.get_tokenizer())
    env = get_env("token_threshold")
    logs: list[StepLog] = []
    train_arm(arm, training_client=client, env=env, renderer=renderer, order=env.train_order(seed=0),
              steps=range(STEPS), window=new_window(arm), on_step=logs.append)
    tables = [pa.Table.from_pydict(log.rollout_columns()) for log in logs]
    return arm, logs, tables


def test_the_loop_equals_gs1_kernel_log_on_its_own_log(loop_log):
    arm, logs, tables = loop_log
    table = pa.concat_tables(tables)
    assert table.num_rows == STEPS * 64
    steps_R = np.asarray(table.column("step").to_pylist())
    features_R_F = prompt_features(table.column("prompt_num_tokens").to_pylist(), table.column("prompt_mean_logprob").to_pylist())
    assert len(np.unique(features_R_F, axis=0)) > 4  # prompts differ: the kernel has something to weigh
    offline = gs1_kernel_log(steps_R, np.asarray(table.column("reward").to_pylist()), features_R_F, arm.kernel)
    for column in ("baseline", "advantage", "kernel_mass", "effective_neighbors"):
        np.testing.assert_allclose(table.column(column).to_pylist(), getattr(offline, column), rtol=0, atol=1e-12)
    # from step 4 on the window is full: 192 earlier rollouts, each once
    assert [len(log.next_window) for log in logs] == [64, 128, 192, 256, 256]


def test_the_audit_reproduces_every_logged_row(loop_log):
    arm, _, tables = loop_log
    result = audit_log(arm, rollout_log(pa.concat_tables(tables)))
    assert result.passed and result.rows == STEPS * 64 and result.steps == STEPS, result
    assert max(result.max_abs_diff.values()) <= 1e-12


def test_the_window_rebuilt_for_resume_is_the_live_one(loop_log):
    arm, logs, tables = loop_log
    for done in range(1, STEPS + 1):
        rebuilt = window_from_logs(tables[:done], arm)
        live = logs[done - 1].next_window
        np.testing.assert_array_equal(rebuilt.rewards_H, live.rewards_H)
        np.testing.assert_allclose(rebuilt.features_H_F, live.features_H_F, rtol=0, atol=1e-15)
