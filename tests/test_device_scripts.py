"""The device scripts' poll (scripts/h200/comparison_device_poll.sh), run here on a made-up work
folder: a run that stops at its start must end the poll's wait at once and bring back why."""
import subprocess
import tarfile
from pathlib import Path

import pytest

POLL = Path(__file__).resolve().parents[1] / "scripts" / "h200" / "comparison_device_poll.sh"


def _poll(work: Path, out: Path, wait: int) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "GS1_DEVICE_WORK": str(work), "OUT": str(out), "WAIT": str(wait)}
    # the timeout is far below WAIT: a poll that waited for `all-done` would be killed by it
    return subprocess.run(["bash", str(POLL)], env=env, capture_output=True, text=True, timeout=wait // 4)


def test_a_failed_start_ends_the_poll_and_comes_back(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir(), out.mkdir()
    (work / "status").write_text("model checksum failed\n")
    (work / "model_sha.txt").write_text("/root/m/model.gguf: FAILED\n")
    done = _poll(work, out, wait=240)
    assert done.returncode == 0 and "status: model checksum failed" in done.stdout
    with tarfile.open(out / "logs.tgz") as logs:
        assert sorted(logs.getnames()) == ["model_sha.txt", "status"]
        assert logs.extractfile("model_sha.txt").read() == b"/root/m/model.gguf: FAILED\n"


@pytest.mark.parametrize("status", ["assembling", "running grpo_gs8-s1"])
def test_a_run_under_way_holds_the_poll_for_its_wait(tmp_path, status):
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir(), out.mkdir()
    (work / "status").write_text(status + "\n")
    with pytest.raises(subprocess.TimeoutExpired):
        _poll(work, out, wait=20)
    assert not (out / "logs.tgz").exists()
