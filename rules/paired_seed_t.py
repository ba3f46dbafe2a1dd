"""paired_seed_t: the seed is the unit of replication.

Per seed, the mean paired difference on the shared items, d_s; over the S seeds their mean d and
sample SD s. The one-sided Student-t bounds d -/+ t(1 - alpha; S - 1) s / sqrt(S) against the
margin, and the matching p-values of t = (d - margin) / (s / sqrt(S)) on S - 1 degrees of freedom.
The between-run spread enters through s: it covers the difference over runs (the mean of d_s over
the runs one could make), which is what a GPU result at one seed cannot speak for. It needs at
least 3 seeds (at 2 a t bound on one degree of freedom is too wide to tell anything: t(0.95; 1) =
6.31). Seeds whose d_s are all equal (s = 0) give the point itself as both bounds.
"""

from __future__ import annotations

import math
import statistics
from typing import Literal

import numpy as np
from scipy import stats as scipy_stats

from rules.base import Rule, RuleSettings, SeededPairs


class PairedSeedTSettings(RuleSettings):
    method: Literal["paired_seed_t"] = "paired_seed_t"


def _moments(pairs: SeededPairs) -> tuple[float, float, int]:
    d_S = pairs.seed_means()
    return float(d_S.mean()), float(d_S.std(ddof=1)), d_S.size


class PairedSeedT(Rule):
    method = "paired_seed_t"
    settings_type = PairedSeedTSettings
    min_seeds = 3
    seed_aware = True
    bounds_name = "seed-t bounds"
    summary = ("per seed the mean paired difference d_s; noninferior when mean(d_s) - t(1-α; S-1) SD(d_s)/√S "
               "exceeds the margin, inferior when mean(d_s) + that is below it")
    covers = "the difference over runs (the seed is its unit: the run-to-run spread is in its bound)"

    def mean_diff(self, pairs):
        return _moments(pairs)[0]

    def interval(self, pairs, level, bounds, settings):
        mean, sd, seeds = _moments(pairs)
        half = float(scipy_stats.t.ppf(1.0 - level, seeds - 1)) * sd / math.sqrt(seeds)
        return mean - half, mean + half

    def p_values(self, pairs, margin, bounds, settings):
        mean, sd, seeds = _moments(pairs)
        if sd == 0.0:  # every seed the same: the point itself
            return (0.0 if mean > margin else 1.0), (0.0 if mean < margin else 1.0)
        t = (mean - margin) / (sd / math.sqrt(seeds))
        return float(scipy_stats.t.sf(t, seeds - 1)), float(scipy_stats.t.cdf(t, seeds - 1))

    def details(self, pairs, alpha, bounds, settings):
        mean, sd, seeds = _moments(pairs)
        return {"df": seeds - 1, "t_quantile": float(scipy_stats.t.ppf(1.0 - alpha, seeds - 1)), "seed_sd": sd,
                "seed_diffs": [float(d) for d in pairs.seed_means()]}

    def reference(self, treatment_S_N, baseline_S_N, *, alpha, margin, bounds, settings):
        # the per-seed differences from plain lists, the t quantile by bisection of the regularised
        # incomplete beta function (scipy.special.betainc), not scipy.stats.t
        from scipy.special import betainc

        d = [math.fsum(t - b for t, b in zip(ts, bs)) / len(ts) for ts, bs in zip(treatment_S_N, baseline_S_N)]
        seeds = len(d)
        df = seeds - 1
        mean, sd = statistics.fmean(d), statistics.stdev(d)

        def t_cdf(x: float) -> float:
            tail = 0.5 * betainc(df / 2, 0.5, df / (df + x * x))
            return 1 - tail if x > 0 else tail

        lo, hi = 0.0, 1e3
        for _ in range(200):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if t_cdf(mid) < 1 - alpha else (lo, mid)
        half = (lo + hi) / 2 * sd / seeds ** 0.5
        if sd == 0:
            return {"lower": mean, "upper": mean, "p_noninferior": 0.0 if mean > margin else 1.0,
                    "p_inferior": 0.0 if mean < margin else 1.0}
        t = (mean - margin) / (sd / seeds ** 0.5)
        return {"lower": mean - half, "upper": mean + half, "p_noninferior": 1 - t_cdf(t), "p_inferior": t_cdf(t)}

    def observed_thresholds(self, design, n, seeds, level, margin, bounds, settings):
        # at the pre-registered spread: the observed SD of d_s moves it from run to run
        half = float(scipy_stats.t.ppf(1.0 - level, seeds - 1)) * design.seed_sd(n) / math.sqrt(seeds)
        return margin + half, margin - half

    def power(self, design, true_diff, n, seeds, level, margin, bounds, settings):
        # (mean - margin) / (s / sqrt(S)) is noncentral t on S - 1 df, noncentrality (true - margin) sqrt(S) / sigma
        df, crit = seeds - 1, float(scipy_stats.t.ppf(1.0 - level, seeds - 1))
        ncp = (true_diff - margin) * np.sqrt(seeds) / design.seed_sd(n)
        return float(scipy_stats.nct.sf(crit, df, ncp)), float(scipy_stats.nct.cdf(-crit, df, ncp))


RULE = PairedSeedT()
