"""The ridge arm kind (issue 22, item 2): the hill-climb's `ridge` family as an arm, added as one
module (`estimators/ridge.py`) plus its line in the registry.

Its own step (`rl.loop.step_advantages`, the path training runs) equals the hill-climb's
`ridge_baselines` on the same stream; the preflight's step check against the plain-Python
reference passes at the demo's and the user's shapes and fails on a broken fit; a hill-climbed
kernel.json of family ridge runs as the arm's recipe; the audit names a wrong row; and no other
spec's hash moved.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import estimators.ridge
from design.arm import ArmConfig
from design.plan import plan_from_spec
from design.revision import experiment_hash
from design.spec import load_spec, parse_spec
from estimators import StepBatch
from estimators.registry import estimator_for
from estimators.ridge import RidgeSpec, ridge_log_reference
from gs1.commands.advantages import compute
from hillclimb import climb
from hillclimb.data import log_from_table, make_streams, synthetic_log_table
from rl.audit import RolloutLog, audit_log
from rl.gates import not_applicable_reason
from rl.loop import new_window, step_advantages
from rl.preflight import check_arm_steps, fixed_step_batches
from schemas.errors import SpecError
from schemas.kernel import FEATURE_NAMES

REPO = Path(__file__).resolve().parents[1]
# The demo's shape (32 rollouts a step, a fit window of 64) and the user's (64 a step, 256).
SHAPES = {"demo": (32, 64), "user": (64, 256)}


def ridge_arm(batch_size: int, history: int, penalty: float = 0.1, features=FEATURE_NAMES) -> ArmConfig:
    return ArmConfig(name="ridge_arm", recipe={"advantage": "ridge", "ridge": {"penalty": penalty, "history": history,
                                                                               "features": list(features)}},
                     group_size=1, groups_per_batch=batch_size, lr=1e-4, seed=0, steps=4, lora_rank=8, base_model="m")


def stream_batches(stream, batch_size: int) -> list[StepBatch]:
    """The stream's rollouts as training steps of `batch_size` (its features as the loop logs them)."""
    num_tokens_N = np.exp(stream.features["log_prompt_num_tokens"][:, 0])
    mean_logprob_N = stream.features["prompt_mean_logprob"][:, 0]
    return [StepBatch(stream.reward_N[s : s + batch_size], np.arange(len(stream.reward_N[s : s + batch_size])),
                      num_tokens_N[s : s + batch_size], mean_logprob_N[s : s + batch_size])
            for s in range(0, stream.n, batch_size)]


@pytest.fixture(scope="module")
def stream():
    search, _ = make_streams(log_from_table(synthetic_log_table(900, 4, seed=5), "ridge"), seed=0)
    return search


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("features", [FEATURE_NAMES, ("prompt_mean_logprob",)])
def test_the_arms_step_is_the_hillclimbs_ridge(stream, shape, features):
    batch_size, history = SHAPES[shape]
    arm = ridge_arm(batch_size, history, penalty=0.1, features=features)
    window, baselines = new_window(arm), []
    for batch in stream_batches(stream, batch_size):
        advantages, window = step_advantages(arm, batch, window)
        baselines.append(advantages.baseline)
        np.testing.assert_allclose(advantages.advantage, batch.rewards_B - advantages.baseline, rtol=0, atol=1e-15)
    (expected,) = climb.ridge_baselines(stream, batch_size, history, features, [0.1])
    np.testing.assert_allclose(np.concatenate(baselines), expected, rtol=0, atol=1e-9)
    assert np.std(expected[batch_size:]) > 1e-3  # the fit says something: baselines vary by prompt


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_step_check_passes_against_the_plain_python_reference(shape):
    batch_size, history = SHAPES[shape]
    arm = ridge_arm(batch_size, history)
    rng = np.random.default_rng(3)
    batches = fixed_step_batches(rng.integers(40, 200, 64).tolist(), rng.normal(-2.0, 0.5, 64).tolist(), arm)
    assert sum(len(b.rewards_B) for b in batches[:-1]) > history  # the fit window fills and rolls over
    result = check_arm_steps(arm, batches)
    assert result.passed, result
    assert result.reference == "estimators.ridge.ridge_log_reference" and set(result.max_abs_diff) == {"baseline", "advantage"}


