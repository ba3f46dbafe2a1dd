"""paired_score: Tango's (1998) score test for the difference of two paired proportions.

For 0/1 outcomes of one seed: b items right only under the treatment, c only under the baseline,
n items; the difference d = (b - c) / n. Under H0: difference = D the restricted maximum-likelihood
share of items right only under the baseline, q, is the positive root of

    2n q^2 + B q + C = 0,   B = -(b + c) + D (2n - b + c),   C = -c D (1 - D),

and the score statistic is Z(D) = (b - c - nD) / sqrt(n (2q + D (1 - D))). One-sided p-values
against the margin: P(Z > Z(margin)) under H0 (noninferior) and its mirror; the bounds invert the
test: the lower bound is the D with Z(D) = z(1 - alpha), the upper the D with Z(D) = -z(1 - alpha)
(Z falls as D rises). It is the standard noninferiority test for paired proportions (Nam 1997,
Tango 1998) and much tighter than Hoeffding; like Hoeffding it covers the difference of the
checkpoints it was given, and it reads one seed (a seed-aware rule reads several).
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from scipy.optimize import brentq
from scipy.stats import norm

from rules.base import Rule, RuleSettings, SeededPairs


class PairedScoreSettings(RuleSettings):
    method: Literal["paired_score"] = "paired_score"


def discordant(pairs: SeededPairs) -> tuple[int, int, int]:
    """(b, c, n) of the one seed's 0/1 pairs: right only under the treatment, only under the baseline."""
    t, b = pairs.treatment_S_N[0], pairs.baseline_S_N[0]
    if not (np.all(np.isin(t, (0.0, 1.0))) and np.all(np.isin(b, (0.0, 1.0)))):
        raise ValueError("paired_score needs 0/1 outcomes")
    return int(np.sum((t == 1) & (b == 0))), int(np.sum((t == 0) & (b == 1))), t.size


def score_z(b: int, c: int, n: int, delta: float) -> float:
    """Tango's score statistic of H0: difference = delta."""
    big_b = -(b + c) + delta * (2 * n - b + c)
    big_c = -c * delta * (1 - delta)
    q = (-big_b + math.sqrt(max(big_b * big_b - 8 * n * big_c, 0.0))) / (4 * n)
    variance = n * (2 * q + delta * (1 - delta))
    gap = b - c - n * delta
    if variance <= 0:
        return 0.0 if gap == 0 else math.copysign(math.inf, gap)
    return gap / math.sqrt(variance)


def score_bound(b: int, c: int, n: int, z: float) -> float:
    """The difference D at which Z(D) = z (lower bound for z > 0, upper for z < 0)."""
    observed = (b - c) / n
    eps = 1e-12
    if z > 0:
        return brentq(lambda d: score_z(b, c, n, d) - z, -1 + eps, observed, xtol=1e-14) if observed > -1 + eps else -1.0
    return brentq(lambda d: score_z(b, c, n, d) - z, observed, 1 - eps, xtol=1e-14) if observed < 1 - eps else 1.0


class PairedScore(Rule):
    method = "paired_score"
    settings_type = PairedScoreSettings
    max_seeds = 1
    bounds_name = "score bounds"
    summary = ("Tango's score test on the discordant items of one seed; noninferior when the score lower bound "
               "(the test inverted at α) exceeds the margin, inferior when the upper bound is below it")
    covers = "the difference of these checkpoints on these items (one seed: runs are not its unit)"

    def interval(self, pairs, level, bounds, settings):
        b, c, n = discordant(pairs)
        z = float(norm.ppf(1.0 - level))
        return score_bound(b, c, n, z), score_bound(b, c, n, -z)

    def p_values(self, pairs, margin, bounds, settings):
        b, c, n = discordant(pairs)
        z = score_z(b, c, n, margin)
        return float(norm.sf(z)), float(norm.cdf(z))

    def details(self, pairs, alpha, bounds, settings):
        b, c, n = discordant(pairs)
        return {"b": b, "c": c, "z_quantile": float(norm.ppf(1.0 - alpha))}

    def reference(self, treatment_S_N, baseline_S_N, *, alpha, margin, bounds, settings):
        """The restricted MLE by maximising the multinomial likelihood numerically, the bounds by
        bisection on the statistic built from it: no closed-form root, no brentq."""
        from scipy.optimize import minimize_scalar
        from statistics import NormalDist

        (ts,), (bs,) = treatment_S_N, baseline_S_N
        n = len(ts)
        b = sum(1 for t, s in zip(ts, bs) if t == 1 and s == 0)
        c = sum(1 for t, s in zip(ts, bs) if t == 0 and s == 1)
        rest = n - b - c

        def z_at(delta):
            lo, hi = max(0.0, -delta), (1 - delta) / 2

            def nll(q):  # q = P(right only under the baseline); p10 = q + delta
                terms = [(b, q + delta), (c, q), (rest, 1 - 2 * q - delta)]
                return -sum(k * math.log(max(p, 1e-300)) for k, p in terms if k)

            q = minimize_scalar(nll, bounds=(lo, hi), method="bounded", options={"xatol": 1e-13}).x
            var = 2 * q + delta - delta * delta
            return (b / n - c / n - delta) / math.sqrt(var / n) if var > 0 else 0.0

        z = NormalDist().inv_cdf(1 - alpha)

        def bisect(target, lo, hi):  # z_at falls as delta rises
            for _ in range(60):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if z_at(mid) > target else (lo, mid)
            return (lo + hi) / 2

        observed = (b - c) / n
        z_margin = z_at(margin)
        return {"lower": bisect(z, -1 + 1e-9, observed), "upper": bisect(-z, observed, 1 - 1e-9),
                "p_noninferior": 1 - NormalDist().cdf(z_margin), "p_inferior": NormalDist().cdf(z_margin)}

    def observed_thresholds(self, design, n, seeds, level, margin, bounds, settings):
        # the score's null variance per item is about the items' own (discordant share - D^2)
        half = float(norm.ppf(1.0 - level)) * design.item_sd / math.sqrt(n)
        return margin + half, margin - half



RULE = PairedScore()
