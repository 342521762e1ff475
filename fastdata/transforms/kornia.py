"""The device lowering of the pixel ops (ColorJitter, TrivialAugment, RandAugment, AutoAugment):
batched torch on any device, with the parameters `plan.plan_pixels` draws, the ones the Pillow
lowering (`pil.py`) applies to the same (seed, epoch, sample). Each op computes what Pillow
computes: the geometric ops in Pillow's 16.16 fixed point (nearest) or its doubles (bilinear,
bicubic), the blends and the grayscale on integer levels, the hue shift through Pillow's 8-bit
HSV in the precision of its C code; Kornia gives Posterize and Equalize. The result is rounded
to uint8 levels after each op, as Pillow's images are. It runs in float32 whatever autocast or
TF32 setting the caller has: nothing here is a matmul or a convolution, and autocast is turned
off around it.

`PARITY` is how far this lowering may be from Pillow's, per op: the mean absolute difference
in uint8 levels over a batch of photographs (the parity tests hold it; the README shows it).
What is left is a level here and there where Pillow-SIMD's integer code rounds otherwise.
"""

from __future__ import annotations

import contextlib
import math
from typing import Sequence

import torch

from .geometry import rotate_data
from .pil import shear_coefficient

# mean |this lowering - Pillow's| in uint8 levels, per op, over random magnitudes
PARITY = {
    "Identity": 0.0, "ShearX": 0.0, "ShearY": 0.0, "TranslateX": 0.0, "TranslateY": 0.0, "Rotate": 0.0,
    "Brightness": 0.05, "Color": 0.05, "Contrast": 0.05, "Sharpness": 0.05, "Posterize": 0.0, "Solarize": 0.0,
    "AutoContrast": 0.05, "Equalize": 0.05, "Invert": 0.0,
    "ColorJitter.brightness": 0.05, "ColorJitter.contrast": 0.05, "ColorJitter.saturation": 0.05,
    "ColorJitter.hue": 0.05,
}


def apply_pixel_ops(images: torch.Tensor, ops: Sequence, plans: list[list[dict]]) -> torch.Tensor:
    """uint8 [N, 3, H, W] images (any device, any strides) -> the same after each op of `ops`,
    sample i with parameters plans[k][i] (from plan_pixels)."""
    from .ops import AutoAugment, ColorJitter, RandAugment

    x = images.float().div_(255)
    # float32 throughout, whatever autocast the caller's loop runs under
    device_type = x.device.type
    off = (torch.autocast(device_type, enabled=False) if torch.amp.is_autocast_available(device_type)
           else contextlib.nullcontext())
    with off:
        for op, params in zip(ops, plans):
            if isinstance(op, ColorJitter):
                x = color_jitter(x, params)
            elif isinstance(op, (RandAugment, AutoAugment)):  # its ops in turn, a TrivialAugment-like op a sample
                rounds = max((len(p["ops"]) for p in params), default=0)
                for r in range(rounds):  # (a sample with fewer ops takes Identity)
                    x = trivial_augment(x, [p["ops"][r] if r < len(p["ops"]) else _IDENTITY for p in params],
                                        op.interpolation)
            else:
                x = trivial_augment(x, params, op.interpolation)
    return x.mul_(255).round_().clamp_(0, 255).to(torch.uint8)


_IDENTITY = {"op": "Identity", "magnitude": 0.0}


def _levels(x: torch.Tensor) -> torch.Tensor:
    """Rounded to uint8 levels, as Pillow's image after each op."""
    return x.mul(255).round_().clamp_(0, 255).div_(255)


