"""The Pillow lowering (`fastdata.transforms.pil`) on fixed inputs, op by op, for holding one
Pillow to another: run here with the active Pillow, and as a script in a process whose
PYTHONPATH puts another Pillow first.

    python tests/_pillow_ops.py INPUTS.npz OUT.npz JPEG...

INPUTS.npz holds "images" (uint8 [N, H, W, 3]); the JPEG files feed the decode ops. OUT.npz gets
one uint8 array per op, and "pillow" (the Pillow that ran, as fastdata._pillow describes it).
"""

from __future__ import annotations

import sys

import numpy as np

# ColorJitter's parts, each alone, over this range of factors (hue: shift)
JITTER = {"brightness": (0.5, 1.5), "contrast": (0.5, 1.5), "saturation": (0.3, 1.7), "hue": (-0.2, 0.2)}


def outputs(images: np.ndarray, jpegs: list[bytes]) -> dict[str, np.ndarray]:
    """{op: outputs of every input}, with parameters drawn from a fixed seed, so two Pillows
    get the same ones."""
    import io

    from PIL import Image

    from fastdata.transforms import pil as P
    from fastdata.transforms.plan import TRIVIAL_OPS, trivial_magnitude

    rng = np.random.default_rng(0)
    pictures = [Image.fromarray(a) for a in images]
    out: dict[str, np.ndarray] = {}
    for name in TRIVIAL_OPS:
        params = []
        for _ in pictures:
            mag = trivial_magnitude(name, int(rng.integers(1, 31)), 31)
            sign = -1 if rng.random() < 0.5 and name not in ("Posterize", "Solarize") else 1
            params.append({"op": name, "magnitude": sign * mag})
        out[name] = np.stack([np.asarray(P.trivial_augment(im, p)) for im, p in zip(pictures, params)])
    for key, (lo, hi) in JITTER.items():
        base = {"order": [0, 1, 2, 3], "brightness": 1.0, "contrast": 1.0, "saturation": 1.0, "hue": 0.0}
        out[f"ColorJitter.{key}"] = np.stack([
            np.asarray(P.color_jitter(im, {**base, key: float(rng.uniform(lo, hi))})) for im in pictures])
    crops, drafts = [], []
    for k, data in enumerate(jpegs):
        w, h = Image.open(io.BytesIO(data)).size
        # a crop window under twice the output (a full-scale decode), flipped every other image
        box = np.array([0.1 * w, 0.2 * h, 0.8 * w, 0.9 * h])
        crops.append(P.open_window(data, box, k % 2 == 1, (96, 80)))
        # the whole image to under half its size: Pillow's reduced-size (draft) decode
        drafts.append(P.open_window(data, np.array([0.0, 0.0, w, h]), False, (64, 56)))
    out["decode, crop, resize, flip"] = np.stack(crops)
    out["draft decode, resize"] = np.stack(drafts)
    return out


if __name__ == "__main__":
    from pathlib import Path

    from fastdata._pillow import PILLOW

    inputs, target, *files = sys.argv[1:]
    jpegs = [Path(f).read_bytes() for f in files]
    np.savez(target, pillow=np.array(PILLOW), **outputs(np.load(inputs)["images"], jpegs))
