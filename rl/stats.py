"""Paired statistics for the decision (float64 numpy, pure functions).

Primary: the paired Hoeffding rule pinned in DESIGN.md. For outcomes in bounds (lo, hi) the paired
differences D_i = treatment_i - baseline_i lie in [-(hi - lo), hi - lo], and Hoeffding gives the
one-sided radius (hi - lo) * sqrt(2 ln(1/alpha) / n); for 0/1 accuracy that is the pinned
`mean(D) - sqrt(2 ln(1/alpha) / n)`.

Secondary reports (never the decision): exact McNemar on the discordant pairs, a seeded paired
bootstrap CI of the mean difference, and the smallest true difference the Hoeffding rule can call
noninferior at this n.
"""

from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from schemas.errors import EvalDataError

VERDICTS = ("noninferior", "inferior", "inconclusive")


def _paired(treatment_R, baseline_R, bounds=None) -> tuple[np.ndarray, np.ndarray]:
    treatment_R = np.asarray(treatment_R, dtype=np.float64)
    baseline_R = np.asarray(baseline_R, dtype=np.float64)
    if treatment_R.ndim != 1 or treatment_R.shape != baseline_R.shape:
        raise ValueError("treatment and baseline must be 1-d and paired (equal length)")
    if treatment_R.size == 0:
        raise ValueError("no paired items")
    if not (np.all(np.isfinite(treatment_R)) and np.all(np.isfinite(baseline_R))):
        raise ValueError("outcomes must be finite")
    if bounds is not None:
        lo, hi = bounds
        if np.any((treatment_R < lo) | (treatment_R > hi) | (baseline_R < lo) | (baseline_R > hi)):
            raise ValueError(f"outcomes must lie within bounds [{lo}, {hi}]")
    return treatment_R, baseline_R


def _range(bounds) -> float:
    lo, hi = (float(b) for b in bounds)
    if not hi > lo:
        raise ValueError(f"bounds must be (lo, hi) with hi > lo, got {bounds}")
    return hi - lo


def _check_alpha(alpha: float) -> None:
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")


def hoeffding_radius(n: int, alpha: float, bounds=(0.0, 1.0)) -> float:
    """(hi - lo) * sqrt(2 ln(1/alpha) / n): the one-sided Hoeffding radius of a mean of n paired
    differences in [-(hi - lo), hi - lo]."""
    _check_alpha(alpha)
    if n < 1:
        raise ValueError("n must be >= 1")
    return _range(bounds) * math.sqrt(2.0 * math.log(1.0 / alpha) / n)


def paired_hoeffding(treatment_R, baseline_R, *, alpha: float, margin: float, bounds=(0.0, 1.0)) -> dict:
    """The pinned decision rule on paired outcomes.

    noninferior when lower = mean(D) - radius > margin; inferior when upper = mean(D) + radius
    < margin; otherwise inconclusive.
    """
    treatment_R, baseline_R = _paired(treatment_R, baseline_R, bounds)
    n = treatment_R.size
    mean_diff = float(np.mean(treatment_R - baseline_R))
    radius = hoeffding_radius(n, alpha, bounds)
    lower, upper = mean_diff - radius, mean_diff + radius
    if lower > margin:
        verdict = "noninferior"
    elif upper < margin:
        verdict = "inferior"
    else:
        verdict = "inconclusive"
    return {
        "n": int(n),
        "mean_diff": mean_diff,
        "lower": lower,
        "upper": upper,
        "alpha": float(alpha),
        "margin": float(margin),
        "verdict": verdict,
    }


def min_noninferior_true_diff(n: int, alpha: float, margin: float, bounds=(0.0, 1.0)) -> float:
    """The smallest true mean difference the Hoeffding rule can call noninferior at this n:
    margin + radius (an observed mean difference above it is needed for lower > margin)."""
    return float(margin) + hoeffding_radius(n, alpha, bounds)


def mcnemar_exact(treatment_R, baseline_R) -> dict:
    """Exact two-sided McNemar test on 0/1 paired outcomes.

    b = pairs with treatment 1 and baseline 0, c = the reverse. Under H0 b ~ Binomial(b + c, 1/2);
    p = min(1, 2 * P(X <= min(b, c))), computed exactly in rationals; p = 1 with no discordant pair.
    """
    treatment_R, baseline_R = _paired(treatment_R, baseline_R)
    if not np.all(np.isin(treatment_R, (0.0, 1.0)) & np.isin(baseline_R, (0.0, 1.0))):
        raise ValueError("McNemar needs 0/1 outcomes")
    b = int(np.sum((treatment_R == 1) & (baseline_R == 0)))
    c = int(np.sum((treatment_R == 0) & (baseline_R == 1)))
    n = b + c
    tail = Fraction(sum(math.comb(n, k) for k in range(min(b, c) + 1)), 2**n)
    p_value = float(min(Fraction(1), 2 * tail))
    return {"b": b, "c": c, "n_discordant": n, "p_value": p_value}


