"""hierarchical_bootstrap: seeds resampled, then items within each drawn seed.

Each of `n_resamples` resamples draws S seeds with replacement, then n items with replacement
within each drawn seed, and takes the mean paired difference over the S x n draws; the bounds are
the alpha and 1 - alpha percentiles of those means (numpy's "inverted_cdf": lower > margin exactly
when fewer than alpha of them lie at or below the margin), the one-sided p-values the share of
resampled means at or below (at or above) the margin. The draws are fixed by `rng_seed` (numpy's
PCG64): the spec pins both, so a decision recomputes to the same numbers. Like the seed-t rule it
covers the difference over runs (Agarwal et al. 2021 resample runs the same way); it needs at
least 3 seeds, and with few seeds its percentile bound is a little optimistic where the run-level
spread dominates the items' (the simulation in `benchmarks/decision_rules.py` measures how much).
"""

from __future__ import annotations

import functools
import math
import random
from typing import Literal

import numpy as np
from pydantic import field_validator
from scipy.stats import norm

from rules.base import Rule, RuleSettings, SeededPairs

DEFAULT_RESAMPLES = 10_000
_CHUNK = 256  # resamples drawn at once (memory: chunk x seeds x items indices)


class HierarchicalBootstrapSettings(RuleSettings):
    method: Literal["hierarchical_bootstrap"] = "hierarchical_bootstrap"
    n_resamples: int = DEFAULT_RESAMPLES
    rng_seed: int = 0

    @field_validator("n_resamples")
    @classmethod
    def _resamples(cls, v):
        if v < 1:
            raise ValueError("must be >= 1")
        return v


@functools.lru_cache(maxsize=16)
def _resampled_means(diff_bytes: bytes, shape: tuple[int, int], n_resamples: int, rng_seed: int) -> np.ndarray:
    """means_B: the mean paired difference of each resample, in draw order."""
    diff_S_N = np.frombuffer(diff_bytes, dtype=np.float64).reshape(shape)
    seeds, n = shape
    rng = np.random.default_rng(rng_seed)
    means_B = np.empty(n_resamples)
    for start in range(0, n_resamples, _CHUNK):
        stop = min(start + _CHUNK, n_resamples)
        drawn_C_S = rng.integers(0, seeds, size=(stop - start, seeds))
        items_C_S_N = rng.integers(0, n, size=(stop - start, seeds, n))
        means_B[start:stop] = diff_S_N[drawn_C_S[:, :, None], items_C_S_N].mean(axis=(1, 2))
    return means_B


def resampled_means(pairs: SeededPairs, settings: HierarchicalBootstrapSettings) -> np.ndarray:
    diff_S_N = np.ascontiguousarray(pairs.diff_S_N, dtype=np.float64)
    return _resampled_means(diff_S_N.tobytes(), diff_S_N.shape, settings.n_resamples, settings.rng_seed)


class HierarchicalBootstrap(Rule):
    method = "hierarchical_bootstrap"
    settings_type = HierarchicalBootstrapSettings
    own_spec_keys = ("n_resamples", "rng_seed")
    min_seeds = 3
    seed_aware = True
    bounds_name = "hierarchical bootstrap bounds"
    summary = ("seeds resampled, then items within each drawn seed; noninferior when the α percentile of the "
               "resampled mean differences exceeds the margin, inferior when the 1-α percentile is below it")
    covers = "the difference over runs (seeds resampled: the run-to-run spread is in its bound)"

    def interval(self, pairs, level, bounds, settings):
        means = resampled_means(pairs, settings)
        return (float(np.quantile(means, level, method="inverted_cdf")),
                float(np.quantile(means, 1.0 - level, method="inverted_cdf")))

    def p_values(self, pairs, margin, bounds, settings):
        means = resampled_means(pairs, settings)
        return float(np.mean(means <= margin)), float(np.mean(means >= margin))

    def details(self, pairs, alpha, bounds, settings):
        return {"n_resamples": settings.n_resamples, "rng_seed": settings.rng_seed,
                "seed_diffs": [float(d) for d in pairs.seed_means()]}

    def reference(self, treatment_S_N, baseline_S_N, *, alpha, margin, bounds, settings):
        """An independent bootstrap (Python's `random`, loops, sorted order statistics): its
        numbers agree with the rule's within Monte Carlo error, not to the bit."""
        rng = random.Random(settings.rng_seed)
        diffs = [[t - b for t, b in zip(ts, bs)] for ts, bs in zip(treatment_S_N, baseline_S_N)]
        seeds, n = len(diffs), len(diffs[0])
        means = []
        for _ in range(settings.n_resamples):
            total = 0.0
            for _ in range(seeds):
                row = diffs[rng.randrange(seeds)]
                total += sum(row[rng.randrange(n)] for _ in range(n))
            means.append(total / (seeds * n))
        ordered = sorted(means)
        k_lower = max(math.ceil(alpha * len(ordered)) - 1, 0)
        k_upper = max(math.ceil((1 - alpha) * len(ordered)) - 1, 0)
        return {"lower": ordered[k_lower], "upper": ordered[k_upper],
                "p_noninferior": sum(m <= margin for m in means) / len(means),
                "p_inferior": sum(m >= margin for m in means) / len(means), "monte_carlo": True}

    @staticmethod
    def _bootstrap_se(design, n, seeds) -> float:
        # E[bootstrap variance of the mean]: the seeds' spread with divisor S, plus the items' again
        return math.sqrt(((seeds - 1) / seeds * design.seed_sd(n) ** 2 + design.item_sd ** 2 / n) / seeds)

    def observed_thresholds(self, design, n, seeds, level, margin, bounds, settings):
        half = float(norm.ppf(1.0 - level)) * self._bootstrap_se(design, n, seeds)
        return margin + half, margin - half



RULE = HierarchicalBootstrap()
