"""Field problems found by one model-level check, each at a path relative to the model.

A pydantic model validator raises `FieldProblems` to report several problems at once; the spec's
error formatter (`schemas.spec.spec_problems`) prints each as its own `field.path: reason` line.
"""

from __future__ import annotations


class FieldProblems(ValueError):
    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        super().__init__("; ".join(f"{p}: {m}" if p else m for p, m in problems))
