"""ColorJitter on PIL images, as fastdata's Pillow lowering runs it (`fastdata.loader`'s `pil`
and `wds` CPU placement, `fastdata run`'s served torchvision ColorJitter), against the steps
torchvision's PIL functional takes (ImageEnhance's Brightness, Contrast and Color, the hue
through an HSV image): the same pixels (checked once), timed interleaved in one process.

fastdata's runs natively (csrc/color.cpp): the hue in one pass with Pillow's conversions'
arithmetic, brightness, contrast and saturation as ImageEnhance's blends with the installed
Pillow's convert("L") weights (`fastdata.transforms.pil.color_jitter`). Images: 64 of the
synthetic ImageNet-like set, resized to 224x224 RGB; ColorJitter(0.4, 0.4, 0.4, 0.1) (MoCo v2's
and SimCLR's strengths' kind): factors uniform in [0.6, 1.4], hue in [-0.1, 0.1], the four in a
random order per image; the three blends alone (timm's default ColorJitter(0.4)); and the hue
alone. One thread, warm (the images in memory).

    OMP_NUM_THREADS=1 python benchmarks/color_jitter.py [--reps 9] [--json PATH]
"""

from __future__ import annotations

import sys

import _common
import numpy as np
from PIL import Image

from fastdata.transforms import pil as P


def torchvisions(fn):
    """`fn` with the native steps off: fastdata's fallback, torchvision.transforms.functional's PIL
    steps for ColorJitter (tests/contract/test_torchvision_faithful.py holds it to torchvision's
    `F.adjust_*`)."""
    def run(*args):
        hue, luma = P._NATIVE_HUE, P._ENHANCE_LUMA
        P._NATIVE_HUE, P._ENHANCE_LUMA = False, None
        try:
            return fn(*args)
        finally:
            P._NATIVE_HUE, P._ENHANCE_LUMA = hue, luma
    return run


def main() -> None:
    args = _common.image_ops_parser(__doc__).parse_args()
    if not P._native_hue() or P._enhance_luma() is None:
        sys.exit("fastdata's native extension is not built (or disagrees with this Pillow): nothing to compare")

    images = [photo.resize((224, 224), Image.BILINEAR) for photo in _common.photos(args.images)]
    rng = np.random.default_rng(0)
    plans = [{"order": list(rng.permutation(4)), "brightness": rng.uniform(0.6, 1.4),
              "contrast": rng.uniform(0.6, 1.4), "saturation": rng.uniform(0.6, 1.4),
              "hue": rng.uniform(-0.1, 0.1)} for _ in images]
    cases = {name: (lambda img, p, order=order: P.color_jitter(img, p if order is None else {**p, "order": order}))
             for name, order in (("ColorJitter", None), ("three blends", [0, 1, 2]), ("hue", [3]))}
    rows = _common.image_ops(cases, torchvisions, images, plans, args.reps)
    _common.write("color_jitter", {"images": len(images), "reps": args.reps, "rows": rows,
                                   "pillow": Image.__version__}, args.json)


if __name__ == "__main__":
    main()
