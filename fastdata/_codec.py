"""Native JPEG decoding for image pipelines: header reads, and a crop-aware decode + resize.

`decode_crop_resize` decodes only the crop window of each JPEG (DCT-scaled by 1/2, 1/4 or 1/8
when the window is at least that many times the output), resizes it as Pillow's
`Image.resize(size, BILINEAR, box=...)` does and writes it straight into a slot of the batch
buffer, with the GIL released and on several threads; a baseline JPEG's rows below the window
are entropy-decoded too (corrupt data anywhere is an error whatever the crop), unless the caller
has seen the file decode whole before (`whole`). A sample it cannot take (corrupt or
truncated data, CMYK, not a JPEG) comes back as an error message, for the caller to decode with
Pillow or to report; `pillow_crop_resize` is that Pillow path, and the tests' reference.

`inspect_batch` is what the loaders run on every sample before any decode, on every backend:
whether the file is a whole JPEG or PNG (`check_structure`: the container walked from its
signature to its end marker, lengths and markers only, so a file cut short is refused the same
way whatever crop the epoch draws) and the size its header claims, which the loaders hold to
`MAX_IMAGE_PIXELS` before anything allocates. Native when the extension is built, else the same
walk in Python (same results, same messages).
"""

from __future__ import annotations

import os
import socket
from typing import Any, NamedTuple, Sequence

import numpy as np
import torch

from ._ext import native as _ext
from ._pillow import open_image

AVAILABLE: bool = _ext is not None and bool(getattr(_ext, "HAVE_JPEG", False))
"""True when the native decoder is here: the extension is built, with libjpeg-turbo, and
FASTDATA_DISABLE_NATIVE is not set."""

MAX_IMAGE_PIXELS: int = 89_478_485
"""The most pixels (width x height, as the header claims) an image may have: larger ones are
refused before any decode, as decompression bombs, on every backend. Pillow's own
`Image.MAX_IMAGE_PIXELS` (where it warns; it refuses at twice that); the native decoder has the
same limit (`_native.MAX_PIXELS`)."""

MAX_SCANS: int = 100
"""The most scans a JPEG may have: `check_structure` refuses more, on every backend, before any
decode. Each scan of a progressive JPEG is a pass over every block of the image however few bytes
it takes, so a file of many tiny scans would cost seconds a decode; libjpeg's progressive script
writes 10 (6 for grayscale). The native decoder's limit is the same (`_native.MAX_SCANS`)."""

MAX_PNG_CHUNKS: int = 1 << 17
MAX_PNG_TEXTS: int = 64
"""The most chunks, and compressed text chunks (zTXt, iTXt), a PNG may have, refused above as
MAX_SCANS is: Pillow reads each chunk in Python and keeps every private one (about 5 us and 100
bytes a chunk however empty; encoders write the image data in chunks of 8 KiB or more: 32,768 at
the 256 MiB read limit), and inflates each text chunk up to 1 MiB, not always against its text
limit (3,000 cost 7 s a decode from 3 MB). The native walk's are the same (`_native.MAX_PNG_*`)."""

MAX_JPEG_MARKERS: int = 1 << 12
MAX_JPEG_FILL: int = 1 << 16
"""The most markers (restart markers too) and fill bytes before markers a JPEG may have, refused
above as MAX_SCANS is: Pillow's parser (the CMYK path) reads each in Python, about 1 us a byte;
writers make a few dozen markers. The native walk's are the same (`_native.MAX_JPEG_MARKERS`)."""


class Inspection(NamedTuple):
    """What `inspect_batch` found for one file."""

    cause: str | None  # why it is not a whole image, or None
    kind: str  # "jpeg", "png", or "" for any other format (not walked: Pillow decides)
    width: int  # from the JPEG frame header or PNG IHDR; 0 for other formats
    height: int


_KINDS = ("", "jpeg", "png")
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _jpeg_ends_early(n: int) -> str:
    return f"truncated JPEG: no end-of-image marker (the file ends after {n} bytes)"


