"""Stages that run arms: the pilot, the full training runs, and eval.

Each training arm logs one Parquet file of rollouts and one of metrics per step, checkpoints with
`save_state` every `checkpoint_every` steps (path and loop state in `checkpoints.parquet`), and
resumes from its last checkpoint when the stage is run again after a crash (a training client
created from that state with its optimizer, the SDK's supported resume).

Every training client is held in `arm_client(...)`, which gives it back to the service when the
stage is done with it: the pilot runs its treatment and baseline side by side (two clients, three
when the treatment has a critic), each training arm one.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
from prefect import get_run_logger, task
from prefect.artifacts import create_progress_artifact, create_table_artifact, update_progress_artifact
from prefect.context import TaskRunContext
from tinker_cookbook import model_info, renderers

from design.arm import ArmConfig
from design.plan import EvalResult, PilotArmRun, PilotLogs, RunContext, TrainedArm
from design.spec import Pilot
from pipeline.cache import digest_paths, record_output, stage_cache
from pipeline.judging import judging_task
from pipeline.running import stage_end_hooks
from pipeline.services import engine_numerics, service_client
from rl.backends import backend_named, release_training_client
from rl.backends.responses import backend_of, resolved
from rl.envs import get_env
from rl.loop import HeldoutRequest, StepLog, eval_rows, new_window, train_arm, window_from_logs
from rl.stats import read_eval_items
from schemas.artifacts import read_artifact, write_artifact
from schemas.cost import ArmCost
from schemas.errors import ArmFailed, BackendError, UserError
from schemas.io import write_json_atomic, write_jsonl_atomic
from schemas.layout import (
    PilotStage, RunLayout, arm_stage_name, artifact_key, merged_logs, pilot_name, stage_info, step_log, step_of, steps_dir,
)
from tasks.gates import record_gate


def env_for(run: RunContext, data_dir: str | None):
    return get_env(run.env, data_dir=data_dir, **run.env_options)


def renderer_for(run: RunContext, tokenizer):
    """A renderer with its own tokenizer: arms run in parallel threads, and a Hugging Face fast
    tokenizer shared across threads fails with 'Already borrowed'."""
    from engine.models import own_tokenizer  # torch and transformers: only once a renderer is made

    name = run.renderer or model_info.get_recommended_renderer_name(run.base_model)
    return renderers.get_renderer(name, own_tokenizer(tokenizer))


TRAINING_CLIENT = "a LoRA training client (a service may cap adapters per user; gs1 holds at most 3 at once)"


def _lora_client(arm: ArmConfig, backend: str, rank: int, state_path: str | None):
    """A LoRA training client on `arm`'s base model: fresh (the arm's seed), or from a `save_state`
    checkpoint with its optimizer state."""
    service = service_client(backend)
    # the unit's name: the local engine's deterministic mode orders a batch's rows by it. In a spec of
    # several seeds, its seed's placement: on several GPUs the engine keeps a seed's units on one
    # (they batch together, and their wall times compare side by side); a single-seed spec's few
    # arms spread one a GPU, as they always have
    metadata = {"unit": arm.unit, **({"placement": f"seed {arm.run_seed}"} if arm.run_seed is not None else {})}
    if state_path is None:
        kwargs = backend_named(backend).lora_options(arm.base_model_path)
        future = service.create_lora_training_client(base_model=arm.base_model, rank=rank, seed=arm.seed,
                                                     user_metadata=metadata, **kwargs)
        call = "create_lora_training_client"
    else:
        future = service.create_training_client_from_state_with_optimizer(state_path, user_metadata=metadata)
        call = "create_training_client_from_state_with_optimizer"
    return resolved(future, backend=backend, call=call, expected=TRAINING_CLIENT)


def open_arm(run: RunContext, arm: ArmConfig, backend: str, state_path: str | None = None):
    """A LoRA training client for `arm` and its renderer: fresh (same base model, rank and seed for
    every arm), or from a checkpoint. The caller gives the client back (`arm_client` does)."""
    training_client = _lora_client(arm, backend, arm.lora_rank, state_path)
    return training_client, renderer_for(run, training_client.get_tokenizer())


def open_critic(run: RunContext, arm: ArmConfig, backend: str, state_path: str | None = None):
    """A critic arm's value model: a second LoRA training client on the arm's base model, fresh or
    from its checkpoint (None for any other arm). The caller gives it back (`critic_of` does)."""
    if arm.critic is None:
        return None
    return _lora_client(arm, backend, arm.critic.lora_rank or arm.lora_rank, state_path)


@contextlib.contextmanager
def failures_named(stage: str, arm_name: str) -> Iterator[None]:
    """A service's failure of a call outside the step loop (opening a client, a checkpoint, the final
    save) ends the stage as an `ArmFailed` naming the stage and the arm (the step loop's own name the step)."""
    try:
        yield
    except BackendError as exc:
        raise ArmFailed.of(stage, arm_name, exc) from exc


@contextlib.contextmanager
def given_back(training_client) -> Iterator:
    """Holds `training_client` for the block, then gives it back to the service."""
    try:
        yield training_client
    except BaseException:
        with contextlib.suppress(Exception):  # the failure in flight is the one to report
            release_training_client(training_client)
        raise
    release_training_client(training_client)


@contextlib.contextmanager
def arm_client(run: RunContext, arm: ArmConfig, backend: str) -> Iterator[tuple]:
    """A fresh client of `arm` and its renderer (`open_arm`), given back on leaving the block."""
    training_client, renderer = open_arm(run, arm, backend)
    with given_back(training_client):
        yield training_client, renderer


@contextlib.contextmanager
def critic_of(run: RunContext, arm: ArmConfig, backend: str, state_path: str | None = None) -> Iterator:
    """A critic arm's value model for the block (`open_critic`), given back after; None otherwise."""
    critic_client = open_critic(run, arm, backend, state_path)
    if critic_client is None:
        yield None
        return
    with given_back(critic_client):
        yield critic_client


def write_step_log(arm_dir: Path, log: StepLog) -> None:
    step = log.metrics["step"]
    rows = [row.as_dict() for row in log.rollouts]
    write_artifact("rollouts", rows, step_log(arm_dir, step, "rollouts"))
    write_artifact("step_metrics", [log.metrics], step_log(arm_dir, step, "metrics"))
    if log.cost is not None:
        write_artifact("step_costs", [log.cost.model_dump()], step_log(arm_dir, step, "costs"))


STEP_LOG_ARTIFACTS = {"rollouts": "rollouts", "metrics": "step_metrics", "costs": "step_costs"}


def read_step_logs(arm_dir: Path, kind: str, before: int | None = None) -> list[pa.Table]:
    files = sorted(steps_dir(arm_dir).glob(f"step-*.{kind}.parquet"))
    name = STEP_LOG_ARTIFACTS[kind]
    tables = []
    for f in files:
        if before is None or step_of(f) < before:
            tables.append(read_artifact(name, f))
    return tables


def merge_step_logs(arm_dir: Path) -> tuple[Path, Path]:
    """Concatenate the per-step logs into `rollouts.parquet` and `step_metrics.parquet`."""
    rollouts = pa.concat_tables(read_step_logs(arm_dir, "rollouts"))
    metrics = pa.concat_tables(read_step_logs(arm_dir, "metrics"))
    rollouts_path, metrics_path = merged_logs(arm_dir)
    return write_artifact("rollouts", rollouts, rollouts_path), write_artifact("step_metrics", metrics, metrics_path)


def _stage_logger():
    """The task run's logger (its lines reach the UI); outside a Prefect run, gs1.train's."""
    return get_run_logger() if TaskRunContext.get() is not None else logging.getLogger("gs1.train")


def _progress_reporter(arm: ArmConfig, total: int, first_step: int, label: str):
    """Per-step callback: a Prefect progress artifact (step / total, reward, elapsed, ETA) and a
    log line. Outside a Prefect run (a plain call) only the log line."""
    started = time.time()
    in_prefect = TaskRunContext.get() is not None
    logger = _stage_logger()
    progress_id = None
    if in_prefect:
        progress_id = create_progress_artifact(
            progress=100.0 * first_step / max(total, 1),
            key=artifact_key(f"{label} {arm.unit}"),
            description=f"{label} {arm.unit}: step {first_step}/{total}",
        )

    def report(log: StepLog) -> None:
        done = log.metrics["step"] + 1
        elapsed = time.time() - started
        per_step = elapsed / max(done - first_step, 1)
        eta = per_step * (total - done)
        if progress_id is not None:
            update_progress_artifact(
                artifact_id=progress_id,
                progress=100.0 * done / total,
                description=(
                    f"{label} {arm.unit}: step {done}/{total}, reward {log.metrics['reward_mean']:.3f}, "
                    f"elapsed {elapsed:.0f}s, ETA {eta:.0f}s"
                ),
            )
        logger.info(
            f"{label} {arm.unit}: step {done}/{total} reward={log.metrics['reward_mean']:.3f} "
            f"|adv|={log.metrics['advantage_abs_mean']:.3f} loss={log.metrics['loss']:.4g} "
            f"elapsed={elapsed:.0f}s eta={eta:.0f}s"
        )

    return report


# ---------------------------------------------------------------------------------------------
# Pilot


def _pilot_run_name() -> str:
    from prefect.runtime import task_run

    return pilot_name(task_run.parameters.get("stage", "pilot"))


def _pilot_inputs(arm: ArmConfig, is_treatment: bool, pilot: Pilot, run: RunContext, backend: str,
                  data_dir: str | None) -> str:
    """The digest of what an arm's part of a pilot stage runs: a finished record names it."""
    import hashlib
    import json

    what = {"arm": arm.model_dump(mode="json"), "treatment": is_treatment, "pilot": pilot.model_dump(mode="json"),
            "run": run.model_dump(mode="json"), "backend": backend, "data_dir": data_dir}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()


def _finished_pilot_arm(record: Path, inputs: str) -> PilotArmRun | None:
    """The arm's finished record when it ran these `inputs` and its logs still verify, else None."""
    try:
        finished = PilotArmRun.model_validate_json(record.read_text())
    except (OSError, ValueError):
        return None
    if finished.inputs != inputs or digest_paths(finished.rollouts) != finished.rollouts_digest:
        return None
    if digest_paths(steps_dir(record.parent)) != finished.steps_digest:  # a step log damaged or gone
        return None
    if finished.heldout is not None and digest_paths(finished.heldout) != finished.heldout_digest:
        return None
    return finished


def _copied_from_the_pilot(arm: ArmConfig, inputs: str, layout: RunLayout, stage: PilotStage) -> PilotArmRun | None:
    """A calibration pilot's arm that the pilot stage already ran with the same `inputs` (the
    calibration changes only the treatment's kernel, so the baseline's step is the same run): the
    pilot's logs copied into the calibration's folder, with their own record there (its measured
    times the pilot's); None when the pilot stage holds no such finished, verified run."""
    if stage == "pilot":
        return None
    ran = _finished_pilot_arm(layout.pilot_arm_record("pilot", arm.name), inputs)
    if ran is None or ran.heldout is not None:  # the treatment's held-out samples belong to its stage
        return None
    source, arm_dir = layout.pilot_arm_dir("pilot", arm.name), layout.pilot_arm_dir(stage, arm.name)
    shutil.rmtree(arm_dir, ignore_errors=True)
    shutil.copytree(source, arm_dir)
    rollouts = arm_dir / Path(ran.rollouts).relative_to(source)
    copied = ran.model_copy(update={"rollouts": str(rollouts), "rollouts_digest": digest_paths(rollouts),
                                    "steps_digest": digest_paths(steps_dir(arm_dir))})
    write_json_atomic(layout.pilot_arm_record(stage, arm.name), copied.model_dump())
    return copied


def _pilot_arm(arm: ArmConfig, is_treatment: bool, pilot: Pilot, run: RunContext, layout: RunLayout, backend: str,
               data_dir: str | None, stage: PilotStage) -> PilotArmRun:
    """One arm's pilot steps on fresh clients (the treatment's `pilot.steps` with held-out
    samples, then a greedy eval of a few test items for its timing; the baseline's one step).
    An arm that finished these steps in an earlier attempt of the stage is reused as it was; so is,
    in a calibration pilot, an arm the pilot stage ran with the same inputs (the baseline)."""
    arm_dir = layout.pilot_arm_dir(stage, arm.name)
    record = layout.pilot_arm_record(stage, arm.name)
    inputs = _pilot_inputs(arm, is_treatment, pilot, run, backend, data_dir)
    finished, earlier = _finished_pilot_arm(record, inputs), "in an earlier attempt"
    if finished is None:
        finished, earlier = _copied_from_the_pilot(arm, inputs, layout, stage), "in the pilot stage, on the same inputs"
    if finished is not None:
        record_output(arm_dir)  # the stage's outputs, as if it had written them now
        if finished.heldout is not None:
            record_output(finished.heldout)
        _stage_logger().info(
            f"{pilot_name(stage)} {arm.name}: {finished.steps} step(s) finished {earlier} "
            f"({finished.wall_seconds:.0f}s): reused, not run again")
        return finished
    record.unlink(missing_ok=True)
    for f in steps_dir(arm_dir).glob("step-*.parquet"):  # an unfinished attempt's steps: this one retraces them
        f.unlink()
    env = env_for(run, data_dir)
    t0 = time.time()
    with failures_named(pilot_name(stage), arm.name), arm_client(run, arm, backend) as (training_client, renderer), \
            critic_of(run, arm, backend) as critic_client:
        setup_seconds = time.time() - t0
        n_steps = pilot.steps if is_treatment else 1
        heldout = HeldoutRequest(pilot.heldout_prompts, pilot.heldout_samples) if is_treatment else None
        step_seconds: list[float] = []
        report = _progress_reporter(arm, n_steps, 0, pilot_name(stage))  # a log line + progress per batch

        def on_step(log: StepLog) -> None:
            write_step_log(arm_dir, log)
            step_seconds.append(log.metrics["step_seconds"])
            report(log)

        train_arm(arm, training_client=training_client, env=env, renderer=renderer, order=env.train_order(seed=0),
                  steps=range(n_steps), window=new_window(arm), on_step=on_step, heldout=heldout,
                  stage=pilot_name(stage), critic_client=critic_client,
                  nonfinite_dir=layout.nonfinite_dir(f"{stage}-{arm.name}"))
        rollouts_path, _ = merge_step_logs(arm_dir)
        fields = dict(inputs=inputs, steps=n_steps, setup_seconds=setup_seconds,
                      step_seconds=sum(step_seconds) / len(step_seconds), rollouts=str(rollouts_path),
                      rollouts_digest=digest_paths(rollouts_path), steps_digest=digest_paths(steps_dir(arm_dir)))
        if is_treatment:
            heldout_path = write_artifact("heldout", heldout.rows, layout.heldout_path(stage))
            # Eval timing for feasibility: a few greedy test items on the pilot policy.
            sampler = resolved(training_client.save_weights_and_get_sampling_client(), backend=backend,
                               call="save_weights_and_get_sampling_client", expected="a sampling client")
            problems = env.test_problems()[: getattr(pilot, "eval_timing_items", None) or 16]
            _stage_logger().info(f"{pilot_name(stage)} {arm.name}: timing greedy eval on {len(problems)} test items")
            t1 = time.time()
            eval_rows(sampler, env=env, renderer=renderer, problems=problems, arm_name=arm.name,
                      max_tokens=arm.max_tokens)
            fields.update(heldout=str(heldout_path), heldout_digest=digest_paths(heldout_path),
                          eval_seconds_per_item=(time.time() - t1) / len(problems))
    finished = PilotArmRun(wall_seconds=time.time() - t0, **fields)
    write_json_atomic(record, finished.model_dump())
    return finished


@judging_task(name=pilot_name("pilot"), task_run_name=_pilot_run_name, **stage_end_hooks(), cache_policy=stage_cache(unread=(("arms", "steps"),)),
              persist_result=True)
def pilot_rollouts(arms: tuple[ArmConfig, ...], pilot: Pilot, run: RunContext, layout: RunLayout, backend: str,
                   data_dir: str | None, stage: PilotStage = "pilot", wall_limit_s: float | None = None) -> PilotLogs:
    """The 2-step treatment pilot (+ held-out samples) and one baseline step, with timings.

    `arms` are the plan's as they stand (the calibration's are `RunPlan.calibrated`'s); a
    calibration pilot's cap of `wall_limit_s` seconds is a gate (`<stage>_wall_minutes`, recorded in the stage's folder as
    every gate is): a calibration pilot that takes longer fails. The stage's wall time is its
    slowest arm's (the arms run side by side), as measured when the arm ran: an arm reused from an
    earlier attempt (`_pilot_arm`) brings its own, so a Retry does not pass a cap by reusing.
    """
    chosen = [arm for arm in arms if arm.name in (run.treatment, run.baseline)]
    # The arms side by side, as training runs them (on one GPU their steps share decodes); each
    # thread carries the stage's context (its logger and artifacts).
    with ThreadPoolExecutor(len(chosen), thread_name_prefix="gs1-pilot") as pool:
        futures = [pool.submit(contextvars.copy_context().run, _pilot_arm, arm, arm.name == run.treatment,
                               pilot, run, layout, backend, data_dir, stage) for arm in chosen]
        done = [future.result() for future in futures]
    paths: dict = {"dir": str(layout.pilot_dir(stage))}
    timings: dict = {"setup_seconds": {}, "step_seconds": {}}
    for arm, result in zip(chosen, done):
        timings["setup_seconds"][arm.name] = result.setup_seconds
        timings["step_seconds"][arm.name] = result.step_seconds
        paths["treatment" if arm.name == run.treatment else "baseline"] = result.rollouts
        if result.heldout is not None:
            paths["heldout"] = result.heldout
            timings["eval_seconds_per_item"] = result.eval_seconds_per_item
    treatment = next(arm for arm in chosen if arm.name == run.treatment)
    timings["bandwidth"] = treatment.kernel.bandwidth if stage == "calibration" and treatment.kernel else None
    timings["wall_seconds"] = max(result.wall_seconds for result in done)
    paths["timings"] = str(write_json_atomic(layout.timings_json(stage), timings))
    if wall_limit_s is not None:
        wall_minutes = timings["wall_seconds"] / 60
        record_gate(pilot_name(stage), [{"gate": pilot_name(stage), "metric": f"{stage}_wall_minutes",
                                         "value": wall_minutes, "op": "max", "bound": str(wall_limit_s / 60),
                                         "passed": wall_minutes <= wall_limit_s / 60}], layout.pilot_dir(stage))
    return PilotLogs(**paths)


# ---------------------------------------------------------------------------------------------
# Full training runs


@task(name=stage_info("train").name, task_run_name=arm_stage_name("train", "{arm.unit}"), **stage_end_hooks(), cache_policy=stage_cache(), persist_result=True)
def trained_arm(arm: ArmConfig, run: RunContext, layout: RunLayout, backend: str, data_dir: str | None,
                checkpoint_every: int = 5) -> TrainedArm:
    """Train one arm for the spec's steps; resume from the last checkpoint if there is one."""
    with failures_named("train", arm.unit):
        return train_with_checkpoints(arm, run, layout, backend, data_dir, checkpoint_every)


def train_with_checkpoints(arm: ArmConfig, run: RunContext, layout: RunLayout, backend: str, data_dir: str | None,
                           checkpoint_every: int = 5) -> TrainedArm:
    """The training stage's body (callable without Prefect): per-step logs, a `save_state`
    checkpoint every `checkpoint_every` steps, and resume from the last one after a crash.
    `arm` is one unit (an arm at one seed): its folder is `arm.unit`, its prompt order seed
    `arm.order_seed`."""
    env = env_for(run, data_dir)
    order = env.train_order(seed=arm.order_seed)
    arm_dir = layout.train_arm_dir(arm.unit)
    checkpoints_path = layout.checkpoints_path(arm.unit)
    try:
        checkpoints, first_step, window = _resume_point(arm, arm_dir, checkpoints_path)
        last = checkpoints[-1] if checkpoints else {}
        if arm.critic is not None and last and not last.get("critic_state_path"):
            raise UserError(f"{checkpoints_path}: the last checkpoint holds no critic state")
        training_client, renderer = open_arm(run, arm, backend, last.get("state_path"))
        critic_client = open_critic(run, arm, backend, last.get("critic_state_path"))
    except UserError as damaged:
        # A damaged checkpoint or step log before it: the arm cannot resume, so it starts over
        # (the steps are seeded, so it retraces the same run).
        logging.getLogger("gs1.train").warning(f"{damaged}; training {arm.name} again from step 0")
        checkpoints_path.unlink(missing_ok=True)
        training_client, renderer = open_arm(run, arm, backend)
        critic_client = open_critic(run, arm, backend)
        checkpoints, first_step, window = [], 0, new_window(arm)
    with given_back(training_client), contextlib.ExitStack() as critic_held:
        if critic_client is not None:
            critic_held.enter_context(given_back(critic_client))
        return _train_from(arm, layout, env, order, arm_dir, training_client, renderer, critic_client, checkpoints,
                           checkpoints_path, first_step, window, checkpoint_every,
                           device=backend_named(backend).unit_device(training_client))


def _train_from(arm: ArmConfig, layout: RunLayout, env, order, arm_dir: Path, training_client, renderer, critic_client,
                checkpoints: list[dict], checkpoints_path: Path, first_step: int, window,
                checkpoint_every: int, device: str | None) -> TrainedArm:
    backend = backend_of(training_client)
    for f in steps_dir(arm_dir).glob("step-*.parquet"):  # logs of steps after the checkpoint are stale
        if step_of(f) >= first_step:
            f.unlink()
    report = _progress_reporter(arm, arm.steps, first_step, "train")

    def on_step(log: StepLog):
        write_step_log(arm_dir, log)
        done = log.metrics["step"] + 1
        if checkpoint_every and (done % checkpoint_every == 0) and done < arm.steps:
            state_path = resolved(training_client.save_state(f"{layout.root.name}-{arm.unit}-{done:05d}"), backend=backend,
                                  call="save_state", expected="a saved state's path").path
            critic_path = (None if critic_client is None else
                           resolved(critic_client.save_state(f"{layout.root.name}-{arm.unit}-critic-{done:05d}"),
                                    backend=backend, call="save_state (critic)", expected="a saved state's path").path)
            checkpoints.append({"next_step": done, "state_path": state_path, "wall_time": time.time(),
                                "critic_state_path": critic_path})
            write_artifact("checkpoints", checkpoints, checkpoints_path)
        report(log)

    train_arm(arm, training_client=training_client, env=env, renderer=renderer, order=order,
              steps=range(first_step, arm.steps), window=window, on_step=on_step, critic_client=critic_client,
              nonfinite_dir=layout.nonfinite_dir(arm.unit))
    rollouts_path, metrics_path = merge_step_logs(arm_dir)
    costs_path = record_costs(arm, arm_dir, layout.costs_path(arm.unit), device=device)
    sampler_path = resolved(training_client.save_weights_for_sampler(f"{layout.root.name}-{arm.unit}-final"),
                            backend=backend, call="save_weights_for_sampler", expected="a sampler weights path").path
    record_output(sampler_path)  # the local engine's adapter files: verified before a cache hit
    # eval keys on the weights themselves: a retrained arm with other weights is evaluated again
    final = TrainedArm(arm=arm.unit, sampler_path=sampler_path, rollouts=str(rollouts_path), metrics=str(metrics_path),
                       sampler_digest=digest_paths(sampler_path), costs=str(costs_path),
                       numerics=engine_numerics(backend))
    write_json_atomic(layout.final_json(arm.unit), final.model_dump())
    return final


def record_costs(arm: ArmConfig, arm_dir: Path, out: Path, device: str | None = None) -> Path:
    """The unit's cost record: its step costs summed (a resumed run's earlier steps included), and
    the device that trained it (`Backend.unit_device`)."""
    steps = [row for table in read_step_logs(arm_dir, "costs") for row in table.to_pylist()]
    cost = ArmCost.from_steps(arm.unit, steps, device=device)
    path = write_artifact("arm_costs", [cost.model_dump()], out)
    if TaskRunContext.get() is not None:
        create_table_artifact(
            key=f"cost-{arm.unit}".replace("_", "-").replace(".", "-").lower(),
            table=[{k: (round(v, 2) if isinstance(v, float) else v) for k, v in cost.model_dump().items()}],
            description=f"What training {arm.unit} cost",
        )
    return path


def unit_results(arm: ArmConfig, layout: RunLayout) -> tuple[TrainedArm, EvalResult]:
    """What a unit that ran elsewhere (a dispatched flow run) left in the shared run directory."""
    trained = TrainedArm.model_validate_json(layout.final_json(arm.unit).read_text())
    jsonl = layout.eval_jsonl(arm.unit)
    items = read_eval_items(jsonl)
    return trained, EvalResult(arm=arm.unit, jsonl=str(jsonl), parquet=str(layout.eval_parquet(arm.unit)),
                               accuracy=sum(items.values()) / len(items))


def _resume_point(arm: ArmConfig, arm_dir: Path, checkpoints_path: Path):
    """(checkpoints, first step to train, kernel window) from the arm's last checkpoint; a UserError
    when the checkpoint record or an earlier step log is damaged."""
    checkpoints = read_artifact("checkpoints", checkpoints_path).to_pylist() if checkpoints_path.exists() else []
    first_step = checkpoints[-1]["next_step"] if checkpoints else 0
    return checkpoints, first_step, window_from_logs(read_step_logs(arm_dir, "rollouts", before=first_step), arm)


# ---------------------------------------------------------------------------------------------
# Eval


@task(name=stage_info("eval").name, task_run_name=arm_stage_name("eval", "{arm.unit}"), **stage_end_hooks(), cache_policy=stage_cache(), persist_result=True)
def eval_items(trained: TrainedArm, arm: ArmConfig, run: RunContext, n_eval: int, layout: RunLayout, backend: str,
               data_dir: str | None) -> EvalResult:
    """Greedy-decode every eval item with the arm's final weights; write eval.jsonl + Parquet."""
    with failures_named("eval", arm.unit):
        return _eval_items(trained, arm, run, n_eval, layout, backend, data_dir)


def _eval_items(trained: TrainedArm, arm: ArmConfig, run: RunContext, n_eval: int, layout: RunLayout, backend: str,
                data_dir: str | None) -> EvalResult:
    env = env_for(run, data_dir)
    sampler = resolved(service_client(backend).create_sampling_client(model_path=trained.sampler_path), backend=backend,
                        call="create_sampling_client(model_path=...)", expected="a sampling client of the arm's final weights")
    renderer = renderer_for(run, sampler.get_tokenizer())
    problems = env.test_problems()[:n_eval]
    try:
        rows = eval_rows(sampler, env=env, renderer=renderer, problems=problems, arm_name=arm.name,
                         max_tokens=arm.max_tokens)
    except (UserError, ArmFailed):
        raise
    except Exception as exc:
        raise ArmFailed.of("eval", arm.unit, exc) from exc
    jsonl = write_jsonl_atomic(layout.eval_jsonl(arm.unit), [{"item_id": r["item_id"], "correct": r["correct"]} for r in rows])
    parquet = write_artifact("eval_items", rows, layout.eval_parquet(arm.unit))
    accuracy = sum(r["correct"] for r in rows) / len(rows)
    create_table_artifact(
        key=artifact_key(arm_stage_name("eval", arm.unit)),
        table=[{"arm": arm.unit, "items": len(rows), "accuracy": round(accuracy, 4)}],
        description=f"Eval of {arm.unit}",
    )
    return EvalResult(arm=arm.unit, jsonl=str(jsonl), parquet=str(parquet), accuracy=accuracy)
