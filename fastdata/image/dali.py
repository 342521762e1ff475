"""Who decodes with DALI: an NVIDIA DALI pipeline decodes, crops, resizes and flips.

fastdata keeps everything that decides *which* pixels a batch holds, so `dali` gives the same
batches as `pil` and `wds`: the same order and reader (files or shards, as with 0 workers),
the same resume, the same checks, and the same crop window and flip for each sample (fastdata's
own parameter sampling, `transforms.plan`). The training process reads each batch's bytes,
checks them (whole file, readable header, within the pixel limit: what would make DALI fail
is caught before DALI sees it; and, once per file, the entropy-coded data, which DALI would fill
where corrupt), plans the geometry, and feeds DALI through
`fn.external_source`: encoded bytes, crop windows, output sizes and flips (a batch of large
files a part at a time, each part a DALI batch, joined as it comes out). DALI runs the
lowering of `fastdata.transforms.dali` (only the window is decoded, on the GPU with
device="mixed" when the target is CUDA; then resize and flip) in its own threads, prefetching
ahead. DALI decodes the JPEGs only: the other formats are decoded with Pillow, as on the
other backends, and set in their rows. The uint8 NHWC batch is copied into a reused slot (or a
CUDA tensor); Normalize, dtype and the batch ops run in the device stage as on the other backends.

DALI's own readers (`readers.file`, `readers.webdataset`) are not used: their order, sharding
and shuffle are DALI's, not a function of (seed, epoch), they cannot resume mid-epoch, and
the crop parameters have to be fed per sample anyway. On a GPU the expensive part, the
decode, is nvJPEG's either way.

A JPEG that passes the checks and still fails in DALI stops the pipeline: the JPEGs in
flight are decoded with Pillow to find the culprit, which raises `DataError` naming it, or
with on_error="skip" is left out while a fresh pipeline takes over from the first batch not
delivered. The pipeline is built at a pass's first batch and shut down at its end, whole or
not: its threads are never left for the garbage collector (see `_Feed`).
"""

from __future__ import annotations

import collections
import io
import logging
import time
import weakref
from typing import Any, Callable, Iterator

import numpy as np
import torch

from .._buffers import new_batch
from .._optional import require_pillow
from .._pillow import open_image
from .._torch_internals import dali_shutdown
from .._stall import NoWatchdog
from .._workers import hold_threads, release_threads
from ..errors import DataError, error_line, one_line, skippable
from ..transforms import CenterCrop
from ..transforms import dali as lowering
from .decode import BatchDecoder, Checked
from .order import Passes
from .parts import BatchOrder

logger = logging.getLogger("fastdata")


def _placeholder() -> bytes:
    """A tiny JPEG that fills a batch up to the pipeline's batch size (see `_feed`); its
    outputs are dropped."""
    require_pillow("for backend='dali'")
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (8, 8)).save(out, "JPEG")
    return out.getvalue()


class _Feed:
    """DALI's external source: iterating it gives the live pass's inputs, from the batch the
    pass starts at. It holds the decoders weakly: a strong reference would close a cycle
    (decoders, pipeline, source, decoders) that only the garbage collector frees, and a forked
    child may run that collection on a pipeline whose threads it does not have, and block."""

    def __init__(self, owner: "DaliDecoders") -> None:
        self.owner = weakref.ref(owner)
        self.live: Iterator[tuple] | None = None

    def __iter__(self):
        self.live = self.owner()._feed()
        return self.live

    def close(self) -> None:
        """Ends the generator handed to DALI, which refers to the decoders: DALI may keep it in
        reference cycles of its own after the pipeline is gone."""
        if self.live is not None:
            self.live.close()
            self.live = None


class _Retry(Exception):
    """The pipeline is restarted from the first batch not delivered, without the culprits."""


