"""Fuzzing of the native core and the tar/index readers (csrc/fuzz/, scripts/fuzz.sh).

* A bounded run of every fuzz target (libFuzzer with ASan + UBSan for the native JPEG decode and
  the collation, atheris for the tar and index readers) that fails on any crash or finding. It
  needs clang and atheris: skipped without them, except under CI (CI=true), where it fails.
* Replays of every checked-in input in tests/fuzz_corpus/<target>/ (the crashes fuzzing found,
  each fixed) and of the seed corpus, through the Python API: fastdata._codec for the decoder,
  fastdata._collate for the collation, the readers for the tar target. Each replay reads an input
  as the fuzz target does (csrc/fuzz/*_fuzzer.cpp and tar_fuzzer.py document the layouts) and
  checks what the target checks.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fastdata import _collate, _codec

ROOT = Path(__file__).resolve().parents[2]
CORPUS = Path(__file__).resolve().parents[1] / "fuzz_corpus"
sys.path.insert(0, str(ROOT / "csrc" / "fuzz"))
import seeds  # noqa: E402
import tar_fuzzer  # noqa: E402

SENTINEL = 0xA5


class Cursor:
    """fuzz_input.h's Cursor: bytes from the front, zeros once the input runs out."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def byte(self) -> int:
        if self.at >= len(self.data):
            return 0
        self.at += 1
        return self.data[self.at - 1]


def _inputs(target: str) -> list[Path]:
    return sorted(p for p in (CORPUS / target).iterdir() if p.is_file())


def _ids(paths: list[Path]) -> list[str]:
    return [p.name for p in paths]


def _tools_missing() -> str | None:
    if shutil.which(os.environ.get("CXX_FUZZ", "clang++")) is None:
        return "clang++ (apt-get install clang)"
    try:
        import atheris  # noqa: F401
    except ImportError:
        return "atheris (pip install atheris)"
    return None


