"""What every stage shares: the gate exception, the cache policy, and the per-process backend.

Caching (resume): a stage's key is its inputs + its own source + the source of the `rl/` and
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
import functools
import hashlib
import json
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect.cache_policies import INPUTS, TASK_SOURCE, CachePolicy

import rl
import schemas
from rl.backends import make_service_client
from schemas.errors import UserError
from schemas.gate_text import GateRow, gate_failed_message
from schemas.io import on_artifact_written

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


class _GateStopNotATraceback(logging.Filter):
    """Prefect logs a task run that returned a Failed state twice: "Task run failed with state:
    ..." (with exc_info, though nothing was raised) and "Finished in state Failed(...)". For a
    gate's stop the second is the one ERROR line; the first is dropped. Only records that carry
    a GateFailed: a crash keeps every line and its traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        if message.startswith("Task run failed with state: ") and "GateFailed(" in record.getMessage():
            return False
        # A flow run a runner (`gs1 serve`) starts in its own process ends in `run_flow(...)` asking
        # for the result, which raises the Failed state's GateFailed; the engine logs that with its
        # traceback. The flow's own "Finished in state Failed(...)" line has said it already.
        exception = record.exc_info[1] if record.exc_info else None
        return not (message == "Engine execution exited with unexpected exception" and isinstance(exception, GateFailed))


_GATE_STOP_FILTER = _GateStopNotATraceback()


