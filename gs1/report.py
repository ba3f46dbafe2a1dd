"""Render a run directory as PNG plots, one self-contained HTML page and a markdown summary.

    write_report(run_dir, out_dir=None) -> dict     # writes <run_dir>/report/ (or out_dir)

Reads whatever the experiment flow wrote (any stage may be missing: a failed gate stops the flow)
and says plainly which stages did not run and why. No Prefect here: `tasks/report.py` publishes
the result as an artifact, `gs1 report` calls it from the command line.

Output (deterministic for the same run directory: no timestamps, fixed style and seeds):
    reward_per_step.png, advantage_baseline.png, effective_neighbours.png, eval_accuracy.png,
    wall_time.png      (a plot with no data behind it is not drawn, and the page says why)
    report.html        (the PNGs embedded as base64 data URIs; no external asset)
    report.md          (the same summary, linking the PNGs beside it)
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib
import matplotlib.style
import numpy as np
import pyarrow as pa
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, MultipleLocator

from schemas.errors import UserError
from schemas.artifacts import read_artifact
from schemas.io import write_bytes_atomic, write_text_atomic

KERNEL_ADVANTAGE = "kernel_cross_prompt_baseline"
KERNEL_P10_METRIC = "kernel_effective_neighbors_p10"

# Flow order (flows/experiment.py): key, title shown to people.
STAGES = [
    ("spec", "validate spec"),
    ("preflight", "correctness preflight"),
    ("unit_checks", "offline unit checks"),
    ("pilot", "pilot (2 treatment steps, 1 baseline step)"),
    ("activation_gate", "activation gate"),
    ("calibration", "bandwidth calibration"),
    ("feasibility", "feasibility"),
    ("train", "full training runs"),
    ("eval", "eval"),
    ("decision", "decision"),
]
# Gate stage key -> gate_report path inside the run dir.
GATE_FILES = {
    "preflight": "preflight/gate_report.parquet",
    "unit_checks": "unit_checks/gate_report.parquet",
    "activation_gate": "gate/gate_report.parquet",
    "calibration": "calibration/gate/gate_report.parquet",
    "feasibility": "feasibility/gate_report.parquet",
}
PLOTS = ["reward_per_step", "advantage_baseline", "effective_neighbours", "eval_accuracy", "wall_time"]
PLOT_TITLES = {
    "reward_per_step": "Training reward per step",
    "advantage_baseline": "Advantage and baseline distributions",
    "effective_neighbours": "Kernel effective neighbours",
    "eval_accuracy": "Eval accuracy and the paired decision",
    "wall_time": "Wall time per stage",
}
VERDICT_COLOURS = {"noninferior": "#1a7f37", "inferior": "#cf222e", "inconclusive": "#9a6700"}
STOPPED_COLOUR = "#cf222e"
PENDING_COLOUR = "#57606a"
ROLE_COLOURS = {"treatment": "#0969da", "baseline": "#e16f24"}
OTHER_COLOURS = ["#8250df", "#1a7f37", "#bf3989", "#57606a"]
SOURCE_STYLES = {"pilot": ":", "calibration": "--", "train": "-"}
SOURCE_TITLES = {"pilot": "pilot", "calibration": "calibration pilot", "train": "full run"}


# ---------------------------------------------------------------------------------------------
# Reading the run directory


@dataclass
class ArmLogs:
    """One arm's logs in one stage (pilot, calibration or train); tables are None when absent."""

    rollouts: pa.Table | None = None
    metrics: pa.Table | None = None
    complete: bool = False  # the stage finished for this arm (merged logs / final.json)

    @property
    def steps_logged(self) -> int:
        return 0 if self.metrics is None else self.metrics.num_rows


@dataclass
class RunData:
    run_dir: Path
    plan: dict
    spec: dict | None = None
    gates: dict[str, list[dict]] = field(default_factory=dict)  # gate stage key -> gate_report rows
    logs: dict[str, dict[str, ArmLogs]] = field(default_factory=dict)  # pilot/calibration/train -> arm -> logs
    timings: dict[str, dict] = field(default_factory=dict)  # pilot/calibration -> timings.json
    evals: dict[str, list[dict]] = field(default_factory=dict)  # arm -> eval_items rows
    feasibility: dict | None = None
    decision: dict | None = None
    revised_spec: dict | None = None
    problems: list[str] = field(default_factory=list)  # unreadable files, named
    # set by the flow when the run that rendered this page ended Failed (the error's message):
    # then a decision.json in the directory is an earlier run's and is not this run's verdict
    stopped: str | None = None

    @property
    def arm_names(self) -> list[str]:
        names = [a["name"] for a in self.plan.get("arms", [])]
        for by_arm in [*self.logs.values(), self.evals]:
            names += [n for n in by_arm if n not in names]
        return names

    def role(self, arm: str) -> str | None:
        run = self.plan.get("run", {})
        return "treatment" if arm == run.get("treatment") else "baseline" if arm == run.get("baseline") else None

    def arm_spec(self, arm: str) -> dict:
        return next((a for a in self.plan.get("arms", []) if a["name"] == arm), {})

    def colour(self, arm: str) -> str:
        role = self.role(arm)
        if role:
            return ROLE_COLOURS[role]
        others = [a for a in self.arm_names if not self.role(a)]
        return OTHER_COLOURS[others.index(arm) % len(OTHER_COLOURS)]

    def check_for(self, metric: str) -> dict | None:
        return next((c for c in self.plan.get("checks", []) if c.get("metric") == metric), None)


def _read_json(path: Path, problems: list[str]):
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        problems.append(f"{path}: not readable JSON ({type(e).__name__})")
        return None


def _read_table(kind: str, path: Path, problems: list[str]) -> pa.Table | None:
    if not path.is_file():
        return None
    try:
        return read_artifact(kind, path)
    except UserError as e:
        problems.append(str(e))
        return None


def _read_step_files(steps_dir: Path, kind: str, suffix: str, problems: list[str]) -> pa.Table | None:
    tables = [t for f in sorted(steps_dir.glob(f"step-*.{suffix}.parquet")) if (t := _read_table(kind, f, problems)) is not None]
    return pa.concat_tables(tables) if tables else None


def _read_arm_logs(arm_dir: Path, problems: list[str], done_marker: str | None = None) -> ArmLogs | None:
    """Merged logs when the stage merged them, else the per-step files of a stage in progress."""
    if not arm_dir.is_dir():
        return None
    logs = ArmLogs()
    merged_rollouts, merged_metrics = arm_dir / "rollouts.parquet", arm_dir / "step_metrics.parquet"
    if merged_metrics.is_file():
        logs.metrics = _read_table("step_metrics", merged_metrics, problems)
        logs.rollouts = _read_table("rollouts", merged_rollouts, problems)
        logs.complete = (arm_dir / done_marker).is_file() if done_marker else True
    else:
        logs.metrics = _read_step_files(arm_dir / "steps", "step_metrics", "metrics", problems)
        logs.rollouts = _read_step_files(arm_dir / "steps", "rollouts", "rollouts", problems)
    return logs


