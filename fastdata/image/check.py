"""Whether each file is a whole image within the pixel limit, before any decoder allocates for
it: the loader's check of a batch (`decode.BatchDecoder.check`, on every backend) and `fastdata
shard`'s of each file it packs."""

from __future__ import annotations

import struct
from typing import Sequence

import numpy as np

from .. import _codec, _structure
from .._optional import require_pillow
from .._pillow import FORMATS
from ..errors import error_line
from ..transforms import pil as pil_lowering


def check_complete(datas: Sequence, threads: int = 1) -> list[tuple[str | None, bool, int, int]]:
    """For each of `datas`: (why it cannot be decoded or None, whether it is a JPEG, width,
    height). JPEGs and PNGs are walked from their signature to their end marker (`_structure.
    inspect_batch`: a file cut short is refused whatever the crop, and whatever Pillow's
    LOAD_TRUNCATED_IMAGES says; bytes after the end are accepted, as Pillow does); other formats
    are sized by Pillow. An image whose header claims more than `_structure.MAX_IMAGE_PIXELS` is
    refused here, before any decoder allocates for it (DALI included)."""
    limit = _structure.MAX_IMAGE_PIXELS
    out = []
    for data, (cause, kind, w, h) in zip(datas, _structure.inspect_batch(datas, _codec.AVAILABLE, threads)):
        if cause is None and not kind:
            require_pillow("to read an image that is neither a JPEG nor a PNG")
            from PIL import Image, UnidentifiedImageError

            cause = tiff_parts(data) or gif_blocks(data) or pnm_walk(data) or bmp_rle(data)
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
    if head[:4] == b"\x00\x05\x16\x07":  # AppleDouble's magic number
        return ("not an image but macOS's AppleDouble file of the file beside it (what a copy from macOS leaves as "
                "._name); delete them (find DIR -name '._*' -delete, or macOS's dot_clean DIR)")
    return f"not a readable image (none of {', '.join(FORMATS)} starts with {head[:8]!r})"


MAX_TIFF_PARTS = 1 << 17
"""The most strips or tiles a TIFF may have: `tiff_parts` refuses more. Pillow builds a tile, in
Python, for every strip when it opens the file (and again to decode it), about 3 us each: 2
million strips for a 16x16 image cost 25 s and 550 MB a sample. Writers make strips of about
8 KiB, or one a row: 32,768 at the 256 MiB read limit, a row each for an image 131,072 high."""

MAX_TIFF_ENTRIES = 1 << 12
"""The most entries a TIFF's directory may have: `tiff_parts` refuses more. Pillow reads each in
Python as it opens the file (twice a sample: sized, then decoded), and those of the EXIF and
GPS directories as it loads it: a BigTIFF, whose count is 64-bit, of a million entries cost 9 s
a sample. Writers put a few dozen tags in each."""

MAX_TIFF_EXIF_NUMBERS = 1 << 20
"""The most bytes of numbers (values of any type but BYTE, ASCII and UNDEFINED, which stay
bytes) a TIFF's EXIF, GPS and Interop directories may hold together: `tiff_parts` refuses more.
Pillow turns them into tuples of Python numbers as it loads the image, about 18 times their
bytes (1,024 entries of 32,768 SHORTs sharing one block took 1.35 GB from a 78 KB file); these
directories hold a few numbers a tag."""

MAX_TIFF_TILE_PIXELS = 1 << 24
"""The most pixels a TIFF's tile may have where it is larger than its image (each side rounded
up to 16, the tile's unit): `tiff_parts` refuses more. libtiff allocates and inflates a tile
whole, whatever the image's size: a 16x16 image declaring 16384x16384 tiles took 770 MB and 2 s
from a 783 KB file, past the pixel limit, which holds the image's size. Writers tile in 256 or
512, and a tile larger than its image is one tile of a small image."""

# Bytes a value of each TIFF type (BYTE, ASCII, SHORT, LONG, RATIONAL, SBYTE, UNDEFINED, SSHORT,
# SLONG, SRATIONAL, FLOAT, DOUBLE, IFD, LONG8, SLONG8, IFD8): the types Pillow reads.
_TIFF_UNITS = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 1, 7: 1, 8: 2, 9: 4, 10: 8, 11: 4, 12: 8, 13: 4, 16: 8, 17: 8,
               18: 8}
_TIFF_INTEGERS = (1, 3, 4, 6, 8, 9, 13, 16, 17, 18)  # the types libtiff takes a size in (or Pillow an offset)
# The lists of a TIFF's first directory Pillow unpacks as it opens the file; a ColorMap, the longest,
# holds 3 x 65,536 values (16-bit palettes). One of 5 million SHORTs cost 4 s and 1.1 GB.
_TIFF_LISTS = {258: "BitsPerSample", 320: "ColorMap", 338: "ExtraSamples", 339: "SampleFormat",
               530: "YCbCrSubSampling"}
