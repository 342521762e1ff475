"""Decoding a batch: check -> plan geometry -> decode into a slot -> pixel ops.

`BatchDecoder.check` walks each image's structure (a file cut short is refused whatever the
crop; see `check_complete`), sizes it from its header, refuses it above the pixel limit, and
plans every sample's geometry at once (`transforms.plan`): the same checks on every backend,
before any decode. `BatchDecoder.decode` then decodes each image straight into its row of a
slot of this process's ring (`fastdata._buffers`): JPEGs with the native crop-aware decoder
(only the crop window, at a reduced DCT scale when it is at least twice the output; a file's
rows below the window are entropy-decoded too until it has once decoded whole without error,
which `EntropyCheck` records by sample id; a file decoded before on this machine is
Huffman-decoded from the checkpoint before each window row, `_codec.open_index`), the rest
with Pillow (Pillow-SIMD when installed); then the CPU pixel ops (ColorJitter, TrivialAugment)
run on the rows in place. The `dali`
backend runs `check` only, with the entropy check of `EntropyCheck`: DALI decodes.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from collections import OrderedDict
from typing import Any, Hashable, Sequence

import numpy as np
import torch

from .. import _codec  # the native decoder when built (AVAILABLE), the structure checks always
from .._buffers import ProcessRings, new_batch
from .._cores import batch_threads
from .._trace import trace_range
from ..errors import error_line
from ..sources import Shards
from ..transforms import Compose
from ..transforms import pil as pil_lowering
from ..transforms.plan import plan_geometry, plan_pixels
from .check import check_complete, check_rows
from .read import Failures, Read


def _native_jpeg() -> bool:
    return _codec.AVAILABLE


def _pillows(err: str) -> bool:
    """Whether the native decoder's error leaves the file to Pillow (a colour space it does not
    convert: CMYK, YCCK) rather than saying it is corrupt."""
    return "unsupported JPEG color space" in err


# The records of the last few sample lists loaders were built over in this process, by key
# (EntropyCheck's clean files, ShardReader's verified checksums): a handful, each 4 bytes a sample.
_RECORDS: OrderedDict = OrderedDict()
_RECORDS_KEPT = 8


def shared_record(ids: int, key: Hashable | None) -> torch.Tensor:
    """The record for `key` with `ids` entries: the one kept for it, else a new one of zeros
    (kept when there is a key)."""
    record = _RECORDS.get(key) if key is not None else None
    if record is None or len(record) != ids:
        # torch's file-descriptor sharing (its default) unlinks the segment's name at once, and
        # pickling for a forkserver worker sends the descriptor: the worker maps the same pages.
        record = torch.zeros(ids, dtype=torch.int32).share_memory_()
    if key is not None:
        _RECORDS[key] = record
        _RECORDS.move_to_end(key)
        while len(_RECORDS) > _RECORDS_KEPT:
            _RECORDS.popitem(last=False)
    return record


def samples_key(samples: Any) -> bytes:
    """What names a source's samples, by sample id, across the loaders of this process (the
    key of the decoder's record of clean files): a digest of the files' paths, or of the
    shards' URLs and their sample counts, with the working directory, which relative paths
    depend on. A digest, so that the record kept does not keep a copy of a million paths."""
    if isinstance(samples, Shards):  # (with the shards' identities: a rewrite is other samples)
        names = ["shards", *samples.urls, *(str(len(k)) for k in samples.keys), *map(str, samples.stamps or ())]
    else:
        names = ["files", *samples.paths]
    text = "\0".join([os.getcwd(), *names])
    return hashlib.blake2b(text.encode("utf-8", "surrogateescape"), digest_size=16).digest()


def _stamps(sizes: np.ndarray) -> np.ndarray:
    """What the record holds for a clean file of each size: 1 + its size, at most 2**31 - 1."""
    return np.minimum(np.asarray(sizes, dtype=np.int64), 2**31 - 2).astype(np.int32) + 1


class EntropyCheck:
    """The record of which samples' files decoded whole without error (`clean`, an int32 tensor
    in shared memory, one entry per sample id: 0, or 1 + the size in bytes of the file as it
    decoded whole, sizes from 2 GiB up counted as one). The processes decoding for one loader, its DataLoader workers included,
    whether forked or started by forkserver, share one record; loaders built in this process
    over the same samples (`key`: a validation loader each epoch, the tuner's probes, a resume)
    share one too, so that a fresh loader does not decode whole again what an earlier one did.

    The native decoder entropy-decodes a baseline JPEG's rows below the crop window too, so that
    corrupt data anywhere in a file is an error whatever the crop. That is needed once a file:
    with its checkpoint index (`_codec.open_index`, the CPU path), bytes the index has are the
    bytes that once decoded whole, found by a keyed hash of them, and all others are decoded
    whole, whatever the record says, so a file rewritten at the very same size is checked too.
    Without the index (this check, for DALI), a sample marked clean at its present size is not
    checked again (`whole` gives 0 for it): a file rewritten at the same size after its check
    is delivered as DALI decodes it, within the processes that share the record. A corrupt
    file is never marked, so it is checked, and fails, each time it comes.

    Called, it checks the entropy-coded data of each unmarked JPEG for a decoder that would fill
    corrupt data with grey or repeated rows and deliver it (DALI's: libjpeg-turbo's warnings,
    and nvJPEG's, are not errors there): the native decoder is handed a 1x1 window at the top of
    the image, decoded whole. Without the native decoder nothing is checked (DALI fills, as
    Pillow does); nor are JPEGs the native decoder leaves to Pillow (CMYK). Ids outside
    [0, ids) are never marked."""

    def __init__(self, ids: int, key: Hashable | None = None) -> None:
        self.clean = shared_record(max(0, int(ids)), key)
        self.threads: int | None = None  # None: the usable cores

    def whole(self, ids: np.ndarray, sizes: np.ndarray) -> np.ndarray:
        """uint8 [len(ids)]: 1 for each sample not marked clean at its size `sizes` (bytes),
        to be decoded whole; else 0."""
        ids = np.asarray(ids, dtype=np.int64)
        clean = self.clean.numpy()
        inside = (ids >= 0) & (ids < len(clean))
        out = np.ones(len(ids), dtype=np.uint8)
        out[inside] = clean[ids[inside]] != _stamps(sizes)[inside]
        return out

    def mark(self, ids: np.ndarray, sizes: np.ndarray) -> None:
        """Marks the samples `ids` clean: their files, of `sizes` bytes, decoded whole without
        error."""
        ids = np.asarray(ids, dtype=np.int64)
        clean = self.clean.numpy()
        inside = (ids >= 0) & (ids < len(clean))
        clean[ids[inside]] = _stamps(sizes)[inside]

    def __call__(self, index: np.ndarray, datas: Sequence, checked: list) -> list:
        if not _native_jpeg():
            return checked
        sizes = np.fromiter((len(d) for d in datas), dtype=np.int64, count=len(datas))
        whole = self.whole(index, sizes)
        todo = [j for j, (cause, is_jpeg, _, _) in enumerate(checked) if cause is None and is_jpeg and whole[j]]
        if not todo:
            return checked
        n = len(todo)
        out = np.empty((n, 3, 1, 1), dtype=np.uint8)
        top_left = np.tile(np.array([0, 0, 1, 1], np.int32), (n, 1))
        # index=False: DALI decodes these files, so checkpoints for them would never be used.
        results = _codec.decode_crop_resize([datas[j] for j in todo], top_left, np.zeros(n, np.uint8), out,
                                             batch_threads(self.threads), index=False)
        checked = list(checked)
        for j, err in zip(todo, results):
            if err is not None and not _pillows(err):
                _, is_jpeg, w, h = checked[j]
                checked[j] = (f"corrupt JPEG ({err})", is_jpeg, w, h)
        ok = [j for j, err in zip(todo, results) if err is None]
        self.mark(np.asarray(index)[ok], sizes[ok])
        return checked


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
    empty_size: tuple[int, int] = (0, 0)  # the size with no samples: the transform's, where it fixes one

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) of the output images."""
        return (int(self.geo.sizes[0][0]), int(self.geo.sizes[0][1])) if len(self.datas) else self.empty_size


def working_pixels(geo) -> np.ndarray:
    """The pixels each sample's resize holds at once: its output, or the pass between (output
    width x the crop box's height): Pillow's resize and the native one run the horizontal pass
    first, over every row of the box. The header's limit bounds the decode, not these: a
    1 x 4,000,000 image resized to 224 x 224 passes through 224 x 4,000,000."""
    out_w, out_h = geo.sizes[:, 0], geo.sizes[:, 1]
    box_h = np.ceil(geo.boxes[:, 3] - geo.boxes[:, 1]).astype(np.int64)
    return np.maximum(out_w * out_h, out_w * box_h)


class BatchDecoder:
    """Checks and decodes batches into slots of this process's ring (picklable: it travels to
    the worker processes). `ids`: the number of sample ids, the size of `entropy`, the record
    of the files that decoded whole (shared with the workers, and with the loaders built in
    this process over the samples `key` names). `cpu_pixel_ops`: the transform's pixel ops it
    runs (None: all of them; the loader passes those its placement leaves on the CPU)."""

    def __init__(self, transform: Compose | None, seed: int, fail: Failures, slots: int, pin: bool, *,
                 ids: int, key: Hashable | None = None, cpu_pixel_ops: tuple | None = None) -> None:
        self.geometry = transform.geometry if transform is not None else ()
        if cpu_pixel_ops is None:
            cpu_pixel_ops = transform.pixel_ops if transform is not None else ()
        self.pixel_ops = cpu_pixel_ops
        self.seed = seed
        self.fail = fail
        self.rings = ProcessRings(slots, pin)
        self.entropy = EntropyCheck(ids, key)
        self.threads: int | None = None  # native decode threads a batch; None: 1 in a worker, else the usable cores
        self.resample = "bilinear"  # the resize filter: "bilinear" (native or Pillow), "bicubic" or "nearest" (Pillow)
        self.crop_first = False  # Pillow's path as torchvision's steps (see transforms.pil.open_window)
        _codec.open_index()  # before the workers start: forked ones share it even in memory

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        _codec.open_index()  # a worker started by spawn or forkserver

    def check(self, epoch: int, index: np.ndarray, paths: list[str], datas: list, labels: np.ndarray,
              errors: list[tuple[str, str]], entropy: bool = False) -> "Checked":
        """The samples that are whole images within the pixel limit (`check_complete`, `check_rows`), with
        their sizes (from the headers) and planned geometry; the others fail (raise, or are
        recorded in `errors`). The same checks on every backend, before any decode; with
        `entropy`, also each unmarked JPEG's entropy-coded data (`self.entropy`, for a decoder
        that does not check it)."""
        ok, sizes, jpeg = [], [], []
        checked = check_rows(self.entropy, index, datas, check_complete(datas, batch_threads(self.threads)))
        if entropy:
            checked = self.entropy(index, datas, checked)
        for j, (path, (cause, is_jpeg, w, h)) in enumerate(zip(paths, checked)):
            if cause is not None:
                self.fail(errors, path, cause)
                continue
            ok.append(j)
            sizes.append((w, h))
            jpeg.append(is_jpeg)
        sizes = np.array(sizes, dtype=np.int64).reshape(-1, 2)
        jpeg = np.array(jpeg, dtype=bool)
        sel = index[ok]
        geo = plan_geometry(self.geometry, self.seed, epoch, sel, sizes[:, 0], sizes[:, 1])
        work = working_pixels(geo)
        if (work > _codec.MAX_IMAGE_PIXELS).any():  # a sliver of an image resized to a size its header did not give
            keep = []
            for j, pixels in enumerate(work):
                if pixels <= _codec.MAX_IMAGE_PIXELS:
                    keep.append(j)
                    continue
                w, h = sizes[j]
                ow, oh = geo.sizes[j]
                self.fail(errors, paths[ok[j]], f"the transform resizes its {w}x{h} pixels to {ow}x{oh}, which takes "
                          f"{pixels} pixels, over the limit of {_codec.MAX_IMAGE_PIXELS} (an image of that shape?)")
            ok, sizes, jpeg = [ok[j] for j in keep], sizes[keep], jpeg[keep]
            sel = index[ok]
            geo = plan_geometry(self.geometry, self.seed, epoch, sel, sizes[:, 0], sizes[:, 1])
        if len(ok) and (geo.sizes != geo.sizes[0]).any():
            odd = int(np.argmax((geo.sizes != geo.sizes[0]).any(axis=1)))
            self.mixed_sizes(paths[ok[0]], tuple(geo.sizes[0]), paths[ok[odd]], tuple(geo.sizes[odd]), odd)
        empty = (0, 0)
        if not ok:  # every sample left out: the batch is [0, 3, H, W] in the size the transform gives any image
            probe = plan_geometry(self.geometry, self.seed, epoch, np.zeros(2, np.int64), np.array([640, 480]),
                                  np.array([480, 640]))
            if (probe.sizes[0] == probe.sizes[1]).all():
                empty = (int(probe.sizes[0][0]), int(probe.sizes[0][1]))
        return Checked(sel, [paths[j] for j in ok], [datas[j] for j in ok], labels[ok], jpeg, geo, empty)

    def mixed_sizes(self, first: str, first_size: tuple, other: str, other_size: tuple, entry: int) -> None:
        """Raises for a batch whose images would come out in different sizes ((width, height) each):
        `other` is the first whose size is not `first`'s, at `entry` among the samples checked."""
        raise ValueError(
            f"images in a batch should have one size, but {first} is {first_size[0]}x{first_size[1]} and "
            f"{other} is {other_size[0]}x{other_size[1]}; add a resize or crop to the transform, "
            f"e.g. transform=fastdata.transforms.imagenet_train(224)"
        )

    def decode(self, read: Read, stages: dict | None = None):
        """(images, labels, errors, ids) of a batch as read: its images (NHWC, in a slot of this
        process's ring) and labels; a sample that fails is left out (or raises). With `stages`,
        the seconds of decode (with the header checks), cpu_transforms and collate (closing
        the gaps of failed samples) go in it."""
        epoch, index, paths, datas, labels, errors = read
        # CPU seconds of this process, not wall time: under contention (workers sharing the
        # cores with the training process) wall time counts the waits for a core too, and the
        # profiler's rate model needs what an image costs.
        clock = time.process_time if stages is not None else None
        t0 = clock() if clock else 0.0
        c = self.check(epoch, index, paths, datas, labels, errors)
        sel, labels = c.index, c.labels
        n = len(c.datas)
        out_w, out_h = c.size
        ring = self.rings.ring()
        try:
            target, handle = new_batch(ring, (n, out_h, out_w, 3), torch.uint8)
            times: list[float] = []
            failed = self.fill(target, c, epoch, errors, times.append if clock else None)
        finally:
            ring.end()
        if clock:
            t1, t2 = times
            stages["decode"] = t1 - t0
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

    def fill(self, target: torch.Tensor, c: "Checked", epoch: int, errors: list[tuple[str, str]],
             lap: Any = None) -> set[int]:
        """Decodes the checked samples `c` into `target` (uint8 [len, h, w, 3]) and runs the
        pixel ops on them; the rows of the samples that failed (recorded or raised through
        `self.fail`). `lap`, if given, gets the CPU clock after the decode and after the pixel ops."""
        with trace_range("fastdata.decode"):
            failed = self._decode_into(target, c.index, c.datas, c.jpeg, c.geo, c.paths, errors, _native_jpeg())
        if lap:
            lap(time.process_time())
        if self.pixel_ops:
            plans = plan_pixels(self.pixel_ops, self.seed, epoch, c.index)
            with trace_range("fastdata.cpu_transforms"):
                for k in range(len(c.datas)):
                    if k not in failed:
                        pil_lowering.apply_pixel_ops(target[k].numpy(), self.pixel_ops, [p[k] for p in plans])
        if lap:
            lap(time.process_time())
        return failed

    def _decode_into(self, target, ids, datas, jpeg, geo, paths, errors, native) -> set[int]:
        padded = np.flatnonzero(geo.padded())
        if not len(padded):
            return self._decode_boxes(target, ids, datas, jpeg, geo, paths, errors, native)
        # A CenterCrop padded these: each box goes to its place in a zeroed output, one at a time
        # (places differ with the image's size). One with no place left (a crop of padding
        # only) is decoded to a pixel aside, so that a corrupt file fails as on any other crop.
        rest = np.setdiff1d(np.arange(len(datas)), padded)
        failed: set[int] = set()
        if len(rest):
            part = target[rest]  # (a copy, filled, then put back: rare)
            bad = self._decode_boxes(part, ids[rest], [datas[k] for k in rest], jpeg[rest], geo.take(rest),
                                     [paths[k] for k in rest], errors, native)
            target[rest] = part
            failed = {int(rest[k]) for k in bad}
        for k, (x, y, w, h) in zip(padded.tolist(), geo.placements()[padded].tolist()):
            target[k].zero_()
            into = target[k:k + 1, y:y + h, x:x + w] if w and h else torch.empty((1, 1, 1, 3), dtype=torch.uint8)
            if self._decode_boxes(into, ids[[k]], [datas[k]], jpeg[[k]], geo.take([k]), [paths[k]], errors, native):
                failed.add(k)
        return failed

    def _decode_boxes(self, target, ids, datas, jpeg, geo, paths, errors, native) -> set[int]:
        failed: set[int] = set()
        size = (target.shape[2], target.shape[1])
        # The native decoder's filter is the bilinear one; other filters are Pillow's. It takes
        # a box with fractions of a pixel (a resize before a crop) as Pillow's resize(box=)
        # does, but with `crop_first` such a box goes to Pillow, which runs torchvision's two
        # steps (a resize of the whole image, then a crop of it).
        native = native and self.resample == "bilinear"
        whole_pixels = (geo.boxes == np.round(geo.boxes)).all(axis=1) if self.crop_first else np.ones(len(datas), bool)
        pillow = [k for k in range(len(datas)) if not (native and jpeg[k] and whole_pixels[k])]
        if native:
            js = [k for k in range(len(datas)) if jpeg[k] and whole_pixels[k]]
            if js:
                boxes = geo.boxes[js]
                crops = np.concatenate([boxes[:, :2], boxes[:, 2:] - boxes[:, :2]], axis=1)
                threads = batch_threads(self.threads)
                chw = target.permute(0, 3, 1, 2)
                out = chw if len(js) == len(datas) else chw[js]  # (a copy when mixed: rare)
                # Whole for a file not yet seen to decode whole without error (the index decides
                # for the rest: the record marks the files for DALI's check too).
                sizes = np.fromiter((len(datas[k]) for k in js), dtype=np.int64, count=len(js))
                whole = self.entropy.whole(ids[js], sizes)
                results = _codec.decode_crop_resize([datas[k] for k in js], crops, geo.flips[js], out, threads,
                                                     whole=whole)
                if out is not chw:
                    chw[js] = out
                done = np.array([w == 1 and err is None for w, err in zip(whole, results)], bool)
                self.entropy.mark(ids[js][done], sizes[done])
                for k, err in zip(js, results):
                    if err is None:
                        continue
                    if _pillows(err):
                        pillow.append(k)
                    else:
                        failed.add(k)
                        self.fail(errors, paths[k], f"corrupt JPEG ({err})")
        for k in pillow:
            try:
                target[k].numpy()[...] = pil_lowering.open_window(datas[k], geo.boxes[k], bool(geo.flips[k]), size,
                                                                  self.resample, self.crop_first)
            except Exception as e:  # Pillow raises OSError, SyntaxError, ValueError, ...
                failed.add(k)
                self.fail(errors, paths[k], f"cannot decode ({error_line(e)})")
        return failed
