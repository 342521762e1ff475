"""ColorJitter on a PIL image as fastdata runs it natively (`fastdata.transforms.pil.color_jitter`:
csrc/color.cpp) against Pillow's own steps (ImageEnhance's Brightness, Contrast and Color; an HSV
image, its hue band moved, back to RGB), over every colour. CI runs this module with Pillow-SIMD
(the main environment) and with stock Pillow (the torchvision environment, .ci/run), whose
convert("L") weights differ."""

from __future__ import annotations

import numpy as np
import pytest

from fastdata._ext import native
from fastdata.transforms import pil as P

Image = pytest.importorskip("PIL.Image")
needs_native = pytest.mark.skipif(native is None, reason="fastdata's native extension is not built")


@pytest.fixture(scope="module")
def cube() -> np.ndarray:
    """Every 24-bit colour once, as a 4096 x 4096 RGB (or HSV) image."""
    codes = np.arange(1 << 24, dtype=np.uint32)
    return np.stack([codes >> 16, (codes >> 8) & 255, codes & 255], -1).astype(np.uint8).reshape(4096, 4096, 3)


def _pillows(img, p: dict, monkeypatch) -> np.ndarray:
    """P.color_jitter with Pillow's own steps (ImageEnhance's, the hue through an HSV image)."""
    with monkeypatch.context() as m:
        m.setattr(P, "_NATIVE_HUE", False)
        m.setattr(P, "_ENHANCE_LUMA", None)
        return np.asarray(P.color_jitter(img, p))


@needs_native
@pytest.mark.timeout(60)
def test_both_conversions_are_pillows_for_every_colour(cube):
    ours = np.empty_like(cube)
    for mode, to_hsv, into in (("RGB", True, "HSV"), ("HSV", False, "RGB")):
        native.convert_hsv(cube, ours, to_hsv)
        theirs = np.asarray(Image.fromarray(cube, mode).convert(into))
        wrong = (ours != theirs).any(-1)
        assert not wrong.any(), f"{mode} -> {into}: {wrong.sum()} colours differ, first {cube[wrong][:3].tolist()}"


@needs_native
@pytest.mark.timeout(90)
# shifts of under a level, one level, both signs, nearly half the circle
@pytest.mark.parametrize("shift", [-0.5, -0.02, 1.5 / 255, 0.1, 0.4999, 0.001])
def test_the_hue_is_pillows_for_every_colour(cube, shift, monkeypatch):
    img = Image.fromarray(cube)
    assert P._native_hue(), "the native hue shift disagrees with this Pillow (or was not checked)"
    p = {"order": [3], "hue": shift}
    ours, theirs = np.asarray(P.color_jitter(img, p)), _pillows(img, p, monkeypatch)
    assert ours.shape == theirs.shape == (4096, 4096, 3)
    wrong = (ours != theirs).any(-1)
    assert not wrong.any(), f"{wrong.sum()} colours differ at shift {shift}"
    if int(shift * 255):  # (a shift under one level moves only what the 8-bit HSV round trip moves)
        assert (ours != cube).any(-1).mean() > 0.5


@needs_native
@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", [0, 1, 2])
def test_brightness_contrast_saturation_are_pillows_for_every_colour(cube, kind, monkeypatch):
    """ImageEnhance's blends natively, with the "L" weights this Pillow's convert("L") uses:
    every colour as Pillow gives it, interpolated (factor in 0..1) and extrapolated (clipped)."""
    img = Image.fromarray(cube)
    assert P._enhance_luma() in P._LUMAS, "the native enhance disagrees with this Pillow (or was not checked)"
    name = ("brightness", "contrast", "saturation")[kind]
    for factor in (0.2468, 0.999, 1.0, 1.5731):
        p = {"order": [kind], name: factor}
        ours, theirs = P.color_jitter(cube, p), _pillows(img, p, monkeypatch)
        assert isinstance(ours, np.ndarray) and ours.shape == theirs.shape == (4096, 4096, 3)
        wrong = (ours != theirs).any(-1)
        assert not wrong.any(), f"{wrong.sum()} colours differ at {name} {factor}, first {cube[wrong][:3].tolist()}"
        assert (ours != cube).any(-1).mean() > 0.4 or factor == 1.0


