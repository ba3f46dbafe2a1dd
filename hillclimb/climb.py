"""Offline kernel hill-climb: which single-rollout baseline has the largest G_eff, and does it transfer.

Training is simulated as the gs1_kernel arm runs it (DESIGN.md, "Spec semantics pinned here"):
one sample per prompt, drawn (seeded) into steps of `batch_size`; for step t the window is the
current batch plus the most recent earlier rollouts, `window` in all; each feature is z-scored by
the window's mean and population std (the rollout itself included); the baseline of rollout i is
a weighted mean of the other window rewards, falling back to the window mean without i when the
kernel mass is below `min_mass`, and to i's own reward when it has no neighbour. Each baseline is
judged by G_eff (hillclimb/geff.py) against the prompt's other samples, which the window never sees.

Prompts are split by a seeded hash into a search half and an evaluation half, simulated as two
separate streams: the search only ever scores candidates on the search stream; the evaluation
stream is touched once per reported recipe.

Kernel families over a squared distance D2 = sum_f s_f^2 d_f, with d_f the squared difference of
feature f's window z-scores (a multi-column feature such as the embedding uses the mean over its
columns, so every feature enters on the same scale):
- gaussian: w = exp(-D2 / (2 h^2));  laplace: w = exp(-sqrt(D2) / h)
- knn: equal weight on the k = round(bandwidth) nearest others (ties: earlier rollout first)
- constant: equal weight on every other window rollout (the leave-one-out window mean; with
  window = batch size this is the batch-mean baseline)
- ridge: a ridge regression of reward on the z-scored features, refit each step on the `window`
  most recent rollouts of earlier steps only (no lookahead); penalty lambda * n = bandwidth * n;
  predictions clipped to the training rewards' range; step 0 uses the batch mean without i.
- crossfit: a small learned regressor cross-fitted on the window: ridge on random Fourier features
  (a Gaussian kernel of unit bandwidth on the scaled window z-scores), fit on the window's other
  folds and predicting each batch row from the fold it is not in, so b_i never sees r_i but does
  see the current batch's other rewards, as a kernel does; lambda = bandwidth, clipped as ridge.

What the gs1_kernel arm runs (estimators.gs1_kernel_step): gaussian, laplace and knn over the
features the training loop logs (log_prompt_num_tokens, prompt_mean_logprob), with scales.
`KernelRecipe.arm_accepts()` says whether a recipe is one of those (constant is, as an equivalent
gaussian); the report names the best such recipe `arm_winner` and writes it as `kernel.json`,
and reports the unrestricted winner beside it with what keeps the arm from running it.

Speed: squared feature differences are precomputed once per (stream, window) for every feature;
a candidate's D2 is then a weighted sum of those arrays, and every bandwidth of every family is
evaluated on it with a few vectorised array operations.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field, replace

import numpy as np
from pydantic import ValidationError, model_validator

from estimators.kernels import FEATURE_NAMES, knn_k, standardize
from hillclimb import geff
from hillclimb.data import FEATURE_FAMILIES, RolloutLog, Stream, make_streams
from schemas.kernel import KernelForm, KernelSpec

FAMILIES = ("gaussian", "laplace", "knn", "constant", "ridge", "crossfit")
BANDWIDTHS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
KNN_KS = (1, 2, 4, 8, 16, 32, 64, 128)
RIDGE_LAMBDAS = (1e-3, 1e-2, 1e-1, 1.0, 10.0)
WINDOWS = (64, 128, 256, 512)
RIDGE_HISTORIES = (256, 1024)
CROSSFIT_FOLDS = 4
CROSSFIT_FOURIER_FEATURES = 64
FRONTIER_FAMILIES = ("gaussian", "laplace", "knn", "ridge", "crossfit")  # the baselines that read features
ALL_FEATURES = "all"  # the frontier's row of the whole search (every feature of the log)
SPEC_FEATURES = FEATURE_NAMES  # the features the training loop logs, hence all the arm can use


class KernelRecipe(KernelForm):
    """One candidate baseline: the kernel form (schemas.kernel) over the search's wider space, the
    families constant, ridge and crossfit and any feature the log has included. `kernel_spec()` is
    the arm's KernelSpec of it, and `to_fragment()` the gs1_kernel arm's optional `kernel` object
    (`kernel.json`). The bandwidth is lambda for ridge and crossfit, and None for constant."""

    def __init__(self, family: str, features: tuple[str, ...], scales: tuple[float, ...] | None,
                 bandwidth: float | None, window: int, min_mass: float = 1e-3):
        # positional, as the search writes thousands of them (validated all the same)
        super().__init__(family=family, features=features, scales=scales, bandwidth=bandwidth, window=window,
                         min_mass=min_mass)

    @model_validator(mode="after")
    def _searched_family(self):
        if self.family not in FAMILIES:
            raise ValueError(f"unknown search family {self.family!r} (known: {', '.join(FAMILIES)})")
        return self

    def arm_blockers(self) -> list[str]:
        """Why the gs1_kernel arm cannot run this recipe as is; [] when it can (the arm's own
        `KernelSpec` decides)."""
        if self.family == "constant":
            return []  # runs as an equivalent gaussian (to_fragment)
        try:
            self.kernel_spec()
        except ValidationError as e:
            return [f"{'.'.join(map(str, err['loc'])) or 'kernel'}: {err['msg'].removeprefix('Value error, ')}"
                    for err in e.errors(include_url=False)]
        return []

    def arm_accepts(self) -> bool:
        return not self.arm_blockers()

    def to_fragment(self) -> dict:
        """`{"kernel": {...}}`: the KernelSpec the arm runs, as `kernel.json` holds it."""
        if self.family == "constant":
            # the arm's kernel needs features and a bandwidth: a gaussian with a huge h is the same
            # leave-one-out window mean (DESIGN.md), and is accepted by the pinned-kernel validator
            return KernelRecipe("gaussian", SPEC_FEATURES, None, 1e9, self.window, self.min_mass).to_fragment()
        return {"kernel": self.kernel_spec().model_dump(mode="json")}

    @classmethod
    def from_spec(cls, kernel: KernelSpec) -> KernelRecipe:
        """The arm's kernel as a candidate of the search (the same fields)."""
        return cls.model_validate(kernel.model_dump())

    def kernel_spec(self) -> KernelSpec:
        """This recipe as the arm's KernelSpec (a ValidationError when the arm cannot run it)."""
        return KernelSpec.model_validate(self.model_dump())

    def kernel_object(self) -> dict:
        """This recipe as a plain kernel object, family as is (JSON-ready)."""
        return self.model_dump(mode="json")

    def label(self) -> str:
        feats = ",".join(
            f if self.scales is None or self.scales[i] == 1 else f"{self.scales[i]:g}*{f}"
            for i, f in enumerate(self.features)
        )
        bw = "" if self.bandwidth is None else f" {_BANDWIDTH_NAME.get(self.family, 'h')}={self.bandwidth:g}"
        return f"{self.family}[{feats}]{bw} W={self.window}"


