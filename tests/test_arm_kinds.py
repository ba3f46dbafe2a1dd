"""The arm kinds beside GRPO and the pre-registered kernel (issue 17, item 1): flash_reinforce,
batch_mean, leave_one_out, critic, and gs1_kernel with a hill-climbed kernel.json.

Each is checked the way the kernel arm is: its own step function (`rl.loop.step_advantages`, the
path training runs) against the independent float64 reference (`estimators.reference`) over fixed
multi-step batches at the demo shape and at the user's shape (B = 64, window 256); the audit of a
logged run; and, for flash_reinforce and critic, a demo-sized two-arm spec against grpo run end
to end through the flow on CPU.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import fixtures.flow_env  # noqa: F401  (registers the token_threshold env)
from fixtures.tiny_model import tiny_model_dir, tiny_service_client  # noqa: F401
import estimators
from estimators import reference
from estimators.registry import rollout_log
from rl.audit import RolloutLog, audit_log
from rl.gates import compute_gate_metrics, evaluate_checks
from rl.preflight import check_arm_steps, fixed_step_batches
from design.arm import ArmConfig, CriticSpec
from schemas.artifacts import read_rows
from schemas.errors import SpecError
from schemas.kernel import KernelSpec
from design.spec import GateCheck, parse_spec
from design.plan import plan_from_spec

REPO = Path(__file__).resolve().parents[1]


def arm(advantage: str, group_size: int, groups_per_batch: int, **recipe) -> ArmConfig:
    estimator = {"flash_reinforce": "flash_reinforce", "critic": "critic"}.get(advantage)
    defaults = {"trust_delta": 3e-3} if estimator == "flash_reinforce" else {"critic": CriticSpec()} if estimator == "critic" else {}
    return ArmConfig(name=f"{advantage}_arm", advantage=advantage, group_size=group_size, groups_per_batch=groups_per_batch,
                     lr=1e-4, seed=0, steps=4, lora_rank=8, base_model="m", **{**defaults, **recipe})


def prompt_features(n: int, seed: int = 1):
    rng = np.random.default_rng(seed)
    return rng.integers(40, 200, n).tolist(), rng.normal(-2.0, 0.5, n).tolist()


# The demo's shape (32 rollouts a step, window 64) and the user's (64 rollouts a step, window 256).
SHAPES = {"demo": (32, 64), "user": (64, 256)}


# ---------------------------------------------------------------------------- step checks


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("kind", ["flash_reinforce", "critic", "batch_mean", "leave_one_out", "hillclimbed_kernel"])
def test_the_arms_own_step_matches_the_reference_at_demo_and_user_shape(kind, shape):
    batch_size, window = SHAPES[shape]
    if kind == "leave_one_out":
        config = arm(kind, 8, batch_size // 8)
    elif kind == "hillclimbed_kernel":  # a recipe `gs1 hillclimb` may write: knn on scaled features
        config = arm("kernel_cross_prompt_baseline", 1, batch_size,
                     kernel=KernelSpec(family="knn", bandwidth=8, scales=(0.5, 2.0), window=window))
    else:
        config = arm(kind, 1, batch_size)
    num_tokens, mean_logprob = prompt_features(batch_size)
    batches = fixed_step_batches(num_tokens, mean_logprob, config)
    result = check_arm_steps(config, batches)
    assert result.passed, result.mismatches[:3]
    assert result.steps >= 4 and result.rows == sum(len(b.rewards_B) for b in batches)
    if kind == "flash_reinforce":
        # every column the trust gate adds was compared, and the gate both admitted and rejected
        assert {"sequence_kl", "admitted", "token_advantage"} <= set(result.max_abs_diff)
        admitted = np.concatenate([estimators.flash_reinforce_gate(b.sampler_logprobs_B_T, b.learner_logprobs_B_T,
                                                                   delta=3e-3)[1] for b in batches])
        assert 0.2 < admitted.mean() < 0.9
        assert result.reference == "estimators.reference.flash_reinforce_log_reference"
    if kind == "critic":
        assert result.reference == "estimators.reference.critic_log_reference"


@pytest.mark.parametrize("kind", ["flash_reinforce", "critic"])
def test_the_step_check_catches_a_broken_estimator(kind, monkeypatch):
    config = arm(kind, 1, 64)
    num_tokens, mean_logprob = prompt_features(64)
    batches = fixed_step_batches(num_tokens, mean_logprob, config)
    if kind == "flash_reinforce":  # forget the sample-mean weight's 1/B
        real = estimators.flash_reinforce_token_advantages
        monkeypatch.setattr(estimators.flash_reinforce, "flash_reinforce_token_advantages", lambda a, t, m: real(a, t, m) * len(a))
    else:  # read P(yes) without normalising by P(yes) + P(no)
        monkeypatch.setattr(estimators.critic, "critic_values", lambda yes, no: np.exp(np.asarray(yes)))
    result = check_arm_steps(config, batches)
    assert not result.passed and result.n_mismatches > 0
    column = "token_advantage" if kind == "flash_reinforce" else "baseline"
    assert any(m.column == column for m in result.mismatches)


def test_flash_reinforce_reference_is_the_papers_loss_gradient():
    """The per-token advantage the datum carries, fed through tinker's importance_sampling loss,
    gives the gradient of the paper's loss -mean_i(sum_t ratio_it A_i l_it / T_i) in every l_it."""
    rng = np.random.default_rng(3)
    lengths = [3, 7, 1, 5]
    rewards = [1.0, 0.0, 1.0, 0.0]
    sampler = [np.log(rng.uniform(0.05, 0.95, T)) for T in lengths]
    learner = [np.minimum(s + rng.normal(0, 0.02, len(s)), 0.0) for s in sampler]
    delta = 1e-3
    ref = reference.flash_reinforce_log_reference([0] * 4, rewards, [s.tolist() for s in sampler],
                                                  [l.tolist() for l in learner], delta)
    mean = sum(rewards) / 4
    for i, T in enumerate(lengths):
        for t in range(T):
            ratio = math.exp(learner[i][t] - sampler[i][t])
            paper = -ratio * (rewards[i] - mean) * ref["admitted"][i] / (T * 4)  # d loss / d l_it
            is_loss = -ratio * ref["token_advantage"][i]  # d/dl of -exp(l - s) * a
            assert is_loss == pytest.approx(paper, rel=1e-12, abs=1e-15)


