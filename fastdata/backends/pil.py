"""The `pil` backend: image files decoded into reused batch slots, in DataLoader's workers.

Each batch is one task: a worker (torch's DataLoader machinery: processes, seeding, timeouts,
dead-worker detection) reads the batch's files, sizes them from their headers, plans every
sample's geometry at once (`transforms.plan`), and decodes each image straight into its row
of a slot of the worker's shared-memory ring: JPEGs with the native crop-aware decoder
(only the crop window, at a reduced DCT scale when it is at least twice the output), the rest
with Pillow (Pillow-SIMD when installed). The slot reaches the main process as a leased tensor
(`fastdata._buffers`): no collation copy, no per-batch allocation. With num_workers=0 the
main process decodes with the native decoder's own threads.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
import warnings
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from .._buffers import BufferRing, ProcessRings, new_batch
from .._trace import trace_range
from .._workers import NoWatchdog, Watchdog, pass_end, stall_limit, start_method
from ..device import prefetch
from ..errors import DataError
from ..sources import Samples
from ..transforms import Compose
from ..transforms import batch as batch_ops
from ..transforms import pil as pil_lowering
from ..transforms.plan import plan_geometry, plan_pixels
from .base import Loader, resolve_workers, usable_cores

logger = logging.getLogger("fastdata")

from .. import _decode  # the native decoder when built (AVAILABLE), the structure checks always

_MAX_ERRORS = 100
_STATE_VERSION = 1


def _native_jpeg() -> bool:
    return _decode.AVAILABLE


def _check_complete(datas: Sequence) -> list[tuple[str | None, bool, int, int]]:
    """For each of `datas`: (why it cannot be decoded or None, whether it is a JPEG, width,
    height). JPEGs and PNGs are walked from their signature to their end marker (`_decode.
    inspect_batch`: a file cut short is refused whatever the crop, and whatever Pillow's
    LOAD_TRUNCATED_IMAGES says; bytes after the end are accepted, as Pillow does); other formats
    are sized by Pillow. An image whose header claims more than `_decode.MAX_IMAGE_PIXELS` is
    refused here, before any decoder allocates for it (DALI included)."""
    limit = _decode.MAX_IMAGE_PIXELS
    out = []
    for data, (cause, kind, w, h) in zip(datas, _decode.inspect_batch(datas, jpeg_headers=_native_jpeg())):
        if cause is None and not kind:
            from PIL import Image, UnidentifiedImageError

            try:
                w, h = pil_lowering.size_of(data)
            except UnidentifiedImageError:
                cause = f"not a readable image (Pillow knows no format that starts with {bytes(data[:8])!r})"
            except Image.DecompressionBombError as e:
                cause = f"over the pixel limit of {limit} ({e})"
            except Exception as e:  # Pillow's header parsers raise OSError, SyntaxError, ValueError, ...
                cause = f"not a readable image ({type(e).__name__}: {e})"
        if cause is None and w * h > limit:
            cause = f"the header claims {w}x{h} = {w * h} pixels, over the limit of {limit} (a decompression bomb?)"
        out.append((cause, kind == "jpeg", w, h))
    return out


@dataclass
class Checked:
    """A batch's samples that passed `check`: ids, names, bytes, labels, which are JPEGs, and
    their planned geometry (`geo.boxes`, `geo.flips`, one output size)."""

    index: np.ndarray
    paths: list[str]
    datas: list
    labels: np.ndarray
    jpeg: np.ndarray
    geo: Any

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) of the output images; (0, 0) for no samples."""
        return (int(self.geo.sizes[0][0]), int(self.geo.sizes[0][1])) if len(self.datas) else (0, 0)


