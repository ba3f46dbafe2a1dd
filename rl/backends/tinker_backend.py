"""The `tinker` backend: the real Tinker SDK, checked for reachability before it is built.

The user sets `TINKER_BASE_URL` (the service root, e.g.
`https://tinker.thinkingmachines.dev/services/tinker-prod`) and `TINKER_API_KEY` (a key
starting `tml-`, or a Tinker-issued JWT), or passes `base_url=` / `api_key=`.

`tinker.ServiceClient` opens no connection when it is built, and once used it retries an
unreachable service for minutes. So before building one this module probes
`GET {base_url}/api/v1/healthz` and then asks `POST /api/v1/client/config` with the key (the
SDK's own first authenticated call), within `probe_timeout` seconds in all, and turns every
way that can fail into one `UserError` line. The key is sent only in the `X-API-Key` header
(how the SDK authenticates) and never appears in a message.

Retries after start-up are the SDK's own, and they already cover what the RL loop needs
(tinker 0.38, read from `tinker/lib`):
- every request it submits (`asample`, `forward_backward`, `optim_step`, saves, session
  calls) goes through `InternalClientHolder.execute_with_retries`: connection errors,
  timeouts, 408/409/429 and 5xx are retried with backoff 1, 2, 4 ... 30 s for up to 5 min
  (402 billing pauses for up to an hour);
- polling a result (`/retrieve_future`) retries 5xx at once, connection errors and 429
  with backoff, and re-submits a sample whose promise expired (410);
- `SamplingClient.sample` runs under `RetryHandler` (`RetryConfig`): the retryable errors
  again, backoff 0.5 s doubling to 10 s with 25 % jitter, until no request has made
  progress for `progress_timeout` (2 h). `SAMPLE_RETRY_CONFIG` below is that default,
  exposed so a caller can pass a tighter one to `create_sampling_client(retry_config=...)`
  or `save_weights_and_get_sampling_client(retry_config=...)`.
What the SDK does not retry is a request the service reports as failed
(`RequestFailedError`): the call ends there, on `await_result`'s one line naming it.

Bounded calls (issue 47). The SDK bounds a submission by its retry window (5 min) but not a
result's polling (connection errors there back off forever), nor a sample the service keeps
answering 429 (it backs off and resubmits for good); and `APIFuture.result()` waits without limit
unless given the SDK's own `timeout`. So every call the pipeline reads goes through
`await_result` (`rl.backends.responses.resolved`), which passes `result(timeout=call_timeout())`:
`GS1_TINKER_TIMEOUT` seconds, by default the SDK's own budget for one call -- its retry window
(`SDK_RETRY_WINDOW_S`, 300 s) plus one HTTP request's read timeout (`tinker._constants.DEFAULT_TIMEOUT`,
60 s): 360 s. Within it the SDK retries as above; there is no second retry loop here. A call that
times out is cancelled, and the service is asked once (`POST /client/config`, a few seconds) what
state it is in, so the line names the cause: no answer, connection reset or refused, rate limited
(HTTP 429 and its Retry-After), the key refused. A key refused mid-run is a `KeyRefused` (exit 2).

A training client holds a LoRA adapter on the service until the session ends, and a service may
cap adapters per user. `unload_training_client` gives one back when the pipeline is done with it
(`POST /api/v1/unload_model`, whose request and response types the SDK ships, through the
client's own authenticated session and retries; SDK 0.38 has no method for it).
"""

from __future__ import annotations

import concurrent.futures
import email.utils
import logging
import os
import time
from typing import Any

import httpx
import tinker
from tinker import types
from tinker.lib.api_future_impl import _APIFuture
from tinker.lib.client_connection_pool_type import ClientConnectionPoolType
from tinker.lib.retry_handler import RetryConfig

from tinker._constants import DEFAULT_TIMEOUT as SDK_REQUEST_TIMEOUT

from schemas.errors import BackendError, KeyRefused, UserError
from schemas.redaction import one_line, redact

