"""The H100 folders of sessions 24-32 (results/h200-engine/h100-s*/) carry the README's numbers:
the learner under each memory setting, the 16-adapter RL step before and after the learner's
memory plan, where a decode step goes (diagnostics and kernel profiles), the user's spec cold and
warm, and the 16 units run together (their step and stage tables, and a decision the pipeline's
own collect re-derives from units that carry their proof) are read back from the committed files,
and each folder names the card and tree that ran it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

S24 = Path(__file__).resolve().parents[1] / "results" / "h200-engine" / "h100-s24"


def _table_rows(text: str, first: str) -> list[list[str]]:
    """The cells of the markdown rows whose first cell is `first`."""
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines()
            if line.startswith("|")]
    return [r for r in rows if r[0] == first]


def _learner(path: Path) -> tuple[float, int, float]:
    """(mean timed fwd+bwd s, tokens a microbatch, peak GiB) of a learner table."""
    text = path.read_text()
    timed = _table_rows(text, "train")
    assert len(timed) == 2, path
    tokens = int(re.search(r"tokens per microbatch: (\d+)", text).group(1))
    return sum(float(r[1]) for r in timed) / 2, tokens, float(timed[0][6])


def _adapters_row(path: Path, n: int) -> dict[str, float]:
    heads = ["adapters", "rows", "batches", "decode_ms", "x", "sample_s", "train_s", "step_s", "x2",
             "held", "per_arm", "own", "peak"]
    (row,) = _table_rows(path.read_text(), str(n))
    return {h: float(v) for h, v in zip(heads, row)}


def test_each_folder_names_the_h100_and_the_tree_that_ran_it():
    trees = {}
    for folder in sorted(p for p in S24.iterdir() if p.is_dir()):
        gpu = (folder / "gpu.txt").read_text()
        assert "NVIDIA H100 80GB HBM3" in gpu and "torch 2.11.0+cu130" in gpu
        trees[folder.name] = gpu.strip().splitlines()[-1][:7]
    assert trees == {"1-16-cold": "318371a", "16-expandable": "318371a", "1-16-warm": "318371a",
                     "learner-settings": "318371a", "planned-memory": "547720f"}


def test_the_learner_settings_read_as_the_readme_says():
    got = {name: _learner(S24 / "learner-settings" / "learner" / f"{name}.txt")
           for name in ("checkpointed", "unchecked", "compiled")}
    got["planned"] = _learner(S24 / "planned-memory" / "learner" / "planned.txt")
    assert got["checkpointed"][0] == pytest.approx(2.786, abs=1e-3)
    assert got["planned"][0] == pytest.approx(1.394, abs=1e-3)
    # the plan cut the microbatch (16,384 -> 11,040 tokens, aligned to 16) and ran unchecked, compiled
    assert [got[k][1] for k in ("checkpointed", "unchecked", "compiled", "planned")] == [16384, 16384, 16384, 11040]
    assert got["planned"][1] % 16 == 0
    text = (S24 / "planned-memory" / "learner" / "planned.txt").read_text()
    assert "gradient checkpointing: False (auto)" in text and "compiled layers: True" in text
    # twice as fast as the checkpointed learner, within 5 % of the uncut compiled one, 15 GiB less at peak
    assert got["checkpointed"][0] / got["planned"][0] == pytest.approx(2.0, abs=0.05)
    assert got["planned"][0] / got["compiled"][0] < 1.05
    assert got["compiled"][2] - got["planned"][2] == pytest.approx(15.3, abs=0.1)


def test_the_16_adapter_step_before_and_after_the_memory_plan():
    before = _adapters_row(S24 / "16-expandable" / "speed" / "adapters.txt", 16)
    again = _adapters_row(S24 / "1-16-warm" / "speed" / "adapters.txt", 16)
    after = _adapters_row(S24 / "planned-memory" / "speed" / "adapters.txt", 16)
    assert before["step_s"] == pytest.approx(67.22) and after["step_s"] == pytest.approx(47.62)
    assert abs(before["step_s"] - again["step_s"]) < 0.1  # the two draws before the lever agree
    # the sampler did not move; the learner's share did: 16 x 2.86 -> 16 x 1.62
    assert after["sample_s"] == pytest.approx(before["sample_s"], rel=0.02)
    assert 16 * (before["train_s"] - after["train_s"]) == pytest.approx(before["step_s"] - after["step_s"], rel=0.05)
    assert after["per_arm"] == pytest.approx(2.66, abs=0.01) and after["peak"] < 78
    header = (S24 / "planned-memory" / "speed" / "adapters.txt").read_text()
    assert "compiled_learner=True gradient_checkpointing=False" in header
    assert "compiled_learner=False gradient_checkpointing=True" in (S24 / "16-expandable" / "speed" / "adapters.txt").read_text()


def test_the_first_16_adapter_row_died_of_fragmentation_and_the_next_ran_with_expandable_segments():
    log = (S24 / "1-16-cold" / "speed" / "engine.log").read_text()
    assert "CUDA out of memory. Tried to allocate 5.47 GiB" in log and "12.22 GiB is reserved by PyTorch but unallocated" in log
    assert "speed-rc 1" in (S24 / "1-16-cold" / "times.txt").read_text()
    assert "speed-rc 0" in (S24 / "16-expandable" / "times.txt").read_text()


S25 = S24.parent / "h100-s25"


def _diagnostics(path: Path) -> dict[tuple[int, int], dict[str, float]]:
    """The `diagnostics, R rows x P positions: {...}` lines of an adapters table."""
    import ast

    found = re.findall(r"^diagnostics, (\d+) rows x (\d+) positions: (\{.*\})$", path.read_text(), re.M)
    return {(int(r), int(p)): ast.literal_eval(d) for r, p, d in found}


def _kernels_ms(part: str, name_starts: str | tuple[str, ...]) -> float:
    """Self CUDA ms of a profile table's kernels whose name starts with any of `name_starts`."""
    total, seen = 0.0, set()
    for line in part.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if cells and cells[0].startswith(name_starts) and (cells[0], cells[6]) not in seen:
            # the profile lists a compiled kernel twice (its launch and its run, the same time);
            # two kernels of one truncated name keep their own times
            seen.add((cells[0], cells[6]))
            value = cells[6]
            total += float(value[:-2]) / 1000 if value.endswith("us") else float(value[:-2])
    return total


