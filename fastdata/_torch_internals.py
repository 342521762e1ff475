"""Every private name of torch and DALI that fastdata uses, behind one door.

fastdata drives DataLoader from outside (its live iterator, its workers, its single-process
fetcher), allocates shared memory as DataLoader's workers do, reuses torch's collate table and
tears DALI pipelines down deterministically. None of that has a public API, so each use is a
function here and nowhere else: a torch (or DALI) release that renames one breaks this file
alone, and `tests/unit/test_torch_internals.py` checks every name below on the installed torch and
that no other module of fastdata names one. Every probe of a live object is defensive (a
missing attribute reads as "nothing there"), so an unknown torch degrades to DataLoader's own
behaviour rather than raising.

Supported: torch 2.6 (the first with `torch.accelerator`) to 2.13, the newest tested.
"""

from __future__ import annotations

import math
import os
import signal
import threading
from typing import Any, Callable, Iterator

import torch
from torch._utils import ExceptionWrapper  # what a worker sends for a batch that raised: DataLoader re-raises it
from torch.utils.data._utils.collate import collate as torch_collate
from torch.utils.data._utils.collate import collate_tensor_fn, default_collate_fn_map

__all__ = ["ExceptionWrapper", "torch_collate", "collate_tensor_fn", "default_collate_fn_map", "profiler_enabled",
           "collate_error_in_process",
           "new_shared_storage", "new_shared_tensor", "auto_collation", "share_length_warning", "driven_dataloader",
           "live_iterator", "iterator_workers", "iterator_shutdown", "kill_iterator_workers", "end_live_iterator",
           "ask_workers_to_end",
           "unregister_workers", "single_process_fetch", "mark_fetches", "dali_shutdown"]

SUPPORTED_TORCH = ((2, 6), (2, 13))  # (oldest, newest) major.minor, both ends included

# The attributes below, by owner: what the test checks on the installed torch, and what no
# other module may name.
DATALOADER_ATTRIBUTES = ("_auto_collation", "_IterableDataset_len_called", "_iterator")
ITERATOR_ATTRIBUTES = ("_workers", "_shutdown_workers", "_worker_pids_set", "_workers_done_event", "_dataset_fetcher",
                       "_sampler_iter", "_pin_memory", "_pin_memory_device", "_workers_status", "_persistent_workers",
                       "_mark_worker_as_unavailable")
OTHER_NAMES = ("_new_shared", "_typed_storage", "_profiler_enabled", "_remove_worker_pids", "_utils", "_shutdown",
               "_worker_info",
               "_SingleProcessDataLoaderIter", "_MapDatasetFetcher", "_IterableDatasetFetcher", "_version")


# ----------------------------------------------------------------- the profiler, tensors, shared memory

def profiler_enabled() -> bool:
    """Whether a torch profiler records now (its traces keep the ranges of the thread that
    started it)."""
    return torch.autograd._profiler_enabled()


def write_count(t: torch.Tensor) -> int:
    """A counter torch bumps at each in-place write to `t`'s data (autograd's version counter):
    unchanged, the data is as it was when the count was read."""
    return t._version


def new_shared_storage(nbytes: int) -> torch.UntypedStorage:
    """`nbytes` of shared memory, as a DataLoader worker's batch gets it."""
    return torch.UntypedStorage._new_shared(nbytes)