class _BatchDecoder(Dataset):
    """Decodes a batch of encoded images into a slot of this process's ring: what the `pil`
    and `wds` backends share. Subclasses read a batch's bytes (`read`); `__getitems__` then
    checks and decodes them (`_decode`). The `dali` backend calls `read` and `check` only."""

    backend = ""

    def __init__(self, transform: Compose | None, seed: int, on_error: str, slots: int, pin: bool) -> None:
        self.geometry = transform.geometry if transform is not None else ()
        self.pixel_ops = transform.pixel_ops if transform is not None else ()
        self.seed = seed
        self.on_error = on_error
        self.rings = ProcessRings(slots, pin)

    timing = False  # stage timing (fastdata.profile turns it on): off, it costs one check a batch

    def close(self) -> None:
        """Stops whatever threads this process runs for the decoder (a read-ahead); the next
        batch starts them again."""

    def __getitem__(self, key):  # DataLoader asks for batches only (see __getitems__)
        return self.__getitems__([key])

    def __getitems__(self, keys):
        """(images, labels, errors, sample ids, stage seconds or None) of one batch. In a
        worker a DataError is returned as the batch, not raised: it reaches the training
        process as itself (one line, with its path and member), where DataLoader would re-raise
        it as a new exception whose message is the worker's traceback."""
        try:
            if not self.timing:
                return *self._decode(*self.read(keys)), None
            info = get_worker_info()
            stages = {"worker": info.id if info is not None else -1}
            t = time.perf_counter()
            with trace_range("fastdata.read"):
                args = self.read(keys)
            stages["read"] = time.perf_counter() - t
            return *self._decode(*args, stages=stages), stages
        except DataError as e:
            if get_worker_info() is None:
                raise
            return e

    def _fail(self, errors: list, path: str, cause: str) -> None:
        if self.on_error == "raise":
            # a tar member is named "<shard> (member <name>)": DataError carries both
            shard, _, member = path.partition(" (member ")
            raise DataError(f"cannot read {path}: {cause} (backend {self.backend!r})", path=shard,
                            member=member[:-1] or None)
        errors.append((path, cause))

    def check(self, epoch: int, index: np.ndarray, paths: list[str], datas: list, labels: np.ndarray,
              errors: list[tuple[str, str]]) -> "Checked":
        """The samples that are whole images within the pixel limit (`_check_complete`), with
        their sizes (from the headers) and planned geometry; the others fail (raise, or are
        recorded in `errors`). The same checks on every backend, before any decode."""
        ok, sizes, jpeg = [], [], []
        for j, (path, (cause, is_jpeg, w, h)) in enumerate(zip(paths, _check_complete(datas))):
            if cause is not None:
                self._fail(errors, path, cause)
                continue
            ok.append(j)
            sizes.append((w, h))
            jpeg.append(is_jpeg)
        sizes = np.array(sizes, dtype=np.int64).reshape(-1, 2)
        jpeg = np.array(jpeg, dtype=bool)
        sel = index[ok]
        geo = plan_geometry(self.geometry, self.seed, epoch, sel, sizes[:, 0], sizes[:, 1])
        if len(ok) and (geo.sizes != geo.sizes[0]).any():
            odd = int(np.argmax((geo.sizes != geo.sizes[0]).any(axis=1)))
            raise ValueError(
                f"images in a batch should have one size, but {paths[ok[0]]} is {geo.sizes[0][0]}x{geo.sizes[0][1]} and "
                f"{paths[ok[odd]]} is {geo.sizes[odd][0]}x{geo.sizes[odd][1]}; add a resize or crop to the transform, "
                f"e.g. transform=fastdata.transforms.imagenet_train(224)"
            )
        return Checked(sel, [paths[j] for j in ok], [datas[j] for j in ok], labels[ok], jpeg, geo)

    def _decode(self, epoch: int, index: np.ndarray, paths: list[str], datas: list, labels: np.ndarray,
                errors: list[tuple[str, str]], stages: dict | None = None):
        """(images, labels, errors, ids) for samples `index` (their ids for the random
        transforms), named `paths`, with bytes `datas`; a sample that fails is left out (or
        raises). With `stages`, the seconds of decode (with the header checks), cpu_transforms
        and collate (closing the gaps of failed samples) go in it."""
        # CPU seconds of this process, not wall time: under contention (workers sharing the
        # cores with the training process) wall time counts the waits for a core too, and the
        # profiler's rate model needs what an image costs.
        clock = time.process_time if stages is not None else None
        t0 = clock() if clock else 0.0
        c = self.check(epoch, index, paths, datas, labels, errors)
        sel, datas, labels, jpeg, geo = c.index, c.datas, c.labels, c.jpeg, c.geo
        n = len(datas)
        out_w, out_h = c.size
        native = _native_jpeg()

        ring = self.rings.ring()
        try:
            target, handle = new_batch(ring, (n, out_h, out_w, 3), torch.uint8)
            with trace_range("fastdata.decode"):
                failed = self._decode_into(target, datas, jpeg, geo, c.paths, errors, native)
            if clock:
                t1 = clock()
                stages["decode"] = t1 - t0
            if self.pixel_ops:
                plans = plan_pixels(self.pixel_ops, self.seed, epoch, sel)
                with trace_range("fastdata.cpu_transforms"):
                    for k in range(n):
                        if k not in failed:
                            pil_lowering.apply_pixel_ops(target[k].numpy(), self.pixel_ops, [p[k] for p in plans])
        finally:
            ring.end()
        if clock:
            t2 = clock()
            stages["cpu_transforms"] = t2 - t1
            stages["images"] = n
        if failed:
            # Close the gaps the failed samples left, so the batch stays one block.
            good = [k for k in range(n) if k not in failed]
            for dst, src in enumerate(good):
                if dst != src:
                    target[dst].copy_(target[src])
            handle = handle.narrow(0, 0, len(good))
            labels = labels[good]
            sel = sel[good]
        if clock:
            stages["collate"] = clock() - t2
        return handle, torch.from_numpy(np.ascontiguousarray(labels, dtype=np.int64)), errors, sel

    def _decode_into(self, target, datas, jpeg, geo, paths, errors, native) -> set[int]:
        failed: set[int] = set()
        size = (target.shape[2], target.shape[1])
        pillow = [k for k in range(len(datas)) if not (native and jpeg[k])]
        if native:
            js = [k for k in range(len(datas)) if jpeg[k]]
            if js:
                boxes = geo.boxes[js]
                x0, y0 = np.rint(boxes[:, 0]), np.rint(boxes[:, 1])
                crops = np.stack([x0, y0, np.maximum(1, np.rint(boxes[:, 2]) - x0),
                                  np.maximum(1, np.rint(boxes[:, 3]) - y0)], axis=1).astype(np.int32)
                threads = 1 if get_worker_info() is not None else usable_cores()
                chw = target.permute(0, 3, 1, 2)
                out = chw if len(js) == len(datas) else chw[js]  # (a copy when mixed: rare)
                results = _decode.decode_crop_resize([datas[k] for k in js], crops, geo.flips[js], out, threads)
                if out is not chw:
                    chw[js] = out
                for k, err in zip(js, results):
                    if err is None:
                        continue
                    if "color space" in err:  # CMYK and the like: Pillow handles them
                        pillow.append(k)
                    else:
                        failed.add(k)
                        self._fail(errors, paths[k], f"corrupt JPEG ({err})")
        for k in pillow:
            try:
                target[k].numpy()[...] = pil_lowering.decode(datas[k], geo.boxes[k], bool(geo.flips[k]), size)
            except Exception as e:  # Pillow raises OSError, SyntaxError, ValueError, ...
                failed.add(k)
                self._fail(errors, paths[k], f"cannot decode ({type(e).__name__}: {e})")
        return failed


