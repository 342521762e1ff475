"""`fastdata`: the one command line, a subcommand for each tool.

Each subcommand is a tool's own command, with the same flags and behaviour; the older names
stay as aliases: `fastdata profile` is `fastdata-profile`, `fastdata bench` `fastdata-bench`,
`fastdata shard` `fastdata-shard`, `fastdata demo` `fastdata-demo`. A tool module gives
`SUMMARY` (its line in `fastdata --help`), `EXAMPLE`, and `add_arguments(parser)`, which sets
the parser's `run` default to the function that runs the parsed command.
"""

from __future__ import annotations

from types import ModuleType

from . import bench, demo, run, shard
from ._cli import EXIT_CODES, Parser
from .profiling import cli as profile

# name -> the module of its command, in the order `fastdata --help` lists them
COMMANDS: dict[str, ModuleType] = {"profile": profile, "bench": bench, "shard": shard, "demo": demo, "run": run}


def parser() -> Parser:
    """The `fastdata` command's parser, its subcommands included."""
    ap = Parser(prog="fastdata", description=__doc__.split("\n\n")[0] + "\n\nRun `fastdata COMMAND --help` for its "
                "flags and an example.", epilog=EXIT_CODES, example=profile.EXAMPLE)
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND", title="commands")
    for name, module in COMMANDS.items():
        module.add_arguments(sub.add_parser(name, help=module.SUMMARY, description=module.__doc__,
                                            example=module.EXAMPLE))
    return ap


def main(argv: list[str] | None = None) -> int:
    """`fastdata COMMAND ...`: runs the command; its exit status."""
    args = parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
