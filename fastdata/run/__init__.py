"""`fastdata run -- COMMAND...`: runs a training command, unchanged, with its DataLoaders served by
fastdata's drop-in loader (native collation into reused buffers).

The command runs as a child process (its exit status is this one's; where a signal ended it, the
same signal then ends this process, so that a shell or a supervisor sees the signal). SIGINT,
SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 sent to this process are sent on to it (as torchrun
sends them on to its workers), save what a terminal sends the whole foreground group, the
command's too (Ctrl-C).
In it, and in every Python process it starts (torchrun's ranks, spawned workers),
`torch.utils.data.DataLoader` decides per loader: served by fastdata, or torch's own where
fastdata could not give the same batches (a subclass of DataLoader, an IterableDataset, a custom
sampler or batch sampler, arguments torch's DataLoader does not take). A loader the script left
at num_workers=0 gets num_workers='auto' only where workers cannot change a batch: a torchvision
image folder fastdata decodes itself, torch's default samplers, fork, room in /dev/shm; any other
Dataset keeps its 0 (only its own __getitem__ knows whether workers would change its samples).
A torchvision image folder (or timm's dataset of one), CIFAR or MNIST whose transform fastdata
lowers is served natively: decoded by fastdata, its pixels within the bounds docs/guide.md gives,
its random ops drawn by fastdata from torchvision's distributions (so a seeded run's batches are
not the plain run's; the summary says so).
Where CUDA is, a served loader with workers copies each batch ahead to the GPU the script moves
its batches to (`fastdata.run._copy`; --no-copy-ahead: not). At the end, one line per loader on
stderr: where it was made, the dataset, native (served, fastdata making its samples), served or
fell back, and why (and how many of the copies ahead the script took).

--profile times each served loader in the real run (the wait per step, the stall fraction, the
stages) and writes the usual report (report.json, report.html) per loader in --out.

    fastdata run [--profile] [--out DIR] [--no-copy-ahead] [--debug] -- python train.py [ARGS...]

A script named alone (`fastdata run train.py ARGS...`: a .py, a folder with a __main__.py, a
file that is not executable) and a module (`fastdata run -m package.train ARGS...`) run with the
Python that runs fastdata, as torchrun runs them. With torchrun, fastdata run goes first
(`fastdata run -- torchrun --nproc_per_node 8 train.py`): one summary for all the ranks.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .._cli import CommandError, add_debug, check_writable, run_command

EXAMPLE = "fastdata run --profile -- python train.py --epochs 2"
_SITE = Path(__file__).with_name("_site.py")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--profile", action="store_true",
                    help="time each served loader in the run and write its report (report.json, report.html)")
    ap.add_argument("--no-copy-ahead", dest="copy_ahead", action="store_false",
                    help="do not copy batches ahead to the GPU the script moves them to")
    ap.add_argument("--out", default="fastdata-run", metavar="DIR",
                    help="where --profile writes a folder per loader (default: ./fastdata-run)")
    add_debug(ap)
    ap.add_argument("-m", dest="module", metavar="MODULE",
                    help="run a module with this Python, as python -m (and torchrun -m) do; its arguments follow")
    ap.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND...",
                    help="the command to run (after an optional --), as it runs without fastdata; a script "
                         "named alone (a .py, a folder or a file that is not executable) runs with this Python")
    ap.set_defaults(run=lambda args: main_args(args, ap))


def main_args(args: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    """Runs the parsed command line; no COMMAND is a bad command line (exit 2)."""
    command = ["-m", args.module, *args.command] if getattr(args, "module", None) else args.command
    if not command or command == ["--"]:
        ap.error("no command given: fastdata run [--profile] -- python train.py ...")

    def body() -> int:
        status = _launch(command, profile=args.profile, out=args.out, copy_ahead=args.copy_ahead)
        if status < 0 and getattr(args, "own_process", False):  # (not a Python caller's process)
            _end_by_signal(-status)
        return _as_a_shell_gives(status)

    return run_command("fastdata run", body, args.debug)


def run(command: list[str], *, profile: bool = False, out: str | os.PathLike = "fastdata-run",
        copy_ahead: bool = True) -> int:
    """Runs `command` with the hook; prints the loaders' decisions (and with `profile`, writes
    their reports in `out`); returns the command's exit status (128 + N where signal N ended it,
    as a shell gives it)."""
    return _as_a_shell_gives(_launch(command, profile=profile, out=out, copy_ahead=copy_ahead))


def _as_a_shell_gives(status: int) -> int:
    """Popen's status (-N: signal N) as a shell gives it (128 + N)."""
    return 128 - status if status < 0 else status