# ---------------------------------------------------------------------------- audit of a logged run


def test_the_audit_recomputes_a_flash_reinforce_and_a_critic_log(tmp_path):
    for kind in ("flash_reinforce", "critic"):
        config = arm(kind, 1, 16)
        num_tokens, mean_logprob = prompt_features(16)
        batches = fixed_step_batches(num_tokens, mean_logprob, config)
        good = check_arm_steps(config, batches)
        assert good.passed
    # a log without the inputs the reference needs fails the audit (it is never silently skipped)
    bare = RolloutLog(np.zeros(4, dtype=np.int64), np.arange(4), np.ones(4), np.full(4, 50.0), np.full(4, -2.0),
                      logged={"baseline": np.ones(4), "advantage": np.zeros(4)})
    for kind in ("flash_reinforce", "critic"):
        result = audit_log(arm(kind, 1, 4), bare)
        assert not result.passed and "logprobs" in result.reference


# ---------------------------------------------------------------------------- spec and plan


def spec_with_arms(arms: list[dict], **top) -> dict:
    spec = json.loads((REPO / "specs" / "demo_local.json").read_text())
    spec["arms"] = arms
    spec["restoration_preflight"] = None
    spec["feasibility"] = {**spec["feasibility"], "effective_config": None}
    spec.update(top)
    return spec


GRPO = {"name": "grpo_gs8", "advantage": "group_mean", "group_size": 8, "groups_per_batch": 4, "lr": 1e-4}


