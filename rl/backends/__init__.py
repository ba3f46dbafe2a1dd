"""One client surface for the RL loop: hosted Tinker or the in-process local engine.

`make_service_client(backend, **kw)` returns an object with the `tinker.ServiceClient` methods
the loop uses (see docs/contracts.md, "Backend surface"):
- `"local"`: `rl.backends.local.LocalServiceClient(device=None, dtype=None, cache_dir=None,
  max_batch_rows=None, batch_window_s=0.0, tokens_per_microbatch=None, use_cuda_graphs=None,
  compile_decode=None, gradient_checkpointing=None, batch_across_clients=None, gather_busy_s=None,
  bank_decode=None, compile_after_batches=None, learner_lora="fused")`;
  compile_decode None: on unless GS1_COMPILE_DECODE=0 (CUDA only); gradient_checkpointing None: on
  when a microbatch's activations would crowd the GPU, or the machine's memory on the CPU (`local.settings.checkpoint_learner`);
  batch_across_clients None: on CUDA only (one decode batch across every client's queued requests;
  a flush waits for the arms still in their step at most gather_busy_s, 60 s by default);
  bank_decode None: GS1_BANK_DECODE, else `lora_bank.DEFAULT_DECODE_FORM`.
- `"tinker"`: `rl.backends.tinker_backend.make_tinker_service_client(base_url=None,
  api_key=None, **kw)` (imported lazily, so the local path never needs the hosted pieces).

`release_training_client(tc)` gives back what the service holds for a training client the
caller is done with (hosted: its LoRA adapter; local: its adapter on the shared base).
"""

from __future__ import annotations

import sys
from typing import Any

from schemas.errors import UserError

BACKENDS = ("local", "tinker")


def make_service_client(backend: str, **kw: Any):
    if backend == "local":
        from rl.backends.local import LocalServiceClient  # lazy: torch and transformers are slow to import

        kw.pop("base_url", None)
        kw.pop("api_key", None)
        return LocalServiceClient(**kw)
    if backend == "tinker":
        from rl.backends.tinker_backend import make_tinker_service_client  # lazy: only the hosted path needs it

        return make_tinker_service_client(**kw)
    raise UserError(f"unknown backend {backend!r}: use one of {', '.join(BACKENDS)}")


def release_training_client(training_client) -> None:
    import tinker

    if isinstance(training_client, tinker.TrainingClient):
        from rl.backends.tinker_backend import unload_training_client

        unload_training_client(training_client)
        return
    local = sys.modules.get("rl.backends.local")  # loaded if a local client exists at all
    if local is not None and isinstance(training_client, local.LocalTrainingClient):
        training_client.release()  # its adapter leaves the shared base now


__all__ = ["BACKENDS", "make_service_client", "release_training_client"]
