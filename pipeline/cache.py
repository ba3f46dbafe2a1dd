"""Stage caching (resume): the cache policy of every cached stage, and the output manifests behind it.

A stage's key is its inputs + its own source + the source of the `rl/` and
`schemas/` library it calls + the path and content hash of every file it reads. A re-run of the
same spec, or a Retry from the UI, is served from cache up to the first stage whose key changed.

A cache hit is served only while the stage's outputs still verify: every file a stage writes
(each atomic artifact write, and what it names with `record_output`) goes with its SHA-256 into
`<key>.outputs.json` beside the stage's stored result. The manifest is the result's proof: it is
started (empty, with its key) when the stage starts to run, so a stored result always has one, and
it names the key it belongs to, while the stored result names its own key (Prefect's record
`storage_key`). A missing, unreadable or stale manifest (an older format, another stage's key), a
stored result of another key, or an output missing or changed: the stored result is dropped with
one warning naming what is wrong, and the stage runs again; later stages key on the content of
what they read, so only those whose inputs came out different run again.
"""

from __future__ import annotations

import errno
import hashlib
import importlib.util
import json
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect.cache_policies import INPUTS, TASK_SOURCE, CachePolicy

from pipeline.running import stage_started
from schemas.errors import UserError
from schemas.io import file_sha256, on_artifact_written

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
            h.update(file_sha256(path).encode())
        elif path.is_dir():
            for f in sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith(".")):
                h.update(str(f.relative_to(path)).encode())
                h.update(file_sha256(f).encode())
        else:
            h.update(b"<missing>")
    return h.hexdigest()


# the packages a stage runs: a change to any reruns the stages that used it (found by name, not
# imported: `engine` imports torch)
LIBRARY = ("schemas", "estimators", "rules", "design", "engine", "rl", "hillclimb", "decision")


def _library_digest() -> str:
    h = hashlib.sha256()
    for package in LIBRARY:
        # its folder, not its __init__'s: an editable install made before a package had one finds a namespace
        root = Path(next(iter(importlib.util.find_spec(package).submodule_search_locations)))
        for f in sorted(root.rglob("*.py")):
            h.update(str(f.relative_to(root.parent)).encode())
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
    """Keys on the source of the library (`LIBRARY`): fixing it reruns what used it."""

    def compute_key(self, task_ctx, inputs, flow_parameters, **kwargs) -> str | None:
        global _LIBRARY_DIGEST
        if _LIBRARY_DIGEST is None:
            _LIBRARY_DIGEST = _library_digest()
        return _LIBRARY_DIGEST


def _without_field(value: Any, name: str) -> Any:
    """A pydantic model (or a tuple/list of them) as a dict without field `name`."""
    if isinstance(value, (tuple, list)):
        return [_without_field(v, name) for v in value]
    if hasattr(value, "model_dump"):
        return {k: v for k, v in value.model_dump(mode="json").items() if k != name}
    return value


@dataclass
class InputsRead(CachePolicy):
    """INPUTS, less the fields of an input that the stage never reads: `unread` holds
    (parameter, field) pairs, e.g. ("arms", "steps") for a stage before training (the number of
    training steps changes what training does, not what the pilot does)."""

    unread: tuple[tuple[str, str], ...] = ()

    def compute_key(self, task_ctx, inputs, flow_parameters, **kwargs) -> str | None:
        inputs = dict(inputs or {})
        for param, name in self.unread:
            if param in inputs:
                inputs[param] = _without_field(inputs[param], name)
        return INPUTS.compute_key(task_ctx, inputs, flow_parameters, **kwargs)


def stage_cache(*files_read: str, unread: tuple[tuple[str, str], ...] = ()) -> CachePolicy:
    """The inputs the stage reads (all its parameters, less the `unread` fields) + TASK_SOURCE +
    library source + the files the stage reads; a hit only while the files the stage wrote still
    verify."""
    return OutputsVerified(
        inner=InputsRead(unread=tuple(unread)) + TASK_SOURCE + LibrarySource() + FilesRead(params=tuple(files_read))
    )


# ---------------------------------------------------------------------------------------------
# Outputs: what a stage wrote, with content hashes, checked before its cached result is served

OUTPUTS_SUFFIX = ".outputs.json"
_OUTPUTS_LOCK = threading.Lock()
log = logging.getLogger("gs1.cache")


def _record_dir(store) -> Path | None:
    """The folder holding stored stage results (a local one; other storage is not verified)."""
    basepath = getattr(getattr(store, "result_storage", None), "basepath", None)
    return Path(basepath).expanduser() if basepath else None


def _files_under(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file())
    return []


