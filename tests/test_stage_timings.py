"""benchmarks/stage_timings.py: a `gs1 run` terminal log read into one row per stage, with the
engine's decode-graph compiles and model loads counted in the stage they happened in. The load
lines come from engine/models.py's own logger, in `gs1 run`'s console format, so the parser is
checked against what the engine writes."""

from __future__ import annotations

import io
import logging
import time

import pytest

from engine import models
from fixtures.benchmarks import load_benchmark

stage_timings = load_benchmark("stage_timings")

CONSOLE = logging.Formatter("%(asctime)s.%(msecs)03d | %(levelname)-7s | %(name)s - %(message)s", "%H:%M:%S")


@pytest.fixture
def engine_lines(monkeypatch):
    """The gs1.engine logger's lines in gs1 run's console format (gs1/commands/run.py)."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(CONSOLE)
    log = logging.getLogger("gs1.engine")
    level = log.level
    log.setLevel(logging.INFO)  # setLevel, not the attribute: it clears the loggers' isEnabledFor caches
    log.addHandler(handler)
    monkeypatch.setattr(models, "MODEL_LOAD_EVENTS", [])
    yield out
    log.removeHandler(handler)
    log.setLevel(level)


def _load(spec, how, seconds, device="cuda:0"):
    """One load as the engine logs it, `seconds` long."""
    src = models.ModelSource(spec, "/models/x", "x.gguf")
    models._record_load(src, how, time.perf_counter() - seconds, device)


def _at(clock, lines):
    """`lines` re-stamped at `clock` (they carry the time they were logged)."""
    return [clock + line[len(clock):] for line in lines]


def _compile(clock, what):
    """A decode-graph line as engine/generate.py logs it."""
    return (f"{clock} | INFO    | gs1.engine - decode graph 64 rows x 1024 positions on cuda:0: {what} "
            "(1 shapes compiled in this process)")


def _finished(clock, name):
    return f"{clock} | INFO    | Task run '{name}-1a2' - Finished in state Completed()"


def test_loads_and_compiles_are_counted_in_their_stage(engine_lines):
    spec = "pkg:llm_qwen/Qwen2.5-1.5B-Instruct.Q4_K_M.gguf"
    _load(spec, "tokenizer", 3.0, "cpu")
    _load(spec, "gguf", 50.0)
    preflight_loads = engine_lines.getvalue().splitlines()
    _load(spec, "reused", 0.2)
    pilot_loads = engine_lines.getvalue().splitlines()[len(preflight_loads):]
    log = "\n".join([
        _finished("10:00:00.000", "validate spec"),
        *_at("10:00:30.000", preflight_loads),
        _compile("10:01:40.000", "compiled and captured in 40.5 s"),
        _finished("10:02:00.000", "correctness preflight"),
        *_at("10:02:10.000", pilot_loads),
        _compile("10:02:20.000", "captured in 0.4 s"),
        _finished("10:03:00.000", "pilot"),
    ])
    rows = {r["stage"]: r for r in stage_timings.stage_table(log)}
    assert list(rows) == ["validate spec", "correctness preflight", "pilot"]
    preflight, pilot = rows["correctness preflight"], rows["pilot"]
    assert preflight["seconds"] == 120.0 and pilot["seconds"] == 60.0
    assert (preflight["compiled"], preflight["captured"], preflight["compile_seconds"]) == (1, 1, 40.5)
    assert (pilot["compiled"], pilot["captured"], pilot["compile_seconds"]) == (0, 1, 0.0)
    # the events' seconds, as logged (one decimal): the tokenizer and the dequantised GGUF
    logged = [round(e.seconds, 1) for e in models.MODEL_LOAD_EVENTS]
    assert preflight["loads"] == 2 and preflight["load_seconds"] == pytest.approx(sum(logged[:2]))
    assert pilot["loads"] == 0 and pilot["load_seconds"] == pytest.approx(logged[2])  # a reuse: no load
    assert rows["validate spec"]["loads"] == 0 and rows["validate spec"]["load_seconds"] == 0.0


def test_the_load_line_names_the_model_how_and_device(engine_lines):
    _load("/models/tiny dir/m.gguf", "converted", 1.25, "cpu")  # a path with a space
    event = models.MODEL_LOAD_EVENTS[-1]
    assert (event.spec, event.how, event.device) == ("/models/tiny dir/m.gguf", "converted", "cpu")
    line = engine_lines.getvalue().splitlines()[-1]
    m = stage_timings.LOAD.search(line)
    assert m and m.group(1) == event.spec and m.group(2) == "converted" and m.group(4) == "cpu"
    assert float(m.group(3)) == pytest.approx(event.seconds, abs=0.05)


def test_the_printed_table_shows_compiles_compile_and_load_seconds(tmp_path, capsys):
    log = "\n".join([
        "09:59:00.000 | INFO    | gs1.engine - model m loaded (gguf) in 12.5 s on cuda:0",
        _compile("09:59:30.000", "compiled and captured in 7.0 s"),
        _finished("10:00:00.000", "correctness preflight"),
    ])
    (tmp_path / "flow.log").write_text(log)
    assert stage_timings.main([str(tmp_path / "flow.log")]) == 0
    header, _, row, total = capsys.readouterr().out.strip().splitlines()
    cells = dict(zip([c.strip() for c in header.strip("|").split("|")], [c.strip() for c in row.strip("|").split("|")]))
    assert cells["stage"] == "correctness preflight"
    assert (cells["graphs compiled (decode, learner)"], cells["compile s"]) == ("1", "7.0")
    assert (cells["model loads"], cells["model load s"]) == ("1", "12.5")
    assert total.startswith("| total |")


def test_the_learner_compile_counts_in_its_stage_and_is_no_captured_graph():
    log = "\n".join([
        _finished("10:00:00.000", "calibration gate"),
        _compile("10:00:20.000", "captured in 0.2 s"),
        "10:01:10.000 | INFO    | gs1.engine - learner: decoder layers compiled on cuda:0 in 41.3 s "
        "(first compiled microbatch, 16100 tokens)",
        _finished("10:02:00.000", "train grpo_gs8-s0"),
    ])
    row = {r["stage"]: r for r in stage_timings.stage_table(log)}["train grpo_gs8-s0"]
    assert (row["compiled"], row["compile_seconds"], row["captured"]) == (1, 41.3, 1)


def test_a_compile_line_with_its_cache_reads_still_counts():
    """The engine's compile lines end with what the on-disk caches answered
    (`engine.generate.CacheReads`): the table reads them as before."""
    from engine.generate import CacheReads

    reads = str(CacheReads(autograd_hit=1, autograd_miss=1, inductor_hit=2))
    log = "\n".join([
        _finished("10:00:00.000", "calibration gate"),
        "10:00:20.000 | INFO    | gs1.engine - decode graph 64 rows x 1024 positions on cuda:0: compiled and "
        f"captured in 13.1 s (5 shapes compiled in this process; {reads})",
        "10:01:10.000 | INFO    | gs1.engine - learner: decoder layers compiled on cuda:0 in 36.7 s "
        f"(15 datums x 704 positions; 1 graphs so far; {reads})",
        _finished("10:02:00.000", "train grpo_gs8"),
    ])
    row = {r["stage"]: r for r in stage_timings.stage_table(log)}["train grpo_gs8"]
    assert (row["compiled"], row["compile_seconds"], row["captured"]) == (2, pytest.approx(49.8), 1)
    assert reads == "autograd cache 1 hit 1 miss 0 bypass, inductor cache 2 hit 0 miss 0 bypass"


@pytest.mark.slow
def test_start_to_flow_times_a_real_gs1_run_up_to_its_first_stage_and_stops_it(tmp_path, capsys):
    """benchmarks/start_to_flow.py: a fresh `gs1 run` of the demo spec, on its own temporary
    server, timed by stage_timings from the process's start to 'validate spec' finishing, then
    stopped by SIGTERM as a user's Ctrl-C would: gs1 run's one stop line, and the stage's
    cached result kept for a resume."""
    start_to_flow = load_benchmark("start_to_flow")
    assert start_to_flow.main(["--draws", "1", "--work", str(tmp_path)]) == 0
    table = capsys.readouterr().out.splitlines()
    seconds = float(table[2].split("|")[2])
    assert 0 < seconds < start_to_flow.WAIT_S and table[-1] == f"| median | {seconds:.1f} |"
    log = (tmp_path / "draw0.log").read_text()
    assert "Task run 'validate spec' - Finished in state Completed()" in log
    assert "gs1: stopped by SIGTERM" in log and "Traceback" not in log
    assert any((tmp_path / "draw0" / ".stage-results").iterdir())
