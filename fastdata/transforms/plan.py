"""Compiles a pipeline's per-sample geometry into what a decoder applies in one pass.

RandomResizedCrop, Resize, CenterCrop and RandomHorizontalFlip (and an op with a `window` of its
own: `fastdata run`'s RandomCrop, which draws its offsets, and Pad), in any order, fold into one
box in the source image's coordinates, one output size and one flip per sample: the native
decoder then decodes only the box (and at a reduced DCT scale when it is at least twice the
output), and Pillow does it as one `resize(size, box=...)`. A CenterCrop larger than the image
pads it with zeros, as torchvision's does, and so does a window past its edges: the box then
lands on a part of the output (`inner`), and the rest is zeros (or a window's fill, or
`pad_around`'s copies of the box's pixels). Vectorised over the batch. An op whose size follows
a schedule (`schedule.py`) gives the epoch's size; its random draws do not depend on the size,
so the crop boxes are those of a fixed-size pipeline.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ._random import uniforms
from .ops import TRIVIAL_OPS, CenterCrop, Op, RandomHorizontalFlip, RandomResizedCrop, Resize

_RRC_ATTEMPTS = 10  # torchvision's


@dataclass
class Geometry:
    boxes: np.ndarray  # float64 [N, 4]: x0, y0, x1, y1 in source pixels
    flips: np.ndarray  # bool [N]
    sizes: np.ndarray  # int64 [N, 2]: output (w, h)
    inner: np.ndarray  # float64 [N, 4]: x0, y0, x1, y1 in output pixels, where the box lands (zeros around it)
    # int64 [N, 4]: where the box is a crop of the whole image resized (a Resize, then crops), that
    # resize's (w, h), which torchvision's steps make before they crop, and the box's corner
    # (x, y) in whole pixels of it; else -1
    resized: np.ndarray
    source: np.ndarray  # int64 [N, 2]: the image's (w, h)
    # bool [N]: the samples the transform raises on (an op's `refuses`: a RandomCrop larger than the image)
    refused: np.ndarray
    # what fills the output around the box (a window's padding, `fastdata.run._crop`): `fill`
    # ("constant"), or NumPy's pad of the box's pixels in that mode ("edge", "reflect", "symmetric")
    mode: str = "constant"
    fill: tuple[int, int, int] = (0, 0, 0)

    def placements(self) -> np.ndarray:
        """Where each box lands in its output, in whole pixels: int64 [N, 4] of (x, y, w, h),
        each edge rounded to the nearest pixel (exact unless a resize follows a CenterCrop
        that padded; w or h is 0 where the output is all padding)."""
        r = np.rint(self.inner).astype(np.int64)
        return np.stack([r[:, 0], r[:, 1], np.maximum(0, r[:, 2] - r[:, 0]), np.maximum(0, r[:, 3] - r[:, 1])], axis=1)

    def in_resize(self, size: tuple[int, int]) -> np.ndarray:
        """bool [N]: the boxes that are a window of `size` (w, h) inside their whole image's resize."""
        r = self.resized
        return (r[:, 0] >= 0) & (r[:, 2] >= 0) & (r[:, 3] >= 0) & (r[:, 2] + size[0] <= r[:, 0]) & \
            (r[:, 3] + size[1] <= r[:, 1])

    def crops(self, size: tuple[int, int], windows: np.ndarray) -> np.ndarray:
        """float64 [N, 4] of (x, y, w, h): each box in source pixels, or where `windows`, its window
        of `size` (w, h) in whole pixels of the whole image's resize."""
        crops = np.concatenate([self.boxes[:, :2], self.boxes[:, 2:] - self.boxes[:, :2]], axis=1)
        crops[windows] = np.concatenate([self.resized[windows, 2:], np.broadcast_to(size, (int(windows.sum()), 2))],
                                        axis=1)
        return crops

    def working_pixels(self) -> np.ndarray:
        """The pixels each sample's resize holds at once: its output, or the pass between (output
        width x the crop box's height) when the horizontal pass runs first, over every row of the
        box (a vertical pass first holds the box's rows, which the header's limit bounds). The
        header's limit bounds the decode, not these: a 1 x 4,000,000 image resized to 224 x 224
        horizontal pass first passes through 224 x 4,000,000."""
        out_w, out_h = self.sizes[:, 0], self.sizes[:, 1]
        box_h = np.ceil(self.boxes[:, 3] - self.boxes[:, 1]).astype(np.int64)
        return np.maximum(out_w * out_h, out_w * box_h)

    def take(self, rows) -> "Geometry":
        """The geometry of the samples `rows` (indices), in their order."""
        return Geometry(self.boxes[rows], self.flips[rows], self.sizes[rows], self.inner[rows], self.resized[rows],
                        self.source[rows], self.refused[rows], self.mode, self.fill)

    def padded(self) -> np.ndarray:
        """bool [N]: the samples whose box does not fill their output."""
        p = self.placements()
        return (p[:, 0] != 0) | (p[:, 1] != 0) | (p[:, 2] != self.sizes[:, 0]) | (p[:, 3] != self.sizes[:, 1])

    def windows(self) -> np.ndarray:
        """The crop boxes in whole pixels, as DALI's slicing decoders cut them (the native
        decoder and Pillow take `boxes` as they are): int32 [N, 4] of (x, y, w, h), each edge
        rounded to the nearest pixel, at least one pixel wide and high."""
        x0, y0 = np.rint(self.boxes[:, 0]), np.rint(self.boxes[:, 1])
        return np.stack([x0, y0, np.maximum(1, np.rint(self.boxes[:, 2]) - x0),
                         np.maximum(1, np.rint(self.boxes[:, 3]) - y0)], axis=1).astype(np.int32)


