"""Text statistics of a problem: cheap prompt-level features for the kernel hill-climb.

`text_features(question, answer)` reads only the problem (its question and reference answer),
never a response, so every value is fixed before sampling and is the same for all K samples of a
prompt. A baseline built from them is action-independent and leaves the policy gradient unbiased.
They need no model call: a Tinker client (or any trainer) holds the question to build the prompt
and the reference answer to compute the reward, so it can compute all of them with this function
at sampling time. The policy never sees the answer; only the baseline does.

| column | value |
|---|---|
| `text_question_log_chars` | log(1 + characters in the question) |
| `text_question_numbers` | how many numbers the question contains |
| `text_question_log_max_number` | log(1 + largest absolute number in the question); 0 if none |
| `text_answer_is_number` | 1 if the whole answer is one number, else 0 (also 0 with no answer) |
| `text_answer_log_magnitude` | log(1 + abs(answer)) when the answer is a number, else 0 |
| `text_answer_log_chars` | log(1 + characters in the answer); 0 with no answer |

The answer is read with surrounding whitespace stripped.

Numbers (`NUMBER`): an optional minus sign, digits with optional thousands commas ("1,234"), an
optional decimal part ("3.5"). A minus right after a word character or ")" is subtraction
("5-3" holds 5 and 3), elsewhere it is a sign ("x = -5").
"""

from __future__ import annotations

import math
import re
from decimal import Decimal

NUMBER = re.compile(r"(?:(?<![\w)])-)?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?")


def text_features(question: str, answer: str | None) -> dict[str, float]:
    """The `text_*` columns of one problem (module docstring); deterministic and always finite."""
    numbers = NUMBER.findall(question)
    answer = (answer or "").strip()
    answer_number = answer if NUMBER.fullmatch(answer) else None
    return {
        "text_question_log_chars": math.log1p(len(question)),
        "text_question_numbers": float(len(numbers)),
        "text_question_log_max_number": max((_log1p_abs(n) for n in numbers), default=0.0),
        "text_answer_is_number": float(answer_number is not None),
        "text_answer_log_magnitude": _log1p_abs(answer_number) if answer_number is not None else 0.0,
        "text_answer_log_chars": math.log1p(len(answer)),
    }


def _log1p_abs(number: str) -> float:
    """log(1 + |number|) of a NUMBER match, finite even past the float range (a 400-digit integer)."""
    digits = number.replace(",", "")
    x = abs(float(digits))
    if math.isfinite(x):
        return math.log1p(x)
    return float(Decimal(digits).copy_abs().ln())  # log1p(x) == log(x) at this size
