"""The `tinker` backend as another Tinker-API server answers it, through the real SDK (0.38) and a
loopback FakeTinkerServer set up to answer like that server:

- current SDK calls only: a demo-scale flow run and a resumed training arm raise no FutureWarning
  or DeprecationWarning and log or print no SDK deprecation message;
- few clients: a service that caps live LoRA adapters at 3 runs the whole flow (preflight, pilot,
  both training arms in parallel, eval), and every training client is given back;
- tolerant where the API allows: no `loss:sum` metric but per-token losses, prompt logprobs
  without the leading None -- read exactly;
- clear where it does not: an adapter limit, or an answer that cannot be read, ends in one
  `BackendError` line naming the backend, the call and what was expected.
"""

from __future__ import annotations

import contextlib
import json
import logging
import warnings
from pathlib import Path

import numpy as np
import pytest
from tinker import types

import fixtures.flow_env  # noqa: F401  (registers the token_threshold env)
from fakes.fake_tinker_server import FakeTinkerServer
from fixtures.tiny_model import tiny_model_dir  # noqa: F401
from rl.backends.responses import loss_sum, prompt_mean_logprob_of
from rl.backends.tinker_backend import make_tinker_service_client
from schemas.errors import BackendError
from test_flow import flow_spec

KEY = "tml-current-sdk-test"
ADAPTER_LIMIT = 3


class _Deprecations(logging.Handler):
    """Collects every record that reads like a deprecation notice (the SDK logs some, e.g. for
    `load_state*`, instead of warning)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record):
        text = record.getMessage()
        if "deprecat" in text.lower():
            self.messages.append(f"{record.name}: {text}")


@contextlib.contextmanager
def no_deprecations(capfd=None):
    """Warnings of the deprecation kinds raise (wherever they come from); deprecation notices the
    SDK logs (and, with `capfd`, prints) are collected and fail the test afterwards."""
    handler = _Deprecations()
    loggers = [logging.getLogger(), logging.getLogger("tinker")]
    for lg in loggers:
        lg.addHandler(handler)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)
            warnings.filterwarnings("error", category=DeprecationWarning, module=r"(tinker|rl|tasks|flows)(\.|$)")
            warnings.filterwarnings("error", message=r".*(DEPRECATED|deprecated).*", category=DeprecationWarning)
            yield handler
    finally:
        for lg in loggers:
            lg.removeHandler(handler)
    printed = capfd.readouterr() if capfd is not None else None
    noted = [line for line in (printed.out + printed.err).splitlines() if "DEPRECATED" in line] if printed else []
    assert not handler.messages and not noted, handler.messages + noted


@pytest.fixture
def use_fake(monkeypatch):
    """Points the pipeline's tinker backend at a fresh fake (one service client per test)."""
    import pipeline.services

    monkeypatch.setattr(pipeline.services, "_SERVICES", {})

    @contextlib.contextmanager
    def start(**options):
        with FakeTinkerServer(api_key=KEY, sample_latency_s=0.0, **options) as server:
            monkeypatch.setenv("TINKER_BASE_URL", server.base_url)
            monkeypatch.setenv("TINKER_API_KEY", KEY)
            try:
                yield server
            finally:
                # End the sessions before the server stops: a session left open keeps sending
                # heartbeats, and logs each failure for the rest of the test run.
                for service in pipeline.services._SERVICES.values():
                    service.close("success").result(timeout=30)
                pipeline.services._SERVICES.clear()

    return start


# ---- the flow: current SDK calls, at most 3 training clients, per-token losses, N-1 logprobs ----