def _profile_ms(path: Path, rows: int, name_start: str) -> float:
    """Self CUDA ms of the kernels whose name starts with `name_start` in the profile of `rows` rows."""
    text = path.read_text()
    part = text[text.index(f"{rows} rows x "):]
    return _kernels_ms(part[:part.index("Self CUDA time total")], name_start)


def _profile_total_ms(path: Path, rows: int) -> float:
    """The `Self CUDA time total` of the eager step's profile at `rows` rows."""
    text = path.read_text()
    part = text[text.index(f"{rows} rows x "):]
    value = re.search(r"Self CUDA time total: ([\d.]+)(ms|us)", part)
    return float(value.group(1)) / (1000 if value.group(2) == "us" else 1)


def test_session_25_names_the_h100_and_the_tree_and_where_a_decode_step_goes():
    for folder in ("sdpa-1-diagnose", "flex-1-16"):
        gpu = (S25 / folder / "gpu.txt").read_text()
        assert "NVIDIA H100 80GB HBM3" in gpu and gpu.strip().splitlines()[-1].startswith("63ace4d")
    sdpa_txt, flex_txt = S25 / "sdpa-1-diagnose" / "speed" / "adapters.txt", S25 / "flex-1-16" / "speed" / "adapters.txt"
    assert "decode_attention=sdpa" in sdpa_txt.read_text() and "decode_attention=flex" in flex_txt.read_text()
    sdpa, flex = _adapters_row(sdpa_txt, 1), _adapters_row(flex_txt, 1)
    assert sdpa["decode_ms"] == pytest.approx(9.29) and flex["decode_ms"] == pytest.approx(12.17)
    # the default path reproduces session 24's draw on the same card
    assert sdpa["decode_ms"] == pytest.approx(_adapters_row(S24 / "1-16-warm" / "speed" / "adapters.txt", 1)["decode_ms"], rel=0.01)
    assert _adapters_row(flex_txt, 16)["decode_ms"] == pytest.approx(59.43)
    d_sdpa, d_flex = _diagnostics(sdpa_txt), _diagnostics(flex_txt)
    one, many = d_sdpa[128, 1024], d_flex[1024, 1024]
    assert one["attention masked 1024 positions x28 ms"] == pytest.approx(2.313)
    assert many["attention masked 1024 positions x28 ms"] == pytest.approx(13.992)
    # reading the live positions only halves the attention, at either row count
    for d in (one, many):
        assert d["attention live 592 positions x28 ms"] / d["attention masked 1024 positions x28 ms"] == pytest.approx(0.5, abs=0.03)
    assert many["sample_step ms"] == pytest.approx(3.978)
    # at one adapter the bank's float32 LoRA GEMMs are 37 % of the eager step's CUDA time, the attention 27 %
    lora = sum(_profile_ms(sdpa_txt, 128, k) for k in ("void cutlass::Kernel2<cutlass_80_simt_sgemm",
                                                      "void cublasLt::splitKreduce_kernel", "sm80_xmma_gemm_f32f32"))
    assert lora == pytest.approx(2.706, abs=0.002)
    assert _profile_total_ms(sdpa_txt, 128) == pytest.approx(7.344)
    assert lora / _profile_total_ms(sdpa_txt, 128) == pytest.approx(0.37, abs=0.005)
    assert _profile_ms(sdpa_txt, 128, "fmha_cutlassF_bf16") == pytest.approx(1.978)
    # FlexAttention's general kernel: 4x SDPA's at 128 rows
    assert _profile_ms(flex_txt, 128, "triton_tem_fused_flex_attention") == pytest.approx(7.885)
    assert _profile_ms(flex_txt, 1024, "triton_tem_fused_flex_attention") == pytest.approx(61.702)


S27 = S24.parent / "h100-s27"


def _learner_profile_ms(path: Path, name_starts: tuple[str, ...]) -> float:
    """Self CUDA ms of the kernels starting with any of `name_starts` in a learner's profile."""
    text = path.read_text()
    return _kernels_ms(text[text.index("its kernels by CUDA time"):text.index("Self CUDA time total")], name_starts)


