"""Does a run reproduce? The same spec's arms trained several times, and the runs compared.

    python benchmarks/reproduce.py SPEC --steps 7 --runs 3 --out DIR --label default
    GS1_DETERMINISTIC=1 python benchmarks/reproduce.py SPEC --steps 7 --runs 1 --out DIR --label det-a
    python benchmarks/reproduce.py --compare DIR                     # every run under DIR

A run is the flow's own training stage body (`tasks.arms.train_with_checkpoints`) for every arm of
the spec at its first seed, the arms in parallel threads on one engine as `gs1 run` trains them,
from fresh clients, for `--steps` steps, in `DIR/<label>-<k>/` (a run directory). Several runs of one
process share its model and compiled kernels; runs of separate processes (a label each) test
reproduction across processes too. `--compare` reads each run's step logs and final adapter and
prints, per arm and step, the mean reward and loss of every run and whether each matches the first
run bit for bit (rollouts included), then each run's final-adapter difference from the first
(largest |difference| and relative L2 over every LoRA tensor); `--json` writes it all too.

A run's folder may be compared where it was moved to (a device run's logs brought back into
`results/`): the step logs are read from the run folder itself, and where the adapters' folders
did not come along, the content digests each run recorded in its `reproduce.json` say whether the
final adapters are the same tensors (runs recorded before session 23 have none: unchecked, and said so).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

STEP_FIELDS = ("reward_mean", "loss", "grad_norm", "num_tokens")
TIME_COLUMNS = {"step_seconds", "sample_seconds", "train_seconds", "wall_time"}


def train_runs(spec: str, steps: int, runs: int, out: Path, label: str, data_dir: str | None) -> None:
    from design.plan import plan_from_spec
    from design.spec import load_spec
    from engine.determinism import requested
    from pipeline.services import engine_numerics
    from schemas.layout import RunLayout
    from tasks.arms import train_with_checkpoints

    plan = plan_from_spec(load_spec(spec))
    arms = [a.model_copy(update={"steps": steps}) for a in plan.arms]
    # the engine's compile lines on stderr: session 23's runs kept none, and a long step then
    # could only be read as a compile from its timing
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("gs1.engine").setLevel(logging.INFO)
    for k in range(runs):
        compiles_before = len(_decode_compiles())
        layout = RunLayout(out / f"{label}-{k}")
        layout.root.mkdir(parents=True, exist_ok=True)
        errors: list[BaseException] = []
        seconds: dict[str, float] = {}

        def train(arm):
            t0 = time.perf_counter()
            try:
                train_with_checkpoints(arm, plan.run, layout, "local", data_dir, checkpoint_every=0)
            except BaseException as e:  # reported below, after every arm is done
                errors.append(e)
            seconds[arm.name] = time.perf_counter() - t0

        threads = [threading.Thread(target=train, args=(a,), name=f"arm-{a.name}") for a in arms]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        record = {"spec": spec, "steps": steps, "label": label, "run": k, "arm_seconds": seconds,
                  "deterministic_requested": requested(), "numerics": engine_numerics("local"),
                  "adapter_digests": {a.name: adapter_content_digest(_trained(layout, a.name).sampler_path) for a in arms},
                  "decode_compiles": _decode_compiles()[compiles_before:]}
        (layout.root / "reproduce.json").write_text(json.dumps(record, indent=2))
        print(f"{layout.root.name}: " + ", ".join(f"{a} {s:.1f} s" for a, s in seconds.items()), flush=True)


def _rollout_digest(table) -> str:
    """The step's rollouts, every column but the clocks, as one digest."""
    keep = [c for c in table.column_names if c not in TIME_COLUMNS]
    return hashlib.sha256(json.dumps(table.select(keep).to_pylist(), sort_keys=True, default=str).encode()).hexdigest()[:16]


def _decode_compiles() -> list[dict]:
    """This process's decode graphs made ready so far (rows, positions, seconds, compiled or only
    captured), in order: a run's own are the ones added while it ran."""
    from dataclasses import asdict

    from engine.generate import COMPILE_EVENTS

    return [asdict(e) for e in COMPILE_EVENTS]


def _trained(layout, arm: str):
    from design.plan import TrainedArm

    return TrainedArm.model_validate_json((layout.root / "train" / arm / "final.json").read_text())


def adapter_content_digest(folder: str) -> str:
    """sha256 of an adapter folder's weights file: the same tensors, saved by the same code, give
    the same digest wherever the folder lies (pipeline.cache.digest_paths hashes the path too)."""
    from schemas.io import file_sha256

    return file_sha256(Path(folder) / "adapter_model.safetensors")


def _here(recorded: str, arm_dir: Path) -> Path:
    """The log of that name in the arm's own folder, which is the one compared wherever the run
    was moved (the device's /root/work/... is not here); the recorded path only when it is not."""
    moved = arm_dir / Path(recorded).name
    return moved if moved.exists() else Path(recorded)


