"""Native JPEG decoding for image pipelines: header reads, and a crop-aware decode + resize.

`decode_crop_resize` decodes only the crop window of each JPEG (DCT-scaled by 1/2, 1/4 or 1/8
when the window is at least that many times the output), resizes it as Pillow's
`Image.resize(size, BILINEAR, box=...)` does and writes it straight into a slot of the batch
buffer, with the GIL released and on several threads; a baseline JPEG's rows below the window
are entropy-decoded too (corrupt data anywhere is an error whatever the crop), unless the caller
has seen the file decode whole before (`whole`). A sample it cannot take (corrupt or
truncated data, CMYK, not a JPEG) comes back as an error message, for the caller to decode with
Pillow or to report; `pillow_crop_resize` is that Pillow path, and the tests' reference.

The walk each file gets before any decode, and the bounds on a file's work: `_structure`.
"""

from __future__ import annotations

import os
import socket
from typing import Any, Sequence

import numpy as np
import torch

from ._ext import native as _ext
from ._pillow import open_image

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
    datas: Sequence[Any], crops: Any, flips: Any, out: Any, threads: int = 1, whole: Any = None,
    index: bool = True, resample: Any = "bilinear", crop_first: bool = False, vertical_first: Any = None,
    resized: Any = None, weights: str = "pillow",
) -> list[str | None]:
    """For each i: decode the window crops[i] = (x, y, w, h) (original image pixels, fractions
    of one allowed) of JPEG datas[i] as RGB, resize it to out's H x W as Pillow's `resize` with
    the box (x, y, x + w, y + h) and the `resample` filter ("bilinear" or "bicubic", or a
    sequence or array [N] of them, one a sample) does, mirror it left-right where flips[i],
    and write it into out[i]. With `crop_first`, the window is cut out before the resize, as
    torchvision crops then resizes: the filter reads no
    pixel outside it (for a window of whole pixels decoded at full scale, Pillow's resize of the
    crop exactly), where Pillow's resize(box=) reads the pixels around the box too. Pillow's
    two passes (each rounded and clipped to 0..255) go horizontal, then vertical; where
    vertical_first[i] (None, or a bool or uint8 array [N]) the vertical pass comes first, as
    Pillow 13 orders them for some sizes (`image.decode.pillow_order`). Where resized[i] (None, or
    an int array [N, 2]) is a size (w, h), both > 0, torchvision's Resize, then a crop: the whole
    image is resized to it (at full scale, the filter reading the pixels around the window) and
    crops[i] must be the window (x, y, W, H) of out's size, in whole pixels of that resize; only
    the window's pixels are computed. Rows of -1 take the crop as above.

    weights: the fixed-point filter weights, "pillow" (classic Pillow's, 22 fraction bits) or
    "pillow-simd" (Pillow-SIMD's: 16-bit, at the most fraction bits that keep each pass's largest
    weight under 2^15; a window of a whole resize computes that pass's weights whole).

    datas: bytes-like objects. crops: int or float array [N, 4]. flips: bool or uint8 array [N].
    out: uint8 tensor (or array) [N, 3, H, W] with any strides: contiguous, channels_last, or a
    per-sample HWC buffer seen as CHW. Returns, per sample, None or the reason it could not be
    decoded (out[i] is then left untouched): the caller decides whether to fall back to Pillow.
    Whether a file decodes does not depend on its crop: its structure is walked to the end
    (`check_structure`), and a baseline JPEG's rows below the window are entropy-decoded (not
    transformed), so corrupt data anywhere is an error (libjpeg's warnings are errors here).

    whole: None (every sample decoded whole, as above) or a bool or uint8 array [N], which
    counts with index=False only: where whole[i] is false the decode stops at the window's last
    row, so corrupt data below the window goes unseen. For a file already seen to decode whole
    without error: the same pixels, without the rows below. A progressive JPEG is read whole
    either way.

    Each decode reads a private copy of its bytes: a buffer rewritten by another thread while
    the GIL is released changes that decode at most.

    index: a baseline JPEG's Huffman decoding by fastdata's own decoder (csrc/entropy.cpp),
    which keeps checkpoints of the bytes it decodes in the machine's checkpoint index
    (`open_index`; at most 64 a file, 8 bytes each), found by a keyed hash of the bytes (SipHash,
    so no file can take another's): a later decode of the same bytes, in any process, decodes
    from the checkpoint before each window row, with the same pixels as libjpeg's decoder
    (index=False) and its errors, a little stricter (a bad Huffman code is always one;
    csrc/entropy.h). Bytes the index has are not decoded whole again; any others are, whatever
    `whole` says (bytes it cannot index included): a record of files by name or size could not
    tell a file from another written in its place at the same size.
    """
    _require()
    datas = list(datas)
    n = len(datas)
    crops = np.asarray(crops)
    if crops.ndim != 2 or crops.shape != (n, 4):
        raise ValueError(f"crops should have shape [{n}, 4], but got {list(crops.shape)}")
    if not (np.issubdtype(crops.dtype, np.integer) or np.issubdtype(crops.dtype, np.floating)):
        raise TypeError(f"crops should be an int or float array, but got dtype {crops.dtype}")
    if crops.size and not (np.isfinite(crops).all() and np.abs(crops).max() < 2 ** 31):
        raise ValueError("crops should be finite and fit in int32")
    crops = np.ascontiguousarray(crops, dtype=np.float64)
    flips = np.asarray(flips)
    if flips.shape != (n,):
        raise ValueError(f"flips should have shape [{n}], but got {list(flips.shape)}")
    flips = np.ascontiguousarray(flips != 0, dtype=np.uint8)
    if whole is not None:
        whole = np.asarray(whole)
        if whole.shape != (n,):
            raise ValueError(f"whole should have shape [{n}], but got {list(whole.shape)}")
        whole = np.ascontiguousarray(whole != 0, dtype=np.uint8)
    if vertical_first is not None:
        vertical_first = np.asarray(vertical_first)
        if vertical_first.shape != (n,):
            raise ValueError(f"vertical_first should have shape [{n}], but got {list(vertical_first.shape)}")
        vertical_first = np.ascontiguousarray(vertical_first != 0, dtype=np.uint8)
    if resized is not None:
        resized = np.asarray(resized)
        if resized.shape != (n, 2) or not np.issubdtype(resized.dtype, np.integer):
            raise ValueError(f"resized should be an int array of shape [{n}, 2], but got {resized.dtype} "
                             f"{list(resized.shape)}")
        resized = np.ascontiguousarray(np.clip(resized, -1, 2 ** 31 - 1), dtype=np.int64)
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
    bicubic = None
    if not isinstance(resample, str):  # one a sample: bicubic where named so, else bilinear
        filters = np.asarray(resample, dtype=object)
        if filters.shape != (n,):
            raise ValueError(f"resample should be a filter or have shape [{n}], but got {list(filters.shape)}")
        odd = [f for f in filters.tolist() if f not in ("bilinear", "bicubic")]
        if odd:
            raise ValueError(f"resample should be 'bilinear' or 'bicubic', but got {odd[0]!r}")
        bicubic = np.ascontiguousarray(filters == "bicubic", dtype=np.uint8)
        resample = "bilinear"
    if resample not in ("bilinear", "bicubic"):
        raise ValueError(f"resample should be 'bilinear' or 'bicubic', but got {resample!r}")
    if weights not in ("pillow", "pillow-simd"):
        raise ValueError(f"weights should be 'pillow' or 'pillow-simd', but got {weights!r}")
    return _ext.decode_crop_resize(datas, crops, flips, out, max(1, int(threads)), whole, bool(index), resample,
                                   bool(crop_first), vertical_first, bicubic, resized, weights)


