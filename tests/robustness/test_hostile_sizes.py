"""Sizes and kinds of file that are not a sample's to choose: a file or a shard's sample over
`MAX_FILE_BYTES` (sparse, so it costs nothing on disk) is refused from its declared size before
anything is allocated for it, and a shard that is a FIFO or a device is refused at once, not
waited on or read without end. Each gives a one-line cause naming the file (and member), or a
counted skip, and the good samples beside it are delivered."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import struct
import tarfile
import zlib

import numpy as np
import pytest
from PIL import Image
from _images import png_chunk

import fastdata
from fastdata import DataError
from fastdata import transforms as T
from fastdata._ext import native
from fastdata.image import read

CROP = T.Compose([T.Resize(16), T.CenterCrop(16)])


def jpeg(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=90)
    return out.getvalue()


def sparse(path, head: bytes, size: int) -> str:
    """A file of `size` bytes that starts with `head`, the rest a hole."""
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)
    return str(path)


def test_the_limit_is_the_native_readers():
    assert read.MAX_FILE_BYTES == 1 << 28
    if native is not None:
        assert native.MAX_FILE_BYTES == read.MAX_FILE_BYTES


def test_both_readers_refuse_an_oversized_file_from_its_size(tmp_path):
    big = sparse(tmp_path / "big.jpg", jpeg(0), read.MAX_FILE_BYTES + 1)
    small = sparse(tmp_path / "edge.jpg", jpeg(0), read.MAX_FILE_BYTES)
    want = f"too large: {read.MAX_FILE_BYTES + 1} bytes, over the {read.MAX_FILE_BYTES} an image file may have"
    assert read._read_file(big) == want
    assert len(read._read_file(small)) == read.MAX_FILE_BYTES  # the limit itself is read
    if native is not None:
        assert native.read_files([big], 1) == [want]


@pytest.mark.parametrize("workers", [0, 2])
def test_an_oversized_image_file_is_named_or_counted(tmp_path, workers):
    good = tmp_path / "good.jpg"
    good.write_bytes(jpeg(1))
    big = sparse(tmp_path / "big.jpg", jpeg(2), 1 << 40)  # 1 TiB declared
    pairs = [(str(good), 0), (big, 1)]
    loader = fastdata.loader(pairs, batch_size=2, num_workers=workers, device="cpu", transform=CROP,
                             on_error="skip")
    assert [y for _, ys in loader for y in ys.tolist()] == [0]
    (error,) = loader.stats["errors"]
    assert error["path"] == big and error["cause"].startswith("too large: 1099511627776 bytes"), error
    with pytest.raises(DataError, match=r"cannot read .*big\.jpg: too large") as raised:
        list(fastdata.loader(pairs, batch_size=2, num_workers=0, device="cpu", transform=CROP))
    assert "\n" not in str(raised.value)


def shard_with_an_oversized_sample(path, declared: int) -> str:
    """One shard: sample "a" (a JPEG and its label), then sample "big", whose image member's pax
    header declares `declared` bytes (a hole), then its label."""
    with open(path, "wb") as f:
        tar = tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT)
        for name, data in [("a.jpg", jpeg(3)), ("a.cls", b"0")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        info = tarfile.TarInfo("big.jpg")
        info.size = declared
        f.write(info.tobuf(tarfile.PAX_FORMAT))
        f.seek(declared + (-declared % 512), 1)
        info = tarfile.TarInfo("big.cls")
        info.size = 1
        f.write(info.tobuf(tarfile.PAX_FORMAT) + b"1" + bytes(511) + bytes(1024))
    return str(path)


@pytest.mark.parametrize("workers", [0, 2])
def test_an_oversized_shard_sample_is_named_or_counted(tmp_path, workers):
    shard = shard_with_an_oversized_sample(tmp_path / "s-000000.tar", 100 << 30)  # 100 GiB declared
    loader = fastdata.loader(shard, batch_size=2, backend="wds", num_workers=workers, device="cpu",
                             transform=CROP, on_error="skip")
    assert [y for _, ys in loader for y in ys.tolist()] == [0]
    (error,) = loader.stats["errors"]
    assert error["path"] == f"{shard} (member big.*)", error
    declared = int(error["cause"].split()[2])  # the sample's span: its headers and members
    assert error["cause"].startswith("too large: ") and 100 << 30 < declared < (100 << 30) + 8192, error
    with pytest.raises(DataError, match=r"\(member big\.\*\): too large"):
        list(fastdata.loader(shard, batch_size=2, backend="wds", num_workers=0, device="cpu", transform=CROP))


_BUILD = """
import sys
import fastdata
try:
    fastdata.loader(sys.argv[1], batch_size=2, backend="wds", num_workers=0, device="cpu")
except fastdata.DataError as e:
    print(e)
"""


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_a_shard_that_is_not_a_regular_file_is_refused(tmp_path, kind):
    """(In a child with a time limit: the failure this guards against is a hang, in an open that
    waits for a writer or a scan that reads zeros without end.)"""
    shard = tmp_path / "s-000000.tar"
    if kind == "fifo":
        os.mkfifo(shard)
    else:
        os.symlink("/dev/zero", shard)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", _BUILD, str(shard)], capture_output=True, text=True,
                          timeout=60, env=env)
    kind_words = "a FIFO" if kind == "fifo" else "a character device"
    assert proc.stdout.strip() == f"cannot read shard {shard}: not a regular file ({kind_words})", proc


def tall_png(path, height: int) -> str:
    """A 1 x `height` RGB PNG: a few KB whatever its height, each row compressing to nothing."""
    ihdr = struct.pack(">IIBBBBB", 1, height, 8, 2, 0, 0, 0)
    rows = zlib.compress(b"\0\xc8\x0a\x0a" * height, 9)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", rows) + png_chunk(b"IEND", b""))
    return str(path)


@pytest.mark.parametrize("transform, height", [(T.Compose([T.Resize((224, 224))]), 4_000_000),
                                               (T.Compose([T.Resize(256)]), 100_000)])
def test_a_resize_that_would_pass_through_more_pixels_than_the_limit_is_refused(tmp_path, transform, height):
    """The header's pixel limit bounds the decode; a sliver resized to a square passes through
    (output width x the sliver's height) pixels, and Resize(256) of a 1 x 100,000 image asks for
    a 256 x 25,600,000 output: each is refused from the plan, before anything is allocated."""
    sliver = tall_png(tmp_path / "sliver.png", height)
    good = tmp_path / "good.png"
    Image.new("RGB", (height // 1000, 1000), (7, 8, 9)).save(good)  # the sliver's shape, but sized to fit
    pairs = [(str(good), 0), (sliver, 1)]
    loader = fastdata.loader(pairs, batch_size=1, device="cpu", transform=transform, on_error="skip")
    assert [y for _, ys in loader for y in ys.tolist()] == [0]
    (error,) = loader.stats["errors"]
    assert error["path"] == sliver and "over the limit of 89478485" in error["cause"], error
    with pytest.raises(DataError, match=r"cannot read .*sliver\.png: the transform resizes its 1x\d+ pixels") as e:
        list(fastdata.loader(pairs, batch_size=1, device="cpu", transform=transform))
    assert "\n" not in str(e.value)
