"""`fastdata run`: the geometry of an in-memory dataset's batch (`fastdata.run._arrays`), run on
its rows at once: numpy's pad (the one torchvision's PIL pad calls for edge, reflect and
symmetric; its constant pad is Pillow's expand, the same fill), windows cut at per-sample
offsets, flips by mask; a RandomResizedCrop's boxes cut and resized by Pillow, a rotation by
Pillow's rotate, an affine or perspective map by torchvision's own `F.affine` or `F.perspective`,
each row as torchvision calls them on its PIL image.
"""

from __future__ import annotations

import numpy as np
import torch

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
        elif op[0] == "resized":  # each row's box cut, then Pillow's resize of it: torchvision's F.resized_crop
            from PIL import Image

            crop, resample = op[1], op[2]
            h, w = crop.size
            # its boxes drawn as the folders' (torchvision's get_params), from a seed of the batch's generator
            boxes = plan_geometry((crop,), int(draws.rng().integers(0, 2**62)), 0, np.arange(n), np.full(n, width),
                                  np.full(n, height)).boxes.astype(np.int64)
            out = np.empty((n, h, w, x.shape[3]), np.uint8)
            for k, (x0, y0, x1, y1) in enumerate(boxes.tolist()):
                window = np.ascontiguousarray(x[k, y0:y1, x0:x1])
                img = Image.fromarray(window[:, :, 0] if window.shape[2] == 1 else window)
                out[k] = np.asarray(img.resize((w, h), resample)).reshape(out[k].shape)
            x = out
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
                x = np.array(x)
                x[flipped] = np.flip(x[flipped], op[1])
    return x


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