def new_shared_tensor(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An empty CPU tensor in shared memory, as default_collate makes one in a worker (sent to
    the training process without a copy)."""
    elem = torch.empty((), dtype=dtype)
    storage = elem._typed_storage()._new_shared(math.prod(shape), device="cpu")
    return elem.new(storage).resize_(*shape)


# ----------------------------------------------------------------- a DataLoader and its iterator

def collate_error_in_process(batch: Any) -> Exception | None:
    """The error torch's default_collate raises for `batch` in the training process, where it
    stacks tensors in place (a worker's stacks them into shared memory sized from the samples,
    which raises its own error first for samples of different sizes); None where it collates."""
    from torch.utils.data._utils import worker

    info, worker._worker_info = worker._worker_info, None  # (get_worker_info() then says: no worker)
    try:
        torch_collate(batch, collate_fn_map=default_collate_fn_map)
    except Exception as e:
        return e
    finally:
        worker._worker_info = info
    return None


def auto_collation(loader: Any) -> bool:
    """Whether DataLoader `loader` batches (a batch sampler), rather than handing out samples."""
    return loader._auto_collation


def share_length_warning(source: Any, target: Any) -> None:
    """`target` (a DataLoader) warns as `source` would for an iterable dataset that yields more
    than its len(): len() asked of `source` counts for it."""
    target._IterableDataset_len_called = source._IterableDataset_len_called


def driven_dataloader(*args: Any, **kwargs: Any) -> Any:
    """A DataLoader built for a loader that was built as one (fastdata's drop-in), which gave
    torch's warning of a worker count above the cores then: this one skips its construction's
    check (an instance attribute over the method, gone once built) and warns at each pass from
    torch's own line, as a plain DataLoader does. (Not under `warnings.catch_warnings`: its exit
    resets the once-per-place record, and the warning would come again.)"""
    loader = torch.utils.data.DataLoader.__new__(torch.utils.data.DataLoader)
    loader.check_worker_number_rationality = lambda: None
    loader.__init__(*args, **kwargs)
    del loader.check_worker_number_rationality
    return loader


def live_iterator(loader: Any) -> Any:
    """DataLoader `loader`'s persistent iterator (its workers, running ahead), or None."""
    return getattr(loader, "_iterator", None)


def iterator_workers(it: Any) -> tuple:
    """The worker processes of DataLoader iterator `it` (none for a single-process one, or once
    shut down)."""
    return tuple(getattr(it, "_workers", None) or ())


def iterator_shutdown(it: Any) -> None:
    """DataLoader iterator `it`'s own shutdown of its workers (idempotent; nothing for a
    single-process iterator), which cannot wait on a lock a dead worker held, and after which
    no worker is left alive."""
    if hasattr(it, "_shutdown_workers"):
        if not getattr(it, "_shutdown", True) and any((w.exitcode or 0) < 0 for w in iterator_workers(it)) \
                and not _done_event_free(it):
            # A worker died by a signal (the out-of-memory killer, a kill -9) holding the pool's
            # shared lock: the others cannot exit gracefully, so the pool is killed whole.
            kill_iterator_workers(it)
        try:
            it._shutdown_workers()
        finally:
            # DataLoader's SIGCHLD handler raises wherever this thread is; raised inside the
            # shutdown before it told a worker to end, that worker would wait for its next
            # index as long as this process lives. One still alive here is killed (not at the
            # interpreter's exit, whose shutdown leaves them to multiprocessing's: `python_exiting`).
            if torch.utils.data._utils.python_exit_status is False and any(w.is_alive() for w in iterator_workers(it)):
                kill_iterator_workers(it)


def ask_workers_to_end(it: Any) -> tuple:
    """Tells the workers of DataLoader iterator `it` to end, as its own shutdown does first (its
    done event set, a stop in the queue of each worker it still feeds), without waiting for
    them: their processes, to join."""
    workers = iterator_workers(it)
    if workers and not getattr(it, "_shutdown", True):
        it._workers_done_event.set()
        for i, up in enumerate(it._workers_status):
            if up or it._persistent_workers:
                it._mark_worker_as_unavailable(i, shutdown=True)
    return workers


def _done_event_free(it: Any) -> bool:
    """Whether the lock of DataLoader iterator `it`'s done event can be had within a second (a
    live worker holds it for a moment, a dead one for ever)."""
    lock = getattr(getattr(getattr(it, "_workers_done_event", None), "_cond", None), "_lock", None)
    if lock is None or not lock.acquire(timeout=1.0):
        return lock is None
    lock.release()
    return True


def kill_iterator_workers(it: Any) -> list[int]:
    """SIGKILLs the live workers of DataLoader iterator `it` and reaps them; their pids.

    The workers share a done event whose lock each takes in `done_event.is_set()`, and one
    killed inside that call never gives it back; DataLoader's own code then waits forever on it
    (its shutdown sets the event; a read that finds a worker dead checks it). So the iterator
    gets a fresh event, which only this process can hold, before the kills: the workers keep
    the old one to their end. (A thread of this process already waiting on the old lock, one
    that found a worker dead in DataLoader's read before SIGCHLD was seen, stays waiting: torch
    raises for the dead worker in the main thread first, where the pass is read there.)"""
    unregister_workers(it)  # first, as DataLoader's shutdown does: its SIGCHLD handler would raise
    if hasattr(it, "_workers_done_event"):
        it._workers_done_event = threading.Event()
    killed = []
    for w in iterator_workers(it):
        if w.is_alive():
            killed.append(w.pid)
            try:
                os.kill(w.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for w in iterator_workers(it):
        if w.pid in killed:
            w.join(5)
    return killed


def python_exiting() -> None:
    """Marks the interpreter's exit as torch's own atexit hook marks it (`python_exit_status`):
    a DataLoader iterator shut down from then on leaves its daemonic workers to
    multiprocessing's exit, which terminates them, rather than waiting for their batches."""
    torch.utils.data._utils.python_exit_status = True


def end_live_iterator(loader: Any) -> None:
    """Shuts the persistent workers of DataLoader `loader` down: its next iter() starts fresh ones."""
    live = live_iterator(loader)
    if live is not None:
        iterator_shutdown(live)
        loader._iterator = None


def rewatch_workers(it: Any) -> bool:
    """Puts the workers of DataLoader iterator `it` back on DataLoader's SIGCHLD watch, while it
    has not shut down. Its handler forgets all of an iterator's workers once it has raised for
    one (so that the shutdown's kills do not raise again): where that raise came outside the
    pass (in the training step) and the consumer reads on, nothing would tell it of the dead
    worker until its timeout. Whether it did."""
    if not getattr(it, "_worker_pids_set", False) or getattr(it, "_shutdown", True):
        return False
    from torch.utils.data._utils import signal_handling

    signal_handling._remove_worker_pids(id(it))
    signal_handling._set_worker_pids(id(it), tuple(w.pid for w in iterator_workers(it)))
    return True


def unregister_workers(it: Any) -> None:
    """Takes `it`'s workers off DataLoader's SIGCHLD watch, as its own shutdown does first: a
    worker killed after that is not reported as "killed by signal" in whatever thread runs."""
    if getattr(it, "_worker_pids_set", False):
        from torch.utils.data._utils import signal_handling

        signal_handling._remove_worker_pids(id(it))
        it._worker_pids_set = False


def single_process_fetch(it: Any) -> tuple[Iterator[Any], Callable[[Any], Any]] | None:
    """(the sampler's indices, a function from an index to its batch, pinned when `it` pins) of
    DataLoader's single-process iterator `it`, the parts its `__next__` drives; None for any
    other iterator, or where this torch's iterator has other parts."""
    fetcher = getattr(it, "_dataset_fetcher", None)
    indices = getattr(it, "_sampler_iter", None)
    if fetcher is None or indices is None or type(it).__name__ != "_SingleProcessDataLoaderIter":
        return None
    if getattr(it, "_pin_memory", False):
        from torch.utils.data._utils.pin_memory import pin_memory

        fetch, device = fetcher.fetch, it._pin_memory_device
        return indices, lambda index: pin_memory(fetch(index), device)
    return indices, fetcher.fetch


def mark_fetches() -> None:
    """In a DataLoader worker (this process only; called again, nothing more): each batch's
    fetch first calls `fetching()` on its collate_fn where that is one timing stages (fastdata's
    `RingCollate` under the profiler), after the worker's loop took the batch's indices off its
    queue. A worker waits there while the consumer's step runs; the mark keeps that wait out of
    the time counted as the Dataset's and its reads."""
    from torch.utils.data._utils import fetch

    for cls in (fetch._MapDatasetFetcher, fetch._IterableDatasetFetcher):
        original = cls.fetch
        if getattr(original, "marks_fetches", False):
            continue

        def marked(self: Any, possibly_batched_index: Any, _original: Callable = original) -> Any:
            collate = getattr(self, "collate_fn", None)
            if getattr(collate, "timing", None) is not None and hasattr(collate, "fetching"):
                collate.fetching()
            return _original(self, possibly_batched_index)

        marked.marks_fetches = True
        cls.fetch = marked


# ----------------------------------------------------------------- DALI

def dali_shutdown(pipe: Any) -> None:
    """DALI's own teardown of a pipeline, which its `__del__` and atexit hook call: joins its
    threads now."""
    pipe._shutdown()