def test_session_27_reads_as_the_readme_says_and_the_defaults_follow_it(monkeypatch):
    folders = ("sdpa-1-diagnose", "sdpa-1-tf32", "flex-1-16", "flex-1-tf32", "learner-tf32")
    for folder in folders:
        gpu = (S27 / folder / "gpu.txt").read_text()
        assert "NVIDIA H100 80GB HBM3" in gpu and gpu.strip().splitlines()[-1].startswith("912b435")
    table = {f: S27 / f / "speed" / "adapters.txt" for f in folders[:4]}
    settings = {f: re.search(r"tf32=(\w+) .*decode_attention=(\w+)", t.read_text()).groups() for f, t in table.items()}
    assert settings == {"sdpa-1-diagnose": ("False", "sdpa"), "sdpa-1-tf32": ("True", "sdpa"),
                        "flex-1-16": ("False", "flex"), "flex-1-tf32": ("True", "flex")}
    one = {f: _adapters_row(t, 1) for f, t in table.items()}
    assert {f: r["decode_ms"] for f, r in one.items()} == pytest.approx(
        {"sdpa-1-diagnose": 7.84, "sdpa-1-tf32": 6.47, "flex-1-16": 6.91, "flex-1-tf32": 5.58})
    assert one["flex-1-tf32"]["step_s"] == pytest.approx(4.32) and all(r["rows"] == 64 for r in one.values())
    # against session 25's default on the same card (128 graphed rows then): each lever moved the step
    s25 = _adapters_row(S25 / "sdpa-1-diagnose" / "speed" / "adapters.txt", 1)
    assert s25["decode_ms"] > one["sdpa-1-diagnose"]["decode_ms"] > one["flex-1-16"]["decode_ms"] > one["flex-1-tf32"]["decode_ms"]
    many = _adapters_row(table["flex-1-16"], 16)
    assert (many["decode_ms"], many["sample_s"], many["step_s"], many["per_arm"]) == pytest.approx((23.82, 16.94, 43.92, 2.66))
    s24 = _adapters_row(S24 / "planned-memory" / "speed" / "adapters.txt", 16)
    assert s24["decode_ms"] == pytest.approx(33.5, abs=0.05) and s24["step_s"] == pytest.approx(47.6, abs=0.1)
    # the learner, run an adapter after another, is now the larger part of the 16-adapter step
    assert many["train_s"] * 16 > many["sample_s"]
    # FlexAttention's kernel against SDPA over the masked 1,024 positions, the same run, 28 layers
    flex_ms = _profile_ms(table["flex-1-16"], 1024, "triton_tem_fused_flex_attention")
    assert flex_ms == pytest.approx(8.210) and _diagnostics(table["flex-1-16"])[1024, 1024][
        "attention masked 1024 positions x28 ms"] == pytest.approx(14.128)
    assert _profile_ms(table["flex-1-16"], 64, "triton_tem_fused_flex_attention") == pytest.approx(0.826, abs=1e-3)
    assert _diagnostics(table["sdpa-1-diagnose"])[64, 1024]["sample_step ms"] == pytest.approx(0.834)
    # the learner: TF32 for the LoRA's float32 matmuls, 1.41 -> 1.22 s; the float32 GEMMs leave its profile
    learner = S27 / "learner-tf32" / "learner"
    f32, tf32 = _learner(learner / "planned.txt"), _learner(learner / "planned-tf32.txt")
    assert (f32[0], tf32[0]) == pytest.approx((1.4125, 1.2165))
    assert "TF32 float32 matmuls: True" in (learner / "planned-tf32.txt").read_text()
    assert _learner_profile_ms(learner / "planned.txt", ("sm80_xmma_gemm_f32f32",)) > 300
    assert _learner_profile_ms(learner / "planned-tf32.txt", ("sm80_xmma_gemm_f32f32",)) == 0
    lora_tf32 = _learner_profile_ms(learner / "planned-tf32.txt", ("sm90_xmma_gemm_f32f32_tf32", "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm"))
    assert lora_tf32 == pytest.approx(228, abs=2)
    assert _learner_profile_ms(learner / "planned-tf32.txt", ("nvjet_sm90",)) == pytest.approx(362, abs=2)
    # what the README made the defaults: flex decode attention, TF32 on CUDA
    import torch

    from engine.generate import DEFAULT_DECODE_ATTENTION
    from engine.settings import use_tf32

    monkeypatch.delenv("GS1_TF32", raising=False)
    assert DEFAULT_DECODE_ATTENTION == "flex" and use_tf32(torch.device("cuda", 0), None)


S28 = S24.parent / "h100-s28"


