"""Runs that reproduce, on request: the local engine's deterministic mode.

On a GPU the same spec, code and seed do not give the same run by default: the flash attention
backward adds the query gradient with atomics, inductor autotunes kernel configs per process
(results/h200-multi-adapter: step 1 identical, step 2 apart), and a decode batch's rows come in
the order the arms' threads queued them, so which rows share a batch (and its shape) can change.
`GS1_DETERMINISTIC=1` (or `deterministic=True` to `LocalServiceClient`) turns each off:

- `torch.use_deterministic_algorithms(True)`, strict: SDPA's flash and memory-efficient backward
  take their deterministic paths (cuDNN attention is left out, as the engine does anyway), and
  inductor its deterministic mode (no autotuning, no benchmarked padding); an op with no
  deterministic form raises instead of drifting;
- cuBLAS on a fixed workspace (`CUBLAS_WORKSPACE_CONFIG`), cuDNN deterministic, no benchmarking;
- every decode batch's requests in one order whatever the threads did (`request_order`);
- the sampler's draw by an integer scan (`generate.sample_step`): torch's float cumsum on
  CUDA has no deterministic form.

The mode is process-wide (torch's flags are) and is recorded in every trained unit's record
(`Numerics`, `TrainedArm.numerics`). On the CPU the engine is deterministic already; the mode
changes nothing there but the sampler's scan (tested to draw the same tokens).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

import torch

ENV = "GS1_DETERMINISTIC"
# cuBLAS picks its reduction by workspace; a fixed one (8 buffers of 4 MiB) makes a matmul's
# result one function of its inputs. Read when torch first sizes the workspace: set before any
# CUDA matmul of the process (`enable` runs when the service is made).
CUBLAS_WORKSPACE = ":4096:8"


def requested(flag: bool | None = None) -> bool:
    """The mode asked for: `flag` when given, else `GS1_DETERMINISTIC=1`."""
    return os.environ.get(ENV, "0") == "1" if flag is None else bool(flag)


def enable() -> None:
    """Turn the mode on for this process (idempotent)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def enabled() -> bool:
    return torch.are_deterministic_algorithms_enabled()


@dataclass(frozen=True)
class Numerics:
    """How a unit's numbers were made, in its record: whether a rerun gives the same bits."""
    backend: str
    deterministic: bool | None  # None: a hosted service, whose numerics gs1 cannot see
    device: str | None = None
    dtype: str | None = None
    tf32: bool | None = None
    cublas_workspace: str | None = None
    torch: str | None = None
    # the static decode step's attention (`generate.DECODE_ATTENTIONS`): another kernel, other sums
    decode_attention: str | None = None

    def record(self) -> dict:
        return asdict(self)


def request_order(key: int, owner, prompt: list[int], num_samples: int) -> tuple:
    """A decode request's place in its batch under the mode: its sampling key, then the unit its
    training client trains (`owner.unit`: two arms at one seed draw with the same keys), then its
    prompt. The thread that queued it, and the adapter names (made in thread order), play no part."""
    return (key, getattr(owner, "unit", ""), len(prompt), prompt, num_samples)
