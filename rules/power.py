"""The power of a spec before any GPU time: the model every rule's power reading assumes, and the
design table (seeds x items).

The model. A seed's mean paired difference on n items is

    d_s = delta + b_s + (1/n) sum_i e_is,    b_s ~ N(0, tau^2),  Var(e_is) = item_sd^2,

a run-level shift b_s (the run-to-run spread: on a GPU one run per seed is a draw) plus the items'
noise; so d_s ~ N(delta, sigma(n)^2) with sigma(n)^2 = tau^2 + item_sd^2 / n. The spec
pre-registers `between_seed_sd`, sigma at its own eval items (n_eval): tau^2 is what is left of it
after the items' share, and the design table scales the items' share to other item counts.

The defaults, and where they come from (main at 28b1b68, Qwen2.5-Coder-1.5B on one H200):
- between_seed_sd = 0.02: the user's spec run in full three times at seed 0 gave gs1_kernel -
  grpo_gs8 = +0.0091, -0.0099, +0.0281 on all 1,319 GSM8K test items (SD 0.019);
- item_sd = 0.40: the SD of one item's paired difference within a seed, over the ten arm-seed
  pairs of `results/h200-comparison` (0.37-0.42; 14-18 % of the items discordant).

A rule that reads one seed covers the difference of the checkpoints it was given; its power
against a true difference over runs carries the run-level shift all the same (the power of a
single run is the chance that this draw concludes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, field_validator

DEFAULT_BETWEEN_SEED_SD = 0.02
DEFAULT_ITEM_SD = 0.40
DESIGN_SEEDS = (1, 2, 4, 8, 16)
SPREAD_SOURCE = ("between_seed_sd 0.02: three full seed-0 runs of the user's spec on the H200 (gs1_kernel - grpo_gs8 = "
                 "+0.0091, -0.0099, +0.0281 at 1,319 items); item_sd 0.40: one item's paired difference within a seed, "
                 "the ten arm-seed pairs of results/h200-comparison")


class PowerDesign(BaseModel):
    """The spread a spec pre-registers for its power reading, and its optional power gate."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    between_seed_sd: float = DEFAULT_BETWEEN_SEED_SD  # SD over runs of a seed's mean difference at n_eval items
    item_sd: float = DEFAULT_ITEM_SD  # SD of one item's paired difference within a seed
    n_eval: int  # the items between_seed_sd was measured at (the spec's eval items)
    min_power: float | None = None  # the power gate: P(conclusive) at power_difference must reach it
    power_difference: float | None = None  # the true difference the gate reads (None: half the margin)
    from_spec: bool = False  # whether the spread is the spec's own or the defaults

    @field_validator("between_seed_sd", "item_sd")
    @classmethod
    def _positive(cls, v):
        if not v > 0:
            raise ValueError("must be > 0")
        return v

    def seed_sd(self, n: int) -> float:
        """sigma(n): the SD of one seed's mean paired difference over n items."""
        run_var = max(self.between_seed_sd ** 2 - self.item_sd ** 2 / self.n_eval, 0.0)
        return math.sqrt(run_var + self.item_sd ** 2 / n)

    def run_sd(self) -> float:
        """tau: the run-level part of the spread (what more items cannot shrink)."""
        return math.sqrt(max(self.between_seed_sd ** 2 - self.item_sd ** 2 / self.n_eval, 0.0))

    def gate_difference(self, margin: float) -> float:
        return margin / 2 if self.power_difference is None else self.power_difference


@dataclass(frozen=True)
class PowerPoint:
    true_diff: float
    p_noninferior: float
    p_inferior: float

    @property
    def p_conclusive(self) -> float:
        return self.p_noninferior + self.p_inferior

    def record(self) -> dict:
        return {"true_diff": self.true_diff, "p_noninferior": self.p_noninferior, "p_inferior": self.p_inferior,
                "p_conclusive": self.p_conclusive}


@dataclass(frozen=True)
class DesignCell:
    """One (seeds, items) design: its thresholds and P(conclusive) at each reading's true differences."""

    seeds: int
    items: int
    noninferior_threshold: float | None  # None: the rule cannot read this many seeds
    inferior_threshold: float | None
    points: tuple[PowerPoint, ...]
    why_not: str | None = None

    def record(self) -> dict:
        return {"seeds": self.seeds, "items": self.items, "noninferior_threshold": self.noninferior_threshold,
                "inferior_threshold": self.inferior_threshold, "points": [p.record() for p in self.points],
                "why_not": self.why_not}


