"""Stage: validate the spec and lay out the run directory.

The stage turns the spec into a *plan*: plain JSON with exactly what each later stage needs.
Stages take their slice of the plan as input, so changing a gate bound re-keys only the gate.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from design.arm import ArmConfig
from design.plan import RunPlan, plan_from_spec
from design.revision import SpecRevision, experiment_hash, field_changes
from design.spec import ExperimentSpec, SpecOverrides, anchored, load_spec, set_arm_kernel, spec_hash
from rl.backends import backend_named
from pipeline.artifacts import publish_markdown
from pipeline.cache import stage_cache
from pipeline.running import stage_end_hooks, uncached_stage_hooks
from schemas.errors import UserError
from schemas.io import write_json_atomic
from schemas.kernel import CALIBRATION
from schemas.layout import CALIBRATED_SPEC, VALIDATE_SPEC, RunLayout


def run_name(spec: ExperimentSpec) -> str:
    """`<title-slug>-<experiment-hash>`: the run directory's name (and the flow run's, with the
    backend). Gate bounds, the decision rule and the budget are not part of it
    (design.revision.JUDGING_FIELDS): an edit there re-runs, in the same directory, only what
    reads them."""
    from design.spec import slug

    return f"{slug(spec.title)}-{experiment_hash(spec)}"


def run_dir_for(spec_path: str | Path, runs_root: str | Path = "runs") -> Path:
    """`runs/<title-slug>-<experiment-hash>/`: one directory per experiment."""
    return Path(runs_root) / run_name(load_spec(spec_path))


def flow_run_name(spec_path: str | Path, backend: str, overrides: dict | None = None) -> str:
    """`<title-slug>-<experiment-hash>-<backend>`; a spec that does not load is named by its file
    (the flow run then fails on the spec's problems, in its first stage)."""
    from design.spec import SpecOverrides, apply_overrides, parse_spec

    try:
        if overrides:
            spec = parse_spec(apply_overrides(json.loads(Path(spec_path).read_text()), SpecOverrides(**overrides),
                                              Path(spec_path).parent))
        else:
            spec = load_spec(spec_path)
        return f"{run_name(spec)}-{backend}"
    except Exception:  # a name is never the reason a run fails
        return f"{Path(spec_path).stem}-unreadable-spec-{backend}"


@task(name=VALIDATE_SPEC, task_run_name=VALIDATE_SPEC, cache_policy=NO_CACHE, **uncached_stage_hooks())
def validated_plan(spec_path: str, layout: RunLayout) -> RunPlan:
    """Validate the spec (SpecError stops the flow), record an edit of the spec this directory
    ran before (`spec/revisions/NNN.json`), and write `spec/{spec,plan}.json`. Never cached:
    it is cheap, and spec.json must be the spec of this run."""
    spec = load_spec(spec_path)
    plan = plan_from_spec(spec)
    spec_json = json.loads(Path(spec_path).read_text())
    _record_revision(layout, spec_json)
    write_json_atomic(layout.spec_json, spec_json)
    write_json_atomic(layout.plan_json, plan.model_dump(mode="json"))
    arms = "\n".join(
        f"| {a.name} | {a.advantage}{_recipe_label(a)} | "
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


def _recipe_label(arm: ArmConfig) -> str:
    label = arm.estimator.label(arm.recipe)
    return f" ({label})" if label else ""


def _record_revision(layout: RunLayout, new: dict) -> SpecRevision | None:
    """When the directory last ran another spec: write the edit (old, new, each changed field) as
    the next `spec/revisions/NNN.json`, publish it, and log it."""
    from design.spec import parse_spec

    try:
        old = json.loads(layout.spec_json.read_text())
    except (OSError, ValueError):
        return None  # the directory's first run (or its record is gone): nothing to compare with
    changes = field_changes(old, new)
    if not changes:
        return None

    def hash_of(spec_json: dict) -> str:
        try:
            return spec_hash(parse_spec(spec_json))
        except Exception:  # an old record that no longer validates is still an old spec
            return "invalid"

    number = 1 + len(list(layout.revisions_dir.glob("[0-9][0-9][0-9].json")))
    revision = SpecRevision(number=number, at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                            old_spec_hash=hash_of(old), new_spec_hash=hash_of(new), changes=tuple(changes), old=old, new=new)
    write_json_atomic(layout.revisions_dir / f"{number:03d}.json", revision.model_dump(mode="json"))
    shown = "\n".join(f"| `{c.field}` | `{json.dumps(c.old)}` | `{json.dumps(c.new)}` |" for c in changes)
    publish_markdown(
        "spec-revision",
        f"# Spec revision {number}\n\n{revision.old_spec_hash} -> {revision.new_spec_hash}; stages whose inputs did "
        f"not change are served from cache.\n\n| field | old | new |\n|---|---|---|\n{shown}\n\n"
        f"Old and new spec: `{layout.revisions_dir / f'{number:03d}.json'}`\n",
        description=f"Spec revised: {', '.join(c.field for c in changes)}"[:500],
    )
    get_run_logger().info(f"spec revised since this directory's last run: {'; '.join(c.text for c in changes)}")
    return revision


@task(name=CALIBRATED_SPEC, task_run_name=CALIBRATED_SPEC, **stage_end_hooks(), cache_policy=stage_cache("spec_path"), persist_result=True)
def calibrated_plan(calibration: RunPlan, spec_path: str, layout: RunLayout) -> RunPlan:
    """Record the revised spec before any full run: the treatment's kernel as the calibrated plan
    (`RunPlan.calibrated`) holds it; that plan, naming its revised spec, is what the runs read."""
    spec_json = anchored(json.loads(Path(spec_path).read_text()), Path(spec_path).parent)  # written to the run directory
    treatment = calibration.run.treatment
    bandwidth = calibration.treatment.kernel.bandwidth
    for arm in spec_json["arms"]:
        if arm["name"] == treatment:  # the revision holds the recipe itself
            set_arm_kernel(arm, calibration.treatment.kernel)
    spec_json.setdefault("revisions", []).append(
        {
            "reason": f"pre-registered calibration: {CALIBRATION.metric} failed on the pilot",
            "change": {"arm": treatment, "kernel.bandwidth": bandwidth},
            "chosen_on": "pilot training prompts only",
        }
    )
    revised = write_json_atomic(layout.revised_spec_json, spec_json)
    create_markdown_artifact(
        key="revised-spec",
        markdown=f"# Revised spec\n\nCalibration chose bandwidth **{bandwidth}** for `{treatment}`.\n\n"
        f"```json\n{json.dumps(spec_json['revisions'], indent=2)}\n```\n",
        description="Revised spec from the pre-registered bandwidth calibration",
    )
    return calibration.model_copy(update={"revised_spec": str(revised)})


@dataclass(frozen=True)
class RunRequest:
    """What a run started from the UI asked for, checked: a spec that loads with its overrides, on
    a backend that can load its model."""

    spec_path: str
    backend: str
    overrides: SpecOverrides


def checked_request(spec_path: str, backend: str, overrides: SpecOverrides | dict | None) -> RunRequest:
    """The parameters of a run started from the UI, checked before anything is written; a
    UserError of one line otherwise: the overrides' bad fields with their bounds, the spec's
    problems, a backend that is not one, or a model path that does not exist (`Backend.check_model_path`)."""
    from design.spec import apply_overrides, overrides_from, parse_spec

    named = backend_named(backend)
    checked = overrides_from(overrides)
    path = Path(spec_path)
    spec = load_spec(path)  # a bad spec stops here with its problems listed
    if not checked.is_empty():
        spec = parse_spec(apply_overrides(json.loads(path.read_text()), checked, path.parent), source="spec with overrides")
    named.check_model_path(spec.base_model_path or spec.base_model)  # a path that does not exist: one line
    return RunRequest(spec_path=str(spec_path), backend=backend, overrides=checked)


@task(name="spec with overrides", task_run_name="spec with overrides", **stage_end_hooks(), cache_policy=stage_cache("spec_path"),
      persist_result=True)
def spec_with_overrides(spec_path: str, overrides: dict, runs_root: str = "runs") -> dict:
    """The spec to run: the file itself, or its revision with `overrides` written in full to
    `runs/specs/<slug>-<hash>.json` (a revision is recorded, never applied silently)."""
    from design.spec import SpecOverrides, apply_overrides, parse_spec, slug

    path = Path(spec_path).resolve()
    load_spec(path)  # a bad spec stops here with its problems listed
    if not overrides:
        return {"spec_path": str(path), "run_dir": str(run_dir_for(path, runs_root).resolve())}
    revised = apply_overrides(json.loads(path.read_text()), SpecOverrides(**overrides), path.parent)
    spec = parse_spec(revised)
    out = write_json_atomic(Path(runs_root) / "specs" / f"{slug(spec.title)}-{spec_hash(spec)}.json", revised)
    return {"spec_path": str(out.resolve()), "run_dir": str((Path(runs_root) / run_name(spec)).resolve())}
