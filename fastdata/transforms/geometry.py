"""Pillow's affine transform (Image.transform(size, AFFINE, ...), and Image.rotate through it) of
an HWC uint8 array or a PIL image, as torchvision's PIL functional calls it (the auto-augments'
shears, translations and rotations, RandomRotation, RandomAffine): natively on an RGB or L
image's pixels where the extension gives this Pillow's (csrc/geometry.cpp, checked once a
process), else Pillow's own call.
"""

from __future__ import annotations

import math

import numpy as np

from .._ext import native


def bands(img) -> int:
    """An HWC (or HW) uint8 array's channels, or a PIL image's: 3 for RGB, 1 for L, else 0 (what
    the native ops do not take)."""
    if hasattr(img, "getbands"):
        return {"RGB": 3, "L": 1}.get(img.mode, 0)
    shape = getattr(img, "shape", ())
    ok = getattr(img, "dtype", None) == np.uint8 and (len(shape) == 2 or (len(shape) == 3 and shape[2] in (1, 3)))
    return (1 if len(shape) == 2 else shape[2]) if ok else 0


_AFFINE_PROBES = ((1, 0.3, 0, 0, 1, 0), (1, 0, 0, -0.25, 1, 0), (1, 0, -7, 0, 1, 5), (1.1, 0.2, -3.5, -0.15, 0.9, 4.25),
                  (1, 0.01, 0, 0, 1000, -50480))  # (the last: nearest's doubles, past 16.16's range)
_NATIVE_AFFINE: bool | None = None


def _native_affine() -> bool:
    """Whether the extension's `affine` (csrc/geometry.cpp: Pillow's Geometry.c arithmetic) gives
    this process's Pillow's Image.transform(AFFINE): checked once on 96 x 96 noise, RGB and L,
    each filter, through shears, a translation, a rotation, a map of every coefficient and one
    past the fixed-point range (tests/unit/test_geometry.py checks more)."""
    global _NATIVE_AFFINE
    if _NATIVE_AFFINE is None:
        _NATIVE_AFFINE = False
        if native is not None and hasattr(native, "affine"):
            from PIL import Image

            rgb = np.random.default_rng(0).integers(0, 256, (96, 96, 3), dtype=np.uint8)
            same = True
            for pixels in (rgb, rgb[..., 1:2].copy()):
                img = Image.fromarray(pixels if pixels.shape[2] == 3 else pixels[..., 0])
                fill = [5, 6, 7][:pixels.shape[2]]
                for data in _AFFINE_PROBES + (rotate_data(23.5, 96, 96),):
                    for resample in (0, 2, 3):
                        ours = np.empty_like(pixels)
                        native.affine(pixels, ours, data, resample, fill)
                        colour = tuple(fill) if len(fill) == 3 else fill[0]
                        want = np.asarray(img.transform(img.size, Image.AFFINE, data, resample, fillcolor=colour))
                        same = same and np.array_equal(ours.reshape(want.shape), want)
            _NATIVE_AFFINE = bool(same)
    return _NATIVE_AFFINE


def affine(img, data: tuple, resample: int, fill):
    """Pillow's img.transform(img.size, AFFINE, data, resample, fillcolor=fill) (resample: Pillow's
    0 nearest, 2 bilinear, 3 bicubic; `fill` an int for every channel, or a colour, a value a
    channel) of an HWC uint8 array or a PIL image: natively on an RGB or L image's pixels where
    `_native_affine`, in the form given (but a PIL image's nearest, which Pillow maps faster than
    the image's two conversions take); else Pillow's, a PIL image (its error for another filter)."""
    from PIL import Image

    channels = bands(img)
    fills = list(fill) if isinstance(fill, (tuple, list)) else [fill] * channels
    native_fill = len(fills) == channels and all(type(v) is int and 0 <= v <= 255 for v in fills)
    if (channels and native_fill and resample in (0, 2, 3) and _native_affine()
            and not (resample == 0 and hasattr(img, "getbands"))):
        pixels = np.ascontiguousarray(np.asarray(img))
        src = pixels.reshape(pixels.shape[0], pixels.shape[1], channels)
        out = np.empty_like(src)
        native.affine(src, out, tuple(float(v) for v in data), int(resample), fills)
        return Image.fromarray(out.reshape(pixels.shape)) if hasattr(img, "getbands") else out.reshape(pixels.shape)
    img = as_image(img)
    colour = tuple(fill) if isinstance(fill, (tuple, list)) else fill if len(img.getbands()) == 1 else \
        (fill,) * len(img.getbands())
    return img.transform(img.size, Image.AFFINE, data, resample, fillcolor=colour)


def rotate_data(angle: float, w: int, h: int, center: tuple | None = None) -> tuple:
    """The AFFINE data Pillow's Image.rotate(angle, center=center) computes for a w x h image
    (counter-clockwise about the centre, or `center`; the angle taken modulo 360, the matrix
    rounded to 15 decimals)."""
    t = -math.radians(angle % 360.0)
    m = [round(math.cos(t), 15), round(math.sin(t), 15), 0.0, round(-math.sin(t), 15), round(math.cos(t), 15), 0.0]
    cx, cy = (w / 2.0, h / 2.0) if center is None else center
    m[2] = m[0] * -cx + m[1] * -cy + 0.0 + cx
    m[5] = m[3] * -cx + m[4] * -cy + 0.0 + cy
    return tuple(m)


def rotate(img, angle: float, resample: int, center: tuple | None, fill):
    """Pillow's img.rotate(angle, resample, expand=False, center=center, fillcolor=fill) (`fill`
    as `affine`'s) of an HWC uint8 array or a PIL image, in `affine`'s forms: Pillow's exact
    turns where it takes them (about the middle: 0 and 180 degrees, and 90 and 270 on a square
    image, whatever the filter), else its affine map."""
    angle = angle % 360.0
    w, h = img.size if hasattr(img, "getbands") else (img.shape[1], img.shape[0])
    if center is None and (angle in (0.0, 180.0) or (angle in (90.0, 270.0) and w == h)):
        if hasattr(img, "getbands"):
            return img.rotate(angle, resample)
        return np.array(np.rot90(img, int(angle // 90)))  # (counter-clockwise, as Pillow's; a copy, as its)
    return affine(img, rotate_data(angle, w, h, center), resample, fill)


def as_image(img):
    """An HWC (or HW) uint8 array as a PIL image (one channel: L); a PIL image as it is."""
    from PIL import Image

    if isinstance(img, np.ndarray):
        return Image.fromarray(img[:, :, 0] if img.ndim == 3 and img.shape[2] == 1 else img)
    return img
