"""One RL arm, top to bottom: sample -> grade -> estimator inputs -> advantages -> datums -> train
-> after the step -> log.

Written in the style of tinker-cookbook's `recipes/rl_loop.py`: every sample future of a step is
submitted before any is awaited, datums are built in plain sight, and lists carry their
dimensions in their names:

    _P  prompts of the step          _G  rollouts of one prompt (the arm's group size)
    _B  rollouts of the step (P*G)   _T  tokens             _D  datums sent to forward_backward

The loop never knows which backend it talks to: `service_client` is the real `tinker`
ServiceClient or the embedded local engine, both returning futures of real `tinker.types`. Nor
does it know which kind of arm it runs: it asks the arm's Estimator (`arm.estimator`, from
`estimators.registry`) what the step needs (`needs`: a learner forward, a critic, the window)
and for the advantages. The loop alone owns the window: `step_advantages` (the arm's advantage
step, the function the correctness preflight drives) computes a step's advantages against the
window of earlier rollouts and hands back the window of the next step, into which this step's
rollouts entered exactly once. Per-step logs go to `<arm_dir>/steps/step-NNNNN.{rollouts,metrics}.parquet`;
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

from design.arm import ArmConfig
from estimators import CRITIC, LEARNER_LOGPROBS, KernelWindow, StepAdvantages, StepBatch
from rl.backends.responses import backend_of, loss_sum, prompt_mean_logprob_of, resolved
from rl.envs.base import Env, Problem
from rl.step_inputs import critic_answer_tokens, critic_logprobs, learner_logprobs, train_critic
from schemas.artifacts import STEP_EXTRA_METRICS, RolloutRow, rollout_columns, write_artifact
from schemas.cost import StepCost
from schemas.errors import ArmFailed, NonFiniteStep, UserError
from schemas.io import write_json_atomic
from schemas.layout import NONFINITE_STEP_FILE as STEP_FILE



@dataclass
class StepLog:
    """What one step produced: one row per rollout, one row of step metrics, and the window the
    next step sees (None for a kind without one)."""

    rollouts: list[RolloutRow]
    metrics: dict[str, float]
    next_window: KernelWindow | None = None
    cost: StepCost | None = None

    def rollout_columns(self) -> dict[str, list]:
        return rollout_columns(self.rollouts)


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


# ---------------------------------------------------------------------------- the advantage step


def new_window(arm: ArmConfig) -> KernelWindow | None:
    """The empty window of an arm's first step; None for a kind that reads no window."""
    return arm.estimator.new_window(arm.recipe)


def advance_window(arm: ArmConfig, window: KernelWindow | None, batch: StepBatch) -> KernelWindow | None:
    """The window after `batch`'s step: the one place a step's rollouts enter the window."""
    return None if window is None else arm.estimator.advance_window(arm.recipe, window, batch)


def step_advantages(arm: ArmConfig, batch: StepBatch, window: KernelWindow | None) -> tuple[StepAdvantages, KernelWindow | None]:
    """The arm's advantage step as training runs it: this step's advantages against the window of
    earlier rollouts (the arm's Estimator), and the window of the next step."""
    return arm.estimator.advantages(arm.recipe, batch, window), advance_window(arm, window, batch)


def batch_of(rows) -> StepBatch:
    """A step's StepBatch from its rollout rows (a column dict, a list of RolloutRow, or a rollouts table)."""
    if isinstance(rows, list):
        rows = rollout_columns(rows)

    def values(name):
        if isinstance(rows, dict):
            return rows.get(name)
        return rows.column(name).to_pylist() if name in rows.column_names else None

    def column(name, dtype):
        return np.asarray(values(name), dtype=dtype)

    def optional(name):  # a kind's own input: absent (or null) for the other kinds
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


# ---------------------------------------------------------------------------- one step, in parts


@dataclass(frozen=True)
class Graded:
    """A step's rollouts, sampled and graded, in rollout order (prompt-major)."""

    rows_B: list[RolloutRow]
    prompts_B: list[types.ModelInput]
    tokens_B_T: list[list[int]]
    logprobs_B_T: list[list[float]]
    sampler_tokens: int  # every token the sampler prefilled or generated for them

    @property
    def rewards_B(self) -> list[float]:
        return [row.reward for row in self.rows_B]


