"""What a decision rule is: the `Rule` every rule module under `rules/` subclasses, the paired
outcomes it reads (`SeededPairs`) and what it answers (`Reading`). Float64 numpy and scipy; no
torch, tinker or prefect here.

A rule module owns, for its rule (the spec's `decision_rule.method`, the only name a rule has):

- its spec fields: a frozen pydantic model keyed by `method` (`settings_type`), read from the
  keys it names in `decision_rule` (`own_spec_keys`), and how many seeds it needs;
- its verdict from paired per-item outcomes grouped by seed (`read`), its one-sided p-values for
  Holm (`p_values`) and its bounds at any level (`interval`);
- its independent reference (`reference`), which shares no code with `read`;
- its power before any GPU time (`observed_thresholds`, `power`), under the power model of
  `rules.power`;
- its wording: what its bounds are called, how it decides, what its lower bound covers.

The registry (`rules.registry`) maps each method to its Rule; spec validation, the decision
stage, `gs1 decide`, `gs1 power`, the artifacts, the report and the units table ask it and never
name a rule.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict
from scipy.stats import norm

from schemas.errors import EvalDataError

class RuleSettings(BaseModel):
    """A rule's own spec fields (each rule subclasses this with `method: Literal[...]`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    method: str


@dataclass(frozen=True)
class SeededPairs:
    """Two arms' per-item outcomes, paired within each seed: row s of both arrays is seed
    `seeds[s]`, column i the item `item_ids[i]` (sorted; every seed holds the same items)."""

    seeds: tuple[int, ...]
    item_ids: tuple[str, ...]
    treatment_S_N: np.ndarray
    baseline_S_N: np.ndarray

    @classmethod
    def of(cls, treatment: Mapping[int, Mapping[str, float]], baseline: Mapping[int, Mapping[str, float]],
           arm: str = "treatment") -> SeededPairs:
        """From seed -> item -> outcome maps of the two arms; EvalDataError when the seeds, or the
        items of a seed, differ."""
        seeds = tuple(sorted(baseline))
        if not seeds:
            raise EvalDataError(f"{arm}: no seed has eval results")
        if tuple(sorted(treatment)) != seeds:
            raise EvalDataError(f"{arm}: seeds {sorted(treatment)} differ from the baseline's {list(seeds)}")
        items = tuple(sorted(baseline[seeds[0]]))
        if not items:
            raise ValueError("no paired items")
        for side, by_seed in (("baseline", baseline), (arm, treatment)):  # each arm holds one item set over its seeds
            first = by_seed[seeds[0]].keys()
            for s in seeds[1:]:
                if by_seed[s].keys() != first:
                    raise EvalDataError(f"{side}: seed {s} holds other eval items than seed {seeds[0]}")
        only_treatment = treatment[seeds[0]].keys() - set(items)
        only_baseline = set(items) - treatment[seeds[0]].keys()
        if only_treatment or only_baseline:
            raise EvalDataError(f"item sets differ: {len(only_treatment) + len(only_baseline)} item(s) differ "
                                f"({len(only_treatment)} only in {arm}, {len(only_baseline)} only in baseline)")
        t = np.array([[treatment[s][i] for i in items] for s in seeds], dtype=np.float64)
        b = np.array([[baseline[s][i] for i in items] for s in seeds], dtype=np.float64)
        return cls(seeds, items, t, b)

    @classmethod
    def one_seed(cls, treatment_N, baseline_N, seed: int = 0) -> SeededPairs:
        """One seed's paired outcome arrays (items in the given order)."""
        t = np.asarray(treatment_N, dtype=np.float64)
        b = np.asarray(baseline_N, dtype=np.float64)
        if t.ndim != 1 or t.shape != b.shape:
            raise ValueError("treatment and baseline must be 1-d and paired (equal length)")
        if t.size == 0:
            raise ValueError("no paired items")
        return cls((seed,), tuple(str(i) for i in range(t.size)), t[None, :], b[None, :])

    def __post_init__(self):
        if self.treatment_S_N.shape != self.baseline_S_N.shape or self.treatment_S_N.ndim != 2:
            raise ValueError("treatment and baseline must be seeds x items arrays of one shape")
        if not (np.all(np.isfinite(self.treatment_S_N)) and np.all(np.isfinite(self.baseline_S_N))):
            raise ValueError("outcomes must be finite")

    @property
    def n(self) -> int:
        return self.treatment_S_N.shape[1]

    @property
    def n_seeds(self) -> int:
        return self.treatment_S_N.shape[0]

    @property
    def diff_S_N(self) -> np.ndarray:
        return self.treatment_S_N - self.baseline_S_N

    def seed_means(self) -> np.ndarray:
        """diff_S: each seed's mean paired difference over the items."""
        return self.diff_S_N.mean(axis=1)

    def mean_diff_by_seed(self) -> dict[str, float]:
        """Each seed's mean paired difference, keyed by the seed as text (the records' JSON keys)."""
        return {str(s): float(d) for s, d in zip(self.seeds, self.seed_means())}

    def seed_averaged(self) -> tuple[np.ndarray, np.ndarray]:
        """(treatment_N, baseline_N): each item's outcome averaged over the seeds."""
        return self.treatment_S_N.mean(axis=0), self.baseline_S_N.mean(axis=0)

    def check_bounds(self, bounds) -> None:
        lo, hi = bounds
        if np.any((self.treatment_S_N < lo) | (self.treatment_S_N > hi) | (self.baseline_S_N < lo) | (self.baseline_S_N > hi)):
            raise ValueError(f"outcomes must lie within bounds [{lo}, {hi}]")