def paired_bootstrap_ci(
    treatment_R,
    baseline_R,
    *,
    confidence: float = 0.95,
    n_resamples: int = 10_000,
    seed: int = 0,
    chunk: int = 1_000,
) -> dict:
    """Percentile bootstrap CI of mean(treatment - baseline), resampling items (pairs) with
    replacement; seeded, vectorised in chunks of resamples."""
    treatment_R, baseline_R = _paired(treatment_R, baseline_R)
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if n_resamples < 1:
        raise ValueError("n_resamples must be >= 1")
    diff_R = treatment_R - baseline_R
    n = diff_R.size
    rng = np.random.default_rng(seed)
    means_S = np.empty(n_resamples)
    for start in range(0, n_resamples, chunk):
        stop = min(start + chunk, n_resamples)
        index_S_R = rng.integers(0, n, size=(stop - start, n))
        means_S[start:stop] = diff_R[index_S_R].mean(axis=1)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(means_S, [tail, 1.0 - tail])
    return {
        "low": float(low),
        "high": float(high),
        "confidence": float(confidence),
        "n_resamples": int(n_resamples),
        "seed": int(seed),
    }


# ---------------------------------------------------------------------------- eval files -> decision


def _outcome(value, where: str) -> float:
    if isinstance(value, bool) or (isinstance(value, (int, float)) and value in (0, 1)):
        return float(value)
    raise EvalDataError(f"{where}: correct must be true/false or 0/1, got {value!r}")


def read_eval_items(path) -> dict[str, float]:
    """item_id -> correct (0.0 / 1.0) from an eval file: `.parquet` (the eval_items table, or any
    Parquet with item_id and correct) or JSON lines with item_id and correct."""
    path = Path(path)
    if path.is_dir():
        raise EvalDataError(f"{path}: is a directory, not an eval file")
    if not path.is_file():
        raise EvalDataError(f"{path}: no such file")
    rows: list[tuple] = []
    if path.suffix == ".parquet":
        try:
            table = pq.read_table(path)
        except Exception as e:  # pyarrow raises several types for a corrupt file
            raise EvalDataError(f"{path}: not a readable Parquet file ({type(e).__name__})") from None
        missing = [c for c in ("item_id", "correct") if c not in table.column_names]
        if missing:
            raise EvalDataError(f"{path}: missing column(s) {', '.join(missing)}")
        pairs = zip(table.column("item_id").to_pylist(), table.column("correct").to_pylist())
        rows = [(item_id, correct, f"{path}: row {k}") for k, (item_id, correct) in enumerate(pairs)]
    else:
        try:
            lines = path.read_text(encoding="utf-8").split("\n")
        except UnicodeDecodeError as e:
            raise EvalDataError(f"{path}: not UTF-8 text (byte {e.start})") from None
        except OSError as e:
            raise EvalDataError(f"{path}: cannot read ({e.strerror or type(e).__name__})") from None
        for line_number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            where = f"{path}: line {line_number}"
            try:
                row = json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                raise EvalDataError(f"{where}: not valid JSON") from None
            if not isinstance(row, dict) or "item_id" not in row or "correct" not in row:
                raise EvalDataError(f"{where}: needs item_id and correct")
            rows.append((row["item_id"], row["correct"], where))
    if not rows:
        raise EvalDataError(f"{path}: no eval items")
    items: dict[str, float] = {}
    for item_id, correct, where in rows:
        if item_id is None:
            raise EvalDataError(f"{where}: item_id is null")
        key = str(item_id)
        if key in items:
            raise EvalDataError(f"{path}: duplicate item_id {key!r}")
        items[key] = _outcome(correct, where)
    return items