@dataclass(frozen=True)
class Trained:
    """The policy's update: its loss, what was sent, and what the service reported."""

    loss: float = 0.0
    datums_D: tuple[types.Datum, ...] = ()
    grad_norm: float | None = None
    logprob_gap_max: float | None = None
    seconds: float = 0.0

    @property
    def calls(self) -> int:
        return 2 if self.datums_D else 0  # forward_backward + optim_step

    @property
    def tokens(self) -> int:
        return sum(d.model_input.length for d in self.datums_D)


def sample_params(arm: ArmConfig, stop, seed: int) -> types.SamplingParams:
    return types.SamplingParams(max_tokens=arm.max_tokens, temperature=arm.temperature, stop=stop, seed=seed)


def submit_samples(sampling_client, arm: ArmConfig, step: int, prompts_P, stop) -> list:
    """Every rollout request of the step, submitted before any is awaited; each also returns its
    prompt's logprobs under the sampling policy (the kernel's feature, measured before the rollout)."""
    return [sampling_client.sample(prompt=prompt, num_samples=arm.group_size,
                                   sampling_params=sample_params(arm, stop, sampling_seed(arm.seed, step, p)),
                                   include_prompt_logprobs=True)
            for p, prompt in enumerate(prompts_P)]


def submit_heldout(sampling_client, arm: ArmConfig, step: int, problems_P, prompts_P, stop, heldout: HeldoutRequest | None
                   ) -> list[tuple[Problem, object]]:
    """The held-out samples still wanted, of the step's first prompts (never trained on)."""
    if heldout is None:
        return []
    wanted = min(len(prompts_P), heldout.num_prompts - len({r["prompt_id"] for r in heldout.rows}))
    return [(problems_P[p], sampling_client.sample(prompt=prompts_P[p], num_samples=heldout.num_samples,
                                                  sampling_params=sample_params(arm, stop, sampling_seed(arm.seed + 1_000_003, step, p))))
            for p in range(wanted)]


def grade(step: int, arm: ArmConfig, env: Env, renderer, problems_P, prompts_P, sample_futures_P, backend: str) -> Graded:
    """Await each prompt's samples, grade every rollout with the env, and build its row."""
    rows_B, prompts_B, tokens_B_T, logprobs_B_T = [], [], [], []
    sampler_tokens = 0
    for p, (problem, prompt, future) in enumerate(zip(problems_P, prompts_P, sample_futures_P)):
        response = resolved(future, backend=backend, call="sample", expected="a SampleResponse")
        mean_lp = prompt_mean_logprob_of(response.prompt_logprobs, prompt.length, backend=backend,
                                         call="sample(include_prompt_logprobs=True)")
        sampler_tokens += prompt.length + sum(len(sequence.tokens) for sequence in response.sequences)
        for g, sequence in enumerate(response.sequences):
            tokens_T = list(sequence.tokens)
            rows_B.append(RolloutRow.sampled(
                step=step, arm=arm.name, seed=arm.seed, prompt_id=problem.id, group_id=p, sample_idx=g,
                prompt_num_tokens=prompt.length, prompt_mean_logprob=mean_lp,
                reward=float(env.reward(renderer, problem, tokens_T)), num_tokens=len(tokens_T),
                stop_reason=str(sequence.stop_reason), response=_decode(renderer, tokens_T)))
            prompts_B.append(prompt)
            tokens_B_T.append(tokens_T)
            logprobs_B_T.append(list(sequence.logprobs or []))
    return Graded(rows_B, prompts_B, tokens_B_T, logprobs_B_T, sampler_tokens)


