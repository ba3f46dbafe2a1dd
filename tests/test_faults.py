"""Fault injection on `gs1 run` (real processes, the tiny model): kill -9 at each stage and
resume, damage each kind of output, fill the disk under the run dir and under the local cache,
two runs on one run dir at once. Each must lose nothing and end on the decision of an
uninterrupted run.

Minutes long, so not in the default run:  pytest -m faults tests/test_faults.py -v
(the full-disk test mounts small tmpfs folders, so it needs root; it is skipped otherwise).
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from fixtures.gs1_process import start_gs1_run, wait_for
from fixtures.tiny_model import tiny_model_dir  # noqa: F401
from test_flow import flow_spec

pytestmark = pytest.mark.faults

FULL_RUN_S = 1200  # a whole tiny run on a loaded 2-core machine, with room to spare
# The stages in flow order, each told by the first file it writes.
STAGE_MARKERS = [
    ("validate spec", "spec/plan.json"),
    ("correctness preflight", "preflight"),
    ("offline unit checks", "unit_checks"),
    ("pilot", "pilot"),
    ("audit (pilot)", "audit/pilot"),
    ("activation gate", "gate"),
    ("feasibility", "feasibility"),
    ("training", "train/gs1_kernel/steps"),
    ("audit (train)", "audit/train"),
    ("eval", "eval"),
    ("decision", "decision"),
]


def _run_to_end(spec, workdir: Path, run_dir: Path, cache: Path, log: str) -> tuple[int, str]:
    proc = start_gs1_run(spec, workdir, run_dir, cache, log)
    rc = proc.wait(timeout=FULL_RUN_S)
    return rc, (workdir / f"{log}.err").read_text()


def _decision(run_dir: Path) -> dict:
    return json.loads((run_dir / "decision" / "decision.json").read_text())


def _all_outputs_verify(run_dir: Path) -> None:
    """Every output, as last recorded, still matches its hash. (A stage whose inputs changed ran
    under a new key; the record of its old key is superseded: it is never served unless those
    inputs recur, and then only if its outputs verify.)"""
    from pipeline.cache import OUTPUTS_SUFFIX, damaged_output

    manifests = sorted((run_dir / ".stage-results").glob(f"*{OUTPUTS_SUFFIX}"), key=lambda m: m.stat().st_mtime)
    assert manifests
    latest: dict[str, str] = {}
    for manifest in manifests:
        if (manifest.parent / manifest.name.removesuffix(OUTPUTS_SUFFIX)).exists():
            latest.update(json.loads(manifest.read_text())["outputs"])
    assert damaged_output(latest) is None


@pytest.fixture(scope="module")
def spec(repo_root, tiny_model_dir) -> dict:
    return flow_spec(repo_root, tiny_model_dir)


@pytest.fixture(scope="module")
def reference(spec, tmp_path_factory) -> dict:
    """The decision of an uninterrupted run."""
    workdir = tmp_path_factory.mktemp("reference")
    rc, err = _run_to_end(spec, workdir, workdir / "run", workdir / "cache", "gs1")
    assert rc == 0, err[-3000:]
    return _decision(workdir / "run")


def test_kill_9_at_each_stage_then_resume(spec, reference, tmp_path):
    run_dir, cache = tmp_path / "run", tmp_path / "cache"
    for n, (stage, marker) in enumerate(STAGE_MARKERS):
        proc = start_gs1_run(spec, tmp_path, run_dir, cache, f"kill-{n}")
        try:
            wait_for(lambda: (run_dir / marker).exists(), FULL_RUN_S, f"{stage} to start", proc, interval=0.02)
        except AssertionError:
            if proc.poll() == 0:  # the stage came and went between two looks: the run is done
                break
            raise
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    rc, err = _run_to_end(spec, tmp_path, run_dir, cache, "resumed")
    assert rc == 0, err[-3000:]
    assert _decision(run_dir) == reference
    _all_outputs_verify(run_dir)


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: max(1, path.stat().st_size // 3)])


def _damages(run_dir: Path) -> list[tuple[str, Path, object]]:
    """(kind of output, file, how to damage it) for every kind of file a run writes."""
    sampler = Path(json.loads((run_dir / "train/grpo_gs8/final.json").read_text())["sampler_path"])
    checkpoints = run_dir / "train/gs1_kernel/checkpoints.parquet"
    state = Path(pq.read_table(checkpoints).to_pylist()[-1]["state_path"]) if checkpoints.exists() else None
    records = sorted(p for p in (run_dir / ".stage-results").iterdir() if "." not in p.name)
    kinds = [
        ("spec plan", run_dir / "spec/plan.json", _truncate),
        ("preflight record", run_dir / "preflight/record.json", Path.unlink),
        ("unit checks", run_dir / "unit_checks/details.json", _truncate),
        ("pilot rollouts", run_dir / "pilot/gs1_kernel/rollouts.parquet", _truncate),
        ("pilot held-out", run_dir / "pilot/heldout.parquet", Path.unlink),
        ("pilot audit", run_dir / "audit/pilot/gate_report.parquet", _truncate),
        ("gate report", run_dir / "gate/gate_report.parquet", _truncate),
        ("feasibility", run_dir / "feasibility/feasibility.json", lambda p: p.write_text("{}")),
        ("training step log", run_dir / "train/gs1_kernel/steps/step-00001.rollouts.parquet", _truncate),
        ("training rollouts", run_dir / "train/gs1_kernel/rollouts.parquet", _truncate),
        ("training metrics", run_dir / "train/grpo_gs8/step_metrics.parquet", Path.unlink),
        ("final record", run_dir / "train/grpo_gs8/final.json", _truncate),
        ("training audit mismatches", run_dir / "audit/train/mismatches.parquet", Path.unlink),
        ("sampler adapter", sampler / "adapter_model.safetensors", _truncate),
        ("eval jsonl (cut)", run_dir / "eval/gs1_kernel/eval.jsonl", _truncate),
        ("eval jsonl (deleted)", run_dir / "eval/grpo_gs8/eval.jsonl", Path.unlink),
        ("eval parquet", run_dir / "eval/gs1_kernel/eval.parquet", _truncate),
        ("decision", run_dir / "decision/decision.json", lambda p: p.write_text('{"verdict": "noninferior"}')),
        ("stored stage result", records[0], _truncate),
    ]
    if state is not None:
        kinds.append(("checkpoint state", state / "adapter_model.safetensors", _truncate))
    return kinds


def test_damage_each_kind_of_output_then_rerun(spec, reference, tmp_path):
    run_dir, cache = tmp_path / "run", tmp_path / "cache"
    rc, err = _run_to_end(spec, tmp_path, run_dir, cache, "first")
    assert rc == 0, err[-3000:]
    for n, (kind, path, damage) in enumerate(_damages(run_dir)):
        damage(path)
        rc, err = _run_to_end(spec, tmp_path, run_dir, cache, f"damaged-{n}")
        assert rc == 0, (kind, err[-3000:])
        assert _decision(run_dir) == reference, kind
        _all_outputs_verify(run_dir)


def _stage_record(run_dir: Path, output: str) -> Path:
    """The stored result of the stage whose manifest records `output` (a path under the run)."""
    from pipeline.cache import OUTPUTS_SUFFIX

    want = str((run_dir / output).resolve())
    for manifest in (run_dir / ".stage-results").glob(f"*{OUTPUTS_SUFFIX}"):
        if want in json.loads(manifest.read_text())["outputs"]:
            return manifest.parent / manifest.name.removesuffix(OUTPUTS_SUFFIX)
    raise AssertionError(f"no manifest records {output}")


def _all_correct(eval_jsonl: Path) -> None:
    rows = [json.loads(line) for line in eval_jsonl.read_text().splitlines()]
    eval_jsonl.write_text("".join(json.dumps({**row, "correct": True}) + "\n" for row in rows))


def test_a_result_is_never_served_without_its_proof(spec, reference, tmp_path):
    """Issue 27's reproduction: the eval stage's manifest deleted and every item of its eval.jsonl
    made correct must not turn the decision; nor may a manifest, or a stored result, of another
    stage put in its place. Each time the stage runs again with one warning, and the decision is
    the uninterrupted run's."""
    from pipeline.cache import OUTPUTS_SUFFIX

    run_dir, cache = tmp_path / "run", tmp_path / "cache"
    rc, err = _run_to_end(spec, tmp_path, run_dir, cache, "first")
    assert rc == 0, err[-3000:]
    eval_jsonl = "eval/gs1_kernel/eval.jsonl"

    def manifest_of(record: Path) -> Path:
        return record.with_name(record.name + OUTPUTS_SUFFIX)

    def delete_manifest(record: Path, other: Path) -> None:
        manifest_of(record).unlink()

    def another_stages_manifest(record: Path, other: Path) -> None:
        manifest_of(record).write_bytes(manifest_of(other).read_bytes())

    def another_stages_result(record: Path, other: Path) -> None:
        record.write_bytes(other.read_bytes())

    for n, swap in enumerate((delete_manifest, another_stages_manifest, another_stages_result)):
        record = _stage_record(run_dir, eval_jsonl)
        other = _stage_record(run_dir, "decision/decision.json")
        swap(record, other)
        _all_correct(run_dir / eval_jsonl)
        rc, err = _run_to_end(spec, tmp_path, run_dir, cache, f"proof-{n}")
        assert rc == 0, (swap.__name__, err[-3000:])
        assert _decision(run_dir) == reference, swap.__name__
        log = err + (tmp_path / f"proof-{n}.out").read_text()
        assert "running the stage 'eval' again" in log, (swap.__name__, log[-3000:])
        _all_outputs_verify(run_dir)


