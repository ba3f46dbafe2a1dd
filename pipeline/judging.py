"""Stages that judge: a failed gate ends its task run Failed with the gate's message, as an
expected stop (one ERROR line, no traceback), while the flow still sees the GateFailed."""

from __future__ import annotations

import functools
import logging

from schemas.errors import GateFailed, UserError


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
        # traceback. The flow's own "Finished in state Failed(...)" line has said it already. The same
        # for bad input a flow ended on (`flows/deployment.py`: a UserError as the Failed state's data).
        exception = record.exc_info[1] if record.exc_info else None
        return not (message == "Engine execution exited with unexpected exception"
                    and isinstance(exception, (GateFailed, UserError)))


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