def paired_outcomes(treatment: dict, baseline: dict) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(item_ids sorted, treatment_R, baseline_R) matched by item id; differing sets -> error."""
    only_treatment = treatment.keys() - baseline.keys()
    only_baseline = baseline.keys() - treatment.keys()
    if only_treatment or only_baseline:
        raise EvalDataError(
            f"item sets differ: {len(only_treatment) + len(only_baseline)} item(s) differ "
            f"({len(only_treatment)} only in treatment, {len(only_baseline)} only in baseline)"
        )
    item_ids = sorted(treatment)
    return (
        item_ids,
        np.array([treatment[i] for i in item_ids], dtype=np.float64),
        np.array([baseline[i] for i in item_ids], dtype=np.float64),
    )


def paired_decision(treatment, baseline, *, alpha: float, margin: float, bounds=(0.0, 1.0), n_resamples: int = 10_000, seed: int = 0) -> dict:
    """The decision record for two arms' eval results (paths to eval files, or item -> outcome maps).

    The paired Hoeffding rule decides (n, mean_diff, lower, upper, alpha, margin, verdict); the
    rest is descriptive: arm means, exact McNemar, a paired bootstrap CI at confidence 1 - 2 alpha
    (its low end is a one-sided level-alpha bound, comparable with `lower`), and the smallest true
    difference the rule can call noninferior at this n. Flat keys follow the `decision` artifact's
    columns (paired_t_* are not computed: None); `mcnemar` and `bootstrap_ci` hold the full reports.
    """
    if not isinstance(treatment, dict):
        treatment = read_eval_items(treatment)
    if not isinstance(baseline, dict):
        baseline = read_eval_items(baseline)
    _, treatment_R, baseline_R = paired_outcomes(treatment, baseline)
    record = paired_hoeffding(treatment_R, baseline_R, alpha=alpha, margin=margin, bounds=bounds)
    binary = bool(np.all(np.isin(treatment_R, (0.0, 1.0)) & np.isin(baseline_R, (0.0, 1.0))))
    mcnemar = mcnemar_exact(treatment_R, baseline_R) if binary else None
    bootstrap = paired_bootstrap_ci(treatment_R, baseline_R, confidence=1.0 - 2.0 * alpha, n_resamples=n_resamples, seed=seed)
    return {
        **record,
        "bounds": [float(b) for b in bounds],
        "treatment_mean": float(treatment_R.mean()),
        "baseline_mean": float(baseline_R.mean()),
        "paired_t_lower": None,
        "paired_t_upper": None,
        "bootstrap_lower": bootstrap["low"],
        "bootstrap_upper": bootstrap["high"],
        "mcnemar_p": None if mcnemar is None else mcnemar["p_value"],
        "mcnemar": mcnemar,
        "bootstrap_ci": bootstrap,
        "min_noninferior_true_diff": min_noninferior_true_diff(len(treatment_R), alpha, margin, bounds),
    }


# ------------------------------------------------------------- many arms, one baseline, several seeds


def hoeffding_p_value(mean_diff: float, n: int, margin: float, bounds=(0.0, 1.0), *, side: str = "noninferior") -> float:
    """The one-sided Hoeffding p-value matching `paired_hoeffding`'s bounds: for side
    "noninferior", of H0: true difference <= margin, exp(-n (mean_diff - margin)^2 / (2 (hi - lo)^2))
    when mean_diff > margin, else 1; for "inferior", of H0: difference >= margin (mirrored).
    `lower > margin` at level alpha exactly when this p-value is below alpha."""
    if n < 1:
        raise ValueError("n must be >= 1")
    gap = (mean_diff - margin) if side == "noninferior" else (margin - mean_diff)
    if side not in ("noninferior", "inferior"):
        raise ValueError(f"side must be noninferior or inferior, got {side!r}")
    if gap <= 0:
        return 1.0
    return float(math.exp(-n * gap * gap / (2.0 * _range(bounds) ** 2)))


def holm_adjust(p_values) -> list[float]:
    """Holm's step-down adjusted p-values, in the input's order: with the m p-values sorted
    ascending, adjusted p_(k) = min(1, max over j <= k of (m - j + 1) p_(j)). Rejecting every
    hypothesis whose adjusted p-value is <= alpha controls the family-wise error at alpha."""
    p = np.asarray(p_values, dtype=np.float64)
    if p.ndim != 1 or p.size == 0:
        raise ValueError("need a non-empty 1-d list of p-values")
    if np.any((p < 0) | (p > 1) | ~np.isfinite(p)):
        raise ValueError("p-values must lie in [0, 1]")
    m = p.size
    order = np.argsort(p, kind="stable")
    stepped = np.maximum.accumulate((m - np.arange(m)) * p[order])
    adjusted = np.empty(m)
    adjusted[order] = np.minimum(stepped, 1.0)
    return adjusted.tolist()


def holm_level(alpha: float, rank: int, m: int) -> float:
    """The level Holm tests the hypothesis of 0-based `rank` (by ascending p) at: alpha / (m - rank)."""
    return alpha / (m - rank)


def mean_diff_by_seed(treatment: dict[int, dict[str, float]], baseline: dict[int, dict[str, float]]) -> dict[str, float]:
    """Treatment minus baseline at each seed, items paired within the seed (JSON keys: the seeds
    as text): how far the seeds agree on a difference the decision averages over them."""
    by_seed = {}
    for s in sorted(baseline):
        _, t_R, b_R = paired_outcomes(treatment[s], baseline[s])
        by_seed[str(s)] = float(np.mean(t_R - b_R))
    return by_seed


def seed_averaged(by_seed: dict[int, dict[str, float]], arm: str) -> dict[str, float]:
    """item -> the item's outcome averaged over the seeds (every seed must hold the same items).

    Differences are paired within a seed (the same item, both arms trained at that seed) and then
    averaged over seeds per item: the items stay the independent units Hoeffding needs, and the
    average of per-seed outcomes stays within the metric's bounds."""
    if not by_seed:
        raise EvalDataError(f"{arm}: no seed has eval results")
    seeds = sorted(by_seed)
    items = by_seed[seeds[0]]
    for s in seeds[1:]:
        if by_seed[s].keys() != items.keys():
            raise EvalDataError(f"{arm}: seed {s} holds other eval items than seed {seeds[0]}")
    return {i: float(np.mean([by_seed[s][i] for s in seeds])) for i in items}