def load_run(run_dir: str | Path) -> RunData:
    """Everything the flow wrote under `run_dir`; a missing stage is simply absent.

    A run directory needs `spec/plan.json` (written by the first stage); without it, or when the
    directory does not exist, this is a one-line UserError. An unreadable artifact is listed in
    `problems` and treated as absent.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"{run_dir}: no such run directory")
    problems: list[str] = []
    plan = _read_json(run_dir / "spec" / "plan.json", problems)
    if plan is None:
        why = f" ({problems[0]})" if problems else ""
        raise UserError(f"{run_dir}: not a gs1 run directory: no readable spec/plan.json{why}")
    data = RunData(run_dir=run_dir, plan=plan, problems=problems)
    data.spec = _read_json(run_dir / "spec" / "spec.json", problems)
    for key, rel in GATE_FILES.items():
        table = _read_table("gate_report", run_dir / rel, problems)
        if table is not None:
            data.gates[key] = table.to_pylist()
    for stage in ("pilot", "calibration"):
        stage_dir = run_dir / stage
        if not stage_dir.is_dir():
            continue
        timings = _read_json(stage_dir / "timings.json", problems)
        if timings is not None:
            data.timings[stage] = timings
        arms = {}
        for arm_dir in sorted(p for p in stage_dir.iterdir() if p.is_dir() and p.name != "gate"):
            logs = _read_arm_logs(arm_dir, problems)
            if logs is not None and (logs.metrics is not None or logs.rollouts is not None):
                logs.complete = logs.complete and timings is not None
                arms[arm_dir.name] = logs
        if arms:
            data.logs[stage] = arms
    train_dir = run_dir / "train"
    if train_dir.is_dir():
        arms = {}
        for arm_dir in sorted(p for p in train_dir.iterdir() if p.is_dir()):
            logs = _read_arm_logs(arm_dir, problems, done_marker="final.json")
            if logs is not None and (logs.metrics is not None or logs.rollouts is not None):
                arms[arm_dir.name] = logs
        if arms:
            data.logs["train"] = arms
    eval_dir = run_dir / "eval"
    if eval_dir.is_dir():
        for arm_dir in sorted(p for p in eval_dir.iterdir() if p.is_dir()):
            table = _read_table("eval_items", arm_dir / "eval.parquet", problems)
            if table is not None and table.num_rows:
                data.evals[arm_dir.name] = table.to_pylist()
    data.feasibility = _read_json(run_dir / "feasibility" / "feasibility.json", problems)
    data.decision = _read_json(run_dir / "decision" / "decision.json", problems)
    data.revised_spec = _read_json(run_dir / "calibration" / "revised_spec.json", problems)
    return data


# ---------------------------------------------------------------------------------------------
# Gates and stage status


def fmt(value, digits: int = 4) -> str:
    """A number for people: 4 significant digits, 'n/a' for missing or NaN."""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        if math.isnan(value):
            return "n/a"
        return f"{value:.{digits}g}"
    return str(value)


def _bound_text(bound: str) -> str:
    """The gate_report's bound as written ("8.0", "(1.0,)", "0 (excess over tolerance)")."""
    text = str(bound).strip()
    try:
        return fmt(float(text))
    except ValueError:
        pass
    if text.startswith(("(", "[")):
        try:
            values = json.loads("[" + text.strip("()[]").rstrip(",") + "]")
            return "{" + ", ".join(fmt(float(v)) for v in values) + "}"
        except (ValueError, TypeError):
            return text
    return text


def needs_text(row: dict) -> str:
    """What a gate check needs, in symbols: '>= 8', '<= 0.9', 'one of {1}', or the bound's text."""
    bound = _bound_text(row["bound"])
    starts_numeric = bound[:1].isdigit() or bound[:1] in "-+." or bound.startswith("{")
    if not starts_numeric:
        return bound  # e.g. "finite"
    op = row["op"]
    return {"min": f"≥ {bound}", "max": f"≤ {bound}", "one_of": f"one of {bound}"}.get(op, f"{op} {bound}")


def gate_passed(rows: list[dict]) -> bool:
    return all(r["passed"] for r in rows)


def failing_text(rows: list[dict]) -> str:
    """'metric = value (needs >= bound)' for every failing check, joined by '; '."""
    parts = []
    for r in rows:
        if r["passed"]:
            continue
        value = fmt(r["value"]) if r["value"] is not None and not math.isnan(r["value"]) else "not computable"
        parts.append(f"{r['metric']} = {value} (needs {needs_text(r)})")
    return "; ".join(parts)


@dataclass(frozen=True)
class StageStatus:
    key: str
    title: str
    status: str  # passed, failed, done, incomplete, skipped, not run, earlier run
    detail: str


def _stopping_gate(data: RunData) -> str | None:
    """The first failed gate that stopped the flow (the activation gate does not stop it when the
    pre-registered calibration then passed)."""
    for key, _ in STAGES:
        rows = data.gates.get(key)
        if rows is None or gate_passed(rows):
            continue
        if key == "activation_gate" and "calibration" in data.gates and \
                KERNEL_P10_METRIC in {r["metric"] for r in rows if not r["passed"]}:
            # the pre-registered calibration answered this failure: the flow went on, or stopped there
            if gate_passed(data.gates["calibration"]):
                continue
            return "calibration"
        return key
    return None


def _gate_title(key: str) -> str:
    return {"calibration": "calibration gate"}.get(key, dict(STAGES)[key])


def stage_statuses(data: RunData) -> list[StageStatus]:
    """One line per flow stage: what ran, what failed, and why later stages did not run."""
    stop = _stopping_gate(data)
    stop_reason = f"not run: the flow stopped at the {_gate_title(stop)}" if stop else None
    arms = [a["name"] for a in data.plan.get("arms", [])]
    statuses: list[StageStatus] = []
    reached_stop = False
    first_missing = None  # the first stage with no record when no gate stopped the flow
    for key, title in STAGES:
        status, detail = _stage_status(data, key, arms)
        if reached_stop and data.stopped and status not in ("not run", "skipped"):
            # this run stopped before the stage: what the directory holds came from an earlier run
            status, detail = "earlier run", f"not this run's (it stopped at the {_gate_title(stop)}); on file: {detail}"
        if status == "not run":
            if reached_stop and stop_reason:
                detail = stop_reason
            elif first_missing is not None:
                detail = f"not run yet: comes after {first_missing}"
            elif not detail:  # calibration explains itself; others are the frontier of the run
                first_missing = title
                detail = (
                    "no record yet: the flow may still be running this stage, or stopped with an error "
                    "before it (see the flow run's logs)"
                )
        elif status == "incomplete" and first_missing is None:
            first_missing = title
        statuses.append(StageStatus(key, title, status, detail))
        if key == stop:
            reached_stop = True
    return statuses


