"""Which stages of this process are running: what `gs1 run` names when it is stopped."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

# Stages of this process that have started, with where their result will be stored: one whose
# result is not there yet is still running (what `gs1 run` names when it is stopped).
_STARTED: dict[str, tuple[str, Path | None]] = {}
_STARTED_LOCK = threading.Lock()


def stage_started(task_run, record: Path | None) -> None:
    """A cached stage's task run starts (its cache policy sees it), its result to be at `record`."""
    # the task run's name is the stage's one name, with its arm (`train grpo_gs8`)
    with _STARTED_LOCK:
        _STARTED[str(task_run.id)] = (task_run.name, record)


def _stage_ended(task, task_run, state) -> None:
    with _STARTED_LOCK:
        _STARTED.pop(str(task_run.id), None)


def _stage_running(task, task_run, state) -> None:
    with _STARTED_LOCK:
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
    with _STARTED_LOCK:
        started = list(_STARTED.values())
    return [label for label, record in started if record is None or not record.exists()]
