"""The device lowering of the pixel ops (ColorJitter, TrivialAugment): Kornia, batched, on any
torch device, with the parameters `plan.plan_pixels` draws, the ones the Pillow lowering
(`pil.py`) applies to the same (seed, epoch, sample). Each op follows Pillow's definition,
and the result is rounded to uint8 levels after each op, as Pillow's images are.

`PARITY` is how far this lowering may be from Pillow's, per op: the mean absolute difference
in uint8 levels over a batch of photographs (the parity tests hold it; the README shows it).
The differences come from float arithmetic against Pillow's integer tables and, for hue, from
Pillow's 8-bit HSV.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

# mean |kornia - pillow| in uint8 levels, per op, over random magnitudes (geometric ops,
# Posterize and Equalize are exact; the blends are within one level, as Pillow truncates where
# float arithmetic rounds)
PARITY = {
    "Identity": 0.0, "ShearX": 0.05, "ShearY": 0.05, "TranslateX": 0.05, "TranslateY": 0.05, "Rotate": 0.05,
    "Brightness": 0.6, "Color": 0.6, "Contrast": 0.6, "Sharpness": 0.6, "Posterize": 0.05, "Solarize": 0.1,
    "AutoContrast": 0.05, "Equalize": 0.05,
    "ColorJitter.brightness": 0.6, "ColorJitter.contrast": 0.6, "ColorJitter.saturation": 0.6, "ColorJitter.hue": 0.6,
}


def apply_pixel_ops(images: torch.Tensor, ops: Sequence, plans: list[list[dict]]) -> torch.Tensor:
    """uint8 [N, 3, H, W] images (any device, any strides) -> the same after each op of `ops`,
    sample i with parameters plans[k][i] (from plan_pixels)."""
    from .ops import ColorJitter

    x = images.float().div_(255)
    for op, params in zip(ops, plans):
        x = color_jitter(x, params) if isinstance(op, ColorJitter) else trivial_augment(x, params)
    return x.mul_(255).round_().clamp_(0, 255).to(torch.uint8)


def _levels(x: torch.Tensor) -> torch.Tensor:
    """Rounded to uint8 levels, as Pillow's image after each op."""
    return x.mul(255).round_().clamp_(0, 255).div_(255)


