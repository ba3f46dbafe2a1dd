"""Variance-equivalent group size of a single-rollout baseline, and its companion metrics.

A baseline b_i for a rollout of prompt i is only as good as its distance to the prompt's true
mean reward mu_i. A group-mean baseline over G independent samples of the prompt has mean squared
error sigma_i^2 / G, where sigma_i^2 is the prompt's reward variance (mu_i (1 - mu_i) for a
Bernoulli reward). The variance-equivalent group size of a baseline is the G whose group mean
would be as accurate on average:

    G_eff = mean_i sigma_i^2 / mean_i E[(b_i - mu_i)^2].

mu_i is unknown; we observe m_i held-out samples of prompt i that the baseline did not see, with
mean p_i and unbiased variance s_i^2 (ddof = 1). Because b_i is independent of those samples,

    E[(b_i - p_i)^2] = E[(b_i - mu_i)^2] + sigma_i^2 / m_i,

and s_i^2 / m_i is unbiased for the last term, so the denominator is estimated by
mean_i [(b_i - p_i)^2 - s_i^2 / m_i]. For a Bernoulli reward s_i^2 = p_i (1 - p_i) m_i / (m_i - 1),
so the subtracted noise is p_i (1 - p_i) / (m_i - 1): the issue's `p(1-p)/(K-1)` with K the number
of held-out samples. The numerator mean_i sigma_i^2 is estimated by the mean unbiased per-prompt
variance over all of the prompt's samples (the drawn one included: it is a property of the prompt,
not of the baseline), or by a caller-given per-prompt variance. Both estimates are unbiased, so
G_eff is a ratio of unbiased estimates; with a near-perfect baseline the denominator can be
<= 0 by sampling error, and G_eff is then reported as +inf.

Reference points: a group mean of G other samples has G_eff ~ G; the best constant baseline
(the mean of mu) has G_eff = mean sigma^2 / Var(mu), the floor any useful baseline should beat.

Everything here is float64 numpy over plain arrays; `_P` arrays have one entry per evaluated
rollout (one per prompt), `_P_M` arrays hold held-out rewards padded with NaN.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class HeldOut:
    """Per-prompt statistics of held-out rewards (samples the baseline never saw)."""

    mean_P: np.ndarray  # p_i
    var_P: np.ndarray  # s_i^2, ddof = 1
    n_P: np.ndarray  # m_i (>= 2)


def held_out_stats(rewards_P_M: np.ndarray) -> HeldOut:
    """Mean, unbiased variance and count of each row of a NaN-padded (P, M) reward array."""
    r = np.asarray(rewards_P_M, dtype=np.float64)
    if r.ndim != 2:
        raise ValueError("rewards_P_M must be 2-d (prompts x held-out samples, NaN padded)")
    valid = ~np.isnan(r)
    n = valid.sum(axis=1)
    if r.shape[0] and n.min() < 2:
        raise ValueError("every prompt needs at least 2 held-out samples")
    z = np.where(valid, r, 0.0)
    mean = z.sum(axis=1) / n
    dev2 = np.where(valid, (r - mean[:, None]) ** 2, 0.0)
    var = dev2.sum(axis=1) / (n - 1)
    return HeldOut(mean_P=mean, var_P=var, n_P=n.astype(np.float64))


def prompt_reward_variance(rewards_P_K: np.ndarray) -> np.ndarray:
    """Unbiased per-prompt reward variance over all (non-NaN) samples of each prompt."""
    return held_out_stats(rewards_P_K).var_P


def g_eff(baseline_P: np.ndarray, held: HeldOut, sigma2_P: np.ndarray | None = None) -> float:
    """Variance-equivalent group size (module docstring); +inf when the noise-corrected MSE <= 0."""
    num, den = _g_eff_parts(baseline_P, held, sigma2_P)
    if den <= 0.0:
        return float("inf") if num > 0 else float("nan")
    return float(num / den)


def _g_eff_parts(baseline_P, held: HeldOut, sigma2_P) -> tuple[float, float]:
    b = np.asarray(baseline_P, dtype=np.float64)
    if b.shape != held.mean_P.shape:
        raise ValueError("baseline_P and held-out stats differ in length")
    if b.size == 0:
        raise ValueError("no rollouts to evaluate")
    sigma2 = held.var_P if sigma2_P is None else np.asarray(sigma2_P, dtype=np.float64)
    mse_corrected = (b - held.mean_P) ** 2 - held.var_P / held.n_P
    return float(sigma2.mean()), float(mse_corrected.mean())


def baseline_metrics(
    baseline_P: np.ndarray,
    held: HeldOut,
    sigma2_P: np.ndarray | None = None,
    kish_P: np.ndarray | None = None,
) -> dict[str, float]:
    """G_eff plus the diagnostics reported next to it.

    - `g_eff`: the variance-equivalent group size.
    - `mse`: noise-corrected mean squared error of b against mu (the G_eff denominator).
    - `bias`: mean(b_i - p_i) (unbiased for mean(b_i - mu_i)).
    - `corr`: Pearson correlation of b_i with p_i (NaN when either is constant).
    - `kish_p10`: 10th percentile of the Kish effective neighbours (NaN when not a kernel).
    - `n`: rollouts evaluated.
    """
    b = np.asarray(baseline_P, dtype=np.float64)
    num, den = _g_eff_parts(b, held, sigma2_P)
    out = {
        "g_eff": (float("inf") if num > 0 else float("nan")) if den <= 0 else num / den,
        "mse": den,
        "sigma2": num,
        "bias": float(np.mean(b - held.mean_P)),
        "corr": pearson(b, held.mean_P),
        "kish_p10": float(np.percentile(kish_P, 10)) if kish_P is not None and len(kish_P) else float("nan"),
        "n": float(b.size),
    }
    return out


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    dx, dy = x - x.mean(), y - y.mean()
    sx, sy = np.sqrt((dx * dx).sum()), np.sqrt((dy * dy).sum())
    if sx == 0 or sy == 0:
        return float("nan")
    return float((dx * dy).sum() / (sx * sy))


def kish(weights_N_W: np.ndarray) -> np.ndarray:
    """Kish effective neighbours (sum w)^2 / sum w^2 per row (0 for an all-zero row)."""
    w = np.asarray(weights_N_W, dtype=np.float64)
    s1 = w.sum(axis=-1)
    s2 = (w * w).sum(axis=-1)
    return np.divide(s1 * s1, s2, out=np.zeros_like(s1), where=s2 > 0)


def grpo_split(
    rewards_P_K: np.ndarray, group_size: int, rng: np.random.Generator, repeats: int = 4
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Simulated GRPO baselines: the mean of `group_size` random samples of the prompt.

    For each of `repeats` seeded permutations of each prompt's K samples, the first `group_size`
    form the group-mean baseline and the remaining K - group_size are the held-out samples.
    Returns (baseline_R_P, heldout_mean_R_P, heldout_var_R_P, heldout_n_R_P); needs
    K >= group_size + 2 for every prompt (no NaN padding allowed here).
    """
    r = np.asarray(rewards_P_K, dtype=np.float64)
    P, K = r.shape
    if np.isnan(r).any():
        raise ValueError("grpo_split needs a full (P, K) reward array")
    if K < group_size + 2:
        raise ValueError(f"GRPO at group size {group_size} needs K >= {group_size + 2} samples per prompt, got {K}")
    b, mean, var, n = [], [], [], []
    for _ in range(repeats):
        perm = np.argsort(rng.random((P, K)), axis=1)
        shuffled = np.take_along_axis(r, perm, axis=1)
        b.append(shuffled[:, :group_size].mean(axis=1))
        held = held_out_stats(shuffled[:, group_size:])
        mean.append(held.mean_P)
        var.append(held.var_P)
        n.append(held.n_P)
    return np.array(b), np.array(mean), np.array(var), np.array(n)


