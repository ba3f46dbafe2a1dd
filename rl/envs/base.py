"""The env interface the RL loop and eval use, and the shared cookbook-backed implementation.

An env owns a benchmark's problems (file order and the seed-shuffled train order), its prompt, its
training reward and its eval grade. Prompts and rewards come from a tinker-cookbook `ProblemEnv`
(its `initial_observation` and `step`), so they are the cookbook's own, not a re-implementation.

Prompt ids: `<env>/<split>/<index>`, where index is the problem's position in the split's file
order (for GSM8K, the row index in the jsonl file). `make_prompt_id` / `parse_prompt_id`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from abc import ABC, abstractmethod
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

if TYPE_CHECKING:  # tinker is heavy to import; only the annotations name it
    import tinker


T = TypeVar("T")

SPLITS = ("train", "test")


@dataclass(frozen=True)
class Problem:
    id: str  # stable, e.g. "gsm8k/train/17"
    question: str
    answer: str  # reference final answer


@runtime_checkable
class Env(Protocol):
    name: str

    def check_data(self) -> None: ...  # read and check its data files before a run (UserError naming file and line)

    def train_problems(self) -> list[Problem]: ...  # file order

    def test_problems(self) -> list[Problem]: ...

    def train_order(self, seed: int = 0) -> list[Problem]: ...  # the seed-shuffled order shared by arms

    def build_prompt(self, renderer, problem: Problem) -> tinker.ModelInput: ...

    def stop_sequences(self, renderer) -> list[str] | list[int]: ...

    def reward(self, renderer, problem: Problem, response_tokens: list[int]) -> float: ...

    def grade(self, renderer, problem: Problem, response_tokens: list[int]) -> tuple[bool, str]: ...


def make_prompt_id(env: str, split: str, index: int) -> str:
    return f"{env}/{split}/{index}"


def parse_prompt_id(prompt_id: str) -> tuple[str, str, int]:
    """`"gsm8k/train/17"` -> `("gsm8k", "train", 17)`; anything else is a ValueError."""
    parts = prompt_id.split("/")
    if len(parts) != 3 or parts[1] not in SPLITS or not parts[2].isdigit():
        raise ValueError(f"not a prompt id (<env>/<split>/<index>): {prompt_id!r}")
    return parts[0], parts[1], int(parts[2])


def seeded_order(n: int, seed: int) -> list[int]:
    """The permutation `datasets.Dataset.shuffle(seed=seed)` applies to `n` rows.

    This is how the cookbook's RL datasets (e.g. `Gsm8kDataset`) order their train split, so a
    problem list put in this order matches the cookbook's order for the same file rows.
    """
    import datasets  # here, not at the top: every env module imports base, and datasets is slow to import

    return list(datasets.Dataset.from_dict({"i": list(range(n))}).shuffle(seed=seed)["i"])


def run_coroutine(coro: Coroutine[Any, Any, T]) -> T:
    """Run a cookbook coroutine to completion from sync code, on any thread.

    With no event loop running in this thread, `asyncio.run`; inside a running loop (an async
    caller), a helper thread with its own loop, since the loop here cannot be re-entered.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()


def response_text(renderer, response_tokens: Sequence[int]) -> str:
    """The text content of a sampled response as the renderer parses it (stop token stripped)."""
    from tinker_cookbook import renderers  # here: the renderers are slow to import and base is always imported

    message, _termination = renderer.parse_response(list(response_tokens))
    return renderers.get_text_content(message)


class CookbookProblemEnv(ABC):
    """An `Env` whose prompts and training reward are those of a tinker-cookbook `ProblemEnv`.

    Subclasses load their problems (`_load_split`), build the cookbook env for one problem
    (`cookbook_env`) and say how eval extracts and checks an answer (`extract_answer`,
    `answer_is_correct`).
    """

    name: str

    def __init__(self) -> None:
        self._splits: dict[str, list[Problem]] = {}
        self._orders: dict[int, list[Problem]] = {}
        self._lock = threading.Lock()

    # -- problems ---------------------------------------------------------------------------

    @abstractmethod
    def _load_split(self, split: str) -> list[Problem]:
        """All problems of `split` in file order, ids `make_prompt_id(name, split, index)`."""

    def check_data(self) -> None:
        """Check the env's data files before a run starts (a file-backed env reads them); the
        default has none to check."""

    def _split(self, split: str) -> list[Problem]:
        with self._lock:
            if split not in self._splits:
                self._splits[split] = self._load_split(split)
            return self._splits[split]

    def train_problems(self) -> list[Problem]:
        return list(self._split("train"))

    def test_problems(self) -> list[Problem]:
        return list(self._split("test"))

    def train_order(self, seed: int = 0) -> list[Problem]:
        problems = self._split("train")
        with self._lock:
            if seed not in self._orders:
                self._orders[seed] = [problems[i] for i in seeded_order(len(problems), seed)]
            return list(self._orders[seed])

    def get_problem(self, prompt_id: str) -> Problem:
        env, split, index = parse_prompt_id(prompt_id)
        problems = self._split(split)
        if env != self.name or index >= len(problems):
            raise KeyError(prompt_id)
        return problems[index]

    # -- prompt and reward: the cookbook env's own ------------------------------------------

    @abstractmethod
    def cookbook_env(self, renderer, problem: Problem):
        """The tinker-cookbook `ProblemEnv` for one problem (prompt and reward come from it)."""

    def build_prompt(self, renderer, problem: Problem) -> tinker.ModelInput:
        model_input, _stop = run_coroutine(self.cookbook_env(renderer, problem).initial_observation())
        return model_input

    def stop_sequences(self, renderer) -> list[str] | list[int]:
        return renderer.get_stop_sequences()

    def reward(self, renderer, problem: Problem, response_tokens: list[int]) -> float:
        step = run_coroutine(self.cookbook_env(renderer, problem).step(list(response_tokens)))
        return float(step.reward)

    # -- eval grade -------------------------------------------------------------------------

    @abstractmethod
    def extract_answer(self, text: str) -> str | None:
        """The final answer in a response's text, or None when there is none."""

    @abstractmethod
    def answer_is_correct(self, extracted: str, problem: Problem) -> bool: ...

    def grade(self, renderer, problem: Problem, response_tokens: list[int]) -> tuple[bool, str]:
        extracted = self.extract_answer(response_text(renderer, response_tokens))
        if extracted is None:
            return False, ""
        return bool(self.answer_is_correct(extracted, problem)), extracted

