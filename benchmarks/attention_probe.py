"""The cuDNN SDPA backward defect, and the learner's attention path, on this device.

    python benchmarks/attention_probe.py [--device cuda] [--dtype bfloat16]

For each SDPA backend (the engine's flags after `configure_cuda_attention`, then each backend
alone), with the learner's mask (none: is_causal) and with the padded mask the learner passed
before the fix, at L = 703, 704 and 705: whether the sink reproduction's forward and backward
through transformers' sdpa attention are finite, and their time. The engine's row with no mask
is what training runs; a NaN in a masked cuDNN row at 704 is the defect itself.
"""

from __future__ import annotations

import argparse
import time

import torch

from engine.attention import (
    DEFECT_LENGTH,
    SDPA_BACKENDS,
    configure_cuda_attention,
    padding_mask,
    probe,
    sdpa_flags,
    set_sdpa_flags,
    versions,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    if device.type == "cuda":
        configure_cuda_attention()
    engine = sdpa_flags()
    settings = [("engine", engine)] + [(b, {name: name == b for name in SDPA_BACKENDS}) for b in SDPA_BACKENDS]
    print(f"{versions()}; {device} {dtype}; engine flags: {engine}")
    print(f"{'backends':<10} {'mask':<8} {'L':>5}  {'finite':<6} {'ms':>7}  note")
    for name, flags in settings:
        set_sdpa_flags(flags)
        for masked in (False, True):
            for L in (DEFECT_LENGTH - 1, DEFECT_LENGTH, DEFECT_LENGTH + 1):
                mask = padding_mask(L, L - 40, device) if masked else None
                probe(device, dtype, L, mask)  # warm-up (kernel selection, autotuning)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                result = probe(device, dtype, L, mask)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                ms = (time.perf_counter() - t0) * 1e3
                finite = "yes" if result.finite else ("n/a" if result.error else "NO")
                print(f"{name:<10} {'padding' if masked else 'none':<8} {L:>5}  {finite:<6} {ms:>7.2f}  {result.error or ''}")
    set_sdpa_flags(engine)


if __name__ == "__main__":
    main()