HEALTHZ_PATH = "/api/v1/healthz"
CLIENT_CONFIG_PATH = "/api/v1/client/config"
UNLOAD_MODEL_PATH = "/api/v1/unload_model"
UNLOAD_TIMEOUT_S = 120.0

logger = logging.getLogger(__name__)

# The SDK's default retry policy for sampling, named so callers can see and adjust it.
SAMPLE_RETRY_CONFIG = RetryConfig()

# The SDK's budget for one call (tinker 0.38): `InternalClientHolder.execute_with_retries` retries
# for MAX_WAIT_TIME = 300 s (a constant inside that method, not a setting), each HTTP request
# waiting up to DEFAULT_TIMEOUT's read timeout (60 s; connect 5 s).
SDK_RETRY_WINDOW_S = 300.0
TIMEOUT_ENV = "GS1_TINKER_TIMEOUT"
DEFAULT_CALL_TIMEOUT_S = SDK_RETRY_WINDOW_S + float(SDK_REQUEST_TIMEOUT.read or 60.0)
DIAGNOSE_TIMEOUT_S = 5.0
# The start-up probe waits out a 429's Retry-After up to this long in all, then says it is rate limited.
PROBE_RETRY_AFTER_MAX_S = 60.0

# The service the backend was made for (URL, key, extra headers): asked what is wrong when a call
# times out. In memory only; the key never leaves the X-API-Key header.
_SERVICE: dict[str, Any] = {}


def call_timeout() -> float:
    """Seconds one SDK call's result is awaited: `$GS1_TINKER_TIMEOUT`, else the SDK's own budget."""
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_CALL_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise UserError(f"{TIMEOUT_ENV} must be a positive number of seconds, got {text!r}")
    return value


def await_result(future: Any, *, call: str, expected: str, timeout: float | None = None) -> Any:
    """`future.result(timeout)` of an SDK call, within `call_timeout()`; whatever stops it is one
    BackendError line naming the call and the cause (a `KeyRefused` for a refused key)."""
    timeout = call_timeout() if timeout is None else timeout
    try:
        return future.result(timeout=timeout)
    except (concurrent.futures.TimeoutError, TimeoutError) as e:
        with_sdk_deadline = "Timeout of" in str(e)  # the SDK's own APIFuture deadline, if any
        _cancel(future)
        if with_sdk_deadline:
            raise BackendError("tinker", call, expected, one_line(f"TimeoutError: {e}")) from None
        state, refused = _diagnose()
        got = (f"no result within {timeout:g} s ({TIMEOUT_ENV}; the SDK retrying with backoff 1, 2, 4 ... 30 s "
               f"meanwhile); the service now: {state}")
        raise (KeyRefused if refused else BackendError)("tinker", call, expected, got) from None
    except (tinker.AuthenticationError, tinker.PermissionDeniedError) as e:
        raise KeyRefused("tinker", call, expected, f"the service refused TINKER_API_KEY (HTTP {e.status_code})") from None
    except tinker.RateLimitError as e:
        raise BackendError("tinker", call, expected, f"rate limited (HTTP 429{_retry_after_text(e.response)}) "
                           "past the SDK's retries") from None
    except tinker.APITimeoutError:
        raise BackendError("tinker", call, expected, f"no answer: each request timed out, for the SDK's "
                           f"{SDK_RETRY_WINDOW_S:g} s of retries") from None
    except tinker.APIConnectionError as e:
        raise BackendError("tinker", call, expected, _redacted(f"connection failed for the SDK's "
                           f"{SDK_RETRY_WINDOW_S:g} s of retries ({_root_cause(e)})")) from None
    except tinker.APIResponseValidationError as e:
        raise BackendError("tinker", call, expected, _redacted(f"an answer of the wrong shape (HTTP "
                           f"{e.status_code}: {_first_line(e)})")) from None
    except (UserError, BackendError):
        raise
    except Exception as e:  # noqa: BLE001 - whatever the service answered, the run ends on one line
        raise BackendError("tinker", call, expected, _redacted(f"{type(e).__name__}: {e}")) from None