def _mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True, capture_output=True)


def _grow_tmpfs(path: Path, size: str) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(path)], check=True, capture_output=True)


@pytest.fixture
def tmpfs(tmp_path):
    """A tmpfs mounter (root only); every mount is undone after the test."""
    probe = tmp_path / "probe"
    try:
        _mount_tmpfs(probe, "64k")
    except (subprocess.CalledProcessError, FileNotFoundError):
        pytest.skip("mounting a tmpfs needs root")
    subprocess.run(["umount", str(probe)], check=True)
    mounted: list[Path] = []

    def mount(path: Path, size: str) -> Path:
        _mount_tmpfs(path, size)
        mounted.append(path)
        return path

    yield mount
    for path in reversed(mounted):
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


@pytest.mark.parametrize("full", ["run dir", "local cache"])
def test_a_full_disk_is_one_line_and_the_rerun_with_space_resumes(spec, reference, tmp_path, tmpfs, full):
    # Sized to fill part way through: the tiny run's dir holds ~1.1 MB by the end (~0.4 MB before
    # training), its local cache ~150 kB of adapters.
    run_dir = tmpfs(tmp_path / "run", "200k") if full == "run dir" else tmp_path / "run"
    cache = tmpfs(tmp_path / "cache", "48k") if full == "local cache" else tmp_path / "cache"
    rc, err = _run_to_end(spec, tmp_path, run_dir, cache, "full")
    lines = err.strip().splitlines()
    last = lines[-1]
    assert rc in (1, 2) and "no space left" in last.lower(), err[-3000:]
    assert "Traceback" not in err
    # said once: nothing before gs1's line about it (Prefect's failed states, a result not written)
    before = (err + (tmp_path / "full.out").read_text()).lower().replace(last.lower(), "")
    assert not any(mark in before for mark in ("no space left", "failed to write result", "errno 28")), err[-3000:]
    _grow_tmpfs(run_dir if full == "run dir" else cache, "512m")
    rc, err = _run_to_end(spec, tmp_path, run_dir, cache, "after")
    assert rc == 0, err[-3000:]
    assert _decision(run_dir) == reference
    _all_outputs_verify(run_dir)