def judging_task(**options):
    """`@task(**options)` for a stage that judges. A failed gate ends its task run Failed with the
    gate's message, returned as a `Failed` state rather than raised, so Prefect logs one ERROR
    line ("Finished in state Failed('pilot_mean_reward = ...')") and no traceback: the gate's
    table artifact says the rest. Where the flow calls the stage, the GateFailed is raised as
    before (calibration and the flow's end depend on it). Any other exception is a crash: raised
    in the task, it keeps its traceback."""
    from prefect import Task
    from prefect.states import Failed, State

    for name in ("prefect.task_runs", "prefect.flow_runs"):  # a logger's filter sees its records before any handler
        if _GATE_STOP_FILTER not in logging.getLogger(name).filters:
            logging.getLogger(name).addFilter(_GATE_STOP_FILTER)

    class JudgingTask(Task):
        def __call__(self, *args, return_state: bool = False, **kwargs):
            result = super().__call__(*args, return_state=return_state, **kwargs)
            if not return_state and isinstance(result, State) and result.is_failed():
                raise result.result(raise_on_failure=False)  # the gate's GateFailed, into the flow
            return result

    def decorate(fn):
        @functools.wraps(fn)
        def judged(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except GateFailed as failed:
                return Failed(message=str(failed), data=failed)

        return JudgingTask(fn=judged, **options)

    return decorate


# ---------------------------------------------------------------------------------------------
# Artifacts the deployment's run shows too


def _deployment_run_id():
    """The flow run a deployment (or a command) started, when the current run is a subflow of it."""
    from prefect.runtime import flow_run

    current, root = flow_run.get_id(), flow_run.get_root_flow_run_id()
    return root if root and current and str(root) != str(current) else None


def _publish(artifact, on_deployment_run: bool) -> None:
    artifact.create()
    root = _deployment_run_id() if on_deployment_run else None
    if root is not None:
        # the page `prefect deployment run` links to is the outer run's: the same artifact there
        type(artifact)(**{**artifact.model_dump(exclude={"flow_run_id", "task_run_id"}), "flow_run_id": root}).create()


def publish_markdown(key: str, markdown: str, description: str, on_deployment_run: bool = True) -> None:
    """A markdown artifact on this run and, when it is a subflow, on the run that started it."""
    from prefect.artifacts import MarkdownArtifact

    _publish(MarkdownArtifact(key=key, markdown=markdown, description=description), on_deployment_run)


def publish_table(key: str, table: list[dict], description: str, on_deployment_run: bool = False) -> None:
    """A table artifact on this run (and on the run that started it, if asked)."""
    from prefect.artifacts import TableArtifact

    _publish(TableArtifact(key=key, table=table, description=description), on_deployment_run)


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
        outputs = _read_outputs(manifest, txn.key) or {}
        for f in files:
            outputs[str(f.resolve())] = _file_digest(f)
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


def _read_outputs(manifest: Path, key: str) -> dict[str, str] | None:
    """The outputs `manifest` records for `key`; None when it is missing, unreadable, of another
    format or of another key (`manifest_problem` says which)."""
    return None if manifest_problem(manifest, key) else json.loads(manifest.read_text())["outputs"]


def manifest_problem(manifest: Path, key: str) -> str | None:
    """What makes `manifest` no proof of the stored result of `key`, or None."""
    try:
        data = json.loads(manifest.read_text())
    except FileNotFoundError:
        return "is missing"
    except (OSError, ValueError) as e:
        return f"cannot be read ({type(e).__name__})"
    if not isinstance(data, dict) or not isinstance(data.get("outputs"), dict) or "key" not in data:
        return "is stale (not this version's format)"
    if data["key"] != key:
        return f"belongs to another stage result ({data['key']})"
    return None


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
            if _file_digest(path) != digest:
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
        _started(task_ctx, inputs, folder / key if folder is not None else None)
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
            problem = manifest_problem(manifest, key)
            damaged = (f"{manifest} (the output manifest)", problem) if problem else None
        if damaged is None:
            damaged = damaged_output(json.loads(manifest.read_text())["outputs"])
        if damaged is not None:
            _warn(task_ctx, f"{damaged[0]} {damaged[1]}: running the stage '{task_ctx.task.name}' again")
            record.unlink(missing_ok=True)
            with _OUTPUTS_LOCK:
                _write_outputs(manifest, key, {})  # the stage runs again: a fresh proof
        return key


# Stages of this process that have started, with where their result will be stored: one whose
# result is not there yet is still running (what `gs1 run` names when it is stopped).
_STARTED: dict[str, tuple[str, Path | None]] = {}


def _started(task_ctx, inputs: dict, record: Path | None) -> None:
    # the task run's name is the stage's one name, with its arm (`train grpo_gs8`)
    with _OUTPUTS_LOCK:
        _STARTED[str(task_ctx.task_run.id)] = (task_ctx.task_run.name, record)


def _stage_ended(task, task_run, state) -> None:
    with _OUTPUTS_LOCK:
        _STARTED.pop(str(task_run.id), None)


def _stage_running(task, task_run, state) -> None:
    with _OUTPUTS_LOCK:
        _STARTED[str(task_run.id)] = (task_run.name, None)


class _StageHookLines(logging.Filter):
    """Prefect logs two INFO lines for every hook it runs ("Running hook ...", "Hook ... finished
    running successfully"); the stage bookkeeping hooks are no news to the run's reader."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith(("Running hook '_stage_", "Hook '_stage_")))


_STAGE_HOOK_LINES = _StageHookLines()


def _bookkeeping(hooks: dict) -> dict:
    logger = logging.getLogger("prefect.task_runs")  # a logger's filter sees its records before any handler
    if _STAGE_HOOK_LINES not in logger.filters:
        logger.addFilter(_STAGE_HOOK_LINES)
    return hooks


def stage_end_hooks() -> dict:
    """Task hooks for a cached stage (its cache policy sees it start): it stops counting among the
    running stages when it ends, Completed or Failed (a failed gate stores no result, and is not
    running for that)."""
    return _bookkeeping({"on_completion": [_stage_ended], "on_failure": [_stage_ended]})


def uncached_stage_hooks() -> dict:
    """Task hooks for a stage that is never cached (so no cache policy sees it start): it counts
    among the running stages from its Running state until it ends."""
    return _bookkeeping({"on_running": [_stage_running], **stage_end_hooks()})


def running_stages() -> list[str]:
    """The stages started in this process whose result is not stored yet."""
    with _OUTPUTS_LOCK:
        started = list(_STARTED.values())
    return [label for label, record in started if record is None or not record.exists()]


def _warn(task_ctx, message: str) -> None:
    try:
        from prefect import get_run_logger

        get_run_logger().warning(message)
    except Exception:  # no run context (a plain call): the module logger
        log.warning(message)


on_artifact_written(record_output)


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
