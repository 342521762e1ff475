"""Crafted JPEGs against the native decoder: no file can take another file's checkpoints, no
buffer rewritten during a decode leaves a trace, a file's work is bounded, and the checkpoint
decoder (index=True) and libjpeg's (index=False) give the same pixels or both refuse.

The forged pairs are built against the hash fastdata used to key its checkpoints before they
were keyed by a secret (`old_hash`, xxHash64's rounds with a fixed seed): a 32-byte block after
the end-of-image marker, solved from the rounds' inverse, gives a second file that hash and
size. Under that hash the second file decoded with the first's checkpoints; each must now get
its own pixels and errors.
"""

from __future__ import annotations

import io
import subprocess
import sys
import struct
import threading
import zlib

import numpy as np
import pytest
import torch
from PIL import Image
from _images import png_chunk

import fastdata
from fastdata import DataError, _codec, _structure
from fastdata import transforms as T

pytestmark = pytest.mark.skipif(not _codec.AVAILABLE, reason="native JPEG decoder not built")

M64 = (1 << 64) - 1
P1, P2, P3 = 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9


def _rotl(v: int, r: int) -> int:
    return ((v << r) | (v >> (64 - r))) & M64


def _round(acc: int, lane: int) -> int:
    return _rotl((acc + lane * P2) & M64, 31) * P1 & M64


def _lanes(d: bytes, stripes: int) -> list[int]:
    acc = [(P1 + P2) & M64, P2, 0, (-P1) & M64]
    for i in range(stripes):
        for k in range(4):
            acc[k] = _round(acc[k], int.from_bytes(d[32 * i + 8 * k:32 * i + 8 * k + 8], "little"))
    return acc


