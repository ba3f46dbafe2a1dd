"""Shared pytest setup: offline, telemetry off, the shared GSM8K copy, and the test tiers.

Tiers (issue 22): `pytest -q` runs everything but the fault-injection suite and the demo model's
whole-spec runs; `pytest -m "not slow"` is the fast tier (library and schema tests, no model, no
flow, no Prefect server, no `gs1 run`); `pytest -m faults tests/test_faults.py` the fault-injection
suite; `pytest -m demo_e2e` the whole specs on the demo model (`OPT_IN_TIERS`).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]

pytest_plugins = ("pytester",)  # tests/test_fast_tier.py runs the tier rules on a scratch suite


def _find_shared_gsm8k() -> Path:
    env = os.environ.get("GS1_GSM8K_DIR")
    if env:
        return Path(env)
    # ../shared beside the checkout (developer machines and CI both lay it there)
    return REPO.parent / "shared" / "data" / "gsm8k"


@pytest.fixture(scope="session")
def gsm8k_dir() -> Path:
    d = _find_shared_gsm8k()
    assert (d / "train.jsonl").is_file(), f"GSM8K copy not found at {d}"
    return d


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def prefect_harness():
    """One temporary Prefect backend for the whole session (starting one costs 15-30 s)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield


# ---------------------------------------------------------------------------------- test tiers
# A test is slow when it loads a model, runs a flow or a Prefect server, spawns `gs1 run`, or
# trains. Most slow tests are found by the fixtures they use, directly or through another fixture
# (item.fixturenames is the closure): these build the tiny model or start Prefect. A test that is
# slow some other way says so itself: `pytestmark = pytest.mark.slow` in its module or
# `@pytest.mark.slow` on it, with a comment saying why. Every faults test is slow too.
SLOW_FIXTURES = frozenset({"tiny_model_dir", "tiny_tokenizer", "tiny_service_client", "prefect_harness"})


# Tiers that run only when a `-m` names them: the fault-injection suite, and the whole specs run
# on the SmolLM2 demo model (10-14 minutes each on the 2-core CI machine, which holds `pytest -q`
# to 90 minutes). Their tests are slow too.
OPT_IN_TIERS = ("faults", "demo_e2e")


@pytest.hookimpl(tryfirst=True)  # before pytest's own `-m` filter reads the marks
def pytest_collection_modifyitems(config, items):
    for item in items:
        if any(item.get_closest_marker(t) for t in OPT_IN_TIERS) or SLOW_FIXTURES.intersection(item.fixturenames):
            item.add_marker(pytest.mark.slow)
    # An opt-in tier runs only when a `-m` names it: a `-m` on the command line replaces addopts'
    # `-m 'not faults'`, and `pytest -m "not slow"` or `-m slow` must not bring it in.
    for tier in OPT_IN_TIERS:
        if tier not in (config.getoption("markexpr") or ""):
            out = [item for item in items if item.get_closest_marker(tier)]
            if out:
                config.hook.pytest_deselected(items=out)
                items[:] = [item for item in items if not item.get_closest_marker(tier)]


class _SlowFixtureGuard:
    """A test that reaches a model or Prefect fixture another way (request.getfixturevalue) and is
    not marked slow is misfiled: fail it, naming the fix, rather than load a model in the fast tier.
    A plugin, not a conftest hook: the session-scoped fixtures are set up through the session's
    hooks, which a conftest below the rootdir does not take part in."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_fixture_setup(self, fixturedef, request):
        if fixturedef.argname in SLOW_FIXTURES:
            item = getattr(request, "_pyfuncitem", None)
            if item is not None and item.get_closest_marker("slow") is None:
                pytest.fail(f"{item.nodeid} sets up {fixturedef.argname!r} (a model or Prefect) but is not "
                            "marked slow: mark it `@pytest.mark.slow` (tests/conftest.py, test tiers)", pytrace=False)


def pytest_configure(config):
    config.pluginmanager.register(_SlowFixtureGuard(), "gs1-slow-fixture-guard")
