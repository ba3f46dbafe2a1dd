"""G_eff's error bars (a bootstrap over prompts), the oracle reference, the cross-fitted regressor
family and the transfer verdicts of the offline hill-climb (hillclimb/)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hillclimb import climb as hc
from hillclimb import geff
from hillclimb.data import EMBEDDING, log_from_table, make_stream, make_streams, synthetic_log_table


def _bernoulli_log(n_prompts: int, k: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    mu = rng.uniform(0.05, 0.95, n_prompts)
    return (rng.random((n_prompts, k)) < mu[:, None]).astype(float)


# ---- intervals -----------------------------------------------------------------------------------


def test_grpo_intervals_cover_their_group_size_at_about_the_stated_level():
    """A group mean of G samples has G_eff G exactly; the 90% interval over prompts holds G in
    about 90% of independent logs (fixed seeds: deterministic)."""
    covered, total = 0, 0
    for seed in range(30):
        r = _bernoulli_log(300, 8, seed)
        for G in (2, 4):
            err_P = geff.grpo_squared_error_P(r, G, seed=seed)
            sigma2_P = geff.prompt_reward_variance(r)
            point = geff.grpo_metrics(r, G, seed=seed)["g_eff"]
            assert sigma2_P.mean() / err_P.mean() == pytest.approx(point, rel=1e-12)  # the same split
            lo, hi = geff.g_eff_interval(sigma2_P, err_P, seed=seed)
            assert lo <= point <= hi
            covered += lo <= G <= hi
            total += 1
    assert 0.78 <= covered / total <= 1.0, covered / total


def test_an_interval_narrows_as_the_log_holds_more_prompts():
    widths = []
    for n in (100, 1600):
        r = _bernoulli_log(n, 8, 5)
        lo, hi = geff.g_eff_interval(geff.prompt_reward_variance(r), geff.grpo_squared_error_P(r, 4), seed=0)
        widths.append(hi - lo)
    assert widths[1] < 0.4 * widths[0]  # 16x the prompts: about a quarter of the width


def test_a_near_perfect_baseline_reaches_inf_and_percentiles_rank_it_last():
    sigma2_P = np.full(50, 0.25)
    sq_error_P = np.full(50, -0.001)  # noise-corrected error below 0 on every prompt
    assert geff.g_eff_interval(sigma2_P, sq_error_P) == (math.inf, math.inf)
    mixed = sq_error_P.copy()
    mixed[:25] = 0.05
    lo, hi = geff.g_eff_interval(sigma2_P, mixed)
    assert math.isfinite(lo) and lo > 0


def test_the_paired_difference_is_zero_for_one_baseline_and_signed_for_two():
    r = _bernoulli_log(400, 10, 1)
    held = geff.held_out_stats(r[:, 1:])
    sigma2_P = geff.prompt_reward_variance(r)
    good = geff.squared_error_P(r[:, 1:6].mean(1), geff.held_out_stats(r[:, 6:]))
    poor = geff.squared_error_P(np.full(400, r.mean()), geff.held_out_stats(r[:, 6:]))
    assert geff.g_eff_difference_interval(sigma2_P, good, good) == (0.0, 0.0)
    lo, hi = geff.g_eff_difference_interval(sigma2_P, good, poor)
    assert 0 < lo <= hi
    lo, hi = geff.g_eff_difference_interval(sigma2_P, poor, good)
    assert lo <= hi < 0
    with pytest.raises(ValueError):
        geff.g_eff_interval(sigma2_P, good[:10])
    assert held.mean_P.shape == (400,)


# ---- the oracle and the intervals in the report -----------------------------------------------------


def test_the_report_has_intervals_and_an_oracle_at_k_minus_two():
    log = log_from_table(synthetic_log_table(1200, 16, seed=4), "k16")
    rep = hc.analyse(log, seed=0, budget=120)
    rows = {r["method"]: r for r in rep.summary_rows}
    for method, row in rows.items():
        if not math.isnan(row["eval_g_eff"]):
            assert row["eval_g_eff_lo"] <= row["eval_g_eff"] <= row["eval_g_eff_hi"], method
    # the oracle: GRPO at G = K - 2 = 14, judged on the last two samples
    assert rows["oracle"]["eval_kish_p10"] == 14.0
    assert abs(rows["oracle"]["eval_g_eff"] - 14) / 14 < 0.35
    assert rows["oracle"]["eval_g_eff_hi"] > rows["grpo_8"]["eval_g_eff"] > rows["grpo_4"]["eval_g_eff"]


# ---- the cross-fitted regressor --------------------------------------------------------------------


def _z(X):
    X = np.asarray(X, dtype=float)
    mean, std = X.mean(0), X.std(0)
    const = np.array([np.all(X[:, c] == X[0, c]) for c in range(X.shape[1])])
    return np.where(const, 0.0, (X - mean) / np.where(const, 1.0, std))


def _small_stream(seed: int = 3):
    log = log_from_table(synthetic_log_table(150, 6, seed=seed, emb_dim=5), "small")
    return make_stream(log, np.ones(150, dtype=bool), seed, "all")


def test_crossfit_matches_a_direct_solve_fold_by_fold():
    """An independent float64 reference: the window's z-scores (the embedding's over sqrt(5)), the
    same random Fourier draws, and per batch row a ridge solved by least squares on the other folds."""
    st = _small_stream()
    B, W, lam, folds, D = 32, 64, 0.3, 4, 64
    feats = ("value_easy", EMBEDDING)
    (b,) = hc.crossfit_baselines(st, B, W, feats, [lam], folds=folds, n_fourier=D, seed=0)
    rng = np.random.default_rng(0)
    omega = rng.normal(size=(6, D))
    phase = rng.uniform(0.0, 2.0 * math.pi, D)
    r = st.reward_N
    for t in (0, 2, 4):  # the first step (window = its batch), a full window, the short last batch
        start, stop = t * B, min((t + 1) * B, st.n)
        lo = max(0, stop - max(W, stop - start))
        Z = np.concatenate([_z(st.features["value_easy"][lo:stop]), _z(st.features[EMBEDDING][lo:stop]) / math.sqrt(5)],
                           axis=1)
        phi = math.sqrt(2.0 / D) * np.cos(Z @ omega + phase)
        for i in range(start, stop):
            train = [s for s in range(stop - lo) if s % folds != (i - lo) % folds]
            y = r[lo:stop][train]
            A = np.vstack([phi[train], math.sqrt(lam * len(train)) * np.eye(D)])
            coef = np.linalg.lstsq(A, np.concatenate([y - y.mean(), np.zeros(D)]), rcond=None)[0]
            want = np.clip(y.mean() + phi[i - lo] @ coef, y.min(), y.max())
            assert b[i] == pytest.approx(want, abs=1e-9), (t, i)


def test_crossfit_never_sees_the_rollouts_own_reward_or_a_later_step():
    st = _small_stream()
    B = 32
    recipe = hc.KernelRecipe("crossfit", ("value_easy", "prompt_mean_logprob"), None, 0.1, 64)
    base, _ = hc.recipe_baselines(st, recipe, B)
    for i in (40, 41, 70):  # flip one rollout's reward: its own baseline stays
        flipped = _small_stream()
        flipped.reward_N[i] = 1.0 - flipped.reward_N[i]
        b, _ = hc.recipe_baselines(flipped, recipe, B)
        assert b[i] == base[i]
        assert not np.array_equal(b, base)  # ... while the rows it trains on move
    later = _small_stream()
    later.reward_N[96:] = 1.0 - later.reward_N[96:]
    b, _ = hc.recipe_baselines(later, recipe, B)
    np.testing.assert_array_equal(b[:96], base[:96])


def test_crossfit_learns_the_planted_signal():
    log = log_from_table(synthetic_log_table(1600, 10, seed=11), "planted")
    search, evaluation = make_streams(log, 0)
    learned = hc.evaluate_recipe(evaluation, hc.KernelRecipe("crossfit", ("value_easy",), None, 0.01, 256), 64)
    constant = hc.evaluate_recipe(evaluation, hc.KernelRecipe("constant", (), None, None, 64), 64)
    assert learned["g_eff"] > 2 * constant["g_eff"]
    assert not hc.KernelRecipe("crossfit", ("value_easy",), None, 0.01, 256).arm_accepts()


# ---- transfer verdicts --------------------------------------------------------------------------


def test_a_recipe_that_misses_the_signal_does_not_transfer_and_one_that_has_it_does():
    """Two 'benchmarks' on the same planted log, each with a fixed own recipe: one on the feature that
    carries the signal, one on pure noise (the prompt length). The noise column gains from the other's
    recipe (transfers); the signal column loses with the noise recipe (needs its own)."""
    log = log_from_table(synthetic_log_table(1600, 10, seed=11), "planted")
    streams = [make_streams(log, 0), make_streams(log, 0)]
    recipes = [hc.KernelRecipe("gaussian", ("value_easy",), None, 0.3, 256),
               hc.KernelRecipe("gaussian", ("log_prompt_num_tokens",), None, 0.3, 256)]
    mat, lo, hi = hc.transfer_matrix(recipes, streams, 64, seed=0)
    assert np.all((lo <= mat) & (mat <= hi))
    signal, noise = hc.transfer_verdicts(["signal", "noise"], recipes, mat, streams, 64, seed=0)
    assert (signal.best_from, noise.best_from) == ("noise", "signal")
    assert signal.own == mat[0, 0] and signal.transferred == mat[1, 0]
    assert signal.diff_hi < 0 and not signal.transfers and "signal: needs its own" in signal.sentence()
    assert noise.diff_lo > 0 and noise.transfers and "noise: transfers" in noise.sentence()
    alone = hc.transfer_verdicts(["only"], recipes[:1], mat[:1, :1], streams[:1], 64, seed=0)[0]
    assert alone.best_from is None and not alone.transfers and "no other benchmark" in alone.sentence()


def test_a_second_embedding_is_a_feature_of_its_own_and_the_regressions_try_it_alone():
    """A log with the sampler's prompt embedding and a question embedding (list columns, each on
    its prompt's first row only, as collection writes them)."""
    import pyarrow as pa

    k, n = 6, 120
    table = synthetic_log_table(n, k, seed=2, emb_dim=3)
    first = np.asarray(table.column("sample_idx").to_pylist()) == 0
    qemb = np.random.default_rng(0).normal(size=(len(first), 4))
    column = pa.array([list(v) if f else None for v, f in zip(qemb, first)], pa.list_(pa.float16()))
    log = log_from_table(table.append_column("question_embedding", column), "two")
    assert log.features["question_embedding"].shape == (n, 4)
    np.testing.assert_array_equal(log.features["question_embedding"], qemb[first].astype(np.float16))
    stream = make_stream(log, np.ones(n, dtype=bool), 0, "all")
    ridge_sets = {c["recipe"].features for c in hc.search(stream, 32, budget=40).candidates
                  if c["recipe"].family == "ridge"}
    assert {(EMBEDDING,), ("question_embedding",)} <= ridge_sets


def test_the_report_says_after_how_many_kernels_each_best_was_found():
    log = log_from_table(synthetic_log_table(600, 10, seed=7), "effort")
    rep = hc.analyse(log, seed=0, budget=150)
    rows = {r["method"]: r for r in rep.summary_rows}
    tried = int(rows["winner"]["search_tried"])
    assert rep.search.candidates[tried - 1]["recipe"] == rep.winner
    assert all(c["recipe"] != rep.winner for c in rep.search.candidates[: tried - 1])
    assert rep.search.candidates[tried - 1]["g_eff"] == rep.search.best_g_eff
    assert 0 < rep.search.best_seconds <= rep.search.seconds
    assert math.isnan(rows["grpo_4"]["search_tried"]) and math.isnan(rows["oracle"]["search_tried"])
