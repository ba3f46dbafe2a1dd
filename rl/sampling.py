"""Concurrency helpers over any sampling client with tinker's `SamplingClient.sample` surface.

`sample(prompt, num_samples, sampling_params, ...)` must return a future (anything with
`.result()`); both the tinker SDK and the local engine qualify.

- `submit_all`: training. Every request of a step goes in flight before any is awaited
  (as in the cookbook's `rl_loop.py`), so a step costs about one sampling latency.
  Evaluation submits its chunks through it too (`rl.loop.eval_rows`, `max_in_flight` a chunk);
  every future is read through `rl.backends.responses.resolved`, bounded in time on a service.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tinker import types

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
