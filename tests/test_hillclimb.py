"""Offline kernel hill-climb (hillclimb/, `gs1 hillclimb`) on synthetic logs with planted structure."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gs1.cli import main as gs1_main
from hillclimb import climb as hc
from hillclimb.data import (
    EMBEDDING,
    load_log,
    log_from_table,
    make_stream,
    make_streams,
    split_prompts,
    synthetic_log_table,
)
from hillclimb.outputs import summary_markdown
from schemas.errors import UserError
from schemas.kernel import KernelSpec


@pytest.fixture(scope="module")
def planted_log():
    return log_from_table(synthetic_log_table(1600, 10, seed=11), "planted")


def _small_stream(n_prompts=150, seed=3):
    log = log_from_table(synthetic_log_table(n_prompts, 6, seed=seed, emb_dim=5), "small")
    return make_stream(log, np.ones(n_prompts, dtype=bool), seed, "all")


# ---- an independent, loop-by-loop reference of the pinned training semantics -------------------


def _z(X):
    X = np.asarray(X, dtype=float)
    mean, std = X.mean(0), X.std(0)
    const = np.array([np.all(X[:, c] == X[0, c]) for c in range(X.shape[1])])
    return np.where(const, 0.0, (X - mean) / np.where(const, 1.0, std))


def _reference_baselines(r, feats, B, W, weight, min_mass=1e-3):
    """feats: list of (N, d) arrays with scales; weight(d2) -> w. Pure loops over rollouts."""
    N = len(r)
    b = np.empty(N)
    for start in range(0, N, B):
        end = min(start + B, N)
        lo = max(0, end - W)
        zs = [(s, _z(X[lo:end])) for s, X in feats]
        for i in range(start, end):
            js = [j for j in range(lo, end) if j != i]
            if not js:
                b[i] = r[i]
                continue
            ws = []
            for j in js:
                d2 = sum(s * s * float(np.mean((z[i - lo] - z[j - lo]) ** 2)) for s, z in zs)
                ws.append(weight(d2))
            ws = np.array(ws)
            rj = r[js]
            b[i] = (ws @ rj) / ws.sum() if ws.sum() >= min_mass else rj.mean()
    return b


@pytest.mark.parametrize("window", [64, 100, 256])
def test_gaussian_spec_kernel_matches_reference(window):
    st = _small_stream()
    B, h = 32, 0.5
    rec = hc.KernelRecipe("gaussian", hc.SPEC_FEATURES, None, h, window)
    b, kish = hc.recipe_baselines(st, rec, B)
    ref = _reference_baselines(
        st.reward_N,
        [(1.0, st.features[f]) for f in hc.SPEC_FEATURES],
        B,
        window,
        lambda d2: math.exp(-d2 / (2 * h * h)),
    )
    np.testing.assert_allclose(b, ref, rtol=1e-12, atol=1e-12)
    assert np.all(kish > 0)


def test_laplace_scaled_and_embedding_match_reference():
    st = _small_stream()
    B, W, h = 16, 64, 0.7
    rec = hc.KernelRecipe("laplace", ("prompt_mean_logprob", EMBEDDING), (2.0, 0.5), h, W)
    b, _ = hc.recipe_baselines(st, rec, B)
    ref = _reference_baselines(
        st.reward_N,
        [(2.0, st.features["prompt_mean_logprob"]), (0.5, st.features[EMBEDDING])],
        B,
        W,
        lambda d2: math.exp(-math.sqrt(d2) / h),
    )
    np.testing.assert_allclose(b, ref, rtol=1e-10, atol=1e-12)


def test_tiny_bandwidth_falls_back_to_window_mean_and_constant_is_loo_mean():
    st = _small_stream()
    B, W = 32, 64
    b_tiny, _ = hc.recipe_baselines(st, hc.KernelRecipe("gaussian", ("value_easy",), None, 1e-6, W), B)
    b_const, kish = hc.recipe_baselines(st, hc.KernelRecipe("constant", (), None, None, W), B)
    np.testing.assert_allclose(b_tiny, b_const, rtol=1e-12)
    ref = _reference_baselines(st.reward_N, [(0.0, st.features["value_easy"])], B, W, lambda d2: 1.0)
    np.testing.assert_allclose(b_const, ref, rtol=1e-12)
    assert kish[0] == B - 1 and kish[-1] == W - 1


def test_knn_matches_reference():
    st = _small_stream()
    B, W, k = 16, 48, 5
    b, kish = hc.recipe_baselines(st, hc.KernelRecipe("knn", ("value_easy",), None, k, W), B)
    r, x = st.reward_N, st.features["value_easy"][:, 0]
    for i in [0, 7, 40, 77, len(r) - 1]:
        t = i // B
        end = min((t + 1) * B, len(r))
        lo = max(0, end - W)
        z = _z(x[lo:end, None])[:, 0]
        js = [j for j in range(lo, end) if j != i]
        js.sort(key=lambda j: ((z[i - lo] - z[j - lo]) ** 2, j))
        assert b[i] == pytest.approx(r[js[:k]].mean(), abs=1e-12)
    assert np.all(kish == k)


def test_no_lookahead_kernels_and_ridge():
    st = _small_stream()
    B = 32
    t_cut = 3 * B  # rollouts of steps >= 3 are changed
    changed = make_stream(
        log_from_table(synthetic_log_table(150, 6, seed=3, emb_dim=5), "small"), np.ones(150, bool), 3, "all"
    )
    changed.reward_N[t_cut:] = 1.0 - changed.reward_N[t_cut:]
    for rec in [
        hc.KernelRecipe("gaussian", hc.SPEC_FEATURES, None, 0.5, 64),
        hc.KernelRecipe("ridge", ("value_easy", EMBEDDING), None, 0.1, 64),
        hc.KernelRecipe("ridge", (EMBEDDING,), None, 0.1, 16),  # dual form (p > n)
    ]:
        a, _ = hc.recipe_baselines(st, rec, B)
        c, _ = hc.recipe_baselines(changed, rec, B)
        np.testing.assert_array_equal(a[:t_cut], c[:t_cut])
        assert not np.array_equal(a[t_cut:], c[t_cut:])


def test_ridge_matches_lstsq_reference():
    st = _small_stream()
    B, H, lam = 32, 64, 0.3
    (b,) = hc.ridge_baselines(st, B, H, ("value_easy", "prompt_mean_logprob"), [lam])
    X = np.concatenate([st.features["value_easy"], st.features["prompt_mean_logprob"]], axis=1)
    r = st.reward_N
    t = 3
    lo, start = t * B - H, t * B
    Z = _z(X[lo:start])
    mean, std = X[lo:start].mean(0), X[lo:start].std(0)
    n = start - lo
    A = np.vstack([Z, math.sqrt(lam * n) * np.eye(2)])
    y = np.concatenate([r[lo:start] - r[lo:start].mean(), np.zeros(2)])
    coef = np.linalg.lstsq(A, y, rcond=None)[0]
    pred = r[lo:start].mean() + ((X[start : start + B] - mean) / std) @ coef
    np.testing.assert_allclose(b[start : start + B], np.clip(pred, r[lo:start].min(), r[lo:start].max()), atol=1e-10)
    # step 0: batch mean without i
    np.testing.assert_allclose(b[:B], (r[:B].sum() - r[:B]) / (B - 1))


def test_planted_feature_wins_on_eval_and_beats_spec_and_batch_mean(planted_log):
    rep = hc.analyse(planted_log, seed=0, budget=900)
    rows = {r["method"]: r for r in rep.summary_rows}
    assert len(rep.search.candidates) <= 900
    assert rep.winner.family in hc.FAMILIES
    # the planted predictors: value_easy (strong) or the embedding (emb_0 carries x)
    assert set(rep.winner.features) & {"value_easy", EMBEDDING}
    assert "log_prompt_num_tokens" not in rep.winner.features  # pure noise in the planted log
    win = rows["winner"]["eval_g_eff"]
    assert win > 2 * rows["spec_kernel"]["eval_g_eff"]
    assert win > 2 * rows["batch_mean"]["eval_g_eff"]
    assert win > rows["grpo_4"]["eval_g_eff"]
    # GRPO references come out near their group size
    for G in (2, 4, 8):
        assert abs(rows[f"grpo_{G}"]["eval_g_eff"] - G) / G < 0.3
    assert 0.3 < rows["batch_mean"]["eval_g_eff"] < 3.0
    assert rows["winner"]["eval_corr"] > 0.7


def test_each_feature_family_is_searched_alone_and_the_planted_one_leads(planted_log):
    """The frontier: every feature family the log has gets its own search, each baseline family
    its eval-split cell with an interval, no cell uses a feature outside its family, and the
    planted value signal beats the noise and weak features; `all` is the whole search's."""
    rep = hc.analyse(planted_log, seed=0, budget=300)
    groups: dict[str, dict[str, dict]] = {}
    for r in rep.frontier_rows:
        groups.setdefault(r["features"], {})[r["family"]] = r
    # the synthetic log has no text columns and no question embedding
    assert list(groups) == ["length_logprob", "value_probe", "policy_embedding", hc.ALL_FEATURES]
    outside = {"length_logprob": ("value_easy", "embedding"), "value_probe": ("log_prompt", "logprob", "embedding"),
               "policy_embedding": ("value_easy", "log_prompt", "logprob")}
    for group, cells in groups.items():
        assert set(cells) == set(hc.FRONTIER_FAMILIES), group
        for r in cells.values():
            assert r["eval_g_eff_lo"] <= r["eval_g_eff"] <= r["eval_g_eff_hi"]
            assert 1 <= r["search_tried"] <= r["search_candidates"] <= 300
            assert not any(name in r["recipe"] for name in outside.get(group, ())), (group, r["recipe"])
    best = {g: max(c.values(), key=lambda r: r["search_g_eff"])["eval_g_eff"] for g, c in groups.items()}
    assert best["value_probe"] > 2 * best["length_logprob"]
    assert all(r["search_candidates"] == len(rep.search.candidates) for r in groups[hc.ALL_FEATURES].values())
    text = summary_markdown(rep)
    assert "## Feature families (the frontier)" in text and "the local engine only" in text
    assert hc.analyse(planted_log, seed=0, budget=100, frontier=False).frontier_rows == []


