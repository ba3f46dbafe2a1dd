"""GSM8K: problems from the hub (`openai/gsm8k`, `main`) or a local copy, the cookbook math env.

The prompt and training reward are exactly what tinker-cookbook's math_rl GSM8K env builder
(`Gsm8kDatasetBuilder`, `convo_prefix="standard"`) produces: a `MathEnv(question, answer, renderer,
convo_prefix=MathEnv.standard_fewshot_prefix())`. Its question is the GSM8K question plus
`MathEnv.question_suffix()` (the builder never uses `Gsm8kDataset.question_suffix()`), and its
reward is `correct + 0.1 * (format_ok - 1)` with the sympy grader on the last `\\boxed{}`.

The train order for a seed is `datasets.Dataset.shuffle(seed=seed)` over the file rows, the
cookbook's own order. Prompt ids are `gsm8k/<split>/<row index in the file>`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import datasets
from tinker_cookbook.recipes.math_rl.math_env import MathEnv, extract_gsm8k_final_answer, safe_grade
from tinker_cookbook.recipes.math_rl.math_grading import extract_boxed

from rl.envs.base import CookbookProblemEnv, Problem, make_prompt_id
from schemas.errors import UserError

HF_PATH = "openai/gsm8k"
HF_CONFIG = "main"
DATA_DIR_ENV = "GS1_GSM8K_DIR"


def _read_jsonl_split(path: Path) -> list[dict]:
    """Rows of a GSM8K jsonl file; a missing file or malformed line is a UserError naming it."""
    if not path.is_file():
        raise UserError(f"{path}: no such GSM8K data file")
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                raise UserError(f"{path}:{lineno}: empty line")
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict) or not all(
                isinstance(row.get(k), str) for k in ("question", "answer")
            ):
                raise UserError(f"{path}:{lineno}: expected an object with string 'question' and 'answer'")
            rows.append(row)
    if not rows:
        raise UserError(f"{path}: no rows")
    return rows


def _hub_split(split: str) -> list[dict]:
    try:
        ds = datasets.load_dataset(HF_PATH, HF_CONFIG, split=split)
    except Exception as e:  # offline, no cache, hub error: all end the same way for the user
        raise UserError(
            f"could not load {HF_PATH} ({HF_CONFIG}/{split}) from the hub ({type(e).__name__}); "
            f"point --data-dir or {DATA_DIR_ENV} at a folder with train.jsonl and test.jsonl"
        ) from None
    return [{"question": r["question"], "answer": r["answer"]} for r in ds]


SPLITS = ("train", "test")


class Gsm8kEnv(CookbookProblemEnv):
    name = "gsm8k"

    def __init__(self, data_dir: str | Path | None = None):
        super().__init__()
        if data_dir is None and os.environ.get(DATA_DIR_ENV):
            data_dir = os.environ[DATA_DIR_ENV]
        self.data_dir = Path(data_dir) if data_dir is not None else None
        if self.data_dir is not None and not self.data_dir.is_dir():
            raise UserError(f"{self.data_dir}: GSM8K data directory not found")
        # Both splits up front: a run trains on one and is judged on the other, and a missing
        # test split would otherwise surface only at eval, after all the training.
        missing = [f"{s}.jsonl" for s in SPLITS if self.data_dir is not None and not (self.data_dir / f"{s}.jsonl").is_file()]
        if missing:
            raise UserError(f"{self.data_dir}: GSM8K data directory has no {' or '.join(missing)} (it needs train.jsonl and test.jsonl)")

    def check_data(self) -> None:
        """Read and check both split files now (`gs1 run` calls it before the flow starts): a bad
        line is one UserError naming the file and the line. Hub data is checked when loaded."""
        if self.data_dir is not None:
            for split in SPLITS:
                self._split(split)

    def source(self) -> str:
        return str(self.data_dir) if self.data_dir is not None else f"hf:{HF_PATH}/{HF_CONFIG}"

    def _load_split(self, split: str) -> list[Problem]:
        if self.data_dir is not None:
            path = self.data_dir / f"{split}.jsonl"
            rows = _read_jsonl_split(path)
            where = lambda i: f"{path}:{i + 1}"  # noqa: E731
        else:
            rows = _hub_split(split)
            where = lambda i: f"{HF_PATH} {split} row {i}"  # noqa: E731
        problems = []
        for i, row in enumerate(rows):
            try:
                answer = extract_gsm8k_final_answer(row["answer"])
            except ValueError:
                raise UserError(f"{where(i)}: answer has no '#### <final answer>' line") from None
            problems.append(Problem(make_prompt_id(self.name, split, i), row["question"], answer))
        return problems

    def cookbook_env(self, renderer, problem: Problem):
        return MathEnv(
            problem.question, problem.answer, renderer, convo_prefix=MathEnv.standard_fewshot_prefix()
        )

    def extract_answer(self, text: str) -> str | None:
        try:
            return extract_boxed(text)
        except ValueError:
            return None

    def answer_is_correct(self, extracted: str, problem: Problem) -> bool:
        # safe_grade bounds sympy with a worker-thread timeout (cookbook 0.5.8), so it is safe to
        # call from any thread, not only the main one.
        return bool(safe_grade(extracted, problem.answer))
