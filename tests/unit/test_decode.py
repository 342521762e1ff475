"""The native crop-aware JPEG decoder (fastdata._codec) against Pillow, its reference.

Images are made here: smooth gradients, blurred shapes, a few sharp lines and a little sensor
noise, encoded by Pillow at quality 75-95 (4:4:4, 4:2:2, 4:2:0, progressive, grayscale).

Tolerances, against Pillow's `open -> convert('RGB') -> resize(size, BILINEAR, box) -> flip`:
* full-resolution decode (window < 2x the output): the same pixels as classic Pillow's
  resampling, bit for bit (checked exactly against a model of it below); Pillow-SIMD rounds its
  16-bit coefficients differently, and Pillow 13 sometimes runs the vertical pass first, so
  against the installed Pillow: mean <= 0.5, max <= 4, with headroom over what either gives.
* DCT-scaled decode (window >= 2x the output: libjpeg's IDCT shrinks by 2, 4 or 8 before the
  resize): a different, equally valid low-pass, sharper than Pillow's antialiasing triangle.
  The largest differences are single pixels on the sharp lines, worst where the scaled window
  is exactly the output size and the DCT-reduced image goes out unresampled. Asserted: mean
  <= 1.5, 99.9th percentile <= 28, max <= 64, with headroom over what this content gives.
"""

from __future__ import annotations

import io
import math
import os
import subprocess
import sys
import zlib

import numpy as np
import pytest
import torch

from fastdata import _codec

from _images import extraneous

pytestmark = pytest.mark.skipif(not _codec.AVAILABLE, reason="native JPEG decoder not built")

Image = pytest.importorskip("PIL.Image")
from PIL import ImageDraw, ImageFilter  # noqa: E402

FULL_RES_MEAN, FULL_RES_MAX = 0.5, 4
SCALED_MEAN, SCALED_P999, SCALED_MAX = 1.5, 28, 64


# ---------------------------------------------------------------------------- test images


def photo(w: int, h: int, seed: int = 0) -> Image.Image:
    """Photo-like RGB content: gradients, blurred shapes, a few sharp lines, mild noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    base = np.stack(
        [
            120 + 80 * np.sin(xx / w * np.pi * rng.uniform(0.5, 2) + rng.uniform(0, 6))
            * np.cos(yy / h * np.pi * rng.uniform(0.5, 1.5)),
            100 + 100 * (xx / w) * (1 - yy / h) + 30 * np.sin((xx + yy) / 37.0),
            90 + 120 * (yy / h) - 40 * np.cos(xx / 53.0),
        ],
        -1,
    )
    img = Image.fromarray(np.clip(base, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    for _ in range(8):
        x0, y0 = rng.integers(0, w), rng.integers(0, h)
        r = rng.integers(max(4, min(w, h) // 12), max(6, min(w, h) // 3))
        color = tuple(int(c) for c in rng.integers(0, 256, 3))
        if rng.random() < 0.5:
            draw.ellipse([x0 - r, y0 - r, x0 + r, y0 + r], fill=color)
        else:
            draw.rectangle([x0 - r, y0 - r // 2, x0 + r, y0 + r // 2], fill=color)
    img = img.filter(ImageFilter.GaussianBlur(2.0))
    draw = ImageDraw.Draw(img)
    for _ in range(4):
        x0, y0 = rng.integers(0, w), rng.integers(0, h)
        x1 = x0 + rng.integers(-w // 3, w // 3 + 1)
        y1 = y0 + rng.integers(-h // 3, h // 3 + 1)
        draw.line([x0, y0, x1, y1], fill=tuple(int(c) for c in rng.integers(0, 256, 3)), width=3)
    img = img.filter(ImageFilter.GaussianBlur(0.7))  # lens and demosaicing softness
    noisy = np.asarray(img).astype(np.float32) + rng.normal(0, 2.0, (h, w, 3))
    return Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8))


def encode(img: Image.Image, quality: int = 90, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=quality, **kw)
    return buf.getvalue()


# name -> (bytes, (width, height), components)
_SPECS = {
    "500x375_q90_420": ((500, 375), dict(quality=90, subsampling=2)),
    "333x500_q75_444": ((333, 500), dict(quality=75, subsampling=0)),
    "1000x800_q95_420": ((1000, 800), dict(quality=95, subsampling=2)),
    "64x48_q85_420": ((64, 48), dict(quality=85, subsampling=2)),
    "500x375_q80_422_progressive": ((500, 375), dict(quality=80, subsampling=1, progressive=True)),
    "400x300_q85_gray": ((400, 300), dict(quality=85)),
}


@pytest.fixture(scope="module")
def images() -> dict[str, tuple[bytes, tuple[int, int], int]]:
    out = {}
    for k, (name, (size, kw)) in enumerate(_SPECS.items()):
        img = photo(*size, seed=k)
        components = 3
        if "gray" in name:
            img, components = img.convert("L"), 1
        out[name] = (encode(img, **kw), size, components)
    return out


@pytest.fixture(scope="module")
def cmyk() -> bytes:
    return encode(photo(120, 90, seed=9).convert("CMYK"), 90)


# ---------------------------------------------------------------------------- helpers


def dct_denom(crop, out_hw) -> int:
    """The DCT scaling the decoder picks: the largest 1/d with the scaled window >= the output."""
    w, h = crop[2], crop[3]
    oh, ow = out_hw
    return next((d for d in (8, 4, 2) if w >= ow * d and h >= oh * d), 1)


def native(datas, crops, flips, out_hw, threads=1, resample="bilinear"):
    """decode_crop_resize into a fresh NCHW batch; returns (errors, NHWC numpy)."""
    out = torch.zeros(len(datas), 3, *out_hw, dtype=torch.uint8)
    errors = _codec.decode_crop_resize(
        datas, np.asarray(crops, np.float64).reshape(-1, 4), np.asarray(flips, bool), out, threads,
        resample=resample,
    )
    return errors, out.permute(0, 2, 3, 1).numpy()


def diff_stats(a: np.ndarray, b: np.ndarray) -> tuple[float, float, int]:
    d = np.abs(a.astype(np.int16) - b.astype(np.int16))
    return float(d.mean()), float(np.percentile(d, 99.9)), int(d.max())


def random_crops(rng, size, n, area=(0.02, 1.0)):
    """RandomResizedCrop-like windows (x, y, w, h)."""
    W, H = size
    crops = []
    while len(crops) < n:
        a = W * H * rng.uniform(*area)
        ar = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        w, h = int(round(math.sqrt(a * ar))), int(round(math.sqrt(a / ar)))
        if 0 < w <= W and 0 < h <= H:
            crops.append((int(rng.integers(0, W - w + 1)), int(rng.integers(0, H - h + 1)), w, h))
    return crops


def _bicubic(x):
    """Pillow's bicubic_filter (a = -0.5), written as its C is."""
    a = -0.5
    x = abs(x)
    if x < 1.0:
        return ((a + 2.0) * x - (a + 3.0)) * x * x + 1
    if x < 2.0:
        return (((x - 5) * x + 8) * x - 4) * a
    return 0.0


