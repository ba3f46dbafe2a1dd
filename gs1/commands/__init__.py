"""CLI subcommands. Each module defines `register(subparsers)`; its parser sets `func`.

A command imports what it runs inside its functions, not at the top: `gs1` imports every command
module to build its parser, and `gs1 --help` or a bad argument should answer at once, without
loading pydantic, numpy, Prefect or torch. Each such import says `# lazy: start-up time`.
"""

# Module names under gs1.commands, in the order `gs1 --help` lists them.
COMMANDS = ["validate", "power", "run", "advantages", "decide", "collect", "hillclimb", "report", "serve", "replay"]
