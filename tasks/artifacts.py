"""Prefect artifacts a stage publishes: on its own flow run and, where asked, on the deployment's
run that started it (the page `prefect deployment run` links to)."""

from __future__ import annotations


def _deployment_run_id():
    """The flow run a deployment (or a command) started, when the current run is a subflow of it."""
    from prefect.runtime import flow_run

    current, root = flow_run.get_id(), flow_run.get_root_flow_run_id()
    return root if root and current and str(root) != str(current) else None


def _publish(artifact, on_deployment_run: bool) -> None:
    artifact.create()
    root = _deployment_run_id() if on_deployment_run else None
    if root is not None:
        # the page `prefect deployment run` links to is the outer run's: the same artifact there
        type(artifact)(**{**artifact.model_dump(exclude={"flow_run_id", "task_run_id"}), "flow_run_id": root}).create()


def publish_markdown(key: str, markdown: str, description: str, on_deployment_run: bool = True) -> None:
    """A markdown artifact on this run and, when it is a subflow, on the run that started it."""
    from prefect.artifacts import MarkdownArtifact

    _publish(MarkdownArtifact(key=key, markdown=markdown, description=description), on_deployment_run)


def publish_table(key: str, table: list[dict], description: str, on_deployment_run: bool = False) -> None:
    """A table artifact on this run (and on the run that started it, if asked)."""
    from prefect.artifacts import TableArtifact

    _publish(TableArtifact(key=key, table=table, description=description), on_deployment_run)
