"""paired_hoeffding: the user's pre-registered rule, exactly as DESIGN.md pins it.

Each item's outcome is averaged over the seeds, D_i = treatment_i - baseline_i lies in
[-(hi - lo), hi - lo], and Hoeffding's one-sided radius is (hi - lo) sqrt(2 ln(1/alpha) / n): for
0/1 accuracy `mean(D) -/+ sqrt(2 ln(1/alpha) / n)`. It needs no assumption about the outcomes'
distribution and is loose for it (at 1,319 items and alpha 0.05 the radius is 0.067). The items
are its unit: it covers the difference of the checkpoints it was given, not the spread over runs.
"""

from __future__ import annotations

import math
from typing import Literal


from rules.base import Rule, RuleSettings, SeededPairs, value_range


class PairedHoeffdingSettings(RuleSettings):
    method: Literal["paired_hoeffding"] = "paired_hoeffding"


def hoeffding_radius(n: int, level: float, bounds=(0.0, 1.0)) -> float:
    """(hi - lo) * sqrt(2 ln(1/level) / n)."""
    if n < 1:
        raise ValueError("n must be >= 1")
    return value_range(bounds) * math.sqrt(2.0 * math.log(1.0 / level) / n)


def hoeffding_p_value(mean_diff: float, n: int, margin: float, bounds=(0.0, 1.0), *, side: str = "noninferior") -> float:
    """exp(-n gap^2 / (2 (hi - lo)^2)) for gap = mean_diff - margin > 0 (noninferior; mirrored for
    inferior), else 1: `lower > margin` at level alpha exactly when this is below alpha."""
    if side not in ("noninferior", "inferior"):
        raise ValueError(f"side must be noninferior or inferior, got {side!r}")
    if n < 1:
        raise ValueError("n must be >= 1")
    gap = (mean_diff - margin) if side == "noninferior" else (margin - mean_diff)
    if gap <= 0:
        return 1.0
    return float(math.exp(-n * gap * gap / (2.0 * value_range(bounds) ** 2)))


def paired_hoeffding(treatment_R, baseline_R, *, alpha: float, margin: float, bounds=(0.0, 1.0)) -> dict:
    """The pinned rule on one seed's paired outcome arrays: n, mean_diff, lower, upper, alpha,
    margin, verdict (noninferior when lower > margin; inferior when upper < margin)."""
    reading = RULE.read(SeededPairs.one_seed(treatment_R, baseline_R), alpha=alpha, margin=margin, bounds=bounds)
    return {"n": reading.n, "mean_diff": reading.mean_diff, "lower": reading.lower, "upper": reading.upper,
            "alpha": reading.alpha, "margin": reading.margin, "verdict": reading.verdict}


def noninferior_threshold(n: int, alpha: float, margin: float, bounds=(0.0, 1.0)) -> float:
    """The smallest observed mean difference the rule calls noninferior at n items: margin + radius."""
    return float(margin) + hoeffding_radius(n, alpha, bounds)


class PairedHoeffding(Rule):
    method = "paired_hoeffding"
    settings_type = PairedHoeffdingSettings
    bounds_name = "Hoeffding bounds"
    summary = ("each item's outcome averaged over the seeds; noninferior when mean(D) - (hi - lo) sqrt(2 ln(1/α) / n) "
               "exceeds the margin, inferior when mean(D) + that radius is below it")
    covers = "the difference of these checkpoints on these items (the items are its unit; runs are not)"

    def interval(self, pairs: SeededPairs, level, bounds, settings):
        mean_diff = self.mean_diff(pairs)
        radius = hoeffding_radius(pairs.n, level, bounds)
        return mean_diff - radius, mean_diff + radius

    def p_values(self, pairs: SeededPairs, margin, bounds, settings):
        mean_diff = self.mean_diff(pairs)
        return (hoeffding_p_value(mean_diff, pairs.n, margin, bounds, side="noninferior"),
                hoeffding_p_value(mean_diff, pairs.n, margin, bounds, side="inferior"))

    def details(self, pairs, alpha, bounds, settings):
        return {"radius": hoeffding_radius(pairs.n, alpha, bounds)}

    def reference(self, treatment_S_N, baseline_S_N, *, alpha, margin, bounds, settings):
        lo, hi = bounds
        seeds, n = len(treatment_S_N), len(treatment_S_N[0])
        diffs = [sum(treatment_S_N[s][i] for s in range(seeds)) / seeds - sum(baseline_S_N[s][i] for s in range(seeds)) / seeds
                 for i in range(n)]
        mean = math.fsum(diffs) / n
        r = (hi - lo) * (2 * math.log(1 / alpha) / n) ** 0.5
        gap_ni, gap_inf = mean - margin, margin - mean
        p_ni = math.exp(-n * gap_ni ** 2 / (2 * (hi - lo) ** 2)) if gap_ni > 0 else 1.0
        p_inf = math.exp(-n * gap_inf ** 2 / (2 * (hi - lo) ** 2)) if gap_inf > 0 else 1.0
        return {"lower": mean - r, "upper": mean + r, "p_noninferior": p_ni, "p_inferior": p_inf}

    def observed_thresholds(self, design, n, seeds, level, margin, bounds, settings):
        radius = hoeffding_radius(n, level, bounds)
        return margin + radius, margin - radius



RULE = PairedHoeffding()
