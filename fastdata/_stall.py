"""How a pass over DataLoader workers ends when one stalls or dies.

DataLoader's watchdog notices a worker that died, not one that stopped or is stuck in native
code, and with `timeout=0` it waits forever. So a loader always gives DataLoader a
limit: its `timeout`, or with `timeout=0` the stall limit (`FASTDATA_STALL_TIMEOUT` seconds,
600 by default: no batch in ten minutes is no progress), and a `Watchdog` covers the one
wait DataLoader's limit does not. When it passes, the workers are killed (SIGKILL reaches a
stopped process; DataLoader's SIGTERM does not) before the error is raised, so the error
comes at the limit and no worker is left behind. An iterator marked by `wait_forever`
(`fastdata run`'s, for a script that asked torch's timeout=0) has no stall limit: it waits as
torch's waits.

A worker that dies is DataLoader's error, at once (its SIGCHLD handler), with what sent a
SIGKILL that fastdata did not send (`_memory.killed_why`: the out-of-memory killer, where the
kernel's count says so).
"""

from __future__ import annotations

import os
import signal
import threading
import time
import weakref
from typing import Any

import torch.multiprocessing

from ._memory import killed_why, oom_kills
from ._torch_internals import iterator_workers, kill_iterator_workers, rewatch_workers, unregister_workers

STALL_ENV = "FASTDATA_STALL_TIMEOUT"
_STALL_DEFAULT = 600.0

_unlimited: "weakref.WeakSet[Any]" = weakref.WeakSet()  # DataLoader iterators without a stall limit


def stall_limit(timeout: float) -> float:
    """The seconds DataLoader waits for a batch before the loader gives up: `timeout` when
    set, else the stall limit."""
    if timeout and timeout > 0:
        return float(timeout)
    text = os.environ.get(STALL_ENV, "")
    try:
        limit = float(text) if text else _STALL_DEFAULT
    except ValueError:
        raise ValueError(f"{STALL_ENV} should be a number of seconds, but got {text!r}") from None
    return limit if limit > 0 else _STALL_DEFAULT


