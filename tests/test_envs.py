"""Envs: GSM8K from the shared copy and the arithmetic demo env, against the cookbook's own."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor

import datasets
import pytest
from tinker_cookbook import renderers
from tinker_cookbook.recipes.math_rl import math_env as cookbook_math_env
from tinker_cookbook.recipes.math_rl.math_env import Gsm8kDataset, MathEnv, extract_gsm8k_final_answer

from schemas.errors import UserError
from rl.envs import ENV_NAMES, Env, get_env, make_prompt_id, parse_prompt_id
from rl.envs.arithmetic import generate_pairs
from rl.envs.base import run_coroutine
from fixtures.qwen_tokenizer import build_qwen_tokenizer


@pytest.fixture(scope="session")
def tokenizer():
    return build_qwen_tokenizer()


@pytest.fixture(scope="session")
def renderer(tokenizer):
    return renderers.get_renderer("qwen3", tokenizer)


@pytest.fixture(scope="session")
def gsm8k(gsm8k_dir):
    return get_env("gsm8k", data_dir=gsm8k_dir)


@pytest.fixture(scope="session")
def arithmetic():
    return get_env("arithmetic")


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def file_rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# --- registry and ids ------------------------------------------------------------------------


def test_get_env_by_name(gsm8k, arithmetic):
    assert set(ENV_NAMES) == {
        "gsm8k", "arithmetic", "rg_basic_arithmetic", "rg_chain_sum", "rg_gsm_symbolic", "rg_countdown", "rg_lcm",
    }
    assert gsm8k.name == "gsm8k" and arithmetic.name == "arithmetic"
    assert isinstance(gsm8k, Env) and isinstance(arithmetic, Env)
    with pytest.raises(UserError, match="unknown dataset 'mmlu'"):
        get_env("mmlu")


def test_the_schema_lists_exactly_the_envs_and_options_the_library_implements():
    """schemas.names owns the names (and options) a spec may use; rl.envs must implement each."""
    from rl.envs import _ENVS, accepted_options
    from schemas import names

    assert set(_ENVS) == set(names.env_names()) >= set(names.ENV_NAMES)
    for name in names.ENV_NAMES:
        assert set(names.env_options(name)) == set(accepted_options(name)), name


def test_a_registered_env_is_a_name_a_spec_may_use():
    from design.spec import Dataset
    from rl.envs import register_env
    from schemas.names import env_names

    class CountingEnv:  # a fake env: only its constructor's keyword options matter here
        def __init__(self, data_dir=None, *, n_train: int = 4):
            self.n_train = n_train

    with pytest.raises(ValueError, match="no env for dataset 'counting_test_env'"):
        Dataset(name="counting_test_env")
    register_env("counting_test_env", CountingEnv)
    assert "counting_test_env" in env_names()
    assert Dataset(name="counting_test_env", options={"n_train": 2}).options == {"n_train": 2}
    with pytest.raises(ValueError, match="colour"):
        Dataset(name="counting_test_env", options={"colour": 1})
    assert get_env("counting_test_env", n_train=3).n_train == 3


def test_reasoning_gym_envs_are_registered_and_usable_in_a_spec():
    from design.spec import Dataset
    from rl.envs import env_names, unknown_env_options
    from rl.envs.reasoning_gym_env import REASONING_GYM_ENVS, ReasoningGymEnv
    from schemas.names import REASONING_GYM_ENV_NAMES

    assert set(REASONING_GYM_ENV_NAMES) == set(REASONING_GYM_ENVS)  # the registry lists every generator
    assert set(REASONING_GYM_ENV_NAMES) <= set(env_names())
    env = get_env("rg_basic_arithmetic", seed=3, n_train=20, n_test=5)
    assert isinstance(env, ReasoningGymEnv) and isinstance(env, Env)
    assert (env.name, env.generator, env.seed, env.n_train) == ("rg_basic_arithmetic", "basic_arithmetic", 3, 20)
    problems = env.train_problems()
    assert len(problems) == 20 and problems[0].id == "rg_basic_arithmetic/train/0"
    assert get_env("rg_basic_arithmetic", seed=3, n_train=20).train_problems() == problems  # seeded
    assert unknown_env_options("rg_chain_sum", {"seed": 1, "n_train": 8}) == []
    assert unknown_env_options("rg_chain_sum", {"colour": 1}) == ["colour"]
    assert Dataset(name="rg_countdown", options={"n_train": 64}).name == "rg_countdown"
    with pytest.raises(ValueError, match="colour"):
        Dataset(name="rg_countdown", options={"colour": 1})


def test_prompt_ids_round_trip():
    assert make_prompt_id("gsm8k", "train", 17) == "gsm8k/train/17"
    assert parse_prompt_id("gsm8k/train/17") == ("gsm8k", "train", 17)
    for bad in ["gsm8k/train", "gsm8k/dev/1", "gsm8k/train/x", "a/b/c/d"]:
        with pytest.raises(ValueError):
            parse_prompt_id(bad)


# --- GSM8K data ------------------------------------------------------------------------------


def test_gsm8k_loads_the_shared_copy_in_file_order(gsm8k, gsm8k_dir):
    train, test = gsm8k.train_problems(), gsm8k.test_problems()
    assert (len(train), len(test)) == (7473, 1319)
    rows = file_rows(gsm8k_dir / "train.jsonl")
    for i in (0, 1, 4000, 7472):
        assert train[i].id == f"gsm8k/train/{i}"
        assert train[i].question == rows[i]["question"]
        assert train[i].answer == extract_gsm8k_final_answer(rows[i]["answer"])
    assert train[1].answer == "10"
    assert test[0].id == "gsm8k/test/0"
    assert gsm8k.get_problem("gsm8k/test/5") == test[5]


def test_gsm8k_seed0_order_is_the_datasets_shuffle_of_the_file_rows(gsm8k, gsm8k_dir):
    rows = file_rows(gsm8k_dir / "train.jsonl")
    shuffled = datasets.Dataset.from_list(rows).shuffle(seed=0)
    order = gsm8k.train_order(0)
    assert [p.question for p in order] == shuffled["question"]
    assert sorted(p.id for p in order) == sorted(p.id for p in gsm8k.train_problems())
    assert order == gsm8k.train_order(0)  # stable
    assert [p.id for p in gsm8k.train_order(1)[:20]] != [p.id for p in order[:20]]


def test_gsm8k_order_and_prompts_equal_the_cookbook_gsm8k_env(gsm8k, gsm8k_dir, renderer, monkeypatch, tokenizer):
    """The cookbook's own Gsm8kDataset (its hub load swapped for the file rows) builds the same
    prompts, in the same order, with the same rewards."""
    rows = file_rows(gsm8k_dir / "train.jsonl")
    monkeypatch.setattr(cookbook_math_env, "load_dataset", lambda *a, **k: datasets.Dataset.from_list(rows))
    cookbook = Gsm8kDataset(
        batch_size=6, group_size=1, renderer=renderer, convo_prefix=MathEnv.standard_fewshot_prefix(), split="train", seed=0
    )
    ours = gsm8k.train_order(0)[:6]
    for builder, problem in zip(cookbook.get_batch(0), ours, strict=True):
        (env,) = run_coroutine(builder.make_envs())
        cookbook_prompt, stop = run_coroutine(env.initial_observation())
        assert gsm8k.build_prompt(renderer, problem).to_ints() == cookbook_prompt.to_ints()
        assert gsm8k.stop_sequences(renderer) == stop == [tokenizer.convert_tokens_to_ids("<|im_end|>")]
        response = encode(tokenizer, f"Thus \\boxed{{{problem.answer}}}<|im_end|>")
        assert gsm8k.reward(renderer, problem, response) == run_coroutine(env.step(response)).reward == 1.0


def test_gsm8k_prompt_is_the_rendered_fewshot_conversation(gsm8k, renderer, tokenizer):
    problem = gsm8k.train_problems()[1]
    prompt = gsm8k.build_prompt(renderer, problem)
    convo = MathEnv.standard_fewshot_prefix() + [{"role": "user", "content": problem.question + MathEnv.question_suffix()}]
    assert prompt.to_ints() == renderer.build_generation_prompt(convo).to_ints()
    text = tokenizer.decode(prompt.to_ints())
    assert text.startswith("<|im_start|>user\nHow many r's are in strawberry?")
    assert "\\boxed{3}<|im_end|>" in text
    assert text.endswith(problem.question + " Write your answer in \\boxed{} format.<|im_end|>\n<|im_start|>assistant\n")


def test_gsm8k_reward_is_the_cookbook_env_reward(gsm8k, renderer, tokenizer):
    problem = gsm8k.train_problems()[1]  # answer 10
    assert gsm8k.reward(renderer, problem, encode(tokenizer, "She earned \\boxed{10}.<|im_end|>")) == 1.0
    assert gsm8k.reward(renderer, problem, encode(tokenizer, "She earned \\boxed{10.00}<|im_end|>")) == 1.0
    wrong = gsm8k.reward(renderer, problem, encode(tokenizer, "She earned \\boxed{12}<|im_end|>"))
    assert wrong < 1.0 and wrong == 0.0
    # the cookbook's format term: no \boxed{} or no stop token costs 0.1
    assert gsm8k.reward(renderer, problem, encode(tokenizer, "She earned 10.<|im_end|>")) == pytest.approx(-0.1)
    assert gsm8k.reward(renderer, problem, encode(tokenizer, "She earned \\boxed{10}")) == pytest.approx(0.9)


def test_gsm8k_eval_grade(gsm8k, renderer, tokenizer):
    problem = gsm8k.train_problems()[1]
    assert gsm8k.grade(renderer, problem, encode(tokenizer, "So \\boxed{10}<|im_end|>")) == (True, "10")
    assert gsm8k.grade(renderer, problem, encode(tokenizer, "\\boxed{5} then \\boxed{10.0}<|im_end|>")) == (True, "10.0")
    assert gsm8k.grade(renderer, problem, encode(tokenizer, "So \\boxed{7}<|im_end|>")) == (False, "7")
    assert gsm8k.grade(renderer, problem, encode(tokenizer, "So 10<|im_end|>")) == (False, "")
    # a truncated response (no stop token) is still graded on its boxed answer
    assert gsm8k.grade(renderer, problem, encode(tokenizer, "So \\boxed{10}")) == (True, "10")


def test_grading_works_off_the_main_thread_and_inside_an_event_loop(gsm8k, renderer, tokenizer):
    problems = gsm8k.test_problems()[:8]
    responses = [encode(tokenizer, f"\\boxed{{{p.answer}}}<|im_end|>") for p in problems]

    def work(i):
        assert threading.current_thread() is not threading.main_thread()
        return gsm8k.grade(renderer, problems[i], responses[i]), gsm8k.reward(renderer, problems[i], responses[i])

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(work, range(len(problems))))
    assert results == [((True, p.answer), 1.0) for p in problems]

    async def from_async_code():
        return gsm8k.reward(renderer, problems[0], responses[0]), gsm8k.build_prompt(renderer, problems[0])

    reward, prompt = asyncio.run(from_async_code())
    assert reward == 1.0 and prompt.to_ints() == gsm8k.build_prompt(renderer, problems[0]).to_ints()


# --- GSM8K data errors -----------------------------------------------------------------------


def write_split_dir(tmp_path, train_lines, test_lines=()):
    """A GSM8K folder; `test_lines=None` leaves test.jsonl out."""
    d = tmp_path / "gsm8k"
    d.mkdir()
    (d / "train.jsonl").write_text("".join(line + "\n" for line in train_lines))
    if test_lines is not None:
        (d / "test.jsonl").write_text("".join(line + "\n" for line in test_lines))
    return d


GOOD = json.dumps({"question": "What is 2 + 2?", "answer": "2 + 2 = 4\n#### 4"})


def test_gsm8k_malformed_line_names_file_and_line(tmp_path):
    d = write_split_dir(tmp_path, [GOOD, GOOD, '{"question": "oops"'])
    with pytest.raises(UserError) as exc:
        get_env("gsm8k", data_dir=d).train_problems()
    assert str(exc.value).startswith(f"{d / 'train.jsonl'}:3: not valid JSON")


@pytest.mark.parametrize(
    "line, reason",
    [
        (json.dumps({"question": "q"}), "expected an object with string 'question' and 'answer'"),
        (json.dumps([1, 2]), "expected an object with string 'question' and 'answer'"),
        (json.dumps({"question": "q", "answer": "no final line"}), "answer has no '#### <final answer>' line"),
        ("", "empty line"),
    ],
)
def test_gsm8k_bad_rows(tmp_path, line, reason):
    d = write_split_dir(tmp_path, [GOOD, line])
    with pytest.raises(UserError) as exc:
        get_env("gsm8k", data_dir=d).train_problems()
    assert str(exc.value) == f"{d / 'train.jsonl'}:2: {reason}"


def test_gsm8k_missing_file_or_dir(tmp_path):
    d = write_split_dir(tmp_path, [GOOD], test_lines=None)
    # Checked when the env is made (before any training), not when eval first reads the split.
    with pytest.raises(UserError, match=r"has no test\.jsonl \(it needs train\.jsonl and test\.jsonl\)"):
        get_env("gsm8k", data_dir=d)
    (d / "test.jsonl").write_text(GOOD + "\n")
    env = get_env("gsm8k", data_dir=d)
    assert len(env.train_problems()) == 1 and len(env.test_problems()) == 1
    with pytest.raises(UserError, match="GSM8K data directory not found"):
        get_env("gsm8k", data_dir=tmp_path / "nowhere")


def test_gsm8k_data_dir_from_env_var(tmp_path, monkeypatch):
    d = write_split_dir(tmp_path, [GOOD, GOOD], [GOOD])
    monkeypatch.setenv("GS1_GSM8K_DIR", str(d))
    env = get_env("gsm8k")
    assert env.data_dir == d and len(env.train_problems()) == 2 and len(env.test_problems()) == 1


def test_gsm8k_default_source_is_the_hub(monkeypatch):
    """Without a data dir it asks `datasets` for openai/gsm8k main (a fake here: no network)."""
    monkeypatch.delenv("GS1_GSM8K_DIR", raising=False)
    calls = []

    def fake_load_dataset(path, name=None, split=None, **kw):
        calls.append((path, name, split))
        return datasets.Dataset.from_list([{"question": f"{split} q", "answer": "#### 3"}])

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    env = get_env("gsm8k")
    assert env.train_problems()[0].question == "train q" and env.test_problems()[0].answer == "3"
    assert calls == [("openai/gsm8k", "main", "train"), ("openai/gsm8k", "main", "test")]

    def offline(*a, **k):
        raise ConnectionError("offline")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(UserError, match="could not load openai/gsm8k .*GS1_GSM8K_DIR"):
        get_env("gsm8k").train_problems()


# --- arithmetic ------------------------------------------------------------------------------


def test_arithmetic_problems_are_deterministic_and_disjoint(arithmetic):
    train, test = arithmetic.train_problems(), arithmetic.test_problems()
    assert (len(train), len(test)) == (4096, 500)
    again = get_env("arithmetic")
    assert again.train_problems() == train and again.test_problems() == test
    assert again.train_order(0) == arithmetic.train_order(0) != train
    other = get_env("arithmetic", seed=1)
    assert other.train_problems() != train
    train_q, test_q = {p.question for p in train}, {p.question for p in test}
    assert not train_q & test_q
    assert len(test_q) == 500  # distinct test items
    assert train[0].id == "arithmetic/train/0" and test[499].id == "arithmetic/test/499"


def test_arithmetic_mixes_one_and_two_digit_operands(arithmetic):
    pairs_train, pairs_test = generate_pairs(0, 4096, 500)
    classes = [(len(str(a)), len(str(b))) for a, b in pairs_train]
    for cls in [(1, 1), (1, 2), (2, 1), (2, 2)]:
        assert 0.2 < classes.count(cls) / len(classes) < 0.3
    for p, (a, b) in zip(arithmetic.train_problems(), pairs_train, strict=True):
        assert p.question == f"What is {a} + {b}?" and p.answer == str(a + b)
    assert {(len(str(a)), len(str(b))) for a, b in pairs_test} == {(1, 1), (1, 2), (2, 1), (2, 2)}


def test_arithmetic_prompt_length_varies_with_operands(arithmetic, renderer, tokenizer):
    by_class = {}
    for p in arithmetic.train_problems()[:200]:
        a, b = arithmetic.operands(p)
        by_class.setdefault((a >= 10) + (b >= 10), set()).add(len(arithmetic.build_prompt(renderer, p).to_ints()))
    assert max(by_class[0]) < min(by_class[1]) and max(by_class[1]) < min(by_class[2])


def test_arithmetic_prompt_uses_the_cookbook_prefix(arithmetic, renderer, tokenizer):
    problem = arithmetic.train_problems()[0]
    text = tokenizer.decode(arithmetic.build_prompt(renderer, problem).to_ints())
    assert text == (
        "<|im_start|>user\nWhat is 4 + 5?<|im_end|>\n<|im_start|>assistant\n9<|im_end|>\n"
        f"<|im_start|>user\n{problem.question} Answer with just the number.<|im_end|>\n<|im_start|>assistant\n"
    )


def test_arithmetic_reward_and_grade(arithmetic, renderer, tokenizer):
    problem = next(p for p in arithmetic.train_problems() if int(p.answer) >= 10)
    right, wrong = problem.answer, str(int(problem.answer) + 1)
    cases = [
        (f"{right}<|im_end|>", 1.0, (True, right)),
        (f"{right}", 1.0, (True, right)),  # truncated: no format term
        (f"The answer is {right}.<|im_end|>", 1.0, (True, right)),
        (f"{wrong}<|im_end|>", 0.0, (False, wrong)),
        (f"{wrong}\n{right}<|im_end|>", 0.0, (False, wrong)),  # only the first line counts
        (f"{right}\n{wrong}<|im_end|>", 1.0, (True, right)),
        ("I don't know<|im_end|>", 0.0, (False, "")),
        ("<|im_end|>", 0.0, (False, "")),
    ]
    for text, reward, grade in cases:
        tokens = encode(tokenizer, text)
        assert arithmetic.reward(renderer, problem, tokens) == reward, text
        assert arithmetic.grade(renderer, problem, tokens) == grade, text


# --- the demo spec's renderer fits its model ---------------------------------------------------


@pytest.mark.slow  # reads the tokenizer out of the SmolLM2-135M GGUF (half a minute on 2 cores)
def test_demo_renderer_speaks_smollm2_chatml(repo_root):
    """specs/demo_local.json pairs SmolLM2-135M-Instruct with the cookbook `qwen3_instruct`
    renderer: the same ChatML turns as the model's own chat template, stopping on <|im_end|>."""
    from transformers import AutoTokenizer

    from design.spec import load_spec, resolve_base_model_path, resolve_renderer_name

    spec = load_spec(repo_root / "specs" / "demo_local.json")
    gguf = Path(resolve_base_model_path(spec))
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    renderer = renderers.get_renderer(resolve_renderer_name(spec), tok)
    assert renderer.get_stop_sequences() == [tok.convert_tokens_to_ids("<|im_end|>")]
    convo = [
        {"role": "system", "content": "You are a helpful AI assistant named SmolLM, trained by Hugging Face"},
        {"role": "user", "content": "What is 4 + 5?"},
        {"role": "assistant", "content": "9"},
        {"role": "user", "content": "What is 12 + 7? Answer with just the number."},
    ]
    ours = tok.decode(renderer.build_generation_prompt(convo).to_ints())
    assert ours == tok.apply_chat_template(convo, tokenize=False, add_generation_prompt=True)
    message, _ = renderer.parse_response(tok.encode("19<|im_end|>", add_special_tokens=False))
    assert message["content"] == "19"


