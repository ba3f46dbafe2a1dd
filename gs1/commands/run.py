"""`gs1 run [SPEC]`: run the pre-registered experiment flow (default: the local demo spec)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from gs1.commands.argtypes import positive_int
from rl.backends import BACKENDS, DEFAULT_BACKEND
from schemas.errors import ArmFailed, UserError

DEMO_SPEC = "specs/demo_local.json"


def default_spec() -> Path:
    """`specs/demo_local.json` in the working directory, else beside the installed package."""
    here = Path(DEMO_SPEC)
    if here.is_file():
        return here
    return Path(__file__).resolve().parents[2] / DEMO_SPEC


def register(subparsers) -> None:
    p = subparsers.add_parser("run", help="run an experiment spec end to end (default: the local demo)")
    p.add_argument("spec", nargs="?", help=f"spec JSON (default: {DEMO_SPEC})")
    p.add_argument("--backend", choices=list(BACKENDS), default=DEFAULT_BACKEND)
    p.add_argument("--run-dir", help="run directory (default: runs/<title-slug>-<experiment-hash>; gate bounds are not part of it)")
    p.add_argument("--data-dir", help="directory with GSM8K train.jsonl/test.jsonl, for a spec on gsm8k (default: the hub; "
                                      "env GS1_GSM8K_DIR); an env that generates its problems reads none")
    p.add_argument("--dispatch", metavar="DEPLOYMENT",
                   help="run each arm x seed as a flow run of this deployment of gs1-arm-unit "
                        "(e.g. gs1-arm-unit/train-and-eval) on its work pool's workers; needs PREFECT_API_URL and a run directory the workers share")
    p.add_argument("--dispatch-groups", type=positive_int, metavar="N",
                   help="with --dispatch: the units as N flow runs, whole seeds each, every one training its units "
                        "side by side on one base (one a worker and its GPU; default: one flow run a unit)")
    p.add_argument("--units", type=_unit_list, metavar="UNIT[,UNIT...]",
                   help="train and evaluate only these arm x seed units (e.g. grpo_gs8-s0,critic-s0) after the gates; "
                        "no decision: `gs1 decide --spec SPEC --units DIR --collect RUN_DIR` gathers units from runs "
                        "and decides once all are in")
    p.set_defaults(func=run)


def _unit_list(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("name at least one unit")
    return names


def run(args: argparse.Namespace) -> int:
    from gs1.run_control import StopOnSignal, TemporaryServer
    from pipeline.running import running_stages

    server = TemporaryServer()
    # First of all, so that Ctrl-C or SIGTERM at any point is one line and a prompt exit.
    with StopOnSignal(running_stages, cleanup=server.stop):
        try:
            return _run(args, server)
        finally:
            server.stop()


def _run(args: argparse.Namespace, server) -> int:
    from design.spec import load_spec

    spec_path = Path(args.spec) if args.spec else default_spec()
    spec = load_spec(spec_path)  # SpecError (a UserError) -> one line per problem, exit 2
    units = getattr(args, "units", None)
    if units is not None:
        from design.plan import plan_from_spec  # lazy: start-up time

        plan_from_spec(spec).selected_units(units)  # an unknown unit: one line naming the spec's, exit 2
    data_dir = _data_dir(spec.dataset.name, args.data_dir)
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from gs1.run_control import check_prefect_api, run_dir_lock

    dispatch, dispatch_groups = getattr(args, "dispatch", None), getattr(args, "dispatch_groups", None)
    if dispatch_groups and not dispatch:
        raise UserError("--dispatch-groups needs --dispatch: the deployment whose workers run the groups")
    api_url = PREFECT_API_URL.value()
    if api_url:
        check_prefect_api(api_url)  # down, or never answering: one line, exit 2, within seconds
    if dispatch and not api_url:
        raise UserError("--dispatch needs the Prefect server the workers poll: set PREFECT_API_URL")
    if not api_url:
        # the temporary server starts while the data, the model and the flow's imports are checked
        # and loaded below (a check that fails stops it: `run`'s finally)
        server.launch()
    from rl.envs import get_env

    # its data files, read and checked now: a bad line is one line naming file and line, before the flow
    env = get_env(spec.dataset.name, data_dir=data_dir, **dict(spec.dataset.options))
    env.check_data()
    from design.spec import resolve_base_model_path
    from rl.backends import backend_named

    # the model not loadable, the service not answering, the key refused: one line, exit 2, now
    backend_named(args.backend).check_before_run(resolve_base_model_path(spec) or spec.base_model)

    from tasks.spec import run_dir_for  # lazy: start-up time

    run_dir = Path(args.run_dir) if args.run_dir else run_dir_for(spec_path)
    import flows.experiment  # noqa: F401 -- the flow's imports, while the server starts
    with run_dir_lock(run_dir):
        print(f"gs1: running {spec_path} on the {args.backend} backend; run directory {run_dir}", flush=True)
        if not api_url:
            api_url = server.start()  # our child: it ends when gs1 run does, however that happens
        with temporary_settings({PREFECT_API_URL: api_url}):
            try:
                return _run_flow(spec_path, run_dir, args.backend, data_dir, dispatch, units, dispatch_groups)
            finally:
                _send_pending_logs()  # while the server is still up: it stops when the run ends


def _data_dir(env: str, given: str | None) -> str | None:
    """The data directory the spec's env reads (`--data-dir`, else GS1_GSM8K_DIR), or None for an
    env that generates its problems: it is not handed one, and `--data-dir` there says so."""
    from schemas.names import env_reads_data

    if not env_reads_data(env):
        if given:
            print(f"gs1: --data-dir {given} not used: dataset {env} generates its problems and reads no data directory",
                  file=sys.stderr, flush=True)
        return None
    data_dir = given or os.environ.get("GS1_GSM8K_DIR")
    if data_dir and not Path(data_dir).is_dir():
        raise UserError(f"--data-dir {data_dir}: no such directory")
    return data_dir


def _send_pending_logs(timeout: float = 5.0) -> None:
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        try:
            worker.drain_all(timeout=timeout, at_exit=False)
        except Exception:  # best effort: the run's outcome is already decided
            pass


def _run_flow(spec_path: Path, run_dir: Path, backend: str, data_dir: str | None, dispatch: str | None = None,
              units: list[str] | None = None, dispatch_groups: int | None = None) -> int:
    from flows.experiment import experiment_in
    from schemas.errors import BackendError, GateFailed
    from schemas.layout import RunLayout
    from schemas.redaction import one_line, redact_key

    _quiet_tracebacks((GateFailed, UserError, ArmFailed, BackendError))
    _show_engine_log()

    layout = RunLayout(run_dir)
    state = experiment_in(layout)(
        spec_path=str(spec_path.resolve()), run_dir=str(layout.resolved().root), backend=backend,
        data_dir=str(Path(data_dir).resolve()) if data_dir else None, dispatch=dispatch, units=units,
        dispatch_groups=dispatch_groups, return_state=True,
    )
    if state.is_completed():
        decision = state.result()
        if "waiting_for" in decision:  # a share of the sweep (--units)
            print(f"gs1: units done: {', '.join(decision['units_done'])} (train/ and eval/ under {run_dir})")
            print(f"gs1: no decision yet, it waits for: {', '.join(decision['waiting_for'])}; "
                  f"`gs1 decide --spec {spec_path} --units DIR --collect {run_dir}` gathers units and decides once all are in")
            return 0
        from rules import rule_for  # lazy: start-up time

        bounds_name = rule_for(decision["method"]).bounds_name
        for pair in decision.get("comparisons", []):  # several arms (or seeds): one line per arm, Holm's verdicts
            print(f"gs1: {pair['arm']} - {decision['baseline']} = {pair['mean_diff']:+.4f} "
                  f"({bounds_name} [{pair['lower']:+.4f}, {pair['upper']:+.4f}], Holm p {pair['holm_p_noninferior']:.3g}): "
                  f"{pair['verdict']}")
        print(
            f"gs1: decision {decision['verdict']}: {decision['treatment']} - {decision['baseline']} = "
            f"{decision['mean_diff']:+.4f} ({bounds_name}: lower {decision['lower']:+.4f}, margin {decision['margin']:+.4f}, "
            f"n={decision['n']})"
        )
        print(f"gs1: decision at {layout.decision.json}; artifacts under {run_dir}")
        return 0
    error = state.result(raise_on_failure=False)
    if isinstance(error, GateFailed):
        sys.stderr.write(f"gs1: {error}\n")
        return 1
    if isinstance(error, ArmFailed):
        sys.stderr.write(one_line(redact_key(f"gs1: {error}; the run directory keeps what ran: the same command "
                                             "resumes it")) + "\n")
        return getattr(error, "exit_code", 1)  # 2: the service refused the key mid-run
    if isinstance(error, UserError):
        raise error
    if isinstance(error, BackendError):  # the service failed a call or answered off its API: a run failure
        sys.stderr.write(one_line(redact_key(f"gs1: {error}")) + "\n")
        return getattr(error, "exit_code", 1)
    raise UserError(f"the flow ended {state.name}: {state.message}")


class _Terminal(logging.StreamHandler):
    """A handler on whatever `sys.stderr` is when a record comes (not the one at set-up)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def _show_engine_log() -> None:
    """The local engine's lines (each decode graph compiled, and how long it took) on the terminal,
    in Prefect's console format: a stage that waits on a compile says so."""
    engine_log = logging.getLogger("gs1.engine")
    if not engine_log.handlers:
        handler = _Terminal()
        handler.setFormatter(logging.Formatter("%(asctime)s.%(msecs)03d | %(levelname)-7s | %(name)s - %(message)s",
                                               "%H:%M:%S"))
        engine_log.addHandler(handler)
        engine_log.setLevel(logging.INFO)
        engine_log.propagate = False


