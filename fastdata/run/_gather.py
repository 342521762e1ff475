"""`fastdata run`: the geometry of an in-memory dataset's batch (`fastdata.run._arrays`), run on
its rows at once: numpy's pad (the one torchvision's PIL pad calls for edge, reflect and
symmetric; its constant pad is Pillow's expand, the same fill), windows cut at per-sample
offsets, flips by mask; a RandomResizedCrop's boxes cut and resized as Pillow resizes them (its
bilinear and bicubic natively on the batch: `_native_resize`; on a tensor, by the op's own
functional on each row), a rotation by Pillow's rotate, an
affine or perspective map by torchvision's own `F.affine` or `F.perspective`, each row as
torchvision calls them on its PIL image; a Resize (which draws nothing) as RandomResizedCrop's
resize on the PIL image, else the script's own on each row's PIL image or tensor.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from .._cores import batch_threads
from .._ext import native
from .._pillow import pillow_info
from ..image.decode import pillow_order, vertical_first
from ..transforms.plan import plan_geometry


class Draws:
    """A batch's random numbers: one seed from this process's torch RNG, drawn at its first use
    (torchvision draws nothing for a crop that cannot move), as the folders' (see NativeFolder)."""

    def __init__(self) -> None:
        self._seed: int | None = None
        self._rng: np.random.Generator | None = None

    @property
    def seed(self) -> int:
        if self._seed is None:
            self._seed = int(torch.randint(0, 2**62, (), dtype=torch.int64))
        return self._seed

    def taken(self) -> int:
        """The seed if it was drawn, else 0 (without drawing it)."""
        return 0 if self._seed is None else self._seed

    def rng(self) -> np.random.Generator:
        if self._rng is None:
            self._rng = np.random.default_rng(self.seed)
        return self._rng