def test_search_never_reads_the_eval_split(planted_log):
    is_eval = split_prompts(planted_log.prompt_ids_P, 0)
    assert 0.4 < is_eval.mean() < 0.6
    tampered = log_from_table(synthetic_log_table(1600, 10, seed=11), "planted")
    tampered.rewards_P_K[is_eval] = 1.0 - tampered.rewards_P_K[is_eval]
    for k in tampered.features:
        tampered.features[k][is_eval] = 0.0
    s1, e1 = make_streams(planted_log, 0)
    s2, e2 = make_streams(tampered, 0)
    r1 = hc.search(s1, 64, budget=150)
    r2 = hc.search(s2, 64, budget=150)
    assert [c["g_eff"] for c in r1.candidates] == [c["g_eff"] for c in r2.candidates]
    assert r1.best == r2.best
    assert not set(s1.prompt_ids_N) & set(e1.prompt_ids_N)


def test_deterministic_for_a_seed(planted_log):
    a = hc.analyse(planted_log, seed=5, budget=200)
    b = hc.analyse(planted_log, seed=5, budget=200)
    c = hc.analyse(planted_log, seed=6, budget=200)
    canon = lambda rows: json.dumps(rows, sort_keys=True)  # noqa: E731  (NaN-safe equality)
    assert canon(a.summary_rows) == canon(b.summary_rows)
    assert canon(a.sweep_rows) == canon(b.sweep_rows)
    assert a.winner == b.winner
    assert canon(a.summary_rows) != canon(c.summary_rows)


