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
from .geometry import affine, as_image, bands, rotate


def open_window(data: bytes, box: np.ndarray, flip: bool, size: tuple[int, int], resample: str = "bilinear",
                crop_first: bool = False, resized: tuple[int, int, int, int] | None = None) -> np.ndarray:
    """HWC uint8 RGB of `data` cropped to `box` (x0, y0, x1, y1 in source pixels), resized to
    `size` (w, h) with the `resample` filter ("bilinear", "bicubic": antialiased when
    shrinking, as Pillow's are; "nearest"), mirrored if `flip`. With `crop_first`, torchvision's
    steps, with no reduced-size decode: the whole decode, then the whole image resized to
    `resized` (w, h, x, y: `Geometry.resized`) and the window at (x, y) of it cropped (a Resize,
    then crops), or a box of whole pixels cropped before the resize (whose filter then sees
    only the crop)."""
    from PIL import Image

    img = open_image(data)
    x0, y0, x1, y1 = (float(v) for v in box)
    if crop_first:
        img = img.convert("RGB")
        if resized is not None:
            left, top = resized[2:]
            img = img.resize(tuple(resized[:2]), FILTERS[resample]).crop((left, top, left + size[0], top + size[1]))
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


# "L" as convert("L") computes it, (R * r + G * g + B * b + half) >> shift, and the pixels its SIMD lanes
# take at a time (a row's last width % lanes take stock weights): stock Pillow's, then Pillow-SIMD's
_LUMAS = ((19595, 38470, 7471, 16, 0), (9798, 19235, 3735, 15, 4))
_ENHANCE_LUMA: tuple | None | bool = False  # not probed yet


def _native_enhance(src: np.ndarray, out: np.ndarray, kind: int, factor: float, luma: tuple) -> None:
    native.enhance(src, out, kind, factor, luma[:4], luma[4])  # (one of `_LUMAS`: its weights, then its lanes)