def grpo_metrics(rewards_P_K: np.ndarray, group_size: int, seed: int = 0, repeats: int = 4) -> dict[str, float]:
    """`baseline_metrics` for simulated GRPO at `group_size`, averaged over `repeats` splits.

    The numerator and denominator are each averaged over the repeats (both stay unbiased), then
    divided; bias and correlation are averaged.
    """
    rng = np.random.default_rng(seed)
    r = np.asarray(rewards_P_K, dtype=np.float64)
    sigma2 = prompt_reward_variance(r)
    b_R, mean_R, var_R, n_R = grpo_split(r, group_size, rng, repeats)
    mse = float(np.mean((b_R - mean_R) ** 2 - var_R / n_R))
    num = float(sigma2.mean())
    return {
        "g_eff": num / mse if mse > 0 else float("inf"),
        "mse": mse,
        "sigma2": num,
        "bias": float(np.mean(b_R - mean_R)),
        "corr": float(np.nanmean([pearson(b_R[k], mean_R[k]) for k in range(repeats)])),
        "kish_p10": float(group_size),
        "n": float(r.shape[0]),
    }


# ----------------------------------------------------------------------------------------------
# Intervals: a percentile bootstrap over prompts. G_eff is a ratio of two prompt means (sigma^2 and
# the noise-corrected squared error), so a resample redraws prompts, not rollouts: the error bar
# says how much the number depends on which prompts the log happened to hold.

