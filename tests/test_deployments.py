"""Deployments: the run form is built from the pydantic overrides; prefect.yaml points at real flows."""

from __future__ import annotations

import json

import pytest
import yaml

from gs1.cli import main
from schemas.spec import SpecOverrides, apply_overrides, load_spec, spec_hash


def test_serve_builds_deployments_whose_form_comes_from_the_spec_overrides():
    from gs1.commands.serve import build_deployments

    run, collect = build_deployments("specs/gs1_vs_grpo_gsm8k.json")
    assert (run.flow_name, collect.flow_name) == ("gs1-run", "collect-rollout-logs")
    schema = run._parameter_openapi_schema.model_dump()
    assert schema["properties"]["spec_path"]["default"] == "specs/demo_local.json"
    assert run.parameters == {"spec_path": "specs/gs1_vs_grpo_gsm8k.json"}
    assert schema["properties"]["backend"]["enum"] == ["local", "tinker"]
    fields = schema["definitions"]["SpecOverrides"]["properties"]
    assert set(SpecOverrides.model_fields) == set(fields)
    assert fields["steps"]["anyOf"][0]["exclusiveMinimum"] == 0
    # a share of a sweep's units from the form too (gs1 run --units)
    assert schema["properties"]["units"]["anyOf"][0] == {"items": {"type": "string"}, "type": "array"}


def test_prefect_yaml_entrypoints_load_the_flows(repo_root, monkeypatch):
    from prefect.flows import load_flow_from_entrypoint

    monkeypatch.chdir(repo_root)
    config = yaml.safe_load((repo_root / "deployments" / "prefect.yaml").read_text())
    names = {load_flow_from_entrypoint(d["entrypoint"]).name for d in config["deployments"]}
    assert names == {"gs1-run", "collect-rollout-logs"}


def test_overrides_revise_the_spec_and_its_hash(repo_root):
    path = repo_root / "specs" / "gs1_vs_grpo_gsm8k.json"
    original = json.loads(path.read_text())
    revised = apply_overrides(original, SpecOverrides(steps=2, bandwidth=1.0, n_eval=10))
    assert revised["steps"] == 2 and revised["eval"]["n_examples"] == 10
    assert [a.get("kernel", {}).get("bandwidth") for a in revised["arms"]] == [None, 1.0]
    assert revised["overrides"] == [{"steps": 2, "bandwidth": 1.0, "n_eval": 10}]
    assert original["steps"] == 40  # the input is untouched
    from schemas.spec import parse_spec

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
