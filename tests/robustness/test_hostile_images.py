"""Hostile image files, the same on every backend: `pil` (0 and 2 workers), `wds` (the same files
as shards) and `dali` (CPU pipeline).

Accepted files (a PNG named .jpg, CMYK, grayscale and progressive JPEGs, EXIF-rotated JPEGs,
1x1 images, a JPEG with data after its end marker, stray bytes after a JPEG's first scan, a
webcam's before its restart markers among them) must give the pixels Pillow gives for the same
crop: the image as stored, EXIF orientation ignored (Pillow's `Image.open` and torchvision's
`decode_jpeg` do not apply it either). Rejected files (empty, cut short, not an image, a header
claiming 13000x13000 pixels, 150 scans, fill bytes before a stuffed zero, stray bytes before a
JPEG's first scan) must raise a `DataError` naming the file and the cause (one line when the
main process decodes; torch's DataLoader re-raises a worker's with its traceback), or with
on_error="skip" be left out and counted, on every backend, for every crop the epoch draws.

The images are gradients (red follows x, green follows y), so a rotated, mirrored or misplaced
crop is off by tens of levels where resampling differences are a level or two.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import subprocess
import sys
import tarfile
import zlib

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

import fastdata
from fastdata import DataError, _codec, _structure
from fastdata import transforms as T
from fastdata.transforms.plan import plan_geometry

from _images import extraneous, tar_as_is

OUT = 24
RRC = T.Compose([T.RandomResizedCrop(OUT, scale=(0.25, 1.0)), T.RandomHorizontalFlip()])
CONFIGS = [("pil", 0), ("pil", 2), ("wds", 0), pytest.param(("dali", 0), marks=pytest.mark.dali)]
# Mean absolute difference from Pillow's decode of the same crop: resampling and DCT-scaling
# differences stay under a level on these gradients; a rotated or misplaced window is off by tens.
TOLERANCE = 2.0


# ---------------------------------------------------------------------------- the files


def gradient(w: int, h: int, blue: int = 40) -> Image.Image:
    x = np.linspace(0, 255, w)[None, :] * np.ones((h, 1))
    y = np.linspace(0, 255, h)[:, None] * np.ones((1, w))
    return Image.fromarray(np.stack([x, y, np.full((h, w), float(blue))], -1).astype(np.uint8))


def encode(img: Image.Image, fmt: str = "JPEG", **kw) -> bytes:
    out = io.BytesIO()
    img.save(out, fmt, **kw)
    return out.getvalue()


def oriented(img: Image.Image, orientation: int) -> bytes:
    """A JPEG of `img` as stored, with an EXIF Orientation tag (3: turn 180 degrees to display,
    6 and 8: 90 degrees)."""
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encode(img, quality=95, exif=exif.tobytes())


def bomb_jpeg(side: int = 13000) -> bytes:
    """A ~550-byte progressive JPEG whose frame header claims side x side pixels: libjpeg would
    buffer every coefficient of that image before the first row."""
    data = bytearray(encode(gradient(16, 16), progressive=True))
    sof = data.find(b"\xff\xc2")
    data[sof + 5:sof + 9] = side.to_bytes(2, "big") * 2
    return bytes(data)


def bomb_png(side: int = 13000) -> bytes:
    """A small PNG whose IHDR (CRC fixed up) claims side x side pixels."""
    data = bytearray(encode(gradient(16, 16), "PNG"))
    data[16:24] = side.to_bytes(4, "big") * 2
    data[29:33] = zlib.crc32(bytes(data[12:29])).to_bytes(4, "big")
    return bytes(data)


def photo(w: int = 160, h: int = 120) -> bytes:
    """A baseline JPEG with enough entropy-coded data that a cut lands inside the scan."""
    noise = np.random.default_rng(1).integers(-12, 13, (h, w, 3))
    img = np.clip(np.asarray(gradient(w, h)).astype(int) + noise, 0, 255).astype(np.uint8)
    return encode(Image.fromarray(img), quality=90)


def many_scans(scans: int = 150) -> bytes:
    """A progressive JPEG whose last scan comes again and again: each repeat is a pass over the
    whole image for a few bytes of file."""
    data = encode(gradient(96, 64), quality=95, progressive=True)
    last = data[data.rfind(b"\xff\xda"):-2]
    return data[:-2] + last * (scans - data.count(b"\xff\xda")) + b"\xff\xd9"


def fill_before_zero(data: bytes) -> bytes:
    """`data` with a fill byte before its scan's first stuffed zero (FF FF 00), which
    libjpeg-turbo's two Huffman readers decode differently."""
    at = data.index(b"\xff\x00", data.index(b"\xff\xda"))
    return data[:at] + b"\xff" + data[at:]


def stray_between_scans(data: bytes) -> bytes:
    """A progressive JPEG with stray bytes (and a stuffed zero, FF 00) after the first Huffman
    table segment that follows its first scan: libjpeg, Pillow and DALI step over them."""
    first = data.index(b"\xff\xda")
    at = data.index(b"\xff\xc4", first)
    at += 2 + int.from_bytes(data[at + 2:at + 4], "big")
    return data[:at] + b"\x12\x34\xff\x00\x56" + data[at:]


def png_of(rows: bytes, w: int, h: int, interlace: int = 0) -> bytes:
    """An 8-bit RGB PNG of `rows` (filtered scanlines, as the header's layout gives them),
    deflated into one IDAT chunk: every chunk whole and its CRC right."""
    from _images import png_chunk

    ihdr = w.to_bytes(4, "big") + h.to_bytes(4, "big") + bytes([8, 2, 0, 0, interlace])
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", zlib.compress(rows))
            + png_chunk(b"IEND", b""))


