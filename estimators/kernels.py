"""Kernel pieces of the GS1 cross-prompt baseline (float64 numpy, pure functions).

Prompt features, their standardisation over a window, kernel weights and the effective number of
neighbours. `estimators.gs1_kernel_step` puts them together. Semantics pinned in DESIGN.md:

- phi = (log prompt_num_tokens, prompt_mean_logprob), z-scored by the window's mean and
  population std; a feature whose values are all equal in the window has std 0 and contributes
  no distance (its z is 0 everywhere, so no rounding noise is blown up into a distance).
- gaussian weights w_ij = exp(-||z_i - z_j||^2 / (2 h^2)).
- laplace weights w_ij = exp(-||z_i - z_j|| / h).
- knn weights: 1 on the k = round(h) nearest others in z-distance (all others if fewer), 0 on the
  rest; ties go to the earlier window slot (older rollout first), as in hillclimb/climb.py.
  For laplace and knn the squared distance is built as hillclimb/climb.py builds it:
  D2_ij = sum_f s_f^2 (z_if - z_jf)^2 with z z-scored one feature at a time (`scaled_sq_distances`);
  the gaussian keeps its original arithmetic (scaled z, then `squared_distances`).
- effective neighbours of i: (sum_j w_ij)^2 / sum_j w_ij^2 (0 when every weight is 0).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from schemas.kernel import FEATURE_NAMES, KERNEL_FAMILIES


def prompt_features(
    prompt_num_tokens_R,
    prompt_mean_logprob_R,
    names: Sequence[str] = FEATURE_NAMES,
) -> np.ndarray:
    """Per-rollout prompt features, one column per name: features_R_F (float64).

    `log_prompt_num_tokens` = log(prompt_num_tokens); `prompt_mean_logprob` as given (the
    sampler's mean logprob over prompt tokens 2..n, computed before the rollout).
    """
    num_tokens_R = np.asarray(prompt_num_tokens_R, dtype=np.float64)
    mean_logprob_R = np.asarray(prompt_mean_logprob_R, dtype=np.float64)
    if num_tokens_R.shape != mean_logprob_R.shape or num_tokens_R.ndim != 1:
        raise ValueError("prompt_num_tokens and prompt_mean_logprob must be 1-d and of equal length")
    columns = []
    for name in names:
        if name == "log_prompt_num_tokens":
            if np.any(~(num_tokens_R > 0)):
                raise ValueError("prompt_num_tokens must be positive to take its log")
            columns.append(np.log(num_tokens_R))
        elif name == "prompt_mean_logprob":
            columns.append(mean_logprob_R)
        else:
            raise ValueError(f"unknown prompt feature {name!r}; known: {', '.join(FEATURE_NAMES)}")
    if not columns:
        raise ValueError("at least one prompt feature is needed")
    features_R_F = np.stack(columns, axis=1)
    if not np.all(np.isfinite(features_R_F)):
        raise ValueError("prompt features must be finite")
    return features_R_F


def prompt_mean_logprob(prompt_logprobs_T: Sequence[float | None], prompt_length: int) -> float:
    """The kernel feature `prompt_mean_logprob`: the sampler's mean logprob over prompt tokens 2..n.

    The SDK returns one entry per prompt token, the first None (nothing predicts it). A server
    that leaves that None out (n - 1 entries) gives the same tokens 2..n; any other length is an
    error, never a silently shifted mean.
    """
    values = list(prompt_logprobs_T)
    if len(values) == prompt_length:
        values = values[1:]
    elif len(values) != prompt_length - 1:
        raise ValueError(f"prompt logprobs: {len(values)} entries for a prompt of {prompt_length} tokens "
                         f"(expected {prompt_length}, the first None)")
    if not values or any(v is None for v in values):
        raise ValueError(f"prompt logprobs: tokens 2..{prompt_length} need a logprob each")
    return float(np.mean(np.asarray(values, dtype=np.float64)))


def standardize(features_W_F: np.ndarray, scales_F=None) -> np.ndarray:
    """z-score each feature by the window's mean and population std, then multiply by its scale.

    A feature whose values are all equal has std 0: its z is 0 everywhere (no distance).
    """
    features_W_F = np.asarray(features_W_F, dtype=np.float64)
    mean_F = features_W_F.mean(axis=0)
    std_F = features_W_F.std(axis=0)
    # "all values equal" decides constancy, not std == 0: a constant column's float mean can
    # differ from the value by one ulp, and dividing that by a tiny std would invent distances.
    constant_F = np.all(features_W_F == features_W_F[:1], axis=0)
    safe_std_F = np.where(constant_F, 1.0, std_F)
    z_W_F = np.where(constant_F, 0.0, (features_W_F - mean_F) / safe_std_F)
    if scales_F is not None:
        z_W_F = z_W_F * np.asarray(scales_F, dtype=np.float64)
    return z_W_F


def squared_distances(z_B_F: np.ndarray, z_W_F: np.ndarray) -> np.ndarray:
    """||z_i - z_j||^2 for each row i of z_B_F and j of z_W_F: sq_dist_B_W.

    Computed from differences (not |a|^2 + |b|^2 - 2ab) so that ties give exactly 0.
    """
    diff_B_W_F = z_B_F[:, None, :] - z_W_F[None, :, :]
    return np.einsum("bwf,bwf->bw", diff_B_W_F, diff_B_W_F)


def scaled_sq_distances(features_W_F: np.ndarray, rows_B, scales_F=None) -> np.ndarray:
    """sum_f s_f^2 (z_if - z_jf)^2 for window rows i in `rows_B` and every window row j: D2_B_W.

    Each feature is z-scored over the window on its own (`standardize` of one column) and the
    per-feature squared differences are added in feature order, as hillclimb/climb.py does, so the
    hill-climb's simulation and the training loop see the same numbers.
    """
    features_W_F = np.asarray(features_W_F, dtype=np.float64)
    rows_B = np.asarray(rows_B, dtype=np.int64)
    n_features = features_W_F.shape[1]
    scales_F = np.ones(n_features) if scales_F is None else np.asarray(scales_F, dtype=np.float64)
    d2_B_W = np.zeros((rows_B.shape[0], features_W_F.shape[0]))
    for f in range(n_features):
        s = float(scales_F[f])
        if s == 0.0:
            continue
        z_W = standardize(features_W_F[:, [f]])[:, 0]
        d2_B_W = d2_B_W + (s * s) * (z_W[rows_B][:, None] - z_W[None, :]) ** 2
    return d2_B_W


def knn_k(bandwidth: float) -> int:
    """The k of a knn kernel: its bandwidth rounded to the nearest integer (must be >= 1)."""
    k = int(round(float(bandwidth)))
    if k < 1:
        raise ValueError(f"knn needs a bandwidth that rounds to k >= 1, got {bandwidth}")
    return k


def knn_weights(sq_dist_B_W: np.ndarray, k: int) -> np.ndarray:
    """Weight 1 on the k nearest columns of each row (+inf marks a column that is no neighbour).

    Ties keep column order (stable sort): the earlier window slot, i.e. the older rollout, wins.
    A row with fewer than k finite distances gives weight 1 to all of them.
    """
    sq_dist_B_W = np.asarray(sq_dist_B_W, dtype=np.float64)
    order_B_W = np.argsort(sq_dist_B_W, axis=1, kind="stable")
    n_finite_B = np.isfinite(sq_dist_B_W).sum(axis=1)
    take_B = np.minimum(int(k), n_finite_B)
    w_B_W = np.zeros_like(sq_dist_B_W)
    rank_B_W = np.arange(sq_dist_B_W.shape[1])[None, :] < take_B[:, None]
    np.put_along_axis(w_B_W, order_B_W, rank_B_W.astype(np.float64), axis=1)
    return w_B_W


def kernel_weights(sq_dist: np.ndarray, bandwidth: float, family: str = "gaussian") -> np.ndarray:
    """Kernel weights from squared distances.

    gaussian: exp(-d^2 / (2 h^2)); laplace: exp(-d / h); knn: 1 on the round(h) nearest of each
    row (`knn_weights`; +inf marks a non-neighbour).
    """
    if not bandwidth > 0:
        raise ValueError(f"bandwidth must be > 0, got {bandwidth}")
    if family == "gaussian":
        return np.exp(-np.asarray(sq_dist, dtype=np.float64) / (2.0 * bandwidth * bandwidth))
    if family == "laplace":
        return np.exp(np.sqrt(np.asarray(sq_dist, dtype=np.float64)) * (-1.0 / bandwidth))
    if family == "knn":
        return knn_weights(np.atleast_2d(sq_dist), knn_k(bandwidth))
    raise ValueError(f"unknown kernel family {family!r}; known: {', '.join(KERNEL_FAMILIES)}")


def effective_neighbors(w_B_W: np.ndarray) -> np.ndarray:
    """(sum_j w_ij)^2 / sum_j w_ij^2 per row; 0 for a row whose weights are all 0."""
    w_B_W = np.asarray(w_B_W, dtype=np.float64)
    mass_B = w_B_W.sum(axis=-1)
    sq_mass_B = np.square(w_B_W).sum(axis=-1)
    return np.where(sq_mass_B > 0, np.square(mass_B) / np.where(sq_mass_B > 0, sq_mass_B, 1.0), 0.0)
