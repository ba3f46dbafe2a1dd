"""Hill-climb speed: candidate kernels per minute on a synthetic 100k-row log (target >= 1,000).

    python benchmarks/hillclimb_speed.py [--rows 100000] [--k 8] [--emb-dim 16] [--budget 2000]

Prints a table: log size, features, candidates scored by the search, seconds, candidates/min.
The search runs on the search half of the prompts (as `gs1 hillclimb` does); the log load and
split are timed separately.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "2")

from hillclimb import climb as hc  # noqa: E402
from hillclimb.data import log_from_table, make_streams, synthetic_log_table  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--emb-dim", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--budget", type=int, default=2000)
    args = ap.parse_args()
    print(f"{'rows':>8} {'prompts':>8} {'emb_dim':>7} {'features':>8} {'stream':>6} {'load_s':>7} "
          f"{'cands':>6} {'search_s':>8} {'cands/min':>9}")
    for emb_dim in args.emb_dim:
        t0 = time.perf_counter()
        table = synthetic_log_table(args.rows // args.k, args.k, seed=0, emb_dim=emb_dim)
        log = log_from_table(table, "synthetic")
        search_stream, _ = make_streams(log, seed=0)
        load_s = time.perf_counter() - t0
        res = hc.search(search_stream, batch_size=64, budget=args.budget)
        n = len(res.candidates)
        print(f"{table.num_rows:>8} {len(log.prompt_ids_P):>8} {emb_dim:>7} {len(log.features):>8} "
              f"{search_stream.n:>6} {load_s:>7.2f} {n:>6} {res.seconds:>8.2f} {60 * n / res.seconds:>9.0f}")


if __name__ == "__main__":
    main()