@pytest.mark.parametrize("breakage", ["current batch in the fit", "no clipping"])
def test_the_step_check_catches_a_broken_fit(monkeypatch, breakage):
    arm = ridge_arm(32, 64)
    real = estimators.ridge.ridge_baselines_step
    if breakage == "current batch in the fit":  # a lookahead: the step's own rewards enter its fit
        def broken(rewards_B, features_B_F, fit_rewards_H, fit_features_H_F, *, penalty):
            return real(rewards_B, features_B_F, np.concatenate([fit_rewards_H, rewards_B]),
                        np.concatenate([fit_features_H_F, features_B_F]), penalty=penalty)
    else:  # predictions outside the fit rewards' range are kept
        def broken(rewards_B, features_B_F, fit_rewards_H, fit_features_H_F, *, penalty):
            out = real(rewards_B, features_B_F, fit_rewards_H, fit_features_H_F, penalty=penalty)
            return out if len(fit_rewards_H) < 2 else out + 2.0
    monkeypatch.setattr(estimators.ridge, "ridge_baselines_step", broken)
    rng = np.random.default_rng(4)
    result = check_arm_steps(arm, fixed_step_batches(rng.integers(40, 200, 64).tolist(), rng.normal(-2.0, 0.5, 64).tolist(), arm))
    assert not result.passed and result.mismatches[0].column in ("baseline", "advantage")


def spec_with(arms: list[dict]) -> dict:
    spec = json.loads((REPO / "specs" / "demo_local.json").read_text())
    spec["arms"] = arms
    spec["restoration_preflight"] = None
    spec["feasibility"] = {**spec["feasibility"], "effective_config": None}
    return spec


GRPO = {"name": "grpo_gs8", "advantage": "group_mean", "group_size": 8, "groups_per_batch": 4, "lr": 1e-4}
RIDGE = {"name": "ridge_arm", "advantage": "ridge", "group_size": 1, "groups_per_batch": 32, "lr": 1e-4}


def test_a_hillclimbed_ridge_kernel_json_is_the_arms_recipe(tmp_path):
    recipe = climb.KernelRecipe("ridge", ("prompt_mean_logprob",), None, 0.01, 128)
    kernel_json = tmp_path / "kernel.json"
    kernel_json.write_text(json.dumps({"kernel": recipe.kernel_object()}))
    plan = plan_from_spec(parse_spec(spec_with([GRPO, {**RIDGE, "kernel_file": str(kernel_json)}])))
    held = plan.arm("ridge_arm")
    assert held.advantage == "ridge" and plan.run.treatment == "ridge_arm"
    assert held.recipe.ridge == RidgeSpec(penalty=0.01, history=128, features=("prompt_mean_logprob",))
    assert held.recipe.kernel_source.startswith(str(kernel_json.resolve()) + " sha256:")
    # the spec's own `ridge` object, its defaults filled in for the hash
    spec = parse_spec(spec_with([GRPO, {**RIDGE, "ridge": {"penalty": 0.5}}]))
    assert plan_from_spec(spec).arm("ridge_arm").recipe.ridge == RidgeSpec(penalty=0.5)
    assert spec.model_dump(mode="json")["arms"][1]["ridge"] == {"penalty": 0.5, "history": 256, "features": list(FEATURE_NAMES)}
    assert "ridge" not in spec.model_dump(mode="json")["arms"][0]  # only a ridge arm holds it

    for arm, says in (
        ({**RIDGE, "kernel_file": str(kernel_json), "ridge": {"penalty": 1.0}}, "arms.1.kernel_file: give ridge or kernel_file, not both"),
        ({**RIDGE, "ridge": {"penalty": 0}}, "arms.1.ridge.penalty: must be > 0"),
        ({**RIDGE, "ridge": {"penalty": 1.0, "histroy": 3}}, "arms.1.ridge.histroy: unknown key (did you mean 'history'?)"),
        ({**RIDGE, "group_size": 4, "groups_per_batch": 8}, "arms.1.group_size: a ridge arm samples one rollout per prompt"),
        ({**GRPO, "name": "g2", "ridge": {"penalty": 1.0}}, "arms.1.ridge: a group_mean arm reads no ridge"),
    ):
        with pytest.raises(SpecError) as e:
            parse_spec(spec_with([GRPO, arm]))
        assert any(p.startswith(says) for p in e.value.problems), e.value.problems
    # a kernel.json of another family is not a ridge recipe, and a ridge one runs on no kernel arm
    gaussian = tmp_path / "gaussian.json"
    gaussian.write_text(json.dumps(climb.spec_recipe().to_fragment()))
    with pytest.raises(SpecError, match="a ridge arm runs a recipe of family 'ridge', not 'gaussian'"):
        parse_spec(spec_with([GRPO, {**RIDGE, "kernel_file": str(gaussian)}]))
    kernel_arm = {"name": "gs1_kernel", "advantage": "kernel_cross_prompt_baseline", "group_size": 1, "groups_per_batch": 32,
                  "lr": 1e-4, "kernel_file": str(kernel_json)}
    with pytest.raises(SpecError, match="kernel.family: unknown kernel family 'ridge'"):
        parse_spec(spec_with([GRPO, kernel_arm]))


