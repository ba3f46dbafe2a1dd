"""A peer side by side: TRL's GRPOTrainer and our grpo_gs8 arm, 4 RL steps each, same model and shape.

    python benchmarks/peer_trl.py --model /root/m/model.gguf --data-dir .data/gsm8k [--steps 4]

Both sides: the same base model (bf16), LoRA rank 32 on every attention and MLP projection, 8
GSM8K train prompts x 8 samples per step at temperature 1, 512 new tokens, the same prompt (the
cookbook's few-shot prefix + question + boxed-answer suffix, Qwen chat format), reward = our env's
grader, lr 4e-5. Each side runs in its own process (so one's memory never counts against the
other's): TRL with its defaults (HF `generate`, no vLLM) plus gradient checkpointing; ours through
`rl.loop.train_arm` on the local engine, the loop `gs1 run` trains with, its decode shape and
learner compiled on step 1 (a 40-step run's steady state). Prints seconds per step
(steady = steps 2..N), peak GPU memory (`torch.cuda.max_memory_allocated`) and the ratios.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

LR = 4e-5
RANK = 32
PROMPTS, SAMPLES, NEW_TOKENS = 8, 8, 512
LORA_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _env(data_dir: str):
    from rl.envs import get_env

    return get_env("gsm8k", data_dir=data_dir)


def run_trl(model: str, data_dir: str, steps: int) -> dict:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from tinker_cookbook.recipes.math_rl.math_env import MathEnv
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from engine.models import load_causal_lm, load_tokenizer, resolve_model

    # the engine's loader: a GGUF dequantised to bf16 as our side gets it, read from $GS1_MODEL_CACHE
    # when a run kept it there (the dequantising is no part of either side's steps)
    src = resolve_model(model)
    tokenizer = load_tokenizer(src)
    lm = load_causal_lm(src, torch.bfloat16, "cuda")
    # Dequantised to bf16 on load, nothing quantised remains; the Trainer refuses a GGUF-marked model.
    lm.hf_quantizer = None
    try:
        lm.is_quantized = False
    except AttributeError:
        pass
    env = _env(data_dir)
    problems = env.train_order(seed=0)[: PROMPTS * steps]
    by_question = {p.question: p for p in problems}
    rows = [{"prompt": MathEnv.standard_fewshot_prefix() + [{"role": "user", "content": p.question + MathEnv.question_suffix()}],
             "question": p.question} for p in problems]

    def reward(completions, question, **_):
        out = []
        for completion, q in zip(completions, question):
            text = completion[0]["content"] if isinstance(completion, list) else completion
            extracted = env.extract_answer(text)
            out.append(float(extracted is not None and env.answer_is_correct(extracted, by_question[q])))
        return out

    times: list[float] = []

    class StepClock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            torch.cuda.synchronize()
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            torch.cuda.synchronize()
            times.append(time.perf_counter() - self.t)

    config = GRPOConfig(
        output_dir="/tmp/gs1-peer-trl", per_device_train_batch_size=PROMPTS * SAMPLES, num_generations=SAMPLES,
        gradient_accumulation_steps=1, max_completion_length=NEW_TOKENS, temperature=1.0, learning_rate=LR,
        max_steps=steps, logging_steps=1, bf16=True, gradient_checkpointing=True, report_to="none",
        save_strategy="no", shuffle_dataset=False, seed=0,
    )
    trainer = GRPOTrainer(
        model=lm, reward_funcs=reward, args=config, train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
        peft_config=LoraConfig(r=RANK, lora_alpha=32, lora_dropout=0.0, target_modules=LORA_MODULES),
        callbacks=[StepClock()],
    )
    torch.cuda.reset_peak_memory_stats()
    trainer.train()
    return {"step_seconds": times, "peak_gib": torch.cuda.max_memory_allocated() / 2**30}


def run_ours(model: str, data_dir: str, steps: int) -> dict:
    import torch
    from tinker_cookbook import renderers

    from design.arm import ArmConfig
    from rl.backends import make_service_client
    from rl.loop import new_window, train_arm

    arm = ArmConfig(name="grpo_gs8", advantage="group_mean", group_size=SAMPLES, groups_per_batch=PROMPTS, lr=LR,
                    seed=0, steps=steps, lora_rank=RANK, base_model="Qwen/Qwen2.5-Coder-1.5B-Instruct",
                    base_model_path=model, max_tokens=NEW_TOKENS)
    # a 40-step run's steady state: its decode shape and learner compiled on step 1 (not timed as
    # steady, as TRL's step 1 is not), not on the 8th batch and 3rd call the engine waits for
    service = make_service_client("local", compile_after_batches=1, compile_learner_after=1)
    training_client = service.create_lora_training_client(base_model=arm.base_model, rank=RANK, seed=0,
                                                          base_model_path=model).result()
    renderer = renderers.get_renderer("qwen3_instruct", training_client.get_tokenizer())
    env = _env(data_dir)
    logs = []
    torch.cuda.reset_peak_memory_stats()
    train_arm(arm, training_client=training_client, env=env, renderer=renderer, order=env.train_order(seed=0),
              steps=range(steps), window=new_window(arm), on_step=logs.append)
    return {"step_seconds": [log.metrics["step_seconds"] for log in logs],
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
            "reward_mean": [log.metrics["reward_mean"] for log in logs]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a .gguf file or a HF model directory")
    ap.add_argument("--data-dir", required=True, help="GSM8K train.jsonl / test.jsonl")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--side", choices=["trl", "ours"], help="run one side in this process (the table runs both)")
    args = ap.parse_args(argv)
    if args.side:
        result = (run_trl if args.side == "trl" else run_ours)(args.model, args.data_dir, args.steps)
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    results = {}
    for side in ("trl", "ours"):
        t = time.perf_counter()
        proc = subprocess.run([sys.executable, __file__, "--side", side, "--model", args.model, "--data-dir",
                               args.data_dir, "--steps", str(args.steps)], capture_output=True, text=True)
        line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            print(f"{side} failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}", file=sys.stderr)
            return 1
        results[side] = json.loads(line[len("RESULT "):])
        results[side]["process_seconds"] = time.perf_counter() - t
        print(f"{side}: {results[side]}", flush=True)

    def steady(side):
        s = results[side]["step_seconds"][1:]
        return sum(s) / len(s)

    print(f"\n| | s / RL step (steady, steps 2-{args.steps}) | step 1 s | peak GPU GiB | process s |\n|---|---|---|---|---|")
    for side, name in (("trl", "TRL GRPOTrainer"), ("ours", "gs1 grpo_gs8 (local engine)")):
        r = results[side]
        print(f"| {name} | {steady(side):.2f} | {r['step_seconds'][0]:.2f} | {r['peak_gib']:.1f} | {r['process_seconds']:.0f} |")
    print(f"| ratio TRL / ours | {steady('trl') / steady('ours'):.1f}x | | "
          f"{results['trl']['peak_gib'] / results['ours']['peak_gib']:.2f}x | |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
