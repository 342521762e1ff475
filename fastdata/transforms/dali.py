"""The ops lowered to NVIDIA DALI operators (as `pil.py` lowers them to Pillow and `kornia.py`
to Kornia): what the `dali` backend's pipeline and `fastdata-bench augment` build their graphs
from. Each function takes and returns DALI DataNodes; call them inside a `pipeline_def`.

The geometry arrives planned (`plan.plan_geometry`): the crop windows in whole pixels
(`Geometry.windows`: a box with fractions of a pixel, as Resize then CenterCrop makes, is
rounded to them), the output size and the flips, fed per sample through external sources.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def require() -> None:
    """Raises RuntimeError, saying how to install it, when DALI is missing (it runs CPU-only
    pipelines on a machine without a GPU too)."""
    from .._optional import require as require_part

    require_part("dali", "backend 'dali'")


def window_inputs(windows: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per-sample (x, y) anchors and (w, h) shapes of int [N, 4] windows, as DALI's slicing
    operators take them (float32, absolute pixels)."""
    w = windows.astype(np.float32)
    return list(w[:, :2]), list(w[:, 2:])


def decode_window(datas: Any, starts: Any, shapes: Any, *, gpu: bool, hw_decoder_load: float = 0.65) -> Any:
    """Decodes only each image's window (JPEG: the rows and columns it covers), RGB. EXIF
    orientation ignored: the image as stored, as Pillow's open and the other backends give it
    (and the window was planned on the stored size)."""
    from nvidia.dali import fn, types

    where = dict(device="mixed", hw_decoder_load=hw_decoder_load) if gpu else dict(device="cpu")
    return fn.decoders.image_slice(datas, starts, shapes, normalized_anchor=False, normalized_shape=False,
                                   output_type=types.RGB, adjust_orientation=False, **where)


def crop(images: Any, starts: Any, shapes: Any) -> Any:
    """Cuts each decoded image's window out."""
    from nvidia.dali import fn

    return fn.slice(images, starts, shapes, normalized_anchor=False, normalized_shape=False,
                    out_of_bounds_policy="trim_to_shape")


def resize(images: Any, size: Any) -> Any:
    """To `size` (h, w), a DataNode or a pair: bilinear, antialiased when shrinking (as
    Pillow's and torchvision's resize)."""
    from nvidia.dali import fn, types

    return fn.resize(images, size=size, interp_type=types.INTERP_LINEAR, antialias=True)


def place(images: Any, anchors: Any, canvas: Any) -> Any:
    """Each image at its place in a canvas of zeros (a CenterCrop larger than the image pads
    it): `anchors` the negated (x, y) of its top-left corner, `canvas` the (w, h)."""
    from nvidia.dali import fn

    return fn.slice(images, anchors, canvas, normalized_anchor=False, normalized_shape=False,
                    out_of_bounds_policy="pad", fill_values=0)


def flip(images: Any, flips: Any) -> Any:
    """Mirrors the samples whose flag is 1."""
    from nvidia.dali import fn

    return fn.flip(images, horizontal=flips)


def color_jitter(images: Any, brightness: Any, contrast: Any, saturation: Any, hue_degrees: Any) -> Any:
    from nvidia.dali import fn

    return fn.color_twist(images, brightness=brightness, contrast=contrast, saturation=saturation, hue=hue_degrees)


def normalize(images: Any, mean: tuple[float, ...], std: tuple[float, ...]) -> Any:
    """uint8 HWC to float CHW, (x / 255 - mean) / std."""
    from nvidia.dali import fn, types

    return fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW",
                                    mean=[m * 255 for m in mean], std=[s * 255 for s in std])
