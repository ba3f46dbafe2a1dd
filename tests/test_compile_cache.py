"""Where torch.compile's kernels are kept between processes (engine.pin_compile_cache).

Each case runs in a fresh interpreter: which folder inductor uses is process-wide state, set by the
first cache lookup, and the point is what an import of the engine does to it."""

from __future__ import annotations

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


def test_a_second_process_loads_the_learners_compiled_graph_with_the_same_gradients(tmp_path):
    """The learner's compiled layers hold a custom autograd.Function (lora_bank.LoraAddon), which
    AOTAutograd's cache bypasses unless `settings.cache_learner_graphs` lets it keep them: then a
    second process on the first's caches loads the layers' forward and backward (an autograd cache
    hit, no bypass) instead of re-tracing them (h100-s29: 36.7 s of a warm run), and its LoRA
    gradients are the first's bit for bit. The learner's own forward_backward, compiled, on the CPU,
    as benchmarks/learner_compile.py runs it."""
    from fixtures.benchmarks import load_benchmark

    bench = load_benchmark("learner_compile")
    cold, warm = (bench.run_probe(tmp_path, run) for run in ("cold", "warm"))
    # the learner's compile line says what each cache answered (engine.generate.CacheReads)
    assert re.search(r"autograd cache 0 hit [1-9]\d* miss 0 bypass, inductor cache 0 hit [1-9]\d* miss", cold.line)
    assert re.search(r"autograd cache [1-9]\d* hit 0 miss 0 bypass, inductor cache [1-9]\d* hit 0 miss", warm.line)
    # one analysis and one lookup a process: no restart whose trace and AOTAutograd lookup are
    # thrown away (the layers' floats specialised from the start, `Learner.compiled_layers`; before,
    # dynamo analysed twice in every process and the warm one's first lookup missed)
    assert cold.attempts == warm.attempts == 1
    assert cold.autograd_saved == cold.autograd_miss >= 1 and cold.inductor_miss >= 1
    assert warm.autograd_hit >= 1 and warm.autograd_miss == 0 and warm.inductor_miss == 0
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


def test_two_processes_compiling_into_one_cache_at_once_leave_it_whole(tmp_path):
    """Two workers of one host (one a GPU, issue 52) share one compile cache: two fresh processes
    compile the learner's layers into it at the same time, both cold, and both get the same LoRA
    gradients; a third process then loads the graph they wrote (autograd and inductor caches hit,
    nothing missed) with the same gradients. The learner's own compile, on the CPU, as
    benchmarks/learner_compile.py runs it."""
    from concurrent.futures import ThreadPoolExecutor

    import torch

    from fixtures.benchmarks import load_benchmark

    bench = load_benchmark("learner_compile")
    load_benchmark("engine_speed").build_model("tiny", tmp_path / "model", None, "cpu")  # before either starts
    with ThreadPoolExecutor(2) as pool:
        at_once = list(pool.map(lambda run: bench.run_probe(tmp_path, run), ("gpu0", "gpu1")))
    # each looked the graph up (the first to finish may have saved it before the other looked)
    assert all(r.autograd_hit + r.autograd_miss >= 1 for r in at_once), [r.line for r in at_once]
    assert sum(r.autograd_miss for r in at_once) >= 1  # the cache started empty
    warm = bench.run_probe(tmp_path, "after")
    assert warm.autograd_hit >= 1 and warm.autograd_miss == 0 and warm.inductor_miss == 0, warm.line
    grads = [torch.load(tmp_path / f"{run}.pt") for run in ("gpu0", "gpu1", "after")]
    assert len(grads[0]) > 0 and all(g.keys() == grads[0].keys() for g in grads)
    assert all(torch.equal(g[k], grads[0][k]) for g in grads[1:] for k in grads[0])
