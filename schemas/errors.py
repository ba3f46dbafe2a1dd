"""Every exception type of the project, at the bottom layer so that every package imports down to it.

- `UserError`: bad input from the user; the CLI prints `gs1: error: <message>` and exits 2.
  `SpecError` is the one for an invalid spec file.
- `EvalDataError`: eval files that cannot be paired (the `decide` command turns it into a UserError).
- `SampleRequestError`: a sample request that still failed after its retries.
- `BackendError`: a backend call that failed or answered other than the SDK documents (the run
  ends on its one line, exit 1).
- `FieldProblems`: a pydantic model check's several `field: reason` problems (spec, kernel).
- `AttentionDefect`: the local engine's start-up probe found the learner's attention backward not
  finite on this device (a kernel defect); it refuses to train.
- `NonFiniteStep`: a forward_backward of the local engine met a non-finite loss, logprob or gradient;
  nothing was applied and a dump for `gs1 replay` was written.
- `ArmFailed`: an arm's work failed (out of memory, a non-finite loss, a dead service): names the
  stage, the arm, the step and the cause on one line; `gs1 run` prints it and exits 1.

(`GateFailed`, raised by the Prefect gate tasks, lives with them in `tasks/common.py`: no lower
layer raises or catches it.)
"""

from __future__ import annotations

import difflib


class UserError(Exception):
    """Bad input from the user (spec, data files, CLI arguments, service, key).

    The CLI prints `gs1: error: <message>` on one line and exits 2, with no traceback.
    """


class SpecError(UserError):
    """An invalid spec: `problems` holds one `field.path: reason` line each."""

    def __init__(self, problems: list[str], source: str | None = None):
        self.problems = list(problems)
        self.source = source
        head = f"{source}: " if source else ""
        n = len(self.problems)
        super().__init__(f"{head}invalid spec ({n} problem{'s' if n != 1 else ''}): " + "; ".join(self.problems))


class EvalDataError(ValueError):
    """Eval files that cannot be paired (missing file or field, duplicate or differing items).
    The message is one line naming the file and what is wrong."""


class SampleRequestError(RuntimeError):
    """A sample request still failed after its retries; `index` is its position in the input."""

    def __init__(self, index: int, attempts: int, cause: BaseException) -> None:
        super().__init__(
            f"sample request {index} failed after {attempts} attempt(s): "
            f"{type(cause).__name__}: {cause}"
        )
        self.index = index
        self.attempts = attempts

    def __reduce__(self):
        # Picklable across processes (Prefect results) without the unpicklable cause.
        return (_rebuild_sample_request_error, (self.index, self.attempts, str(self)))


def _rebuild_sample_request_error(index: int, attempts: int, message: str) -> SampleRequestError:
    err = SampleRequestError.__new__(SampleRequestError)
    RuntimeError.__init__(err, message)
    err.index, err.attempts = index, attempts
    return err


class BackendError(RuntimeError):
    """A backend call that failed, or whose answer deviates from the shape the tinker SDK documents
    and cannot be read exactly. One line: the backend, the call, what was expected, what came."""

    def __init__(self, backend: str, call: str, expected: str, got: str) -> None:
        super().__init__(f"{backend} backend: {call}: expected {expected}; got {got}")
        self.backend, self.call, self.expected, self.got = backend, call, expected, got

    def __reduce__(self):
        # Picklable across processes (Prefect results), the cause left behind like SampleRequestError's.
        return (BackendError, (self.backend, self.call, self.expected, self.got))


