"""What fastdata's console scripts share: the parser, the exit codes, the output checks, progress.

Exit codes (`EXIT_CODES`): 0 success; 1 an error, reported as one line naming its cause (the
traceback with --debug); 2 a bad command line, one line; 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import logging
import numbers
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterable, TextIO

from .errors import SKIP_OPTION, DataError, error_line

EXIT_CODES = """exit codes:
  0    success
  1    an error: one line naming its cause (--debug shows the traceback)
  2    a bad command line: one line
  130  interrupted (Ctrl-C)"""


class CommandError(Exception):
    """A failure that a command reports as its message alone, one line, exit 1."""


def version_text() -> str:
    """fastdata's version, torch's (and its CUDA) and Pillow's (Pillow-SIMD or stock), one a line."""
    import torch

    from ._pillow import PILLOW

    # The package's __init__ imports this module (through profiling.cli), so its version is
    # read from the imported package, not imported from it.
    version = sys.modules[__package__].__version__
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU build"
    return f"fastdata {version}\ntorch {torch.__version__} ({build})\n{PILLOW}"


class _Version(argparse.Action):
    """--version: prints `version_text()` and exits 0."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_text())
        parser.exit()


class Parser(argparse.ArgumentParser):
    """argparse, with a bad command line answered in one line (no usage block), exit 2; the
    description shown as written; `example` (a command line) closing the help as "example:";
    and --version on every command and subcommand."""

    def __init__(self, *args, example: str | None = None, **kwargs) -> None:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        if example:
            kwargs["epilog"] = "\n\n".join(filter(None, [kwargs.get("epilog"), f"example:\n  {example}"]))
        super().__init__(*args, **kwargs)
        self.add_argument("--version", action=_Version,
                          help="print the versions of fastdata, torch and Pillow, and exit")

    def error(self, message: str):
        print(f"{self.prog}: error: {message} (see --help)", file=sys.stderr)
        raise SystemExit(2)


class SkipsNamedOnce(logging.Filter):
    """Lets the warning that names a skipped file (the loader's, on_error="skip") through once:
    a command that makes several loaders over one source (a tune), or a profile that remakes
    its loader to measure a change, names each file once (`named`: those already named)."""

    def __init__(self, named: Iterable[str] = ()) -> None:
        super().__init__()
        self.named: set[str] = set(named)

    def filter(self, record: logging.LogRecord) -> bool:
        path = getattr(record, "fastdata_skipped", None)
        if path is None:
            return True
        if path in self.named:
            return False
        self.named.add(path)
        return True


def run_command(prog: str, body: Callable[[], int], debug: bool = False, skip_flag: str | None = None) -> int:
    """Runs a command's work by the exit codes: its own status, 1 and one line
    "`prog`: error: <cause>" for an exception (re-raised when `debug`), 130 on Ctrl-C. A
    skipped file is named once a run. `skip_flag`: the command's own way past a bad sample
    ("--on-error skip"), which a DataError's line then ends with instead of on_error="skip"."""
    logger, once = logging.getLogger("fastdata"), SkipsNamedOnce()
    logger.addFilter(once)
    try:
        return body()
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if debug:
            raise
        why = str(e) if isinstance(e, CommandError) else error_line(e)
        if skip_flag and isinstance(e, DataError) and why.endswith(SKIP_OPTION):
            why = why[:-len(SKIP_OPTION)] + skip_flag
        print(f"{prog}: error: {why}".replace("\n", " "), file=sys.stderr)
        return 1
    finally:
        logger.removeFilter(once)


def add_debug(parser: argparse.ArgumentParser) -> None:
    """The --debug flag that `run_command` reads."""
    parser.add_argument("--debug", action="store_true", help="tracebacks instead of one-line errors")


def not_a_directory(path: str | Path) -> Path | None:
    """The first component of `path`, from the root down, that exists but is not a directory
    (a file where a folder should be); None when there is none."""
    path = Path(path)
    for part in [*reversed(path.parents), path]:
        if not part.exists():
            return None  # nothing below it exists either: it can be made
        if not part.is_dir():
            return part
    return None


def check_writable(flag: str, path: str | Path, *, folder: bool = False) -> None:
    """Raises CommandError, naming `flag` and the cause, unless `path` can be written: with
    `folder`, a folder (made when missing) a file can be created in; otherwise a file whose
    folder is made when missing. A file there already is opened for appending, not changed.
    Called before the work that the output would record, so a bad path costs nothing."""
    path = Path(path)
    where = path if folder else path.parent
    blocked = not_a_directory(where)
    if blocked is not None:
        raise CommandError(f"{flag} {str(path)!r} cannot be written: {str(blocked)!r} is not a directory")
    try:
        where.mkdir(parents=True, exist_ok=True)
        if folder or not path.exists():
            with tempfile.TemporaryFile(dir=where):
                pass
        elif path.is_dir():
            raise CommandError(f"{flag} {str(path)!r} cannot be written: it is a directory")
        else:
            with open(path, "ab"):
                pass
    except OSError as e:
        raise CommandError(f"{flag} {str(path)!r} cannot be written: {e.strerror or error_line(e)}") from None


class Progress:
    """`done` of `total` on stderr while a long job runs: a rich progress bar on a terminal;
    otherwise (a log) a line at the start, at each quarter and at the end, five at most. The
    bar is redrawn by `update`, not by a thread of rich's, so that worker processes can be
    forked while it shows."""

    def __init__(self, what: str, total: int, stream: TextIO | None = None) -> None:
        self.what, self.total = what, total
        self.stream = stream if stream is not None else sys.stderr
        self.bar = None
        self.quarter = -1
        self.start = self.drawn = time.monotonic()

    def __enter__(self) -> "Progress":
        if self.stream.isatty():
            from rich.console import Console
            from rich.markup import escape
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as Bar, TimeRemainingColumn

            self.bar = Bar("{task.description}", BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                           console=Console(file=self.stream), auto_refresh=False)
            self.bar.start()
            self.task = self.bar.add_task(escape(self.what), total=self.total)  # (a path's brackets are not markup)
        self.update(0)
        return self

    def update(self, done: int) -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=done)
            now = time.monotonic()
            if done == self.total or now - self.drawn > 0.1:
                self.drawn = now
                self.bar.refresh()
            return
        quarter = 4 * done // max(self.total, 1)
        if quarter > self.quarter:
            self.quarter = quarter
            seconds = f" ({time.monotonic() - self.start:.1f} s)" if done == self.total else ""
            print(f"{self.what}: {done}/{self.total}{seconds}", file=self.stream, flush=True)

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()


def check_int(name: str, value: object, minimum: int) -> int:
    """The same check for a Python call's argument `name` (the tools' functions): an integer
    (numpy's too, not a bool) >= `minimum`, as an int; else ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"`{name}` should be an integer >= {minimum}, but got {value!r}")
    return int(value)


def _int_at_least(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise argparse.ArgumentTypeError(f"should be an integer >= {minimum}, but got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    return _int_at_least(text, 1)


def natural_int(text: str) -> int:
    """An argparse type: an integer >= 0."""
    return _int_at_least(text, 0)


def positive_float(text: str) -> float:
    """An argparse type: a number > 0."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"should be a number > 0, but got {text!r}")
    return value


def workers(text: str) -> int | str:
    """An argparse type: num_workers, "auto" or an integer >= 0."""
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"should be 'auto' or an integer >= 0, but got {text!r}")
    return value


def run_alone(prog: str, description: str, example: str, add_arguments: Callable[[Parser], None],
              argv: list[str] | None) -> int:
    """A tool's own console script (`fastdata-profile`, ...): its parser alone, then the command
    it sets (the same as under `fastdata`)."""
    ap = Parser(prog=prog, description=description, example=example)
    add_arguments(ap)
    args = ap.parse_args(argv)
    return args.run(args)
