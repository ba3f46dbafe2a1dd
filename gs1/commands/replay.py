"""`gs1 replay DIR`: rerun a non-finite training step from the dump it left, and say whether the
data or the attention kernel made it non-finite.

    gs1 replay runs/<run>/nonfinite/<arm>/<step> [--device cpu|cuda]

DIR is the folder a failure line names (`replay: gs1 replay DIR`). The call is rerun exactly,
then with the failing microbatch padded one longer and one shorter, with each SDPA backend alone
and with the other learner attention-mask setting (engine/replay.py); one line per run says whether
it was finite, and the last line gives the verdict.
"""

from __future__ import annotations

from pathlib import Path

from schemas.errors import UserError


def register(subparsers) -> None:
    parser = subparsers.add_parser("replay", help="rerun a non-finite training step from its dump",
                                   description=__doc__.splitlines()[0])
    parser.add_argument("dump", metavar="DIR", help="a nonfinite/<arm>/<step> folder")
    parser.add_argument("--device", default=None, help="where to rerun (default: the device it ran on)")
    parser.set_defaults(func=run)


def run(args) -> int:
    path = Path(args.dump)
    if not path.is_dir():  # said before torch is imported (seconds on a cold start)
        raise UserError(f"{path}: no such folder (a failure line names its `gs1 replay DIR`)")
    from engine.replay import replay, replay_table, verdict  # lazy: start-up time

    dump, runs = replay(path, device=args.device)
    print(replay_table(dump, runs))
    print(verdict(runs))
    return 0
