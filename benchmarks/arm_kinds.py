"""What each arm kind costs per training step, beside grpo: one table row per arm.

    python benchmarks/arm_kinds.py                          # the demo model and env, 32 rollouts a step
    python benchmarks/arm_kinds.py --prompts 64 --steps 3   # the user's shape (64 x 1; grpo 8 x 8)
    python benchmarks/arm_kinds.py --device cuda --model /path/to/model

Runs `--steps` steps of each arm through `rl.loop.run_step` on the local engine (the tinker client
surface: the same calls a hosted run makes) from fresh clients, and reports the mean over the
steps after the first (the first pays one-time costs): step wall time and its parts -- sampling,
the policy's forward_backward + optim_step, FlashREINFORCE's learner forward pass, the critic's
forward pass and its training step -- and the tokens each of those sent. The critic's columns are
its extra cost over a one-rollout-per-prompt arm.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default=str(REPO / "specs" / "demo_local.json"), help="model, env, sampling from here")
    parser.add_argument("--model", default=None,
                        help="weights (a directory or .gguf), or `tiny` (the tests' random tiny Qwen3 and their "
                             "token_threshold env); default: the spec's")
    parser.add_argument("--prompts", type=int, default=32, help="prompts per step of a one-rollout arm")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--device", default=None)
    args = parser.parse_args()

    from tinker_cookbook import renderers

    from design.arm import CriticSpec
    from design.plan import plan_from_spec
    from design.spec import load_spec, resolve_base_model_path, resolve_renderer_name
    from rl.backends import make_service_client
    from rl.envs import get_env
    from rl.loop import new_window, run_step

    spec = load_spec(args.spec)
    plan = plan_from_spec(spec)
    base = plan.baseline.model_copy(update={"steps": args.steps})
    if args.max_tokens:
        base = base.model_copy(update={"max_tokens": args.max_tokens})
    model_path = args.model or resolve_base_model_path(spec)
    renderer_name = resolve_renderer_name(spec)
    env = get_env(spec.dataset.name, **dict(spec.dataset.options))
    if args.model == "tiny":
        sys.path.insert(0, str(REPO / "tests"))
        from fixtures.flow_env import TokenThresholdEnv
        from fixtures.tiny_model import build_tiny_qwen3

        model_path = str(build_tiny_qwen3(Path(tempfile.mkdtemp(prefix="gs1-tiny-")) / "tiny"))
        base = base.model_copy(update={"base_model": model_path, "lora_rank": 4})
        env, renderer_name = TokenThresholdEnv(), "qwen3_instruct"
    shapes = {
        "grpo": dict(advantage="group_mean", group_size=8, groups_per_batch=max(1, args.prompts // 8)),
        "batch_mean": dict(advantage="batch_mean", group_size=1, groups_per_batch=args.prompts),
        "flash_reinforce": dict(advantage="flash_reinforce", group_size=1, groups_per_batch=args.prompts, trust_delta=3e-3),
        "critic": dict(advantage="critic", group_size=1, groups_per_batch=args.prompts, critic=CriticSpec()),
    }
    service = make_service_client("local", device=args.device, cache_dir=tempfile.mkdtemp(prefix="gs1-bench-"))
    order = env.train_order(seed=0)
    rows = []
    for name, shape in shapes.items():
        arm = base.model_copy(update={"name": name, **shape})
        arm = type(arm).model_validate(arm.model_dump())  # the recipe checks of ArmConfig
        open_client = lambda: service.create_lora_training_client(  # noqa: E731
            base_model=arm.base_model, rank=arm.lora_rank, seed=arm.seed, base_model_path=model_path).result()
        client = open_client()
        critic = open_client() if arm.critic is not None else None
        renderer = renderers.get_renderer(renderer_name, client.get_tokenizer())
        window, metrics = new_window(arm), []
        for step in range(args.steps):
            log = run_step(step, arm, training_client=client, env=env, renderer=renderer, order=order, window=window,
                           critic_client=critic)
            window = log.next_window
            metrics.append(log.metrics)
            print(f"{name} step {step}: {log.metrics['step_seconds']:.2f}s", file=sys.stderr, flush=True)
        timed = metrics[1:] or metrics

        def mean(key):
            values = [m[key] for m in timed if m.get(key) is not None]
            return float(np.mean(values)) if values else None

        rows.append({
            "arm": name, "rollouts": arm.batch_size, "step_s": mean("step_seconds"), "sample_s": mean("sample_seconds"),
            "policy_train_s": mean("train_seconds"), "learner_forward_s": mean("learner_forward_seconds"),
            "critic_forward_s": mean("critic_forward_seconds"), "critic_train_s": mean("critic_train_seconds"),
            "sampled_tokens": mean("num_tokens"), "learner_forward_tokens": mean("learner_forward_tokens"),
            "critic_tokens": (mean("critic_forward_tokens") or 0) + (mean("critic_train_tokens") or 0) if arm.critic else None,
            "admit_rate": mean("trust_admit_rate"), "reward": mean("reward_mean"),
        })
    header = list(rows[0])
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join("-" if row[k] is None else f"{row[k]:.3g}" if isinstance(row[k], float) else str(row[k])
                                for k in header) + " |")
    print(json.dumps({"spec": args.spec, "model": model_path, "device": args.device or "auto", "steps": args.steps,
                      "timed_steps": max(1, args.steps - 1), "wall_time": time.time()}))


if __name__ == "__main__":
    main()
