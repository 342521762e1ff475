"""`fastdata run`'s RandomRotation, RandomAffine and RandomPerspective (torchvision's v1 and v2
classes) on the PIL image: read from the script's op (`rotation`, `affine`, `perspective`;
`pillow_geometry` takes any), the parameters drawn per sample, and each image transformed as
torchvision transforms it: Pillow's rotate as `F.rotate` calls it (`Rotation.on_pillow`, natively
where `transforms.geometry.rotate` can), torchvision's own `F.affine` (`Affine.on_pillow`) and
`F.perspective` (`Perspective.on_pillow`).
A folder's lowering runs them as pixel ops after the decoder's geometry (`_lowering`); an
in-memory set's among its array ops (`_arrays`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..transforms import ops as fd
from ..transforms import geometry, pil


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

    arrays = True  # (on_pillow takes an HWC uint8 array too, and gives one back: `transforms.geometry.rotate`)

    def on_pillow(self, img: Any, p: dict) -> Any:
        return geometry.rotate(img, p["angle"], self.resample, self.center, self.fill)


def _pillow_mode(op: Any, tensor: bool) -> Any:
    """The op's interpolation as an InterpolationMode (v2 takes a name; v1's functional raises on
    one); ValueError, saying why, where fastdata does not lower the op: on a tensor (torchvision
    transforms one with torch's grid sampling, not Pillow's), with `expand` (the size would change
    with the angle), a fill other than one int, an interpolation other than nearest, bilinear or
    bicubic."""
    import torchvision.transforms.v2 as v2
    from torchvision.transforms import InterpolationMode

    mode = op.interpolation
    if isinstance(mode, str) and isinstance(op, v2.Transform):
        mode = InterpolationMode(mode)
    filters = (InterpolationMode.NEAREST, InterpolationMode.BILINEAR, InterpolationMode.BICUBIC)
    why = ("on a tensor" if tensor else "with expand" if getattr(op, "expand", False) else
           f"with fill {op.fill!r}" if type(op.fill) is not int or not 0 <= op.fill <= 255 else
           f"with interpolation {mode}" if mode not in filters else "")
    if why:
        raise ValueError(f"{type(op).__name__} {why}: fastdata lowers it on the PIL image, with one int fill from 0 "
                         "to 255, nearest, bilinear or bicubic" + (", without expand" if hasattr(op, "expand") else ""))
    return mode


def rotation(op: Any, tensor: bool) -> Rotation:
    """RandomRotation's lowering; ValueError, saying why, where there is none (`_pillow_mode`)."""
    from torchvision.transforms.functional import pil_modes_mapping

    mode = _pillow_mode(op, tensor)
    center = None if op.center is None else tuple(op.center)
    return Rotation((float(op.degrees[0]), float(op.degrees[1])), pil_modes_mapping[mode], center, op.fill)


@dataclass(frozen=True)
class Affine(fd.Op):
    """torchvision's RandomAffine on the PIL image: per sample, as its `get_params` draws them
    (float32, as torch's `uniform_` gives them), an angle in `degrees`, a translation of at most
    `translate` of the image's width and height (whole pixels), a scale in `scale` and shears in
    `shear` (x, then y where four are given); then torchvision's `F.affine` with them, the op's
    interpolation, fill and center."""

    degrees: tuple[float, float]
    translate: tuple[float, float] | None
    scale: tuple[float, float] | None
    shear: tuple[float, ...] | None
    mode: str  # torchvision's InterpolationMode's value
    center: tuple | None
    fill: int

    def plan(self, u: Any) -> list[dict]:
        import numpy as np

        f32 = lambda r, x: np.float32(r[0] + (r[1] - r[0]) * x)  # noqa: E731
        sh = self.shear
        return [{"angle": float(f32(self.degrees, d[0])), "translate": (float(d[1]), float(d[2])),
                 "scale": float(f32(self.scale, d[3])) if self.scale else 1.0,
                 "shear": (float(f32(sh[:2], d[4])) if sh else 0.0, float(f32(sh[2:], d[5])) if sh and len(sh) == 4
                           else 0.0)} for d in u]

    def move(self, p: dict, size: tuple[int, int]) -> list[int]:
        """The sample's translation on an image of `size` (w, h): whole pixels, of at most the
        op's share of each side, as `get_params` rounds its draw."""
        import numpy as np

        if self.translate is None:
            return [0, 0]
        most = [float(share * side) for share, side in zip(self.translate, size)]
        return [int(round(float(np.float32(-m + 2 * m * x)))) for m, x in zip(most, p["translate"])]

    arrays = True  # (on_pillow takes an HWC uint8 array too, and gives one back where it maps natively)

    def on_pillow(self, img: Any, p: dict) -> Any:
        """torchvision's `F.affine` of the PIL image (or HWC array): its matrix, by its own
        `_get_inverse_affine_matrix` from the arguments `F.affine` passes it, then Pillow's
        transform as `transforms.geometry.affine` runs it (natively where it can); where torchvision
        has no such function or the fill is not one byte, `F.affine` itself."""
        import torchvision.transforms.functional as F
        from torchvision.transforms import InterpolationMode

        w, h = (img.shape[1], img.shape[0]) if hasattr(img, "shape") else img.size
        matrix = getattr(F, "_get_inverse_affine_matrix", None)
        if matrix is not None and self.mode in pil.FILTERS and type(self.fill) is int and 0 <= self.fill <= 255:
            center = [w * 0.5, h * 0.5] if self.center is None else list(self.center)
            data = matrix(center, p["angle"], self.move(p, (w, h)), p["scale"], list(p["shear"]))
            return geometry.affine(img, data, pil.FILTERS[self.mode], self.fill)
        img = geometry.as_image(img)
        return F.affine(img, p["angle"], self.move(p, img.size), p["scale"], list(p["shear"]),
                        interpolation=InterpolationMode(self.mode), fill=self.fill,
                        center=None if self.center is None else list(self.center))


