"""The `tinker` backend: the real tinker SDK against a loopback FakeTinkerServer.

(a) start-up failures are one-line `UserError`s within 10 s with the key never shown;
(b) a training step's 64 sample requests are all in flight at once (one latency), while
    eval's bounded sampling really bounds; (c) transient errors are retried.
"""

from __future__ import annotations

import json
import logging
import socket
import time

import pytest
import tinker
from tinker import types

from fakes.eval_env import FakeEvalEnv, FakeRenderer
from fakes.fake_tinker_server import FakeTinkerServer
from schemas.errors import UserError
from rl.backends.tinker_backend import make_tinker_service_client, probe_service
from rl.sampling import submit_all

LATENCY_S = 0.3
SECRET_KEY = "tml-test-SECRET-4f1c9a"
PARAMS = types.SamplingParams(max_tokens=4, temperature=1.0, seed=0)


@pytest.fixture(autouse=True)
def _no_ambient_tinker_env(monkeypatch):
    for name in ("TINKER_BASE_URL", "TINKER_API_KEY", "TINKER_CREDENTIAL_CMD"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def fake_tinker():
    with FakeTinkerServer(api_key=SECRET_KEY, sample_latency_s=LATENCY_S) as server:
        yield server


@pytest.fixture(scope="module")
def clients(fake_tinker):
    service = make_tinker_service_client(fake_tinker.base_url, SECRET_KEY)
    training = service.create_lora_training_client("Qwen/Qwen3-0.6B", rank=8, seed=0).result()
    sampler = training.save_weights_and_get_sampling_client().result()
    sampler.sample(types.ModelInput.from_ints([1, 2]), 1, PARAMS).result()  # warm connections
    yield service, training, sampler
    service.close("success").result(timeout=30)  # no heartbeats to a stopped server after the module


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _assert_one_clean_line(err: UserError) -> str:
    message = str(err)
    assert message and "\n" not in message
    assert SECRET_KEY not in message and "SECRET" not in message
    return message


def _prompts(n):
    return [types.ModelInput.from_ints([500, i]) for i in range(n)]


# ---- (a) start-up failures -----------------------------------------------------------


def test_unreachable_service_is_one_line_user_error_within_10s():
    url = f"http://127.0.0.1:{_closed_port()}"
    start = time.monotonic()
    with pytest.raises(UserError) as e:
        make_tinker_service_client(url, SECRET_KEY)
    assert time.monotonic() - start < 10
    message = _assert_one_clean_line(e.value)
    assert "unreachable" in message and url in message


def test_service_that_never_answers_fails_within_10s():
    # A socket that listens but never reads: the TCP connect succeeds, the answer never comes.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        start = time.monotonic()
        with pytest.raises(UserError) as e:
            make_tinker_service_client(url, SECRET_KEY)  # default probe_timeout
        elapsed = time.monotonic() - start
    assert elapsed < 10
    assert "did not answer" in _assert_one_clean_line(e.value)


def test_missing_key_is_user_error_before_any_request(fake_tinker, monkeypatch):
    monkeypatch.setenv("TINKER_BASE_URL", fake_tinker.base_url)
    fake_tinker.reset_counters()
    with pytest.raises(UserError, match="TINKER_API_KEY") as e:
        make_tinker_service_client()
    _assert_one_clean_line(e.value)
    assert sum(fake_tinker.calls.values()) == 0


def test_missing_base_url_is_user_error(monkeypatch):
    monkeypatch.setenv("TINKER_API_KEY", SECRET_KEY)
    with pytest.raises(UserError, match="TINKER_BASE_URL") as e:
        make_tinker_service_client()
    _assert_one_clean_line(e.value)


def test_malformed_key_and_url_are_user_errors(fake_tinker):
    with pytest.raises(UserError, match="malformed") as e:
        make_tinker_service_client(fake_tinker.base_url, "SECRET-not-a-tinker-key")
    _assert_one_clean_line(e.value)
    with pytest.raises(UserError, match="http"):
        make_tinker_service_client("127.0.0.1:8000", SECRET_KEY)


@pytest.mark.parametrize("status", [404, 500, 503])
def test_unhealthy_service_is_user_error(fake_tinker, status):
    fake_tinker.fail_next("/api/v1/healthz", status)
    with pytest.raises(UserError, match=f"not healthy.*HTTP {status}") as e:
        make_tinker_service_client(fake_tinker.base_url, SECRET_KEY)
    _assert_one_clean_line(e.value)


def test_rejected_key_is_user_error(fake_tinker):
    with pytest.raises(UserError, match="rejected TINKER_API_KEY.*401") as e:
        probe_service(fake_tinker.base_url, "tml-SECRET-wrong-key")
    assert "tml-SECRET-wrong-key" not in _assert_one_clean_line(e.value)


def test_env_vars_configure_the_real_sdk_and_the_key_is_never_logged(
    fake_tinker, monkeypatch, caplog
):
    monkeypatch.setenv("TINKER_BASE_URL", fake_tinker.base_url + "/")
    monkeypatch.setenv("TINKER_API_KEY", SECRET_KEY)
    caplog.set_level(logging.DEBUG)
    service = make_tinker_service_client()
    assert isinstance(service, tinker.ServiceClient)
    sampler = service.create_sampling_client(base_model="Qwen/Qwen3-0.6B").result()
    response = sampler.sample(types.ModelInput.from_ints([3, 9]), 2, PARAMS).result()
    assert [s.tokens for s in response.sequences] == [[9, 0, 11, 12], [9, 1, 11, 12]]
    assert all(s.stop_reason == "length" for s in response.sequences)
    assert "ServiceClient initialized for session" in caplog.text  # the SDK's logs were seen
    assert SECRET_KEY not in caplog.text
    service.close("success").result(timeout=30)


def test_probe_sends_the_gateway_headers_the_sdk_sends(fake_tinker, monkeypatch):
    monkeypatch.setenv("CLOUDFLARE_ACCESS_CLIENT_ID", "cf-id-1")
    service = make_tinker_service_client(
        fake_tinker.base_url, SECRET_KEY, default_headers_overrides={"X-Gateway": "g1"}
    )
    assert isinstance(service, tinker.ServiceClient)
    for path in ("/api/v1/healthz", "/api/v1/client/config"):
        seen = fake_tinker.last_headers[path]
        assert seen["cf-access-client-id"] == "cf-id-1" and seen["x-gateway"] == "g1"
    assert fake_tinker.last_headers["/api/v1/client/config"]["x-api-key"] == SECRET_KEY
    assert "x-api-key" not in fake_tinker.last_headers["/api/v1/healthz"]


# ---- (b) concurrency against a fixed-latency service ---------------------------------


def test_a_step_of_64_requests_takes_about_one_latency(fake_tinker, clients):
    _, _, sampler = clients
    fake_tinker.reset_counters()
    # Nothing is answered before all 64 arrive (or 10 s pass): the in-flight count proves the
    # step submits every request before awaiting any, whatever the CI machine's load.
    fake_tinker.hold_samples(64, timeout_s=10.0)
    start = time.monotonic()
    futures_P = submit_all(sampler, _prompts(64), 1, PARAMS)
    responses_P = [f.result() for f in futures_P]
    elapsed = time.monotonic() - start
    assert fake_tinker.max_samples_in_flight == 64
    # Of the order of one latency plus submission and SDK polling on a loaded machine; one at a
    # time would take 64 x 0.3 s = 19.2 s.
    assert LATENCY_S <= elapsed < 20 * LATENCY_S
    assert fake_tinker.sample_requests == 64
    assert [r.sequences[0].tokens[0] for r in responses_P] == list(range(64))


def _eval(sampler, n: int, max_in_flight: int) -> list[dict]:
    from rl.envs.base import Problem
    from rl.loop import eval_rows

    problems = [Problem(id=str(i), question=f"q{i}", answer="0") for i in range(n)]
    return eval_rows(sampler, env=FakeEvalEnv(prefix=500), renderer=FakeRenderer(), problems=problems, arm_name="a",
                     max_tokens=4, max_in_flight=max_in_flight)


def test_eval_sampling_really_bounds(fake_tinker, clients):
    _, _, sampler = clients
    fake_tinker.reset_counters()
    start = time.monotonic()
    rows = _eval(sampler, 64, max_in_flight=8)  # the eval's own path: chunks of 8, each awaited whole
    elapsed = time.monotonic() - start
    # 64 / 8 = 8 waves of one latency each: at least 8 latencies, far from 64.
    assert 2 <= fake_tinker.max_samples_in_flight <= 8
    assert 8 * LATENCY_S <= elapsed < 32 * LATENCY_S
    assert [r["item_id"] for r in rows] == [str(i) for i in range(64)]


# ---- (c) transient errors ------------------------------------------------------------


@pytest.mark.parametrize(
    "path, status",
    [("/api/v1/asample", 503), ("/api/v1/asample", 429), ("/api/v1/retrieve_future", 503)],
)
def test_transient_error_on_first_try_is_retried(fake_tinker, clients, path, status):
    _, _, sampler = clients
    fake_tinker.reset_counters()
    fake_tinker.fail_next(path, status)
    response = sampler.sample(types.ModelInput.from_ints([7, 42]), 1, PARAMS).result()
    assert response.sequences[0].tokens[:2] == [42, 0]
    assert fake_tinker.injected == 1
    assert fake_tinker.calls[path] == 2  # the failed try and the retry


def test_a_sample_request_the_service_failed_ends_the_eval_on_one_line(fake_tinker, clients):
    """The SDK does not retry a request the service reports as failed: the eval ends there, on
    `resolved`'s one line naming the call and the cause, not on the SDK's traceback."""
    from schemas.errors import BackendError

    _, _, sampler = clients
    fake_tinker.fail_next_samples(1)
    with pytest.raises(tinker.RequestFailedError):  # the SDK itself does not retry these
        sampler.sample(types.ModelInput.from_ints([7, 1]), 1, PARAMS).result()
    fake_tinker.fail_next_samples(1)
    with pytest.raises(BackendError) as failed:
        _eval(sampler, 4, max_in_flight=4)
    text = str(failed.value)
    assert text.startswith("tinker backend: sample (eval, greedy): expected a SampleResponse; got ")
    assert "RequestFailedError" in text and "\n" not in text


def test_training_calls_round_trip_and_survive_a_503(fake_tinker, clients):
    _, training, _ = clients
    fake_tinker.reset_counters()
    fake_tinker.fail_next("/api/v1/forward_backward", 503)
    datum = types.Datum(
        model_input=types.ModelInput.from_ints([1, 2, 3]),
        loss_fn_inputs={
            "target_tokens": types.TensorData(data=[2, 3, 4], dtype="int64", shape=[3]),
            "logprobs": types.TensorData(data=[-0.5, -0.25, -1.0], dtype="float32", shape=[3]),
            "advantages": types.TensorData(data=[1.0, 1.0, 0.5], dtype="float32", shape=[3]),
        },
    )
    fwd_bwd_future = training.forward_backward([datum, datum], "importance_sampling")
    optim_future = training.optim_step(types.AdamParams(learning_rate=1e-4, eps=1e-8))
    fwd_bwd = fwd_bwd_future.result()
    optim_future.result()
    assert fwd_bwd.metrics["loss:sum"] == pytest.approx(-5.0)
    assert fwd_bwd.loss_fn_outputs[1]["logprobs"].tolist() == [-0.5, -0.25, -1.0]
    assert fake_tinker.injected == 1 and fake_tinker.optim_steps == 1
    saved = training.save_state("step-1").result()
    assert saved.path.endswith("/weights/step-1")


# ---- the key in messages, whatever it holds; a 200 that is not the service ---------------

HOSTILE_KEYS = [
    "tml-SECRET\nx",  # a newline: httpx refuses the header and quotes it in its error
    "tml-SEC\"RET'quoted",
    "tml-SECRÉT-ünicode",  # non-ASCII: httpx fails to encode the header
    "tml-SECRET\t\x07ctl",
    "tml-SECRET-" + "k" * 5000,  # very long (and well formed: the service rejects it)
]


class _LoopbackService:
    """A loopback HTTP server (a fake, for these tests): 200 on /api/v1/healthz; elsewhere 401,
    or 200 with an HTML page when `html` is set (a proxy or web page at the URL)."""

    def __init__(self, html: bool = False):
        import http.server
        import threading

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self):
                self.rfile.read(int(self.headers.get("content-length") or 0))
                if self.path == "/api/v1/healthz":
                    status, body, kind = 200, b'{"status": "ok"}', "application/json"
                elif html:
                    status, body, kind = 200, b"<html><body>Welcome</body></html>", "text/html"
                else:
                    status, body, kind = 401, b'{"detail": "Invalid API key"}', "application/json"
                self.send_response(status)
                self.send_header("content-type", kind)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def loopback_401():
    service = _LoopbackService()
    yield service.url
    service.close()


