"""Futures for the local backend, shaped like tinker's.

Every local call returns a `LocalFuture`: a `tinker` `APIFuture` (so `.result(timeout)`,
`await fut`, `.result_async()` and `.future()` all work, and `isinstance(f, APIFuture)` holds).
A future may carry an `on_wait` hook that runs the first time anyone asks for the value: the
sampler uses it to flush queued requests into one batch only when a caller waits, which keeps
batch composition (and so every sampled bit) independent of thread timing.

`LocalClientFuture` is a future of a client that can also be used as the client, as tinker's
`BackcompatSamplingClientFuture` / `BackcompatTrainingClientFuture` are, and warns as they do
(`FutureWarning`) when it is: a caller that forgets `.result()` is told on the local engine too.
"""

from __future__ import annotations

import asyncio
import threading
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Generic, TypeVar

from tinker.lib.public_interfaces.api_future import AwaitableConcurrentFuture

T = TypeVar("T")


class LocalFuture(AwaitableConcurrentFuture[T], Generic[T]):
    """A concurrent future with tinker's `APIFuture` surface and an optional wait hook."""

    def __init__(self, future: Future, on_wait: Callable[[], None] | None = None):
        super().__init__(future)
        self._on_wait = on_wait
        self._wait_lock = threading.Lock()

    def _before_wait(self) -> None:
        if self._on_wait is None or self._future.done():
            return
        with self._wait_lock:
            hook, self._on_wait = self._on_wait, None
        if hook is not None:
            hook()

    def result(self, timeout: float | None = None) -> T:
        self._before_wait()
        return self._future.result(timeout)

    async def result_async(self, timeout: float | None = None) -> T:
        if self._on_wait is not None and not self._future.done():
            # Let every coroutine already scheduled submit its request before the flush, so
            # `asyncio.gather` over many `await sc.sample(...)` still forms one batch.
            for _ in range(2):
                await asyncio.sleep(0)
            self._before_wait()
        async with asyncio.timeout(timeout):
            return await asyncio.wrap_future(self._future)

    def future(self) -> Future:
        self._before_wait()
        return self._future

    def done(self) -> bool:
        return self._future.done()


def completed(value: T) -> LocalFuture[T]:
    f: Future = Future()
    f.set_result(value)
    return LocalFuture(f)


def failed(exc: BaseException) -> LocalFuture[Any]:
    f: Future = Future()
    f.set_exception(exc)
    return LocalFuture(f)


class LocalClientFuture(LocalFuture[T], Generic[T]):
    """A future of a client; attribute access falls through to the (awaited) client."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        warnings.warn(
            f"Using the future of a client as the client (`.{name}`) is deprecated in tinker; call "
            ".result() on the future, or await it, to get the client first.",
            FutureWarning,
            stacklevel=2,
        )
        return getattr(self.result(), name)

    def __repr__(self) -> str:
        state = "done" if self._future.done() else "pending"
        return f"<{type(self).__name__}: {state}>"


@dataclass(frozen=True)
class WorkerUsage:
    """What a `SerialWorker` had run so far: per job name, its count and busy seconds. `since`
    gives what ran between two of them."""

    jobs: dict[str, int]
    busy: dict[str, float]

    def since(self, before: "WorkerUsage") -> "WorkerUsage":
        ran = [k for k, n in self.jobs.items() if n > before.jobs.get(k, 0)]
        return WorkerUsage({k: self.jobs[k] - before.jobs.get(k, 0) for k in ran},
                           {k: self.busy[k] - before.busy.get(k, 0.0) for k in ran})


class SerialWorker:
    """One thread that runs submitted jobs in submission order (the device's queue).
    `initializer` runs first in that thread (the local engine makes its CUDA stream current).
    Each job's seconds count under its function's name (`usage`)."""

    def __init__(self, name: str, initializer: Callable[[], None] | None = None):
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name, initializer=initializer)
        self._jobs: dict[str, int] = {}
        self._busy: dict[str, float] = {}
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> LocalFuture[T]:
        return LocalFuture(self._pool.submit(self._timed, fn, *args, **kwargs))

    def submit_raw(self, fn: Callable[..., Any], *args: Any) -> Future:
        return self._pool.submit(self._timed, fn, *args)

    def _timed(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            name = getattr(fn, "__name__", type(fn).__name__)
            with self._lock:
                self._jobs[name] = self._jobs.get(name, 0) + 1
                self._busy[name] = self._busy.get(name, 0.0) + time.perf_counter() - t0

    def usage(self) -> WorkerUsage:
        with self._lock:
            return WorkerUsage(dict(self._jobs), dict(self._busy))

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)