# a config with few distinct questions (1-digit a ± b: about 240 texts), so that train, the few-shot
# turns and the test candidates collide and the filter has work to do
_SMALL = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+", "-"],
          "allow_negation": False, "allow_parentheses": False}


def test_reasoning_gym_test_items_are_distinct_and_disjoint_from_train_and_the_fewshot_turns():
    from rl.envs.reasoning_gym_env import TEST_SEED_OFFSET

    env = get_env("rg_basic_arithmetic", seed=5, n_train=60, n_test=20, config=_SMALL, fewshot=3)
    train = {p.question for p in env.train_problems()}
    shots = {t["content"] for t in env.convo_prefix() if t["role"] == "user"}
    test = [p.question for p in env.test_problems()]
    assert len(test) == 20 and len(set(test)) == 20 and len(shots) == 3
    assert not set(test) & train and not set(test) & shots
    # the generator at the test seed does repeat train questions and itself: the filter is what keeps them apart
    import reasoning_gym

    raw = [e["question"] for e in reasoning_gym.create_dataset("basic_arithmetic", size=104, seed=5 + TEST_SEED_OFFSET, **_SMALL)]
    assert set(raw) & train and len(set(raw)) < len(raw)
    assert [p.question for p in get_env("rg_basic_arithmetic", seed=5, n_train=60, n_test=20, config=_SMALL,
                                        fewshot=3).test_problems()] == test  # fixed by the seed


