"""Concurrency helpers over any sampling client with tinker's `SamplingClient.sample` surface.

`sample(prompt, num_samples, sampling_params, ...)` must return a future (anything with
`.result()`); both the tinker SDK and the local engine qualify.

- `submit_all`: training. Every request of a step goes in flight before any is awaited
  (as in the cookbook's `rl_loop.py`), so a step costs about one sampling latency.
- `sample_bounded`: evaluation. At most `max_in_flight` requests at a time, results in input
  order, and a failed request retried a bounded number of times before the whole call fails
  naming the item.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from tinker import types

from schemas.errors import SampleRequestError

logger = logging.getLogger(__name__)

SamplingParamsArg = types.SamplingParams | Sequence[types.SamplingParams]


def params_per_prompt(
    sampling_params: SamplingParamsArg, num_prompts: int
) -> list[types.SamplingParams]:
    """One `SamplingParams` per prompt: the same one for all, or a list of exactly one each."""
    if isinstance(sampling_params, types.SamplingParams):
        return [sampling_params] * num_prompts
    params_P = list(sampling_params)
    if len(params_P) != num_prompts:
        raise ValueError(f"{len(params_P)} sampling params for {num_prompts} prompts")
    return params_P


def submit_all(
    sampling_client: Any,
    prompts: Sequence[types.ModelInput],
    num_samples: int,
    sampling_params: SamplingParamsArg,
) -> list[Any]:
    """Submit one sample request per prompt and return their futures, none awaited yet.

    `sampling_params` is one `SamplingParams` for every prompt, or one per prompt (e.g. a
    per-group seed). `futures_P[i].result()` is the `SampleResponse` for `prompts[i]`.
    """
    params_P = params_per_prompt(sampling_params, len(prompts))
    futures_P = [
        sampling_client.sample(prompt=prompt, num_samples=num_samples, sampling_params=params)
        for prompt, params in zip(prompts, params_P, strict=True)
    ]
    return futures_P


def sample_bounded(
    sampling_client: Any,
    prompts: Sequence[types.ModelInput],
    num_samples: int,
    sampling_params: SamplingParamsArg,
    max_in_flight: int = 64,
    on_result: Callable[[int, types.SampleResponse], None] | None = None,
    *,
    max_attempts: int = 3,
    retry_backoff_s: float = 0.5,
) -> list[types.SampleResponse]:
    """Sample every prompt with at most `max_in_flight` requests outstanding at once.

    Returns `responses_P` in input order. `on_result(index, response)` is called in the
    calling thread as each request finishes (completion order), e.g. to grade as you go.
    A request that raises is re-submitted after `retry_backoff_s * 2**k` s, up to
    `max_attempts` attempts in all; then `SampleRequestError` (with `.index`) is raised and
    requests not yet started are dropped.
    """
    if max_in_flight < 1:
        raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
    if max_attempts < 1:
        raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
    params_P = params_per_prompt(sampling_params, len(prompts))
    if not prompts:
        return []
    failed = threading.Event()

    def sample_one(index: int) -> types.SampleResponse:
        # Each worker holds one request in flight, so the pool size is the bound.
        for attempt in range(1, max_attempts + 1):
            try:
                return sampling_client.sample(
                    prompt=prompts[index], num_samples=num_samples, sampling_params=params_P[index]
                ).result()
            except Exception as e:  # noqa: BLE001 - any failure of one request is retried
                if attempt == max_attempts or failed.is_set():
                    raise SampleRequestError(index, attempt, e) from e
                logger.warning("sample request %d failed (attempt %d): %s", index, attempt, e)
                time.sleep(retry_backoff_s * 2 ** (attempt - 1))
        raise AssertionError("unreachable")

    responses_P: list[types.SampleResponse | None] = [None] * len(prompts)
    pool = concurrent.futures.ThreadPoolExecutor(
        max_workers=min(max_in_flight, len(prompts)), thread_name_prefix="sample-bounded"
    )
    try:
        jobs = {pool.submit(sample_one, i): i for i in range(len(prompts))}
        for job in concurrent.futures.as_completed(jobs):
            index = jobs[job]
            responses_P[index] = job.result()
            if on_result is not None:
                on_result(index, responses_P[index])
    except BaseException:
        failed.set()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return responses_P  # type: ignore[return-value]
