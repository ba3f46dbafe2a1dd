"""The test tiers (issue 22, item 8): `pytest -m "not slow"` runs the library and schema tests with no
model loaded, and the pure-numpy ones import neither torch nor tinker."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "tinker", "tinker_cookbook", "transformers")

# The numpy-and-pydantic library the fast tier tests; every module of schemas and design is added in the probe.
PURE_LIBRARY = ("estimators", "rules", "estimators.kernels", "rl.stats", "estimators.reference", "rl.checks", "rl.gates", "rl.audit",
                "rl.feasibility", "hillclimb.climb", "hillclimb.data", "hillclimb.geff")
# Test modules of pure numpy code: run whole, in a fresh process, they must not pull torch or tinker in.
PURE_NUMPY_TESTS = ("tests/test_estimators.py", "tests/test_stats.py", "tests/test_family.py", "tests/test_geff.py",
                    "tests/test_gates.py")

# Imports the modules one by one and names, for each heavy module, the first import that pulled it in.
PROBE = """
import importlib, json, pkgutil, sys
heavy_modules, mods = sys.argv[1].split(","), sys.argv[2:]
for room in ("schemas", "design"):
    if room in mods:
        package = importlib.import_module(room)
        mods = [m for m in mods if m != room] + sorted(f"{room}.{m.name}" for m in pkgutil.iter_modules(package.__path__))
pulled = {}
for mod in mods:
    importlib.import_module(mod)
    for heavy in heavy_modules:
        if heavy in sys.modules and heavy not in pulled:
            pulled[heavy] = mod
print(json.dumps({"imported": mods, "pulled": pulled}))
"""


def _probe(*modules: str, heavy: tuple[str, ...] = HEAVY, path: Path = REPO) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, ",".join(heavy), *modules], cwd=path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_fast_tiers_library_imports_neither_torch_nor_tinker():
    out = _probe(*PURE_LIBRARY, "schemas", "design")  # "schemas", "design": every module of the room
    assert "design.spec" in out["imported"] and "estimators" in out["imported"]
    # a module named here imports torch or tinker at import time: move that import into the function
    # that needs it (python -X importtime -c 'import MODULE' shows the chain)
    assert out["pulled"] == {}


def test_the_probe_names_the_import_that_pulls_a_heavy_module_in(tmp_path):
    # not vacuous, and cheap: a stand-in heavy module (the real chain, rl.loop -> tinker ->
    # tinker.types -> ... -> torch, costs seconds to import)
    (tmp_path / "light.py").write_text("import json\n")
    (tmp_path / "pulls.py").write_text("import stand_in_torch\n")
    (tmp_path / "stand_in_torch.py").write_text("")
    out = _probe("light", "pulls", heavy=("stand_in_torch", "json_not_imported"), path=tmp_path)
    assert out["pulled"] == {"stand_in_torch": "pulls"}


def test_the_pure_numpy_tests_run_without_torch_or_tinker():
    code = ("import json, sys, pytest\n"
            "rc = pytest.main(['-q', '-p', 'no:cacheprovider', *sys.argv[1:]])\n"
            f"print(json.dumps({{'rc': int(rc), 'heavy': [m for m in {HEAVY!r} if m in sys.modules]}}))\n")
    done = subprocess.run([sys.executable, "-c", code, *PURE_NUMPY_TESTS], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["rc"] == 0, done.stdout[-3000:]
    assert out["heavy"] == [], "a pure-numpy test module imported these, directly or through the library"


# ------------------------------------------------------------------ the tier rules in tests/conftest.py

INNER_TESTS = '''
import pytest


@pytest.fixture(scope="session")
def tiny_model_dir():  # stands in for the real one: the rules go by the fixture's name
    return "model"


@pytest.fixture
def built_on_the_model(tiny_model_dir):
    return tiny_model_dir


def test_pure():
    pass


def test_uses_the_model(tiny_model_dir):
    pass


def test_uses_the_model_through_a_fixture(built_on_the_model):
    pass


def test_uses_prefect(prefect_harness):
    pass


@pytest.mark.slow
def test_marked_slow():
    pass


@pytest.mark.faults
def test_a_fault():
    pass


@pytest.mark.demo_e2e
def test_a_demo_run():
    pass


def test_reaches_the_model_dynamically(request):
    request.getfixturevalue("tiny_model_dir")
'''


@pytest.fixture
def inner(pytester):
    """A scratch suite under this repository's conftest.py and pytest settings."""
    pytester.makeconftest((REPO / "tests" / "conftest.py").read_text())
    pytester.makefile(".toml", pyproject=(REPO / "pyproject.toml").read_text())
    pytester.makepyfile(test_inner=INNER_TESTS)
    return pytester


def _selected(pytester, *args: str) -> set[str]:
    result = pytester.runpytest_subprocess("--collect-only", "-q", "-p", "no:cacheprovider", "test_inner.py", *args)
    return {line.split("::", 1)[1] for line in result.outlines if line.startswith("test_inner.py::")}


ALL = {"test_pure", "test_uses_the_model", "test_uses_the_model_through_a_fixture", "test_uses_prefect",
       "test_marked_slow", "test_a_fault", "test_a_demo_run", "test_reaches_the_model_dynamically"}
SLOW = {"test_uses_the_model", "test_uses_the_model_through_a_fixture", "test_uses_prefect", "test_marked_slow"}


def test_model_and_prefect_fixtures_make_a_test_slow_and_the_opt_in_tiers_stay_out_unless_named(inner):
    assert _selected(inner) == ALL - {"test_a_fault", "test_a_demo_run"}  # `pytest -q`
    assert _selected(inner, "-m", "not slow") == {"test_pure", "test_reaches_the_model_dynamically"}
    assert _selected(inner, "-m", "slow") == SLOW  # an opt-in tier's test is slow, yet only its own `-m` runs it
    assert _selected(inner, "-m", "faults") == {"test_a_fault"}
    assert _selected(inner, "-m", "demo_e2e") == {"test_a_demo_run"}


def test_a_fast_test_that_reaches_a_model_fixture_fails_naming_the_fix(inner):
    result = inner.runpytest_subprocess("-q", "-p", "no:cacheprovider", "test_inner.py", "-m", "not slow")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*test_reaches_the_model_dynamically sets up 'tiny_model_dir'*not marked slow*"])


@pytest.mark.slow  # three collections of the whole suite (each imports torch, transformers and prefect)
def test_the_tiers_split_the_whole_suite_and_leave_out_the_faults():
    def collected(*args: str) -> set[str]:
        done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                              cwd=REPO, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return {line for line in done.stdout.splitlines() if "::" in line}

    everything, fast, slow = collected(), collected("-m", "not slow"), collected("-m", "slow")
    assert fast and slow and not fast & slow
    assert fast | slow == everything  # every test of `pytest -q` is in one tier
    assert not any(t.startswith("tests/test_faults.py::") for t in everything)
    assert not any(t.startswith(("tests/test_reasoning_gym_run.py::test_a_reasoning_gym_family_trains_end_to_end",
                                 "tests/test_multiarm.py::test_comparison_demo")) for t in everything)