def test_a_flow_run_on_a_capped_service_uses_current_sdk_calls_and_at_most_3_clients(
        prefect_harness, tmp_path, repo_root, tiny_model_dir, use_fake):  # noqa: F811
    from flows.experiment import experiment_in

    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(flow_spec(repo_root, tiny_model_dir, steps=2)))
    run_dir = tmp_path / "run"
    # skyrl's answers: no loss:sum (per-token losses instead), N-1 prompt logprobs; and a cap.
    with use_fake(max_adapters=ADAPTER_LIMIT, seeded_first_token=True, loss_sum_metric=False,
                  prompt_logprobs_leading_none=False) as fake, no_deprecations():
        # (no fd capture here: Prefect's console handler, made during the run, would keep the
        # captured stream past the test; the SDK's deprecation notices are log records anyway)
        state = experiment_in(run_dir)(spec_path=str(spec_path), run_dir=str(run_dir), backend="tinker",
                                      return_state=True)
        live_after = fake.live_models
    assert state.is_completed(), state.message
    assert fake.adapter_limit_hits == 0
    assert 2 <= fake.max_live_models <= ADAPTER_LIMIT  # both training arms ran at once
    assert live_after == 0  # every training client was given back
    # Every check of the preflight compared numbers read from the per-token losses.
    record = json.loads((run_dir / "preflight" / "record.json").read_text())
    assert record["backend"] == "tinker" and all(c["passed"] for c in record["checks"])
    probes = [c["loss"] for c in record["checks"] if c["name"].startswith("probe_")]
    assert len(probes) == 2 and all(np.isfinite(probes))
    # The N-1 prompt logprobs (all -1.0 in the fake) gave the exact mean, nothing shifted in.
    from schemas.artifacts import read_rows

    rows = read_rows("rollouts", run_dir / "train" / "gs1_kernel" / "rollouts.parquet")
    assert {r["prompt_mean_logprob"] for r in rows} == {-1.0}
    decision = json.loads((run_dir / "decision" / "decision.json").read_text())
    assert decision["n"] == 48


def test_a_resumed_arm_comes_back_from_its_state_through_the_current_call(tmp_path, tiny_model_dir, use_fake,  # noqa: F811
                                                                           capfd):
    from design.arm import ArmConfig
    from design.plan import RunContext
    from schemas.layout import RunLayout
    from tasks.arms import train_with_checkpoints

    arm = ArmConfig(name="gs1_kernel", advantage="kernel_cross_prompt_baseline", group_size=1, groups_per_batch=8,
                    lr=1e-3, seed=0, steps=3, lora_rank=4, base_model=str(tiny_model_dir), max_tokens=2,
                    kernel={"bandwidth": 1.0, "window": 32})
    run = RunContext(env="token_threshold", env_options={}, renderer="qwen3_instruct", base_model=str(tiny_model_dir),
                     treatment="gs1_kernel", baseline="grpo_gs8")
    with use_fake(max_adapters=1, seeded_first_token=True) as fake, no_deprecations(capfd):
        first = train_with_checkpoints(arm, run, RunLayout(tmp_path / "run"), "tinker", None, checkpoint_every=1)
        # As after a crash past the last checkpoint: the step logs after it are stale and redone.
        again = train_with_checkpoints(arm, run, RunLayout(tmp_path / "run"), "tinker", None, checkpoint_every=1)
        live_after = fake.live_models
    assert fake.calls["/api/v1/load_weights"] == 1  # the resumed client, created from the state
    assert fake.calls["/api/v1/create_model"] == 1
    assert fake.adapter_limit_hits == 0 and live_after == 0  # one client at a time, each given back
    assert first.arm == again.arm == "gs1_kernel"


# ---- clear where the API does not allow ------------------------------------------------------


def test_an_adapter_limit_ends_the_run_with_one_line_naming_backend_call_and_expectation(
        tmp_path, tiny_model_dir, use_fake):  # noqa: F811
    from design.arm import ArmConfig
    from design.plan import RunContext
    from tasks.arms import arm_client

    arm = ArmConfig(name="grpo_gs8", advantage="group_mean", group_size=8, groups_per_batch=2, lr=1e-3, seed=0,
                    steps=1, lora_rank=4, base_model=str(tiny_model_dir), max_tokens=2)
    run = RunContext(env="token_threshold", env_options={}, renderer="qwen3_instruct", base_model=str(tiny_model_dir),
                     treatment="gs1_kernel", baseline="grpo_gs8")
    with use_fake(max_adapters=1) as fake:
        with arm_client(run, arm, "tinker"):
            with pytest.raises(BackendError) as e:
                with arm_client(run, arm, "tinker"):
                    pass
        assert fake.live_models == 0
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith("tinker backend: create_lora_training_client: expected a LoRA training client")
    assert "Maximum number of LoRA adapters (1) reached" in message
    # Picklable as it crosses Prefect's result store, message intact.
    import pickle

    assert str(pickle.loads(pickle.dumps(e.value))) == message


def _fwd_bwd_output(metrics, per_token_D=None, logprobs_D=None) -> types.ForwardBackwardOutput:
    outputs = []
    for i in range(len(per_token_D or logprobs_D or [])):
        out = {}
        if per_token_D is not None:
            out["elementwise_loss"] = types.TensorData(data=per_token_D[i], dtype="float32", shape=[len(per_token_D[i])])
        if logprobs_D is not None:
            out["logprobs"] = types.TensorData(data=logprobs_D[i], dtype="float32", shape=[len(logprobs_D[i])])
        outputs.append(out)
    return types.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", loss_fn_outputs=outputs, metrics=metrics)


