"""One RL arm, top to bottom: sample -> grade -> advantages -> datums -> forward_backward -> optim_step.

Written in the style of tinker-cookbook's `recipes/rl_loop.py`: every sample future of a step is
submitted before any is awaited, datums are built in plain sight, and lists carry their
dimensions in their names:

    _P  prompts of the step          _G  rollouts of one prompt (the arm's group size)
    _B  rollouts of the step (P*G)   _T  tokens             _D  datums sent to forward_backward

The loop never knows which backend it talks to: `service_client` is the real `tinker`
ServiceClient or the embedded local engine, both returning futures of real `tinker.types`.
The loop alone owns the kernel window: `step_advantages` (the arm's advantage step, the function
the correctness preflight drives) computes a step's advantages against the window of earlier
rollouts and hands back the window of the next step, into which this step's rollouts entered
exactly once. Per-step logs go to `<arm_dir>/steps/step-NNNNN.{rollouts,metrics}.parquet`;
because the window is rebuilt from those logs through the same `advance_window`, and the sampling
seeds are a pure function of (seed, step, prompt), a run resumed from a `save_state` checkpoint
replays the same steps.
"""

from __future__ import annotations

import hashlib
import math
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
from tinker import types
from tinker.types.tensor_data import TensorData

from rl.backends.responses import backend_of, loss_sum, prompt_mean_logprob_of, resolved
from rl.envs.base import Env, Problem
from rl.estimators import KernelWindow, StepAdvantages, StepBatch, advantages_for_step, critic_targets
from schemas.arm import ArmConfig, CriticSpec
from schemas.cost import StepCost
from schemas.artifacts import write_artifact
from schemas.errors import ArmFailed, NonFiniteStep, UserError
from schemas.io import write_json_atomic
from schemas.layout import NONFINITE_STEP_FILE as STEP_FILE


@dataclass
class StepLog:
    """What one step produced: one row per rollout, one row of step metrics, and the kernel window
    the next step sees (None for a non-kernel arm)."""

    rollouts: dict[str, list]
    metrics: dict[str, float]
    next_window: KernelWindow | None = None
    cost: StepCost | None = None


@dataclass
class HeldoutRequest:
    """Extra samples of some prompts, used only to measure the baseline (never trained on)."""

    num_prompts: int
    num_samples: int
    rows: list[dict] = field(default_factory=list)