_BANDWIDTH_NAME = {"knn": "k", "ridge": "lam", "crossfit": "lam"}  # what a family's bandwidth field holds


def spec_recipe(window: int | None = None) -> KernelRecipe:
    """The user's pre-registered kernel (schemas.kernel.KernelSpec's defaults), at `window` if given."""
    pinned = KernelSpec()
    return KernelRecipe.from_spec(pinned if window is None else pinned.with_window(window))


# ----------------------------------------------------------------------------------------------
# Simulated windows


class WindowedStream:
    """One stream's step/window geometry at one window size, with per-feature squared differences.

    Arrays are (T steps, B batch rows, W window slots); the valid window slots of a step are its
    last ones, and its batch rows are the last valid slots. `dist[f]` is +inf where j is not a
    neighbour of i (padding, or j = i), so every kernel gives it weight 0 without a mask.
    """

    def __init__(self, stream: Stream, batch_size: int, window: int, feature_names):
        N, B, W = stream.n, int(batch_size), int(max(window, batch_size))
        T = math.ceil(N / B)
        self.N, self.B, self.W, self.T = N, B, W, T
        ends_T = np.minimum((np.arange(T) + 1) * B, N)
        win_T_W = ends_T[:, None] - W + np.arange(W)[None, :]
        # a step's window is its batch plus the most recent max(0, window - batch rows) earlier
        # rollouts, as in the estimator (a short last batch may then see fewer than W slots)
        W_T = np.maximum(int(window), ends_T - np.arange(T) * B)
        valid_T_W = (win_T_W >= 0) & (np.arange(W)[None, :] >= (W - W_T)[:, None])
        rows_T_B = np.arange(T)[:, None] * B + np.arange(B)[None, :]
        self.row_valid_T_B = rows_T_B < ends_T[:, None]
        pos_T_B = rows_T_B - (ends_T[:, None] - W)  # slot of the row within its window
        self.neighbour_T_B_W = (
            valid_T_W[:, None, :]
            & self.row_valid_T_B[:, :, None]
            & (np.arange(W)[None, None, :] != pos_T_B[:, :, None])
        )
        self.n_neighbours_T_B = self.neighbour_T_B_W.sum(axis=2)
        reward_N = stream.reward_N
        self.r_T_W = np.where(valid_T_W, reward_N[np.where(valid_T_W, win_T_W, 0)], 0.0)
        r_self_T_B = reward_N[np.minimum(rows_T_B, N - 1)]
        sum_T = self.r_T_W.sum(axis=1)
        n_nb = self.n_neighbours_T_B
        # window mean without i (the min-mass fallback); i's own reward when it has no neighbour
        self.loo_T_B = np.where(n_nb > 0, (sum_T[:, None] - r_self_T_B) / np.maximum(n_nb, 1), r_self_T_B)
        self.r_self_T_B = r_self_T_B
        self.inf_mask_T_B_W = np.where(self.neighbour_T_B_W, 0.0, np.inf)
        self.dist: dict[str, np.ndarray] = {}
        for name in feature_names:
            self.dist[name] = self._feature_sq_diff(stream.features[name], ends_T, valid_T_W)

    def _feature_sq_diff(self, X_N_d: np.ndarray, ends_T, valid_T_W) -> np.ndarray:
        T, B, W = self.T, self.B, self.W
        d = X_N_d.shape[1]
        out = np.zeros((T, B, W))
        for t in range(T):
            n_valid = int(valid_T_W[t].sum())
            z_V_d = standardize(X_N_d[ends_T[t] - n_valid : ends_T[t]])
            nb = int(self.row_valid_T_B[t].sum())
            z_b_d = z_V_d[n_valid - nb :]
            if d == 1:
                sq = (z_b_d - z_V_d[:, 0][None, :]) ** 2
            else:
                sq = (z_b_d * z_b_d).sum(1)[:, None] + (z_V_d * z_V_d).sum(1)[None, :] - 2.0 * z_b_d @ z_V_d.T
                sq = np.maximum(sq, 0.0) / d
            out[t, :nb, W - n_valid :] = sq
        return out

    # -- baselines ------------------------------------------------------------------------------

    def sq_distance(self, scales: dict[str, float]) -> np.ndarray:
        D2 = self.inf_mask_T_B_W.copy()
        for name, s in scales.items():
            if s != 0.0:
                D2 += (s * s) * self.dist[name]
        return D2

    def _finish(self, b_T_B, kish_T_B):
        v = self.row_valid_T_B
        return b_T_B[v], kish_T_B[v]

    def kernel(self, D2: np.ndarray, family: str, bandwidth: float, min_mass: float):
        """(b_N, kish_N) for a gaussian or laplace kernel on squared distances D2."""
        if family == "gaussian":
            w = np.exp(D2 * (-0.5 / (bandwidth * bandwidth)))
        elif family == "laplace":
            w = np.exp(np.sqrt(D2) * (-1.0 / bandwidth))
        else:
            raise ValueError(f"not a smooth kernel family: {family}")
        mass = w.sum(axis=2)
        num = np.einsum("tbw,tw->tb", w, self.r_T_W)
        sq = np.einsum("tbw,tbw->tb", w, w)
        use = mass >= min_mass
        b = np.where(use, num / np.where(use, mass, 1.0), self.loo_T_B)
        kish = np.where(sq > 0, mass * mass / np.where(sq > 0, sq, 1.0), 0.0)
        return self._finish(b, kish)

    def knn(self, D2: np.ndarray, ks, min_mass: float = 0.0) -> list[tuple[np.ndarray, np.ndarray]]:
        """(b_N, kish_N) for each k: the mean reward of the k nearest others (all, if fewer).

        Mass = the number of neighbours used; below min_mass (never, for min_mass <= 1) the window
        mean without i, as in the estimator.
        """
        order = np.argsort(D2, axis=2, kind="stable")
        r_sorted = np.take_along_axis(np.broadcast_to(self.r_T_W[:, None, :], D2.shape), order, axis=2)
        csum = np.cumsum(r_sorted, axis=2)
        n_nb = self.n_neighbours_T_B
        out = []
        for k in ks:
            kk = np.minimum(int(k), n_nb)
            knn_mean = np.take_along_axis(csum, np.maximum(kk - 1, 0)[:, :, None], axis=2)[:, :, 0] / np.maximum(kk, 1)
            b = np.where(kk > 0, np.where(kk >= min_mass, knn_mean, self.loo_T_B), self.r_self_T_B)
            out.append(self._finish(b, kk.astype(np.float64)))
        return out

    def constant(self):
        return self._finish(self.loo_T_B, self.n_neighbours_T_B.astype(np.float64))


