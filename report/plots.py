"""The report's plots: matplotlib's object API on the Agg canvas (no pyplot, no global backend).

    plots = render_plots(data)     # one RenderedPlot per entry of PLOT_SPECS, in page order

A plot with no data behind it is not drawn; its RenderedPlot says why. Deterministic: fixed
style, no timestamps in the PNG metadata.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import matplotlib
import matplotlib.style
import numpy as np
import pyarrow as pa
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, MultipleLocator

from report.model import KERNEL_P10_METRIC, ArmLogs, RunData
from report.palette import PENDING_COLOUR, STOPPED_COLOUR, arm_colour, colour_for, verdict_colour
from report.status import steps_text
from report.units_model import UnitsStanding, seeds_text
from rules import DEFAULT_METHOD, rule_for
from schemas.gate_text import fmt

SOURCE_STYLES = {"pilot": ":", "calibration": "--", "train": "-"}
SOURCE_TITLES = {"pilot": "pilot", "calibration": "calibration pilot", "train": "full run"}

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
        if data.arm_logs(source):
            return source, data.arm_logs(source)
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
        plan = data.arm_plan(arm)
        per_step = plan.batch_size if plan else 0
        label = f"{arm} ({data.role(arm) or 'arm'}" + (f", {per_step} rollouts/step)" if per_step else ")")
        ax.plot(steps, mean, marker="o", markersize=4, color=arm_colour(data, arm), label=label)
        n_R = np.full(len(steps), float(per_step)) if per_step else np.maximum(_column(m, "num_datums"), 1.0)
        sem = _column(m, "reward_std") / np.sqrt(n_R)
        if steps.size > 1:
            ax.fill_between(steps, mean - sem, mean + sem, color=arm_colour(data, arm), alpha=0.15, linewidth=0)
        else:  # a band needs two steps
            ax.errorbar(steps, mean, yerr=sem, color=arm_colour(data, arm), alpha=0.5, capsize=6, linewidth=1.5)
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
            ax.hist(v, bins=bins, histtype="stepfilled", alpha=0.35, color=arm_colour(data, a), edgecolor=arm_colour(data, a),
                    linewidth=1.2, label=f"{a} (n={v.size}{extra})")
        ax.set_xlabel(what)
        ax.set_ylabel("rollouts")
        ax.set_title(f"{column.capitalize()} per rollout, {SOURCE_TITLES[source]}")
        _legend_below(ax, ncol=1)
    return fig, ""


def plot_effective_neighbours(data: RunData) -> tuple[Figure | None, str]:
    series = []  # (source, arm, neighbours_R, steps, p10_per_step)
    for source in ("pilot", "calibration", "train"):
        for arm, logs in data.arm_logs(source).items():
            eff = _column(logs.rollouts, "effective_neighbors")
            eff = eff[~np.isnan(eff)]
            p10 = _column(logs.metrics, "effective_neighbors_p10")
            steps = _column(logs.metrics, "step")
            keep = ~np.isnan(p10)
            if eff.size or keep.any():
                series.append((source, arm, eff, steps[keep], p10[keep]))
    if not series:
        return None, "no kernel-arm rollouts logged (the pilot did not run, or no arm uses the kernel baseline)"
    check = data.check_for(KERNEL_P10_METRIC)
    bound = check.min if check else None
    fig, (left, right) = _figure(11, 4, ncols=2)
    every = np.concatenate([s[2] for s in series if s[2].size]) if any(s[2].size for s in series) else np.array([0.0, 1.0])
    bins = np.linspace(0.0, max(float(every.max()), float(bound or 0)) * 1.02 + 1e-9, 41)
    for source, arm, eff, steps, p10 in series:
        colour, style = arm_colour(data, arm), SOURCE_STYLES[source]
        label = f"{arm}, {SOURCE_TITLES[source]}"
        if eff.size:
            p10_all = float(np.percentile(eff, 10))
            left.hist(eff, bins=bins, histtype="step", linestyle=style, linewidth=1.6, color=colour,
                      label=f"{label} (n={eff.size}, p10 {p10_all:.1f})")
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
    accuracy = [data.evals[a].accuracy for a in arms]
    bars = ax.bar(arms, accuracy, color=[arm_colour(data, a) for a in arms], width=0.6)
    for bar, a, acc in zip(bars, arms, accuracy):
        ax.annotate(f"{acc:.3f}\n({data.evals[a].n_correct}/{data.evals[a].n})", (bar.get_x() + bar.get_width() / 2, acc),
                    xytext=(0, 3), textcoords="offset points", ha="center", va="bottom")
    ax.set_ylim(0, min(1.0, max(accuracy) * 1.3 + 0.1))
    ax.set_ylabel("eval accuracy (greedy, final weights)")
    ax.set_title("Eval accuracy per arm" + (" and seed" if data.plan.multi_seed else ""))
    if len(arms) > 4:  # arm x seed units: slanted names stay apart
        ax.tick_params(axis="x", labelrotation=30)
        for label in ax.get_xticklabels():
            label.set_horizontalalignment("right")
    ax.grid(axis="x", visible=False)
    if d:
        ax = axes[1]
        verdict = d.verdict
        colour = verdict_colour(verdict)
        lower, upper, mean, margin = d.lower, d.upper, d.mean_diff, d.margin
        ax.errorbar([mean], [1], xerr=[[mean - lower], [upper - mean]], fmt="o", color=colour, capsize=6,
                    linewidth=2.5, markersize=8, label=f"mean diff {mean:+.3f}, {d.rule.bounds_name} [{lower:+.3f}, {upper:+.3f}]")
        boot_lo, boot_hi = d.bootstrap_lower, d.bootstrap_upper
        if boot_lo is not None and boot_hi is not None:
            ax.errorbar([mean], [0], xerr=[[mean - boot_lo], [boot_hi - mean]], fmt="o", color="#8c959f", capsize=4,
                        linewidth=1.5, markersize=5, label=f"bootstrap {1 - 2 * d.alpha:.0%} CI [{boot_lo:+.3f}, {boot_hi:+.3f}] (descriptive)")
        ax.axvline(margin, color=STOPPED_COLOUR, linestyle="--", linewidth=1.5, label=f"noninferiority margin {margin:+.3f}")
        ax.axvline(0.0, color="#57606a", linewidth=0.8)
        ax.set_yticks([0, 1], ["bootstrap", f"{d.rule.method}\n(decides)"])
        ax.set_ylim(-0.8, 1.8)
        ax.set_xlabel(f"accuracy difference {d.treatment or 'treatment'} − {d.baseline or 'baseline'}  (n={d.n} paired items)")
        ax.set_title(f"Paired difference, α={d.alpha:g} each side: {verdict.upper()}", color=colour, fontweight="bold")
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=1)
    return fig, ""


def _time_rows(data: RunData) -> list[tuple[str, dict[str, float]]]:
    """(label, {segment: seconds}) per stage per arm, from the step logs and the pilot timings."""
    rows = []
    for source in ("pilot", "calibration", "train"):
        stage = data.logs.get(source)
        setup = stage.timings.setup_seconds if stage and stage.timings else {}
        for arm in data.arm_names:
            logs = data.arm_logs(source).get(arm)
            if logs is None or logs.metrics is None:
                continue
            step, sample, train = (float(np.sum(_column(logs.metrics, c))) for c in ("step_seconds", "sample_seconds", "train_seconds"))
            segments = {
                "model setup": float(setup.get(arm, 0.0)),
                "sampling": sample,
                "forward_backward + optim_step": train,
                "other (advantages, logging)": max(step - sample - train, 0.0),
            }
            rows.append((f"{SOURCE_TITLES[source]} · {arm} ({steps_text(logs.steps_logged)})", segments))
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
        phases = projection.phases
        budget = projection.budget_wall_seconds or 0.0
        unit, short, scale = _unit(max(projection.wall_seconds, budget))
        left = 0.0
        phase_colours = {"setup": "#8c959f", "train": "#0969da", "eval": "#1a7f37", "reserve": "#d0d7de"}
        for name, seconds in phases.items():
            ax.barh(["projected full run"], [seconds / scale], left=left, color=phase_colours.get(name, "#bf3989"),
                    label=f"{name} {seconds / scale:.1f} {short}", height=0.5)
            left += seconds / scale
        ax.annotate(f"{left:.1f} {short}", (left, 0), xytext=(3, 0), textcoords="offset points", va="center", fontsize=8)
        train_measured = [float(np.sum(_column(logs.metrics, "step_seconds"))) for logs in data.arm_logs("train").values() if logs.metrics is not None]
        if train_measured:
            ax.barh(["measured training\n(slowest arm)"], [max(train_measured) / scale], color="#0969da", alpha=0.5, height=0.5)
            ax.annotate(f"{max(train_measured) / scale:.1f} {short}", (max(train_measured) / scale, 1), xytext=(3, 0),
                        textcoords="offset points", va="center", fontsize=8)
        if budget:
            ax.axvline(budget / scale, color=STOPPED_COLOUR, linestyle="--", linewidth=1.5, label=f"wall budget {budget / scale:.1f} {short}")
        ax.set_xlabel(f"wall time ({unit})")
        ax.set_title(f"Projection vs wall budget: {projection.status}")
        _legend_below(ax, ncol=2)
        ax.grid(axis="y", visible=False)
    return fig, ""


# ---------------------------------------------------------------------------------------------
# A units folder's plots (`gs1 decide --units`): the sweep's arms over the seeds in so far

def _units_colours(standing: UnitsStanding) -> dict[str, str]:
    others = [a.arm for a in standing.arms if not a.role]
    return {a.arm: colour_for(a.arm, a.role, others) for a in standing.arms}


def _baseline(standing: UnitsStanding) -> str:
    return next(a.arm for a in standing.arms if a.role == "baseline")


def plot_units_accuracy(standing: UnitsStanding) -> tuple[Figure | None, str]:
    arms = [a for a in standing.arms if a.seed_accuracy]
    if not arms:
        return None, "no unit evaluated yet"
    colours, baseline = _units_colours(standing), _baseline(standing)
    fig, (ax, diff_ax) = _figure(12, 4.2, ncols=2)
    names = [a.arm for a in arms]
    ax.bar(names, [a.accuracy for a in arms], color=[colours[a.arm] for a in arms], width=0.6, alpha=0.8)
    for x, a in enumerate(arms):
        seeds = list(a.seed_accuracy.items())
        ax.scatter([x] * len(seeds), [acc for _, acc in seeds], color="black", s=14, zorder=3)
        ax.annotate(f"{a.accuracy:.3f}", (x, a.accuracy), xytext=(0, 3), textcoords="offset points", ha="center", va="bottom")
    lo = min(acc for a in arms for acc in a.seed_accuracy.values())
    ax.set_ylim(max(0.0, lo - 0.1), min(1.0, max(a.accuracy for a in arms) + 0.06))
    ax.set_ylabel("eval accuracy (greedy, final weights)")
    ax.set_title("Accuracy per arm (bar: mean over its seeds; dots: each seed's unit)")
    ax.tick_params(axis="x", labelrotation=25)
    for label in ax.get_xticklabels():
        label.set_horizontalalignment("right")
    ax.grid(axis="x", visible=False)
    paired = [a for a in arms if a.pair is not None]
    if not paired:
        diff_ax.text(0.5, 0.5, f"no arm paired with {baseline} yet", ha="center", va="center", transform=diff_ax.transAxes)
        return fig, ""
    margin = paired[0].pair["margin"]
    for y, a in enumerate(reversed(paired)):
        p = a.pair
        final = p["verdict"] != "interim"
        colour = verdict_colour(p["verdict"]) if final else PENDING_COLOUR
        if p.get("lower") is None:  # interim, and the rule cannot read that few seeds: the point alone
            diff_ax.plot([p["mean_diff"]], [y], "o", color=colour, markersize=6)
            diff_ax.annotate(f"{p['mean_diff']:+.3f} (no bounds yet)", (p["mean_diff"], y), xytext=(6, 0),
                             textcoords="offset points", va="center", fontsize=8)
            continue
        diff_ax.errorbar([p["mean_diff"]], [y], xerr=[[p["mean_diff"] - p["lower"]], [p["upper"] - p["mean_diff"]]], fmt="o",
                         color=colour, capsize=5, linewidth=2, markersize=6)
        diff_ax.annotate(f"{p['mean_diff']:+.3f} [{p['lower']:+.3f}, {p['upper']:+.3f}]"
                         + (f" {p['verdict']}" if final else ""), (p["upper"], y), xytext=(6, 0), textcoords="offset points",
                         va="center", fontsize=8)
    diff_ax.set_yticks(range(len(paired)), [f"{a.arm}\n({seeds_text(a.common_seeds)})" for a in reversed(paired)])
    diff_ax.axvline(margin, color=STOPPED_COLOUR, linestyle="--", linewidth=1.5, label=f"noninferiority margin {margin:+.3f}")
    diff_ax.axvline(0.0, color="#57606a", linewidth=0.8)
    width = max(abs(v) for a in paired for v in (a.pair["lower"], a.pair["upper"], a.pair["mean_diff"], margin)
                if v is not None)
    diff_ax.set_xlim(-width - 0.02, width + 0.09)
    diff_ax.set_xlabel(f"arm − {baseline}, paired items (bars: {rule_for(paired[0].pair.get('method') or DEFAULT_METHOD).bounds_name})")
    final = paired[0].pair["verdict"] != "interim"
    diff_ax.set_title(f"Against {baseline}: " + ("Holm's verdicts" if final else "interim, unadjusted (grey)"))
    diff_ax.grid(axis="y", visible=False)
    _legend_below(diff_ax, ncol=1)
    return fig, ""


def plot_units_reward(standing: UnitsStanding) -> tuple[Figure | None, str]:
    arms = [a for a in standing.arms if a.rewards]
    if not arms:
        return None, "no unit has step metrics"
    colours = _units_colours(standing)
    seeds = sorted({s for a in arms for s in a.rewards})
    fig, axes = _figure(min(6 + 5 * len(seeds), 16), 4.5, ncols=len(seeds))
    every = [r for a in arms for rewards in a.rewards.values() for r in rewards]
    for ax, seed in zip(axes, seeds):  # one panel per seed: its arms saw the same prompt order
        all_steps = []
        for a in arms:
            rewards = a.rewards.get(seed)
            if not rewards:
                continue
            steps = np.arange(1, len(rewards) + 1, dtype=np.float64)
            all_steps.append(steps)
            window = min(5, len(rewards))  # a step's mean of 64 rollouts is noisy: its trailing 5-step mean drawn bold
            smooth = np.convolve(rewards, np.ones(window) / window, mode="valid")
            ax.plot(steps, rewards, color=colours[a.arm], linewidth=0.8, alpha=0.35)
            ax.plot(steps[window - 1:], smooth, color=colours[a.arm], linewidth=2, label=a.arm)
        ax.set_ylim(min(every) - 0.03, max(every) + 0.03)
        ax.set_xlabel("training step")
        ax.set_title(f"seed {seed}")
        _step_axis(ax, all_steps)
        _legend_below(ax, ncol=3)
    axes[0].set_ylabel("mean training reward of the step's rollouts")
    fig.suptitle("Training reward per step, per arm and seed (thin: each step; bold: trailing 5-step mean)")
    return fig, ""


UNIT_COSTS = (("sampler_tokens", "sampler tokens"), ("trainer_tokens", "trainer tokens"), ("model_calls", "model calls"),
              ("wall_seconds", "wall time"))


def plot_units_cost(standing: UnitsStanding) -> tuple[Figure | None, str]:
    arms = [a for a in standing.arms if a.role != "baseline" and a.relative_cost]
    if not arms:
        return None, "no arm has a unit at a seed the baseline has"
    baseline = _baseline(standing)
    colours = ["#8c959f", "#0969da", "#e16f24", "#1a7f37"]
    fig, (ax,) = _figure(10, 1.2 + 0.9 * len(arms))
    height = 0.8 / len(UNIT_COSTS)
    for k, ((key, label), colour) in enumerate(zip(UNIT_COSTS, colours)):
        ys, widths, notes = [], [], []
        for y, a in enumerate(reversed(arms)):
            # wall time only over the seeds at which the two shared the GPU alike
            value = a.wall_ratio if key == "wall_seconds" else a.relative_cost.get(key)
            if key == "wall_seconds" and a.wall_ratio is None:
                ax.annotate("wall: ran apart", (0.02, y - (k - 1.5) * height), va="center", fontsize=7, color="#57606a")
                continue
            if value is not None:
                ys.append(y - (k - 1.5) * height)  # first measure on top, as in the legend
                widths.append(value)
                partial = key == "wall_seconds" and a.wall_seeds != a.common_seeds
                notes.append(f" at {seeds_text(a.wall_seeds)}" if partial else "")
        ax.barh(ys, widths, height=height, color=colour, label=label)
        for y, w, note in zip(ys, widths, notes):
            ax.annotate(f"{w:.2f}x{note}", (w, y), xytext=(3, 0), textcoords="offset points", va="center", fontsize=7)
    ax.axvline(1.0, color="#57606a", linewidth=1, linestyle="--", label=f"{baseline} (1.00x)")
    ax.set_yticks(range(len(arms)), [f"{a.arm}\n({seeds_text(a.common_seeds)})" for a in reversed(arms)])
    ax.set_xlabel(f"cost of the arm's training / {baseline}'s over the same seeds")
    ax.set_title(f"Cost per arm relative to {baseline} (wall time only where they trained side by side)")
    ax.grid(axis="y", visible=False)
    _legend_below(ax, ncol=5)
    return fig, ""


@dataclass(frozen=True)
class PlotSpec:
    name: str  # the PNG is <name>.png
    title: str
    caption: str
    # (figure, '') or (None, why not drawn), from a run's RunData or a units folder's UnitsStanding
    draw: Callable[[Any], tuple[Figure | None, str]]


@dataclass(frozen=True)
class RenderedPlot:
    spec: PlotSpec
    png: bytes | None
    why_not: str = ""  # when png is None

    @property
    def name(self) -> str:
        return self.spec.name


PLOT_SPECS: tuple[PlotSpec, ...] = (
    PlotSpec("reward_per_step", "Training reward per step", "Mean training reward of each step's rollouts, per arm. Both arms see the same number of rollouts per step.", plot_reward_per_step),
    PlotSpec("advantage_baseline", "Advantage and baseline distributions", "Per-rollout advantage A = r − b and baseline b. GRPO's baseline is the group mean; GS1's is the kernel-weighted mean reward of other prompts' rollouts in the window.", plot_advantage_baseline),
    PlotSpec("effective_neighbours", "Kernel effective neighbours", "How many other rollouts the GS1 kernel baseline effectively averages over, (Σw)²/Σw² (at most the window size − 1). The activation gate needs its 10th percentile over the pilot's rollouts at or above the red line.", plot_effective_neighbours),
    PlotSpec("eval_accuracy", "Eval accuracy and the paired decision", "Left: greedy eval accuracy per arm. Right: the paired difference with the rule's one-sided bounds; noninferior when the lower bound is above the margin, inferior when the upper bound is below it, else inconclusive.", plot_eval_accuracy),
    PlotSpec("wall_time", "Wall time per stage", "Measured wall time per stage and arm, summed over its steps (model setup from the pilot's timings; eval time is not logged). When the feasibility stage ran: its projection of the full run from the pilot (arms in parallel, plus a recovery reserve), against the wall budget.", plot_wall_time),
)
PLOTS = [p.name for p in PLOT_SPECS]


UNITS_PLOT_SPECS: tuple[PlotSpec, ...] = (
    PlotSpec("units_accuracy", "Accuracy and the paired differences", "Left: greedy eval accuracy per arm, the mean over its seeds in the folder (dots: each seed). Right: each arm minus the baseline on the same items, paired within the seeds both have, with the rule's one-sided bounds (none while the rule cannot read that few seeds); grey while interim (unadjusted, units missing), the verdict's colour once Holm's decision is made.", plot_units_accuracy),
    PlotSpec("units_reward", "Training reward per step", "Each unit's mean training reward per step (64 rollouts a step in every arm), one panel per seed (its arms saw the same prompts in the same order).", plot_units_reward),
    PlotSpec("units_cost", "Cost relative to the baseline", "Each arm's training cost over the seeds it shares with the baseline, divided by the baseline's over the same seeds: sampler tokens, trainer tokens (a critic's value model included), model calls, and wall time where the two trained side by side.", plot_units_cost),
)


def render_plots(data: Any, specs: tuple[PlotSpec, ...] = PLOT_SPECS) -> list[RenderedPlot]:
    """Each of `specs` drawn from `data` (a run's RunData for PLOT_SPECS, a units folder's
    UnitsStanding for UNITS_PLOT_SPECS)."""
    out = []
    with matplotlib.style.context("default"), matplotlib.rc_context(STYLE):
        for spec in specs:
            fig, why = spec.draw(data)
            out.append(RenderedPlot(spec, _png_bytes(fig)) if fig is not None else RenderedPlot(spec, None, why))
    return out