def gather(images: np.ndarray, geometry: tuple, draws: Draws) -> np.ndarray:
    """`images` (uint8 NHWC, a batch's rows, which it may write) through `geometry`, each op on
    all rows at once; raises ValueError where torchvision raises (a crop larger than the padded
    image; a reflect or symmetric pad of a tensor past its size, which torch refuses): the
    script's own fetch then raises it."""
    x = images
    for op in geometry:
        n, height, width = x.shape[:3]
        if op[0] == "pad":
            left, top, right, bottom = op[1]
            if op[5] is not None:  # RandomCrop's pad_if_needed: both sides by the shortfall after the padding
                dh, dw = max(op[5][0] - height - top - bottom, 0), max(op[5][1] - width - left - right, 0)
                left, top, right, bottom = left + dw, top + dh, right + dw, bottom + dh
            x = _pad(x, (left, top, right, bottom), op[2], op[3], op[4])
        elif op[0] == "crop":
            h, w = op[1]
            if height < h or width < w:
                raise ValueError(f"crop {h}x{w} larger than the image, {height}x{width}")
            if (height, width) != (h, w):
                rng = draws.rng()
                top = rng.integers(0, height - h + 1, n)
                left = rng.integers(0, width - w + 1, n)
                windows = np.lib.stride_tricks.sliding_window_view(x, (h, w), axis=(1, 2))  # [n, i, j, c, h, w]
                x = windows[np.arange(n), top, left].transpose(0, 2, 3, 1)
        elif op[0] == "center":
            h, w = op[1]
            if h > height or w > width:  # torchvision pads it with zeros first, the odd pixel after
                dh, dw = max(h - height, 0), max(w - width, 0)
                x = _pad(x, (dw // 2, dh // 2, (dw + 1) // 2, (dh + 1) // 2), 0, "constant", False)
                height, width = x.shape[1:3]
            top, left = int(round((height - h) / 2.0)), int(round((width - w) / 2.0))
            x = x[:, top:top + h, left:left + w]
        elif op[0] == "resized":  # each row's box cut, then resized: torchvision's F.resized_crop
            crop, resample, on_tensor = op[1], op[2], op[3]
            h, w = crop.size
            # its boxes drawn as the folders' (torchvision's get_params), from a seed of the batch's generator
            boxes = plan_geometry((crop,), int(draws.rng().integers(0, 2**62)), 0, np.arange(n), np.full(n, width),
                                  np.full(n, height)).boxes.astype(np.int64)
            out = _native_resize(x, boxes, resample, lambda: _box_resized(x[0], boxes[0], (w, h), resample)) \
                if n and on_tensor is None else None
            if on_tensor is not None:  # the op's own functional on each row's CHW view, as PILToTensor makes it
                out = np.empty((n, h, w, x.shape[3]), np.uint8)
                for k, (x0, y0, x1, y1) in enumerate(boxes.tolist()):
                    row = torch.from_numpy(np.ascontiguousarray(x[k])).permute(2, 0, 1)
                    out[k] = on_tensor(row, y0, x0, y1 - y0, x1 - x0).permute(1, 2, 0).numpy()
            elif out is None:
                out = np.empty((n, h, w, x.shape[3]), np.uint8)
                for k in range(n):
                    out[k] = _box_resized(x[k], boxes[k], (w, h), resample)
            x = out
        elif op[0] == "resize":  # the script's own Resize on each row, as its PIL image or uint8 CHW tensor
            out = None
            if n and not op[2] and op[3] is not None:  # (on the PIL image, Pillow's bilinear or bicubic)
                whole = np.tile(np.array([0, 0, width, height], np.int64), (n, 1))
                out = _native_resize(x, whole, op[3], lambda: _each(x[:1], op[1], False)[0])
            x = _each(x, op[1], op[2]) if out is None else out
        elif op[0] == "rotate":  # each row as torchvision transforms the PIL image (F.rotate's, F.affine's call)
            from PIL import Image  # (here, not at import: `fastdata run` serves scripts without Pillow)

            rotate = op[1]
            x = np.array(x)
            one = x.shape[3] == 1
            for k, p in enumerate(rotate.plan(draws.rng().random((n, getattr(rotate, "draws", 6))))):
                img = x[k] if getattr(rotate, "arrays", False) else Image.fromarray(x[k, :, :, 0] if one else x[k])
                x[k] = np.asarray(rotate.on_pillow(img, p)).reshape(x[k].shape)
        else:  # flip
            flipped = draws.rng().random(n) < op[2]
            if flipped.any():
                x = x if x.flags.writeable else np.array(x)  # (a window cut is a read-only view of the rows)
                if x.shape[3] == 1:
                    x[flipped] = np.flip(x[flipped], op[1])
                else:  # torch's flip of a row: numpy's copies 3-byte pixels a byte at a time, 6x slower
                    rows = torch.from_numpy(x)
                    for k in np.flatnonzero(flipped).tolist():
                        rows[k] = rows[k].flip(op[1] - 1)
    return x


def _box_resized(row: np.ndarray, box: np.ndarray, size: tuple[int, int], resample: int) -> np.ndarray:
    """The box (x0, y0, x1, y1) of `row` (HWC) cut, then resized by Pillow to size (w, h)."""
    x0, y0, x1, y1 = box.tolist()
    window = np.ascontiguousarray(row[y0:y1, x0:x1])
    return np.asarray(_pil(window).resize(size, resample)).reshape(size[1], size[0], row.shape[2])


def _pil(row: np.ndarray):
    """The PIL image torchvision's `__getitem__` makes of an HWC row: L for one channel, else RGB."""
    from PIL import Image  # (here, not at import: `fastdata run` serves scripts without Pillow)

    return Image.fromarray(row[:, :, 0] if row.shape[2] == 1 else row)


def _native_resize(x: np.ndarray, boxes: np.ndarray, resample: int,
                   first: Callable[[], np.ndarray]) -> np.ndarray | None:
    """Each row's box (x0, y0, x1, y1) cut, then resized as the installed Pillow's resize with
    `resample` (2, bilinear, or 3, bicubic) does, by the extension's `resize_images`
    (csrc/resample.h: Pillow's taps, weights and order of passes, on the batch's threads), to the
    size of `first()`, Pillow's own of the first row; None where the extension is not built or
    cannot follow this Pillow (`pillow_order`), or where its first row is not Pillow's (a Pillow
    whose arithmetic it does not know: the batch, and this process's later ones, are then Pillow's)."""
    global _NATIVE_EXACT
    order = pillow_order() if native is not None and _NATIVE_EXACT and resample in (2, 3) else "other"
    if order == "other":
        return None
    want = first()
    if max(*want.shape[:2], *x.shape[1:3]) >= 1 << 28:  # (past what `resize_images` takes)
        return None
    out = np.empty((len(x), *want.shape), np.uint8)
    size = (want.shape[1], want.shape[0])
    vertical = vertical_first(boxes, size).astype(np.uint8) if order == "rule" else None
    native.resize_images(np.ascontiguousarray(x), out, boxes, "bilinear" if resample == 2 else "bicubic", vertical,
                         "pillow-simd" if pillow_info()["simd"] else "pillow", batch_threads())
    _NATIVE_EXACT = bool(np.array_equal(out[0], want))
    return out if _NATIVE_EXACT else None


_NATIVE_EXACT = True  # (until a batch's first row says otherwise: `_native_resize`)


def _each(x: np.ndarray, transform, tensor: bool) -> np.ndarray:
    """Each row of `x` through `transform` (one that draws nothing, the same output size for
    each input size), given as torchvision's `__getitem__` gives it: the PIL image of the row (an
    L image for one channel) or, on a tensor, the CHW view PILToTensor makes of it."""
    out = None
    for k in range(len(x)):
        row = np.ascontiguousarray(x[k])
        if tensor:
            made = transform(torch.from_numpy(row).permute(2, 0, 1)).permute(1, 2, 0).numpy()
        else:
            made = np.asarray(transform(_pil(row)))
        if out is None:
            out = np.empty((len(x), made.shape[0], made.shape[1], row.shape[2]), np.uint8)
        out[k] = made.reshape(out.shape[1:])
    return x if out is None else out


def _pad(x: np.ndarray, ltrb: tuple, fill: int, mode: str, tensor: bool) -> np.ndarray:
    """numpy's pad, torchvision's for a PIL image in every mode (its constant one, Pillow's
    expand, gives the same fill); on a tensor, torch's reflect takes pads below the size only,
    and torchvision's symmetric one pads up to the size."""
    left, top, right, bottom = ltrb
    height, width = x.shape[1:3]
    if tensor and mode in ("reflect", "symmetric"):
        most = (height - 1, width - 1) if mode == "reflect" else (height, width)
        if max(top, bottom) > most[0] or max(left, right) > most[1]:
            raise ValueError(f"a {mode} padding of {ltrb} on a {height}x{width} tensor")
    widths = ((0, 0), (top, bottom), (left, right), (0, 0))
    return np.pad(x, widths, constant_values=fill) if mode == "constant" else np.pad(x, widths, mode)