def test_transfer_matrix(planted_log):
    other = synthetic_log_table(900, 10, seed=12, signal=1.0).drop(["value_easy"])
    logs = [planted_log, log_from_table(other, "no_value")]
    tr = hc.transfer(logs, seed=0, budget=250)
    assert tr.g_eff.shape == (2, 2)
    np.testing.assert_array_equal(tr.own_best, np.diag(tr.g_eff))
    for i, w in enumerate(tr.winners):
        if "value_easy" in w.features:
            assert math.isnan(tr.g_eff[i, 1])
        else:
            assert np.isfinite(tr.g_eff[i, 1])
    assert np.all(np.isfinite(tr.own_best))
    assert np.all(tr.own_best > tr.batch_mean)


# ---- CLI -----------------------------------------------------------------------------------------


def test_cli_writes_all_artifacts(tmp_path, capsys):
    log = tmp_path / "log.parquet"
    pq.write_table(synthetic_log_table(800, 10, seed=1), log)
    out = tmp_path / "out"
    assert gs1_main(["hillclimb", "--log", str(log), "--out", str(out), "--budget", "300"]) == 0
    for name in ["candidates.parquet", "summary.parquet", "sweep.parquet", "summary.md", "geff_vs_bandwidth.png", "kernel.json",
                 "frontier.parquet"]:
        assert (out / name).stat().st_size > 0, name
    frag = json.loads((out / "kernel.json").read_text())
    assert set(frag["kernel"]) == {"family", "features", "scales", "bandwidth", "window", "min_mass"}
    cands = pq.read_table(out / "candidates.parquet")
    assert cands.num_rows == 300
    best = max(cands.column("g_eff").to_pylist())
    summary = pq.read_table(out / "summary.parquet").to_pylist()
    assert summary[0]["method"] == "winner" and summary[0]["search_g_eff"] == pytest.approx(best)
    methods = {r["method"] for r in summary}
    assert {"winner", "spec_kernel", "batch_mean", "grpo_2", "grpo_4", "grpo_8"} <= methods
    assert (out / "geff_vs_bandwidth.png").read_bytes()[:4] == b"\x89PNG"


