"""Seed corpora for the fuzz targets, made from real files: JPEGs encoded by Pillow in the
variants decoders trip on, and WebDataset shards written by fastdata.shard.write_shards.

    python3 csrc/fuzz/seeds.py OUT_DIR     # writes OUT_DIR/decode/ and OUT_DIR/tar/

decode seeds are an 8-byte parameter header (see decode_fuzzer.cpp) then a JPEG (or a PNG, which
the decoder must refuse cleanly); tar seeds are laid out as tar_fuzzer.py reads them.
"""

from __future__ import annotations

import io
import os
import shutil
import sys
import tempfile

import numpy as np
from PIL import Image


def picture(w: int, h: int, seed: int, mode: str = "RGB") -> Image.Image:
    """Gradients and a few blocks: content with both smooth areas and edges, so that every
    DCT coefficient band and both Huffman tables get used."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    rgb = np.stack([(xx * 255 // max(w - 1, 1)), (yy * 255 // max(h - 1, 1)), (xx + yy) * 7 % 256], -1)
    for _ in range(3):
        x, y = rng.integers(0, w), rng.integers(0, h)
        rgb[y:y + h // 4 + 1, x:x + w // 4 + 1] = rng.integers(0, 256, 3)
    return Image.fromarray(rgb.astype(np.uint8)).convert(mode)


def jpeg(img: Image.Image, **kw) -> bytes:
    out = io.BytesIO()
    img.save(out, "JPEG", **kw)
    return out.getvalue()


def images() -> dict[str, bytes]:
    """Small images in the encodings the decoder must handle or refuse."""
    pic = picture(48, 40, 0)
    found = {
        "baseline-420": jpeg(pic, quality=85),
        "baseline-444": jpeg(pic, quality=90, subsampling=0),
        "baseline-422-odd": jpeg(picture(37, 23, 1), quality=75, subsampling=1),
        "progressive": jpeg(pic, quality=80, progressive=True),
        "optimized": jpeg(pic, quality=60, optimize=True),
        "grayscale": jpeg(picture(40, 33, 2, "L"), quality=85),
        "cmyk": jpeg(picture(24, 24, 3, "CMYK"), quality=85),
        "restart-blocks": jpeg(pic, quality=85, restart_marker_blocks=2),
        "restart-rows": jpeg(picture(50, 34, 4), quality=85, restart_marker_rows=1),
        "one-pixel": jpeg(picture(1, 1, 5), quality=95),
        "one-row": jpeg(picture(61, 1, 6), quality=90),
        "one-column": jpeg(picture(1, 29, 7), quality=90),
        "large-dct-scaled": jpeg(picture(320, 200, 8), quality=70),
    }
    png = io.BytesIO()
    picture(9, 7, 9).save(png, "PNG")
    found["png"] = png.getvalue()
    return found


# (out width - 1, out height - 1, crop x, y, w, h fractions, flags, nudge) for each seed: whole
# image and small crops, each layout, flipped, paired on two threads, bicubic (flag 32), cut out
# before the resize (flag 64), the vertical pass first (flag 128), and edge nudges.
_HEADERS = [
    bytes([15, 11, 0, 0, 255, 255, 0, 0]),
    bytes([63, 63, 128, 64, 100, 180, 0b100011, 0]),
    bytes([6, 4, 255, 255, 30, 20, 0b0100, 0x55]),
    bytes([31, 2, 10, 200, 255, 40, 0b1100111, 0]),
    bytes([11, 12, 40, 40, 200, 200, 0b1001001, 0b10011001]),
    bytes([40, 5, 20, 0, 120, 255, 0b11101010, 0]),
]


def decode_seeds() -> dict[str, bytes]:
    return {f"{name}-{k}": header + data for name, data in images().items()
            for k, header in enumerate(_HEADERS) if k < 2 or name in ("baseline-420", "progressive", "grayscale")}


def tar_input(shard: bytes, index: bytes | None) -> bytes:
    """A tar_fuzzer.py input: the index's length (2 bytes, little-endian; 0 for no index), the
    index, the shard."""
    index = index or b""
    return len(index).to_bytes(2, "little") + index + shard


def tar_seeds() -> dict[str, bytes]:
    """Shards of a few small JPEG, PNG and odd-sized images, with and without their index, as
    fastdata.shard.write_shards writes them."""
    from fastdata.shard import write_shards

    found: dict[str, bytes] = {}
    pics = images()
    with tempfile.TemporaryDirectory() as tmp:
        pairs = []
        for i, name in enumerate(["baseline-420", "png", "grayscale", "one-pixel", "progressive"]):
            path = os.path.join(tmp, f"{i}.{'png' if name == 'png' else 'jpg'}")
            with open(path, "wb") as f:
                f.write(pics[name])
            pairs.append((path, i % 3))
        out = os.path.join(tmp, "out")
        write_shards(pairs, os.path.join(out, "train-%06d.tar"), max_count=3, shuffle=False, workers=1,
                     progress=False)
        for name in sorted(os.listdir(out)):
            if name.endswith(".tar"):
                with open(os.path.join(out, name), "rb") as f:
                    found[f"shard-{name[:-4]}"] = tar_input(f.read(), None)
        with open(os.path.join(out, "train-index.json"), "rb") as f:
            index = f.read()
        with open(os.path.join(out, "train-000000.tar"), "rb") as f:
            found["shard-with-index"] = tar_input(f.read(), index)
    return found


def write(out_dir: str) -> None:
    for target, seeds in (("decode", decode_seeds()), ("tar", tar_seeds())):
        folder = os.path.join(out_dir, target)
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
        for name, data in seeds.items():
            with open(os.path.join(folder, name), "wb") as f:
                f.write(data)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: seeds.py OUT_DIR")
    write(sys.argv[1])