def test_each_arm_kind_is_selectable_as_a_two_arm_specs_treatment():
    for treatment in (
        {"name": "flash", "advantage": "flash_reinforce", "group_size": 1, "groups_per_batch": 32, "lr": 1e-4, "trust_delta": 1e-3},
        {"name": "critic", "advantage": "critic", "group_size": 1, "groups_per_batch": 32, "lr": 1e-4, "critic": {"lr": 3e-4}},
        {"name": "reinforce", "advantage": "batch_mean", "group_size": 1, "groups_per_batch": 32, "lr": 1e-4},
        {"name": "rloo", "advantage": "leave_one_out", "group_size": 8, "groups_per_batch": 4, "lr": 1e-4},
    ):
        plan = plan_from_spec(parse_spec(spec_with_arms([GRPO, treatment])))
        assert plan.run.treatment == treatment["name"] and plan.run.baseline == "grpo_gs8"
        held = plan.treatment
        assert held.advantage == treatment["advantage"]  # the recipe is its kind's, and only its kind's
        assert (getattr(held.recipe, "trust_delta", None) == 1e-3) == (treatment["advantage"] == "flash_reinforce")
        assert (held.critic == CriticSpec(lr=3e-4)) == (treatment["advantage"] == "critic")
        assert held.kernel is None and plan.baseline.recipe.model_dump() == {"advantage": "group_mean"}
    # defaults: FlashREINFORCE's delta 3e-3
    flash = {"name": "flash", "advantage": "flash_reinforce", "group_size": 1, "groups_per_batch": 32, "lr": 1e-4}
    assert plan_from_spec(parse_spec(spec_with_arms([GRPO, flash]))).treatment.recipe.trust_delta == 3e-3


@pytest.mark.parametrize("bad, line", [
    ({"advantage": "flash_reinforce", "group_size": 8, "groups_per_batch": 4}, "arms.1.group_size: a flash_reinforce arm samples one rollout per prompt"),
    ({"advantage": "critic", "group_size": 2, "groups_per_batch": 16}, "arms.1.group_size: a critic arm samples one rollout per prompt"),
    ({"advantage": "leave_one_out", "group_size": 1, "groups_per_batch": 32}, "arms.1.group_size: a leave_one_out arm needs at least 2"),
    ({"advantage": "flash_reinforce", "group_size": 1, "groups_per_batch": 32, "trust_delta": -1}, "arms.1.trust_delta: must be >= 0"),
    ({"advantage": "critic", "group_size": 1, "groups_per_batch": 32, "critic": {"lr": 1e-4, "lrr": 1}}, "arms.1.critic.lrr: unknown key"),
    ({"advantage": "batch_mean", "group_size": 1, "groups_per_batch": 32, "kernel_file": "k.json"}, "arms.1.kernel_file: a batch_mean arm reads no kernel file"),
])
def test_a_bad_arm_is_one_line_naming_its_field(bad, line):
    with pytest.raises(SpecError) as e:
        parse_spec(spec_with_arms([GRPO, {"name": "t", "lr": 1e-4, **bad}]))
    assert any(p.startswith(line) for p in e.value.problems), e.value.problems


def test_a_hillclimbed_kernel_json_is_validated_and_recorded_in_the_plan(tmp_path):
    from hillclimb.climb import KernelRecipe

    recipe = KernelRecipe("laplace", ("log_prompt_num_tokens", "prompt_mean_logprob"), (1.0, 3.0), 0.75, 128)
    kernel_json = tmp_path / "climb" / "kernel.json"
    kernel_json.parent.mkdir()
    kernel_json.write_text(json.dumps(recipe.to_fragment()))  # what `gs1 hillclimb` writes
    tuned = {"name": "gs1_tuned", "advantage": "kernel_cross_prompt_baseline", "group_size": 1, "groups_per_batch": 32,
             "lr": 1e-4, "kernel_file": "climb/kernel.json"}
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec_with_arms([GRPO, tuned])))
    from design.spec import load_spec, spec_hash

    plan = plan_from_spec(load_spec(spec_path))
    assert plan.treatment.kernel == recipe.kernel_spec()
    assert plan.treatment.recipe.kernel_source.startswith(str(kernel_json.resolve()) + " sha256:")
    before = spec_hash(spec_path)
    kernel_json.write_text(json.dumps(recipe.with_bandwidth(1.5).to_fragment()))
    assert spec_hash(spec_path) != before  # the recipe, not only its file name, is part of the spec
    # problems with the file are one line each, naming the arm's field
    for content, says in (("{", "not a JSON kernel file"), ('{"kernel": {"family": "ridge"}}', "kernel.family: unknown kernel family"),
                          ('{"family": "knn"}', "expected {\"kernel\": {...}}")):
        kernel_json.write_text(content)
        with pytest.raises(SpecError) as e:
            load_spec(spec_path)
        assert any(p.startswith("arms.1.kernel_file: ") and says in p for p in e.value.problems), e.value.problems
    with pytest.raises(SpecError, match="give kernel or kernel_file, not both"):
        parse_spec(spec_with_arms([GRPO, {**tuned, "kernel": {"bandwidth": 1.0}}]))
    with pytest.raises(SpecError, match="no such kernel file"):
        parse_spec(spec_with_arms([GRPO, {**tuned, "kernel_file": str(tmp_path / "missing.json")}]))