@dataclass(frozen=True)
class PowerReading:
    """What a spec's rule can tell at its items, seeds and margin, before any GPU time."""

    method: str
    n: int
    seeds: int
    alpha: float
    level: float  # alpha / m: the level Holm tests the first of m compared arms at (power's floor)
    compared: int
    margin: float
    noninferior_threshold: float | None
    inferior_threshold: float | None
    points: tuple[PowerPoint, ...]  # at 0, half the margin, and the gate's difference
    design: PowerDesign
    table: tuple[DesignCell, ...]
    why_not: str | None = None  # the rule cannot read the spec's seeds

    def point(self, true_diff: float) -> PowerPoint | None:
        return next((p for p in self.points if math.isclose(p.true_diff, true_diff, abs_tol=1e-12)), None)

    @property
    def gate_point(self) -> PowerPoint | None:
        return self.point(self.design.gate_difference(self.margin))

    @property
    def gate_passed(self) -> bool | None:
        """None without a power gate; else whether P(conclusive) at the gate's difference reaches it."""
        if self.design.min_power is None:
            return None
        point = self.gate_point
        return point is not None and point.p_conclusive >= self.design.min_power

    def gate_row(self) -> dict | None:
        """The feasibility gate's check of a pre-registered power gate (None without one): P(conclusive)
        at the gate's difference against `min_power`, the reading in words beside it."""
        if self.design.min_power is None:
            return None
        point = self.gate_point
        return {"gate": "feasibility", "metric": "power", "value": point.p_conclusive if point else float("nan"),
                "op": "min", "bound": str(self.design.min_power), "passed": bool(self.gate_passed),
                "observed": self.summary()}

    def summary(self) -> str:
        """One paragraph: the thresholds and the chance of a conclusive verdict, with the spread assumed."""
        if self.why_not is not None:
            return f"{self.method} cannot read this spec: {self.why_not}."
        at = "; ".join(f"{p.p_conclusive:.0%} at a true difference of {p.true_diff:+.4f} "
                       f"({p.p_noninferior:.0%} noninferior, {p.p_inferior:.0%} inferior)" for p in self.points)
        holm = f" (α/{self.compared} = {self.level:g}: Holm's first step over {self.compared} arms)" if self.compared > 1 else ""
        spread = (f"a between-seed SD of {self.design.between_seed_sd:g} at {self.design.n_eval} items and an item SD of "
                  f"{self.design.item_sd:g} ({'the spec' if self.design.from_spec else 'measured: ' + SPREAD_SOURCE})")
        gate = ("" if self.design.min_power is None else
                f" Power gate: P(conclusive) at {self.design.gate_difference(self.margin):+.4f} must reach "
                f"{self.design.min_power:.0%}: {'passes' if self.gate_passed else 'FAILS'}.")
        return (f"{self.method} at {self.n} items x {self.seeds} seed(s), α={self.alpha:g}{holm}, margin {self.margin:+.4f}: "
                f"noninferior when the observed difference is above {self.noninferior_threshold:+.4f}, inferior when below "
                f"{self.inferior_threshold:+.4f}. P(conclusive): {at}; assuming {spread}.{gate}")

    def table_markdown(self) -> str:
        """The design table: seeds x items, each with its thresholds and P(conclusive) at each difference."""
        differences = reading_differences(self.margin, self.design)
        head = ("| seeds | items | noninferior above | inferior below | "
                + " | ".join(f"P(conclusive) at {d:+.4f}" for d in differences) + " |\n"
                + "|---|---|---|---|" + "---|" * len(differences) + "\n")
        rows = []
        for c in self.table:
            if c.why_not is not None:
                rows.append(f"| {c.seeds} | {c.items} | — | — | " + " | ".join("—" for _ in differences) + " |")
                continue
            rows.append(f"| {c.seeds} | {c.items} | {c.noninferior_threshold:+.4f} | {c.inferior_threshold:+.4f} | "
                        + " | ".join(f"{p.p_conclusive:.3f}" for p in c.points) + " |")
        return head + "\n".join(rows) + "\n"

    def record(self) -> dict:
        return {
            "method": self.method, "n": self.n, "seeds": self.seeds, "alpha": self.alpha, "level": self.level,
            "compared": self.compared, "margin": self.margin, "noninferior_threshold": self.noninferior_threshold,
            "inferior_threshold": self.inferior_threshold, "power": [p.record() for p in self.points],
            "min_power": self.design.min_power, "power_difference": self.design.gate_difference(self.margin),
            "gate_passed": self.gate_passed, "why_not": self.why_not,
            "assumptions": {"between_seed_sd": self.design.between_seed_sd, "item_sd": self.design.item_sd,
                            "n_eval": self.design.n_eval, "run_sd": self.design.run_sd(),
                            "source": "the spec" if self.design.from_spec else SPREAD_SOURCE},
            "design": [c.record() for c in self.table],
        }


def reading_differences(margin: float, design: PowerDesign) -> tuple[float, ...]:
    """The true differences a power reading states: 0, half the margin, and the gate's."""
    return tuple(dict.fromkeys([0.0, margin / 2, design.gate_difference(margin)]))


def power_reading(rule, settings, *, n: int, seeds: int, alpha: float, margin: float, compared: int,
                  design: PowerDesign, bounds=(0.0, 1.0), items: tuple[int, ...] = (),
                  seed_counts: tuple[int, ...] = DESIGN_SEEDS) -> PowerReading:
    """The spec's power reading under `rule` (an `rules.base.Rule`): its thresholds and power at n
    items and `seeds` seeds, and the design table over `seed_counts` (and the spec's own) x `items`
    (n when empty)."""
    level = alpha / max(compared, 1)
    differences = reading_differences(margin, design)

    def cell(s: int, k: int) -> DesignCell:
        problem = rule.seeds_problem(s)
        if problem is not None:
            return DesignCell(s, k, None, None, (), problem)
        ni, inf = rule.observed_thresholds(design, k, s, level, margin, bounds, settings)
        points = tuple(PowerPoint(d, *rule.power(design, d, k, s, level, margin, bounds, settings)) for d in differences)
        return DesignCell(s, k, ni, inf, points)

    own = cell(seeds, n)
    table = tuple(cell(s, k) for k in (items or (n,)) for s in sorted({*seed_counts, seeds}))
    return PowerReading(rule.method, n, seeds, float(alpha), level, compared, float(margin), own.noninferior_threshold,
                        own.inferior_threshold, own.points, design, table, own.why_not)
