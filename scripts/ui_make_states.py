"""Put a real Prefect server into the states the screenshots in results/ui/ show, and shoot them.

    python scripts/ui_make_states.py [--work DIR] [--port 4281] [--rss]

From the repository root, with the dev venv active, Debian's chromium and playwright installed.
It starts `prefect server start` and `gs1 serve` (their own processes, stopped at the end), on the
tests' tiny spec (tests/test_flow.py `flow_spec`: the tiny random Qwen3 of
tests/fixtures/tiny_model.py and its `token_threshold` env, registered in every process through a
`sitecustomize` on PYTHONPATH), registers `deployments/units.yaml` too (its work pool, no worker)
-> `<out>/deployments.png`, then (each shot by scripts/ui_screenshots.py, stale PNGs removed first):

1. a run of `gs1-run/experiment` with a `pilot_mean_reward` bound that cannot pass (min 0.95)
   -> the run stops at the activation gate -> `<out>/1_gate_failure/`;
2. the spec file edited back to the tests' passing bound, *Retry* through the API (the state the
   UI's Retry button sets) -> the same flow run resumes, earlier stages Cached, to the decision
   -> `<out>/2_retry/`;
3. a bad parameter, `overrides.steps = -1`: the run form refuses it (its validation on), and a
   run started with the validation off (the form's *Validate parameters* unticked) ends Failed on
   one line -> `<out>/3_bad_parameter/`;
4. with `--rss`: peak RSS of a full run started by `gs1 serve` (a fresh run_dir: no cache) and of
   the same spec through `gs1 run`, sampled every 0.2 s over each process tree.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]  # this checkout's code, not an installed copy's


def wait_for(predicate, timeout: float, what: str, every: float = 2.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise SystemExit(f"make_states: timed out waiting for {what}")


def prepare(work: Path) -> tuple[Path, dict, dict]:
    from fixtures.tiny_model import build_tiny_qwen3
    from test_flow import flow_spec

    model = work / "tiny_qwen3"
    if not (model / "config.json").is_file():
        build_tiny_qwen3(model, seed=0)
    site = work / "site"
    site.mkdir(parents=True, exist_ok=True)
    # every process (gs1 serve, the flow run it starts, gs1 run) knows the tests' env
    (site / "sitecustomize.py").write_text("import fixtures.flow_env  # noqa: F401\n")
    failing = flow_spec(REPO, model, bounds={"pilot_mean_reward": {"min": 0.95, "max": 1.0}})
    fixed = flow_spec(REPO, model)
    return site, failing, fixed


class Sampler:
    """Peak RSS of a process tree (the process and all its descendants), sampled."""

    def __init__(self, pid: int):
        import psutil

        self.root = psutil.Process(pid)
        self.peak_tree = 0
        self.peak_one = 0

    def sample(self) -> None:
        import psutil

        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        rss = []
        for p in procs:
            try:
                rss.append(p.memory_info().rss)
            except psutil.NoSuchProcess:
                pass
        self.peak_tree = max(self.peak_tree, sum(rss))
        self.peak_one = max([self.peak_one, *rss])


def flow_run_state(flow_run_id):
    import asyncio

    from prefect import get_client

    async def read():
        async with get_client() as client:
            return await client.read_flow_run(flow_run_id)

    return asyncio.run(read()).state


def wait_final(flow_run_id, timeout: float, sampler: Sampler | None = None):
    end = time.monotonic() + timeout
    last = 0.0
    while time.monotonic() < end:
        if sampler:
            sampler.sample()
        if time.monotonic() - last > 2:
            last = time.monotonic()
            state = flow_run_state(flow_run_id)
            if state.is_final():
                return state
        time.sleep(0.2)
    raise SystemExit(f"make_states: flow run {flow_run_id} did not finish in {timeout:.0f} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "gs1-ui")
    ap.add_argument("--port", type=int, default=4281)
    ap.add_argument("--out", type=Path, default=REPO / "results" / "ui")
    ap.add_argument("--rss", action="store_true")
    ap.add_argument("--skip-shots", action="store_true")
    args = ap.parse_args()
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    site, failing, fixed = prepare(work)
    folders = [args.out / name for name in ("1_gate_failure", "2_retry", "3_bad_parameter")]
    if not args.skip_shots:
        for stale in [args.out / "deployments.png", *(png for folder in folders for png in folder.glob("*.png"))]:
            stale.unlink(missing_ok=True)
    api = f"http://127.0.0.1:{args.port}/api"
    env = {**os.environ, "PREFECT_API_URL": api, "DO_NOT_TRACK": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_HOME": str(work / "prefect_home"),
           "PYTHONPATH": os.pathsep.join([str(site), str(REPO), str(REPO / "tests"),
                                          os.environ.get("PYTHONPATH", "")])}
    os.environ.update({k: env[k] for k in ("PREFECT_API_URL", "PREFECT_HOME", "DO_NOT_TRACK")})
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    started = []
    try:
        server = subprocess.Popen(["prefect", "server", "start", "--host", "127.0.0.1", "--port", str(args.port)],
                                  env=env, stdout=open(logs / "server.log", "w"), stderr=subprocess.STDOUT)
        started.append(server)
        import httpx

        def healthy():
            try:
                return httpx.get(f"{api}/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(healthy, 240, "the Prefect server")
        print("server up", flush=True)
        spec_path = work / "spec.json"
        spec_path.write_text(json.dumps(failing, indent=1))
        serve = subprocess.Popen([sys.executable, "-m", "gs1", "serve", "--spec", str(spec_path)], cwd=REPO, env=env,
                                 stdout=open(logs / "serve.log", "w"), stderr=subprocess.STDOUT)
        started.append(serve)
        from prefect.deployments import run_deployment

        wait_for(lambda: _deployment_exists("gs1-run/experiment"), 240, "gs1 serve's deployments")
        for command in (["prefect", "work-pool", "create", "gs1-units", "--type", "process", "--overwrite"],
                        ["prefect", "--no-prompt", "deploy", "--prefect-file", "deployments/units.yaml", "--all"]):
            subprocess.run(command, cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL)
        if not args.skip_shots:
            shots(args.out, env, "--page", "deployments")
        # the run directory beside the work files (the report names it)
        flow_run = run_deployment("gs1-run/experiment", timeout=0, parameters={"run_dir": str(work / "run")})
        print(f"1. deployment run {flow_run.id}", flush=True)
        state = wait_final(flow_run.id, 1500)
        print(f"   -> {state.name}: {state.message}", flush=True)
        if not args.skip_shots:
            shots(folders[0], env, "--flow-run", str(flow_run.id))

        spec_path.write_text(json.dumps(fixed, indent=1))  # the gate-bound edit
        from prefect.states import AwaitingRetry

        _set_state(flow_run.id, AwaitingRetry())
        print("2. Retry after the edit", flush=True)
        wait_for(lambda: not flow_run_state(flow_run.id).is_final(), 300, "the runner to pick up the Retry")
        state = wait_final(flow_run.id, 1800)
        print(f"   -> {state.name}: {state.message}", flush=True)
        if not args.skip_shots:
            shots(folders[1], env, "--flow-run", str(flow_run.id))

        print("3. a bad parameter: overrides.steps = -1", flush=True)
        if not args.skip_shots:
            shots(folders[2], env, "--page", "refused-form")
        bad = _run_unvalidated(api, "gs1-run/experiment", {"overrides": {"steps": -1}})
        state = wait_final(bad, 300)
        print(f"   -> {state.name}: {state.message}", flush=True)
        if not args.skip_shots:
            shots(folders[2], env, "--flow-run", bad)

        if args.rss:
            rss(serve, env, work, spec_path)
    finally:
        for p in reversed(started):
            p.terminate()
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
    return 0


def rss(serve, env, work: Path, spec_path: Path) -> None:
    from prefect.deployments import run_deployment

    sampler = Sampler(serve.pid)
    flow_run = run_deployment("gs1-run/experiment", timeout=0, parameters={"spec_path": str(spec_path),
                                                                     "run_dir": str(work / "rss_serve")})
    t0 = time.monotonic()
    state = wait_final(flow_run.id, 1800, sampler)
    serve_row = (state.name, time.monotonic() - t0, sampler.peak_tree, sampler.peak_one)
    t0 = time.monotonic()
    cli = subprocess.Popen([sys.executable, "-m", "gs1", "run", str(spec_path), "--run-dir", str(work / "rss_cli")],
                           cwd=REPO, env=env, stdout=open(work / "logs" / "gs1_run.log", "w"), stderr=subprocess.STDOUT)
    sampler = Sampler(cli.pid)
    while cli.poll() is None:
        sampler.sample()
        time.sleep(0.2)
    cli_row = (f"exit {cli.returncode}", time.monotonic() - t0, sampler.peak_tree, sampler.peak_one)
    gb = 1 << 30
    print("| entry point | end | wall s | peak RSS, process tree (GB) | peak RSS, largest process (GB) |")
    print("|---|---|---|---|---|")
    for name, row in (("gs1 serve (deployment run)", serve_row), ("gs1 run", cli_row)):
        print(f"| {name} | {row[0]} | {row[1]:.0f} | {row[2] / gb:.2f} | {row[3] / gb:.2f} |", flush=True)


def shots(out: Path, env, *args: str) -> None:
    subprocess.run([sys.executable, str(REPO / "scripts" / "ui_screenshots.py"), "--out", str(out), *args],
                   cwd=REPO, env=env, check=True)


def _run_unvalidated(api: str, deployment: str, parameters: dict) -> str:
    """A run of `deployment` created as the run form does with *Validate parameters* unticked."""
    import asyncio

    import httpx
    from prefect import get_client

    async def read():
        async with get_client() as client:
            return (await client.read_deployment_by_name(deployment)).id

    created = httpx.post(f"{api}/deployments/{asyncio.run(read())}/create_flow_run",
                         json={"parameters": parameters, "enforce_parameter_schema": False}, timeout=30)
    created.raise_for_status()
    return created.json()["id"]


def _deployment_exists(name: str) -> bool:
    import asyncio

    from prefect import get_client

    async def read():
        async with get_client() as client:
            try:
                await client.read_deployment_by_name(name)
                return True
            except Exception:  # not registered yet
                return False

    return asyncio.run(read())


def _set_state(flow_run_id, state) -> None:
    import asyncio

    from prefect import get_client

    async def write():
        async with get_client() as client:
            await client.set_flow_run_state(flow_run_id, state, force=True)

    asyncio.run(write())


if __name__ == "__main__":
    sys.exit(main())
