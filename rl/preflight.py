"""Correctness preflight: does our loop compute what it claims, before any full run?

(a) the production gs1_kernel against the independent float64 reference (advantages, and the
    loss and LoRA gradient they induce on one fixed batch);
(b) the loop with the treatment disabled (group-mean advantages, our datums) against the stock
    tinker-cookbook path (`compute_advantages` + `assemble_training_data`) on the same batch;
(c) the probe: per arm, a fresh client, one forward_backward with that arm's advantage, one
    optim_step, finite loss;
(d) restoration: fresh clients of both arms give the same loss on a fixed batch.

Loss and gradient comparisons use the spec's tolerances: |a-b| <= atol + rtol*|b| elementwise
and cosine(a, b) >= min_cosine.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tinker import types
from tinker_cookbook.completers import TokensWithLogprobs
from tinker_cookbook.rl import data_processing
from tinker_cookbook.rl.types import Trajectory, TrajectoryGroup, Transition

from rl.estimators import advantages_for_step
from rl.loop import rollout_datum


@dataclass(frozen=True)
class Rollout:
    """One sampled rollout of the fixed preflight batch."""

    prompt: types.ModelInput
    tokens: list[int]
    logprobs: list[float]
    reward: float
    group_id: int


@dataclass(frozen=True)
class Comparison:
    name: str
    passed: bool
    details: dict


def cookbook_revision() -> dict:
    """The installed tinker-cookbook version and the hash of its advantage code: the pinned baseline."""
    import tinker_cookbook

    path = Path(data_processing.__file__)
    return {
        "package": "tinker-cookbook",
        "version": getattr(tinker_cookbook, "__version__", "unknown"),
        "file": "tinker_cookbook/rl/data_processing.py",
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
    }


def module_revision(module) -> dict:
    path = Path(module.__file__)
    return {"module": module.__name__, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def cookbook_grpo_datums(rollouts: Sequence[Rollout]) -> list[types.Datum]:
    """The stock cookbook path: TrajectoryGroups -> compute_advantages -> assemble_training_data."""
    group_ids = sorted({r.group_id for r in rollouts})
    groups_P = []
    for gid in group_ids:
        trajectories_G = [
            Trajectory(
                transitions=[
                    Transition(
                        ob=r.prompt,
                        ac=TokensWithLogprobs(tokens=list(r.tokens), maybe_logprobs=list(r.logprobs)),
                        reward=r.reward,
                        episode_done=True,
                    )
                ],
                final_ob=types.ModelInput.empty(),
            )
            for r in rollouts
            if r.group_id == gid
        ]
        groups_P.append(TrajectoryGroup(trajectories_G, [0.0] * len(trajectories_G), [{} for _ in trajectories_G]))
    advantages_P = data_processing.compute_advantages(groups_P)
    datums_D, _ = data_processing.assemble_training_data(groups_P, advantages_P)
    # The cookbook strips its bookkeeping mask before forward_backward (rl/train.py::_remove_mask).
    return [
        types.Datum(model_input=d.model_input, loss_fn_inputs={k: v for k, v in d.loss_fn_inputs.items() if k != "mask"})
        for d in datums_D
    ]


def loop_datums(rollouts: Sequence[Rollout], advantage_B: Sequence[float]) -> list[types.Datum]:
    """Our loop's datums for the same rollouts and the given advantages."""
    return [rollout_datum(r.prompt, r.tokens, r.logprobs, a) for r, a in zip(rollouts, advantage_B)]


def loop_grpo_advantages(rollouts: Sequence[Rollout]) -> np.ndarray:
    return advantages_for_step(
        "group_mean",
        rewards_B=np.asarray([r.reward for r in rollouts], dtype=np.float64),
        group_ids_B=np.asarray([r.group_id for r in rollouts]),
    ).advantage


def compare_arrays(name: str, ours, reference, *, atol: float, rtol: float, min_cosine: float | None = None) -> Comparison:
    a = np.asarray(ours, dtype=np.float64).ravel()
    b = np.asarray(reference, dtype=np.float64).ravel()
    details: dict = {"n": int(a.size)}
    if a.shape != b.shape:
        return Comparison(name, False, {**details, "reason": f"shapes differ {a.shape} vs {b.shape}"})
    finite = bool(np.all(np.isfinite(a)) and np.all(np.isfinite(b)))
    excess = np.abs(a - b) - (atol + rtol * np.abs(b))
    details["max_abs_diff"] = float(np.max(np.abs(a - b))) if a.size else 0.0
    details["max_excess_over_tolerance"] = float(np.max(excess)) if a.size else 0.0
    passed = finite and bool(np.all(excess <= 0))
    if min_cosine is not None:
        # A zero gradient on either side makes the comparison vacuous: that fails, it never passes.
        na, nb = np.linalg.norm(a), np.linalg.norm(b)
        cosine = float(a @ b / (na * nb)) if na > 0 and nb > 0 else float("nan")
        details["cosine"] = cosine
        details["min_cosine"] = min_cosine
        details["norm"] = float(nb)
        passed = passed and cosine >= min_cosine
    return Comparison(name, passed, details)