def _cancel(future: Any) -> None:
    try:
        inner = future.future() if hasattr(future, "future") else future
        inner.cancel()
    except Exception:  # noqa: BLE001 - best effort: the SDK's background task may already be gone
        pass


def _first_line(e: BaseException) -> str:
    cause = e.__cause__ or e.__context__
    text = f"{type(cause).__name__}: {cause}" if cause is not None else str(e)
    return next((line.strip() for line in text.splitlines() if line.strip()), type(e).__name__)


def _root_cause(e: BaseException) -> str:
    while (e.__cause__ or e.__context__) is not None:
        e = e.__cause__ or e.__context__
    return one_line(f"{type(e).__name__}: {e}")


def _redacted(text: str) -> str:
    key = _SERVICE.get("api_key")
    return one_line(redact(text, key) if key else text)


def _retry_after_text(response: httpx.Response | None) -> str:
    seconds = _retry_after_s(response)
    return f", Retry-After {seconds:g} s" if seconds is not None else ""


def _retry_after_s(response: httpx.Response | None) -> float | None:
    """A response's Retry-After in seconds (delta-seconds or an HTTP date), None when absent or unreadable."""
    value = (response.headers.get("retry-after") if response is not None else None) or ""
    value = value.strip()
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _diagnose() -> tuple[str, bool]:
    """What state the service is in now, asked once within DIAGNOSE_TIMEOUT_S: (words, key refused)."""
    if not _SERVICE:
        return "unknown (no service recorded)", False
    base_url, api_key = _SERVICE["base_url"], _SERVICE["api_key"]
    headers = _sdk_default_headers() | dict(_SERVICE.get("headers") or {}) | {"X-API-Key": api_key}
    try:
        with httpx.Client(timeout=DIAGNOSE_TIMEOUT_S, follow_redirects=True, headers=headers) as http:
            answer = http.post(base_url + CLIENT_CONFIG_PATH, json={"sdk_version": tinker.__version__})
    except httpx.TimeoutException:
        return f"no answer to POST {CLIENT_CONFIG_PATH} within {DIAGNOSE_TIMEOUT_S:g} s", False
    except (httpx.HTTPError, ValueError, UnicodeError) as e:
        cause = e.__cause__ or e.__context__ or e
        reset = isinstance(cause, ConnectionResetError) or "reset" in str(e).lower() or "disconnected" in str(e).lower()
        what = "connection reset" if reset else "connection failed"
        return _redacted(f"{what} ({type(e).__name__}: {e})"), False
    if answer.status_code in (401, 403):
        return f"it refuses TINKER_API_KEY (HTTP {answer.status_code})", True
    if answer.status_code == 429:
        return f"rate limited (HTTP 429{_retry_after_text(answer)})", False
    if not answer.is_success:
        return f"POST {CLIENT_CONFIG_PATH} answers HTTP {answer.status_code}", False
    return f"it answers POST {CLIENT_CONFIG_PATH}, but this call got no result", False


def make_tinker_service_client(
    base_url: str | None = None,
    api_key: str | None = None,
    *,
    probe_timeout: float = 5.0,
    **service_kwargs: Any,
) -> tinker.ServiceClient:
    """A real `tinker.ServiceClient` for a service that answered its health and key checks.

    `base_url` defaults to `$TINKER_BASE_URL` and `api_key` to `$TINKER_API_KEY`.
    `service_kwargs` go to `tinker.ServiceClient` (`user_metadata`, `project_id`,
    `display_name`, `default_headers_overrides`). Raises `UserError` (one line, no key in
    it) when either is missing or malformed, the service cannot be reached, or it rejects
    the key.
    """
    base_url = _resolve_base_url(base_url)
    api_key = _resolve_api_key(api_key)
    extra_headers = dict(service_kwargs.get("default_headers_overrides") or {})
    probe_service(base_url, api_key, timeout=probe_timeout, headers=extra_headers)
    _SERVICE.update(base_url=base_url, api_key=api_key, headers=extra_headers)
    return tinker.ServiceClient(base_url=base_url, api_key=api_key, **service_kwargs)


