"""The page as HTML and markdown, from the Jinja2 templates beside this module, and the files.

    result = write_report(run_dir, out_dir=None, stopped=None)     # -> ReportFiles

Output (deterministic for the same run directory: no timestamps, fixed style and seeds), in
`<run_dir>/report/` unless `out_dir` names another directory:
    <plot>.png      one per drawn plot (a plot with no data behind it is not drawn; the page says why)
    report.html     self-contained: styles inline, the PNGs as base64 data URIs, nothing fetched
    report.md       the same summary, linking the PNGs beside it
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path

import jinja2
from markupsafe import Markup

from schemas.errors import UserError
from report.model import STAGES, RunData, Stage, load_run
from report.page import ARM_COLUMNS, COMPARISON_COLUMNS, COST_COLUMNS, Page, build_page
from report.plots import RenderedPlot, render_plots
from report.status import Status, stage_statuses, stopping_gate
from schemas.io import write_bytes_atomic, write_text_atomic
from schemas.layout import REPORT_HTML_FILE, REPORT_MARKDOWN_FILE, RunLayout

HTML_NAME, MARKDOWN_NAME = REPORT_HTML_FILE, REPORT_MARKDOWN_FILE

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("report", "templates"),
    autoescape=jinja2.select_autoescape(enabled_extensions=("html.j2",), default_for_string=False),
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
    undefined=jinja2.StrictUndefined,  # a misspelt field fails the render instead of vanishing
)


def _data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _cell(text) -> str:
    """Text for one markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


_ENV.filters["data_uri"] = _data_uri
_ENV.filters["cell"] = _cell
_ENV.globals["arm_columns"] = ARM_COLUMNS
_ENV.globals["comparison_columns"] = COMPARISON_COLUMNS
_ENV.globals["cost_columns"] = COST_COLUMNS


def render_html(page: Page) -> str:
    css = Markup(_ENV.loader.get_source(_ENV, "report.css")[0].strip())  # our own file, not data: not escaped
    return _ENV.get_template("report.html.j2").render(page=page, css=css)


def render_markdown(page: Page, *, html_link: str = HTML_NAME, embed_plots: bool = False) -> str:
    """The markdown summary. Beside the PNGs by default; `embed_plots` puts them in as data URIs
    (for a Prefect artifact, which is read elsewhere: a browser will not open a file:// link from
    the UI, so the HTML page's path is shown as text only)."""
    def plot_src(plot: RenderedPlot) -> str:
        return _data_uri(plot.png) if embed_plots else f"{plot.name}.png"

    text = _ENV.get_template("report.md.j2").render(page=page, html_link=html_link, plot_src=plot_src)
    return text.rstrip() + "\n"


@dataclass(frozen=True)
class ReportFiles:
    """What `write_report` wrote and what the page says, in brief."""

    out_dir: Path
    html: Path
    markdown: Path
    plots: dict[str, Path]  # plot name -> PNG, for the plots drawn
    not_drawn: dict[str, str]  # plot name -> why not
    verdict: str | None  # this run's (None when it has none, or ended Failed)
    headline: str
    stopped_at: str | None  # the gate stage that stopped the flow
    stages: dict[str, Status]  # stage key -> status, flow order
    problems: tuple[str, ...]  # unreadable files, named
    artifact_markdown: str  # report.md with the plots embedded and the HTML page's path as text


def write_plots(out: Path, plots: list[RenderedPlot]) -> dict[str, Path]:
    """Each drawn plot as out/<name>.png (plot name -> path); a plot not drawn removes its stale PNG."""
    written = {}
    for plot in plots:
        path = out / f"{plot.name}.png"
        if plot.png is None:
            if path.is_file():  # a plot from an earlier render whose data is gone would mislead
                path.unlink()
            continue
        written[plot.name] = write_bytes_atomic(path, plot.png)
    return written


def write_report(
    run_dir: RunLayout | str | Path, out_dir: str | Path | None = None, stopped: str | None = None, stages: tuple[Stage, ...] = STAGES,
    reused: tuple[str, ...] = (),
) -> ReportFiles:
    """Render `run_dir` into `out_dir` (default `<run_dir>/report/`): PNG plots, report.html
    (self-contained) and report.md. A missing run directory, one without spec/plan.json, or an
    `out_dir` that is a file is a UserError. `stopped`: the error that ended the flow run
    rendering this page (its headline then; a decision on file is then an earlier run's).
    `stages`: the flow's stages in order (model.STAGES; a test may pass others). `reused`: the
    stages the flow run served from cache, named on the page."""
    data: RunData = load_run(run_dir, stages).with_stopped(stopped).with_reused(reused)
    out = Path(out_dir) if out_dir is not None else data.layout.report_dir
    if out.exists() and not out.is_dir():
        raise UserError(f"{out}: exists and is not a directory")
    statuses = stage_statuses(data)
    plots = render_plots(data)
    page = build_page(data, statuses, plots)
    written = write_plots(out, plots)
    html_path = write_text_atomic(out / HTML_NAME, render_html(page))
    md_path = write_text_atomic(out / MARKDOWN_NAME, render_markdown(page))
    html_abs = html_path.resolve()
    return ReportFiles(
        out_dir=out,
        html=html_path,
        markdown=md_path,
        plots=written,
        not_drawn={p.name: p.why_not for p in plots if p.png is None},
        verdict=data.verdict,
        headline=page.headline.line,
        stopped_at=stopping_gate(data),
        stages={s.key: s.status for s in statuses},
        problems=tuple(data.problems),
        artifact_markdown=render_markdown(page, html_link=str(html_abs), embed_plots=True),
    )