def _enhance_luma() -> tuple | None:
    """The "L" weights (`_LUMAS`) with which the extension's `enhance` (csrc/color.cpp: ImageEnhance's
    blends in one pass) gives this process's Pillow's Brightness, Contrast and Color, or None
    (no extension, or a Pillow of other arithmetic: ColorJitter then takes Pillow's own steps).
    Checked once, on 65,536 colours spread over the RGB cube in rows of 256, and those whose "L"
    the two weights give otherwise in rows of one pixel (past any SIMD lane), at factors inside
    and outside 0..1 (tests/unit/test_color_jitter.py checks all 2^24)."""
    global _ENHANCE_LUMA
    if _ENHANCE_LUMA is False:
        _ENHANCE_LUMA = None
        if native is not None and hasattr(native, "enhance"):
            from PIL import Image, ImageEnhance

            cube = _probe_colours()
            rgb = cube.reshape(-1, 3).astype(np.int64)
            odd = (rgb @ _LUMAS[1][:3] + (1 << 14)) >> 15 != (rgb @ _LUMAS[0][:3] + (1 << 15)) >> 16
            cubes = [cube, np.ascontiguousarray(cube.reshape(-1, 3)[odd][:, None])]  # (rows of one pixel)
            classes = (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color)
            wants = [(cube, kind, f, np.asarray(cls(Image.fromarray(cube)).enhance(f))) for cube in cubes
                     for kind, cls in enumerate(classes) for f in (0.37, 1.63)]
            for luma in _LUMAS:
                same = True
                for cube, kind, f, want in wants:
                    ours = np.empty_like(cube)
                    _native_enhance(cube, ours, kind, f, luma)
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
                _native_enhance(pixels, pixels, k, p[("brightness", "contrast", "saturation")[k]], luma)
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
    """One TrivialAugmentWide, RandAugment or AutoAugment op, as torchvision runs it on a PIL image.
    `img`: an HWC uint8 array, a PIL image or a CHW uint8 tensor; the geometry and ImageEnhance's
    four run natively on an RGB image's pixels where this Pillow's arithmetic was found (`affine`,
    `enhance`), ImageOps' table ops on an array's (`table_op`), the result in the form given (an
    array for a tensor); the rest Pillow's own, the result a PIL image. Geometry convention (the
    GPU lowering follows it): shear maps output (x, y) to input (x + m*y, y); translate moves
    content right/down by m pixels; rotate turns counter-clockwise about the centre; fill 0."""
    from PIL import ImageOps

    name, m = p["op"], p["magnitude"]
    resample = FILTERS.get(interpolation, 0)
    img = img.permute(1, 2, 0).numpy() if hasattr(img, "permute") else img  # (a tensor as its HWC pixels)
    if name in ("ShearX", "ShearY"):
        s = shear_coefficient(name, m)
        return affine(img, (1, s, 0, 0, 1, 0) if name == "ShearX" else (1, 0, 0, s, 1, 0), resample, 0)
    if name in ("TranslateX", "TranslateY"):
        return affine(img, (1, 0, -int(m), 0, 1, 0) if name == "TranslateX" else (1, 0, 0, 0, 1, -int(m)), resample, 0)
    if name == "Rotate":
        return rotate(img, m, resample, None, 0)
    if name in ("Brightness", "Contrast", "Color", "Sharpness"):
        return enhance(img, ("Brightness", "Contrast", "Color", "Sharpness").index(name), 1 + m)
    if name in _LUT_OPS and isinstance(img, np.ndarray) and bands(img) and native_tables():
        return table_op(img, name, m)
    img = _form(img, tensor=False)
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
    """ImageEnhance's Brightness (kind 0), Contrast (1), Color (2) or Sharpness (3) of an HWC uint8
    array or a PIL image: natively on an RGB image's pixels where this Pillow's arithmetic was
    found (`_enhance_luma`, `_native_sharpness`), in the form given; else ImageEnhance's, a PIL
    image."""
    from PIL import Image, ImageEnhance

    luma = _enhance_luma()
    if bands(img) == 3 and (_native_sharpness() if kind == 3 else luma is not None):
        pixels = np.array(img, dtype=np.uint8, order="C")  # (a copy: the image given is left as it is)
        _native_enhance(pixels, pixels, kind, factor, luma or _LUMAS[0])  # (Sharpness takes no "L")
        return Image.fromarray(pixels) if hasattr(img, "getbands") else pixels
    classes = (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color, ImageEnhance.Sharpness)
    return classes[kind](_form(img, tensor=False)).enhance(factor)


_NATIVE_SHARPNESS: bool | None = None


def _native_sharpness() -> bool:
    """Whether the extension's Sharpness (csrc/color.cpp: Filter.c's SMOOTH pass, ImagingBlend's
    blend) gives this process's Pillow's ImageEnhance.Sharpness: checked once on the probe
    colours, at factors inside and outside 0..1 (tests/unit/test_auto_augment.py checks more)."""
    global _NATIVE_SHARPNESS
    if _NATIVE_SHARPNESS is None:
        _NATIVE_SHARPNESS = False
        if native is not None and hasattr(native, "enhance"):
            from PIL import Image, ImageEnhance

            cube = _probe_colours()
            ours, sharpness, same = np.empty_like(cube), ImageEnhance.Sharpness(Image.fromarray(cube)), True
            for factor in (0.37, 1.63):
                native.enhance(cube, ours, 3, factor)
                same = same and np.array_equal(ours, np.asarray(sharpness.enhance(factor)))
            _NATIVE_SHARPNESS = same
    return _NATIVE_SHARPNESS


# ImageOps' table ops as torchvision's PIL functional calls them, on an array's pixels
_LUT_OPS = ("Posterize", "Solarize", "AutoContrast", "Equalize", "Invert")
_NATIVE_TABLES: bool | None = None


