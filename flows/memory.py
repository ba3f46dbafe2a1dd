"""The process's memory settings, owned here and applied by every entry point: `gs1 run` (the
CLI), and the flows themselves, so that a run `gs1 serve` (or any Prefect worker) starts in its
own process behaves the same.

Keep glibc from hoarding freed tensor memory: every engine worker thread gets its own malloc
arena and freed mid-sized buffers stay in it. Measured on the demo (2 cores): peak RSS 12.0 GB by
default, 5.8 GB with two arenas and a fixed 1 MB mmap threshold (the run took 6m42s instead of
5m48s); through `gs1 serve`, without these, 8.6-10.4 GB against `gs1 run`'s 4.7 GB (issue 15).
"""

from __future__ import annotations

import ctypes
import os
import sys

ARENA_MAX = 2
MMAP_THRESHOLD = 1 << 20  # fixed: it also stops glibc from raising it dynamically

# glibc reads these at a process's start: child processes (a flow run `prefect serve` starts)
# get the same settings from the first allocation on
MALLOC_ENVIRONMENT = {"MALLOC_ARENA_MAX": str(ARENA_MAX), "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD)}


def bound_malloc() -> dict[str, str]:
    """Apply the settings to this process (mallopt) and its future children (environment);
    returns the environment set. Idempotent; a no-op off glibc."""
    if not sys.platform.startswith("linux"):
        return {}
    for name, value in MALLOC_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-8, ARENA_MAX)  # M_ARENA_MAX
        libc.mallopt(-3, MMAP_THRESHOLD)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):  # not glibc
        return {}
    return {name: os.environ[name] for name in MALLOC_ENVIRONMENT}
