"""benchmarks/prompt_positions.py: the share of batches whose static decode cache takes each
number of positions, from prompt lengths (the engine's own bucketing)."""

from __future__ import annotations


import pytest

from fixtures.benchmarks import load_benchmark

def _positions_share():
    return load_benchmark("prompt_positions").positions_share


@pytest.mark.parametrize("rows", [1, 64, 1024])
def test_a_batch_takes_the_positions_of_its_longest_prompt(rows):
    share = _positions_share()
    lengths = [100] * 99 + [300]  # one prompt in a hundred runs past 256 tokens
    got = share(lengths, 512, 256, rows)
    p_short = 0.99 ** rows  # every prompt of the batch fits 256: 100 + 512 -> 768
    assert got == pytest.approx({768: p_short, 1024: 1 - p_short})
    assert share(lengths, 512, 1024, rows) == pytest.approx({1024: 1.0})  # one shape at 1,024
    assert share(lengths, 512, 128, rows) == pytest.approx({640: p_short, 896: 1 - p_short})  # 612, 812 rounded up
