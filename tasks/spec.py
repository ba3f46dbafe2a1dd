"""Stage: validate the spec and lay out the run directory.

The stage turns the spec into a *plan*: plain JSON with exactly what each later stage needs.
Stages take their slice of the plan as input, so changing a gate bound re-keys only the gate.
"""

from __future__ import annotations

import json
from pathlib import Path

from prefect import task
from prefect.artifacts import create_markdown_artifact

from schemas.arm import ArmConfig
from schemas.io import write_json_atomic
from schemas.layout import RunLayout
from schemas.plan import DecisionPlan, RunContext, RunPlan
from schemas.spec import ExperimentSpec, baseline_arm, compared_arms, load_spec, spec_hash, treatment_arm
from tasks.common import stage_cache


def run_dir_for(spec_path: str | Path, runs_root: str | Path = "runs") -> Path:
    """`runs/<title-slug>-<spec-hash>/`: one directory per distinct spec."""
    from schemas.spec import slug

    spec = load_spec(spec_path)
    return Path(runs_root) / f"{slug(spec.title)}-{spec_hash(spec_path)}"


def plan_from_spec(spec: ExperimentSpec) -> RunPlan:
    """The run plan: every stage's inputs, typed. A kernel arm holds its validated KernelSpec."""
    arms = tuple(
        ArmConfig(
            name=arm.name, advantage=arm.advantage, group_size=arm.group_size, groups_per_batch=arm.groups_per_batch,
            lr=arm.lr, seed=arm.seed, steps=spec.steps, lora_rank=spec.lora_rank, base_model=spec.base_model,
            base_model_path=spec.base_model_path, max_tokens=spec.sampling.max_tokens,
            temperature=spec.sampling.temperature, kernel=arm.kernel if arm.estimator == "gs1_kernel" else None,
        )
        for arm in spec.arms
    )
    criterion = spec.decision_rule.criteria[0]
    return RunPlan(
        title=spec.title,
        run=RunContext(
            env=spec.dataset.name, env_options=dict(spec.dataset.options), renderer=spec.renderer,
            base_model=spec.base_model, treatment=treatment_arm(spec).name, baseline=baseline_arm(spec).name,
        ),
        arms=arms,
        pilot=spec.pilot,
        checks=tuple(spec.activation_gate.checks),
        n_eval=spec.eval.n_examples,
        decision=DecisionPlan(
            alpha=spec.decision_rule.alpha, margin=criterion.margin, bounds=tuple(criterion.bounds),
            criterion=criterion.id, method=spec.decision_rule.method,
            compared=tuple(a.name for a in compared_arms(spec)),
        ),
        budget=spec.budget,
        preflight=spec.correctness_preflight,
        seeds=tuple(spec.decision_rule.seeds),
    )


@task(name="validate spec", cache_policy=stage_cache("spec_path"), persist_result=True)
def validated_plan(spec_path: str, run_dir: str) -> RunPlan:
    """Validate the spec (SpecError stops the flow) and write `spec/{spec,plan}.json`."""
    spec = load_spec(spec_path)
    plan = plan_from_spec(spec)
    layout = RunLayout(run_dir)
    write_json_atomic(layout.spec_json, json.loads(Path(spec_path).read_text()))
    write_json_atomic(layout.plan_json, plan.model_dump(mode="json"))
    arms = "\n".join(
        f"| {a.name} | {a.advantage}{'' if a.kernel is None else ' (' + a.kernel.label() + ')'} | "
        f"{a.groups_per_batch} x {a.group_size} | {a.lr:g} |"
        for a in plan.arms
    )
    create_markdown_artifact(
        key="spec",
        markdown=(
            f"# {spec.title}\n\nmodel `{spec.base_model}`, {spec.steps} steps, env `{plan.run.env}`, "
            f"{plan.n_eval} eval items\n\n| arm | advantage | prompts x rollouts | lr |\n|---|---|---|---|\n{arms}\n"
        ),
        description="The validated spec",
    )
    return plan


@task(name="calibrated spec", cache_policy=stage_cache("spec_path"), persist_result=True)
def calibrated_plan(plan: RunPlan, spec_path: str, bandwidth: float, run_dir: str) -> RunPlan:
    """Record the revised spec (treatment bandwidth from the calibration) before any full run."""
    spec_json = json.loads(Path(spec_path).read_text())
    treatment = plan.run.treatment
    for arm in spec_json["arms"]:
        if arm["name"] == treatment:
            arm["kernel"] = {**(arm.get("kernel") or {}), "bandwidth": bandwidth}
    spec_json.setdefault("revisions", []).append(
        {
            "reason": "pre-registered calibration: kernel_effective_neighbors_p10 failed on the pilot",
            "change": {"arm": treatment, "kernel.bandwidth": bandwidth},
            "chosen_on": "pilot training prompts only",
        }
    )
    revised = write_json_atomic(RunLayout(run_dir).revised_spec_json, spec_json)
    create_markdown_artifact(
        key="revised-spec",
        markdown=f"# Revised spec\n\nCalibration chose bandwidth **{bandwidth}** for `{treatment}`.\n\n"
        f"```json\n{json.dumps(spec_json['revisions'], indent=2)}\n```\n",
        description="Revised spec from the pre-registered bandwidth calibration",
    )
    return plan.calibrated(bandwidth, str(revised))


@task(name="spec with overrides", cache_policy=stage_cache("spec_path"), persist_result=True)
def spec_with_overrides(spec_path: str, overrides: dict, runs_root: str = "runs") -> dict:
    """The spec to run: the file itself, or its revision with `overrides` written in full to
    `runs/specs/<slug>-<hash>.json` (a revision is recorded, never applied silently)."""
    from schemas.spec import SpecOverrides, apply_overrides, parse_spec, slug

    path = Path(spec_path).resolve()
    load_spec(path)  # a bad spec stops here with its problems listed
    if not overrides:
        return {"spec_path": str(path), "run_dir": str(run_dir_for(path, runs_root).resolve())}
    revised = apply_overrides(json.loads(path.read_text()), SpecOverrides(**overrides))
    name = f"{slug(revised['title'])}-{spec_hash(parse_spec(revised))}"
    out = write_json_atomic(Path(runs_root) / "specs" / f"{name}.json", revised)
    return {"spec_path": str(out.resolve()), "run_dir": str((Path(runs_root) / name).resolve())}
