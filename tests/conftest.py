"""Shared pytest setup: offline, telemetry off, the shared GSM8K copy."""

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
