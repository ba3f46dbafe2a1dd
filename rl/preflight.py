"""Correctness preflight: does our loop compute what it claims, before any full run?

(s) per arm, the arm's own advantage step (`rl.loop.step_advantages`: estimator dispatch and the
    window the loop threads from step to step) driven over fixed batches -- at least 4 steps,
    a window of at least 4 batches -- and every row compared with the independent reference over
    the same multi-step log (`rl.audit`), for the arm's actual recipe;
(a) the treatment's advantages on one sampled batch against the reference's: the loss and LoRA
    gradient they induce (a flash_reinforce arm's gated per-token advantages from the learner's
    forward pass on a fresh client; a critic arm's baselines from a fresh critic's forward pass);
(b) the loop with the treatment disabled (group-mean advantages, our datums) against the stock
    tinker-cookbook path (`compute_advantages` + `assemble_training_data`) on the same batch;
(c) the probe: per arm, a fresh client, one forward_backward with that arm's advantage, one
    optim_step, finite loss (a critic arm: its value model's training step too);
(d) restoration: fresh clients of both arms give the same loss on a fixed batch.

A fresh client is a context manager (`fresh_client(arm)`) and every check holds one at a time:
with the sampling client's own, at most two training clients are alive at once, so a service
that caps LoRA adapters per user runs the preflight.

Loss and gradient comparisons use the spec's tolerances: |a-b| <= atol + rtol*|b| elementwise
and cosine(a, b) >= min_cosine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tinker import types
from tinker_cookbook.completers import TokensWithLogprobs
from tinker_cookbook.rl import data_processing
from tinker_cookbook.rl.types import Trajectory, TrajectoryGroup, Transition

from design.arm import ArmConfig
from estimators import CRITIC, LEARNER_LOGPROBS, StepBatch
from rl.audit import AuditResult, RolloutLog, audit_log, reference_columns
from rl.backends.responses import backend_of, loss_sum, prompt_mean_logprob_of, resolved
from rl.loop import batch_of, new_window, rollout_datum, sampling_seed, step_advantages
from rl.step_inputs import critic_answer_tokens, critic_logprobs, learner_logprobs, train_critic
from schemas.optimizer import ADAM

FWD_BWD = "a ForwardBackwardOutput"

STEP_CHECK_TOLERANCE = 1e-12
MIN_CHECK_STEPS = 4


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


def sampled_batch(rollouts: Sequence[Rollout], mean_logprobs: Sequence[float]) -> StepBatch:
    """The sampled fixed batch as one step's StepBatch."""
    return batch_of({
        "reward": [r.reward for r in rollouts], "group_id": [r.group_id for r in rollouts],
        "prompt_num_tokens": [r.prompt.length for r in rollouts], "prompt_mean_logprob": list(mean_logprobs),
    })


def arm_step_advantages(arm: ArmConfig, batch: StepBatch) -> np.ndarray:
    """The per-token advantage of each rollout's datum as the arm's first training step (an empty
    window): the advantage, or FlashREINFORCE's gated, sample-mean weighted one."""
    return step_advantages(arm, batch, new_window(arm))[0].datum_advantage


def reference_step_advantages(arm: ArmConfig, batch: StepBatch) -> np.ndarray:
    """The independent reference's per-token datum advantages for `batch` as the arm's first step."""
    log = RolloutLog(np.zeros(len(batch.rewards_B), dtype=np.int64), batch.group_ids_B, batch.rewards_B,
                     batch.prompt_num_tokens_B, batch.prompt_mean_logprob_B, logged={},
                     sampler_logprobs_R_T=None if batch.sampler_logprobs_B_T is None else [t.tolist() for t in batch.sampler_logprobs_B_T],
                     learner_logprobs_R_T=None if batch.learner_logprobs_B_T is None else [t.tolist() for t in batch.learner_logprobs_B_T],
                     critic_yes_logprob_R=batch.critic_yes_logprob_B, critic_no_logprob_R=batch.critic_no_logprob_B)
    columns = reference_columns(arm, log)[0]
    return columns.get("token_advantage", columns["advantage"])