def ridge_baselines(stream: Stream, batch_size: int, history: int, feature_names, lambdas) -> list[np.ndarray]:
    """b_N for each lambda: ridge of reward on z-scored features, fit on earlier steps only."""
    B, N = int(batch_size), stream.n
    X_N_p = np.concatenate([stream.features[f] for f in feature_names], axis=1)
    r_N = stream.reward_N
    out = np.empty((len(lambdas), N))
    for start in range(0, N, B):
        stop = min(start + B, N)
        lo = max(0, start - int(history))
        if start - lo < 2:
            # no earlier step to fit on: the batch mean without i (own reward if alone)
            r_b = r_N[start:stop]
            nb = len(r_b)
            out[:, start:stop] = (r_b.sum() - r_b) / (nb - 1) if nb > 1 else r_b
            continue
        X_tr, y_tr, X_te = X_N_p[lo:start], r_N[lo:start], X_N_p[start:stop]
        mean_p = X_tr.mean(0)
        std_p = X_tr.std(0)
        constant_p = np.all(X_tr == X_tr[:1], axis=0)
        safe = np.where(constant_p, 1.0, std_p)
        Z_tr = np.where(constant_p, 0.0, (X_tr - mean_p) / safe)
        Z_te = np.where(constant_p, 0.0, (X_te - mean_p) / safe)
        y_bar = y_tr.mean()
        y_c = y_tr - y_bar
        n, p = Z_tr.shape
        if p <= n:
            e, V = np.linalg.eigh(Z_tr.T @ Z_tr)
            proj_te = Z_te @ V  # (b, p)
            rhs = V.T @ (Z_tr.T @ y_c)  # (p,)
        else:  # dual form: same predictions, n x n
            e, Q = np.linalg.eigh(Z_tr @ Z_tr.T)
            proj_te = (Z_te @ Z_tr.T) @ Q
            rhs = Q.T @ y_c
        e = np.maximum(e, 0.0)
        lo_r, hi_r = y_tr.min(), y_tr.max()
        for li, lam in enumerate(lambdas):
            pred = y_bar + proj_te @ (rhs / (e + lam * n))
            out[li, start:stop] = np.clip(pred, lo_r, hi_r)
    return list(out)


