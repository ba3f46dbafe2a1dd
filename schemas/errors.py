"""Every exception type of the project, at the bottom layer so that every package imports down to it.

All of them derive from `Gs1Error` (`except Gs1Error` catches what gs1 itself raises), and each
keeps a second, standard base where callers relied on one (`ValueError`, `RuntimeError`, ...).
Each is picklable: Prefect ships exceptions across processes and stores them in failed states.

- `UserError`: bad input from the user; the CLI prints `gs1: error: <message>` and exits 2.
  `SpecError` is the one for an invalid spec file.
- `UnitProofError` (a UserError): a unit of a units folder fails its proof, holds fewer or other
  items than the spec registers, or lacks a file the decision reads; nothing is written.
- `EvalDataError`: eval files that cannot be paired (the `decide` command turns it into a UserError).
- `BackendError`: a backend call that failed or answered other than the SDK documents (the run
  ends on its one line, exit 1). `KeyRefused` is the one for a key the service refused mid-run (exit 2).
- `FieldProblems`: a pydantic model check's several `field: reason` problems (spec, kernel).
- `AttentionDefect`: the local engine's start-up probe found the learner's attention backward not
  finite on this device (a kernel defect); it refuses to train.
- `NonFiniteStep`: a forward_backward of the local engine met a non-finite loss, logprob or gradient;
  nothing was applied and a dump for `gs1 replay` was written.
- `ArmFailed`: an arm's work failed (out of memory, a non-finite loss, a dead service): names the
  stage, the arm, the step and the cause on one line; `gs1 run` prints it and exits 1.
- `AuditInputMissing`: an arm's rollout log lacks an input its reference recomputes from.
- `GateFailed`: a gate check failed; raised by the gate stages, it ends the flow run Failed with
  the gate's message (`gs1 run` exits 1).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the wording lives with the gate rows; imported when a gate fails (CLI start-up stays light)
    from schemas.gate_text import GateRow


class Gs1Error(Exception):
    """The base of every exception gs1 raises on purpose; never raised itself."""


class UserError(Gs1Error):
    """Raised on bad input from the user (spec, data files, CLI arguments, service, key, a full disk).

    The CLI prints `gs1: error: <message>` on one line and exits 2, with no traceback.
    """


class SpecError(UserError):
    """Raised when a spec file does not validate: `problems` holds one `field.path: reason` line
    each, `source` the file."""

    def __init__(self, problems: list[str], source: str | None = None):
        self.problems = list(problems)
        self.source = source
        head = f"{source}: " if source else ""
        n = len(self.problems)
        super().__init__(f"{head}invalid spec ({n} problem{'s' if n != 1 else ''}): " + "; ".join(self.problems))

    def __reduce__(self):
        return (SpecError, (self.problems, self.source))


class UnitProofError(UserError):
    """Raised by every read of a units folder (`decision.units.check_units`: `gs1 decide --units`, its
    readings) when a unit listed by the spec fails its proof (`schemas.unit_proof.UnitProof`): no
    or an unreadable proof, a file missing or not the one copied (its sha256), another arm, seed,
    unit or experiment than the folder name and the spec say, fewer or other eval items than the
    spec registers or than the other units hold. One line naming the unit and what failed; the
    command exits 2 and writes nothing."""

    def __init__(self, unit: str, problem: str):
        self.unit, self.problem = unit, problem
        super().__init__(f"units folder: unit {unit}: {problem}")

    def __reduce__(self):
        return (UnitProofError, (self.unit, self.problem))


class EvalDataError(Gs1Error, ValueError):
    """Raised when eval files cannot be paired (missing file or field, duplicate or differing items).
    The message is one line naming the file and what is wrong."""


class BackendError(Gs1Error, RuntimeError):
    """Raised on a backend call that failed, or whose answer deviates from the shape the tinker SDK documents
    and cannot be read exactly. One line: the backend, the call, what was expected, what came."""

    def __init__(self, backend: str, call: str, expected: str, got: str) -> None:
        super().__init__(f"{backend} backend: {call}: expected {expected}; got {got}")
        self.backend, self.call, self.expected, self.got = backend, call, expected, got

    def __reduce__(self):
        # Picklable across processes (Prefect results), the cause left behind (it may not pickle).
        return (BackendError, (self.backend, self.call, self.expected, self.got))


class KeyRefused(BackendError):
    """Raised when the service refused the API key on a call after the start-up check (HTTP 401/403):
    a BackendError whose run ends with exit 2, as a key refused at start-up does. The key is never in it."""

    exit_code = 2

    def __reduce__(self):
        return (KeyRefused, (self.backend, self.call, self.expected, self.got))


class FieldProblems(Gs1Error, ValueError):
    """Raised by a model-level check (pydantic) that found several problems, each at a path
    relative to the model; the spec's error formatter prints each as its own `field.path: reason` line."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        super().__init__("; ".join(f"{p}: {m}" if p else m for p, m in problems))

    def __reduce__(self):
        return (FieldProblems, (self.problems,))


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


