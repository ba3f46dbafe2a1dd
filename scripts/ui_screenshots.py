"""Screenshots of the Prefect UI pages a researcher looks at, in headless Chromium.

    PREFECT_API_URL=http://127.0.0.1:4200/api python scripts/ui_screenshots.py --out shots/ [--flow-run ID]
    ... --page deployments        # the Deployments list: each deployment's name says what it does
    ... --page refused-form       # gs1-run/experiment's run form refusing `steps = -1`

`--page run` (the default) takes a flow run, without `--flow-run` the newest run of the `gs1-run`
(deployment) or `gs1-experiment` flow. It saves the flow run page (logs), its Details tab (the
state message), its Artifacts tab, and of the run's last attempt (an experiment subflow per Retry)
the subflow's Task Runs tab and every table/markdown artifact. Each shot is the whole page (the
window is grown until the UI's inner scrolling pane hides nothing), a PNG of 256 colours.
Run with no PREFECT_API_URL and no `--flow-run`, it re-shoots the whole walk into `results/ui/`
(`scripts/ui_make_states.py`, which puts a server of its own into the states these show and calls
this script per screen; its options pass through).
Needs Debian's `chromium` and `pip install playwright` (it drives that chromium; nothing is
downloaded).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
from pathlib import Path

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]
MAX_HEIGHT = 12000  # px: a shot stays a readable PNG of a few MB at most

# The Prefect UI lays its page out in the viewport's height and scrolls an inner pane, so the
# document is never taller than the window and `full_page=True` alone stops at the viewport. How
# much the most overflowing scrollable element still hides is what the window must grow by.
HIDDEN_HEIGHT_JS = """() => {
  let hidden = 0;
  for (const el of document.querySelectorAll('*')) {
    const style = getComputedStyle(el);
    if (!/(auto|scroll)/.test(style.overflowY)) continue;
    hidden = Math.max(hidden, el.scrollHeight - el.clientHeight);
  }
  return Math.max(hidden, document.documentElement.scrollHeight - window.innerHeight, 0);
}"""


class Browser:
    """Headless Debian chromium driven by playwright (`pip install playwright`; no browser
    download: it runs /usr/bin/chromium), so a tab can be clicked before the screenshot."""

    def __init__(self):
        chromium = shutil.which("chromium") or shutil.which("chromium-browser")
        if chromium is None:
            raise SystemExit("scripts/ui_screenshots.py: chromium not found (apt-get install chromium)")
        try:
            from playwright.sync_api import sync_playwright
        except ImportError:
            raise SystemExit("scripts/ui_screenshots.py: needs playwright (pip install playwright)") from None
        self._pw = sync_playwright().start()
        self._browser = self._pw.chromium.launch(executable_path=chromium, args=FLAGS[1:], headless=True)

    def shoot(self, url: str, out: Path, click: str | None = None, act=None, width: int = 1500) -> Path:
        """The whole page at `url` after clicking the tab `click` or running `act(page)`."""
        page = self._browser.new_page(viewport={"width": width, "height": 1000})
        page.goto(url, wait_until="networkidle")
        if click:
            page.get_by_text(click, exact=True).first.click()
            page.wait_for_load_state("networkidle")
        if act:
            act(page)
        page.wait_for_timeout(1500)
        self._fit_height(page, width)
        page.screenshot(path=str(out), full_page=True)
        page.close()
        _quantize(out)
        print(f"{out}  <-  {url}" + (f" [{click} tab]" if click else ""))
        return out

    @staticmethod
    def _fit_height(page, width: int) -> None:
        """Grow the window until no scrollable pane hides anything (a few rounds: panes re-lay out
        as the window grows, and lazy parts load when they come into view)."""
        for _ in range(4):
            hidden = page.evaluate(HIDDEN_HEIGHT_JS)
            height = page.viewport_size["height"]
            if hidden <= 2 or height >= MAX_HEIGHT:
                return
            page.set_viewport_size({"width": width, "height": min(height + hidden, MAX_HEIGHT)})
            page.wait_for_timeout(800)

    def close(self) -> None:
        self._browser.close()
        self._pw.stop()


def _quantize(png: Path) -> None:
    """256 colours: a UI page reads the same at a third of the size."""
    from PIL import Image

    with Image.open(png) as image:
        small = image.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    small.save(png, optimize=True)


def _refuse_steps(page) -> None:
    """Type `steps = -1` into the run form's overrides and submit it with the form's validation on."""
    label = page.locator("xpath=./div/label//span[@class='schema-form-property__label']", has_text="Steps (Optional)")
    page.locator("div.schema-form-property").filter(has=label).locator("input").fill("-1")
    page.get_by_role("button", name="Submit").click()
    page.get_by_text("Validation failed for field", exact=False).first.wait_for(timeout=15000)


async def _deployment_id(name: str):
    from prefect.client.orchestration import get_client

    async with get_client() as client:
        return (await client.read_deployment_by_name(name)).id


async def _pages(flow_run_id: str | None):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter, ArtifactFilterFlowRunId, FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterParentFlowRunId,
    )
    from prefect.client.schemas.sorting import FlowRunSort

    async with get_client() as client:
        if flow_run_id is None:
            runs = await client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["gs1-run", "gs1-experiment"])),
                                               sort=FlowRunSort.START_TIME_DESC, limit=1)
            if not runs:
                raise SystemExit("scripts/ui_screenshots.py: no run of the experiment flow on this server")
            run = runs[0]
        else:
            run = await client.read_flow_run(flow_run_id)
        # a deployment's run holds the experiment as a subflow (one per Retry): its task runs are there
        subflows = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[run.id])),
            sort=FlowRunSort.START_TIME_ASC)
        arts = await client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run.id])))
        return run, subflows, arts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="shots")
    ap.add_argument("--page", choices=["run", "deployments", "refused-form"], default="run")
    ap.add_argument("--flow-run", default=None)
    ap.add_argument("--ui", default=None, help="UI base URL (default: PREFECT_API_URL without /api)")
    args, walk_args = ap.parse_known_args(argv)
    api = os.environ.get("PREFECT_API_URL")
    if not api and args.flow_run is None and args.page == "run":
        # no server given: the whole walk (a server of its own, its states, every screen) into results/ui/
        import subprocess

        return subprocess.call([sys.executable, str(Path(__file__).with_name("ui_make_states.py")), *walk_args])
    if walk_args:
        ap.error(f"unrecognized arguments: {' '.join(walk_args)}")
    if not api:
        raise SystemExit("scripts/ui_screenshots.py: set PREFECT_API_URL (a running `prefect server start`)")
    ui = (args.ui or api.removesuffix("/").removesuffix("/api")).rstrip("/")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.page == "deployments":
        pages = [(f"{ui}/deployments", out / "deployments.png", {})]
    elif args.page == "refused-form":
        deployment = asyncio.run(_deployment_id("gs1-run/experiment"))
        form = f"{ui}/deployments/deployment/{deployment}/run"
        pages = [(form, out / "run_form_refused.png", {"act": _refuse_steps})]
    else:
        pages = _run_pages(ui, out, args.flow_run)
    browser = Browser()
    try:
        for url, png, how in pages:
            browser.shoot(url, png, **how)
    finally:
        browser.close()
    return 0


def _run_pages(ui: str, out: Path, flow_run_id: str | None) -> list:
    run, subflows, arts = asyncio.run(_pages(flow_run_id))
    print(f"flow run {run.name} ({run.id}): {run.state_name}")
    url = f"{ui}/runs/flow-run/{run.id}"
    pages = [(url, out / "flow_run.png", {}),
             (url, out / "flow_run_details.png", {"click": "Details"})]  # the state message
    if arts:
        pages.append((url, out / "flow_run_artifacts.png", {"click": "Artifacts"}))
    # the last attempt: its subflow's task runs and its artifacts (an earlier one's are in its own shots)
    since = subflows[-1].start_time if subflows else None
    if subflows:
        url = f"{ui}/runs/flow-run/{subflows[-1].id}"
        pages.append((url, out / f"subflow_{len(subflows) - 1}_task_runs.png", {"click": "Task Runs"}))
    for i, a in enumerate(sorted(arts, key=lambda a: a.created)):
        if a.type in ("table", "markdown", "progress") and (since is None or a.created >= since):
            pages.append((f"{ui}/artifacts/artifact/{a.id}", out / f"artifact_{i:02d}_{a.key or a.type}.png", {}))
    return pages


if __name__ == "__main__":
    sys.exit(main())
