"""One backend session per process, shared by the stages (the local engine holds models in memory)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from rl.backends import backend_named

_SERVICES: dict[str, Any] = {}
_SERVICES_LOCK = threading.Lock()


def service_client(backend: str):
    """The process's service client for `backend` (created once, shared by the stages)."""
    with _SERVICES_LOCK:
        if backend not in _SERVICES:
            _SERVICES[backend] = backend_named(backend).session_client()
        return _SERVICES[backend]


def engine_numerics(backend: str) -> dict:
    """How the backend makes its numbers (`Numerics.record`): the local engine's mode, device and
    dtype; for a hosted service only its name (whether it reproduces is not gs1's to see)."""
    return backend_named(backend).numerics(lambda: service_client(backend))


def engine_usage(backend: str) -> tuple[float, dict] | None:
    """The engine's usage now (`LocalServiceClient.usage`) and the time, to bound a stage with
    `log_engine_usage`; None for a backend that meters none (a hosted service)."""
    if not backend_named(backend).meters_usage:  # never a hosted service's client for this (a resume may need none)
        return None
    return time.perf_counter(), service_client(backend).usage()


def log_engine_usage(backend: str, before: tuple[float, dict] | None, stage: str) -> None:
    """One `gs1.engine` line per base the stage used since `before`: the device's busy share and
    its jobs (`engine.usage_lines`)."""
    if before is None:
        return
    from engine import usage_lines

    t0, usage = before
    for line in usage_lines(usage, service_client(backend).usage(), time.perf_counter() - t0):
        logging.getLogger("gs1.engine").info(f"{stage}: {line}")
