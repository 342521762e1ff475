"""Who decodes with `num_workers=0`: the training process itself. One thread runs the pass's
read-and-decode tasks (`cpu.BatchTask`) ahead of the consumer, and the native decoder spreads
each batch over the cores with the GIL released, so a pass starts at once: no worker processes
to start, no batch crossing a pipe. The thread lives only while its pass does: the pass's end
stops and joins it, so nothing of it is left at a fork.
"""

from __future__ import annotations

import atexit
import queue
import threading
import weakref
from typing import Any, Callable, Iterator

from .._torch_internals import profiler_enabled
from .._stall import STALL_ENV, NoWatchdog, stall_limit
from .._workers import hold_threads, release_threads
from .cpu import BatchTask
from .order import Passes
from .parts import BatchOrder

_END = object()
_POLL_S = 0.05  # how often a blocked put looks at the pass's stop flag
_live: "weakref.WeakSet[_Pass]" = weakref.WeakSet()


@atexit.register
def _end_all() -> None:
    # A pass still live at exit (its iterator never finished or closed) is stopped here, while
    # the interpreter is whole: a daemon thread that finalization finds in the native decoder
    # is ended by pthread_exit when it next takes the GIL, unwinding through C++ frames that
    # hold running std::threads, which aborts the process.
    for live in list(_live):
        live.end()


class _Raised:
    """What the task raised, handed to the consumer to raise there."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class _Pass:
    """One pass's decode thread and its queue of finished batches (at most `depth` ahead)."""

    def __init__(self, task: BatchTask, keys: Iterator[list], depth: int, timeout: float) -> None:
        self.task, self.keys, self.timeout = task, keys, timeout
        self.queue: queue.Queue = queue.Queue(depth)
        self.stop = threading.Event()
        self.stuck = False  # past the stall limit: the thread is not waited for
        self.thread = threading.Thread(target=self._produce, name="fastdata-decode", daemon=True)
        hold_threads(self)  # workers of other loaders started meanwhile do not fork this thread
        _live.add(self)
        self.thread.start()

    def _put(self, item: Any) -> bool:
        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                pass
        return False

    def _produce(self) -> None:
        try:
            for item in self._items():
                if not self._put(item):
                    return
        except BaseException as e:  # raised in the consumer, as a worker's error is: an error choosing the
            self._put(_Raised(e))   # next keys (a sampler's) as much as one decoding them
        finally:
            self._put(_END)

    def _items(self) -> Iterator[Any]:
        for keys in self.keys:
            if self.stop.is_set():
                return
            yield self.task.__getitems__(keys)

    def batches(self) -> Iterator[Any]:
        limit = stall_limit(self.timeout)
        while True:
            try:
                item = self.queue.get(timeout=limit)
            except queue.Empty:
                self.stuck = True
                why = f"timeout={self.timeout:g}" if self.timeout and self.timeout > 0 else \
                    f"timeout=0, so fastdata's stall limit: {STALL_ENV}={limit:g} s"
                raise RuntimeError(f"no batch in {limit:g} seconds from the decode thread ({why}): it is stuck reading "
                                   "or decoding") from None
            if item is _END:
                return
            if isinstance(item, _Raised):
                raise item.error
            yield item

    def end(self) -> None:
        """Stops the thread (after the batch it is on) and waits for it, unless it is stuck;
        idempotent."""
        self.stop.set()
        if threading.current_thread() is self.thread:  # a collection in the thread freed the pass's iterator
            return
        while self.thread.is_alive() and not self.stuck:
            try:  # a put waiting for room sees the stop flag within _POLL_S
                self.queue.get(timeout=_POLL_S)
            except queue.Empty:
                pass
        if not self.stuck:
            self.thread.join()
        release_threads(self)
        _live.discard(self)


class InProcess:
    """Runs `task` over the batches of `order` in a thread of this process, one pass at a time,
    `prefetch_factor` (default 2) batches ahead; CpuWorkers' interface with no workers. A batch
    that takes longer than `timeout` (0: the stall limit) ends the pass with an error; the
    thread, which cannot be killed, stops after its batch."""

    num_workers = 0

    def __init__(self, order: BatchOrder, task: BatchTask, prefetch_factor: int | None, timeout: float) -> None:
        self.task, self.timeout = task, timeout
        self.passes = Passes(order)
        self.depth = prefetch_factor or 2

    @property
    def timing(self) -> bool:
        return self.task.timing

    def set_timing(self, on: bool) -> bool:
        self.task.timing = on
        return True

    def ready_ahead(self) -> int:
        return self.depth

    def in_process(self) -> bool:
        return True

    def open(self, epoch: int, skip: int) -> tuple[Iterator[Any], Callable[[], None]]:
        """(the batches from batch `skip` of `epoch` on, the pass's end)."""
        self.passes.seek(epoch, skip)
        reader = self.task.reader
        if profiler_enabled():
            # In this thread: a torch profiler records the stages' ranges of the thread it started in.
            return (self.task.__getitems__(keys) for keys in self.passes), reader.close
        live = _Pass(self.task, iter(self.passes), self.depth, self.timeout)

        def end() -> None:  # the reader's own threads (shard read-ahead) stop with the pass
            live.end()
            reader.close()

        batches = live.batches()
        # Also when the iterator is dropped unstarted (a generator's finally never runs then) or
        # freed in a reference cycle by the garbage collector.
        weakref.finalize(batches, live.end)
        return batches, end

    def epoch_done(self, epoch: int) -> None:
        pass

    def watchdog(self, it: Any) -> NoWatchdog:
        return NoWatchdog()

    def shutdown(self) -> None:
        pass