def _factor(values, x: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(values, dtype=x.dtype, device=x.device)


def _blend(x: torch.Tensor, degenerate: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """Pillow's ImageEnhance: degenerate + f * (x - degenerate), clipped."""
    f = f.view(-1, 1, 1, 1)
    return (degenerate + f * (x - degenerate)).clamp_(0, 1)


def _gray(x: torch.Tensor) -> torch.Tensor:
    import kornia

    return kornia.color.rgb_to_grayscale(x)  # ITU-R 601-2 luma, as Pillow's "L"


def brightness(x, f):
    # Pillow blends with black, i.e. scales: what Kornia calls adjust_contrast.
    import kornia

    return kornia.enhance.adjust_contrast(x, f)


def contrast(x, f):
    # Pillow blends with the mean of the grayscale image, rounded to a level.
    mean = (_gray(x).mean(dim=(1, 2, 3), keepdim=True) * 255).round() / 255
    return _blend(x, mean.expand_as(x), f)


def saturation(x, f):
    import kornia

    return kornia.enhance.adjust_saturation_with_gray_subtraction(x, f)


def hue(x, shift):
    import kornia

    return kornia.enhance.adjust_hue(x, shift * 2 * math.pi)


def sharpness(x, f):
    import kornia

    return kornia.enhance.sharpness(x, f)


_JITTER = (brightness, contrast, saturation, hue)
_JITTER_KEYS = ("brightness", "contrast", "saturation", "hue")


def color_jitter(x: torch.Tensor, params: list[dict]) -> torch.Tensor:
    """Brightness, contrast, saturation and hue, in each sample's own order."""
    order = torch.tensor([p["order"] for p in params], device=x.device)
    factors = [_factor([p[k] for p in params], x) for k in _JITTER_KEYS]
    for step in range(4):
        for k, fn in enumerate(_JITTER):
            rows = (order[:, step] == k).nonzero().flatten()
            if len(rows):
                x[rows] = _levels(fn(x[rows], factors[k][rows]))
    return x


# ----------------------------------------------------------------- TrivialAugmentWide

def _pil_affine(data, x: torch.Tensor) -> torch.Tensor:
    """Pillow's AFFINE data (output pixel -> input position, in pixel-edge coordinates) as the
    forward matrix Kornia's warp_affine takes in pixel-centre coordinates."""
    a, b, c, d, e, f = data
    inverse = torch.tensor([[a, b, c + 0.5 * (a + b) - 0.5], [d, e, f + 0.5 * (d + e) - 0.5], [0.0, 0.0, 1.0]],
                           dtype=torch.float64)
    return torch.linalg.inv(inverse)[:2].to(x.dtype)


def _rotate_data(angle: float, w: int, h: int) -> tuple:
    """The AFFINE data Pillow's Image.rotate(angle) uses (counter-clockwise, about the centre)."""
    t = -math.radians(angle)
    m = [math.cos(t), math.sin(t), 0.0, -math.sin(t), math.cos(t), 0.0]
    cx, cy = w / 2.0, h / 2.0
    m[2] = m[0] * -cx + m[1] * -cy + cx
    m[5] = m[3] * -cx + m[4] * -cy + cy
    return tuple(m)


def _affine(name: str, m: float, w: int, h: int) -> tuple:
    if name == "ShearX":
        return (1, m, 0, 0, 1, 0)
    if name == "ShearY":
        return (1, 0, 0, m, 1, 0)
    if name == "TranslateX":
        return (1, 0, -int(m), 0, 1, 0)
    if name == "TranslateY":
        return (1, 0, 0, 0, 1, -int(m))
    return _rotate_data(m, w, h)


def _autocontrast(x: torch.Tensor) -> torch.Tensor:
    # Kornia has no per-channel min-max stretch with Pillow's rules (identity where a channel
    # is flat; levels truncated): four lines of torch.
    levels = (x * 255).round()
    lo = levels.amin(dim=(2, 3), keepdim=True)
    hi = levels.amax(dim=(2, 3), keepdim=True)
    scale = torch.where(hi > lo, 255.0 / (hi - lo).clamp(min=1), torch.ones_like(hi))
    out = torch.where(hi > lo, ((levels - lo) * scale).floor_().clamp_(0, 255), levels)
    return out / 255


def trivial_augment(x: torch.Tensor, params: list[dict]) -> torch.Tensor:
    """One TrivialAugmentWide op per sample, samples grouped by op."""
    import kornia

    n, _, h, w = x.shape
    names = [p["op"] for p in params]
    mags = [p["magnitude"] for p in params]
    for name in set(names):
        rows = torch.tensor([i for i in range(n) if names[i] == name], device=x.device)
        m = [mags[i] for i in rows.tolist()]
        sub = x[rows]
        if name in ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate"):
            M = torch.stack([_pil_affine(_affine(name, v, w, h), x) for v in m]).to(x.device)
            out = kornia.geometry.transform.warp_affine(sub, M, (h, w), mode="nearest", padding_mode="zeros",
                                                        align_corners=True)
        elif name in ("Brightness", "Color", "Contrast", "Sharpness"):
            fn = {"Brightness": brightness, "Color": saturation, "Contrast": contrast, "Sharpness": sharpness}[name]
            out = fn(sub, _factor([1 + v for v in m], x))
        elif name == "Posterize":
            out = kornia.enhance.posterize(sub, torch.tensor([int(v) for v in m], device=x.device))
        elif name == "Solarize":
            # Pillow inverts the levels >= the threshold; compared on levels, not floats
            t = torch.tensor(m, dtype=x.dtype, device=x.device).view(-1, 1, 1, 1)
            levels = (sub * 255).round()
            out = torch.where(levels < t, levels, 255 - levels) / 255
        elif name == "AutoContrast":
            out = _autocontrast(sub)
        elif name == "Equalize":
            out = kornia.enhance.equalize(sub)
        else:  # Identity
            continue
        x[rows] = _levels(out)
    return x