# The directories Pillow parses as it loads an image, by the directory and tag that point to them.
_TIFF_POINTERS = {"first": {34665: "EXIF", 34853: "GPS"}, "EXIF": {40965: "Interop"}}


def _tiff_integer(data, endian: str, field: int, kind: int, count: int, value: int) -> int | None:
    """The value of a directory entry of one integer (of any type libtiff takes a size in), held
    in the entry's value field (`value`, that field read as one unsigned integer in the file's
    byte order) or, where it does not fit, at the offset the field gives; None for another
    entry."""
    nbytes = _TIFF_UNITS.get(kind, 0)
    if kind not in _TIFF_INTEGERS or count != 1:
        return None
    raw = value.to_bytes(field, endian)[:nbytes] if nbytes <= field else bytes(data[value:value + nbytes])
    return int.from_bytes(raw, endian, signed=kind in (6, 8, 9, 17)) if len(raw) == nbytes else None


def tiff_parts(data) -> str | None:
    """Why a TIFF's directories would cost Pillow or libtiff far more than its image: more than
    `MAX_TIFF_ENTRIES` entries in one, more than `MAX_TIFF_PARTS` strips or tiles, entries whose
    data out of line comes to more than twice the file (entries that share one block, each read
    whole), or tiles larger than both its image and `MAX_TIFF_TILE_PIXELS` (or sized in a way
    not read here); None for one within them, or any other file. The directories are the first
    and those Pillow parses as it loads the image (`TiffImageFile.load_end`: the EXIF, GPS and,
    within the EXIF, Interop directories). A directory that cannot be read is left to Pillow,
    which refuses it."""
    head = bytes(data[:16])
    order = {b"II": "<", b"MM": ">"}.get(head[:2])
    if order is None or len(head) < 16:
        return None
    endian = "little" if order == "<" else "big"
    magic = int.from_bytes(head[2:4], endian)
    big = magic == 43  # BigTIFF: 8-byte offsets and counts, 20-byte entries
    if magic not in (42, 43):
        return None
    unpack = struct.Struct(order + ("HHQQ" if big else "HHII")).unpack_from
    size, at, field = (20, 8, 8) if big else (12, 4, 4)
    width = 8 if big else 2
    dims: dict[int, int | None] = {}  # ImageWidth, ImageLength, TileWidth, TileLength (None: not read)
    out_of_line = numbers = 0
    todo, seen = [(struct.unpack_from(order + ("Q" if big else "I"), head, at)[0], "first")], set()
    while todo:
        ifd, name = todo.pop()
        if ifd in seen or ifd + width > len(data):
            continue
        seen.add(ifd)
        entries = int.from_bytes(bytes(data[ifd:ifd + width]), endian)
        entries = min(entries, (len(data) - ifd - width) // size)  # no more than the file holds
        if entries > MAX_TIFF_ENTRIES:
            return (f"corrupt TIFF: {entries} entries in its {name} directory, more than the {MAX_TIFF_ENTRIES} one "
                    "may have")
        for k in range(entries):
            tag, kind, count, value = unpack(data, ifd + width + k * size)
            nbytes = count * _TIFF_UNITS.get(kind, 0)
            if nbytes > field:
                out_of_line += min(nbytes, len(data))
            if name != "first" and kind not in (1, 2, 7):
                numbers += nbytes
            pointer = _TIFF_POINTERS.get(name, {}).get(tag)
            if pointer is not None and (offset := _tiff_integer(data, endian, field, kind, count, value)) is not None:
                todo.append((offset, pointer))
            if name != "first":
                continue
            if tag in (273, 324) and count > MAX_TIFF_PARTS:  # StripOffsets, TileOffsets
                parts = "strips" if tag == 273 else "tiles"
                return f"corrupt TIFF: {count} {parts}, more than the {MAX_TIFF_PARTS} a file may have"
            if tag in _TIFF_LISTS and count > 3 << 16:  # Pillow makes a tuple of each, in Python, as it opens the file
                return f"corrupt TIFF: a {_TIFF_LISTS[tag]} of {count} values, more than the {3 << 16} one may hold"
            if tag == 259 and _tiff_integer(data, endian, field, kind, count, value) in (6, 7):
                return ("a TIFF of JPEG-compressed strips or tiles, which are not read: libtiff decodes each to the "
                        "size its own JPEG header declares, past the image's")
            if tag in (256, 257, 322, 323) and tag not in dims:  # the first of a tag counts, as in libtiff
                dims[tag] = _tiff_integer(data, endian, field, kind, count, value)
    if numbers > MAX_TIFF_EXIF_NUMBERS:
        return (f"corrupt TIFF: its EXIF and GPS directories hold {numbers} bytes of numbers, more than the "
                f"{MAX_TIFF_EXIF_NUMBERS} they may")
    if out_of_line > 2 * len(data):
        return (f"corrupt TIFF: its directories' entries hold {out_of_line} bytes out of line, more than twice "
                f"the file's {len(data)}")
    if 322 not in dims and 323 not in dims:
        return None
    tile_w, tile_h = dims.get(322), dims.get(323)
    if tile_w is None or tile_h is None or min(tile_w, tile_h) < 0:
        return "corrupt TIFF: a tile size that is not one integer of 0 or more"
    image_w, image_h = (-(-max(dims.get(t) or 0, 0) // 16) * 16 for t in (256, 257))
    if tile_w * tile_h > max(image_w * image_h, MAX_TIFF_TILE_PIXELS):
        shown = "x".join("?" if dims.get(t) is None else str(dims[t]) for t in (256, 257))
        return (f"corrupt TIFF: tiles of {tile_w}x{tile_h} pixels for a {shown} image "
                f"(a tile larger than its image may have at most {MAX_TIFF_TILE_PIXELS} pixels)")
    return None


MAX_GIF_BLOCKS = 1 << 10
"""The most extension blocks, sub-blocks and stray bytes a GIF may have before its first image:
`gif_blocks` refuses more. Pillow reads each in Python when it opens the file (a stray byte, one
that starts no block, it steps over) and joins comments by copying what it has so far, so that
a 1 MiB file of empty comments costs 3 s and 3 MiB 27 s (the time grows as the square of the
count); a GIF's own extensions (its loop count, a frame's delay and transparency, a comment or
an XMP packet) take a few dozen."""


def gif_blocks(data) -> str | None:
    """Why a GIF has too many blocks before its first image (`MAX_GIF_BLOCKS`), walked from its
    header; None for one within it, or any other file (one that cannot be walked is left to
    Pillow, which refuses it)."""
    view = memoryview(data)
    if bytes(view[:6]) not in (b"GIF87a", b"GIF89a") or len(view) < 13:
        return None
    pos = 13 + (3 << ((view[10] & 7) + 1) if view[10] & 0x80 else 0)  # after the global colour table
    blocks = 0
    while pos < len(view) and view[pos] not in (0x2C, 0x3B):  # up to an image, or the trailer
        if view[pos] != 0x21:  # a stray byte, which Pillow steps over (one a Python loop)
            pos += 1
            blocks += 1
        else:  # an extension: label, then sub-blocks to an empty one
            pos += 2
            blocks += 1
            while pos < len(view) and view[pos] and blocks <= MAX_GIF_BLOCKS:
                pos += 1 + view[pos]
                blocks += 1
            pos += 1
        if blocks > MAX_GIF_BLOCKS:
            return f"corrupt GIF: more than {MAX_GIF_BLOCKS} extension blocks and stray bytes before its first image"
    return None


MAX_PNM_HEADER = 1 << 12
"""The most bytes a PNM header (its magic, sizes, maxval, and the whitespace and comments between
them) may take: `pnm_walk` refuses more. Pillow reads it a byte at a time in Python: 20 MB of
padding cost 8 s a sample."""

MAX_PNM_COMMENTS = 1 << 10
"""The most comments (`#`) a plain PNM (P1-P3, pixels as text) may hold: `pnm_walk` refuses
more. Pillow's plain-format decoder drops each comment by copying the rest of its 1 MiB block:
1 MiB of empty comments cost 10 s a sample. Writers put one comment in the header, or none."""

MAX_PLAIN_PNM_BYTES = 1 << 21
"""The most bytes a plain PNM (P1-P3, pixels as text) may take: `pnm_walk` refuses more. Pillow
decodes the text in Python, about 0.4 s a MiB for P3 (0.3 s for P2, 0.08 s for P1): a 256 MiB
file would cost 100 s a sample; at the bound, under a second. Writers use the binary forms (P4-P6)
for anything larger than a test image."""

# Pillow's PNM magics (PpmImagePlugin.MODES) and the header tokens after each: width, height,
# and a maxval (a scale for Pf) but for bitmaps.
_PNM_TOKENS = {b"P1": 2, b"P4": 2, b"P2": 3, b"P3": 3, b"P5": 3, b"P6": 3, b"P0CMYK": 3, b"Pf": 3, b"PyP": 3,
               b"PyRGBA": 3, b"PyCMYK": 3}
_WHITESPACE = b" \t\n\v\f\r"


def _pnm_header_end(head: bytes) -> int | None:
    """Where Pillow's read of a PNM header in `head` ends (`PpmImageFile._open`: a magic of up
    to 6 bytes, then tokens of up to 10 bytes, whitespace between them, and comments from `#` to
    a line's end anywhere, within a token too), or None for a header that does not end in
    `head`, or no PNM's."""
    at = 0
    while at < min(6, len(head)) and head[at] not in _WHITESPACE:
        at += 1
    tokens = _PNM_TOKENS.get(head[:at])
    if tokens is None:
        return 0  # no magic Pillow knows: refused at once
    for _ in range(tokens):
        length = 0
        while length <= 10:
            if at >= len(head):
                return None
            c, at = head[at], at + 1
            if c == 0x23:  # '#': to the line's end, the token going on after it
                ends = [e for e in (head.find(b"\r", at), head.find(b"\n", at)) if e >= 0]
                if not ends:
                    return None
                at = min(ends) + 1
            elif c in _WHITESPACE:
                if length:
                    break
            else:
                length += 1
    return at


def pnm_walk(data) -> str | None:
    """Why a PNM's header is longer than `MAX_PNM_HEADER`, or a plain one is over
    `MAX_PLAIN_PNM_BYTES` or holds more than `MAX_PNM_COMMENTS` comments; None for one within
    them, or any other file."""
    magic = bytes(data[:2])
    if magic[:1] != b"P":
        return None
    head = bytes(data[:MAX_PNM_HEADER + 1])  # a magic Pillow does not know ends its header at 0
    if _pnm_header_end(head) is None and len(data) > MAX_PNM_HEADER:
        return f"corrupt PNM: a header of more than {MAX_PNM_HEADER} bytes"
    if magic not in (b"P1", b"P2", b"P3"):  # binary pixels after the header: no comment there
        return None
    if len(data) > MAX_PLAIN_PNM_BYTES:
        return (f"a plain (text) PNM of {len(data)} bytes, over the {MAX_PLAIN_PNM_BYTES} taken in that encoding, "
                "which Pillow decodes in Python")
    comments = int(np.count_nonzero(np.frombuffer(data, np.uint8) == ord("#")))
    if comments > MAX_PNM_COMMENTS:
        return f"corrupt PNM: {comments} comments, more than the {MAX_PNM_COMMENTS} it may hold"
    return None


MAX_BMP_RLE_PIXELS = 1 << 22
MAX_BMP_RLE_WIDTH = 1 << 14
"""The most pixels, and the widest rows, a run-length encoded BMP (RLE8, RLE4) may have:
`bmp_rle` refuses more. Pillow decodes these in Python, a row's padding a byte at a time (an
end-of-line code a row: 9 s for 80 million pixels, against 0.5 s for the same image written
as long runs), and writes the rows a delta code skips before it checks the image's end (255
rows of an 89-million-pixel-wide image: 23 GB from 1 KB). Such BMPs are icons and old
screenshots."""


def bmp_rle(data) -> str | None:
    """Why a run-length encoded BMP is larger than `MAX_BMP_RLE_PIXELS` or wider than
    `MAX_BMP_RLE_WIDTH`; None for one within them, or any other file."""
    if bytes(data[:2]) != b"BM" or len(data) < 34:
        return None
    header, width, height, _, _, compression = struct.unpack_from("<IiiHHI", data, 14)
    if header < 40 or compression not in (1, 2):  # BITMAPCOREHEADER (12) has no compression
        return None
    width, height = abs(width), abs(height)
    if width > MAX_BMP_RLE_WIDTH or width * height > MAX_BMP_RLE_PIXELS:
        return (f"a run-length encoded BMP of {width}x{height} pixels, over the {MAX_BMP_RLE_PIXELS} pixels (and "
                f"{MAX_BMP_RLE_WIDTH} a row) taken in that encoding, which Pillow decodes in Python")
    return None


_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # by colour type
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))


def png_rows(data) -> str | None:
    """Why a PNG's image data holds fewer rows than its header gives, or None. Pillow's decoder
    stops where the zlib stream ends and leaves the rows below as zeros, without an error, so a
    valid stream that is too short (every chunk whole, every CRC right) would pass as an image.
    Here the IDAT chunks are inflated, at most one byte past what the header gives (the work is
    bounded by the pixel limit), and counted, a MiB at a time. For a file `check_complete`
    passed (its chunks walked to IEND); any other file, or one whose stream is corrupt (Pillow's
    decode says so), gives None."""
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
                while got <= need and not stream.eof:
                    # a MiB at a time, only counted (a 16-bit RGBA image at the pixel limit inflates to 1.4 GB)
                    asked = min(need + 1 - got, 1 << 20)
                    gave = len(stream.decompress(chunk, asked))
                    got, chunk = got + gave, stream.unconsumed_tail
                    if gave < asked and not chunk:  # (all of the chunk's bytes taken, and what they gave)
                        break
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
