"""`ImageLoader`: image mode's Loader, which every image backend is.

A backend is three parts (`parts.py`: BatchOrder, Reader, Runner): an order (which samples
each batch holds, `order.py`), a reader (their bytes, `read.py`, `read_shards.py`) and a
runner, who decodes them (CPU workers, `cpu.py`; this process, `threads.py`; DALI, `dali.py`;
Ray, `ray.py`). The loader validates the call, builds the parts, and runs
the passes: it takes the decoded batches the parts give, in order, hands each to the device
stage (`fastdata.device`), counts what it delivers and skips (`stats`), and keeps the resume
point (`state_dict`).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import time
from typing import Any, Iterator

import torch

from .. import _optional as optional
from .._ranks import ranks
from .._trace import trace_range
from .._loader import Loader, Pass, check_position, resolve_workers
from ..device import DeviceStage, prefetch
from ..transforms import Compose
from .cpu import BatchTask, CpuWorkers
from .decode import BatchDecoder
from .record import samples_key
from .options import ImageOptions
from .order import EpochSampler, FileOrder, ShardOrder, check_sampler, warn_other_order
from .parts import BatchOrder, Reader, Runner
from .read import Failures, Skipped
from .read_shards import ShardReader
from .threads import InProcess

_STATE_VERSION = 1
# The most soft targets (MixUp, CutMix, LabelSmoothing: float32 [batch, classes]) a batch may have:
# the class count can come from input (a shard index's list of classes), and one-hot targets grow
# with it.
MAX_TARGET_BYTES = 1 << 30
# What a pass is built from, so fixed once the loader is made: the keywords and DataLoader's names
# for the same things. torch's DataLoader refuses its own after __init__ (batch_size, sampler,
# drop_last, ...); here a later value would be ignored (a rank left to torch.distributed is read
# from it again before a pass, not from the attribute), so each is refused, in torch's words.
_FIXED = frozenset(f.name for f in dataclasses.fields(ImageOptions)) | {
    "batch_size", "backend", "config", "samples", "index_sampler", "dataset", "batch_sampler"}


class ImageLoader(Loader):
    """Image mode: `(images, labels)` batches from image files or shards. A backend names
    its parts in `_parts` (the order and the reader) and, when it is not CPU workers, in
    `_make_runner` (who decodes)."""

    _run_ahead = True  # persistent workers run ahead into the next epoch (off: benchmarks/run_ahead.py's ablation)
    _auto_in_process = True  # num_workers="auto" without persistent workers: 0 (see resolve_workers)
    _persistent_default = False  # persistent_workers when not given (DataLoader's)

    def __init__(self, samples: Any, batch_size: int, options: ImageOptions = ImageOptions()) -> None:
        super().__init__()
        o = options
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
            raise ValueError(f"batch_size should be a positive integer in image mode, but got {batch_size!r}")
        if o.on_error not in ("raise", "skip"):
            raise ValueError(f"on_error should be 'raise' or 'skip', but got {o.on_error!r}")
        if o.placement not in ("auto", "cpu", "gpu"):
            raise ValueError(f"placement should be 'auto', 'cpu' or 'gpu', but got {o.placement!r}")
        dtype = o.dtype
        if isinstance(dtype, str):  # as a JSON config gives it: "bfloat16" or "torch.bfloat16"
            dtype = getattr(torch, dtype.removeprefix("torch."), dtype)
        if dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise ValueError(f"dtype should be torch.float32, torch.float16 or torch.bfloat16, but got {dtype}")
        if o.transform is not None and not isinstance(o.transform, Compose):
            kind = type(o.transform)
            hint = ("torchvision's transforms run on a Dataset (torchvision.datasets.ImageFolder(root, transform)), "
                    "or in the script unchanged under `fastdata run`" if kind.__module__.startswith("torchvision")
                    else "put the ops in fastdata.transforms.Compose([...])")
            raise TypeError(f"transform should be a fastdata.transforms.Compose, but got {kind.__module__}."
                            f"{kind.__qualname__}: {hint}")
        if o.sampler is not None:
            check_sampler(o.sampler, samples, o.shuffle)
        self.samples = samples
        self._given = o
        self.index_sampler = o.sampler
        self.batch_size = batch_size
        self.transform = o.transform
        self.device = torch.device(o.device if o.device is not None else "cuda" if torch.cuda.is_available() else "cpu")
        self.dtype, self.channels_last, self.placement = dtype, o.channels_last, o.placement
        self.on_error = o.on_error
        self.seed = o.seed
        self._asked = (o.rank, o.world_size)  # None: from torch.distributed when a pass starts (see _follow_dist)
        self.rank, self.world_size = ranks(o.rank, o.world_size)
        persistent = self._persistent_default if o.persistent_workers is None else bool(o.persistent_workers)
        num_workers = resolve_workers(o.num_workers, self.device,
                                      fresh_in_process=self._auto_in_process and not persistent)
        self.persistent_workers = persistent and num_workers > 0
        pin = bool(o.pin_memory) and torch.accelerator.is_available()
        # The options the parts are built from (again when the ranks change), resolved: a worker
        # count for "auto", pinned slots only where an accelerator is.
        self._options = dataclasses.replace(o, num_workers=num_workers, persistent_workers=self.persistent_workers,
                                            pin_memory=pin)
        self._build()
        self._epoch = 0  # the epoch the next pass runs (the live pass's, until its last batch is out)
        self._skip = 0  # batches of self._epoch the next pass skips (a resume)
        self._delivered = 0  # batches of the live pass's epoch handed out, the skipped included
        self._in_epoch = False  # a pass is live and its epoch not finished
        self._state_world: int | None = None  # the world size of a state just loaded
        self._skipped = Skipped(self.stats)  # on_error="skip"'s counts, listing and warnings
        self._made = True  # from here on, the names in _FIXED are refused (see __setattr__)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _FIXED and self.__dict__.get("_made"):
            raise ValueError(f"{name} attribute should not be set after {type(self).__name__} is initialized: a pass "
                             "is built from the values given to fastdata.loader(...); make a new loader instead")
        super().__setattr__(name, value)

    def _build(self) -> None:
        """The parts for this rank and world size: order, reader, decoder, who decodes, the
        device stage."""
        o, transform = self._options, self.transform
        fail = Failures(self.on_error, self.backend)
        self._order, self._reader = self._parts(o.shuffle, o.drop_last, o.num_workers, fail)
        self.num_classes = self._reader.num_classes(transform)
        targets = 4 * self.batch_size * self.num_classes if transform is not None and transform.soft_labels else 0
        if targets > MAX_TARGET_BYTES:
            raise ValueError(f"MixUp, CutMix and LabelSmoothing would make float32 targets of [{self.batch_size}, "
                             f"{self.num_classes}] a batch, over {MAX_TARGET_BYTES >> 30} GiB: {self.num_classes} "
                             "classes (the shard index's list, or the largest label + 1) are more than one-hot "
                             "targets can hold")
        # The transform split once: the geometry is the decoder's, the batch ops the device stage's,
        # the pixel ops either's by placement ("auto" is the CPU, the README's rule).
        pixel_ops = transform.pixel_ops if transform is not None else ()
        device_pixel_ops = pixel_ops if self.placement == "gpu" else ()
        if device_pixel_ops:
            optional.require("kornia", "placement='gpu'")
        # Sample ids: a file's index in the list, or a shard sample's place among all the shards'.
        self._decoder = BatchDecoder(transform, self.seed, fail, (o.prefetch_factor or 2) + 2, o.pin_memory,
                                     ids=len(self.samples), key=samples_key(self.samples),
                                     cpu_pixel_ops=() if device_pixel_ops else pixel_ops)
        self._runner = self._make_runner(o.num_workers, o.timeout, o.prefetch_factor, o.pin_memory)
        self._device_stage = DeviceStage(device_pixel_ops, transform.batch_ops if transform is not None else (),
                                         device=self.device, dtype=self.dtype, channels_last=self.channels_last,
                                         num_classes=self.num_classes, seed=self.seed, rank=self.rank)

    def _follow_dist(self) -> None:
        """A rank or world size left to torch.distributed is read again before a pass (and by
        len()): a loader made before the process group (handed to a trainer that starts it)
        splits the epoch among the ranks that iterate it."""
        if None not in self._asked or (self._live is not None and self._live[0]() is not None):
            return
        live = ranks(*self._asked)
        if live != (self.rank, self.world_size):
            self._runner.shutdown()
            vars(self).update(rank=live[0], world_size=live[1])  # (past __setattr__'s guard)
            self._build()

    # ------------------------------------------------------------- the backend's parts

    def _parts(self, shuffle: bool, drop_last: bool, num_workers: int, fail: Failures) -> tuple[BatchOrder, Reader]:
        """(the batch order, the reader) of this backend."""
        raise NotImplementedError

    def _make_runner(self, num_workers: int, timeout: float, prefetch_factor: int | None, pin: bool) -> Runner:
        """Who decodes: DataLoader's worker processes running read-and-decode tasks."""
        # Not ahead into the next epoch with a sampler: its next epoch's list may change
        # (set_weights, a callable of the training state) until that epoch starts.
        run_ahead = self._run_ahead and self.index_sampler is None
        if num_workers == 0:
            return InProcess(self._order, BatchTask(self._reader, self._decoder), prefetch_factor, timeout)
        return CpuWorkers(self._order, BatchTask(self._reader, self._decoder), num_workers, timeout, prefetch_factor,
                          pin, self.persistent_workers, run_ahead)

    def _shard_parts(self, shuffle: bool, drop_last: bool, lanes: int, fail: Failures,
                     persistent: bool) -> tuple[ShardOrder, ShardReader]:
        """The order of shard samples for this rank, read in `lanes` lanes (one a worker), and its
        reader (`persistent`: the process reads the next epoch's first block ahead)."""
        order = ShardOrder(self.samples.counts, self.batch_size, shuffle, drop_last, self.seed, self.rank,
                           self.world_size, lanes, self.samples.sizes)
        return order, ShardReader(self.samples, order, fail, persistent=persistent)

    def _file_order(self, shuffle: bool, drop_last: bool) -> FileOrder:
        """The order of image files for this rank: the epoch's permutation, or the sampler's list."""
        return FileOrder(len(self.samples), self.batch_size, shuffle, drop_last, self.seed, self.rank,
                         self.world_size, self.index_sampler)

    # ------------------------------------------------------------- the Loader interface

    @property
    def num_workers(self) -> int:
        return self._runner.num_workers

    def __len__(self) -> int:
        self._follow_dist()
        return len(self._order)

    batch_sampler = None  # as a DataLoader given a sampler has (Lightning reads both)

    @property
    def sampler(self) -> EpochSampler:
        """What trainers call `set_epoch` on (Lightning and Fabric look for a DataLoader's
        sampler): it sets this loader's epoch."""
        return EpochSampler(self)

    @property
    def dataset(self):
        raise AttributeError("image mode has no torch Dataset to rebuild a DataLoader from: it reads, orders and "
                             "splits the images itself; to skip the first k batches of an epoch, use "
                             "loader.load_state_dict({**loader.state_dict(), 'epoch': e, 'batches': k})")

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration runs (it also advances by itself after each pass), or,
        called between `iter()` and the first batch, the one that iterator runs. Another epoch
        than the current starts from its first batch; the current one (as after
        `load_state_dict`, in a loop that calls set_epoch at the top) keeps its resume point."""
        if int(epoch) != self._epoch:
            self._skip = 0
            self._in_epoch, self._delivered = False, 0
        self._epoch = int(epoch)

    def __iter__(self) -> Iterator[Any]:
        """A pass over the next epoch (from the resume point after `load_state_dict`). The
        previous iterator, if still alive, ends first; if asked for more, it gives the rest
        of its epoch on parts of its own (`_rest`). An epoch counts as finished when its last
        batch is handed out; a pass left early ends its epoch there too."""
        self._supersede()
        self._stop()
        self._follow_dist()
        if self._state_world not in (None, self.world_size):
            raise ValueError(f"the state was taken with world_size={self._state_world}: each rank's share of an epoch "
                             f"depends on it, so resume on {self._state_world} ranks, not {self.world_size}")
        self._state_world = None
        check_position({"epoch": self._epoch, "batches": self._skip}, len(self._order), self.batch_size)
        if self._in_epoch:  # the last iterator was dropped before its first batch: its start stands
            self._skip = self._delivered
        epoch, skip, self._skip = self._epoch, self._skip, 0
        it, end = self._runner.open(epoch, skip)
        self._delivered, self._in_epoch = skip, True
        return self._start(Pass(self._run(it, epoch, skip, end)), end)

    def _rest(self, state: dict[str, Any]) -> Iterator[Any]:
        """The rest of a pass a newer one ended: its epoch after its `batches`, from a copy of
        this loader with parts of its own (workers that end with it), the same batches the
        pass would have given (each sample's randomness is its seed's, epoch's and id's)."""
        twin = copy.copy(self)  # without the live pass (Loader.__getstate__)
        twin._options = dataclasses.replace(self._options, persistent_workers=False)
        vars(twin)["persistent_workers"] = False  # (past __setattr__'s guard: the twin is this loader's own)
        twin._build()
        twin._order.check_state(state)  # the pass's shuffle blocks, which a state may have set
        twin._epoch, twin._skip, twin._in_epoch, twin._delivered = state["epoch"], state["batches"], False, 0
        return iter(twin)

    def _state_dict(self) -> dict[str, Any]:
        """Where the stream stands: mid-epoch while a pass is live, else where the next pass
        starts."""
        return {"version": _STATE_VERSION, "backend": self.backend, "seed": self.seed,
                "shuffle": self._options.shuffle, "epoch": self._epoch,
                "batches": self._delivered if self._in_epoch else self._skip, "batch_size": self.batch_size,
                "world_size": self.world_size, **self._order.state()}

    def _load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get("version") != _STATE_VERSION or "batches" not in state:
            raise ValueError(f"state should be a dict from Loader.state_dict() (version {_STATE_VERSION}), but got {state!r:.200}")
        check_position(state, None, self.batch_size)
        blocks = self._order.state()
        self._order.check_state(state)  # (a shard order takes the state's shuffle blocks)
        self._state_world = state.get("world_size")  # checked when the next pass knows its world size
        warn_other_order(state, self.seed, self._options.shuffle)
        if self.index_sampler is not None:
            self.index_sampler.load_state_dict(state["sampler"])
        self._stop()
        if self._order.state() != blocks:  # persistent workers hold the order as it was
            self._runner.shutdown()
        self._epoch = int(state["epoch"])
        self._skip = int(state["batches"])
        self._in_epoch, self._delivered = False, 0

    # ------------------------------------------------------------- the profiling protocol

    def set_stage_timing(self, on: bool) -> bool:
        if not self._runner.set_timing(on):
            return False
        if on:
            self.stats.setdefault("stages", {})
        return True

    def batches_ahead(self) -> int:
        return self._runner.ready_ahead()

    def remade(self, change: dict[str, Any]) -> ImageLoader:
        # over the same samples, resolved once: a folder is not listed again
        return type(self)(self.samples, self.batch_size, dataclasses.replace(self._given, **change))

    def runs_in_process(self) -> bool:
        return self._runner.in_process()

    # ------------------------------------------------------------- a pass

    def _run(self, it: Iterator[Any], epoch: int, skip: int, end: Any) -> Iterator[Any]:
        """The batches of `epoch` after its first `skip`, from `it` (which may run on past the
        epoch, into the next)."""
        runner = self._runner
        if self._epoch != epoch:
            # set_epoch came between iter() and the first batch (Lightning's resume from an
            # epoch-end checkpoint does that): as with a DataLoader, whose sampler is read at the
            # first batch, the pass runs the epoch set, from its start.
            end()
            epoch, skip = self._epoch, 0
            it, end = runner.open(epoch, skip)
            self._delivered, self._in_epoch = skip, True
        total = len(self._order)
        batches = (self._finish(b) for b in itertools.islice(it, total - skip))
        if self.device.type != "cpu":
            batches = prefetch(batches, self.device, self._time_copy if runner.timing else None)
        stats, clock = self.stats, time.perf_counter
        k = skip
        dog = runner.watchdog(it)
        try:
            dog.waiting = k
            t0 = clock()
            for batch in batches:
                dog.waiting = -1
                batch = self._timed_device_stage(batch, epoch, k) if runner.timing else self._device_stage(batch, epoch, k)
                stats["wait_s"] += clock() - t0
                stats["batches"] += 1
                stats["samples"] += int(batch[1].shape[0])
                k += 1
                self._delivered = k
                if k == total and self._epoch == epoch:  # trainers take len() batches, never asking past the last
                    self._next_epoch(epoch)
                    runner.epoch_done(epoch)
                yield batch
                dog.waiting = k
                t0 = clock()
        except Exception as e:  # a killed worker's read may fail with any error on the way
            error = dog.error(e)  # first: it kills stuck workers, which a shutdown would wait on
            if self.persistent_workers:
                # They are shut down here, not left to the iterator's finalizer: an error's
                # traceback can hold this loader in a reference cycle, and a cycle collected
                # in a forked child would run that finalizer there.
                runner.shutdown()
            if error is None:
                raise
            raise error from None
        finally:
            dog.close()
            if k < total and self._in_epoch and self._epoch == epoch:
                self._next_epoch(epoch)  # left early: the next pass is the next epoch
            end()

    def _finish(self, batch: Any) -> Any:
        if isinstance(batch, Exception):  # a DataError or MixedSizes from a worker (see BatchTask.__getitems__)
            raise batch
        images, labels, errors, keys, stages = batch
        if errors:
            self._skipped.record(errors)
        if stages is not None:
            self._record_stages(stages)
        images = images.permute(0, 3, 1, 2)  # NHWC slot seen as NCHW: channels_last
        if not self.channels_last:
            images = images.contiguous()
        return images, labels, keys  # the samples' draw keys: the device stage's random parameters

    def _timed_device_stage(self, batch: tuple, epoch: int, k: int) -> tuple:
        # On a CPU device its CPU seconds (as the workers' stages); on a GPU its wall time, synchronized.
        clock = time.thread_time if self.device.type == "cpu" else time.perf_counter
        t = clock()
        with trace_range("fastdata.device_stage"):
            out = self._device_stage(batch, epoch, k)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)  # timing only: the stage's own time
        self._record_stages({"device_stage": clock() - t})
        return out

    def _next_epoch(self, epoch: int) -> None:
        self._in_epoch, self._delivered, self._epoch = False, 0, epoch + 1
        self._skipped.epoch_done(epoch)

