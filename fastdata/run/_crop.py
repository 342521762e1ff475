"""`fastdata run`'s RandomCrop and Pad (torchvision's v1 and v2 classes) of a folder's images,
folded into the decoder's one box per sample as a CenterCrop is (`transforms.plan`: an op with a
`window`), a RandomCrop's at offsets drawn per sample. Padding is the box reaching past the image,
whose part outside is the zeros a padded sample is decoded into (constant, with a fill of 0), or
those zeros overwritten by the fill, or on the PIL image by the decoded pixels NumPy's pad would
copy there (`mode` edge, reflect or symmetric: `transforms.plan.pad_around`). An image smaller than the crop after the
padding, on which torchvision raises, is refused (`refuses`), so that its batch is the script's
own fetch, which raises there.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..transforms import ops as fd


@dataclass(frozen=True)
class RandomCrop(fd.Op):
    """torchvision's RandomCrop: the image padded by `padding` (left, top, right, bottom), then,
    with `pad_if_needed`, on both sides of an axis by what it lacks of the crop; then an (h, w)
    window at offsets uniform over [0, H - h] and [0, W - w] of the padded image, as its
    `get_params` draws them with torch.randint."""

    size: tuple[int, int]
    padding: tuple[int, int, int, int] = (0, 0, 0, 0)
    pad_if_needed: bool = False
    mode: str = "constant"  # torchvision's padding_mode
    fill: tuple[int, int, int] = (0, 0, 0)  # a constant padding's
    geometric = True

    def _padded(self, W: np.ndarray, H: np.ndarray) -> tuple:
        """(the padded width and height, the padding before the image on each axis)."""
        h, w = self.size
        left, top, right, bottom = self.padding
        W, H = W + left + right, H + top + bottom
        more_x = np.maximum(w - W, 0) if self.pad_if_needed else np.zeros_like(W)
        more_y = np.maximum(h - H, 0) if self.pad_if_needed else np.zeros_like(H)
        return W + 2 * more_x, H + 2 * more_y, left + more_x, top + more_y

    def window(self, u: np.ndarray, W: np.ndarray, H: np.ndarray) -> tuple:
        """(left, top, w, h) per image of sizes (W, H), from two uniforms an image: in the image's
        own coordinates, past its edges where the padding is cut."""
        h, w = self.size
        PW, PH, before_x, before_y = self._padded(W, H)
        top = np.floor(u[:, 0] * np.maximum(PH - h + 1, 1)).astype(np.int64)
        left = np.floor(u[:, 1] * np.maximum(PW - w + 1, 1)).astype(np.int64)
        return left - before_x, top - before_y, np.full_like(W, w), np.full_like(H, h)

    def refuses(self, W: np.ndarray, H: np.ndarray) -> np.ndarray:
        """bool [N]: the images of sizes (W, H) smaller than the crop once padded (torchvision raises)."""
        PW, PH, _, _ = self._padded(W, H)
        return (PW < self.size[1]) | (PH < self.size[0])


@dataclass(frozen=True)
class Pad(fd.Op):
    """torchvision's Pad: the window reaching `padding` (left, top, right, bottom) past each edge
    of the image, padded in `mode`."""

    padding: tuple[int, int, int, int]
    mode: str = "constant"
    fill: tuple[int, int, int] = (0, 0, 0)
    geometric = True

    def padded_size(self, h: Any, w: Any) -> tuple:
        """(h, w) of an image of (h, w) once padded (ints, or arrays of them)."""
        left, top, right, bottom = self.padding
        return h + top + bottom, w + left + right

    def window(self, u: np.ndarray, W: np.ndarray, H: np.ndarray) -> tuple:
        PH, PW = self.padded_size(H, W)
        return np.full_like(W, -self.padding[0]), np.full_like(H, -self.padding[1]), PW, PH

    def refuses(self, W: np.ndarray, H: np.ndarray) -> np.ndarray:
        return np.zeros(len(W), dtype=bool)


def padding_of(op: Any) -> tuple[int, int, int, int]:
    """(left, top, right, bottom) of torchvision's RandomCrop's or Pad's padding: an int, or 1, 2 or
    4 of them (v2's RandomCrop keeps it as left, right, top, bottom); zeros for none. ValueError,
    saying why, for any other form."""
    import torchvision.transforms.v2 as v2

    padding = op.padding
    if not padding:
        return (0, 0, 0, 0)
    if type(op) is v2.RandomCrop:
        return (padding[0], padding[2], padding[1], padding[3])
    p = [padding] if isinstance(padding, int) else [operator.index(x) for x in padding]
    p = p * 4 if len(p) == 1 else p * 2 if len(p) == 2 else p
    if len(p) != 4 or min(p) < 0:
        raise ValueError(f"padding {padding!r}: fastdata lowers 1, 2 or 4 sizes of at least 0")
    return tuple(p)  # type: ignore[return-value]


def fits(h: int, w: int, fixed: tuple[int, int] | None, short_side: int | None) -> bool:
    """Whether every image, of (h, w) `fixed` or of shorter side `short_side` (None: not known),
    is at least h x w."""
    return (fixed is not None and h <= fixed[0] and w <= fixed[1]) or (
        short_side is not None and max(h, w) <= short_side)


MODES = ("edge", "reflect", "symmetric")  # the padding modes other than constant that fastdata lowers


def _fill(fill: Any, domain: str) -> tuple[int, int, int] | None:
    """A constant padding's fill as a channel's uint8 values: ints from 0 to 255 (a list of 1 or 3
    on the PIL image only: torchvision's v1 refuses one for a tensor), 0 only on a float tensor
    (whose values are the uint8 image's after the tensor steps); None for any other."""
    values = list(fill) if type(fill) in (list, tuple) and domain == "pil" else [fill]
    if len(values) not in (1, 3) or not all(type(v) is int or (type(v) is float and v.is_integer()) for v in values):
        return None
    rgb = tuple(int(v) for v in values) * (3 // len(values))
    return rgb if all(0 <= v <= 255 for v in rgb) and not (domain == "float" and any(rgb)) else None  # type: ignore


def _mode(op: Any, domain: str) -> tuple[str, tuple[int, int, int]]:
    """`op`'s padding mode and fill on images of `domain`: constant with a fill `_fill` takes, or
    on the PIL image one of `MODES`; ValueError, saying why, for any other."""
    fill, mode, kind = op.fill, op.padding_mode, type(op).__name__
    rgb = _fill(fill, domain) if mode == "constant" else (0, 0, 0)
    if rgb is not None and (mode == "constant" or (mode in MODES and domain == "pil")):
        return mode, rgb
    where = {"pil": "", "uint8": " on a tensor", "float": " on a float tensor"}[domain]
    raise ValueError(f"{kind} with padding_mode {mode!r} and fill {fill!r}{where}: fastdata lowers a folder's {kind} "
                     "constant with a fill of ints from 0 to 255 (one; on the PIL image 3 too; on a float tensor 0), "
                     "or on the PIL image edge, reflect or symmetric")


def pad(op: Any, domain: str) -> Pad | None:
    """Pad's lowering on images of `domain`; None where it pads nothing; ValueError, saying why,
    where there is none."""
    mode, fill = _mode(op, domain)
    padding = padding_of(op)
    return Pad(padding, mode, fill) if any(padding) else None


def random_crop(op: Any, fixed: tuple[int, int] | None, domain: str) -> RandomCrop | None:
    """RandomCrop's lowering for images of (h, w) `fixed` (None: not known) so far, of `domain`;
    None where it is the image's own size and pads nothing (torchvision then draws nothing and
    crops nothing); ValueError, saying why, where there is none: padding `_mode` refuses,
    pad_if_needed in a mode other than constant (v1 pads twice)."""
    h, w = int(op.size[0]), int(op.size[1])  # (torchvision holds it as (h, w), an int given or not)
    mode, fill = _mode(op, domain) if op.padding or op.pad_if_needed else ("constant", (0, 0, 0))
    if op.pad_if_needed and mode != "constant":
        raise ValueError(f"{type(op).__name__} with pad_if_needed and padding_mode {mode!r}: fastdata lowers "
                         "pad_if_needed constant")
    padding = padding_of(op)
    if fixed == (h, w) and not any(padding):
        return None
    return RandomCrop((h, w), padding, bool(op.pad_if_needed), mode, fill)
