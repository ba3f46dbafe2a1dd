"""What every stage shares: the gate exception, the cache policy, and the per-process backend.

Caching (resume): a stage's key is its inputs + its own source + the source of the `rl/` and
`schemas/` library it calls + the path and content hash of every file it reads. A re-run of the
same spec, or a Retry from the UI, is served from cache up to the first stage whose key changed.
"""

from __future__ import annotations

import hashlib
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect.cache_policies import INPUTS, TASK_SOURCE, CachePolicy

import rl
import schemas
from rl.backends import make_service_client
from schemas.gate_text import GateRow, gate_failed_message

# ---------------------------------------------------------------------------------------------
# Gates


class GateFailed(Exception):
    """A gate check failed. Carries every metric of the gate so the flow's state shows them.

    Picklable (`__reduce__`) so Prefect can persist the failed state and re-raise it.
    """

    def __init__(self, gate: str, results: list[dict]):
        self.gate = gate
        self.results = [dict(r) for r in results]
        super().__init__(gate_failed_message(gate, [GateRow.from_row({"gate": gate, **r}) for r in self.results]))

    def __reduce__(self):
        return (GateFailed, (self.gate, self.results))

    @property
    def failing(self) -> list[dict]:
        return [r for r in self.results if not r["passed"]]


# ---------------------------------------------------------------------------------------------
# Caching


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def digest_paths(value: Any) -> str:
    """Content hash of a file, of every file under a directory, or of a list of those."""
    h = hashlib.sha256()
    values = value if isinstance(value, (list, tuple)) else [value]
    for v in values:
        if v is None:
            continue
        path = Path(v)
        h.update(str(path.resolve()).encode())
        if path.is_file():
            h.update(_file_digest(path).encode())
        elif path.is_dir():
            for f in sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith(".")):
                h.update(str(f.relative_to(path)).encode())
                h.update(_file_digest(f).encode())
        else:
            h.update(b"<missing>")
    return h.hexdigest()


def _library_digest() -> str:
    h = hashlib.sha256()
    for package in (rl, schemas):
        root = Path(package.__file__).parent
        for f in sorted(root.rglob("*.py")):
            h.update(str(f.relative_to(root)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


_LIBRARY_DIGEST: str | None = None


@dataclass
class FilesRead(CachePolicy):
    """Keys on the path and content hash of the files named by some task parameters."""

    params: tuple[str, ...] = ()

    def compute_key(self, task_ctx, inputs, flow_parameters, **kwargs) -> str | None:
        h = hashlib.sha256()
        for name in self.params:
            h.update(name.encode())
            h.update(digest_paths((inputs or {}).get(name)).encode())
        return h.hexdigest()


@dataclass
class LibrarySource(CachePolicy):
    """Keys on the source of `rl/` and `schemas/`: fixing the library reruns what used it."""

    def compute_key(self, task_ctx, inputs, flow_parameters, **kwargs) -> str | None:
        global _LIBRARY_DIGEST
        if _LIBRARY_DIGEST is None:
            _LIBRARY_DIGEST = _library_digest()
        return _LIBRARY_DIGEST


def stage_cache(*files_read: str) -> CachePolicy:
    """INPUTS + TASK_SOURCE + library source + the files the stage reads."""
    return INPUTS + TASK_SOURCE + LibrarySource() + FilesRead(params=tuple(files_read))


# ---------------------------------------------------------------------------------------------
# One backend session per process (the local engine holds models in memory)

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
