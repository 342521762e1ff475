"""Drop-in mode: `fastdata.loader(dataset, ...)` over torch's own DataLoader machinery.

The samplers, worker processes, worker seeding and error handling are DataLoader's, so the
batches are DataLoader's. What changes: collation (native, into a reused ring of shared or
pinned buffers: see `fastdata._buffers`), exact mid-epoch resume, stats, and the device stage.
"""

from __future__ import annotations

import collections.abc
import inspect
import itertools
import time
from typing import Any, Iterator

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset

from .._collate import RingCollate
from .._workers import (NoWatchdog, Watchdog, pass_end, shutdown_workers, stall_limit, start_method,
                        workers_running)
from ..device import prefetch
from .base import Loader, resolve_workers

DATALOADER_KEYWORDS = tuple(
    name for name in inspect.signature(DataLoader.__init__).parameters if name not in ("self", "dataset")
)
# What decides which indices make a batch: given to a reference DataLoader, whose batch
# sampler the working DataLoader then draws from.
_INDEX_KEYWORDS = ("batch_size", "shuffle", "sampler", "batch_sampler", "drop_last")
_STATE_VERSION = 1


class _Resumable:
    """Wraps the epoch's (batch) sampler: records the RNG state its shuffle starts from, and on
    resume restores it and skips the batches already delivered, by index only: no sample of a
    skipped batch is read."""

    def __init__(self, inner: Any, rng: torch.Generator) -> None:
        self.inner, self.rng = inner, rng
        self.skip = 0
        self.restore: torch.Tensor | None = None
        self.rng_at_start: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.inner)

    def __iter__(self) -> Iterator[Any]:
        # Nothing may run before the first index is asked for: DataLoader calls iter() on its
        # sampler before drawing its worker seed (and, with workers, twice, dropping the
        # first), while torch's samplers draw lazily; resuming must keep that order. So the
        # restore-and-skip runs on the first next(), and after it the sampler's own iterator
        # is chained on at C speed (a Python generator here would cost 0.3 us an index).
        inner = iter(self.inner)  # lazy for torch's samplers: nothing is drawn yet
        return itertools.chain(self._prepare(inner), inner)

    def _prepare(self, inner: Iterator[Any]) -> Iterator[Any]:
        if self.restore is not None:
            self.rng.set_state(self.restore)
            self.restore = None
        self.rng_at_start = self.rng.get_state()
        skip, self.skip = self.skip, 0
        for _ in range(skip):
            next(inner, None)
        return
        yield  # a generator that yields nothing: its body runs on the first next()


def _fetches(it: Any) -> Iterator[Any]:
    """What DataLoader's single-process iterator `it` yields, without its `__next__`.

    NOTE: with 0 workers, `__next__` costs about 10 us a call beyond the fetch (a profiler
    range entered and left, and bookkeeping for iterable datasets), more than fetching a ready
    item. So here the iterator DataLoader built (its sampler iterator, RNG draws,
    fetcher and pin settings, all as DataLoader made them) is driven by its own parts. Not for
    iterable datasets (whose length warning lives in `__next__`), nor while a torch profiler
    records (its traces keep DataLoader's ranges). Any other iterator passes through."""
    fetcher = getattr(it, "_dataset_fetcher", None)
    indices = getattr(it, "_sampler_iter", None)
    if fetcher is None or indices is None or type(it).__name__ != "_SingleProcessDataLoaderIter":
        yield from it  # a DataLoader that changed inside: its own iterator
        return
    fetch, pin, device = fetcher.fetch, it._pin_memory, it._pin_memory_device
    if pin:
        from torch.utils.data._utils.pin_memory import pin_memory

        for index in indices:
            yield pin_memory(fetch(index), device)
    else:
        for index in indices:
            yield fetch(index)


def _batch_len(batch: Any) -> int:
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.ndim else 1
    if isinstance(batch, collections.abc.Mapping):
        return _batch_len(next(iter(batch.values()))) if batch else 0
    if isinstance(batch, (list, tuple)) and batch:
        first = batch[0]
        if isinstance(first, (torch.Tensor, collections.abc.Mapping, list, tuple)):
            return _batch_len(first)
        return len(batch)
    return 1