def affine(op: Any, tensor: bool) -> Affine:
    """RandomAffine's lowering; ValueError, saying why, where there is none (`_pillow_mode`)."""
    mode = _pillow_mode(op, tensor)
    pair = lambda v: None if v is None else tuple(float(x) for x in v)  # noqa: E731
    return Affine(pair(op.degrees), pair(op.translate), pair(op.scale), pair(op.shear), mode.value,
                  None if op.center is None else tuple(op.center), op.fill)


@dataclass(frozen=True)
class Perspective(fd.Op):
    """torchvision's RandomPerspective on the PIL image: with chance `p` per sample, the four
    corners moved inward by whole pixels, each coordinate uniform over the range its `get_params`
    draws from (at most `distortion` of half the side), then `F.perspective` from the corners to
    the moved ones, with the op's interpolation and fill (v1's functional for v1's op, v2's for v2's)."""

    p: float
    distortion: float
    mode: str  # torchvision's InterpolationMode's value
    fill: int
    v2: bool
    draws = 9  # uniforms a sample takes: the chance, then the 8 coordinates

    def plan(self, u: Any) -> list[dict]:
        return [{"apply": bool(d[0] < self.p), "corners": tuple(float(x) for x in d[1:9])} for d in u]

    def points(self, p: dict, size: tuple[int, int]) -> tuple[list, list]:
        """(start, end): the image's corners and the sample's moved ones on an image of `size` (w,
        h), top-left, top-right, bottom-right, bottom-left, as `get_params` gives them."""
        w, h = size
        bw, bh = int(self.distortion * (w // 2)) + 1, int(self.distortion * (h // 2)) + 1
        # each coordinate's [low, high), as torch.randint(low, high) draws it
        ranges = [(0, bw), (0, bh), (w - bw, w), (0, bh), (w - bw, w), (h - bh, h), (0, bw), (h - bh, h)]
        xy = [lo + min(int(u * (hi - lo)), hi - lo - 1) for (lo, hi), u in zip(ranges, p["corners"])]
        return [[0, 0], [w - 1, 0], [w - 1, h - 1], [0, h - 1]], [xy[0:2], xy[2:4], xy[4:6], xy[6:8]]

    def on_pillow(self, img: Any, p: dict) -> Any:
        if not p["apply"]:
            return img
        import torchvision.transforms.functional as F
        import torchvision.transforms.v2.functional as F2
        from torchvision.transforms import InterpolationMode

        start, end = self.points(p, img.size)
        return (F2 if self.v2 else F).perspective(img, start, end, InterpolationMode(self.mode), self.fill)


def perspective(op: Any, tensor: bool) -> Perspective:
    """RandomPerspective's lowering; ValueError, saying why, where there is none (`_pillow_mode`)."""
    import torchvision.transforms.v2 as v2

    mode = _pillow_mode(op, tensor)
    return Perspective(float(op.p), float(op.distortion_scale), mode.value, op.fill, isinstance(op, v2.Transform))


def pillow_geometry(op: Any, tensor: bool) -> Rotation | Affine | Perspective:
    """RandomRotation's, RandomAffine's or RandomPerspective's lowering (ValueError, saying why,
    where there is none)."""
    kind = type(op).__name__
    return affine(op, tensor) if "Affine" in kind else perspective(op, tensor) if "Perspective" in kind else \
        rotation(op, tensor)