# ---------------------------------------------------------------------------- the bounded run


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_fuzz_targets_run_clean(tmp_path):
    """Each target fuzzed for a few seconds from the seed corpus and the checked-in inputs:
    no crash, sanitizer report, hang or failed check. (scripts/fuzz.sh runs the long version.)"""
    missing = _tools_missing()
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"the fuzz run needs {missing}, which CI installs")
        pytest.skip(f"needs {missing}")
    env = {**os.environ, "FUZZ_DIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    seconds = os.environ.get("FASTDATA_FUZZ_SECONDS", "20")
    run = subprocess.run(["bash", str(ROOT / "scripts" / "fuzz.sh"), seconds, "decode", "collate", "tar"],
                         env=env, capture_output=True, text=True)
    assert run.returncode == 0, f"fuzz.sh failed:\n{run.stdout[-6000:]}\n{run.stderr[-6000:]}"
    for target in ("decode", "collate", "tar"):
        assert f"{target}: clean" in run.stdout, run.stdout[-3000:]


# ---------------------------------------------------------------------------- decode replay


def _out(n: int, h: int, w: int, layout: int) -> tuple[np.ndarray, np.ndarray, int]:
    """decode_fuzzer.cpp's `Out`: (buffer holding exactly the view's span, the [n, 3, h, w]
    view with the layout's strides, the view's first element's offset in the buffer)."""
    if layout == 1:
        sc, sw, sh, sb = 1, 3, 3 * w, 3 * h * w
    elif layout == 2:
        sc, sw, sh = 1, 4, 4 * w + 5
        sb = sh * h + 7
    elif layout == 3:
        sw, sh, sc, sb = 1, -w, h * w, 3 * h * w
    else:
        sw, sh, sc, sb = 1, w, h * w, 3 * h * w
    lo = hi = 0
    for extent, stride in zip((n, 3, h, w), (sb, sc, sh, sw)):
        reach = (extent - 1) * stride
        lo, hi = (lo + reach, hi) if reach < 0 else (lo, hi + reach)
    buf = np.full(hi - lo + 1, SENTINEL, np.uint8)
    view = np.lib.stride_tricks.as_strided(buf[-lo:], shape=(n, 3, h, w), strides=(sb, sc, sh, sw))
    return buf, view, -lo


def decode_case(data: bytes) -> bool:
    """decode_fuzzer.cpp's checks, through fastdata._codec (numpy outputs in the same layouts).
    Whether the crop decoded."""
    cur = Cursor(data)
    out_w, out_h = 1 + cur.byte() % 64, 1 + cur.byte() % 64
    fx, fy, fw, fh = cur.byte(), cur.byte(), cur.byte(), cur.byte()
    flags, nudge = cur.byte(), cur.byte()
    jpeg = data[8:]
    flip, pair, partial, layout = bool(flags & 1), bool(flags & 8), bool(flags & 16), (flags >> 1) & 3
    resample, crop_first = "bicubic" if flags & 32 else "bilinear", bool(flags & 64)
    order = {"resample": resample, "crop_first": crop_first, "vertical_first": [bool(flags & 128)]}

    try:
        W, H, components = _codec.jpeg_info(jpeg)
        info_ok = True
        assert W >= 1 and H >= 1 and components >= 1
        if W * H > 1 << 22:
            return False
    except ValueError as e:
        assert str(e), "jpeg_info raised ValueError without a message"
        W = H = 1
        components, info_ok = 0, False
    w = 1 + fw * (W - 1) // 255
    h = 1 + fh * (H - 1) // 255
    crop = [fx * (W - w) // 255, fy * (H - h) // 255, w, h]
    crop = [v + (0, 1, -1, 2)[(nudge >> (2 * k)) & 3] for k, v in enumerate(crop)]

    n = 2 if pair else 1
    flips = np.array([flip, not flip][:n])
    whole = np.array([not partial, True][:n])  # the first sample stops at its window's last row
    buf, view, origin = _out(n, out_h, out_w, layout)
    errors = _codec.decode_crop_resize([jpeg] * n, np.array([crop] * n), flips, view, threads=n, whole=whole,
                                       resample=resample, crop_first=crop_first,
                                       vertical_first=[bool(flags & 128)] * n)
    _, ref, _ = _out(1, out_h, out_w, 0)
    (ref_error,) = _codec.decode_crop_resize([jpeg], np.array([crop]), np.array([False]), ref, threads=1, **order)
    ok = ref_error is None
    assert info_ok or not ok, "decoded a JPEG whose header jpeg_info refused"
    # The differential check: libjpeg's own Huffman decoder (index=False) on the same crop gives
    # the same pixels, or fails where the checkpoint decoder fails; it may decode what the
    # checkpoint decoder refuses only where that one is stricter by design (a bad Huffman code).
    _, lib, _ = _out(1, out_h, out_w, 0)
    (lib_error,) = _codec.decode_crop_resize([jpeg], np.array([crop]), np.array([False]), lib, index=False, **order)
    if ok:
        assert lib_error is None, f"the checkpoint decoder decoded what libjpeg's refused: {lib_error}"
        np.testing.assert_array_equal(lib, ref, "the checkpoint decoder and libjpeg's disagree on a pixel")
    elif lib_error is None:
        assert "bad Huffman code" in ref_error, \
            f"libjpeg's decoder decoded what the checkpoint decoder refused: {ref_error}"
    in_view = np.zeros(buf.shape, bool)
    np.lib.stride_tricks.as_strided(in_view[origin:], view.shape, view.strides)[...] = True
    for i, error in enumerate(errors):
        got = error is None
        # A decode that stops at the window's last row may pass where the whole one fails
        # (corrupt data below the window), never the other way.
        assert got == ok if whole[i] else got or not ok, \
            f"one call decoded the crop and another did not: {error} / {ref_error}"
        if not got:
            assert isinstance(error, str) and error, "a failed sample has no message"
            assert (view[i] == SENTINEL).all(), f"a failed sample's output was written ({error})"
            continue
        assert info_ok, "decoded (to the window's end) a JPEG whose header jpeg_info refused"
        if components == 1:
            assert (view[i] == view[i][:1]).all(), "grayscale came out in color"
        if ok:  # else decoded to the window's end only: no whole decode to compare
            want = ref[0][:, :, ::-1] if flips[i] else ref[0]
            np.testing.assert_array_equal(view[i], want, "layout, flip or the decode's end changed a pixel value")
    assert (buf[~in_view] == SENTINEL).all(), "a byte outside the output view was written"

    # A window of the whole image's resize (decode_fuzzer.cpp says how the input picks it).
    rw, rh = out_w + fw % 64, out_h + fh % 64
    rx = fx * (rw - out_w) // 255 + (0, 1, -1, 2)[nudge & 3]
    ry = fy * (rh - out_h) // 255 + (0, 1, -1, 2)[(nudge >> 2) & 3]
    inside = rx >= 0 and ry >= 0 and rx + out_w <= rw and ry + out_h <= rh
    window, sizes = np.array([[rx, ry, out_w, out_h]]), np.array([[rw, rh]])
    _, resized, _ = _out(1, out_h, out_w, 0)
    (error,) = _codec.decode_crop_resize([jpeg], window, np.array([False]), resized, resized=sizes, **order)
    crop_inside = crop[2] > 0 and crop[3] > 0 and crop[0] >= 0 and crop[1] >= 0 and crop[0] + crop[2] <= W \
        and crop[1] + crop[3] <= H  # (then whether the file decodes is the reference's answer)
    assert error is not None or inside, "decoded a window outside the whole resize"
    assert not crop_inside or (error is None) == (ok and inside), \
        f"a window of the whole resize decoded where the crop did not, or not where it did: {error}"
    if error is not None:
        assert error and (resized == SENTINEL).all(), f"a failed window's output was written ({error})"
    else:
        if components == 1:
            assert (resized[0] == resized[0][:1]).all(), "grayscale came out in color (a window of the whole resize)"
        _, lib, _ = _out(1, out_h, out_w, 0)
        (lib_error,) = _codec.decode_crop_resize([jpeg], window, np.array([False]), lib, index=False, resized=sizes,
                                                 **order)
        assert lib_error is None, lib_error
        np.testing.assert_array_equal(lib, resized, "libjpeg's decoder disagrees on a window of the whole resize")
    _, simd, _ = _out(1, out_h, out_w, 0)  # Pillow-SIMD's weights: the same answer, grey kept grey
    (simd_error,) = _codec.decode_crop_resize([jpeg], window, np.array([False]), simd, resized=sizes,
                                              weights="pillow-simd", **order)
    assert (simd_error is None) == (error is None), f"Pillow-SIMD's weights decoded otherwise: {simd_error}"
    assert simd_error is None or (simd == SENTINEL).all(), "a failed window's output was written (Pillow-SIMD's)"
    assert simd_error is not None or components != 1 or (simd[0] == simd[0][:1]).all(), "grayscale in color"
    return ok


DECODE_INPUTS = _inputs("decode")


@pytest.mark.skipif(not _codec.AVAILABLE, reason="native JPEG decoder not built")
@pytest.mark.parametrize("path", DECODE_INPUTS, ids=_ids(DECODE_INPUTS))
def test_decode_corpus_replays(path):
    # Named for what they do: "decodes-..." inputs decode, the others are refused.
    assert decode_case(path.read_bytes()) == path.name.startswith("decodes-")


@pytest.mark.skipif(not _codec.AVAILABLE, reason="native JPEG decoder not built")
def test_decode_seeds_replay():
    """The seed corpus (every encoding in seeds.py behind each parameter header) decodes or
    fails cleanly, and the checks hold; every JPEG but the CMYK one decodes whole (header 0),
    so most cases get every pixel compared with the reference."""
    for name, data in seeds.decode_seeds().items():
        decoded = decode_case(data)
        if name.endswith("-0"):
            assert decoded == (name not in ("cmyk-0", "png-0")), name


def _without(jpeg: bytes, marker: int) -> bytes:
    """The JPEG with its `marker` segments (0xDB: quantization tables, 0xC4: Huffman tables)
    taken out of the header: an abbreviated datastream, which relies on tables from elsewhere."""
    out, pos = bytearray(jpeg[:2]), 2
    while jpeg[pos + 1] != 0xDA:  # up to the scan
        end = pos + 2 + int.from_bytes(jpeg[pos + 2:pos + 4], "big")
        if jpeg[pos + 1] != marker:
            out += jpeg[pos:end]
        pos = end
    return bytes(out + jpeg[pos:])


@pytest.mark.skipif(not _codec.AVAILABLE, reason="native JPEG decoder not built")
@pytest.mark.parametrize("marker", [0xDB, 0xC4], ids=["no-quant-tables", "no-huffman-tables"])
def test_decode_keeps_no_tables_from_an_earlier_image(marker):
    """The fuzzer found the same bytes decoding on one thread and failing on another: libjpeg
    keeps a decompressor's tables from image to image, so a JPEG missing one took it from the
    image its thread read before. Now each decodes as it would alone: without quantization
    tables it fails (as in Pillow), without Huffman tables it gets libjpeg-turbo's defaults,
    whatever came before."""
    pic = seeds.picture(48, 40, 3)
    target = _without(seeds.jpeg(pic, quality=50), marker)
    earlier = [seeds.jpeg(pic, quality=10, optimize=True),
               seeds.jpeg(pic, quality=97, subsampling=0, optimize=True)]
    results = []
    for before in earlier:
        (error,) = _codec.decode_crop_resize([before], np.array([[0, 0, 48, 40]]), np.array([False]),
                                              np.zeros((1, 3, 8, 8), np.uint8))
        assert error is None
        out = np.zeros((1, 3, 16, 16), np.uint8)
        (error,) = _codec.decode_crop_resize([target], np.array([[0, 0, 48, 40]]), np.array([False]), out)
        results.append((error, out))
    if marker == 0xDB:
        assert all(e is not None and "Quantization table 0x00" in e for e, _ in results), results
    else:
        assert all(e is None for e, _ in results), results
        np.testing.assert_array_equal(results[0][1], results[1][1])


# ---------------------------------------------------------------------------- collate replay

ITEM_SIZES = (1, 2, 4, 8, 16)
NUMPY_DTYPES = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64, 16: np.complex128}
TORCH_DTYPES = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _layout(cur: Cursor, shape: list[int], es: int, source: bool) -> tuple[list[int], int, int, int]:
    """collate_fuzzer.cpp's `Layout`: (byte strides, lo, hi, misalign)."""
    ndim = len(shape)
    order = list(range(ndim))
    for d in range(ndim):
        j = d + cur.byte() % (ndim - d)
        order[d], order[j] = order[j], order[d]
    pads, align = cur.byte(), cur.byte()
    strides = [0] * ndim
    step = es
    for k, d in enumerate(order):
        strides[d] = step
        step = step * max(shape[d], 1) + ((pads >> (k % 4 * 2)) % 3) * es
    misalign = 0
    for d in range(ndim):
        s = cur.byte() % 4
        if source and s == 2:
            strides[d] = -strides[d]
        if source and s == 3:
            strides[d] = 0
    if source and es > 1 and align & 1:
        misalign = 1 + (align >> 1) % (es - 1)
    lo = sum(min(0, (max(n, 1) - 1) * s) for n, s in zip(shape, strides))
    hi = sum(max(0, (max(n, 1) - 1) * s) for n, s in zip(shape, strides)) + es
    return strides, lo, hi, misalign


def _bytes_view(buf: bytearray, offset: int, shape, strides, es: int) -> np.ndarray:
    """The elements as uint8 [..., es]: copies through it are byte exact whatever the dtype."""
    return np.ndarray((*shape, es), np.uint8, buffer=buf, offset=offset, strides=(*strides, 1))


def collate_case(data: bytes) -> None:
    """collate_fuzzer.cpp's case through fastdata._collate: numpy sources into a numpy batch
    (copy_into_native), and where torch can hold them (aligned, no negative strides) torch
    tensors through the raw-address path; both against a byte-exact numpy copy."""
    cur = Cursor(data)
    ndim = cur.byte() % 6
    es = ITEM_SIZES[cur.byte() % 5]
    counts = cur.byte()
    n, threads = 1 + counts % 4, 1 + (counts >> 2) % 3
    shape = [cur.byte() % 6 for _ in range(ndim)]
    out_strides, _, span, _ = _layout(cur, shape, es, False)
    batch_stride = span + (cur.byte() % 3) * es
    out_bytes = (n - 1) * batch_stride + span
    dtype = NUMPY_DTYPES[es]

    samples, buffers = [], []
    want = bytearray([SENTINEL]) * out_bytes
    for i in range(n):
        strides, lo, hi, misalign = _layout(cur, shape, es, True)
        buf = bytearray((k * 131 + 7 * i + 1) & 0xFF for k in range(misalign + hi - lo))
        buffers.append((buf, misalign - lo, strides))
        samples.append(np.ndarray(shape, dtype, buffer=buf, offset=misalign - lo, strides=strides))
        _bytes_view(want, i * batch_stride, shape, out_strides, es)[...] = _bytes_view(buf, misalign - lo, shape,
                                                                                      strides, es)

    got = bytearray([SENTINEL]) * out_bytes
    out = np.ndarray((n, *shape), dtype, buffer=got, strides=(batch_stride, *out_strides))
    _collate.copy_into_native(samples, out, threads)
    assert got == want, "the batch differs from the element-by-element copy"

    torch_ok = es in TORCH_DTYPES and all(m == 0 and min(s, default=0) >= 0 for _, m, s in buffers)
    if torch_ok and out_bytes:
        tdt = TORCH_DTYPES[es]
        tensors = [torch.frombuffer(buf, dtype=torch.uint8).view(tdt).as_strided(shape, [s // es for s in st],
                                                                                  off // es)
                   if len(buf) else torch.empty(shape, dtype=tdt)
                   for buf, off, st in buffers]
        got_t = bytearray([SENTINEL]) * out_bytes
        out_t = torch.frombuffer(got_t, dtype=torch.uint8)[: out_bytes - out_bytes % es].view(tdt)
        out_t = out_t.as_strided((n, *shape), (batch_stride // es, *[s // es for s in out_strides]))
        _collate._copy_checked_tensors(tensors, out_t, threads)
        assert got_t == want, "the raw-address path's batch differs from the element-by-element copy"


COLLATE_INPUTS = _inputs("collate")


@pytest.mark.skipif(not _collate.NATIVE, reason="native extension not built")
@pytest.mark.parametrize("path", COLLATE_INPUTS, ids=_ids(COLLATE_INPUTS))
def test_collate_corpus_replays(path):
    collate_case(path.read_bytes())


@pytest.mark.skipif(not _collate.NATIVE, reason="native extension not built")
def test_collate_cases_cover_every_kernel():
    """Hand-made cases in the fuzz layout: contiguous, HWC -> CHW and back (the planar kernels),
    reversed, broadcast and misaligned sources, padded batches, every element size."""
    # ndim 3, shape [3, 5, 4]; a permutation byte 0 puts dimension 0 (size 3) innermost: HWC
    # seen as CHW, and 2 keeps the C order; 2 samples on 2 threads, the second one padded.
    for es_index in range(5):
        for out_perm in (0, 2):
            for out_pads in (0, 0b010101):
                for src_perm in (0, 2):
                    for sign in (0, 2, 3):
                        for align in (0, 1, 3):
                            collate_case(bytes([3, es_index, 5, 3, 5, 4,
                                                out_perm, out_perm, 0, out_pads, 0, 0, 0, 0, 1,
                                                src_perm, src_perm, 0, 0, align, sign, 0, 0,
                                                src_perm, src_perm, 0, 0b100100, align, 0, sign, 0]))


# ---------------------------------------------------------------------------- tar replay

TAR_INPUTS = _inputs("tar")


@pytest.fixture()
def quiet_readers():
    tar_fuzzer.quiet()


@pytest.mark.parametrize("path", TAR_INPUTS, ids=_ids(TAR_INPUTS))
def test_tar_corpus_replays(path, tmp_path, quiet_readers):
    tar_fuzzer.check(path.read_bytes(), str(tmp_path))


def test_tar_seeds_replay(tmp_path, quiet_readers):
    for name, data in seeds.tar_seeds().items():
        tar_fuzzer.check(data, str(tmp_path))