def _walk_jpeg(d: bytes) -> tuple[str | None, int, int]:
    # csrc/structure.cpp's walk_jpeg, line for line (its comments say why).
    n = len(d)
    pos, frame, scan, scans, width, height, markers, fill = 2, False, False, 0, 0, 0, 0, 0
    while True:
        if pos >= n:
            return _jpeg_ends_early(n), width, height
        if d[pos] != 0xFF:
            return f"corrupt JPEG: no marker at byte {pos} (0x{d[pos]:02x})", width, height
        at = pos
        while pos < n and d[pos] == 0xFF:
            pos += 1
        if pos >= n:
            return _jpeg_ends_early(n), width, height
        fill, markers = fill + pos - at - 1, markers + 1
        if fill > MAX_JPEG_FILL or markers > MAX_JPEG_MARKERS:
            what = (f"{MAX_JPEG_FILL} fill bytes before markers (the marker at byte {at} passes them)" if fill >
                    MAX_JPEG_FILL else f"{MAX_JPEG_MARKERS} markers (the marker at byte {at} is one too many)")
            return f"corrupt JPEG: more than {what}", width, height
        m = d[pos]
        pos += 1
        if m == 0xD9:
            if not scan:
                return f"corrupt JPEG: end-of-image marker at byte {at} before any scan", width, height
            return None, width, height
        if 0xD0 <= m <= 0xD7 or m == 0x01:
            continue
        if m in (0x00, 0xD8):
            return f"corrupt JPEG: unexpected marker 0xFF{m:02X} at byte {at}", width, height
        if n - pos < 2:
            return _jpeg_ends_early(n), width, height
        length = d[pos] << 8 | d[pos + 1]
        if length < 2:
            return f"corrupt JPEG: the 0xFF{m:02X} segment at byte {at} has length {length}", width, height
        if length > n - pos:
            return (f"truncated JPEG: the 0xFF{m:02X} segment at byte {at} runs past the end of the file "
                    f"({n} bytes)"), width, height
        if 0xC0 <= m <= 0xCF and m not in (0xC4, 0xC8, 0xCC) and not frame:
            if length < 8:
                return f"corrupt JPEG: the frame header at byte {at} has length {length}", width, height
            height = d[pos + 3] << 8 | d[pos + 4]
            width = d[pos + 5] << 8 | d[pos + 6]
            if width == 0 or height == 0:
                return f"corrupt JPEG: the frame header claims a {width}x{height} image", width, height
            frame = True
        pos += length
        if m != 0xDA:
            continue
        if not frame:
            return f"corrupt JPEG: a scan at byte {at} before the frame header", width, height
        scans += 1
        if scans > MAX_SCANS:
            return f"corrupt JPEG: more than {MAX_SCANS} scans (the scan at byte {at} is one too many)", width, height
        scan = True
        data_start = pos
        while True:
            ff = d.find(b"\xff", pos) if pos < n else -1
            q = ff + 1 if ff >= 0 else n
            while q < n and d[q] == 0xFF:
                q += 1
            if q >= n:
                return (f"truncated JPEG: no end-of-image marker (the scan data from byte {data_start} runs "
                        f"to the end of the file, {n} bytes)"), width, height
            if d[q] == 0x00 and q > ff + 1:
                return (f"corrupt JPEG: fill bytes before a stuffed zero (0xFF 0xFF ... 0x00) at byte {ff} "
                        "of the scan data"), width, height
            if d[q] == 0x00 or 0xD0 <= d[q] <= 0xD7:
                pos = q + 1
                continue
            pos = q - 1
            break


def _chunk_name(t: bytes) -> str:
    if all(65 <= c <= 90 or 97 <= c <= 122 for c in t):
        return t.decode("ascii")
    return f"0x{int.from_bytes(t, 'big'):08X}"


def _walk_png(d: bytes) -> tuple[str | None, int, int]:
    # csrc/structure.cpp's walk_png, line for line.
    n = len(d)
    pos, width, height, chunks, texts, profile = 8, 0, 0, 0, 0, False
    while True:
        if n - pos < 8:
            return f"truncated PNG: no IEND chunk (the file ends after {n} bytes)", width, height
        chunks += 1
        if chunks > MAX_PNG_CHUNKS:
            return (f"corrupt PNG: more than {MAX_PNG_CHUNKS} chunks (the chunk at byte {pos} is one too many)",
                    width, height)
        length = int.from_bytes(d[pos:pos + 4], "big")
        name = _chunk_name(d[pos + 4:pos + 8])
        if length + 12 > n - pos:
            return (f"truncated PNG: the {name} chunk at byte {pos} runs past the end of the file "
                    f"({n} bytes)"), width, height
        if pos == 8:
            if name != "IHDR" or length != 13:
                return f"corrupt PNG: the first chunk is {name} of {length} bytes, not a 13-byte IHDR", width, height
            w, h = int.from_bytes(d[pos + 8:pos + 12], "big"), int.from_bytes(d[pos + 12:pos + 16], "big")
            if w == 0 or h == 0 or w > 0x7FFFFFFF or h > 0x7FFFFFFF:
                return f"corrupt PNG: the header claims a {w}x{h} image", width, height
            width, height = w, h
        if name == "IEND":
            return None, width, height
        if name == "iCCP" and profile:
            return f"corrupt PNG: a second iCCP chunk at byte {pos} (a PNG holds one colour profile)", width, height
        profile = profile or name == "iCCP"
        if name in ("zTXt", "iTXt") and (texts := texts + 1) > MAX_PNG_TEXTS:
            cause = f"corrupt PNG: more than {MAX_PNG_TEXTS} zTXt and iTXt chunks (the last at byte {pos})"
            return cause, width, height
        pos += 12 + length