def unload_training_client(training_client: tinker.TrainingClient, timeout: float | None = None) -> None:
    """Free the service's LoRA adapter behind `training_client` and wait until it is gone.

    Sent as the SDK sends its own calls (the holder's authenticated client, `execute_with_retries`,
    then the result polled as an `APIFuture`). A service without the endpoint keeps the adapter
    until the session ends: that is logged, not fatal (a later creation over its limit fails
    with a clear line of its own).
    """
    holder = training_client.holder
    model_id = training_client.model_id

    async def unload() -> types.UnloadModelResponse:
        started = time.time()

        async def send():
            with holder.aclient(ClientConnectionPoolType.TRAIN) as client:
                return await client.post(
                    UNLOAD_MODEL_PATH, body=types.UnloadModelRequest(model_id=model_id).model_dump(mode="json"),
                    cast_to=types.UntypedAPIFuture,
                )

        future = await holder.execute_with_retries(send)
        return await _APIFuture(types.UnloadModelResponse, holder, future, request_start_time=started,
                                request_type="UnloadModel").result_async()

    if timeout is None:
        timeout = min(UNLOAD_TIMEOUT_S, call_timeout())
    pending = holder.run_coroutine_threadsafe(unload())
    try:
        pending.result(timeout)
    except (concurrent.futures.TimeoutError, TimeoutError):
        _cancel(pending)
        raise
    except tinker.NotFoundError:
        logger.warning(f"tinker backend: {UNLOAD_MODEL_PATH} not found; adapter {model_id} stays until the session ends")


def probe_service(
    base_url: str,
    api_key: str,
    *,
    timeout: float = 5.0,
    headers: dict[str, str] | None = None,
) -> None:
    """Check that `base_url` is a live Tinker service that accepts `api_key`, within `timeout` s.

    `headers` are sent with both requests, after the Cloudflare Access headers the SDK itself
    adds from `CLOUDFLARE_ACCESS_CLIENT_ID` / `CLOUDFLARE_ACCESS_CLIENT_SECRET`, so the probe
    passes the same gateway the SDK will. Raises `UserError` with one line naming what is wrong.
    """
    deadline = time.monotonic() + timeout
    sent_headers = _sdk_default_headers() | dict(headers or {})
    waited = [0.0]  # seconds spent waiting out 429s, over both requests
    with httpx.Client(timeout=timeout, follow_redirects=True, headers=sent_headers) as http:
        health = _patient_request(http, "GET", base_url, HEALTHZ_PATH, api_key, deadline, waited)
        if not health.is_success:
            raise UserError(
                f"Tinker service at {base_url} is not healthy: GET {HEALTHZ_PATH} answered "
                f"HTTP {health.status_code}"
            )
        config = _patient_request(
            http, "POST", base_url, CLIENT_CONFIG_PATH, api_key, deadline, waited,
            headers={"X-API-Key": api_key},
            json={"sdk_version": tinker.__version__},
        )
    if config.status_code in (401, 403):
        raise UserError(
            f"Tinker service at {base_url} rejected TINKER_API_KEY (HTTP {config.status_code})"
        )
    if not config.is_success:
        raise UserError(
            f"Tinker service at {base_url} failed the client check: POST {CLIENT_CONFIG_PATH} "
            f"answered HTTP {config.status_code}"
        )
    # A proxy or a web page at the URL answers 200 too; the service answers a JSON object.
    if not isinstance(_json_body(config), dict):
        kind = config.headers.get("content-type", "no content type").split(";")[0]
        raise UserError(
            f"{base_url} is not a Tinker service: POST {CLIENT_CONFIG_PATH} answered HTTP "
            f"{config.status_code} with a non-JSON body ({kind}); check TINKER_BASE_URL"
        )