def family_decision(compared: dict[str, dict[int, object]], baseline: dict[int, object], *, alpha: float, margin: float,
                    bounds=(0.0, 1.0), n_resamples: int = 10_000, seed: int = 0) -> dict:
    """Every compared arm against one baseline, the family-wise error controlled by Holm.

    `compared`: arm -> seed -> eval results (a path or an item -> outcome map); `baseline`: seed ->
    eval results. Each arm is paired with the baseline on the same items within each seed, and the
    per-item differences averaged over seeds; `paired_decision` gives its Hoeffding bounds (at the
    unadjusted alpha) and descriptive statistics. The verdicts come from the Holm-adjusted Hoeffding
    p-values over the m compared arms: noninferior when the adjusted p of H0 (difference <= margin)
    is <= alpha, inferior when that of H0 (difference >= margin) is, else inconclusive; each of the
    two one-sided families is held at alpha, as the single-pair rule holds each side at alpha.
    """
    def outcomes(by_seed, arm):
        return seed_averaged({s: (v if isinstance(v, dict) else read_eval_items(v)) for s, v in by_seed.items()}, arm)

    if not compared:
        raise ValueError("no arm to compare with the baseline")
    base_seeds = sorted(baseline)
    base = outcomes(baseline, "baseline")
    base_by_seed = {s: (v if isinstance(v, dict) else read_eval_items(v)) for s, v in baseline.items()}
    records = []
    for arm, by_seed in compared.items():
        if sorted(by_seed) != base_seeds:
            raise EvalDataError(f"{arm}: seeds {sorted(by_seed)} differ from the baseline's {base_seeds}")
        loaded = {s: (v if isinstance(v, dict) else read_eval_items(v)) for s, v in by_seed.items()}
        record = paired_decision(seed_averaged(loaded, arm), base, alpha=alpha, margin=margin, bounds=bounds,
                                 n_resamples=n_resamples, seed=seed)
        record.update(
            arm=arm, seeds=len(base_seeds), mean_diff_by_seed=mean_diff_by_seed(loaded, base_by_seed),
            p_noninferior=hoeffding_p_value(record["mean_diff"], record["n"], margin, bounds, side="noninferior"),
            p_inferior=hoeffding_p_value(record["mean_diff"], record["n"], margin, bounds, side="inferior"),
        )
        records.append(record)
    m = len(records)
    for side in ("noninferior", "inferior"):
        raw = [r[f"p_{side}"] for r in records]
        ranks = np.argsort(np.argsort(raw, kind="stable"), kind="stable")
        for r, adjusted, rank in zip(records, holm_adjust(raw), ranks):
            r[f"holm_p_{side}"] = adjusted
            if side == "noninferior":  # the bounds at the level Holm tests this arm at
                level = holm_level(alpha, int(rank), m)
                radius = hoeffding_radius(r["n"], level, bounds)
                r.update(holm_level=level, holm_lower=r["mean_diff"] - radius, holm_upper=r["mean_diff"] + radius)
    for r in records:
        r["verdict"] = ("noninferior" if r["holm_p_noninferior"] <= alpha
                        else "inferior" if r["holm_p_inferior"] <= alpha else "inconclusive")
    return {
        "family": {
            "method": "holm", "alpha": float(alpha), "m": m,
            "statement": (f"Holm's step-down procedure over the {m} arm(s) compared with the baseline holds the "
                          f"family-wise error at alpha={alpha:g} for the noninferiority claims (and, separately, for "
                          "the inferiority claims); each arm's p-value is the one-sided Hoeffding p-value of its "
                          "seed-averaged paired differences."),
        },
        "seeds": base_seeds,
        "comparisons": records,
    }