def loss_and_gradient(make_client: Callable[[], object], datums: Sequence[types.Datum]) -> tuple[float, np.ndarray | None]:
    """Loss of one forward_backward on a fresh client, and the LoRA gradient it accumulated.

    The gradient is observable on the local engine only (`lora_gradient`); a hosted service
    returns None and the comparison is made on the loss alone (and says so).
    """
    client = make_client()
    out = client.forward_backward(list(datums), loss_fn="importance_sampling").result()
    gradient = client.lora_gradient() if hasattr(client, "lora_gradient") else None
    return float(out.metrics["loss:sum"]), None if gradient is None else np.asarray(gradient, dtype=np.float64)


def compare_loss_and_gradient(prefix: str, make_client, ours_D, reference_D, tolerances: dict) -> list[Comparison]:
    loss_a, grad_a = loss_and_gradient(make_client, ours_D)
    loss_b, grad_b = loss_and_gradient(make_client, reference_D)
    lt, gt = tolerances[f"{prefix}_loss"], tolerances[f"{prefix}_gradient"]
    loss = compare_arrays(f"{prefix}_loss", [loss_a], [loss_b], atol=lt["atol"], rtol=lt["rtol"])
    if grad_a is None or grad_b is None:
        return [loss, Comparison(f"{prefix}_gradient", loss.passed, {"status": "gradient not observable on this backend; loss compared"})]
    return [loss, compare_arrays(f"{prefix}_gradient", grad_a, grad_b, atol=gt["atol"], rtol=gt["rtol"], min_cosine=gt["min_cosine"])]


def probe(training_client, datums: Sequence[types.Datum], lr: float) -> Comparison:
    """One forward_backward + one optim_step on a fresh client; the loss must be finite."""
    out = training_client.forward_backward(list(datums), loss_fn="importance_sampling").result()
    training_client.optim_step(types.AdamParams(learning_rate=lr, beta1=0.9, beta2=0.95, eps=1e-8)).result()
    loss = float(out.metrics["loss:sum"])
    return Comparison("probe", math.isfinite(loss), {"loss": loss, "num_datums": len(datums)})


def fixed_batch(sampling_client, *, env, renderer, problems, num_samples: int, max_tokens: int,
                temperature: float, seed: int = 0) -> tuple[list[Rollout], list[float]]:  # fmt: skip
    """Sample and grade one fixed batch: `num_samples` rollouts of each problem.

    Returns the rollouts and, per rollout, its prompt's mean logprob (the kernel feature).
    """
    from rl.loop import prompt_mean_logprob, sampling_seed

    prompts_P = [env.build_prompt(renderer, p) for p in problems]
    stop = env.stop_sequences(renderer)
    logprob_futures_P = [sampling_client.compute_logprobs(prompt) for prompt in prompts_P]
    sample_futures_P = [
        sampling_client.sample(
            prompt=prompt, num_samples=num_samples,
            sampling_params=types.SamplingParams(max_tokens=max_tokens, temperature=temperature, stop=stop,
                                                 seed=sampling_seed(seed, -1, p)),
        )  # fmt: skip
        for p, prompt in enumerate(prompts_P)
    ]
    rollouts, mean_logprobs = [], []
    for p, (problem, prompt, lp_future, future) in enumerate(zip(problems, prompts_P, logprob_futures_P, sample_futures_P)):
        mean_lp = prompt_mean_logprob(lp_future.result())
        for sequence in future.result().sequences:
            tokens = list(sequence.tokens)
            rollouts.append(Rollout(prompt, tokens, list(sequence.logprobs or []), float(env.reward(renderer, problem, tokens)), p))
            mean_logprobs.append(mean_lp)
    return rollouts, mean_logprobs


def with_varied_rewards(rollouts: Sequence[Rollout], seed: int = 0) -> tuple[list[Rollout], str]:
    """The batch itself when its rewards vary within some group; else seeded 0/1 rewards.

    The preflight compares code paths, not the policy: a batch whose every group has one reward
    gives zero advantages, a zero loss and a zero gradient everywhere, and would compare nothing.
    """
    by_group: dict[int, set] = {}
    for r in rollouts:
        by_group.setdefault(r.group_id, set()).add(r.reward)
    if any(len(v) > 1 for v in by_group.values()):
        return list(rollouts), "env"
    rng = np.random.default_rng(seed)
    rewards = rng.integers(0, 2, size=len(rollouts)).astype(float)
    for gid in by_group:  # make every group hold both rewards
        idx = [i for i, r in enumerate(rollouts) if r.group_id == gid]
        if len(idx) > 1:
            rewards[idx[0]], rewards[idx[1]] = 0.0, 1.0
    return [Rollout(r.prompt, r.tokens, r.logprobs, float(x), r.group_id) for r, x in zip(rollouts, rewards)], "seeded (env rewards had no variation)"