def table_op(pixels: np.ndarray, name: str, m) -> np.ndarray:
    """ImageOps' posterize(bits m), solarize(threshold m), autocontrast(), equalize(), invert() or timm's
    solarize_add (m: add, threshold) of an HWC (or HW) uint8 array by `band_tables` and the
    extension's lookup, a new array; a posterize of other than 1-8 bits is Pillow's (its error)."""
    from PIL import ImageOps

    src = np.ascontiguousarray(pixels).reshape(-1, pixels.shape[2] if pixels.ndim == 3 else 1)
    if name == "Posterize" and not 1 <= int(m) <= 8:
        return np.asarray(ImageOps.posterize(_form(pixels, tensor=False), int(m))).reshape(pixels.shape)
    out = np.empty_like(src)
    native.lookup_values(src[:, :, None], band_tables(src.T, name, m), out[:, :, None])
    return out.reshape(pixels.shape)


def band_tables(bands: np.ndarray, name: str, m) -> np.ndarray:
    """`table_op`'s tables (uint8 [C, 256]; Posterize: 1-8 bits) for uint8 bands [C, N], as ImageOps
    computes them in Python's arithmetic (Pillow's point clips to 0..255); torchvision's tensor
    kernels' Posterize and Equalize alike (`fastdata.run._kernels`)."""
    x = np.arange(256, dtype=np.int64)
    tables = []
    for band in bands:
        if name == "Posterize":
            table = x & ~(2 ** (8 - int(m)) - 1)
        elif name == "Solarize":
            table = np.where(x < m, x, 255 - x)
        elif name == "Invert":
            table = 255 - x
        elif name == "SolarizeAdd":  # (timm's: m = (add, threshold))
            table = np.where(x < m[1], np.minimum(255, x + m[0]), x)
        elif name == "AutoContrast":
            lo, hi = int(band.min()), int(band.max())  # (the first and last bins of its histogram)
            table = np.trunc(x * (scale := 255.0 / (hi - lo)) + -lo * scale) if hi > lo else x  # (int(): toward zero)
        else:  # Equalize
            h = np.bincount(band, minlength=256)
            step = (band.size - int(h[h > 0][-1:].sum())) // 255  # (the pixels outside its last bin; one bin: 0)
            table = (step // 2 + np.concatenate(([0], np.cumsum(h)[:-1]))) // step if step else x
        tables.append(np.clip(table, 0, 255))
    return np.stack(tables).astype(np.uint8)


def native_tables() -> bool:
    """Whether `table_op` gives this process's ImageOps' pixels: checked once on 64 x 64 noise and
    a three-level image (where equalize's table passes 255), RGB and L, each op."""
    global _NATIVE_TABLES
    if _NATIVE_TABLES is None:
        _NATIVE_TABLES = False
        if native is not None and hasattr(native, "lookup_values"):
            from PIL import Image, ImageOps

            noise = np.random.default_rng(1).integers(0, 256, (64, 64, 3), dtype=np.uint8)
            levels = np.where(noise < 250, 90, np.where(noise < 254, 20, 200)).astype(np.uint8)
            ops = {"Posterize": (lambda im: ImageOps.posterize(im, 3), 3), "Invert": (ImageOps.invert, 0),
                   "Solarize": (lambda im: ImageOps.solarize(im, 99.5), 99.5),
                   "AutoContrast": (ImageOps.autocontrast, 0), "Equalize": (ImageOps.equalize, 0)}
            same = True
            for pixels in (noise, levels, noise[:, :, 0], levels[:, :, 0]):
                img = Image.fromarray(np.ascontiguousarray(pixels))
                for name, (theirs, m) in ops.items():
                    same = same and np.array_equal(table_op(pixels, name, m), np.asarray(theirs(img)))
            _NATIVE_TABLES = bool(same)
    return _NATIVE_TABLES


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
    the last op's form. An op holding ops (`fastdata.run`'s RandomApply, RandomChoice,
    RandomOrder) runs those its plan names, in the plan's order."""
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
    if tensor:
        if hasattr(img, "permute"):
            return img
        import torch

        pixels = np.array(img)  # (a copy, as pil_to_tensor's)
        return torch.from_numpy(pixels.reshape(*pixels.shape[:2], -1)).permute(2, 0, 1)  # (an L image: 1 x H x W)
    return as_image(img.permute(1, 2, 0).numpy() if hasattr(img, "permute") else img)
