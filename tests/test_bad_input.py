"""Bad input is one line and exit 2 (issue 47's rough edges): a damaged non-finite dump, a CUDA
dump replayed on a CPU host, a missing dump folder said before torch is imported, a spec saved
with a byte-order mark. No model is loaded: the fast tier."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gs1.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _dump(folder: Path, *, datums=b"ok", layout: dict | None = None, settings: dict | None = None) -> Path:
    """A non-finite dump's files as `_dump_nonfinite` writes them (one datum, one microbatch)."""
    from engine import META_FILE, NONFINITE_DATUMS, NONFINITE_LAYOUT, NONFINITE_SETTINGS

    folder.mkdir(parents=True)
    (folder / META_FILE).write_text(json.dumps({"base_model": "x", "rank": 4}))
    if datums == b"ok":
        torch.save([{"tokens": torch.tensor([1, 2, 3]), "weights": torch.ones(3)}], folder / NONFINITE_DATUMS)
    else:
        (folder / NONFINITE_DATUMS).write_bytes(datums)
    layout = layout if layout is not None else {
        "loss_fn": "cross_entropy", "microbatches": [{"datums": [0], "lengths": [3], "padded_length": 3}],
        "failed": {"what": "loss", "microbatch": 0, "datum": 0, "token": 1}}
    (folder / NONFINITE_LAYOUT).write_text(json.dumps(layout))
    settings = settings if settings is not None else {
        "device": "cpu", "dtype": "float32", "tokens_per_microbatch": 64, "gradient_checkpointing": True}
    (folder / NONFINITE_SETTINGS).write_text(json.dumps(settings))
    return folder


def _replay(folder: Path, capsys, *extra: str) -> tuple[int, str]:
    rc = main(["replay", str(folder), *extra])
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("damage", ["zero-byte datums", "truncated datums", "layout without loss_fn",
                                    "layout without failed", "settings without device", "failed microbatch out of range"])
def test_a_damaged_dump_is_bad_input(tmp_path, capsys, damage):
    good_layout = {"loss_fn": "cross_entropy", "microbatches": [{"datums": [0], "lengths": [3], "padded_length": 3}],
                   "failed": {"what": "loss", "microbatch": 0, "datum": 0, "token": 1}}
    kw: dict = {}
    if damage == "zero-byte datums":
        kw["datums"] = b""
    elif damage == "truncated datums":
        whole = tmp_path / "whole.pt"
        torch.save([{"tokens": torch.tensor([1, 2, 3])}], whole)
        kw["datums"] = whole.read_bytes()[:40]
    elif damage == "layout without loss_fn":
        kw["layout"] = {k: v for k, v in good_layout.items() if k != "loss_fn"}
    elif damage == "layout without failed":
        kw["layout"] = {k: v for k, v in good_layout.items() if k != "failed"}
    elif damage == "settings without device":
        kw["settings"] = {"dtype": "float32", "tokens_per_microbatch": 64, "gradient_checkpointing": True}
    else:
        kw["layout"] = {**good_layout, "failed": {**good_layout["failed"], "microbatch": 3}}
    rc, err = _replay(_dump(tmp_path / "dump", **kw), capsys)
    assert rc == 2 and len(err.splitlines()) == 1 and "damaged dump" in err, (rc, err)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a host without CUDA")
def test_a_cuda_dump_on_a_cpu_host_says_rerun_with_device_cpu(tmp_path, capsys):
    folder = _dump(tmp_path / "dump", settings={"device": "cuda:0", "dtype": "bfloat16", "tokens_per_microbatch": 64,
                                                "gradient_checkpointing": False})
    rc, err = _replay(folder, capsys)
    assert rc == 2 and len(err.splitlines()) == 1 and "--device cpu" in err, (rc, err)