def _stage_status(data: RunData, key: str, arms: list[str]) -> tuple[str, str]:
    run_dir = data.run_dir
    if key == "spec":
        return "done", f"{len(arms)} arms; treatment {data.plan['run'].get('treatment')}, baseline {data.plan['run'].get('baseline')}"
    if key in GATE_FILES:
        rows = data.gates.get(key)
        if key == "calibration" and rows is None:
            act = data.gates.get("activation_gate")
            if act is not None and gate_passed(act):
                return "skipped", "not needed: the activation gate passed at the pre-registered bandwidth"
            if act is not None and KERNEL_P10_METRIC not in {r["metric"] for r in act if not r["passed"]}:
                return "skipped", f"not triggered: the pre-registered calibration only answers a failed {KERNEL_P10_METRIC}"
            if (run_dir / "calibration").is_dir():
                return "incomplete", "calibration pilot started, its gate has no record yet"
            return "not run", f"not run: only runs when the activation gate fails {KERNEL_P10_METRIC}"
        if rows is None:
            return "not run", ""
        n = len(rows)
        if gate_passed(rows):
            return "passed", f"all {n} checks passed"
        text = f"{sum(not r['passed'] for r in rows)} of {n} checks failed: {failing_text(rows)}"
        if key == "activation_gate" and "calibration" in data.gates and gate_passed(data.gates["calibration"]):
            text += "; the pre-registered bandwidth calibration then passed"
        return "failed", text
    if key == "pilot":
        pilot = data.logs.get("pilot", {})
        if "pilot" in data.timings:
            steps = ", ".join(f"{a}: {_steps(pilot[a].steps_logged)}" for a in arms if a in pilot)
            return "done", steps or "timings recorded"
        if pilot:
            return "incomplete", ", ".join(f"{a}: {_steps(logs.steps_logged)} logged" for a, logs in pilot.items())
        return "not run", ""
    if key == "train":
        train = data.logs.get("train", {})
        if not train:
            return "not run", ""
        parts = []
        for a in arms:
            total = data.arm_spec(a).get("steps", "?")
            logs = train.get(a)
            parts.append(f"{a}: {logs.steps_logged if logs else 0}/{total} steps" + ("" if logs and logs.complete else " (unfinished)"))
        complete = all(a in train and train[a].complete for a in arms)
        return ("done" if complete else "incomplete"), ", ".join(parts)
    if key == "eval":
        if not data.evals:
            return "not run", ""
        parts = [f"{a}: accuracy {fmt(_accuracy(data.evals[a]))} on {len(data.evals[a])} items" for a in arms if a in data.evals]
        missing = [a for a in arms if a not in data.evals]
        if missing:
            parts.append("no eval yet for " + ", ".join(missing))
            return "incomplete", "; ".join(parts)
        return "done", "; ".join(parts)
    if key == "decision":
        if data.decision is None:
            return "not run", ""
        d = data.decision
        return "done", f"{d.get('verdict')}: lower bound {fmt(d.get('lower'))} vs margin {fmt(d.get('margin'))} over {d.get('n')} items"
    raise KeyError(key)


def _steps(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


def _accuracy(rows: list[dict]) -> float:
    return sum(bool(r["correct"]) for r in rows) / len(rows) if rows else float("nan")


# ---------------------------------------------------------------------------------------------
# Plots (matplotlib's object API on the Agg canvas: no pyplot, no global backend)

STYLE = {
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.fontsize": 9,
    "legend.frameon": False,
}


def _figure(width: float, height: float, ncols: int = 1) -> tuple[Figure, list]:
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, list(axes)


def _step_axis(ax, steps: list[np.ndarray]) -> None:
    """Whole-number step ticks, with room around a single step."""
    every = np.concatenate([s for s in steps if s.size]) if any(s.size for s in steps) else np.array([0.0])
    ax.set_xlim(float(every.min()) - 0.4, float(every.max()) + 0.4)
    span = float(every.max() - every.min())
    ax.xaxis.set_major_locator(MultipleLocator(1) if span <= 20 else MaxNLocator(integer=True))


def _legend_below(ax, ncol: int = 2) -> None:
    """A legend under the axes, so it never hides data (constrained layout makes room)."""
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=ncol)