def test_cli_transfer(tmp_path):
    paths = []
    for i, sig in enumerate([2.0, 1.0]):
        p = tmp_path / f"bench{i}.parquet"
        pq.write_table(synthetic_log_table(700, 10, seed=20 + i, signal=sig), p)
        paths.append(str(p))
    out = tmp_path / "tr"
    assert gs1_main(["hillclimb", "--transfer", *paths, "--out", str(out), "--budget", "120"]) == 0
    t = pq.read_table(out / "transfer.parquet")
    assert t.num_rows == 4
    assert (out / "transfer.png").is_file() and (out / "bench0" / "kernel.json").is_file()
    for row in t.to_pylist():  # each cell with its bootstrap interval
        assert row["g_eff_lo"] <= row["g_eff"] <= row["g_eff_hi"]
        assert row["arm_g_eff_lo"] <= row["arm_g_eff"] <= row["arm_g_eff_hi"]
    text = (out / "transfer.md").read_text()
    verdicts = text.split("## Does a kernel transfer?", 1)[1].split("## Unrestricted winners", 1)[0]
    for name in ("bench0", "bench1"):
        # one sentence per benchmark, for each kind of winner
        assert sum(line.startswith(f"- {name}: ") for line in verdicts.splitlines()) == 2
    summary = (out / "bench0" / "summary.md").read_text()
    assert "| oracle |" in summary and "90% interval" in summary
    frontier = text.split("## The frontier", 1)[1].split("## Does a kernel transfer?", 1)[0]
    for name in ("bench0", "bench1"):  # one row per benchmark: each feature family beside GRPO-4 and the oracle
        row = next(line for line in frontier.splitlines() if line.startswith(f"| {name} |"))
        assert row.count("[") == 4 + 5  # value_probe, policy_embedding, length_logprob, all; 5 references
    assert pq.read_table(out / "bench0" / "frontier.parquet").num_rows > 0
    assert (out / "frontier.png").read_bytes()[:4] == b"\x89PNG"


def test_spec_window_and_batch_are_used(tmp_path):
    spec = {
        "batch_size": 32,
        "arms": [{"advantage": "kernel_cross_prompt_baseline", "kernel": {"window": 96, "bandwidth": 1.0}}],
    }
    sp = tmp_path / "spec.json"
    sp.write_text(json.dumps(spec))
    from gs1.commands.hillclimb import spec_settings

    batch, window, rec = spec_settings(sp)
    assert (batch, window, rec.bandwidth, rec.window, rec.family) == (32, 96, 1.0, 96, "gaussian")


