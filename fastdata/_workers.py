"""DataLoader worker processes: how they start, how a pass over them ends.

- Start: `fork`, unless something in this process holds threads (a DALI pipeline, see
  `hold_threads`): a forked child gets a copy of such an object but none of its threads, and
  the first garbage collection or lock that touches it there can crash or block the child
  forever. Then workers start by `forkserver`, from a clean server process that never held
  those threads; it costs the server's start (and its one import of the loader's modules) once a
  process. Workers whose work is fastdata's (an image loader's, those `fastdata run` gives a
  script's loader) fork also where the platform's default is forkserver (Linux from Python
  3.14, `own_start_method`); a drop-in loader's start as DataLoader's would.
- Stall and death: see `_stall` (what a stalled or dead worker's pass raises).
- End: `pass_end` shuts a pass's workers down and frees the buffer slots it never delivered.
"""

from __future__ import annotations

import gc
import os
import time
import weakref
from typing import Any, Callable

import multiprocessing
import multiprocessing.queues
from multiprocessing.reduction import ForkingPickler

import torch.multiprocessing  # (here, not at the call: a pass may end as the interpreter shuts down)
import torch.utils.data

from ._buffers import unsent
from ._stall import unlink_orphans
from ._torch_internals import (ExceptionWrapper, ask_workers_to_end, end_live_iterator, iterator_shutdown,
                               iterator_workers, live_iterator, mark_fetches)

_threaded: "weakref.WeakSet[Any]" = weakref.WeakSet()


def hold_threads(owner: Any) -> None:
    """`owner` runs threads in this process until `release_threads(owner)` (or until it dies)."""
    _threaded.add(owner)


# What the forkserver imports once, not each worker: the loader's modules (torch and the backends
# with them), which a worker runs.
FORKSERVER_PRELOAD = ("fastdata.factory",)


def release_threads(owner: Any) -> None:
    _threaded.discard(owner)


def start_method(asked: Any, own: bool = False) -> Any:
    """The multiprocessing context for a loader's workers: what the user asked for, else
    DataLoader's default (this process's default start method) unless threads are live here,
    then "forkserver"; for workers whose work is fastdata's (`own`), `own_start_method()`. Its
    queues send a batch that cannot be pickled as that batch's error (`_BatchQueue`). A context
    object of the user's own class is left as it is."""
    if asked is None and len(_threaded):
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(list(FORKSERVER_PRELOAD))
    elif asked is None and own:
        ctx = multiprocessing.get_context(own_start_method())
    elif asked is None or isinstance(asked, str):
        # (with None, resolving the default fixes it, as torch's first Queue() does)
        ctx = multiprocessing.get_context(asked).get_context()
    else:
        ctx = asked
    kind = _SENDING.get(type(ctx))
    return ctx if kind is None else kind()


def own_start_method() -> str:
    """How workers whose work is fastdata's start, looked up without fixing the default start
    method (a script may still set one, as under torch alone, which fixes it at the first iter()
    with workers): "forkserver" while threads are live here; else the start method set, or the
    platform's default (listed first), but "fork" where that is "forkserver" (Linux from Python
    3.14). forkserver runs the main module again in each worker (a script without a main guard
    fails there) and adds its server's start before a process's first batch
    (benchmarks/start_method.py); fork is what these workers have on Python 3.13 and before, with
    the same threads to mind. (A script's own choice of forkserver cannot be told from the default
    once the default is fixed, so both fork.)"""
    if len(_threaded):
        return "forkserver"
    methods = multiprocessing.get_all_start_methods()
    chosen = multiprocessing.get_start_method(allow_none=True)
    if chosen in (None, methods[0]) and methods[0] == "forkserver" and "fork" in methods:
        return "fork"
    return chosen or methods[0]


class _BatchQueue(multiprocessing.queues.Queue):
    """A DataLoader worker's result queue that cannot lose a batch. The queue pickles each
    item in a feeder thread; for one that fails (a sample holding a lambda, an open file, a
    lock) the base queue prints the error and drops the item, and DataLoader's iterator waits
    for that batch forever (or until its timeout). Here the batch's index goes with the error
    instead, which the training process raises at that batch as it raises a Dataset's error
    (concurrent.futures' process pool sends its results' pickling errors the same way)."""

    def _on_queue_feeder_error(self, e: Exception, obj: Any) -> None:
        info = torch.utils.data.get_worker_info()
        if info is None or not (isinstance(obj, tuple) and len(obj) == 2) or isinstance(obj[1], ExceptionWrapper):
            return super()._on_queue_feeder_error(e, obj)  # not a worker's batch, or its error did not pickle
        unsent(obj[1])
        where = f"in DataLoader worker process {info.id} (batch {obj[0]} cannot be pickled to reach the main process)"
        error = ExceptionWrapper((type(e), e, e.__traceback__), where=where)
        try:
            ForkingPickler.dumps(error)
        except Exception:  # an exception class of the sample's own that does not pickle either
            error = ExceptionWrapper((RuntimeError, RuntimeError(f"{type(e).__name__}: {e}"), None), where=where)
        try:
            self.put((obj[0], error))
        except Exception:  # the queue closed under the worker's shutdown: nobody waits for the batch
            return super()._on_queue_feeder_error(e, obj)


