"""Artifacts of the hill-climb and the transfer matrix: Parquet tables, markdown, PNG plots, JSON.

Every file is written atomically (temp file + rename) through schemas.io.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
from matplotlib.figure import Figure  # no pyplot: no global figure state, no GUI backend
from matplotlib.ticker import NullFormatter, ScalarFormatter

from hillclimb.climb import (
    ALL_FEATURES,
    FRONTIER_FAMILIES,
    HillclimbReport,
    KernelRecipe,
    TransferReport,
    TransferVerdict,
)
from hillclimb.data import FEATURE_FAMILIES
from hillclimb.geff import BOOT_LEVEL, BOOT_RESAMPLES
from schemas.io import write_bytes_atomic, write_json_atomic, write_parquet_atomic, write_text_atomic

CANDIDATES_SCHEMA = pa.schema(
    [
        ("rank", pa.int32()),
        ("family", pa.string()),
        ("features", pa.list_(pa.string())),
        ("scales", pa.list_(pa.float64())),
        ("bandwidth", pa.float64()),
        ("window", pa.int32()),
        ("min_mass", pa.float64()),
        ("label", pa.string()),
        ("g_eff", pa.float64()),
        ("mse", pa.float64()),
        ("bias", pa.float64()),
        ("corr", pa.float64()),
        ("kish_p10", pa.float64()),
    ]
)


def candidates_table(report: HillclimbReport) -> pa.Table:
    """Every scored candidate in search order, with its search-split metrics."""
    rows = []
    for i, c in enumerate(report.search.candidates):
        r: KernelRecipe = c["recipe"]
        rows.append(
            {
                "rank": i,
                "family": r.family,
                "features": list(r.features),
                "scales": None if r.scales is None else list(r.scales),
                "bandwidth": r.bandwidth,
                "window": r.window,
                "min_mass": r.min_mass,
                "label": r.label(),
                **{k: c[k] for k in ("g_eff", "mse", "bias", "corr", "kish_p10")},
            }
        )
    return pa.Table.from_pylist(rows, schema=CANDIDATES_SCHEMA)


def _fmt(x) -> str:
    if isinstance(x, str):
        return x
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return f"{x:.3f}" if abs(x) < 100 else f"{x:.1f}"


def _md_table(header: list[str], rows: list[list]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(out)


def _interval(lo, hi) -> str:
    return f"[{_fmt(lo)}, {_fmt(hi)}]"


def summary_markdown(report: HillclimbReport) -> str:
    cols = ["method", "recipe", "G_eff (eval)", f"{BOOT_LEVEL:.0%} interval", "G_eff (search)", "found after",
            "Kish p10", "bias", "corr(b, p)", "n"]
    rows = [
        [r["method"], r["recipe"] or "-", r["eval_g_eff"], _interval(r["eval_g_eff_lo"], r["eval_g_eff_hi"]),
         r["search_g_eff"], "-" if math.isnan(r["search_tried"]) else f"{r['search_tried']:.0f} kernels",
         r["eval_kish_p10"], r["eval_bias"], r["eval_corr"], r["eval_n"]]
        for r in report.summary_rows
    ]
    s = report.search
    return "\n".join(
        [
            f"# Kernel hill-climb: {report.log_name}",
            "",
            f"Seed {report.seed}; batch {report.batch_size}, spec window {report.window}; prompts "
            f"{report.n_prompts['search']} search / {report.n_prompts['eval']} eval (split by a seeded hash of the "
            f"prompt id; the search never scores the eval half). {len(s.candidates)} candidates in "
            f"{s.seconds:.1f} s ({60 * len(s.candidates) / max(s.seconds, 1e-9):.0f}/min); the winner was found after "
            f"{s.tried_until(report.winner)} of them, {s.best_seconds:.1f} s in ({s.best_seconds / 60:.2f} min).",
            "",
            "G_eff = mean per-prompt reward variance / noise-corrected mean (b - p)^2, with p from the prompt's "
            "samples other than the drawn one (hillclimb/geff.py). GRPO rows: the mean of G samples of the prompt, "
            "judged against its remaining samples; oracle: the prompt's own success rate from all of its samples but "
            "the two it is judged on (GRPO at G = K - 2), what a baseline that knew each prompt would score. "
            f"Interval: {BOOT_LEVEL:.0%} percentile bootstrap over the eval half's prompts ({BOOT_RESAMPLES} "
            "resamples). Bias = mean(b - p); corr = Pearson(b, p).",
            "",
            _md_table(cols, rows),
            "",
            "Best kernel the gs1_kernel arm runs (`arm_winner`; spec fragment, `kernel.json`; families "
            "gaussian/laplace/knn over the features the training loop logs):",
            "",
            "```json",
            json.dumps(report.arm_winner.to_fragment(), indent=2),
            "```",
            "",
            unrestricted_note(report),
            "",
            frontier_markdown(report),
        ]
    )


FRONTIER_REFERENCES = ("batch_mean", "spec_kernel", "grpo_2", "grpo_4", "grpo_8", "oracle")
WHO = {fam.name: fam.who for fam in FEATURE_FAMILIES} | {ALL_FEATURES: "as its parts"}


def _eval_cell(row: dict) -> str:
    """A row's eval-split G_eff with its bootstrap interval (frontier and reference rows alike)."""
    return f"{_fmt(row['eval_g_eff'])} {_interval(row['eval_g_eff_lo'], row['eval_g_eff_hi'])}"