class _Decoder(_BatchDecoder):
    """Map-style over (epoch, index) keys; `__getitems__` reads and decodes a whole batch."""

    backend = "pil"

    def __init__(self, samples: Samples, transform: Compose | None, seed: int, on_error: str, slots: int, pin: bool) -> None:
        super().__init__(transform, seed, on_error, slots, pin)
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def read(self, keys: Sequence[tuple[int, int]]):
        """(epoch, ids, paths, bytes, labels, errors) of a batch's samples: what `_decode` and
        `check` take."""
        epoch = keys[0][0]
        index = np.fromiter((k[1] for k in keys), dtype=np.int64, count=len(keys))
        errors: list[tuple[str, str]] = []
        paths, datas, ok = [], [], []
        for j, i in enumerate(index):
            path = self.samples.paths[i]
            try:
                with open(path, "rb") as f:
                    datas.append(f.read())
            except OSError as e:
                self._fail(errors, path, e.strerror or type(e).__name__)
                continue
            paths.append(path)
            ok.append(j)
        index = index[ok]
        return epoch, index, paths, datas, self.samples.labels[index], errors


def _first(batch):
    return batch


class _Batches:
    """This rank's batches of (epoch, index) keys: a pure function of (seed, epoch). Every rank
    gets the same number of samples (the epoch's order is padded by wrapping, or cut with
    drop_last, to a multiple of world_size, as DistributedSampler does), and so of batches."""

    def __init__(self, n: int, batch_size: int, shuffle: bool, drop_last: bool, seed: int, rank: int, world_size: int) -> None:
        self.n, self.batch_size, self.shuffle, self.drop_last = n, batch_size, shuffle, drop_last
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.epoch = 0
        self.skip = 0
        per_rank = n // world_size if drop_last else math.ceil(n / world_size)
        self.per_rank = per_rank
        self.batches = per_rank // batch_size if drop_last else math.ceil(per_rank / batch_size)

    def __len__(self) -> int:
        return self.batches

    def order(self, epoch: int) -> np.ndarray:
        if self.shuffle:
            order = np.random.Generator(np.random.PCG64([self.seed, epoch])).permutation(self.n)
        else:
            order = np.arange(self.n)
        total = self.per_rank * self.world_size
        if total > self.n:
            order = np.concatenate([order, order[: total - self.n]])
        return order[:total][self.rank :: self.world_size]

    def __iter__(self):
        epoch, skip = self.epoch, self.skip
        self.skip = 0
        mine = self.order(epoch)
        b = self.batch_size
        for k in range(skip, self.batches):
            chunk = mine[k * b : (k + 1) * b]
            yield [(epoch, int(i)) for i in chunk]


