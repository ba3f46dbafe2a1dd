"""The flow's last stage: render the run directory as a report and publish it as an artifact."""

from __future__ import annotations

from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from report import ReportFiles, write_report


@task(name="report", cache_policy=NO_CACHE)
def run_report(run_dir: str, stopped: str | None = None) -> ReportFiles:
    """Plots + report.html + report.md under `<run_dir>/report/`; a markdown artifact (key
    "report") with the plots embedded and the HTML page's path. Never cached: it shows whatever
    the run directory holds now. `stopped`: why this flow run failed, for the headline."""
    result = write_report(run_dir, stopped=stopped)
    create_markdown_artifact(key="report", markdown=result.artifact_markdown, description=result.headline[:500])
    return result
