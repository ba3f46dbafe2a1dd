"""Deployments: the run form is built from the pydantic overrides; prefect.yaml points at real flows."""

from __future__ import annotations

import json

import pytest
import yaml

from design.spec import SpecOverrides, apply_overrides, load_spec, spec_hash
from gs1.cli import main


def test_serve_builds_deployments_whose_form_comes_from_the_spec_overrides():
    from gs1.commands.serve import build_deployments

    run, collect = build_deployments("specs/gs1_vs_grpo_gsm8k.json")
    assert (run.flow_name, collect.flow_name) == ("gs1-run", "collect-rollout-logs")
    # the names the UI shows in bold say what each does
    assert (run.name, collect.name) == ("experiment", "hill-climb-logs")
    schema = run._parameter_openapi_schema.model_dump()
    assert schema["properties"]["spec_path"]["default"] == "specs/demo_local.json"
    assert run.parameters == {"spec_path": "specs/gs1_vs_grpo_gsm8k.json"}
    assert schema["properties"]["backend"]["enum"] == ["local", "tinker"]
    fields = schema["definitions"]["SpecOverrides"]["properties"]
    assert set(SpecOverrides.model_fields) == set(fields)
    # each field its own type and bound (no `null` branch), the block a plain object defaulting to {}:
    # the form validates field by field
    assert fields["steps"] == {"description": "Training steps per arm (> 0)", "exclusiveMinimum": 0, "title": "Steps",
                               "type": "integer"}
    assert not any("anyOf" in f or "default" in f for f in fields.values()), fields
    assert schema["properties"]["overrides"]["$ref"] == "#/definitions/SpecOverrides"
    assert schema["properties"]["overrides"]["default"] == {}
    # a share of a sweep's units from the form too (gs1 run --units)
    assert schema["properties"]["units"]["anyOf"][0] == {"items": {"type": "string"}, "type": "array"}


def test_prefect_yaml_entrypoints_load_the_flows(repo_root, monkeypatch):
    from prefect.flows import load_flow_from_entrypoint

    monkeypatch.chdir(repo_root)

    def names(file: str) -> set[str]:
        config = yaml.safe_load((repo_root / "deployments" / file).read_text())
        return {f"{load_flow_from_entrypoint(d['entrypoint']).name}/{d['name']}" for d in config["deployments"]}

    assert names("prefect.yaml") == {"gs1-run/experiment", "collect-rollout-logs/hill-climb-logs"}  # as `gs1 serve`
    assert names("units.yaml") == {"gs1-arm-unit/train-and-eval"}  # what a sweep's --dispatch names


def test_overrides_revise_the_spec_and_its_hash(repo_root):
    path = repo_root / "specs" / "gs1_vs_grpo_gsm8k.json"
    original = json.loads(path.read_text())
    revised = apply_overrides(original, SpecOverrides(steps=2, bandwidth=1.0, n_eval=10))
    assert revised["steps"] == 2 and revised["eval"]["n_examples"] == 10
    assert [a.get("kernel", {}).get("bandwidth") for a in revised["arms"]] == [None, 1.0]
    assert revised["overrides"] == [{"steps": 2, "bandwidth": 1.0, "n_eval": 10}]
    assert original["steps"] == 40  # the input is untouched
    from design.spec import parse_spec

    assert spec_hash(parse_spec(revised)) != spec_hash(load_spec(path))
    with pytest.raises(Exception):
        SpecOverrides(steps=0)
    with pytest.raises(Exception):
        SpecOverrides(unknown=1)


def test_serve_without_a_server_is_one_line_exit_2(monkeypatch, capsys):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: None}):
        assert main(["serve"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "prefect server start" in err


def test_bad_form_input_is_one_line_naming_the_field_and_its_bound():
    """What the run form's validation says (Prefect's own validator on the deployment's schema),
    and what the flow says when a run is started without it: the field and the bound, one line."""
    from prefect.utilities.schema_tools.validation import ValidationError, validate

    from design.spec import overrides_from
    from gs1.commands.serve import build_deployments
    from schemas.errors import UserError

    schema = build_deployments()[0]._parameter_openapi_schema.model_dump()
    validate({"spec_path": "s.json"}, schema, raise_on_error=True, preprocess=True)  # the defaults pass
    validate({"spec_path": "s.json", "overrides": {}}, schema, raise_on_error=True, preprocess=True)
    with pytest.raises(ValidationError) as refused:
        validate({"spec_path": "s.json", "overrides": {"steps": -1}}, schema, raise_on_error=True, preprocess=True)
    assert str(refused.value) == ("Validation failed for field 'overrides.steps'. Failure reason: -1 is less than or "
                                  "equal to the minimum of 0")
    assert overrides_from({"steps": 3}).steps == 3 and overrides_from(None).is_empty()
    for bad, line in (({"steps": -1}, "overrides.steps = -1: Input should be greater than 0"),
                      ({"lr": 0, "steps": 2}, "overrides.lr = 0: Input should be greater than 0"),
                      ({"stepz": 2}, "overrides.stepz: Extra inputs are not permitted")):
        with pytest.raises(UserError) as e:
            overrides_from(bad)
        assert str(e.value) == line
