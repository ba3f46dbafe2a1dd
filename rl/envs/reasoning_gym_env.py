"""reasoning-gym generators as envs: offline, deterministic, verifiable benchmarks for transfer.

Each env wraps one `reasoning_gym` procedural generator. Train problems are the generator's first
`n_train` items at `seed` (default 2048; countdown 512, its generator is slow); test problems are
items at a different seed (`seed + 1_000_003`), kept only where the question text occurs neither in
train nor in the few-shot turns nor earlier in test (disjoint by content, each question once), the
first `n_test` of them. Both are fixed by the seed; a generator that cannot give `n_test` such
items is one line naming how many it gave.

Prompt: one of reasoning-gym's own system prompts (`system_prompt`, default "default": think step by
step, final answer inside `<answer>...</answer>`), then `fewshot` solved items (default none: a
question as a user turn, `<answer>answer</answer>` as the assistant's, drawn at a third seed,
`seed + 2_000_006`) for a model too small to follow the format from the instruction alone, then
the question as the user turn, rendered by the cookbook renderer through a cookbook `ProblemEnv`
(`initial_observation`). Reward: the generator's own
`score_answer` on the text inside the last `<answer>` tags (no tags: the generator scores `None`,
which is 0), with no format term, so it lies in [0, 1] and may be fractional (countdown gives
partial credit). Grade: correct when that score is 1.0.

Prompt ids: `rg_<generator>/<split>/<index>`.
"""

from __future__ import annotations

from collections.abc import Iterable

import reasoning_gym
from reasoning_gym.utils import SYSTEM_PROMPTS, extract_answer
from tinker_cookbook.rl.problem_env import ProblemEnv

from rl.envs.base import CookbookProblemEnv, Problem, make_prompt_id
from schemas.errors import UserError

# env name -> (reasoning-gym dataset name, generator config)
REASONING_GYM_ENVS: dict[str, tuple[str, dict]] = {
    "rg_basic_arithmetic": ("basic_arithmetic", {}),
    "rg_chain_sum": ("chain_sum", {}),
    "rg_gsm_symbolic": ("gsm_symbolic", {}),
    "rg_countdown": ("countdown", {}),
    "rg_lcm": ("lcm", {}),
}
TEST_SEED_OFFSET = 1_000_003
FEWSHOT_SEED_OFFSET = 2_000_006
# countdown's generator searches for a solvable target (~25 ms an item): a smaller default train set
DEFAULT_N_TRAIN = {"countdown": 512}


class ScoredProblemEnv(ProblemEnv):
    """Cookbook `ProblemEnv` whose answer score is the generator's `score_answer` (a float)."""

    def __init__(self, renderer, question: str, entry: dict, dataset, reference: str, convo_prefix: list[dict]):
        super().__init__(renderer, convo_prefix=convo_prefix, format_coef=0.0)
        self.question, self.entry, self.dataset, self.reference = question, entry, dataset, reference

    def get_question(self) -> str:
        return self.question

    def check_answer(self, sample_str: str) -> float:  # the cookbook takes float() of this
        return score_response(self.dataset, self.entry, sample_str)

    def check_format(self, sample_str: str) -> bool:
        return extract(sample_str) is not None

    def get_reference_answer(self) -> str:
        return self.reference


def extract(text: str) -> str | None:
    return extract_answer(text)


def score_response(dataset, entry: dict, text: str) -> float:
    return float(dataset.score_answer(extract(text), entry))


