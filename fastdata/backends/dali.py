"""The `dali` backend: an NVIDIA DALI pipeline decodes, crops, resizes and flips.

fastdata keeps everything that decides *which* pixels a batch holds, so `dali` gives the same
batches as `pil` and `wds`: the same samples per batch and per rank (the `pil` batch sampler
for files, the `wds` plan and block reader for shards), the same resume, and the same crop
window and flip for each sample (fastdata's own parameter sampling, `transforms.plan`). The
main process reads each batch's bytes, checks them (whole file, readable header: what would
make DALI fail is caught before DALI sees it), plans the geometry, and feeds DALI through
`fn.external_source`: encoded bytes, crop windows, output sizes and flips. DALI runs
`decoders.image_slice` (only the window is decoded; on the GPU with device="mixed" when the
target is CUDA), `resize` and `flip` in its own threads, prefetching ahead. The uint8 NHWC
batch is copied into a reused slot (or a CUDA tensor); Normalize, dtype and the batch ops run
in the device stage as on the other backends.

DALI's own readers (`readers.file`, `readers.webdataset`) are not used: their order, sharding
and shuffle are DALI's, not a function of (seed, epoch), they cannot resume mid-epoch, and
the crop parameters have to be fed per sample anyway. On a GPU the expensive part, the
decode, is nvJPEG's either way.

A sample that passes the checks and still fails in DALI (a corrupt entropy-coded segment)
stops the pipeline: the batches in flight are decoded with Pillow to find the culprit, which
raises `DataError` naming it, or with on_error="skip" is left out while a fresh pipeline
takes over from the first batch not delivered.
"""

from __future__ import annotations

import collections
import io
import logging
import time
import weakref
from typing import Any, Iterator

import numpy as np
import torch

from .._buffers import new_batch
from .._workers import hold_threads, release_threads
from ..errors import DataError
from ..sources import Shards
from . import wds
from .pil import PilLoader

logger = logging.getLogger("fastdata")


# The formats DALI's image decoders read, by Pillow's names for them (MPO: a JPEG with a
# multi-picture index, as cameras write).
_DALI_FORMATS = frozenset({"JPEG", "MPO", "PNG", "BMP", "TIFF", "PPM", "JPEG2000", "WEBP"})


def _require():
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        raise RuntimeError("backend 'dali' needs NVIDIA DALI, which is not installed: pip install nvidia-dali-cuda120 "
                           "(runs CPU-only pipelines on a machine without a GPU too)") from None


def _placeholder() -> bytes:
    """A tiny JPEG fed in place of a batch whose samples were all left out (DALI takes no
    empty batch); its output is dropped."""
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (8, 8)).save(out, "JPEG")
    return out.getvalue()


class _Feed:
    """DALI's external source: iterating it gives the live pass's batches, from the batch the
    pass starts at. It holds the loader weakly: a strong reference would close a cycle (loader,
    pipeline, source, loader) that only the garbage collector frees, and a forked child may
    run that collection on a pipeline whose threads it does not have, and block forever."""

    def __init__(self, loader: DaliLoader) -> None:
        self.loader = weakref.ref(loader)
        self.live: Iterator[tuple] | None = None

    def __iter__(self):
        self.live = self.loader()._feed()
        return self.live

    def close(self) -> None:
        """Ends the generator handed to DALI, which refers to the loader: DALI may keep it in
        reference cycles of its own after the pipeline is gone."""
        if self.live is not None:
            self.live.close()
            self.live = None