@dataclass(frozen=True)
class Reading:
    """What a rule makes of one pair of arms at level alpha: bounds, one-sided p-values, verdict
    (noninferior when lower > margin, inferior when upper < margin, else inconclusive)."""

    method: str
    n: int  # paired items per seed
    seeds: int
    mean_diff: float
    lower: float
    upper: float
    alpha: float
    margin: float
    p_noninferior: float  # of H0: true difference <= margin
    p_inferior: float  # of H0: true difference >= margin
    details: Mapping[str, Any] = field(default_factory=dict)  # the rule's own numbers (df, quantile, ...)

    @property
    def verdict(self) -> str:
        if self.lower > self.margin:
            return "noninferior"
        if self.upper < self.margin:
            return "inferior"
        return "inconclusive"

    def record(self) -> dict:
        """The decision record's fields (as the `decision` artifact names them)."""
        return {"method": self.method, "n": int(self.n), "mean_diff": float(self.mean_diff), "lower": float(self.lower),
                "upper": float(self.upper), "alpha": float(self.alpha), "margin": float(self.margin),
                "verdict": self.verdict, "p_noninferior": float(self.p_noninferior),
                "p_inferior": float(self.p_inferior), "rule_details": dict(self.details)}


def check_alpha(alpha: float) -> None:
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")


def value_range(bounds) -> float:
    lo, hi = (float(b) for b in bounds)
    if not hi > lo:
        raise ValueError(f"bounds must be (lo, hi) with hi > lo, got {bounds}")
    return hi - lo