def old_hash(d: bytes) -> int:
    """The unkeyed checkpoint key fastdata had (csrc/entropy.cpp's former hash_bytes)."""
    n, i = len(d), len(d) // 32 * 32
    a, b, c, e = _lanes(d, n // 32)
    h = (_rotl(a, 1) + _rotl(b, 7) + _rotl(c, 12) + _rotl(e, 18) + n) & M64
    for j in range(i, n - 7, 8):
        h = (_rotl(h ^ _round(0, int.from_bytes(d[j:j + 8], "little")), 27) * P1 + P3) & M64
        i = j + 8
    for j in range(i, n):
        h = _rotl(h ^ (d[j] * P3 & M64), 11) * P1 & M64
    h ^= h >> 33
    h = h * P2 & M64
    h ^= h >> 29
    h = h * P3 & M64
    return h ^ (h >> 32)


def forge(a: bytes, b: bytes) -> tuple[bytes, bytes]:
    """(a', b'): a and b padded after their end-of-image marker to one length, each closed by a
    32-byte block; b's block is solved so that old_hash(a') == old_hash(b')."""
    stripes = -(-max(len(a), len(b)) // 32)
    a2 = a + bytes(32 * stripes - len(a)) + bytes(range(7, 39))
    b2 = b + bytes(32 * stripes - len(b))
    want, have = _lanes(a2, stripes + 1), _lanes(b2, stripes)
    inv1, inv2 = pow(P1, -1, 1 << 64), pow(P2, -1, 1 << 64)
    block = b"".join((((_rotl(w * inv1 & M64, 33) - h) * inv2) & M64).to_bytes(8, "little")
                     for w, h in zip(want, have))
    b2 += block
    assert len(a2) == len(b2) and old_hash(a2) == old_hash(b2)
    return a2, b2


def noise(w: int, h: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    smooth = np.kron(rng.integers(0, 256, (h // 8 + 1, w // 8 + 1, 3)), np.ones((8, 8, 1)))[:h, :w]
    return Image.fromarray(np.clip(smooth + rng.normal(0, 12, (h, w, 3)), 0, 255).astype(np.uint8))


def jpeg(img: Image.Image, **kw) -> bytes:
    out = io.BytesIO()
    img.save(out, "JPEG", quality=kw.pop("quality", 90), **kw)
    return out.getvalue()


def scan_start(d: bytes) -> int:
    """Where the first scan's entropy-coded data starts."""
    pos = 2
    while d[pos + 1] != 0xDA:
        pos += 2 + int.from_bytes(d[pos + 2:pos + 4], "big")
    return pos + 2 + int.from_bytes(d[pos + 2:pos + 4], "big")


def decode(datas, crops, index=True, whole=None, out_hw=(32, 40)):
    n = len(datas)
    out = torch.zeros(n, 3, *out_hw, dtype=torch.uint8)
    errors = _codec.decode_crop_resize(datas, np.asarray(crops, np.int32), np.zeros(n, bool), out, 1,
                                        whole=whole, index=index)
    return out, errors


def crops_of(w: int, h: int) -> list[tuple[int, int, int, int]]:
    return [(0, 0, w, h), (w // 2, h // 2, w // 2, h // 2), (3, h - 40, 50, 40), (w - 64, 0, 64, 64)]


# ---------------------------------------------------------------------------- the key


def test_forged_pair_decodes_each_file_to_its_own_pixels():
    w, h = 320, 240
    a, b = forge(jpeg(noise(w, h, 1)), jpeg(noise(w, h, 2)))
    crops = crops_of(w, h)
    for _ in range(2):  # a's checkpoints kept, then proven whole
        assert decode([a] * len(crops), crops)[1] == [None] * len(crops)
    for whole in (None, np.zeros(len(crops), np.uint8)):
        got, errors = decode([b] * len(crops), crops, whole=whole)
        want, want_errors = decode([b] * len(crops), crops, index=False)
        assert errors == want_errors == [None] * len(crops)
        assert torch.equal(got, want)


def test_forged_truncated_file_fails_after_its_partner():
    # b is a's image cut inside its scan and closed with an end-of-image marker: libjpeg
    # refuses it; under the old hash it took a's proven-whole checkpoints and decoded "clean".
    w, h = 320, 240
    whole_a = jpeg(noise(w, h, 3))
    start = scan_start(whole_a)
    cut = whole_a[:start + (len(whole_a) - start) // 2]
    cut = cut[:-1] if cut.endswith(b"\xff") else cut
    a, b = forge(whole_a, cut + b"\xff\xd9")
    crops = crops_of(w, h)
    for _ in range(2):
        assert decode([a] * len(crops), crops)[1] == [None] * len(crops)
    _, errors = decode([b] * len(crops), crops)  # whole: as the loaders decode an unmarked file
    _, want = decode([b] * len(crops), crops, index=False)
    assert all(e is not None for e in errors) and all(e is not None for e in want)


def test_forged_one_code_changed_gets_its_own_pixels():
    # b differs from a in one byte of the scan's first MCU (a DC code): every block after it
    # shifts; under the old hash b came out as a's pixels after a.
    w, h = 256, 192
    base = jpeg(noise(w, h, 4))
    at = scan_start(base) + 1
    assert base[at] != 0xFF and base[at] ^ 0x10 != 0xFF
    changed = base[:at] + bytes([base[at] ^ 0x10]) + base[at + 1:]
    a, b = forge(base, changed)
    crops = crops_of(w, h)
    for _ in range(2):
        decode([a] * len(crops), crops)
    got, errors = decode([b] * len(crops), crops)
    want, want_errors = decode([b] * len(crops), crops, index=False)
    assert [e is None for e in errors] == [e is None for e in want_errors]
    ok = [k for k, e in enumerate(errors) if e is None]
    assert torch.equal(got[ok], want[ok])
    a_pixels, _ = decode([a] * len(crops), crops, index=False)
    assert not ok or not torch.equal(got[ok], a_pixels[ok])


# ---------------------------------------------------------------------------- the private copy

_FRESH = """
import sys, numpy as np, torch
from fastdata import _codec
crops = np.load(sys.argv[1])
for path in sys.argv[2:]:
    data = open(path, "rb").read()
    out = torch.zeros(len(crops), 3, 32, 40, dtype=torch.uint8)
    assert _codec.decode_crop_resize([data] * len(crops), crops, np.zeros(len(crops), bool), out, 1) == [None] * len(crops)
    sys.stdout.buffer.write(out.numpy().tobytes())
"""


@pytest.mark.timeout(180)
def test_buffer_rewritten_during_decodes_leaves_no_trace(tmp_path):
    """Bytearrays flipped between two files of one size by another thread while they decode
    (the GIL released), each pair new to the process: afterwards every decode of each first
    file, whole and stopped at the window's last row, equals a fresh process's."""
    w, h = 240, 160
    crops = np.asarray(crops_of(w, h), np.int32)
    n = len(crops)
    bufs, firsts = [], []
    for k in range(40):
        p0, q0 = jpeg(noise(w, h, 100 + 2 * k)), jpeg(noise(w, h, 101 + 2 * k))
        size = max(len(p0), len(q0))
        p, q = p0 + bytes(size - len(p0)), q0 + bytes(size - len(q0))
        buf = bytearray(p)
        stop = threading.Event()

        def flip(buf=buf, p=p, q=q, stop=stop):
            while not stop.is_set():
                buf[:] = q
                buf[:] = p

        flipper = threading.Thread(target=flip)
        flipper.start()
        try:
            for j in range(6):
                out = torch.zeros(n, 3, 32, 40, dtype=torch.uint8)
                _codec.decode_crop_resize([buf] * n, crops, np.zeros(n, bool), out, 1,
                                           whole=None if j % 2 else np.zeros(n, np.uint8))
        finally:
            stop.set()
            flipper.join()
        buf[:] = p
        bufs.append(buf)
        firsts.append(tmp_path / f"{k}.jpg")
        firsts[-1].write_bytes(p)
    np.save(tmp_path / "crops.npy", crops)
    fresh = subprocess.run([sys.executable, "-c", _FRESH, str(tmp_path / "crops.npy"), *map(str, firsts)],
                           capture_output=True, check=True, timeout=150).stdout
    each = len(fresh) // len(bufs)
    for k, buf in enumerate(bufs):
        for whole in (None, np.zeros(n, np.uint8)):
            out = torch.zeros(n, 3, 32, 40, dtype=torch.uint8)
            assert _codec.decode_crop_resize([buf] * n, crops, np.zeros(n, bool), out, 1,
                                              whole=whole) == [None] * n
            assert out.numpy().tobytes() == fresh[k * each:(k + 1) * each], (k, whole is None)


# ---------------------------------------------------------------------------- bounded work


def many_scans(scans: int) -> bytes:
    """A progressive JPEG whose last scan (with the Huffman tables before it) comes again and
    again: each repeat is a pass over the whole image for a few bytes of file."""
    d = jpeg(noise(64, 48, 7), progressive=True)
    sos = [i for i in range(2, len(d) - 1) if d[i] == 0xFF and d[i + 1] == 0xDA]
    assert len(sos) >= 2
    last = d[sos[-1]:len(d) - 2]  # the last scan: its header and data, to before EOI
    have = len(sos)
    return d[:-2] + last * (scans - have) + b"\xff\xd9"


_PEAK = """
import resource, sys
import numpy as np, torch
from fastdata import _codec
data, n = open(sys.argv[1], "rb").read(), int(sys.argv[2])
crops = np.tile(np.array([0, 0, 9440, 9440], np.float64), (n, 1))
out = torch.empty((n, 3, 8, 8), dtype=torch.uint8)
assert _codec.decode_crop_resize([data] * n, crops, np.zeros(n, np.uint8), out, threads=n, index=False) == [None] * n
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


@pytest.mark.skipif(not _codec.AVAILABLE, reason="the native decoder")
def test_progressive_files_decoded_at_once_hold_a_bounded_buffer(tmp_path):
    """A progressive JPEG at the pixel limit takes a 535 MB coefficient buffer from a file of
    under 1 MB. Four decoded at once on four threads hold at most the budget (1 GiB: two of
    them) in such buffers, not four buffers: peak memory within 1.5 buffers of one decode's."""
    path = tmp_path / "x.jpg"
    Image.new("RGB", (9440, 9440), (120, 60, 200)).save(path, "JPEG", progressive=True, subsampling=0, quality=10)
    assert path.stat().st_size < 2 << 20

    def peak(n: int) -> int:
        run = subprocess.run([sys.executable, "-c", _PEAK, str(path), str(n)], capture_output=True, text=True,
                             timeout=300)
        assert run.returncode == 0, run.stderr
        return int(run.stdout) * 1024

    one, four = peak(1), peak(4)
    buffer = 1180 * 1180 * 3 * 128
    assert four < one + 1.5 * buffer, (one, four)


def test_many_scans_refused_before_any_decode(tmp_path):
    limit = _structure.MAX_SCANS
    assert _codec._ext.MAX_SCANS == limit == 100
    at_limit, over = many_scans(limit), many_scans(20 * limit)
    for d in (at_limit, over):
        native = _structure.inspect_batch([d])[0]
        assert native == _structure.check_structure(d)  # the Python walk
    assert _structure.check_structure(at_limit).cause is None
    cause = _structure.check_structure(over).cause
    assert cause.startswith(f"corrupt JPEG: more than {limit} scans (the scan at byte ")
    for index in (True, False):
        assert decode([over], [(0, 0, 64, 48)], index=index)[1] == [cause]
    (tmp_path / "scans.jpg").write_bytes(over)
    Image.new("RGB", (16, 16), (200, 0, 0)).save(tmp_path / "ok.jpg")
    pairs = [(str(tmp_path / "ok.jpg"), 0), (str(tmp_path / "scans.jpg"), 1)]
    with pytest.raises(DataError, match=r"scans.jpg: corrupt JPEG: more than 100 scans"):
        list(fastdata.loader(pairs, batch_size=2, transform=T.Compose([T.Resize((8, 8))]), device="cpu", num_workers=0))


def test_a_large_image_may_have_fewer_scans():
    """Each scan is a pass over the whole image, so the scans a JPEG may have fall with its
    size: as many as pass over MAX_SCAN_PIXELS pixels in all, never fewer than 10 nor more than
    MAX_SCANS (at the pixel limit, 100 scans of a 9450x9450 image cost 2.4 s a decode, 10 cost
    0.5 s). The native walk and the Python one agree on every size."""
    assert _codec._ext.MAX_SCAN_PIXELS == _structure.MAX_SCAN_PIXELS == 1 << 31

    def sized(d: bytes, w: int, h: int) -> bytes:  # the frame header's size changed: the walk reads no more
        sof = next(i for i in range(2, len(d) - 1) if d[i] == 0xFF and d[i + 1] in (0xC0, 0xC1, 0xC2))
        return d[:sof + 5] + h.to_bytes(2, "big") + w.to_bytes(2, "big") + d[sof + 9:]

    for (w, h), most in (((64, 48), 100), ((4096, 4096), 100), ((8000, 4000), 67), ((9450, 9450), 24),
                         ((40000, 40000), 10)):
        assert _structure.max_scans(w, h) == most
        for scans in (most, most + 1):
            d = sized(many_scans(scans), w, h)
            cause = _structure.check_structure(d).cause
            assert _structure.inspect_batch([d])[0] == _structure.check_structure(d)
            if scans == most:
                assert cause is None
            elif most == 100:
                assert cause.startswith("corrupt JPEG: more than 100 scans (the scan at byte ")
            else:
                assert cause.startswith(f"corrupt JPEG: more than {most} scans for its {w}x{h} pixels (each a pass ")


def many_chunks(chunks: int) -> bytes:
    """A 16x16 PNG whose image data is preceded by empty private chunks, `chunks` in all."""
    rows = zlib.compress(b"".join(b"\0" + b"\x80" * 48 for _ in range(16)))
    ihdr = (16).to_bytes(4, "big") * 2 + bytes([8, 2, 0, 0, 0])
    return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"abCd", b"") * (chunks - 3) + \
        png_chunk(b"IDAT", rows) + png_chunk(b"IEND", b"")


def test_many_png_chunks_refused_before_any_decode(tmp_path):
    """Pillow keeps every private chunk, at about 5 us and 100 bytes each: 64 MiB of empty ones
    cost 28 s and 580 MB a decode before the bound. The native and the Python walk agree."""
    limit = _structure.MAX_PNG_CHUNKS
    assert _codec._ext.MAX_PNG_CHUNKS == limit == 1 << 17
    at_limit, over = many_chunks(limit), many_chunks(limit + 1)
    for d in (at_limit, over):
        assert _structure.inspect_batch([d])[0] == _structure.check_structure(d)
    assert _structure.check_structure(at_limit).cause is None
    cause = _structure.check_structure(over).cause
    assert cause == f"corrupt PNG: more than {limit} chunks (the chunk at byte {len(over) - 12} is one too many)"
    (tmp_path / "chunks.png").write_bytes(over)
    Image.new("RGB", (16, 16), (200, 0, 0)).save(tmp_path / "ok.png")
    pairs = [(str(tmp_path / "ok.png"), 0), (str(tmp_path / "chunks.png"), 1)]
    with pytest.raises(DataError, match=r"chunks.png: corrupt PNG: more than 131072 chunks"):
        list(fastdata.loader(pairs, batch_size=2, transform=T.Compose([T.Resize((8, 8))]), device="cpu", num_workers=0))


def _good_then_bad(tmp_path, good: bytes, bad: bytes, ext: str):
    """One batch of the files `good` (label 0) and `bad` (label 1) with on_error="skip": (images,
    labels, the loader)."""
    (tmp_path / f"ok.{ext}").write_bytes(good)
    (tmp_path / f"bad.{ext}").write_bytes(bad)
    pairs = [(str(tmp_path / f"ok.{ext}"), 0), (str(tmp_path / f"bad.{ext}"), 1)]
    loader = fastdata.loader(pairs, batch_size=2, transform=T.Compose([T.Resize((8, 8))]), device="cpu",
                             num_workers=0, on_error="skip")
    (x, y), = list(loader)
    return x, y, loader


def cmyk_with(before_sos: bytes) -> bytes:
    """A 16x16 CMYK JPEG (Pillow's path: the native decoder leaves CMYK to it) with `before_sos`
    put before its first scan."""
    out = io.BytesIO()
    Image.new("CMYK", (16, 16), (10, 200, 30, 0)).save(out, "JPEG", quality=95)
    d = out.getvalue()
    sos = d.index(b"\xff\xda")
    return d[:sos] + before_sos + d[sos:]


@pytest.mark.parametrize("flood", ["markers", "fill"])
def test_a_flood_of_jpeg_markers_or_fill_bytes_is_refused_before_any_decode(tmp_path, flood):
    """Pillow parses a JPEG's markers and fill bytes in Python, about 1 us a byte: 20 MiB of
    empty comments or of 0xFF fill cost seconds a decode (CMYK, which Pillow decodes). Over
    MAX_JPEG_MARKERS markers or MAX_JPEG_FILL fill bytes the file is refused; at the bound it
    decodes. The native and the Python walk agree."""
    limit = _structure.MAX_JPEG_MARKERS if flood == "markers" else _structure.MAX_JPEG_FILL
    assert (_codec._ext.MAX_JPEG_MARKERS, _codec._ext.MAX_JPEG_FILL) == (_structure.MAX_JPEG_MARKERS,
                                                                      _structure.MAX_JPEG_FILL) == (1 << 12, 1 << 16)
    base = cmyk_with(b"")
    # the markers the walk counts: each after SOI, EOI included (no restart markers in its data)
    have = sum(1 for i in range(2, len(base) - 1) if base[i] == 0xFF and base[i + 1] not in (0x00, 0xFF))
    if flood == "markers":  # empty comments: 4 bytes a marker
        at_limit, over = (cmyk_with(b"\xff\xfe\x00\x02" * (limit - have + k)) for k in (0, 1))
    else:  # fill bytes before the first scan's marker
        at_limit, over = (cmyk_with(b"\xff" * (limit + k)) for k in (0, 1))
    for d in (at_limit, over):
        assert _structure.inspect_batch([d])[0] == _structure.check_structure(d)
    assert _structure.check_structure(at_limit).cause is None
    cause = _structure.check_structure(over).cause
    assert cause.startswith(f"corrupt JPEG: more than {limit} {'markers' if flood == 'markers' else 'fill bytes'}")
    x, y, loader = _good_then_bad(tmp_path, at_limit, over, "jpg")
    assert y.tolist() == [0] and loader.stats["errors"][0]["cause"] == cause


def test_a_second_png_colour_profile_is_refused_before_any_decode(tmp_path):
    """Pillow inflates every iCCP chunk's profile, up to 1 MiB each: 10,000 of them in a 10 MB
    file cost 30 s a decode. A PNG holds one profile (the PNG standard): a second is refused."""
    rows = zlib.compress(b"".join(b"\0" + b"\x80" * 48 for _ in range(16)))
    ihdr = (16).to_bytes(4, "big") * 2 + bytes([8, 2, 0, 0, 0])
    profile = png_chunk(b"iCCP", b"p\0\0" + zlib.compress(bytes(1 << 20)))

    def png(profiles: int) -> bytes:
        return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + profile * profiles + png_chunk(b"IDAT", rows) + \
            png_chunk(b"IEND", b"")

    one, two = png(1), png(2)
    for d in (one, two):
        assert _structure.inspect_batch([d])[0] == _structure.check_structure(d)
    assert _structure.check_structure(one).cause is None
    assert _structure.check_structure(two).cause == \
        f"corrupt PNG: a second iCCP chunk at byte {33 + len(profile)} (a PNG holds one colour profile)"


def test_a_second_png_header_is_refused_before_any_decode(tmp_path):
    """Pillow takes each IHDR chunk's size over the last one's, so a PNG whose first header says
    16x16 and second 128x128 decodes at 128x128: the pixel limit and the crop planned from the
    first would not hold (a second header of 10000x10000 passed the limit). A PNG has one header
    (libpng refuses a second): refused, natively and in Python alike, and skipped by name."""
    rows = zlib.compress(b"".join(b"\0" + b"\x80" * 48 for _ in range(16)))
    ihdr = (16).to_bytes(4, "big") * 2 + bytes([8, 2, 0, 0, 0])
    second = png_chunk(b"IHDR", (128).to_bytes(4, "big") * 2 + bytes([8, 2, 0, 0, 0]))
    good = b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", rows) + png_chunk(b"IEND", b"")
    bad = good[:33] + second + good[33:]
    assert Image.open(io.BytesIO(bad)).size == (128, 128)  # Pillow's size is the second header's
    for d in (good, bad):
        assert _structure.inspect_batch([d])[0] == _structure.check_structure(d)
    assert _structure.check_structure(good).cause is None
    cause = _structure.check_structure(bad).cause
    assert cause == "corrupt PNG: a second IHDR chunk at byte 33 (a PNG has one header)"
    x, y, loader = _good_then_bad(tmp_path, good, bad, "png")
    assert y.tolist() == [0] and loader.stats["errors"][0]["cause"] == cause
    assert loader.stats["errors"][0]["path"].endswith("bad.png")


@pytest.mark.parametrize("marker", [0xD0, 0xD7, 0x01], ids=["RST0", "RST7", "TEM"])
def test_a_restart_marker_or_tem_before_the_first_scan_is_refused(tmp_path, marker):
    """libjpeg steps over a restart marker or a TEM anywhere, but before the first scan DALI's
    parser refuses a restart marker and Pillow's a TEM: there a file would decode on one backend
    and fail on another (with DALI, as a batch error naming no file), so the walk refuses it on
    every backend. Between scans (libjpeg's alone to read) it decodes to Pillow's pixels."""
    img = noise(48, 40, 3)
    good = jpeg(img)
    bad = good[:2] + bytes([0xFF, marker]) + good[2:]
    for d in (good, bad):
        assert _structure.inspect_batch([d])[0] == _structure.check_structure(d)
    cause = _structure.check_structure(bad).cause
    assert cause == f"corrupt JPEG: unexpected marker 0xFF{marker:02X} at byte 2"
    x, y, loader = _good_then_bad(tmp_path, good, bad, "jpg")
    assert y.tolist() == [0] and loader.stats["errors"][0]["cause"] == cause
    if marker == 0x01:
        return
    progressive = jpeg(img, progressive=True)
    second = progressive.index(b"\xff\xda", scan_start(progressive))  # the second scan's header
    between = progressive[:second] + bytes([0xFF, marker]) + progressive[second:]
    assert _structure.inspect_batch([between])[0] == _structure.check_structure(between)
    assert _structure.check_structure(between).cause is None
    out, errors = decode([between], [(0, 0, 48, 40)], out_hw=(40, 48))
    assert errors == [None] or not any(errors)
    want = np.asarray(Image.open(io.BytesIO(between)).convert("RGB"))
    assert np.abs(out[0].permute(1, 2, 0).numpy().astype(int) - want).max() <= 1


def test_a_png_of_many_compressed_text_chunks_is_refused_before_pillow_inflates_them():
    """Pillow inflates each zTXt and iTXt chunk up to 1 MiB, and counts it against its text limit
    only for some (not a zTXt without a keyword, nor an iTXt that is not UTF-8): 3,000 cost 7 s
    a decode from a 3 MB file. Over MAX_PNG_TEXTS a PNG is refused, natively and in Python
    alike; within it, it decodes."""
    limit = _structure.MAX_PNG_TEXTS
    assert _codec._ext.MAX_PNG_TEXTS == limit == 64
    rows = zlib.compress(b"".join(b"\0" + b"\x80" * 48 for _ in range(16)))
    ihdr = (16).to_bytes(4, "big") * 2 + bytes([8, 2, 0, 0, 0])
    texts = [png_chunk(b"zTXt", b"\0\0" + zlib.compress(bytes(1 << 16))),  # no keyword: not counted by Pillow
             png_chunk(b"iTXt", b"k\0\1\0\0\0" + zlib.compress(b"\xff" * (1 << 16)))]  # not UTF-8: nor this

    def png(n: int) -> bytes:
        return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + b"".join(texts[k % 2] for k in range(n)) + \
            png_chunk(b"IDAT", rows) + png_chunk(b"IEND", b"")

    within, over = png(limit), png(limit + 1)
    for d in (within, over):
        assert _structure.inspect_batch([d])[0] == _structure.check_structure(d)
    assert _structure.check_structure(within).cause is None
    assert np.asarray(Image.open(io.BytesIO(within)))[3, 3].tolist() == [128, 128, 128]
    at = 33 + sum(len(texts[k % 2]) for k in range(limit))
    assert _structure.check_structure(over).cause == \
        f"corrupt PNG: more than {limit} zTXt and iTXt chunks (the last at byte {at})"


def test_a_gif_of_many_comments_is_refused_before_pillow_reads_them(tmp_path):
    """Pillow joins a GIF's comments by copying what it has so far (3 s for 1 MiB of empty
    comment blocks, 27 s for 3 MiB): over MAX_GIF_BLOCKS extension blocks before the first
    image a GIF is refused; within it, it decodes, comments and sub-blocks counted alike."""
    from fastdata.image.check import MAX_GIF_BLOCKS, check_complete

    out = io.BytesIO()
    Image.new("RGB", (8, 8), (250, 0, 0)).save(out, "GIF", comment=b"x" * 600)  # a comment of 3 sub-blocks
    d = out.getvalue()
    at = d.index(b"\x21\xfe")
    within, over = (d[:at] + b"\x21\xfe\x00" * (MAX_GIF_BLOCKS - 4 + k) + d[at:] for k in (0, 1))
    want = f"corrupt GIF: more than {MAX_GIF_BLOCKS} extension blocks and stray bytes before its first image"
    assert check_complete([within])[0][0] is None
    assert check_complete([over])[0][0] == want
    # Stray bytes (Pillow steps over them a byte at a time) count, and do not end the walk.
    strays, more = (d[:at] + b"\x00" * (MAX_GIF_BLOCKS - 4 + k) + d[at:] for k in (0, 1))
    assert check_complete([strays])[0][0] is None and np.asarray(Image.open(io.BytesIO(strays)).convert("RGB"))[4, 4, 0] > 200
    hidden = d[:at] + b"\x00" + b"\x21\xfe\x00" * MAX_GIF_BLOCKS + d[at:]
    assert check_complete([more])[0][0] == check_complete([hidden])[0][0] == want
    x, y, loader = _good_then_bad(tmp_path, within, over, "gif")
    assert y.tolist() == [0] and x[0, :, 4, 4].tolist()[0] > 200 and loader.stats["skipped"] == 1


def many_strips(strips: int, order: str) -> bytes:
    """A 16x16 grayscale TIFF (byte order `order`, "<" or ">") whose StripOffsets list `strips`
    strips, each the whole image."""
    pixels = bytes(range(256))
    offsets_at = 8 + len(pixels)
    counts_at = offsets_at + 4 * strips
    ifd_at = counts_at + 4 * strips
    entries = [(256, 3, 1, 16), (257, 3, 1, 16), (258, 3, 1, 8), (259, 3, 1, 1), (262, 3, 1, 1),
               (273, 4, strips, offsets_at), (277, 3, 1, 1), (278, 3, 1, 16), (279, 4, strips, counts_at)]
    short = (lambda v: struct.pack(order + "HH", v, 0)) if order == ">" else (lambda v: struct.pack("<I", v))
    ifd = struct.pack(order + "H", len(entries)) + b"".join(
        struct.pack(order + "HHI", tag, kind, count) + (short(value) if kind == 3 else struct.pack(order + "I", value))
        for tag, kind, count, value in entries) + bytes(4)
    return ((b"II*\0" if order == "<" else b"MM\0*") + struct.pack(order + "I", ifd_at) + pixels
            + struct.pack(f"{order}{strips}I", *[8] * strips) + struct.pack(f"{order}{strips}I", *[256] * strips) + ifd)


@pytest.mark.parametrize("order", ["<", ">"])
def test_a_tiff_of_too_many_strips_is_refused_before_pillow_opens_it(tmp_path, order):
    """Pillow builds a tile for every strip as it opens a TIFF: 2 million strips for a 16x16
    image cost 25 s and 550 MB a sample before the bound."""
    from fastdata.image.check import MAX_TIFF_PARTS, check_complete

    assert MAX_TIFF_PARTS == 1 << 17
    at_limit, over = many_strips(MAX_TIFF_PARTS, order), many_strips(MAX_TIFF_PARTS + 1, order)
    assert Image.open(io.BytesIO(at_limit)).size == (16, 16)  # a file Pillow reads as it is written
    assert check_complete([at_limit]) == [(None, False, 16, 16)]
    want = f"corrupt TIFF: {MAX_TIFF_PARTS + 1} strips, more than the 131072 a file may have"
    assert check_complete([over])[0][0] == want
    (tmp_path / "strips.tif").write_bytes(over)
    (tmp_path / "ok.tif").write_bytes(at_limit)
    pairs = [(str(tmp_path / "ok.tif"), 0), (str(tmp_path / "strips.tif"), 1)]
    loader = fastdata.loader(pairs, batch_size=2, transform=T.Compose([T.Resize((8, 8))]), device="cpu",
                             on_error="skip")
    ((images, labels),) = list(loader)
    assert labels.tolist() == [0] and loader.stats["errors"][0]["path"].endswith("strips.tif")


def tiled_tiff(tile: int, order: str, kind: int, extra: list[tuple[int, int, int, int]] = (), data: bytes = b"",
               tile_kind: int | None = None) -> bytes:
    """A 16x16 grayscale TIFF (byte order `order`) of one uncompressed tile of `tile` x `tile`
    pixels (pixel (x, y) = (y * tile + x) % 256), its sizes of type `kind` (3 SHORT, 4 LONG,
    8 SSHORT, 9 SLONG), its tile's of `tile_kind` (the same by default; 16: a LONG8, out of
    line); then the (tag, type, count, value) entries `extra`, and `data` after the pixels, at
    8 + tile * tile."""
    pixels = bytes(range(256)) * (tile * tile // 256)
    tile_kind = tile_kind or kind
    long8_at = 8 + len(pixels) + len(data)
    tile_value = long8_at if tile_kind == 16 else tile
    entries = [(256, kind, 1, 16), (257, kind, 1, 16), (258, 3, 1, 8), (259, 3, 1, 1), (262, 3, 1, 1), (277, 3, 1, 1),
               (322, tile_kind, 1, tile_value), (323, tile_kind, 1, tile_value), (324, 4, 1, 8),
               (325, 4, 1, len(pixels)), *extra]
    def value(k: int, count: int, v: int) -> bytes:  # a SHORT held inline, else a LONG or an offset
        return struct.pack(order + "HH", v, 0) if k in (3, 8) and count == 1 else struct.pack(order + "I", v)

    ifd = struct.pack(order + "H", len(entries)) + b"".join(
        struct.pack(order + "HHI", tag, k, count) + value(k, count, v) for tag, k, count, v in entries) + bytes(4)
    tail = data + (struct.pack(order + "Q", tile) if tile_kind == 16 else b"")
    return (b"II*\0" if order == "<" else b"MM\0*") + struct.pack(order + "I", 8 + len(pixels) + len(tail)) + \
        pixels + tail + ifd


@pytest.mark.parametrize("order", ["<", ">"])
@pytest.mark.parametrize("kind", [3, 4, 8, 9], ids=["short", "long", "sshort", "slong"])
def test_a_tiff_tile_far_larger_than_its_image_is_refused(tmp_path, order, kind):
    """libtiff allocates and inflates a tile whole, whatever the image's size: a 16x16 image
    declaring 16384x16384 deflated tiles cost 770 MB from a 783 KB file. A tile larger than its
    image is held to MAX_TIFF_TILE_PIXELS, whatever integer type gives its size (libtiff takes
    signed ones, and a LONG8 out of line); one that covers a small image is read."""
    from fastdata.image.check import MAX_TIFF_TILE_PIXELS, check_complete

    assert MAX_TIFF_TILE_PIXELS == 4096 * 4096
    small, at_limit, over, long8 = (tiled_tiff(t, order, kind, tile_kind=k)
                                    for t, k in ((256, None), (4096, None), (4112, None), (4112, 16)))
    assert check_complete([small, at_limit]) == [(None, False, 16, 16)] * 2
    for bomb in (over, long8):
        assert check_complete([bomb])[0][0] == ("corrupt TIFF: tiles of 4112x4112 pixels for a 16x16 image (a tile "
                                                "larger than its image may have at most 16777216 pixels)")
    rational = tiled_tiff(256, order, kind, tile_kind=5)
    assert check_complete([rational])[0][0] == "corrupt TIFF: a tile size that is not one integer of 0 or more"
    (tmp_path / "ok.tif").write_bytes(small)
    (tmp_path / "tile.tif").write_bytes(over)
    pairs = [(str(tmp_path / "ok.tif"), 0), (str(tmp_path / "tile.tif"), 1)]
    loader = fastdata.loader(pairs, batch_size=2, device="cpu", on_error="skip")
    ((images, labels),) = list(loader)
    assert labels.tolist() == [0] and loader.stats["errors"][0]["path"].endswith("tile.tif")
    assert images.dtype == torch.uint8 and images[0, :, 1, 3].tolist() == [3] * 3  # (256 * 1 + 3) % 256


@pytest.mark.parametrize("order", ["<", ">"])
def test_a_tiff_directory_pillow_would_read_far_past_its_image_is_refused(order):
    """Pillow reads every entry of a TIFF's first directory, and each entry's data, as it opens
    the file (twice a sample): 65,000 entries sharing one 1 MiB block cost 9 s a sample, a
    BigTIFF of a million entries 9 s. Over MAX_TIFF_ENTRIES entries, or entries holding more
    than twice the file out of line, a TIFF is refused; within them it decodes."""
    from fastdata.image.check import MAX_TIFF_ENTRIES, check_complete

    base = 10  # tiled_tiff's own entries
    block = bytes(range(256)) * 256  # 64 KiB, at byte 8 + 256 * 256
    within = tiled_tiff(256, order, 3, extra=[(65000, 1, 1, 0)] * (MAX_TIFF_ENTRIES - base))
    many = tiled_tiff(256, order, 3, extra=[(65000, 1, 1, 0)] * (MAX_TIFF_ENTRIES - base + 1))
    own = tiled_tiff(256, order, 3, extra=[(65000, 1, len(block), 8 + 65536)], data=block)
    shared = tiled_tiff(256, order, 3, extra=[(65000, 1, len(block), 8 + 65536)] * 5, data=block)
    for ok in (within, own):
        assert check_complete([ok]) == [(None, False, 16, 16)]
        assert np.asarray(Image.open(io.BytesIO(ok)))[1, 3] == 3
    assert check_complete([many])[0][0] == \
        f"corrupt TIFF: {MAX_TIFF_ENTRIES + 1} entries in its first directory, more than the 4096 one may have"
    assert check_complete([shared])[0][0] == (f"corrupt TIFF: its directories' entries hold {5 * 65536} "
                                              f"bytes out of line, more than twice the file's {len(shared)}")


def test_a_tiff_list_pillow_unpacks_and_a_jpeg_compressed_tiff_are_refused():
    """Pillow makes a tuple of a TIFF's ColorMap (and BitsPerSample, ...) in Python as it opens
    the file: 5 million SHORTs cost 4 s and 1.1 GB before "invalid palette size". Such a list
    holds at most 3 x 65,536 values (a 16-bit palette). And libtiff decodes a JPEG-compressed
    strip to the size its own JPEG declares (a strip of 4096x8 declaring 4096x60000: 15 s and
    700 MB), so JPEG-compressed TIFFs are not read."""
    from fastdata.image.check import tiff_parts

    block = bytes(3 << 17)  # 3 x 65,536 SHORTs
    within = tiled_tiff(256, "<", 3, extra=[(320, 3, 3 << 16, 8 + 65536)], data=block)
    over = tiled_tiff(256, "<", 3, extra=[(320, 3, (3 << 16) + 1, 8 + 65536)], data=block + bytes(2))
    assert tiff_parts(within) is None
    assert tiff_parts(over) == "corrupt TIFF: a ColorMap of 196609 values, more than the 196608 one may hold"
    for compression in (6, 7):
        jpeg_tiff = tiled_tiff(256, "<", 3, extra=[(259, 3, 1, compression)])
        assert tiff_parts(jpeg_tiff) == ("a TIFF of JPEG-compressed strips or tiles, which are not read: libtiff "
                                         "decodes each to the size its own JPEG header declares, past the image's")


@pytest.mark.parametrize("order", ["<", ">"])
def test_a_tiff_exif_directory_pillow_would_unpack_far_past_its_file_is_refused(order):
    """Pillow parses a TIFF's EXIF and GPS directories as it loads the image, each number into a
    Python object: 1,024 EXIF entries of 32,768 SHORTs sharing one 64 KiB block took 1.35 GB
    from a 78 KB file. Those directories are held to MAX_TIFF_ENTRIES entries and
    MAX_TIFF_EXIF_NUMBERS bytes of numbers; an honest one is read."""
    from fastdata.image.check import MAX_TIFF_ENTRIES, MAX_TIFF_EXIF_NUMBERS, check_complete

    block = bytes(range(256)) * 256
    exif_at = 8 + 65536 + len(block)

    def exif_tiff(entries: list[tuple[int, int, int, int]]) -> bytes:
        ifd = struct.pack(order + "H", len(entries)) + b"".join(
            struct.pack(order + "HHII", tag, kind, count, value) for tag, kind, count, value in entries) + bytes(4)
        return tiled_tiff(256, order, 4, extra=[(34665, 4, 1, exif_at)], data=block + ifd)

    honest = exif_tiff([(36864, 7, 4, 0x30323330), (37510, 7, len(block), 8 + 65536)])  # ExifVersion, UserComment
    assert check_complete([honest]) == [(None, False, 16, 16)]
    assert np.asarray(Image.open(io.BytesIO(honest)))[1, 3] == 3
    shorts = exif_tiff([(40000 + i, 3, 32768, 8 + 65536) for i in range(17)])
    assert check_complete([shorts])[0][0] == (f"corrupt TIFF: its EXIF and GPS directories hold {17 * 65536} bytes "
                                              f"of numbers, more than the {MAX_TIFF_EXIF_NUMBERS} they may")
    many = exif_tiff([(40000, 3, 1, 0)] * (MAX_TIFF_ENTRIES + 1))
    assert check_complete([many])[0][0] == \
        f"corrupt TIFF: {MAX_TIFF_ENTRIES + 1} entries in its EXIF directory, more than the 4096 one may have"


def test_a_pnm_padded_past_its_header_bound_or_full_of_comments_is_refused(tmp_path):
    """Pillow reads a PNM's header a byte at a time (20 MB of padding: 8 s a sample) and drops a
    plain PNM's comments by copying the rest of a 1 MiB block (1 MiB of them: 10 s). A header
    over MAX_PNM_HEADER bytes, or more than MAX_PNM_COMMENTS comments, is refused; within them
    the image decodes."""
    from fastdata.image.check import MAX_PNM_COMMENTS, MAX_PNM_HEADER, check_complete

    rows = b"".join(b"0 1 " * 8 + b"\n" for _ in range(16))  # P1: columns alternate white, black

    def pbm(pad: bytes, comments: int) -> bytes:
        return b"P1\n" + pad + b"16 16\n" + b"#\n" * comments + rows

    header = MAX_PNM_HEADER - len(b"P1\n16 16")
    cases = {"header": (pbm(b" " * header, 0), pbm(b" " * (header + 1), 0)),
             "comment": (pbm(b"#" + b"x" * (header - 2) + b"\n", 0), pbm(b"#" + b"x" * (header - 1) + b"\n", 0)),
             "comments": (pbm(b"", MAX_PNM_COMMENTS), pbm(b"", MAX_PNM_COMMENTS + 1)),
             # Pillow goes on with a token after a comment inside it ("1#...\n6" is 16)
             "glued": (b"P1\n1#x\n6" + b" " * (header - 2) + b"16\n" + rows,
                       b"P1\n1#x\n6" + b" " * (header - 1) + b"16\n" + rows)}
    for name, (ok, bad) in cases.items():
        assert check_complete([ok]) == [(None, False, 16, 16)], name
        assert np.asarray(Image.open(io.BytesIO(ok)).convert("L"))[0, :4].tolist() == [255, 0, 255, 0], name
        want = (f"corrupt PNM: {MAX_PNM_COMMENTS + 1} comments, more than the 1024 it may hold" if name == "comments"
                else f"corrupt PNM: a header of more than {MAX_PNM_HEADER} bytes")
        assert check_complete([bad])[0][0] == want, name
    binary = b"P5\n64 64\n255\n" + b"#" * 4096  # pixels of value 35 ("#"): no comments in binary pixels
    assert check_complete([binary]) == [(None, False, 64, 64)]
    (tmp_path / "ok.pbm").write_bytes(cases["comments"][0])
    (tmp_path / "bad.pbm").write_bytes(cases["comments"][1])
    loader = fastdata.loader([(str(tmp_path / "ok.pbm"), 0), (str(tmp_path / "bad.pbm"), 1)], batch_size=2,
                             device="cpu", on_error="skip")
    ((images, labels),) = list(loader)
    assert labels.tolist() == [0] and images[0, 0, 0, :4].tolist() == [255, 0, 255, 0]
    assert loader.stats["errors"][0]["path"].endswith("bad.pbm")


@pytest.mark.parametrize("magic", [b"P1", b"P2", b"P3"])
def test_a_plain_pnm_over_its_byte_bound_is_refused(magic):
    """Pillow decodes a plain PNM's text in Python, about 0.4 s a MiB (P3): a 256 MiB file cost
    100 s a sample. One over MAX_PLAIN_PNM_BYTES is refused; at the bound it decodes."""
    from fastdata.image.check import MAX_PLAIN_PNM_BYTES, check_complete

    values = 256 * (3 if magic == b"P3" else 1)
    body = magic + b"\n16 16\n" + (b"" if magic == b"P1" else b"255\n") + b" ".join(
        str(i % 2).encode() for i in range(values)) + b"\n"
    ok = body + b" " * (MAX_PLAIN_PNM_BYTES - len(body))
    assert check_complete([ok]) == [(None, False, 16, 16)]
    assert np.asarray(Image.open(io.BytesIO(ok)).convert("L"))[0, :2].tolist() == \
        {b"P1": [255, 0], b"P2": [0, 1], b"P3": [1, 0]}[magic]  # (P3: (0, 1, 0) and (1, 0, 1) in grey)
    assert check_complete([ok + b" "])[0][0] == (f"a plain (text) PNM of {MAX_PLAIN_PNM_BYTES + 1} bytes, over the "
                                                 f"{MAX_PLAIN_PNM_BYTES} taken in that encoding, which Pillow "
                                                 "decodes in Python")


def rle8_bmp(width: int, height: int) -> bytes:
    """A BMP (RLE8) of `width` x `height`, each row runs of 255 pixels of value 128, then an
    end-of-line code; gray palette."""
    palette = b"".join(bytes((i, i, i, 0)) for i in range(256))
    row = b"\xff\x80" * (width // 255) + (bytes((width % 255, 0x80)) if width % 255 else b"") + b"\x00\x00"
    rle = row * height + b"\x00\x01"
    at = 14 + 40 + len(palette)
    info = struct.pack("<IiiHHIIiiII", 40, width, height, 1, 8, 1, len(rle), 2835, 2835, 256, 0)
    return b"BM" + struct.pack("<IHHI", at + len(rle), 0, 0, at) + info + palette + rle


def test_a_large_run_length_encoded_bmp_is_refused():
    """Pillow decodes RLE BMPs in Python: a row's padding a byte at a time (9 s for 80 million
    pixels of end-of-line codes), and a delta code's rows written before the image's end is
    checked (23 GB from a 1 KB file 89 million pixels wide). Over MAX_BMP_RLE_PIXELS, or rows
    wider than MAX_BMP_RLE_WIDTH, such a BMP is refused; within them it decodes."""
    from fastdata.image.check import MAX_BMP_RLE_PIXELS, MAX_BMP_RLE_WIDTH, check_complete

    assert (MAX_BMP_RLE_PIXELS, MAX_BMP_RLE_WIDTH) == (2048 * 2048, 16384)
    for w, h in ((2048, 2048), (16384, 256)):
        ok = rle8_bmp(w, h)
        assert check_complete([ok]) == [(None, False, w, h)]
        assert np.asarray(Image.open(io.BytesIO(ok)))[h - 1, w - 1] == 128
    for w, h in ((2048, 2049), (16385, 1)):
        assert check_complete([rle8_bmp(w, h)])[0][0] == (
            f"a run-length encoded BMP of {w}x{h} pixels, over the 4194304 pixels (and 16384 a row) taken in that "
            "encoding, which Pillow decodes in Python")


# ---------------------------------------------------------------------------- one decoder's pixels


def test_fill_bytes_before_a_stuffed_zero_refused_by_every_decoder():
    d = jpeg(noise(96, 64, 8), quality=98)
    start = scan_start(d)
    at = d.index(b"\xff\x00", start)
    bad = d[:at] + b"\xff" + d[at:]  # FF FF 00: libjpeg's two Huffman readers disagree on it
    want = f"corrupt JPEG: fill bytes before a stuffed zero (0xFF 0xFF ... 0x00) at byte {at} of the scan data"
    assert _structure.check_structure(bad).cause == want == _structure.inspect_batch([bad])[0].cause
    for index in (True, False):
        assert decode([bad], [(0, 0, 96, 64)], index=index)[1] == [want]


def test_fill_bytes_before_a_restart_marker_decode_alike():
    # Fill bytes before a marker are the standard's: both decoders take them, with one result.
    img = noise(96, 64, 9)
    d = jpeg(img, restart_marker_blocks=2)
    start = scan_start(d)
    rst = [i for i in range(start, len(d) - 1) if d[i] == 0xFF and 0xD0 <= d[i + 1] <= 0xD7]
    assert len(rst) > 3
    filled = d[:rst[2]] + b"\xff\xff" + d[rst[2]:]
    assert _structure.check_structure(filled).cause is None
    crops = crops_of(96, 64)[:2]
    got, errors = decode([filled] * 2, crops)
    want, want_errors = decode([filled] * 2, crops, index=False)
    plain, _ = decode([d] * 2, crops, index=False)
    assert errors == want_errors == [None, None]
    assert torch.equal(got, want) and torch.equal(got, plain)


# ---------------------------------------------------------------------------- memory


def test_scratch_buffers_shrink_after_an_oversized_file():
    big = jpeg(Image.fromarray(np.random.default_rng(10).integers(0, 256, (2000, 2600, 3), np.uint8)),
               quality=95)
    assert len(big) > 5 << 20
    small = jpeg(noise(320, 240, 11))
    decode([small], [(0, 0, 320, 240)])
    kept = _codec._ext.decoder_scratch_bytes()
    assert decode([big], [(0, 0, 2600, 2000)], out_hw=(224, 224))[1] == [None]
    assert _codec._ext.decoder_scratch_bytes() < 4 << 20
    decode([small], [(0, 0, 320, 240)])
    assert _codec._ext.decoder_scratch_bytes() <= max(kept, 1 << 20)