def test_loss_sum_is_the_metric_or_the_exact_sum_of_per_token_losses_else_one_line():
    per_token_D = [[0.25, -1.5, 0.125], [2.0, 0.0625]]
    assert loss_sum(_fwd_bwd_output({"loss:sum": 3.5}, per_token_D), backend="tinker") == 3.5
    assert loss_sum(_fwd_bwd_output({}, per_token_D), backend="tinker") == 0.25 - 1.5 + 0.125 + 2.0 + 0.0625
    with pytest.raises(BackendError) as e:
        loss_sum(_fwd_bwd_output({"loss:mean": 1.0}, logprobs_D=[[-1.0, -2.0]]), backend="tinker")
    assert str(e.value) == (
        "tinker backend: forward_backward: expected the 'loss:sum' metric, or per-token 'elementwise_loss' outputs "
        "for every datum; got metrics ['loss:mean'] and 1 datum output(s) with ['logprobs']"
    )


def test_prompt_logprobs_with_or_without_the_leading_none_else_one_line():
    with_none = [None, -1.0, -2.0, -4.5]
    assert prompt_mean_logprob_of(with_none, 4, backend="tinker", call="sample") == pytest.approx(-2.5)
    assert prompt_mean_logprob_of(with_none[1:], 4, backend="tinker", call="sample") == pytest.approx(-2.5)
    for bad in ([-1.0, -2.0], [None, -1.0, -2.0, -4.5, -3.0], None, [None, None, -1.0]):
        with pytest.raises(BackendError) as e:
            prompt_mean_logprob_of(bad, 4, backend="tinker", call="sample")
        assert str(e.value).startswith(
            "tinker backend: sample: expected 4 prompt logprobs (the first None) or 3 (tokens 2..4); got ")


def test_the_sdk_client_future_used_as_a_client_warns_and_the_local_engine_matches(tiny_model_dir, tmp_path,  # noqa: F811
                                                                                   use_fake):
    from rl.backends import make_service_client

    with use_fake() as fake:
        service = make_tinker_service_client(fake.base_url, KEY)
        future = service.create_lora_training_client(str(tiny_model_dir), rank=4, seed=0)
        with pytest.warns(FutureWarning):
            future.get_tokenizer()
        service.close("success").result(timeout=30)
    local = make_service_client("local", device="cpu", cache_dir=tmp_path)
    local_future = local.create_lora_training_client(str(tiny_model_dir), rank=4, seed=0)
    with pytest.warns(FutureWarning):
        local_future.get_tokenizer()
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        local_future.result().get_tokenizer()  # the resolved client: no warning


def test_gs1_run_on_a_service_with_fewer_adapters_than_the_preflight_needs_is_one_line_exit_1(
        tmp_path, repo_root, tiny_model_dir, use_fake):  # noqa: F811
    """The issue's run: a per-user adapter limit met in the preflight ends `gs1 run` (a process of
    its own, as a user runs it) on one line naming the stage, the arm, the backend, the call and what was expected;
    exit 1; no traceback, no KeyError, no key."""
    import os
    import subprocess
    import sys

    from fixtures.gs1_process import BOOT, TESTS

    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(flow_spec(repo_root, tiny_model_dir, steps=2)))
    with use_fake(max_adapters=1):  # the preflight holds its sampler's client and one fresh one
        env = {**os.environ, "PYTHONPATH": str(TESTS)}
        env.pop("PREFECT_API_URL", None)
        done = subprocess.run(
            [sys.executable, "-c", BOOT, "run", str(spec_path), "--backend", "tinker", "--run-dir", str(tmp_path / "run")],
            env=env, cwd=TESTS.parent, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=900,
        )
    assert done.returncode == 1, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    # Issue 47: the line names the stage and the arm too, and says the run resumes.
    from schemas.layout import PREFLIGHT

    assert last.startswith(f"gs1: {PREFLIGHT} "), last
    assert "failed: tinker backend: create_lora_training_client: expected a LoRA training client" in last, last
    assert "Maximum number of LoRA adapters (1) reached" in last
    assert "Traceback" not in done.stdout + done.stderr and "KeyError" not in done.stdout + done.stderr
    assert KEY not in done.stdout + done.stderr
