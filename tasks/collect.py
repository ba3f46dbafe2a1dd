"""Stage: collect a rollout log (N prompts x K samples, every candidate kernel feature) to Parquet."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from prefect import task
from prefect.artifacts import create_markdown_artifact

from rl.hillclimb.collect import CollectSettings, run_collection, write_rollout_log
from tasks.cache import stage_cache
from tasks.running import stage_end_hooks
from tasks.services import service_client


@task(name="rollout-log", **stage_end_hooks(), cache_policy=stage_cache(), persist_result=True)
def rollout_log(settings: dict, out_path: str, data_dir: str | None = None, embed: bool = True) -> str:
    """Sample `settings` (CollectSettings fields) through the process's backend; returns the log path."""
    cfg = CollectSettings(**settings)
    table = run_collection(cfg, service=service_client(cfg.backend), data_dir=data_dir, embed=embed)
    path = write_rollout_log(table, Path(out_path))
    rewards = table.column("reward").to_pylist()
    create_markdown_artifact(
        key=f"rollout-log-{cfg.env.replace('_', '-')}",
        markdown=f"Rollout log `{path}`: {table.num_rows} rollouts ({cfg.n_prompts} prompts x {cfg.k}), "
        f"mean reward {sum(rewards) / len(rewards):.3f}; settings `{asdict(cfg)}`",
    )
    return str(path)