def with_arm_inputs(arm: ArmConfig, batch: StepBatch, rollouts: Sequence[Rollout], *, training_client, critic_client,
                    renderer) -> StepBatch:
    """`batch` with what `arm`'s kind needs besides rewards, measured as training measures it:
    the learner's token logprobs from `training_client`'s forward pass (LEARNER_LOGPROBS), the
    critic's yes/no logprobs from `critic_client`'s (CRITIC)."""
    needs = arm.estimator.needs
    if LEARNER_LOGPROBS in needs:
        learner_B_T, _ = learner_logprobs(training_client, [r.prompt for r in rollouts], [r.tokens for r in rollouts])
        batch = dataclasses.replace(batch, sampler_logprobs_B_T=tuple(np.asarray(r.logprobs, dtype=np.float64) for r in rollouts),
                                    learner_logprobs_B_T=tuple(learner_B_T))
    if CRITIC in needs:
        question_T, yes, no = critic_answer_tokens(renderer.tokenizer, arm.critic)
        yes_B, no_B, _ = critic_logprobs(critic_client, [r.prompt for r in rollouts], question_T, yes, no)
        batch = dataclasses.replace(batch, critic_yes_logprob_B=yes_B, critic_no_logprob_B=no_B)
    return batch


def fixed_step_batches(prompt_num_tokens_P: Sequence[int], prompt_mean_logprob_P: Sequence[float], arm: ArmConfig,
                       seed: int = 0) -> list[StepBatch]:
    """Fixed batches for the step check, at the arm's group size: at least MIN_CHECK_STEPS steps,
    batches of at most a quarter of the window (the window holds >= 4 of them), and enough steps
    for the window to fill and roll over twice. Features are the sampled prompts' own, jittered
    (every 5th row ties its predecessor); rewards are seeded draws from the env's reward values."""
    window = arm.estimator.check_window(arm.recipe) or 4 * arm.batch_size
    prompts_per_step = max(1, min(arm.groups_per_batch, (window // 4) // arm.group_size))
    batch_size = prompts_per_step * arm.group_size
    n_steps = max(MIN_CHECK_STEPS, -(-window // batch_size) + 2)
    rng = np.random.default_rng(seed)
    n_real = len(prompt_num_tokens_P)
    batches = []
    for step in range(n_steps):
        real_P = [(step * prompts_per_step + p) % n_real for p in range(prompts_per_step)]
        num_tokens_P = np.asarray([prompt_num_tokens_P[i] for i in real_P]) + rng.integers(0, 40, prompts_per_step)
        mean_logprob_P = np.asarray([prompt_mean_logprob_P[i] for i in real_P]) + rng.normal(0.0, 0.3, prompts_per_step)
        for p in range(4, prompts_per_step, 5):
            num_tokens_P[p], mean_logprob_P[p] = num_tokens_P[p - 1], mean_logprob_P[p - 1]
        batches.append(StepBatch(
            rewards_B=rng.choice([0.0, 1.0, -0.1, 0.9], size=batch_size, p=[0.45, 0.45, 0.05, 0.05]),
            group_ids_B=np.repeat(np.arange(prompts_per_step), arm.group_size),
            prompt_num_tokens_B=np.repeat(num_tokens_P, arm.group_size).astype(np.float64),
            prompt_mean_logprob_B=np.repeat(mean_logprob_P, arm.group_size),
            **arm.estimator.stand_in_inputs(arm.recipe, batch_size, rng),
        ))
    return batches


def check_arm_steps(arm: ArmConfig, batches: Sequence[StepBatch], tolerance: float = STEP_CHECK_TOLERANCE) -> AuditResult:
    """Drive the arm's own advantage step over `batches` from an empty window, as training does,
    and compare every row of the resulting log with the independent reference over that log."""
    window = new_window(arm)
    logged: dict[str, list] = {}
    for batch in batches:
        advantages, window = step_advantages(arm, batch, window)
        for column, values in advantages.logged().items():
            logged.setdefault(column, []).extend(np.asarray(values, dtype=np.float64).tolist())

    def joined(name):  # an estimator's own input over every batch, as the rollout log holds it
        parts = [getattr(b, name) for b in batches]
        return None if any(p is None for p in parts) else [x for p in parts for x in p]

    sampler, learner, yes, no = (joined(n) for n in ("sampler_logprobs_B_T", "learner_logprobs_B_T",
                                                      "critic_yes_logprob_B", "critic_no_logprob_B"))
    log = RolloutLog(
        step_R=np.concatenate([np.full(len(b.rewards_B), s) for s, b in enumerate(batches)]),
        group_id_R=np.concatenate([b.group_ids_B for b in batches]),
        reward_R=np.concatenate([b.rewards_B for b in batches]),
        prompt_num_tokens_R=np.concatenate([b.prompt_num_tokens_B for b in batches]),
        prompt_mean_logprob_R=np.concatenate([b.prompt_mean_logprob_B for b in batches]),
        logged={k: np.asarray(v, dtype=np.float64) for k, v in logged.items()},
        sampler_logprobs_R_T=None if sampler is None else [t.tolist() for t in sampler],
        learner_logprobs_R_T=None if learner is None else [t.tolist() for t in learner],
        critic_yes_logprob_R=None if yes is None else np.asarray(yes, dtype=np.float64),
        critic_no_logprob_R=None if no is None else np.asarray(no, dtype=np.float64),
    )
    return audit_log(arm, log, tolerance=tolerance)


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


FreshClient = Callable[[], AbstractContextManager]


def loss_and_gradient(make_client: FreshClient, datums: Sequence[types.Datum]) -> tuple[float, np.ndarray | None]:
    """Loss of one forward_backward on a fresh client, and the LoRA gradient it accumulated.

    The gradient is observable on the local engine only (`lora_gradient`); a hosted service
    returns None and the comparison is made on the loss alone (and says so).
    """
    with make_client() as client:
        out = resolved(client.forward_backward(list(datums), loss_fn="importance_sampling"), backend=backend_of(client),
                       call="forward_backward", expected=FWD_BWD)
        gradient = client.lora_gradient() if hasattr(client, "lora_gradient") else None
        loss = loss_sum(out, backend=backend_of(client))
    return loss, None if gradient is None else np.asarray(gradient, dtype=np.float64)


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
    backend = backend_of(training_client)
    out = resolved(training_client.forward_backward(list(datums), loss_fn="importance_sampling"), backend=backend,
                   call="forward_backward", expected=FWD_BWD)
    resolved(training_client.optim_step(types.AdamParams(learning_rate=lr, **ADAM.model_dump())), backend=backend,
             call="optim_step", expected="an OptimStepResponse")
    loss = loss_sum(out, backend=backend)
    return Comparison("probe", math.isfinite(loss), {"loss": loss, "num_datums": len(datums)})


def fixed_batch(sampling_client, *, env, renderer, problems, num_samples: int, max_tokens: int,
                temperature: float, seed: int = 0) -> tuple[list[Rollout], list[float]]:
    """Sample and grade one fixed batch: `num_samples` rollouts of each problem.

    Returns the rollouts and, per rollout, its prompt's mean logprob (the kernel feature).
    """
    prompts_P = [env.build_prompt(renderer, p) for p in problems]
    stop = env.stop_sequences(renderer)
    logprob_futures_P = [sampling_client.compute_logprobs(prompt) for prompt in prompts_P]
    sample_futures_P = [
        sampling_client.sample(
            prompt=prompt, num_samples=num_samples,
            sampling_params=types.SamplingParams(max_tokens=max_tokens, temperature=temperature, stop=stop,
                                                 seed=sampling_seed(seed, -1, p)),
        )
        for p, prompt in enumerate(prompts_P)
    ]
    rollouts, mean_logprobs = [], []
    for p, (problem, prompt, lp_future, future) in enumerate(zip(problems, prompts_P, logprob_futures_P, sample_futures_P)):
        backend = backend_of(sampling_client)
        mean_lp = prompt_mean_logprob_of(resolved(lp_future, backend=backend, call="compute_logprobs", expected="prompt logprobs"),
                                         prompt.length, backend=backend, call="compute_logprobs")
        for sequence in resolved(future, backend=backend, call="sample", expected="a SampleResponse").sequences:
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


@dataclass(frozen=True)
class PreflightOutcome:
    comparisons: list[Comparison]
    step_checks: list[AuditResult]
    fixed_batch: dict  # what the fixed batch was: prompts, samples per prompt, rewards and their source


def step_check_comparison(result: AuditResult) -> Comparison:
    """A step check as a preflight comparison row (the worst row and the first mismatches in its details)."""
    details = {
        "arm": result.arm, "estimator": result.estimator, "reference": result.reference, "rows": result.rows,
        "steps": result.steps, "tolerance": result.tolerance, "max_abs_diff": max(result.max_abs_diff.values(), default=0.0),
        "mismatches": result.n_mismatches,
        "first_mismatches": [m.__dict__ for m in result.mismatches[:5]],
    }
    return Comparison(f"step_check_{result.arm}", result.passed, details)


def correctness_checks(arms: Sequence[ArmConfig], baseline: ArmConfig, treatment: ArmConfig, *,
                       fresh_client: Callable[[ArmConfig], AbstractContextManager], sampling_client, env, renderer,
                       problems, num_samples: int, max_tokens: int, tolerances: dict,
                       fresh_critic: Callable[[ArmConfig], AbstractContextManager] | None = None) -> PreflightOutcome:
    """Every check of the correctness preflight; `with fresh_client(arm) as tc:` holds a fresh training
    client for one check and gives it back after; `fresh_critic(arm)` likewise a critic arm's value model."""
    rollouts, mean_logprobs = fixed_batch(
        sampling_client, env=env, renderer=renderer, problems=problems, num_samples=num_samples,
        max_tokens=max_tokens, temperature=baseline.temperature,
    )
    rollouts, rewards_source = with_varied_rewards(rollouts)
    batch = sampled_batch(rollouts, mean_logprobs)
    comparisons: list[Comparison] = []

    # (s) each arm's own advantage step over fixed multi-step batches vs the reference on that log.
    prompt_num_tokens_P = [r.prompt.length for r in rollouts]
    step_checks = [check_arm_steps(arm, fixed_step_batches(prompt_num_tokens_P, mean_logprobs, arm)) for arm in arms]
    comparisons += [step_check_comparison(result) for result in step_checks]

    def inputs_of(arm: ArmConfig) -> StepBatch:  # the batch with the arm's own inputs, measured on fresh clients
        needs = arm.estimator.needs
        if CRITIC in needs and fresh_critic is None:
            raise ValueError(f"arm {arm.name} needs a critic: the preflight needs fresh_critic")
        with contextlib.ExitStack() as held:
            training_client = held.enter_context(fresh_client(arm)) if LEARNER_LOGPROBS in needs else None
            critic_client = held.enter_context(fresh_critic(arm)) if CRITIC in needs else None
            return with_arm_inputs(arm, batch, rollouts, training_client=training_client, critic_client=critic_client,
                                   renderer=renderer)

    # (a) the treatment's advantages on the sampled batch vs the reference's: loss and LoRA gradient.
    treatment_batch = inputs_of(treatment)
    treatment_advantage = arm_step_advantages(treatment, treatment_batch)
    comparisons += compare_loss_and_gradient(
        "reference", lambda: fresh_client(baseline), loop_datums(rollouts, treatment_advantage),
        loop_datums(rollouts, reference_step_advantages(treatment, treatment_batch)), tolerances,
    )

    # (b) the baseline arm's step on the sampled batch, our datums, vs the stock cookbook path.
    baseline_advantage = arm_step_advantages(baseline, inputs_of(baseline))
    comparisons += compare_loss_and_gradient(
        "baseline", lambda: fresh_client(baseline), loop_datums(rollouts, baseline_advantage), cookbook_grpo_datums(rollouts),
        tolerances,
    )

    # (c) the probe, per arm: a fresh client, that arm's advantage, one optim step, finite loss.
    for arm, advantage in ((baseline, baseline_advantage), (treatment, treatment_advantage)):
        with fresh_client(arm) as training_client:
            result = probe(training_client, loop_datums(rollouts, advantage), arm.lr)
        comparisons.append(Comparison(f"probe_{arm.name}", result.passed, result.details))
        if CRITIC in arm.estimator.needs:  # and its value model's training step, as the loop takes it
            question_T, yes, no = critic_answer_tokens(renderer.tokenizer, arm.critic)
            with fresh_critic(arm) as critic_client:
                loss, tokens = train_critic(critic_client, arm.critic, [r.prompt for r in rollouts],
                                            [r.reward for r in rollouts], question_T, yes, no, arm)
            comparisons.append(Comparison(f"probe_{arm.name}_critic", math.isfinite(loss) and loss > 0,
                                          {"loss": loss, "num_tokens": tokens}))

    # (d) restoration: both arms start from the same base LoRA init within the seed.
    datums = loop_datums(rollouts, baseline_advantage)
    losses = []
    for arm in (baseline, treatment):  # one after the other: each client is given back before the next
        with fresh_client(arm) as training_client:
            out = resolved(training_client.forward(datums, loss_fn="importance_sampling"),
                           backend=backend_of(training_client), call="forward", expected=FWD_BWD)
            losses.append(loss_sum(out, backend=backend_of(training_client), call="forward"))
    lt = tolerances["baseline_loss"]
    comparisons.append(compare_arrays("restoration_loss", [losses[1]], [losses[0]], atol=lt["atol"], rtol=lt["rtol"]))

    fixed = {"prompts": [p.id for p in problems], "samples_per_prompt": num_samples,
             "rewards": [r.reward for r in rollouts], "rewards_source": rewards_source}
    return PreflightOutcome(comparisons, step_checks, fixed)