BOOT_RESAMPLES = 1000
BOOT_LEVEL = 0.90


def squared_error_P(baseline_P: np.ndarray, held: HeldOut) -> np.ndarray:
    """Each prompt's noise-corrected squared error (b_i - p_i)^2 - s_i^2 / m_i (the G_eff
    denominator is its mean)."""
    b = np.asarray(baseline_P, dtype=np.float64)
    if b.shape != held.mean_P.shape:
        raise ValueError("baseline_P and held-out stats differ in length")
    return (b - held.mean_P) ** 2 - held.var_P / held.n_P


def grpo_squared_error_P(rewards_P_K: np.ndarray, group_size: int, seed: int = 0, repeats: int = 4) -> np.ndarray:
    """Each prompt's noise-corrected squared error under simulated GRPO at `group_size`, averaged
    over the same `repeats` splits `grpo_metrics` draws (its mse is this array's mean)."""
    b_R, mean_R, var_R, n_R = grpo_split(rewards_P_K, group_size, np.random.default_rng(seed), repeats)
    return np.mean((b_R - mean_R) ** 2 - var_R / n_R, axis=0)


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den elementwise, +inf where den <= 0 < num (a near-perfect baseline), NaN where both <= 0."""
    safe = np.where(den > 0, den, 1.0)
    return np.where(den > 0, num / safe, np.where(num > 0, np.inf, np.nan))


def _resample_index(n: int, resamples: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n, size=(resamples, n))


def _percentiles(values: np.ndarray, level: float) -> tuple[float, float]:
    """The (1 - level) / 2 and (1 + level) / 2 percentiles by rank: +inf sorts last, NaN is dropped."""
    v = np.sort(values[~np.isnan(values)])
    if v.size == 0:
        return float("nan"), float("nan")
    lo = v[int(np.floor((1 - level) / 2 * (v.size - 1)))]
    hi = v[int(np.ceil((1 + level) / 2 * (v.size - 1)))]
    return float(lo), float(hi)


def g_eff_interval(sigma2_P: np.ndarray, sq_error_P: np.ndarray, *, resamples: int = BOOT_RESAMPLES,
                   level: float = BOOT_LEVEL, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of G_eff = mean(sigma2_P) / mean(sq_error_P) over prompts."""
    sigma2_P, sq_error_P = np.asarray(sigma2_P, np.float64), np.asarray(sq_error_P, np.float64)
    if sigma2_P.shape != sq_error_P.shape or sigma2_P.ndim != 1 or sigma2_P.size == 0:
        raise ValueError("sigma2_P and sq_error_P need one entry per prompt")
    idx_R_P = _resample_index(sigma2_P.size, resamples, seed)
    return _percentiles(_ratio(sigma2_P[idx_R_P].mean(1), sq_error_P[idx_R_P].mean(1)), level)


def g_eff_difference_interval(sigma2_P: np.ndarray, sq_error_a_P: np.ndarray, sq_error_b_P: np.ndarray, *,
                              resamples: int = BOOT_RESAMPLES, level: float = BOOT_LEVEL,
                              seed: int = 0) -> tuple[float, float]:
    """Paired bootstrap interval of G_eff(a) - G_eff(b) on the same prompts: each resample redraws
    the prompts once for both baselines (a transferred recipe against the column's own)."""
    sigma2_P = np.asarray(sigma2_P, np.float64)
    a_P, b_P = np.asarray(sq_error_a_P, np.float64), np.asarray(sq_error_b_P, np.float64)
    if not (sigma2_P.shape == a_P.shape == b_P.shape) or sigma2_P.ndim != 1 or sigma2_P.size == 0:
        raise ValueError("sigma2_P and both sq_error arrays need one entry per prompt")
    idx_R_P = _resample_index(sigma2_P.size, resamples, seed)
    num_R = sigma2_P[idx_R_P].mean(1)
    with np.errstate(invalid="ignore"):  # inf - inf: both near-perfect on a resample, dropped as NaN
        return _percentiles(_ratio(num_R, a_P[idx_R_P].mean(1)) - _ratio(num_R, b_P[idx_R_P].mean(1)), level)