class AttentionDefect(Gs1Error, RuntimeError):
    """Raised when a CUDA engine starts and the minimal reproduction of the known SDPA backward
    defect, run through the attention path the learner uses, gives a non-finite gradient: one line
    naming the device, dtype, enabled backends and versions. Training would meet NaN gradients."""


class NonFiniteStep(Gs1Error, FloatingPointError):
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


class ArmFailed(Gs1Error, RuntimeError):
    """Raised when an arm's stage failed: `stage` (pilot, calibration, train, eval), `arm`, `step` (1-based,
    of `steps`; None outside the step loop) and `cause`, one line; `exit_code` the one `gs1 run` ends
    with (1; 2 when the cause was a refused key). Picklable (Prefect results)."""

    def __init__(self, stage: str, arm: str, step: int | None, steps: int | None, cause: str,
                 exit_code: int = 1) -> None:
        self.stage, self.arm, self.step, self.steps, self.cause = stage, arm, step, steps, cause
        self.exit_code = exit_code
        where = f" at step {step}/{steps}" if step is not None else ""
        super().__init__(f"{stage} {arm} failed{where}: {cause}")

    @classmethod
    def of(cls, stage: str, arm: str, exc: BaseException, step: int | None = None,
           steps: int | None = None) -> ArmFailed:
        return cls(stage, arm, step, steps, failure_cause(exc), getattr(exc, "exit_code", 1))

    def __reduce__(self):
        return (ArmFailed, (self.stage, self.arm, self.step, self.steps, self.cause, self.exit_code))



class AuditInputMissing(Gs1Error, ValueError):
    """Raised by an arm kind's reference (`Estimator.reference`) when an arm's rollout log lacks an
    input it recomputes from (the audit then reports the arm as failed, one mismatch naming it)."""


class GateFailed(Gs1Error):
    """Raised by a gate stage when one of its checks failed, after its metrics are written. Carries
    every check of the gate (`rows`, typed `GateRow`s), so the flow's state shows them; the message
    is the failing checks' (metric, value and bound first: what the UI's state badge shows).

    Picklable (`__reduce__`) so Prefect can persist the failed state and re-raise it."""

    def __init__(self, gate: str, rows: Iterable[GateRow]):
        from schemas.gate_text import gate_failed_message

        self.gate = gate
        self.rows = tuple(rows)
        super().__init__(gate_failed_message(gate, self.rows))

    def __reduce__(self):
        return (GateFailed, (self.gate, self.rows))

    @property
    def failing(self) -> tuple[GateRow, ...]:
        return tuple(r for r in self.rows if not r.passed)

    def fails(self, metric: str) -> bool:
        """Whether the check of `metric` is among the failing ones."""
        return any(r.metric == metric for r in self.failing)


class CalibrationStopped(GateFailed):
    """The activation gate failed the check the pre-registered calibration answers, and the
    calibration stopped too (its pilot's wall cap, its audit or its gate). `gate` and `rows` are
    where it stopped; `activation` is the activation gate's failure, which the message leads with,
    `answered` the metric the calibration answers (its check comes after the others)
    (`schemas.gate_text.calibration_stop_message`): the metric the user's spec judged comes first."""

    def __init__(self, activation: GateFailed, stopped: GateFailed, answered: str, bandwidth: float | None):
        from schemas.gate_text import calibration_stop_message

        self.activation, self.stopped, self.answered, self.bandwidth = activation, stopped, answered, bandwidth
        self.gate, self.rows = stopped.gate, stopped.rows
        Gs1Error.__init__(self, calibration_stop_message(activation.gate, activation.rows, answered, bandwidth,
                                                         stopped.gate, stopped.rows))

    def __reduce__(self):
        return (CalibrationStopped, (self.activation, self.stopped, self.answered, self.bandwidth))


def failure_cause(exc: BaseException, limit: int = 400) -> str:
    """One line saying what went wrong: out of memory named as such, else the exception's type
    and the first line of its message (a BackendError's own line, which names the backend and the call)."""
    name = type(exc).__name__
    if isinstance(exc, BackendError):
        text = str(exc)
        return text if len(text) <= limit else text[: limit - 3] + "..."
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    if name == "OutOfMemoryError" or "out of memory" in first.lower():
        what = "out of memory"
    else:
        what = name
    text = f"{what} ({name}: {first})" if what != name else (f"{name}: {first}" if first else name)
    return text if len(text) <= limit else text[: limit - 3] + "..."
