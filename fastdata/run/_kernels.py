"""torchvision's uint8 tensor kernels of the auto-augment ops, natively where fastdata's twin gives
the installed torchvision's values: `twin` computes one op as autoaugment's `_apply_op` (v1) or
v2's `_apply_image_or_video_transform` calls it, or says it has none (None), and the caller runs
torchvision's own call.

The twins: Brightness, Contrast, Color and Sharpness by the extension's `tensor_enhance`
(csrc/color.cpp: torchvision's float32 steps, each rounded as torch's separate operations round
them); Posterize, Solarize, AutoContrast and Equalize by a table of the 256 values per channel,
computed as torchvision computes each value (in float32 where it does, the histogram's steps in
integers), applied by the extension's lookup; TranslateX and TranslateY (no fill, nearest or
bilinear) as a shift by whole pixels with zeros, which is what torchvision's grid gives (its
sampling points fall within float32's error of whole pixels, and the result is rounded).
v2's Contrast, Color and Sharpness have none: v2 adds with `add_(x, alpha)`, which torch's CPU
kernels fuse into one rounding in their vector lanes and not in a loop's last elements, so that
a value depends on where in the tensor it lies. Each op's twin is checked once per process against
torchvision's call on probe images (`_agrees`); one that differs anywhere is not used.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch

from .._ext import native
from ..transforms import pil

_ENHANCE = {"Brightness": 0, "Contrast": 1, "Color": 2, "Sharpness": 3}
_TABLES = ("Posterize", "Solarize", "AutoContrast", "Equalize")
_VALUES = np.arange(256, dtype=np.int64)


def twin(v2: bool, name: str, magnitude: float, image: torch.Tensor, interpolation: Any,
         fill: Any) -> torch.Tensor | None:
    """The uint8 image [C, H, W] after op `name` of `magnitude`, by fastdata's twin of
    torchvision's kernel (`interpolation` and `fill` as torchvision's call would get them), or
    None where there is none for this op, image or build."""
    if not _supported(v2, name) or not _agrees(v2, name):
        return None
    return _compute(v2, name, magnitude, image, interpolation, fill)


def run_op(v2: bool, tv: Any, image: torch.Tensor, name: str, magnitude: float, v1_fill: Any) -> torch.Tensor:
    """Op `name` of torchvision's AugMix or auto-augment `tv` on the uint8 `image` ([C, H, W], or
    [1, C, H, W]): by fastdata's twin where there is one (`twin`), else by torchvision's call as
    the op's forward makes it (v2's `_apply_image_or_video_transform` with the op's fill; v1's
    `_apply_op` with `v1_fill`, the fill its forward hands its kernels)."""
    one = image[0] if image.ndim == 4 and len(image) == 1 else image
    ours = twin(v2, name, magnitude, one, tv.interpolation, tv.fill)
    if ours is not None:
        return ours if one is image else ours[None]
    if v2:
        return tv._apply_image_or_video_transform(image, name, magnitude, interpolation=tv.interpolation,
                                                  fill=tv._fill)
    from torchvision.transforms.autoaugment import _apply_op

    return _apply_op(image, name, magnitude, interpolation=tv.interpolation, fill=v1_fill)


def _supported(v2: bool, name: str) -> bool:
    if native is None or not hasattr(native, "tensor_enhance"):
        return False
    return name in _TABLES or name in ("TranslateX", "TranslateY", "Brightness") or (name in _ENHANCE and not v2)


def _compute(v2: bool, name: str, magnitude: float, image: torch.Tensor, interpolation: Any,
             fill: Any) -> torch.Tensor | None:
    if image.dtype != torch.uint8 or image.ndim != 3 or image.shape[0] not in (1, 3) or image.numel() == 0:
        return None
    c, h, w = image.shape
    if name in ("TranslateX", "TranslateY"):
        from torchvision.transforms import InterpolationMode

        if v2 and isinstance(interpolation, str) and interpolation in ("nearest", "bilinear"):
            interpolation = InterpolationMode(interpolation)  # (v2 takes the mode's name too)
        if fill is not None or interpolation not in (InterpolationMode.NEAREST, InterpolationMode.BILINEAR):
            return None
        return _shifted(image, int(magnitude), -1 if name == "TranslateX" else -2)
    src = image.contiguous().numpy()
    if name in _ENHANCE:
        kind, factor = _ENHANCE[name], 1.0 + magnitude
        if factor < 0 or (kind == 2 and c != 3) or (kind == 3 and min(h, w) < 3) or \
                (kind == 1 and h * w * 255 >= 2 ** 24):
            return None  # (torchvision's own call: its error, its image as it is, or a sum not exact here)
        out = np.empty_like(src)
        native.tensor_enhance(src, out, kind, factor)
        return torch.from_numpy(out)
    tables = _tables(v2, name, magnitude, src.reshape(c, -1))
    if tables is None:
        return None
    out = np.empty_like(src)
    native.lookup_values(src.reshape(1, c, -1), tables, out.reshape(1, c, -1))
    return torch.from_numpy(out)


def _shifted(image: torch.Tensor, by: int, dim: int) -> torch.Tensor:
    """The image moved by `by` whole pixels along `dim` (right or down for by > 0), zeros where
    nothing moved in."""
    out = torch.zeros_like(image, memory_format=torch.contiguous_format)
    n = image.shape[dim]
    if abs(by) < n:
        out.narrow(dim, max(by, 0), n - abs(by)).copy_(image.narrow(dim, max(-by, 0), n - abs(by)))
    return out


def _tables(v2: bool, name: str, magnitude: float, planes: np.ndarray) -> np.ndarray | None:
    """Each channel's table of the 256 values (uint8 [C, 256]) for a table op, or None where
    torchvision's own call runs (a Posterize of other than 1 to 8 bits, a Solarize threshold over
    255: its error or its image). Posterize's and Equalize's are ImageOps' (`pil.band_tables`:
    the same integer steps); Solarize's and AutoContrast's compare and scale in float32."""
    if name == "Posterize":
        return pil.band_tables(planes, name, int(magnitude)) if 1 <= int(magnitude) <= 8 else None
    if name == "Equalize":
        return pil.band_tables(planes, name, 0)
    x = _VALUES
    if name == "Solarize":  # (v2's threshold: 255 times the magnitude; each compared with it in float32)
        threshold = 255 * magnitude if v2 else magnitude
        if threshold > 255:
            return None
        table = np.where(x.astype(np.float32) >= np.float32(threshold), 255 - x, x)
        return np.broadcast_to(table.astype(np.uint8), (len(planes), 256)).copy()
    # AutoContrast
    lo, hi = planes.min(axis=1).astype(np.float32), planes.max(axis=1).astype(np.float32)
    same = hi == lo
    lo = np.where(same, np.float32(0), lo)[:, None]
    values = x.astype(np.float32)[None]
    if v2:  # (value - min) / ((max - min) * (1 / 255))
        inv = np.where(same, np.float32(1), (hi - lo[:, 0]) * np.float32(1.0 / 255))[:, None]
        out = (values - lo) / inv
    else:  # (value - min) * (255 / (max - min)), the division a reciprocal times 255 (Tensor.__rtruediv__)
        with np.errstate(divide="ignore"):
            scale = np.where(same, np.float32(1), np.float32(1) / (hi - lo[:, 0]) * np.float32(255))[:, None]
        out = (values - lo) * scale
    return np.clip(out, 0, 255).astype(np.uint8)


@functools.lru_cache(maxsize=None)
def _agrees(v2: bool, name: str) -> bool:
    """Whether the twin of op `name` gives torchvision's call's image on the probe images
    (`_probes`) at magnitudes of AugMix's tables, signed, and past them; a translation with either
    interpolation. A few milliseconds an op, once a process."""
    from torchvision.transforms import InterpolationMode

    images = _probes(name == "AutoContrast")
    f32 = [float(np.float32(m)) for m in (0.2, 0.4, 0.6, 0.9)]  # (v2's Solarize magnitudes, from its float32 table)
    magnitudes = {"Posterize": (1.0, 3.0, 4.0, 8.0),
                  "Solarize": (0.0, *f32, 1.0) if v2 else (0.0, 51.0, 128.0, 204.0, 229.5, 255.0),
                  "TranslateX": (0.0, 3.0, -7.9, 40.0), "TranslateY": (2.0, -5.0, -30.0),
                  "AutoContrast": (0.0,), "Equalize": (0.0,)}
    modes = (InterpolationMode.BILINEAR, InterpolationMode.NEAREST) if name.startswith("Translate") else (None,)
    for image in images:
        for m in magnitudes.get(name, (0.0, 0.09, -0.18, 0.27, -0.63, 0.9, -0.9, 1.5)):
            for interpolation in modes:
                ours = _compute(v2, name, m, image, interpolation, None)
                if ours is not None and not torch.equal(ours, _torchvisions(v2, name, m, image, interpolation)):
                    return False
    return True


@functools.lru_cache(maxsize=2)
def _probes(spans: bool) -> tuple[torch.Tensor, ...]:
    """The probe images: noise, a few levels, a flat one, channels of narrower ranges, one channel,
    one laid out as a PIL image's tensor; with `spans`, a channel of each range 0..d too (an
    AutoContrast table depends on each channel's max - min alone)."""
    rng = np.random.default_rng(7)
    noise = rng.integers(0, 256, (3, 23, 29), dtype=np.uint8)
    levels = (rng.integers(0, 5, (3, 17, 31)) * 60 + 7).astype(np.uint8)
    flat = np.full((3, 9, 11), 90, dtype=np.uint8)
    ranged = np.stack([rng.integers(lo, hi, (19, 21)) for lo, hi in ((3, 250), (31, 200), (77, 91))]).astype(np.uint8)
    images = [noise, levels, flat, ranged, noise[:1], ranged[1:2], noise.transpose(1, 2, 0).copy().transpose(2, 0, 1)]
    if spans:
        ramps = np.minimum(_VALUES[None, :], np.arange(1, 256)[:, None]).astype(np.uint8)
        images += [ramps[k:k + 3, None] for k in range(0, 255, 3)]
    return tuple(map(torch.from_numpy, images))


def _torchvisions(v2: bool, name: str, magnitude: float, image: torch.Tensor, interpolation: Any) -> torch.Tensor:
    if v2:
        from torchvision.transforms.v2 import AugMix

        op = AugMix()
        return op._apply_image_or_video_transform(image, name, magnitude, interpolation, op._fill)
    from torchvision.transforms.autoaugment import _apply_op

    return _apply_op(image, name, magnitude, interpolation, None)
