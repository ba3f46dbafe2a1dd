"""G_eff: the variance-equivalent group size of a single-rollout baseline (hillclimb/geff.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hillclimb import geff


def _bernoulli_prompts(P: int, K: int, seed: int):
    rng = np.random.default_rng(seed)
    mu_P = rng.beta(0.7, 0.7, size=P)
    rewards_P_K = (rng.random((P, K)) < mu_P[:, None]).astype(np.float64)
    return mu_P, rewards_P_K


@pytest.mark.parametrize("G", [2, 4, 8])
def test_grpo_group_mean_has_g_eff_about_g(G):
    _, r = _bernoulli_prompts(P=6000, K=16, seed=G)
    m = geff.grpo_metrics(r, G, seed=1, repeats=4)
    # relative sampling error of the estimate at this size is a few percent
    assert abs(m["g_eff"] - G) / G < 0.12, m
    assert abs(m["bias"]) < 0.02


def test_constant_baseline_gives_the_floor():
    mu, r = _bernoulli_prompts(P=20000, K=10, seed=3)
    held = geff.held_out_stats(r[:, 1:])
    sigma2 = geff.prompt_reward_variance(r)
    b = np.full(len(mu), mu.mean())
    floor = np.mean(mu * (1 - mu)) / np.var(mu)
    got = geff.g_eff(b, held, sigma2)
    assert abs(got - floor) / floor < 0.06, (got, floor)
    # a noisy baseline (the prompt's own single other sample) is no better than G = 1
    one = geff.g_eff(r[:, 0], held, sigma2)
    assert abs(one - 1.0) < 0.08
    # a feature-informed baseline that knows half of mu's deviation beats the floor
    half = mu.mean() + 0.5 * (mu - mu.mean())
    assert geff.g_eff(half, held, sigma2) > 2 * floor


def test_noise_correction_makes_oracle_unbounded():
    mu, r = _bernoulli_prompts(P=20000, K=8, seed=4)
    held = geff.held_out_stats(r)
    # without correction the oracle would look like G = K; with it the estimate is huge or inf
    assert geff.g_eff(mu, held) > 50


def _hand_g_eff(b, rows):
    """Independent pure-Python computation straight from the definition."""
    num = 0.0
    den = 0.0
    for bi, row in zip(b, rows):
        vals = [v for v in row if not math.isnan(v)]
        m = len(vals)
        p = sum(vals) / m
        s2 = sum((v - p) ** 2 for v in vals) / (m - 1)
        num += s2
        den += (bi - p) ** 2 - s2 / m
    return num / den


def test_float64_against_hand_computation():
    rng = np.random.default_rng(7)
    P, M = 37, 9
    rows = rng.normal(0.3, 1.0, size=(P, M))
    rows[rng.random((P, M)) < 0.2] = np.nan
    rows[:, :2] = rng.normal(size=(P, 2))  # at least 2 valid per prompt
    b = rng.normal(0.3, 2.0, size=P)
    held = geff.held_out_stats(rows)
    got = geff.g_eff(b, held)
    assert got == pytest.approx(_hand_g_eff(b, rows.tolist()), rel=1e-12)


def test_bernoulli_noise_term_is_p_one_minus_p_over_m_minus_one():
    r = np.array([[1, 0, 0, 1, 1.0], [0, 0, 0, 1, 0]])
    held = geff.held_out_stats(r)
    p = r.mean(axis=1)
    np.testing.assert_allclose(held.var_P / held.n_P, p * (1 - p) / (r.shape[1] - 1), rtol=1e-14)


def test_metrics_bias_corr_kish():
    mu, r = _bernoulli_prompts(P=3000, K=8, seed=9)
    held = geff.held_out_stats(r)
    b = mu + 0.1
    m = geff.baseline_metrics(b, held, kish_P=np.arange(1, 3001, dtype=float))
    assert m["bias"] == pytest.approx(0.1, abs=0.02)
    assert m["corr"] > 0.8
    assert m["kish_p10"] == pytest.approx(np.percentile(np.arange(1, 3001), 10))
    w = np.array([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    np.testing.assert_allclose(geff.kish(w), [2.0, 1.0, 0.0])


def test_bad_input():
    with pytest.raises(ValueError):
        geff.held_out_stats(np.array([[1.0, np.nan]]))
    with pytest.raises(ValueError):
        geff.grpo_split(np.ones((3, 8)), 8, np.random.default_rng(0))