def estimator_inputs(arm: ArmConfig, graded: Graded, prompts_P, *, training_client, critic_client, renderer,
                     extra: dict) -> Graded:
    """What the arm's kind needs besides the rewards, measured on the weights this step updates
    (the learner's token logprobs; the critic's yes/no logprobs per prompt), written into the
    rows; its cost into `extra`."""
    needs, rows_B = arm.estimator.needs, graded.rows_B
    if LEARNER_LOGPROBS in needs:
        t0 = time.time()
        learner_B_T, tokens = learner_logprobs(training_client, graded.prompts_B, graded.tokens_B_T)
        extra.update(learner_forward_seconds=time.time() - t0, learner_forward_tokens=tokens)
        rows_B = [row.with_columns(sampler_logprobs=[float(x) for x in sampler_T], learner_logprobs=[float(x) for x in learner_T])
                  for row, sampler_T, learner_T in zip(rows_B, graded.logprobs_B_T, learner_B_T)]
    if CRITIC in needs:  # its value of each prompt, before this step's rewards train it
        question_T, yes, no = critic_answer_tokens(renderer.tokenizer, arm.critic)
        t0 = time.time()
        yes_P, no_P, tokens = critic_logprobs(critic_client, prompts_P, question_T, yes, no)
        extra.update(critic_forward_seconds=time.time() - t0, critic_forward_tokens=tokens)
        rows_B = [row.with_columns(critic_yes_logprob=float(yes_P[row.group_id]), critic_no_logprob=float(no_P[row.group_id]))
                  for row in rows_B]
    return Graded(rows_B, graded.prompts_B, graded.tokens_B_T, graded.logprobs_B_T, graded.sampler_tokens)


def with_advantages(rows_B: list[RolloutRow], advantages: StepAdvantages) -> list[RolloutRow]:
    """The rows with the step's baselines, advantages and the kind's own columns."""
    columns = {name: np.asarray(values) for name, values in advantages.logged().items()}
    return [row.with_columns(**{name: values[b].item() for name, values in columns.items()})
            for b, row in enumerate(rows_B)]


def step_datums(graded: Graded, advantages: StepAdvantages) -> tuple[list[int], list[types.Datum]]:
    """(which rollout each datum is, the datums). A rollout whose datum advantage is zero carries
    no gradient and is not sent (as in the cookbook, which drops constant-reward groups)."""
    datum_advantage_B = advantages.datum_advantage
    sent_D = [b for b in range(len(graded.rows_B)) if datum_advantage_B[b] != 0.0 and len(graded.tokens_B_T[b]) > 0]
    datums_D = [rollout_datum(graded.prompts_B[b], graded.tokens_B_T[b], graded.logprobs_B_T[b], datum_advantage_B[b])
                for b in sent_D]
    return sent_D, datums_D


def train(training_client, arm: ArmConfig, datums_D: list[types.Datum], responses_D: list[int], backend: str,
          on_nonfinite: Callable) -> Trained:
    """One forward_backward and one optim_step of the policy on the datums (both submitted before
    either is awaited); `responses_D`: each datum's sampled tokens. A forward_backward the local
    engine finds non-finite is handed to `on_nonfinite` (nothing was applied)."""
    t0 = time.time()
    if not datums_D:
        return Trained()
    fwd_bwd_future = training_client.forward_backward(datums_D, loss_fn="importance_sampling")
    optim_future = training_client.optim_step(types.AdamParams(learning_rate=arm.lr, beta1=arm.beta1, beta2=arm.beta2, eps=arm.eps))
    try:
        fwd_bwd = resolved(fwd_bwd_future, backend=backend, call="forward_backward", expected="a ForwardBackwardOutput")
    except NonFiniteStep as bad:  # the local engine applied nothing and dumped the call
        raise on_nonfinite(bad) from None
    loss = loss_sum(fwd_bwd, backend=backend)
    # How far the learner's logprobs of the sampled tokens are from the sampler's: ~0 on one
    # fresh batch; a growing gap is the first sign of a sampler / learner mismatch.
    gap = _logprob_gap_max(datums_D, responses_D, fwd_bwd)
    try:
        optim = resolved(optim_future, backend=backend, call="optim_step", expected="an OptimStepResponse")
    except FloatingPointError as e:  # the local engine refuses a non-finite update (weights kept)
        raise FloatingPointError(f"{e}; the training loss was {loss} ({_non_finite_logprobs(datums_D, fwd_bwd)})") from None
    grad_norm = (getattr(optim, "metrics", None) or {}).get("optim/grad_norm")
    if not math.isfinite(loss):
        # the optimizer step already applied it: the adapter is no longer trustworthy
        raise FloatingPointError(f"the training loss is {loss} (forward_backward; {_non_finite_logprobs(datums_D, fwd_bwd)})")
    return Trained(loss, tuple(datums_D), None if grad_norm is None else float(grad_norm), gap, time.time() - t0)