def _png_bytes(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    return buf.getvalue()


def _column(table: pa.Table | None, name: str) -> np.ndarray:
    if table is None or name not in table.column_names:
        return np.array([], dtype=np.float64)
    return np.asarray(table.column(name).to_numpy(zero_copy_only=False), dtype=np.float64)


def _main_logs(data: RunData) -> tuple[str, dict[str, ArmLogs]] | tuple[None, dict]:
    """The logs that stand for an arm: the full run's when it ran, else the pilot's."""
    for source in ("train", "calibration", "pilot"):
        if data.logs.get(source):
            return source, data.logs[source]
    return None, {}


def plot_reward_per_step(data: RunData) -> tuple[Figure | None, str]:
    source, logs = _main_logs(data)
    if source is None:
        return None, "no training or pilot step logs (those stages did not run)"
    fig, (ax,) = _figure(8, 4)
    all_steps = []
    for arm in data.arm_names:
        if arm not in logs or logs[arm].metrics is None:
            continue
        m = logs[arm].metrics
        steps, mean = _column(m, "step"), _column(m, "reward_mean")
        all_steps.append(steps)
        spec = data.arm_spec(arm)
        per_step = spec.get("groups_per_batch", 0) * spec.get("group_size", 0)
        label = f"{arm} ({data.role(arm) or 'arm'}" + (f", {per_step} rollouts/step)" if per_step else ")")
        ax.plot(steps, mean, marker="o", markersize=4, color=data.colour(arm), label=label)
        n_R = np.full(len(steps), float(per_step)) if per_step else np.maximum(_column(m, "num_datums"), 1.0)
        sem = _column(m, "reward_std") / np.sqrt(n_R)
        if steps.size > 1:
            ax.fill_between(steps, mean - sem, mean + sem, color=data.colour(arm), alpha=0.15, linewidth=0)
        else:  # a band needs two steps
            ax.errorbar(steps, mean, yerr=sem, color=data.colour(arm), alpha=0.5, capsize=6, linewidth=1.5)
    ax.set_xlabel(f"training step ({SOURCE_TITLES[source]})")
    ax.set_ylabel("mean training reward")
    ax.set_title(f"Training reward per step, {SOURCE_TITLES[source]} (band: ± one standard error of the step mean)")
    _step_axis(ax, all_steps)
    _legend_below(ax, ncol=2)
    return fig, ""


def plot_advantage_baseline(data: RunData) -> tuple[Figure | None, str]:
    source, logs = _main_logs(data)
    arms = [a for a in data.arm_names if a in logs and logs[a].rollouts is not None and logs[a].rollouts.num_rows]
    if not arms:
        return None, "no rollout logs (training and the pilot did not run)"
    fig, axes = _figure(11, 4, ncols=2)
    for ax, column, what in zip(axes, ("advantage", "baseline"), ("advantage  A = r − b", "baseline  b")):
        values = {a: _column(logs[a].rollouts, column) for a in arms}
        every = np.concatenate(list(values.values()))
        lo, hi = float(np.min(every)), float(np.max(every))
        if hi - lo < 1e-9:
            lo, hi = lo - 0.5, hi + 0.5
        bins = np.linspace(lo, hi, 41)
        for a in arms:
            v = values[a]
            extra = f", |A|>1e-6: {np.mean(np.abs(v) > 1e-6):.0%}" if column == "advantage" else f", mean {np.mean(v):.3f}"
            ax.hist(v, bins=bins, histtype="stepfilled", alpha=0.35, color=data.colour(a), edgecolor=data.colour(a),
                    linewidth=1.2, label=f"{a} (n={v.size}{extra})")  # fmt: skip
        ax.set_xlabel(what)
        ax.set_ylabel("rollouts")
        ax.set_title(f"{column.capitalize()} per rollout, {SOURCE_TITLES[source]}")
        _legend_below(ax, ncol=1)
    return fig, ""


def plot_effective_neighbours(data: RunData) -> tuple[Figure | None, str]:
    series = []  # (source, arm, neighbours_R, steps, p10_per_step)
    for source in ("pilot", "calibration", "train"):
        for arm, logs in data.logs.get(source, {}).items():
            eff = _column(logs.rollouts, "effective_neighbors")
            eff = eff[~np.isnan(eff)]
            p10 = _column(logs.metrics, "effective_neighbors_p10")
            steps = _column(logs.metrics, "step")
            keep = ~np.isnan(p10)
            if eff.size or keep.any():
                series.append((source, arm, eff, steps[keep], p10[keep]))
    if not series:
        return None, "no kernel-arm rollouts logged (the pilot did not run, or no arm uses the kernel baseline)"
    check = data.check_for(KERNEL_P10_METRIC) or {}
    bound = check.get("min")
    fig, (left, right) = _figure(11, 4, ncols=2)
    every = np.concatenate([s[2] for s in series if s[2].size]) if any(s[2].size for s in series) else np.array([0.0, 1.0])
    bins = np.linspace(0.0, max(float(every.max()), float(bound or 0)) * 1.02 + 1e-9, 41)
    for source, arm, eff, steps, p10 in series:
        colour, style = data.colour(arm), SOURCE_STYLES[source]
        label = f"{arm}, {SOURCE_TITLES[source]}"
        if eff.size:
            p10_all = float(np.percentile(eff, 10))
            left.hist(eff, bins=bins, histtype="step", linestyle=style, linewidth=1.6, color=colour,
                      label=f"{label} (n={eff.size}, p10 {p10_all:.1f})")  # fmt: skip
            left.axvline(p10_all, color=colour, linestyle=style, linewidth=1, alpha=0.7)
        if p10.size:
            right.plot(steps, p10, marker="o", markersize=4, linestyle=style, color=colour, label=label)
    if bound is not None:
        for ax in (left, right):
            line = ax.axvline if ax is left else ax.axhline
            line(float(bound), color=STOPPED_COLOUR, linestyle="--", linewidth=1.5, label=f"gate: p10 ≥ {fmt(float(bound))}")
    left.set_xlabel("effective neighbours (Σw)² / Σw² of one rollout")
    left.set_ylabel("rollouts")
    left.set_title("Effective neighbours per rollout (thin lines: p10)")
    _legend_below(left, ncol=1)
    right.set_xlabel("training step")
    right.set_ylabel("10th percentile of effective neighbours")
    right.set_title("p10 of effective neighbours per step vs the gate bound")
    _step_axis(right, [s[3] for s in series])
    right.set_ylim(bottom=0)
    _legend_below(right, ncol=1)
    return fig, ""


def plot_eval_accuracy(data: RunData) -> tuple[Figure | None, str]:
    if not data.evals:
        return None, "no eval results (eval did not run)"
    d = data.decision
    fig, axes = _figure(11, 3.8, ncols=2 if d else 1)
    ax = axes[0]
    arms = [a for a in data.arm_names if a in data.evals]
    accuracy = [_accuracy(data.evals[a]) for a in arms]
    bars = ax.bar(arms, accuracy, color=[data.colour(a) for a in arms], width=0.6)
    for bar, a, acc in zip(bars, arms, accuracy):
        correct = sum(bool(r["correct"]) for r in data.evals[a])
        ax.annotate(f"{acc:.3f}\n({correct}/{len(data.evals[a])})", (bar.get_x() + bar.get_width() / 2, acc),
                    xytext=(0, 3), textcoords="offset points", ha="center", va="bottom")  # fmt: skip
    ax.set_ylim(0, min(1.0, max(accuracy) * 1.3 + 0.1))
    ax.set_ylabel("eval accuracy (greedy, final weights)")
    ax.set_title("Eval accuracy per arm")
    ax.grid(axis="x", visible=False)
    if d:
        ax = axes[1]
        verdict = d.get("verdict", "?")
        colour = VERDICT_COLOURS.get(verdict, PENDING_COLOUR)
        lower, upper, mean, margin = d["lower"], d["upper"], d["mean_diff"], d["margin"]
        ax.errorbar([mean], [1], xerr=[[mean - lower], [upper - mean]], fmt="o", color=colour, capsize=6,
                    linewidth=2.5, markersize=8, label=f"mean diff {mean:+.3f}, Hoeffding [{lower:+.3f}, {upper:+.3f}]")  # fmt: skip
        boot_lo, boot_hi = d.get("bootstrap_lower"), d.get("bootstrap_upper")
        if boot_lo is not None and boot_hi is not None:
            ax.errorbar([mean], [0], xerr=[[mean - boot_lo], [boot_hi - mean]], fmt="o", color="#8c959f", capsize=4,
                        linewidth=1.5, markersize=5, label=f"bootstrap {1 - 2 * d['alpha']:.0%} CI [{boot_lo:+.3f}, {boot_hi:+.3f}] (descriptive)")  # fmt: skip
        ax.axvline(margin, color=STOPPED_COLOUR, linestyle="--", linewidth=1.5, label=f"noninferiority margin {margin:+.3f}")
        ax.axvline(0.0, color="#57606a", linewidth=0.8)
        ax.set_yticks([0, 1], ["bootstrap", "Hoeffding\n(decides)"])
        ax.set_ylim(-0.8, 1.8)
        ax.set_xlabel(f"accuracy difference {d.get('treatment', 'treatment')} − {d.get('baseline', 'baseline')}  (n={d['n']} paired items)")
        ax.set_title(f"Paired difference, α={d['alpha']:g} each side: {verdict.upper()}", color=colour, fontweight="bold")
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=1)
    return fig, ""