def adam7(img: Image.Image) -> bytes:
    """`img` as an interlaced PNG (Pillow writes none): its seven passes' scanlines, filter 0."""
    a = np.asarray(img.convert("RGB"))
    rows = b""
    for x0, y0, dx, dy in ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2),
                           (0, 1, 1, 2)):
        part = a[y0::dy, x0::dx]
        if part.size:
            rows += b"".join(b"\0" + row.tobytes() for row in part)
    return png_of(rows, img.width, img.height, interlace=1)


def short_rows() -> bytes:
    """A PNG whose valid zlib stream holds the first half of its rows: Pillow leaves the rest
    zeros without an error."""
    a = np.asarray(gradient(64, 48))
    return png_of(b"".join(b"\0" + row.tobytes() for row in a[:24]), 64, 48)


PLAIN = encode(gradient(96, 64), quality=95)
PHOTO = photo()
CUT = PHOTO[: len(PHOTO) * 85 // 100]
PNG = encode(Image.open(io.BytesIO(PHOTO)), "PNG")
GOOD = {
    "plain.jpg": PLAIN,
    "png-named.jpg": encode(gradient(80, 60), "PNG"),
    "cmyk.jpg": encode(gradient(96, 64).convert("CMYK"), quality=95),
    "gray.jpg": encode(gradient(96, 64).convert("L"), quality=95),
    "progressive.jpg": encode(gradient(96, 64), quality=95, progressive=True),
    "exif180.jpg": oriented(gradient(96, 64), 3),
    "exif90.jpg": oriented(gradient(96, 64), 6),
    "exif90-square.jpg": oriented(gradient(64, 64), 8),
    "one-pixel.jpg": encode(Image.new("RGB", (1, 1), (200, 30, 90)), quality=95),
    "one-pixel.png": encode(Image.new("RGB", (1, 1), (20, 130, 190)), "PNG"),
    "interlaced.png": adam7(gradient(61, 43)),
    "tail.jpg": PLAIN + np.random.default_rng(2).integers(0, 256, 2048, dtype=np.uint8).tobytes(),
    "webcam.jpg": extraneous(encode(gradient(96, 64), quality=90, restart_marker_blocks=2)),
    "stray-progressive.jpg": stray_between_scans(encode(gradient(96, 64), quality=90, progressive=True)),
}
BAD = {  # name: (bytes, what the cause says)
    "empty.jpg": (b"", "empty file"),
    "cut85.jpg": (CUT, "truncated JPEG: no end-of-image marker"),
    "cut85.png": (PNG[: len(PNG) * 85 // 100], "truncated PNG: the IDAT chunk"),
    "short-rows.png": (short_rows(), "truncated image data: its zlib stream holds 4632 of the 9264 bytes"),
    "text.jpg": (b"this is not an image\n" * 20, "not a readable image"),
    "bomb.jpg": (bomb_jpeg(), "13000x13000 = 169000000 pixels, over the limit of 89478485"),
    "bomb.png": (bomb_png(), "13000x13000 = 169000000 pixels, over the limit of 89478485"),
    "scans.jpg": (many_scans(), "corrupt JPEG: more than 100 scans"),
    "fill-zero.jpg": (fill_before_zero(PHOTO), "corrupt JPEG: fill bytes before a stuffed zero"),
    # Pillow steps over stray bytes between header segments; DALI's parser refuses them ("Invalid
    # marker"), and so does the walk before the first scan, on every backend alike.
    "stray-header.jpg": (extraneous(encode(gradient(96, 64), quality=90, restart_marker_blocks=2), header=True),
                         "corrupt JPEG: no marker at byte 20 (0x00)"),
}


def write(folder, files: dict) -> list[tuple[str, int]]:
    """The files written to `folder`; (path, label) pairs, the label being the file's position."""
    os.makedirs(folder, exist_ok=True)
    pairs = []
    for k, (name, data) in enumerate(files.items()):
        path = os.path.join(folder, name)
        with open(path, "wb") as f:
            f.write(data)
        pairs.append((path, k))
    return pairs


_SHARD_DIRS = itertools.count()


def make(config, pairs, tmp_path, **kw):
    """A loader over `pairs` on `config` = (backend, workers), samples in list order (with `wds`,
    one shard of them, in the same order: sample ids are list positions either way)."""
    backend, workers = config
    source = pairs
    if backend == "wds":
        out = tmp_path / f"shards-{next(_SHARD_DIRS)}"
        out.mkdir()
        tar_as_is(pairs, out / "s-000000.tar")  # fastdata shard would refuse the bad files
        source = str(out / "s-000000.tar")
    kw.setdefault("transform", RRC)
    kw.setdefault("batch_size", 4)
    kw.setdefault("seed", 3)
    return fastdata.loader(source, backend=backend, num_workers=workers, device="cpu", **kw)


def named(config, message: str, pairs, k: int) -> bool:
    """Whether an error message names sample k: its file, or with `wds` its tar member."""
    if config[0] == "wds":
        return f"(member {k:08d}." in message
    return pairs[k][0] in message


def reference(data: bytes, index: int, epoch: int, seed: int = 3) -> np.ndarray:
    """Pillow's pixels for sample `index` of epoch `epoch`: the crop and flip the loaders plan,
    applied by `Image.open -> convert('RGB') -> resize(box) -> flip` (EXIF not applied)."""
    with Image.open(io.BytesIO(data)) as img:
        w, h = img.size
    geo = plan_geometry(RRC.geometry, seed, epoch, np.array([index]), np.array([w]), np.array([h]))
    x0, y0, x1, y1 = geo.boxes[0]
    crop = (round(x0), round(y0), max(1, round(x1) - round(x0)), max(1, round(y1) - round(y0)))
    return _codec.pillow_crop_resize(data, crop, bool(geo.flips[0]), (OUT, OUT)).astype(np.float64)


def images_by_label(loader) -> dict[int, np.ndarray]:
    """One epoch: {label: HWC image as float}."""
    got = {}
    for images, labels in loader:
        for image, label in zip(images, labels.tolist()):
            assert label not in got, f"sample {label} delivered twice"
            got[label] = image.permute(1, 2, 0).numpy().astype(np.float64)
    return got


# ---------------------------------------------------------------------------- the walk


def _corpus() -> list[bytes]:
    rng = np.random.default_rng(0)
    bases = [*GOOD.values(), *(d for d, _ in BAD.values()), PHOTO]
    out = []
    for base in bases:
        out.append(base)
        out += [base[:cut] for cut in range(0, len(base), max(1, len(base) // 41))]
        for _ in range(40):
            m = bytearray(base)
            for _ in range(int(rng.integers(1, 4))):
                if m:
                    m[int(rng.integers(0, len(m)))] = int(rng.integers(0, 256))
            out.append(bytes(m))
    return out


@pytest.mark.skipif(_codec._ext is None or not hasattr(_codec._ext, "inspect_batch"),
                    reason="native extension not built")
def test_native_walk_equals_the_python_walk():
    corpus = _corpus()
    kinds = ("", "jpeg", "png")
    native = [(c, kinds[k], w, h) for c, k, w, h in _codec._ext.inspect_batch(corpus, False)]
    python = [tuple(_structure.check_structure(d)) for d in corpus]
    assert [tuple(x) for x in _structure.inspect_batch(corpus, False, threads=3)] == native  # spread over threads
    for i, (a, b) in enumerate(zip(native, python)):
        assert a == b, (i, a, b)
    causes = {c.split(":")[0] for c, *_ in python if c}
    assert {"empty file", "truncated JPEG", "corrupt JPEG", "truncated PNG", "corrupt PNG"} <= causes
    assert sum(c is None for c, *_ in python) > len(GOOD)  # some mutations leave the structure whole
    assert _codec._ext.MAX_PIXELS == _structure.MAX_IMAGE_PIXELS == 89_478_485 == Image.MAX_IMAGE_PIXELS


def test_walk_accepts_whole_files_and_refuses_cut_ones():
    for name, data in GOOD.items():
        found = _structure.check_structure(data)
        assert found.cause is None, (name, found)
    with Image.open(io.BytesIO(PLAIN)) as img:
        assert _structure.check_structure(PLAIN) == (None, "jpeg", *img.size)
    assert _structure.check_structure(GOOD["png-named.jpg"]) == (None, "png", 80, 60)
    # every cut of a JPEG is refused, whatever byte it ends on; so is a PNG's
    for cut in range(3, len(PHOTO) - 1, 7):  # (shorter: no JPEG signature, so Pillow decides)
        cause = _structure.check_structure(PHOTO[:cut]).cause
        assert cause is not None and cause.startswith(("truncated JPEG", "corrupt JPEG")), (cut, cause)
    png = GOOD["png-named.jpg"]
    for cut in range(8, len(png) - 1, 5):
        assert _structure.check_structure(png[:cut]).cause.startswith("truncated PNG"), cut
    # An end marker inside a segment (an EXIF thumbnail is a whole JPEG in APP1) does not end
    # the file: a file cut in its scan is refused though FF D9 occurs near its end.
    thumb = encode(gradient(8, 8), quality=50)
    app1 = b"\xff\xe1" + (len(thumb) + 8).to_bytes(2, "big") + b"Exif\0\0" + thumb
    small = encode(gradient(40, 30), quality=90)
    with_thumb = small[:2] + app1 + small[2:-40]
    assert with_thumb.rfind(b"\xff\xd9") > len(with_thumb) - 1024  # found by a search from the end
    assert _structure.check_structure(with_thumb).cause.startswith("truncated JPEG")
    assert _structure.check_structure(small[:2] + app1 + small[2:]).cause is None
    # not JPEG or PNG: not walked, Pillow decides
    assert _structure.check_structure(b"GIF89a....") == (None, "", 0, 0)


# ---------------------------------------------------------------------------- the backends


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c[0]}-{c[1]}")
def test_accepted_files_give_pillows_pixels(config, tmp_path):
    pairs = write(tmp_path / "good", GOOD)
    datas = list(GOOD.values())
    loader = make(config, pairs, tmp_path)
    for epoch in range(2):
        got = images_by_label(loader)
        assert sorted(got) == list(range(len(GOOD))), f"epoch {epoch}: {sorted(got)}"
        for k, name in enumerate(GOOD):
            diff = np.abs(got[k] - reference(datas[k], k, epoch)).mean()
            assert diff < TOLERANCE, f"{name} (epoch {epoch}): mean difference {diff:.2f} from Pillow"
    assert loader.stats["skipped"] == 0
    # The comparison sees a rotation: the EXIF-rotated rendering of the same window is far off.
    for name in ("exif180.jpg", "exif90-square.jpg"):
        k = list(GOOD).index(name)
        with Image.open(io.BytesIO(GOOD[name])) as img:
            turned = encode(ImageOps.exif_transpose(img), "PNG")
        assert np.abs(got[k] - reference(turned, k, 1)).mean() > 20, name


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c[0]}-{c[1]}")
@pytest.mark.parametrize("name", list(BAD))
def test_rejected_file_raises_naming_it(config, name, tmp_path):
    data, cause = BAD[name]
    pairs = write(tmp_path / "files", {"plain.jpg": PLAIN, name: data})
    loader = make(config, pairs, tmp_path, batch_size=2)
    with pytest.raises(DataError) as err:
        for _ in loader:
            pass
    message = str(err.value)
    assert cause in message and named(config, message, pairs, 1), message
    if config[1] == 0:  # (from a worker, torch's DataLoader re-raises it with the traceback)
        assert "\n" not in message and err.value.path is not None, message


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c[0]}-{c[1]}")
def test_rejected_files_skipped_and_counted(config, tmp_path):
    files, bad = {}, list(BAD)
    for k, (name, data) in enumerate(GOOD.items()):  # the bad files among the good ones
        files[name] = data
        if k < len(bad):
            files[bad[k]] = BAD[bad[k]][0]
    pairs = write(tmp_path / "files", files)
    names = list(files)
    loader = make(config, pairs, tmp_path, on_error="skip", shuffle=True)
    got = images_by_label(loader)
    want = [k for k, n in enumerate(names) if n in GOOD]
    assert sorted(got) == want
    for k in want:
        assert np.abs(got[k] - reference(files[names[k]], k, 0)).mean() < TOLERANCE, names[k]
    assert loader.stats["skipped"] == len(BAD) == len(loader.stats["errors"])
    for k, n in enumerate(names):
        if n in BAD:
            (error,) = [e for e in loader.stats["errors"] if named(config, e["path"], pairs, k)]
            assert BAD[n][1] in error["cause"], (n, error)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c[0]}-{c[1]}")
def test_a_batch_of_samples_all_left_out_keeps_its_shape(config, tmp_path):
    """Both samples of the second batch are bad: it still comes, empty, in the transform's
    output size, so that a model (and every rank) gets the same number of well-formed batches."""
    pairs = write(tmp_path / "files", {"a.jpg": PLAIN, "b.jpg": PHOTO, "empty.jpg": b"", "cut.jpg": CUT})
    batches = [(images.shape, labels.tolist()) for images, labels in make(config, pairs, tmp_path, batch_size=2,
                                                                         on_error="skip")]
    assert batches == [((2, 3, OUT, OUT), [0, 1]), ((0, 3, OUT, OUT), [])]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c[0]}-{c[1]}")
def test_cut_file_rejected_in_every_epoch(config, tmp_path):
    """The cut file is refused by its structure, whatever window the epoch's crop draws. A cut
    closed with a pasted end marker is structurally whole: the native decoder (pil, wds)
    entropy-decodes every row and refuses it in every epoch; with `dali`, whose decoder would
    fill the missing rows, its entropy-coded data is decoded natively first (once per clean
    file), so it is refused in every epoch too. Without the native decoder, Pillow and DALI
    fill the rows and deliver it in every epoch. Never a mix."""
    whole = PHOTO
    files = {"a.jpg": whole, "cut85.jpg": CUT, "b.jpg": PLAIN, "cut-closed.jpg": CUT + b"\xff\xd9", "c.jpg": whole}
    pairs = write(tmp_path / "files", files)
    loader = make(config, pairs, tmp_path, on_error="skip", batch_size=5, persistent_workers=config[1] > 0)
    closed_rejected = _codec.AVAILABLE
    windows = []
    for epoch in range(20):
        before = loader.stats["skipped"]
        got = images_by_label(loader)
        want = {0, 2, 4} | (set() if closed_rejected else {3})
        assert set(got) == want, f"epoch {epoch}: got {sorted(got)}"
        assert loader.stats["skipped"] - before == 5 - len(want), f"epoch {epoch}"
        windows.append(got[0])
    assert all(named(config, e["path"], pairs, 1) or named(config, e["path"], pairs, 3)
               for e in loader.stats["errors"])
    # each file listed once, with the times it was skipped: the cut one in each of the 20 epochs
    assert sum(e["count"] for e in loader.stats["errors"] if "truncated JPEG" in e["cause"]) == 20
    assert len(loader.stats["errors"]) == loader.stats["skipped_files"] == 5 - len(want)
    # the crops did differ from epoch to epoch
    assert len({w.tobytes() for w in windows}) > 10


@pytest.mark.skipif(not _codec.AVAILABLE, reason="native decoder not built")
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c[0]}-{c[1]}")
def test_a_cut_cmyk_jpeg_closed_with_an_end_marker_is_refused(config, tmp_path):
    """A CMYK JPEG, which Pillow decodes (libjpeg has no CMYK to RGB), cut and closed with an end
    marker: structurally whole, so the native decoder decodes its data whole before leaving it
    to Pillow, and refuses it in every epoch, where Pillow (and DALI) would fill the missing
    rows and deliver it; the whole CMYK file beside it is Pillow's pixels."""
    cmyk = GOOD["cmyk.jpg"]
    files = {"a.jpg": PLAIN, "cut-cmyk.jpg": cmyk[: len(cmyk) * 6 // 10] + b"\xff\xd9", "cmyk.jpg": cmyk}
    pairs = write(tmp_path / "files", files)
    loader = make(config, pairs, tmp_path, on_error="skip", batch_size=3)
    for epoch in range(2):
        loader.set_epoch(epoch)
        got = images_by_label(loader)
        assert set(got) == {0, 2}, f"epoch {epoch}: got {sorted(got)}"
        diff = np.abs(got[2] - reference(cmyk, 2, epoch))
        assert diff.mean() < 0.5 and diff.max() <= 4, (diff.mean(), diff.max())
    (error,) = loader.stats["errors"]
    assert named(config, error["path"], pairs, 1) and error["count"] == 2
    assert "corrupt JPEG" in error["cause"] and "premature end of data segment" in error["cause"], error


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c[0]}-{c[1]}")
def test_data_after_the_end_marker_changes_nothing(config, tmp_path):
    plain = make(config, write(tmp_path / "plain", {"x.jpg": PLAIN}), tmp_path, batch_size=1)
    tail = make(config, write(tmp_path / "tail", {"x.jpg": GOOD["tail.jpg"]}), tmp_path, batch_size=1)
    for epoch in range(3):
        (a,), (b,) = ([x.clone() for x, _ in loader] for loader in (plain, tail))
        assert torch.equal(a, b), f"epoch {epoch}"
    assert tail.stats["skipped"] == 0


_BOMB_SCRIPT = """
import json, os, resource, sys
import fastdata
from fastdata import transforms as T
backend, good, bomb, tmp, TESTS = sys.argv[1:6]
if backend == "dali":
    import nvidia.dali  # noqa: F401
source = [(good, 0), (bomb, 1)]
if backend == "wds":
    sys.path.insert(0, TESTS)
    from _images import tar_as_is
    tar_as_is(source, os.path.join(tmp, "s-000000.tar"))
    source = os.path.join(tmp, "s-000000.tar")
def run(on_error):
    loader = fastdata.loader(source, batch_size=2, backend=backend, device="cpu", on_error=on_error,
                             transform=T.Compose([T.RandomResizedCrop(32)]))
    try:
        n = sum(len(y) for _, y in loader)
        return n, [e["cause"] for e in loader.stats["errors"]]
    except fastdata.DataError as e:
        return None, str(e)
run("skip")  # a first epoch: imports, threads and buffers are in place before measuring
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
results = [run("skip"), run("raise")]
grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) / 1024
print(json.dumps({"results": results, "grown_mb": grown}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["pil", "wds", pytest.param("dali", marks=pytest.mark.dali)])
def test_decompression_bomb_refused_before_allocating(backend, tmp_path):
    """A header claiming 13000x13000 pixels (169M, over the 89M limit) is refused from the
    header: no decoder sees it, so memory does not grow by the gigabyte it would take."""
    (good, _), (bomb, _) = write(tmp_path / "files", {"good.jpg": PLAIN, "bomb.jpg": bomb_jpeg()})
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", _BOMB_SCRIPT, backend, good, bomb, str(tmp_path), tests],
                          env=env, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    (delivered, causes), (raised, message) = report["results"]
    assert delivered == 1 and len(causes) == 1 and "13000x13000" in causes[0], report
    assert raised is None and "13000x13000" in message and "bomb" in message
    assert report["grown_mb"] < 200, report


def test_a_pngs_rows_are_counted_a_mib_at_a_time():
    """The check for missing rows (`check.png_rows`) inflates a PNG's image data only to count
    it, so it holds a MiB of it at a time: a 4096x4096 image of zeros (50 MB of scanlines from
    a 50 kB file), in one IDAT chunk or in chunks of 8 KiB, is counted whole with under 4 MB
    allocated at its peak, and the same data short of its last row is refused."""
    import tracemalloc

    from fastdata.image.check import png_rows

    from _images import png_chunk

    w = h = 4096
    rows = bytes(h * (1 + 3 * w))
    one = png_of(rows, w, h)
    packed = zlib.compress(rows)  # in IDAT chunks of 8 KiB, as encoders write them
    at = one.index(b"IDAT") - 4
    chunks = b"".join(png_chunk(b"IDAT", packed[k:k + 8192]) for k in range(0, len(packed), 8192))
    several = one[:at] + chunks + png_chunk(b"IEND", b"")
    for data, want in ((one, None), (several, None), (png_of(rows[:-(1 + 3 * w)], w, h), "truncated image data")):
        tracemalloc.start()
        try:
            got = png_rows(data)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert (got is None) if want is None else (want in got), got
        assert peak < 4 << 20, peak


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c[0]}-{c[1]}")
def test_a_name_with_a_line_break_stays_one_line(config, tmp_path, caplog):
    """A bad file (or, on wds, tar member) named with a line break and a terminal escape: the
    error and the skip's log line are one line each, the name's breaks written as escapes, so a
    name cannot forge a line of the log."""
    name = "cut\nFAKE: all samples verified\x1b[0m.jpg"
    pairs = write(tmp_path / "files", {"plain.jpg": PLAIN, name: CUT})
    if config[0] == "wds":  # the tar member named so (a shard written by hand: no index)
        shard = tmp_path / "named-000000.tar"
        with tarfile.open(shard, "w", format=tarfile.PAX_FORMAT) as tar:
            for member, data in [("a.jpg", PLAIN), ("a.cls", b"0"), (name, CUT), (name[:-4] + ".cls", b"1")]:
                info = tarfile.TarInfo(member)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        pairs = str(shard)

    def loader(**kw):
        return fastdata.loader(pairs, batch_size=2, backend=config[0], num_workers=config[1], device="cpu",
                               transform=RRC, **kw)

    with pytest.raises(DataError) as err:
        list(loader())
    message = str(err.value).rstrip("\n").splitlines()[-1]  # (a worker's is re-raised under its traceback)
    assert "cut\\nFAKE: all samples verified\\x1b[0m.jpg" in message and "truncated JPEG" in message, message
    caplog.set_level("WARNING", logger="fastdata")
    list(loader(on_error="skip"))
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("skipped ")]
    assert len(line.splitlines()) == 1 and "\x1b" not in line and "cut\\nFAKE" in line, line


@pytest.mark.skipif(not _codec.AVAILABLE, reason="native decoder not built")
def test_a_file_rewritten_at_its_size_is_checked_again(tmp_path):
    """A file that decoded whole (marked clean at its size) is replaced, at the same size, by a
    copy whose last restart marker is out of turn, which the checkpoint decoder leaves to
    libjpeg's: the crop stops above the damage, but the file is refused, in the next epoch and
    in a new loader of the same process, as a fresh process refuses it."""
    noise = np.random.default_rng(4).integers(0, 256, (256, 64, 3), dtype=np.uint8)
    good = encode(Image.fromarray(noise), quality=90, restart_marker_blocks=2)
    last = max(i for i in range(len(good) - 1) if good[i] == 0xFF and 0xD0 <= good[i + 1] <= 0xD7)
    bad = bytearray(good)
    bad[last + 1] = 0xD0 if good[last + 1] != 0xD0 else 0xD1
    ((path, _),) = write(tmp_path / "files", {"restarts.jpg": good})

    def loader():
        return fastdata.loader([(path, 0)], batch_size=1, num_workers=0, device="cpu", on_error="skip",
                               transform=T.Compose([T.CenterCrop(32)]))

    def delivered(built) -> int:
        return sum(len(labels) for _, labels in built)

    first = loader()
    assert delivered(first) == 1 and first.stats["skipped"] == 0
    with open(path, "wb") as f:
        f.write(bytes(bad))
    first.set_epoch(1)
    for built in (first, loader()):
        assert delivered(built) == 0 and built.stats["skipped"] == 1, built.stats
        assert "RST" in built.stats["errors"][0]["cause"], built.stats["errors"]


EPS = (b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 64 64\n%%EndComments\n"
       b"newpath 0 0 moveto 64 64 lineto stroke\nshowpage\n%%EOF\n")


@pytest.mark.parametrize("config", CONFIGS[:3], ids=lambda c: f"{c[0]}-{c[1]}")
def test_only_image_formats_reach_pillow(config, tmp_path, monkeypatch):
    """A file named .jpg that holds PostScript is refused as not an image: Pillow's EPS plugin,
    which hands the bytes to Ghostscript, is never tried (a stand-in `gs` on PATH would record
    its call, inherited by the workers)."""
    calls = tmp_path / "gs-calls"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gs").write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\nexit 1\n")
    (bin_dir / "gs").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    pairs = write(tmp_path / "files", {"plain.jpg": PLAIN, "postscript.jpg": EPS})
    loader = make(config, pairs, tmp_path, batch_size=2, on_error="skip")
    assert sorted(images_by_label(loader)) == [0]
    (error,) = loader.stats["errors"]
    assert "not a readable image" in error["cause"] and named(config, error["path"], pairs, 1), error
    assert not calls.exists(), calls.read_text()


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c[0]}-{c[1]}")
def test_a_webp_this_pillow_cannot_read_says_so(config, tmp_path):
    """Pillow built without libwebp (a Pillow-SIMD built where its headers were missing) reports
    a WebP as no format at all; the error names the missing codec instead."""
    from PIL import features

    if features.check("webp"):
        pytest.skip("this Pillow reads WebP")
    webp = b"RIFF" + (30).to_bytes(4, "little") + b"WEBPVP8 " + bytes(22)
    pairs = write(tmp_path / "files", {"plain.jpg": PLAIN, "photo.webp": webp})
    loader = make(config, pairs, tmp_path, batch_size=2, on_error="skip")
    assert sorted(images_by_label(loader)) == [0]
    (error,) = loader.stats["errors"]
    assert error["cause"] == "a WebP image, but this Pillow was built without WebP support (libwebp)", error
    assert named(config, error["path"], pairs, 1), error


_FALLBACK_SCRIPT = """
import json, sys
import fastdata
from fastdata import _codec, transforms as T
pairs = json.loads(sys.argv[1])
loader = fastdata.loader([tuple(p) for p in pairs], batch_size=4, backend="pil", on_error="skip",
                         transform=T.Compose([T.RandomResizedCrop(24)]))
labels = sorted(y for _, ys in loader for y in ys.tolist())
print(json.dumps({"native": _codec.AVAILABLE, "labels": labels,
                  "errors": sorted((e["path"], e["cause"]) for e in loader.stats["errors"])}))
"""


@pytest.mark.slow
def test_python_fallback_accepts_and_rejects_the_same(tmp_path):
    """Without the native extension the same walk runs in Python: the same files pass, and the
    refused ones are refused with the same causes."""
    files = {**GOOD, **{n: d for n, (d, _) in BAD.items()}}
    pairs = write(tmp_path / "files", files)
    runs = {}
    for disable in ("0", "1"):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "FASTDATA_DISABLE_NATIVE": disable}
        proc = subprocess.run([sys.executable, "-c", _FALLBACK_SCRIPT, json.dumps(pairs)], env=env,
                              capture_output=True, text=True, timeout=100)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[disable] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert runs["1"]["native"] is False
    assert runs["0"]["labels"] == runs["1"]["labels"] == list(range(len(GOOD)))
    assert runs["0"]["errors"] == runs["1"]["errors"] and len(runs["0"]["errors"]) == len(BAD)



@pytest.mark.skipif(not _codec.AVAILABLE, reason="native decoder not built")
def test_entropy_check_decodes_each_clean_file_once(monkeypatch):
    """`dali`'s check of the entropy-coded data: a clean file is decoded once and remembered by
    its id with a keyed hash of its bytes; a corrupt one is refused each time it comes; CMYK
    (left to Pillow) passes; a file rewritten under a marked id, at any size, is checked again."""
    from fastdata.image.check import check_complete
    from fastdata.image.record import EntropyCheck

    seen = []
    real = _codec.decode_crop_resize

    def counting(datas, *args, **kw):
        seen.append(len(datas))
        return real(datas, *args, **kw)

    monkeypatch.setattr(_codec, "decode_crop_resize", counting)
    datas = [PHOTO, CUT + b"\xff\xd9", GOOD["cmyk.jpg"], PLAIN, GOOD["png-named.jpg"]]
    check = EntropyCheck(5)
    for _ in range(2):
        out = check(np.arange(5), datas, check_complete(datas))
        assert [c is None for c, *_ in out] == [True, False, True, True, True]
        assert "corrupt JPEG" in out[1][0]
    assert seen == [4, 2]  # the JPEGs, then the corrupt one and CMYK again (neither remembered)
    photo, plain = (int(s) for s in check.stamps([PHOTO, PLAIN]))
    assert check.clean.tolist() == [photo, 0, 0, plain, 0] and 0 not in (photo, plain) and photo != plain
    # an id outside the record is checked each time it comes, never marked
    for _ in range(2):
        out = check(np.array([5]), [PLAIN], check_complete([PLAIN]))
        assert out[0][0] is None
    assert seen == [4, 2, 1, 1] and check.clean.tolist() == [photo, 0, 0, plain, 0]
    # a file of another size under a marked id is checked again
    out = check(np.array([0]), [PLAIN], check_complete([PLAIN]))
    assert out[0][0] is None and seen == [4, 2, 1, 1, 1] and check.clean[0] == plain
    # and so is a corrupt one of the very same size: refused, the mark left as it was
    out = check(np.array([0]), [PHOTO], check_complete([PHOTO]))
    assert out[0][0] is None and seen == [4, 2, 1, 1, 1, 1] and check.clean[0] == photo
    closed = CUT + b"\xff\xd9"
    same_size = closed + bytes(len(PHOTO) - len(closed))  # zeros after the end marker
    out = check(np.array([0]), [same_size], check_complete([same_size]))
    assert "corrupt JPEG" in out[0][0] and seen == [4, 2, 1, 1, 1, 1, 1] and check.clean[0] == photo


def test_records_are_shared_by_the_same_files_only(tmp_path, monkeypatch):
    """The key of the shared record of clean files: the same paths in the same working
    directory share it; other paths, the same relative paths from another directory, or the
    same shard URLs with other sample counts do not."""
    from fastdata.image.record import samples_key
    from fastdata.sources.files import Samples
    from fastdata.sources.webdataset import Shards

    def files(*paths):
        return Samples(list(paths), np.zeros(len(paths), np.int64), None, "")

    def shards(*counts):
        return Shards([f"s{i}.tar" for i in range(len(counts))], [[str(k) for k in range(n)] for n in counts],
                      [np.zeros((n, 2), np.int64) for n in counts], None, "")

    for d in ("a", "b"):
        (tmp_path / d).mkdir()
    monkeypatch.chdir(tmp_path / "a")
    here = samples_key(files("x.jpg", "y.jpg"))
    assert samples_key(files("x.jpg", "y.jpg")) == here
    assert samples_key(files("x.jpg", "z.jpg")) != here and samples_key(files("y.jpg", "x.jpg")) != here
    assert samples_key(shards(3, 4)) == samples_key(shards(3, 4)) != samples_key(shards(4, 3))
    monkeypatch.chdir(tmp_path / "b")
    assert samples_key(files("x.jpg", "y.jpg")) != here


def _decodes_by_file(monkeypatch, names_by_data: dict) -> list:
    """Records each native decode as {file name: whole} (1: decoded whole)."""
    calls = []
    real = _codec.decode_crop_resize

    def recording(datas, crops, flips, out, threads=1, whole=None, **kw):
        flags = [1] * len(datas) if whole is None else [int(w) for w in whole]
        calls.append({names_by_data[bytes(d)]: w for d, w in zip(datas, flags)})
        return real(datas, crops, flips, out, threads, whole=whole, **kw)

    monkeypatch.setattr(_codec, "decode_crop_resize", recording)
    return calls


@pytest.mark.skipif(not _codec.AVAILABLE, reason="native decoder not built")
@pytest.mark.parametrize("workers,persistent", [(0, False), (2, False), (2, True)])
def test_the_record_marks_what_was_checked_whole(workers, persistent, tmp_path, monkeypatch):
    """On `pil` the native decoder's checkpoint index, keyed by the bytes, says which JPEGs
    decoded whole: the loader's record marks none of them, and every native decode is handed
    no `whole` of its own. A PNG is marked once its rows are counted (`check_rows`; marks made
    in the workers are the parent's too). The corrupt file is never marked: refused each epoch.
    A new loader over the same files in this process shares the record."""
    files = {"a.jpg": PHOTO, "cut-closed.jpg": CUT + b"\xff\xd9", "b.jpg": PLAIN, "gray.jpg": GOOD["gray.jpg"],
             "progressive.jpg": GOOD["progressive.jpg"], "png-named.jpg": GOOD["png-named.jpg"],
             "cmyk.jpg": GOOD["cmyk.jpg"]}
    calls = _decodes_by_file(monkeypatch, {d: n for n, d in files.items()})
    pairs = write(tmp_path / "files", files)
    loader = make(("pil", workers), pairs, tmp_path, on_error="skip", batch_size=3, persistent_workers=persistent)
    names = list(files)
    clean = loader._decoder.entropy.clean
    assert clean.is_shared() and clean.tolist() == [0] * len(files)
    png = int(loader._decoder.entropy.stamps([files["png-named.jpg"]])[0])
    for epoch in range(3):
        got = images_by_label(loader)
        assert sorted(got) == [k for k, n in enumerate(names) if n != "cut-closed.jpg"], f"epoch {epoch}"
        for k in got:
            assert np.abs(got[k] - reference(files[names[k]], k, epoch)).mean() < TOLERANCE, (epoch, names[k])
        assert clean.tolist() == [png if n == "png-named.jpg" else 0 for n in names], f"epoch {epoch}"
    if workers == 0:
        assert calls and all(set(call.values()) == {1} for call in calls)  # no `whole` given
    assert loader.stats["skipped"] == 3
    assert all("cut-closed.jpg" in e["path"] and "corrupt JPEG" in e["cause"] for e in loader.stats["errors"])
    again = make(("pil", workers), pairs, tmp_path, on_error="skip", batch_size=3, persistent_workers=persistent)
    assert again._decoder.entropy.clean.data_ptr() == clean.data_ptr()
    assert sorted(images_by_label(again)) == [k for k, n in enumerate(names) if n != "cut-closed.jpg"]
    assert again.stats["skipped"] == 1


@pytest.mark.parametrize("hashed", ["native", "python"])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_png_rewritten_at_the_same_size_is_checked_again(workers, hashed, tmp_path, monkeypatch):
    """A PNG whose rows were counted is marked by a keyed hash of its bytes, not its size: the
    same file rewritten between epochs, at the very same size, with half its rows, is refused
    the next epoch, not delivered with the rest of its rows as zeros."""
    from _images import png_chunk
    from fastdata.image import record

    if hashed == "python":
        monkeypatch.setattr(record, "_ext", None)
    elif record._ext is None:
        pytest.skip("native extension not built")

    a = np.asarray(gradient(64, 48))
    whole = png_of(b"".join(b"\0" + row.tobytes() for row in a), 64, 48)
    short = short_rows()
    pad = len(whole) - len(short) - 12  # a private chunk before IEND evens the sizes
    assert pad >= 0
    short = short[:-12] + png_chunk(b"prVt", bytes(pad)) + short[-12:]
    assert len(short) == len(whole)
    pairs = write(tmp_path / "files", {"a.png": whole, "b.jpg": PLAIN})
    loader = make(("pil", workers), pairs, tmp_path, on_error="skip", batch_size=2)
    assert sorted(images_by_label(loader)) == [0, 1] and loader.stats["skipped"] == 0
    with open(pairs[0][0], "wb") as f:
        f.write(short)
    assert sorted(images_by_label(loader)) == [1]
    assert loader.stats["skipped"] == 1 and "truncated image data" in loader.stats["errors"][0]["cause"]


@pytest.mark.skipif(not _codec.AVAILABLE, reason="native decoder not built")
@pytest.mark.parametrize("start", ["in-process", "fork", "forkserver"])
def test_a_workers_mark_reaches_later_passes_and_loaders(start, tmp_path):
    """The record is one block of shared memory: a mark made by a worker (the PNG's, once its
    rows are counted) is the training process's, forked or started by forkserver (which gets
    the record's file descriptor); a new loader over the same files in this process shares it.
    The native decoder goes by content: a file decoded whole, then replaced by a corrupt one of
    the same size whose centre window lies above the corruption, is not in the checkpoint
    index, so the next pass and a new loader decode it whole, and refuse it; so they do a
    corrupt file of another size. No name is left in /dev/shm."""
    from fastdata._workers import hold_threads, release_threads

    def names() -> set:
        return {n for n in os.listdir("/dev/shm") if n.startswith(f"torch_{os.getpid()}_")}

    before = names()
    png = GOOD["png-named.jpg"]
    pairs = write(tmp_path / "files", {"a.jpg": PHOTO, "b.jpg": PHOTO, "c.jpg": png})
    workers = 0 if start == "in-process" else 2
    closed = CUT + b"\xff\xd9"
    same_size = closed + bytes(len(PHOTO) - len(closed))  # zeros after the end marker

    def new_loader():
        return make(("pil", workers), pairs, tmp_path, on_error="skip", batch_size=2,
                    transform=T.Compose([T.CenterCrop(OUT)]))

    def replace(data: bytes) -> None:
        with open(pairs[1][0], "wb") as f:
            f.write(data)

    class Owner:  # a stand-in for a DALI pipeline, whose threads make workers start by forkserver
        pass

    owner = Owner()
    if start == "forkserver":
        hold_threads(owner)
    try:
        loader = new_loader()
        first = [(x.clone(), y.tolist()) for x, y in loader]
        assert loader._decoder.entropy.clean.tolist() == [0, 0, int(loader._decoder.entropy.stamps([png])[0])]
        replace(same_size)
        second = [(x.clone(), y.tolist()) for x, y in loader]
        fresh = new_loader()
        third = [(x.clone(), y.tolist()) for x, y in fresh]
        replace(closed)
        changed = new_loader()
        fourth = [y.tolist() for _, y in changed]
    finally:
        release_threads(owner)
    if workers:
        context = loader._runner.loader.multiprocessing_context
        assert context.get_start_method() == start
    assert fresh._decoder.entropy.clean.data_ptr() == loader._decoder.entropy.clean.data_ptr()
    assert [y for _, y in first] == [[0, 1], [2]]
    assert torch.equal(first[0][0][0], first[0][0][1])
    assert [y for _, y in second] == [y for _, y in third] == fourth == [[0], [2]]
    for run in (loader, fresh, changed):
        assert run.stats["skipped"] == 1 and "corrupt JPEG" in run.stats["errors"][-1]["cause"]
    assert names() == before