def _send_batches(context: type) -> type:
    def queue(self: Any, maxsize: int = 0) -> _BatchQueue:
        return _BatchQueue(maxsize, ctx=self.get_context())

    def reduce(self: Any) -> tuple:  # (a loader that holds one is pickled: ddp_spawn sends it)
        return start_method, (self.get_start_method(),)

    return type(context.__name__, (context,), {"Queue": queue, "__reduce__": reduce, "__module__": __name__})


_SENDING = {type(ctx): _send_batches(type(ctx))
            for ctx in map(multiprocessing.get_context, multiprocessing.get_all_start_methods())}


class WorkerStart:
    """A worker's `worker_init_fn`: moves everything the worker inherited from the training
    process into the collector's permanent generation (`gc.freeze`, which relinks list heads
    and writes no object), then runs the user's function, if any. A full collection in the
    worker then never writes the inherited objects' headers: their pages stay shared with the
    training process instead of being copied, one worker at a time, at some later epoch."""

    def __init__(self, user: Callable[[int], Any] | None = None) -> None:
        self.user = user

    def __call__(self, worker_id: int) -> None:
        gc.freeze()
        mark_fetches()  # under the profiler, a wait for indices is not counted as the Dataset's
        if self.user is not None:
            self.user(worker_id)


def workers_running(loader: Any) -> bool:
    """Whether persistent workers of DataLoader `loader` are up: they hold their own copies of
    what they run, so a flag set in this process (stage timing) no longer reaches them."""
    return bool(iterator_workers(live_iterator(loader)))


# The DataLoaders fastdata made with persistent workers, by the process that made them. At exit
# their workers are told to end, as at any shutdown, and given a few seconds together to do so:
# a worker the interpreter's exit terminates instead (what DataLoader's own persistent workers
# get) leaves its temporary folder behind (/tmp/pymp-*, multiprocessing's, which holds the socket
# a worker sends descriptors through and goes at a worker's normal exit).
_PERSISTENT: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()
EXIT_WAIT = 5.0  # seconds the workers of all of them have, together, to end at exit


def end_at_exit(loader: Any) -> None:
    """Registers DataLoader `loader`, whose workers persist, for `end_persistent_workers`."""
    _PERSISTENT[loader] = os.getpid()


def end_persistent_workers() -> None:
    """At exit, before DataLoader's shutdown is told the interpreter is exiting: the persistent
    workers of this process's loaders told to end, and joined for EXIT_WAIT seconds in all
    (the rest are terminated by multiprocessing's exit, as DataLoader's are)."""
    workers = []
    for loader, pid in list(_PERSISTENT.items()):
        it = live_iterator(loader) if pid == os.getpid() else None
        try:
            workers += ask_workers_to_end(it) if it is not None else ()
        except Exception:  # (a queue already closed: nothing is left to tell at exit, and its workers are terminated)
            continue
    deadline = time.monotonic() + EXIT_WAIT
    for w in workers:
        w.join(max(0.0, deadline - time.monotonic()))


def shutdown_workers(loader: Any) -> None:
    """Shuts the persistent workers of DataLoader `loader` down now (after a stall or a dead
    worker they cannot serve another pass): its next iter() starts fresh ones."""
    workers = iterator_workers(live_iterator(loader))
    end_live_iterator(loader)
    # A worker killed, from outside or by the shutdown, may have left a shared-memory name.
    unlink_orphans([w.pid for w in workers if w.exitcode not in (None, 0)])


def drop_dead_workers(loader: Any) -> bool:
    """Shuts the persistent workers of DataLoader `loader` down when one of them has died since
    they started (killed from outside, or by the out-of-memory killer, mid-pass or between
    passes): its next iter() then starts fresh ones, where DataLoader's would wait for the dead
    worker to answer (torch's 5 s status check, with fastdata's stall limit behind it). Whether
    it did."""
    if all(w.exitcode is None for w in iterator_workers(live_iterator(loader))):
        return False
    shutdown_workers(loader)
    return True


def pass_end(it: Any, rings: Any, persistent: bool) -> Callable[[], None]:
    """The end of a pass of DataLoader iterator `it` whose workers fill the generation of
    worker rings `rings` (or None): the workers are shut down, then the slots of batches they
    made and never delivered are freed. Idempotent. Holds `it` weakly: an iterator that was
    dropped shut its workers down as it went."""
    if persistent:
        return lambda: None
    ref, pid = weakref.ref(it), os.getpid()

    def end() -> None:
        if os.getpid() != pid:  # a forked child collecting the pass it inherited: not its workers
            return
        live = ref()
        if live is not None:
            iterator_shutdown(live)
            # A worker that died by a signal (killed from outside, or terminated by the
            # shutdown for not exiting in time) may have left a shared-memory name.
            unlink_orphans([w.pid for w in iterator_workers(live) if w.exitcode not in (None, 0)])
        if rings is not None:
            rings.end()

    return end
