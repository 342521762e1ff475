"""Decoding a batch: check -> plan geometry -> decode into a slot -> pixel ops.

`BatchDecoder.check` walks each image's structure (a file cut short is refused whatever the
crop; see `check_complete`), sizes it from its header, refuses it above the pixel limit, and
plans every sample's geometry at once (`transforms.plan`): the same checks on every backend,
before any decode. `BatchDecoder.decode` then decodes each image straight into its row of a
slot of this process's ring (`fastdata._buffers`): JPEGs with the native crop-aware decoder
(only the crop window, at a reduced DCT scale when it is at least twice the output; a file's
rows below the window are entropy-decoded too until its bytes have once decoded whole, which
the checkpoint index keeps, `_codec.open_index`, and then each window row is Huffman-decoded
from the checkpoint before it), the rest with Pillow; then the CPU pixel ops (ColorJitter,
TrivialAugment, RandAugment, AutoAugment) run on the rows in place. The `dali` backend runs
`check` only, with the entropy check of `record.EntropyCheck`: DALI decodes.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Any, Hashable

import numpy as np
import torch

from .. import _codec, _structure  # the native decoder when built (AVAILABLE); the pixel limit
from .._buffers import ProcessRings, new_batch
from .._cores import batch_threads
from .._optional import require_pillow
from .._trace import trace_range
from ..errors import error_line, one_line
from ..transforms import Compose
from ..transforms import pil as pil_lowering
from ..transforms._random import uniforms
from ..transforms.plan import pad_around, plan_geometry, plan_pixels
from .check import check_complete, check_rows
from .read import Failures, Read
from .record import EntropyCheck, pillows


def _native_jpeg() -> bool:
    return _codec.AVAILABLE


class MixedSizes(ValueError):
    """A batch whose images come out in different sizes (no resize or crop in the transform):
    the loader's error, which a worker hands the training process as the batch, as a DataError."""


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
    keys: np.ndarray | None = None  # what each sample's random draws are keyed by (`BatchDecoder.draw_keys`)

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) of the output images."""
        return (int(self.geo.sizes[0][0]), int(self.geo.sizes[0][1])) if len(self.datas) else self.empty_size


def vertical_first(boxes: np.ndarray, size: Any) -> np.ndarray:
    """Which crops (x0, y0, x1, y1) Pillow 13 resizes to `size` ((w, h), or one a crop: [N, 2])
    vertical pass first: those whose height shrinks by more than twice the pixels their width does
    (found against both orders of classic Pillow's passes on 496 sizes; earlier Pillows: none). The
    pass between is clipped, so where bicubic overshoots the order moves a pixel up to ~20 levels."""
    w, h = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    size = np.asarray(size)
    return (size[..., 1] < h) & (h - size[..., 1] > 2 * (w - size[..., 0]))


# (box w, h) -> output (w, h) around the edges of `vertical_first`'s rule: shrunk mostly in height,
# at the equality (horizontal first), one past it, mostly in width, grown in width, grown in height
_PROBES = (((40, 64), (36, 16)), ((40, 40), (30, 20)), ((40, 41), (30, 20)), ((64, 40), (16, 36)),
           ((20, 60), (30, 20)), ((40, 30), (10, 50)))

_FILTER_STREAM = 1 << 22  # a drawn filter's uniforms: apart from the geometry's, the pixel ops' and the erasings'


def drawn_filters(resample: str | tuple, seed: int, epoch: int, keys: np.ndarray) -> np.ndarray:
    """Each sample's resize filter (names): `resample`, or for a tuple of them one drawn uniformly
    per sample, a function of (seed, epoch, its draw key) as the other draws are."""
    if isinstance(resample, str):
        return np.full(len(keys), resample, dtype=object)
    u = uniforms(seed, epoch, keys, _FILTER_STREAM, 1)[:, 0]
    return np.array(resample, dtype=object)[(u * len(resample)).astype(np.int64)]


@functools.cache
def pillow_order() -> str:
    """How the installed Pillow orders the two passes of a bicubic resize, measured once per
    process on noise (where the orders differ) at the sizes of `_PROBES`, each resized whole
    against its two passes made as two one-axis resizes: "horizontal" (every size horizontal
    pass first: Pillow before 13), "rule" (as `vertical_first` says: Pillow 13), or "other"
    (neither: the native decoder cannot follow it, and its crops take Pillow's path)."""
    from PIL import Image

    bicubic, horizontal, rule = Image.Resampling.BICUBIC, True, True
    noise = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    for (w, h), (ow, oh) in _PROBES:
        img = Image.fromarray(noise[:h, :w])
        got = np.asarray(img.resize((ow, oh), bicubic))
        across = np.array_equal(got, np.asarray(img.resize((ow, h), bicubic).resize((ow, oh), bicubic)))
        down = np.array_equal(got, np.asarray(img.resize((w, oh), bicubic).resize((ow, oh), bicubic)))
        horizontal &= across
        rule &= down if vertical_first(np.array([[0, 0, w, h]]), (ow, oh))[0] else across
    return "horizontal" if horizontal else "rule" if rule else "other"


class BatchDecoder:
    """Checks and decodes batches into slots of this process's ring (picklable: it travels to
    the worker processes). `ids`: the number of sample ids, the size of `entropy`, the record
    of the files checked whole (`record.EntropyCheck`; shared with the workers, and with the loaders built in
    this process over the samples `key` names). `cpu_pixel_ops`: the transform's pixel ops it
    runs (None: all of them; the loader passes those its placement leaves on the CPU)."""

    def __init__(self, transform: Compose | None, seed: int, fail: Failures, slots: int, pin: bool, *,
                 ids: int, key: Hashable | None = None, cpu_pixel_ops: tuple | None = None) -> None:
        self.geometry = transform.geometry if transform is not None else ()
        if cpu_pixel_ops is None:
            cpu_pixel_ops = transform.pixel_ops if transform is not None else ()
        self.pixel_ops = cpu_pixel_ops
        if cpu_pixel_ops:
            require_pillow(f"to run {', '.join(type(op).__name__ for op in cpu_pixel_ops)} on the CPU")
        self.seed, self.fail = seed, fail
        self.rings, self.entropy = ProcessRings(slots, pin), EntropyCheck(ids, key)
        self.threads: int | None = None  # native decode threads a batch; None: 1 in a worker, else the usable cores
        # the resize filter: "bilinear" or "bicubic" (native or Pillow), "nearest" (Pillow); or a tuple
        # of them, one drawn per sample (`drawn_filters`)
        self.resample: str | tuple = "bilinear"
        self.crop_first = False  # Pillow's path as torchvision's steps (see transforms.pil.open_window)
        # with crop_first, the order of the resize's two passes: None, the installed Pillow's (`pillow_order`),
        # or "horizontal" (as torch resizes a tensor); weights: classic Pillow's or "pillow-simd" (`_codec`)
        self.order: str | None = None
        self.weights = "pillow"
        _codec.open_index()  # before the workers start: forked ones share it even in memory

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        _codec.open_index()  # a worker started by spawn or forkserver

    def draw_keys(self, index: np.ndarray, before: int) -> np.ndarray:
        """What the random draws of the samples `index` (after `before` others of their batch)
        are keyed by, with the seed and the epoch, where the order gives no keys of its own
        (`Read.draws`, for samples that repeat in an epoch): here the samples' ids, so a
        sample's crop, flip and pixel ops are a function of (seed, epoch, id) on every backend."""
        return index

    def check(self, epoch: int, index: np.ndarray, paths: list[str], datas: list, labels: np.ndarray,
              errors: list[tuple[str, str]], entropy: bool = False, like: tuple | None = None,
              draws: np.ndarray | None = None) -> "Checked":
        """The samples that are whole images within the pixel limit (`check_complete`, `check_rows`), with
        their sizes (from the headers) and planned geometry; the others fail (raise, or are
        recorded in `errors`). The same checks on every backend, before any decode; with
        `entropy`, also each unmarked JPEG's entropy-coded data (`self.entropy`, for a decoder
        that does not check it). For a part of a batch after its first, `like` is (the batch's
        first path, its output size, the samples checked before this part): each image must
        come out in that size. `draws`: the samples' draw keys where the order gives them
        (`Read.draws`), else `draw_keys`."""
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
        sizes, jpeg = np.array(sizes, dtype=np.int64).reshape(-1, 2), np.array(jpeg, dtype=bool)
        keys = draws if draws is not None else self.draw_keys(index, like[2] if like else 0)
        sel = index[ok]
        geo = plan_geometry(self.geometry, self.seed, epoch, keys[ok], sizes[:, 0], sizes[:, 1])
        work = geo.working_pixels()
        # a sliver of an image resized to a size its header did not give; an image smaller than a crop
        if (work > _structure.MAX_IMAGE_PIXELS).any() or geo.refused.any():
            keep = []
            for j, pixels in enumerate(work):
                (w, h), (ow, oh) = sizes[j], geo.sizes[j]
                if geo.refused[j]:
                    self.fail(errors, paths[ok[j]], f"its {w}x{h} pixels are fewer than the transform's crop takes "
                              "(torchvision's RandomCrop raises)")
                elif pixels > _structure.MAX_IMAGE_PIXELS:
                    self.fail(errors, paths[ok[j]], f"the transform resizes its {w}x{h} pixels to {ow}x{oh}, which "
                              f"takes {pixels} pixels, over the limit of {_structure.MAX_IMAGE_PIXELS} (an image of "
                              "that shape?)")
                else:
                    keep.append(j)
            ok, sizes, jpeg = [ok[j] for j in keep], sizes[keep], jpeg[keep]
            sel = index[ok]
            geo = plan_geometry(self.geometry, self.seed, epoch, keys[ok], sizes[:, 0], sizes[:, 1])
        if ok:
            first, size, before = like or (paths[ok[0]], tuple(geo.sizes[0]), 0)
            differ = (geo.sizes != np.asarray(size)).any(axis=1)
            if differ.any():
                odd = int(np.argmax(differ))
                self.mixed_sizes(first, tuple(size), paths[ok[odd]], tuple(geo.sizes[odd]), before + odd)
        empty = (0, 0)
        if not ok:  # every sample left out: the batch is [0, 3, H, W] in the size the transform gives any image
            probe = plan_geometry(self.geometry, self.seed, epoch, np.zeros(2, np.int64), np.array([640, 480]),
                                  np.array([480, 640]))
            if (probe.sizes[0] == probe.sizes[1]).all():
                empty = (int(probe.sizes[0][0]), int(probe.sizes[0][1]))
        return Checked(sel, [paths[j] for j in ok], [datas[j] for j in ok], labels[ok], jpeg, geo, empty, keys[ok])

    def mixed_sizes(self, first: str, first_size: tuple, other: str, other_size: tuple, entry: int) -> None:
        """Raises for a batch whose images would come out in different sizes ((width, height) each):
        `other` is the first whose size is not `first`'s, at `entry` among the samples checked."""
        raise MixedSizes(
            f"images in a batch should have one size, but {first} is {first_size[0]}x{first_size[1]} and "
            f"{other} is {other_size[0]}x{other_size[1]}; add a resize or crop to the transform, "
            f"e.g. transform=fastdata.transforms.imagenet_train(224)"
        )

    def joined(self, done: list) -> tuple:
        """One batch of the parts a large batch was decoded in (`read.MAX_PART_BYTES`), each
        (images of its own, labels, errors, draw keys, the name of its first sample): (images in
        a slot of this process's ring, or on the parts' CUDA device; labels, errors, draw keys)."""
        errors = [e for d in done for e in d[2]]
        done = [d for d in done if len(d[3])] or done[:1]  # a part whose samples all failed has no size
        sizes = [tuple(d[0].shape[1:]) for d in done]
        if len(set(sizes)) > 1:
            odd = next(k for k, size in enumerate(sizes) if size != sizes[0])
            self.mixed_sizes(done[0][4], sizes[0][1::-1], done[odd][4], sizes[odd][1::-1],
                             sum(len(d[3]) for d in done[:odd]))
        images = [d[0] for d in done]
        if images[0].is_cuda:
            out = torch.cat(images)
        else:
            ring = self.rings.ring()
            try:
                target, out = new_batch(ring, (sum(len(x) for x in images), *sizes[0]), torch.uint8)
            finally:
                ring.end()
            torch.cat(images, out=target)
        return out, torch.cat([d[1] for d in done]), errors, np.concatenate([d[3] for d in done])

    def decode(self, read: Read, stages: dict | None = None, pooled: bool = True):
        """(images, labels, errors, draw keys) of a batch as read: its images (NHWC, in a slot of this
        process's ring; not `pooled`, a tensor of its own) and labels; a sample that fails is
        left out (or raises). With `stages`, the seconds of decode (with the header checks),
        cpu_transforms and collate (closing the gaps of failed samples) go in it."""
        epoch, index, paths, datas, labels, errors, draws = read
        # CPU seconds of this process, not wall time: under contention (workers sharing the
        # cores with the training process) wall time counts the waits for a core too, and the
        # profiler's rate model needs what an image costs.
        clock = time.process_time if stages is not None else None
        t0 = clock() if clock else 0.0
        c = self.check(epoch, index, paths, datas, labels, errors, draws=draws)
        sel, labels = c.keys, c.labels  # the draw keys: the device stage's draws
        n = len(c.datas)
        out_w, out_h = c.size
        ring = self.rings.ring() if pooled else None
        try:
            target, handle = new_batch(ring, (n, out_h, out_w, 3), torch.uint8) if pooled else (
                (torch.empty((n, out_h, out_w, 3), dtype=torch.uint8),) * 2)
            times: list[float] = []
            failed = self.fill(target, c, epoch, errors, times.append if clock else None)
        finally:
            if ring is not None:
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
        keys = c.index if c.keys is None else c.keys
        filters = drawn_filters(self.resample, self.seed, epoch, keys)
        with trace_range("fastdata.decode"):
            failed = self._decode_into(target, c.datas, c.jpeg, c.geo, c.paths, errors, _native_jpeg(), filters)
        if lap:
            lap(time.process_time())
        if self.pixel_ops:
            plans = plan_pixels(self.pixel_ops, self.seed, epoch, keys, tuple(target.shape[1:3]))
            with trace_range("fastdata.cpu_transforms"):
                for k in range(len(c.datas)):
                    if k not in failed:
                        pil_lowering.apply_pixel_ops(target[k].numpy(), self.pixel_ops, [p[k] for p in plans])
        if lap:
            lap(time.process_time())
        return failed

    def _decode_into(self, target, datas, jpeg, geo, paths, errors, native, filters) -> set[int]:
        padded = np.flatnonzero(geo.padded())
        if not len(padded):
            return self._decode_boxes(target, datas, jpeg, geo, paths, errors, native, filters)
        # A CenterCrop or a padding padded these: each box goes to its place in an output of the
        # padding's fill (zeros but for a window's fill; copied pixels: `pad_around`), decoded aside
        # with the others of its size, then put there. One with no place left (a crop of padding
        # only) is decoded to a pixel, so that a corrupt file fails as on any other crop.
        places = geo.placements()
        wh = np.where((places[padded, 2:] > 0).all(axis=1, keepdims=True), places[padded, 2:], 1)
        rest = np.setdiff1d(np.arange(len(datas)), padded)
        groups = [(rest, None)] if len(rest) else []
        groups += [(padded[(wh == (w, h)).all(axis=1)], (h, w)) for w, h in np.unique(wh, axis=0).tolist()]
        failed, fill = set(), torch.tensor(geo.fill, dtype=torch.uint8)
        for ks, hw in groups:
            part = target[ks] if hw is None else torch.empty((len(ks), *hw, 3), dtype=torch.uint8)
            bad = self._decode_boxes(part, [datas[k] for k in ks], jpeg[ks], geo.take(ks), [paths[k] for k in ks],
                                     errors, native, filters[ks])
            failed |= {int(ks[j]) for j in bad}
            if hw is None:  # (the unpadded ones: a copy, filled, then put back)
                target[ks] = part
                continue
            for j, (k, (x, y, w, h)) in enumerate(zip(ks.tolist(), places[ks].tolist())):
                target[k] = fill
                target[k, y:y + h, x:x + w] = part[j] if w and h else 0
                if geo.mode != "constant" and k not in failed and not pad_around(target[k].numpy(), (x, y, w, h),
                                                                                  geo.mode):
                    failed.add(k)  # (then torchvision's pad: NumPy's, which may reflect more than once)
                    self.fail(errors, paths[k], f"its crop shows too little of it to pad in mode {geo.mode} from")
        return failed

    def _decode_boxes(self, target, datas, jpeg, geo, paths, errors, native, filters) -> set[int]:
        """Decodes each sample's box into its row of `target` with its filter (`filters`, names)."""
        failed: set[int] = set()
        size = (target.shape[2], target.shape[1])
        # The native decoder has Pillow's bilinear and bicubic filters; "nearest" is Pillow's. It takes a
        # box with fractions of a pixel (a resize before a crop) as Pillow's resize(box=) does. With
        # `crop_first`, torchvision's steps: a box a Resize then crops cut is a window of the whole image's
        # resize, a box of whole pixels is cut, then resized; any other box goes to Pillow.
        windows = geo.in_resize(size) if self.crop_first else np.zeros(len(datas), bool)
        if self.weights == "pillow-simd":  # (weights set by the whole resize's: a vast one is Pillow's)
            windows &= (geo.resized[:, :2] <= 1 << 16).all(axis=1)
        takes = (((geo.boxes == np.round(geo.boxes)).all(axis=1) & (geo.resized[:, 0] < 0)) | windows) \
            if self.crop_first else np.ones(len(datas), bool)
        # Torchvision's steps resize in the installed Pillow's order of passes: the native decoder follows
        # it where `pillow_order` knows it; else a bicubic crop (orders ~20 levels apart) is Pillow's.
        order = (self.order or pillow_order()) if self.crop_first else "horizontal"
        vertical = None
        if order == "rule":  # (a window's order is its whole image's resize's)
            whole = np.concatenate([np.zeros_like(geo.source), geo.source], axis=1)
            vertical = np.where(windows, vertical_first(whole, geo.resized[:, :2]), vertical_first(geo.boxes, size))
        takes &= np.isin(filters, ("bilinear", "bicubic") if order != "other" else ("bilinear",)) & jpeg & native
        pillow = np.flatnonzero(~takes).tolist()
        js = np.flatnonzero(takes).tolist()
        if js:
            crops = geo.crops(size, windows)[js]
            chw = target.permute(0, 3, 1, 2)
            out = chw  # (when mixed, rare: decoded aside, then put in place)
            if len(js) < len(datas):
                out = target.new_empty((len(js), *target.shape[1:])).permute(0, 3, 1, 2)
            resample = filters[js]
            # Whole where the checkpoint index, keyed by the bytes, has not seen them decode
            # whole: the index decides, not the record.
            results = _codec.decode_crop_resize([datas[k] for k in js], crops, geo.flips[js], out,
                                                batch_threads(self.threads),
                                                resample=resample[0] if (resample == resample[0]).all() else resample,
                                                crop_first=self.crop_first,
                                                vertical_first=None if vertical is None else vertical[js],
                                                resized=np.where(windows[js, None], geo.resized[js, :2], -1),
                                                weights=self.weights)
            if out is not chw:
                chw[js] = out
            for k, err in zip(js, results):
                if err is None:
                    continue
                if pillows(err):
                    pillow.append(k)
                else:
                    failed.add(k)
                    self.fail(errors, paths[k], f"corrupt JPEG ({err})")
        if pillow:  # (outside the handler below: a missing Pillow is no file's fault)
            require_pillow(f"to decode {one_line(str(paths[pillow[0]]))} (fastdata's own decoder takes JPEGs only)")
        for k in pillow:
            try:
                window = tuple(int(v) for v in geo.resized[k]) if self.crop_first and geo.resized[k, 0] >= 0 else None
                target[k].numpy()[...] = pil_lowering.open_window(datas[k], geo.boxes[k], bool(geo.flips[k]), size,
                                                                  str(filters[k]), self.crop_first, window)
            except Exception as e:  # Pillow raises OSError, SyntaxError, ValueError, ...
                failed.add(k)
                self.fail(errors, paths[k], f"cannot decode ({error_line(e)})")
        return failed