def test_session_28_reads_as_the_readme_says_and_the_bucket_default_follows_it():
    folders = ("learner-fused-base", "defaults-1-16", "bucket256-16", "bucket256-base-16", "bucket256-base-1")
    for folder in folders:
        gpu = (S28 / folder / "gpu.txt").read_text()
        assert "NVIDIA H100 80GB HBM3" in gpu and gpu.strip().splitlines()[-1].startswith("e2c9151")
    table = {f: S28 / f / "speed" / "adapters.txt" for f in folders[1:]}
    settings = {f: re.search(r"tf32=(\w+) decode_length_bucket=(\d+) decode_attention=(\w+)", t.read_text()).groups()
                for f, t in table.items()}
    assert set(settings.values()) >= {("True", "1024", "flex"), ("True", "256", "flex")}
    # the defaults together (flex + TF32) at 16 adapters: 43.92 -> 38.43 s a step (session 27 ran TF32 at one adapter only)
    one, many = _adapters_row(table["defaults-1-16"], 1), _adapters_row(table["defaults-1-16"], 16)
    assert (one["decode_ms"], one["step_s"]) == pytest.approx((5.65, 4.37))
    assert (many["decode_ms"], many["sample_s"], many["train_s"], many["step_s"], many["per_arm"], many["peak"]) == \
        pytest.approx((21.59, 15.44, 1.44, 38.43, 2.66, 73.48))
    assert many["step_s"] < _adapters_row(S27 / "flex-1-16" / "speed" / "adapters.txt", 16)["step_s"]
    # the static KV at 768 positions (bucket 256): 0.44 GiB less an arm, the decode step the same
    bucket = _adapters_row(table["bucket256-16"], 16)
    assert (bucket["decode_ms"], bucket["per_arm"], bucket["peak"]) == pytest.approx((21.52, 2.22, 66.42))
    assert many["per_arm"] - bucket["per_arm"] == pytest.approx(0.44, abs=0.01)
    assert abs(bucket["decode_ms"] - many["decode_ms"]) / many["decode_ms"] < 0.01
    # the learner in the base's dtype: 1.20 -> 0.91 s a forward_backward, at a fifth of the peak
    learner = S28 / "learner-fused-base" / "learner"
    fused, base = _learner(learner / "fused.txt"), _learner(learner / "fused-base.txt")
    assert (fused[0], base[0]) == pytest.approx((1.1995, 0.9065)) and fused[1] == base[1] == 11040
    assert (fused[2], base[2]) == pytest.approx((34.21, 6.59))
    assert "learner LoRA: fused-base" in (learner / "fused-base.txt").read_text()
    # ... and its profile's top 30 holds no attention backward where the float32 sum's holds 34 ms of it:
    # why the next device session checks its gradients (benchmarks/learner_agreement.py) before it is a default
    assert _learner_profile_ms(learner / "fused.txt", ("void pytorch_flash::flash_bwd",)) == pytest.approx(34.266)
    assert _learner_profile_ms(learner / "fused-base.txt", ("void pytorch_flash::flash_bwd",)) == 0
    assert _learner_profile_ms(learner / "fused-base.txt", ("void pytorch_flash::flash_fwd",)) == pytest.approx(18.612)
    # ... nor the SiLU backward, nor the 8,960-wide input-gradient GEMM (one a layer and microbatch there)
    for name, ms in (("triton_poi_fused__to_copy_add_mul_silu_silu_backward", 79.489),
                     ("nvjet_sm90_tst_192x192_64x3_1x2_h_bz_coopB_NNN", 43.236)):
        assert _learner_profile_ms(learner / "fused.txt", (name,)) == pytest.approx(ms)
        assert _learner_profile_ms(learner / "fused-base.txt", (name,)) == 0
    # ... where it fills zeros, three a layer and microbatch (the float32 sum's top 30 holds none)
    assert _learner_profile_ms(learner / "fused-base.txt", ("triton_poi_fused_view_zeros",)) == pytest.approx(19.857)
    assert _learner_profile_ms(learner / "fused.txt", ("triton_poi_fused_view_zeros",)) == 0
    # checked at the end of the session: through the compiled layers fused-base gets no LoRA gradient at all
    import json

    agree = S28 / "agree-fused-base"
    assert "NVIDIA H100 80GB HBM3" in (agree / "gpu.txt").read_text()
    assert "torch 2.11.0+cu130" in (agree / "gpu.txt").read_text()
    fused_row, base_row = json.loads((agree / "agreement.json").read_text())
    assert (fused_row["path"], fused_row["compiled"], base_row["path"], base_row["compiled"]) == ("fused", True, "fused-base", True)
    assert fused_row["no_gradient"] == 0 and fused_row["attention_backward_kernels"] == 448
    assert base_row["no_gradient"] == 392 and base_row["min_cos"] == 0.0 and base_row["attention_backward_kernels"] == 0
    assert "| fused-base | True |" in (agree / "agreement.txt").read_text()
    assert "fused-base (compiled=True) disagrees with fused" in (agree / "agreement.log").read_text()
    # the 16-adapter step with both: 33.15 s (train 1.12 s an adapter), still over the 20 s goal
    both, lone = _adapters_row(table["bucket256-base-16"], 16), _adapters_row(table["bucket256-base-1"], 1)
    assert (both["train_s"], both["step_s"], lone["decode_ms"], lone["train_s"]) == pytest.approx((1.12, 33.15, 5.65, 0.93))
    # the table's config line did not name the LoRA path yet (it does since): each folder's command.txt does
    assert all("--learner-lora fused-base" in (S28 / f / "command.txt").read_text() for f in ("bucket256-base-16", "bucket256-base-1"))
    assert not any("fused-base" in (S28 / f / "command.txt").read_text() for f in ("defaults-1-16", "bucket256-16"))
    # GSM8K's real prompts do not all fit 256 tokens: at a 256 bucket many batches take 1,024
    # positions anyway, so the default stays 1,024; fused stays the learner's path, and fused-base
    # through compiled layers on CUDA is warned of
    positions = (S28 / "gsm8k_prompt_positions.txt").read_text()
    assert "| train | 7473 | 131 | 175 | 247 | 331 | 43 |" in positions
    assert "| train | 256 | 64 | 768: 0.691, 1024: 0.309 |" in positions
    assert "| train | 256 | 1024 | 768: 0.003, 1024: 0.997 |" in positions
    from engine.generate import DECODE_LENGTH_BUCKET
    from engine.settings import EngineSettings, learner_lora_caveat

    assert DECODE_LENGTH_BUCKET == 1024 and EngineSettings.learner_lora == "fused"
    assert "agree-fused-base" in learner_lora_caveat("fused-base", "cuda", True)
    assert all(learner_lora_caveat(*case) is None for case in
               (("fused-base", "cuda", False), ("fused-base", "cpu", True), ("fused", "cuda", True), ("peft", "cuda", True)))