def test_the_demo_and_the_users_spec_plan_as_before():
    from design.spec import load_spec

    for name in ("demo_local.json", "gs1_vs_grpo_gsm8k.json"):
        plan = plan_from_spec(load_spec(REPO / "specs" / name))
        assert {a.advantage for a in plan.arms} == {"group_mean", "kernel_cross_prompt_baseline"}
        assert all(a.critic is None and getattr(a.recipe, "kernel_source", None) is None for a in plan.arms)


# ---------------------------------------------------------------------------- the activation gate


def test_kernel_only_gate_metrics_are_not_applicable_to_other_treatments():
    rows = [{"step": s, "prompt_id": f"p{s}-{i}", "reward": float(i % 2), "baseline": 0.5, "advantage": float(i % 2) - 0.5,
             "effective_neighbors": None} for s in range(2) for i in range(8)]
    treatment = {k: [r[k] for r in rows] for k in rows[0]}
    heldout = {"prompt_id": [r["prompt_id"] for r in rows], "sample_idx": [0] * 16, "reward": [r["reward"] for r in rows]}
    checks = [GateCheck(metric="kernel_effective_neighbors_p10", min=8.0), GateCheck(metric="baseline_reward_corr", min=0.1),
              GateCheck(metric="frac_nonzero_advantage_treatment", min=0.5)]
    for estimator, not_applicable in (("flash_reinforce", {"kernel_effective_neighbors_p10", "baseline_reward_corr"}),
                                      ("batch_mean", {"kernel_effective_neighbors_p10", "baseline_reward_corr"}),
                                      ("critic", {"kernel_effective_neighbors_p10"}),
                                      ("kernel_cross_prompt_baseline", set())):
        metrics = compute_gate_metrics(treatment, treatment, heldout, treatment_estimator=estimator)
        results = {r.metric: r for r in evaluate_checks(checks, metrics)}
        for metric, r in results.items():
            if metric in not_applicable:
                assert r.passed and str(r.observed).startswith("not applicable")
            else:
                assert not str(r.observed).startswith("not applicable")
        # a kernel treatment without neighbours fails the check, as before
        assert results["kernel_effective_neighbors_p10"].passed == (estimator != "kernel_cross_prompt_baseline")


# ---------------------------------------------------------------------------- the loop at the user's shape


