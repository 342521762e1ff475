"""The extension's `resize_images` (csrc/resample.h: Pillow's resize of a box cut from each of a
batch of uint8 images, which `fastdata run` gives an in-memory dataset's Resize and
RandomResizedCrop) against the installed Pillow's own `Image.resize` of the crop: both filters,
RGB and L, sizes of 1 to 80 pixels in and up to 250 out, in the installed Pillow's weights and
order of passes, on every kernel the CPU has. CI runs this module with Pillow-SIMD (the main
environment) and with stock Pillow (the torchvision environment, .ci/run)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from fastdata._ext import native

Image = pytest.importorskip("PIL.Image")
needs_native = pytest.mark.skipif(native is None or not hasattr(native, "resize_images"),
                                  reason="fastdata's native extension is not built")


def _installed() -> tuple[str, str]:
    """(the weights, the order of passes) of the installed Pillow, as `fastdata run` reads them."""
    from fastdata._pillow import pillow_info
    from fastdata.image.decode import pillow_order

    return "pillow-simd" if pillow_info()["simd"] else "pillow", pillow_order()


def _cases(seed: int, count: int) -> list[tuple]:
    """(images [3, h, w, c], boxes [3, 4], (ow, oh)): whole images, and boxes anywhere inside."""
    rng = np.random.default_rng(seed)
    cases = []
    for k in range(count):
        h, w = (int(v) for v in rng.integers(1, 81, 2))
        size = (int(rng.integers(1, 251)), int(rng.integers(1, 251)))
        images = rng.integers(0, 256, (3, h, w, int(rng.choice([1, 3]))), dtype=np.uint8)
        boxes = [(0, 0, w, h)]
        for _ in range(2):
            x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
            boxes.append((x0, y0, int(rng.integers(x0 + 1, w + 1)), int(rng.integers(y0 + 1, h + 1))))
        cases.append((images, np.array(boxes if k % 3 else boxes[:1] * 3, np.int64), size))
    return cases


def _native(images, boxes, size, resample: str, threads: int = 1) -> np.ndarray:
    from fastdata.image.decode import vertical_first

    weights, order = _installed()
    out = np.empty((len(images), size[1], size[0], images.shape[3]), np.uint8)
    vertical = vertical_first(boxes, size).astype(np.uint8) if order == "rule" else None
    native.resize_images(images, out, boxes, resample, vertical, weights, threads)
    return out


def _pillow(image, box, size, resample: str) -> np.ndarray:
    x0, y0, x1, y1 = box.tolist()
    crop = np.ascontiguousarray(image[y0:y1, x0:x1])
    img = Image.fromarray(crop[:, :, 0] if crop.shape[2] == 1 else crop)
    filters = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}
    return np.asarray(img.resize(size, filters[resample])).reshape(size[1], size[0], image.shape[2])


@needs_native
@pytest.mark.timeout(120)
@pytest.mark.parametrize("resample", ["bilinear", "bicubic"])
def test_each_box_is_pillows_resize_of_the_crop(resample):
    """Every image's box, enlarged or shrunk along either axis (the bicubic's overshoot clipped
    between the passes, in the installed Pillow's order), is Pillow's resize of the crop, byte
    for byte; on 2 threads the same."""
    if _installed()[1] == "other":
        pytest.skip("a Pillow whose order of passes fastdata does not follow: `fastdata run` resizes with Pillow")
    for images, boxes, size in _cases(1 if resample == "bilinear" else 2, 150):
        got = _native(images, boxes, size, resample, threads=1 + len(images) % 2)
        for k in range(len(images)):
            want = _pillow(images[k], boxes[k], size, resample)
            assert np.array_equal(got[k], want), (images.shape, boxes[k].tolist(), size, resample)


_KERNELS = """
import sys
import numpy as np
sys.path.insert(0, sys.argv[2])
import test_resize_images as t
outs = [t._native(images, boxes, size, sys.argv[3]) for images, boxes, size in t._cases(3, 40)]
np.savez(sys.argv[1], *outs)
"""


@needs_native
@pytest.mark.timeout(120)
@pytest.mark.parametrize("resample", ["bilinear", "bicubic"])
def test_simd_and_generic_kernels_give_the_same_bytes(tmp_path, resample):
    want = [_native(images, boxes, size, resample) for images, boxes, size in _cases(3, 40)]
    for cap in ("sse4.1", "none"):
        result = tmp_path / f"{cap}.npz"
        env = {**os.environ, "FASTDATA_DECODE_SIMD": cap, "OMP_NUM_THREADS": "1"}
        # (run from tmp_path: `-c` puts the working folder first on sys.path, and a checkout's folder
        # there would shadow the installed package)
        subprocess.run([sys.executable, "-c", _KERNELS, str(result), os.path.dirname(__file__), resample], env=env,
                       check=True, timeout=100, cwd=tmp_path)
        got = np.load(result)
        assert len(got.files) == len(want) and all(np.array_equal(got[f"arr_{k}"], w) for k, w in enumerate(want)), cap


@needs_native
def test_what_it_does_not_take_is_refused():
    rgb, out = np.zeros((2, 4, 4, 3), np.uint8), np.zeros((2, 6, 6, 3), np.uint8)
    boxes = np.array([[0, 0, 4, 4]] * 2, np.int64)
    resize = native.resize_images
    with pytest.raises(ValueError, match="C 1 or 3"):
        resize(rgb, np.zeros((2, 6, 6, 1), np.uint8), boxes, "bilinear", None, "pillow")
    with pytest.raises(ValueError, match="C 1 or 3"):
        resize(rgb.astype(np.float32), out, boxes, "bilinear", None, "pillow")
    with pytest.raises(ValueError, match="contiguous"):
        resize(np.zeros((2, 4, 8, 3), np.uint8)[:, :, ::2], out, boxes, "bilinear", None, "pillow")
    with pytest.raises(ValueError, match="1 to 2"):
        resize(np.zeros((2, 0, 4, 3), np.uint8), out, boxes, "bilinear", None, "pillow")
    with pytest.raises(ValueError, match=r"boxes should be .* \[2, 4\]"):
        resize(rgb, out, boxes.astype(np.int32), "bilinear", None, "pillow")
    for box in ([0, 0, 5, 4], [-1, 0, 4, 4], [2, 0, 2, 4], [0, 3, 4, 1]):
        with pytest.raises(ValueError, match="box 1 is not"):
            resize(rgb, out, np.array([[0, 0, 4, 4], box], np.int64), "bilinear", None, "pillow")
    with pytest.raises(ValueError, match=r"vertical_first should be .* \[2\]"):
        resize(rgb, out, boxes, "bilinear", np.zeros(3, np.uint8), "pillow")
    with pytest.raises(ValueError, match="'lanczos'"):
        resize(rgb, out, boxes, "lanczos", None, "pillow")
    with pytest.raises(ValueError, match="'simd'"):
        resize(rgb, out, boxes, "bilinear", None, "simd")
    with pytest.raises(ValueError, match="overlap"):
        resize(rgb, rgb, boxes, "bilinear", None, "pillow")
