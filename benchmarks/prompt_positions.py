"""How many static decode positions a run's batches take, from the run's real prompts.

    python benchmarks/prompt_positions.py --data-dir ../shared/data/gsm8k --tokenizer-dir .data/qwen-tokenizer

Every GSM8K prompt built as the loop builds it (`Gsm8kEnv.build_prompt`: the cookbook's few-shot
prefix, the spec's renderer), its token count; then, for each length bucket and batch size, the
share of batches of that many prompts drawn at random whose static decode cache takes each number
of positions (`engine.generate._bucket` of the longest prompt plus the new tokens). A bucket whose
batches land on two totals makes two decode shapes (a capture, a compile) where one would do.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def positions_share(lengths: list[int], new_tokens: int, bucket: int, rows: int) -> dict[int, float]:
    """{static positions: share of batches of `rows` prompts drawn with replacement from `lengths`}:
    a batch's positions follow its longest prompt, P(longest <= L) = F(L) ** rows."""
    from engine.generate import _bucket

    n = len(lengths)
    share: dict[int, float] = {}
    below = 0.0  # P(longest < the current length)
    for L in sorted(set(lengths)):
        at_most = (sum(x <= L for x in lengths) / n) ** rows
        total = _bucket(L + new_tokens, bucket)
        share[total] = share.get(total, 0.0) + at_most - below
        below = at_most
    return share


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--tokenizer-dir", required=True)
    ap.add_argument("--renderer", default="qwen3_instruct")
    ap.add_argument("--new-tokens", type=int, default=512)
    ap.add_argument("--buckets", default="1024,256,128")
    ap.add_argument("--rows", default="64,128,1024")
    args = ap.parse_args(argv)

    from tinker_cookbook import renderers
    from transformers import AutoTokenizer

    from rl.envs.gsm8k import Gsm8kEnv

    renderer = renderers.get_renderer(args.renderer, AutoTokenizer.from_pretrained(args.tokenizer_dir))
    env = Gsm8kEnv(args.data_dir)
    print(f"renderer={args.renderer} new={args.new_tokens}")
    print("| split | prompts | min | median | p99 | max | over 256 |\n|---|---|---|---|---|---|---|")
    lengths = {}
    for split, problems in (("train", env.train_problems()), ("test", env.test_problems())):
        L = sorted(env.build_prompt(renderer, p).length for p in problems)
        lengths[split] = L
        print(f"| {split} | {len(L)} | {L[0]} | {L[len(L) // 2]} | {L[int(0.99 * len(L))]} | {L[-1]} "
              f"| {sum(x > 256 for x in L)} |")
    print("\n| split | bucket | rows | static positions: share of batches |\n|---|---|---|---|")
    for split, L in lengths.items():
        for bucket in map(int, args.buckets.split(",")):
            for rows in map(int, args.rows.split(",")):
                share = positions_share(L, args.new_tokens, bucket, rows)
                cells = ", ".join(f"{t}: {s:.3f}" for t, s in sorted(share.items()) if s >= 5e-4)
                print(f"| {split} | {bucket} | {rows} | {cells} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
