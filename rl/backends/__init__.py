"""One client surface for the RL loop: hosted Tinker or the in-process local engine.

`make_service_client(backend, **kw)` returns an object with the `tinker.ServiceClient` methods
the loop uses (see docs/contracts.md, "Backend surface"):
- `"local"`: `engine.LocalServiceClient(device=None, dtype=None, cache_dir=None,
  max_batch_rows=None, batch_window_s=0.0, tokens_per_microbatch=None, use_cuda_graphs=None,
  compile_decode=None, gradient_checkpointing=None, batch_across_clients=None, gather_busy_s=None,
  bank_decode=None, compile_after_batches=None, learner_lora="fused", decode_length_bucket=None,
  decode_attention=None)`; learner_lora one of `engine.settings.LEARNER_LORA`;
  compile_decode None: on unless GS1_COMPILE_DECODE=0 (CUDA only); gradient_checkpointing None: on
  when a microbatch's activations would crowd the machine's memory on the CPU, or on CUDA when a microbatch cut to fit the GPU would be under 4,096 tokens (`engine.settings.learner_memory`);
  batch_across_clients None: on CUDA only (one decode batch across every client's queued requests;
  a flush waits for the arms still in their step at most gather_busy_s, 60 s by default);
  bank_decode None: GS1_BANK_DECODE, else `lora_bank.DEFAULT_DECODE_FORM`; decode_length_bucket None:
  GS1_DECODE_LENGTH_BUCKET, else `engine.generate.DECODE_LENGTH_BUCKET` (1,024: a static decode cache's
  positions are a multiple of it);
  decode_attention None: GS1_DECODE_ATTENTION, else "flex" (a static decode step reads only the
  cache's live blocks, `engine.generate.LiveKV`; "sdpa": every position through the mask); tf32
  None: on CUDA unless GS1_TF32=0 (the adapters' float32 matmuls as TF32, `engine.use_tf32`).
- `"tinker"`: `rl.backends.tinker_backend.make_tinker_service_client(base_url=None,
  api_key=None, **kw)` (imported lazily, so the local path never needs the hosted pieces).

`release_training_client(tc)` gives back what the service holds for a training client the
caller is done with (hosted: its LoRA adapter; local: its adapter on the shared base).

What a backend can do is asked of its `Backend` (`backend_named(name)`), never read off its name:
whether its engine runs in this process (its usage metered, its numerics and devices this
machine's), the extra arguments its training clients take, what it checks before a run. Adding a
backend is its class here and its line in `BACKENDS`; the CLI's choices and the deployment's form
read `BACKENDS`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

from schemas.errors import UserError


class Backend:
    """A backend's name and what it can do: its service client, the extra arguments its training
    clients take, the devices a run holds, its numerics, and its checks before a run."""

    name: str
    meters_usage: bool  # its engine runs in this process: `service.usage()` says what the devices did

    def service_client(self, **kw: Any):
        """A service client with the `tinker.ServiceClient` methods the loop uses."""
        raise NotImplementedError

    def session_client(self):
        """The pipeline's one service client of a process (`pipeline.services.service_client`)."""
        return self.service_client()

    def lora_options(self, base_model_path: str | None) -> dict:
        """Extra arguments of `create_lora_training_client` for an arm's `base_model_path`."""
        return {}

    def devices(self) -> int:
        """Accelerators a run holds, for the feasibility's GPU-hours."""
        return 1  # hosted: count the run as holding one accelerator's worth of time

    def unit_device(self, training_client: Any) -> str | None:
        """The physical device that trains `training_client`'s adapter (a unit's cost record:
        which units shared a GPU); None where the backend does not say (a hosted service)."""
        return None

    def numerics(self, session: Callable[[], Any]) -> dict:
        """How the backend makes its numbers (`engine.determinism.Numerics.record`)."""
        from engine.determinism import Numerics  # lazy: the engine's package imports torch

        return Numerics(backend=self.name, deterministic=None).record()  # a hosted service's are not gs1's to see

    def check_model_path(self, model: str) -> None:
        """A UserError, one line, when the run's model cannot be named (before any directory is written)."""

    def check_before_run(self, model: str) -> None:
        """A UserError, one line, when the run cannot start: the model not loadable, the service not
        answering or the key refused (`gs1 run` asks before the flow starts)."""


class LocalBackend(Backend):
    """The in-process engine (`engine.LocalServiceClient`) on this machine's CPU or GPU."""

    name = "local"
    meters_usage = True

    def service_client(self, **kw: Any):
        from engine import LocalServiceClient  # lazy: torch and transformers are slow to import

        kw.pop("base_url", None)
        kw.pop("api_key", None)
        return LocalServiceClient(**kw)

    def session_client(self):
        # The engine keeps checkpoints and sampler weights on disk; a fixed home lets a run resumed
        # in a new process (after a crash) find the states its Parquet names.
        return self.service_client(cache_dir=os.environ.get("GS1_LOCAL_CACHE") or str(Path.home() / ".cache" / "gs1" / "local"))

    def lora_options(self, base_model_path: str | None) -> dict:
        return {"base_model_path": base_model_path} if base_model_path else {}

    def devices(self) -> int:
        import torch

        # the engine spreads a run's clients over every GPU it sees (`LocalServiceClient.place`)
        return torch.cuda.device_count() if torch.cuda.is_available() else 0

    def unit_device(self, training_client: Any) -> str | None:
        return training_client.device_identity()

    def numerics(self, session: Callable[[], Any]) -> dict:
        return session().numerics().record()

    def check_model_path(self, model: str) -> None:
        from engine.models import resolve_model  # torch: only once the spec is good

        resolve_model(model)  # a local path that does not exist: one line

    def check_before_run(self, model: str) -> None:
        from engine.models import check_model_cached, default_model_cache_dir  # lazy: start-up time

        check_model_cached(model)  # not cached: one line, exit 2, now
        # a GGUF base is dequantised once per machine, not once per run (GS1_MODEL_CACHE= keeps nothing)
        os.environ.setdefault("GS1_MODEL_CACHE", str(default_model_cache_dir()))


class TinkerBackend(Backend):
    """A hosted Tinker-API service through the real SDK (`rl.backends.tinker_backend`)."""

    name = "tinker"
    meters_usage = False

    def service_client(self, **kw: Any):
        from rl.backends.tinker_backend import make_tinker_service_client  # lazy: only the hosted path needs it

        return make_tinker_service_client(**kw)

    def check_before_run(self, model: str) -> None:
        self.service_client()  # probe the service and the key now: one clear line, exit 2


BACKENDS: dict[str, Backend] = {b.name: b for b in (LocalBackend(), TinkerBackend())}
DEFAULT_BACKEND = "local"


def backend_named(name: str) -> Backend:
    """The backend called `name`; a UserError naming the known ones otherwise."""
    if name not in BACKENDS:
        raise UserError(f"backend = {json.dumps(name)}: must be {' or '.join(repr(b) for b in BACKENDS)}")
    return BACKENDS[name]


def make_service_client(backend: str, **kw: Any):
    return backend_named(backend).service_client(**kw)


def release_training_client(training_client) -> None:
    import tinker

    if isinstance(training_client, tinker.TrainingClient):
        from rl.backends.tinker_backend import unload_training_client

        unload_training_client(training_client)
        return
    local = sys.modules.get("engine")  # loaded if a local client exists at all
    if local is not None and isinstance(training_client, local.LocalTrainingClient):
        training_client.release()  # its adapter leaves the shared base now


__all__ = ["BACKENDS", "DEFAULT_BACKEND", "Backend", "backend_named", "make_service_client", "release_training_client"]
