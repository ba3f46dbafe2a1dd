"""The run report: a run directory rendered as PNG plots, one self-contained HTML page and a
markdown summary. No Prefect here: `tasks/run_report.py` publishes it as an artifact, `gs1 report`
calls it from the command line.

    write_report(run_dir, out_dir=None, stopped=None) -> ReportFiles     # the one entry point

The parts, each in its own module:
    model.py    what the run directory holds (typed), and the flow's stages in order (STAGES)
    status.py   each stage's status: ran, failed, skipped, not run (and why), an earlier run's
    plots.py    the matplotlib plots
    page.py     what the page says (headline, facts, arms, decision, gate tables) as typed objects
    render.py   HTML and markdown from templates/ (Jinja2; styles in templates/report.css)

A new gate stage shows up in the report by adding its `GateStage` to `model.STAGES`.
"""

from report.model import RunData, load_run
from report.plots import PLOTS
from report.render import ReportFiles, write_report
from report.status import StageStatus, Status, stage_statuses

__all__ = ["PLOTS", "ReportFiles", "RunData", "StageStatus", "Status", "load_run", "stage_statuses", "write_report"]