def test_reasoning_gym_says_when_the_generator_cannot_give_the_test_items_asked():
    env = get_env("rg_basic_arithmetic", seed=5, n_train=400, n_test=150, config=_SMALL)
    with pytest.raises(UserError, match=r"n_test 150: the generator gave only \d+ test items"):
        env.test_problems()


def test_reasoning_gym_prompt_turns_and_fewshot_answers():
    """The chosen reasoning-gym system prompt opens the conversation; each few-shot turn is a solved
    item whose `<answer>` the generator scores 1; an unknown prompt name is one line naming the known ones."""
    from reasoning_gym.utils import SYSTEM_PROMPTS

    from rl.envs.reasoning_gym_env import extract

    env = get_env("rg_basic_arithmetic", seed=1, n_train=8, n_test=4, system_prompt="direct", fewshot=2)
    turns = env.convo_prefix()
    assert [t["role"] for t in turns] == ["system", "user", "assistant", "user", "assistant"]
    assert turns[0]["content"] == SYSTEM_PROMPTS["direct"]
    entries = env._fewshot_entries()
    for entry, answer in zip(entries, turns[2::2]):
        assert env._dataset("fewshot").score_answer(extract(answer["content"]), entry) == 1.0
    assert get_env("rg_basic_arithmetic", n_train=8, n_test=4).convo_prefix() == [
        {"role": "system", "content": SYSTEM_PROMPTS["default"]}]
    with pytest.raises(UserError, match="system_prompt 'chatty' is not one of reasoning-gym's"):
        get_env("rg_basic_arithmetic", system_prompt="chatty")


