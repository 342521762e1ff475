"""Whether each file is a whole image within the pixel limit, before any decoder allocates for
it: the loader's check of a batch (`decode.BatchDecoder.check`, on every backend) and `fastdata
shard`'s of each file it packs."""

from __future__ import annotations

from typing import Sequence

from .. import _codec
from .._pillow import FORMATS
from ..errors import error_line
from ..transforms import pil as pil_lowering


def check_complete(datas: Sequence, threads: int = 1) -> list[tuple[str | None, bool, int, int]]:
    """For each of `datas`: (why it cannot be decoded or None, whether it is a JPEG, width,
    height). JPEGs and PNGs are walked from their signature to their end marker (`_codec.
    inspect_batch`: a file cut short is refused whatever the crop, and whatever Pillow's
    LOAD_TRUNCATED_IMAGES says; bytes after the end are accepted, as Pillow does); other formats
    are sized by Pillow. An image whose header claims more than `_codec.MAX_IMAGE_PIXELS` is
    refused here, before any decoder allocates for it (DALI included)."""
    limit = _codec.MAX_IMAGE_PIXELS
    out = []
    for data, (cause, kind, w, h) in zip(datas, _codec.inspect_batch(datas, _codec.AVAILABLE, threads)):
        if cause is None and not kind:
            from PIL import Image, UnidentifiedImageError

            try:
                w, h = pil_lowering.size_of(data)
            except UnidentifiedImageError:
                cause = (f"not a readable image (none of {', '.join(FORMATS)} starts with "
                         f"{bytes(data[:8])!r})")
            except Image.DecompressionBombError as e:
                cause = f"over the pixel limit of {limit} ({e})"
            except Exception as e:  # Pillow's header parsers raise OSError, SyntaxError, ValueError, ...
                cause = f"not a readable image ({error_line(e)})"
        if cause is None and w * h > limit:
            cause = f"the header claims {w}x{h} = {w * h} pixels, over the limit of {limit} (a decompression bomb?)"
        out.append((cause, kind == "jpeg", w, h))
    return out
