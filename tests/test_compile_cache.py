"""Where torch.compile's kernels are kept between processes (engine.pin_compile_cache).

Each case runs in a fresh interpreter: which folder inductor uses is process-wide state, set by the
first cache lookup, and the point is what an import of the engine does to it."""

from __future__ import annotations

import json
import os
import re
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


LEARNER_PROBE = """
import json, logging, sys
logging.basicConfig(level=logging.INFO)  # the engine's compile lines, on stderr
sys.path.insert(0, "benchmarks"); sys.path.insert(0, "tests")
from pathlib import Path
import torch
from torch._dynamo.utils import counters
import learner_agreement as la
from engine_speed import build_model

class Args:  # learner_agreement.run_path's arguments
    device, dtype, rank, seed, profile = "cpu", None, 8, 11, False

work = Path(sys.argv[1])
model = work / "model"
if not model.exists():
    build_model("tiny", model, None, "cpu")
_, _, _, _, grads, _ = la.run_path(model, la.datums(4, 12, 12), Args, "fused", True, work / sys.argv[2])
torch.save(grads, work / (sys.argv[2] + ".pt"))
print(json.dumps(dict(counters["aot_autograd"])))
"""


def test_a_second_process_loads_the_learners_compiled_graph_with_the_same_gradients(tmp_path):
    """The learner's compiled layers hold a custom autograd.Function (lora_bank.LoraAddon), which
    AOTAutograd's cache bypasses unless `settings.cache_learner_graphs` lets it keep them: then a
    second process on the first's caches loads the layers' forward and backward (an autograd cache
    hit, no bypass) instead of re-tracing them (h100-s29: 36.7 s of a warm run), and its LoRA
    gradients are the first's bit for bit. The learner's own forward_backward, compiled, on the CPU."""
    base = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "GS1_COMPILE_CACHE")}
    env = {**base, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "HOME": str(tmp_path / "home")}
    seen, lines = [], []
    for run in ("cold", "warm"):
        done = subprocess.run([sys.executable, "-c", LEARNER_PROBE, str(tmp_path), run], capture_output=True,
                              text=True, timeout=600, env=env, cwd=os.getcwd())
        assert done.returncode == 0, done.stderr[-3000:]
        seen.append(json.loads(done.stdout.strip().splitlines()[-1]))
        lines.append([ln for ln in done.stderr.splitlines() if "learner: decoder layers compiled on cpu" in ln])
    cold, warm = seen
    # the learner's compile line says what each cache answered (engine.generate.CacheReads)
    assert len(lines[0]) == len(lines[1]) == 1
    assert re.search(r"autograd cache 0 hit [1-9]\d* miss 0 bypass, inductor cache 0 hit [1-9]\d* miss", lines[0][0])
    # one lookup a process: no analysis restart whose trace and lookup are thrown away (the
    # layers' floats specialised from the start, `Learner.compiled_layers`; before, every process
    # looked up twice and the warm one missed once)
    assert re.search(r"autograd cache [1-9]\d* hit 0 miss 0 bypass, inductor cache [1-9]\d* hit 0 miss", lines[1][0])
    assert cold.get("autograd_cache_saved", 0) == cold.get("autograd_cache_miss", 0) >= 1
    assert not cold.get("autograd_cache_bypass")
    assert warm.get("autograd_cache_hit", 0) >= 1 and not warm.get("autograd_cache_bypass")
    assert not warm.get("autograd_cache_miss")
    import torch

    g_cold, g_warm = torch.load(tmp_path / "cold.pt"), torch.load(tmp_path / "warm.pt")
    assert g_cold.keys() == g_warm.keys() and len(g_cold) > 0
    assert all(torch.equal(g_cold[k], g_warm[k]) for k in g_cold)
    assert any(g.abs().sum() > 0 for g in g_cold.values())


def test_without_the_switch_the_learners_graph_bypasses_autograds_cache():
    """What `cache_learner_graphs` changes: torch's default refuses the HOP an autograd.Function
    becomes in a graph (if torch ever caches them by default, the switch can go)."""
    import torch._functorch.config as functorch_config
    from torch._functorch.autograd_function import autograd_function_apply

    from engine.settings import cache_learner_graphs

    with functorch_config.patch(autograd_cache_allow_custom_autograd_functions=False):
        assert autograd_function_apply.cacheable() is False
        assert cache_learner_graphs() is True
        assert autograd_function_apply.cacheable() is True
