"""FakeTinkerServer: a loopback stand-in for the hosted Tinker service, for tests only.

It speaks enough of the Tinker HTTP API (as the tinker 0.38 SDK uses it) that the REAL
`tinker.ServiceClient(base_url=..., api_key=...)` runs against it unmodified:

- start-up: `GET /api/v1/healthz`, `POST /api/v1/client/config` (API-key auth, no JWT
  exchange), `/client/dynamic_config`, `/create_session`, `/session_heartbeat`, `/telemetry`,
  `/sessions/{id}/finish` (`ServiceClient.close`)
- training: `/create_model`, `/get_info`, `/forward_backward` (protobuf body; `forward` too),
  `/optim_step`, `/save_weights`, `/load_weights`, `/save_weights_for_sampler`, `/unload_model`
- sampling: `/create_sampling_session`, `GET /samplers/{id}`, `/asample`
- results: every call above that the SDK treats as a future returns an `UntypedAPIFuture`;
  the SDK then long-polls `/retrieve_future`, which the fake answers once the request is
  "done": a sample after `sample_latency_s` from its submission, everything else at once.
  `SampleResponse` and `ForwardBackwardOutput` go back as protobuf, as the real service does.

Answers are canned and deterministic. Sample `j` of a request whose prompt ends in token `t`
gets tokens `[t, j, 11, 12, ...]` (`tokens_per_sample` long, capped by `max_tokens`) with
logprobs `-0.1 * (k + 1)`; `stop_reason` is "length" when capped, else "stop". A
forward_backward echoes the datum's `logprobs` input (importance ratio 1), so its
`loss:sum` is `-sum(advantages)`.

Options that reproduce other servers' documented-compatible or limited answers:
`max_adapters` (creating a model past that many live ones fails, as skyrl's "Maximum number of
LoRA adapters (N) reached"), `loss_sum_metric=False` (no `loss:sum` metric, per-token
`elementwise_loss` outputs instead), `prompt_logprobs_leading_none=False` (N-1 prompt logprobs),
`seeded_first_token=True` (a sample's first token is a hash of its seed, sample index and prompt
length, so rewards that read it vary as a random policy's would).

Test hooks: `misbehave(mode)` answers every call but healthz as a broken service (hang, reset, 429,
bad_shape, 401); `fail_next(path, *statuses)` answers the next calls to `path` with those HTTP
statuses before serving normally; `fail_next_samples(n)` makes the next `n` sample requests
complete as failed requests (the SDK raises `RequestFailedError`). Counters:
`max_samples_in_flight` (submitted but not yet delivered, across all clients),
`calls[path]`, `last_headers[path]`, `injected`, `auth_failures`, `sample_requests`,
`fwd_bwd_requests`, `optim_steps`, `max_live_models` (the most training models alive at once).
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import itertools
import json
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from tinker.proto import tinker_public_pb2 as public_pb

PROTO = "application/x-protobuf"
API = "/api/v1"


@dataclass
class _Pending:
    """A submitted request whose result the SDK will fetch through /retrieve_future."""

    ready_at: float
    payload: bytes | dict[str, Any]
    is_sample: bool = False
    delivered: bool = False


@dataclass
class _Model:
    model_id: str
    base_model: str
    rank: int
    optim_steps: int = 0
    adam: list[dict[str, Any]] = field(default_factory=list)


class FakeTinkerServer:
    """Loopback fake of the Tinker service; run it with `with FakeTinkerServer() as server:`."""

    def __init__(
        self,
        *,
        api_key: str = "tml-fake-test-key",
        sample_latency_s: float = 0.2,
        tokens_per_sample: int = 6,
        client_config: dict[str, Any] | None = None,
        max_adapters: int | None = None,
        loss_sum_metric: bool = True,
        prompt_logprobs_leading_none: bool = True,
        seeded_first_token: bool = False,
    ) -> None:
        self.api_key = api_key
        self.max_adapters = max_adapters
        self.loss_sum_metric = loss_sum_metric
        self.prompt_logprobs_leading_none = prompt_logprobs_leading_none
        self.seeded_first_token = seeded_first_token
        self.max_live_models = 0
        self.adapter_limit_hits = 0
        self.sample_latency_s = sample_latency_s
        self.tokens_per_sample = tokens_per_sample
        # What POST /client/config answers; API-key auth (no JWT exchange) by default.
        self.client_config: dict[str, Any] = {"pjwt_auth_enabled": False, **(client_config or {})}
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._pending: dict[str, _Pending] = {}
        self._models: dict[str, _Model] = {}
        self._saved_base: dict[str, str] = {}  # model id -> base model, for models that saved a state
        self._samplers: dict[str, dict[str, Any]] = {}
        self._fail_statuses: dict[str, collections.deque[int]] = collections.defaultdict(
            collections.deque
        )
        self._retry_after: dict[str, int] = {}
        self._failing_samples = 0
        self.misbehaviour: str | None = None  # misbehave(): how every call (but /healthz) is answered
        self.misbehaviour_retry_after: int | None = None
        self.calls: collections.Counter[str] = collections.Counter()
        self.last_headers: dict[str, dict[str, str]] = {}  # path -> headers of its last call
        self.injected = 0
        self.auth_failures = 0
        self.sample_requests = 0
        self.fwd_bwd_requests = 0
        self.optim_steps = 0
        self.samples_in_flight = 0
        self.max_samples_in_flight = 0
        # hold_samples(): no sample is answered before this many were submitted (or the deadline).
        self._hold_remaining = 0
        self._hold_deadline = 0.0
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.base_url = ""

    # ---- test hooks -------------------------------------------------------------------

    def fail_next(self, path: str, *statuses: int, retry_after: int | None = None) -> None:
        """Answer the next len(statuses) calls to `path` (e.g. "/api/v1/asample") with them (with a
        `Retry-After: retry_after` header when given)."""
        with self._lock:
            self._fail_statuses[path].extend(statuses)
            if retry_after is not None:
                self._retry_after[path] = retry_after

    def misbehave(self, mode: str | None, *, retry_after: int | None = None) -> None:
        """From now on answer every call but `/healthz` as a broken service would (None: normally again):
        "hang" (never answer), "reset" (reset the connection), "429" (rate limited, `Retry-After`
        when given), "bad_shape" (HTTP 200 with well-formed JSON of the wrong shape), "401" (the key refused)."""
        assert mode in (None, "hang", "reset", "429", "bad_shape", "401"), mode
        with self._lock:
            self.misbehaviour, self.misbehaviour_retry_after = mode, retry_after

    def fail_next_samples(self, n: int) -> None:
        """The next n sample requests are accepted, then complete as failed requests."""
        with self._lock:
            self._failing_samples += n

    def hold_samples(self, count: int, timeout_s: float) -> None:
        """Answer no sample request until `count` have been submitted since this call, or until
        `timeout_s` has passed: a client that awaits each before submitting the next then shows
        one in flight (and a slow test), never a timing-dependent count."""
        with self._lock:
            self._hold_remaining = count
            self._hold_deadline = time.monotonic() + timeout_s

    def _held(self) -> bool:
        with self._lock:
            return self._hold_remaining > 0 and time.monotonic() < self._hold_deadline

    def reset_counters(self) -> None:
        with self._lock:
            self.calls.clear()
            self.injected = self.auth_failures = 0
            self.sample_requests = self.fwd_bwd_requests = self.optim_steps = 0
            self.max_samples_in_flight = self.samples_in_flight
            self._hold_remaining = 0

    # ---- lifecycle --------------------------------------------------------------------

    def start(self) -> str:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        config = uvicorn.Config(
            self._app(),
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=1,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="fake-tinker", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("FakeTinkerServer did not start")
            time.sleep(0.01)
        self.base_url = f"http://127.0.0.1:{port}"
        return self.base_url

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeTinkerServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- plumbing ---------------------------------------------------------------------

    def _new_id(self, prefix: str) -> str:
        return f"fake-{prefix}-{next(self._ids)}"

    def _future(self, payload: bytes | dict[str, Any], *, delay: float = 0.0, **extra: Any):
        request_id = self._new_id("req")
        with self._lock:
            self._pending[request_id] = _Pending(time.monotonic() + delay, payload, **extra)
        return request_id

    def _app(self) -> Starlette:
        routes = [
            Route(f"{API}/healthz", self._healthz, methods=["GET"]),
            Route(f"{API}/samplers/{{sampler_id}}", self._wrap(self._get_sampler), methods=["GET"]),
            Route(f"{API}/sessions/{{session_id}}/finish", self._wrap(self._finish_session), methods=["POST"]),
        ]
        for name, handler in {
            "client/config": self._client_config,
            "client/dynamic_config": self._dynamic_config,
            "create_session": self._create_session,
            "session_heartbeat": self._heartbeat,
            "telemetry": self._telemetry,
            "create_model": self._create_model,
            "unload_model": self._unload_model,
            "get_info": self._get_info,
            "create_sampling_session": self._create_sampling_session,
            "save_weights_for_sampler": self._save_weights_for_sampler,
            "save_weights": self._save_weights,
            "load_weights": self._load_weights,
            "asample": self._asample,
            "forward_backward": self._forward_backward,
            "optim_step": self._optim_step,
            "retrieve_future": self._retrieve_future,
            "cancel_future": self._cancel_future,
        }.items():
            routes.append(Route(f"{API}/{name}", self._wrap(handler), methods=["POST"]))
        return Starlette(routes=routes)

    def _wrap(self, handler):
        async def endpoint(request: Request) -> Response:
            path = request.url.path
            with self._lock:
                self.calls[path] += 1
                self.last_headers[path] = dict(request.headers)
                mode, retry_after = self.misbehaviour, self.misbehaviour_retry_after
            if mode is not None:
                return await self._misbehave(request, mode, retry_after)
            with self._lock:
                if request.headers.get("x-api-key") != self.api_key:
                    self.auth_failures += 1
                    return JSONResponse({"detail": "Invalid API key"}, status_code=401)
                queue = self._fail_statuses.get(path)
                status = queue.popleft() if queue else None
                if status is not None:
                    self.injected += 1
            if status is not None:
                return self._injected(path, status)
            return await handler(request)

        return endpoint

    def _injected(self, path: str, status: int) -> Response:
        with self._lock:
            retry_after = self._retry_after.get(path)
        headers = {"retry-after": str(retry_after)} if retry_after is not None and status == 429 else None
        return JSONResponse({"detail": f"injected {status}"}, status_code=status, headers=headers)

    async def _misbehave(self, request: Request, mode: str, retry_after: int | None) -> Response:
        if mode == "hang":
            await asyncio.sleep(3600)  # cancelled when the client goes away or the server stops
        if mode == "reset":
            # uvicorn's ASGI `receive` is a method of the request cycle, which holds the transport:
            # close the socket with SO_LINGER 0, so the client reads a TCP reset.
            transport = request.receive.__self__.transport
            sock = transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            transport.abort()
            await asyncio.sleep(3600)
        if mode == "429":
            headers = {"retry-after": str(retry_after)} if retry_after is not None else None
            return JSONResponse({"detail": "rate limited"}, status_code=429, headers=headers)
        if mode == "401":
            return JSONResponse({"detail": "Invalid API key"}, status_code=401)
        return JSONResponse({"type": "unexpected", "items": [1, 2, 3]})  # bad_shape

    async def _json(self, request: Request) -> dict[str, Any]:
        body = await request.body()
        return json.loads(body) if body else {}

    # ---- session endpoints ------------------------------------------------------------

    async def _healthz(self, request: Request) -> Response:
        with self._lock:
            self.calls[request.url.path] += 1
            self.last_headers[request.url.path] = dict(request.headers)
            queue = self._fail_statuses.get(request.url.path)
            status = queue.popleft() if queue else None
        if status is not None:
            return self._injected(request.url.path, status)
        return JSONResponse({"status": "ok"})

    async def _client_config(self, request: Request) -> Response:
        return JSONResponse(self.client_config)

    async def _dynamic_config(self, request: Request) -> Response:
        return JSONResponse({"refresh_interval_sec": 300, "sample_cancel_enabled": False})

    async def _create_session(self, request: Request) -> Response:
        return JSONResponse({"type": "create_session", "session_id": self._new_id("session")})

    async def _finish_session(self, request: Request) -> Response:
        # `ServiceClient.close()`: the session ends and its heartbeats stop.
        return Response(status_code=200)

    async def _heartbeat(self, request: Request) -> Response:
        return JSONResponse({"type": "session_heartbeat"})

    async def _telemetry(self, request: Request) -> Response:
        return JSONResponse({"status": "accepted"})

    async def _cancel_future(self, request: Request) -> Response:
        return Response(status_code=200)

    # ---- training endpoints -----------------------------------------------------------

    @property
    def live_models(self) -> int:
        with self._lock:
            return len(self._models)

    def _add_model(self, model: _Model) -> dict[str, Any] | None:
        """Register `model`, or the failed-request payload when the adapter limit is reached."""
        with self._lock:
            if self.max_adapters is not None and len(self._models) >= self.max_adapters:
                self.adapter_limit_hits += 1
                return {"error": f"Maximum number of LoRA adapters ({self.max_adapters}) reached", "category": "user"}
            self._models[model.model_id] = model
            self.max_live_models = max(self.max_live_models, len(self._models))
        return None

    async def _create_model(self, request: Request) -> Response:
        body = await self._json(request)
        model_id = f"{body['session_id']}:train:{body['model_seq_id']}"
        lora = body.get("lora_config") or {}
        refused = self._add_model(_Model(model_id, body["base_model"], int(lora.get("rank", 0))))
        rid = self._future(refused or {"type": "create_model", "model_id": model_id})
        return JSONResponse({"request_id": rid, "model_id": model_id})

    async def _unload_model(self, request: Request) -> Response:
        body = await self._json(request)
        with self._lock:
            found = self._models.pop(body["model_id"], None)
        if found is None:
            return JSONResponse({"detail": "Model not found"}, status_code=404)
        rid = self._future({"type": "unload_model", "model_id": body["model_id"]})
        return JSONResponse({"request_id": rid, "model_id": body["model_id"]})

    async def _get_info(self, request: Request) -> Response:
        body = await self._json(request)
        model = self._models[body["model_id"]]
        return JSONResponse(
            {
                "type": "get_info",
                "model_id": model.model_id,
                "model_data": {"arch": "qwen3", "model_name": model.base_model},
                "is_lora": True,
                "lora_rank": model.rank,
                "model_name": model.base_model,
            }
        )

    async def _save_weights_for_sampler(self, request: Request) -> Response:
        body = await self._json(request)
        model = self._models[body["model_id"]]
        if body.get("path"):
            path = f"tinker://{model.model_id}/sampler_weights/{body['path']}"
            self._samplers[path] = {"base_model": model.base_model, "model_path": path}
            result: dict[str, Any] = {"type": "save_weights_for_sampler", "path": path}
        else:
            sampler_id = self._new_id("sampler")
            self._samplers[sampler_id] = {"base_model": model.base_model, "model_path": None}
            result = {"type": "save_weights_for_sampler", "sampling_session_id": sampler_id}
        return JSONResponse({"request_id": self._future(result), "model_id": model.model_id})

    async def _save_weights(self, request: Request) -> Response:
        body = await self._json(request)
        path = f"tinker://{body['model_id']}/weights/{body['path']}"
        self._saved_base[body["model_id"]] = self._models[body["model_id"]].base_model
        rid = self._future({"type": "save_weights", "path": path})
        return JSONResponse({"request_id": rid, "model_id": body["model_id"]})

    async def _load_weights(self, request: Request) -> Response:
        body = await self._json(request)
        model_id = body.get("model_id") or f"{body['session_id']}:train:{body['model_seq_id']}"
        refused = None
        if model_id not in self._models:  # a training client created from a checkpoint
            saved_by = body["path"].removeprefix("tinker://").split("/weights/")[0]
            base = self._saved_base.get(saved_by) or body.get("base_model") or "fake/base"
            refused = self._add_model(_Model(model_id, base, 0))
        rid = self._future(refused or {"type": "load_weights", "path": body["path"], "model_id": model_id})
        return JSONResponse({"request_id": rid, "model_id": model_id})

    async def _forward_backward(self, request: Request) -> Response:
        body = await request.body()
        if request.headers.get("content-encoding") == "zstd":
            import zstandard

            body = zstandard.ZstdDecompressor().decompress(body)
        msg = public_pb.ForwardBackwardRequest()
        msg.ParseFromString(body)
        logprobs_D: list[np.ndarray] = []
        elementwise_D: list[np.ndarray] = []
        loss = 0.0
        for datum in msg.data:
            inputs = datum.loss_fn_inputs
            num_targets = len(_tensor(inputs["target_tokens"]))
            sampler_lp = (
                _tensor(inputs["logprobs"]).astype(np.float32)
                if "logprobs" in inputs
                else np.full(num_targets, -1.0, np.float32)
            )
            # The learner's logprobs equal the sampler's, so each ratio is 1 and a token's loss
            # is minus its advantage.
            advantages = _tensor(inputs["advantages"]) if "advantages" in inputs else np.zeros(num_targets)
            elementwise_D.append((-advantages).astype(np.float32))
            loss -= float(advantages.astype(np.float64).sum())
            logprobs_D.append(sampler_lp)
        record = public_pb.ArrayRecord(num_datums=len(logprobs_D))
        record.fields["logprobs"].CopyFrom(_batched(logprobs_D))
        if not self.loss_sum_metric:  # the per-token losses carry the sum instead
            record.fields["elementwise_loss"].CopyFrom(_batched(elementwise_D))
        out = public_pb.ForwardBackwardOutput(
            loss_fn_output_type="ArrayRecord",
            loss_fn_outputs=[record],
            metrics={"loss:sum": loss} if self.loss_sum_metric else {},
        )
        with self._lock:
            self.fwd_bwd_requests += 1
        rid = self._future(out.SerializeToString())
        return JSONResponse({"request_id": rid, "model_id": msg.model_id})

    async def _optim_step(self, request: Request) -> Response:
        body = await self._json(request)
        with self._lock:
            self.optim_steps += 1
            model = self._models.get(body["model_id"])
            if model is not None:
                model.optim_steps += 1
                model.adam.append(body.get("optim_params") or body.get("adam_params") or {})
        rid = self._future({"metrics": {}})
        return JSONResponse({"request_id": rid, "model_id": body["model_id"]})

    # ---- sampling endpoints -----------------------------------------------------------

    async def _create_sampling_session(self, request: Request) -> Response:
        body = await self._json(request)
        sampler_id = self._new_id("sampler")
        base_model = body.get("base_model")
        if base_model is None and body.get("model_path") in self._samplers:
            base_model = self._samplers[body["model_path"]]["base_model"]
        self._samplers[sampler_id] = {
            "base_model": base_model or "fake/base",
            "model_path": body.get("model_path"),
        }
        return JSONResponse(
            {"type": "create_sampling_session", "sampling_session_id": sampler_id}
        )

    async def _get_sampler(self, request: Request) -> Response:
        sampler_id = request.path_params["sampler_id"]
        sampler = self._samplers.get(sampler_id)
        if sampler is None:
            return JSONResponse({"detail": "no such sampler"}, status_code=404)
        return JSONResponse({"sampler_id": sampler_id, **sampler})

    async def _asample(self, request: Request) -> Response:
        body = await self._json(request)
        prompt_tokens = [t for chunk in body["prompt"]["chunks"] for t in chunk["tokens"]]
        num_samples = int(body.get("num_samples", 1))
        max_tokens = body["sampling_params"].get("max_tokens") or self.tokens_per_sample
        with self._lock:
            self.sample_requests += 1
            self._hold_remaining = max(0, self._hold_remaining - 1)
            self.samples_in_flight += 1
            self.max_samples_in_flight = max(self.max_samples_in_flight, self.samples_in_flight)
            fail = self._failing_samples > 0
            if fail:
                self._failing_samples -= 1
        if fail:
            payload: bytes | dict[str, Any] = {
                "error": "injected sample failure",
                "category": "server",
            }
        else:
            payload = self._sample_response(
                prompt_tokens, num_samples, max_tokens, bool(body.get("prompt_logprobs")),
                body["sampling_params"].get("seed"),
            )
        rid = self._future(payload, delay=self.sample_latency_s, is_sample=True)
        return JSONResponse(
            {
                "request_id": rid,
                "sample_sequence_ids": [f"{rid}/{j}" for j in range(num_samples)],
            }
        )

    def _sample_response(
        self, prompt_tokens: list[int], num_samples: int, max_tokens: int, prompt_logprobs: bool,
        seed: int | None = None,
    ) -> bytes:
        n = min(self.tokens_per_sample, max_tokens)
        last = prompt_tokens[-1] if prompt_tokens else 0
        sequences = []
        for j in range(num_samples):
            first = last
            if self.seeded_first_token:
                key = f"{seed}:{j}:{len(prompt_tokens)}".encode()
                first = int.from_bytes(hashlib.sha256(key).digest()[:4], "little") % 151643
            tokens = ([first, j] + list(range(11, 11 + self.tokens_per_sample)))[:n]
            logprobs = [-0.1 * (k + 1) for k in range(n)]
            sequences.append(
                public_pb.SampledSequence(
                    stop_reason=(
                        public_pb.STOP_REASON_LENGTH
                        if n == max_tokens
                        else public_pb.STOP_REASON_STOP
                    ),
                    tokens=np.asarray(tokens, np.int32).tobytes(),
                    logprobs=np.asarray(logprobs, np.float32).tobytes(),
                )
            )
        msg = public_pb.SampleResponse(sequences=sequences)
        if prompt_logprobs:
            values = [np.nan] + [-1.0] * (len(prompt_tokens) - 1)
            if not self.prompt_logprobs_leading_none:
                values = values[1:]
            msg.prompt_logprobs = np.asarray(values, np.float32).tobytes()
        return msg.SerializeToString()

    # ---- results ----------------------------------------------------------------------

    async def _retrieve_future(self, request: Request) -> Response:
        body = await self._json(request)
        pending = self._pending.get(body["request_id"])
        if pending is None:
            return JSONResponse({"detail": "unknown request"}, status_code=404)
        # Long-poll like the real service: hold the call until the request is done.
        await asyncio.sleep(max(0.0, pending.ready_at - time.monotonic()))
        while pending.is_sample and self._held():
            await asyncio.sleep(0.01)
        with self._lock:
            if pending.is_sample and not pending.delivered:
                self.samples_in_flight -= 1
            pending.delivered = True
        if isinstance(pending.payload, bytes):
            return Response(pending.payload, media_type=PROTO)
        return JSONResponse(pending.payload)


def _batched(arrays: list[np.ndarray]) -> public_pb.BatchedTensor:
    """One float32 array per datum as the ArrayRecord field the SDK decodes."""
    offsets = np.cumsum([0] + [a.nbytes for a in arrays]).astype(np.int64)
    return public_pb.BatchedTensor(
        data=b"".join(a.tobytes() for a in arrays), offsets=offsets.tobytes(), dtype=public_pb.DTYPE_FLOAT32
    )


def _tensor(msg: public_pb.Tensor) -> np.ndarray:
    """A dense public-proto tensor as a flat numpy array."""
    dtype = {public_pb.DTYPE_FLOAT32: np.float32, public_pb.DTYPE_INT64: np.int64}[msg.dtype]
    return np.frombuffer(msg.dense, dtype=dtype)
