"""Pillow's affine transform as fastdata runs it natively (`fastdata.transforms.geometry.affine`
and `rotate`: csrc/geometry.cpp) against Pillow's own Image.transform and Image.rotate: shears,
translations, rotations, scalings and maps of every coefficient, each filter, RGB and L, images of
1 to 80 pixels a side. CI runs this module with Pillow-SIMD (the main environment) and with stock
Pillow (the torchvision environment, .ci/run)."""

from __future__ import annotations

import numpy as np
import pytest

from fastdata._ext import native
from fastdata.transforms import geometry as G

Image = pytest.importorskip("PIL.Image")
needs_native = pytest.mark.skipif(native is None or not hasattr(native, "affine"),
                                  reason="fastdata's native extension is not built")


def _maps(rng, w: int, h: int) -> list[tuple]:
    """AFFINE data of each kind the nearest filter takes its own path for (a scaling or a
    translation: doubles stepped a column at a time; a shear or a rotation: 16.16 fixed point;
    one whose corners pass +-32768: doubles again), and the filtered transforms' uses: their rows
    of one step (every fraction across or down 0: shears, translations) and of both."""
    s = rng.uniform(-0.6, 0.6)
    return [
        (1, s, 0, 0, 1, 0), (1, 0, 0, s, 1, 0),  # shears, as RandAugment's
        (1, 0, float(rng.integers(-w, w + 1)), 0, 1, float(rng.integers(-h, h + 1))),  # a translation
        # along one axis by a fraction of a pixel (timm's TranslateXRel and YRel): one filter step
        (1, 0, rng.uniform(-w / 2, w / 2), 0, 1, 0), (1, 0, 0, 0, 1, rng.uniform(-h / 2, h / 2)),
        (rng.uniform(0.3, 3), 0, rng.uniform(-5, 5), 0, 2, 0.5),  # a scaling whose rows map to whole rows
        (rng.uniform(0.3, 3), 0, rng.uniform(-5, 5), 0, rng.uniform(0.3, 3), rng.uniform(-5, 5)),  # a scaling
        G.rotate_data(rng.uniform(-180, 180), w, h),
        G.rotate_data(rng.uniform(-30, 30), w, h, (rng.uniform(0, w), rng.uniform(0, h))),
        tuple(rng.normal(size=6) * [1, 1, w / 2, 1, 1, h / 2]),
        (1, 0.01, 0, 0, 1000, -1000 * rng.uniform(40, 45)),  # nearest: past the fixed-point range
    ]


@needs_native
@pytest.mark.timeout(120)
@pytest.mark.parametrize("bands", [3, 1])
def test_the_transform_is_pillows_for_every_map_filter_and_size(bands):
    rng = np.random.default_rng(bands)
    moved = compared = 0
    for trial in range(150):
        h, w = (int(v) for v in rng.integers(1, 81, 2))
        pixels = rng.integers(0, 256, (h, w, bands), dtype=np.uint8)
        img = Image.fromarray(pixels if bands == 3 else pixels[..., 0])
        ow, oh = (w, h) if trial % 3 else (int(v) for v in rng.integers(1, 81, 2))
        fill = [int(v) for v in rng.integers(0, 256, bands)]
        for data in _maps(rng, w, h):
            for resample in (0, 2, 3):
                want = np.asarray(img.transform((ow, oh), Image.AFFINE, data, resample,
                                                fillcolor=tuple(fill) if bands == 3 else fill[0]))
                out = np.empty((oh, ow, bands), np.uint8)
                native.affine(pixels, out, data, resample, fill)
                got = out if bands == 3 else out[..., 0]
                assert np.array_equal(got, want), (trial, data, resample, (w, h), (ow, oh))
                compared += 1
                moved += bool((out != np.asarray(fill, np.uint8)).any())
    assert compared == 150 * 11 * 3 and moved > compared * 0.6  # (most outputs hold source pixels, not the fill)


def _photo(h: int, w: int, seed: int) -> np.ndarray:
    """A photograph's colours: smooth gradients with noise."""
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 3 + seed, y * 2 + 40 * seed, (x + y)], -1) % 256
    return np.clip(base + np.random.default_rng(seed).normal(0, 12, base.shape), 0, 255).astype(np.uint8)