S29 = S24.parent / "h100-s29"


def _e2e_totals(e2e, items: int) -> dict[str, tuple[float, float, float]]:
    """A cold-then-warm e2e folder (engine_device_run.sh's part "e2e"): each run's stage table is
    what benchmarks/stage_timings.py reads from the run's own log, and each run's decision is the
    paired difference of its two eval files over `items` test items, recomputed here from the
    Parquet. Returns, a run, (stages' seconds, their compile seconds, seconds through feasibility)."""
    import io
    import json
    from contextlib import redirect_stdout

    import pyarrow.parquet as pq

    from fixtures.benchmarks import load_benchmark

    stage_timings = load_benchmark("stage_timings")
    started = dict(line.split() for line in (e2e / "times.txt").read_text().splitlines())
    totals = {}
    for run in ("cold", "warm"):  # seconds from the process's start (the run script's --start)
        assert started[f"e2e-{run}-rc"] == "0"
        out, start = io.StringIO(), started[f"e2e-{run}-start"]
        with redirect_stdout(out):
            assert stage_timings.main([str(e2e / f"{run}.log"), "--start", start]) == 0
        assert out.getvalue().strip() == (e2e / f"{run}-stages.txt").read_text().strip()
        rows = {r["stage"]: r for r in stage_timings.stage_table((e2e / f"{run}.log").read_text(), float(start))}
        before = list(rows)[:list(rows).index("feasibility") + 1]
        totals[run] = (sum(r["seconds"] for r in rows.values()), sum(r["compile_seconds"] for r in rows.values()),
                       sum(rows[s]["seconds"] for s in before))
        treatment, baseline = (pq.read_table(e2e / run / "eval" / a / "eval.parquet").to_pylist()
                               for a in ("gs1_kernel", "grpo_gs8"))
        by_item = {r["item_id"]: r["correct"] for r in baseline}
        assert len(treatment) == len(by_item) == items
        diff = sum(float(r["correct"]) - float(by_item[r["item_id"]]) for r in treatment) / items
        decision = json.loads((e2e / run / "decision" / "decision.json").read_text())
        assert decision["mean_diff"] == pytest.approx(diff, abs=1e-12) and decision["verdict"] == "inconclusive"
    return totals


def test_session_29_stage_tables_follow_from_their_logs_and_the_decisions_from_their_evals():
    """The user's spec end to end on the H100, cold then warm (h100-s29/e2e)."""
    e2e = S29 / "e2e"
    gpu = (e2e / "gpu.txt").read_text()
    assert "NVIDIA H100 80GB HBM3" in gpu and gpu.strip().splitlines()[-1].startswith("2e3a7d8")
    assert "none unpacked" in (e2e / "compile_from.txt").read_text()  # cold: no cache brought in
    totals = _e2e_totals(e2e, 1319)
    assert totals["cold"] == pytest.approx((664.4, 174.2, 156.8), abs=0.06)
    assert totals["warm"] == pytest.approx((528.7, 69.2, 113.4), abs=0.06)
    # the warm run's learner compile, 36.7 s on a warm cache: AOTAutograd bypassed its graph
    # (settings.cache_learner_graphs, landed after this run, lets it keep it)
    assert "decoder layers compiled on cuda:0 in 36.7 s" in (e2e / "warm.log").read_text()


S34 = S24.parent / "h100-s34"


def test_session_34_short_spec_cold_then_warm_and_the_learner_compiles_once_a_process():
    """spec_e2e_short.json (the user's spec at 6 steps, 128 eval items) cold then warm on the
    H100 (h100-s34/e2e), on the tree with the learner's floats specialised (bb8121e): the stage
    tables and decisions follow from the runs' own files, the spec that ran is the committed one,
    and each learner compile line says one AOTAutograd lookup: a miss cold, a hit warm."""
    import json

    e2e = S34 / "e2e"
    gpu = (e2e / "gpu.txt").read_text()
    assert "NVIDIA H100 80GB HBM3" in gpu and gpu.strip().splitlines()[-1].startswith("98ed82b")
    assert "none unpacked" in (e2e / "compile_from.txt").read_text()
    short = json.loads((S24.parent / "spec_e2e_short.json").read_text())
    for run in ("cold", "warm"):
        assert json.loads((e2e / run / "spec" / "spec.json").read_text()) == short
    totals = _e2e_totals(e2e, 128)
    assert totals["cold"] == pytest.approx((322.0, 81.0, 171.5), abs=0.06)
    assert totals["warm"] == pytest.approx((226.6, 25.3, 122.7), abs=0.06)
    learner = {run: [line for line in (e2e / f"{run}.log").read_text().splitlines() if "learner: decoder layers" in line]
               for run in ("cold", "warm")}
    assert len(learner["cold"]) == len(learner["warm"]) == 1
    assert "in 8.7 s (15 datums x 704 positions; 1 graphs so far; autograd cache 0 hit 1 miss" in learner["cold"][0]
    assert "in 3.0 s (15 datums x 704 positions; 1 graphs so far; autograd cache 1 hit 0 miss" in learner["warm"][0]


S35 = S24.parent / "h100-s35"