def _time_rows(data: RunData) -> list[tuple[str, dict[str, float]]]:
    """(label, {segment: seconds}) per stage per arm, from the step logs and the pilot timings."""
    rows = []
    for source in ("pilot", "calibration", "train"):
        setup = data.timings.get(source, {}).get("setup_seconds", {}) or {}
        for arm in data.arm_names:
            logs = data.logs.get(source, {}).get(arm)
            if logs is None or logs.metrics is None:
                continue
            step, sample, train = (float(np.sum(_column(logs.metrics, c))) for c in ("step_seconds", "sample_seconds", "train_seconds"))
            segments = {
                "model setup": float(setup.get(arm, 0.0)),
                "sampling": sample,
                "forward_backward + optim_step": train,
                "other (advantages, logging)": max(step - sample - train, 0.0),
            }
            rows.append((f"{SOURCE_TITLES[source]} · {arm} ({_steps(logs.steps_logged)})", segments))
    return rows


def _unit(seconds: float) -> tuple[str, str, float]:
    """(axis word, short suffix, divisor): minutes above 3 minutes, else seconds."""
    return ("minutes", "min", 60.0) if seconds > 180 else ("seconds", "s", 1.0)


def plot_wall_time(data: RunData) -> tuple[Figure | None, str]:
    rows = _time_rows(data)
    projection = data.feasibility
    if not rows and not projection:
        return None, "no timings (the pilot did not run)"
    fig, axes = _figure(11, 2.4 + 0.45 * max(len(rows), 3), ncols=2 if projection else 1)
    segment_colours = ["#8c959f", "#0969da", "#e16f24", "#d0d7de"]
    ax = axes[0]
    if rows:
        unit, short, scale = _unit(max(sum(seg.values()) for _, seg in rows))
        labels = [label for label, _ in rows][::-1]
        left = np.zeros(len(rows))
        for colour, name in zip(segment_colours, rows[0][1]):
            widths = np.array([seg[name] for _, seg in rows][::-1]) / scale
            ax.barh(labels, widths, left=left, color=colour, label=name, height=0.6)
            left += widths
        for y, total in enumerate(left):
            ax.annotate(f"{total:.1f} {short}", (total, y), xytext=(3, 0), textcoords="offset points", va="center", fontsize=8)
        ax.set_xlim(0, float(left.max()) * 1.15 + 1e-9)
        ax.set_xlabel(f"wall time ({unit})")
        _legend_below(ax, ncol=2)
    else:
        ax.text(0.5, 0.5, "no step logs", ha="center", va="center", transform=ax.transAxes)
    ax.set_title("Measured wall time per stage and arm (sum over its steps)")
    ax.grid(axis="y", visible=False)
    if projection:
        ax = axes[1]
        phases = projection.get("phases", {})
        budget = projection.get("budget_wall_seconds") or 0.0
        unit, short, scale = _unit(max(projection.get("wall_seconds", 0.0), budget))
        left = 0.0
        phase_colours = {"setup": "#8c959f", "train": "#0969da", "eval": "#1a7f37", "reserve": "#d0d7de"}
        for name, seconds in phases.items():
            ax.barh(["projected full run"], [seconds / scale], left=left, color=phase_colours.get(name, "#bf3989"),
                    label=f"{name} {seconds / scale:.1f} {short}", height=0.5)  # fmt: skip
            left += seconds / scale
        ax.annotate(f"{left:.1f} {short}", (left, 0), xytext=(3, 0), textcoords="offset points", va="center", fontsize=8)
        train_measured = [float(np.sum(_column(logs.metrics, "step_seconds"))) for logs in data.logs.get("train", {}).values() if logs.metrics is not None]
        if train_measured:
            ax.barh(["measured training\n(slowest arm)"], [max(train_measured) / scale], color="#0969da", alpha=0.5, height=0.5)
            ax.annotate(f"{max(train_measured) / scale:.1f} {short}", (max(train_measured) / scale, 1), xytext=(3, 0),
                        textcoords="offset points", va="center", fontsize=8)  # fmt: skip
        if budget:
            ax.axvline(budget / scale, color=STOPPED_COLOUR, linestyle="--", linewidth=1.5, label=f"wall budget {budget / scale:.1f} {short}")
        ax.set_xlabel(f"wall time ({unit})")
        ax.set_title(f"Projection vs wall budget: {projection.get('status', '?')}")
        _legend_below(ax, ncol=2)
        ax.grid(axis="y", visible=False)
    return fig, ""


PLOTTERS = {
    "reward_per_step": plot_reward_per_step,
    "advantage_baseline": plot_advantage_baseline,
    "effective_neighbours": plot_effective_neighbours,
    "eval_accuracy": plot_eval_accuracy,
    "wall_time": plot_wall_time,
}
CAPTIONS = {
    "reward_per_step": "Mean training reward of each step's rollouts, per arm. Both arms see the same number of rollouts per step.",
    "advantage_baseline": "Per-rollout advantage A = r − b and baseline b. GRPO's baseline is the group mean; GS1's is the kernel-weighted mean reward of other prompts' rollouts in the window.",
    "effective_neighbours": "How many other rollouts the GS1 kernel baseline effectively averages over, (Σw)²/Σw² (at most the window size − 1). The activation gate needs its 10th percentile over the pilot's rollouts at or above the red line.",
    "eval_accuracy": "Left: greedy eval accuracy per arm. Right: the paired difference with its one-sided Hoeffding bounds; noninferior when the lower bound is above the margin, inferior when the upper bound is below it, else inconclusive.",
    "wall_time": "Measured wall time per stage and arm, summed over its steps (model setup from the pilot's timings; eval time is not logged). When the feasibility stage ran: its projection of the full run from the pilot (arms in parallel, plus a recovery reserve), against the wall budget.",
}


