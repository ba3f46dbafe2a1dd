"""The learner's padding on logged steps: each step's datums (prompt + response - 1 tokens, in the
order the loop built them) cut into microbatches by `engine.learner.cut_microbatches` longest
first (`Learner.microbatches` now) and in arrival order (before issue 46's change), at the
H200's token budget.

    python benchmarks/learner_padding.py results/h200-comparison/*/rollouts.parquet
    python benchmarks/learner_padding.py --tokens 16384 --multiple 16 PATH...

Counts positions, not seconds: the learner's compute grows with the padded positions (every pad
runs through every layer), so the padding share is what a layout saves; the H200 measures the time.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def positions(mbs) -> int:
    return sum(mb.size * mb.padded_length for mb in mbs)


def main(argv=None) -> int:
    import pyarrow.parquet as pq
    from tinker import types

    from engine.learner import cut_microbatches, longest_first

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("rollouts", nargs="+", type=Path)
    ap.add_argument("--tokens", type=int, default=16384, help="tokens per microbatch (the engine's CUDA default)")
    ap.add_argument("--multiple", type=int, default=16, help="padded-length multiple (LEARNER_LENGTH_MULTIPLE)")
    args = ap.parse_args(argv)
    print(f"token budget {args.tokens} a microbatch, lengths rounded up to a multiple of {args.multiple}")
    print("| rollouts | steps | real tokens | padded positions, arrival order | padding | "
          "padded positions, longest first | padding |")
    print("|---|---|---|---|---|---|---|")
    totals = [0, 0, 0]
    for path in args.rollouts:
        table = pq.read_table(path, columns=["step", "prompt_num_tokens", "num_tokens"]).to_pydict()
        steps: dict[int, list[int]] = {}
        for step, p, r in zip(table["step"], table["prompt_num_tokens"], table["num_tokens"]):
            steps.setdefault(step, []).append(p + r - 1)
        real = before = after = 0
        for lengths in steps.values():
            data = [types.Datum(model_input=types.ModelInput.from_ints([0] * n), loss_fn_inputs={}) for n in lengths]
            real += sum(lengths)
            before += positions(cut_microbatches(data, range(len(data)), args.tokens, args.multiple))
            after += positions(cut_microbatches(data, longest_first(data), args.tokens, args.multiple))
        totals = [totals[0] + real, totals[1] + before, totals[2] + after]
        print(f"| {path.parent.name or path} | {len(steps)} | {real} | {before} | {1 - real / before:.1%} "
              f"| {after} | {1 - real / after:.1%} |")
    real, before, after = totals
    print(f"| all | | {real} | {before} | {1 - real / before:.1%} | {after} | {1 - real / after:.1%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