def _bad(tmp_path, capsys, table, extra=()):
    log = tmp_path / "bad.parquet"
    pq.write_table(table, log)
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    (out / "summary.md").write_text("previous")
    rc = gs1_main(["hillclimb", "--log", str(log), "--out", str(out), *extra])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("gs1: error:"), err
    assert (out / "summary.md").read_text() == "previous"  # nothing overwritten
    return err


def test_bad_inputs_exit_2_one_line(tmp_path, capsys):
    good = synthetic_log_table(50, 4, seed=0)
    assert "missing column(s) reward" in _bad(tmp_path, capsys, good.drop(["reward"]))
    assert "empty" in _bad(tmp_path, capsys, good.slice(0, 0))
    two = good.filter(pa.compute.less(good.column("sample_idx"), 2))
    assert "K >= 3" in _bad(tmp_path, capsys, two)
    nofeat = good.select(["prompt_id", "sample_idx", "reward", "response_num_tokens"])
    assert "no feature columns" in _bad(tmp_path, capsys, nofeat)
    assert "--budget" in _bad(tmp_path, capsys, good, ["--budget", "0"])
    zeros = good.set_column(good.column_names.index("reward"), "reward", pa.array([0.0] * good.num_rows))
    assert "G_eff is undefined" in _bad(tmp_path, capsys, zeros)
    rc = gs1_main(["hillclimb", "--log", str(tmp_path / "nope.parquet")])
    assert rc == 2 and "no such file" in capsys.readouterr().err
    with pytest.raises(UserError):
        load_log(tmp_path / "nope.parquet")


def test_constant_fragment_is_an_equivalent_gaussian():
    st = _small_stream()
    const = hc.KernelRecipe("constant", (), None, None, 64)
    frag = const.to_fragment()["kernel"]
    assert frag["family"] == "gaussian" and frag["bandwidth"] >= 1e6
    as_gauss = hc.KernelRecipe(frag["family"], tuple(frag["features"]), None, frag["bandwidth"], frag["window"])
    np.testing.assert_allclose(hc.recipe_baselines(st, as_gauss, 32)[0], hc.recipe_baselines(st, const, 32)[0], atol=1e-12)


# ---- the written fragment is what the gs1_kernel arm runs -------------------------------------


def _arm_baselines(stream, fragment_kernel, batch_size):
    """Baselines the training loop's own advantage step gives the stream's rollouts, step by step,
    the window threaded from step to step as the loop threads it."""
    from design.arm import ArmConfig
    from estimators import StepBatch
    from rl.loop import new_window, step_advantages
    from schemas.kernel import KernelSpec

    arm = ArmConfig(name="gs1_kernel", advantage="kernel_cross_prompt_baseline", group_size=1, groups_per_batch=batch_size,
                    lr=1e-3, seed=0, steps=1, lora_rank=4, base_model="tiny", kernel=KernelSpec.model_validate(fragment_kernel))
    num_tokens_N = np.exp(stream.features["log_prompt_num_tokens"][:, 0])
    mean_logprob_N = stream.features["prompt_mean_logprob"][:, 0]
    window, out = new_window(arm), []
    for start in range(0, stream.n, batch_size):
        stop = min(start + batch_size, stream.n)
        batch = StepBatch(stream.reward_N[start:stop], np.arange(stop - start), num_tokens_N[start:stop], mean_logprob_N[start:stop])
        advantages, window = step_advantages(arm, batch, window)
        out.append(advantages.baseline)
    return np.concatenate(out)


def _recipe_of(kernel: dict) -> hc.KernelRecipe:
    return hc.KernelRecipe(
        kernel["family"], tuple(kernel["features"]), None if kernel["scales"] is None else tuple(kernel["scales"]),
        kernel["bandwidth"], kernel["window"], kernel["min_mass"],
    )


def _spec_with_kernel(repo_root, kernel: dict) -> dict:
    spec = json.loads((repo_root / "specs" / "demo_local.json").read_text())
    arm = next(a for a in spec["arms"] if a["advantage"] == "kernel_cross_prompt_baseline")
    arm["kernel"] = kernel
    return spec


