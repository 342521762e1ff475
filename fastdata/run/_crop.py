"""`fastdata run`'s RandomCrop (torchvision's v1 and v2 classes) of a folder's images: read from
the script's op (`random_crop`) where every image is known to be at least the crop's size (a
Resize or a crop before it says so), and folded into the decoder's one box per sample as a
CenterCrop is (`transforms.plan`: an op with a `window`), at offsets drawn per sample.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..transforms import ops as fd


@dataclass(frozen=True)
class RandomCrop(fd.Op):
    """torchvision's RandomCrop without padding: an (h, w) window at offsets uniform over
    [0, H - h] and [0, W - w], as its `get_params` draws them with torch.randint."""

    size: tuple[int, int]
    geometric = True

    def window(self, u: np.ndarray, W: np.ndarray, H: np.ndarray) -> tuple:
        """(left, top, w, h) per image of sizes (W, H), from two uniforms an image."""
        h, w = self.size
        top = np.floor(u[:, 0] * (H - h + 1)).astype(np.int64)
        left = np.floor(u[:, 1] * (W - w + 1)).astype(np.int64)
        return left, top, np.full_like(W, w), np.full_like(H, h)


def fits(h: int, w: int, fixed: tuple[int, int] | None, short_side: int | None) -> bool:
    """Whether every image, of (h, w) `fixed` or of shorter side `short_side` (None: not known),
    is at least h x w."""
    return (fixed is not None and h <= fixed[0] and w <= fixed[1]) or (
        short_side is not None and max(h, w) <= short_side)


def random_crop(op: Any, fixed: tuple[int, int] | None, short_side: int | None) -> RandomCrop | None:
    """RandomCrop's lowering for images of (h, w) `fixed` or of shorter side `short_side` (None:
    not known) so far; None where it is the image's own size (torchvision then draws nothing and
    crops nothing); ValueError, saying why, where there is none: with padding or pad_if_needed,
    or where an image may be smaller than the crop (torchvision raises there)."""
    kind = type(op).__name__
    if op.padding or op.pad_if_needed:
        raise ValueError(f"{kind} with padding or pad_if_needed: fastdata lowers a folder's RandomCrop without padding")
    h, w = int(op.size[0]), int(op.size[1])  # (torchvision holds it as (h, w), an int given or not)
    if not fits(h, w, fixed, short_side):
        raise ValueError(f"{kind} of images not known to be at least {h}x{w} (torchvision raises on a smaller one): "
                         "fastdata lowers it after a Resize or crop that makes them so")
    return None if fixed == (h, w) else RandomCrop((h, w))