def test_session_35_a_cache_carried_from_another_machine_hits_for_every_shape():
    """spec_e2e_short.json twice on an H100 (h100-s35/e2e), the first process on the inductor
    cache session 34's run brought back from another machine (COMPILE_FROM=.compile), the second
    on what the first left, on the tree where `gs1 run` launches its Prefect server first
    (eadc9bf): the tables and decisions follow from the runs' own files, and every compile line of
    both processes says that AOTAutograd's and inductor's caches hit, none missed."""
    import json
    import re

    e2e = S35 / "e2e"
    gpu = (e2e / "gpu.txt").read_text()
    assert "NVIDIA H100 80GB HBM3" in gpu and gpu.strip().splitlines()[-1].startswith("2b18dbf")
    assert "from .compile" in (e2e / "compile_from.txt").read_text()
    short = json.loads((S24.parent / "spec_e2e_short.json").read_text())
    for run in ("cold", "warm"):
        assert json.loads((e2e / run / "spec" / "spec.json").read_text()) == short
    totals = _e2e_totals(e2e, 128)
    assert totals["cold"] == pytest.approx((277.6, 27.0, 169.9), abs=0.06)
    assert totals["warm"] == pytest.approx((228.1, 25.6, 125.1), abs=0.06)
    for run in ("cold", "warm"):
        caches = re.findall(r"autograd cache (\d+) hit (\d+) miss .*inductor cache (\d+) hit (\d+) miss",
                            (e2e / f"{run}.log").read_text())
        assert len(caches) == 6  # five decode compiles (four shapes' FlexAttention, the 64-row step), the learner
        assert all(int(a_hit) >= 1 and a_miss == "0" and int(i_hit) >= 1 and i_miss == "0"
                   for a_hit, a_miss, i_hit, i_miss in caches)


def test_session_29_the_default_learner_matches_peft_on_the_gpu_and_eager_fused_base_trains():
    import json

    eager = json.loads((S29 / "agree-eager" / "agree" / "agreement.json").read_text())
    compiled = json.loads((S29 / "agree-fused-compiled" / "agree" / "agreement.json").read_text())
    for folder in ("agree-eager", "agree-fused-compiled"):
        gpu = (S29 / folder / "gpu.txt").read_text()
        assert "NVIDIA H100 80GB HBM3" in gpu and "torch 2.11.0+cu130" in gpu
    assert [(r["path"], r["compiled"]) for r in eager] == [("peft", False), ("fused", False), ("fused-base", False)]
    assert [(r["path"], r["compiled"]) for r in compiled] == [("peft", True), ("fused", True)]
    rows = {(r["path"], r["compiled"]): r for r in eager + compiled}
    assert all(r["no_gradient"] == 0 and r["attention_backward_kernels"] > 0 for r in rows.values())
    assert rows["fused", False]["min_cos"] == pytest.approx(0.99982, abs=1e-5)
    assert rows["fused", True]["min_cos"] == pytest.approx(0.99988, abs=1e-5)
    # eager fused-base gives every gradient (session 28's compiled one gave none), bf16-close to peft's
    assert rows["fused-base", False]["min_cos"] == pytest.approx(0.99719, abs=1e-5)
    assert rows["fused-base", False]["max_rel_err"] == pytest.approx(0.0749, abs=1e-4)


S30 = S24.parent / "h100-s30"


def _units_run_reads_back(units: Path, tree: str, step_seconds: list[float], projection_s: float,
                          tmp_path: Path, card: str = "NVIDIA H100 80GB HBM3", spec: str = "spec_16units_h100.json",
                          compared: tuple[str, ...] = ("gs1_kernel",), seeds: int = 8):
    """A units folder (`PARTS=units` of scripts/h200/engine_device_run.sh): the card and tree, the
    step table as benchmarks/unit_steps.py reads the run's own step metrics, and the decision as
    the seed-t rule's mean of each seed's paired difference, recomputed here from the eval Parquet
    and by `gs1 decide --collect` (which takes only units that carry their proof) from the run.
    Returns stage_timings, the benchmark module, for the caller's stage tables."""
    import io
    import json
    import statistics
    from contextlib import redirect_stdout

    import pyarrow.parquet as pq

    from fixtures.benchmarks import load_benchmark

    gpu = (units / "gpu.txt").read_text()
    assert card in gpu and gpu.strip().splitlines()[-1].startswith(tree)
    unit_steps = load_benchmark("unit_steps")
    out = io.StringIO()
    with redirect_stdout(out):
        assert unit_steps.main([str(units / "run")]) == 0
    assert out.getvalue().strip() == (units / "unit_steps.txt").read_text().strip()
    spans = unit_steps.step_spans(unit_steps.unit_steps(units / "run"))
    arms = ("grpo_gs8", *compared)  # the baseline, then each arm the spec compares against it
    assert [s.units for s in spans] == [len(arms) * seeds] * 4
    assert [round(s.seconds, 1) for s in spans] == step_seconds
    assert unit_steps.projected_seconds(spans, 40) == pytest.approx(projection_s, abs=0.5)
    diffs: dict[str, list[float]] = {arm: [] for arm in compared}  # each arm's paired difference, a seed's
    for seed in range(seeds):
        baseline = pq.read_table(units / "run" / "eval" / f"grpo_gs8-s{seed}" / "eval.parquet").to_pylist()
        by_item = {r["item_id"]: r["correct"] for r in baseline}
        assert len(by_item) == 128
        for arm in compared:
            treatment = pq.read_table(units / "run" / "eval" / f"{arm}-s{seed}" / "eval.parquet").to_pylist()
            assert len(treatment) == 128
            diffs[arm].append(sum(float(r["correct"]) - float(by_item[r["item_id"]]) for r in treatment) / 128)
    decision = json.loads((units / "run" / "decision" / "decision.json").read_text())
    assert decision["mean_diff"] == pytest.approx(statistics.fmean(diffs["gs1_kernel"]), abs=1e-12)
    by_arm = {c["arm"]: c for c in decision["comparisons"]}
    assert sorted(by_arm) == sorted(compared)
    for arm in compared:
        assert by_arm[arm]["mean_diff"] == pytest.approx(statistics.fmean(diffs[arm]), abs=1e-12)
        assert by_arm[arm]["rule_details"]["seed_diffs"] == pytest.approx(diffs[arm], abs=1e-12)
    from gs1.cli import main

    spec_path = units.parents[1] / spec
    assert main(["decide", "--spec", str(spec_path), "--units", str(tmp_path / "units"), "--collect",
                 str(units / "run")]) == 0
    collected = json.loads((tmp_path / "units" / "decision" / "decision.json").read_text())
    assert sorted(p.name for p in (tmp_path / "units").glob("*-s*")) == sorted(
        f"{a}-s{seed}" for a in arms for seed in range(seeds))
    assert (collected["verdict"], collected["mean_diff"]) == (decision["verdict"], decision["mean_diff"])
    assert collected["rule_details"]["seed_diffs"] == pytest.approx(diffs["gs1_kernel"], abs=1e-12)
    return load_benchmark("stage_timings")