def crossfit_baselines(stream: Stream, batch_size: int, window: int, feature_names, lambdas, scales=None,
                       folds: int = CROSSFIT_FOLDS, n_fourier: int = CROSSFIT_FOURIER_FEATURES,
                       seed: int = 0) -> list[np.ndarray]:
    """b_N for each lambda: ridge on random Fourier features of the window's scaled z-scores,
    cross-fitted over `folds` folds of the window (module docstring).

    A step's window is its batch plus the most recent earlier rollouts, `window` in all (as the
    kernels'); window slot s is in fold s % folds. A multi-column feature's z-scores are divided by
    sqrt(d), so each feature enters the distance on one scale, as in `WindowedStream`. With fewer
    than 2 training rows in a fold, its rows get the window mean without i.
    """
    B, N = int(batch_size), stream.n
    rng = np.random.default_rng(seed)
    blocks = [stream.features[f] for f in feature_names]
    widths = [b.shape[1] for b in blocks]
    X_N_p = np.concatenate(blocks, axis=1)
    scale_p = np.concatenate([np.full(d, (1.0 if scales is None else float(scales[i])) / math.sqrt(d))
                              for i, d in enumerate(widths)])
    omega_p_D = rng.normal(size=(X_N_p.shape[1], n_fourier))  # a unit-bandwidth Gaussian kernel's spectrum
    phase_D = rng.uniform(0.0, 2.0 * math.pi, n_fourier)
    r_N = stream.reward_N
    out = np.empty((len(lambdas), N))
    for start in range(0, N, B):
        stop = min(start + B, N)
        lo = max(0, stop - max(int(window), stop - start))
        phi_W_D = math.sqrt(2.0 / n_fourier) * np.cos(standardize(X_N_p[lo:stop]) * scale_p @ omega_p_D + phase_D)
        y_W = r_N[lo:stop]
        fold_W = np.arange(stop - lo) % folds
        batch = np.arange(start - lo, stop - lo)
        for f in range(folds):
            rows = batch[fold_W[batch] == f]
            if rows.size == 0:
                continue
            train = fold_W != f
            if train.sum() < 2:  # too few to fit: the window mean without i
                out[:, lo + rows] = (y_W.sum() - y_W[rows]) / max(len(y_W) - 1, 1)
                continue
            phi_tr, y_tr = phi_W_D[train], y_W[train]
            y_bar = y_tr.mean()
            e, V = np.linalg.eigh(phi_tr.T @ phi_tr)
            proj = phi_W_D[rows] @ V
            rhs = V.T @ (phi_tr.T @ (y_tr - y_bar))
            e = np.maximum(e, 0.0)
            for li, lam in enumerate(lambdas):
                pred = y_bar + proj @ (rhs / (e + lam * len(y_tr)))
                out[li, lo + rows] = np.clip(pred, y_tr.min(), y_tr.max())
    return list(out)


# ----------------------------------------------------------------------------------------------
# Scoring


def score(stream: Stream, b_N: np.ndarray, kish_N: np.ndarray | None) -> dict[str, float]:
    return geff.baseline_metrics(b_N, stream.held, stream.sigma2_N, kish_P=kish_N)


METRICS = ("g_eff", "mse", "sigma2", "bias", "corr", "kish_p10", "n")
INTERVAL = ("g_eff_lo", "g_eff_hi")  # the bootstrap interval over prompts (geff.g_eff_interval)


def evaluate_recipe(stream: Stream, recipe: KernelRecipe, batch_size: int, interval: bool = False,
                    seed: int = 0) -> dict[str, float]:
    """Metrics of one recipe on one stream (NaN metrics when the stream lacks a feature); with
    `interval`, G_eff's bootstrap interval over the stream's prompts too."""
    b, kish = recipe_baselines(stream, recipe, batch_size)
    if b is None:
        return {k: float("nan") for k in (*METRICS, *(INTERVAL if interval else ()))}
    m = score(stream, b, kish)
    if interval:
        lo, hi = geff.g_eff_interval(stream.sigma2_N, geff.squared_error_P(b, stream.held), seed=seed)
        m.update(g_eff_lo=lo, g_eff_hi=hi)
    return m


def squared_errors(stream: Stream, recipe: KernelRecipe, batch_size: int) -> np.ndarray | None:
    """Each prompt's noise-corrected squared error under the recipe (None if a feature is missing)."""
    b, _ = recipe_baselines(stream, recipe, batch_size)
    return None if b is None else geff.squared_error_P(b, stream.held)


def recipe_baselines(stream: Stream, recipe: KernelRecipe, batch_size: int):
    """(b_N, kish_N) of one recipe on a stream; (None, None) if a feature is missing there."""
    if any(f not in stream.features for f in recipe.features):
        return None, None
    if recipe.family == "ridge":
        (b,) = ridge_baselines(stream, batch_size, recipe.window, recipe.features, [recipe.bandwidth])
        return b, None
    if recipe.family == "crossfit":
        (b,) = crossfit_baselines(stream, batch_size, recipe.window, recipe.features, [recipe.bandwidth], recipe.scales)
        return b, None
    ws = WindowedStream(stream, batch_size, recipe.window, recipe.features)
    if recipe.family == "constant":
        return ws.constant()
    D2 = ws.sq_distance({f: recipe.scale_of(f) for f in recipe.features})
    if recipe.family == "knn":
        return ws.knn(D2, [knn_k(recipe.bandwidth)], recipe.min_mass)[0]
    return ws.kernel(D2, recipe.family, float(recipe.bandwidth), recipe.min_mass)


def compatible(recipe: KernelRecipe, stream: Stream, reference: Stream) -> bool:
    """A recipe tuned on `reference` applies to `stream` when every feature exists with equal width."""
    return all(
        f in stream.features and stream.features[f].shape[1] == reference.features[f].shape[1] for f in recipe.features
    )


# ----------------------------------------------------------------------------------------------
# Search