def test_two_runs_on_one_run_dir(spec, reference, tmp_path):
    run_dir, cache = tmp_path / "run", tmp_path / "cache"
    first = start_gs1_run(spec, tmp_path, run_dir, cache, "first")
    wait_for(lambda: (run_dir / "spec").exists(), FULL_RUN_S, "the first run to start", first)
    second = subprocess.run(
        first.args, env={**first_env(cache)}, cwd=Path(__file__).parents[1], capture_output=True, text=True, timeout=120
    )
    assert second.returncode == 2, second.stderr[-2000:]
    assert f"is in use by another gs1 run (pid {first.pid} " in second.stderr
    assert len(second.stderr.strip().splitlines()) == 1
    assert first.wait(timeout=FULL_RUN_S) == 0, (tmp_path / "first.err").read_text()[-3000:]
    assert _decision(run_dir) == reference


def first_env(cache: Path) -> dict:
    import os

    from fixtures.gs1_process import TESTS

    env = {**os.environ, "PYTHONPATH": str(TESTS), "GS1_LOCAL_CACHE": str(cache)}
    env.pop("PREFECT_API_URL", None)
    return env



# ------------------------------------------------- a units folder (issue 47): `gs1 decide --spec --units`

DECIDE_S = 120  # one `gs1 decide` of six made-up units on a loaded 2-core machine, with room to spare


def _decide(spec_path: Path, units: Path, *collect: Path) -> subprocess.Popen:
    """`gs1 decide --spec --units [--collect RUN]` as its own process (what a user runs)."""
    import sys

    args = [sys.executable, "-m", "gs1", "decide", "--spec", str(spec_path), "--units", str(units)]
    for run in collect:
        args += ["--collect", str(run)]
    return subprocess.Popen(args, cwd=Path(__file__).parents[1], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, stdin=subprocess.DEVNULL)


@pytest.fixture
def units_run(tmp_path) -> tuple[Path, Path, bytes]:
    """(spec file, a made-up run directory with all six units, the decision.json an uninterrupted
    `decide --collect` of it writes)."""
    from fixtures.units_folder import fake_run, small_comparison_spec

    spec_path = small_comparison_spec(tmp_path / "spec")
    run = fake_run(tmp_path / "run", spec_path)
    proc = _decide(spec_path, tmp_path / "reference", run)
    out, err = proc.communicate(timeout=DECIDE_S)
    assert proc.returncode == 0, err[-3000:]
    return spec_path, run, (tmp_path / "reference" / "decision" / "decision.json").read_bytes()