@pytest.mark.filterwarnings("error::FutureWarning")  # current tinker SDK usage only (issue 16)
@pytest.mark.parametrize("kind", ["flash_reinforce", "critic"])
def test_the_loop_runs_the_arm_at_the_users_shape_and_its_log_audits(kind, tiny_model_dir, tiny_service_client):
    """Two steps of 64 prompts x 1 rollout through `rl.loop.run_step` on the local engine (the
    tinker client surface): the learner's forward pass / the critic's forward and training step
    run, and the logged rows recompute exactly under the independent reference."""
    import pyarrow as pa
    from tinker_cookbook import renderers

    from fixtures.flow_env import TokenThresholdEnv
    from rl.loop import new_window, run_step
    from schemas.artifacts import to_table

    config = arm(kind, 1, 64).model_copy(update={"base_model": str(tiny_model_dir), "max_tokens": 3, "lora_rank": 4,
                                                 "lr": 1e-2})
    client = tiny_service_client.create_lora_training_client(base_model=str(tiny_model_dir), rank=4, seed=0).result()
    critic = (tiny_service_client.create_lora_training_client(base_model=str(tiny_model_dir), rank=4, seed=0).result()
              if kind == "critic" else None)
    renderer = renderers.get_renderer("qwen3_instruct", client.get_tokenizer())
    env = TokenThresholdEnv()
    window, tables, metrics = new_window(config), [], []
    for step in range(2):
        log = run_step(step, config, training_client=client, env=env, renderer=renderer, order=env.train_order(0),
                       window=window, critic_client=critic)
        window = log.next_window
        tables.append(to_table("rollouts", [row.as_dict() for row in log.rollouts]))
        metrics.append(log.metrics)
    result = audit_log(config, rollout_log(pa.concat_tables(tables)))
    assert result.passed and result.rows == 128 and result.steps == 2, result.mismatches[:3]
    if kind == "flash_reinforce":
        # one optimizer step per fresh batch at temperature 1: the learner's forward pass sees the
        # sampler's policy (float32 on CPU), so the gate admits every trajectory
        assert [m["trust_admit_rate"] for m in metrics] == [1.0, 1.0]
        assert all(m["sequence_kl_mean"] < 1e-6 for m in metrics)
        with pytest.raises(ValueError, match="critic client goes with"):
            run_step(2, config, training_client=client, env=env, renderer=renderer, order=env.train_order(0),
                     window=window, critic_client=client)
    else:
        assert all(m["critic_forward_tokens"] > 64 and m["critic_train_tokens"] > 0 for m in metrics)
        assert metrics[1]["critic_loss"] != metrics[0]["critic_loss"]


# ---------------------------------------------------------------------------- end to end on CPU


def two_arm_spec(model_dir: Path, treatment: dict, **bounds) -> dict:
    spec = json.loads((REPO / "specs" / "demo_local.json").read_text())
    spec.update(
        title=f"arm kind {treatment['advantage']}", base_model=str(model_dir), base_model_path=None, renderer="qwen3_instruct",
        batch_size=16, steps=3, lora_rank=4, max_seq_len=64, sampling={"max_tokens": 2, "temperature": 1.0},
        pilot={"steps": 2, "heldout_prompts": 16, "heldout_samples": 8}, budget={"gpu_hours": 1.0, "max_wall_minutes": 60},
        restoration_preflight=None,
    )
    spec["dataset"] = {"name": "token_threshold", "n_examples": 48}
    spec["eval"] = {**spec["eval"], "n_examples": 48}
    spec["feasibility"] = {**spec["feasibility"], "effective_config": None}
    spec["arms"] = [{"name": "grpo_gs8", "advantage": "group_mean", "group_size": 8, "groups_per_batch": 2, "lr": 1e-3, "seed": 0},
                    {"group_size": 1, "groups_per_batch": 16, "lr": 1e-3, "seed": 0, **treatment}]
    for check in spec["activation_gate"]["checks"]:
        check.update(bounds.get(check["metric"], {}))
    return spec