@dataclass
class SearchResult:
    candidates: list[dict] = field(default_factory=list)  # recipe fields + search-split metrics
    best: KernelRecipe | None = None
    best_g_eff: float = -math.inf
    seconds: float = 0.0
    best_seconds: float = 0.0  # the search's time until it scored `best` (its effort, with its rank)

    def tried_until(self, recipe: KernelRecipe) -> int | None:
        """How many candidates the search had scored when it first scored `recipe` (None: never)."""
        return next((i + 1 for i, c in enumerate(self.candidates) if c["recipe"] == recipe), None)


class _Search:
    def __init__(self, stream: Stream, batch_size: int, budget: int, min_mass: float):
        self.t0 = time.perf_counter()
        self.stream = stream
        self.batch_size = batch_size
        self.budget = int(budget)
        self.min_mass = min_mass
        self.result = SearchResult()
        self._ws_cache: dict[int, WindowedStream] = {}

    @property
    def left(self) -> int:
        return self.budget - len(self.result.candidates)

    def windowed(self, window: int) -> WindowedStream:
        if window not in self._ws_cache:
            self._ws_cache.clear()  # one window's arrays at a time keeps memory flat
            self._ws_cache[window] = WindowedStream(self.stream, self.batch_size, window, list(self.stream.features))
        return self._ws_cache[window]

    def record(self, recipe: KernelRecipe, b_N, kish_N) -> float:
        m = score(self.stream, b_N, kish_N)
        self.result.candidates.append({"recipe": recipe, **m})
        g = m["g_eff"]
        if g > self.result.best_g_eff:
            self.result.best_g_eff, self.result.best = g, recipe
            self.result.best_seconds = time.perf_counter() - self.t0
        return g

    def family_sweep(self, window: int, family: str, scales: dict[str, float], grid) -> list[float]:
        """Score `family` at every grid value on one scaling; returns the G_effs (budget-capped)."""
        ws = self.windowed(window)
        feats = tuple(f for f in self.stream.features if scales.get(f, 0.0) != 0.0)
        svec = tuple(float(scales[f]) for f in feats)
        svec_or_none = None if all(s == 1.0 for s in svec) else svec
        grid = list(grid)[: max(self.left, 0)]
        if not grid or not feats:
            return []
        D2 = ws.sq_distance(scales)
        out = []
        if family == "knn":
            for k, (b, kish) in zip(grid, ws.knn(D2, grid, self.min_mass)):
                out.append(self.record(KernelRecipe("knn", feats, svec_or_none, float(k), window, self.min_mass), b, kish))
        else:
            for h in grid:
                b, kish = ws.kernel(D2, family, h, self.min_mass)
                out.append(self.record(KernelRecipe(family, feats, svec_or_none, float(h), window, self.min_mass), b, kish))
        return out


def _feature_subsets(names: list[str]) -> list[tuple[str, ...]]:
    if len(names) <= 5:
        return [c for r in range(1, len(names) + 1) for c in itertools.combinations(names, r)]
    return [(n,) for n in names] + list(itertools.combinations(names, 2)) + [tuple(names)]


def _grid_for(family: str):
    return KNN_KS if family == "knn" else BANDWIDTHS


