"""`fastdata run`'s RandomRotation (torchvision's v1 and v2 classes) on the PIL image: read from
the script's op (`rotation`), an angle drawn per sample, and Pillow's rotate of each image as
torchvision's `F.rotate` calls it (`Rotation.on_pillow`). A folder's lowering runs it as a pixel
op after the decoder's geometry (`_lowering`); an in-memory set's among its array ops (`_arrays`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..transforms import ops as fd


@dataclass(frozen=True)
class Rotation(fd.Op):
    """torchvision's RandomRotation on the PIL image, no expand: an angle uniform in `degrees`
    per sample (float32, as torch's `uniform_` gives it), then Pillow's rotate as torchvision's
    `F.rotate` calls it, with its resample filter, center and fill."""

    degrees: tuple[float, float]
    resample: int  # Pillow's filter
    center: tuple | None
    fill: int

    def plan(self, u: Any) -> list[dict]:
        lo, hi = self.degrees
        return [{"angle": float(a)} for a in (lo + (hi - lo) * u[:, 0]).astype("float32")]

    def on_pillow(self, img: Any, p: dict) -> Any:
        fill = self.fill if len(img.getbands()) == 1 else (self.fill,) * len(img.getbands())
        return img.rotate(p["angle"], self.resample, False, self.center, fillcolor=fill)


def rotation(op: Any, tensor: bool) -> Rotation:
    """RandomRotation's lowering; ValueError, saying why, where there is none. On the PIL image
    only (torchvision rotates a tensor with torch's grid sampling, not Pillow's), without expand
    (the size would change by angle), nearest, bilinear or bicubic, a fill of one int."""
    import torchvision.transforms.v2 as v2
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms.functional import pil_modes_mapping

    kind, mode = type(op).__name__, op.interpolation
    if isinstance(mode, str) and type(op) is v2.RandomRotation:  # (v2 takes a name; v1's functional raises on one)
        mode = InterpolationMode(mode)
    if tensor or op.expand or type(op.fill) is not int or not 0 <= op.fill <= 255 or mode not in (
            InterpolationMode.NEAREST, InterpolationMode.BILINEAR, InterpolationMode.BICUBIC):
        raise ValueError(f"{kind} on a tensor, with expand, a fill other than one int or interpolation {mode}: "
                         "fastdata lowers it on the PIL image, nearest, bilinear or bicubic")
    center = None if op.center is None else tuple(op.center)
    return Rotation((float(op.degrees[0]), float(op.degrees[1])), pil_modes_mapping[mode], center, op.fill)