def after_step(arm: ArmConfig, graded: Graded, *, critic_client, renderer, extra: dict) -> None:
    """What the arm's kind does once the policy has stepped: a critic learns this step's (prompt,
    reward) pairs, after they were used."""
    if CRITIC in arm.estimator.needs:
        question_T, yes, no = critic_answer_tokens(renderer.tokenizer, arm.critic)
        t0 = time.time()
        loss, tokens = train_critic(critic_client, arm.critic, graded.prompts_B, graded.rewards_B, question_T, yes, no, arm)
        extra.update(critic_train_seconds=time.time() - t0, critic_train_tokens=tokens, critic_loss=loss)


def collect_heldout(heldout: HeldoutRequest | None, futures, prompts_P, env: Env, renderer, backend: str) -> int:
    """Grade the held-out samples into `heldout.rows`. Returns the sampler tokens they cost."""
    tokens = 0
    for p, (problem, future) in enumerate(futures):  # held-out request p samples prompt p
        held = resolved(future, backend=backend, call="sample (held-out)", expected="a SampleResponse")
        tokens += prompts_P[p].length + sum(len(seq.tokens) for seq in held.sequences)
        for k, sequence in enumerate(held.sequences):
            heldout.rows.append({"prompt_id": problem.id, "sample_idx": k,
                                 "reward": float(env.reward(renderer, problem, list(sequence.tokens)))})
    return tokens


def step_metrics(step: int, arm: ArmConfig, rows_B: list[RolloutRow], advantages: StepAdvantages, trained: Trained,
                 graded: Graded, times: dict[str, float], extra: dict) -> dict:
    """The step's row of STEP_METRICS."""
    rewards = np.asarray(graded.rewards_B, dtype=np.float64)
    adv = np.asarray(advantages.advantage, dtype=np.float64)
    eff = advantages.effective_neighbors
    now = time.time()
    return {
        "step": step, "arm": arm.name, "seed": arm.seed,
        "reward_mean": float(rewards.mean()), "reward_std": float(rewards.std()),
        "advantage_abs_mean": float(np.abs(adv).mean()),
        "frac_nonzero_advantage": float((np.abs(adv) > 1e-6).mean()),
        "baseline_mean": float(np.mean([row.baseline for row in rows_B])),
        "loss": trained.loss, "num_datums": len(trained.datums_D),
        "num_tokens": int(sum(len(t) for t in graded.tokens_B_T)),
        "effective_neighbors_p10": None if eff is None else float(np.percentile(np.asarray(eff, dtype=np.float64), 10)),
        "sample_seconds": times["sampled"] - times["start"], "train_seconds": trained.seconds,
        "step_seconds": now - times["start"], "wall_time": now,
        **extra, "grad_norm": trained.grad_norm, "logprob_gap_max": trained.logprob_gap_max,
        **arm.estimator.step_metrics(advantages),
    }