class TorchLoader(Loader):
    """Drop-in mode. Takes every keyword of `torch.utils.data.DataLoader` with its meaning and
    default, plus `num_workers="auto"` and `device`."""

    backend = "torch"

    def __init__(self, dataset: Any, *, device: Any = None, **kwargs: Any) -> None:
        super().__init__()
        if "num_workers" in kwargs:
            kwargs["num_workers"] = resolve_workers(kwargs["num_workers"])
        # The reference DataLoader validates every argument with DataLoader's own errors and
        # builds the sampler exactly as DataLoader would; `len` is its len.
        ref = DataLoader(dataset, **kwargs)
        self._ref = ref
        self.dataset = dataset
        self.batch_size = ref.batch_size
        self.device = None if device is None else torch.device(device)
        self._rng = ref.generator if ref.generator is not None else torch.default_generator
        self._iterable = isinstance(dataset, IterableDataset)
        self._auto_collation = ref._auto_collation

        own = {k: v for k, v in kwargs.items() if k not in _INDEX_KEYWORDS and k != "collate_fn"}
        # The working DataLoader always has a time limit (see fastdata._workers); the user's
        # timeout and start method stay what they asked for.
        self._timeout = ref.timeout
        self._asked_context = ref.multiprocessing_context
        if ref.num_workers > 0:
            own["timeout"] = stall_limit(ref.timeout)
        collate_fn = kwargs.get("collate_fn")
        if collate_fn is None and ref._auto_collation:
            pin = bool(ref.pin_memory) and torch.accelerator.is_available()
            collate_fn = RingCollate(slots=(ref.prefetch_factor or 2) + 2, pin=pin)
        self._index: _Resumable | None = None
        if self._iterable:
            self._loader = DataLoader(
                dataset, batch_size=ref.batch_size, drop_last=ref.drop_last, collate_fn=collate_fn, **own
            )
        elif ref._auto_collation:
            self._index = _Resumable(ref.batch_sampler, self._rng)
            self._loader = DataLoader(dataset, batch_sampler=self._index, collate_fn=collate_fn, **own)
        else:
            self._index = _Resumable(ref.sampler, self._rng)
            self._loader = DataLoader(
                dataset, batch_size=None, sampler=self._index, collate_fn=collate_fn, **own
            )
        self._epoch: int | None = None
        self._resume: dict[str, Any] | None = None
        self._epoch_rng: torch.Tensor | None = None
        self._delivered = 0
        self._in_epoch = False

    @property
    def num_workers(self) -> int:
        return self._loader.num_workers

    def __len__(self) -> int:
        return len(self._ref)

    def __iter__(self) -> Iterator[Any]:
        # Eager like DataLoader's __iter__: workers start and seeds are drawn now, not at the
        # first next(), so the RNG is consumed in the same order as with DataLoader.
        self._stop()  # the previous iterator's workers are shut down before new ones start
        resume, self._resume = self._resume, None
        skip = 0
        if resume is not None:
            self._rng.set_state(resume["rng"])
            skip = resume["batches"]
            if self._index is not None:
                self._index.restore = resume["sampler_rng"]
                self._index.skip = skip
        self._epoch_rng = self._rng.get_state()
        self._delivered = skip
        self._in_epoch = True
        collate_fn = self._ring_collate()
        starting = self._loader.num_workers > 0 and not workers_running(self._loader)
        if starting:
            self._loader.multiprocessing_context = start_method(self._asked_context)
        workers = collate_fn.rings.begin_pass() if collate_fn is not None and starting else None
        loader_it = it = iter(self._loader)
        if self._iterable:
            # An iterable dataset cannot seek: fast-forward by reading the skipped batches.
            for _ in range(skip):
                next(it)
        elif self._loader.num_workers == 0 and not torch.autograd._profiler_enabled():
            it = _fetches(it)
        end = pass_end(loader_it, workers, self._loader.persistent_workers)
        return self._start(self._run(it, loader_it, end), end)

    # Per-sample loading (batch_size=None): an item is so quick that two clock reads plus the
    # counters per item would cost about 5%. So there the wait is timed on every 8th item and
    # scaled, and the counters are added 8 at a time (flushed when the iteration ends).
    _SAMPLE_EVERY = 8

    def _run(self, it: Iterator[Any], loader_it: Any, end: Any) -> Iterator[Any]:
        # One generator with both loops inline: a delegating `yield from` per item would cost
        # another 0.2 us.
        collate_fn = self._ring_collate()
        timed = collate_fn is not None and collate_fn.timing is not None
        batches = it if self.device is None else prefetch(it, self.device, self._time_copy if timed else None)
        stats, clock = self.stats, time.perf_counter
        # The pass counts as done when its last batch is handed out: trainers take len()
        # batches and never ask past them.
        total = -1 if self._iterable else len(self._ref)
        dog = Watchdog(loader_it, self._timeout) if self._loader.num_workers else NoWatchdog()
        n = 0
        try:
            if self._auto_collation:
                sizes = self._batch_sizes()
                dog.waiting = self._delivered
                t0 = clock()
                for batch in batches:
                    dog.waiting = -1
                    stats["wait_s"] += clock() - t0
                    stats["batches"] += 1
                    stats["samples"] += sizes(batch, self._delivered)
                    self._delivered += 1
                    if self._delivered == total:
                        self._in_epoch = False
                    yield batch
                    dog.waiting = self._delivered
                    t0 = clock()
            else:
                every = self._SAMPLE_EVERY
                dog.waiting = self._delivered
                t0 = clock()
                for item in batches:
                    dog.waiting = -1
                    if t0:
                        stats["wait_s"] += (clock() - t0) * every
                        t0 = 0.0
                    n += 1
                    self._delivered += 1
                    if self._delivered == total:
                        self._in_epoch = False
                    yield item
                    dog.waiting = self._delivered
                    if n == every:
                        stats["batches"] += n
                        stats["samples"] += n
                        n = 0
                        t0 = clock()
            self._in_epoch = False
        except Exception as e:  # a killed worker's read may fail with any error on the way
            error = dog.error(e)
            if error is None:
                raise
            if self._loader.persistent_workers:
                shutdown_workers(self._loader)  # killed or dead: they cannot serve the next pass
            raise error from None
        finally:
            dog.close()
            stats["batches"] += n
            stats["samples"] += n
            if timed:
                stats["stages"] = self.stage_seconds()
            end()

    def set_stage_timing(self, on: bool) -> bool:
        """Stage timing on or off (for fastdata.profile): the dataset's and the collation's CPU
        seconds, per worker. False when it cannot: a collate_fn of the user's, or persistent
        workers already running (they hold their own copy of the collate function)."""
        collate_fn = self._ring_collate()
        if collate_fn is None:
            return False
        if on and workers_running(self._loader):
            return False
        if on and collate_fn.timing is None:
            collate_fn.timing = torch.zeros((self._loader.num_workers + 1, 5), dtype=torch.float64).share_memory_()
        elif not on and collate_fn.timing is not None:
            self.stats["stages"] = self.stage_seconds()  # what was timed stays in stats
            collate_fn.timing = None
        return True

    def _ring_collate(self) -> RingCollate | None:
        """fastdata's own collate function, when it is the one in use (not a user's)."""
        collate_fn = self._loader.collate_fn
        return collate_fn if isinstance(collate_fn, RingCollate) else None

    def batches_ahead(self) -> int:
        return (self.num_workers or 1) * (self._loader.prefetch_factor or 2) + 1

    def stage_seconds(self) -> dict[str, Any]:
        collate_fn = self._ring_collate()
        if collate_fn is None or collate_fn.timing is None:
            return self.stats.get("stages", {})
        copied = {k: v for k, v in self.stats.get("stages", {}).items() if k == "h2d_copy"}
        return {**collate_fn.stages(), **copied}

    def _batch_sizes(self):
        """How many samples a delivered batch holds: from the batch sampler's arithmetic when it
        is torch's BatchSampler (no look into the batch: this runs every batch), else from the
        batch itself."""
        if not self._auto_collation:
            return lambda batch, k: 1
        bs = self._ref.batch_sampler
        if not self._iterable and type(bs) is BatchSampler and hasattr(bs.sampler, "__len__"):
            n, size, drop = len(bs.sampler), bs.batch_size, bs.drop_last
            return (lambda batch, k: size) if drop else (lambda batch, k: min(size, n - k * size))
        return lambda batch, k: _batch_len(batch)

    def set_epoch(self, epoch: int) -> None:
        """Records the epoch and passes it to the sampler when it has `set_epoch` (as
        `DistributedSampler` does)."""
        self._epoch = epoch
        for s in (self._ref.sampler, self._ref.batch_sampler, getattr(self._ref.batch_sampler, "sampler", None)):
            if hasattr(s, "set_epoch"):
                s.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """Where this loader stands: taken after k batches of an epoch, a loader given it yields
        the batches after those k, then carries on to later epochs the same way. Exact when
        the dataset's samples are a function of their index; an iterable dataset is
        fast-forwarded. Without a `generator`, the shuffle comes from torch's global RNG, and
        resuming restores that global state."""
        if self._in_epoch:
            sampler_rng = self._index.rng_at_start if self._index is not None else None
            return {
                "version": _STATE_VERSION,
                "epoch": self._epoch,
                "batches": self._delivered,
                "rng": self._epoch_rng,
                "sampler_rng": sampler_rng,
            }
        return {
            "version": _STATE_VERSION,
            "epoch": self._epoch,
            "batches": 0,
            "rng": self._rng.get_state(),
            "sampler_rng": None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get("version") != _STATE_VERSION:
            raise ValueError(
                f"state should be a dict from Loader.state_dict() (version {_STATE_VERSION}), but got {state!r:.200}"
            )
        if state["epoch"] is not None:
            self.set_epoch(state["epoch"])
        self._resume = dict(state)