class _RunAhead:
    """A batch sampler's epochs end to end: the epoch it is set to (from its `skip`), then the
    next ones. Given to DataLoader with persistent workers, so that they run ahead into the
    next epoch instead of idling while the last batches of this one drain.

    NOTE: DataLoader asks for new indices only within an epoch, so at each epoch's end its
    persistent workers idle while the consumer works through the queued batches, and the next
    epoch's first batch is made while the consumer waits. In a training loop with a 150 ms step
    on the synthetic set (8 batches of 256 an epoch, 2 workers) the run-ahead measured 1.27x
    (benchmarks/run_ahead.py). The keys carry their epoch, and an epoch's batches are a pure
    function of (seed, epoch), so the next epoch's batches can be decoded before it begins; the
    loader takes `len` batches an epoch from one running iterator (see PilLoader.__iter__)."""

    def __init__(self, batches: Any) -> None:
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        b = self.batches
        while True:
            yield from b  # from (b.epoch, b.skip) to the epoch's end
            b.epoch += 1


def _dist_defaults(rank: int | None, world_size: int | None) -> tuple[int, int]:
    dist = torch.distributed
    live = dist.is_available() and dist.is_initialized()
    if rank is None:
        rank = dist.get_rank() if live else 0
    if world_size is None:
        world_size = dist.get_world_size() if live else 1
    if not 0 <= rank < world_size:
        raise ValueError(f"rank should be in [0, world_size), but got rank={rank}, world_size={world_size}")
    return rank, world_size


