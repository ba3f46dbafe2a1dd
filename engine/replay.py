"""Rerun a non-finite forward_backward from its dump, and tell bad data from a bad kernel.

    runs = replay(Path("runs/<run>/nonfinite/gs1_kernel/28"))
    print(replay_table(dump, runs)); print(verdict(runs))

The dump (written by the local engine, `LocalTrainingClient._dump_nonfinite`, and moved under the
run directory by the loop) holds the adapter and optimizer state before the update, the datums,
the microbatch layout with padded lengths, and the engine's settings. `replay` loads it into a
fresh local engine with the same device, dtype, token budget, checkpointing and attention
settings, and runs the microbatches up to the failing one:

- `exact`: as they ran;
- `L+1` and `L-1`: the failing microbatch padded one longer, or one shorter (its datums longer
  than L-1 lose their last token);
- `sdpa=<backend>`: only that SDPA backend enabled (each one the device has);
- `mask=<on|off>`: the learner with the other attention-mask setting (on: the padded mask the
  learner passed before the cuDNN fix).

A non-finite value in every run points at the data or the weights; finite runs beside a
non-finite exact one point at the attention kernel at that shape or on that backend.
"""

from __future__ import annotations

import json
import pickle
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from engine import (
    META_FILE,
    NONFINITE_DATUMS,
    NONFINITE_LAYOUT,
    NONFINITE_SETTINGS,
    LocalServiceClient,
    Microbatch,
    datum_from_tensors,
)
from engine.attention import SDPA_BACKENDS, sdpa_flags, set_sdpa_flags
from schemas.errors import NonFiniteStep, UserError

# what replay reads of a dump's settings (`_dump_nonfinite` writes them)
DUMP_SETTINGS = ("device", "dtype", "tokens_per_microbatch", "gradient_checkpointing")


@dataclass(frozen=True)
class Dump:
    path: Path
    datums: list
    layout: list[Microbatch]
    loss_fn: str
    failed: dict
    settings: dict

    @property
    def failed_microbatch(self) -> int:
        return int(self.failed["microbatch"])


@dataclass(frozen=True)
class ReplayRun:
    name: str
    padded_length: int
    finite: bool | None  # None: the run could not be made (no such kernel on this device)
    detail: str = ""


def load_dump(path: Path) -> Dump:
    """The dump at `path`, or a UserError naming what is missing or damaged."""
    for name in (META_FILE, NONFINITE_DATUMS, NONFINITE_LAYOUT, NONFINITE_SETTINGS):
        if not (path / name).is_file():
            raise UserError(f"{path} is not a non-finite step dump: {name} is missing")
    try:
        layout = json.loads((path / NONFINITE_LAYOUT).read_text())
        settings = json.loads((path / NONFINITE_SETTINGS).read_text())
        datums = [datum_from_tensors(t) for t in torch.load(path / NONFINITE_DATUMS, weights_only=True)]
        mbs = [Microbatch(tuple(m["datums"]), tuple(m["lengths"]), int(m["padded_length"])) for m in layout["microbatches"]]
        missing = [k for k in DUMP_SETTINGS if k not in settings]
        if missing:
            raise KeyError(f"{NONFINITE_SETTINGS} has no {', '.join(missing)}")
        dump = Dump(path, datums, mbs, layout["loss_fn"], layout["failed"], settings)
        dump.layout[dump.failed_microbatch]  # the failing microbatch is one of the layout's
    # a truncated or zero-byte file, a key missing, a value of the wrong type: bad input, one line
    except (OSError, ValueError, KeyError, IndexError, TypeError, RuntimeError, EOFError, pickle.UnpicklingError) as e:
        raise UserError(f"{path}: damaged dump ({type(e).__name__}: {e})") from None
    return dump


def replay_device(dump: Dump, device: str | None) -> str:
    """Where to rerun: `device`, else where the dump ran; a CUDA dump on a host without CUDA is
    bad input (one line), not a crash."""
    where = device or dump.settings["device"]
    if str(where).startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"{dump.path}: the step ran on {where} and this host has no CUDA device; "
                        "rerun it here with --device cpu")
    return where


def _variants(dump: Dump, device: torch.device) -> list[tuple[str, dict]]:
    L = dump.layout[dump.failed_microbatch].padded_length
    out: list[tuple[str, dict]] = [("exact", {}), ("L+1", {"padded_length": L + 1}), ("L-1", {"padded_length": L - 1})]
    backends = SDPA_BACKENDS if device.type == "cuda" else ("flash", "math")  # the CPU has these two
    out += [(f"sdpa={b}", {"backends": {name: name == b for name in SDPA_BACKENDS}}) for b in backends]
    mask = bool(dump.settings.get("learner_attention_mask"))
    out.append((f"mask={'off' if mask else 'on'}", {"learner_attention_mask": not mask}))
    return out