def _for_python(name: str) -> bool:
    """Whether a command's first word is a script for Python to run, as torchrun takes it: a
    .py (a missing one too: Python then says so, with its exit status), a folder (Python runs
    its __main__.py), or a file that is not executable (a script without its suffix); an
    executable file or a name on PATH is a command of its own."""
    return name.endswith(".py") or os.path.isdir(name) or (os.path.isfile(name) and not os.access(name, os.X_OK))


def _launch(command: list[str], *, profile: bool, out: str | os.PathLike, copy_ahead: bool) -> int:
    """`run`, with the command's status as Popen gives it (-N where signal N ended it)."""
    command = command[1:] if command[:1] == ["--"] else command
    if not command:
        raise CommandError("no command given: fastdata run [--profile] -- python train.py ...")
    if command[0] == "-m" or _for_python(command[0]):
        command = [sys.executable, *command]  # a script or module alone runs with this Python, as torchrun runs it
    if profile:
        check_writable("--out", out, folder=True)
    records = tempfile.mkdtemp(prefix="fastdata-run-")
    try:
        shutil.copyfile(_SITE, os.path.join(records, "sitecustomize.py"))
        env = dict(os.environ, FASTDATA_RUN_DIR=records)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [records, os.environ.get("PYTHONPATH")]))
        if profile:
            env["FASTDATA_RUN_PROFILE"] = "1"
        if not copy_ahead:
            env["FASTDATA_RUN_NO_COPY"] = "1"
        status = _child(command, env)
        loaders = read_records(records)
    finally:
        shutil.rmtree(records, ignore_errors=True)
    print(summary(loaders, status), file=sys.stderr)
    if profile:
        for line in write_reports(loaders, Path(out)):
            print(line, file=sys.stderr)
    return status


# What a process manager, a scheduler or a user sends the command's process (as torchrun's) is
# forwarded to the command, whose handlers (a checkpoint on SIGTERM, KeyboardInterrupt) then run.
FORWARDED = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
                  if hasattr(signal, name))
_SI_KERNEL = 0x80  # Linux's si_code of a signal the kernel sent: a terminal's keys and hangup
_SIGINFO = sys.platform.startswith("linux") and hasattr(signal, "sigtimedwait")


def _end_by_signal(signum: int) -> None:
    """Ends this process by `signum` at its default action, as the command ended, so that the
    shell or supervisor that started `fastdata run` sees a death by that signal (WIFSIGNALED:
    a shell's loop stops at a Ctrl-C), not an exit status; with no core dump of this process's
    own. Returns where the signal's default is to go on (none the command could end by). This
    process has no other thread: the unblock below is for all of it."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    except (ImportError, ValueError, OSError):
        pass
    try:
        signal.signal(signum, signal.SIG_DFL)  # (SIGKILL's cannot be set: it is its default)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
    except (OSError, ValueError):
        pass
    os.kill(os.getpid(), signum)


def _child(command: list[str], env: dict[str, str]) -> int:
    """The command's exit status, as Popen gives it (-N when signal N ended it). A signal of FORWARDED
    that this process gets is sent on to the command, and this process waits on for it to end;
    except one the terminal sent the whole foreground process group, the command's too (Ctrl-C),
    and one this process ignores."""
    child: subprocess.Popen | None = None
    early: list[int] = []

    def caught(signum: int, frame: Any) -> None:  # one that came between two waits, its sender unknown
        if child is None:
            early.append(signum)
        else:
            _forward(child, signum, None)

    # A signal this process ignores (`nohup`, a shell's background job) stays ignored, and the
    # command inherits that, as it would without fastdata.
    previous = {s: signal.signal(s, caught) for s in FORWARDED if signal.getsignal(s) is not signal.SIG_IGN}
    waited = tuple(previous)
    try:
        try:
            child = subprocess.Popen(command, env=env)
        except OSError as e:
            raise CommandError(f"cannot run {command[0]!r}: {e.strerror or e}") from None
        for signum in early:  # came before the command was there to get it
            child.send_signal(signum)
        while child.poll() is None:
            if not _SIGINFO:
                child.wait()  # signals reach `caught`
                break
            # Here the signal's sender is known (one that arrives between two waits goes to
            # `caught`). The command's end is polled for: an unblocked SIGCHLD is discarded (its
            # default is to ignore it), and a blocked one would stay blocked in the command.
            info = signal.sigtimedwait(waited, 0.1)
            # (a wait that a stop and a continue cut short can return a siginfo CPython never
            # filled in, on 3.10 and 3.11: only a signal waited for is one)
            if info is not None and info.si_signo in waited:
                _forward(child, info.si_signo, info.si_code == _SI_KERNEL)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
    return child.returncode


def _forward(child: subprocess.Popen, signum: int, kernel: bool | None) -> None:
    """Sends `signum` on to the command, unless the terminal sent it to the whole foreground
    process group, the command included (Ctrl-C, Ctrl-\\, a hangup once the session's leader has
    exited). `kernel`: whether the kernel sent it (None: unknown; then a SIGINT or SIGQUIT while
    this process's group has the terminal counts as the terminal's). The kernel sends a hangup
    to a session's leader alone: that one is forwarded."""
    if kernel is None:
        group = signum in (signal.SIGINT, signal.SIGQUIT) and _terminal_foreground()
    else:
        group = kernel and not (signum == signal.SIGHUP and os.getsid(0) == os.getpid())
    if not group:
        child.send_signal(signum)


