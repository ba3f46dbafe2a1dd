"""What an arm kind may need from a step besides the graded rollouts (`Estimator.needs`), measured
through the clients on the weights the step updates:

- LEARNER_LOGPROBS: the training client's forward pass, the learner's logprob of every sampled token;
- CRITIC: a value model (a second LoRA client): its log P(yes) / log P(no) after each prompt and
  a fixed question before the advantages, and one Adam step on the step's rewards after them.

The loop and the correctness preflight call these; an estimator only reads what they measured.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from tinker import types
from tinker.types.tensor_data import TensorData

from estimators.critic import CriticSpec, critic_targets
from rl.backends.responses import backend_of, resolved


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
        outputs_D = resolved(training_client.forward(datums_D, loss_fn="cross_entropy"), backend=backend_of(training_client),
                             call="forward", expected="a ForwardBackwardOutput").loss_fn_outputs
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
    outputs_D = resolved(critic_client.forward(datums_D, loss_fn="cross_entropy"), backend=backend_of(critic_client),
                         call="forward (critic)", expected="a ForwardBackwardOutput").loss_fn_outputs
    last_D = np.asarray([float(np.asarray(o["logprobs"].tolist()).reshape(-1)[-1]) for o in outputs_D])
    return last_D[0::2], last_D[1::2], sum(d.model_input.length for d in datums_D)


def train_critic(critic_client, critic: CriticSpec, prompts_B: Sequence[types.ModelInput], rewards_B, question_T,
                 yes: int, no: int, arm) -> tuple[float, int]:
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
    backend = backend_of(critic_client)
    loss = float(resolved(fwd_bwd_future, backend=backend, call="forward_backward (critic)",
                          expected="a ForwardBackwardOutput").metrics.get("loss:sum", float("nan")))
    resolved(optim_future, backend=backend, call="optim_step (critic)", expected="an OptimStepResponse")
    return loss, sum(d.model_input.length for d in datums_D)