class DaliLoader(PilLoader):
    """Image mode with an NVIDIA DALI pipeline doing the decoding and the geometry."""

    backend = "dali"

    def __init__(self, samples: Any, batch_size: int, *, hw_decoder_load: float = 0.65, **options: Any) -> None:
        # hw_decoder_load: the share of JPEGs DALI gives the hardware decoder of A100/H100-class
        # GPUs (the rest go to nvJPEG on the CUDA cores); 0.65 is DALI's default. Unused on the CPU.
        if not (isinstance(hw_decoder_load, (int, float)) and 0.0 <= hw_decoder_load <= 1.0):
            raise ValueError(f"hw_decoder_load should be a number in [0, 1], but got {hw_decoder_load!r}")
        self.hw_decoder_load = float(hw_decoder_load)
        super().__init__(samples, batch_size, **options)

    def _plan(self, shuffle: bool, drop_last: bool, workers: int, slots: int, pin: bool):
        _require()
        if self.transform is not None and self.transform.pixel_ops:
            names = ", ".join(type(op).__name__ for op in self.transform.pixel_ops)
            raise ValueError(f"backend 'dali' runs the geometry and Normalize; {names} has no DALI lowering yet: "
                             "use backend 'pil' or 'wds' for it")
        # The batches and the reader of the `wds` or `pil` backend, as with 0 workers: here the
        # training process reads (one lane of a shard plan), and DALI's threads decode.
        sibling = wds.WdsLoader if isinstance(self.samples, Shards) else PilLoader
        batches, reader = sibling._plan(self, shuffle, drop_last, 0, slots, pin)
        reader.backend = "dali"  # its errors name this backend
        return batches, reader

    def _num_classes(self) -> int | None:
        if isinstance(self.samples, Shards):
            return wds.WdsLoader._num_classes(self)
        return super()._num_classes()

    def _workers(self, workers: int, timeout: float, prefetch_factor: int | None, pin: bool) -> Any:
        # num_workers is DALI's CPU thread count here (at least one).
        self._threads = max(1, workers)
        self._depth = prefetch_factor or 2
        self._pipe = None  # built at a pass's first batch, shut down at its end (see _close)
        self._source: _Feed | None = None  # the pipeline's external source
        self._meta: collections.deque = collections.deque()
        self._bad: dict[int, str] = {}  # sample id -> why DALI could not decode it
        self._dummy = _placeholder()
        self._fed = [0.0, 0.0]  # with stage timing: the feed's wall and CPU seconds so far
        return None

    @property
    def num_workers(self) -> int:
        return self._threads

    # ------------------------------------------------------------- the pipeline

    def _build(self):
        from nvidia.dali import fn, pipeline_def, types

        gpu = self.device.type == "cuda"
        device_id = self.device.index if self.device.index is not None else (torch.cuda.current_device() if gpu else None)
        # The graph's function closes over these values, not over the loader: DALI keeps the
        # function in reference cycles of its own, which would keep the loader alive with them.
        feed = self._source = _Feed(self)
        no_copy = not isinstance(self.samples, Shards)
        decode = dict(device="mixed", hw_decoder_load=self.hw_decoder_load) if gpu else dict(device="cpu")

        @pipeline_def(batch_size=self.batch_size, num_threads=self._threads, device_id=device_id, seed=self.seed,
                      prefetch_queue_depth=self._depth)
        def pipeline():
            # Fed without a copy (dropping the copy took this backend from 0.93x to 1.01x of a
            # hand-written pipeline here): the inputs wait in _meta until their batch is out. Not
            # a shard's samples, though: views of the wds reader's buffers, refilled sooner.
            datas, starts, shapes, sizes, flips = fn.external_source(
                source=feed, num_outputs=5, batch=True, cycle="raise", no_copy=no_copy)
            # adjust_orientation=False: the image as stored, EXIF orientation ignored, as Pillow's
            # open, torchvision's decode_jpeg and the other backends give it (and the crop window
            # was planned on the stored size).
            images = fn.decoders.image_slice(datas, starts, shapes, normalized_anchor=False, normalized_shape=False,
                                             output_type=types.RGB, adjust_orientation=False, **decode)
            images = fn.resize(images, size=sizes, interp_type=types.INTERP_LINEAR, antialias=True)
            return fn.flip(images, horizontal=flips)

        pipe = pipeline()
        pipe.build()
        return pipe

    def _feed(self) -> Iterator[tuple]:
        """The epoch's batches as DALI's inputs; each batch's labels, names and errors wait in
        `_meta` for its output."""
        keys = iter(self._batches)
        for key in keys:
            timing = self._decoder.timing
            if timing:
                wall, cpu = time.perf_counter(), time.thread_time()
            epoch, index, paths, datas, labels, errors = self._decoder.read(key)
            if self._bad:
                keep = [j for j, i in enumerate(index.tolist()) if i not in self._bad]
                for j in sorted(set(range(len(index))) - set(keep)):
                    self._decoder._fail(errors, paths[j], self._bad[int(index[j])])
                index, labels = index[keep], labels[keep]
                paths, datas = [paths[j] for j in keep], [datas[j] for j in keep]
            c = self._decoder.check(epoch, index, paths, datas, labels, errors)
            n = len(c.datas)
            if n == 0:
                inputs = ([np.frombuffer(self._dummy, np.uint8)], [np.zeros(2, np.float32)], [np.full(2, 8, np.float32)],
                          [np.full(2, 8, np.float32)], [np.zeros((), np.int32)])
            else:
                boxes = c.geo.boxes
                x0, y0 = np.rint(boxes[:, 0]), np.rint(boxes[:, 1])
                starts = np.stack([x0, y0], axis=1).astype(np.float32)
                shapes = np.stack([np.maximum(1, np.rint(boxes[:, 2]) - x0), np.maximum(1, np.rint(boxes[:, 3]) - y0)],
                                  axis=1).astype(np.float32)
                w, h = c.size
                inputs = ([np.frombuffer(d, np.uint8) for d in c.datas], list(starts), list(shapes),
                          [np.array([h, w], np.float32)] * n, list(c.geo.flips.astype(np.int32)))
            if timing:  # the read and the header checks, in this thread: the stage "read"
                self._fed[0] += time.perf_counter() - wall
                self._fed[1] += time.thread_time() - cpu
            self._meta.append((c, errors, n, inputs))  # fed without a copy: kept alive until the batch is out
            yield inputs

    def _pipeline(self):
        if self._pipe is None:
            self._meta.clear()
            self._pipe = self._build()
            hold_threads(self._pipe)  # worker loaders start by forkserver while it lives
        return self._pipe

    def _close(self) -> None:
        """Shuts the pipeline and its threads down now: at the end of every pass, whole or
        not, and after an error. Nothing is left for the garbage collector (see _Feed)."""
        pipe, self._pipe = self._pipe, None
        self._meta.clear()
        try:
            if pipe is not None:
                release_threads(pipe)
                pipe._shutdown()  # DALI's own teardown, which its __del__ and atexit hook call: joins its threads
        finally:
            if self._source is not None:
                self._source.close()
            self._decoder.close()  # the shard reader's read-ahead thread, in this process

    def _open(self, epoch: int, skip: int) -> tuple[Iterator[Any], Any]:
        self._batches.epoch, self._batches.skip = epoch, skip
        close = weakref.WeakMethod(self._close)  # the loader keeps its pass's end: no cycle through it

        def end() -> None:
            live = close()
            if live is not None:
                live()

        return self._outputs(epoch), end

    def _outputs(self, epoch: int) -> Iterator[tuple]:
        while True:
            pipe = self._pipeline()
            try:
                yield from self._drain(pipe)
                return
            except _Retry:
                self._batches.epoch = epoch
                self._batches.skip = self._drained
                self._close()

    def _drain(self, pipe) -> Iterator[tuple]:
        self._drained = self._batches.skip  # batches of the epoch that came out, for a restart
        while True:
            timing = self._decoder.timing
            if timing:
                cpu, fed = time.process_time(), self._fed[:]
            try:
                (images,) = pipe.run()
            except StopIteration:
                return
            except DataError:  # from the feed: a file that failed the checks, with on_error="raise"
                self._close()
                raise
            except RuntimeError as e:
                self._isolate(e)  # raises DataError, or _Retry without the culprits
                raise
            c, errors, n, _ = self._meta.popleft()
            self._drained += 1
            labels = torch.from_numpy(np.ascontiguousarray(c.labels))
            if not timing:
                yield self._copy_out(images, n, c.size), labels, errors, c.index, None
                continue
            # Stage seconds: "read" (the feed's wall time, as pil's), "decode" (the CPU seconds
            # of the whole process during run(), less the feed's: DALI's threads decoding,
            # resizing and flipping) and "collate" (the copy out of DALI's buffer).
            t = time.process_time()
            stages = {"worker": -1, "read": self._fed[0] - fed[0], "decode": t - cpu - (self._fed[1] - fed[1]),
                      "images": n}
            out = self._copy_out(images, n, c.size)
            stages["collate"] = time.process_time() - t
            yield out, labels, errors, c.index, stages

    def _copy_out(self, images, n: int, size: tuple[int, int]):
        from nvidia.dali.plugin.pytorch import feed_ndarray

        w, h = size
        if n == 0:
            return torch.empty((0, h, w, 3), dtype=torch.uint8, device=self.device if self.device.type == "cuda" else "cpu")
        tensor = images.as_tensor()
        if self.device.type == "cuda":
            out = torch.empty((n, h, w, 3), dtype=torch.uint8, device=self.device)
            feed_ndarray(tensor, out, cuda_stream=torch.cuda.current_stream(self.device))
            return out
        ring = self._decoder.rings.ring()
        try:
            target, handle = new_batch(ring, (n, h, w, 3), torch.uint8)
            feed_ndarray(tensor, target)
        finally:
            ring.end()
        return handle

    def _isolate(self, error: RuntimeError) -> None:
        """DALI failed on a batch in flight: find the samples Pillow cannot decode either."""
        from PIL import Image

        culprits = []
        for c, _, _, _ in self._meta:
            for i, path, data in zip(c.index.tolist(), c.paths, c.datas):
                try:
                    with Image.open(io.BytesIO(data)) as img:
                        img.load()
                        kind = img.format
                except Exception as e:  # Pillow raises OSError, SyntaxError, ValueError, ...
                    culprits.append((i, path, f"cannot decode ({type(e).__name__}: {e})"))
                    continue
                if kind not in _DALI_FORMATS:  # a GIF named .jpg, say: Pillow's, not DALI's
                    culprits.append((i, path, f"DALI cannot decode {kind} images (backend 'pil' can)"))
        self._close()  # first: it may still hold the inputs fed without a copy
        if not culprits:
            raise DataError(f"DALI failed on a batch whose images all decode with Pillow: {error}") from error
        if self.on_error == "raise":
            i, path, cause = culprits[0]
            raise DataError(f"cannot read {path}: {cause} (backend 'dali')", path=path) from None
        for i, path, cause in culprits:
            self._bad[i] = cause
        logger.warning("DALI failed on %d sample(s); restarting its pipeline without them", len(culprits))
        raise _Retry()


class _Retry(Exception):
    """The pipeline is restarted from the first batch not delivered, without the culprits."""
