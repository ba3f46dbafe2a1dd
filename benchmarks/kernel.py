"""Benchmark: time to compute the GS1 kernel baseline.

    python benchmarks/kernel.py [--repeats 20] [--log-rows 100000]

Prints a table: one 64-rollout step against a full 256-rollout window (the training loop's call),
and a whole rollout log of steps of 64 (the CLI / offline analysis path).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from estimators import gs1_kernel_log, gs1_kernel_step
from schemas.kernel import KernelSpec


def _data(rows: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    rewards_R = rng.integers(0, 2, rows).astype(np.float64)
    features_R_F = np.stack([np.log(rng.integers(30, 400, rows)), rng.normal(-1.2, 0.4, rows)], axis=1)
    return rewards_R, features_R_F


def _best_of(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--log-rows", type=int, default=100_000)
    args = parser.parse_args()

    rewards_R, features_R_F = _data(256)
    step_s = _best_of(
        lambda: gs1_kernel_step(rewards_R[192:], features_R_F[192:], rewards_R[:192], features_R_F[:192], kernel=KernelSpec(window=256)),
        args.repeats,
    )

    rewards_L, features_L_F = _data(args.log_rows, seed=1)
    steps_L = np.arange(args.log_rows) // 64
    log_s = _best_of(lambda: gs1_kernel_log(steps_L, rewards_L, features_L_F, KernelSpec(window=256)), max(1, args.repeats // 10))

    rows = [
        ("gs1_kernel_step", "B=64, window=256", f"{step_s * 1e3:.3f} ms"),
        ("gs1_kernel_log", f"{args.log_rows} rows, steps of 64, window=256", f"{log_s:.3f} s"),
    ]
    width = [max(len(r[k]) for r in rows + [("case", "shape", "best time")]) for k in range(3)]
    for row in [("case", "shape", "best time"), *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, width)))


if __name__ == "__main__":
    main()
