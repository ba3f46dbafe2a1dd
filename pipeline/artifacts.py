"""Prefect artifacts a stage publishes: on its own flow run and, where asked, on the deployment's
run that started it (the page `prefect deployment run` links to)."""

from __future__ import annotations


def _deployment_run_id():
    """The flow run a deployment (or a command) started, when the current run is a subflow of it."""
    from prefect.runtime import flow_run

    current, root = flow_run.get_id(), flow_run.get_root_flow_run_id()
    return root if root and current and str(root) != str(current) else None


def attempt_of(flow_run_id) -> int:
    """Which attempt of a flow run is running: its run count (1, then one more per Retry)."""
    from prefect import get_client

    with get_client(sync_client=True) as client:
        return max(int(client.read_flow_run(flow_run_id).run_count or 1), 1)


def attempt_key(key: str, attempt: int) -> str:
    """An artifact's key on the deployment's run, which holds every attempt's: `report-attempt-2`."""
    return f"{key}-attempt-{attempt}"


def _publish(artifact, on_deployment_run: bool) -> None:
    artifact.create()
    root = _deployment_run_id() if on_deployment_run else None
    if root is not None:
        # the page `prefect deployment run` links to is the outer run's, and it keeps every
        # attempt's artifacts (each Retry runs a new experiment subflow): the same artifact there,
        # its key and description naming the attempt it belongs to
        attempt = attempt_of(root)
        fields = artifact.model_dump(exclude={"flow_run_id", "task_run_id", "key", "description"})
        type(artifact)(**fields, key=attempt_key(artifact.key, attempt), flow_run_id=root,
                       description=f"attempt {attempt}: {artifact.description}"[:500]).create()


def publish_markdown(key: str, markdown: str, description: str, on_deployment_run: bool = True) -> None:
    """A markdown artifact on this run and, when it is a subflow, on the run that started it."""
    from prefect.artifacts import MarkdownArtifact

    _publish(MarkdownArtifact(key=key, markdown=markdown, description=description), on_deployment_run)


def publish_table(key: str, table: list[dict], description: str, on_deployment_run: bool = False) -> None:
    """A table artifact on this run (and on the run that started it, if asked)."""
    from prefect.artifacts import TableArtifact

    _publish(TableArtifact(key=key, table=table, description=description), on_deployment_run)
