"""`fastdata`: the one command line, a subcommand for each tool.

Each subcommand is a tool's own command, with the same flags and behaviour; the older names
stay as aliases: `fastdata profile` is `fastdata-profile`, `fastdata bench` `fastdata-bench`,
`fastdata shard` `fastdata-shard`, `fastdata demo` `fastdata-demo`. A tool module gives
`SUMMARY` (its line in `fastdata --help`), `EXAMPLE`, and `add_arguments(parser)`, which sets
the parser's `run` default to the function that runs the parsed command.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

from ._cli import EXIT_CODES, Parser

# name -> the module of its command, in the order `fastdata --help` lists them. A command line
# imports only its own command's module, not the others' (a profiler, a benchmark, a report).
COMMANDS: dict[str, str] = {"profile": "fastdata.profiling.cli", "bench": "fastdata.bench", "shard": "fastdata.shard",
                            "demo": "fastdata.demo", "run": "fastdata.run"}


def command_module(name: str) -> ModuleType:
    """The module of the command `name`."""
    return importlib.import_module(COMMANDS[name])


def parser(command: str | None = None) -> Parser:
    """The `fastdata` command's parser, its subcommands included; given `command`, only that
    one's arguments (the others named, for argparse's choices)."""
    top = command_module("profile").EXAMPLE if command is None else None
    ap = Parser(prog="fastdata", description=__doc__.split("\n\n")[0] + "\n\nRun `fastdata COMMAND --help` for its "
                "flags and an example.", epilog=EXIT_CODES, example=top)
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND", title="commands")
    for name in COMMANDS:
        if command is None or name == command:
            module = command_module(name)
            module.add_arguments(sub.add_parser(name, help=module.SUMMARY, description=module.__doc__,
                                                example=module.EXAMPLE))
        else:
            sub.add_parser(name)
    return ap


def main(argv: list[str] | None = None) -> int:
    """`fastdata COMMAND ...`: runs the command; its exit status. Without `argv` (the command
    line's), the process is the command's own: `fastdata run` may end it by the signal that
    ended its command; given `argv` (a Python caller), it returns."""
    own_process = argv is None
    argv = sys.argv[1:] if argv is None else argv
    args = parser(argv[0] if argv and argv[0] in COMMANDS else None).parse_args(argv)
    args.own_process = own_process
    return args.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