def render_plots(data: RunData) -> dict[str, tuple[bytes | None, str]]:
    """name -> (PNG bytes, '') or (None, why it was not drawn)."""
    out = {}
    with matplotlib.style.context("default"), matplotlib.rc_context(STYLE):
        for name in PLOTS:
            fig, why = PLOTTERS[name](data)
            out[name] = (_png_bytes(fig), "") if fig is not None else (None, why)
    return out


# ---------------------------------------------------------------------------------------------
# Page content shared by HTML and markdown


def headline(data: RunData, statuses: list[StageStatus]) -> dict:
    """The verdict line: the decision when there is one, else where and why the flow stopped."""
    d = data.decision
    if data.stopped:
        earlier = " A decision.json in this directory is from an earlier run, not this one." if d else ""
        return {
            "label": "NO DECISION: STOPPED AT A GATE" if "gate '" in data.stopped else "NO DECISION: THE RUN FAILED",
            "colour": STOPPED_COLOUR,
            "text": f"This run ended Failed: {data.stopped}.{earlier}",
        }
    if d:
        verdict = d.get("verdict", "?")
        how = {
            "noninferior": f"the lower bound {d['lower']:+.4f} is above the margin {d['margin']:+.4f}",
            "inferior": f"the upper bound {d['upper']:+.4f} is below the margin {d['margin']:+.4f}",
            "inconclusive": f"the margin {d['margin']:+.4f} lies between the bounds [{d['lower']:+.4f}, {d['upper']:+.4f}]",
        }.get(verdict, "")
        return {
            "label": verdict.upper(),
            "colour": VERDICT_COLOURS.get(verdict, PENDING_COLOUR),
            "text": f"{d.get('treatment')} − {d.get('baseline')} accuracy: mean difference {d['mean_diff']:+.4f}; {how} "
            f"(paired Hoeffding, n={d['n']}, α={d['alpha']:g}).",
        }
    stop = _stopping_gate(data)
    if stop:
        return {
            "label": "NO DECISION: STOPPED AT A GATE",
            "colour": STOPPED_COLOUR,
            "text": f"The {_gate_title(stop)} failed: {failing_text(data.gates[stop])}. Later stages did not run.",
        }
    last = next((s for s in reversed(statuses) if s.status not in ("not run", "skipped")), statuses[0])
    return {
        "label": "NO DECISION YET",
        "colour": PENDING_COLOUR,
        "text": f"No stage failed a gate; the last stage with a record is {last.title} ({last.status}). "
        "The flow may still be running, or stopped with an error (see the flow run's logs).",
    }


def earlier_decision_text(d: dict) -> str:
    """For a run that ended Failed: the decision.json on file is an earlier run's."""
    return (f"No decision in this run (it ended Failed). This directory holds an earlier run's decision.json: "
            f"{d.get('verdict', '?').upper()}, mean difference {d.get('mean_diff', float('nan')):+.4f}, n={d.get('n')}.")


def arm_rows(data: RunData) -> list[dict]:
    revised = None
    if data.revised_spec:
        for rev in data.revised_spec.get("revisions", []):
            revised = rev.get("change", {})
    rows = []
    for arm in data.plan.get("arms", []):
        prompts, rollouts = arm.get("groups_per_batch"), arm.get("group_size")
        kernel = "—"
        if arm.get("advantage") == KERNEL_ADVANTAGE:
            k = arm.get("kernel") or {}
            bw = fmt(k.get("bandwidth"))
            if revised and revised.get("arm") == arm["name"] and "kernel.bandwidth" in revised:
                bw = f"{bw} → {fmt(revised['kernel.bandwidth'])} (calibration)"
            kernel = f"{k.get('family')}, h={bw}, window {k.get('window')}, features {', '.join(k.get('features') or [])}"
        rows.append({
            "arm": arm["name"],
            "role": data.role(arm["name"]) or "",
            "advantage": arm.get("advantage"),
            "prompts × rollouts per step": f"{prompts} × {rollouts} = {(prompts or 0) * (rollouts or 0)}",
            "steps": fmt(arm.get("steps")),
            "lr": fmt(arm.get("lr")),
            "LoRA rank": fmt(arm.get("lora_rank")),
            "max tokens": fmt(arm.get("max_tokens")),
            "temperature": fmt(arm.get("temperature")),
            "seed": fmt(arm.get("seed")),
            "kernel": kernel,
        })  # fmt: skip
    return rows


def spec_facts(data: RunData) -> list[tuple[str, str]]:
    plan, spec = data.plan, data.spec or {}
    run, decision, budget = plan.get("run", {}), plan.get("decision", {}), plan.get("budget", {})
    facts = [
        ("title", plan.get("title", "")),
        ("model", f"{run.get('base_model')} (renderer {run.get('renderer')})"),
        ("environment", str(run.get("env"))),
        ("treatment vs baseline", f"{run.get('treatment')} vs {run.get('baseline')}"),
        ("eval items", fmt(plan.get("n_eval"))),
        ("decision rule", f"{decision.get('method', 'paired_hoeffding')}: noninferior when the one-sided lower bound at α={fmt(decision.get('alpha'))} exceeds the margin {fmt(decision.get('margin'))}"),
        ("budget", f"{fmt(budget.get('max_wall_minutes'))} wall minutes, {fmt(budget.get('gpu_hours'))} GPU hours"),
    ]  # fmt: skip
    if spec.get("hypothesis"):
        facts.append(("hypothesis", spec["hypothesis"]))
    return facts


def gate_sections(data: RunData) -> list[tuple[str, str, list[dict]]]:
    """(gate key, title, rows with 'measures' and 'needs') in flow order."""
    out = []
    for key in GATE_FILES:
        rows = data.gates.get(key)
        if rows is None:
            continue
        shown = []
        for r in rows:
            check = data.check_for(r["metric"]) or {}
            shown.append({**r, "needs": needs_text(r), "measures": check.get("measures", "")})
        out.append((key, _gate_title(key), shown))
    return out