def _shaped(dump: Dump, padded_length: int | None) -> tuple[list, list[Microbatch]]:
    """The datums and the microbatches up to the failing one, that one padded to `padded_length`."""
    layout = dump.layout[: dump.failed_microbatch + 1]
    if padded_length is None:
        return dump.datums, layout
    from tinker import types

    failing = layout[-1]
    datums = list(dump.datums)
    for i in failing.datums:  # L-1: a datum longer than the new length loses its last tokens
        d = datums[i]
        n = d.model_input.length
        if n > padded_length:
            toks = d.model_input.to_ints()[:padded_length]
            inputs = {k: types.TensorData.from_torch(v.to_torch().reshape(-1)[:padded_length])
                      for k, v in d.loss_fn_inputs.items()}
            datums[i] = types.Datum(model_input=types.ModelInput.from_ints(toks), loss_fn_inputs=inputs)
    return datums, layout[:-1] + [Microbatch.of(datums, failing.datums, padded_length)]


def replay(path: Path, device: str | None = None) -> tuple[Dump, list[ReplayRun]]:
    """Every run of the module doc, in order; the SDPA flags of the process are restored after."""
    dump = load_dump(path)
    s = dump.settings
    service = LocalServiceClient(device=replay_device(dump, device), dtype=s["dtype"],
                                 cache_dir=tempfile.mkdtemp(prefix="gs1-replay-"),
                                 tokens_per_microbatch=s["tokens_per_microbatch"],
                                 gradient_checkpointing=s["gradient_checkpointing"],
                                 learner_lora=s.get("learner_lora", "peft"),  # a dump from before the fused path
                                 learner_attention_mask=bool(s.get("learner_attention_mask")),
                                 tf32=bool(s.get("tf32")),  # a dump from before TF32 ran IEEE float32
                                 compile_learner=False)  # eager: the layers as written, whatever the dump ran
    tc = service.create_training_client_from_state_with_optimizer(str(dump.path)).result()
    saved = sdpa_flags()
    runs = []
    try:
        for name, change in _variants(dump, service.device):
            datums, layout = _shaped(dump, change.get("padded_length"))
            set_sdpa_flags(change.get("backends") or s.get("sdpa_backends") or saved)
            tc.set_learner_attention_mask(change.get("learner_attention_mask", bool(s.get("learner_attention_mask"))))
            runs.append(_run(tc, name, datums, dump.loss_fn, layout))
            tc.discard_gradients()
    finally:
        set_sdpa_flags(saved)
    return dump, runs


def _run(tc, name: str, datums, loss_fn: str, layout: list[Microbatch]) -> ReplayRun:
    L = layout[-1].padded_length
    try:
        tc.forward_backward_layout(datums, loss_fn, layout).result()
    except NonFiniteStep as e:
        where = f"datum {e.datum}, token {e.token}" if e.datum is not None else "no datum located"
        return ReplayRun(name, L, False, f"{e.what} in microbatch {e.microbatch}: {where}")
    except RuntimeError as e:  # e.g. no kernel of the one enabled backend takes these inputs
        return ReplayRun(name, L, None, str(e).splitlines()[0][:100])
    return ReplayRun(name, L, True)


def replay_table(dump: Dump, runs: list[ReplayRun]) -> str:
    f = dump.failed
    mb = dump.layout[dump.failed_microbatch]
    head = (f"replay of {dump.path}: the {f['what']} was not finite in microbatch {dump.failed_microbatch + 1}/"
            f"{len(dump.layout)} (padded length {mb.padded_length}, {mb.size} datums), datum {f['datum']}, "
            f"token {f['token']}; {dump.settings.get('versions')}, {dump.settings.get('dtype')}")
    lines = [head, f"{'run':<16} {'padded':>6}  {'finite':<6}  first non-finite"]
    for r in runs:
        finite = "n/a" if r.finite is None else ("yes" if r.finite else "no")
        lines.append(f"{r.name:<16} {r.padded_length:>6}  {finite:<6}  {r.detail}")
    return "\n".join(lines)


def verdict(runs: list[ReplayRun]) -> str:
    exact = runs[0]
    if exact.finite:
        return "verdict: the exact rerun is finite: not reproduced (the state or the order of work differed)"
    finite = [r.name for r in runs[1:] if r.finite]
    if not finite:
        return ("verdict: not finite under every length, backend and mask: the data or the weights "
                f"({exact.detail}), not the attention kernel")
    return (f"verdict: finite under {', '.join(finite)}: the attention kernel at this shape or backend, "
            "not the data")


__all__ = ["Dump", "ReplayRun", "load_dump", "replay", "replay_table", "verdict"]