def _stage_table_follows(stage_timings, units: Path, log: str, start: str, table: str) -> dict[str, dict]:
    """The committed stage table is stage_timings.py's of the log; returns its rows by stage."""
    import io
    from contextlib import redirect_stdout

    out = io.StringIO()
    with redirect_stdout(out):
        assert stage_timings.main([str(units / log), "--start", start]) == 0
    assert out.getvalue().strip() == (units / table).read_text().strip()
    return {r["stage"]: r for r in stage_timings.stage_table((units / log).read_text(), float(start))}


def test_session_30_sixteen_units_ran_in_one_process_and_their_tables_follow_from_the_run(tmp_path):
    """Item 5 on the card that came (h100-s30/units): 2 arms x 8 seeds trained 4 steps together in
    one process on one base; the eval ran out of memory in that process and the same command
    resumed it."""
    units = S30 / "units"
    stage_timings = _units_run_reads_back(units, "75db6df", [94.1, 52.7, 101.3, 43.5], 1858, tmp_path)
    started = dict(line.split() for line in (units / "times.txt").read_text().splitlines())
    assert started["units-rc"] == "1"  # the first process ended on the eval's out-of-memory
    resumed = (units / "resume_times.txt").read_text().split()
    assert resumed[:2] == ["resume-rc", "0"]
    first = _stage_table_follows(stage_timings, units, "units.log", started["units-start"], "units-stages.txt")
    _stage_table_follows(stage_timings, units, "resume.log", resumed[3], "resume-stages.txt")
    assert sum(1 for s, r in first.items() if s.startswith("eval ") and r["state"] == "Failed") == 13
    assert "out of memory" in (units / "units.log").read_text()


S32 = S24.parent / "h100-s32"


def test_session_32_sixteen_units_trained_and_evaluated_in_one_process(tmp_path):
    """Item 5 again on an H100 (h100-s32/units), after the chunked prefill and the released
    client's memory: the same 16-unit spec ran end to end in one process, every eval in the
    process that trained (rc 0, no resume, no out-of-memory), on the inductor cache session 30's
    run brought back."""
    units = S32 / "units"
    stage_timings = _units_run_reads_back(units, "8e9dda4", [87.9, 53.5, 98.3, 47.0], 1978, tmp_path)
    started = dict(line.split() for line in (units / "times.txt").read_text().splitlines())
    assert started["units-rc"] == "0"
    stages = _stage_table_follows(stage_timings, units, "units.log", started["units-start"], "units-stages.txt")
    evals = [r for s, r in stages.items() if s.startswith("eval ")]
    assert len(evals) == 16 and all(r["state"] == "Completed" for r in evals)
    assert "out of memory" not in (units / "units.log").read_text()
    assert sum(r["seconds"] for r in stages.values()) == pytest.approx(583.9, abs=0.1)
    assert sum(r["seconds"] for r in evals) == pytest.approx(90.7, abs=0.1)
    # the README's peaks: nvidia-smi's samples (time, card, MiB used, util) before and after training ended
    import csv

    (train_end,) = [line.split()[0] for line in (units / "units.log").read_text().splitlines()
                    if "Task run 'train audit' - Finished" in line]
    samples = [(r[0].split()[1], float(r[2].split()[0])) for r in csv.reader((units / "gpu_samples.csv").open())
               if len(r) > 2]
    assert max(mib for _, mib in samples) == 80873  # in the eval
    assert max(mib for t, mib in samples if t <= train_end) == 80369


S36 = S24.parent / "h200-s36"