def sampling_seed(seed: int, step: int, group: int) -> int:
    """A sampling seed that depends only on (arm seed, step, prompt index): resume replays it."""
    digest = hashlib.sha256(f"{seed}:{step}:{group}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def rollout_datum(prompt: types.ModelInput, tokens_T: list[int], logprobs_T: list[float], advantage: float) -> types.Datum:
    """One rollout as an importance-sampling datum, exactly as the cookbook's rl_loop builds it.

    Inputs are the prompt plus all sampled tokens but the last; targets are shifted by one, so
    the first `prompt.length - 1` positions predict prompt tokens and carry zero advantage.
    """
    ob_len = prompt.length - 1
    model_input = prompt.append(types.EncodedTextChunk(tokens=tokens_T[:-1]))
    target_tokens = [0] * ob_len + list(tokens_T)
    padded_logprobs = [0.0] * ob_len + list(logprobs_T)
    padded_advantages = [0.0] * ob_len + [float(advantage)] * (model_input.length - ob_len)
    assert model_input.length == len(target_tokens) == len(padded_logprobs) == len(padded_advantages)
    return types.Datum(
        model_input=model_input,
        loss_fn_inputs={
            "target_tokens": TensorData(data=target_tokens, dtype="int64", shape=[len(target_tokens)]),
            "logprobs": TensorData(data=padded_logprobs, dtype="float32", shape=[len(padded_logprobs)]),
            "advantages": TensorData(data=padded_advantages, dtype="float32", shape=[len(padded_advantages)]),
        },
    )


def step_problems(order: Sequence[Problem], arm: ArmConfig, step: int) -> list[Problem]:
    """The step's prompts: the next `groups_per_batch` of the shared seed-0 order (wrapping)."""
    start = step * arm.groups_per_batch
    return [order[(start + p) % len(order)] for p in range(arm.groups_per_batch)]


def new_window(arm: ArmConfig) -> KernelWindow | None:
    """The empty window of an arm's first step; None for an arm whose estimator has no window."""
    return None if arm.kernel is None else KernelWindow.empty(arm.kernel.window)


def advance_window(arm: ArmConfig, window: KernelWindow | None, batch: StepBatch) -> KernelWindow | None:
    """The window after `batch`'s step: the one place a step's rollouts enter the window."""
    return None if window is None else window.extended(batch.rewards_B, batch.kernel_features(arm.kernel))


def step_advantages(arm: ArmConfig, batch: StepBatch, window: KernelWindow | None) -> tuple[StepAdvantages, KernelWindow | None]:
    """The arm's advantage step as training runs it: this step's advantages against the window of
    earlier rollouts (estimator dispatch on the arm's spec), and the window of the next step."""
    advantages = advantages_for_step(arm.advantage, batch, kernel=arm.kernel, window=window, trust_delta=arm.trust_delta)
    return advantages, advance_window(arm, window, batch)


def batch_of(rows) -> StepBatch:
    """A step's StepBatch from its rollout rows (a column dict or a rollouts table)."""

    def values(name):
        if isinstance(rows, dict):
            return rows.get(name)
        return rows.column(name).to_pylist() if name in rows.column_names else None

    def column(name, dtype):
        return np.asarray(values(name), dtype=dtype)

    def optional(name):  # an estimator's own input: absent (or null) for the other arms
        v = values(name)
        return None if v is None or any(x is None for x in v) else np.asarray(v, dtype=np.float64)

    def per_token(name):
        v = values(name)
        return None if v is None or any(x is None for x in v) else tuple(np.asarray(x, dtype=np.float64) for x in v)

    return StepBatch(
        rewards_B=column("reward", np.float64),
        group_ids_B=column("group_id", np.int64),
        prompt_num_tokens_B=column("prompt_num_tokens", np.float64),
        prompt_mean_logprob_B=column("prompt_mean_logprob", np.float64),
        sampler_logprobs_B_T=per_token("sampler_logprobs"),
        learner_logprobs_B_T=per_token("learner_logprobs"),
        critic_yes_logprob_B=optional("critic_yes_logprob"),
        critic_no_logprob_B=optional("critic_no_logprob"),
    )


# ---------------------------------------------------------------------------- forward passes


def forward_datum(prompt: types.ModelInput, tokens_T: list[int]) -> types.Datum:
    """A rollout as a forward-only datum: the same positions and targets as `rollout_datum`."""
    ob_len = prompt.length - 1
    model_input = prompt.append(types.EncodedTextChunk(tokens=tokens_T[:-1]))
    target_tokens = [0] * ob_len + list(tokens_T)
    return types.Datum(
        model_input=model_input,
        loss_fn_inputs={
            "target_tokens": TensorData(data=target_tokens, dtype="int64", shape=[len(target_tokens)]),
            "weights": TensorData(data=[0.0] * len(target_tokens), dtype="float32", shape=[len(target_tokens)]),
        },
    )


def learner_logprobs(training_client, prompts_B: Sequence[types.ModelInput], tokens_B_T: Sequence[list[int]]
                     ) -> tuple[list[np.ndarray], int]:
    """The learner's logprob of every sampled token, from the client's forward pass on its current
    weights (the weights the step's forward_backward updates). Returns (logprobs_B_T, tokens sent)."""
    which_D = [b for b in range(len(tokens_B_T)) if len(tokens_B_T[b]) > 0]
    datums_D = [forward_datum(prompts_B[b], list(tokens_B_T[b])) for b in which_D]
    out_B_T = [np.zeros(0) for _ in tokens_B_T]
    if datums_D:
        outputs_D = training_client.forward(datums_D, loss_fn="cross_entropy").result().loss_fn_outputs
        for b, output in zip(which_D, outputs_D):
            logprobs = np.asarray(output["logprobs"].tolist(), dtype=np.float64).reshape(-1)
            out_B_T[b] = logprobs[prompts_B[b].length - 1 :]  # the sampled tokens' positions
    return out_B_T, sum(d.model_input.length for d in datums_D)


def critic_answer_tokens(tokenizer, critic: CriticSpec) -> tuple[list[int], int, int]:
    """(question tokens, yes token, no token) of the critic's fixed question and answers."""
    question = list(tokenizer.encode(critic.question, add_special_tokens=False))
    yes = tokenizer.encode(critic.yes, add_special_tokens=False)
    no = tokenizer.encode(critic.no, add_special_tokens=False)
    if len(yes) != 1 or len(no) != 1 or yes == no:
        raise ValueError(f"critic answers {critic.yes!r} / {critic.no!r} must be two distinct single tokens")
    return question, yes[0], no[0]


def critic_datum(prompt: types.ModelInput, question_T: list[int], answer: int, weight: float) -> types.Datum:
    """The prompt and the critic's question, with one target: `answer` at the last position."""
    model_input = prompt.append(types.EncodedTextChunk(tokens=list(question_T)))
    n = model_input.length
    return types.Datum(
        model_input=model_input,
        loss_fn_inputs={
            "target_tokens": TensorData(data=[0] * (n - 1) + [int(answer)], dtype="int64", shape=[n]),
            "weights": TensorData(data=[0.0] * (n - 1) + [float(weight)], dtype="float32", shape=[n]),
        },
    )


def critic_logprobs(critic_client, prompts_P: Sequence[types.ModelInput], question_T, yes: int, no: int
                    ) -> tuple[np.ndarray, np.ndarray, int]:
    """The critic's log P(yes), log P(no) after each prompt + question (one forward pass).
    Returns (yes_P, no_P, tokens sent)."""
    datums_D = [critic_datum(prompt, question_T, answer, 0.0) for prompt in prompts_P for answer in (yes, no)]
    outputs_D = critic_client.forward(datums_D, loss_fn="cross_entropy").result().loss_fn_outputs
    last_D = np.asarray([float(np.asarray(o["logprobs"].tolist()).reshape(-1)[-1]) for o in outputs_D])
    return last_D[0::2], last_D[1::2], sum(d.model_input.length for d in datums_D)


def train_critic(critic_client, critic: CriticSpec, prompts_B: Sequence[types.ModelInput], rewards_B, question_T,
                 yes: int, no: int, arm: ArmConfig) -> tuple[float, int]:
    """One Adam step of the critic on the step's (prompt, reward) pairs: the mean over rollouts of
    -(y log P(yes) + (1 - y) log P(no)), y the clipped reward. Returns (loss, tokens sent)."""
    B = len(prompts_B)
    datums_D = []
    for prompt, y in zip(prompts_B, critic_targets(rewards_B)):
        for answer, weight in ((yes, y / B), (no, (1.0 - y) / B)):
            if weight > 0:
                datums_D.append(critic_datum(prompt, question_T, answer, weight))
    fwd_bwd_future = critic_client.forward_backward(datums_D, loss_fn="cross_entropy")
    optim_future = critic_client.optim_step(types.AdamParams(learning_rate=critic.lr, beta1=arm.beta1, beta2=arm.beta2, eps=arm.eps))
    loss = float(fwd_bwd_future.result().metrics.get("loss:sum", float("nan")))
    optim_future.result()
    return loss, sum(d.model_input.length for d in datums_D)


def run_step(
    step: int,
    arm: ArmConfig,
    *,
    training_client,
    env: Env,
    renderer,
    order: Sequence[Problem],
    window: KernelWindow | None,
    heldout: HeldoutRequest | None = None,
    critic_client=None,
    nonfinite_dir: Path | None = None,
) -> StepLog:
    """One training step of `arm` against `window`; the log carries the next step's window.

    A critic arm also takes `critic_client` (its value model's LoRA training client). A
    forward_backward the local engine finds non-finite leaves its reproducer under
    `nonfinite_dir` (`kept_nonfinite`)."""
    if (arm.critic is not None) != (critic_client is not None):
        raise ValueError(f"arm {arm.name}: a critic client goes with, and only with, a critic arm")
    t_start = time.time()
    backend = backend_of(training_client)
    sampling_client = resolved(training_client.save_weights_and_get_sampling_client(), backend=backend,
                                call="save_weights_and_get_sampling_client", expected="a sampling client")
    problems_P = step_problems(order, arm, step)
    prompts_P = [env.build_prompt(renderer, problem) for problem in problems_P]
    stop = env.stop_sequences(renderer)

    # Submit every request of the step before awaiting any. Each request also returns its
    # prompt's logprobs under the sampling policy: the kernel's feature, measured before the rollout.
    sample_futures_P = [
        sampling_client.sample(
            prompt=prompt,
            num_samples=arm.group_size,
            sampling_params=types.SamplingParams(
                max_tokens=arm.max_tokens,
                temperature=arm.temperature,
                stop=stop,
                seed=sampling_seed(arm.seed, step, p),
            ),
            include_prompt_logprobs=True,
        )
        for p, prompt in enumerate(prompts_P)
    ]
    heldout_futures_P = []
    if heldout is not None:
        for p in range(min(len(prompts_P), heldout.num_prompts - len({r["prompt_id"] for r in heldout.rows}))):
            heldout_futures_P.append(
                (
                    problems_P[p],
                    sampling_client.sample(
                        prompt=prompts_P[p],
                        num_samples=heldout.num_samples,
                        sampling_params=types.SamplingParams(
                            max_tokens=arm.max_tokens,
                            temperature=arm.temperature,
                            stop=stop,
                            seed=sampling_seed(arm.seed + 1_000_003, step, p),
                        ),
                    ),
                )
            )

    # Cost: every request to the service, and every token the sampler prefilled or generated.
    model_calls = 1 + len(sample_futures_P) + len(heldout_futures_P)  # 1: the sampler refresh above
    sampler_tokens = 0

    # Grade.
    rewards_B: list[float] = []
    group_ids_B: list[int] = []
    tokens_B_T: list[list[int]] = []
    logprobs_B_T: list[list[float]] = []
    rows: dict[str, list] = {c: [] for c in ROLLOUT_COLUMNS}
    for p, (problem, prompt, sample_future) in enumerate(zip(problems_P, prompts_P, sample_futures_P)):
        response = resolved(sample_future, backend=backend, call="sample", expected="a SampleResponse")
        mean_lp = prompt_mean_logprob_of(response.prompt_logprobs, prompt.length, backend=backend,
                                         call="sample(include_prompt_logprobs=True)")
        sampler_tokens += prompt.length + sum(len(sequence.tokens) for sequence in response.sequences)
        for g, sequence in enumerate(response.sequences):
            reward = float(env.reward(renderer, problem, list(sequence.tokens)))
            rewards_B.append(reward)
            group_ids_B.append(p)
            tokens_B_T.append(list(sequence.tokens))
            logprobs_B_T.append(list(sequence.logprobs or []))
            rows["step"].append(step)
            rows["arm"].append(arm.name)
            rows["seed"].append(arm.seed)
            rows["prompt_id"].append(problem.id)
            rows["group_id"].append(p)
            rows["sample_idx"].append(g)
            rows["prompt_num_tokens"].append(prompt.length)
            rows["prompt_mean_logprob"].append(mean_lp)
            rows["reward"].append(reward)
            rows["num_tokens"].append(len(sequence.tokens))
            rows["stop_reason"].append(str(sequence.stop_reason))
            rows["response"].append(_decode(renderer, sequence.tokens))
    t_sampled = time.time()
    prompts_B = [prompts_P[p] for p in group_ids_B]
    B = len(rewards_B)
    extra: dict[str, float | None] = dict.fromkeys(STEP_EXTRA_METRICS)

    # What an arm's estimator reads besides the rewards, measured on the weights this step updates.
    for column in ("sampler_logprobs", "learner_logprobs", "critic_yes_logprob", "critic_no_logprob"):
        rows[column] = [None] * B
    if arm.trust_delta is not None:  # flash_reinforce: the learner's logprobs from a forward pass
        t0 = time.time()
        learner_B_T, forward_tokens = learner_logprobs(training_client, prompts_B, tokens_B_T)
        extra.update(learner_forward_seconds=time.time() - t0, learner_forward_tokens=forward_tokens)
        rows["sampler_logprobs"] = [[float(x) for x in lp] for lp in logprobs_B_T]
        rows["learner_logprobs"] = [[float(x) for x in lp] for lp in learner_B_T]
    if arm.critic is not None:  # critic: its value of each prompt, before this step's rewards train it
        question_T, yes, no = critic_answer_tokens(renderer.tokenizer, arm.critic)
        t0 = time.time()
        yes_P, no_P, forward_tokens = critic_logprobs(critic_client, prompts_P, question_T, yes, no)
        extra.update(critic_forward_seconds=time.time() - t0, critic_forward_tokens=forward_tokens)
        rows["critic_yes_logprob"] = [float(yes_P[p]) for p in group_ids_B]
        rows["critic_no_logprob"] = [float(no_P[p]) for p in group_ids_B]

    # Advantages: the only part that differs between arms.
    advantages, next_window = step_advantages(arm, batch_of(rows), window)
    rows["baseline"] = [float(b) for b in advantages.baseline]
    rows["advantage"] = [float(a) for a in advantages.advantage]
    for column in ("kernel_mass", "effective_neighbors", "fallback", "sequence_kl", "admitted", "token_advantage"):
        values = getattr(advantages, column, None)
        rows[column] = [None] * B if values is None else [v.item() for v in np.asarray(values)]

    # Datums: rollouts with zero advantage carry no gradient, so they are not sent (as in the
    # cookbook, which drops constant-reward groups). FlashREINFORCE's datums carry its gated,
    # sample-mean weighted per-token advantage (`StepAdvantages.datum_advantage`).
    datum_advantage_B = advantages.datum_advantage
    t_policy = time.time()  # train_seconds: the policy's own update (the forward passes above are timed apart)
    sent_D = [b for b in range(B) if datum_advantage_B[b] != 0.0 and len(tokens_B_T[b]) > 0]
    datums_D = [rollout_datum(prompts_B[b], tokens_B_T[b], logprobs_B_T[b], datum_advantage_B[b]) for b in sent_D]
    loss = 0.0
    if datums_D:
        fwd_bwd_future = training_client.forward_backward(datums_D, loss_fn="importance_sampling")
        optim_future = training_client.optim_step(
            types.AdamParams(learning_rate=arm.lr, beta1=arm.beta1, beta2=arm.beta2, eps=arm.eps)
        )
        try:
            fwd_bwd = resolved(fwd_bwd_future, backend=backend, call="forward_backward", expected="a ForwardBackwardOutput")
        except NonFiniteStep as bad:  # the local engine applied nothing and dumped the call
            raise kept_nonfinite(bad, nonfinite_dir, arm, step, rows, sent_D) from None
        loss = loss_sum(fwd_bwd, backend=backend)
        model_calls += 2
        # How far the learner's logprobs of the sampled tokens are from the sampler's: ~0 on one
        # fresh batch; a growing gap is the first sign of a sampler / learner mismatch.
        extra["logprob_gap_max"] = _logprob_gap_max(datums_D, [len(tokens_B_T[b]) for b in sent_D], fwd_bwd)
        try:
            optim = resolved(optim_future, backend=backend, call="optim_step", expected="an OptimStepResponse")
        except FloatingPointError as e:  # the local engine refuses a non-finite update (weights kept)
            raise FloatingPointError(f"{e}; the training loss was {loss} "
                                     f"({_non_finite_logprobs(datums_D, fwd_bwd)})") from None
        grad_norm = (getattr(optim, "metrics", None) or {}).get("optim/grad_norm")
        extra["grad_norm"] = None if grad_norm is None else float(grad_norm)
        if not math.isfinite(loss):
            # the optimizer step already applied it: the adapter is no longer trustworthy
            raise FloatingPointError(f"the training loss is {loss} (forward_backward; "
                                     f"{_non_finite_logprobs(datums_D, fwd_bwd)})")
    t_trained = time.time()
    if arm.critic is not None:  # the critic learns this step's (prompt, reward) pairs, after use
        critic_loss, train_tokens = train_critic(critic_client, arm.critic, prompts_B, rewards_B, question_T, yes, no, arm)
        extra.update(critic_train_seconds=time.time() - t_trained, critic_train_tokens=train_tokens, critic_loss=critic_loss)
    if advantages.admitted is not None:
        extra.update(trust_admit_rate=float(np.mean(advantages.admitted)) if B else float("nan"),
                     sequence_kl_mean=float(np.mean(advantages.sequence_kl)) if B else float("nan"))

    if heldout is not None:
        for p, (problem, future) in enumerate(heldout_futures_P):  # held-out request p samples prompt p
            held = resolved(future, backend=backend, call="sample (held-out)", expected="a SampleResponse")
            sampler_tokens += prompts_P[p].length + sum(len(seq.tokens) for seq in held.sequences)
            for k, sequence in enumerate(held.sequences):
                heldout.rows.append(
                    {"prompt_id": problem.id, "sample_idx": k, "reward": float(env.reward(renderer, problem, list(sequence.tokens)))}
                )

    rewards = np.asarray(rewards_B, dtype=np.float64)
    adv = np.asarray(advantages.advantage, dtype=np.float64)
    eff = rows["effective_neighbors"]
    metrics = {
        "step": step,
        "arm": arm.name,
        "seed": arm.seed,
        "reward_mean": float(rewards.mean()),
        "reward_std": float(rewards.std()),
        "advantage_abs_mean": float(np.abs(adv).mean()),
        "frac_nonzero_advantage": float((np.abs(adv) > 1e-6).mean()),
        "baseline_mean": float(np.mean(rows["baseline"])),
        "loss": loss,
        "num_datums": len(datums_D),
        "num_tokens": int(sum(len(t) for t in tokens_B_T)),
        "effective_neighbors_p10": None if eff[0] is None else float(np.percentile(np.asarray(eff, dtype=np.float64), 10)),
        "sample_seconds": t_sampled - t_start,
        "train_seconds": t_trained - t_policy,
        "step_seconds": time.time() - t_start,
        "wall_time": time.time(),
        **extra,
    }
    # Trainer work includes flash_reinforce's learner forward and the critic's forward and training;
    # the critic's part is also given on its own.
    trainer_tokens = sum(d.model_input.length for d in datums_D) + (extra["learner_forward_tokens"] or 0)
    model_calls += 1 if extra["learner_forward_tokens"] is not None else 0
    critic = {}
    if extra["critic_forward_tokens"] is not None:
        critic = {"critic_seconds": extra["critic_forward_seconds"] + extra["critic_train_seconds"],
                  "critic_tokens": extra["critic_forward_tokens"] + extra["critic_train_tokens"],
                  "critic_calls": 3}  # forward; forward_backward + optim_step
        trainer_tokens += critic["critic_tokens"]
        model_calls += critic["critic_calls"]
    cost = StepCost(
        step=step, arm=arm.name, seed=arm.seed, wall_seconds=metrics["step_seconds"],
        sample_seconds=metrics["sample_seconds"], train_seconds=metrics["train_seconds"], sampler_tokens=sampler_tokens,
        trainer_tokens=trainer_tokens, model_calls=model_calls, **critic,
    )
    return StepLog(rollouts=rows, metrics=metrics, next_window=next_window, cost=cost)


def kept_nonfinite(bad: NonFiniteStep, nonfinite_dir: Path | None, arm: ArmConfig, step: int, rows: dict,
                   sent_D: list[int]) -> NonFiniteStep:
    """The engine's dump moved to `<nonfinite_dir>/<step + 1>/` (the run directory's), with the
    step's rollouts (the rollouts log of a step, as any step writes it) and which rollout each datum
    is; the finding, naming that rollout and its prompt, with the dump's new path."""
    note = ""
    if bad.datum is not None and bad.datum < len(sent_D):
        b = sent_D[bad.datum]
        note = f" (rollout {b}, prompt {rows['prompt_id'][b]})"
    if nonfinite_dir is None:
        return bad.moved(bad.dump, note)
    target = Path(nonfinite_dir) / str(step + 1)
    if target.exists():  # the same step failed before this resume: keep the newest
        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(bad.dump, target)
    write_artifact("rollouts", [dict(zip(rows, values)) for values in zip(*rows.values())], target / "rollouts.parquet")
    write_json_atomic(target / STEP_FILE, {"arm": arm.name, "seed": arm.seed, "step": step, "datum_rollouts": sent_D,
                                           "lr": arm.lr, "beta1": arm.beta1, "beta2": arm.beta2, "eps": arm.eps})
    return bad.moved(str(target), note)


def _non_finite_logprobs(datums_D: list[types.Datum], fwd_bwd: types.ForwardBackwardOutput) -> str:
    """Where a non-finite loss came from: the sampler's logprobs sent in, or the learner's."""
    def bad(values) -> int:
        return int((~np.isfinite(np.asarray(values, dtype=np.float64))).sum())

    sampler = sum(bad(d.loss_fn_inputs["logprobs"].tolist()) for d in datums_D)
    learner = sum(bad(out["logprobs"].tolist()) for out in fwd_bwd.loss_fn_outputs if "logprobs" in out)
    return f"non-finite logprobs: {sampler} from the sampler, {learner} from the learner, over {len(datums_D)} datums"


def _logprob_gap_max(datums_D: list[types.Datum], responses_D: list[int], fwd_bwd: types.ForwardBackwardOutput
                     ) -> float | None:
    """max over the sampled tokens of |learner logprob - sampler logprob|; None when the service
    returns no per-token logprobs. Each datum's sampled tokens are its last `responses_D[d]` targets."""
    gap = 0.0
    for datum, n, out in zip(datums_D, responses_D, fwd_bwd.loss_fn_outputs, strict=True):
        if "logprobs" not in out:
            return None
        learner = np.asarray(out["logprobs"].tolist(), dtype=np.float64)[-n:]
        sampler = np.asarray(datum.loss_fn_inputs["logprobs"].tolist(), dtype=np.float64)[-n:]
        if len(learner) != n:
            return None
        gap = max(gap, float(np.max(np.abs(learner - sampler))))
    return gap


ROLLOUT_COLUMNS = [
    "step", "arm", "seed", "prompt_id", "group_id", "sample_idx", "prompt_num_tokens",
    "prompt_mean_logprob", "reward", "num_tokens", "stop_reason", "baseline", "advantage",
    "kernel_mass", "effective_neighbors", "fallback", "response",
]
# Step metrics that may be None: grad_norm and logprob_gap_max when the service does not report
# them, the rest in arms of other kinds; schemas/artifacts.py STEP_METRICS.
STEP_EXTRA_METRICS = (
    "grad_norm", "logprob_gap_max",
    "trust_admit_rate", "sequence_kl_mean", "learner_forward_seconds", "learner_forward_tokens",
    "critic_forward_seconds", "critic_forward_tokens", "critic_train_seconds", "critic_train_tokens", "critic_loss",
)


def _decode(renderer, tokens_T) -> str:
    message, _ = renderer.parse_response(list(tokens_T))
    content = message.get("content", "") if isinstance(message, dict) else ""
    return content if isinstance(content, str) else str(content)


def window_from_logs(rollout_tables: Sequence[pa.Table], arm: ArmConfig) -> KernelWindow | None:
    """The window after the logged steps (for resume), advanced step by step as the loop does."""
    window = new_window(arm)
    for table in rollout_tables:
        window = advance_window(arm, window, batch_of(table))
    return window


def train_arm(
    arm: ArmConfig,
    *,
    training_client,
    env: Env,
    renderer,
    order: Sequence[Problem],
    steps: Sequence[int],
    window: KernelWindow | None,
    on_step: Callable[[StepLog], None],
    heldout: HeldoutRequest | None = None,
    stage: str = "train",
    critic_client=None,
    nonfinite_dir: Path | None = None,
) -> None:
    """Run `steps` of `arm` in order from `window`; `on_step` persists each step's log (and
    checkpoints). Each step sees the window the previous step handed on. A step that fails
    (out of memory, a non-finite loss, a dead service) raises `ArmFailed` naming `stage`, the
    arm, the step and the cause; the steps logged before it stay, so the stage resumes."""
    total = (max(steps) + 1) if len(steps) else 0
    for step in steps:
        try:
            log = run_step(
                step, arm, training_client=training_client, env=env, renderer=renderer,
                order=order, window=window, heldout=heldout, critic_client=critic_client,
                nonfinite_dir=nonfinite_dir,
            )
        except (UserError, ArmFailed):
            raise  # already one line that says what to fix
        except Exception as exc:
            raise ArmFailed.of(stage, arm.name, exc, step + 1, total) from exc
        on_step(log)
        window = log.next_window


def eval_rows(
    sampling_client,
    *,
    env: Env,
    renderer,
    problems: Sequence[Problem],
    arm_name: str,
    max_tokens: int,
    max_in_flight: int = 512,
) -> list[dict]:
    """Greedy-decode every eval problem and grade it with the env grader.

    At most `max_in_flight` requests are in flight: each chunk is submitted whole before any of
    it is awaited, so a batching backend (the local engine) decodes a chunk as one batch (up to
    its `max_batch_rows`: 512 on CUDA, where a step of 512 rows costs little more than one of 64).
    """
    from rl.sampling import submit_all

    prompts_P = [env.build_prompt(renderer, problem) for problem in problems]
    params = types.SamplingParams(max_tokens=max_tokens, temperature=0.0, stop=env.stop_sequences(renderer), seed=0)
    backend = backend_of(sampling_client)
    responses_P = []
    for start in range(0, len(prompts_P), max_in_flight):
        futures = submit_all(sampling_client, prompts_P[start : start + max_in_flight], 1, params)
        responses_P += [resolved(future, backend=backend, call="sample (eval, greedy)", expected="a SampleResponse")
                        for future in futures]
    rows = []
    for problem, response in zip(problems, responses_P):
        tokens_T = list(response.sequences[0].tokens)
        correct, extracted = env.grade(renderer, problem, tokens_T)
        rows.append(
            {
                "item_id": problem.id,
                "arm": arm_name,
                "correct": bool(correct),
                "extracted_answer": extracted,
                "reference": problem.answer,
                "response": _decode(renderer, tokens_T),
                "num_tokens": len(tokens_T),
            }
        )
    return rows


__all__ = [
    "ArmConfig", "HeldoutRequest", "StepLog", "ROLLOUT_COLUMNS", "advance_window", "batch_of", "eval_rows",
    "new_window", "rollout_datum", "run_step", "sampling_seed", "step_advantages", "step_problems",
    "train_arm", "window_from_logs", "learner_logprobs", "critic_logprobs", "train_critic", "critic_answer_tokens",
    "STEP_EXTRA_METRICS",
]