def _key_forms(key: str) -> list[str]:
    forms = [key, repr(key)[1:-1], repr(key.encode())[2:-1], " ".join(key.split()), "SECRET"]
    return [f for f in forms if len(f) >= 6]


@pytest.mark.parametrize("key", HOSTILE_KEYS, ids=["newline", "quotes", "non-ascii", "control", "long"])
def test_gs1_run_never_prints_the_key_whatever_it_holds(loopback_401, key, monkeypatch, capsys):
    from gs1.cli import main

    monkeypatch.setenv("TINKER_BASE_URL", loopback_401)
    monkeypatch.setenv("TINKER_API_KEY", key)
    rc = main(["run", "--backend", "tinker"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith("gs1: error: "), err
    assert not any(form in err for form in _key_forms(key)), err


@pytest.mark.parametrize("key", HOSTILE_KEYS, ids=["newline", "quotes", "non-ascii", "control", "long"])
def test_probe_redacts_every_form_of_the_key_from_http_errors(loopback_401, key):
    # Straight to the probe, past the key check: whatever httpx says about the header is redacted.
    with pytest.raises(UserError) as e:
        probe_service(loopback_401, key)
    message = _assert_one_clean_line(e.value)
    assert not any(form in message for form in _key_forms(key)), message


def test_redact_covers_repr_json_and_folded_forms():
    from schemas.redaction import redact

    key = 'tml-SEC"RET\n\u00e9\\x'
    text = f"a {key} b {key!r} c {key.encode()!r} d {json.dumps(key)} e {' '.join(key.split())}"
    assert "SEC" not in redact(text, key)


def test_a_200_with_a_non_json_body_fails_the_probe():
    service = _LoopbackService(html=True)
    try:
        with pytest.raises(UserError, match="not a Tinker service.*non-JSON body \\(text/html\\)") as e:
            probe_service(service.url, SECRET_KEY)
        _assert_one_clean_line(e.value)
    finally:
        service.close()