def test_written_fragment_validates_in_the_arm_and_matches_the_simulation(tmp_path, repo_root):
    from design.spec import parse_spec

    log_path = tmp_path / "log.parquet"
    pq.write_table(synthetic_log_table(700, 10, seed=5), log_path)
    out = tmp_path / "out"
    spec_path = repo_root / "specs" / "demo_local.json"
    assert gs1_main(["hillclimb", "--log", str(log_path), "--spec", str(spec_path), "--out", str(out), "--budget", "400"]) == 0
    fragment = json.loads((out / "kernel.json").read_text())
    unrestricted = json.loads((out / "winner_unrestricted.json").read_text())
    kernel = fragment["kernel"]
    # the planted signal lives in value_easy / the embedding, which the loop does not log
    assert not unrestricted["arm_runs_it"] and any("unknown feature" in n for n in unrestricted["needs"])
    assert kernel["family"] in ("gaussian", "laplace", "knn") and set(kernel["features"]) <= set(hc.SPEC_FEATURES)
    spec = parse_spec(_spec_with_kernel(repo_root, kernel))
    arm = next(a for a in spec.arms if a.advantage == "kernel_cross_prompt_baseline")
    assert arm.kernel.family == kernel["family"]
    # the hill-climb's own simulation of the recipe, and the arm's estimator, on the same stream
    batch = json.loads(spec_path.read_text())["batch_size"]
    _, eval_stream = make_streams(load_log(log_path), 0)
    simulated, _ = hc.recipe_baselines(eval_stream, _recipe_of(kernel), batch)
    np.testing.assert_allclose(_arm_baselines(eval_stream, kernel, batch), simulated, rtol=0, atol=1e-9)
    # the arm winner is the best arm-runnable candidate on the search split
    cands = pq.read_table(out / "candidates.parquet").to_pylist()
    runnable = [c for c in cands if c["family"] in ("gaussian", "laplace", "knn", "constant")
                and set(c["features"]) <= set(hc.SPEC_FEATURES)]
    summary = {r["method"]: r for r in pq.read_table(out / "summary.parquet").to_pylist()}
    assert summary["arm_winner"]["search_g_eff"] == pytest.approx(max(c["g_eff"] for c in runnable))


@pytest.mark.parametrize(
    "recipe",
    [
        hc.KernelRecipe("gaussian", hc.SPEC_FEATURES, (2.0, 0.5), 0.3, 64),
        hc.KernelRecipe("laplace", hc.SPEC_FEATURES, None, 0.7, 64),
        hc.KernelRecipe("laplace", ("prompt_mean_logprob",), (1.5,), 0.2, 100),
        hc.KernelRecipe("knn", hc.SPEC_FEATURES, (1.0, 4.0), 5.0, 64),
        hc.KernelRecipe("knn", ("log_prompt_num_tokens",), None, 16.0, 40),  # many exact ties in token counts
        hc.KernelRecipe("knn", hc.SPEC_FEATURES, None, 8.0, 16),  # window smaller than the batch
        hc.KernelRecipe("constant", (), None, None, 64),
    ],
    ids=lambda r: r.label(),
)
def test_every_arm_family_runs_as_the_hillclimb_simulates_it(recipe, repo_root):
    from design.spec import parse_spec

    log = log_from_table(synthetic_log_table(300, 6, seed=9), "arm")
    stream = make_stream(log, np.ones(300, dtype=bool), 0, "all")
    assert recipe.arm_accepts()
    kernel = recipe.to_fragment()["kernel"]
    parse_spec(_spec_with_kernel(repo_root, kernel))
    batch = 32
    simulated, kish = hc.recipe_baselines(stream, recipe, batch)
    np.testing.assert_allclose(_arm_baselines(stream, kernel, batch), simulated, rtol=0, atol=1e-9)


def test_arm_blockers_name_what_the_loop_cannot_run():
    assert hc.spec_recipe().arm_accepts()
    ridge = hc.KernelRecipe("ridge", hc.SPEC_FEATURES, None, 1.0, 256)
    assert any("family 'ridge'" in b for b in ridge.arm_blockers())
    emb = hc.KernelRecipe("knn", ("prompt_mean_logprob", EMBEDDING), None, 8.0, 64)
    # the arm's own KernelSpec says why (one owner of what a kernel may be)
    assert emb.arm_blockers() == ["features: unknown feature(s) ['embedding'] (known: log_prompt_num_tokens, prompt_mean_logprob)"]


