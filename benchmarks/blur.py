"""Pillow's GaussianBlur as a script's own op calls it (MoCo v2's, SimSiam's and DINO's
`img.filter(ImageFilter.GaussianBlur(radius))`), against what `fastdata run` gives that op's
image: the blur computed natively (csrc/blur.cpp: Pillow's BoxBlur.c, value for value;
`fastdata.run._blur`). The same pixels (checked once), timed interleaved in one process.

Images: 64 of the synthetic ImageNet-like set, resized to 224x224 RGB (MoCo v2's crops, DINO's
global ones) and to 96x96 (DINO's local crops); per image a radius uniform in [0.1, 2.0] (those
scripts' draws). One thread, warm (the images in memory). Stock Pillow and Pillow-SIMD each run
their own blur: run it under both (PYTHONPATH=<folder with Pillow-SIMD's PIL>). `fastdata run` serves
the native blur under stock Pillow only: Pillow-SIMD's own is as fast.

    OMP_NUM_THREADS=1 python benchmarks/blur.py [--reps 9] [--json PATH]
"""

from __future__ import annotations

import sys

import _common
import numpy as np
from PIL import Image, ImageFilter

from fastdata._pillow import pillow_info
from fastdata.run import _blur


def pillows(fn):
    """The script's call: Pillow's own Image.filter."""
    return lambda img, r: Image.Image.filter(img, ImageFilter.GaussianBlur(r))


def main() -> None:
    args = _common.image_ops_parser(__doc__).parse_args()
    if not _blur._agrees():
        sys.exit("fastdata's native extension is not built (or disagrees with this Pillow): nothing to compare")

    photos = _common.photos(args.images)
    radii = np.random.default_rng(0).uniform(0.1, 2.0, len(photos)).tolist()
    rows = {}
    for side in (224, 96):
        images = [photo.resize((side, side), Image.BILINEAR) for photo in photos]
        cases = {f"GaussianBlur {side}x{side}": lambda img, r: _blur.blurred(img, ImageFilter.GaussianBlur(r))}
        rows.update(_common.image_ops(cases, pillows, images, radii, args.reps, baseline_name="Pillow"))
    info = pillow_info()
    _common.write("blur" + ("_simd" if info["simd"] else ""), {
        "images": len(photos), "reps": args.reps, "rows": rows, "pillow": Image.__version__,
        "pillow_simd": info["simd"]}, args.json)


if __name__ == "__main__":
    main()