def frontier_by_group(report: HillclimbReport) -> dict[str, dict[str, dict]]:
    """The frontier rows as {feature family: {baseline family: row}}, in the search's order."""
    groups: dict[str, dict[str, dict]] = {}
    for r in report.frontier_rows:
        groups.setdefault(r["features"], {})[r["family"]] = r
    return groups


def frontier_best(cells: dict[str, dict]) -> dict:
    """A feature family's pick among its baseline families: the highest search-split G_eff."""
    return max(cells.values(), key=lambda r: r["search_g_eff"])


def frontier_groups(tr: TransferReport) -> list[str]:
    """Every feature family any benchmark's frontier has, in first-seen order (the across-benchmark columns)."""
    return list(dict.fromkeys(r["features"] for rep in tr.reports for r in rep.frontier_rows))


def frontier_markdown(report: HillclimbReport) -> str:
    """The feature families' table: one row per feature family, one column per baseline family
    (eval G_eff and its interval), the family's best, the search effort and who can compute it."""
    if not report.frontier_rows:
        return ""
    cols = ["features", *FRONTIER_FAMILIES, "best (eval)", "effort", "who can compute it"]
    rows = []
    for group, cells in frontier_by_group(report).items():
        best = frontier_best(cells)
        any_row = next(iter(cells.values()))
        rows.append([group, *(_eval_cell(cells[f]) if f in cells else "-" for f in FRONTIER_FAMILIES),
                     f"{best['family']} {_fmt(best['eval_g_eff'])}",
                     f"{any_row['search_candidates']:.0f} kernels, {any_row['search_seconds']:.1f} s",
                     WHO.get(group, "")])
    refs = {r["method"]: r for r in report.summary_rows}
    ref_line = "; ".join(f"{m} {_eval_cell(refs[m])}" for m in FRONTIER_REFERENCES if m in refs)
    return "\n".join([
        "## Feature families (the frontier)",
        "",
        "Each feature family's features alone, searched on the search split with every baseline family that reads "
        f"features; each cell is that family's best recipe on the eval split, with its {BOOT_LEVEL:.0%} bootstrap "
        "interval over prompts. `best` is the row's pick by the search split; effort: that family's search.",
        "",
        _md_table(cols, rows),
        "",
        f"References on the same eval split: {ref_line}.",
        "",
    ])


def unrestricted_note(report: HillclimbReport) -> str:
    """The unrestricted winner, labelled with what keeps the arm from running it."""
    blockers = report.winner.arm_blockers()
    if not blockers:
        return f"The unrestricted winner `{report.winner.label()}` is one the arm runs (same as `kernel.json`)."
    return (
        f"Unrestricted winner (`winner_unrestricted.json`, NOT runnable by the gs1_kernel arm: "
        f"{'; '.join(blockers)}): `{report.winner.label()}`."
    )


def unrestricted_fragment(report: HillclimbReport) -> dict:
    """The unrestricted winner as a kernel object plus why the arm cannot run it (if it cannot)."""
    w = report.winner
    return {"arm_runs_it": w.arm_accepts(), "needs": w.arm_blockers(), "label": w.label(), "kernel": w.kernel_object()}