@needs_native
@pytest.mark.parametrize("width", [1, 2, 3, 5, 7, 8, 29, 31])
def test_rows_of_every_width_are_pillows(width, monkeypatch):
    """Brightness, contrast and saturation on images whose rows end past a whole group of 4
    pixels: Pillow-SIMD converts to "L" 4 pixels at a time and each row's last width % 4 with
    stock Pillow's weights, so the native "L" takes those there too. The colours are those whose
    "L" the two sets of weights give otherwise (every such colour of a sample of the cube)."""
    rng = np.random.default_rng(width)
    rgb = rng.integers(0, 256, (1 << 20, 3)).astype(np.int64)
    simd = (rgb @ np.array([9798, 19235, 3735]) + (1 << 14)) >> 15
    stock = (rgb @ np.array([19595, 38470, 7471]) + (1 << 15)) >> 16
    odd = rgb[simd != stock].astype(np.uint8)
    assert len(odd) > 500
    img = Image.fromarray(odd[:(len(odd) // width) * width].reshape(-1, width, 3))
    for k, name in enumerate(("brightness", "contrast", "saturation")):
        p = {"order": [k], name: 0.37}
        assert np.array_equal(np.asarray(P.color_jitter(img, p)), _pillows(img, p, monkeypatch)), (width, name)


@needs_native
def test_the_four_in_any_order_are_pillows_on_photos(monkeypatch):
    rng = np.random.default_rng(0)
    # smooth gradients with noise: the colours of photographs, not of the cube's order
    y, x = np.mgrid[0:96, 0:128]
    for k in range(12):
        base = np.stack([x * (2 + k % 3), y * 2 + 40 * k, (x + y) * (1 + k % 2)], -1) % 256
        img = Image.fromarray(np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8))
        p = {"order": list(rng.permutation(4)), "brightness": rng.uniform(0.5, 1.5),
             "contrast": rng.uniform(0.5, 1.5), "saturation": rng.uniform(0.5, 1.5), "hue": rng.uniform(-0.2, 0.2)}
        assert np.array_equal(np.asarray(P.color_jitter(img, p)), _pillows(img, p, monkeypatch)), p


def test_other_modes_and_no_shift_keep_pillows_steps():
    grey = Image.fromarray(np.arange(64, dtype=np.uint8).reshape(8, 8) * 4, "L")
    out = P._hue(grey, 0.3)
    assert out.mode == "RGB" and np.array_equal(np.asarray(out), np.asarray(grey.convert("RGB")))  # no hue in grey
    img = Image.fromarray(np.full((4, 4, 3), (200, 30, 10), np.uint8))
    assert P._hue(img, 0.0) is img
    assert P.color_jitter(grey, {"order": [0], "brightness": 0.5}).mode == "L"  # (ImageEnhance's, on L)
    rgb = np.array(img)
    out = P.color_jitter(rgb, {"order": [0, 2], "brightness": 0.5, "saturation": 1.5})
    assert np.array_equal(rgb, np.array(img)) and out is not rgb  # (the image given is left as it is)


@needs_native
def test_the_native_calls_refuse_what_they_do_not_take():
    rgb = np.zeros((4, 4, 3), np.uint8)
    with pytest.raises(ValueError, match="uint8 src and out of one shape"):
        native.hue_shift(rgb, np.zeros((4, 4, 4), np.uint8), 3)
    with pytest.raises(ValueError, match="uint8 src and out of one shape"):
        native.hue_shift(rgb.astype(np.float32), np.zeros((4, 4, 3), np.float32), 3)
    with pytest.raises(ValueError, match="contiguous"):
        native.hue_shift(np.zeros((4, 8, 3), np.uint8)[:, ::2], rgb, 3)
    with pytest.raises(ValueError, match="shift of 0 to 255"):
        native.hue_shift(rgb, np.empty_like(rgb), 256)
    with pytest.raises(ValueError, match="kind 0"):
        native.enhance(rgb, np.empty_like(rgb), 4, 0.5)
    with pytest.raises(ValueError, match="luma weights"):
        native.enhance(rgb, np.empty_like(rgb), 2, 0.5, (40000, 40000, 0, 16))
    with pytest.raises(ValueError, match="contiguous"):
        native.enhance(np.zeros((4, 8, 3), np.uint8)[:, ::2], rgb, 0, 0.5)