@needs_native
@pytest.mark.parametrize("size", [(64, 64), (48, 80)])
def test_rotate_is_pillows_rotate_in_the_form_given(size):
    """`rotate` of an array and of a PIL image: Pillow's img.rotate pixels, its exact turns (0, 90,
    180, 270 about the middle) included, the array given left as it was."""
    assert G._native_affine(), "the native transform disagrees with this Pillow (or was not checked)"
    h, w = size
    pixels = _photo(h, w, 3)
    img = Image.fromarray(pixels)
    for angle in (0.0, 90.0, 180.0, 270.0, -90.0, 360.0, 45.5, -30.25, 12.0):
        for center in (None, (10, 20.5)):
            for resample in (0, 2, 3):
                for fill in (0, 9):
                    want = np.asarray(img.rotate(angle, resample, False, center, fillcolor=(fill,) * 3))
                    got = G.rotate(pixels, angle, resample, center, fill)
                    assert isinstance(got, np.ndarray) and np.array_equal(got, want), (angle, center, resample)
                    as_pil = G.rotate(img, angle, resample, center, fill)
                    assert as_pil.mode == "RGB" and np.array_equal(np.asarray(as_pil), want)
    assert np.array_equal(pixels, _photo(h, w, 3))


@needs_native
def test_a_fill_colour_is_pillows_fillcolor():
    """A fill given as a colour (timm's image mean), natively on an RGB array and a PIL image:
    Pillow's fillcolor; one Pillow does not take natively (an L image's colour, a float, a
    filter the native maps lack) is Pillow's own call, its error too."""
    assert G._native_affine(), "the native transform disagrees with this Pillow (or was not checked)"
    pixels = _photo(30, 41, 4)
    img = Image.fromarray(pixels)
    data = (1, 0.3, -9.5, 0.1, 1, 6)
    for resample in (0, 2, 3):
        for fill in ((124, 116, 104), [3, 250, 77]):
            want = np.asarray(img.transform(img.size, Image.AFFINE, data, resample, fillcolor=tuple(fill)))
            got = G.affine(pixels, data, resample, fill)
            assert isinstance(got, np.ndarray) and np.array_equal(got, want), (resample, fill)
            assert np.array_equal(np.asarray(G.affine(img, data, resample, fill)), want)
            rotated = np.asarray(img.rotate(21.5, resample, fillcolor=tuple(fill)))
            assert np.array_equal(G.rotate(pixels, 21.5, resample, None, tuple(fill)), rotated)
    gray = Image.fromarray(pixels[:, :, 0])
    want = np.asarray(gray.transform(gray.size, Image.AFFINE, data, 2, fillcolor=7))
    assert np.array_equal(np.asarray(G.affine(pixels[:, :, 0], data, 2, (7,))), want)
    with pytest.raises(ValueError) as theirs:
        img.transform(img.size, Image.AFFINE, data, Image.LANCZOS)
    with pytest.raises(ValueError) as ours:
        G.affine(pixels, data, Image.LANCZOS, 0)
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize("native_on", [True, False])
def test_one_channel_arrays_rotate_as_l_images(monkeypatch, native_on):
    """An MNIST row (H x W x 1) through `rotate`, natively and by Pillow's own call: an L image's
    rotate, its pixels in the row's shape."""
    if native_on and (native is None or not hasattr(native, "affine")):
        pytest.skip("fastdata's native extension is not built")
    monkeypatch.setattr(G, "_NATIVE_AFFINE", None if native_on else False)
    row = _photo(28, 28, 2)[:, :, 1:2].copy()
    img = Image.fromarray(row[:, :, 0])
    for angle in (12.5, -40.0, 90.0):
        for resample in (0, 2, 3):
            want = np.asarray(img.rotate(angle, resample, False, None, fillcolor=0))
            got = np.asarray(G.rotate(row, angle, resample, None, 0))
            assert np.array_equal(got.reshape(28, 28), want), (angle, resample)
    assert G._native_affine() == native_on


def test_a_pillow_of_other_arithmetic_keeps_pillows_own_steps(monkeypatch):
    """Where the extension's transform disagrees with this Pillow (here, an extension whose
    transform is off by one level), `affine` and `rotate` take Pillow's own calls."""

    class Off:
        def affine(self, src, out, data, resample, fill):
            native.affine(src, out, data, resample, fill) if native is not None else out.fill(0)
            out += 1

    monkeypatch.setattr(G, "native", Off())
    monkeypatch.setattr(G, "_NATIVE_AFFINE", None)
    pixels = _photo(32, 32, 1)
    img = Image.fromarray(pixels)
    data = G.rotate_data(33.0, 32, 32)
    assert not G._native_affine()
    out = G.affine(pixels, data, 2, 0)
    want = img.transform((32, 32), Image.AFFINE, data, 2, fillcolor=(0, 0, 0))
    assert np.array_equal(np.asarray(out), np.asarray(want))