def search(
    stream: Stream,
    batch_size: int = 64,
    budget: int = 4000,
    windows=WINDOWS,
    families=FAMILIES,
    min_mass: float = 1e-3,
    climb_starts: int = 3,
    window: int = 256,
) -> SearchResult:
    """Grid then coordinate hill-climb over kernel recipes, scored by G_eff on `stream` only.

    Order (deterministic, truncated at `budget` candidates): the constant kernel at each window;
    ridge over feature sets x histories x lambdas; crossfit over feature sets x windows x lambdas;
    every feature subset (unit scales) x family x
    bandwidth at the home `window`; the `climb_starts` best of those at every other window; then
    from the `climb_starts` best configurations, repeated moves that double, halve, drop or add
    one feature's scale, each scored over the family's whole bandwidth grid, taking the best
    improving move until none improves; finally the subset grid at the other windows.
    """
    t0 = time.perf_counter()
    s = _Search(stream, batch_size, budget, min_mass)
    names = list(stream.features)
    windows = sorted({int(w) for w in windows})

    if "constant" in families:
        for w in windows:
            if s.left <= 0:
                break
            b, kish = s.windowed(w).constant()
            s.record(KernelRecipe("constant", (), None, None, w, min_mass), b, kish)

    def regression_sweep(family: str, feature_sets, spans, baselines) -> None:
        """Every feature set x span (history or window) x lambda of a regression family, one fit
        per set and span for all lambdas (`baselines(feats, span, lams) -> [b_N per lambda]`)."""
        for feats in dict.fromkeys(x for x in feature_sets if x):
            for span in spans:
                lams = list(RIDGE_LAMBDAS)[: max(s.left, 0)]
                if not lams:
                    return
                for lam, b in zip(lams, baselines(feats, span, lams)):
                    s.record(KernelRecipe(family, feats, None, float(lam), span, min_mass), b, None)

    # the regressions' feature sets: the scalar features, all of them, each multi-column one alone
    scalar = tuple(n for n in names if stream.features[n].shape[1] == 1)
    wide = [(n,) for n in names if stream.features[n].shape[1] > 1]
    if "ridge" in families:
        regression_sweep("ridge", [scalar, tuple(names), *wide], RIDGE_HISTORIES,
                         lambda feats, hist, lams: ridge_baselines(stream, batch_size, hist, feats, lams))
    if "crossfit" in families:
        regression_sweep("crossfit", [scalar, tuple(names)], windows,
                         lambda feats, w, lams: crossfit_baselines(stream, batch_size, w, feats, lams))

    smooth = [f for f in ("gaussian", "laplace", "knn") if f in families]
    subsets = _feature_subsets(names)
    home = window if window in windows else windows[len(windows) // 2]

    def sweep_all(w, subset_list):
        found = []
        for subset in subset_list:
            scales = {n: (1.0 if n in subset else 0.0) for n in names}
            for fam in smooth:
                gs = s.family_sweep(w, fam, scales, _grid_for(fam))
                if gs:
                    found.append((max(gs), w, fam, scales))
        return found

    # every feature subset at the home window, then the best configurations at every window
    configs = sweep_all(home, subsets)
    configs.sort(key=lambda c: -c[0])  # stable: ties keep enumeration order
    for g0, _, fam, scales in configs[:climb_starts]:
        for w in windows:
            if w != home:
                gs = s.family_sweep(w, fam, scales, _grid_for(fam))
                if gs:
                    configs.append((max(gs), w, fam, scales))
    configs.sort(key=lambda c: -c[0])
    # coordinate climb on the per-feature scales from the best configurations
    for g0, w, fam, scales in configs[:climb_starts]:
        best_g, best_scales = g0, dict(scales)
        while s.left > 0:
            moves = []
            for n in names:
                cur = best_scales[n]
                if cur == 0.0:
                    moves.append({**best_scales, n: 0.5})
                else:
                    moves += [{**best_scales, n: cur * 2.0}, {**best_scales, n: cur * 0.5}]
                    if sum(v != 0.0 for v in best_scales.values()) > 1:
                        moves.append({**best_scales, n: 0.0})
            step_best = (best_g, None)
            for mv in moves:
                gs = s.family_sweep(w, fam, mv, _grid_for(fam))
                if gs and max(gs) > step_best[0]:
                    step_best = (max(gs), mv)
            if step_best[1] is None:
                break
            best_g, best_scales = step_best
    # whatever budget is left: the full subset grid at the other windows
    for w in windows:
        if w != home and s.left > 0:
            sweep_all(w, subsets)
    s.result.seconds = time.perf_counter() - t0
    return s.result


# ----------------------------------------------------------------------------------------------
# The full analysis of one log, and the transfer matrix


@dataclass
class HillclimbReport:
    log_name: str
    seed: int
    batch_size: int
    window: int
    search: SearchResult
    winner: KernelRecipe  # unrestricted: may need features the loop does not log, or ridge
    arm_winner: KernelRecipe  # the best recipe the gs1_kernel arm runs (kernel.json)
    summary_rows: list[dict]  # one per reported method: eval- and search-split metrics
    sweep_rows: list[dict]  # G_eff vs bandwidth per family (best config of each family)
    n_prompts: dict[str, int]
    frontier_rows: list[dict] = field(default_factory=list)  # feature family x baseline family (`feature_frontier`)


def best_arm_recipe(result: SearchResult, fallback: KernelRecipe | None = None) -> KernelRecipe:
    """The highest search-split G_eff among candidates the gs1_kernel arm runs (first on ties).

    The search always scores unit-scale subsets of the spec features with gaussian, laplace and
    knn, so one exists whenever the budget reaches them; else the constant kernel, else `fallback`
    (the spec's kernel).
    """
    best, best_g = None, -math.inf
    for c in result.candidates:
        if c["g_eff"] > best_g and c["recipe"].arm_accepts():
            best, best_g = c["recipe"], c["g_eff"]
    return best if best is not None else (fallback or spec_recipe())


def best_by_family(result: SearchResult) -> dict[str, dict]:
    """Each family's highest search-split candidate (first on ties)."""
    best: dict[str, dict] = {}
    for c in result.candidates:
        fam = c["recipe"].family
        if fam not in best or c["g_eff"] > best[fam]["g_eff"]:
            best[fam] = c
    return best


def feature_frontier(search_stream: Stream, eval_stream: Stream, batch_size: int, budget: int, windows, window: int,
                     seed: int = 0, whole: SearchResult | None = None) -> list[dict]:
    """G_eff per feature family (data.FEATURE_FAMILIES) and baseline family: each feature family's
    features alone get a search of their own (`budget` candidates, search split only), and each
    baseline family's best there is scored on the eval split with its bootstrap interval. The
    effort is the search's: candidates scored until that recipe was, and the search's seconds.
    `whole`: the search over every feature (the row `all`), when the caller has run it."""
    rows = []
    names = list(search_stream.features)
    groups = [(fam.name, fam.of(names)) for fam in FEATURE_FAMILIES] + [(ALL_FEATURES, tuple(names))]
    for group, feats in groups:
        if not feats:
            continue  # the log lacks this family (no embedding off the local engine, no text columns)
        if group == ALL_FEATURES and whole is not None:
            result = whole
        else:
            alone = replace(search_stream, features={f: search_stream.features[f] for f in feats})
            result = search(alone, batch_size, budget, windows=windows, families=FRONTIER_FAMILIES, window=window)
        best = best_by_family(result)
        for fam in FRONTIER_FAMILIES:
            if fam not in best:
                continue
            recipe = best[fam]["recipe"]
            m = evaluate_recipe(eval_stream, recipe, batch_size, interval=True, seed=seed)
            rows.append({"features": group, "family": fam, "recipe": recipe.label(),
                         "eval_g_eff": m["g_eff"], "eval_g_eff_lo": m["g_eff_lo"], "eval_g_eff_hi": m["g_eff_hi"],
                         "search_g_eff": float(best[fam]["g_eff"]), "search_tried": float(result.tried_until(recipe)),
                         "search_candidates": float(len(result.candidates)), "search_seconds": float(result.seconds)})
    return rows


def reference_recipes(batch_size: int, window: int, spec_kernel: KernelRecipe) -> dict[str, KernelRecipe]:
    return {
        "spec_kernel": spec_kernel,
        "batch_mean": KernelRecipe("constant", (), None, None, batch_size),
        "window_mean": KernelRecipe("constant", (), None, None, window),
    }


def analyse(
    log: RolloutLog,
    seed: int = 0,
    batch_size: int = 64,
    window: int = 256,
    budget: int = 4000,
    spec_kernel: KernelRecipe | None = None,
    windows=None,
    frontier: bool = True,
) -> HillclimbReport:
    """Search on the search half, then report the winner and the references on the eval half;
    with `frontier`, each feature family's own search too (`feature_frontier`)."""
    spec_kernel = spec_kernel or spec_recipe(window=window)
    search_stream, eval_stream = make_streams(log, seed)
    windows = tuple(windows) if windows else tuple(sorted(set(WINDOWS) | {int(window)}))
    result = search(search_stream, batch_size, budget, windows=windows, window=window)
    if result.best is None:
        raise ValueError("the search scored no candidate (budget 0?)")

    rows = []

    def add(method: str, recipe: KernelRecipe | None, eval_m: dict, search_m: dict):
        tried = None if recipe is None else result.tried_until(recipe)
        rows.append(
            {
                "method": method,
                "recipe": "" if recipe is None else recipe.label(),
                **{f"eval_{k}": float(v) for k, v in eval_m.items()},
                "search_g_eff": float(search_m.get("g_eff", float("nan"))),
                # the search's effort to reach it: candidates scored until it was (NaN: not searched)
                "search_tried": float("nan") if tried is None else float(tried),
            }
        )

    def both(recipe):
        return (evaluate_recipe(eval_stream, recipe, batch_size, interval=True, seed=seed),
                evaluate_recipe(search_stream, recipe, batch_size))

    arm_winner = best_arm_recipe(result, spec_kernel)
    add("winner", result.best, *both(result.best))
    add("arm_winner", arm_winner, *both(arm_winner))
    best_of = best_by_family(result)
    for fam in FAMILIES:
        if fam in best_of:
            add(f"best_{fam}", best_of[fam]["recipe"], *both(best_of[fam]["recipe"]))
    for method, recipe in reference_recipes(batch_size, window, spec_kernel).items():
        add(method, recipe, *both(recipe))
    K_min = int(np.min(np.sum(~np.isnan(eval_stream.rewards_N_K), axis=1)))
    search_full = bool(np.all(np.sum(~np.isnan(search_stream.rewards_N_K), axis=1) >= K_min))
    # GRPO at G = 2, 4, 8 and the oracle: the prompt's own success rate from all of its samples but
    # the two it is judged on (GRPO at G = K - 2), the ceiling of a baseline that knew each prompt
    for method, G in [*((f"grpo_{g}", g) for g in (2, 4, 8)), ("oracle", K_min - 2)]:
        if G >= 1 and K_min >= G + 2:
            full = eval_stream.rewards_N_K[:, :K_min]
            m_eval = geff.grpo_metrics(full, G, seed=seed)
            err_P = geff.grpo_squared_error_P(full, G, seed=seed)
            lo, hi = geff.g_eff_interval(geff.prompt_reward_variance(full), err_P, seed=seed)
            m_eval.update(g_eff_lo=lo, g_eff_hi=hi)
            m_search = geff.grpo_metrics(search_stream.rewards_N_K[:, :K_min], G, seed=seed) if search_full else {
                "g_eff": float("nan")}
        else:  # the prompt has too few samples to hold out 2 beyond the group
            m_eval = {k: float("nan") for k in (*METRICS, *INTERVAL)}
            m_search = {"g_eff": float("nan")}
        add(method, None, m_eval, m_search)

    sweep = []
    for fam, c in best_of.items():
        r = c["recipe"]
        if fam == "constant":
            continue
        grid = RIDGE_LAMBDAS if fam in ("ridge", "crossfit") else _grid_for(fam)
        for x in grid:
            rr = r.with_bandwidth(float(x))  # fam is r's family
            e, s_ = both(rr)
            sweep.append({"family": fam, "recipe": rr.label(), "bandwidth": float(x), "eval_g_eff": e["g_eff"],
                          "search_g_eff": s_["g_eff"], "eval_kish_p10": e["kish_p10"]})
    return HillclimbReport(
        log_name=log.name,
        seed=seed,
        batch_size=batch_size,
        window=window,
        search=result,
        winner=result.best,
        arm_winner=arm_winner,
        summary_rows=rows,
        sweep_rows=sweep,
        n_prompts={"search": search_stream.n, "eval": eval_stream.n},
        frontier_rows=(feature_frontier(search_stream, eval_stream, batch_size, budget, windows, window, seed, result)
                       if frontier else []),
    )


@dataclass(frozen=True)
class TransferVerdict:
    """Does another benchmark's recipe do as well on this one as its own? The best transferred
    recipe (highest G_eff on this benchmark's eval split among the other rows) against the
    benchmark's own, with a paired bootstrap interval of the difference over its prompts."""

    benchmark: str
    best_from: str | None  # the row whose recipe transferred best; None when none applies
    transferred: float  # its G_eff here
    own: float  # the benchmark's own recipe's G_eff here
    diff_lo: float  # interval of transferred - own
    diff_hi: float

    @property
    def transfers(self) -> bool:
        """The interval reaches 0 or above: the data cannot tell the transferred recipe is worse."""
        return self.best_from is not None and self.diff_hi >= 0.0

    def sentence(self) -> str:
        if self.best_from is None:
            return f"{self.benchmark}: needs its own (no other benchmark's recipe applies to it)."
        how = "transfers" if self.transfers else "needs its own"
        return (f"{self.benchmark}: {how} — {self.best_from}'s recipe scores G_eff {self.transferred:.2f} here against "
                f"its own {self.own:.2f} (difference {self.diff_lo:+.2f} to {self.diff_hi:+.2f}, "
                f"{geff.BOOT_LEVEL:.0%} paired bootstrap over prompts).")


@dataclass
class TransferReport:
    names: list[str]
    winners: list[KernelRecipe]
    g_eff: np.ndarray  # [row tuned on, column applied to], eval split of the column
    g_eff_lo: np.ndarray  # its bootstrap interval over the column's prompts
    g_eff_hi: np.ndarray
    own_best: np.ndarray  # column's own winner on its eval split (the diagonal)
    arm_winners: list[KernelRecipe]  # each row's best recipe the gs1_kernel arm runs
    g_eff_arm: np.ndarray  # the same matrix for arm_winners
    g_eff_arm_lo: np.ndarray
    g_eff_arm_hi: np.ndarray
    spec_kernel: np.ndarray  # spec kernel on each column's eval split
    batch_mean: np.ndarray
    verdicts: list[TransferVerdict]  # per column, for the unrestricted winners
    arm_verdicts: list[TransferVerdict]  # ... for the arm winners
    reports: list[HillclimbReport]


def transfer(
    logs: list[RolloutLog],
    seed: int = 0,
    batch_size: int = 64,
    window: int = 256,
    budget: int = 4000,
    spec_kernel: KernelRecipe | None = None,
) -> TransferReport:
    """G_eff of each log's winning recipe applied to every log's eval split.

    The recipe transfers, not fitted numbers: z-scoring is per window, and a ridge recipe is
    refit on the column's own earlier windows. A recipe whose features the column lacks is NaN.
    """
    spec_kernel = spec_kernel or spec_recipe(window=window)
    reports = [analyse(log, seed, batch_size, window, budget, spec_kernel) for log in logs]
    streams = [make_streams(log, seed) for log in logs]
    names = [log.name for log in logs]
    winners, arm_winners = [r.winner for r in reports], [r.arm_winner for r in reports]
    mat, mat_lo, mat_hi = transfer_matrix(winners, streams, batch_size, seed)
    mat_arm, mat_arm_lo, mat_arm_hi = transfer_matrix(arm_winners, streams, batch_size, seed)
    ref = reference_recipes(batch_size, window, spec_kernel)
    return TransferReport(
        names=names,
        winners=winners,
        g_eff=mat, g_eff_lo=mat_lo, g_eff_hi=mat_hi,
        own_best=np.diag(mat).copy(),
        arm_winners=arm_winners,
        g_eff_arm=mat_arm, g_eff_arm_lo=mat_arm_lo, g_eff_arm_hi=mat_arm_hi,
        spec_kernel=np.array([evaluate_recipe(s[1], ref["spec_kernel"], batch_size)["g_eff"] for s in streams]),
        batch_mean=np.array([evaluate_recipe(s[1], ref["batch_mean"], batch_size)["g_eff"] for s in streams]),
        verdicts=transfer_verdicts(names, winners, mat, streams, batch_size, seed),
        arm_verdicts=transfer_verdicts(names, arm_winners, mat_arm, streams, batch_size, seed),
        reports=reports,
    )


def transfer_matrix(recipes: list[KernelRecipe], streams, batch_size: int, seed: int):
    """G_eff of each row's recipe on each column's eval split, with its bootstrap interval (NaN
    where the column lacks a feature of the recipe)."""
    n = len(recipes)
    out = [np.full((n, n), np.nan) for _ in range(3)]
    for i, recipe in enumerate(recipes):
        for j in range(n):
            if compatible(recipe, streams[j][1], streams[i][1]):
                m = evaluate_recipe(streams[j][1], recipe, batch_size, interval=True, seed=seed)
                out[0][i, j], out[1][i, j], out[2][i, j] = m["g_eff"], m["g_eff_lo"], m["g_eff_hi"]
    return tuple(out)


def transfer_verdicts(names, recipes, mat: np.ndarray, streams, batch_size: int, seed: int) -> list[TransferVerdict]:
    """Per column: the best other row's recipe against the column's own, paired over its prompts."""
    verdicts = []
    for j, name in enumerate(names):
        others = [i for i in range(len(names)) if i != j and not np.isnan(mat[i, j])]
        if not others:
            verdicts.append(TransferVerdict(name, None, float("nan"), float(mat[j, j]), float("nan"), float("nan")))
            continue
        best = max(others, key=lambda i: mat[i, j])
        column = streams[j][1]
        lo, hi = geff.g_eff_difference_interval(column.sigma2_N, squared_errors(column, recipes[best], batch_size),
                                                squared_errors(column, recipes[j], batch_size), seed=seed)
        verdicts.append(TransferVerdict(name, names[best], float(mat[best, j]), float(mat[j, j]), lo, hi))
    return verdicts