def test_session_36_the_h200_table_at_1_8_16_and_24_adapters_follows_from_its_rows():
    """Item 2's table on the H200 (h200-s36/1-8-16-24): each row of the committed table is the
    benchmark's own record of that count (the `[N s] k adapters: {...}` line it printed as the
    count finished), the settings are today's defaults, and the numbers the README quotes against
    the targets (<= 4 ms a 1-adapter decode step, <= 20 s a 16-adapter RL step, <= 1.5 GiB an arm)."""
    import ast

    from engine.generate import DECODE_LENGTH_BUCKET, DEFAULT_DECODE_ATTENTION

    run = S36 / "1-8-16-24"
    gpu = (run / "gpu.txt").read_text()
    assert "NVIDIA H200" in gpu and "torch 2.11.0+cu130" in gpu and gpu.strip().splitlines()[-1].startswith("97ba042")
    table = run / "speed" / "adapters.txt"
    text = table.read_text()
    records = [ast.literal_eval(line.split(" adapters: ", 1)[1]) for line in text.splitlines() if line.startswith("[")]
    assert [r["adapters"] for r in records] == [1, 8, 16, 24] and [r["rows"] for r in records] == [64, 512, 1024, 1536]
    one = records[0]
    for r in records:
        row = _adapters_row(table, r["adapters"])
        assert row == {"adapters": r["adapters"], "rows": r["rows"], "batches": round(r["batches"]),
                       "decode_ms": round(r["decode_ms"], 2), "x": round(r["decode_ms"] / one["decode_ms"], 2),
                       "sample_s": round(r["sample_s"], 2), "train_s": round(r["train_s"], 2),
                       "step_s": round(r["step_s"], 2), "x2": round(r["step_s"] / one["step_s"], 2),
                       "held": round(r["held"], 2), "per_arm": round(r["per_arm"], 2), "own": round(r["own"], 3),
                       "peak": round(r["peak"], 2)}
    settings = re.search(r"compiled=(\w+) .*compiled_learner=(\w+) learner_lora=(\S+) gradient_checkpointing=(\w+) "
                         r"tf32=(\w+) decode_length_bucket=(\d+) decode_attention=(\w+)", text).groups()
    assert settings == ("True", "True", "fused", "False", "True", str(DECODE_LENGTH_BUCKET), DEFAULT_DECODE_ATTENTION)
    # against the targets: none met at this shape on this card
    at = {r["adapters"]: _adapters_row(table, r["adapters"]) for r in records}
    assert (at[1]["decode_ms"], at[16]["step_s"], at[16]["per_arm"]) == pytest.approx((5.34, 35.19, 2.66))
    assert at[1]["decode_ms"] > 4 and at[16]["step_s"] > 20 and min(r["per_arm"] for r in at.values()) > 1.5
    # the learner, an adapter after another, is the larger part of a many-adapter step
    assert all(r["train_s"] * n > r["sample_s"] for n, r in at.items() if n >= 8)
    assert at[24]["step_s"] == pytest.approx(57.25) and at[24]["peak"] == pytest.approx(108.33)
    # the inductor cache carried from the H100's runs held none of the benchmark's shapes: every compile missed
    compiles = [line for line in (run / "speed" / "engine.log").read_text().splitlines() if "compiled" in line
                and "cache" in line]
    assert len(compiles) == 5 and all("autograd cache 0 hit 1 miss" in line for line in compiles)


def test_session_32_the_feasibility_projection_missed_what_16_units_sharing_a_gpu_took():
    """What the README says of the feasibility stage's projection (session 37's reading of
    h100-s32/units): taken from the pilot's two arms, it put 16 units' training at 4 steps of
    the slowest piloted arm's step (55.4 s) where the units, sharing one GPU, trained for 306.0 s,
    and their eval at 16 serial evals (658.9 s) where the batched evals took 90.7 s."""
    import json

    from fixtures.benchmarks import load_benchmark

    from rl.feasibility import PilotTimings, project_full_run

    units = S32 / "units"
    record = json.loads((units / "run" / "feasibility" / "feasibility.json").read_text())
    measured = record["measurements"]
    # the feasibility stage's own projection, from the pilot's measurements, gives the record's
    # phases: each of the 16 units (2 arms x 8 seeds) steps at its arm's piloted step, in parallel
    piloted = measured["step_seconds"]
    projection = project_full_run(
        PilotTimings(setup_seconds=max(measured["setup_seconds"].values()),
                     step_seconds={f"{arm}-s{seed}": piloted[arm] for arm in piloted for seed in range(8)},
                     eval_seconds_per_item=measured["eval_seconds_per_item"], gpus=1),
        steps=4, n_eval=128, budget_gpu_hours=record["budget_gpu_hours"],
        budget_wall_minutes=record["budget_wall_seconds"] / 60, arms_in_parallel=True,
        recovery_reserve=record["recovery_reserve"])
    assert projection.phases == pytest.approx(record["phases"])
    assert (round(record["phases"]["train"], 1), round(record["phases"]["eval"], 1)) == (55.4, 658.9)
    stage_timings = load_benchmark("stage_timings")
    started = dict(line.split() for line in (units / "times.txt").read_text().splitlines())
    stages = stage_timings.stage_table((units / "units.log").read_text(), float(started["units-start"]))
    train = sum(r["seconds"] for r in stages if r["stage"].startswith("train ") and r["stage"] != "train audit")
    evals = sum(r["seconds"] for r in stages if r["stage"].startswith("eval "))
    assert (round(train, 1), round(evals, 1)) == (306.0, 90.7)
    assert train / record["phases"]["train"] > 5 and record["phases"]["eval"] / evals > 7
