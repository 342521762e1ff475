"""Compiles a pipeline's per-sample geometry into what a decoder applies in one pass.

RandomResizedCrop, Resize, CenterCrop and RandomHorizontalFlip, in any order, fold into one
box in the source image's coordinates, one output size and one flip per sample: the native
decoder then decodes only the box (and at a reduced DCT scale when it is at least twice the
output), and Pillow does it as one `resize(size, box=...)`. Vectorised over the batch. An op
whose size follows a schedule (`schedule.py`) gives the epoch's size; its random draws do not
depend on the size, so the crop boxes are those of a fixed-size pipeline.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ._random import uniforms
from .ops import CenterCrop, Op, RandomHorizontalFlip, RandomResizedCrop, Resize

_RRC_ATTEMPTS = 10  # torchvision's


@dataclass
class Geometry:
    boxes: np.ndarray  # float64 [N, 4]: x0, y0, x1, y1 in source pixels
    flips: np.ndarray  # bool [N]
    sizes: np.ndarray  # int64 [N, 2]: output (w, h)

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
    flip = np.zeros(n, dtype=bool)

    def crop(left, top, w, h):
        # A crop in the current image's coordinates, mapped back to the source box (minding a
        # flip already applied: the current image is the box mirrored).
        sx = (box[:, 2] - box[:, 0]) / W
        sy = (box[:, 3] - box[:, 1]) / H
        left_src = np.where(flip, W - (left + w), left)
        x0 = box[:, 0] + left_src * sx
        y0 = box[:, 1] + top * sy
        box[:, 0], box[:, 1] = x0, y0
        box[:, 2], box[:, 3] = x0 + w * sx, y0 + h * sy

    for stream, op in enumerate(ops):
        if isinstance(op, RandomResizedCrop):
            left, top, w, h = _rrc(op, uniforms(seed, epoch, indices, stream, 4 * _RRC_ATTEMPTS), W, H)
            crop(left, top, w, h)
            oh, ow = op.size_at(epoch)
            H, W = np.full(n, oh, np.int64), np.full(n, ow, np.int64)
        elif isinstance(op, Resize):
            W, H = _resize_to(op.size_at(epoch), W, H)
        elif isinstance(op, CenterCrop):
            ch, cw = op.size_at(epoch)
            # torchvision rounds the offset; a crop larger than the image is clamped to it.
            cw_, ch_ = np.minimum(cw, W), np.minimum(ch, H)
            crop(np.rint((W - cw_) / 2.0).astype(np.int64), np.rint((H - ch_) / 2.0).astype(np.int64), cw_, ch_)
            W, H = np.full(n, cw, np.int64), np.full(n, ch, np.int64)
        elif isinstance(op, RandomHorizontalFlip):
            flip ^= uniforms(seed, epoch, indices, stream, 1)[:, 0] < op.p
        else:
            raise TypeError(f"{type(op).__name__} is not a geometric op")
    # Boxes with fractions of a pixel reach the decoders as they are: a rounding error in the
    # mapping must not put an edge past the image, which a decoder refuses.
    np.clip(box, 0.0, source, out=box)
    return Geometry(box, flip, np.stack([W, H], axis=1))


# Pixel ops draw from their own streams, apart from the geometry's, so adding a ColorJitter
# does not change any crop.
_PIXEL_STREAM = 1 << 20
TRIVIAL_OPS = ("Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color",
               "Contrast", "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize")
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


def plan_pixels(ops: Sequence[Op], seed: int, epoch: int, indices: np.ndarray) -> list[list[dict]]:
    """Per op, per sample: the parameters each engine applies (a dict per sample)."""
    from .ops import ColorJitter, TrivialAugment

    plans = []
    for k, op in enumerate(ops):
        u = uniforms(seed, epoch, indices, _PIXEL_STREAM + k, 8)
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
        else:
            raise TypeError(f"{type(op).__name__} is not a pixel op")
    return plans
