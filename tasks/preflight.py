"""Stage: correctness preflight. No full run starts unless every check here passes.

The checks live in `rl.preflight`; this stage opens the clients, writes the record and the gate.
Pins the spec's UNRESOLVED revisions in the run record: the installed tinker-cookbook version and
the hash of its `rl/data_processing.py` (the stock GRPO baseline), and the hash of our
independent reference (`estimators/reference.py`).
"""

from __future__ import annotations

import contextlib
import json

from design.arm import ArmConfig
from design.plan import RunContext
from design.spec import CorrectnessPreflight
from estimators import reference
from pipeline.cache import stage_cache
from pipeline.judging import judging_task
from pipeline.running import stage_end_hooks
from rl.backends.responses import resolved
from rl.preflight import correctness_checks, cookbook_revision, module_revision
from schemas.io import write_json_atomic
from schemas.layout import PREFLIGHT, RunLayout
from tasks.arms import arm_client, critic_of, env_for, failures_named
from tasks.gates import record_gate

FIXED_PROMPTS = 4
FIXED_SAMPLES = 4
FIXED_MAX_TOKENS = 32  # the preflight checks code paths, not answers: short rollouts suffice


@judging_task(name=PREFLIGHT, task_run_name=PREFLIGHT, **stage_end_hooks(), cache_policy=stage_cache(unread=(("arms", "steps"),)),
              persist_result=True)
def correctness_preflight(arms: tuple[ArmConfig, ...], run: RunContext, preflight: CorrectnessPreflight, layout: RunLayout,
                          backend: str, data_dir: str | None) -> dict:
    env = env_for(run, data_dir)
    problems = env.train_order(seed=0)[:FIXED_PROMPTS]
    tolerances = {k: v.model_dump() for k, v in preflight.paths[0].tolerances.items()}
    baseline = next(a for a in arms if a.name == run.baseline)
    treatment = next(a for a in arms if a.name == run.treatment)

    @contextlib.contextmanager
    def fresh_client(arm: ArmConfig):
        with failures_named(PREFLIGHT, arm.name), arm_client(run, arm, backend) as (training_client, _):
            yield training_client

    # The fixed batch's sampler and one fresh client per check: at most two training clients at once.
    with failures_named(PREFLIGHT, baseline.name), arm_client(run, baseline, backend) as (client, renderer):
        sampling_client = resolved(client.save_weights_and_get_sampling_client(), backend=backend,
                                    call="save_weights_and_get_sampling_client", expected="a sampling client")
        outcome = correctness_checks(
            arms, baseline, treatment, fresh_client=fresh_client, sampling_client=sampling_client, env=env,
            renderer=renderer, problems=problems, num_samples=FIXED_SAMPLES,
            max_tokens=min(baseline.max_tokens, FIXED_MAX_TOKENS), tolerances=tolerances,
            fresh_critic=lambda arm: critic_of(run, arm, backend),
        )
    record = {
        "revisions": {"baseline_revision": cookbook_revision(), "reference_revision": module_revision(reference)},
        "backend": backend,
        "fixed_batch": outcome.fixed_batch,
        "checks": [{"name": c.name, "passed": c.passed, **c.details} for c in outcome.comparisons],
    }
    write_json_atomic(layout.preflight_record, json.loads(json.dumps(record, default=float)))
    rows = [
        {"gate": "correctness_preflight", "metric": c.name, **_value_and_bound(c.details),
         "passed": bool(c.passed), "observed": json.dumps(c.details, default=float)}
        for c in outcome.comparisons
    ]
    record_gate(PREFLIGHT, rows, layout.preflight_dir)
    return record


def _value_and_bound(details: dict) -> dict:
    """The number a preflight row is judged by, and what it needs."""
    if "mismatches" in details:  # a step check: the largest |ours - reference| over every row
        return {"value": float(details["max_abs_diff"]), "op": "max", "bound": details["tolerance"]}
    if "max_excess_over_tolerance" in details:
        return {"value": float(details["max_excess_over_tolerance"]), "op": "max", "bound": "0 (excess over tolerance)"}
    return {"value": float(details.get("loss", 0.0)), "op": "max", "bound": "finite"}