def test_other_modes_take_pillows_own_transform():
    rgba = Image.fromarray(np.full((8, 8, 4), 200, np.uint8), "RGBA")
    out = G.affine(rgba, (1, 0.5, 0, 0, 1, 0), 2, 0)
    assert out.mode == "RGBA"
    assert np.array_equal(np.asarray(out), np.asarray(rgba.transform((8, 8), Image.AFFINE, (1, 0.5, 0, 0, 1, 0), 2,
                                                                     fillcolor=(0, 0, 0, 0))))


@needs_native
def test_the_native_transform_refuses_what_it_does_not_take():
    rgb = np.zeros((4, 4, 3), np.uint8)
    data = (1, 0, 0, 0, 1, 0)
    with pytest.raises(ValueError, match="uint8 src"):
        native.affine(rgb, np.zeros((4, 4, 1), np.uint8), data, 2, [0, 0, 0])
    with pytest.raises(ValueError, match="uint8 src"):
        native.affine(np.zeros((4, 4, 4), np.uint8), np.zeros((4, 4, 4), np.uint8), data, 2, [0] * 4)
    with pytest.raises(ValueError, match="uint8 src"):
        native.affine(rgb.astype(np.float32), rgb.astype(np.float32), data, 2, [0, 0, 0])
    with pytest.raises(ValueError, match="contiguous"):
        native.affine(np.zeros((4, 8, 3), np.uint8)[:, ::2], rgb, data, 2, [0, 0, 0])
    with pytest.raises(ValueError, match="resample 0"):
        native.affine(rgb, np.empty_like(rgb), data, 1, [0, 0, 0])
    with pytest.raises(ValueError, match="fill"):
        native.affine(rgb, np.empty_like(rgb), data, 2, [0, 0])
    with pytest.raises(ValueError, match="fill"):
        native.affine(rgb, np.empty_like(rgb), data, 2, [0, 256, 0])
    with pytest.raises(ValueError, match="overlap"):
        native.affine(rgb, rgb, data, 2, [0, 0, 0])
    out = np.zeros((2, 2, 3), np.uint8)
    native.affine(np.zeros((5, 5, 3), np.uint8), out, (1, 0, 5, 0, 1, 0), 3, [1, 2, 3])  # (all outside: the fill)
    assert (out == [1, 2, 3]).all()


@pytest.mark.parametrize("mode", ["edge", "reflect", "symmetric"])
def test_padding_copied_from_a_window_is_numpys_pad_or_refused(mode):
    """`pad_around` on a window of a padded image, given only the image's pixels the window
    shows: NumPy's pad of the whole image, every value, or False where a pixel it copies lies
    outside the window (the window then unchanged); over random sizes, paddings and windows, both
    outcomes seen, and a window that shows the whole image always filled."""
    from fastdata.transforms.plan import pad_around

    rng, seen = np.random.default_rng(0), {True: 0, False: 0}
    for _ in range(3000):
        H, W = (int(v) for v in rng.integers(1, 9, 2))
        img = rng.integers(0, 256, (H, W, 3), dtype=np.uint8)
        left, top, right, bottom = (int(v) for v in rng.integers(0, 6, 4))
        padded = np.pad(img, ((top, bottom), (left, right), (0, 0)), mode=mode)
        whole = rng.random() < 0.2
        h, w = padded.shape[:2] if whole else (int(rng.integers(1, padded.shape[0] + 1)),
                                               int(rng.integers(1, padded.shape[1] + 1)))
        y0, x0 = (0, 0) if whole else (int(rng.integers(0, padded.shape[0] - h + 1)),
                                       int(rng.integers(0, padded.shape[1] - w + 1)))
        x1, y1 = max(left, x0), max(top, y0)  # the image's part the window shows, in the padded image
        x2, y2 = min(left + W, x0 + w), min(top + H, y0 + h)
        out = np.zeros((h, w, 3), np.uint8)
        place = (0, 0, 0, 0)
        if x2 > x1 and y2 > y1:
            out[y1 - y0:y2 - y0, x1 - x0:x2 - x0] = padded[y1:y2, x1:x2]
            place = (x1 - x0, y1 - y0, x2 - x1, y2 - y1)
        before = out.copy()
        filled = pad_around(out, place, mode)
        seen[filled] += 1
        assert np.array_equal(out, padded[y0:y0 + h, x0:x0 + w] if filled else before)
        if whole and (mode == "edge" or max(left, right) < W + (mode == "symmetric")) and \
                max(top, bottom) < H + (mode == "symmetric"):
            assert filled  # (the whole image shown: each padding within one reflection of it)
    assert seen[True] > 500 and seen[False] > 100, seen
