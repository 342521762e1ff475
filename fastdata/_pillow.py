"""Which Pillow this environment runs: Pillow-SIMD (what scripts/install.sh builds) or stock.

Both install the same `PIL` package, so the last one installed wins while both keep their
metadata; the one whose version is `PIL.__version__` is the one whose files are there.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

# The distributions that provide `PIL`, by their normalised names.
_DISTRIBUTIONS = ("pillow-simd", "pillow")


def pillow_info() -> dict:
    """{"distribution": "pillow-simd", "pillow" or None, "version": PIL.__version__ (None
    without PIL), "simd": whether it is Pillow-SIMD, "libjpeg_turbo": whether its JPEG codec
    is libjpeg-turbo}."""
    try:
        import PIL
    except ImportError:
        return {"distribution": None, "version": None, "simd": False, "libjpeg_turbo": False}
    import importlib.metadata

    distribution = None
    for name in _DISTRIBUTIONS:
        try:
            if importlib.metadata.version(name) == PIL.__version__:
                distribution = name
                break
        except importlib.metadata.PackageNotFoundError:
            pass
    try:
        from PIL import features

        turbo = bool(features.check_feature("libjpeg_turbo"))
    except (ImportError, ValueError):  # a Pillow older than the feature, or built without JPEG
        turbo = False
    return {"distribution": distribution, "version": PIL.__version__,
            "simd": distribution == "pillow-simd", "libjpeg_turbo": turbo}


def _describe(info: dict) -> str:
    if info["version"] is None:
        return "Pillow is not installed"
    codec = "libjpeg-turbo" if info["libjpeg_turbo"] else "libjpeg"
    if info["simd"]:
        return f"Pillow-SIMD {info['version']} ({codec})"
    if info["distribution"] == "pillow":
        return f"Pillow {info['version']} (stock; install pillow-simd for ~30% faster resize)"
    return f"Pillow {info['version']} (installed by an unknown distribution; {codec})"


# The formats fastdata decodes with Pillow: those of the image extensions it lists (JPEG, which
# opens cameras' MPO files too, PNG, WebP, BMP, PPM/PGM, TIFF) and GIF (which torchvision's
# loader reads from a file named .jpg). Image.open would otherwise try every plugin Pillow
# registers on any bytes, whatever the file's name, and some hand the bytes on: EPS content
# runs Ghostscript.
FORMATS = ("JPEG", "PNG", "WEBP", "BMP", "PPM", "TIFF", "GIF")


def open_image(data: bytes):
    """`PIL.Image.open` of `data`, for one of FORMATS only (else Pillow's UnidentifiedImageError)."""
    from PIL import Image

    return Image.open(io.BytesIO(data), formats=FORMATS)


# One line for reports and benchmark headers, e.g. "Pillow-SIMD 12.1.1.post0 (libjpeg-turbo)".
PILLOW: str = _describe(pillow_info())


def stock_pillow_path() -> Path | None:
    """The stock Pillow that scripts/install.sh puts beside Pillow-SIMD (`pip install --target
    .stock-pillow`, or $FASTDATA_STOCK_PILLOW): a folder to put on PYTHONPATH for a process that
    should run stock Pillow (the parity tests' reference, a baseline). None when it is not there."""
    root = Path(os.environ.get("FASTDATA_STOCK_PILLOW") or Path(__file__).resolve().parents[1] / ".stock-pillow")
    return root if (root / "PIL" / "__init__.py").is_file() else None