def _save_png(fig, path: Path) -> None:
    """Write the figure atomically (bytes, then temp file + rename)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    write_bytes_atomic(path, buf.getvalue())


def plot_sweep(report: HillclimbReport, path: Path) -> None:
    """G_eff against bandwidth (k for knn, lambda for ridge) per family, with reference lines."""
    families = list(dict.fromkeys(r["family"] for r in report.sweep_rows))
    fig = Figure(figsize=(4.2 * max(len(families), 1), 3.6))
    axes = fig.subplots(1, max(len(families), 1), squeeze=False)
    refs = {r["method"]: r["eval_g_eff"] for r in report.summary_rows}
    for ax, fam in zip(axes[0], families):
        pts = [r for r in report.sweep_rows if r["family"] == fam]
        x = [r["bandwidth"] for r in pts]
        ax.plot(x, [r["eval_g_eff"] for r in pts], "o-", label="eval")
        ax.plot(x, [r["search_g_eff"] for r in pts], "s--", alpha=0.6, label="search")
        for name, style in (("grpo_8", ":"), ("grpo_4", ":"), ("spec_kernel", "-."), ("batch_mean", "--")):
            v = refs.get(name)
            if v is not None and np.isfinite(v):
                ax.axhline(v, ls=style, color="gray", lw=0.8)
                ax.annotate(name, (x[0], v), fontsize=7, color="gray", va="bottom")
        ax.set_xscale("log")
        ax.set_xlabel({"knn": "k", "ridge": "lambda", "crossfit": "lambda"}.get(fam, "bandwidth h"))
        ax.set_ylabel("G_eff")
        ax.set_title(f"{fam}: {pts[0]['recipe'].split(']')[0]}]" if pts else fam, fontsize=8)
        ax.legend(fontsize=7)
    fig.suptitle(f"G_eff vs bandwidth: {report.log_name}", fontsize=10)
    _save_png(fig, path)


def write_hillclimb(report: HillclimbReport, out_dir: str | Path) -> dict[str, Path]:
    out = Path(out_dir)
    paths = {
        "candidates": out / "candidates.parquet",
        "summary": out / "summary.parquet",
        "sweep": out / "sweep.parquet",
        "markdown": out / "summary.md",
        "plot": out / "geff_vs_bandwidth.png",
        "kernel": out / "kernel.json",
        "unrestricted": out / "winner_unrestricted.json",
        "frontier": out / "frontier.parquet",
    }
    write_parquet_atomic(candidates_table(report), paths["candidates"])
    write_parquet_atomic(pa.Table.from_pylist(report.summary_rows), paths["summary"])
    write_parquet_atomic(pa.Table.from_pylist(report.sweep_rows) if report.sweep_rows else pa.table({}), paths["sweep"])
    write_text_atomic(paths["markdown"], summary_markdown(report))
    plot_sweep(report, paths["plot"])
    write_json_atomic(paths["kernel"], report.arm_winner.to_fragment())
    write_json_atomic(paths["unrestricted"], unrestricted_fragment(report))
    write_parquet_atomic(pa.Table.from_pylist(report.frontier_rows) if report.frontier_rows else pa.table({}),
                         paths["frontier"])
    return paths


def transfer_rows(tr: TransferReport) -> list[dict]:
    rows = []
    for i, row in enumerate(tr.names):
        for j, col in enumerate(tr.names):
            rows.append(
                {
                    "tuned_on": row,
                    "applied_to": col,
                    "recipe": tr.winners[i].label(),
                    "g_eff": float(tr.g_eff[i, j]),
                    "g_eff_lo": float(tr.g_eff_lo[i, j]),
                    "g_eff_hi": float(tr.g_eff_hi[i, j]),
                    "arm_recipe": tr.arm_winners[i].label(),
                    "arm_g_eff": float(tr.g_eff_arm[i, j]),
                    "arm_g_eff_lo": float(tr.g_eff_arm_lo[i, j]),
                    "arm_g_eff_hi": float(tr.g_eff_arm_hi[i, j]),
                    "column_own_best": float(tr.own_best[j]),
                    "column_spec_kernel": float(tr.spec_kernel[j]),
                    "column_batch_mean": float(tr.batch_mean[j]),
                }
            )
    return rows


def _with_interval(mat, lo, hi, i: int) -> list[str]:
    return [f"{_fmt(float(mat[i, j]))} {_interval(float(lo[i, j]), float(hi[i, j]))}" if not np.isnan(mat[i, j])
            else "n/a" for j in range(mat.shape[1])]


def _verdict_lines(verdicts: list[TransferVerdict]) -> str:
    return "\n".join(f"- {v.sentence()}" for v in verdicts)


def frontier_across(tr: TransferReport) -> str:
    """One row per benchmark: each feature family's best G_eff on the eval split (picked on the
    search split) with its interval, beside batch mean, GRPO-2/4/8 and the oracle."""
    groups = frontier_groups(tr)
    if not groups:
        return ""
    refs = ("batch_mean", "grpo_2", "grpo_4", "grpo_8", "oracle")
    def best_cell(by_group: dict[str, dict[str, dict]], group: str) -> str:
        if group not in by_group:
            return "-"
        best = frontier_best(by_group[group])
        return f"{_eval_cell(best)} {best['family']}"

    rows = []
    for name, rep in zip(tr.names, tr.reports):
        by_group = frontier_by_group(rep)
        summary = {r["method"]: r for r in rep.summary_rows}
        rows.append([name, *(best_cell(by_group, g) for g in groups),
                     *(_eval_cell(summary[m]) if m in summary else "-" for m in refs)])
    return "\n".join([
        "## The frontier: G_eff per feature family, beside the references",
        "",
        "Each cell: the feature family's best baseline (any family that reads features, picked on the search "
        f"split) on the eval split, {BOOT_LEVEL:.0%} bootstrap interval over prompts, and its family. Per benchmark "
        "folder: `summary.md` has every family's cell and the search effort.",
        "",
        _md_table(["benchmark", *groups, *refs], rows),
        "",
    ])


def transfer_markdown(tr: TransferReport) -> str:
    header = ["tuned on \\ applied to"] + tr.names
    rows = [[tr.names[i]] + _with_interval(tr.g_eff, tr.g_eff_lo, tr.g_eff_hi, i) for i in range(len(tr.names))]
    rows.append(["(column's own best)"] + [float(v) for v in tr.own_best])
    rows.append(["(spec kernel)"] + [float(v) for v in tr.spec_kernel])
    rows.append(["(batch mean)"] + [float(v) for v in tr.batch_mean])
    rows_arm = [[tr.names[i]] + _with_interval(tr.g_eff_arm, tr.g_eff_arm_lo, tr.g_eff_arm_hi, i)
                for i in range(len(tr.names))]
    rows_arm.append(["(column's own arm winner)"] + [float(v) for v in np.diag(tr.g_eff_arm)])
    rows_arm.append(["(column's own unrestricted best)"] + [float(v) for v in tr.own_best])
    rows_arm.append(["(spec kernel)"] + [float(v) for v in tr.spec_kernel])
    rows_arm.append(["(batch mean)"] + [float(v) for v in tr.batch_mean])
    winners = "\n".join(
        f"- {n}: `{w.label()}`" + ("" if w.arm_accepts() else f" (not runnable by the arm: {'; '.join(w.arm_blockers())})")
        for n, w in zip(tr.names, tr.winners)
    )
    arm_winners = "\n".join(f"- {n}: `{w.label()}`" for n, w in zip(tr.names, tr.arm_winners))
    return "\n".join(
        [
            "# Kernel transfer matrix (G_eff on each column's eval split)",
            "",
            "Each row's winning recipe (found on the row's search split) applied to each column's eval split; "
            "the recipe transfers, not fitted numbers (z-scores are per window; ridge refits on earlier "
            f"windows). In brackets: {BOOT_LEVEL:.0%} percentile bootstrap interval over the column's eval prompts. "
            "n/a: the column lacks a feature the recipe uses.",
            "",
            frontier_across(tr),
            "## Does a kernel transfer?",
            "",
            "Per benchmark, the best other benchmark's recipe against its own, paired over its eval prompts: it "
            "transfers when the interval of the difference reaches 0.",
            "",
            "Unrestricted winners:",
            "",
            _verdict_lines(tr.verdicts),
            "",
            "Arm winners (`kernel.json`):",
            "",
            _verdict_lines(tr.arm_verdicts),
            "",
            "## Unrestricted winners (any feature in the logs, any family; may need features the loop does not log)",
            "",
            _md_table(header, rows),
            "",
            winners,
            "",
            "## Arm winners (the best recipe the gs1_kernel arm runs: gaussian/laplace/knn over "
            "log_prompt_num_tokens, prompt_mean_logprob; what `kernel.json` holds)",
            "",
            _md_table(header, rows_arm),
            "",
            arm_winners,
            "",
        ]
    )


def plot_transfer(tr: TransferReport, path: Path) -> None:
    n = len(tr.names)
    panels = [
        ("unrestricted winners", np.vstack([tr.g_eff, tr.own_best[None, :]])),
        ("arm winners (kernel.json)", np.vstack([tr.g_eff_arm, np.diag(tr.g_eff_arm)[None, :]])),
    ]
    fig = Figure(figsize=(2 * (1.4 * n + 2.5), 1.1 * (n + 1) + 1.2))
    axes = fig.subplots(1, 2, squeeze=False)
    for ax, (title, mat) in zip(axes[0], panels):
        # log colour scale: G_eff spans orders of magnitude (a near-constant-reward column is huge)
        shown = np.where(np.isfinite(mat) & (mat > 0), np.log10(np.where(mat > 0, mat, 1.0)), np.nan)
        im = ax.imshow(shown, cmap="viridis")
        ax.set_xticks(range(n), tr.names, rotation=30, ha="right")
        ax.set_yticks(range(n + 1), [*tr.names, "own"])
        ax.set_xlabel("applied to (eval split)")
        ax.set_ylabel("tuned on")
        for i in range(n + 1):
            for j in range(n):
                ax.text(j, i, _fmt(float(mat[i, j])), ha="center", va="center", color="w", fontsize=8)
        fig.colorbar(im, ax=ax, label="log10 G_eff")
        ax.set_title(f"Kernel transfer, {title}: G_eff", fontsize=9)
    _save_png(fig, path)


def plot_frontier(tr: TransferReport, path: Path) -> None:
    """Per benchmark, each feature family's best G_eff (eval split, with its interval) as points,
    beside the batch mean and GRPO-2/4/8 as lines: how far each family climbs, and what it meets."""
    groups = frontier_groups(tr)
    n = len(tr.names)
    fig = Figure(figsize=(3.2 * n, 3.8), layout="constrained")
    axes = fig.subplots(1, n, squeeze=False)
    for ax, name, rep in zip(axes[0], tr.names, tr.reports):
        refs = {r["method"]: r["eval_g_eff"] for r in rep.summary_rows}
        by_group = frontier_by_group(rep)
        for k, g in enumerate(groups):
            if g not in by_group:
                continue
            best = frontier_best(by_group[g])
            y, lo, hi = best["eval_g_eff"], best["eval_g_eff_lo"], best["eval_g_eff_hi"]
            top = hi if np.isfinite(hi) else 10 * y
            ax.errorbar([k], [y], yerr=[[y - lo], [top - y]], fmt="o", capsize=3)
        for method, style in (("batch_mean", "--"), ("grpo_2", ":"), ("grpo_4", ":"), ("grpo_8", ":")):
            v = refs.get(method)
            if v is not None and np.isfinite(v) and v > 0:
                ax.axhline(v, ls=style, color="gray", lw=0.8)
                ax.annotate(method, (-0.4, v), fontsize=7, color="gray", va="bottom", ha="left")
        ax.set_xlim(-0.5, len(groups) - 0.5)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xticks(range(len(groups)), groups, rotation=40, ha="right", fontsize=7)
        ax.set_title(name, fontsize=9)
    axes[0][0].set_ylabel("G_eff (eval split)")
    fig.suptitle(f"G_eff per feature family ({BOOT_LEVEL:.0%} bootstrap intervals) against batch mean and GRPO-k",
                 fontsize=10)
    _save_png(fig, path)


def write_transfer(tr: TransferReport, out_dir: str | Path) -> dict[str, Path]:
    out = Path(out_dir)
    paths = {
        "transfer": out / "transfer.parquet",
        "markdown": out / "transfer.md",
        "plot": out / "transfer.png",
        "frontier_plot": out / "frontier.png",
    }
    for name, rep in zip(tr.names, tr.reports):
        write_hillclimb(rep, out / name)
    write_parquet_atomic(pa.Table.from_pylist(transfer_rows(tr)), paths["transfer"])
    write_text_atomic(paths["markdown"], transfer_markdown(tr))
    plot_transfer(tr, paths["plot"])
    if any(rep.frontier_rows for rep in tr.reports):
        plot_frontier(tr, paths["frontier_plot"])
    return paths