def _coeffs(in_size, in0, in1, out_size, resample="bilinear", simd=False):
    """Classic Pillow's precompute_coeffs + normalize_coeffs_8bpc for BILINEAR or BICUBIC: the
    taps, their weights and the weights' fraction bits (22; with `simd`, Pillow-SIMD's int16
    weights: the most bits, up to 22, with which the next would bring the largest weight to 2^15)."""
    kernel, reach = (_bicubic, 2.0) if resample == "bicubic" else (lambda x: max(0.0, 1.0 - abs(x)), 1.0)
    in0, in1 = np.float32(in0), np.float32(in1)
    scale = float(np.float32(in1 - in0)) / out_size
    filterscale = max(scale, 1.0)
    support = reach * filterscale
    ksize = int(math.ceil(support)) * 2 + 1
    idx = np.zeros((out_size, ksize), np.int64)
    pre = np.zeros((out_size, ksize))
    for xx in range(out_size):
        center = float(in0) + (xx + 0.5) * scale
        xmin = max(int(center - support + 0.5), 0)
        n = min(int(center + support + 0.5), in_size) - xmin
        ss = 1.0 / filterscale
        w = [kernel((x + xmin - center + 0.5) * ss) for x in range(n)]
        total = 0.0
        for v in w:  # (summed in order, as C sums)
            total += v
        idx[xx, :n] = np.arange(xmin, xmin + n)
        pre[xx, :n] = [v / total if total else v for v in w]
    bits = 22
    if simd:
        bits = next((p for p in range(22) if int(0.5 + pre.max() * (1 << (p + 1))) >= 1 << 15), 22)
    # C's (int) truncates toward zero: 0.5 is added to positive weights, subtracted from negative
    wts = np.array([[int(v * (1 << bits) + (0.5 if v >= 0 else -0.5)) for v in row] for row in pre], np.int64)
    return idx, wts, bits


def pillow_model(img: np.ndarray, box, size, resample="bilinear", vertical_first=False, simd=False) -> np.ndarray:
    """Classic Pillow `resize(size, BILINEAR or BICUBIC, box)` of an HWC uint8 image: horizontal
    pass first (with `vertical_first`, the vertical one, as Pillow 13 orders some sizes), 22-bit
    fixed-point weights (with `simd`, Pillow-SIMD's int16 ones: `_coeffs`), each pass rounded half
    away from zero and clipped."""
    (ow, oh), (x0, y0, x1, y1) = size, box
    xi, xw, xbits = _coeffs(img.shape[1], x0, x1, ow, resample, simd)
    yi, yw, ybits = _coeffs(img.shape[0], y0, y1, oh, resample, simd)

    def across(a):
        return np.clip(((a[:, xi, :] * xw[None, :, :, None]).sum(2) + (1 << (xbits - 1))) >> xbits, 0, 255)

    def down(a):
        return np.clip(((a[yi, :, :] * yw[:, :, None, None]).sum(1) + (1 << (ybits - 1))) >> ybits, 0, 255)

    a = img.astype(np.int64)
    return (across(down(a)) if vertical_first else down(across(a))).astype(np.uint8)


# ---------------------------------------------------------------------------- header reads


