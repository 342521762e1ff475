"""Images the tests make: one flat color per image that names its sample (red = 40 * class
+ 20, green = 12 * number + 10, blue a constant), so any crop or resize of it still says which
sample it came from, and must agree with its label."""

import os
import pickle
from pathlib import Path
from typing import Callable

import numpy as np
from PIL import Image


def color(c: int, i: int) -> tuple[int, int, int]:
    return (40 * c + 20, 12 * i + 10, 77)


def color_folder(root: Path, classes: int, per_class: int, sides: tuple[int, int],
                 name: Callable[[int], str]) -> Path:
    """An ImageFolder of flat-color images with random sizes in `sides`; `name(i)` names image
    i of a class, its extension picks the format."""
    rng = np.random.default_rng(0)
    for c in range(classes):
        os.makedirs(root / f"class{c}")
        for i in range(per_class):
            w, h = int(rng.integers(*sides)), int(rng.integers(*sides))
            n = name(i)
            Image.new("RGB", (w, h), color(c, i)).save(root / f"class{c}" / n, "PNG" if n.endswith("png") else "JPEG",
                                                       quality=95)
    return root


def png_chunk(kind: bytes, data: bytes) -> bytes:
    """A PNG chunk as a crafted file holds it: length, type, data, CRC-32 of type and data."""
    import zlib

    return len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")


def tar_of(path: Path | str, members: list[tuple[str, bytes]], fmt: int | None = None) -> None:
    """A tar of `members` ((name, bytes) each, in order), written with tarfile (USTAR unless
    `fmt` says otherwise), the bytes as they are."""
    import io
    import tarfile

    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT if fmt is None else fmt) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def tar_as_is(pairs: list[tuple[str, int]], path: Path | str) -> None:
    """A WebDataset shard of `pairs` (path, label) in list order, the bytes as they are (as
    webdataset's ShardWriter or tar would pack them; `fastdata shard` refuses files the loader
    would): sample i is `%08d.<ext>` and `%08d.cls`, ext lowercased, jpeg as jpg. No index."""
    members = []
    for i, (file, label) in enumerate(pairs):
        ext = os.path.splitext(file)[1][1:].lower().replace("jpeg", "jpg")
        members += [(f"{i:08d}.{ext}", Path(file).read_bytes()), (f"{i:08d}.cls", b"%d" % label)]
    tar_of(path, members)


def extraneous(data: bytes, header: bool = False) -> bytes:
    """`data` (with restart markers) with 1 to 4 stray bytes before each restart marker, as a
    Logitech C270 webcam writes every frame (libjpeg: "Corrupt JPEG data: 3 extraneous bytes
    before marker 0xd0"); with `header`, 5 more between two header segments."""
    sos = data.index(b"\xff\xda")
    start = sos + 2 + int.from_bytes(data[sos + 2:sos + 4], "big")
    out = bytearray(data)
    markers = [i for i in range(start, len(data) - 1) if data[i] == 0xFF and 0xD0 <= data[i + 1] <= 0xD7]
    assert len(markers) > 3
    for k, i in enumerate(reversed(markers)):
        out[i:i] = bytes([0x11 * (k % 5 + 1)]) * (k % 4 + 1)
    if header:
        at = out.index(b"\xff\xdb")
        out[at:at] = b"\x00\x2a\xff\x00\x17"
    return bytes(out)


def blue_folder(root: Path, per_class: int = 12, classes: int = 4, seed: int = 0) -> Path:
    """An ImageFolder of JPEGs of varied sizes; class c has its blue channel at 40 + 50c (plus
    noise up to 30), red and green ramps across and down."""
    rng = np.random.default_rng(seed)
    for c in range(classes):
        (root / f"class{c}").mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            w, h = int(rng.integers(80, 200)), int(rng.integers(70, 180))
            a = np.zeros((h, w, 3), np.uint8)
            a[..., 0] = (np.arange(w) * 255 // w)[None]
            a[..., 1] = (np.arange(h) * 255 // h)[:, None]
            a[..., 2] = 40 + 50 * c
            a = (a.astype(int) + rng.integers(0, 30, a.shape)).clip(0, 255).astype(np.uint8)
            Image.fromarray(a).save(root / f"class{c}" / f"{i:03d}.jpg", quality=92)
    return root


def cifar_rows(n: int) -> np.ndarray:
    """uint8 [n, 32, 32, 3]: red is the index (mod 250, plus 1), green 10 + 7 * row, blue 10 + 7 * column."""
    a = np.zeros((n, 32, 32, 3), np.uint8)
    a[..., 0] = (np.arange(n) % 250 + 1)[:, None, None]
    a[..., 1] = (10 + 7 * np.arange(32))[None, :, None]
    a[..., 2] = (10 + 7 * np.arange(32))[None, None, :]
    return a


def write_cifar10(root: Path, n: int) -> None:
    """CIFAR-10's files (`cifar-10-batches-py`) of `cifar_rows(n)`, label = index % 10: the test
    batch all of them, each training batch the first fifth."""
    d = root / "cifar-10-batches-py"
    d.mkdir()
    rows = cifar_rows(n).transpose(0, 3, 1, 2).reshape(n, -1)  # CIFAR's files hold CHW rows
    labels = [i % 10 for i in range(n)]
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        with open(d / name, "wb") as f:
            pickle.dump({"data": rows[: n // 5] if name != "test_batch" else rows, "labels": labels[: n // 5]
                         if name != "test_batch" else labels}, f)
    with open(d / "batches.meta", "wb") as f:
        pickle.dump({"label_names": [str(i) for i in range(10)]}, f)
