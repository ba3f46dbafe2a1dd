"""Stage: collect a rollout log (N prompts x K samples, every candidate kernel feature) to Parquet."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from prefect import task
from prefect.artifacts import create_markdown_artifact

from hillclimb.collect import CollectSettings, run_collection, write_rollout_log
from hillclimb.question_embedding import question_embedding_for
from pipeline.cache import stage_cache
from pipeline.running import stage_end_hooks
from pipeline.services import service_client


@task(name="rollout-log", **stage_end_hooks(), cache_policy=stage_cache(), persist_result=True)
def rollout_log(settings: CollectSettings, out_path: str, data_dir: str | None = None, embed: bool = True,
                question_model: str | None = None, question_device: str = "cpu") -> str:
    """Sample `settings` through the process's backend; returns the log path. `question_model`
    (as `gs1 collect --question-model` takes it) adds the `question_embedding` feature."""
    question_embedder, question_source = question_embedding_for(question_model, question_device)
    table = run_collection(settings, service=service_client(settings.backend), data_dir=data_dir, embed=embed,
                           question_embedder=question_embedder, question_embedding_source=question_source)
    path = write_rollout_log(table, Path(out_path))
    rewards = table.column("reward").to_pylist()
    create_markdown_artifact(
        key=f"rollout-log-{settings.env.replace('_', '-')}",
        markdown=f"Rollout log `{path}`: {table.num_rows} rollouts ({settings.n_prompts} prompts x {settings.k}), "
        f"mean reward {sum(rewards) / len(rewards):.3f}; question embedding: {question_source}; "
        f"settings `{asdict(settings)}`",
    )
    return str(path)
