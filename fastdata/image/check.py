"""Whether each file is a whole image within the pixel limit, before any decoder allocates for
it: the loader's check of a batch (`decode.BatchDecoder.check`, on every backend) and `fastdata
shard`'s of each file it packs."""

from __future__ import annotations

import struct
from typing import Sequence

import numpy as np

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

            cause = tiff_parts(data) or gif_blocks(data)
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

MAX_TIFF_TILE_PIXELS = 1 << 24
"""The most pixels a TIFF's tile may have where it is larger than its image (each side rounded
up to 16, the tile's unit): `tiff_parts` refuses more. libtiff allocates and inflates a tile
whole, whatever the image's size: a 16x16 image declaring 16384x16384 tiles took 770 MB and 2 s
from a 783 KB file, past the pixel limit, which holds the image's size. Writers tile in 256 or
512, and a tile larger than its image is one tile of a small image."""


def _inline(order: str, big: bool, kind: int, value: int) -> int | None:
    """The value of a directory entry of one SHORT, LONG or LONG8 (`kind` 3, 4, 16), held in the
    entry's value field (read as one unsigned integer `value` of the field's width, in byte
    order `order`), or None for another type."""
    size = {3: 2, 4: 4, 16: 8}.get(kind)
    field = 8 if big else 4
    if size is None or size > field:
        return None
    return value & ((1 << 8 * size) - 1) if order == "<" else value >> 8 * (field - size)


def tiff_parts(data) -> str | None:
    """Why a TIFF has too many strips or tiles to open (`MAX_TIFF_PARTS`), from the counts of its
    first directory's StripOffsets and TileOffsets, or tiles larger than both its image and
    `MAX_TIFF_TILE_PIXELS`; None for one within them, or any other file. Read here from the
    directory's entries, which Pillow only gives once it has built the tiles. A directory that
    cannot be read is left to Pillow, which refuses it."""
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
    dims: dict[int, int] = {}  # ImageWidth, ImageLength, TileWidth, TileLength
    for k in range(entries):
        tag, kind, count, value = unpack(data, ifd + width + k * size)
        if tag in (273, 324) and count > MAX_TIFF_PARTS:  # StripOffsets, TileOffsets
            parts = "strips" if tag == 273 else "tiles"
            return f"corrupt TIFF: {count} {parts}, more than the {MAX_TIFF_PARTS} a file may have"
        if tag in (256, 257, 322, 323) and count == 1 and (v := _inline(order, big, kind, value)) is not None:
            dims.setdefault(tag, v)
    tile_w, tile_h = dims.get(322, 0), dims.get(323, 0)
    image_w, image_h = (-(-dims.get(t, 0) // 16) * 16 for t in (256, 257))
    if tile_w * tile_h > max(image_w * image_h, MAX_TIFF_TILE_PIXELS):
        return (f"corrupt TIFF: tiles of {tile_w}x{tile_h} pixels for a {dims.get(256)}x{dims.get(257)} image "
                f"(a tile larger than its image may have at most {MAX_TIFF_TILE_PIXELS} pixels)")
    return None


MAX_GIF_BLOCKS = 1 << 10
"""The most extension blocks and sub-blocks a GIF may have before its first image: `gif_blocks`
refuses more. Pillow reads each in Python when it opens the file and joins comments by copying
what it has so far, so that a 1 MiB file of empty comments costs 3 s and 3 MiB 27 s (the time
grows as the square of the count); a GIF's own extensions (its loop count, a frame's delay and
transparency, a comment or an XMP packet) take a few dozen."""


def gif_blocks(data) -> str | None:
    """Why a GIF has too many blocks before its first image (`MAX_GIF_BLOCKS`), walked from its
    header; None for one within it, or any other file (one that cannot be walked is left to
    Pillow, which refuses it)."""
    view = memoryview(data)
    if bytes(view[:6]) not in (b"GIF87a", b"GIF89a") or len(view) < 13:
        return None
    pos = 13 + (3 << ((view[10] & 7) + 1) if view[10] & 0x80 else 0)  # after the global colour table
    blocks = 0
    while pos < len(view) and view[pos] == 0x21:  # an extension: label, then sub-blocks to an empty one
        pos += 2
        blocks += 1
        while pos < len(view) and view[pos] and blocks <= MAX_GIF_BLOCKS:
            pos += 1 + view[pos]
            blocks += 1
        if blocks > MAX_GIF_BLOCKS:
            return f"corrupt GIF: more than {MAX_GIF_BLOCKS} extension blocks before its first image"
        pos += 1
    return None


_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # by colour type
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))


def png_rows(data) -> str | None:
    """Why a PNG's image data holds fewer rows than its header gives, or None. Pillow's decoder
    stops where the zlib stream ends and leaves the rows below as zeros, without an error, so a
    valid stream that is too short (every chunk whole, every CRC right) would pass as an image.
    Here the IDAT chunks are inflated, at most one byte past what the header gives (the work is
    bounded by the pixel limit), and counted. For a file `check_complete` passed (its chunks
    walked to IEND); any other file, or one whose stream is corrupt (Pillow's decode says so),
    gives None."""
    import zlib

    view = memoryview(data)
    if bytes(view[:8]) != b"\x89PNG\r\n\x1a\n" or len(view) < 33:
        return None
    w, h, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", view[16:29])
    bits = _PNG_CHANNELS.get(colour, 0) * depth
    passes = _ADAM7 if interlace == 1 else ((0, 0, 1, 1),)
    need = 0
    for x0, y0, dx, dy in passes:
        pw, ph = -(-max(0, w - x0) // dx), -(-max(0, h - y0) // dy)
        need += ph * (1 + -(-pw * bits // 8)) if pw and ph else 0
    stream, got, pos = zlib.decompressobj(), 0, 8
    try:
        while pos + 8 <= len(view) and got <= need:
            n, kind = struct.unpack(">I4s", view[pos:pos + 8])
            if kind == b"IEND":
                break
            if kind == b"IDAT":
                chunk = view[pos + 8:pos + 8 + n]
                while chunk and got <= need and not stream.eof:
                    got += len(stream.decompress(chunk, need + 1 - got))
                    chunk = stream.unconsumed_tail
            pos += 12 + n
    except zlib.error:
        return None
    return None if got >= need else f"truncated image data: its zlib stream holds {got} of the {need} bytes its " \
        f"{w}x{h} header gives"


def check_rows(record, index, datas: Sequence, checked: list) -> list:
    """`checked` (`check_complete`'s), with each PNG that `record` (the decoder's record of clean
    files, `record.EntropyCheck`) has not marked with the stamp of its bytes checked by
    `png_rows`: one short of rows fails, one whole is marked, so a file is inflated here once,
    not every epoch (a file rewritten since, at any size, is checked again)."""
    todo = [j for j, (cause, is_jpeg, _, _) in enumerate(checked)
            if cause is None and not is_jpeg and bytes(datas[j][:8]) == b"\x89PNG\r\n\x1a\n"]
    if not todo:
        return checked
    stamps = record.stamps([datas[j] for j in todo])
    ids = np.asarray(index, dtype=np.int64)[todo]
    checked, whole = list(checked), []
    for k, (j, unmarked) in enumerate(zip(todo, record.whole(ids, stamps))):
        cause = png_rows(datas[j]) if unmarked else None
        if cause is not None:
            checked[j] = (cause, False, checked[j][2], checked[j][3])
        elif unmarked:
            whole.append(k)
    record.mark(ids[whole], stamps[whole])
    return checked
