"""`gs1 hillclimb`: offline kernel search on rollout logs, maximising the variance-equivalent group size.

    gs1 hillclimb --log LOG.parquet [--spec SPEC] [--seed 0] [--out DIR] [--budget N]
    gs1 hillclimb --transfer LOG1 LOG2 ... [--spec SPEC] [--seed 0] [--out DIR] [--budget N]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from schemas.errors import UserError

DEFAULT_BATCH = 64
KERNEL_ADVANTAGE = "kernel_cross_prompt_baseline"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "hillclimb",
        help="search kernel baselines offline on rollout logs (G_eff), or a transfer matrix",
        description=__doc__.splitlines()[0],
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--log", type=Path, help="rollout log (Parquet, one row per rollout, K >= 3 per prompt)")
    src.add_argument("--transfer", type=Path, nargs="+", metavar="LOG", help="two or more logs: transfer matrix")
    p.add_argument("--spec", type=Path, help="experiment spec JSON: batch_size and the gs1_kernel arm's kernel")
    p.add_argument("--seed", type=int, default=0, help="prompt split, draw order and sample draw (default 0)")
    p.add_argument("--out", type=Path, default=None, help="output folder (default hillclimb/<log name>)")
    p.add_argument("--budget", type=int, default=4000, help="candidate kernels to score per log (default 4000)")
    p.set_defaults(func=run)


def spec_settings(path: Path | None):
    """(batch_size, window, spec KernelRecipe) from a spec file, or the pinned defaults."""
    from pydantic import ValidationError  # lazy: start-up time

    from hillclimb.climb import KernelRecipe, spec_recipe
    from schemas.kernel import KernelSpec

    if path is None:
        return DEFAULT_BATCH, KernelSpec().window, spec_recipe()
    if not path.is_file():
        raise UserError(f"{path}: no such spec file")
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not valid JSON ({e.msg if hasattr(e, 'msg') else e})") from None
    if not isinstance(spec, dict):
        raise UserError(f"{path}: a spec must be a JSON object")
    batch = spec.get("batch_size", DEFAULT_BATCH)
    if not isinstance(batch, int) or batch < 2:
        raise UserError(f"{path}: batch_size must be an integer >= 2")
    kernel = {}
    for arm in spec.get("arms") or []:
        if isinstance(arm, dict) and arm.get("advantage") == KERNEL_ADVANTAGE:
            kernel = arm.get("kernel") or {}
            break
    try:
        recipe = KernelRecipe.from_spec(KernelSpec.model_validate(kernel))
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        where = ".".join(map(str, first["loc"]))
        raise UserError(f"{path}: the gs1_kernel arm's kernel{'.' + where if where else ''}: "
                        f"{first['msg'].removeprefix('Value error, ')}") from None
    window = recipe.window
    if window < batch:
        raise UserError(f"{path}: kernel window {window} is smaller than batch_size {batch}")
    return batch, window, recipe


def hc_families():
    from hillclimb.climb import FAMILIES  # lazy: start-up time

    return FAMILIES


def run(args: argparse.Namespace) -> int:
    from hillclimb import climb as hc  # lazy: start-up time
    from hillclimb import outputs
    from hillclimb.data import load_log

    if args.budget < 1:
        raise UserError("--budget must be at least 1")
    batch, window, spec_kernel = spec_settings(args.spec)
    if args.log is not None:
        log = load_log(args.log)  # every check happens before anything is written
        out = args.out or Path("hillclimb") / log.name
        rep = hc.analyse(log, args.seed, batch, window, args.budget, spec_kernel)
        paths = outputs.write_hillclimb(rep, out)
        rows = {r["method"]: r for r in rep.summary_rows}
        print(f"arm winner (kernel.json) {rep.arm_winner.label()}: G_eff {rows['arm_winner']['eval_g_eff']:.3f} "
              f"on {rep.n_prompts['eval']} eval prompts ({len(rep.search.candidates)} candidates)")
        blockers = rep.winner.arm_blockers()
        print(f"unrestricted winner {rep.winner.label()}: G_eff {rows['winner']['eval_g_eff']:.3f}"
              + (f" (not runnable by the arm: {'; '.join(blockers)})" if blockers else ""))
        print(f"wrote {paths['markdown'].parent}/ ({', '.join(p.name for p in paths.values())})")
        return 0
    if len(args.transfer) < 2:
        raise UserError("--transfer needs at least two logs")
    logs = [load_log(p) for p in args.transfer]
    seen: dict[str, int] = {}
    for lg in logs:  # distinct names: they label the matrix and the sub-folders
        seen[lg.name] = seen.get(lg.name, 0) + 1
        if seen[lg.name] > 1:
            lg.name = f"{lg.name}_{seen[lg.name]}"
    tr = hc.transfer(logs, args.seed, batch, window, args.budget, spec_kernel)
    out = args.out or Path("hillclimb") / "transfer"
    paths = outputs.write_transfer(tr, out)
    print(outputs.transfer_markdown(tr))
    print(f"wrote {paths['markdown'].parent}/")
    return 0