def _factor(values, x: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(values, dtype=x.dtype, device=x.device)


def _blend(x: torch.Tensor, degenerate: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """Pillow's ImageEnhance (Image.blend): degenerate + f * (x - degenerate) on levels, in
    float32 as Pillow computes it, truncated and clipped to a level."""
    a, b = (degenerate * 255).round_(), (x * 255).round_()
    f = f.to(torch.float32).view(-1, 1, 1, 1)
    return (a + f * (b - a)).floor_().clamp_(0, 255).div_(255)


def _gray(x: torch.Tensor) -> torch.Tensor:
    """Pillow's "L" of an RGB image, [N, 1, H, W] levels: ITU-R 601-2 luma in 16.16 fixed point
    (libImaging/Convert.c, L24), on integers, so every device gives Pillow's level."""
    rgb = (x * 255).round_().to(torch.int32)
    luma = (rgb[:, 0:1] * 19595 + rgb[:, 1:2] * 38470 + rgb[:, 2:3] * 7471 + 0x8000) >> 16
    return luma.to(x.dtype) / 255


def brightness(x, f):
    # Pillow blends with black.
    return _blend(x, torch.zeros_like(x), f)


def contrast(x, f):
    # Pillow blends with the mean of the grayscale image, rounded to a level.
    mean = (_gray(x).double().mean(dim=(1, 2, 3), keepdim=True) * 255 + 0.5).floor_().float() / 255
    return _blend(x, mean.expand_as(x), f)


def saturation(x, f):
    # Pillow blends with the grayscale image.
    return _blend(x, _gray(x).expand_as(x), f)


def hue(x, shift):
    """torchvision's hue shift of a Pillow image: to Pillow's 8-bit HSV, the hue level moved by
    the shift truncated to whole levels (modulo 256), back to RGB. Pillow's conversions
    (libImaging/Convert.c, rgb2hsv_row and hsv2rgb) mix float and double arithmetic; each step
    here is one torch op in the precision C gives it, so every device rounds as Pillow does."""
    f32, f64 = torch.float32, torch.float64
    rgb = (x * 255).round_().to(torch.int32)
    r, g, b = rgb[:, 0], rgb[:, 1], rgb[:, 2]
    maxc, minc = rgb.amax(dim=1), rgb.amin(dim=1)
    flat = maxc == minc
    cr = (maxc - minc).to(f32).clamp_(min=1)  # flat pixels take hue and saturation 0 below
    sat = cr / maxc.to(f32).clamp_(min=1)
    rc, gc, bc = ((maxc - c).to(f32) / cr for c in (r, g, b))
    h = torch.where(r == maxc, (bc - gc).to(f64),
                    torch.where(g == maxc, (2.0 + rc.to(f64)) - bc.to(f64), (4.0 + gc.to(f64)) - rc.to(f64))).to(f32)
    h = torch.fmod(h.to(f64) / 6.0 + 1.0, 1.0).to(f32)
    uh = torch.where(flat, 0, (h.to(f64) * 255.0).trunc().clamp_(0, 255).to(torch.int32))
    us = torch.where(flat, 0, (sat.to(f64) * 255.0).trunc().clamp_(0, 255).to(torch.int32))
    steps = torch.tensor([int(v * 255) % 256 for v in shift.tolist()], dtype=torch.int32).to(x.device)
    hh = (uh + steps.view(-1, 1, 1)) % 256
    hd = hh.to(f64) * 6.0 / 255.0
    i = hd.floor()
    frac = (hd - i.to(f32).to(f64)).to(f32)
    fs = (us.to(f64) / 255.0).to(f32)
    v = maxc.to(f64)

    def level(t):  # C's round (half away from zero) of a non-negative value, clipped to a level
        return (t + 0.5).floor_().clamp_(0, 255)

    p = level(v * (1.0 - fs.to(f64)))
    q = level(v * (1.0 - (fs * frac).to(f64)))
    t = level(v * (1.0 - fs.to(f64) * (1.0 - frac.to(f64))))
    sector = i.to(torch.int64) % 6
    table = torch.stack([torch.stack(c, dim=1) for c in ((v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v),
                                                          (v, p, q))], dim=1)  # [N, 6, 3, H, W]
    out = table.gather(1, sector.view(sector.shape[0], 1, 1, *sector.shape[1:]).expand(-1, 1, 3, -1, -1)).squeeze(1)
    gray = (us == 0).unsqueeze(1)
    out = torch.where(gray, v.unsqueeze(1).expand_as(out), out)
    unmoved = (shift.abs() < 1e-9).to(x.device).view(-1, 1, 1, 1)  # the Pillow lowering leaves these alone
    return torch.where(unmoved, x, (out / 255).to(x.dtype))


def sharpness(x, f):
    # Pillow's SMOOTH filter (3x3: 1s around a 5, over 13), its border rows and columns kept,
    # rounded to levels as Pillow's filtered image is, then the blend. A sum of shifted slices,
    # not Kornia's convolution: cuDNN runs a convolution in TF32 where the caller allows it.
    h, w = x.shape[-2:]
    inner = 4 * x[..., 1:-1, 1:-1]
    for dy in range(3):
        for dx in range(3):
            inner = inner + x[..., dy:h - 2 + dy, dx:w - 2 + dx]
    degenerate = x.clone()
    degenerate[..., 1:-1, 1:-1] = _levels(inner / 13)
    return _blend(x, degenerate, f)


_JITTER = (brightness, contrast, saturation, hue)
_JITTER_KEYS = ("brightness", "contrast", "saturation", "hue")


def color_jitter(x: torch.Tensor, params: list[dict]) -> torch.Tensor:
    """Brightness, contrast, saturation and hue, in each sample's own order."""
    # the order and the hue shifts stay on the CPU: the rows and the hue's whole levels are drawn
    # from them there, with no wait on the device
    order = torch.tensor([p["order"] for p in params])
    factors = [_factor([p[k] for p in params], x) for k in _JITTER_KEYS[:3]]
    factors.append(torch.tensor([p["hue"] for p in params], dtype=torch.float64))
    for step in range(4):
        for k, fn in enumerate(_JITTER):
            rows = (order[:, step] == k).nonzero().flatten()
            if len(rows):
                x[rows] = _levels(fn(x[rows], factors[k][rows]))
    return x


# ----------------------------------------------------------------- TrivialAugmentWide

def _fix(v: float) -> int:
    """Pillow's FIX: a double to 16.16 fixed point, rounded half up."""
    return math.floor(v * 65536.0 + 0.5)


def _pil_affine_nearest(x: torch.Tensor, datas: Sequence[tuple]) -> torch.Tensor:
    """Pillow's AFFINE transform with NEAREST sampling and fill 0, sample i with datas[i]
    (output pixel -> input position, pixel-edge coordinates), computed as Pillow computes it:
    in 16.16 fixed point (libImaging/Geometry.c, affine_fixed; a translation takes its
    ImagingScaleAffine path, which picks the same pixels). Integer arithmetic, so each output
    pixel takes the input pixel Pillow takes on every device. A sampling grid in float32 (Kornia's
    warp_affine) does not: its rounding picks a neighbour near half-pixel positions, and a
    matmul there runs in TF32 or bfloat16 where the caller allows it, which moves whole edges."""
    n, c, h, w = x.shape
    a = torch.tensor([[_fix(d[0]), _fix(d[1]), _fix(d[2] + d[0] * 0.5 + d[1] * 0.5),
                       _fix(d[3]), _fix(d[4]), _fix(d[5] + d[3] * 0.5 + d[4] * 0.5)] for d in datas],
                     dtype=torch.int64).to(x.device).view(n, 6, 1, 1)
    xs = torch.arange(w, device=x.device, dtype=torch.int64).view(1, 1, w)
    ys = torch.arange(h, device=x.device, dtype=torch.int64).view(1, h, 1)
    xin = torch.div(a[:, 2] + xs * a[:, 0] + ys * a[:, 1], 65536, rounding_mode="floor")  # Pillow's >> 16
    yin = torch.div(a[:, 5] + xs * a[:, 3] + ys * a[:, 4], 65536, rounding_mode="floor")
    inside = (xin >= 0) & (xin < w) & (yin >= 0) & (yin < h)
    src = (yin.clamp(0, h - 1) * w + xin.clamp(0, w - 1)).view(n, 1, h * w).expand(n, c, h * w)
    out = x.reshape(n, c, h * w).gather(2, src).view(n, c, h, w)
    return out * inside.unsqueeze(1).to(x.dtype)


def _source_points(x: torch.Tensor, datas: Sequence[tuple]) -> tuple:
    """Where Pillow's AFFINE transform samples each output pixel (libImaging/Geometry.c,
    affine_transform and the filters' HEAD): its centre mapped in doubles, sample i with
    datas[i]; (inside: [N, 1, H, W], whether that point is in the image (else the pixel is
    fill 0); x0, y0: [N, H, W] int64, the pixel below and left of the point less 0.5; dx, dy:
    [N, 1, H, W], its fractions; at(yy, xx): the images' levels at those pixels, each index
    clipped to the image, as float64 [N, C, H, W]). In float64, one torch op per C expression
    in C's order, so every device computes Pillow's doubles."""
    n, c, h, w = x.shape
    f64 = torch.float64
    a = torch.tensor(datas, dtype=f64).to(x.device).view(n, 6, 1, 1)
    xs = (torch.arange(w, device=x.device, dtype=f64) + 0.5).view(1, 1, w)
    ys = (torch.arange(h, device=x.device, dtype=f64) + 0.5).view(1, h, 1)
    xin = a[:, 0] * xs + a[:, 1] * ys + a[:, 2]
    yin = a[:, 3] * xs + a[:, 4] * ys + a[:, 5]
    inside = ((xin >= 0) & (xin < w) & (yin >= 0) & (yin < h)).unsqueeze(1)
    xin, yin = xin - 0.5, yin - 0.5
    x0, y0 = xin.floor(), yin.floor()
    dx, dy = (xin - x0).unsqueeze(1), (yin - y0).unsqueeze(1)
    levels = (x * 255).round().to(f64).reshape(n, c, h * w)

    def at(yy: torch.Tensor, xx: torch.Tensor) -> torch.Tensor:
        src = (yy.clamp(0, h - 1) * w + xx.clamp(0, w - 1)).view(n, 1, h * w).expand(n, c, h * w)
        return levels.gather(2, src).view(n, c, h, w)

    return inside, x0.to(torch.int64), y0.to(torch.int64), dx, dy, at


def _row_inside(y: torch.Tensor, h: int) -> torch.Tensor:
    return ((y >= 0) & (y < h)).unsqueeze(1)


def _pil_affine_bilinear(x: torch.Tensor, datas: Sequence[tuple]) -> torch.Tensor:
    """Pillow's AFFINE transform with BILINEAR sampling and fill 0 (bilinear_filter32RGB): at
    each point (`_source_points`), its four neighbours blended along x, then along y (the lower
    row taken only where it is inside, else the upper again), truncated to a level."""
    inside, x0, y0, dx, dy, at = _source_points(x, datas)
    left, right = at(y0, x0), at(y0, x0 + 1)
    v1 = left + (right - left) * dx
    left, right = at(y0 + 1, x0), at(y0 + 1, x0 + 1)
    v2 = torch.where(_row_inside(y0 + 1, x.shape[2]), left + (right - left) * dx, v1)
    v = v1 + (v2 - v1) * dy
    return (v.trunc() * inside).div_(255).to(x.dtype)


def _cubic(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Pillow's BICUBIC(v, v1, v2, v3, v4, d) (libImaging/Geometry.c), its terms in C's order."""
    return b + t * ((-a + c) + t * ((2 * (a - b) + c - d) + t * (-a + b - c + d)))


def _pil_affine_bicubic(x: torch.Tensor, datas: Sequence[tuple]) -> torch.Tensor:
    """Pillow's AFFINE transform with BICUBIC sampling and fill 0 (bicubic_filter32RGB): at each
    point (`_source_points`), its 4x4 neighbours (a row below the first taken only where it is
    inside, else the row above it again), clipped to [0, 255] and truncated to a level."""
    inside, x0, y0, dx, dy, at = _source_points(x, datas)
    x0, y0 = x0 - 1, y0 - 1

    def row(yy: torch.Tensor) -> torch.Tensor:
        return _cubic(at(yy, x0), at(yy, x0 + 1), at(yy, x0 + 2), at(yy, x0 + 3), dx)

    v = [row(y0)]
    for k in (1, 2, 3):
        v.append(torch.where(_row_inside(y0 + k, x.shape[2]), row(y0 + k), v[-1]))
    out = _cubic(*v, dy)
    out = torch.where(out <= 0, 0.0, torch.where(out >= 255, 255.0, out.trunc()))
    return (out * inside).div_(255).to(x.dtype)


def _warp(x: torch.Tensor, datas: Sequence[tuple], interpolation: str) -> torch.Tensor:
    warp = {"bilinear": _pil_affine_bilinear, "bicubic": _pil_affine_bicubic}.get(interpolation, _pil_affine_nearest)
    return warp(x, datas)


def _rotate(x: torch.Tensor, angles: Sequence[float], interpolation: str) -> torch.Tensor:
    """Pillow's Image.rotate per sample: its exact turns first (0 and 180 degrees, and 90 and 270
    on a square image, which it transposes whatever the filter), the rest through the affine map."""
    n, _, h, w = x.shape
    out = x.clone()
    warped = []
    for i, angle in enumerate(angles):
        angle = angle % 360.0
        if angle == 180.0:
            out[i] = x[i].flip(1, 2)
        elif angle in (90.0, 270.0) and w == h:
            out[i] = torch.rot90(x[i], 1 if angle == 90.0 else -1, dims=(1, 2))
        elif angle != 0.0:
            warped.append(i)
    if warped:
        out[warped] = _warp(x[warped], [rotate_data(angles[i], w, h) for i in warped], interpolation)
    return out


def _affine(name: str, m: float) -> tuple:
    if name in ("ShearX", "ShearY"):
        s = shear_coefficient(name, m)
        return (1, s, 0, 0, 1, 0) if name == "ShearX" else (1, 0, 0, s, 1, 0)
    if name == "TranslateX":
        return (1, 0, -int(m), 0, 1, 0)
    return (1, 0, 0, 0, 1, -int(m))


def _autocontrast(x: torch.Tensor) -> torch.Tensor:
    # Kornia has no per-channel min-max stretch with Pillow's rules (identity where a channel
    # is flat; levels truncated): four lines of torch.
    levels = (x * 255).round()
    lo = levels.amin(dim=(2, 3), keepdim=True)
    hi = levels.amax(dim=(2, 3), keepdim=True)
    scale = torch.where(hi > lo, 255.0 / (hi - lo).clamp(min=1), torch.ones_like(hi))
    out = torch.where(hi > lo, ((levels - lo) * scale).floor_().clamp_(0, 255), levels)
    return out / 255


def trivial_augment(x: torch.Tensor, params: list[dict], interpolation: str = "nearest") -> torch.Tensor:
    """One TrivialAugmentWide (or RandAugment) op per sample, samples grouped by op."""
    import kornia

    n, _, h, w = x.shape
    names = [p["op"] for p in params]
    mags = [p["magnitude"] for p in params]
    for name in set(names):
        rows = torch.tensor([i for i in range(n) if names[i] == name], device=x.device)
        m = [mags[i] for i in rows.tolist()]
        sub = x[rows]
        if name == "Rotate":
            out = _rotate(sub, m, interpolation)
        elif name in ("ShearX", "ShearY", "TranslateX", "TranslateY"):
            out = _warp(sub, [_affine(name, v) for v in m], interpolation)
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
        elif name == "Invert":
            out = 1 - sub
        else:  # Identity
            continue
        x[rows] = _levels(out)
    return x
