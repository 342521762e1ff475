"""ColorJitter's hue on a PIL image: the native hue shift (csrc/color.cpp) against Pillow's own
conversions, over every colour. CI runs this module with Pillow-SIMD (the main environment) and
with stock Pillow (the torchvision environment, .ci/run)."""

from __future__ import annotations

import numpy as np
import pytest

from fastdata._ext import native
from fastdata.transforms import pil as P

Image = pytest.importorskip("PIL.Image")
needs_native = pytest.mark.skipif(native is None, reason="fastdata's native extension is not built")


def _cube() -> np.ndarray:
    """Every 24-bit colour once, as a 4096 x 4096 RGB (or HSV) image."""
    codes = np.arange(1 << 24, dtype=np.uint32)
    return np.stack([codes >> 16, (codes >> 8) & 255, codes & 255], -1).astype(np.uint8).reshape(4096, 4096, 3)


@needs_native
@pytest.mark.timeout(60)
def test_both_conversions_are_pillows_for_every_colour():
    cube, ours = _cube(), np.empty((4096, 4096, 3), np.uint8)
    for mode, to_hsv, into in (("RGB", True, "HSV"), ("HSV", False, "RGB")):
        native.convert_hsv(cube, ours, to_hsv)
        theirs = np.asarray(Image.fromarray(cube, mode).convert(into))
        wrong = (ours != theirs).any(-1)
        assert not wrong.any(), f"{mode} -> {into}: {wrong.sum()} colours differ, first {cube[wrong][:3].tolist()}"


@needs_native
@pytest.mark.timeout(60)
@pytest.mark.parametrize("shift", [0.1, -0.5, 0.5, -0.02, 1.5 / 255, 0.4999])
def test_hue_is_pillows_steps_for_every_colour(shift, monkeypatch):
    img = Image.fromarray(_cube())
    assert P._native_hue(), "the native hue shift disagrees with this Pillow (or was not checked)"
    ours = np.asarray(P._hue(img, shift))
    monkeypatch.setattr(P, "_NATIVE_HUE", False)  # Pillow's own steps: HSV, the hue band moved, RGB
    theirs = np.asarray(P._hue(img, shift))
    assert ours.shape == theirs.shape == (4096, 4096, 3)
    wrong = (ours != theirs).any(-1)
    assert not wrong.any(), f"{wrong.sum()} colours differ at shift {shift}"
    if int(shift * 255):  # (a shift under one level moves nothing, as torchvision's)
        assert (ours != np.asarray(img)).any(-1).mean() > 0.5


def test_other_modes_and_no_shift_keep_pillows_steps():
    grey = Image.fromarray(np.arange(64, dtype=np.uint8).reshape(8, 8) * 4, "L")
    out = P._hue(grey, 0.3)
    assert out.mode == "RGB" and np.array_equal(np.asarray(out), np.asarray(grey.convert("RGB")))  # no hue in grey
    img = Image.fromarray(np.full((4, 4, 3), (200, 30, 10), np.uint8))
    assert P._hue(img, 0.0) is img


@needs_native
def test_hue_shift_refuses_what_it_does_not_take():
    rgb = np.zeros((4, 4, 3), np.uint8)
    with pytest.raises(ValueError, match="uint8 src and out of one shape"):
        native.hue_shift(rgb, np.zeros((4, 4, 4), np.uint8), 3)
    with pytest.raises(ValueError, match="uint8 src and out of one shape"):
        native.hue_shift(rgb.astype(np.float32), np.zeros((4, 4, 3), np.float32), 3)
    with pytest.raises(ValueError, match="contiguous"):
        native.hue_shift(np.zeros((4, 8, 3), np.uint8)[:, ::2], rgb, 3)
    with pytest.raises(ValueError, match="shift of 0 to 255"):
        native.hue_shift(rgb, np.empty_like(rgb), 256)
