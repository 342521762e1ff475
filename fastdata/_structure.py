"""The container walk every loader runs on each file before any decode, on every backend
(`inspect_batch`): whether it is a whole JPEG or PNG (`check_structure`: walked from its
signature to its end marker, lengths and markers only, so a file cut short is refused the same
way whatever crop the epoch draws) and the size its header claims, which the loaders hold to
`MAX_IMAGE_PIXELS` before anything allocates; and the bounds on the work a file may ask for.
Native when the extension is built (csrc/structure.cpp), else the same walk here in Python (same
results, same messages).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

from ._ext import native as _ext

MAX_IMAGE_PIXELS: int = 89_478_485
"""The most pixels (width x height, as the header claims) an image may have: larger ones are
refused before any decode, as decompression bombs, on every backend. Pillow's own
`Image.MAX_IMAGE_PIXELS` (where it warns; it refuses at twice that); the native decoder has the
same limit (`_native.MAX_PIXELS`)."""

MAX_SCANS: int = 100
MAX_SCAN_PIXELS: int = 1 << 31
"""The most scans a JPEG may have: `check_structure` refuses more, on every backend, before any
decode. Each scan of a progressive JPEG is a pass over every block of the image however few bytes
it takes, so a file of many tiny scans would cost seconds a decode; libjpeg's progressive script
writes 10 (6 for grayscale). A large image may have fewer, as many as pass over MAX_SCAN_PIXELS
pixels in all but never fewer than 10 (`max_scans`: 24 at the pixel limit, where 100 tiny scans of
a 9450x9450 image cost 2.4 s of a core a decode, 24 cost 0.66 s and 10 0.51 s). The native
decoder's limits are the same (`_native.MAX_SCANS`, `_native.MAX_SCAN_PIXELS`)."""


def max_scans(width: int, height: int) -> int:
    """The most scans a `width` x `height` JPEG may have (see MAX_SCANS)."""
    return min(MAX_SCANS, max(10, MAX_SCAN_PIXELS // (width * height)))


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
            if not scan:
                return f"corrupt JPEG: no marker at byte {pos} (0x{d[pos]:02x})", width, height
            pos = d.find(b"\xff", pos)
            if pos < 0:
                return _jpeg_ends_early(n), width, height
        at = pos
        while pos < n and d[pos] == 0xFF:
            pos += 1
        if pos >= n:
            return _jpeg_ends_early(n), width, height
        if scan and d[pos] == 0x00:
            pos += 1
            continue
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
        bare = 0xD0 <= m <= 0xD7 or m == 0x01
        if bare and scan:
            continue
        if bare or m in (0x00, 0xD8):
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
        scans, most = scans + 1, max_scans(width, height)
        if scans > most:
            why = (f"more than {most} scans (the scan at byte {at} is one too many)" if most == MAX_SCANS else
                   f"more than {most} scans for its {width}x{height} pixels (each a pass over them; the scan at byte "
                   f"{at} is one too many)")
            return f"corrupt JPEG: {why}", width, height
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
        if name == "IHDR" and pos != 8:
            return f"corrupt PNG: a second IHDR chunk at byte {pos} (a PNG has one header)", width, height
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
    than `max_scans` scans for its size; stray bytes, a restart marker or a TEM before a JPEG's
    first scan (DALI's or Pillow's parser refuses them); fill bytes before a stuffed zero (FF FF
    00) in entropy-coded data, which libjpeg's two Huffman readers decode differently; a PNG's
    second IHDR (Pillow would decode at its size, not the first's). The pure-Python
    twin of the native walk, with the same results and messages.

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