def record_output(path: str | Path) -> None:
    """Record `path` (a file, or every file under a directory) as an output of the stage now
    running, with its content hash. Outside a cached stage, or for a path that is not a local
    file (e.g. a `tinker://` one), nothing is recorded."""
    from prefect.transactions import get_transaction

    txn = get_transaction()
    folder = _record_dir(txn.store) if txn is not None and txn.key else None
    if folder is None:
        return
    files = _files_under(Path(path))
    if not files:
        return
    manifest = folder / f"{txn.key}{OUTPUTS_SUFFIX}"
    with _OUTPUTS_LOCK:
        outputs = read_manifest(manifest, txn.key)[0] or {}
        for f in files:
            outputs[str(f.resolve())] = file_sha256(f)
        _write_outputs(manifest, txn.key, outputs)


def _write_outputs(manifest: Path, key: str, outputs: dict[str, str]) -> None:
    tmp = manifest.with_name(f".{manifest.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        manifest.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"key": key, "outputs": outputs}, indent=1, sort_keys=True))
        os.replace(tmp, manifest)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise UserError(f"no space left to write {manifest}: free some and run again (it resumes)") from None
        raise


def read_manifest(manifest: Path, key: str) -> tuple[dict[str, str] | None, str | None]:
    """(the outputs `manifest` records for `key`, None) from one read; (None, what makes it no
    proof of the stored result of `key`) when it is missing, unreadable, of another format or of
    another key."""
    try:
        data = json.loads(manifest.read_text())
    except FileNotFoundError:
        return None, "is missing"
    except (OSError, ValueError) as e:
        return None, f"cannot be read ({type(e).__name__})"
    if not isinstance(data, dict) or not isinstance(data.get("outputs"), dict) or "key" not in data:
        return None, "is stale (not this version's format)"
    if data["key"] != key:
        return None, f"belongs to another stage result ({data['key']})"
    return data["outputs"], None


def manifest_problem(manifest: Path, key: str) -> str | None:
    """What makes `manifest` no proof of the stored result of `key`, or None."""
    return read_manifest(manifest, key)[1]


def record_problem(record: Path, key: str) -> str | None:
    """What makes the stored result at `record` not the result of `key` (Prefect's record names
    its own storage key), or None."""
    try:
        stored = json.loads(record.read_text()).get("metadata", {}).get("storage_key")
    except (OSError, ValueError, AttributeError) as e:
        return f"cannot be read ({type(e).__name__})"
    if not isinstance(stored, str) or Path(stored).name != key:
        return f"is the stored result of another stage ({Path(str(stored)).name})"
    return None


def damaged_output(outputs: dict[str, str]) -> tuple[str, str] | None:
    """The first recorded output that no longer verifies, with what is wrong with it."""
    for name, digest in sorted(outputs.items()):
        path = Path(name)
        if not path.is_file():
            return name, "is missing"
        try:
            if file_sha256(path) != digest:
                return name, "changed since the stage wrote it"
        except OSError as e:
            return name, f"cannot be read ({e.strerror or type(e).__name__})"
    return None


@dataclass
class OutputsVerified(CachePolicy):
    """`inner`'s key, served from the cache only while the stage's recorded outputs verify."""

    inner: CachePolicy | None = None

    def compute_key(self, task_ctx, inputs, flow_parameters, **kwargs) -> str | None:
        key = self.inner.compute_key(task_ctx, inputs, flow_parameters, **kwargs)
        folder = _record_dir(getattr(task_ctx, "result_store", None)) if key else None
        stage_started(task_ctx.task_run, folder / key if folder is not None else None)
        if folder is None:
            return key
        record, manifest = folder / key, folder / f"{key}{OUTPUTS_SUFFIX}"
        if not record.exists():
            # the stage runs now: its manifest starts empty (a stage that never finished leaves a
            # stale list), so the result it stores always has its proof beside it
            with _OUTPUTS_LOCK:
                _write_outputs(manifest, key, {})
            return key
        problem = record_problem(record, key)
        damaged = (str(record), problem) if problem else None
        if damaged is None:
            outputs, problem = read_manifest(manifest, key)
            damaged = (f"{manifest} (the output manifest)", problem) if problem else damaged_output(outputs)
        if damaged is not None:
            _warn(task_ctx, f"{damaged[0]} {damaged[1]}: running the stage '{task_ctx.task.name}' again")
            record.unlink(missing_ok=True)
            with _OUTPUTS_LOCK:
                _write_outputs(manifest, key, {})  # the stage runs again: a fresh proof
        return key


def _warn(task_ctx, message: str) -> None:
    try:
        from prefect import get_run_logger

        get_run_logger().warning(message)
    except Exception:  # no run context (a plain call): the module logger
        log.warning(message)


on_artifact_written(record_output)
