"""Drop-in mode: `fastdata.loader(dataset, ...)` over torch's own DataLoader machinery. Over 400
lines: TorchCore is one DataLoader subclass, whose pass, resume and profiling protocol share the
attributes DataLoader keeps (as does remaking a plain DataLoader for the profiler, like TorchLoader);
split apart, they would reach into each other's.

The loader is a DataLoader (a subclass), and its samplers, worker processes, worker seeding and
error handling are DataLoader's, so the batches are DataLoader's. What changes: collation
(native, into a reused ring of shared or pinned buffers: see `fastdata._buffers`), exact
mid-epoch resume, stats, and the device stage. How a pass iterates: `torch_iter.py`.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import time
import warnings
from typing import Any, Callable, Iterator

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, default_collate

from .._collate import RingCollate, Timed, collate as native_collate
from .._torch_internals import auto_collation, driven_dataloader, profiler_enabled, share_length_warning
from .._stall import NoWatchdog, Watchdog, stall_limit
from .._workers import (WorkerStart, drop_dead_workers, end_at_exit, pass_end, shutdown_workers, start_method,
                        workers_running)
from ..device import prefetch
from ..errors import warn
from .._loader import Loader, LoaderCore, check_position, resolve_workers
from .torch_iter import (Continued, Fetches, Marked, Pass, Raised, Resumable, batch_sizes, fetches, raised_by_dataset,
                         stage_seconds)

DATALOADER_KEYWORDS = tuple(name for name in inspect.signature(DataLoader.__init__).parameters
                            if name not in ("self", "dataset"))
# What decides which indices make a batch: given to a reference DataLoader, whose batch
# sampler the working DataLoader then draws from.
_INDEX_KEYWORDS = ("batch_size", "shuffle", "sampler", "batch_sampler", "drop_last")
_STATE_VERSION = 1


class TorchCore(DataLoader, LoaderCore):
    """Drop-in mode: a `torch.utils.data.DataLoader` (a subclass, with all its attributes and
    checks), plus `num_workers="auto"` and `device`; `TorchLoader` with the public state methods,
    `fastdata run`'s `Served` without them.

    DataLoader's own `__init__` validates the arguments with its own errors and builds the
    sampler and batch sampler; the batches come from a second, working DataLoader that draws
    from that batch sampler (through `Resumable`) and collates natively into reused slots.
    Frameworks that rebuild a DataLoader from its attributes (Lightning and Fabric with a
    DistributedSampler, Accelerate's sharded loader) get this class again, or, for `collate_fn`,
    fastdata's native collation (`fastdata._collate.collate`: default_collate's values, without
    the reused slots, which belong to this loader's passes)."""

    backend = "torch"
    # The sampler is asked past an epoch's last batch before that batch is handed out, so that a
    # state taken at it sees the sampler's draws at its end (`Resumable`): for a loader with
    # public state methods.
    _asks_past = True

    def __init__(self, dataset: Any, *args: Any, device: Any = None, **kwargs: Any) -> None:
        call = inspect.signature(DataLoader.__init__).bind(self, dataset, *args, **kwargs).arguments
        del call["self"]
        # for remade(): what decides a batch's indices, as given (DataLoader refuses it changed later)
        self._given = {k: v for k, v in call.items() if k in _INDEX_KEYWORDS}
        if "num_workers" in call:
            call["num_workers"] = resolve_workers(call["num_workers"], device)
        if call.get("collate_fn") in (default_collate, native_collate) or isinstance(call.get("collate_fn"), RingCollate):
            # torch's default named (as torchvision's references do), or ours, handed back by a
            # framework that rebuilds the loader: native collation gives default_collate's values
            del call["collate_fn"]
        LoaderCore.__init__(self)
        DataLoader.__init__(self, **call)
        self.device = None if device is None else torch.device(device)
        self._iterable = isinstance(dataset, IterableDataset)
        if call.get("collate_fn") is None and auto_collation(self):
            self.collate_fn = native_collate
        self._build()
        self._epoch: int | None = None
        self._resume: dict[str, Any] | None = None
        self._epoch_rng: torch.Tensor | None = None
        self._delivered = 0
        self._in_epoch = False

    def _build(self) -> None:
        """The working DataLoader, from this loader's attributes as they stand: those a script may
        set after construction (`_settings`), which torch's reads at each iter(), included."""
        workers = self.num_workers
        own = {k: getattr(self, k) for k in DATALOADER_KEYWORDS if k not in (*_INDEX_KEYWORDS, "collate_fn")}
        # The working DataLoader always has a time limit (see fastdata._workers); the user's
        # timeout and start method stay what they asked for.
        own.update(timeout=stall_limit(self.timeout) if workers else self.timeout, prefetch_factor=None,
                   persistent_workers=False, multiprocessing_context=None)
        if workers:
            own.update(prefetch_factor=self.prefetch_factor, persistent_workers=self.persistent_workers)
        collate_fn = self._working_collate()
        self._index: Resumable | None = None
        dataset, index = self.dataset, dict(batch_size=self.batch_size, drop_last=self.drop_last)
        # (a pass of a sampler that is not replayable keeps its indices not yet handed out: at
        # most those its workers were asked for, and the device copy's, well within this)
        keep = 4 * workers * (self.prefetch_factor or 2) + 16
        if auto_collation(self) and not self._iterable:
            self._index = Resumable(self.batch_sampler, self.generator, ask_past=self._asks_past, keep=keep)
            dataset, index = self._fetched_from(dataset), dict(batch_sampler=self._index)
        elif not self._iterable:
            self._index = Resumable(self.sampler, self.generator, ask_past=self._asks_past, keep=keep)
            index = dict(batch_size=None, sampler=self._index)
        self._loader = driven_dataloader(dataset, collate_fn=collate_fn, **index, **own)
        if workers and self.persistent_workers:
            end_at_exit(self._loader)
        self._built = self._settings()

    def _working_collate(self) -> Any:
        """The working DataLoader's collate_fn: the loader's, or for native collation a `RingCollate`."""
        if self.collate_fn is not native_collate:
            return self.collate_fn
        slots, pin = self._ring_settings()
        return RingCollate(slots=slots, pin=pin)

    def _ring_settings(self) -> tuple[int, bool]:
        """(slots, pinned) of the reused batch rings: the batches in flight, and pinned where an
        accelerator is and the loader pins memory."""
        return (self.prefetch_factor or 2) + 2, bool(self.pin_memory) and torch.accelerator.is_available()

    def _settings(self) -> tuple:
        """What the working DataLoader is built from that a script may set after construction (torch
        refuses batch_size, sampler, ...; worker_init_fn and the start method are taken at each iter())."""
        return (self.num_workers, self.collate_fn, self.pin_memory, self.timeout, self.generator,
                self.prefetch_factor, self.pin_memory_device, self.in_order)

    def _fetched_from(self, dataset: Any) -> Any:
        """The dataset the working DataLoader fetches batches from: `dataset` (a subclass may
        give one whose `__getitems__` builds a batch whole: see `fastdata._collate.Prepared`)."""
        return dataset

    @property
    def _rng(self) -> torch.Generator:
        return self.generator if self.generator is not None else torch.default_generator

    def __iter__(self) -> Iterator[Any]:
        # Eager like DataLoader's __iter__: workers start and seeds are drawn now, not at the
        # first next(), so the RNG is consumed in the same order as with DataLoader.
        if self.generator is not None and not isinstance(self.generator, torch.Generator):  # torch's first failure,
            torch.empty((), dtype=torch.int64).random_(generator=self.generator)  # its TypeError; nothing drawn
        self._supersede()
        self._stop()  # the previous iterator's workers are shut down before new ones start
        if self._settings() != self._built:  # a setting changed since the working loader was built
            timing = getattr(self._ring_collate(), "timing", None)
            shutdown_workers(self._loader)
            self._build()
            if timing is not None:
                self.set_stage_timing(True)
        resume, self._resume = self._resume, None
        skip = 0
        if resume is not None:
            self._rng.set_state(resume["rng"])
            skip = resume["batches"]
            if self._index is not None:
                self._index.restore = resume["sampler_rng"]
                # With 0 workers the dataset draws from this process's RNG: the state's RNG is
                # past what the skipped batches drew (and, after a batch, past the sampler's draws).
                self._index.restore_after = resume.get("rng_now") if skip and not self.num_workers else None
                self._index.skip = skip
        self._epoch_rng = self._rng.get_state()
        self._delivered = skip
        self._in_epoch = True
        collate_fn = self._ring_collate()
        if self._loader.persistent_workers and drop_dead_workers(self._loader) and collate_fn is not None:
            collate_fn.rings.workers.end()  # the dead generation's undelivered slots are freed
        starting = self._loader.num_workers > 0 and not workers_running(self._loader)
        if starting:
            self._loader.multiprocessing_context = self._worker_context()
        workers = collate_fn.rings.begin_pass() if collate_fn is not None and starting else None
        # Trainers assign worker_init_fn after construction (Lightning's seed_everything(workers=True))
        self._loader.worker_init_fn = WorkerStart(self.worker_init_fn)
        # len() asked of this loader counts for the working one's warning (an iterable dataset
        # that yields more than its len())
        share_length_warning(self, self._loader)
        loader_it = it = iter(self._loader)
        if self._iterable:
            # An iterable dataset cannot seek: fast-forward by reading the skipped batches.
            for _ in range(skip):
                next(it)
        elif self._loader.num_workers == 0 and not profiler_enabled():
            it = fetches(it)
        end = pass_end(loader_it, workers, self._loader.persistent_workers)
        # len(iter(loader)): its index sampler's, as torch's iterator counts them
        return self._start(Pass(self._run(it, loader_it, end), self._index_source()), end)

    def _index_source(self) -> Any:
        """What gives a pass its indices, as DataLoader picks it: the batch sampler, or
        the sampler with batch_size=None."""
        return self.batch_sampler if auto_collation(self) else self.sampler

    def _rest_state(self) -> dict[str, Any]:
        state = self._state_dict()
        left = self._index.left(self._delivered) if self._index is not None else None
        if left is not None:
            state["left"] = left
        return state

    def _rest(self, state: dict[str, Any]) -> Iterator[Any]:
        """The batches after `state` (taken in a pass a newer one ended) of that pass, from a
        DataLoader of their own with this loader's arguments: torch's own iterator, without the
        reused slots (the newer pass holds them). The pass's shuffle and its workers' seeds
        are drawn again from the RNG states it started with; this process's RNG is left as it
        stands, as torch's two iterators leave it; a sampler that is not replayable goes on from
        the pass's own iterator (`Resumable.left`). Counted in `stats` as the pass's were."""
        workers = self.num_workers
        twin = functools.partial(  # a DataLoader of this loader's dataset and arguments, with workers of its own
            type(self._loader), self.dataset, num_workers=workers, collate_fn=self.collate_fn,
            pin_memory=self.pin_memory, timeout=self.timeout or self._loader.timeout,
            worker_init_fn=WorkerStart(self.worker_init_fn),
            multiprocessing_context=self._worker_context() if workers else None,
            generator=self.generator, prefetch_factor=self.prefetch_factor, in_order=self.in_order)
        rng = self._rng
        now = rng.get_state()
        rng.set_state(state["rng"])  # the workers' base seed, drawn again as the pass drew it
        try:
            if self._iterable:
                it = iter(twin(batch_size=self.batch_size, drop_last=self.drop_last))
                for _ in range(state["batches"]):  # an iterable dataset cannot seek: read past
                    next(it)
            else:
                if "left" in state:  # a sampler that is not replayable: its pass's own iterator goes on
                    index = Continued(*state["left"])
                else:
                    index = Resumable(self._index_source(), self.generator, ask_past=self._asks_past)
                    # the sampler's own RNG state, then this process's again once the delivered are passed
                    index.restore, index.skip, index.restore_after = state["sampler_rng"], state["batches"], now
                it = iter(twin(batch_sampler=index) if auto_collation(self) else twin(batch_size=None, sampler=index))
        finally:
            rng.set_state(now)
        if self.device is not None:
            it = prefetch(it, self.device)
        stats, sizes, k = self.stats, self._batch_sizes(), itertools.count(state["batches"])

        def counted(batch: Any) -> Any:
            stats["batches"] += 1
            stats["samples"] += sizes(batch, next(k))
            return batch

        return Fetches(it, counted)

    # Per-sample loading (batch_size=None): an item is so quick that two clock reads plus the
    # counters per item would cost about 5%. So there the wait is timed on every 8th item and
    # scaled, and the counters are added 8 at a time (flushed when the iteration ends).
    _SAMPLE_EVERY = 8

    def _run(self, it: Iterator[Any], loader_it: Any, end: Any) -> Iterator[Any]:
        # One generator with both loops inline: a delegating `yield from` would add a frame
        # switch per item. A batch that raised in the dataset is handed out as Raised and the
        # pass goes on, as DataLoader's does (not with `device`: the copy-ahead ends with it).
        collate_fn = self._ring_collate()
        timed = collate_fn is not None and collate_fn.timing is not None
        workers = self._loader.num_workers
        if timed:  # (with no workers, each fetch timed from when it is asked for: not the consumer's step)
            it = self._untimed(it if workers else Marked(it, collate_fn.fetching))
        batches = self._to_device(it, timed)
        take = batches.__next__
        survives = self.device is None
        stats, clock = self.stats, time.perf_counter
        # The pass counts as done when its last batch is handed out: trainers take len()
        # batches and never ask past them.
        total = -1 if (length := self._length()) is None else length  # a sampler may have no len()
        dog = Watchdog(loader_it, self.timeout) if workers else NoWatchdog()
        n = 0
        try:
            if auto_collation(self):
                sizes = self._batch_sizes()
                dog.waiting = self._delivered
                t0 = clock()
                while True:
                    try:
                        batch = take()
                    except StopIteration:
                        break
                    except Exception as e:
                        if not (survives and raised_by_dataset(e, workers)):
                            raise
                        batch = Raised(e)
                    dog.waiting = -1
                    if batch.__class__ is not Raised:
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
                while True:
                    try:
                        item = take()
                    except StopIteration:
                        break
                    except Exception as e:
                        if not (survives and raised_by_dataset(e, workers)):
                            raise
                        item = Raised(e)
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
            # A next() goes on, as torch's iterator goes on after its timeout or a dead worker:
            if str(error or e).startswith(("DataLoader timed out", "DataLoader worker")):
                self._supersede()  # from the batch that did not come, with workers of its own
            if error is None:
                raise
            if self._loader.persistent_workers:
                shutdown_workers(self._loader)  # killed or dead: they cannot serve the next pass
            raise error from None
        finally:
            dog.close()
            stats["batches"] += n
            stats["samples"] += n
            end()

    def _to_device(self, it: Iterator[Any], timed: bool) -> Iterator[Any]:
        """The pass's batches on `device` (copied one batch ahead), or as they are without one."""
        return it if self.device is None else prefetch(it, self.device, self._time_copy if timed else None)

    def set_stage_timing(self, on: bool) -> bool:
        """Stage timing on or off (for fastdata.profile): the dataset's and the collation's CPU
        seconds, per worker. False when it cannot: a collate_fn of the user's, or persistent
        workers already running (they hold their own copy of the collate function)."""
        collate_fn = self._ring_collate()
        if collate_fn is None:
            return False
        if on and workers_running(self._loader):
            return False
        collate_fn.timing = True if on else None
        if on:
            self.stats.setdefault("stages", {})
        return True

    def _untimed(self, batches: Iterator[Timed]) -> Iterator[Any]:
        """The batches of a timed pass, their stage seconds summed into stats (on after a batch that raised)."""
        def record(timed: Timed) -> Any:
            self._record_stages(timed[1])
            return timed[0]
        return Fetches(batches, record)

    def _worker_context(self) -> Any:
        """The multiprocessing context its workers start in (`start_method`)."""
        return start_method(self.multiprocessing_context)

    def _ring_collate(self) -> RingCollate | None:
        """fastdata's own collate function, when it is the one in use (not a user's)."""
        collate_fn = self._loader.collate_fn
        return collate_fn if isinstance(collate_fn, RingCollate) else None

    def batches_ahead(self) -> int:
        return (self.num_workers or 1) * (self._loader.prefetch_factor or 2) + 1

    def stage_seconds(self) -> dict[str, Any]:
        return stage_seconds(self.stats.get("stages", {}))

    def _batch_sizes(self):
        """How many samples a delivered batch holds (`torch_iter.batch_sizes`)."""
        return batch_sizes(self.batch_sampler if auto_collation(self) else None, self._iterable)

    def set_epoch(self, epoch: int) -> None:
        """Records the epoch and passes it to the sampler when it has `set_epoch` (DistributedSampler's)."""
        self._epoch = epoch
        for s in (self.sampler, self.batch_sampler, getattr(self.batch_sampler, "sampler", None)):
            if hasattr(s, "set_epoch"):
                s.set_epoch(epoch)

    def _state_dict(self) -> dict[str, Any]:
        """Where this loader stands: taken after k batches of an epoch, a loader given it yields
        the batches after those k, then carries on to later epochs the same way. Exact when
        the dataset's samples are a function of their index; an iterable dataset is
        fast-forwarded. Without a `generator`, the shuffle comes from torch's global RNG, and
        resuming restores that global state."""
        # the size of the batches its position counts, and what drew their order
        own = {"batch_size": self.batch_size, "order": self._order_name()}
        if hasattr(self.sampler, "state_dict"):  # a sampler with state of its own (fastdata.samplers) keeps it too
            own["sampler_state"] = self.sampler.state_dict()
        if self._in_epoch:
            if not self.in_order and self.num_workers:
                warnings.warn("state_dict() of a loader with in_order=False: its workers' batches came out of "
                              "order, so those delivered need not be the epoch's first ones, which a resume skips; "
                              "resume exactly with in_order=True", stacklevel=3)
            sampler_rng = self._index.rng_at_start if self._index is not None else None
            return {
                "version": _STATE_VERSION,
                "epoch": self._epoch,
                "batches": self._delivered,
                "rng": self._epoch_rng,
                "sampler_rng": sampler_rng,
                "rng_now": self._rng.get_state(),
                **own,
            }
        return {
            "version": _STATE_VERSION,
            "epoch": self._epoch,
            "batches": 0,
            "rng": self._rng.get_state(),
            "sampler_rng": None,
            **own,
        }

    def _order_name(self) -> str:
        """The class that orders the batches: a batch_sampler of the script's, else the sampler."""
        own = self.batch_sampler is not None and type(self.batch_sampler) is not BatchSampler
        return type(self.batch_sampler if own else self.sampler).__qualname__

    def _length(self) -> int | None:
        """Batches an epoch where the sampler says (an iterable dataset's len is an estimate)."""
        if isinstance(self.dataset, IterableDataset):
            return None
        try:
            return len(self)
        except TypeError:  # a batch sampler without __len__
            return None

    def _load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get("version") != _STATE_VERSION:
            raise ValueError(f"state should be a dict from Loader.state_dict() (version {_STATE_VERSION}), but got "
                             f"{state!r:.200}")
        if not isinstance(state.get("rng"), torch.Tensor):  # an image loader's state has "backend" and no RNG
            raise ValueError(f"the state was taken by a loader over images (backend {state.get('backend')!r}), "
                             "so it resumes only a loader over the same images, not one over a Dataset")
        check_position(state, self._length(), self.batch_size, epoch_may_be_none=True)
        taken = state.get("order", self._order_name())  # (a state taken before states kept it: unchecked)
        if taken != self._order_name() and state["batches"]:
            epoch = "its epoch" if state["epoch"] is None else f"epoch {state['epoch']}"  # (set_epoch never called)
            warn(f"resuming with a {self._order_name()}, but the state was taken with a {taken}: the "
                 f"{state['batches']} batches it counts as delivered came in another order, so the rest of {epoch} "
                 "may repeat some of their samples and leave out others")
        if state.get("sampler_state") is not None and hasattr(self.sampler, "load_state_dict"):
            self.sampler.load_state_dict(state["sampler_state"])
        if state["epoch"] is not None:
            self.set_epoch(state["epoch"])
        self._resume = dict(state)


class TorchLoader(TorchCore, Loader):
    """What `fastdata.loader(dataset, ...)` returns: `TorchCore` with `Loader`'s state methods."""

    def remade(self, change: dict[str, Any]) -> TorchLoader:
        return TorchLoader(self.dataset, **_remade_keywords(self, self._given, {"device": self.device, **change}))


def remaker(loader: Any) -> Callable[[dict[str, Any]], Any] | None:
    """How `fastdata.profile` makes fresh loaders like `loader`, with the keywords of a change
    set, to measure the change: a fastdata loader's own `remade`; for a DataLoader made by
    DataLoader's own `__init__`, one made from its attributes, as trainers rebuild a DataLoader;
    None for anything else (a subclass with an `__init__` of its own takes arguments that its
    attributes need not hold)."""
    if isinstance(loader, LoaderCore):
        return loader.remade
    if isinstance(loader, DataLoader) and type(loader).__init__ is DataLoader.__init__:
        return functools.partial(_dataloader_remade, loader)
    return None


def _dataloader_remade(loader: DataLoader, change: dict[str, Any]) -> DataLoader:
    # What decided its batches, from the attributes DataLoader's __init__ set: an explicit batch
    # sampler leaves batch_size None; an IterableDataset takes no sampler.
    if isinstance(loader.dataset, IterableDataset):
        given = {"batch_size": loader.batch_size, "drop_last": loader.drop_last}
    elif loader.batch_size is None and loader.batch_sampler is not None:
        given = {"batch_sampler": loader.batch_sampler}
    else:
        given = {"batch_size": loader.batch_size, "sampler": loader.sampler, "drop_last": loader.drop_last}
    options = _remade_keywords(loader, given, change)
    if options["num_workers"]:
        # a measurement must end: fastdata's worker queues send a batch that cannot be pickled
        # as its error, where torch's drop it and wait for it; a stall ends at the stall limit
        options.update(multiprocessing_context=start_method(options.get("multiprocessing_context")),
                       timeout=stall_limit(options["timeout"]))
    return type(loader)(loader.dataset, **options)


def _remade_keywords(loader: DataLoader, given: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    """The keywords of a loader like `loader` with `change` set: what decides its batches as
    `given`, the others as they stand (a script or trainer may set them after construction)."""
    now = {k: getattr(loader, k) for k in DATALOADER_KEYWORDS if k not in _INDEX_KEYWORDS}
    options = {**given, **now, **change}
    if options["num_workers"] == 0:  # what DataLoader takes only with workers
        for name in ("persistent_workers", "prefetch_factor", "multiprocessing_context"):
            options.pop(name, None)
    return options