def run_logs(run_dir: Path) -> dict:
    """{arm: {"steps": {step: {field: value, "rollouts": digest}}, "adapter": path, "adapter_digest": str | None}}."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from design.plan import TrainedArm
    from schemas.layout import RunLayout

    layout = RunLayout(run_dir)
    record = json.loads((run_dir / "reproduce.json").read_text()) if (run_dir / "reproduce.json").is_file() else {}
    digests = record.get("adapter_digests", {})
    logs = {}
    for final_json in sorted((run_dir / "train").glob("*/final.json")):
        trained = TrainedArm.model_validate_json(final_json.read_text())
        metrics = pq.read_table(_here(trained.metrics, final_json.parent))
        rollouts = pq.read_table(_here(trained.rollouts, final_json.parent))
        steps = {}
        for row in metrics.to_pylist():
            s = row["step"]
            steps[s] = {f: row.get(f) for f in STEP_FIELDS}
            steps[s]["step_seconds"] = row.get("step_seconds")
            steps[s]["train_seconds"] = row.get("train_seconds")
            steps[s]["rollouts"] = _rollout_digest(rollouts.filter(pc.equal(rollouts["step"], s)))
        logs[trained.arm] = {"steps": steps, "adapter": trained.sampler_path, "numerics": trained.numerics,
                             "adapter_digest": digests.get(trained.arm)}
    if not logs:
        raise SystemExit(f"{layout.root}: no trained arm (train/<arm>/final.json)")
    return logs


def adapter_difference(a: str, b: str) -> tuple[float, float]:
    """(largest |a - b|, ||a - b|| / ||a||) over every tensor of two adapter folders."""
    import torch
    from safetensors.torch import load_file

    ta = load_file(str(Path(a) / "adapter_model.safetensors"))
    tb = load_file(str(Path(b) / "adapter_model.safetensors"))
    worst, diff2, norm2 = 0.0, 0.0, 0.0
    for name, x in ta.items():
        d = (x.double() - tb[name].double())
        worst = max(worst, float(d.abs().max()))
        diff2 += float((d * d).sum())
        norm2 += float((x.double() ** 2).sum())
    return worst, (diff2 ** 0.5) / max(norm2 ** 0.5, 1e-300)


def compare(dirs: list[Path], as_json: Path | None) -> bool:
    """Prints the comparison; returns whether every run matched the first bit for bit."""
    runs = {d.name: run_logs(d) for d in dirs}
    names = list(runs)
    first = runs[names[0]]
    out = {"runs": names, "arms": {}, "identical": True, "adapters_unchecked": []}
    print(f"runs: {', '.join(names)} (first: {names[0]})")
    for arm, ref in first.items():
        print(f"\n{arm}: per step, each run's mean reward / loss; '=' matches {names[0]} bit for bit "
              f"(rewards, losses, grad norms, token counts and every rollout), '~' does not")
        print("| step | " + " | ".join(names) + " |")
        print("|---|" + "---|" * len(names))
        arm_out = {"steps": {}, "adapters": {}}
        for step in sorted(ref["steps"]):
            cells, row = [], {}
            for n in names:
                got = runs[n].get(arm, {}).get("steps", {}).get(step)
                if got is None:
                    cells.append("missing")
                    out["identical"] = False
                    continue
                same = all(got[f] == ref["steps"][step][f] for f in (*STEP_FIELDS, "rollouts"))
                out["identical"] &= same
                cells.append(f"{got['reward_mean']:.4f} / {got['loss']:.2f} {'=' if same else '~'}")
                row[n] = {**got, "same_as_first": same}
            arm_out["steps"][step] = row
            print(f"| {step} | " + " | ".join(cells) + " |")
        print(f"\n{arm}: final adapter against {names[0]}'s (largest |difference|, relative L2)")
        for n in names[1:]:
            if arm not in runs[n]:
                continue
            other = runs[n][arm]
            if Path(ref["adapter"]).is_dir() and Path(other["adapter"]).is_dir():
                worst, rel = adapter_difference(ref["adapter"], other["adapter"])
                arm_out["adapters"][n] = {"max_abs": worst, "rel_l2": rel}
                out["identical"] &= worst == 0.0
                print(f"  {n}: {worst:.3e}, {rel:.3e}")
            elif ref["adapter_digest"] and other["adapter_digest"]:
                same = ref["adapter_digest"] == other["adapter_digest"]
                arm_out["adapters"][n] = {"same_tensors": same}
                out["identical"] &= same
                print(f"  {n}: {'the same tensors' if same else 'different tensors'} (content digests; the folders are not here)")
            else:  # neither the folders nor digests: the step logs alone are compared
                out["adapters_unchecked"].append(f"{arm}/{n}")
                print(f"  {n}: unchecked (the adapters' folders are not here and the run recorded no digest)")
        seconds = {n: [s["step_seconds"] for _, s in sorted(runs[n].get(arm, {}).get("steps", {}).items())] for n in names}
        arm_out["step_seconds"] = seconds
        # the first two steps run the learner eagerly (it compiles on the third): the rest are the cost
        later = lambda v: v[2:] if len(v) > 2 else v  # noqa: E731
        print(f"\n{arm}: mean step seconds{' from step 2' if len(ref['steps']) > 2 else ''}: " + ", ".join(
            f"{n} {sum(later(v)) / max(len(later(v)), 1):.2f}" for n, v in seconds.items()))
        out["arms"][arm] = arm_out
    unchecked = f" (final adapters unchecked: {', '.join(out['adapters_unchecked'])})" if out["adapters_unchecked"] else ""
    print(f"\nidentical: {out['identical']}{unchecked}")
    if as_json is not None:
        as_json.write_text(json.dumps(out, indent=2, default=str))
    return out["identical"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("spec", nargs="?")
    p.add_argument("--steps", type=int, default=7)
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--out", type=Path, default=Path("runs/reproduce"))
    p.add_argument("--label", default="run")
    p.add_argument("--data-dir")
    p.add_argument("--compare", type=Path, nargs="+", help="a folder of runs, or the runs' folders")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    if args.compare:
        dirs = [d for c in args.compare for d in ([c] if (c / "train").is_dir() else sorted(x for x in c.iterdir() if (x / "train").is_dir()))]
        compare(dirs, args.json)
        return 0
    if not args.spec:
        p.error("a spec, or --compare")
    train_runs(args.spec, args.steps, args.runs, args.out, args.label, args.data_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
