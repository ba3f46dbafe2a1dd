"""The reproduction runs brought back from the GPU (results/h200-engine/h100/repro/, session 23) carry
their proof: `benchmarks/reproduce.py --compare` over the committed step logs, here, gives the
device's own comparison step for step (rewards, losses, grad norms, token counts, rollout
digests, matches); and a run's recorded adapter digests decide the final-adapter check where the
adapters' folders did not come back."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REPRO = ROOT / "results" / "h200-engine" / "h100" / "repro"
sys.path.insert(0, str(ROOT / "benchmarks"))

import reproduce  # noqa: E402


def _steps(comparison: dict) -> dict:
    return {arm: a["steps"] for arm, a in comparison["arms"].items()}


@pytest.mark.parametrize("runs,device_json,identical", [
    (("det-a-0", "det-b-0"), "compare-det.json", True),
    (("default-0", "default-1", "default-2"), "compare-default.json", False),
])
def test_the_committed_runs_compare_as_the_device_compared_them(tmp_path, runs, device_json, identical):
    ours = tmp_path / "ours.json"
    got = reproduce.compare([REPRO / r for r in runs], ours)
    device = json.loads((REPRO / device_json).read_text())
    assert got is identical and device["identical"] is identical
    assert _steps(json.loads(ours.read_text())) == _steps(device)
    # this session's runs recorded no adapter digests and their adapters stayed on the machine
    assert len(json.loads(ours.read_text())["adapters_unchecked"]) == 2 * (len(runs) - 1)


def test_the_default_mode_diverged_and_the_deterministic_mode_did_not():
    """What the H100 showed (the README's claim, read from the device's own comparison)."""
    det = json.loads((REPRO / "compare-det.json").read_text())
    default = json.loads((REPRO / "compare-default.json").read_text())
    for arm in ("grpo_gs8", "gs1_kernel"):
        assert all(row["det-b-0"]["same_as_first"] for row in det["arms"][arm]["steps"].values())
        assert det["arms"][arm]["adapters"]["det-b-0"]["max_abs"] == 0.0
        later = [row[n]["same_as_first"] for row in default["arms"][arm]["steps"].values() for n in ("default-1", "default-2")]
        assert not any(later)
        assert default["arms"][arm]["adapters"]["default-1"]["max_abs"] > 0


def _steps_1_to_5(comparison: dict, runs: list[str]) -> list[float]:
    return [x for arm in comparison["arms"].values() for n in runs for x in arm["step_seconds"][n][1:6]]


def test_the_modes_cost_is_what_the_readme_says():
    """results/h200-engine/README.md's cost of the mode, recounted from the device's step seconds:
    both arms, steps 1-5, the two deterministic runs against the two warm default runs."""
    det = _steps_1_to_5(json.loads((REPRO / "compare-det.json").read_text()), ["det-a-0", "det-b-0"])
    default = _steps_1_to_5(json.loads((REPRO / "compare-default.json").read_text()), ["default-1", "default-2"])
    mean = lambda v: sum(v) / len(v)  # noqa: E731
    readme = (ROOT / "results" / "h200-engine" / "README.md").read_text()
    assert f"was {mean(det):.1f} s" in readme and f"against {mean(default):.1f} s by default" in readme
    assert f"{min(det):.1f}-{max(det):.1f} s under the mode and {min(default):.1f}-{max(default):.1f} s" in readme
    assert 1.4 < mean(det) / mean(default) < 1.6  # "about 1.5x"


def _with_digests(tmp_path, name: str, digests: dict[str, str]) -> Path:
    run = tmp_path / name
    shutil.copytree(REPRO / name, run)
    record = json.loads((run / "reproduce.json").read_text())
    (run / "reproduce.json").write_text(json.dumps({**record, "adapter_digests": digests}))
    return run


def test_recorded_adapter_digests_decide_the_adapter_check_without_the_folders(tmp_path, capsys):
    same = {"grpo_gs8": "a" * 64, "gs1_kernel": "b" * 64}
    a = _with_digests(tmp_path / "one", "det-a-0", same)
    b = _with_digests(tmp_path / "two", "det-b-0", same)
    assert reproduce.compare([a, b], None) is True
    assert "the same tensors (content digests" in capsys.readouterr().out
    c = _with_digests(tmp_path / "three", "det-b-0", {**same, "gs1_kernel": "c" * 64})
    assert reproduce.compare([a, c], None) is False
    assert "different tensors" in capsys.readouterr().out


def test_the_adapter_digest_is_the_tensors_not_the_folder(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    tensors = {"lora_A": torch.arange(12, dtype=torch.bfloat16).reshape(3, 4), "lora_B": torch.ones(4, 2)}
    for folder in ("x", "elsewhere/y"):
        (tmp_path / folder).mkdir(parents=True)
        save_file(tensors, str(tmp_path / folder / "adapter_model.safetensors"))
    assert reproduce.adapter_content_digest(str(tmp_path / "x")) == reproduce.adapter_content_digest(str(tmp_path / "elsewhere/y"))
    nudged = {**tensors, "lora_B": tensors["lora_B"].clone()}
    nudged["lora_B"][1, 1] = torch.nextafter(torch.tensor(1.0), torch.tensor(2.0))
    (tmp_path / "z").mkdir()
    save_file(nudged, str(tmp_path / "z" / "adapter_model.safetensors"))
    assert reproduce.adapter_content_digest(str(tmp_path / "z")) != reproduce.adapter_content_digest(str(tmp_path / "x"))