class PilLoader(Loader):
    """Image mode on the CPU: files decoded by the native JPEG decoder or Pillow."""

    backend = "pil"
    _run_ahead = True  # persistent workers run ahead into the next epoch (off: benchmarks/run_ahead.py's ablation)

    def __init__(
        self,
        samples: Samples,
        batch_size: int,
        *,
        shuffle: bool = False,
        drop_last: bool = False,
        num_workers: int | str = 0,
        timeout: float = 0,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory: bool = False,
        transform: Compose | None = None,
        device: Any = None,
        dtype: torch.dtype = torch.float32,
        channels_last: bool = True,
        placement: str = "auto",
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        on_error: str = "raise",
    ) -> None:
        super().__init__()
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
            raise ValueError(f"batch_size should be a positive integer in image mode, but got {batch_size!r}")
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error should be 'raise' or 'skip', but got {on_error!r}")
        if placement not in ("auto", "cpu", "gpu"):
            raise ValueError(f"placement should be 'auto', 'cpu' or 'gpu', but got {placement!r}")
        if isinstance(dtype, str):  # as a JSON config gives it: "bfloat16" or "torch.bfloat16"
            dtype = getattr(torch, dtype.removeprefix("torch."), dtype)
        if dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise ValueError(f"dtype should be torch.float32, torch.float16 or torch.bfloat16, but got {dtype}")
        if transform is not None and not isinstance(transform, Compose):
            raise TypeError(f"transform should be a fastdata.transforms.Compose, but got {type(transform).__name__}")
        self.samples = samples
        self.batch_size = batch_size
        self.transform = transform
        self.device = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.dtype, self.channels_last, self.placement = dtype, channels_last, placement
        self.on_error = on_error
        self.seed = seed
        rank, world_size = _dist_defaults(rank, world_size)
        self.rank, self.world_size = rank, world_size
        workers = resolve_workers(num_workers)
        self.persistent_workers = bool(persistent_workers) and workers > 0
        pin = bool(pin_memory) and torch.accelerator.is_available()
        slots = (prefetch_factor or 2) + 2
        self._batches, self._decoder = self._plan(shuffle, drop_last, workers, slots, pin)
        # placement: where ColorJitter/TrivialAugment run. "auto" is the CPU (the README's rule):
        # measured on this 2-core machine, the device stage on a CPU device is slower.
        pixel_ops = transform.pixel_ops if transform is not None else ()
        self._device_pixel_ops = pixel_ops if placement == "gpu" else ()
        if self._device_pixel_ops:
            from ..transforms import kornia as _kornia  # noqa: F401 (fails early when Kornia is missing)

            self._decoder.pixel_ops = ()
        self._timeout = timeout
        self._loader = self._workers(workers, timeout, prefetch_factor, pin)
        self._batch_ops = transform.batch_ops if transform is not None else ()
        # On a CPU device the device stage's float batch goes into reused slots: a fresh one
        # (19.6 MB at batch 64, 160 px) is page-faulted in every step or not at all, as the
        # process's heap happens to have it (benchmarks/device_stage.py: 1.03-1.33x over three
        # runs, as 2 to 5 of 6 allocating processes faulted).
        self._out_ring = BufferRing(3, shared=False) if self.device.type == "cpu" else None
        self.num_classes = self._num_classes()
        self._epoch = 0  # the epoch the next pass runs (the live pass's, until its last batch is out)
        self._skip = 0  # batches of self._epoch the next pass skips (a resume)
        self._delivered = 0  # batches of the live pass's epoch handed out, the skipped included
        self._in_epoch = False  # a pass is live and its epoch not finished
        self._ahead: tuple[int, int] | None = None  # (epoch, batch) the running workers deliver next
        self._warned: set[str] = set()

    def _plan(self, shuffle: bool, drop_last: bool, workers: int, slots: int, pin: bool) -> tuple[Any, _BatchDecoder]:
        """(batch sampler, decoder dataset) for DataLoader: what a backend reads and how."""
        batches = _Batches(len(self.samples), self.batch_size, shuffle, drop_last, self.seed, self.rank, self.world_size)
        return batches, _Decoder(self.samples, self.transform, self.seed, self.on_error, slots, pin)

    def _workers(self, workers: int, timeout: float, prefetch_factor: int | None, pin: bool) -> Any:
        """What runs the decoder: DataLoader's worker processes (or its main-process loop)."""
        extra: dict[str, Any] = {}
        if workers > 0:
            extra.update(prefetch_factor=prefetch_factor, persistent_workers=self.persistent_workers)
        batches = _RunAhead(self._batches) if self.persistent_workers and self._run_ahead else self._batches
        return DataLoader(self._decoder, batch_sampler=batches, collate_fn=_first, num_workers=workers,
                          timeout=stall_limit(timeout) if workers else 0, pin_memory=pin, **extra)

    def _num_classes(self) -> int | None:
        samples = self.samples
        return len(samples.classes) if samples.classes else int(samples.labels.max()) + 1

    @property
    def num_workers(self) -> int:
        return self._loader.num_workers

    def __len__(self) -> int:
        return len(self._batches)

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration runs (it also advances by itself after each pass).
        Another epoch than the current starts from its first batch; the current one (as after
        `load_state_dict`, in a loop that calls set_epoch at the top) keeps its resume point."""
        if int(epoch) != self._epoch:
            self._skip = 0
        self._epoch = int(epoch)

    def __iter__(self) -> Iterator[Any]:
        """A pass over the next epoch (from the resume point after `load_state_dict`). The
        previous iterator, if still alive, ends first. An epoch counts as finished when its
        last batch is handed out; a pass left early ends its epoch there too."""
        self._stop()
        if self._in_epoch:  # the last iterator was dropped before its first batch: its start stands
            self._skip = self._delivered
        epoch, skip, self._skip = self._epoch, self._skip, 0
        it, end = self._open(epoch, skip)
        self._delivered, self._in_epoch = skip, True
        return self._start(self._run(it, epoch, skip, end), end)

    def _open(self, epoch: int, skip: int) -> tuple[Iterator[Any], Any]:
        """(the iterator of raw batches from batch `skip` of `epoch` on, the pass's end)."""
        ahead, self._ahead = self._ahead, None
        if ahead == (epoch, skip):
            return self._loader._iterator, lambda: None  # persistent workers, already running ahead (see _RunAhead)
        self._batches.epoch, self._batches.skip = epoch, skip
        starting = self._loader.num_workers > 0 and not self._workers_running()
        if starting:
            self._loader.multiprocessing_context = start_method(None)
        rings = self._decoder.rings.begin_pass() if starting else None
        it = iter(self._loader)  # (persistent workers: drops what they had under way)
        end = pass_end(it, rings, self.persistent_workers)
        if self._loader.num_workers:
            return it, end
        decoder = self._decoder

        def end_here() -> None:  # the decoder ran in this process: its threads stop with the pass
            end()
            decoder.close()

        return it, end_here

    def _finish(self, batch: Any) -> Any:
        if isinstance(batch, DataError):  # from a worker (see _BatchDecoder.__getitems__)
            raise batch
        images, labels, errors, ids, stages = batch
        if errors:
            self._record(errors)
        if stages is not None:
            self._add_stages(stages)
        images = images.permute(0, 3, 1, 2)  # NHWC slot seen as NCHW: channels_last
        if not self.channels_last:
            images = images.contiguous()
        return images, labels, ids  # the sample ids: the device stage's random parameters

    def _timing(self, on: bool) -> bool:
        """Stage timing on or off (for fastdata.profile); False when it cannot reach running
        persistent workers."""
        if on and self._workers_running():
            return False
        self._decoder.timing = on
        if on:
            self.stats.setdefault("stages", {})
        return True

    def _add_stages(self, stages: dict) -> None:
        """Sums a batch's stage seconds into stats["stages"]: per stage, and per worker."""
        into = self.stats.setdefault("stages", {})
        worker = into.setdefault(f"worker {stages['worker']}", {})
        for name, value in stages.items():
            if name != "worker":
                into[name] = into.get(name, 0) + value
                worker[name] = worker.get(name, 0) + value

    def _record(self, errors: list) -> None:
        stats = self.stats
        stats["skipped"] += len(errors)
        for path, cause in errors:
            if len(stats["errors"]) < _MAX_ERRORS:
                stats["errors"].append({"path": path, "cause": cause})
            logger.warning("skipped %s: %s", path, cause)

    def _timed_device_stage(self, batch: tuple, epoch: int, k: int) -> tuple:
        # On a CPU device its CPU seconds (as the workers' stages); on a GPU its wall time, synchronized.
        clock = time.thread_time if self.device.type == "cpu" else time.perf_counter
        t = clock()
        with trace_range("fastdata.device_stage"):
            out = self._device_stage(batch, epoch, k)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)  # timing only: the stage's own time
        self._add_stage("device_stage", clock() - t)
        return out

    def _device_stage(self, batch: tuple, epoch: int, k: int) -> tuple:
        """Batch k of `epoch` through the device stage: its random parameters are a function of
        (seed, epoch, sample) and, for the batch ops, (seed, epoch, rank, k)."""
        images, labels, ids = batch
        if self._device_pixel_ops:
            from ..transforms import kornia

            plans = plan_pixels(self._device_pixel_ops, self.seed, epoch, ids)
            images = kornia.apply_pixel_ops(images, self._device_pixel_ops, plans)
            if self.channels_last:
                images = images.contiguous(memory_format=torch.channels_last)
        if not self._batch_ops:
            return images, labels
        return batch_ops.apply(images, labels, self._batch_ops, dtype=self.dtype, num_classes=self.num_classes,
                               seed=self.seed, epoch=epoch, rank=self.rank, batch=k,
                               new=self._new_output if self._out_ring is not None else None)

    def _new_output(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """A buffer for the device stage's output: a free slot of the output ring, else fresh."""
        try:
            return new_batch(self._out_ring, shape, dtype)[1]
        finally:
            self._out_ring.end()

    def _run(self, it: Iterator[Any], epoch: int, skip: int, end: Any) -> Iterator[Any]:
        """The batches of `epoch` after its first `skip`, from `it` (which may run on past the
        epoch, into the next)."""
        total = len(self._batches)
        batches = (self._finish(b) for b in itertools.islice(it, total - skip))
        if self.device.type != "cpu":
            batches = prefetch(batches, self.device, self._time_copy if self._decoder.timing else None)
        stats, clock = self.stats, time.perf_counter
        k = skip
        dog = Watchdog(it, self._timeout) if self._loader is not None and self._loader.num_workers else NoWatchdog()
        try:
            dog.waiting = k
            t0 = clock()
            for batch in batches:
                dog.waiting = -1
                if self._decoder.timing:
                    batch = self._timed_device_stage(batch, epoch, k)
                else:
                    batch = self._device_stage(batch, epoch, k)
                stats["wait_s"] += clock() - t0
                stats["batches"] += 1
                stats["samples"] += int(batch[1].shape[0])
                k += 1
                self._delivered = k
                if k == total:  # trainers take len() batches and never ask past the last
                    self._next_epoch(epoch)
                    if isinstance(getattr(self._loader, "batch_sampler", None), _RunAhead):
                        self._ahead = (epoch + 1, 0)
                yield batch
                dog.waiting = k
                t0 = clock()
        except Exception as e:  # a killed worker's read may fail with any error on the way
            error = dog.error(e)  # first: it kills stuck workers, which a shutdown would wait on
            if self.persistent_workers:
                # They are shut down here, not left to the iterator's finalizer: an error's
                # traceback can hold this loader in a reference cycle, and a cycle collected
                # in a forked child would run that finalizer there.
                self._shutdown_workers()
            if error is None:
                raise
            raise error from None
        finally:
            dog.close()
            if k < total and self._in_epoch and self._epoch == epoch:
                self._next_epoch(epoch)  # left early: the next pass is the next epoch
            end()

    def _shutdown_workers(self) -> None:
        super()._shutdown_workers()
        self._ahead = None

    def _next_epoch(self, epoch: int) -> None:
        self._in_epoch, self._delivered, self._epoch = False, 0, epoch + 1

    def state_dict(self) -> dict[str, Any]:
        """Where the stream stands: mid-epoch while a pass is live, else where the next pass
        starts."""
        return {"version": _STATE_VERSION, "backend": self.backend, "seed": self.seed, "epoch": self._epoch,
                "batches": self._delivered if self._in_epoch else self._skip}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get("version") != _STATE_VERSION or "batches" not in state:
            raise ValueError(f"state should be a dict from Loader.state_dict() (version {_STATE_VERSION}), but got {state!r:.200}")
        if state.get("seed", self.seed) != self.seed:
            warnings.warn(f"resuming with seed={self.seed}, but the state was taken with seed={state['seed']}", stacklevel=2)
        self._stop()
        self._epoch = int(state["epoch"])
        self._skip = int(state["batches"])
