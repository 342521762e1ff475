"""The native GaussianBlur (csrc/blur.cpp, `fastdata.run._blur`) against Pillow's own: byte for
byte on noise and on photos, through sizes, radii and modes, with this process's Pillow and with
stock Pillow beside it; a script's op served with it keeps Pillow's results and errors for what
it does not take."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

from fastdata import _pillow
from fastdata._ext import native

pytestmark = pytest.mark.timeout(300)
needs_native = pytest.mark.skipif(native is None, reason="the native extension is not built")

# Sizes from 2 x 2 to a photo's, odd and even, one side much longer; radii under a pixel (box
# radius 0 with a fractional part), at whole and half box radii, past the image's size, one axis
# at a time.
SIZES = ((2, 2), (2, 5), (5, 2), (3, 3), (7, 64), (64, 7), (17, 29), (96, 96), (224, 224), (375, 500))
RADII = (0.05, 0.3, 0.93, 1.0, 1.5, 2.0, 2.4, 3.7, 6.0, 9.31, 25.0, 140.0, 1000.0, (0.001, 3.1), (2.2, 0.01),
         (0.4, 11.0), 0)

COMPARE = r"""
import sys
import numpy as np
from PIL import Image, ImageFilter
from fastdata.run._blur import blurred
sizes, radii, seed = eval(sys.argv[1]), eval(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(seed)
checked = []
for h, w in sizes:
    noise = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    smooth = np.cumsum(noise, axis=1, dtype=np.uint32).astype(np.uint8)  # (long runs and edges, not just noise)
    for pixels in (noise, smooth, noise[:, :, 0], smooth[:, :, 2]):
        img = Image.fromarray(np.ascontiguousarray(pixels))
        for r in radii:
            ours = blurred(img, ImageFilter.GaussianBlur(r))
            theirs = Image.Image.filter(img, ImageFilter.GaussianBlur(r))
            assert ours is not None and ours.mode == theirs.mode and ours.size == theirs.size, (h, w, r)
            assert ours.tobytes() == theirs.tobytes(), (img.mode, h, w, r)
            checked.append(r)
print(len(checked))
"""


def _compare(env=None) -> int:
    # (run from the temporary folder: a checkout's folder first on the path would shadow the installed fastdata)
    out = subprocess.run([sys.executable, "-c", COMPARE, repr(SIZES), repr(RADII), "5"], env=env, timeout=240,
                         capture_output=True, text=True, cwd=tempfile.gettempdir())
    assert out.returncode == 0, out.stderr[-3000:]
    return int(out.stdout.split()[-1])


@needs_native
def test_the_native_blur_is_this_pillows():
    assert _compare() == len(SIZES) * 4 * len(RADII)


@needs_native
def test_the_native_blur_is_stock_pillows():
    stock = _pillow.stock_pillow_path()
    if stock is None or not _pillow.pillow_info()["simd"]:
        pytest.skip("no stock Pillow beside Pillow-SIMD (scripts/install.sh puts one in .stock-pillow/)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(stock), os.environ.get("PYTHONPATH", "")])}
    assert _compare(env) == len(SIZES) * 4 * len(RADII)


@needs_native
def test_the_probe_finds_this_pillow_and_a_photo_blurs_as_pillows(tmp_path):
    from PIL import Image, ImageFilter

    from fastdata.run import _blur
    from fastdata.synthetic import make_file_list, make_imagenet_like

    assert _blur._agrees()
    make_imagenet_like(tmp_path / "photos", n_images=4, n_classes=2, workers=1)
    for path, _ in make_file_list(tmp_path / "photos"):
        img = Image.open(path).convert("RGB")
        changed = []
        for r in (0.1, 1.3, 2.0):
            ours = _blur.blurred(img, ImageFilter.GaussianBlur(r))
            assert ours.tobytes() == img.filter(ImageFilter.GaussianBlur(r)).tobytes()
            changed.append(np.abs(np.asarray(ours, dtype=int) - np.asarray(img, dtype=int)).mean())
        assert changed[0] < changed[1] < changed[2], changed  # (it blurs, more with a wider radius)


def test_a_served_image_leaves_to_pillow_what_the_blur_does_not_take():
    """What `blurred` does not take is Pillow's call, results and errors alike: another filter, a
    subclass of GaussianBlur, a filter class, a negative or huge radius, a radius of another
    type, a blur along one axis, an image one pixel wide, an RGBA image; `withdrawn` leaves the image as it was."""
    from PIL import Image, ImageFilter

    from fastdata.run._blur import blurred, served, withdrawn

    class Wider(ImageFilter.GaussianBlur):
        def filter(self, image):
            return image.box_blur((3, 3))

    rng = np.random.default_rng(3)
    rgb = Image.fromarray(rng.integers(0, 256, (19, 23, 3), dtype=np.uint8))
    for img, f in ((rgb, ImageFilter.SMOOTH), (rgb, ImageFilter.BoxBlur(2)), (rgb, Wider(2)),
                   (rgb, ImageFilter.GaussianBlur), (rgb, ImageFilter.GaussianBlur(-1.5)),
                   (rgb, ImageFilter.GaussianBlur(1e9)), (rgb, ImageFilter.GaussianBlur(np.float32(2))),
                   (rgb, ImageFilter.GaussianBlur("2")), (rgb, ImageFilter.GaussianBlur((1, 2, 3))),
                   (rgb, ImageFilter.GaussianBlur((0, 2.5))), (rgb, ImageFilter.GaussianBlur((1.2, 0))),
                   (rgb, ImageFilter.GaussianBlur((1e-30, 2.5))),  # (a float32 square of 0: one axis alone)
                   (Image.fromarray(rng.integers(0, 256, (1, 23, 3), dtype=np.uint8)), ImageFilter.GaussianBlur(2)),
                   (rgb.convert("RGBA"), ImageFilter.GaussianBlur(2)), (rgb, "not a filter")):
        assert blurred(img, f) is None
        try:
            want = Image.Image.filter(img, f)
        except Exception as e:  # noqa: BLE001 (whatever Pillow raises, served raises)
            with pytest.raises(type(e), match=str(e)[:40]):
                served(img).filter(f)
        else:
            got = served(img).filter(f)
            assert got.mode == want.mode and got.tobytes() == want.tobytes(), f
        withdrawn(img)
        assert "filter" not in vars(img) and img.filter.__func__ is Image.Image.filter


@needs_native
@pytest.mark.parametrize("simd", [False, True])
def test_the_blur_is_served_under_stock_pillow_only(simd, monkeypatch):
    """Under stock Pillow an image's GaussianBlur is the native one (Pillow's pixels); under
    Pillow-SIMD, whose own blur is as fast, Pillow's call."""
    from PIL import Image, ImageFilter

    from fastdata.run import _blur

    monkeypatch.setattr(_blur, "_simd", lambda: simd)
    calls = []
    blurred = _blur.blurred
    monkeypatch.setattr(_blur, "blurred", lambda img, f: calls.append(f) or blurred(img, f))
    img = Image.fromarray(np.random.default_rng(4).integers(0, 256, (33, 45, 3), dtype=np.uint8))
    got = _blur.served(img).filter(ImageFilter.GaussianBlur(1.6))
    _blur.withdrawn(img)
    assert got.tobytes() == img.filter(ImageFilter.GaussianBlur(1.6)).tobytes()
    assert len(calls) == (0 if simd else 1)
