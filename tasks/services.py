"""One backend session per process, shared by the stages (the local engine holds models in memory)."""

from __future__ import annotations

import os
import threading
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