def test_the_audit_recomputes_a_ridge_log_and_names_a_wrong_row(stream):
    arm = ridge_arm(32, 64)
    window, rows = new_window(arm), []
    for step, batch in enumerate(stream_batches(stream, 32)[:8]):
        advantages, window = step_advantages(arm, batch, window)
        rows.append((np.full(len(batch.rewards_B), step), batch, advantages))
    log = RolloutLog(np.concatenate([s for s, _, _ in rows]), np.concatenate([b.group_ids_B for _, b, _ in rows]),
                     np.concatenate([b.rewards_B for _, b, _ in rows]), np.concatenate([b.prompt_num_tokens_B for _, b, _ in rows]),
                     np.concatenate([b.prompt_mean_logprob_B for _, b, _ in rows]),
                     {"baseline": np.concatenate([a.baseline for _, _, a in rows]),
                      "advantage": np.concatenate([a.advantage for _, _, a in rows])})
    assert audit_log(arm, log).passed
    log.logged["baseline"][100] += 1e-6
    result = audit_log(arm, log)
    assert not result.passed and (result.mismatches[0].row, result.mismatches[0].column) == (100, "baseline")


def test_gs1_advantages_runs_the_ridge_kind_offline(stream):
    import pyarrow as pa

    batches = stream_batches(stream, 32)[:6]
    table = pa.table({"step": np.concatenate([np.full(len(b.rewards_B), s) for s, b in enumerate(batches)]),
                      "prompt_id": [f"p{i}" for i in range(sum(len(b.rewards_B) for b in batches))],
                      "reward": np.concatenate([b.rewards_B for b in batches]),
                      "prompt_num_tokens": np.concatenate([b.prompt_num_tokens_B for b in batches]),
                      "prompt_mean_logprob": np.concatenate([b.prompt_mean_logprob_B for b in batches])})
    out = compute(table, "ridge")
    features = [[np.log(n), m] for n, m in zip(table.column("prompt_num_tokens").to_pylist(), table.column("prompt_mean_logprob").to_pylist())]
    reference = ridge_log_reference(table.column("step").to_pylist(), table.column("reward").to_pylist(), features,
                                    penalty=RidgeSpec().penalty, history=RidgeSpec().history)
    np.testing.assert_allclose(out.column("baseline").to_pylist(), reference["baseline"], rtol=0, atol=1e-9)


def test_the_gate_and_the_other_specs_are_as_before():
    assert not_applicable_reason("kernel_effective_neighbors_p10", "ridge") == "a ridge treatment has no kernel"
    assert not_applicable_reason("baseline_reward_corr", "ridge") is None  # its baseline differs by prompt
    assert estimator_for("ridge").needs == {"window"}
    # adding a kind moved no spec's experiment (the run directory's name)
    assert experiment_hash(load_spec(REPO / "specs" / "gs1_vs_grpo_gsm8k.json")) == "ef4eb84a"
    assert experiment_hash(load_spec(REPO / "specs" / "demo_local.json")) == "2ba871d5"  # bandwidth 1.0 since issue 47
