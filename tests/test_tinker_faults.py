"""Issue 47 (4): the tinker backend when the service misbehaves after its start-up check.

The real SDK (0.38) against a loopback FakeTinkerServer that starts well and then hangs, resets
connections, answers 429 or answers well-formed JSON of the wrong shape, or refuses the key: each
call ends within the per-call timeout (`GS1_TINKER_TIMEOUT`, set to 2 s here; by default the SDK's
own budget) on one line naming the call and the cause, never with the key; the service client works
again once the service does. The start-up probe waits out a 429's Retry-After.
"""

from __future__ import annotations

import pickle
import time

import pytest
from tinker import types

from fakes.fake_tinker_server import FakeTinkerServer
from rl.backends.responses import resolved
from rl.backends.tinker_backend import (DEFAULT_CALL_TIMEOUT_S, TIMEOUT_ENV, call_timeout, make_tinker_service_client,
                                        probe_service)
from schemas.errors import ArmFailed, BackendError, KeyRefused, UserError

KEY = "tml-faults-SECRET-77"
CALL_TIMEOUT_S = 2.0


@pytest.fixture(autouse=True)
def _small_timeout(monkeypatch):
    for name in ("TINKER_BASE_URL", "TINKER_API_KEY", "TINKER_CREDENTIAL_CMD"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(TIMEOUT_ENV, str(CALL_TIMEOUT_S))
    monkeypatch.setenv("TINKER_TELEMETRY", "0")


@pytest.fixture(scope="module")
def fake():
    with FakeTinkerServer(api_key=KEY, sample_latency_s=0.0) as server:
        yield server


@pytest.fixture
def training(fake):
    """A fresh service client per case, as each `gs1 run` (and its rerun) is a process of its own."""
    service = make_tinker_service_client(fake.base_url, KEY)
    client = service.create_lora_training_client("Qwen/Qwen3-0.6B", rank=8, seed=0).result()
    yield client
    fake.misbehave(None)
    service.close("success").result(timeout=30)


def _datum():
    return types.Datum(
        model_input=types.ModelInput.from_ints([1, 2, 3]),
        loss_fn_inputs={
            "target_tokens": types.TensorData(data=[2, 3, 4], dtype="int64", shape=[3]),
            "logprobs": types.TensorData(data=[-0.5, -0.25, -1.0], dtype="float32", shape=[3]),
            "advantages": types.TensorData(data=[1.0, 1.0, 0.5], dtype="float32", shape=[3]),
        },
    )


def _forward_backward(training):
    return resolved(training.forward_backward([_datum()], "importance_sampling"), backend="tinker",
                    call="forward_backward", expected="a ForwardBackwardOutput")


@pytest.mark.parametrize("mode, cause", [
    ("hang", f"no result within {CALL_TIMEOUT_S:g} s ({TIMEOUT_ENV}; the SDK retrying with backoff 1, 2, 4 ... 30 s "
             "meanwhile); the service now: no answer to POST /api/v1/client/config"),
    ("reset", "the service now: connection reset"),
    ("429", "the service now: rate limited (HTTP 429, Retry-After 30 s)"),
    ("bad_shape", "got an answer of the wrong shape (HTTP 200: ValidationError"),
])
def test_a_misbehaving_service_ends_the_call_in_bounded_time_on_one_line(fake, training, mode, cause):
    fake.misbehave(mode, retry_after=30 if mode == "429" else None)
    start = time.monotonic()
    try:
        with pytest.raises(BackendError) as e:
            _forward_backward(training)
    finally:
        fake.misbehave(None)
    elapsed = time.monotonic() - start
    message = str(e.value)
    assert elapsed < CALL_TIMEOUT_S + 8, (elapsed, message)
    assert "\n" not in message and KEY not in message and "SECRET" not in message
    assert message.startswith("tinker backend: forward_backward: expected a ForwardBackwardOutput; got "), message
    assert cause in message, message
    assert not isinstance(e.value, KeyRefused)
    # The service is back: the same client's next call works (what a rerun of the stage relies on).
    assert _forward_backward(training).metrics["loss:sum"] == pytest.approx(-2.5)


def test_a_key_refused_mid_run_is_key_refused_exit_2(fake, training):
    fake.misbehave("401")
    try:
        with pytest.raises(KeyRefused) as e:
            _forward_backward(training)
    finally:
        fake.misbehave(None)
    assert str(e.value) == ("tinker backend: forward_backward: expected a ForwardBackwardOutput; got the service "
                            "refused TINKER_API_KEY (HTTP 401)")
    failed = ArmFailed.of("train", "gs1_kernel", e.value, 3, 5)
    assert str(failed) == f"train gs1_kernel failed at step 3/5: {e.value}"
    assert failed.exit_code == 2 and pickle.loads(pickle.dumps(failed)).exit_code == 2
    assert pickle.loads(pickle.dumps(e.value)).exit_code == 2


def test_an_arm_failure_names_stage_arm_step_and_call():
    cause = BackendError("tinker", "optim_step", "an OptimStepResponse", "no result within 2 s (GS1_TINKER_TIMEOUT)")
    failed = ArmFailed.of("train", "gs1_kernel", cause, 3, 5)
    assert str(failed) == ("train gs1_kernel failed at step 3/5: tinker backend: optim_step: expected an "
                           "OptimStepResponse; got no result within 2 s (GS1_TINKER_TIMEOUT)")
    assert failed.exit_code == 1


def test_the_call_timeout_is_the_sdks_budget_unless_set(monkeypatch):
    monkeypatch.delenv(TIMEOUT_ENV)
    assert call_timeout() == DEFAULT_CALL_TIMEOUT_S == 360.0  # the SDK's 300 s of retries + one 60 s request
    monkeypatch.setenv(TIMEOUT_ENV, "45")
    assert call_timeout() == 45.0
    for bad in ("0", "-3", "soon"):
        monkeypatch.setenv(TIMEOUT_ENV, bad)
        with pytest.raises(UserError, match=TIMEOUT_ENV):
            call_timeout()


# ---- the start-up probe and a 429 ------------------------------------------------------------


def test_the_probe_waits_out_a_429s_retry_after(fake):
    fake.reset_counters()
    fake.fail_next("/api/v1/healthz", 429, retry_after=1)
    fake.fail_next("/api/v1/client/config", 429, retry_after=1)
    start = time.monotonic()
    probe_service(fake.base_url, KEY, timeout=5.0)
    assert time.monotonic() - start >= 2.0
    assert fake.calls["/api/v1/healthz"] == 2 and fake.calls["/api/v1/client/config"] == 2


def test_the_probe_says_rate_limited_when_the_retry_after_is_too_long(fake):
    fake.fail_next("/api/v1/healthz", 429, retry_after=3600)
    start = time.monotonic()
    with pytest.raises(UserError) as e:
        probe_service(fake.base_url, KEY, timeout=5.0)
    assert time.monotonic() - start < 5
    message = str(e.value)
    assert "rate limiting" in message and "HTTP 429, Retry-After 3600 s" in message and "not healthy" not in message
    assert KEY not in message