def _quiet_tracebacks(expected: tuple[type, ...]) -> None:
    """A failed gate or a user error (a bad data line, a full disk) is an outcome, not a crash:
    Prefect logs the task's and the flow's failure with the traceback, but the message already
    says what is wrong and `gs1 run` ends on it. Drop the traceback on this terminal only (the
    root logger's console handlers, where Prefect's run loggers propagate, and Prefect's own
    console handlers); the copy sent to the Prefect server keeps it."""
    import logging

    class NoTraceback(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            if record.exc_info and isinstance(record.exc_info[1], expected):
                record.exc_info, record.exc_text = None, None
            return True

    class FullDiskSaidOnce(logging.Filter):
        """A full disk is said once, by `gs1 run`'s last line (`no space left to write ...: free
        some and run again`): Prefect's lines about the same failure (the task's and the flow's
        failed states, a result it could not write) stay off the terminal."""

        def filter(self, record: logging.LogRecord) -> bool:
            if not record.name.startswith("prefect"):  # our own warnings (a model cache not kept) stay
                return True
            text = record.getMessage().lower()  # any level: a failed state's line is INFO
            if record.exc_info and record.exc_info[1] is not None:
                text += " " + str(record.exc_info[1]).lower()
            return not any(mark in text for mark in FULL_DISK_MARKS)

    loggers = [logging.getLogger(), *(logging.getLogger(n) for n in ("prefect", "prefect.flow_runs", "prefect.task_runs"))]
    for logger in loggers:
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and not any(isinstance(f, NoTraceback) for f in handler.filters):
                handler.addFilter(NoTraceback())
                handler.addFilter(FullDiskSaidOnce())


# how a full disk reads in an exception or log line (errno.ENOSPC's text, our UserError's, Prefect's)
FULL_DISK_MARKS = ("no space left", "errno 28", "failed to write result")