def step_cost(step: int, arm: ArmConfig, metrics: dict, trained: Trained, sampler_tokens: int, requests: int, extra: dict
              ) -> StepCost:
    """The step's cost: every request to the service and every token the sampler and trainer saw.
    Trainer work includes a learner forward and a critic's forward and training; the critic's
    part is also given on its own."""
    trainer_tokens = trained.tokens + (extra["learner_forward_tokens"] or 0)
    model_calls = requests + trained.calls + (1 if extra["learner_forward_tokens"] is not None else 0)
    critic = {}
    if extra["critic_forward_tokens"] is not None:
        critic = {"critic_seconds": extra["critic_forward_seconds"] + extra["critic_train_seconds"],
                  "critic_tokens": extra["critic_forward_tokens"] + extra["critic_train_tokens"],
                  "critic_calls": 3}  # forward; forward_backward + optim_step
        trainer_tokens += critic["critic_tokens"]
        model_calls += critic["critic_calls"]
    return StepCost(step=step, arm=arm.name, seed=arm.seed, wall_seconds=metrics["step_seconds"],
                    sample_seconds=metrics["sample_seconds"], train_seconds=metrics["train_seconds"],
                    sampler_tokens=sampler_tokens, trainer_tokens=trainer_tokens, model_calls=model_calls, **critic)


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

    A kind that needs a critic also takes `critic_client` (its value model's LoRA training client).
    A forward_backward the local engine finds non-finite leaves its reproducer under
    `nonfinite_dir` (`kept_nonfinite`)."""
    if (CRITIC in arm.estimator.needs) != (critic_client is not None):
        raise ValueError(f"arm {arm.name}: a critic client goes with, and only with, a kind that needs a critic")
    times = {"start": time.time()}
    backend = backend_of(training_client)
    sampling_client = resolved(training_client.save_weights_and_get_sampling_client(), backend=backend,
                               call="save_weights_and_get_sampling_client", expected="a sampling client")
    problems_P = step_problems(order, arm, step)
    prompts_P = [env.build_prompt(renderer, problem) for problem in problems_P]
    stop = env.stop_sequences(renderer)
    extra: dict[str, float | None] = dict.fromkeys(STEP_EXTRA_METRICS)

    sample_futures_P = submit_samples(sampling_client, arm, step, prompts_P, stop)
    heldout_futures = submit_heldout(sampling_client, arm, step, problems_P, prompts_P, stop, heldout)
    graded = grade(step, arm, env, renderer, problems_P, prompts_P, sample_futures_P, backend)
    times["sampled"] = time.time()
    graded = estimator_inputs(arm, graded, prompts_P, training_client=training_client, critic_client=critic_client,
                              renderer=renderer, extra=extra)
    advantages, next_window = step_advantages(arm, batch_of(graded.rows_B), window)
    rows_B = with_advantages(graded.rows_B, advantages)
    sent_D, datums_D = step_datums(graded, advantages)
    trained = train(training_client, arm, datums_D, [len(graded.tokens_B_T[b]) for b in sent_D], backend,
                    on_nonfinite=lambda bad: kept_nonfinite(bad, nonfinite_dir, arm, step, rows_B, sent_D))
    after_step(arm, graded, critic_client=critic_client, renderer=renderer, extra=extra)
    sampler_tokens = graded.sampler_tokens + collect_heldout(heldout, heldout_futures, prompts_P, env, renderer, backend)

    metrics = step_metrics(step, arm, rows_B, advantages, trained, graded, times, extra)
    requests = 1 + len(sample_futures_P) + len(heldout_futures)  # 1: the sampler refresh above
    cost = step_cost(step, arm, metrics, trained, sampler_tokens, requests, extra)
    return StepLog(rollouts=rows_B, metrics=metrics, next_window=next_window, cost=cost)


def kept_nonfinite(bad: NonFiniteStep, nonfinite_dir: Path | None, arm: ArmConfig, step: int, rows: list[RolloutRow],
                   sent_D: list[int]) -> NonFiniteStep:
    """The engine's dump moved to `<nonfinite_dir>/<step + 1>/` (the run directory's), with the
    step's rollouts (the rollouts log of a step, as any step writes it) and which rollout each datum
    is; the finding, naming that rollout and its prompt, with the dump's new path."""
    note = ""
    if bad.datum is not None and bad.datum < len(sent_D):
        b = sent_D[bad.datum]
        note = f" (rollout {b}, prompt {rows[b].prompt_id})"
    if nonfinite_dir is None:
        return bad.moved(bad.dump, note)
    target = Path(nonfinite_dir) / str(step + 1)
    if target.exists():  # the same step failed before this resume: keep the newest
        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(bad.dump, target)
    write_artifact("rollouts", [row.as_dict() for row in rows], target / "rollouts.parquet")
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
    "ArmConfig", "HeldoutRequest", "StepLog", "advance_window", "batch_of", "eval_rows",
    "new_window", "rollout_datum", "run_step", "sampling_seed", "step_advantages", "step_problems",
    "train_arm", "window_from_logs", "learner_logprobs", "critic_logprobs", "train_critic", "critic_answer_tokens",
]
