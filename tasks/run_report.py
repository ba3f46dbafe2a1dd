"""The flow's last stage: render the run directory as a report and publish it as an artifact."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from pipeline.artifacts import publish_markdown
from report import ReportFiles, write_report
from schemas.layout import REPORT, RunLayout, artifact_key


def reused_stages() -> tuple[str, ...]:
    """The task runs of the current flow run that were served from cache (state `Cached`), by
    name, in the order they started: what a re-run or a Retry did not have to redo."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.client.schemas.sorting import TaskRunSort
    from prefect.runtime import flow_run

    flow_run_id = flow_run.get_id()
    if flow_run_id is None:
        return ()
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])), sort=TaskRunSort.EXPECTED_START_TIME_ASC
        )
    return tuple(r.name for r in runs if r.state is not None and r.state.name == "Cached")


@task(name=REPORT, task_run_name=REPORT, cache_policy=NO_CACHE)
def run_report(layout: RunLayout, stopped: str | None = None) -> ReportFiles:
    """Plots + report.html + report.md under `<run_dir>/report/`; a markdown artifact (key
    "report", on this run and on the deployment's run that started it) with the plots embedded
    and the HTML page's path as text. Never cached: it shows whatever the run directory holds
    now, and which stages this run reused. `stopped`: why this flow run failed, for the headline."""
    result = write_report(layout, stopped=stopped, reused=reused_stages())
    publish_markdown(artifact_key(REPORT), result.artifact_markdown, description=result.headline[:500])
    return result
