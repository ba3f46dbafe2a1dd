"""The GS1 kernel specification: the one place that says what a kernel is and what it defaults to.

The spec schema builds a `KernelSpec` (an arm's optional `kernel` object), the run plan carries it,
the training arm holds it, and the estimator (`estimators`) and the independent reference
(`estimators.reference`) take it whole. It validates once, here; nothing downstream re-checks or re-defaults.

Semantics (DESIGN.md, "Spec semantics pinned here"):
- features: prompt features the training loop logs, z-scored over the window;
- scales: a per-feature multiplier after z-scoring (None = 1 each);
- family: gaussian w = exp(-d^2 / (2 h^2)); laplace w = exp(-d / h); knn w = 1 on the
  k = round(h) nearest others (ties: the older rollout first), 0 elsewhere;
- window: rollouts the baseline may draw on, the current batch included;
- min_mass: when sum_j w_ij falls below it the baseline is the window mean without i.

`KernelForm` is those fields alone, over any family and feature name: the offline hill-climb's
candidates (`hillclimb.climb.KernelRecipe`) range over that wider space, and `KernelSpec` is the
part of it the arm runs. A changed recipe is made through the typed `with_*` methods, which
validate it again (never by editing a dict).

`CALIBRATION` is the spec's single pre-registered calibration of the kernel's bandwidth.
"""

from __future__ import annotations

import math
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from schemas.errors import FieldProblems, known_keys_only

# The prompt features the training loop logs, in the order the spec pins them.
FEATURE_NAMES = ("log_prompt_num_tokens", "prompt_mean_logprob")
KERNEL_FAMILIES = ("gaussian", "laplace", "knn")
KernelFamily = Literal["gaussian", "laplace", "knn"]


class KernelForm(BaseModel):
    """The fields of a kernel baseline recipe, unchecked against what the arm runs (the hill-climb
    also scores other families and features). Each is declared here once; `KernelSpec` narrows."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    family: str
    features: tuple[str, ...]
    scales: tuple[float, ...] | None = None  # per feature, after z-scoring; None = 1 each
    bandwidth: float | None  # h (gaussian, laplace); k = round(h) (knn); None where a family has none
    window: int
    min_mass: float = 1e-3

    @model_validator(mode="before")
    @classmethod
    def _known_keys_only(cls, data):
        return known_keys_only(cls, data)

    def scale_of(self, feature: str) -> float:
        """The multiplier of `feature`'s z-score: 0 when the recipe does not use it."""
        if feature not in self.features:
            return 0.0
        return 1.0 if self.scales is None else float(self.scales[self.features.index(feature)])

    def with_bandwidth(self, bandwidth: float) -> Self:
        """The same recipe at another bandwidth (the pre-registered calibration, an override),
        validated as its class validates."""
        return type(self).model_validate({**self.model_dump(), "bandwidth": bandwidth})

    def with_window(self, window: int) -> Self:
        """The same recipe over another window of rollouts, validated as its class validates."""
        return type(self).model_validate({**self.model_dump(), "window": window})


class KernelSpec(KernelForm):
    """One GS1 kernel recipe the arm runs; the defaults are the user's pre-registered kernel."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    family: str = "gaussian"
    features: tuple[str, ...] = FEATURE_NAMES
    scales: tuple[float, ...] | None = None
    bandwidth: float = 0.5  # h (gaussian, laplace); k = round(h) (knn)
    window: int = 256
    min_mass: float = 1e-3

    @field_validator("family")
    @classmethod
    def _family(cls, v):
        if v not in KERNEL_FAMILIES:
            raise ValueError(f"unknown kernel family {v!r} (known: {', '.join(KERNEL_FAMILIES)})")
        return v

    @field_validator("features")
    @classmethod
    def _features(cls, v):
        if not v:
            raise ValueError("must name at least one feature")
        unknown = [f for f in v if f not in FEATURE_NAMES]
        if unknown:
            raise ValueError(f"unknown feature(s) {unknown} (known: {', '.join(FEATURE_NAMES)})")
        if len(set(v)) != len(v):
            raise ValueError("duplicate feature")
        return v

    @field_validator("bandwidth")
    @classmethod
    def _bandwidth(cls, v):
        if not (math.isfinite(v) and v > 0):
            raise ValueError("must be > 0")
        return v

    @field_validator("window")
    @classmethod
    def _window(cls, v):
        if v < 1:
            raise ValueError("must be >= 1")
        return v

    @field_validator("min_mass")
    @classmethod
    def _min_mass(cls, v):
        if not (math.isfinite(v) and v >= 0):
            raise ValueError("must be >= 0")
        return v

    @model_validator(mode="after")
    def _recipe(self):
        problems = []
        if self.family == "knn" and not round(self.bandwidth) >= 1:
            problems.append(("bandwidth", f"knn takes k = round(bandwidth) >= 1, got {self.bandwidth}"))
        if self.scales is not None:
            if len(self.scales) != len(self.features):
                problems.append(("scales", f"has {len(self.scales)} entries for {len(self.features)} features"))
            problems += [(f"scales.{i}", "must be > 0") for i, s in enumerate(self.scales) if not (math.isfinite(s) and s > 0)]
        if problems:
            raise FieldProblems(problems)
        return self

    @property
    def knn_k(self) -> int:
        """k of a knn kernel: the bandwidth rounded to the nearest integer."""
        return int(round(self.bandwidth))

    def label(self) -> str:
        features = ",".join(
            f if self.scales is None or self.scales[i] == 1 else f"{self.scales[i]:g}*{f}" for i, f in enumerate(self.features)
        )
        h = "k" if self.family == "knn" else "h"
        return f"{self.family}[{features}] {h}={self.bandwidth:g} W={self.window} min_mass={self.min_mass:g}"


class KernelCalibration(BaseModel):
    """The spec's single pre-registered calibration (its activation-failure plan (c); DESIGN.md,
    "The experiment flow"): when the pilot fails `metric`, the treatment is re-piloted once at the
    other bandwidth of `bandwidths`, chosen by the gate on pilot training prompts only, within the
    spec's `pilot.calibration_wall_minutes` (at most the pilot's steps)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bandwidths: tuple[float, float] = (0.5, 1.0)
    metric: str = "kernel_effective_neighbors_p10"

    def other_bandwidth(self, kernel: KernelSpec) -> float:
        """The bandwidth the calibration re-pilots `kernel` at: the pair's first one it is not at."""
        return next(h for h in self.bandwidths if h != kernel.bandwidth)


CALIBRATION = KernelCalibration()
