"""Native JPEG decoding for image pipelines: header reads, and a crop-aware decode + resize.

`decode_crop_resize` decodes only the crop window of each JPEG (DCT-scaled by 1/2, 1/4 or 1/8
when the window is at least that many times the output), resizes it as Pillow's
`Image.resize(size, BILINEAR, box=...)` does and writes it straight into a slot of the batch
buffer, with the GIL released and on several threads. A sample it cannot take (corrupt or
truncated data, CMYK, not a JPEG) comes back as an error message, for the caller to decode with
Pillow or to report; `pillow_crop_resize` is that Pillow path, and the tests' reference.
"""

from __future__ import annotations

import io
import logging
import os
from typing import Any, Sequence

import numpy as np
import torch

logger = logging.getLogger("fastdata")

_ext: Any = None
if os.environ.get("FASTDATA_DISABLE_NATIVE", "0").lower() in ("", "0", "false", "no"):
    try:
        from . import _native as _ext
    except ImportError:  # a source checkout that was never built; _collate already warns
        _ext = None

AVAILABLE: bool = _ext is not None and bool(getattr(_ext, "HAVE_JPEG", False))
"""True when the native decoder is here: the extension is built, with libjpeg-turbo, and
FASTDATA_DISABLE_NATIVE is not set."""


def _require() -> None:
    if not AVAILABLE:
        raise RuntimeError(
            "fastdata's native JPEG decoder is not available (extension not built, built "
            "without libjpeg-turbo, or FASTDATA_DISABLE_NATIVE set); decode with Pillow instead"
        )


def jpeg_info(data: Any) -> tuple[int, int, int]:
    """(width, height, components) of a JPEG, from its header alone (a few microseconds).

    Raises ValueError with libjpeg's message when `data` is not a parseable JPEG."""
    _require()
    return _ext.jpeg_info(data)


def jpeg_info_batch(datas: Sequence[Any]) -> list[tuple[int, int, int] | None]:
    """`jpeg_info` for each of `datas`, None where the header cannot be parsed."""
    _require()
    return _ext.jpeg_info_batch(list(datas))


def _shape(x: Any) -> list[int]:
    return list(getattr(x, "shape", ()))


def decode_crop_resize(
    datas: Sequence[Any], crops: Any, flips: Any, out: Any, threads: int = 1
) -> list[str | None]:
    """For each i: decode the window crops[i] = (x, y, w, h) (original image pixels) of JPEG
    datas[i] as RGB, resize it to out's H x W as Pillow's bilinear `resize` with that box does,
    mirror it left-right where flips[i], and write it into out[i].

    datas: bytes-like objects. crops: int array [N, 4]. flips: bool or uint8 array [N].
    out: uint8 tensor (or array) [N, 3, H, W] with any strides: contiguous, channels_last, or a
    per-sample HWC buffer seen as CHW. Returns, per sample, None or the reason it could not be
    decoded (out[i] is then left untouched): the caller decides whether to fall back to Pillow.
    """
    _require()
    datas = list(datas)
    n = len(datas)
    crops = np.asarray(crops)
    if crops.ndim != 2 or crops.shape != (n, 4):
        raise ValueError(f"crops should have shape [{n}, 4], but got {list(crops.shape)}")
    if not np.issubdtype(crops.dtype, np.integer):
        raise TypeError(f"crops should be an integer array, but got dtype {crops.dtype}")
    if crops.size and (crops.min() < np.iinfo(np.int32).min or crops.max() > np.iinfo(np.int32).max):
        raise ValueError("crops should fit in int32")
    crops = np.ascontiguousarray(crops, dtype=np.int32)
    flips = np.asarray(flips)
    if flips.shape != (n,):
        raise ValueError(f"flips should have shape [{n}], but got {list(flips.shape)}")
    flips = np.ascontiguousarray(flips != 0, dtype=np.uint8)
    if isinstance(out, torch.Tensor):
        if out.dtype != torch.uint8:
            raise TypeError(f"out should have dtype torch.uint8, but got {out.dtype}")
        if out.device.type != "cpu":
            raise ValueError(f"out should be a CPU tensor, but got device {out.device}")
    elif isinstance(out, np.ndarray):
        if out.dtype != np.uint8:
            raise TypeError(f"out should have dtype uint8, but got {out.dtype}")
    else:
        raise TypeError(f"out should be a torch.Tensor or numpy.ndarray, but got {type(out).__name__}")
    shape = _shape(out)
    if len(shape) != 4 or shape[0] != n or shape[1] != 3 or shape[2] < 1 or shape[3] < 1:
        raise ValueError(f"out should have shape [{n}, 3, H, W], but got {shape}")
    return _ext.decode_crop_resize(datas, crops, flips, out, max(1, int(threads)))


def pillow_crop_resize(
    data_bytes: bytes, crop: Sequence[int], flip: bool, size: tuple[int, int]
) -> np.ndarray:
    """The Pillow path `decode_crop_resize` reproduces, for one image: open, convert to RGB,
    resize to `size` = (width, height) (Pillow's order) with BILINEAR and box = the crop
    (x, y, w, h) as (x, y, x + w, y + h), mirror left-right if `flip`. Returns HWC uint8."""
    from PIL import Image  # Pillow is not a dependency of the package, only of this path

    x, y, w, h = (int(v) for v in crop)
    with Image.open(io.BytesIO(data_bytes)) as im:
        img = im.convert("RGB")
    # The enums came with Pillow 9.1 (whose plain constants warn); older Pillow-SIMD has neither.
    resampling = getattr(Image, "Resampling", Image)
    transpose = getattr(Image, "Transpose", Image)
    img = img.resize(tuple(size), resampling.BILINEAR, box=(x, y, x + w, y + h))
    if flip:
        img = img.transpose(transpose.FLIP_LEFT_RIGHT)
    return np.asarray(img, dtype=np.uint8)
