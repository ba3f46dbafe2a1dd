"""Stage: correctness preflight. No full run starts unless every check here passes.

Pins the spec's UNRESOLVED revisions in the run record: the installed tinker-cookbook version and
the hash of its `rl/data_processing.py` (the stock GRPO baseline), and the hash of our
independent reference (`rl/reference_gs1.py`).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from prefect import task

from rl import reference_gs1
from rl.estimators import gs1_kernel_step, kernel_params
from rl.kernels import prompt_features
from rl.preflight import (
    Comparison, compare_arrays, compare_loss_and_gradient, cookbook_grpo_datums, cookbook_revision, fixed_batch,
    loop_datums, loop_grpo_advantages, module_revision, probe, with_varied_rewards,
)  # fmt: skip
from schemas.io import write_json_atomic
from tasks.arms import arm_config, env_for, open_arm
from tasks.common import stage_cache
from tasks.gates import record_gate

FIXED_PROMPTS = 4
FIXED_SAMPLES = 4
FIXED_MAX_TOKENS = 32  # the preflight checks code paths, not answers: short rollouts suffice


@task(name="correctness preflight", cache_policy=stage_cache(), persist_result=True)
def correctness_preflight(arms: list[dict], run: dict, preflight: dict, run_dir: str, backend: str,
                          data_dir: str | None) -> dict:  # fmt: skip
    env = env_for(run, data_dir)
    problems = env.train_order(seed=0)[:FIXED_PROMPTS]
    tolerances = preflight["paths"][0]["tolerances"]
    baseline = arm_config(next(a for a in arms if a["name"] == run["baseline"]))
    treatment = arm_config(next(a for a in arms if a["name"] == run["treatment"]))

    def fresh_client(arm=baseline):
        return open_arm(run, arm, backend)[0]

    client, renderer = open_arm(run, baseline, backend)
    rollouts, mean_logprobs = fixed_batch(
        client.save_weights_and_get_sampling_client(), env=env, renderer=renderer, problems=problems,
        num_samples=FIXED_SAMPLES, max_tokens=min(baseline.max_tokens, FIXED_MAX_TOKENS), temperature=baseline.temperature,
    )  # fmt: skip
    rollouts, rewards_source = with_varied_rewards(rollouts)
    results: list[Comparison] = []

    # (a) production gs1_kernel vs the independent reference, on this batch as one step.
    rewards_B = np.asarray([r.reward for r in rollouts], dtype=np.float64)
    features_B_F = prompt_features(
        np.asarray([r.prompt.length for r in rollouts], dtype=np.float64), np.asarray(mean_logprobs, dtype=np.float64)
    )
    params = kernel_params(treatment.kernel)
    ours = gs1_kernel_step(rewards_B, features_B_F, **params)
    reference = reference_gs1.gs1_kernel_reference(
        rewards_B.tolist(), features_B_F.tolist(), [], [],
        bandwidth=params["bandwidth"], window=params["window"], min_mass=params["min_mass"],
    )  # fmt: skip
    results.append(compare_arrays("reference_advantage", ours.advantage, reference["advantage"], atol=1e-12, rtol=0.0))
    results += compare_loss_and_gradient(
        "reference", fresh_client, loop_datums(rollouts, ours.advantage), loop_datums(rollouts, reference["advantage"]), tolerances
    )

    # (b) treatment disabled: our loop's GRPO datums vs the stock cookbook path.
    results += compare_loss_and_gradient(
        "baseline", fresh_client, loop_datums(rollouts, loop_grpo_advantages(rollouts)), cookbook_grpo_datums(rollouts), tolerances
    )

    # (c) the probe, per arm: a fresh client, that arm's advantage, one optim step, finite loss.
    probe_losses = {}
    for arm, advantage in ((baseline, loop_grpo_advantages(rollouts)), (treatment, ours.advantage)):
        result = probe(fresh_client(arm), loop_datums(rollouts, advantage), arm.lr)
        probe_losses[arm.name] = result.details["loss"]
        results.append(Comparison(f"probe_{arm.name}", result.passed, result.details))

    # (d) restoration: both arms start from the same base LoRA init within the seed.
    datums = loop_datums(rollouts, loop_grpo_advantages(rollouts))
    losses = [
        fresh_client(arm).forward(datums, loss_fn="importance_sampling").result().metrics["loss:sum"]
        for arm in (baseline, treatment)
    ]
    lt = tolerances["baseline_loss"]
    results.append(compare_arrays("restoration_loss", [losses[1]], [losses[0]], atol=lt["atol"], rtol=lt["rtol"]))

    out = Path(run_dir) / "preflight"
    record = {
        "revisions": {"baseline_revision": cookbook_revision(), "reference_revision": module_revision(reference_gs1)},
        "backend": backend,
        "fixed_batch": {"prompts": [p.id for p in problems], "samples_per_prompt": FIXED_SAMPLES,
                        "rewards": [r.reward for r in rollouts], "rewards_source": rewards_source},
        "checks": [{"name": r.name, "passed": r.passed, **r.details} for r in results],
    }
    write_json_atomic(out / "record.json", json.loads(json.dumps(record, default=float)))
    rows = [
        {"gate": "correctness_preflight", "metric": r.name,
         "value": float(r.details.get("max_excess_over_tolerance", r.details.get("loss", 0.0))),
         "op": "max", "bound": "0 (excess over tolerance)" if "max_excess_over_tolerance" in r.details else "finite",
         "passed": bool(r.passed), "observed": json.dumps(r.details, default=float)}
        for r in results
    ]  # fmt: skip
    record_gate("correctness_preflight", rows, out)
    return record