# ---- one kernel form: the recipe is the arm's KernelSpec fields, and kernel.json reads back as it ----


def test_recipe_overrides_keep_the_recipe_and_its_search_only_families():
    ridge = hc.KernelRecipe("ridge", ("value_easy", EMBEDDING), None, 0.1, 256)
    wider = ridge.with_window(1024).with_bandwidth(1.0)
    assert type(wider) is hc.KernelRecipe and (wider.family, wider.features, wider.bandwidth, wider.window) == (
        "ridge", ("value_easy", EMBEDDING), 1.0, 1024)
    assert ridge.bandwidth == 0.1 and ridge.window == 256  # frozen: a new recipe, not an edit
    assert ridge.arm_blockers()  # still a recipe the arm cannot run: the arm's KernelSpec says so
    with pytest.raises(ValueError, match="unknown search family"):
        hc.KernelRecipe("cosine", hc.SPEC_FEATURES, None, 0.5, 64)
    assert hc.spec_recipe(window=96).kernel_spec() == KernelSpec().with_window(96)


@pytest.mark.parametrize(
    "recipe",
    [
        hc.KernelRecipe("laplace", hc.SPEC_FEATURES, (1.0, 3.0), 0.75, 128),
        hc.KernelRecipe("knn", ("log_prompt_num_tokens",), None, 32.0, 64),
        hc.KernelRecipe("gaussian", ("prompt_mean_logprob",), (2.5,), 0.3, 256, 1e-2),
    ],
    ids=lambda r: r.label(),
)
def test_a_written_recipe_reads_back_as_the_kernel_spec_the_arm_runs(recipe, tmp_path):
    from design.spec import read_kernel_file
    from schemas.io import write_json_atomic

    from estimators.registry import estimator_for

    path = write_json_atomic(tmp_path / "kernel.json", recipe.to_fragment())
    fields, source = read_kernel_file(str(path), None, estimator_for("kernel_cross_prompt_baseline"))
    kernel = fields["kernel"]
    assert kernel == recipe.kernel_spec() and source.startswith(str(path.resolve()))
    assert hc.KernelRecipe.from_spec(kernel) == recipe  # the round trip loses nothing


def test_hill_climbed_kernel_json_is_the_arm_winner_and_keeps_its_format(tmp_path, repo_root):
    from design.spec import read_kernel_file
    from hillclimb import outputs

    log = log_from_table(synthetic_log_table(400, 6, seed=4), "roundtrip")
    rep = hc.analyse(log, 0, 32, 64, 150, hc.spec_recipe(window=64))
    from estimators.registry import estimator_for

    paths = outputs.write_hillclimb(rep, tmp_path / "out")
    kernel = read_kernel_file(str(paths["kernel"]), None, estimator_for("kernel_cross_prompt_baseline"))[0]["kernel"]
    assert rep.arm_winner.arm_accepts()
    assert kernel == KernelSpec.model_validate(rep.arm_winner.to_fragment()["kernel"])
    if rep.arm_winner.family != "constant":  # (constant runs as an equivalent gaussian)
        assert kernel == rep.arm_winner.kernel_spec()
    assert json.loads(paths["kernel"].read_text()) == {"kernel": kernel.model_dump(mode="json")}
    # the kernel.json files already on disk read back, and write again, byte for byte
    for stored in sorted((repo_root / "results" / "issue7" / "hillclimb").glob("*/kernel.json")):
        read = read_kernel_file(str(stored), None, estimator_for("kernel_cross_prompt_baseline"))[0]["kernel"]
        again = write_json_atomic_text(tmp_path / "again.json", hc.KernelRecipe.from_spec(read).to_fragment())
        assert again == stored.read_text(), stored


def write_json_atomic_text(path, data) -> str:
    from schemas.io import write_json_atomic

    return write_json_atomic(path, data).read_text()