def decision_lines(d: dict) -> list[tuple[str, str]]:
    """The decision's numbers, each with a one-line explanation."""
    lines = [
        ("mean difference", f"{d['mean_diff']:+.4f}: mean over {d['n']} paired eval items of (treatment correct − baseline correct)"),
        ("Hoeffding bounds", f"[{d['lower']:+.4f}, {d['upper']:+.4f}]: one-sided bounds at α={d['alpha']:g} each; the lower one decides noninferiority"),
        ("margin", f"{d['margin']:+.4f}: the pre-registered noninferiority margin"),
        ("n", f"{d['n']} eval items answered by both arms"),
    ]  # fmt: skip
    if d.get("treatment_mean") is not None:
        lines.append(("arm accuracies", f"{d.get('treatment')} {d['treatment_mean']:.4f}, {d.get('baseline')} {d['baseline_mean']:.4f}"))
    boot = d.get("bootstrap_ci") or {}
    if d.get("bootstrap_lower") is not None:
        lines.append(("bootstrap CI", f"[{d['bootstrap_lower']:+.4f}, {d['bootstrap_upper']:+.4f}]: percentile CI at {boot.get('confidence', 1 - 2 * d['alpha']):.0%} "
                      f"from {boot.get('n_resamples', 'n/a')} paired resamples; descriptive, tighter than Hoeffding, does not decide"))  # fmt: skip
    mc = d.get("mcnemar") or {}
    if d.get("mcnemar_p") is not None:
        lines.append(("McNemar p", f"{d['mcnemar_p']:.4g}: exact two-sided test of any difference on the {mc.get('n_discordant', '?')} items the arms disagree on "
                      f"({mc.get('b', '?')} only treatment right, {mc.get('c', '?')} only baseline right); not a noninferiority test"))  # fmt: skip
    if d.get("min_noninferior_true_diff") is not None:
        lines.append(("smallest detectable", f"{d['min_noninferior_true_diff']:+.4f}: the smallest true difference this rule can call noninferior at n={d['n']} (margin + Hoeffding radius)"))
    return lines


# ---------------------------------------------------------------------------------------------
# HTML

CSS = """
body{font-family:-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;color:#1f2328;max-width:1160px;margin:24px auto;padding:0 20px;line-height:1.45}
h1{font-size:26px;margin:0 0 4px} h2{font-size:20px;margin:32px 0 10px;border-bottom:1px solid #d0d7de;padding-bottom:4px}
h3{font-size:16px;margin:18px 0 6px} .sub{color:#57606a;margin:0 0 16px}
.verdict{border:3px solid;border-radius:10px;padding:16px 22px;margin:16px 0}
.verdict .label{font-size:40px;font-weight:800;letter-spacing:.5px}
.verdict .text{font-size:16px;margin-top:6px}
table{border-collapse:collapse;margin:6px 0 12px;font-size:14px}
th,td{border:1px solid #d0d7de;padding:4px 10px;text-align:left;vertical-align:top}
th{background:#f6f8fa} td.num{text-align:right;font-variant-numeric:tabular-nums}
.badge{display:inline-block;border-radius:4px;padding:1px 8px;font-weight:700;font-size:12px;color:#fff}
.pass{background:#1a7f37} .fail{background:#cf222e} .done{background:#0969da} .skip{background:#8c959f}
.notrun{background:#57606a} .incomplete{background:#9a6700}
tr.failrow td{background:#ffebe9} tr.passrow td.status{background:#dafbe1}
figure{margin:12px 0 24px} figure img{max-width:100%;border:1px solid #d0d7de}
figcaption{color:#57606a;font-size:13px;margin-top:4px} .missing{color:#57606a;font-style:italic}
.problems{background:#fff8c5;border:1px solid #d4a72c;padding:8px 12px;border-radius:6px}
"""

STATUS_BADGES = {
    "passed": ("PASSED", "pass"),
    "failed": ("FAILED", "fail"),
    "pass": ("PASS", "pass"),
    "fail": ("FAIL", "fail"),
    "done": ("DONE", "done"),
    "skipped": ("SKIPPED", "skip"),
    "not run": ("NOT RUN", "notrun"),
    "incomplete": ("INCOMPLETE", "incomplete"),
    "earlier run": ("EARLIER RUN", "notrun"),
}


def _e(text) -> str:
    return html.escape(str(text), quote=True)


def _badge(status: str) -> str:
    label, cls = STATUS_BADGES[status]
    return f'<span class="badge {cls}">{label}</span>'


def _table(header: list[str], rows: list[list[str]], row_classes: list[str] | None = None) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{row_classes[i]}"' if row_classes and row_classes[i] else ""
        body.append(f"<tr{cls}>" + "".join(row) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _td(text, cls: str = "") -> str:
    return f'<td class="{cls}">{_e(text)}</td>' if cls else f"<td>{_e(text)}</td>"


def render_html(data: RunData, statuses: list[StageStatus], plots: dict[str, tuple[bytes | None, str]]) -> str:
    head = headline(data, statuses)
    title = data.plan.get("title", data.run_dir.name)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_e(title)}: gs1 report</title><style>{CSS}</style></head><body>",
        f"<h1>{_e(title)}</h1>",
        f'<p class="sub">gs1 run report · run directory <code>{_e(data.run_dir.name)}</code></p>',
        f'<div class="verdict" style="border-color:{head["colour"]}">'
        f'<div class="label" style="color:{head["colour"]}">{_e(head["label"])}</div>'
        f'<div class="text">{_e(head["text"])}</div></div>',
    ]
    if data.problems:
        items = "".join(f"<li>{_e(p)}</li>" for p in data.problems)
        parts.append(f'<div class="problems"><b>Unreadable files (treated as missing):</b><ul>{items}</ul></div>')

    parts.append("<h2>Stages</h2>")
    parts.append(_table(
        ["stage", "status", "detail"],
        [[_td(s.title), f"<td>{_badge(s.status)}</td>", _td(s.detail)] for s in statuses],
        ["failrow" if s.status == "failed" else "" for s in statuses],
    ))  # fmt: skip

    parts.append("<h2>Spec</h2>")
    parts.append(_table(["", ""], [[f"<th>{_e(k)}</th>", _td(v)] for k, v in spec_facts(data)]).replace("<thead><tr><th></th><th></th></tr></thead>", ""))
    arms = arm_rows(data)
    if arms:
        header = list(arms[0])
        parts.append("<h3>Arms</h3>")
        parts.append(_table(header, [[_td(r[h], "num" if h in ("steps", "lr", "LoRA rank", "max tokens", "temperature", "seed") else "") for h in header] for r in arms]))

    parts.append("<h2>Decision</h2>")
    d = data.decision
    if d and data.stopped:
        parts.append(f'<p class="missing">{html.escape(earlier_decision_text(d), quote=False)}</p>')
    elif d:
        parts.append(
            f'<p style="font-size:30px;font-weight:800;color:{head["colour"]};margin:4px 0">{_e(d["verdict"].upper())}</p>'
        )
        parts.append(_table(["quantity", "value and meaning"], [[f"<th>{_e(k)}</th>", _td(v)] for k, v in decision_lines(d)]))
    else:
        decision_status = next(s for s in statuses if s.key == "decision")
        parts.append(f'<p class="missing">No decision: {_e(decision_status.detail.removeprefix("not run: "))}.</p>')

    parts.append("<h2>Gates</h2>")
    sections = gate_sections(data)
    if not sections:
        parts.append('<p class="missing">No gate has a record yet.</p>')
    for key, gate_title, rows in sections:
        passed = gate_passed(rows)
        parts.append(f"<h3>{_e(gate_title)} {_badge('passed' if passed else 'failed')}</h3>")
        with_measures = any(r["measures"] for r in rows)
        header = ["metric", "value", "needs", "result"] + (["measures"] if with_measures else [])
        cells = []
        for r in rows:
            row = [_td(r["metric"]), _td(fmt(r["value"]), "num"), _td(r["needs"]),
                   f'<td class="status">{_badge("pass" if r["passed"] else "fail")}</td>']  # fmt: skip
            cells.append(row + ([_td(r["measures"])] if with_measures else []))
        parts.append(_table(header, cells, ["failrow" if not r["passed"] else "passrow" for r in rows]))
    missing_gates = [s for s in statuses if s.key in GATE_FILES and s.key not in data.gates]
    for s in missing_gates:
        parts.append(f'<p class="missing">{_e(_gate_title(s.key))}: {_e(s.detail)}</p>')

    parts.append("<h2>Plots</h2>")
    for name in PLOTS:
        png, why = plots[name]
        parts.append(f"<h3>{_e(PLOT_TITLES[name])}</h3>")
        if png is None:
            parts.append(f'<p class="missing">Not drawn: {_e(why)}.</p>')
            continue
        uri = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
        parts.append(f'<figure><img alt="{_e(PLOT_TITLES[name])}" src="{uri}"><figcaption>{_e(CAPTIONS[name])}</figcaption></figure>')
    parts.append("</body></html>\n")
    return "\n".join(parts)


