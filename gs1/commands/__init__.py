"""CLI subcommands. Each module defines `register(subparsers)`; its parser sets `func`."""

# Module names under gs1.commands, in the order `gs1 --help` lists them.
COMMANDS = ["validate", "run", "advantages", "decide", "collect", "hillclimb", "report", "serve"]