def test_jpeg_info_matches_pillow(images, cmyk):
    for data, size, components in images.values():
        assert _codec.jpeg_info(data) == (*size, components)
        with Image.open(io.BytesIO(data)) as im:
            assert im.size == size
    assert _codec.jpeg_info(cmyk) == (120, 90, 4)
    datas = [images["64x48_q85_420"][0], b"", b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", cmyk]
    assert _codec.jpeg_info_batch(datas) == [(64, 48, 3), None, None, None, (120, 90, 4)]
    with pytest.raises(ValueError, match="not a JPEG file: starts with 0x89 0x50"):
        _codec.jpeg_info(b"\x89PNG\r\n\x1a\n")


def test_jpeg_info_takes_any_bytes_like(images):
    data = images["64x48_q85_420"][0]
    for view in (data, bytearray(data), memoryview(data), np.frombuffer(data, np.uint8)):
        assert _codec.jpeg_info(view) == (64, 48, 3)


# ---------------------------------------------------------------------------- against Pillow


@pytest.mark.parametrize("resample", ["bilinear", "bicubic"])
@pytest.mark.parametrize("name", list(_SPECS))
def test_full_resolution_matches_pillow(images, name, resample):
    data, (W, H), _ = images[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    cases = [
        ((0, 0, W, H), (224, 224)),  # whole image
        ((0, 0, W, H), (H, W)),  # identity: a plain full decode
        ((0, 0, min(W, 40), min(H, 30)), (224, 224)),  # top-left corner, enlarged
        ((W - 37, H - 21, 37, 21), (64, 96)),  # bottom-right corner
        ((W // 2, H // 3, 3, 2), (50, 70)),  # tiny window, enlarged 20x
        ((1, 1, W - 2, H - 2), (H // 2 + 1, W // 2 + 1)),  # just under 2x: no DCT scaling
        # fractions of a pixel, as a resize before a crop maps the crop into the image
        ((W * 0.1 + 0.31, H * 0.2 + 0.62, W * 0.55 - 0.07, H * 0.6 - 0.93), (57, 61)),
        ((0.5, 0.25, W - 1.0, H - 0.75), (H // 2 + 3, W // 2 + 3)),
    ]
    for crop in random_crops(rng, (W, H), 10):
        cases.append((crop, [(224, 224), (64, 64), (96, 128)][len(cases) % 3]))
    cases = [(c, hw) for c, hw in cases if dct_denom(c, hw) == 1]
    worst = (0.0, 0.0, 0)
    for i, (crop, (oh, ow)) in enumerate(cases):
        flip = i % 2 == 1
        errors, got = native([data], [crop], [flip], (oh, ow), resample=resample)
        assert errors == [None], (crop, errors)
        want = _codec.pillow_crop_resize(data, crop, flip, (ow, oh), resample)
        mean, _, mx = diff_stats(got[0], want)
        assert mean <= FULL_RES_MEAN and mx <= FULL_RES_MAX, (name, crop, (oh, ow), mean, mx)
        worst = tuple(max(a, b) for a, b in zip(worst, (mean, 0.0, mx)))
    print(f"{name} {resample}: full resolution, {len(cases)} crops, worst mean {worst[0]:.3f} max {worst[2]}")


@pytest.mark.parametrize("resample", ["bilinear", "bicubic"])
@pytest.mark.parametrize("name", ["1000x800_q95_420", "500x375_q80_422_progressive", "400x300_q85_gray"])
def test_dct_scaled_matches_pillow(images, name, resample):
    data, (W, H), _ = images[name]
    rng = np.random.default_rng(7)
    cases = [((0, 0, W, H), (H // 2, W // 2)), ((0, 0, W, H), (H // 4, W // 4))]
    cases += [((0, 0, W, H), (hw, hw)) for hw in (224, 112, 64, 40, 24)]
    cases += [(c, (48, 56)) for c in random_crops(rng, (W, H), 6, area=(0.3, 1.0))]
    cases = [(c, hw) for c, hw in cases if dct_denom(c, hw) > 1]
    assert {dct_denom(c, hw) for c, hw in cases} >= {2, 4}
    for i, (crop, (oh, ow)) in enumerate(cases):
        flip = i % 2 == 0
        errors, got = native([data], [crop], [flip], (oh, ow), resample=resample)
        assert errors == [None], (crop, errors)
        want = _codec.pillow_crop_resize(data, crop, flip, (ow, oh), resample)
        mean, p999, mx = diff_stats(got[0], want)
        print(f"{name} {resample} crop {crop} -> {ow}x{oh} (1/{dct_denom(crop, (oh, ow))}): "
              f"mean {mean:.3f} p99.9 {p999:.1f} max {mx}")
        assert mean <= SCALED_MEAN and p999 <= SCALED_P999 and mx <= SCALED_MAX, (crop, (oh, ow))


@pytest.mark.parametrize("resample", ["bilinear", "bicubic"])
def test_exactly_classic_pillow_resampling(images, resample):
    """A window decode equals the full decode of the image resampled by classic Pillow's
    algorithm (its bilinear or bicubic filter), bit for bit, at full resolution and at every
    DCT scale: the crop and skip bookkeeping and the resampling are both exact."""
    rng = np.random.default_rng(3)
    for name in ("500x375_q90_420", "333x500_q75_444", "500x375_q80_422_progressive",
                 "400x300_q85_gray", "1000x800_q95_420"):
        data, (W, H), _ = images[name]
        for d in (1, 2, 4, 8) if name.startswith("1000") else (1,):
            sw, sh = W // d, H // d  # exact: both divisible
            errors, full = native([data], [(0, 0, W, H)], [False], (sh, sw))
            assert errors == [None]
            for _ in range(6):
                ow, oh = int(rng.integers(8, max(9, sw // 2))), int(rng.integers(8, max(9, sh // 2)))
                # a window whose DCT scale is exactly d: in [d, 2d) times the output (capped by
                # the image), or any window smaller than 2x for d = 1
                w = min(W, int(rng.integers(ow * d, ow * 2 * d)) if d > 1 else int(rng.integers(1, W + 1)))
                h = min(H, int(rng.integers(oh * d, oh * 2 * d)) if d > 1 else int(rng.integers(1, H + 1)))
                crop = (int(rng.integers(0, W - w + 1)), int(rng.integers(0, H - h + 1)), w, h)
                if dct_denom(crop, (oh, ow)) != d:
                    continue
                flip = bool(rng.integers(0, 2))
                errors, got = native([data], [crop], [flip], (oh, ow), resample=resample)
                assert errors == [None]
                x, y = crop[0], crop[1]
                want = pillow_model(full[0], (x / d, y / d, (x + w) / d, (y + h) / d), (ow, oh), resample)
                if flip:
                    want = want[:, ::-1]
                assert np.array_equal(got[0], want), (name, d, crop, (oh, ow), flip)


@pytest.mark.parametrize("resample", ["bilinear", "bicubic"])
def test_crop_first_resizes_the_window_cut_out(images, resample):
    """With crop_first, a window of whole pixels is resized as Pillow resizes the crop
    (torchvision's crop, then resize), bit for bit against classic Pillow's algorithm: the filter
    reads no pixel outside it, where resize(box=) does (the two differ at the window's edges).
    A DCT-scaled window is the scaled image's whole pixels around it, cut out."""
    rng = np.random.default_rng(4)
    edges_differ = 0
    for name in ("500x375_q90_420", "333x500_q75_444", "400x300_q85_gray", "1000x800_q95_420"):
        data, (W, H), _ = images[name]
        for d in (1, 2, 4) if name.startswith("1000") else (1,):
            sw, sh = W // d, H // d
            errors, full = native([data], [(0, 0, W, H)], [False], (sh, sw))
            assert errors == [None]
            for _ in range(8):
                ow, oh = int(rng.integers(8, 200)), int(rng.integers(8, 200))
                w = min(W, int(rng.integers(ow * d, ow * 2 * d)) if d > 1 else int(rng.integers(1, W + 1)))
                h = min(H, int(rng.integers(oh * d, oh * 2 * d)) if d > 1 else int(rng.integers(1, H + 1)))
                crop = (int(rng.integers(0, W - w + 1)), int(rng.integers(0, H - h + 1)), w, h)
                if dct_denom(crop, (oh, ow)) != d:
                    continue
                out = torch.zeros(1, 3, oh, ow, dtype=torch.uint8)
                assert _codec.decode_crop_resize([data], np.array([crop], np.float64), np.array([False]), out,
                                                 resample=resample, crop_first=True) == [None]
                got = out[0].permute(1, 2, 0).numpy()
                x, y = crop[0], crop[1]
                x0, y0 = math.floor(x / d), math.floor(y / d)
                x1, y1 = min(sw, math.ceil((x + w) / d)), min(sh, math.ceil((y + h) / d))
                cut = full[0][y0:y1, x0:x1]
                want = pillow_model(cut, (x / d - x0, y / d - y0, (x + w) / d - x0, (y + h) / d - y0), (ow, oh),
                                    resample)
                assert np.array_equal(got, want), (name, d, crop, (oh, ow))
                _, boxed = native([data], [crop], [False], (oh, ow), resample=resample)
                edges_differ += not np.array_equal(boxed[0], got)
    assert edges_differ  # (resize(box=) reads the pixels around the window: not the same)


@pytest.mark.parametrize("resample", ["bilinear", "bicubic"])
def test_a_window_of_the_whole_images_resize(images, resample):
    """With `resized`, torchvision's Resize, then a crop: the window (x, y) of the whole image
    resized to (w, h) at full scale, bit for bit against classic Pillow's algorithm resizing the
    whole decode, then cropped; shrunk and enlarged, one axis kept, either order of passes,
    flipped or not, the samples of one batch with resizes and windows of their own, and rows of
    -1 taking their crop as usual."""
    rng = np.random.default_rng(12)
    for name in ("500x375_q90_420", "333x500_q75_444", "400x300_q85_gray", "500x375_q80_422_progressive",
                 "64x48_q85_420"):
        data, (W, H), _ = images[name]
        errors, full = native([data], [(0, 0, W, H)], [False], (H, W))
        assert errors == [None]
        for rw, rh in ((int(W * 256 / H) if W > H else 256, 256 if W > H else int(H * 256 / W)), (W, int(H * 0.6)),
                       (int(rng.integers(20, 2 * W)), int(rng.integers(20, 2 * H)))):
            ow, oh = int(rng.integers(1, min(rw, 160) + 1)), int(rng.integers(1, min(rh, 160) + 1))
            corners = [(int(rng.integers(0, rw - ow + 1)), int(rng.integers(0, rh - oh + 1))) for _ in range(3)]
            crops = np.array([(x, y, ow, oh) for x, y in corners] + [(0, 0, W, H)], np.float64)
            flips, vertical = np.array([False, True, True, False]), np.array([False, False, True, False])
            resized = np.array([(rw, rh)] * 3 + [(-1, -1)])
            out = torch.zeros(4, 3, oh, ow, dtype=torch.uint8)
            assert _codec.decode_crop_resize([data] * 4, crops, flips, out, resample=resample, crop_first=True,
                                             vertical_first=vertical, resized=resized) == [None] * 4
            got = out.permute(0, 2, 3, 1).numpy()
            for k, (x, y) in enumerate(corners):
                want = pillow_model(full[0], (0, 0, W, H), (rw, rh), resample, vertical_first=bool(vertical[k]))
                want = want[y:y + oh, x:x + ow]
                assert np.array_equal(got[k], want[:, ::-1] if flips[k] else want), (name, (rw, rh), (x, y, ow, oh), k)
            alone = torch.zeros(1, 3, oh, ow, dtype=torch.uint8)
            assert _codec.decode_crop_resize([data], crops[3:], flips[3:], alone, resample=resample, crop_first=True,
                                             vertical_first=vertical[3:]) == [None]
            assert torch.equal(out[3], alone[0]), name


@pytest.mark.parametrize("resample", ["bilinear", "bicubic"])
def test_pillow_simds_weights(images, resample):
    """weights="pillow-simd": Pillow-SIMD's int16 weights, at the fraction bits its pass's largest
    weight allows, bit for bit against the model of its algorithm (`pillow_model(simd=True)`):
    a box resized in place, a window cut out first (either order of passes), and a window of the
    whole image's resize, whose pass is the whole resize's (its weights outside the window set
    the bits too). Classic Pillow's weights give other pixels on most of them."""
    rng = np.random.default_rng(21)
    differ = cases = 0
    for name in ("500x375_q90_420", "333x500_q75_444", "400x300_q85_gray", "64x48_q85_420"):
        data, (W, H), _ = images[name]
        errors, full = native([data], [(0, 0, W, H)], [False], (H, W))
        assert errors == [None]
        for _ in range(6):
            ow, oh = int(rng.integers(8, min(160, W) + 1)), int(rng.integers(8, min(160, H) + 1))
            w, h = min(W, int(rng.integers(ow // 2 + 1, 2 * ow))), min(H, int(rng.integers(oh // 2 + 1, 2 * oh)))
            x, y = int(rng.integers(0, W - w + 1)), int(rng.integers(0, H - h + 1))
            rw, rh = int(rng.integers(ow, 2 * W)), int(rng.integers(oh, 2 * H))
            wx, wy = int(rng.integers(0, rw - ow + 1)), int(rng.integers(0, rh - oh + 1))
            vertical = bool(rng.integers(0, 2))
            wants = [pillow_model(full[0], (x, y, x + w, y + h), (ow, oh), resample, vertical, simd=True),
                     pillow_model(full[0][y:y + h, x:x + w], (0, 0, w, h), (ow, oh), resample, vertical, simd=True),
                     pillow_model(full[0], (0, 0, W, H), (rw, rh), resample, vertical, simd=True)[wy:wy + oh,
                                                                                                  wx:wx + ow]]
            for k, (crop_first, resized) in enumerate(((False, (-1, -1)), (True, (-1, -1)), (True, (rw, rh)))):
                crop = (wx, wy, ow, oh) if k == 2 else (x, y, w, h)
                outs = []
                for weights in ("pillow-simd", "pillow"):
                    out = torch.zeros(1, 3, oh, ow, dtype=torch.uint8)
                    assert _codec.decode_crop_resize([data], np.array([crop], np.float64), [False], out,
                                                     resample=resample, crop_first=crop_first, vertical_first=[vertical],
                                                     resized=[resized], weights=weights) == [None]
                    outs.append(out[0].permute(1, 2, 0).numpy())
                assert np.array_equal(outs[0], wants[k]), (name, k, crop, (ow, oh), (rw, rh))
                differ += not np.array_equal(outs[0], outs[1])
                cases += 1
    assert differ > cases // 2, (differ, cases)
    with pytest.raises(ValueError, match="weights should be 'pillow' or 'pillow-simd', but got 'simd'"):
        _codec.decode_crop_resize([data], np.array([(0, 0, 8, 8)], np.float64), [False],
                                  torch.zeros(1, 3, 8, 8, dtype=torch.uint8), weights="simd")


def test_pillow_simds_weights_are_the_installed_pillow_simds():
    """Where Pillow-SIMD is the Pillow running (fastdata's install builds it): the model of its
    weights (`pillow_model(simd=True)`) is its resize on noise, boxes and sizes drawn at random,
    bilinear and bicubic, and the native decoder's crop of a JPEG is its crop and resize of the
    same file (torchvision's steps), bit for bit."""
    from fastdata._pillow import pillow_info

    if not pillow_info()["simd"]:
        pytest.skip("the Pillow running is not Pillow-SIMD")
    rng = np.random.default_rng(22)
    for t in range(40):
        H, W = int(rng.integers(20, 160)), int(rng.integers(20, 160))
        img = rng.integers(0, 256, (H, W, 3), dtype=np.uint8)
        x0, y0 = float(rng.uniform(0, W / 2)), float(rng.uniform(0, H / 2))
        box = (x0, y0, float(rng.uniform(x0 + 1, W)), float(rng.uniform(y0 + 1, H)))
        size, resample = (int(rng.integers(8, 120)), int(rng.integers(8, 120))), ("bilinear", "bicubic")[t % 2]
        got = np.asarray(Image.fromarray(img).resize(size, getattr(Image.Resampling, resample.upper()), box=box))
        assert np.array_equal(got, pillow_model(img, box, size, resample, simd=True)), (box, size, resample)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (180, 240, 3), dtype=np.uint8)).save(buf, "JPEG", quality=90)
    data = buf.getvalue()
    for crop, (ow, oh), resample in (((10, 20, 200, 150), (96, 80), "bilinear"), ((0, 0, 240, 180), (224, 224), "bicubic"),
                                     ((33, 7, 61, 170), (40, 120), "bicubic")):
        x, y, w, h = crop
        want = np.asarray(Image.open(io.BytesIO(data)).convert("RGB").crop((x, y, x + w, y + h)).resize(
            (ow, oh), getattr(Image.Resampling, resample.upper())))
        out = torch.zeros(1, 3, oh, ow, dtype=torch.uint8)
        assert _codec.decode_crop_resize([data], np.array([crop], np.float64), [False], out, resample=resample,
                                         crop_first=True, weights="pillow-simd") == [None]
        assert np.array_equal(out[0].permute(1, 2, 0).numpy(), want), crop


def test_a_window_of_a_resize_is_checked_and_costs_the_windows_pixels(images):
    """A window of a whole resize must be whole pixels of out's size inside it, else the sample
    fails with the reason (out untouched); the taps are the window's alone, so a resize of a
    500x375 image to a billion pixels a side decodes a 4x4 window of it at once (each output
    pixel its source pixel, so far enlarged)."""
    data, (W, H), _ = images["500x375_q90_420"]
    _, full = native([data], [(0, 0, W, H)], [False], (H, W))
    for crop, size in (((250, 0, 8, 8), (256, 256)), ((0.5, 0, 8, 8), (341, 256)), ((0, 0, 8, 9), (341, 256)),
                       ((-1, 0, 8, 8), (341, 256))):
        out = torch.full((1, 3, 8, 8), 7, dtype=torch.uint8)
        errors = _codec.decode_crop_resize([data], np.array([crop], np.float64), [False], out, resized=[size])
        assert errors[0] == (f"crop ({', '.join(f'{v:g}' for v in crop)}) not whole pixels of the image resized to "
                             f"{size[0]}x{size[1]}"), errors
        assert (out == 7).all()
    big = 10 ** 9
    out = torch.zeros(1, 3, 4, 4, dtype=torch.uint8)
    x, y = int(123.5 * big / W), int(77.5 * big / H)  # (on the centres of source pixels (123, 77))
    assert _codec.decode_crop_resize([data], np.array([(x, y, 4, 4)], np.float64), [False], out,
                                     resized=[(big, big)]) == [None]
    source = full[0][77, 123]
    assert (out[0].permute(1, 2, 0).int() - torch.from_numpy(source).int()).abs().max() <= 1
    with pytest.raises(ValueError, match=r"resized should be an int array of shape \[1, 2\]"):
        _codec.decode_crop_resize([data], np.array([(0, 0, 4, 4)], np.float64), [False], out, resized=[(1.5, 2.0)])


@pytest.mark.parametrize("resample", ["bilinear", "bicubic"])
def test_vertical_first_takes_the_vertical_pass_first(images, resample):
    """With vertical_first, the window is resized vertical pass first, bit for bit against
    classic Pillow's algorithm in that order, for resize(box=) and for the window cut out, flipped
    or not, with the samples of one batch taking either order; bicubic's clipped overshoot
    between the passes makes the two orders differ."""
    rng = np.random.default_rng(9)
    orders_differ = 0
    for name in ("500x375_q90_420", "333x500_q75_444", "400x300_q85_gray"):
        data, (W, H), _ = images[name]
        errors, full = native([data], [(0, 0, W, H)], [False], (H, W))
        assert errors == [None]
        for _ in range(6):
            ow, oh = int(rng.integers(8, 120)), int(rng.integers(8, 120))
            w, h = int(rng.integers(ow // 2 + 1, min(W, 2 * ow - 1) + 1)), int(rng.integers(oh // 2 + 1, min(H, 2 * oh) + 1))
            crop = (int(rng.integers(0, W - w + 1)), int(rng.integers(0, H - h + 1)), w, h)
            box = (crop[0], crop[1], crop[0] + w, crop[1] + h)
            for crop_first in (False, True):
                out = torch.zeros(3, 3, oh, ow, dtype=torch.uint8)
                flips, vertical = np.array([False, True, False]), np.array([True, True, False])
                assert _codec.decode_crop_resize([data] * 3, np.array([crop] * 3, np.float64), flips, out,
                                                 resample=resample, crop_first=crop_first,
                                                 vertical_first=vertical) == [None] * 3
                img = full[0][box[1]:box[3], box[0]:box[2]] if crop_first else full[0]
                at = (0, 0, w, h) if crop_first else box
                want = pillow_model(img, at, (ow, oh), resample, vertical_first=True)
                got = [out[k].permute(1, 2, 0).numpy() for k in range(3)]
                assert np.array_equal(got[0], want) and np.array_equal(got[1], want[:, ::-1]), (name, crop, crop_first)
                assert np.array_equal(got[2], pillow_model(img, at, (ow, oh), resample)), (name, crop, crop_first)
                orders_differ += not np.array_equal(got[0], got[2])
    assert orders_differ
    with pytest.raises(ValueError, match=r"vertical_first should have shape \[1\]"):
        _codec.decode_crop_resize([data], np.array([crop], np.float64), [False], torch.zeros(1, 3, 4, 4, dtype=torch.uint8),
                                  vertical_first=[True, False])


def test_a_filter_per_sample(images):
    """resample given per sample: each sample resized with its own filter, bit for bit the batch
    decoded with that filter alone (and the two filters' pixels differ); a name that is neither
    filter, or the wrong count, raises."""
    data, (W, H), _ = images["500x375_q90_420"]
    crops = np.array([(0, 0, W, H), (40, 30, 300, 200), (10, 5, 120, 240), (0, 0, W, H)], np.float64)
    flips = np.array([False, True, False, True])
    filters = ["bicubic", "bilinear", "bicubic", "bilinear"]
    out = torch.zeros(4, 3, 50, 70, dtype=torch.uint8)
    assert _codec.decode_crop_resize([data] * 4, crops, flips, out, resample=filters, crop_first=True) == [None] * 4
    for resample in ("bilinear", "bicubic"):
        alone = torch.zeros(4, 3, 50, 70, dtype=torch.uint8)
        assert _codec.decode_crop_resize([data] * 4, crops, flips, alone, resample=resample, crop_first=True) == [None] * 4
        for k, f in enumerate(filters):
            assert torch.equal(out[k], alone[k]) == (f == resample), (k, f, resample)
    with pytest.raises(ValueError, match="resample should be 'bilinear' or 'bicubic', but got 'nearest'"):
        _codec.decode_crop_resize([data] * 4, crops, flips, out, resample=["bilinear", "nearest", "bicubic", "bicubic"])
    with pytest.raises(ValueError, match=r"resample should be a filter or have shape \[4\], but got \[2\]"):
        _codec.decode_crop_resize([data] * 4, crops, flips, out, resample=["bilinear", "bicubic"])


def test_pillow_order_is_the_installed_pillows():
    """`pillow_order` tells Pillow 13's order (vertical pass first by `vertical_first`'s rule) from
    earlier Pillows' (Pillow-SIMD's too: horizontal first always), on probes where the two orders
    give other pixels (classic Pillow's algorithm in each order, on the probe's noise)."""
    import PIL

    from fastdata.image import decode

    noise = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    for (w, h), (ow, oh) in decode._PROBES:
        img = noise[:h, :w]
        assert not np.array_equal(pillow_model(img, (0, 0, w, h), (ow, oh), "bicubic"),
                                  pillow_model(img, (0, 0, w, h), (ow, oh), "bicubic", vertical_first=True))
    rules = decode.vertical_first(np.array([[0, 0, *box] for box, _ in decode._PROBES]),
                                  np.array([size for _, size in decode._PROBES]))
    assert rules.any() and not rules.all()
    assert decode.pillow_order() == ("rule" if int(PIL.__version__.split(".")[0]) >= 13 else "horizontal")


def test_flip_mirrors_exactly(images):
    data = images["500x375_q90_420"][0]
    crops = [(10, 20, 300, 200), (0, 0, 500, 375), (100, 50, 33, 17)]
    for crop in crops:
        for hw in ((224, 224), (31, 47)):
            _, plain = native([data], [crop], [False], hw)
            _, flipped = native([data], [crop], [True], hw)
            assert np.array_equal(flipped[0], plain[0][:, ::-1])


def test_output_layouts_and_threads_agree(images):
    names = list(_SPECS)
    rng = np.random.default_rng(11)
    datas, crops = [], []
    for i in range(14):
        data, size, _ = images[names[i % len(names)]]
        datas.append(data)
        crops.append(random_crops(rng, size, 1)[0])
    crops = np.array(crops, np.int32)
    flips = rng.integers(0, 2, len(datas)).astype(bool)
    n, oh, ow = len(datas), 72, 88

    nchw = torch.zeros(n, 3, oh, ow, dtype=torch.uint8)
    assert _codec.decode_crop_resize(datas, crops, flips, nchw, threads=1) == [None] * n
    outs = {
        "channels_last": torch.zeros(n, 3, oh, ow, dtype=torch.uint8).to(
            memory_format=torch.channels_last),
        "hwc": torch.zeros(n, oh, ow, 3, dtype=torch.uint8).permute(0, 3, 1, 2),
        "strided": torch.zeros(n, 3, oh, 2 * ow, dtype=torch.uint8)[..., ::2],
        "numpy": np.zeros((n, 3, oh, ow), np.uint8),
    }
    for layout, out in outs.items():
        assert _codec.decode_crop_resize(datas, crops, flips, out, threads=2) == [None] * n
        assert np.array_equal(np.asarray(out), nchw.numpy()), layout
    for threads in (2, 3, 8):
        again = torch.zeros_like(nchw)
        assert _codec.decode_crop_resize(datas, crops, flips, again, threads) == [None] * n
        assert torch.equal(again, nchw), threads
    # a slot of a bigger batch buffer, as the loader passes it
    big = torch.zeros(n + 4, 3, oh, ow, dtype=torch.uint8)
    assert _codec.decode_crop_resize(datas, crops, flips, big[2:2 + n]) == [None] * n
    assert torch.equal(big[2:2 + n], nchw) and not big[:2].any() and not big[2 + n:].any()


def test_bytes_like_inputs(images):
    data = images["64x48_q85_420"][0]
    crop, hw = (3, 4, 50, 40), (32, 32)
    _, want = native([data], [crop], [False], hw)
    for view in (bytearray(data), memoryview(data), np.frombuffer(data, np.uint8)):
        errors, got = native([view], [crop], [False], hw)
        assert errors == [None] and np.array_equal(got, want)


def test_grayscale_comes_out_as_rgb(images):
    data = images["400x300_q85_gray"][0]
    errors, got = native([data], [(20, 10, 300, 250)], [False], (96, 96))
    assert errors == [None]
    assert np.array_equal(got[0, ..., 0], got[0, ..., 1])
    assert np.array_equal(got[0, ..., 0], got[0, ..., 2])


# ---------------------------------------------------------------------------- errors


def test_errors_are_strings_and_the_rest_of_the_batch_decodes(images, cmyk, capfd):
    good = images["500x375_q90_420"][0]
    prog = images["500x375_q80_422_progressive"][0]
    png = io.BytesIO()
    photo(40, 30).save(png, "PNG")
    rnd = np.random.default_rng(0).integers(0, 256, 4000, dtype=np.uint8).tobytes()
    cases = [
        (good, None),
        (b"", "empty input"),
        (good[: int(len(good) * 0.6)], "truncated JPEG: no end-of-image marker"),
        (png.getvalue(), "not a JPEG file: starts with 0x89 0x50"),
        (rnd, "not a JPEG file"),
        (cmyk, "unsupported JPEG color space CMYK"),
        (prog, None),
        (prog[: int(len(prog) * 0.6)], "truncated JPEG: no end-of-image marker"),
        (b"\xff\xd8" + rnd, "JPEG"),  # a JPEG start, then garbage: libjpeg's own message
        (good, None),
    ]
    datas = [d for d, _ in cases]
    crops = np.array([(0, 0, 120, 90) if d is cmyk else (40, 30, 400, 300) for d in datas])
    flips = np.array([False, True] * 5)
    out = torch.full((len(datas), 3, 64, 80), 7, dtype=torch.uint8)
    errors = _codec.decode_crop_resize(datas, crops, flips, out, threads=2)
    for i, ((_, want), got) in enumerate(zip(cases, errors)):
        if want is None:
            assert got is None, (i, got)
            alone = torch.zeros(1, 3, 64, 80, dtype=torch.uint8)
            assert _codec.decode_crop_resize([datas[i]], crops[i:i + 1], flips[i:i + 1], alone) == [None]
            assert torch.equal(out[i], alone[0])
        else:
            assert isinstance(got, str) and want in got, (i, got)
            assert (out[i] == 7).all(), f"sample {i} failed but its slot was written"
    captured = capfd.readouterr()
    assert captured.out == "" and captured.err == "", "libjpeg printed something"


def test_truncated_is_an_error_whatever_the_crop(images):
    """A baseline decode stops at the window's last row; the file's structure is still walked
    to its end marker, so a cut file fails for a window above the cut too, as it does for
    Pillow. A cut closed with a pasted end marker is structurally whole: the rows below the
    window are entropy-decoded all the same, so libjpeg's strict warning fails it for every crop."""
    good = images["500x375_q90_420"][0]
    cut = good[: int(len(good) * 0.6)]
    for crop in ((0, 0, 100, 50), (0, 0, 500, 375), (300, 300, 200, 75)):
        errors, _ = native([cut], [crop], [False], (32, 32))
        assert errors[0] is not None and "truncated JPEG: no end-of-image marker" in errors[0], (crop, errors)
        errors, _ = native([cut + b"\xff\xd9"], [crop], [False], (32, 32))
        assert errors[0] is not None and "Corrupt JPEG data" in errors[0], (crop, errors)


def test_whole_0_stops_at_the_windows_last_row(images):
    """whole[i] = 0 (for a file already seen to decode whole): the rows below the window are not
    decoded by libjpeg's entropy decoder (index=False). A cut closed with an end marker then
    decodes for a window above the cut, with the intact file's pixels; whole = 1 and the default
    refuse it, as does a window reaching the cut and a progressive file (libjpeg reads every
    scan before the first row). With the checkpoint index (index=True), a file it lacks is
    decoded whole whatever `whole` says (to be indexed): the cut file fails there too."""
    good = images["500x375_q90_420"][0]
    closed = good[: int(len(good) * 0.6)] + b"\xff\xd9"
    top, bottom = (40, 10, 300, 90), (0, 300, 500, 75)

    def run(datas, crops, whole, index=False):
        out = torch.full((len(datas), 3, 32, 32), 7, dtype=torch.uint8)
        errors = _codec.decode_crop_resize(datas, np.array(crops, np.int32), np.zeros(len(datas), bool), out,
                                            2, whole=whole, index=index)
        return errors, out

    errors, _ = run([closed], [top], np.array([0], np.uint8), index=True)
    assert errors[0] is not None and "Corrupt JPEG data" in errors[0], errors

    errors, want = run([good], [top], None)
    assert errors == [None]
    errors, got = run([closed, closed, closed, good], [top] * 4, np.array([0, 1, 0, 0], np.uint8))
    assert errors[0] is None and errors[2] is None and errors[3] is None, errors
    assert "Corrupt JPEG data" in errors[1]
    for i in (0, 2, 3):
        assert torch.equal(got[i], want[0]), i
    assert (got[1] == 7).all()
    errors, _ = run([closed], [top], None)
    assert "Corrupt JPEG data" in errors[0]
    errors, _ = run([closed], [bottom], np.array([False]))
    assert errors[0] is not None and "JPEG" in errors[0], errors
    progressive = images["500x375_q80_422_progressive"][0]
    closed = progressive[: int(len(progressive) * 0.6)] + b"\xff\xd9"
    errors, _ = run([closed, progressive], [top] * 2, np.array([False, False]))
    assert errors[0] is not None and errors[1] is None, errors


def test_crop_outside_the_image(images):
    data = images["500x375_q90_420"][0]
    for crop in ((100, 100, 401, 10), (-1, 0, 10, 10), (0, 370, 10, 6), (5, 5, 0, 10), (0, 0, 500.5, 10)):
        errors, _ = native([data], [crop], [False], (16, 16))
        x, y, w, h = crop
        assert errors == [f"crop ({x}, {y}, {w}, {h}) outside the 500x375 image"]


def test_argument_checks(images):
    data = images["64x48_q85_420"][0]
    out = torch.zeros(1, 3, 8, 8, dtype=torch.uint8)
    crop, flip = np.array([[0, 0, 10, 10]]), np.array([False])
    with pytest.raises(ValueError, match=r"crops should have shape \[1, 4\], but got \[2, 4\]"):
        _codec.decode_crop_resize([data], np.zeros((2, 4), np.int32), flip, out)
    with pytest.raises(ValueError, match=r"crops should have shape \[1, 4\], but got \[4\]"):
        _codec.decode_crop_resize([data], np.zeros(4, np.int32), flip, out)
    with pytest.raises(ValueError, match=r"flips should have shape \[1\], but got \[2\]"):
        _codec.decode_crop_resize([data], crop, np.zeros(2, bool), out)
    with pytest.raises(ValueError, match=r"whole should have shape \[1\], but got \[1, 1\]"):
        _codec.decode_crop_resize([data], crop, flip, out, whole=np.ones((1, 1), bool))
    with pytest.raises(TypeError, match="out should have dtype torch.uint8, but got torch.float32"):
        _codec.decode_crop_resize([data], crop, flip, torch.zeros(1, 3, 8, 8))
    with pytest.raises(ValueError, match=r"out should have shape \[1, 3, H, W\], but got \[1, 8, 8, 3\]"):
        _codec.decode_crop_resize([data], crop, flip, torch.zeros(1, 8, 8, 3, dtype=torch.uint8))
    with pytest.raises(TypeError, match="bytes-like"):
        _codec.decode_crop_resize([123], crop, flip, out)
    for bad in (np.nan, np.inf, 2.0 ** 31):
        with pytest.raises(ValueError, match="crops should be finite and fit in int32"):
            _codec.decode_crop_resize([data], np.array([[0, 0, bad, 10]]), flip, out)
    with pytest.raises(TypeError, match="crops should be an int or float array, but got dtype complex128"):
        _codec.decode_crop_resize([data], crop.astype(complex), flip, out)
    with pytest.raises(ValueError, match="resample should be 'bilinear' or 'bicubic', but got 'lanczos'"):
        _codec.decode_crop_resize([data], crop, flip, out, resample="lanczos")
    with pytest.raises(ValueError, match="resample should be 'bilinear' or 'bicubic', not 'nearest'"):
        _codec._ext.decode_crop_resize([data], crop.astype(np.float64), flip.astype(np.uint8), out, 1, None, True,
                                       "nearest")
    assert _codec.decode_crop_resize([], np.zeros((0, 4), np.int32), np.zeros(0, bool),
                                      torch.zeros(0, 3, 8, 8, dtype=torch.uint8)) == []


# ---------------------------------------------------------------------------- entropy decoding


def _fresh_jpegs(seed: int) -> list[tuple[bytes, tuple[int, int]]]:
    """JPEGs no other test decodes (so no checkpoints exist for them in this process yet): each
    subsampling, odd sizes, grayscale, Huffman tables of their own (optimize), restart markers,
    and a progressive one, which entropy.cpp leaves to libjpeg."""
    specs = [
        ((500, 375), dict(quality=90, subsampling=2)),
        ((333, 251), dict(quality=75, subsampling=0)),
        ((301, 203), dict(quality=85, subsampling=1)),
        ((17, 9), dict(quality=85, subsampling=2)),
        ((300, 200), dict(quality=85, subsampling=2, optimize=True)),
        ((211, 157), dict(quality=80, subsampling=0, optimize=True)),
        ((160, 120), dict(quality=85, restart_marker_blocks=3)),
        ((203, 150), dict(quality=85, subsampling=0, restart_marker_rows=1)),
        ((200, 150), dict(quality=85, progressive=True)),
    ]
    out = [(encode(photo(*size, seed=seed + k), **kw), size) for k, (size, kw) in enumerate(specs)]
    out.append((encode(photo(250, 190, seed=seed + 99).convert("L"), 85), (250, 190)))
    return out


def test_entropy_decoder_gives_libjpegs_pixels(tmp_path):
    """entropy.cpp's Huffman decoding (index=True) keeps a checkpoint per MCU of the bytes it
    decodes, then decodes the same bytes again from the window's MCUs only: the pixels are
    libjpeg's (index=False) for windows at any place and DCT scale, flipped or not, on one
    thread (one image's Huffman tables replacing another's in the thread's cache) and on two,
    decoding whole and stopping at the window's last row. Each file's checkpoints are indexed
    (index_stats' files grows by one a file) by the first decode with index=True, stopped or
    not (a file the index lacks is decoded whole), and by no decode with index=False."""
    rng = np.random.default_rng(11)
    datas, crops = [], []
    for data, size in _fresh_jpegs(1000):
        for crop in random_crops(rng, size, 6, area=(0.01, 1.0)) + [(0, 0, *size)]:
            datas.append(data)
            crops.append(crop)
    order = rng.permutation(len(datas))
    datas = [datas[i] for i in order]
    crops = np.array(crops, np.int32)[order]
    flips = rng.integers(0, 2, len(datas)).astype(bool)
    n = len(datas)
    _codec.open_index(tmp_path / "index.idx")  # an empty index: the user's may hold these files

    def run(index, whole, threads):
        out = torch.zeros(n, 3, 40, 56, dtype=torch.uint8)
        errors = _codec.decode_crop_resize(datas, crops, flips, out, threads, whole=whole, index=index)
        assert errors == [None] * n, [e for e in errors if e][:3]
        return out

    before = _codec.index_stats()["files"]
    want = run(False, None, 1)
    assert _codec.index_stats()["files"] == before
    stop = np.zeros(n, np.uint8)
    # Stopped first: each file decoded whole and indexed; then from the checkpoints, stopped
    # and not, on one and two threads.
    for whole, threads in ((stop, 1), (None, 1), (stop, 1), (None, 2), (stop, 2)):
        assert torch.equal(run(True, whole, threads), want), (whole is None, threads)
    # 9 files of the 10 indexed (not the progressive one).
    assert _codec.index_stats()["files"] - before == 9


def test_entropy_decoder_takes_restart_markers_in_turn(tmp_path):
    """A JPEG with restart markers (a segment every MCU, every 3 MCUs, every MCU row) is decoded
    by entropy.cpp (its checkpoints are kept) with libjpeg's pixels, and so is one with stray
    bytes before its markers (a webcam's), which both decoders step over; with two markers out
    of turn it is left to libjpeg's decoder (no checkpoints), with libjpeg's result; corrupt
    segments fail where libjpeg's decoder fails."""
    rng = np.random.default_rng(21)
    img = photo(180, 130, seed=3000)
    variants = [encode(img, 85, subsampling=2, restart_marker_blocks=1),
                encode(img, 85, subsampling=0, restart_marker_blocks=3),
                encode(img.convert("L"), 85, restart_marker_rows=1)]
    swapped = bytearray(variants[1])
    a, b = swapped.index(b"\xff\xd0"), swapped.index(b"\xff\xd1")
    swapped[a + 1], swapped[b + 1] = 0xD1, 0xD0

    _codec.open_index(tmp_path / "index.idx")  # an empty index: the user's may hold these files

    def run(data, crops, index):
        out = torch.zeros(len(crops), 3, 32, 48, dtype=torch.uint8)
        errors = _codec.decode_crop_resize([data] * len(crops), np.array(crops, np.int32),
                                            np.zeros(len(crops), bool), out, 1, index=index)
        return errors, out

    for data in variants:
        crops = random_crops(rng, (180, 130), 8, area=(0.02, 1.0))
        want_errors, want = run(data, crops, False)
        assert want_errors == [None] * len(crops)
        before = _codec.index_stats()["files"]
        for _ in range(2):  # the first decode keeps checkpoints, the second starts from them
            errors, got = run(data, crops, True)
            assert errors == want_errors and torch.equal(got, want)
        assert _codec.index_stats()["files"] - before == 1
    # 1 to 4 bytes before each marker, as a Logitech C270 writes them: the segments' blocks are
    # decoded from the bits before, so the pixels are the file's without them.
    for data in variants[:2]:
        stray = extraneous(data)
        crops = random_crops(rng, (180, 130), 8, area=(0.02, 1.0))
        want = run(data, crops, False)[1]
        before = _codec.index_stats()["files"]
        for index in (False, True, True):
            errors, got = run(bytes(stray), crops, index)
            assert errors == [None] * len(crops) and torch.equal(got, want), index
        assert _codec.index_stats()["files"] - before == 1
    crops = random_crops(rng, (180, 130), 4)
    before = _codec.index_stats()["files"]
    assert run(bytes(swapped), crops, True)[0] == run(bytes(swapped), crops, False)[0]
    assert _codec.index_stats()["files"] == before

    # Corrupt segments: where libjpeg fails, so does entropy.cpp (the message may differ: past a
    # segment's end it reads the next segment's bits where libjpeg reads zeros); it fails where
    # libjpeg passes only on a bad Huffman code; where both decode, the same pixels.
    base = variants[0]
    sos = base.index(b"\xff\xda")
    start = sos + 2 + int.from_bytes(base[sos + 2:sos + 4], "big")
    for k in range(60):
        b = bytearray(base)
        for p in rng.integers(start, len(base) - 2, size=int(rng.integers(1, 4))):
            b[p] = int(rng.integers(0, 256))
        crops = random_crops(rng, (180, 130), 1, area=(0.05, 1.0))
        want_errors, want = run(bytes(b), crops, False)
        for _ in range(2):
            errors, got = run(bytes(b), crops, True)
            if want_errors[0] is not None:
                assert errors[0] is not None, k
            elif errors[0] is not None:
                assert "bad Huffman code" in errors[0], (k, errors)
            else:
                assert torch.equal(got, want), k


def test_entropy_decoder_fails_where_libjpeg_does():
    """Corrupt entropy-coded data (bytes overwritten in the scan; the scan cut short and closed
    with an end marker), decoded whole: index=True fails where libjpeg's decoder fails, and
    gives its pixels where both decode, before and after the bytes that decoded are decoded
    again from checkpoints. It is stricter in one way: a bad Huffman code is always an error
    ("bad Huffman code"), where libjpeg-turbo's fast path, used for all but the scan's last few
    kB, reads it as symbol 0 without a warning. Stopped at the window's last row, it may decode
    what libjpeg refuses (from a checkpoint it reads only the window's MCUs), never the other
    way round, and with the same pixels."""
    base = encode(photo(240, 180, seed=2000), 85)
    sos = base.index(b"\xff\xda")
    start = sos + 2 + int.from_bytes(base[sos + 2:sos + 4], "big")
    rng = np.random.default_rng(3)
    datas = []
    for _ in range(80):
        b = bytearray(base)
        for p in rng.integers(start, len(base) - 2, size=int(rng.integers(1, 4))):
            b[p] = int(rng.integers(0, 256))
        datas.append(bytes(b))
    datas += [base[:start + k] + b"\xff\xd9" for k in (0, 1, 7, 100, (len(base) - start) // 2, len(base) - start - 3)]
    n = len(datas)
    crops = np.array(random_crops(rng, (240, 180), n, area=(0.05, 1.0)), np.int32)
    flips = np.zeros(n, bool)
    bad_code = "Corrupt JPEG data: bad Huffman code"

    def run(index, whole):
        out = torch.zeros(n, 3, 24, 24, dtype=torch.uint8)
        return _codec.decode_crop_resize(datas, crops, flips, out, 1, whole=whole, index=index), out

    want_errors, want = run(False, None)
    for _ in range(2):  # the second time from the checkpoints of the bytes that decoded
        errors, got = run(True, None)
        for i, (e, w) in enumerate(zip(errors, want_errors)):
            if w is not None:
                assert e in (w, bad_code), (i, e, w)
            elif e is not None:
                assert e == bad_code, (i, e)
            else:
                assert torch.equal(got[i], want[i]), i
    # Both kinds, and both failures, in the set.
    assert sum(e is None for e in errors) > n // 4 and {bad_code, "Corrupt JPEG data: premature end of data segment"} <= set(errors)
    # Stopping at the window's last row: files the index has (those that decoded whole) are
    # decoded as libjpeg's stopped decode; those it lacks are decoded whole (to be indexed), and
    # fail as they did whole.
    whole_errors = errors
    stop = np.zeros(n, np.uint8)
    want_errors, want = run(False, stop)
    errors, got = run(True, stop)
    for i, (e, w) in enumerate(zip(errors, want_errors)):
        assert w is not None or e in (None, bad_code, whole_errors[i]), (i, e)
        if e is None and w is None:
            assert torch.equal(got[i], want[i]), i
    assert any(w is None and e is not None for e, w in zip(errors, want_errors))


# ---------------------------------------------------------------------------- build variants


_SIMD_SCRIPT = """
import sys, numpy as np, torch
from fastdata import _codec
z = np.load(sys.argv[1], allow_pickle=True)
datas = [bytes(d) for d in z["datas"]]
out = torch.zeros(len(datas), 3, 61, 77, dtype=torch.uint8)
errors = _codec.decode_crop_resize(datas, z["crops"], z["flips"], out, 2, resample=sys.argv[3])
assert errors == [None] * len(datas), errors
last = torch.zeros_like(out).to(memory_format=torch.channels_last)
assert _codec.decode_crop_resize(datas, z["crops"], z["flips"], last, 2, resample=sys.argv[3]) == errors
np.save(sys.argv[2], np.stack([out.numpy(), last.numpy()]))
"""


@pytest.mark.parametrize("resample", ["bilinear", "bicubic"])
def test_simd_and_generic_kernels_agree(images, tmp_path, resample):
    """Every resampling kernel (AVX2, SSE4.1, plain C++) gives the same bytes, written planar
    (NCHW) or interleaved (channels_last), mirrored or not, with either filter (the bicubic's
    negative weights and its wider taps)."""
    rng = np.random.default_rng(5)
    datas, crops = [], []
    for name, (data, size, _) in images.items():
        for crop in random_crops(rng, size, 3) + [(0, 0, *size)]:
            datas.append(data)
            crops.append(crop)
    crops = np.array(crops, np.int32)
    flips = rng.integers(0, 2, len(datas)).astype(bool)
    out = torch.zeros(len(datas), 3, 61, 77, dtype=torch.uint8)
    assert _codec.decode_crop_resize(datas, crops, flips, out, 2, resample=resample) == [None] * len(datas)
    inputs = tmp_path / "in.npz"
    np.savez(inputs, datas=np.array(datas, dtype=object), crops=crops, flips=flips)
    for cap in ("sse4.1", "none"):
        result = tmp_path / f"{cap}.npy"
        env = {**os.environ, "FASTDATA_DECODE_SIMD": cap, "OMP_NUM_THREADS": "1"}
        subprocess.run([sys.executable, "-c", _SIMD_SCRIPT, str(inputs), str(result), resample],
                       env=env, check=True, timeout=120)
        assert np.array_equal(np.load(result), np.stack([out.numpy()] * 2)), cap


def test_available_follows_disable_native():
    env = {**os.environ, "FASTDATA_DISABLE_NATIVE": "1", "OMP_NUM_THREADS": "1"}
    code = "from fastdata import _codec; print(_codec.AVAILABLE)"
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, timeout=120)
    assert got.stdout.strip() == "False"
