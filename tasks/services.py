"""One backend session per process, shared by the stages (the local engine holds models in memory)."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from rl.backends import make_service_client

_SERVICES: dict[str, Any] = {}
_SERVICES_LOCK = threading.Lock()


def service_client(backend: str):
    """The process's service client for `backend` (created once, shared by the stages)."""
    with _SERVICES_LOCK:
        if backend not in _SERVICES:
            # The local engine keeps checkpoints and sampler weights on disk; a fixed home lets a
            # run resumed in a new process (after a crash) find the states its Parquet names.
            kw = {"cache_dir": os.environ.get("GS1_LOCAL_CACHE") or str(Path.home() / ".cache" / "gs1" / "local")}
            _SERVICES[backend] = make_service_client(backend, **(kw if backend == "local" else {}))
        return _SERVICES[backend]


def engine_numerics(backend: str) -> dict:
    """How the backend makes its numbers (`Numerics.record`): the local engine's mode, device and
    dtype; for a hosted service only its name (whether it reproduces is not gs1's to see)."""
    from engine.determinism import Numerics

    if backend != "local":
        return Numerics(backend=backend, deterministic=None).record()
    return service_client(backend).numerics().record()


def engine_usage(backend: str) -> tuple[float, dict] | None:
    """The local engine's usage now (`LocalServiceClient.usage`) and the time, to bound a stage
    with `log_engine_usage`; None on a hosted service."""
    if backend != "local":  # never a hosted service's client for this (a resume may need none)
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