def _terminal_foreground() -> bool:
    """Whether this process's group is its controlling terminal's foreground group."""
    try:
        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:
        return False
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(fd)


def read_records(folder: str | os.PathLike) -> list[dict[str, Any]]:
    """The loaders the command's processes made, in order (process, then creation), each with
    its profile when one was written."""
    loaders: dict[tuple[int, int], dict[str, Any]] = {}
    for path in sorted(Path(folder).glob("loaders-*.jsonl")):
        for text in path.read_text().splitlines():
            line = json.loads(text)
            key = (line["pid"], line["seq"])
            loaders.setdefault(key, {}).update(line if "decision" in line else
                                              {k: v for k, v in line.items() if k in ("profile", "copy")})
    return [loaders[k] for k in sorted(loaders) if "decision" in loaders[k]]


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:  # a real-time signal has no name
        return str(signum)


def summary(loaders: list[dict[str, Any]], status: int = 0) -> str:
    """One line per kind of loader: where it was made, the dataset, the decision and why (a
    loader made again alike, as trainers rebuild them, counted once with "xN"). Without any, why
    there may be none: a command that failed (`status`, -N: signal N ended it) before it made
    one, else the hook."""
    if not loaders and status:
        how = f"exited with status {status}" if status > 0 else f"was ended by signal {_signal_name(-status)}"
        return f"fastdata run: the command {how} before it made a DataLoader"
    if not loaders:
        return ("fastdata run: the command made no DataLoader under fastdata (none made, or its Python did not load "
                "the hook: python -S, -I or -E ignore PYTHONPATH)")
    kinds = collections.Counter((r["decision"], r["where"], r["dataset"], r["loader"], r["reason"] + _copied(r))
                                for r in loaders)
    native = sum(r["decision"] == "native" for r in loaders)  # (fastdata makes their samples)
    served = native + sum(r["decision"] == "served" for r in loaders)
    lines = [f"fastdata run: {len(loaders)} DataLoader(s): {served} served by fastdata ({native} natively), "
             f"{len(loaders) - served} torch's own"]
    for (decision, where, dataset, loader, reason), n in kinds.items():
        times = f" (x{n})" if n > 1 else ""
        lines.append(f"  {decision:<9} {where}  {loader}({dataset}){times}: {reason}")
    return "\n".join(lines)


def _copied(record: dict[str, Any]) -> str:
    copy = record.get("copy")
    if not copy:
        return ""
    return (f"; copied ahead to {copy['device']}, {copy['taken']:,} of {copy['copies']:,} tensor copies taken by "
            "the script's .to()")


def write_reports(loaders: list[dict[str, Any]], out: Path) -> list[str]:
    """Writes a report per served loader that timed a step, in out/loader-K; a line each."""
    from ._profile import report

    lines = []
    timed = [r for r in loaders if r.get("profile")]
    if not timed:
        return ["fastdata run --profile: no served loader delivered 2 batches (a step is timed from one batch to "
                "the next): no report"]
    for k, r in enumerate(timed, 1):
        rep = report(r["profile"], f"{r['where']} {r['loader']}({r['dataset']})", r.get("reason", ""))
        folder = rep.write(out / f"loader-{k}")
        stall = "" if rep.stall_fraction is None else f", the step waited {100 * rep.stall_fraction:.0f}% of the time"
        lines.append(f"fastdata run --profile: {r['where']}: {rep.verdict}{stall}; "
                     f"{1e3 * r['profile']['wait_s'] / max(r['profile']['batches'], 1):.2f} ms wait a step; "
                     f"report in {folder}")
    return lines