def _a_worker_died(it: Any) -> bool:
    """Whether a worker of DataLoader iterator `it` was killed or exited with an error: read
    without reaping it (WNOWAIT), as DataLoader's SIGCHLD handler reads it after."""
    for w in iterator_workers(it):
        try:
            ended = os.waitid(os.P_PID, w.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except (OSError, AttributeError, TypeError):  # reaped already, not our child, no waitid (not Linux)
            continue
        if ended is not None and (ended.si_code != os.CLD_EXITED or ended.si_status != 0):
            return True
    return False


def wait_forever(it: Any) -> None:
    """DataLoader iterator `it` (whose DataLoader has timeout=0) waits for a batch as long as it
    takes: no `Watchdog` limit for its passes."""
    _unlimited.add(it)


class Watchdog:
    """Ends a pass whose consumer has waited longer than the stall limit for a batch.

    DataLoader's own timeout covers the wait for a batch to be queued, not the unpickling of
    one: a tensor crosses from a worker as a file descriptor that the worker's resource-sharer
    thread hands over on request, so a worker stopped (or stuck in native code holding its
    GIL) after queueing a batch blocks the consumer forever with any timeout. This thread
    kills the workers when a wait passes the limit; the blocked read then fails, and `error`
    turns what DataLoader raises into the timeout error.

    DataLoader learns that a worker died from its SIGCHLD handler, which raises in the main
    thread at whatever line runs there, once: it then forgets the pass's workers. Raised outside
    the pass (in the training step, which a script may catch and go on reading) or where it is
    lost (a finalizer the garbage collector runs, whose errors Python only prints), the
    consumer would wait for the dead worker's batch until the stall limit. So while the main
    thread has waited a second for a batch and a worker has died, this thread puts the workers
    back on the handler's watch and sends it SIGCHLD again, once a second (DataLoader's own
    check, with timeout=0, comes every 5 s).
    """

    it: Any = None
    killed: list[int] | None = None  # the workers this killed, once it has
    _rewatched = False  # whether this put the workers back on DataLoader's SIGCHLD watch
    _oom_before: int | None = None

    def __init__(self, it: Any, timeout: float) -> None:
        self.it, self.timeout = it, timeout
        # The consumer sets `waiting` to the number of the batch it waits for, and to -1 when
        # it has it: two stores a batch, no clock read; this thread times how long one number stays.
        self.waiting = -1
        self._oom_before = oom_kills()  # (a worker's SIGKILL error says whether the out-of-memory killer sent it)
        self._main = threading.get_ident() == threading.main_thread().ident  # (made in the consumer's thread)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if it in _unlimited:  # no limit, nothing to watch; `error` still names a worker that died
            self.limit = float("inf")
            return
        self.limit = stall_limit(timeout)
        self._thread = threading.Thread(target=self._watch, name="fastdata-watchdog", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        period = min(1.0, self.limit / 4)
        seen, since = -1, 0.0
        while not self._stop.wait(period):
            waiting, now = self.waiting, time.monotonic()
            if waiting < 0 or waiting != seen:
                seen, since = waiting, now
            elif now - since > self.limit:
                self.killed = []  # first: the consumer's read fails as soon as a worker dies
                kill_workers(self.it, self.killed)
                return
            elif self._main and now - since >= 1.0 and _a_worker_died(self.it):
                self._rewatched = rewatch_workers(self.it) or self._rewatched
                signal.pthread_kill(threading.main_thread().ident, signal.SIGCHLD)

    def close(self) -> None:
        self._stop.set()
        # (a pass dropped in a reference cycle ends where the collector runs: maybe this very thread)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        if self._rewatched:  # off the watch again, as after the handler's raise: the shutdown's kills must not raise
            unregister_workers(self.it)

    def error(self, error: BaseException) -> BaseException | None:
        """For an error out of the DataLoader iterator: the error to raise instead, or None to
        raise it as it is. A stall becomes the timeout error (the workers killed); a worker
        that died under a read (its socket reset before DataLoader could see it exit) becomes
        DataLoader's own "exited unexpectedly" error. DataLoader's SIGCHLD handler may raise
        its "DataLoader worker ... is killed by signal" error in this thread while this runs
        (at whatever line runs when the signal comes): that error is the one to raise then. A
        worker's error for a SIGKILL fastdata did not send says what sent it (`_why_killed`)."""
        try:
            out = self._error(error)
        except RuntimeError as e:
            if not str(e).startswith("DataLoader worker"):
                raise
            out = e
        return self._why_killed(error if out is None else out) or out

    def _why_killed(self, error: BaseException) -> RuntimeError | None:
        """A dead worker's `error`, with what sent its SIGKILL where fastdata did not (`killed_why`)."""
        workers = iterator_workers(self.it)
        if not str(error).startswith("DataLoader worker") or self.killed is not None or \
                not any(w.exitcode == -signal.SIGKILL for w in workers):
            return None
        why = killed_why(self._oom_before, len(workers))
        return RuntimeError(f"{str(error).rstrip(' .')}: {why}")

    def _error(self, error: BaseException) -> BaseException | None:
        self.close()  # a kill under way in the watchdog's thread completes
        if isinstance(error, RuntimeError) and str(error).startswith("DataLoader timed out"):
            self.killed = kill_workers(self.it, [])
        if self.killed is not None:
            why = f"timeout={self.timeout:g}" if self.timeout and self.timeout > 0 else \
                f"timeout=0, so fastdata's stall limit: {STALL_ENV}={self.limit:g} s"
            return RuntimeError(f"DataLoader timed out after {self.limit:g} seconds: no batch came from the workers "
                                f"({why}); a worker is stuck or stopped; workers {self.killed} were killed")
        workers = iterator_workers(self.it)
        deadline = time.monotonic() + (1.0 if isinstance(error, (OSError, EOFError)) else 0.0)
        while True:
            dead = [w for w in workers if w.exitcode not in (None, 0)]
            if dead or time.monotonic() >= deadline:
                break
            time.sleep(0.01)
        unlink_orphans([w.pid for w in dead])  # a worker killed from outside may have left a name
        if dead and not isinstance(error, RuntimeError):
            causes = ", ".join(f"pid {w.pid}: " + (f"killed by signal {-w.exitcode}" if w.exitcode < 0
                                                   else f"exit code {w.exitcode}") for w in dead)
            return RuntimeError(f"DataLoader worker exited unexpectedly ({causes})")
        return None


class NoWatchdog:
    """For a pass without workers: nothing to watch."""

    waiting = -1

    def close(self) -> None:
        pass

    def error(self, error: BaseException) -> None:
        return None


def kill_workers(it: Any, pids: list[int]) -> list[int]:
    """SIGKILLs the live workers of DataLoader iterator `it` and reaps them; their pids,
    appended to `pids`."""
    pids.extend(kill_iterator_workers(it))
    unlink_orphans(pids)
    return pids


def unlink_orphans(pids: list[int]) -> None:
    """Removes the shared-memory names that killed workers left. torch names a worker's
    segment /dev/shm/torch_<pid>_... and, sharing by file descriptor (its default), unlinks the
    name right after creating it, before anyone else can know it; a worker killed between the
    two leaves a name that nothing will ever remove."""
    if not pids or torch.multiprocessing.get_sharing_strategy() != "file_descriptor":
        return
    try:
        names = os.listdir("/dev/shm")
    except OSError:
        return
    prefixes = tuple(f"torch_{pid}_" for pid in pids)
    for name in names:
        if name.startswith(prefixes):
            try:
                os.unlink(os.path.join("/dev/shm", name))
            except OSError:
                pass
