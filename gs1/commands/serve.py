"""`gs1 serve`: register the flows as deployments with a Prefect server and run them on request."""

from __future__ import annotations

import argparse
import os

from schemas.errors import UserError

# Each deployment's name says what it does: the UI's deployment list shows it in bold, above its flow's
# name (`gs1-run/experiment`, `collect-rollout-logs/hill-climb-logs`).
EXPERIMENT_DEPLOYMENT = "experiment"
COLLECT_DEPLOYMENT = "hill-climb-logs"


def build_deployments(spec_path: str = "specs/demo_local.json") -> list:
    """The deployments `gs1 serve` offers: the experiment (spec + overrides) and log collection."""
    from flows.collect import collect_logs  # lazy: start-up time
    from flows.deployment import gs1_run

    return [
        gs1_run.to_deployment(
            name=EXPERIMENT_DEPLOYMENT, parameters={"spec_path": spec_path},
            description="Run a pre-registered GS1 experiment spec end to end (gates, paired decision, report).",
            tags=["gs1"],
        ),
        collect_logs.to_deployment(
            name=COLLECT_DEPLOYMENT, tags=["gs1"],
            description="Sample N prompts x K rollouts and log rewards and kernel features (the kernel hill-climb's input).",
        ),
    ]


def register(subparsers) -> None:
    p = subparsers.add_parser("serve", help="serve the flows as deployments (needs a Prefect server; see README)")
    p.add_argument("--spec", default="specs/demo_local.json", help="default spec_path of the run form")
    p.add_argument("--limit", type=int, default=1, help="flow runs at a time (default 1)")
    p.set_defaults(func=serve)


def serve(args: argparse.Namespace) -> int:
    if not os.environ.get("PREFECT_API_URL"):
        from prefect.settings import PREFECT_API_URL  # lazy: start-up time

        if not PREFECT_API_URL.value():
            raise UserError(
                "no Prefect server: start one with `prefect server start` and set "
                "PREFECT_API_URL=http://127.0.0.1:4200/api (see README, 'Prefect UI')"
            )
    from prefect import serve as prefect_serve  # lazy: start-up time

    prefect_serve(*build_deployments(args.spec), limit=args.limit)
    return 0
