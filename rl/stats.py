"""The decision's statistics around the rule (float64 numpy, pure functions).

The verdict is the spec's rule's (`rules`: one module per `decision_rule.method`); here is what
every rule shares: reading eval files, pairing items within seeds, Holm's step-down over the
compared arms, and the secondary reports beside any verdict (never the decision): exact McNemar on
the discordant pairs, a seeded paired bootstrap CI of the mean difference over items, and the
smallest observed difference the rule would call noninferior at this n.
"""

from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from rules.base import RuleSettings, SeededPairs
from rules.power import PowerDesign
from rules.registry import DEFAULT_METHOD, rule_for
from schemas.errors import EvalDataError


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


def _settings(rule: RuleSettings | None) -> RuleSettings:
    return rule if rule is not None else rule_for(DEFAULT_METHOD).settings()


def describe_pair(treatment_R: np.ndarray, baseline_R: np.ndarray, *, alpha: float, n_resamples: int = 10_000,
                  seed: int = 0) -> dict:
    """The descriptive numbers beside any verdict, over items (outcomes averaged over the seeds):
    arm means, exact McNemar (0/1 outcomes), and a paired bootstrap CI at confidence 1 - 2 alpha
    (its low end a one-sided level-alpha bound over items)."""
    binary = bool(np.all(np.isin(treatment_R, (0.0, 1.0)) & np.isin(baseline_R, (0.0, 1.0))))
    mcnemar = mcnemar_exact(treatment_R, baseline_R) if binary else None
    bootstrap = paired_bootstrap_ci(treatment_R, baseline_R, confidence=1.0 - 2.0 * alpha, n_resamples=n_resamples, seed=seed)
    return {
        "treatment_mean": float(treatment_R.mean()),
        "baseline_mean": float(baseline_R.mean()),
        "paired_t_lower": None,
        "paired_t_upper": None,
        "bootstrap_lower": bootstrap["low"],
        "bootstrap_upper": bootstrap["high"],
        "mcnemar_p": None if mcnemar is None else mcnemar["p_value"],
        "mcnemar": mcnemar,
        "bootstrap_ci": bootstrap,
    }


def read_pairs(pairs: SeededPairs, *, alpha: float, margin: float, bounds=(0.0, 1.0), rule: RuleSettings | None = None,
               design: PowerDesign | None = None, n_resamples: int = 10_000, seed: int = 0) -> dict:
    """The decision record of one pair of arms: the rule's reading (method, n, mean_diff, lower, upper,
    p-values, verdict, its own details), the descriptive reports over items, and the smallest observed
    difference the rule would call noninferior here (at `design`'s spread for a seed-aware rule)."""
    settings = _settings(rule)
    the_rule = rule_for(settings.method)
    reading = the_rule.read(pairs, alpha=alpha, margin=margin, bounds=bounds, settings=settings)
    treatment_R, baseline_R = pairs.seed_averaged()
    design = design or PowerDesign(n_eval=pairs.n)
    threshold, _ = the_rule.observed_thresholds(design, pairs.n, pairs.n_seeds, alpha, margin, bounds, settings)
    return {**reading.record(), "bounds": [float(b) for b in bounds],
            **describe_pair(treatment_R, baseline_R, alpha=alpha, n_resamples=n_resamples, seed=seed),
            "noninferior_threshold": threshold}


def paired_decision(treatment, baseline, *, alpha: float, margin: float, bounds=(0.0, 1.0), rule: RuleSettings | None = None,
                    design: PowerDesign | None = None, n_resamples: int = 10_000, seed: int = 0) -> dict:
    """The decision record for two arms' eval results at one seed (paths to eval files, or item ->
    outcome maps), under `rule` (default: the user's pre-registered rule). Flat keys follow the
    `decision` artifact's columns; `mcnemar` and `bootstrap_ci` hold the full reports."""
    if not isinstance(treatment, dict):
        treatment = read_eval_items(treatment)
    if not isinstance(baseline, dict):
        baseline = read_eval_items(baseline)
    pairs = SeededPairs.of({0: treatment}, {0: baseline})
    return read_pairs(pairs, alpha=alpha, margin=margin, bounds=bounds, rule=rule, design=design,
                      n_resamples=n_resamples, seed=seed)


# ------------------------------------------------------------- many arms, one baseline, several seeds


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


def _loaded(by_seed: dict[int, object]) -> dict[int, dict[str, float]]:
    return {s: (v if isinstance(v, dict) else read_eval_items(v)) for s, v in by_seed.items()}


def family_decision(compared: dict[str, dict[int, object]], baseline: dict[int, object], *, alpha: float, margin: float,
                    bounds=(0.0, 1.0), rule: RuleSettings | None = None, design: PowerDesign | None = None,
                    n_resamples: int = 10_000, seed: int = 0) -> dict:
    """Every compared arm against one baseline under `rule`, the family-wise error held by Holm.

    `compared`: arm -> seed -> eval results (a path or an item -> outcome map); `baseline`: seed ->
    eval results. Each arm is paired with the baseline on the same items within each seed
    (`SeededPairs`); the rule reads the pairs (bounds at the unadjusted alpha, one-sided p-values),
    `describe_pair` adds the descriptive reports over the seed-averaged items. The verdicts come
    from the Holm-adjusted p-values over the m compared arms: noninferior when the adjusted p of H0
    (difference <= margin) is <= alpha, inferior when that of H0 (difference >= margin) is, else
    inconclusive; each of the two one-sided families is held at alpha, as a single pair holds each
    side at alpha. `holm_lower`/`holm_upper` are the rule's bounds at the level Holm tests the arm at.
    """
    if not compared:
        raise ValueError("no arm to compare with the baseline")
    settings = _settings(rule)
    the_rule = rule_for(settings.method)
    base_by_seed = _loaded(baseline)
    base_seeds = sorted(base_by_seed)
    records, arm_pairs = [], []
    for arm, by_seed in compared.items():
        loaded = _loaded(by_seed)
        pairs = SeededPairs.of(loaded, base_by_seed, arm)
        record = read_pairs(pairs, alpha=alpha, margin=margin, bounds=bounds, rule=settings, design=design,
                            n_resamples=n_resamples, seed=seed)
        record.update(arm=arm, seeds=len(base_seeds), mean_diff_by_seed=pairs.mean_diff_by_seed())
        records.append(record)
        arm_pairs.append(pairs)
    m = len(records)
    for side in ("noninferior", "inferior"):
        raw = [r[f"p_{side}"] for r in records]
        ranks = np.argsort(np.argsort(raw, kind="stable"), kind="stable")
        for r, pairs, adjusted, rank in zip(records, arm_pairs, holm_adjust(raw), ranks):
            r[f"holm_p_{side}"] = adjusted
            if side == "noninferior":  # the bounds at the level Holm tests this arm at
                level = holm_level(alpha, int(rank), m)
                lower, upper = the_rule.interval(pairs, level, bounds, settings)
                r.update(holm_level=level, holm_lower=lower, holm_upper=upper)
    for r in records:
        r["verdict"] = ("noninferior" if r["holm_p_noninferior"] <= alpha
                        else "inferior" if r["holm_p_inferior"] <= alpha else "inconclusive")
    return {
        "family": {
            "method": "holm", "alpha": float(alpha), "m": m,
            "statement": (f"Holm's step-down procedure over the {m} arm(s) compared with the baseline holds the "
                          f"family-wise error at alpha={alpha:g} for the noninferiority claims (and, separately, for "
                          f"the inferiority claims); each arm's p-value is the {the_rule.method} rule's one-sided p-value."),
        },
        "seeds": base_seeds,
        "comparisons": records,
    }
