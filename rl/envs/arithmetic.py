"""Two-operand addition: the demo env for the embedded engine on a small model.

`What is a + b? Answer with just the number.` after the cookbook arithmetic env's few-shot prefix.
Operands are 1-digit (0-9) or 2-digit (10-99), each with probability 1/2, so prompt length varies
with difficulty: that correlation is what lets a prompt-feature kernel baseline predict reward.

Problems are fixed by the seed: each digit class's (a, b) pairs are shuffled and 20% of them held
out as the test pool; test is 500 distinct pairs from that pool and train is 4096 draws (with
replacement) from the rest. Both draws weight the four digit classes (1+1, 1+2, 2+1, 2+2 digits)
equally, as far as the pool allows: test holds all 20 held-out 1+1 pairs. Train and test share no
pair. Prompt ids: `arithmetic/<split>/<index>`.

Reward and grade: 1.0 when the last integer on the first line of the response equals a + b, else
0.0 (the cookbook `ArithmeticEnv` with that answer check and no format term).
"""

from __future__ import annotations

import numpy as np
from tinker_cookbook.recipes.math_rl.arithmetic_env import ArithmeticEnv as CookbookArithmeticEnv
from tinker_cookbook.recipes.math_rl.arithmetic_env import _extract_final_int

from rl.envs.base import CookbookProblemEnv, Problem, make_prompt_id

QUESTION_SUFFIX = " Answer with just the number."
DIGIT_RANGES = {1: (0, 10), 2: (10, 100)}  # [low, high) of an operand with that many digits
TEST_POOL_FRACTION = 0.2


def _first_line_int(text: str) -> int | None:
    lines = text.strip().splitlines()
    return _extract_final_int(lines[0]) if lines else None


class InstructedArithmeticEnv(CookbookArithmeticEnv):
    """Cookbook `ArithmeticEnv` asking for just the number, checked on the first line."""

    def get_question(self) -> str:
        return super().get_question() + QUESTION_SUFFIX

    def check_answer(self, sample_str: str) -> bool:
        return _first_line_int(sample_str) == self.x + self.y


ALL_CLASSES = tuple((da, db) for da in DIGIT_RANGES for db in DIGIT_RANGES)


def generate_pairs(seed: int, n_train: int, n_test: int,
                   classes: tuple[tuple[int, int], ...] = ALL_CLASSES) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Deterministic, disjoint (train, test) operand pairs; see the module docstring."""
    rng = np.random.default_rng(seed)
    classes = [tuple(c) for c in classes]
    train_pool: list[tuple[int, int]] = []
    test_pool: list[tuple[int, int]] = []
    train_w: list[float] = []
    test_w: list[float] = []
    for da, db in classes:
        (alo, ahi), (blo, bhi) = DIGIT_RANGES[da], DIGIT_RANGES[db]
        pairs = [(a, b) for a in range(alo, ahi) for b in range(blo, bhi)]
        order = rng.permutation(len(pairs))
        n_held = max(1, int(round(TEST_POOL_FRACTION * len(pairs))))
        held = [pairs[i] for i in order[:n_held]]
        rest = [pairs[i] for i in order[n_held:]]
        test_pool += held
        train_pool += rest
        # each class gets total weight 1/len(classes), spread evenly over its pairs
        test_w += [1.0 / (len(classes) * len(held))] * len(held)
        train_w += [1.0 / (len(classes) * len(rest))] * len(rest)
    if n_test > len(test_pool):
        raise ValueError(f"n_test={n_test} exceeds the {len(test_pool)} held-out pairs")
    test_idx = rng.choice(len(test_pool), size=n_test, replace=False, p=np.asarray(test_w))
    train_idx = rng.choice(len(train_pool), size=n_train, replace=True, p=np.asarray(train_w))
    return [train_pool[i] for i in train_idx], [test_pool[i] for i in test_idx]


class ArithmeticEnv(CookbookProblemEnv):
    name = "arithmetic"

    def __init__(self, data_dir=None, *, seed: int = 0, n_train: int = 4096, n_test: int = 500,
                 operand_digits: list[list[int]] | None = None, system_prompt: str | None = None,
                 fewshot: bool = True):
        """`operand_digits` restricts the digit classes (e.g. [[1, 1], [1, 2]]); `system_prompt`
        opens the conversation (a small model may need its own); `fewshot` keeps the cookbook's
        one-shot example."""
        super().__init__()  # data_dir is accepted for a uniform get_env signature; nothing to read
        self.seed, self.n_train, self.n_test = seed, n_train, n_test
        self.classes = tuple(tuple(c) for c in operand_digits) if operand_digits else ALL_CLASSES
        bad = [c for c in self.classes if len(c) != 2 or any(d not in DIGIT_RANGES for d in c)]
        if bad:
            raise ValueError(f"operand_digits: each class is [digits_a, digits_b] with digits in 1..2, got {bad}")
        self.system_prompt, self.fewshot = system_prompt, fewshot
        self._operands: dict[str, tuple[int, int]] = {}

    def _load_split(self, split: str) -> list[Problem]:
        train, test = generate_pairs(self.seed, self.n_train, self.n_test, self.classes)
        problems = []
        for i, (a, b) in enumerate(train if split == "train" else test):
            problem = Problem(make_prompt_id(self.name, split, i), f"What is {a} + {b}?", str(a + b))
            self._operands[problem.id] = (a, b)
            problems.append(problem)
        return problems

    def operands(self, problem: Problem) -> tuple[int, int]:
        if problem.id not in self._operands:
            self.get_problem(problem.id)  # loads the split
        return self._operands[problem.id]

    def cookbook_env(self, renderer, problem: Problem):
        a, b = self.operands(problem)
        return InstructedArithmeticEnv(
            a,
            b,
            renderer,
            convo_prefix=self.convo_prefix(),
            format_coef=0.0,  # reward is exactly 1.0 (correct) or 0.0
        )

    def convo_prefix(self) -> list:
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return system + (CookbookArithmeticEnv.standard_fewshot_prefix() if self.fewshot else [])

    def extract_answer(self, text: str) -> str | None:
        value = _first_line_int(text)
        return None if value is None else str(value)

    def answer_is_correct(self, extracted: str, problem: Problem) -> bool:
        return int(extracted) == int(problem.answer)
