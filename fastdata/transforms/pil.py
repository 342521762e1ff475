"""The Pillow lowering: one sample's geometry (box, flip, output size) in one resize.

Used for everything the native decoder does not take (PNG, WebP, CMYK JPEGs, a build
without libjpeg). With Pillow-SIMD installed the resize is about 6x faster than stock Pillow.
"""

from __future__ import annotations

import io
import math

import numpy as np


def decode(data: bytes, box: np.ndarray, flip: bool, size: tuple[int, int]) -> np.ndarray:
    """HWC uint8 RGB of `data` cropped to `box` (x0, y0, x1, y1 in source pixels), resized to
    `size` (w, h) with the bilinear filter (antialiased when shrinking), mirrored if `flip`."""
    from PIL import Image

    img = Image.open(io.BytesIO(data))
    x0, y0, x1, y1 = (float(v) for v in box)
    if img.format == "JPEG":
        # A reduced-size DCT decode when the box is at least twice the output: Pillow picks
        # the largest of 1/2, 1/4, 1/8 that keeps the image at least the requested size.
        shrink = min((x1 - x0) / size[0], (y1 - y0) / size[1])
        if shrink >= 2:
            W, H = img.size
            img.draft("RGB", (math.ceil(W / shrink), math.ceil(H / shrink)))
            sx, sy = img.size[0] / W, img.size[1] / H
            x0, x1, y0, y1 = x0 * sx, x1 * sx, y0 * sy, y1 * sy
    img = img.convert("RGB")
    img = img.resize(size, Image.BILINEAR, box=(x0, y0, x1, y1))
    if flip:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    return np.asarray(img)


def size_of(data: bytes) -> tuple[int, int]:
    """(width, height) from the header."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        return img.size