def test_a_missing_dump_is_said_before_torch_is_imported(tmp_path):
    code = ("import sys; from gs1.cli import main; rc = main(['replay', sys.argv[1]]); "
            "print(rc, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "nope")], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.stdout.split() == ["2", "False"], (done.stdout, done.stderr)
    assert "no such folder" in done.stderr


def test_a_spec_with_a_byte_order_mark_is_read(tmp_path):
    from design.spec import load_spec

    text = (ROOT / "specs" / "demo_local.json").read_text(encoding="utf-8")
    bom = tmp_path / "spec.json"
    bom.write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    assert load_spec(bom) == load_spec(ROOT / "specs" / "demo_local.json")


def test_more_eval_items_than_the_test_set_is_said_at_validation(tmp_path):
    from design.spec import load_spec
    from schemas.errors import SpecError

    spec = json.loads((ROOT / "specs" / "demo_local.json").read_text())
    spec["eval"]["n_examples"] = spec["dataset"]["options"]["n_test"] + 1
    spec.get("feasibility", {}).get("effective_config", {}).pop("n_eval", None)
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    with pytest.raises(SpecError, match=r"eval.n_examples.*is more than the 128 test items arithmetic has"):
        load_spec(path)


def test_a_kernel_file_that_is_a_directory_says_so(tmp_path):
    from design.spec import read_kernel_file

    with pytest.raises(ValueError, match="is a directory, not a kernel file"):
        read_kernel_file(str(tmp_path), None, None)


def test_group_mean_advantages_need_no_prompt_features(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rollouts = tmp_path / "r.parquet"
    pq.write_table(pa.table({"step": [0, 0, 0, 0], "prompt_id": ["a", "a", "b", "b"], "reward": [1.0, 0.0, 1.0, 1.0]}),
                   rollouts)
    assert main(["advantages", "--estimator", "group_mean", "--rollouts", str(rollouts), "--out", str(tmp_path / "o.parquet")]) == 0
    assert pq.read_table(tmp_path / "o.parquet").column("advantage").to_pylist() == [0.5, -0.5, 0.0, 0.0]
    # a kind that reads them still asks for them, by name
    rc = main(["advantages", "--estimator", "kernel_cross_prompt_baseline", "--rollouts", str(rollouts),
               "--out", str(tmp_path / "k.parquet")])
    assert rc == 2 and "prompt_num_tokens" in capsys.readouterr().err


def test_a_killed_saves_partial_folder_goes_with_the_next_save(tmp_path):
    """A model-sized `.tmp-<pid>` a killed process left is removed by the next save into the
    cache (its process gone, or older than STALE_PARTIAL_S); a live writer's is kept."""
    import os
    import time

    from engine.models import STALE_PARTIAL_S, remove_stale_partials

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    live_pid = os.getppid()  # alive, and not this process
    for name in (f".model-abc.tmp-{dead_pid}", f".model-abc.tmp-{live_pid}", f".tok-abc.damaged-{dead_pid}",
                 f".model-old.tmp-{live_pid + 0}x", "model-abc"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "weights").write_bytes(b"x" * 10)
    gone = remove_stale_partials(tmp_path)
    assert sorted(p.name for p in gone) == sorted([f".model-abc.tmp-{dead_pid}", f".tok-abc.damaged-{dead_pid}"])
    assert (tmp_path / f".model-abc.tmp-{live_pid}").is_dir() and (tmp_path / "model-abc").is_dir()
    later = time.time() + STALE_PARTIAL_S + 1  # the live pid's folder, a day later: stale whatever the pid says
    assert [p.name for p in remove_stale_partials(tmp_path, now=later)] == [f".model-abc.tmp-{live_pid}"]


def test_validate_of_a_spec_of_many_arms_is_one_screen(tmp_path, capsys):
    spec = json.loads((ROOT / "specs" / "demo_local.json").read_text())
    extra = {k: v for k, v in spec["arms"][1].items() if k not in ("role",)}
    spec["arms"] += [{**extra, "name": f"extra_{i}", "advantage": "batch_mean", "group_size": 1,
                      "groups_per_batch": spec["batch_size"]} for i in range(40)]
    spec.get("feasibility", {}).get("effective_config", {}).pop("arms", None)
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "... and 31 more arms (batch_mean)" in out and "extra_0, extra_1 and 38 more arms each against" in out
    assert "grpo_gs8" in out and "gs1_kernel" in out  # the compared pair is shown
    assert len(out.splitlines()) < 60


def test_the_calibration_cap_is_the_specs_and_its_default_hashes_as_before(tmp_path):
    """The calibration pilot's wall cap is a spec field (pilot.calibration_wall_minutes): the user's
    10 minutes by default, which leaves every existing spec's hash (its run directory) as it was;
    the demo specs size theirs for a slow or shared CPU and say so."""
    from design.spec import CALIBRATION_WALL_MINUTES, load_spec, parse_spec, spec_hash

    user = json.loads((ROOT / "specs" / "gs1_vs_grpo_gsm8k.json").read_text())
    assert load_spec(ROOT / "specs" / "gs1_vs_grpo_gsm8k.json").pilot.calibration_wall_minutes == CALIBRATION_WALL_MINUTES == 10
    stated = json.loads(json.dumps(user))
    stated.setdefault("pilot", {})["calibration_wall_minutes"] = 10
    longer = json.loads(json.dumps(user))
    longer.setdefault("pilot", {})["calibration_wall_minutes"] = 30
    assert spec_hash(parse_spec(stated)) == spec_hash(parse_spec(user)) != spec_hash(parse_spec(longer))
    for demo in ("demo_local.json", "comparison_demo_local.json"):
        spec = load_spec(ROOT / "specs" / demo)
        # 16.1 minutes: the demo's calibration pilot on the 2-core machine with two busy processes beside it
        assert spec.pilot.calibration_wall_minutes >= 2 * 16.1 and "16.1 minutes" in spec.notes


def test_a_hub_model_not_cached_is_one_line_before_the_run(tmp_path, capsys, monkeypatch, gsm8k_dir):
    """The user's spec names a hub id: without it in the local cache (and gs1 reads no hub at run
    time) `gs1 run` says so in one line, exit 2, before any run directory or flow."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    run_dir = tmp_path / "run"
    rc = main(["run", str(ROOT / "specs" / "gs1_vs_grpo_gsm8k.json"), "--run-dir", str(run_dir),
               "--data-dir", str(gsm8k_dir)])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "'Qwen/Qwen3.5-2B' is not in the local Hugging Face cache" in err
    assert not run_dir.exists()


def test_dispatch_groups_without_a_dispatch_is_one_line_before_the_run(tmp_path, capsys, monkeypatch):
    """`--dispatch-groups` says how to split a dispatched sweep: without `--dispatch` it is bad input,
    one line and exit 2 before any run directory, server or flow; fewer than 1 is argparse's line."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    run_dir = tmp_path / "run"
    with temporary_settings(restore_defaults={PREFECT_API_URL}):  # also where a harness set one
        rc = main(["run", str(ROOT / "specs" / "demo_local.json"), "--run-dir", str(run_dir), "--dispatch-groups", "2"])
    err = capsys.readouterr().err
    assert rc == 2 and err.strip() == "gs1: error: --dispatch-groups needs --dispatch: the deployment whose workers run the groups"
    assert not run_dir.exists()
    with pytest.raises(SystemExit) as stop:
        main(["run", "--dispatch-groups", "0"])
    assert stop.value.code == 2 and "must be >= 1" in capsys.readouterr().err


@pytest.mark.slow  # starts a Prefect server's process
def test_the_temporary_server_starts_beside_the_checks_and_a_failed_check_stops_it(tmp_path, capsys, monkeypatch,
                                                                                  gsm8k_dir):
    """With no PREFECT_API_URL, `gs1 run` launches its temporary Prefect server before it checks the
    model (and before the flow's imports), so that the server's start overlaps them; a check that
    then fails is still one line, exit 2, and the server it launched is stopped, not left running."""
    import huggingface_hub.constants
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from gs1 import run_control
    from rl.backends import BACKENDS

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    order, servers, processes = [], [], []
    launch = run_control.TemporaryServer.launch

    def launch_seen(server):
        order.append("launch")
        servers.append(server)
        launch(server)
        processes.append(server.process)

    check = type(BACKENDS["local"]).check_before_run

    def check_seen(backend, model):
        # the server's process is already running while the model is checked
        order.append("check" if servers and servers[0].process is not None and servers[0].process.poll() is None
                     else "check without a server running")
        check(backend, model)

    monkeypatch.setattr(run_control.TemporaryServer, "launch", launch_seen)
    monkeypatch.setattr(type(BACKENDS["local"]), "check_before_run", check_seen)
    # no API configured, also where the session's Prefect test harness set one in Prefect's settings
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        rc = main(["run", str(ROOT / "specs" / "gs1_vs_grpo_gsm8k.json"), "--run-dir", str(tmp_path / "run"),
                   "--data-dir", str(gsm8k_dir)])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.splitlines()) == 1 and "is not in the local Hugging Face cache" in err, err
    assert order == ["launch", "check"]
    assert servers[0].process is None and processes[0].poll() is not None  # stopped by `run` on the way out
    assert not (tmp_path / "run").exists()


def test_a_reasoning_gym_spec_without_reasoning_gym_is_one_line(tmp_path, capsys, monkeypatch):
    """reasoning-gym is a run dependency only where a spec names one of its families: without the
    package, `gs1 run` says which dataset needs it and how to install it, exit 2, before any run
    directory or flow."""
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # `import reasoning_gym` fails as when not installed
    monkeypatch.delitem(sys.modules, "rl.envs.reasoning_gym_env", raising=False)
    run_dir = tmp_path / "run"
    rc = main(["run", str(ROOT / "specs" / "basic_arithmetic_demo_local.json"), "--run-dir", str(run_dir)])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "dataset rg_basic_arithmetic: needs the reasoning-gym package" in err and "pip install -e '.[reasoning-gym]'" in err
    assert not run_dir.exists()


def test_a_data_dir_reaches_only_an_env_that_reads_one(tmp_path, capsys, monkeypatch):
    """GS1_GSM8K_DIR and --data-dir are GSM8K's: an env that generates its problems is handed none
    (a stale GS1_GSM8K_DIR is no error there, and an explicit --data-dir says it is not used), while
    for GSM8K a missing directory is still one line."""
    from gs1.commands.run import _data_dir
    from schemas.errors import UserError
    from schemas.names import env_data_dir, env_reads_data

    monkeypatch.setenv("GS1_GSM8K_DIR", str(tmp_path / "nowhere"))
    assert _data_dir("rg_basic_arithmetic", None) is None and capsys.readouterr().err == ""
    assert _data_dir("arithmetic", str(tmp_path)) is None
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and f"--data-dir {tmp_path} not used: dataset arithmetic generates its problems" in err
    with pytest.raises(UserError, match="no such directory"):
        _data_dir("gsm8k", None)
    assert _data_dir("gsm8k", str(tmp_path)) == str(tmp_path)
    assert env_reads_data("gsm8k") and not env_reads_data("rg_countdown") and not env_reads_data("arithmetic")
    assert env_data_dir("rg_lcm", "/data") is None and env_data_dir("gsm8k", "/data") == "/data"