@pytest.mark.parametrize("treatment, bounds", [
    ({"name": "flash", "advantage": "flash_reinforce"}, {}),
    # a critic two steps into training predicts little yet: its pre-registered corr bound is loose here
    ({"name": "critic", "advantage": "critic", "critic": {"lr": 1e-2}}, {"baseline_reward_corr": {"min": -1.0}}),
])
def test_a_two_arm_spec_runs_end_to_end_against_grpo(prefect_harness, tmp_path, tiny_model_dir, treatment, bounds):
    from flows.experiment import experiment_in

    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(two_arm_spec(tiny_model_dir, treatment, **bounds)))
    run_dir = tmp_path / "run"
    state = experiment_in(run_dir)(spec_path=str(spec_path), run_dir=str(run_dir), backend="local", return_state=True)
    assert state.is_completed(), state.message
    name = treatment["name"]
    decision = json.loads((run_dir / "decision" / "decision.json").read_text())
    assert decision["treatment"] == name and decision["baseline"] == "grpo_gs8" and decision["n"] == 48

    plan = json.loads((run_dir / "spec" / "plan.json").read_text())
    held = next(a for a in plan["arms"] if a["name"] == name)
    rollouts = read_rows("rollouts", run_dir / "train" / name / "rollouts.parquet")
    metrics = read_rows("step_metrics", run_dir / "train" / name / "step_metrics.parquet")
    assert sorted({r["step"] for r in rollouts}) == [0, 1, 2] and len(metrics) == 3
    assert all(r["sample_idx"] == 0 for r in rollouts)  # one rollout per prompt
    if treatment["advantage"] == "flash_reinforce":
        assert held["recipe"]["trust_delta"] == 3e-3
        for r in rollouts:
            assert len(r["learner_logprobs"]) == len(r["sampler_logprobs"]) == r["num_tokens"]
        # temperature 1 and one optimizer step per fresh batch: the learner's forward pass sees the
        # sampler's own policy, so the gate admits (almost) everything
        for m in metrics:
            assert m["trust_admit_rate"] is not None and m["trust_admit_rate"] >= 0.9
            assert m["learner_forward_seconds"] > 0 and m["learner_forward_tokens"] > 0
            step_rows = [r for r in rollouts if r["step"] == m["step"]]
            assert m["trust_admit_rate"] == pytest.approx(np.mean([r["admitted"] for r in step_rows]))
        assert all(m["critic_forward_seconds"] is None for m in metrics)
    else:
        assert held["recipe"]["critic"]["lr"] == 1e-2
        for m in metrics:
            assert m["critic_forward_seconds"] > 0 and m["critic_train_seconds"] > 0
            assert m["critic_forward_tokens"] > 0 and m["critic_train_tokens"] > 0 and m["critic_loss"] > 0
            assert m["trust_admit_rate"] is None
        # the critic is trained: its baseline for the same prompts moves from step to step
        by_step = {s: [r["baseline"] for r in rollouts if r["step"] == s] for s in (0, 1, 2)}
        assert by_step[0] != by_step[2]
        for r in rollouts:
            assert r["baseline"] == pytest.approx(1 / (1 + math.exp(r["critic_no_logprob"] - r["critic_yes_logprob"])), abs=1e-12)
    # the audit recomputed the new arm's columns with its own reference, before the gate and the decision
    for stage in ("pilot", "train"):
        audit = {r["metric"]: r for r in read_rows("gate_report", run_dir / "audit" / stage / "gate_report.parquet")}
        observed = json.loads(audit[f"{name}.max_abs_diff"]["observed"])
        assert audit[f"{name}.max_abs_diff"]["passed"] and observed["mismatches"] == 0
        assert observed["reference"] == f"estimators.reference.{treatment['advantage']}_log_reference"
    gate = {r["metric"]: r for r in read_rows("gate_report", run_dir / "gate" / "gate_report.parquet")}
    assert gate["kernel_effective_neighbors_p10"]["passed"]
    assert gate["kernel_effective_neighbors_p10"]["observed"].startswith("not applicable")
    record = json.loads((run_dir / "preflight" / "record.json").read_text())
    checks = {c["name"]: c for c in record["checks"]}
    assert checks[f"step_check_{name}"]["passed"] and checks["reference_loss"]["passed"] and checks["reference_gradient"]["passed"]
    if treatment["advantage"] == "critic":
        assert checks["probe_critic_critic"]["passed"]


