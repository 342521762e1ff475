"""`fastdata`: the one command line, a subcommand for each tool.

Each subcommand is a tool's own command, with the same flags and behaviour; the older names
stay as aliases: `fastdata profile` is `fastdata-profile`, `fastdata bench` `fastdata-bench`,
`fastdata shard` `fastdata-shard`, `fastdata demo` `fastdata-demo`. A tool module gives
`EXAMPLE` and `add_arguments(parser)`, which sets the parser's `run` default to the function that
runs the parsed command, and imports what needs torch where the command runs, not at its own
import: a command's help page is its parser alone, and `import fastdata` skips torch for it (see
`_needs_no_torch` in `fastdata/__init__.py`). Its line in `fastdata --help` is here (`COMMANDS`),
so that page imports no tool.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

from ._cli import EXIT_CODES, Parser

# name -> (the module of its command, its line in `fastdata --help`), in the order that page lists
# them. A command line imports only its own command's module, not the others' (a profiler, a
# benchmark, a report).
COMMANDS: dict[str, tuple[str, str]] = {
    "profile": ("fastdata.profiling.cli", "is the training step waiting on its input? measure, explain, tune"),
    "bench": ("fastdata.bench", "images/s of each augmentation on each engine this machine has"),
    "shard": ("fastdata.shard", "pack an image folder into WebDataset tar shards, with an index"),
    "demo": ("fastdata.demo", "fastdata against torch's DataLoader, side by side, on data it makes"),
    "run": ("fastdata.run", "run a training command with its DataLoaders served by fastdata"),
}
EXAMPLE = "fastdata profile synthetic --step-ms 100 --tune"  # the README's first command's job


def command_module(name: str) -> ModuleType:
    """The module of the command `name`."""
    return importlib.import_module(COMMANDS[name][0])


def parser(command: str | None = None) -> Parser:
    """The `fastdata` command's parser; given `command`, with that one's arguments (the others
    named, with their lines, for argparse's choices and the help page)."""
    ap = Parser(prog="fastdata", description=__doc__.split("\n\n")[0] + "\n\nRun `fastdata COMMAND --help` for its "
                "flags and an example.", epilog=EXIT_CODES, example=EXAMPLE if command is None else None)
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND", title="commands")
    for name, (_, summary) in COMMANDS.items():
        if name == command:
            module = command_module(name)
            module.add_arguments(sub.add_parser(name, help=summary, description=module.__doc__,
                                                example=module.EXAMPLE))
        else:
            sub.add_parser(name, help=summary)
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