class ReasoningGymEnv(CookbookProblemEnv):
    """One reasoning-gym generator behind the project's Env interface (module docstring)."""

    def __init__(
        self,
        name: str,
        data_dir=None,
        *,
        seed: int = 0,
        n_train: int | None = None,
        n_test: int = 256,
        config: dict | None = None,
        system_prompt: str = "default",
        fewshot: int = 0,
    ):
        super().__init__()  # data_dir: accepted for a uniform get_env signature; nothing to read
        if name not in REASONING_GYM_ENVS:
            raise UserError(f"unknown reasoning-gym env {name!r} (known: {', '.join(REASONING_GYM_ENVS)})")
        if system_prompt not in SYSTEM_PROMPTS:
            raise UserError(f"{name}: system_prompt {system_prompt!r} is not one of reasoning-gym's "
                            f"({', '.join(SYSTEM_PROMPTS)})")
        if not 0 <= int(fewshot) <= 8:
            raise UserError(f"{name}: fewshot {fewshot} is not 0..8")
        self.name = name
        self.system_prompt, self.fewshot = system_prompt, int(fewshot)
        self.generator, default_config = REASONING_GYM_ENVS[name]
        self.config = {**default_config, **(config or {})}
        n_train = DEFAULT_N_TRAIN.get(self.generator, 2048) if n_train is None else n_train
        self.seed, self.n_train, self.n_test = int(seed), int(n_train), int(n_test)
        self._entries: dict[str, dict] = {}
        self._datasets: dict[str, object] = {}
        self._generated_items: dict[str, list[dict]] = {}

    def _dataset(self, split: str):
        if split not in self._datasets:
            if split == "train":
                size, seed = self.n_train, self.seed
            elif split == "fewshot":
                size, seed = max(self.fewshot, 1), self.seed + FEWSHOT_SEED_OFFSET
            else:  # candidates, scanned in order until n_test are kept (an item depends on its index only)
                size, seed = candidates_for(self.n_test), self.seed + TEST_SEED_OFFSET
            try:
                self._datasets[split] = reasoning_gym.create_dataset(self.generator, size=size, seed=seed, **self.config)
            except (TypeError, ValueError) as e:
                raise UserError(f"{self.name}: bad generator config ({e})") from None
        return self._datasets[split]

    def _generated(self, split: str) -> list[dict]:
        if split not in self._generated_items:
            ds = self._dataset(split)
            self._generated_items[split] = [ds[i] for i in range(len(ds))]
        return self._generated_items[split]

    def _load_split(self, split: str) -> list[Problem]:
        # (never self._split(...) here: the base class holds its lock while loading a split)
        if split == "test":
            ds = self._dataset("test")
            entries = disjoint_test_entries((ds[i] for i in range(len(ds))),
                                            self._generated("train") + self._fewshot_entries(), self.n_test)
            if len(entries) < self.n_test:
                raise UserError(f"{self.name}: n_test {self.n_test}: the generator gave only {len(entries)} test items "
                                f"whose question is in neither train nor the few-shot turns (of {len(ds)} drawn); ask "
                                f"for fewer, or a config with more distinct problems")
        else:
            entries = self._generated(split)
        problems = []
        for i, entry in enumerate(entries):
            problem = Problem(make_prompt_id(self.name, split, i), entry["question"], str(entry["answer"]))
            self._entries[problem.id] = entry
            problems.append(problem)
        return problems

    def entry(self, problem: Problem) -> dict:
        if problem.id not in self._entries:
            self.get_problem(problem.id)  # loads the split
        return self._entries[problem.id]

    def dataset_for(self, problem: Problem):
        split = problem.id.split("/")[1]
        return self._dataset(split)

    def _fewshot_entries(self) -> list[dict]:
        return self._generated("fewshot")[: self.fewshot] if self.fewshot else []

    def convo_prefix(self) -> list[dict]:
        """The turns before the question: the system prompt, then the few-shot solved items."""
        turns = [{"role": "system", "content": SYSTEM_PROMPTS[self.system_prompt]}]
        for entry in self._fewshot_entries():
            turns += [{"role": "user", "content": entry["question"]},
                      {"role": "assistant", "content": f"<answer>{entry['answer']}</answer>"}]
        return turns

    def cookbook_env(self, renderer, problem: Problem):
        return ScoredProblemEnv(renderer, problem.question, self.entry(problem), self.dataset_for(problem),
                                problem.answer, self.convo_prefix())

    def extract_answer(self, text: str) -> str | None:
        return extract(text)

    def answer_is_correct(self, extracted: str, problem: Problem) -> bool:
        return float(self.dataset_for(problem).score_answer(extracted, self.entry(problem))) >= 1.0


def candidates_for(n_test: int) -> int:
    """How many items at the test seed may be drawn to find `n_test` new questions: plenty for a
    small config whose questions repeat (an item is drawn only when reached)."""
    return 8 * n_test + 256


def disjoint_test_entries(candidates: Iterable[dict], seen: list[dict], n: int) -> list[dict]:
    """The first `n` candidates whose question text is not in `seen` nor earlier among them."""
    questions = {e["question"] for e in seen}
    kept = []
    for entry in candidates:
        if entry["question"] not in questions:
            questions.add(entry["question"])
            kept.append(entry)
            if len(kept) == n:
                break
    return kept


def make_reasoning_gym_env(name: str, data_dir=None, **kw) -> ReasoningGymEnv:
    """`rl.envs.get_env`-compatible factory: `make_reasoning_gym_env("rg_chain_sum", seed=0)`."""
    return ReasoningGymEnv(name, data_dir, **kw)