class FieldProblems(ValueError):
    """Several problems found by one model-level check (pydantic), each at a path relative to the
    model; the spec's error formatter prints each as its own `field.path: reason` line."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        super().__init__("; ".join(f"{p}: {m}" if p else m for p, m in problems))


def known_keys_only(model, data, also=frozenset()):
    """`data` for a pydantic `model`, or FieldProblems naming each unknown key with the closest
    known one (a typo such as `sampling.temprature` must not leave the default in force). Keys in
    `also` are known too (records a model keeps beside its fields)."""
    if not isinstance(data, dict):
        return data
    known = set(model.model_fields) | {f.alias for f in model.model_fields.values() if f.alias} | set(also)
    unknown = [str(k) for k in data if k not in known]
    if unknown:
        raise FieldProblems([(k, _unknown_key_text(k, known)) for k in unknown])
    return data


def _unknown_key_text(key: str, known: set[str]) -> str:
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(sorted(known))}"
    return f"unknown key ({hint})"


class AttentionDefect(RuntimeError):
    """Raised when a CUDA engine starts and the minimal reproduction of the known SDPA backward
    defect, run through the attention path the learner uses, gives a non-finite gradient: one line
    naming the device, dtype, enabled backends and versions. Training would meet NaN gradients."""


class NonFiniteStep(FloatingPointError):
    """Raised by the local engine's forward_backward when a microbatch's loss, learner logprobs or
    LoRA gradient is not finite. Nothing was applied (the gradients are dropped and the next
    optim_step refuses). `what`: "loss", "logprob" or "gradient"; `microbatch` (1-based, of
    `microbatches`) with its `padded_length` and `size` (datums); `datum` (index into the call's
    datums, or None) and `token` (position in it, or None): for a gradient, the latest position
    whose hidden-state gradient is not finite (causal attention carries gradients only to earlier
    positions, so that is where it started); `dump`: the folder `gs1 replay` reruns. Picklable."""

    def __init__(self, what: str, microbatch: int, microbatches: int, padded_length: int, size: int,
                 datum: int | None, token: int | None, dump: str, note: str = "") -> None:
        self.what, self.microbatch, self.microbatches = what, microbatch, microbatches
        self.padded_length, self.size, self.datum, self.token, self.dump, self.note = (
            padded_length, size, datum, token, dump, note)
        at = f", datum {datum}{note}, token {token}" if datum is not None else ""
        super().__init__(f"the {what} is not finite in microbatch {microbatch}/{microbatches} (padded length "
                         f"{padded_length}, {size} datums){at}; nothing was applied; replay: gs1 replay {dump}")

    def moved(self, dump: str, note: str = "") -> NonFiniteStep:
        """The same finding, its dump now at `dump` (the run directory), with `note` after the datum."""
        return NonFiniteStep(self.what, self.microbatch, self.microbatches, self.padded_length, self.size,
                             self.datum, self.token, dump, note or self.note)

    def __reduce__(self):
        return (NonFiniteStep, (self.what, self.microbatch, self.microbatches, self.padded_length, self.size,
                                self.datum, self.token, self.dump, self.note))


class ArmFailed(RuntimeError):
    """An arm's stage failed: `stage` (pilot, calibration, train, eval), `arm`, `step` (1-based,
    of `steps`; None outside the step loop) and `cause`, one line. Picklable (Prefect results)."""

    def __init__(self, stage: str, arm: str, step: int | None, steps: int | None, cause: str) -> None:
        self.stage, self.arm, self.step, self.steps, self.cause = stage, arm, step, steps, cause
        where = f" at step {step}/{steps}" if step is not None else ""
        super().__init__(f"{stage} {arm} failed{where}: {cause}")

    @classmethod
    def of(cls, stage: str, arm: str, exc: BaseException, step: int | None = None,
           steps: int | None = None) -> ArmFailed:
        return cls(stage, arm, step, steps, failure_cause(exc))

    def __reduce__(self):
        return (ArmFailed, (self.stage, self.arm, self.step, self.steps, self.cause))


def failure_cause(exc: BaseException, limit: int = 400) -> str:
    """One line saying what went wrong: out of memory named as such, else the exception's type
    and the first line of its message."""
    name = type(exc).__name__
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    if name == "OutOfMemoryError" or "out of memory" in first.lower():
        what = "out of memory"
    else:
        what = name
    text = f"{what} ({name}: {first})" if what != name else (f"{name}: {first}" if first else name)
    return text if len(text) <= limit else text[: limit - 3] + "..."
