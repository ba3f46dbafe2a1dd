"""Where torch.compile's kernels are kept between processes (engine.pin_compile_cache).

Each case runs in a fresh interpreter: which folder inductor uses is process-wide state, set by the
first cache lookup, and the point is what an import of the engine does to it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # each case starts a Python that imports torch and the engine (~10 s on 2 cores)

PROBE = """
import os
import engine as local                       # imports torch: its first lookup happens here
before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
pinned = local.pin_compile_cache()
from torch._inductor.runtime.cache_dir_utils import cache_dir
print(before)
print(pinned)
print(cache_dir())
"""


def _probe(tmp_path, **env) -> list[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "GS1_COMPILE_CACHE")}
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300,
                          env={**base, **env, "HOME": str(tmp_path / "home")}, cwd=os.getcwd())
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-3:]


def test_the_engines_compile_cache_reaches_inductor(tmp_path):
    """GS1_COMPILE_CACHE reaches inductor although an import had already written torch's default
    into TORCHINDUCTOR_CACHE_DIR (what the engine's old setdefault missed)."""
    ours = tmp_path / "compile"
    before, pinned, used = _probe(tmp_path, GS1_COMPILE_CACHE=str(ours))
    assert before != str(ours)  # the import left torch's default there
    assert pinned == used == str(ours)


def test_without_gs1_compile_cache_the_engines_default_folder(tmp_path):
    _, pinned, used = _probe(tmp_path)
    assert pinned == used == str(tmp_path / "home" / ".cache" / "gs1" / "torch-compile")


def test_a_folder_named_outright_for_inductor_is_kept(tmp_path):
    theirs = tmp_path / "inductor"
    before, pinned, used = _probe(tmp_path, TORCHINDUCTOR_CACHE_DIR=str(theirs), GS1_COMPILE_CACHE=str(tmp_path / "compile"))
    assert before == pinned == used == str(theirs)