def check_structure(data: Any) -> Inspection:
    """Whether `data` (bytes-like) is a whole JPEG or PNG, from its container structure alone:
    a JPEG's marker segments from SOI, through each scan's entropy-coded data (up to the first
    0xFF not followed by a stuffed 0x00 or a restart marker), to EOI; a PNG's chunks from the
    signature to IEND; every length must fit in the file. Bytes after EOI or IEND are accepted
    (as Pillow does). Other formats are not walked (kind ""). Refused as well: a JPEG of more
    than MAX_SCANS scans, and fill bytes before a stuffed zero (FF FF 00) in entropy-coded data,
    which libjpeg's two Huffman readers decode differently. The pure-Python twin of the native
    walk, with the same results and messages.

    It cannot see corrupt entropy-coded data inside a whole structure (flipped bits, a file cut
    short and closed with an end marker): the decoder meets that, and the native one is strict
    (an error whatever the crop, see `decode_crop_resize`)."""
    d = data if isinstance(data, bytes) else bytes(data)
    if not d:
        return Inspection("empty file", "", 0, 0)
    for signature, walk, kind in ((b"\xff\xd8\xff", _walk_jpeg, "jpeg"), (_PNG_SIGNATURE, _walk_png, "png")):
        if d.startswith(signature):
            cause, width, height = walk(d)
            return Inspection(cause, kind, width, height)
    return Inspection(None, "", 0, 0)


def inspect_batch(datas: Sequence[Any], jpeg_headers: bool = True, threads: int = 1) -> list[Inspection]:
    """`check_structure` of each of `datas`, natively (on `threads` threads, GIL released) when
    the extension is built. With `jpeg_headers` and the native decoder, a whole JPEG's header is
    also parsed by libjpeg, whose complaint becomes the cause ("corrupt JPEG header (...)")."""
    if _ext is not None and hasattr(_ext, "inspect_batch"):
        found = _ext.inspect_batch(list(datas), jpeg_headers, max(1, int(threads)))
        return [Inspection(c, _KINDS[k], w, h) for c, k, w, h in found]
    return [check_structure(d) for d in datas]


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
    index: bool = True,
) -> list[str | None]:
    """For each i: decode the window crops[i] = (x, y, w, h) (original image pixels, fractions
    of one allowed) of JPEG datas[i] as RGB, resize it to out's H x W as Pillow's bilinear
    `resize` with the box (x, y, x + w, y + h) does, mirror it left-right where flips[i], and
    write it into out[i].

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
    return _ext.decode_crop_resize(datas, crops, flips, out, max(1, int(threads)), whole, bool(index))


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
    data_bytes: bytes, crop: Sequence[float], flip: bool, size: tuple[int, int]
) -> np.ndarray:
    """The Pillow path `decode_crop_resize` reproduces, for one image: open, convert to RGB,
    resize to `size` = (width, height) (Pillow's order) with BILINEAR and box = the crop
    (x, y, w, h) as (x, y, x + w, y + h), mirror left-right if `flip`. Returns HWC uint8."""
    from PIL import Image  # Pillow is not a dependency of the package, only of this path

    x, y, w, h = (float(v) for v in crop)
    with open_image(data_bytes) as im:
        img = im.convert("RGB")
    # The enums came with Pillow 9.1 (whose plain constants warn); older Pillow-SIMD has neither.
    resampling = getattr(Image, "Resampling", Image)
    transpose = getattr(Image, "Transpose", Image)
    img = img.resize(tuple(size), resampling.BILINEAR, box=(x, y, x + w, y + h))
    if flip:
        img = img.transpose(transpose.FLIP_LEFT_RIGHT)
    return np.asarray(img, dtype=np.uint8)
