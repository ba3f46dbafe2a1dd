"""argparse `type=` converters whose errors read `--flag: not a number: 'x'` / `must be ...`."""

from __future__ import annotations

import argparse
import math
from typing import Callable, TypeVar

T = TypeVar("T")


def checked(parse: Callable[[str], T], ok: Callable[[T], bool], requirement: str,
            noun: str = "a number") -> Callable[[str], T]:
    """A converter: `parse(text)` (a ValueError is 'not <noun>'), then `ok(value)` or 'must be <requirement>'."""

    def convert(text: str) -> T:
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {noun}: {text!r}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"must be {requirement}, got {text!r}")
        return value

    return convert


positive_float = checked(float, lambda v: v > 0 and math.isfinite(v), "a finite number > 0")
positive_int = checked(int, lambda v: v >= 1, ">= 1", noun="an integer")
finite_float = checked(float, math.isfinite, "finite")
