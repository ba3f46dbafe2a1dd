"""rl.sampling against an in-process FakeSamplingClient whose futures come from a thread pool."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import numpy as np
import pytest
from tinker import types

from fakes.eval_env import FakeEvalEnv, FakeRenderer
from rl.sampling import params_per_prompt, submit_all


class FakeSamplingClient:
    """`sample()` returns a concurrent future that resolves after `latency_s(prompt_id)`.

    The prompt id is the prompt's last token. The response's sample j is `[prompt_id, j]`.
    With `held` (an Event) no request is answered until it is set.
    """

    def __init__(self, latency_s=lambda pid: 0.05, held=None):
        self.latency_s = latency_s
        self.held = held
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=128)
        self.lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0
        self.params_seen: dict[int, types.SamplingParams] = {}

    def sample(self, prompt, num_samples, sampling_params, include_prompt_logprobs=False):
        pid = prompt.to_ints()[-1]
        with self.lock:
            self.params_seen[pid] = sampling_params
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        return self.pool.submit(self._run, pid, num_samples)

    def _run(self, pid, num_samples):
        try:
            if self.held is not None:
                self.held.wait()
            time.sleep(self.latency_s(pid))
            return types.SampleResponse(
                sequences=[
                    types.SampledSequence(
                        stop_reason="stop",
                        sequence_id=f"{pid}/{j}",
                        tokens_np=np.array([pid, j], np.int32),
                        logprobs_np=np.array([-0.5, -0.5], np.float32),
                    )
                    for j in range(num_samples)
                ]
            )
        finally:
            with self.lock:
                self.in_flight -= 1


def _prompts(n):
    return [types.ModelInput.from_ints([1000, i]) for i in range(n)]


PARAMS = types.SamplingParams(max_tokens=8, temperature=1.0)


def test_submit_all_puts_every_request_in_flight_before_any_is_awaited():
    held = threading.Event()
    client = FakeSamplingClient(latency_s=lambda pid: 0.0, held=held)
    submitted = concurrent.futures.ThreadPoolExecutor(1).submit(submit_all, client, _prompts(32), 2, PARAMS)
    # No request can be answered yet, so a submit_all that awaited any of them would not return.
    futures_P = submitted.result(timeout=30)
    assert client.max_in_flight == 32
    assert not any(f.done() for f in futures_P)
    held.set()
    responses_P = [f.result() for f in futures_P]
    assert [r.sequences[0].tokens[0] for r in responses_P] == list(range(32))
    assert [[s.tokens[1] for s in r.sequences] for r in responses_P] == [[0, 1]] * 32


def test_submit_all_takes_one_params_per_prompt():
    client = FakeSamplingClient()
    params_P = [types.SamplingParams(max_tokens=4, seed=100 + i) for i in range(5)]
    [f.result() for f in submit_all(client, _prompts(5), 1, params_P)]
    assert [client.params_seen[i].seed for i in range(5)] == [100, 101, 102, 103, 104]
    with pytest.raises(ValueError, match="4 sampling params for 5 prompts"):
        submit_all(client, _prompts(5), 1, params_P[:4])


def test_params_per_prompt_repeats_a_single_params():
    assert params_per_prompt(PARAMS, 3) == [PARAMS] * 3


@pytest.mark.parametrize("max_in_flight", [1, 5, 64])
def test_eval_rows_bounds_requests_in_flight_and_keeps_item_order(max_in_flight):
    from rl.envs.base import Problem
    from rl.loop import eval_rows

    # no request is answered before the bound's worth are in flight at once (a fixed latency races a
    # loaded machine's submissions); after that they answer at once
    target, reached = min(max_in_flight, 23), threading.Event()

    def latency(pid):
        if client.in_flight >= target:
            reached.set()
        reached.wait(timeout=30)
        return 0.0

    client = FakeSamplingClient(latency_s=latency)
    problems = [Problem(id=str(i), question=f"q{i}", answer="0") for i in range(23)]
    rows = eval_rows(client, env=FakeEvalEnv(), renderer=FakeRenderer(), problems=problems, arm_name="a",
                     max_tokens=4, max_in_flight=max_in_flight)
    assert client.max_in_flight == min(max_in_flight, 23)
    assert [r["item_id"] for r in rows] == [str(i) for i in range(23)]
    assert [r["correct"] for r in rows] == [i % 2 == 0 for i in range(23)]
    assert all(p.temperature == 0.0 for p in client.params_seen.values())  # greedy
