"""The auto-augments' geometry (TrivialAugmentWide's and RandAugment's shears, translations and
rotations) and RandomRotation on PIL images, as fastdata's Pillow lowering runs them
(`fastdata.loader`'s CPU placement, `fastdata run`'s served torchvision ops), against the calls
torchvision's PIL functional makes (Pillow's Image.transform and Image.rotate): the same pixels
(checked once), timed interleaved in one process.

fastdata's runs natively (csrc/geometry.cpp: Pillow's affine map and filters with its
arithmetic; `fastdata.transforms.geometry.affine` and `rotate`). Images: 64 of the synthetic
ImageNet-like set, resized to 224x224 RGB; per image a shear in [-0.3, 0.3], a translation of up
to 32 pixels, an angle in [-30, 30] degrees (the auto-augments' magnitudes' ranges), each with
the nearest filter (torchvision's default there) and the bilinear one (its references' recipes);
RandomRotation(15)'s bilinear and bicubic. One thread, warm (the images in memory).

    OMP_NUM_THREADS=1 python benchmarks/geometry.py [--reps 9] [--json PATH]
"""

from __future__ import annotations

import sys

import _common
import numpy as np
from PIL import Image

from fastdata.transforms import geometry as G
from fastdata.transforms import pil as P


def torchvisions(fn):
    """`fn` with the native geometry off: fastdata's fallback, Pillow's own calls as torchvision's
    PIL functional makes them (tests/contract/test_torchvision_faithful.py holds it to
    torchvision's `F.affine` and `F.rotate`)."""
    def run(*args):
        native = G._NATIVE_AFFINE
        G._NATIVE_AFFINE = False
        try:
            return fn(*args)
        finally:
            G._NATIVE_AFFINE = native
    return run


def main() -> None:
    args = _common.image_ops_parser(__doc__).parse_args()
    if not G._native_affine():
        sys.exit("fastdata's native extension is not built (or disagrees with this Pillow): nothing to compare")

    images = [photo.resize((224, 224), Image.BILINEAR) for photo in _common.photos(args.images)]
    rng = np.random.default_rng(0)
    draws = [{"ShearX": rng.uniform(-0.3, 0.3), "TranslateY": float(rng.integers(-32, 33)),
              "Rotate": rng.uniform(-30, 30)} for _ in images]
    cases = {f"{op} {f}": (lambda img, d, op=op, f=f: P.trivial_augment(img, {"op": op, "magnitude": d[op]}, f))
             for op in ("ShearX", "TranslateY", "Rotate") for f in ("nearest", "bilinear")}
    for f, resample in (("bilinear", 2), ("bicubic", 3)):
        cases[f"RandomRotation {f}"] = lambda img, d, r=resample: G.rotate(img, d["Rotate"] / 2, r, None, 0)

    rows = _common.image_ops(cases, torchvisions, images, draws, args.reps)
    _common.write("geometry", {"images": len(images), "reps": args.reps, "rows": rows,
                               "pillow": Image.__version__}, args.json)


if __name__ == "__main__":
    main()
