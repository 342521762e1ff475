"""The process pool of fastdata's own batch jobs (writing shards, making synthetic images):
concurrent.futures' ProcessPoolExecutor, whose workers are never terminated while they work.
multiprocessing.Pool ends with terminate(), which can kill a worker while it holds the result
queue's lock and then wait on that lock forever (CPython issue 96995); the executor's workers
end when told, after their job, and one that dies (killed, out of memory) fails the pending
jobs with BrokenProcessPool instead of leaving them unanswered."""

from __future__ import annotations

import multiprocessing
import os
import signal
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Callable


def process_pool(workers: int, initializer: Callable[..., None] | None = None,
                 initargs: tuple = ()) -> ProcessPoolExecutor:
    """A pool of `workers` processes, forked where fork exists: the children need nothing
    imported again (a spawned child would import fastdata, hence torch, first), and the
    executor forks them all at the first submit, before it starts a thread of its own.
    Each runs `initializer(*initargs)` first."""
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else None)
    return ProcessPoolExecutor(workers, mp_context=ctx, initializer=_start,
                               initargs=(os.getpid(), initializer, initargs))


def _start(parent: int, initializer: Any, initargs: tuple) -> None:
    # On Linux a worker ends with the process that forked it (PR_SET_PDEATHSIG, 1), so that none
    # outlives a run that was killed; elsewhere it does, idle, as multiprocessing's own do.
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)
    except Exception:  # no prctl (macOS), no C library by that name (Windows)
        pass
    if os.getppid() != parent:  # it ended before the line above
        os._exit(1)
    if initializer is not None:
        initializer(*initargs)
