"""The Pillow lowering: one sample's geometry (box, flip, output size) in one resize.

Used for everything the native decoder does not take (PNG, WebP, CMYK JPEGs, a build
without libjpeg). Pillow-SIMD (scripts/install.sh builds it) runs the resize on SIMD kernels,
several times faster than stock Pillow.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from .._ext import native
from .._pillow import open_image


def open_window(data: bytes, box: np.ndarray, flip: bool, size: tuple[int, int], resample: str = "bilinear",
                crop_first: bool = False, resized: tuple[int, int] | None = None) -> np.ndarray:
    """HWC uint8 RGB of `data` cropped to `box` (x0, y0, x1, y1 in source pixels), resized to
    `size` (w, h) with the `resample` filter ("bilinear", "bicubic": antialiased when
    shrinking, as Pillow's are; "nearest"), mirrored if `flip`. With `crop_first`, torchvision's
    steps, with no reduced-size decode: the whole decode, then the whole image resized to
    `resized` (w, h) and the box's whole pixels of it cropped (a Resize, then crops), or a box of
    whole pixels cropped before the resize (whose filter then sees only the crop)."""
    from PIL import Image

    img = open_image(data)
    x0, y0, x1, y1 = (float(v) for v in box)
    if crop_first:
        img = img.convert("RGB")
        if resized is not None:
            sx, sy = resized[0] / img.size[0], resized[1] / img.size[1]
            left, top = round(x0 * sx), round(y0 * sy)
            img = img.resize(tuple(resized), FILTERS[resample]).crop((left, top, left + size[0], top + size[1]))
            return np.asarray(img.transpose(Image.FLIP_LEFT_RIGHT) if flip else img)
        if all(v.is_integer() for v in (x0, y0, x1, y1)):
            img = img.crop((int(x0), int(y0), int(x1), int(y1)))
            x0, y0, x1, y1 = 0.0, 0.0, float(img.size[0]), float(img.size[1])
    elif img.format == "JPEG" and resample == "bilinear":
        # A reduced-size DCT decode when the box is at least twice the output: Pillow picks
        # the largest of 1/2, 1/4, 1/8 that keeps the image at least the requested size.
        shrink = min((x1 - x0) / size[0], (y1 - y0) / size[1])
        if shrink >= 2:
            W, H = img.size
            img.draft("RGB", (math.ceil(W / shrink), math.ceil(H / shrink)))
            sx, sy = img.size[0] / W, img.size[1] / H
            x0, x1, y0, y1 = x0 * sx, x1 * sx, y0 * sy, y1 * sy
    img = img.convert("RGB")
    img = img.resize(size, FILTERS[resample], box=(x0, y0, x1, y1))
    if flip:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    return np.asarray(img)


FILTERS = {"bilinear": 2, "bicubic": 3, "nearest": 0}  # the resize filters, by PIL.Image.Resampling's values


def size_of(data: bytes) -> tuple[int, int]:
    """(width, height) from the header. Pillow's decompression-bomb warning is silenced: the
    loaders hold the size to their own limit (`fastdata._structure.MAX_IMAGE_PIXELS`)."""
    from PIL import Image

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        with open_image(data) as img:
            return img.size


# ---- pixel ops (ColorJitter, TrivialAugment, RandAugment, AutoAugment) on a PIL image, with
# parameters from plan_pixels

def _probe_colours() -> np.ndarray:
    """The native colour ops' probe: every 256th colour of the RGB cube, each at an offset of its
    own in its run of 256, as a 256 x 256 RGB image."""
    codes = np.arange(1 << 16, dtype=np.uint32) * 256 + (np.arange(1 << 16, dtype=np.uint32) * 97) % 256
    return np.stack([codes >> 16, (codes >> 8) & 255, codes & 255], -1).astype(np.uint8).reshape(256, 256, 3)


def _native_hue() -> bool:
    """Whether ColorJitter's hue runs natively (`_hue`): where the extension is built and its hue
    shift (csrc/color.cpp, Pillow's conversions' arithmetic in one pass) gives this process's
    Pillow's pixels: checked once, on 65,536 colours spread over the RGB cube and as many HSV
    triples, both conversions (tests/unit/test_color_jitter.py checks all 2^24 of each, and the
    hue shift over every colour). Elsewhere the hue takes Pillow's own steps."""
    global _NATIVE_HUE
    if _NATIVE_HUE is None and native is None:
        _NATIVE_HUE = False
    if _NATIVE_HUE is None:
        from PIL import Image

        cube = _probe_colours()
        ours = np.empty_like(cube)
        same = True
        for mode, to_hsv in (("RGB", True), ("HSV", False)):
            native.convert_hsv(cube, ours, to_hsv)
            pillows = Image.fromarray(cube, mode).convert("RGB" if mode == "HSV" else "HSV")
            same &= np.array_equal(ours, np.asarray(pillows))
        _NATIVE_HUE = bool(same)
    return _NATIVE_HUE


_NATIVE_HUE: bool | None = None


# "L" as Pillow's convert("L") computes it, (R * r + G * g + B * b + half) >> shift: stock
# Pillow's weights, then Pillow-SIMD's
_LUMAS = ((19595, 38470, 7471, 16), (9798, 19235, 3735, 15))
_ENHANCE_LUMA: tuple | None | bool = False  # not probed yet


def _enhance_luma() -> tuple | None:
    """The "L" weights (`_LUMAS`) with which the extension's `enhance` (csrc/color.cpp: ImageEnhance's
    blends in one pass) gives this process's Pillow's Brightness, Contrast and Color, or None
    (no extension, or a Pillow of other arithmetic: ColorJitter then takes Pillow's own steps).
    Checked once, on 65,536 colours spread over the RGB cube, at factors inside and outside
    0..1 (tests/unit/test_color_jitter.py checks all 2^24)."""
    global _ENHANCE_LUMA
    if _ENHANCE_LUMA is False:
        _ENHANCE_LUMA = None
        if native is not None and hasattr(native, "enhance"):
            from PIL import Image, ImageEnhance

            cube = _probe_colours()
            img, ours = Image.fromarray(cube), np.empty_like(cube)
            classes = (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color)
            wants = [(kind, f, np.asarray(cls(img).enhance(f))) for kind, cls in enumerate(classes) for f in (0.37, 1.63)]
            for luma in _LUMAS:
                same = True
                for kind, f, want in wants:
                    native.enhance(cube, ours, kind, f, luma)
                    same = same and np.array_equal(ours, want)
                if same:
                    _ENHANCE_LUMA = luma
                    break
    return _ENHANCE_LUMA


def _hue_level(shift: float) -> int | None:
    """torchvision's hue step: the shift truncated toward zero to whole hue levels, added
    modulo 256 (None: no shift, the image unchanged)."""
    return None if abs(shift) < 1e-9 else int(np.int32(shift * 255).astype(np.uint8))


def _hue(img, shift: float):
    from PIL import Image

    level = _hue_level(shift)
    if level is None:
        return img
    if img.mode == "RGB" and _native_hue():
        pixels = np.array(img)  # (a writable copy, shifted in place)
        native.hue_shift(pixels, pixels, level)
        return Image.fromarray(pixels, "RGB")
    h, s, v = img.convert("HSV").split()
    h = Image.fromarray(np.asarray(h, dtype=np.uint8) + np.uint8(level), "L")
    return Image.merge("HSV", (h, s, v)).convert("RGB")


def color_jitter(img, p: dict):
    """ColorJitter's ops in the plan's order, as torchvision runs them on a PIL image
    (ImageEnhance's blends, the hue through HSV). `img`: an HWC uint8 array, a PIL image or a
    CHW uint8 tensor (`_form`). Natively on its pixels where `_enhance_luma` (and for a hue
    shift `_native_hue`) found this Pillow's arithmetic, the result a PIL image for a PIL image,
    else an HWC array; else Pillow's own steps, the result a PIL image."""
    from PIL import Image, ImageEnhance

    luma = _enhance_luma()
    level = _hue_level(p["hue"]) if 3 in p["order"] else None
    pixels = img.permute(1, 2, 0) if hasattr(img, "permute") else img  # (HWC)
    rgb = img.mode == "RGB" if hasattr(img, "getbands") else pixels.ndim == 3 and pixels.shape[2] == 3
    if luma is not None and (level is None or _native_hue()) and rgb:
        pixels = np.array(pixels, dtype=np.uint8, order="C")  # (a copy: the image given is left as it is)
        for k in p["order"]:
            if k < 3:
                native.enhance(pixels, pixels, k, p[("brightness", "contrast", "saturation")[k]], luma)
            elif level is not None:
                native.hue_shift(pixels, pixels, level)
        return Image.fromarray(pixels) if hasattr(img, "getbands") else pixels
    img = _form(img, tensor=False)
    for k in p["order"]:
        if k == 0:
            img = ImageEnhance.Brightness(img).enhance(p["brightness"])
        elif k == 1:
            img = ImageEnhance.Contrast(img).enhance(p["contrast"])
        elif k == 2:
            img = ImageEnhance.Color(img).enhance(p["saturation"])
        else:
            img = _hue(img, p["hue"])
    return img


def shear_coefficient(name: str, m: float) -> float:
    """The shear in the affine matrix torchvision gives Pillow for a ShearX/ShearY of magnitude
    m: an angle of degrees(atan(m)) through `_get_inverse_affine_matrix`, which gives tan(angle)
    for x and sin/cos for y; these differ from m in the last bits, which a bilinear sample's
    weights keep."""
    angle = math.radians(math.degrees(math.atan(m)))
    return math.tan(angle) if name == "ShearX" else math.sin(angle) / math.cos(angle)


def trivial_augment(img, p: dict, interpolation: str = "nearest"):
    """One TrivialAugmentWide or RandAugment op, as torchvision runs it on a PIL image. `img`: an
    HWC uint8 array, a PIL image or a CHW uint8 tensor; the geometry and the three blends run
    natively on an RGB image's pixels where this Pillow's arithmetic was found (`affine`,
    `enhance`), the result in the form given (an array for a tensor), the rest Pillow's own, the
    result a PIL image. Geometry convention (the GPU lowering follows it): shear maps output
    (x, y) to input (x + m*y, y); translate moves content right/down by m pixels; rotate turns
    counter-clockwise about the centre; fill 0."""
    from PIL import ImageEnhance, ImageOps

    name, m = p["op"], p["magnitude"]
    resample = FILTERS.get(interpolation, 0)
    img = img.permute(1, 2, 0).numpy() if hasattr(img, "permute") else img  # (a tensor as its HWC pixels)
    geometry = {"ShearX": (1, shear_coefficient(name, m), 0, 0, 1, 0),
                "ShearY": (1, 0, 0, shear_coefficient(name, m), 1, 0),
                "TranslateX": (1, 0, -int(m), 0, 1, 0), "TranslateY": (1, 0, 0, 0, 1, -int(m))}
    if name in geometry:
        return affine(img, geometry[name], resample, 0)
    if name == "Rotate":
        return rotate(img, m, resample, None, 0)
    if name in ("Brightness", "Contrast", "Color"):
        return enhance(img, ("Brightness", "Contrast", "Color").index(name), 1 + m)
    img = _form(img, tensor=False)
    if name == "Sharpness":
        return ImageEnhance.Sharpness(img).enhance(1 + m)
    if name == "Posterize":
        return ImageOps.posterize(img, int(m))
    if name == "Solarize":
        return ImageOps.solarize(img, m)
    if name == "AutoContrast":
        return ImageOps.autocontrast(img)
    if name == "Equalize":
        return ImageOps.equalize(img)
    if name == "Invert":
        return ImageOps.invert(img)
    return img


def enhance(img, kind: int, factor: float):
    """ImageEnhance's Brightness (kind 0), Contrast (1) or Color (2) of an HWC uint8 array or a PIL
    image: natively on an RGB image's pixels where `_enhance_luma` found this Pillow's
    arithmetic, in the form given; else ImageEnhance's, a PIL image."""
    from PIL import Image, ImageEnhance

    luma = _enhance_luma()
    if luma is not None and _bands(img) == 3:
        pixels = np.array(img, dtype=np.uint8, order="C")  # (a copy: the image given is left as it is)
        native.enhance(pixels, pixels, kind, factor, luma)
        return Image.fromarray(pixels) if hasattr(img, "getbands") else pixels
    classes = (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color)
    return classes[kind](_form(img, tensor=False)).enhance(factor)


# ---- geometry: Pillow's affine transform (Image.transform, Image.rotate), natively where the
# extension gives this Pillow's pixels

def _bands(img) -> int:
    """An HWC (or HW) uint8 array's channels, or a PIL image's: 3 for RGB, 1 for L, else 0 (what
    the native ops do not take)."""
    if hasattr(img, "getbands"):
        return {"RGB": 3, "L": 1}.get(img.mode, 0)
    shape = getattr(img, "shape", ())
    ok = getattr(img, "dtype", None) == np.uint8 and (len(shape) == 2 or (len(shape) == 3 and shape[2] in (1, 3)))
    return (1 if len(shape) == 2 else shape[2]) if ok else 0


_AFFINE_PROBES = ((1, 0.3, 0, 0, 1, 0), (1, 0, 0, -0.25, 1, 0), (1, 0, -7, 0, 1, 5), (1.1, 0.2, -3.5, -0.15, 0.9, 4.25),
                  (1, 0.01, 0, 0, 1000, -50480))  # (the last: nearest's doubles, past 16.16's range)
_NATIVE_AFFINE: bool | None = None


def _native_affine() -> bool:
    """Whether the extension's `affine` (csrc/geometry.cpp: Pillow's Geometry.c arithmetic) gives
    this process's Pillow's Image.transform(AFFINE): checked once on a 96 x 96 slice of the probe
    colours, RGB and L, each filter, through shears, a translation, a rotation, a map of every
    coefficient and one past the fixed-point range (tests/unit/test_geometry.py checks more)."""
    global _NATIVE_AFFINE
    if _NATIVE_AFFINE is None:
        _NATIVE_AFFINE = False
        if native is not None and hasattr(native, "affine"):
            from PIL import Image

            rgb = np.ascontiguousarray(_probe_colours()[:96, 16:112])
            same = True
            for pixels in (rgb, rgb[..., 1:2].copy()):
                img = Image.fromarray(pixels if pixels.shape[2] == 3 else pixels[..., 0])
                fill = [5, 6, 7][:pixels.shape[2]]
                for data in _AFFINE_PROBES + (rotate_data(23.5, 96, 96),):
                    for resample in (0, 2, 3):
                        ours = np.empty_like(pixels)
                        native.affine(pixels, ours, data, resample, fill)
                        colour = tuple(fill) if len(fill) == 3 else fill[0]
                        want = np.asarray(img.transform(img.size, Image.AFFINE, data, resample, fillcolor=colour))
                        same = same and np.array_equal(ours.reshape(want.shape), want)
            _NATIVE_AFFINE = bool(same)
    return _NATIVE_AFFINE


def affine(img, data: tuple, resample: int, fill: int):
    """Pillow's img.transform(img.size, AFFINE, data, resample, fillcolor=fill) (resample: Pillow's
    0 nearest, 2 bilinear, 3 bicubic; `fill` every channel's) of an HWC uint8 array or a PIL
    image: natively on an RGB or L image's pixels where `_native_affine`, in the form given (but
    a PIL image's nearest, which Pillow maps faster than the image's two conversions take); else
    Pillow's, a PIL image."""
    from PIL import Image

    bands = _bands(img)
    if bands and _native_affine() and not (resample == 0 and hasattr(img, "getbands")):
        pixels = np.ascontiguousarray(np.asarray(img))
        src = pixels.reshape(pixels.shape[0], pixels.shape[1], bands)
        out = np.empty_like(src)
        native.affine(src, out, tuple(float(v) for v in data), resample, [fill] * bands)
        return Image.fromarray(out.reshape(pixels.shape)) if hasattr(img, "getbands") else out.reshape(pixels.shape)
    img = _form(img, tensor=False)
    colour = fill if len(img.getbands()) == 1 else (fill,) * len(img.getbands())
    return img.transform(img.size, Image.AFFINE, data, resample, fillcolor=colour)


def rotate_data(angle: float, w: int, h: int, center: tuple | None = None) -> tuple:
    """The AFFINE data Pillow's Image.rotate(angle, center=center) computes for a w x h image
    (counter-clockwise about the centre, or `center`; the angle taken modulo 360, the matrix
    rounded to 15 decimals)."""
    t = -math.radians(angle % 360.0)
    m = [round(math.cos(t), 15), round(math.sin(t), 15), 0.0, round(-math.sin(t), 15), round(math.cos(t), 15), 0.0]
    cx, cy = (w / 2.0, h / 2.0) if center is None else center
    m[2] = m[0] * -cx + m[1] * -cy + 0.0 + cx
    m[5] = m[3] * -cx + m[4] * -cy + 0.0 + cy
    return tuple(m)


def rotate(img, angle: float, resample: int, center: tuple | None, fill: int):
    """Pillow's img.rotate(angle, resample, expand=False, center=center, fillcolor=fill) (`fill`
    every channel's) of an HWC uint8 array or a PIL image, in `affine`'s forms: Pillow's exact
    turns where it takes them (about the middle: 0 and 180 degrees, and 90 and 270 on a square
    image, whatever the filter), else its affine map."""
    angle = angle % 360.0
    if center is None and (angle in (0.0, 180.0) or (angle in (90.0, 270.0) and _size(img)[0] == _size(img)[1])):
        if hasattr(img, "getbands"):
            return img.rotate(angle, resample)
        return np.array(np.rot90(img, int(angle // 90)))  # (counter-clockwise, as Pillow's; a copy, as its)
    w, h = _size(img)
    return affine(img, rotate_data(angle, w, h, center), resample, fill)


def _size(img) -> tuple[int, int]:
    """(width, height) of an HWC array or a PIL image."""
    return img.size if hasattr(img, "getbands") else (img.shape[1], img.shape[0])


def apply_pixel_ops(row: np.ndarray, ops, params: list[dict]) -> None:
    """Runs the pixel ops on one HWC uint8 row in place (a row of the batch slot)."""
    out = pixel_ops_on(row, ops, params)
    if out is not row:  # (an array, a PIL image, or a CHW tensor: the one with `permute`)
        row[...] = out.permute(1, 2, 0).numpy() if hasattr(out, "permute") else np.asarray(out)


def pixel_ops_on(img, ops, params: list[dict]):
    """The image after the pixel ops, each with its sample's parameters. `img` is an HWC uint8
    array, a PIL image or a CHW uint8 tensor; each op gets the form it takes (a PIL image; the
    array itself where the op takes one, ColorJitter, the auto-augments and `fastdata.run`'s ops
    marked `arrays`; with `tensor` set, `fastdata.run`'s ops on the tensor image, the tensor
    torchvision's `pil_to_tensor` makes), converted only where the form changes; the result is in
    the last op's form. An op holding ops (`fastdata.run`'s RandomApply, RandomChoice, RandomOrder) runs those
    its plan names, in the plan's order."""
    from .ops import ColorJitter

    for op, p in zip(ops, params):
        if isinstance(getattr(op, "ops", None), tuple):  # its ops in the order its plan drew (none, one, all)
            img = pixel_ops_on(img, [op.ops[k] for k in p["order"]], [p["inner"][k] for k in p["order"]])
        elif getattr(op, "tensor", False):
            img = op.on_tensor(_form(img, tensor=True), p)
        elif callable(getattr(op, "on_pillow", None)):  # an op that applies itself (`fastdata.run`'s)
            img = op.on_pillow(img if getattr(op, "arrays", False) and isinstance(img, np.ndarray)
                               else _form(img, tensor=False), p)
        elif isinstance(op, ColorJitter):
            img = color_jitter(img, p)
        else:  # TrivialAugment (one op), RandAugment or AutoAugment (its ops in turn)
            for one in p.get("ops", (p,)):
                img = trivial_augment(img, one, op.interpolation)
    return img


def _form(img, tensor: bool):
    """`img` (an HWC uint8 array, a PIL image or a CHW uint8 tensor) as a CHW tensor (`tensor`)
    or a PIL image, both lossless."""
    from PIL import Image

    if tensor:
        if hasattr(img, "permute"):
            return img
        import torch

        pixels = np.array(img)  # (a copy, as pil_to_tensor's)
        return torch.from_numpy(pixels.reshape(*pixels.shape[:2], -1)).permute(2, 0, 1)  # (an L image: 1 x H x W)
    if isinstance(img, np.ndarray):
        return Image.fromarray(img[:, :, 0] if img.ndim == 3 and img.shape[2] == 1 else img)  # (one channel: L)
    return Image.fromarray(img.permute(1, 2, 0).numpy()) if hasattr(img, "permute") else img
