"""Who decodes on the CPU: DataLoader's worker processes (its processes, seeding, timeouts and
dead-worker detection), each batch one task: read its samples, decode them into a slot of the
worker's shared-memory ring (`BatchTask`). With num_workers=0 the training process runs the
tasks, the native decoder with its own threads. The slot reaches the training process as a
leased tensor (`fastdata._buffers`): no collation copy, no per-batch allocation.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator

import numpy as np
from torch.utils.data import DataLoader, Dataset, get_worker_info

from .._collate import by_value
from .._torch_internals import live_iterator
from .._trace import trace_range
from .._stall import NoWatchdog, Watchdog, stall_limit
from .._workers import drop_dead_workers, end_at_exit, pass_end, shutdown_workers, start_method, workers_running
from ..errors import DataError
from .decode import BatchDecoder, MixedSizes
from .order import Passes
from .parts import BatchOrder


class BatchTask(Dataset):
    """Map-style over batch keys (DataLoader asks for whole batches: `__getitems__`): reads
    a batch with `reader` and decodes it with `decoder`. Gives (images, labels, errors, draw
    keys, stage seconds or None)."""

    def __init__(self, reader: Any, decoder: BatchDecoder) -> None:
        self.reader, self.decoder = reader, decoder
        self.timing = False  # stage timing (fastdata.profile turns it on): off, it costs one check a batch

    def __len__(self) -> int:
        return len(self.reader)

    def __getitem__(self, key):
        return self.__getitems__([key])

    def __getitems__(self, keys):
        """In a worker a DataError (or a batch of mixed sizes) is returned as the batch, not
        raised: it reaches the training process as itself (one line, with its path and member),
        where DataLoader would re-raise it as a new exception whose message is the worker's
        traceback."""
        try:
            stages = None
            if self.timing:
                info = get_worker_info()
                stages = {"worker": info.id if info is not None else -1, "read": 0.0}
            # A batch of large files comes in parts (`read.MAX_PART_BYTES`): each is decoded into
            # a tensor of its own once read, and the parts are joined into a slot of the ring.
            done = []
            for read, more in self._reads(keys, stages):
                if more or done:
                    part = self._decode(read, stages, pooled=False)
                    drawn = read.index if read.draws is None else read.draws  # (as the part's draw keys)
                    first = read.paths[int(np.flatnonzero(drawn == part[3][0])[0])] if len(part[3]) else None
                    done.append((*part, first))
                    del read  # its bytes go before the next part's are read
                else:
                    return self._sent(self._decode(read, stages, pooled=True)) + (stages,)
            t = time.process_time()
            joined = self.decoder.joined(done)
            if stages is not None:  # the copy into the ring, as a batch's collation
                stages["collate"] += time.process_time() - t
            return self._sent(joined) + (stages,)
        except (DataError, MixedSizes) as e:
            if get_worker_info() is None:
                raise
            return e

    @staticmethod
    def _sent(out: tuple) -> tuple:
        """A decoded batch as it leaves this process: from a worker, its labels by value (torch
        would hand the training process a file descriptor for them, a socket connection a batch)."""
        if get_worker_info() is None:
            return out
        images, labels, *rest = out
        return (images, by_value(labels), *rest)

    def _reads(self, keys, stages: dict | None) -> Iterator[tuple[Any, bool]]:
        """The batch's reads, each with whether more follow; with `stages`, timed in its "read"."""
        parts = self.reader.parts(keys)
        while True:
            t = time.perf_counter()
            with trace_range("fastdata.read"):
                part = next(parts, None)
            if stages is not None:
                stages["read"] += time.perf_counter() - t
            if part is None:
                return
            yield part
            del part

    def _decode(self, read, stages: dict | None, pooled: bool) -> tuple:
        if stages is None:
            return self.decoder.decode(read, pooled=pooled)
        part: dict = {}
        out = self.decoder.decode(read, stages=part, pooled=pooled)
        for name, value in part.items():
            stages[name] = stages.get(name, 0) + value
        return out


def _first(batch):
    return batch


class CpuWorkers:
    """Runs `task` over the batches of `order` in DataLoader's workers, one pass at a time."""

    def __init__(self, order: BatchOrder, task: BatchTask, num_workers: int, timeout: float,
                 prefetch_factor: int | None, pin: bool, persistent: bool, run_ahead: bool) -> None:
        self.task = task
        self.persistent = persistent and num_workers > 0
        self.passes = Passes(order, run_ahead=self.persistent and run_ahead)
        self.timeout = timeout
        extra: dict[str, Any] = {}
        if num_workers > 0:
            extra.update(prefetch_factor=prefetch_factor, persistent_workers=self.persistent)
        self.loader = DataLoader(task, batch_sampler=self.passes, collate_fn=_first, num_workers=num_workers,
                                 timeout=stall_limit(timeout) if num_workers else 0, pin_memory=pin, **extra)
        if self.persistent:
            end_at_exit(self.loader)
        self._ahead: tuple[int, int] | None = None  # (epoch, batch) the running workers deliver next

    @property
    def num_workers(self) -> int:
        return self.loader.num_workers

    @property
    def timing(self) -> bool:
        return self.task.timing

    def set_timing(self, on: bool) -> bool:
        """Not when persistent workers already run: they hold their own copy of the flag."""
        if on and workers_running(self.loader):
            return False
        self.task.timing = on
        return True

    def ready_ahead(self) -> int:
        return (self.num_workers or 1) * (self.loader.prefetch_factor or 2) + 1

    def in_process(self) -> bool:
        return self.num_workers == 0

    def open(self, epoch: int, skip: int) -> tuple[Iterator[Any], Callable[[], None]]:
        """(the raw batches from batch `skip` of `epoch` on, the pass's end)."""
        if self.persistent and drop_dead_workers(self.loader):
            self._ahead = None
            self.task.decoder.rings.workers.end()  # the dead generation's undelivered slots are freed
        ahead, self._ahead = self._ahead, None
        if ahead == (epoch, skip):
            return live_iterator(self.loader), lambda: None  # persistent workers, already running ahead (see Passes)
        self.passes.seek(epoch, skip)
        starting = self.num_workers > 0 and not workers_running(self.loader)
        if starting:
            self.loader.multiprocessing_context = start_method(None, own=True)
        rings = self.task.decoder.rings.begin_pass() if starting else None
        it = iter(self.loader)  # (persistent workers: drops what they had under way)
        end = pass_end(it, rings, self.persistent)
        if self.num_workers:
            return it, end
        reader = self.task.reader

        def end_here() -> None:  # the reader ran in this process: its threads stop with the pass
            end()
            reader.close()

        return it, end_here

    def epoch_done(self, epoch: int) -> None:
        """The epoch's last batch is out: running-ahead workers are already on the next."""
        if self.passes.run_ahead:
            self._ahead = (epoch + 1, 0)

    def watchdog(self, it: Any) -> Watchdog | NoWatchdog:
        return Watchdog(it, self.timeout) if self.num_workers else NoWatchdog()

    def shutdown(self) -> None:
        """Persistent workers shut down now (after an error: the next pass starts fresh ones)."""
        shutdown_workers(self.loader)
        self._ahead = None
