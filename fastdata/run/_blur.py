"""Pillow's GaussianBlur, natively, where a script's op calls it.

MoCo v2's, SimSiam's and DINO's GaussianBlur classes are the script's own ops (`_pixels.ScriptOp`),
called as they are on the PIL image after the geometry: they draw their radius from Python's RNG
and call `img.filter(ImageFilter.GaussianBlur(radius))`; timm's blur ops do the same (`_timm`).
`served` gives such an op an image whose `filter` computes that blur with the extension's
`gaussian_blur` (csrc/blur.cpp: Pillow's BoxBlur.c, value for value) and calls Pillow's own
`Image.filter` for anything else: another filter, a subclass of GaussianBlur (its `filter` may
differ), a mode other than RGB or L, an image one pixel wide or high (where Pillow-SIMD's boxes
read past a line's end), a radius that is not a number, a negative one, a blur along one axis
alone (Pillow-SIMD's red band is 255s there), or a radius that Pillow's sums do not hold. The op,
its draws and what it does with the result are the script's. The native blur is used under stock
Pillow (Pillow-SIMD's own is as fast), and only where it gave this process's Pillow's pixels on
the probe images (`_agrees`, once a process).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from .._ext import native
from .._pillow import pillow_info
from ..transforms.geometry import as_image


def served(img: Any) -> Any:
    """`img` (a PIL image), its `filter` serving GaussianBlur natively under stock Pillow where
    `_agrees`; as it is otherwise. (Pillow-SIMD's own blur is as fast as the native one with
    its conversions, stock Pillow's twice as slow: benchmarks/blur.py.)"""
    if img.mode in ("RGB", "L") and not _simd() and _agrees():
        img.filter = functools.partial(_filter, img)
    return img


@functools.lru_cache(maxsize=None)
def _simd() -> bool:
    return pillow_info()["simd"]


def withdrawn(img: Any) -> None:
    """Takes `served`'s `filter` off `img` (an image the script's op returned as it was given)."""
    vars(img).pop("filter", None)


def _filter(img: Any, f: Any) -> Any:
    from PIL import Image

    out = blurred(img, f)
    return Image.Image.filter(img, f) if out is None else out


def blurred(img: Any, f: Any) -> Any:
    """`img.filter(f)` for an RGB or L image and an ImageFilter.GaussianBlur (its exact class),
    natively, as a new image with `img`'s info; None where that is left to Pillow."""
    from PIL import ImageFilter

    if type(f) is not ImageFilter.GaussianBlur or img.mode not in ("RGB", "L") or min(img.size) < 2:
        return None
    xy = (f.radius, f.radius) if isinstance(f.radius, (int, float)) else f.radius
    numbers = isinstance(xy, (tuple, list)) and len(xy) == 2 and all(isinstance(v, (int, float)) for v in xy)
    if not numbers or min(xy) < 0:  # (a negative radius: whatever Pillow does with it is Pillow's)
        return None
    pixels = np.asarray(img)
    pixels = pixels.reshape(*pixels.shape[:2], -1)
    out = np.empty_like(pixels)
    if not native.gaussian_blur(pixels, out, float(xy[0]), float(xy[1])):
        return None
    result = as_image(out)
    result.info = img.info.copy()  # (as Image.filter's `_new` copies it)
    return result


@functools.lru_cache(maxsize=None)
def _agrees() -> bool:
    """Whether the extension's blur gives this process's Pillow's `Image.filter(GaussianBlur(r))`
    on noise of sizes from 2 x 2 to 41 x 23, RGB and L, through radii under one pixel, fractional
    ones, one past the image's size and a different one each axis."""
    if native is None or not hasattr(native, "gaussian_blur"):
        return False
    from PIL import Image, ImageFilter

    rng = np.random.default_rng(7)
    radii = (0.1, 0.5, 0.93, 1.0, 1.7, 2.0, 3.3, 6.25, 40.0, (0.001, 2.5), (1.2, 0.3))
    for h, w in ((2, 2), (2, 9), (9, 2), (41, 23)):
        noise = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        for img in (Image.fromarray(noise), Image.fromarray(noise[:, :, 1])):
            for r in radii:
                ours = blurred(img, ImageFilter.GaussianBlur(r))
                if ours is None or ours.tobytes() != Image.Image.filter(img, ImageFilter.GaussianBlur(r)).tobytes():
                    return False
    return True