@pytest.mark.slow  # loads the tiny model on its own service and trains two arms
def test_two_arms_stepping_together_share_decodes_and_each_logs_what_it_would_alone(tiny_model_dir, tmp_path):
    """grpo_gs8 (8 x 8) and gs1_kernel (64 x 1), the user's 64 rollouts a step, each stepping
    through `rl.loop.run_step` in its own thread on one base with the CUDA batching
    (`batch_across_clients`, the flush's gather, 1024-row batches): the arms' rows decode in
    batches across the two adapters, and each arm logs the rollouts, rewards, prompt logprobs
    and advantages it logs stepping alone (its own batches): the shared decode changed nothing
    it registered."""
    import threading

    import pyarrow as pa
    from tinker_cookbook import renderers

    from fixtures.flow_env import TokenThresholdEnv
    from engine import LocalServiceClient
    from rl.loop import new_window, run_step
    from schemas.artifacts import to_table

    def config(name, advantage, group_size, groups):
        return arm(advantage, group_size, groups).model_copy(update={
            "name": name, "base_model": str(tiny_model_dir), "max_tokens": 3, "lora_rank": 4, "lr": 1e-2})

    arms = [config("grpo_gs8", "group_mean", 8, 8), config("gs1_kernel", "kernel_cross_prompt_baseline", 1, 64)]
    env = TokenThresholdEnv()

    def run(arm_config, client, steps, out):
        try:
            steps_of(arm_config, client, steps, out)
        except BaseException as e:  # a thread's failure fails the test
            out[arm_config.name] = e
        finally:  # an arm done gives its client back, as the pipeline's arms do (`given_back`)
            client.release()

    def steps_of(arm_config, client, steps, out):
        renderer = renderers.get_renderer("qwen3_instruct", client.get_tokenizer())
        window, logs = new_window(arm_config), []
        for step in range(steps):
            log = run_step(step, arm_config, training_client=client, env=env, renderer=renderer,
                           order=env.train_order(0), window=window)
            window = log.next_window
            logs.append(log)
        out[arm_config.name] = logs

    def service(across: bool) -> LocalServiceClient:
        return LocalServiceClient(device="cpu", cache_dir=tmp_path / f"across-{across}", max_batch_rows=1024,
                                  batch_across_clients=across)

    alone: dict = {}
    svc = service(False)
    for a in arms:
        run(a, svc.create_lora_training_client(str(tiny_model_dir), rank=4, seed=0).result(), 2, alone)

    together: dict = {}
    svc = service(True)
    clients = [svc.create_lora_training_client(str(tiny_model_dir), rank=4, seed=0).result() for _ in arms]
    gen = clients[0]._engine.sampler.generator
    adapters_per_batch = []  # a spy around the real generate: which adapters each batch held
    generate = gen.generate

    def spy(rows):
        adapters_per_batch.append(len({id(r.adapter) for r in rows}))
        return generate(rows)

    gen.generate = spy
    threads = [threading.Thread(target=run, args=(a, c, 2, together)) for a, c in zip(arms, clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not [v for v in [*alone.values(), *together.values()] if isinstance(v, BaseException)], (alone, together)
    # Every row decoded once, in at most three batches, and batches held both adapters. The
    # first step may split (an arm that has not sampled yet is not waited for: a critic's value
    # client never samples), and then one arm's step k shares a batch with the other's step k+1
    # (an arm is waited for from the return of its samples until it waits on its next ones).
    assert gen.stats.rows == 2 * 128 and len(adapters_per_batch) <= 3 and 2 in adapters_per_batch, adapters_per_batch

    for a in arms:
        for got, want in zip(together[a.name], alone[a.name]):
            def key(r):
                return (r.prompt_id, r.group_id, r.sample_idx, r.response, r.stop_reason, r.reward)

            assert [key(r) for r in got.rollouts] == [key(r) for r in want.rollouts]
            close = [(x, y) for g, w in zip(got.rollouts, want.rollouts)
                     for x, y in [(g.prompt_mean_logprob, w.prompt_mean_logprob), (g.advantage, w.advantage)]]
            assert max(abs(x - y) for x, y in close) < 1e-5
        tables = [to_table("rollouts", [row.as_dict() for row in log.rollouts]) for log in together[a.name]]
        result = audit_log(a, rollout_log(pa.concat_tables(tables)))
        assert result.passed and result.rows == 128, result.mismatches[:3]