class DaliDecoders:
    """Runs a DALI pipeline over the batches of `order`, read by `reader` and checked by
    `decoder` in this process, one pass at a time. `threads` is DALI's CPU thread count (the
    loader's num_workers, at least one), `depth` its prefetch queue."""

    def __init__(self, order: BatchOrder, reader: Any, decoder: BatchDecoder, *, batch_size: int, threads: int,
                 depth: int, device: torch.device, seed: int, on_error: str, hw_decoder_load: float,
                 copy_inputs: bool) -> None:
        lowering.require()
        self.passes = Passes(order)
        self.reader, self.decoder = reader, decoder
        self.batch_size, self.threads, self.depth = batch_size, threads, depth
        self.device, self.seed, self.on_error = device, seed, on_error
        self.hw_decoder_load = hw_decoder_load
        self.copy_inputs = copy_inputs  # a shard's samples are views of the reader's buffers, refilled sooner
        self.timing = False
        self._pipe = None  # built at a pass's first batch, shut down at its end (see close)
        self._source: _Feed | None = None  # the pipeline's external source
        self._meta: collections.deque = collections.deque()
        self._bad: dict[int, str] = {}  # sample id -> why DALI could not decode it
        self._dummy = np.frombuffer(_placeholder(), np.uint8)
        self._fed = [0.0, 0.0]  # with stage timing: the feed's wall and CPU seconds so far
        self._drained = 0
        # A CenterCrop may pad: each box then goes to its place in a canvas of zeros.
        self._pads = any(isinstance(op, CenterCrop) for op in decoder.geometry)

    @property
    def num_workers(self) -> int:
        return self.threads

    def set_timing(self, on: bool) -> bool:
        self.timing = on
        return True

    def ready_ahead(self) -> int:
        return self.depth + 1

    def in_process(self) -> bool:
        return True

    def watchdog(self, it: Any) -> NoWatchdog:
        return NoWatchdog()

    def epoch_done(self, epoch: int) -> None:
        pass

    def shutdown(self) -> None:
        self.close()

    def open(self, epoch: int, skip: int) -> tuple[Iterator[Any], Callable[[], None]]:
        """(the decoded batches from batch `skip` of `epoch` on, the pass's end)."""
        self.passes.seek(epoch, skip)
        self._drained = skip  # batches of the epoch that came out: where a restarted pipeline starts
        close = weakref.WeakMethod(self.close)  # the loader keeps its pass's end: no cycle through it

        def end() -> None:
            live = close()
            if live is not None:
                live()

        return self._outputs(epoch), end

    def close(self) -> None:
        """Shuts the pipeline and its threads down now: at the end of every pass, whole or
        not, and after an error. Nothing is left for the garbage collector (see _Feed)."""
        pipe, self._pipe = self._pipe, None
        self._meta.clear()
        try:
            if pipe is not None:
                release_threads(pipe)
                dali_shutdown(pipe)
        finally:
            if self._source is not None:
                self._source.close()
            self.reader.close()  # the shard reader's read-ahead thread, in this process

    # ------------------------------------------------------------- the pipeline

    def _build(self):
        from nvidia.dali import fn, pipeline_def

        gpu = self.device.type == "cuda"
        device_id = self.device.index if self.device.index is not None else (torch.cuda.current_device() if gpu else None)
        # The graph's function closes over these values, not over self: DALI keeps the
        # function in reference cycles of its own, which would keep the decoders alive with them.
        feed = self._source = _Feed(self)
        no_copy, load, pads = not self.copy_inputs, self.hw_decoder_load, self._pads

        @pipeline_def(batch_size=self.batch_size, num_threads=self.threads, device_id=device_id, seed=self.seed,
                      prefetch_queue_depth=self.depth)
        def pipeline():
            # Fed without a copy where the inputs outlive the batch (they wait in _meta until
            # their batch is out).
            datas, starts, shapes, sizes, flips, *place = fn.external_source(
                source=feed, num_outputs=7 if pads else 5, batch=True, cycle="raise", no_copy=no_copy)
            images = lowering.decode_window(datas, starts, shapes, gpu=gpu, hw_decoder_load=load)
            images = lowering.flip(lowering.resize(images, sizes), flips)
            return lowering.place(images, *place) if pads else images

        pipe = pipeline()
        pipe.build()
        return pipe

    def _feed(self) -> Iterator[tuple]:
        """The pass's batches as DALI's inputs; each batch's checked samples and errors wait in
        `_meta` for its output."""
        for keys in self.passes:
            # A batch of large files is fed a part at a time (the reader's parts, at most
            # MAX_PART_BYTES each), as DALI batches of their own that `_drain` joins: what DALI
            # holds is then its prefetch queue's parts, not that many batches of 256 MiB files.
            parts = self.reader.parts(keys)
            while True:
                timing = self.timing
                if timing:
                    wall, cpu = time.perf_counter(), time.thread_time()
                part = next(parts, None)
                if part is None:
                    break
                read, more = part
                yield self._inputs(read, more, (wall, cpu) if timing else None)

    def _inputs(self, read, more: bool, timing: tuple[float, float] | None) -> tuple:
        """DALI's inputs for one part of a batch (the whole batch but for large files), `more`
        parts to follow; `timing`: when its read began (wall and thread seconds)."""
        epoch, index, paths, datas, labels, errors, draws = read
        if self._bad:
            keep = [j for j, i in enumerate(index.tolist()) if i not in self._bad]
            for j in sorted(set(range(len(index))) - set(keep)):
                self.decoder.fail(errors, paths[j], self._bad[int(index[j])])
            index, labels = index[keep], labels[keep]
            paths, datas = [paths[j] for j in keep], [datas[j] for j in keep]
            draws = None if draws is None else draws[keep]
        # DALI fills corrupt entropy-coded data: each file's is checked once here (the
        # decoder's record of clean files, `EntropyCheck`).
        c = self.decoder.check(epoch, index, paths, datas, labels, errors, entropy=True, draws=draws)
        n = len(c.datas)
        starts, shapes = lowering.window_inputs(c.geo.windows())
        w, h = c.size if n else (8, 8)
        # Every batch DALI sees is full, the short ones (an epoch's last, one with samples
        # left out; DALI takes no empty batch) filled up with the placeholder at the same
        # output size: DALI's buffers then keep one shape from pass to pass, where a batch of
        # another size reallocates them, and glibc's heap, which DALI's host buffers come
        # from, grows and shrinks by a batch from epoch to epoch.
        pad = self.batch_size - n
        inputs = ([np.frombuffer(d, np.uint8) for d in c.datas] + [self._dummy] * pad,
                  starts + [np.zeros(2, np.float32)] * pad, shapes + [np.full(2, 8, np.float32)] * pad,
                  [np.array([h, w], np.float32)] * self.batch_size,
                  list(c.geo.flips.astype(np.int32)) + [np.zeros((), np.int32)] * pad)
        if self._pads:  # each box resized to its place, then set there in zeros (its output size)
            places = c.geo.placements().astype(np.float32)
            # A place of no pixels: a pixel set outside the output, which is then all zeros.
            places[(places[:, 2] == 0) | (places[:, 3] == 0)] = (w, h, 1, 1)
            inputs = inputs[:3] + ([np.array([ph, pw], np.float32) for pw, ph in places[:, 2:]]
                                   + [np.array([h, w], np.float32)] * pad, inputs[4],
                                   list(-places[:, :2]) + [np.zeros(2, np.float32)] * pad,
                                   [np.array([w, h], np.float32)] * self.batch_size)
        # DALI decodes the JPEGs. Other formats are Pillow's, as on every backend (DALI
        # converts 16-bit samples, value ranges and TIFF orientations otherwise): DALI gets
        # the placeholder in their place, and `_drain` fills their rows.
        others = np.flatnonzero(~c.jpeg)
        for k in others:
            inputs[0][k], inputs[1][k] = self._dummy, np.zeros(2, np.float32)
            inputs[2][k] = np.full(2, 8, np.float32)
        if timing:  # the read and the header checks, in this thread: the stage "read"
            self._fed[0] += time.perf_counter() - timing[0]
            self._fed[1] += time.thread_time() - timing[1]
        self._meta.append((c, errors, n, inputs, (epoch, others, more)))  # inputs fed without a copy: kept until out
        return inputs

    def _pipeline(self):
        if self._pipe is None:
            self._meta.clear()
            self._pipe = self._build()
            hold_threads(self._pipe)  # worker loaders start by forkserver while it lives
        return self._pipe

    def _outputs(self, epoch: int) -> Iterator[tuple]:
        while True:
            pipe = self._pipeline()
            try:
                yield from self._drain(pipe)
                return
            except _Retry:
                self.passes.seek(epoch, self._drained)
                self.close()

    def _drain(self, pipe) -> Iterator[tuple]:
        done: list = []  # a batch's parts before its last, decoded (see _feed)
        stages: dict | None = None
        while True:
            timing = self.timing
            if timing:
                cpu, fed = time.process_time(), self._fed[:]
            try:
                (images,) = pipe.run()
            except StopIteration:
                return
            except DataError:  # from the feed: a file that failed the checks, with on_error="raise"
                self.close()
                raise
            except RuntimeError as e:
                self._isolate(e)  # raises DataError, or _Retry without the culprits
                raise
            c, errors, n, _, (epoch, others, more) = self._meta.popleft()
            if timing:
                # Stage seconds: "read" (the feed's wall time, as the workers'), "decode" (the CPU
                # seconds of the whole process during run(), less the feed's: DALI's threads
                # decoding, resizing and flipping) and "collate" (the copy out of DALI's buffer).
                t = time.process_time()
                part = {"read": self._fed[0] - fed[0], "decode": t - cpu - (self._fed[1] - fed[1]), "images": n}
            out, kept = self._with_pillows(self._copy_out(images, n, c.size, pooled=not (more or done)), c, epoch,
                                           others, errors)
            result = out, torch.from_numpy(np.ascontiguousarray(c.labels[kept])), errors, c.keys[kept]
            if timing:
                part["collate"] = time.process_time() - t
                stages = {k: v + stages.get(k, 0) for k, v in part.items()} if done and stages else part
            if more or done:  # a part of a batch of large files
                done.append((*result, c.paths[int(np.arange(n)[kept][0])] if len(result[3]) else None))
                if more:
                    continue
                t = time.process_time()
                try:
                    result = self.decoder.joined(done)
                except ValueError:  # its parts' images of different sizes
                    self.close()
                    raise
                done = []
                if timing:
                    stages["collate"] += time.process_time() - t
            self._drained += 1
            yield *result, ({"worker": -1, **stages} if timing else None)

    def _with_pillows(self, out: torch.Tensor, c: Checked, epoch: int, others: np.ndarray, errors: list):
        """(`out` with the rows of the samples `others` decoded by Pillow, those of `c` kept):
        a sample Pillow fails on is left out, or raises (DALI's pipeline shut down first)."""
        if not len(others):
            return out, slice(None)
        w, h = c.size
        rows = torch.empty((len(others), h, w, 3), dtype=torch.uint8)
        part = Checked(c.index[others], [c.paths[k] for k in others], [c.datas[k] for k in others],
                       c.labels[others], c.jpeg[others], c.geo.take(others),
                       keys=None if c.keys is None else c.keys[others])
        try:
            failed = self.decoder.fill(rows, part, epoch, errors)
        except DataError:
            self.close()
            raise
        good = [j for j in range(len(others)) if j not in failed]
        out[torch.from_numpy(others[good])] = rows[good].to(out.device)
        kept = np.setdiff1d(np.arange(len(out)), others[sorted(failed)])
        for dst, src in enumerate(kept.tolist()):  # the batch stays one block, as the other backends close gaps
            if dst != src:
                out[dst].copy_(out[src])
        return out.narrow(0, 0, len(kept)), kept

    def _copy_out(self, images, n: int, size: tuple[int, int], pooled: bool):
        """The first `n` images of DALI's output: in a slot of this process's ring (not `pooled`:
        a tensor of their own), or on the CUDA device."""
        from nvidia.dali.plugin.pytorch import feed_ndarray

        w, h = size
        if n == 0:
            return torch.empty((0, h, w, 3), dtype=torch.uint8, device=self.device if self.device.type == "cuda" else "cpu")
        tensor = images.as_tensor()  # the full batch: the first n are the samples, the rest filling
        if self.device.type == "cuda":
            out = torch.empty((self.batch_size, h, w, 3), dtype=torch.uint8, device=self.device)
            feed_ndarray(tensor, out, cuda_stream=torch.cuda.current_stream(self.device))
            return out[:n]
        if not pooled:
            return torch.from_numpy(np.asarray(tensor))[:n].clone()
        ring = self.decoder.rings.ring()
        try:
            target, handle = new_batch(ring, (n, h, w, 3), torch.uint8)
            target.copy_(torch.from_numpy(np.asarray(tensor))[:n])  # a view of DALI's buffer: one copy
        finally:
            ring.end()
        return handle

    def _isolate(self, error: RuntimeError) -> None:
        """DALI failed on a batch in flight: find the JPEGs (what DALI decodes) Pillow cannot
        decode either."""
        culprits = []
        for c, _, _, _, _ in self._meta:
            for i, path, data, jpeg in zip(c.index.tolist(), c.paths, c.datas, c.jpeg):
                try:
                    if jpeg:
                        with open_image(data) as img:
                            img.load()
                except Exception as e:  # Pillow raises OSError, SyntaxError, ValueError, ...
                    culprits.append((i, path, f"cannot decode ({error_line(e)})"))
        self.close()  # first: it may still hold the inputs fed without a copy
        if not culprits:
            raise DataError(one_line(f"DALI failed on a batch whose JPEGs all decode with Pillow: {error}")) from error
        if self.on_error == "raise":
            i, path, why = culprits[0]
            raise DataError(skippable(one_line(f"cannot read {path}: {why} (backend 'dali')")), path=path) from None
        for i, path, why in culprits:
            self._bad[i] = why
        logger.warning("DALI failed on %d sample(s); restarting its pipeline without them", len(culprits))
        raise _Retry()