INDEX_SLOTS = 1 << 21
"""The checkpoint index's slots: it takes files up to 3/4 of them, 1.57 million (ImageNet's
1.28 million training images fill 61%), and an index past 2/3 is replaced by a new one when a
job opens it."""
INDEX_ARENA = 960 << 20
"""Bytes of the index's records: 48 a file and 8 a checkpoint (a 500x375 photo: 48 of them,
432 bytes). With the slots (16 bytes each) and its header, the index file is 992 MiB, sparse:
only what is written takes disk and memory."""
INDEX_CHECKPOINTS = 64
"""The most checkpoints a file keeps: spread over its MCU rows (csrc/entropy.cpp's Grid)."""


def index_path() -> str:
    """Where the machine's checkpoint index lives: $FASTDATA_CACHE (default ~/.cache/fastdata)
    /jpeg-index/<host>-v1.idx. Named for the host, so that a home directory shared over the
    network gives each machine its own (a memory-mapped file is shared only on one machine).
    "" where there is no cache folder (no $FASTDATA_CACHE and no home directory): `open_index`
    then keeps the index in this process's memory, as where the cache is not writable."""
    from .tunecache import cache_root  # the tuned configs' cache, one root for both

    root = cache_root()
    if root is None:
        return ""
    return str(root / "jpeg-index" / f"{socket.gethostname() or 'host'}-v1.idx")


_opened: str | None = None


def open_index(path: str | None = None) -> str | None:
    """Makes the checkpoint index at `path` (default `index_path()`) this process's, creating it
    (mode 0600, in a directory of mode 0700) if needed; the loaders call it before their workers
    start, and each worker after it starts. Returns None, or why the file could not be used:
    then an index in this process's memory, which the workers it forks share, serves instead
    (an unwritable cache, a file another user owns or others may write, a filesystem without
    fallocate). A nearly full file, or one of another format, is replaced by a new one. A
    no-op for the index already open; without the native decoder, nothing."""
    global _opened
    if not AVAILABLE:
        return None
    path = index_path() if path is None else os.fspath(path)
    if path == _opened:
        return None
    try:
        os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
    except OSError:
        pass  # open_index below says why the file cannot be made
    why = _ext.open_index(path, INDEX_SLOTS, INDEX_ARENA, INDEX_CHECKPOINTS)
    _opened = path
    return why or None


def index_stats() -> dict:
    """The checkpoint index in use: its file ("" when in memory), the files it holds, the bytes
    of records used and available, its slots and the most checkpoints a file."""
    _require()
    return dict(_ext.index_stats())


def pillow_crop_resize(
    data_bytes: bytes, crop: Sequence[float], flip: bool, size: tuple[int, int], resample: str = "bilinear"
) -> np.ndarray:
    """The Pillow path `decode_crop_resize` reproduces, for one image: open, convert to RGB,
    resize to `size` = (width, height) (Pillow's order) with the `resample` filter
    ("bilinear" or "bicubic") and box = the crop (x, y, w, h) as (x, y, x + w, y + h), mirror
    left-right if `flip`. Returns HWC uint8."""
    from PIL import Image  # Pillow is not a dependency of the package, only of this path

    x, y, w, h = (float(v) for v in crop)
    with open_image(data_bytes) as im:
        img = im.convert("RGB")
    # The enums came with Pillow 9.1 (whose plain constants warn); older Pillow-SIMD has neither.
    resampling = getattr(Image, "Resampling", Image)
    transpose = getattr(Image, "Transpose", Image)
    img = img.resize(tuple(size), getattr(resampling, resample.upper()), box=(x, y, x + w, y + h))
    if flip:
        img = img.transpose(transpose.FLIP_LEFT_RIGHT)
    return np.asarray(img, dtype=np.uint8)