def _patient_request(http: httpx.Client, method: str, base_url: str, path: str, api_key: str, deadline: float,
                     waited: list[float], **kwargs: Any) -> httpx.Response:
    """`_request`, but a 429 is waited out for its Retry-After (1 s without one) and asked again, up to
    PROBE_RETRY_AFTER_MAX_S of waiting in all; a service that stays rate limited is one UserError line."""
    while True:
        # the waits the service asked for do not count against the probe's timeout
        response = _request(http, method, base_url, path, api_key, deadline + waited[0], **kwargs)
        if response.status_code != 429:
            return response
        retry_after = _retry_after_s(response)
        wait = 1.0 if retry_after is None else retry_after
        if waited[0] + wait > PROBE_RETRY_AFTER_MAX_S:
            raise UserError(
                f"Tinker service at {base_url} is rate limiting this client: {method} {path} answered HTTP 429"
                f"{_retry_after_text(response)} (gs1 waits up to {PROBE_RETRY_AFTER_MAX_S:g} s at start-up); "
                "try again later"
            )
        logger.warning(f"tinker backend: {method} {path} answered HTTP 429; retrying after {wait:g} s")
        time.sleep(wait)
        waited[0] += wait


def _json_body(response: httpx.Response):
    try:
        return response.json()
    except ValueError:  # json.JSONDecodeError and UnicodeDecodeError are both ValueErrors
        return None


def _request(
    http: httpx.Client,
    method: str,
    base_url: str,
    path: str,
    api_key: str,
    deadline: float,
    **kwargs: Any,
) -> httpx.Response:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise UserError(f"Tinker service at {base_url} did not answer in time ({path})")
    try:
        return http.request(method, base_url + path, timeout=remaining, **kwargs)
    except httpx.TimeoutException:
        raise UserError(
            f"Tinker service at {base_url} did not answer {path} within the probe timeout; "
            "check TINKER_BASE_URL and your network"
        ) from None
    except (httpx.HTTPError, ValueError, UnicodeError) as e:  # ValueError: e.g. a header httpx refuses
        reason = one_line(redact(f"{type(e).__name__}: {e}", api_key))
        raise UserError(
            f"Tinker service at {base_url} is unreachable ({reason}); check TINKER_BASE_URL"
        ) from None


def _sdk_default_headers() -> dict[str, str]:
    # Mirrors tinker.lib.internal_client_holder._get_default_headers (private in the SDK).
    headers = {}
    if client_id := os.environ.get("CLOUDFLARE_ACCESS_CLIENT_ID"):
        headers["CF-Access-Client-Id"] = client_id
    if client_secret := os.environ.get("CLOUDFLARE_ACCESS_CLIENT_SECRET"):
        headers["CF-Access-Client-Secret"] = client_secret
    return headers


def _resolve_base_url(base_url: str | None) -> str:
    resolved = (base_url or os.environ.get("TINKER_BASE_URL") or "").strip()
    if not resolved:
        raise UserError(
            "no Tinker service URL: set TINKER_BASE_URL (e.g. "
            "https://tinker.thinkingmachines.dev/services/tinker-prod) or pass base_url"
        )
    if not resolved.startswith(("http://", "https://")):
        raise UserError(f"TINKER_BASE_URL must start with http:// or https://, got {resolved!r}")
    return resolved.rstrip("/")


def _resolve_api_key(api_key: str | None) -> str:
    resolved = (api_key or os.environ.get("TINKER_API_KEY") or "").strip()
    if not resolved:
        raise UserError("no Tinker API key: set TINKER_API_KEY or pass api_key")
    # The SDK's own rule (ApiKeyAuthProvider): a `tml-` key or a Tinker-issued JWT.
    if not resolved.startswith(("tml-", "eyJ")):
        raise UserError("TINKER_API_KEY is malformed: a Tinker API key starts with 'tml-'")
    # The key travels in an HTTP header, which carries only visible ASCII: a key with a newline,
    # a space or a non-ASCII character was mis-pasted, and would fail (and show) in the request.
    bad = sorted({c for c in resolved if not (0x21 <= ord(c) <= 0x7E)})
    if bad:
        kinds = sorted({"whitespace" if c.isspace() else "non-ASCII" if ord(c) > 0x7E else "control" for c in bad})
        raise UserError(
            f"TINKER_API_KEY is malformed: it contains {' and '.join(kinds)} character(s), which an "
            "HTTP header cannot carry (check how the key was pasted)"
        )
    return resolved


