"""TrivialAugmentWide's, RandAugment's and AutoAugment's ops as fastdata runs them on the CPU
(`fastdata.transforms.pil.trivial_augment`): natively (the geometry through
`transforms.geometry`, ImageEnhance's four through the native enhance, ImageOps' table ops through
`table_op`) against Pillow's own calls, in each form an op gets (an HWC array, a PIL image, a CHW
tensor). CI runs this module with Pillow-SIMD (the main environment) and with stock Pillow (the
torchvision environment, .ci/run)."""

from __future__ import annotations

import numpy as np
import pytest

from fastdata._ext import native
from fastdata.transforms import geometry as G
from fastdata.transforms import pil as P

Image = pytest.importorskip("PIL.Image")
ImageOps = pytest.importorskip("PIL.ImageOps")
ImageEnhance = pytest.importorskip("PIL.ImageEnhance")
needs_native = pytest.mark.skipif(native is None or not hasattr(native, "affine"),
                                  reason="fastdata's native extension is not built")


def _photo(h: int, w: int, seed: int) -> np.ndarray:
    """A photograph's colours: smooth gradients with noise."""
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 3 + seed, y * 2 + 40 * seed, (x + y)], -1) % 256
    return np.clip(base + np.random.default_rng(seed).normal(0, 12, base.shape), 0, 255).astype(np.uint8)


@needs_native
def test_auto_augment_ops_are_pillows_natively_and_in_any_form(monkeypatch):
    """Each TrivialAugment op on an array, a PIL image and a CHW tensor gives the pixels of
    Pillow's own steps (the native geometry and blends off); the geometry and the blends return
    the form given (an array for a tensor)."""
    torch = pytest.importorskip("torch")
    pixels = _photo(40, 56, 5)
    ops = {"ShearX": 0.3, "ShearY": -0.2, "TranslateX": 7.0, "TranslateY": -5.0, "Rotate": 21.5,
           "Brightness": 0.4, "Color": -0.3, "Contrast": 0.5, "Sharpness": 0.6, "Posterize": 4,
           "Solarize": 100.0, "AutoContrast": 0.0, "Equalize": 0.0, "Invert": 0.0, "Identity": 0.0}
    native_forms = {"ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color", "Contrast",
                    "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize", "Invert"}
    for interpolation in ("nearest", "bilinear", "bicubic"):
        for name, m in ops.items():
            p = {"op": name, "magnitude": m}
            with monkeypatch.context() as mp:
                mp.setattr(G, "_NATIVE_AFFINE", False)
                mp.setattr(P, "_ENHANCE_LUMA", None)
                mp.setattr(P, "_NATIVE_TABLES", False)
                mp.setattr(P, "_NATIVE_SHARPNESS", False)
                want = np.asarray(P.trivial_augment(Image.fromarray(pixels), p, interpolation))
            for form in (pixels, Image.fromarray(pixels), torch.from_numpy(pixels).permute(2, 0, 1)):
                got = P.trivial_augment(form, p, interpolation)
                assert np.array_equal(np.asarray(got), want), (name, interpolation, type(form))
                if name in native_forms and (name in P._LUT_OPS) <= isinstance(form, np.ndarray):
                    assert hasattr(got, "getbands") == hasattr(form, "getbands"), name  # (tables: an array's)
            if name not in ("Identity", "AutoContrast", "Equalize"):
                assert not np.array_equal(want, pixels), name  # (each op moves some pixel here)


@needs_native
@pytest.mark.parametrize("channels", [3, 1])
def test_the_table_ops_are_imageops_for_every_image_kind(channels):
    """posterize (1-8 bits), solarize (whole and fractional thresholds), autocontrast (flat
    bands, one level, full range) and equalize (few levels: its table passing 255, which Pillow
    clips; one level; noise) of arrays as ImageOps gives them for the PIL image."""
    assert P.native_tables()
    rng = np.random.default_rng(channels)
    images = [rng.integers(0, 256, (17, 23, 3), dtype=np.uint8), _photo(30, 20, 4),
              np.full((5, 6, 3), 77, np.uint8), rng.choice(np.array([3, 90, 250], np.uint8), (40, 9, 3)),
              np.where(rng.random((25, 25, 3)) < 0.99, 60, 61).astype(np.uint8),
              rng.integers(40, 45, (8, 8, 3), dtype=np.uint8)]
    cases = [("Posterize", b, lambda im, b=b: ImageOps.posterize(im, b)) for b in range(1, 9)]
    cases += [("Solarize", t, lambda im, t=t: ImageOps.solarize(im, t)) for t in (0, 1, 99.5, 128, 255.0, 256)]
    cases += [("AutoContrast", 0, ImageOps.autocontrast), ("Equalize", 0, ImageOps.equalize),
              ("Invert", 0, ImageOps.invert)]
    for pixels in images:
        pixels = np.ascontiguousarray(pixels[:, :, :channels])
        img = Image.fromarray(pixels if channels == 3 else pixels[:, :, 0])
        for name, m, theirs in cases:
            want = np.asarray(theirs(img)).reshape(pixels.shape)
            got = P.table_op(pixels, name, m)
            assert got.shape == pixels.shape and np.array_equal(got, want), (name, m, pixels.shape)
            assert np.array_equal(P.trivial_augment(pixels, {"op": name, "magnitude": m}), want)


@needs_native
def test_sharpness_is_imageenhances_at_every_size_and_factor():
    """ImageEnhance.Sharpness (its SMOOTH filter, then the blend) natively: images of 1 to 40 pixels
    a side (under 3: Pillow keeps the image as its own smoothing), factors inside and outside
    0..1; the image given left as it was."""
    assert P._native_sharpness()
    rng = np.random.default_rng(7)
    for trial in range(60):
        h, w = (int(v) for v in rng.integers(1, 41, 2))
        pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8) if trial % 2 else _photo(h, w, trial)
        img, before = Image.fromarray(pixels), pixels.copy()
        for factor in (-0.5, 0.05, 0.9, 1.0, 1.45, 2.0):
            want = np.asarray(ImageEnhance.Sharpness(img).enhance(factor))
            got = P.enhance(pixels, 3, factor)
            assert isinstance(got, np.ndarray) and np.array_equal(got, want), ((h, w), factor)
            assert np.array_equal(np.asarray(P.enhance(img, 3, factor)), want)
        assert np.array_equal(pixels, before)
    with pytest.raises(ValueError, match="Sharpness takes an image"):
        native.enhance(np.zeros((4, 3), np.uint8), np.zeros((4, 3), np.uint8), 3, 0.5)
