"""Flow: rollout logs for the kernel hill-climb, one per env (wiring only)."""

from __future__ import annotations

from pathlib import Path

from prefect import flow

from hillclimb.collect import CollectSettings
from rl.backends import DEFAULT_BACKEND
from tasks.collect import rollout_log


@flow(name="collect-rollout-logs")
def collect_logs(
    envs: list[str],
    n_prompts: int,
    k: int,
    base_model: str,
    renderer: str,
    out_dir: str,
    backend: str = DEFAULT_BACKEND,
    base_model_path: str | None = None,
    max_tokens: int = 256,
    temperature: float = 1.0,
    seed: int = 0,
    data_dir: str | None = None,
    question_model: str | None = None,
    question_device: str = "cpu",
) -> list[str]:
    """One log per env; `question_model` (`smollm2`, or a model path) adds the question embedding."""
    paths = []
    for env in envs:
        settings = CollectSettings(env=env, n_prompts=n_prompts, k=k, base_model=base_model, backend=backend,
                                   base_model_path=base_model_path, renderer=renderer, seed=seed,
                                   max_tokens=max_tokens, temperature=temperature)
        paths.append(rollout_log(settings, str(Path(out_dir) / f"{env}.parquet"), data_dir,
                                 question_model=question_model, question_device=question_device))
    return paths
