"""Reading backend answers: exact where the API leaves room, one clear line where it does not.

Every place that reads a client's answer goes through here, so that an independently written
Tinker-API server (or a future SDK) that answers in another documented-compatible shape is read
exactly, and one that answers otherwise ends the run with a `BackendError` naming the backend,
the call and what was expected -- never a bare KeyError and never a silently shifted feature.

- `resolved(future, ...)`: a call's answer (`.result()`), e.g. the client a `create_*` call returns
  a future of, resolved where the SDK expects it; a failed call (the service's limit on LoRA
  adapters, a sample the service refuses) is a `BackendError`.
- `loss_sum(output, ...)`: the summed loss of a `forward_backward` / `forward`: the documented
  `loss:sum` metric, else the exact sum of the per-token `elementwise_loss` outputs.
- `prompt_mean_logprob_of(prompt_logprobs, prompt_length, ...)`: the kernel feature from a
  sample's (or `compute_logprobs`') prompt logprobs, with or without the leading None.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from tinker import types

from estimators.kernels import prompt_mean_logprob
from schemas.errors import BackendError, UserError
from schemas.redaction import one_line

LOSS_SUM = "loss:sum"
ELEMENTWISE_LOSS = "elementwise_loss"


def backend_of(client: Any) -> str:
    """The backend a client belongs to, by where its class lives: "tinker" (the SDK), "local"."""
    module = type(client).__module__
    if module.split(".")[0] == "tinker":
        return "tinker"
    if module.startswith("engine"):
        return "local"
    return module.rsplit(".", 1)[-1]


def resolved(future: Any, *, backend: str, call: str, expected: str) -> Any:
    """`future.result()`; a service's failure of the call is one BackendError line (a UserError stays
    one; the local engine's own errors stay as they are). On the tinker backend within the per-call
    timeout (`tinker_backend.await_result`: `GS1_TINKER_TIMEOUT`, by default the SDK's own budget), the
    line naming the cause: no answer, a reset connection, HTTP 429, a refused key, a wrong shape."""
    if backend == "tinker":
        from rl.backends.tinker_backend import await_result  # lazy: the local path never imports the SDK's parts

        return await_result(future, call=call, expected=expected)
    try:
        return future.result()
    except UserError:  # already one line about the user's input (a missing model, a bad path)
        raise
    except Exception as e:  # noqa: BLE001 - whatever the service answered, the run ends on one line
        if backend == "local":
            raise  # this process's own error (out of memory, say): the arm's failure line names it as it is
        raise BackendError(backend, call, expected, one_line(f"{type(e).__name__}: {e}")) from None


def loss_sum(output: types.ForwardBackwardOutput, *, backend: str, call: str = "forward_backward") -> float:
    """The summed loss of one forward(_backward) call.

    Tinker documents the `loss:sum` metric; a server that leaves it out but returns the per-token
    `elementwise_loss` of every datum gives the same number exactly, as their sum (float64).
    """
    metrics = output.metrics or {}
    if LOSS_SUM in metrics:
        return float(metrics[LOSS_SUM])
    outputs = list(output.loss_fn_outputs or [])
    if outputs and all(ELEMENTWISE_LOSS in o for o in outputs):
        return float(sum(np.asarray(o[ELEMENTWISE_LOSS].data, dtype=np.float64).sum() for o in outputs))
    keys = sorted({k for o in outputs for k in o})
    raise BackendError(
        backend, call,
        f"the '{LOSS_SUM}' metric, or per-token '{ELEMENTWISE_LOSS}' outputs for every datum",
        f"metrics {sorted(metrics)} and {len(outputs)} datum output(s) with {keys}",
    )


def prompt_mean_logprob_of(prompt_logprobs: Sequence[float | None] | None, prompt_length: int, *,
                           backend: str, call: str) -> float:
    """The kernel feature from a prompt's logprobs as a backend returned them (N entries, the first
    None, as the SDK documents; or the N-1 of tokens 2..N); any other answer is a BackendError."""
    expected = f"{prompt_length} prompt logprobs (the first None) or {prompt_length - 1} (tokens 2..{prompt_length})"
    if prompt_logprobs is None:
        raise BackendError(backend, call, expected, "no prompt logprobs")
    try:
        return prompt_mean_logprob(prompt_logprobs, prompt_length)
    except ValueError as e:
        raise BackendError(backend, call, expected, str(e)) from None


__all__ = ["ELEMENTWISE_LOSS", "LOSS_SUM", "backend_of", "resolved", "loss_sum", "prompt_mean_logprob_of"]
