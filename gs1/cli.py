"""`gs1` console script: a thin dispatcher over gs1.commands.*.

Every user-facing failure is a `UserError` (or an argparse error) and ends as one line on
stderr with exit code 2 -- never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from flows.memory import bound_malloc
from gs1.commands import COMMANDS
from schemas.errors import UserError

# Telemetry off before anything imports prefect or the tinker SDK (whose telemetry also prints a
# traceback of its own when a service misbehaves); TINKER_TELEMETRY=1 turns the SDK's back on.
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TINKER_TELEMETRY", "0")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2 (argparse prints usage + message)
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gs1", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"gs1.commands.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"gs1.commands.{name}":
                continue  # command not built yet
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    bound_malloc()  # the one owner of the memory settings (the flows apply it too)
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:
        # the reader stopped reading (`gs1 validate SPEC | head -1`): what it wanted, not an error.
        # Point stdout at /dev/null so that the interpreter's last flush cannot fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except UserError as e:
        _say(f"gs1: error: {e}")
        return 2
    except KeyboardInterrupt:
        _say("gs1: interrupted")
        return 130
    except RecursionError:
        _say("gs1: error: the input is nested too deeply to read")
        return 2
    except Exception as e:  # a crash is still one line (the key redacted), never a traceback
        if os.environ.get("GS1_TRACEBACK"):
            raise
        _say(f"gs1: failed: {type(e).__name__}: {e} (set GS1_TRACEBACK=1 to see where)")
        return 1


def _say(message: str) -> None:
    """One line on stderr, with the Tinker API key redacted in whatever form the message holds it."""
    from schemas.redaction import one_line, redact_key

    sys.stderr.write(one_line(redact_key(message)) + "\n")


if __name__ == "__main__":
    sys.exit(main())
