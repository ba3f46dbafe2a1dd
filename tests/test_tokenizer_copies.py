"""`models.own_tokenizer`: the copy each engine, client and renderer makes of a fast tokenizer so
that parallel threads never share its Rust state."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from fixtures.tiny_model import tiny_model_dir, tiny_tokenizer  # noqa: F401
from engine.models import own_tokenizer

TEXTS = ["question %d: %d plus %d?" % (i, 7 * i, 13 * i) * (1 + i % 4) for i in range(32)]


def test_a_copy_tokenizes_alike_with_rust_state_of_its_own(tiny_tokenizer):
    copy = own_tokenizer(tiny_tokenizer)
    assert copy is not tiny_tokenizer and copy.backend_tokenizer is not tiny_tokenizer.backend_tokenizer
    ids = [tiny_tokenizer.encode(t) for t in TEXTS]
    assert [copy.encode(t) for t in TEXTS] == ids
    assert [copy.decode(i) for i in ids] == [tiny_tokenizer.decode(i) for i in ids]
    assert (copy.eos_token_id, copy.pad_token_id) == (tiny_tokenizer.eos_token_id, tiny_tokenizer.pad_token_id)
    # padding and truncation are the Rust state a call sets: the copy's, never the original's
    tiny_tokenizer(TEXTS[:1])  # a call without them clears them
    copy(TEXTS[:4], padding="max_length", truncation=True, max_length=5)
    assert copy.backend_tokenizer.truncation is not None and copy.backend_tokenizer.padding is not None
    assert tiny_tokenizer.backend_tokenizer.truncation is None and tiny_tokenizer.backend_tokenizer.padding is None
    assert tiny_tokenizer(TEXTS[:2])["input_ids"] == ids[:2]


def test_threads_with_copies_of_their_own_tokenize_at_once(tiny_tokenizer):
    want = tiny_tokenizer(TEXTS, padding=True, truncation=True, max_length=12)["input_ids"]

    def work(k: int):
        tok = own_tokenizer(tiny_tokenizer)
        return [tok(TEXTS, padding=True, truncation=True, max_length=12 if r % 2 == 0 else 9)["input_ids"]
                for r in range(40)]

    with ThreadPoolExecutor(4) as pool:
        runs = list(pool.map(work, range(4)))
    for run in runs:
        assert run[0] == want and all(r == want for r in run[::2])
