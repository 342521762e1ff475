"""Whether each file is a whole image within the pixel limit, before any decoder allocates for
it: the loader's check of a batch (`decode.BatchDecoder.check`, on every backend) and `fastdata
shard`'s of each file it packs."""

from __future__ import annotations

import struct
from typing import Sequence

from .. import _codec
from .._pillow import FORMATS
from ..errors import error_line
from ..transforms import pil as pil_lowering


def check_complete(datas: Sequence, threads: int = 1) -> list[tuple[str | None, bool, int, int]]:
    """For each of `datas`: (why it cannot be decoded or None, whether it is a JPEG, width,
    height). JPEGs and PNGs are walked from their signature to their end marker (`_codec.
    inspect_batch`: a file cut short is refused whatever the crop, and whatever Pillow's
    LOAD_TRUNCATED_IMAGES says; bytes after the end are accepted, as Pillow does); other formats
    are sized by Pillow. An image whose header claims more than `_codec.MAX_IMAGE_PIXELS` is
    refused here, before any decoder allocates for it (DALI included)."""
    limit = _codec.MAX_IMAGE_PIXELS
    out = []
    for data, (cause, kind, w, h) in zip(datas, _codec.inspect_batch(datas, _codec.AVAILABLE, threads)):
        if cause is None and not kind:
            from PIL import Image, UnidentifiedImageError

            cause = tiff_parts(data)
            if cause is None:
                try:
                    w, h = pil_lowering.size_of(data)
                except UnidentifiedImageError:
                    cause = _unread(bytes(data[:12]))
                except Image.DecompressionBombError as e:
                    cause = f"over the pixel limit of {limit} ({e})"
                except Exception as e:  # Pillow's header parsers raise OSError, SyntaxError, ValueError, ...
                    cause = f"not a readable image ({error_line(e)})"
        if cause is None and w * h > limit:
            cause = f"the header claims {w}x{h} = {w * h} pixels, over the limit of {limit} (a decompression bomb?)"
        out.append((cause, kind == "jpeg", w, h))
    return out


def _unread(head: bytes) -> str:
    """Why Pillow opened no format from a file starting with `head`: none matched, or it is a
    WebP and this Pillow was built without libwebp (Pillow-SIMD built where its headers are
    missing), which Pillow's plugin reports as no match."""
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        from PIL import features

        if not features.check("webp"):
            return "a WebP image, but this Pillow was built without WebP support (libwebp)"
    return f"not a readable image (none of {', '.join(FORMATS)} starts with {head[:8]!r})"


MAX_TIFF_PARTS = 1 << 17
"""The most strips or tiles a TIFF may have: `tiff_parts` refuses more. Pillow builds a tile, in
Python, for every strip when it opens the file (and again to decode it), about 3 us each: 2
million strips for a 16x16 image cost 25 s and 550 MB a sample. Writers make strips of about
8 KiB, or one a row: 32,768 at the 256 MiB read limit, a row each for an image 131,072 high."""


def tiff_parts(data) -> str | None:
    """Why a TIFF has too many strips or tiles to open (`MAX_TIFF_PARTS`), from the counts of its
    first directory's StripOffsets and TileOffsets; None for one within it, or any other file.
    Read here from the directory's entries, which Pillow only gives once it has built the tiles.
    A directory that cannot be read is left to Pillow, which refuses it."""
    head = bytes(data[:16])
    order = {b"II": "<", b"MM": ">"}.get(head[:2])
    if order is None or len(head) < 16:
        return None
    magic = int.from_bytes(head[2:4], "little" if order == "<" else "big")
    big = magic == 43  # BigTIFF: 8-byte offsets and counts, 20-byte entries
    if magic not in (42, 43):
        return None
    unpack = struct.Struct(order + ("HHQQ" if big else "HHII")).unpack_from
    size, at = (20, 8) if big else (12, 4)
    ifd = struct.unpack_from(order + ("Q" if big else "I"), head, at)[0]
    width = 8 if big else 2
    if ifd + width > len(data):
        return None
    entries = int.from_bytes(bytes(data[ifd:ifd + width]), "little" if order == "<" else "big")
    entries = min(entries, (len(data) - ifd - width) // size)  # no more than the file holds
    for k in range(entries):
        tag, _, count, _ = unpack(data, ifd + width + k * size)
        if tag in (273, 324) and count > MAX_TIFF_PARTS:  # StripOffsets, TileOffsets
            kind = "strips" if tag == 273 else "tiles"
            return f"corrupt TIFF: {count} {kind}, more than the {MAX_TIFF_PARTS} a file may have"
    return None
