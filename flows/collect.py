"""Flow: rollout logs for the kernel hill-climb, one per env (wiring only)."""

from __future__ import annotations

from pathlib import Path

from prefect import flow

from tasks.collect import rollout_log


@flow(name="collect-rollout-logs")
def collect_logs(
    envs: list[str],
    n_prompts: int,
    k: int,
    base_model: str,
    renderer: str,
    out_dir: str,
    backend: str = "local",
    base_model_path: str | None = None,
    max_tokens: int = 256,
    temperature: float = 1.0,
    seed: int = 0,
    data_dir: str | None = None,
) -> list[str]:
    paths = []
    for env in envs:
        settings = dict(env=env, n_prompts=n_prompts, k=k, base_model=base_model, backend=backend,
                        base_model_path=base_model_path, renderer=renderer, seed=seed,
                        max_tokens=max_tokens, temperature=temperature)
        paths.append(rollout_log(settings, str(Path(out_dir) / f"{env}.parquet"), data_dir))
    return paths