# ---------------------------------------------------------------------------------------------
# Markdown


def _md(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_markdown(data: RunData, statuses: list[StageStatus], plots: dict[str, tuple[bytes | None, str]], html_name: str = "report.html") -> str:
    head = headline(data, statuses)
    lines = [f"# {data.plan.get('title', data.run_dir.name)}", "", f"## {head['label']}", "", head["text"], ""]
    lines += [f"Full report (self-contained): `{html_name}`", ""]
    if data.problems:
        lines += ["**Unreadable files (treated as missing):**", ""] + [f"- {p}" for p in data.problems] + [""]
    lines += ["## Stages", "", "| stage | status | detail |", "|---|---|---|"]
    lines += [f"| {_md(s.title)} | **{STATUS_BADGES[s.status][0]}** | {_md(s.detail)} |" for s in statuses]
    lines += ["", "## Spec", "", "| | |", "|---|---|"] + [f"| {_md(k)} | {_md(v)} |" for k, v in spec_facts(data)]
    arms = arm_rows(data)
    if arms:
        header = list(arms[0])
        lines += ["", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(_md(r[h]) for h in header) + " |" for r in arms]
    lines += ["", "## Decision", ""]
    if data.decision and data.stopped:
        lines += [earlier_decision_text(data.decision)]
    elif data.decision:
        lines += [f"**{data.decision['verdict'].upper()}**", "", "| quantity | value and meaning |", "|---|---|"]
        lines += [f"| {_md(k)} | {_md(v)} |" for k, v in decision_lines(data.decision)]
    else:
        lines += [f"No decision: {next(s for s in statuses if s.key == 'decision').detail.removeprefix('not run: ')}."]
    lines += ["", "## Gates", ""]
    for key, gate_title, rows in gate_sections(data):
        lines += [f"### {gate_title}: {'PASSED' if gate_passed(rows) else 'FAILED'}", "",
                  "| metric | value | needs | result |", "|---|---|---|---|"]  # fmt: skip
        lines += [f"| {_md(r['metric'])} | {fmt(r['value'])} | {_md(r['needs'])} | {'PASS' if r['passed'] else '**FAIL**'} |" for r in rows]
        lines.append("")
    lines += ["## Plots", ""]
    for name in PLOTS:
        png, why = plots[name]
        if png is None:
            lines += [f"- {PLOT_TITLES[name]}: not drawn ({why})"]
        else:
            lines += [f"![{PLOT_TITLES[name]}]({name}.png)", "", f"*{CAPTIONS[name]}*", ""]
    return "\n".join(lines).rstrip() + "\n"


def embedded_markdown(out_dir: str | Path) -> str:
    """report.md with its PNG links replaced by data URIs (for a Prefect markdown artifact)."""
    out_dir = Path(out_dir)
    text = (out_dir / "report.md").read_text(encoding="utf-8")
    for name in PLOTS:
        png = out_dir / f"{name}.png"
        if png.is_file():
            uri = "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode("ascii")
            text = text.replace(f"]({name}.png)", f"]({uri})")
    return text


# ---------------------------------------------------------------------------------------------
# Writing


def _write_bytes_atomic(path: Path, payload: bytes) -> Path:
    return write_bytes_atomic(path, payload)


def write_report(run_dir: str | Path, out_dir: str | Path | None = None, stopped: str | None = None) -> dict:
    """Render `run_dir` into `out_dir` (default `<run_dir>/report/`): PNG plots, report.html
    (self-contained) and report.md. Returns the paths, the verdict (or None) and the stage
    statuses. A missing run directory or one without spec/plan.json is a UserError.
    `stopped`: the error that ended the flow run rendering this page (its headline then)."""
    data = load_run(run_dir)
    data.stopped = stopped
    out = Path(out_dir) if out_dir is not None else data.run_dir / "report"
    if out.exists() and not out.is_dir():
        raise UserError(f"{out}: exists and is not a directory")
    statuses = stage_statuses(data)
    plots = render_plots(data)
    written: dict[str, str] = {}
    for name, (png, _) in plots.items():
        path = out / f"{name}.png"
        if png is None:
            if path.is_file():  # a plot from an earlier render whose data is gone would mislead
                path.unlink()
            continue
        written[name] = str(_write_bytes_atomic(path, png))
    html_path = write_text_atomic(out / "report.html", render_html(data, statuses, plots))
    md_path = write_text_atomic(out / "report.md", render_markdown(data, statuses, plots))
    head = headline(data, statuses)
    stop = _stopping_gate(data)
    return {
        "out_dir": str(out),
        "html": str(html_path),
        "markdown": str(md_path),
        "plots": written,
        "not_drawn": {name: why for name, (png, why) in plots.items() if png is None},
        "verdict": data.decision.get("verdict") if data.decision and not stopped else None,
        "headline": f"{head['label']}: {head['text']}",
        "stopped_at": stop,
        "stages": {s.key: s.status for s in statuses},
        "problems": list(data.problems),
    }