class Rule:
    """One decision rule. Subclasses set the class attributes and implement `interval`,
    `p_values`, `reference`, `observed_thresholds` and `power`."""

    method: ClassVar[str]
    settings_type: ClassVar[type[RuleSettings]]
    own_spec_keys: ClassVar[tuple[str, ...]] = ()  # decision_rule keys this rule reads (its settings)
    min_seeds: ClassVar[int] = 1
    max_seeds: ClassVar[int | None] = None
    bounds_name: ClassVar[str]  # "Hoeffding bounds": what the table calls its interval
    summary: ClassVar[str]  # how it decides, one sentence
    covers: ClassVar[str]  # what its lower bound covers: these checkpoints, or the difference over runs
    seed_aware: ClassVar[bool] = False  # the seed is its unit of replication

    def settings(self, **fields) -> RuleSettings:
        return self.settings_type(method=self.method, **fields)

    def seeds_problem(self, n_seeds: int) -> str | None:
        """Why this rule cannot read `n_seeds` seeds, or None."""
        if n_seeds < self.min_seeds:
            return f"{self.method} needs at least {self.min_seeds} seeds (got {n_seeds})"
        if self.max_seeds is not None and n_seeds > self.max_seeds:
            return (f"{self.method} reads {'one seed' if self.max_seeds == 1 else f'at most {self.max_seeds} seeds'} "
                    f"(got {n_seeds}): a seed-aware rule reads several")
        return None

    def read(self, pairs: SeededPairs, *, alpha: float, margin: float, bounds=(0.0, 1.0),
             settings: RuleSettings | None = None) -> Reading:
        """The rule's reading of `pairs` at level alpha against the margin."""
        settings = settings or self.settings()
        check_alpha(alpha)
        value_range(bounds)
        pairs.check_bounds(bounds)
        if (problem := self.seeds_problem(pairs.n_seeds)) is not None:
            raise ValueError(problem)
        lower, upper = self.interval(pairs, alpha, bounds, settings)
        p_noninferior, p_inferior = self.p_values(pairs, margin, bounds, settings)
        return Reading(self.method, pairs.n, pairs.n_seeds, self.mean_diff(pairs), lower, upper, float(alpha),
                       float(margin), p_noninferior, p_inferior, self.details(pairs, alpha, bounds, settings))

    def mean_diff(self, pairs: SeededPairs) -> float:
        """The observed difference the rule's bounds are around (the mean over seeds and items)."""
        t_N, b_N = pairs.seed_averaged()
        return float(np.mean(t_N - b_N))

    def details(self, pairs: SeededPairs, alpha: float, bounds, settings: RuleSettings) -> dict:
        return {}

    # --- each rule's own
    def interval(self, pairs: SeededPairs, level: float, bounds, settings: RuleSettings) -> tuple[float, float]:
        """(lower, upper): one-sided bounds, each at `level`."""
        raise NotImplementedError

    def p_values(self, pairs: SeededPairs, margin: float, bounds, settings: RuleSettings) -> tuple[float, float]:
        """(p of H0: difference <= margin, p of H0: difference >= margin), one-sided."""
        raise NotImplementedError

    def reference(self, treatment_S_N, baseline_S_N, *, alpha: float, margin: float, bounds,
                  settings: RuleSettings) -> dict:
        """The independent reference: {lower, upper, p_noninferior, p_inferior} from plain lists,
        sharing no code with `interval` and `p_values`."""
        raise NotImplementedError

    def observed_thresholds(self, design, n: int, seeds: int, level: float, margin: float,
                            bounds, settings: RuleSettings) -> tuple[float, float]:
        """(the smallest observed difference it would call noninferior, the largest it would call
        inferior) at n items and `seeds` seeds, at the power model's `design` spread."""
        raise NotImplementedError

    def power(self, design, true_diff: float, n: int, seeds: int, level: float, margin: float, bounds,
              settings: RuleSettings) -> tuple[float, float]:
        """(P(noninferior), P(inferior)) when the true difference is `true_diff`. Here for a rule whose
        thresholds do not move with the data: the observed mean ~ N(true_diff, sigma(n)^2 / seeds)
        against them (a rule whose bound carries the observed spread overrides it)."""
        ni, inf = self.observed_thresholds(design, n, seeds, level, margin, bounds, settings)
        se = design.seed_sd(n) / math.sqrt(seeds)
        return float(norm.sf((ni - true_diff) / se)), float(norm.cdf((inf - true_diff) / se))