def _rrc(op: RandomResizedCrop, u: np.ndarray, W: np.ndarray, H: np.ndarray):
    """torchvision's RandomResizedCrop.get_params, for a batch, from uniforms [N, 40]."""
    n = len(W)
    area = (W * H).astype(np.float64)
    lo, hi = op.scale
    log_r = (math.log(op.ratio[0]), math.log(op.ratio[1]))
    u = u.reshape(n, _RRC_ATTEMPTS, 4)
    target = area[:, None] * (lo + (hi - lo) * u[:, :, 0])
    aspect = np.exp(log_r[0] + (log_r[1] - log_r[0]) * u[:, :, 1])
    w = np.rint(np.sqrt(target * aspect)).astype(np.int64)
    h = np.rint(np.sqrt(target / aspect)).astype(np.int64)
    ok = (w > 0) & (w <= W[:, None]) & (h > 0) & (h <= H[:, None])
    first = np.argmax(ok, axis=1)
    found = ok[np.arange(n), first]
    w, h = w[np.arange(n), first], h[np.arange(n), first]
    top = np.floor(u[np.arange(n), first, 2] * (H - h + 1)).astype(np.int64)
    left = np.floor(u[np.arange(n), first, 3] * (W - w + 1)).astype(np.int64)
    # No attempt fit: torchvision's fallback, a central crop clamped to the ratio range.
    in_ratio = W / H
    fw = np.where(in_ratio < op.ratio[0], W, np.where(in_ratio > op.ratio[1], np.rint(H * op.ratio[1]), W))
    fh = np.where(in_ratio < op.ratio[0], np.rint(W / op.ratio[0]), H)
    fw, fh = fw.astype(np.int64), fh.astype(np.int64)
    w, h = np.where(found, w, fw), np.where(found, h, fh)
    top = np.where(found, top, (H - h) // 2)
    left = np.where(found, left, (W - w) // 2)
    return left, top, w, h


def _resize_to(size: int | tuple[int, int], W: np.ndarray, H: np.ndarray):
    if isinstance(size, tuple):
        return np.full_like(W, size[1]), np.full_like(H, size[0])
    s = size
    short, long_ = np.minimum(W, H), np.maximum(W, H)
    new_long = (s * long_ // short).astype(np.int64)  # torchvision: int(size * long / short)
    return np.where(W <= H, s, new_long), np.where(W <= H, new_long, s)


def plan_geometry(ops: Sequence[Op], seed: int, epoch: int, indices: np.ndarray,
                  widths: np.ndarray, heights: np.ndarray) -> Geometry:
    """Boxes, flips and output sizes for samples `indices` of sizes (widths, heights), at
    `epoch` (which picks the random parameters, and the output size of a size schedule)."""
    n = len(indices)
    W = np.asarray(widths, dtype=np.int64).copy()  # the current image's size, op by op
    H = np.asarray(heights, dtype=np.int64).copy()
    source = np.stack([W, H, W, H], axis=1).astype(np.float64)
    box = np.stack([np.zeros(n), np.zeros(n), W.astype(np.float64), H.astype(np.float64)], axis=1)
    inner = box.copy()  # where the box lies in the current image: all of it until a CenterCrop pads
    flip = np.zeros(n, dtype=bool)
    resized = np.full((n, 4), -1, np.int64)
    whole = True  # nothing cropped or resized yet: a Resize now resizes the whole image
    refused = np.zeros(n, dtype=bool)

    def crop(left, top, w, h):
        # A crop in the current image's coordinates, which may reach past it into padding: the
        # box keeps the part of it the crop holds (minding a flip already applied: the current
        # image shows the box mirrored), and `inner` is where that part lies in the crop.
        a_x, b_x = np.maximum(inner[:, 0], left), np.minimum(inner[:, 2], left + w)
        a_y, b_y = np.maximum(inner[:, 1], top), np.minimum(inner[:, 3], top + h)
        empty = (b_x <= a_x) | (b_y <= a_y)
        span_x = np.where(empty, 1.0, inner[:, 2] - inner[:, 0])
        span_y = np.where(empty, 1.0, inner[:, 3] - inner[:, 1])
        sx = (box[:, 2] - box[:, 0]) / span_x
        sy = (box[:, 3] - box[:, 1]) / span_y
        lo_x, hi_x = (a_x - inner[:, 0]) * sx, (b_x - inner[:, 0]) * sx
        x0 = np.where(flip, box[:, 2] - hi_x, box[:, 0] + lo_x)
        x1 = np.where(flip, box[:, 2] - lo_x, box[:, 0] + hi_x)
        y0, y1 = box[:, 1] + (a_y - inner[:, 1]) * sy, box[:, 1] + (b_y - inner[:, 1]) * sy
        box[:] = np.where(empty[:, None], box, np.stack([x0, y0, x1, y1], axis=1))
        inner[:] = np.where(empty[:, None], 0.0, np.stack([a_x - left, a_y - top, b_x - left, b_y - top], axis=1))

    def resize(new_w, new_h):  # (multiplied first: an inner edge at the image's stays exactly there)
        inner[:, 0::2] = inner[:, 0::2] * new_w[:, None] / W[:, None]
        inner[:, 1::2] = inner[:, 1::2] * new_h[:, None] / H[:, None]

    for stream, op in enumerate(ops):
        if isinstance(op, RandomResizedCrop):
            resized[:], whole = -1, False  # a crop, then a resize: not a resize, then crops
            left, top, w, h = _rrc(op, uniforms(seed, epoch, indices, stream, 4 * _RRC_ATTEMPTS), W, H)
            crop(left, top, w, h)
            W, H = w, h
            oh, ow = op.size_at(epoch)
            new_w, new_h = np.full(n, ow, np.int64), np.full(n, oh, np.int64)
            resize(new_w, new_h)
            W, H = new_w, new_h
        elif isinstance(op, Resize):
            new_w, new_h = _resize_to(op.size_at(epoch), W, H)
            resized[:, :2] = np.stack([new_w, new_h], axis=1) if whole else -1  # after a crop or a resize: not one step
            whole = False
            resize(new_w, new_h)
            W, H = new_w, new_h
        elif isinstance(op, CenterCrop):
            ch, cw = op.size_at(epoch)
            # torchvision's: a side shorter than the crop is padded, (cw - W) // 2 before it,
            # then the crop's offset is rounded (half to even); a negative offset is the padding.
            pad_x, pad_y = np.where(cw > W, (cw - W) // 2, 0), np.where(ch > H, (ch - H) // 2, 0)
            left = np.rint((np.maximum(W, cw) - cw) / 2.0).astype(np.int64) - pad_x
            top = np.rint((np.maximum(H, ch) - ch) / 2.0).astype(np.int64) - pad_y
            crop(left, top, cw, ch)
            whole = False
            W, H = np.full(n, cw, np.int64), np.full(n, ch, np.int64)
        elif callable(getattr(op, "window", None)):  # a window of its own (`fastdata.run`'s RandomCrop, Pad)
            refused |= op.refuses(W, H)
            left, top, w, h = op.window(uniforms(seed, epoch, indices, stream, 2), W, H)
            crop(left, top, w, h)
            whole = False
            W, H = w, h
        elif isinstance(op, RandomHorizontalFlip):
            flipped = uniforms(seed, epoch, indices, stream, 1)[:, 0] < op.p
            inner[flipped, 0], inner[flipped, 2] = W[flipped] - inner[flipped, 2], W[flipped] - inner[flipped, 0]
            flip ^= flipped
        else:
            raise TypeError(f"{type(op).__name__} is not a geometric op")
    # Boxes with fractions of a pixel reach the decoders as they are: a rounding error in the
    # mapping must not put an edge past the image, which a decoder refuses.
    np.clip(box, 0.0, source, out=box)
    at = resized[:, 0] >= 0  # (the box's mapping is exact but for rounding: its corner is whole pixels)
    resized[at, 2] = np.rint(box[at, 0] * (resized[at, 0] / source[at, 0]))
    resized[at, 3] = np.rint(box[at, 1] * (resized[at, 1] / source[at, 1]))
    pads = [op for op in ops if getattr(op, "mode", "constant") != "constant" or any(getattr(op, "fill", ()))]
    return Geometry(box, flip, np.stack([W, H], axis=1), inner, resized, source[:, :2].astype(np.int64), refused,
                    *((pads[0].mode, pads[0].fill) if pads else ()))


def pad_around(image: np.ndarray, place: tuple[int, int, int, int], mode: str) -> bool:
    """Fills an HWC `image` around the box placed at (x, y, w, h) as NumPy's pad in `mode` (edge,
    reflect, symmetric: the pixels torchvision's pad of a PIL image puts there) fills it; False,
    filling nothing, where a pixel it would copy is not in the box (a window showing a sliver of
    its image, which NumPy reflects more than once)."""
    x, y, w, h = place
    rows, cols = _pad_source(image.shape[0], y, h, mode), _pad_source(image.shape[1], x, w, mode)
    if rows is None or cols is None:
        return False
    # NumPy pads one axis, then the next from the padded rows: the bands above and below the box
    # first, then the columns beside it, full height (their corners from those bands)
    top, bottom, left, right = rows[:y], rows[y + h:], cols[:x], cols[x + w:]
    image[:y, x:x + w], image[y + h:, x:x + w] = image[top, x:x + w], image[bottom, x:x + w]
    image[:, :x], image[:, x + w:] = image[:, left], image[:, right]
    return True


@functools.lru_cache(maxsize=256)
def _pad_source(size: int, start: int, n: int, mode: str) -> np.ndarray | None:
    """Per index of an axis of `size`, the one in [start, start + n) whose pixel pads it in
    `mode`; None where one falls outside. (Read-only: the same array for each window alike.)"""
    at, end = np.arange(size), start + n - 1
    if mode == "edge":
        source = np.clip(at, start, end)
    else:  # (symmetric repeats the edge pixel, reflect does not)
        s = int(mode == "symmetric")
        source = np.where(at < start, 2 * start - s - at, np.where(at > end, 2 * end + s - at, at))
    if not (n > 0 and ((source >= start) & (source <= end)).all()):
        return None
    source.flags.writeable = False
    return source


# Pixel ops draw from their own streams, apart from the geometry's, so adding a ColorJitter
# does not change any crop.
_PIXEL_STREAM = 1 << 20
_AUTO_BINS = 10  # AutoAugment's tables: RandAugment's over 10 bins
_SIGNED = {"ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color", "Contrast", "Sharpness"}


@functools.lru_cache(maxsize=64)
def _magnitudes(name: str, bins: int, table: str) -> tuple[float, ...]:
    """torchvision's TrivialAugmentWide magnitudes for `name`, computed as torchvision computes
    them (float32 `torch.linspace`), so that an op that truncates or compares its magnitude
    (a translation in whole pixels, Solarize's threshold) does what torchvision's does.
    `table`: "v1" (torchvision.transforms) or "v2" (transforms.v2, whose Solarize threshold is
    255 times a float32 fraction)."""
    import torch

    if name in ("ShearX", "ShearY", "Brightness", "Color", "Contrast", "Sharpness"):
        values = torch.linspace(0.0, 0.99, bins)
    elif name in ("TranslateX", "TranslateY"):
        values = torch.linspace(0.0, 32.0, bins)
    elif name == "Rotate":
        values = torch.linspace(0.0, 135.0, bins)
    elif name == "Posterize":
        values = 8 - (torch.arange(bins) / ((bins - 1) / 6)).round().int()
    elif name == "Solarize":
        if table == "v2":
            return tuple(255.0 * float(v) for v in torch.linspace(1.0, 0.0, bins))
        values = torch.linspace(255.0, 0.0, bins)
    else:
        return (0.0,) * bins
    return tuple(float(v) for v in values)


def trivial_magnitude(name: str, bin_: int, bins: int, table: str = "v1") -> float:
    """torchvision's TrivialAugmentWide magnitude for one (op, bin); see `_magnitudes`."""
    return _magnitudes(name, bins, table)[bin_]


@functools.lru_cache(maxsize=256)
def rand_magnitude(name: str, bin_: int, bins: int, table: str, height: int, width: int) -> float:
    """torchvision's RandAugment magnitude for one (op, bin) on an image of that size, computed
    as torchvision computes it (float32 tables; translations 150/331 of the side)."""
    import torch

    if name in ("ShearX", "ShearY"):
        values = torch.linspace(0.0, 0.3, bins)
    elif name in ("TranslateX", "TranslateY"):
        values = torch.linspace(0.0, 150.0 / 331.0 * (width if name == "TranslateX" else height), bins)
    elif name == "Rotate":
        values = torch.linspace(0.0, 30.0, bins)
    elif name in ("Brightness", "Color", "Contrast", "Sharpness"):
        values = torch.linspace(0.0, 0.9, bins)
    elif name == "Posterize":  # (v2 rounds 8 - i / step, v1 subtracts the rounded i / step)
        step = torch.arange(bins) / ((bins - 1) / 4)
        values = (8 - step).round().int() if table == "v2" else 8 - step.round().int()
    elif name == "Solarize":
        return _magnitudes(name, bins, table)[bin_]  # RandAugment's table is TrivialAugmentWide's
    else:
        return 0.0
    return float(values[bin_])


def plan_pixels(ops: Sequence[Op], seed: int, epoch: int, indices: np.ndarray,
                size: tuple[int, int] | None = None, stream: int = _PIXEL_STREAM) -> list[list[dict]]:
    """Per op, per sample: the parameters each engine applies (a dict per sample). `size`: the
    images' (h, w), which RandAugment's and AutoAugment's translations are a fraction of. Op k
    draws from stream `stream + k`; the ops an op holds (`fastdata.run`'s RandomApply) from
    streams of their own, `(stream + k) * 64` on, apart from every other op's."""
    from .ops import AutoAugment, ColorJitter, RandAugment, TrivialAugment

    plans = []
    for k, op in enumerate(ops):
        if isinstance(op, (RandAugment, AutoAugment)):
            if size is None:
                raise ValueError(f"{type(op).__name__}'s plan needs the images' size")
            draws = 2 * op.num_ops if isinstance(op, RandAugment) else 1 + 2 * max(map(len, op.policies))
            u = uniforms(seed, epoch, indices, stream + k, draws)
            plans.append(_plan_rand(op, u, size) if isinstance(op, RandAugment) else _plan_auto(op, u, size))
            continue
        u = uniforms(seed, epoch, indices, stream + k, getattr(op, "draws", 8))  # (`fastdata.run`'s may ask more)
        if isinstance(op, ColorJitter):
            order = np.argsort(u[:, :4], axis=1)
            lerp = lambda r, x: r[0] + (r[1] - r[0]) * x  # noqa: E731
            plans.append([
                {"order": order[i].tolist(), "brightness": lerp(op.brightness, u[i, 4]),
                 "contrast": lerp(op.contrast, u[i, 5]), "saturation": lerp(op.saturation, u[i, 6]),
                 "hue": lerp(op.hue, u[i, 7])}
                for i in range(len(indices))
            ])
        elif isinstance(op, TrivialAugment):
            params = []
            for i in range(len(indices)):
                name = TRIVIAL_OPS[min(int(u[i, 0] * len(TRIVIAL_OPS)), len(TRIVIAL_OPS) - 1)]
                bin_ = min(int(u[i, 1] * op.num_magnitude_bins), op.num_magnitude_bins - 1)
                mag = trivial_magnitude(name, bin_, op.num_magnitude_bins, op.table)
                if name in _SIGNED and u[i, 2] < 0.5:
                    mag = -mag
                params.append({"op": name, "magnitude": mag})
            plans.append(params)
        elif isinstance(getattr(op, "ops", None), tuple):  # ops applied together or not (`fastdata.run`'s)
            if len(op.ops) > 64:
                raise ValueError(f"{type(op).__name__} of {len(op.ops)} ops: at most 64")
            plans.append(op.plan(u, plan_pixels(op.ops, seed, epoch, indices, size, (stream + k) * 64)))
        elif callable(getattr(op, "plan", None)):  # an op that plans itself from its draws (`fastdata.run`'s)
            plans.append(op.plan(u))
        else:
            raise TypeError(f"{type(op).__name__} is not a pixel op")
    return plans


def _plan_rand(op, u: np.ndarray, size: tuple[int, int]) -> list[dict]:
    """RandAugment's parameters per sample: {"ops": [{"op", "magnitude"}, ...]}, `num_ops` of
    them, each op and its sign from two of the sample's uniforms."""
    n_ops = len(TRIVIAL_OPS)
    params = []
    for row in u:
        chosen = []
        for r in range(op.num_ops):
            name = TRIVIAL_OPS[min(int(row[2 * r] * n_ops), n_ops - 1)]
            mag = rand_magnitude(name, op.magnitude, op.num_magnitude_bins, op.table, *size)
            if name in _SIGNED and row[2 * r + 1] < 0.5:
                mag = -mag
            chosen.append({"op": name, "magnitude": mag})
        params.append({"ops": chosen})
    return params


def _plan_auto(op, u: np.ndarray, size: tuple[int, int]) -> list[dict]:
    """AutoAugment's parameters per sample: {"ops": [{"op", "magnitude"}, ...]}, the ops of one
    sub-policy (from the sample's first uniform) that pass their probability, each with its
    sign (two uniforms an op)."""
    policies = op.policies
    params = []
    for row in u:
        chosen = []
        for r, (name, p, bin_) in enumerate(policies[min(int(row[0] * len(policies)), len(policies) - 1)]):
            if row[1 + 2 * r] < p:
                mag = 0.0 if bin_ is None else rand_magnitude(name, bin_, _AUTO_BINS, op.table, *size)
                if name in _SIGNED and row[2 + 2 * r] < 0.5:
                    mag = -mag
                chosen.append({"op": name, "magnitude": mag})
        params.append({"ops": chosen})
    return params