def test_a_damaged_units_folder_decides_nothing(units_run, tmp_path):
    """Issue 47: each damage of a collected unit (tests/test_units_proof.py's DAMAGES: flipped
    outcomes, a train file or the costs deleted, another arm's or seed's eval file, every eval file
    cut to 45 of 48 items, another unit's folder, the proof deleted): `gs1 decide` exits 2 on one
    line naming the unit and writes nothing (no decision, the folder byte for byte as it was)."""
    import shutil

    from fixtures.units_folder import snapshot
    from test_units_proof import DAMAGES

    spec_path, run, _ = units_run
    clean = tmp_path / "clean"
    proc = _decide(spec_path, clean, run)
    assert proc.wait(timeout=DECIDE_S) == 0
    for n, (kind, (damage, unit)) in enumerate(DAMAGES.items()):
        units = tmp_path / f"damaged-{n}"
        shutil.copytree(clean, units)
        shutil.rmtree(units / "decision")
        damage(units)
        before = snapshot(units)
        out, err = _decide(spec_path, units).communicate(timeout=DECIDE_S)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("gs1: error: ") and f"unit {unit}" in lines[0], (kind, err)
        assert not (units / "decision").exists() and snapshot(units) == before, kind


def _kill_when(proc: subprocess.Popen, ready, timeout: float) -> bool:
    """SIGKILL `proc` as soon as `ready()` (polled every 2 ms); False when it ended first."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        if ready():
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            return True
        time.sleep(0.002)
    proc.kill()
    raise AssertionError("no marker within the time")


def _decision_is_whole(units: Path, reference: bytes, old: bool) -> None:
    """decision/ absent, or complete: the new one (the reference's record, its four files) or,
    where `old`, the old one as it was (its marker file beside the four)."""
    folder = units / "decision"
    if not folder.exists():
        assert not old, "the old decision is gone and no new one is in its place"
        return
    names = sorted(p.name for p in folder.iterdir())
    whole = ["comparisons.parquet", "decision.json", "decision.md", "decision.parquet"]
    assert names in (whole, sorted([*whole, "old.txt"])) if old else names == whole, names
    assert (folder / "decision.json").read_bytes() == reference


def test_kill_9_during_decide_collect_leaves_no_half_decision(units_run, tmp_path):
    """Issue 47: `gs1 decide --collect` killed at each point it writes (a unit being staged, the
    gates' records, the decision being staged and renamed in, the table) and at fixed moments:
    every unit folder there passes its proof, decision/ is absent or whole (the old one or the new
    one where one was there), and the same command run again ends on the uninterrupted decision."""
    import shutil
    import time

    from decision.units import check_units
    from design.spec import load_spec
    from schemas.layout import UnitsLayout

    spec_path, run, reference = units_run
    spec = load_spec(spec_path)
    start = time.monotonic()
    proc = _decide(spec_path, tmp_path / "timed", run)
    assert proc.wait(timeout=DECIDE_S) == 0
    whole_run = time.monotonic() - start
    markers = ["*.swap", "grpo_gs8-s0", "runs", ".decision.*.swap", "decision", "comparison.md"]
    cases = [("marker", m, False) for m in markers] + [("marker", ".decision.*.swap", True)]
    cases += [("after", f, False) for f in (0.5, 0.7, 0.85, 0.95)] + [("after", 0.9, True)]
    killed = 0
    for n, (how, at, old) in enumerate(cases):
        units = tmp_path / f"kill-{n}"
        if old:  # a folder already decided: the kill comes while the new decision replaces it
            shutil.copytree(tmp_path / "timed", units)
            (units / "decision" / "old.txt").write_text("the old decision")
        proc = _decide(spec_path, units, run)
        if how == "marker":
            hit = _kill_when(proc, lambda: any(units.glob(at)), DECIDE_S)
        else:
            t0 = time.monotonic()
            hit = _kill_when(proc, lambda: time.monotonic() - t0 > at * whole_run, DECIDE_S)
        killed += hit
        if units.exists():
            _decision_is_whole(units, reference, old)
            check_units(spec, UnitsLayout(units))  # every unit there is whole, with its proof
        again = _decide(spec_path, units, run)
        out, err = again.communicate(timeout=DECIDE_S)
        assert again.returncode == 0, (how, at, err[-3000:])
        assert (units / "decision" / "decision.json").read_bytes() == reference, (how, at)
        assert not list(units.glob(".*.swap")), (how, at)
    assert killed >= len(cases) // 2, f"only {killed} of {len(cases)} kills landed before the command ended"