def test_a_data_dir_is_not_handed_to_an_env_that_generates_its_problems(tmp_path):
    seen = {}

    def counting(data_dir=None, **kw):
        seen["data_dir"] = data_dir
        return get_env("arithmetic", **kw)

    from rl.envs import register_env

    register_env("generating_test_env", counting, reads_data=False)
    register_env("reading_test_env", counting)
    get_env("generating_test_env", data_dir=tmp_path, n_train=4, n_test=2)
    assert seen["data_dir"] is None
    get_env("reading_test_env", data_dir=tmp_path, n_train=4, n_test=2)
    assert seen["data_dir"] == tmp_path
    assert isinstance(get_env("rg_chain_sum", data_dir=tmp_path / "nowhere", n_train=4, n_test=2), Env)


def test_the_basic_arithmetic_specs_test_set_is_there_at_its_own_shape(repo_root):
    """specs/basic_arithmetic_gs1_vs_grpo.json as the H200 loads it: its 2,560 train items and all
    4,000 eval items its power table asks for, each test question distinct and in no train prompt
    (a shortfall would stop the device run at its first stage)."""
    from design.spec import eval_items, load_spec

    spec = load_spec(repo_root / "specs" / "basic_arithmetic_gs1_vs_grpo.json")
    env = get_env(spec.dataset.name, **dict(spec.dataset.options))
    train = {p.question for p in env.train_problems()}
    test = [p.question for p in env.test_problems()]
    assert len(env.train_problems()) == spec.dataset.n_examples == 2560
    assert len(test) == len(set(test)) == eval_items(spec) == 4000
    assert not set(test) & train
