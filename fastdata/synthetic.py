"""A seeded synthetic ImageNet-like JPEG dataset, for the demo, the tests and the benchmarks.
Over 400 lines: the image model (about 170 lines) stays beside the resumable writer, whose
manifest records the model's version (`GENERATOR`), to be bumped with any change to it.

    python -m fastdata.synthetic ROOT [--images 2000] [--classes 10] [--seed 0]

`make_imagenet_like(root)` writes the ImageFolder layout `root/n00000/00000000.JPEG`, ...
(`make_file_list(root)` lists it) with files that a decoder sees as it sees ImageNet's:

- size: long side uniform in 333-500 px (3% of images: 500-1000), short side 3/4 of it (80%)
  or 2/3; 70% landscape, 20% portrait, 10% square; mean about 405x350;
- JPEG: baseline, quality uniform in 75-95, 4:2:0 chroma subsampling (Pillow's defaults);
- content: smooth colour fields, soft-edged shapes and 1/f-like texture whose strength varies
  over the image and between images, so that the entropy-coded data (what decoding time
  follows) has a photo's mix of flat areas, edges and texture; about 100 KB a file.

Image i depends only on (seed, i); its class is i % n_classes (the folder: nothing is encoded
in the pixels). The pixels are computed with float32 +, -, * on numbers from numpy's PCG64 (no
transcendental functions, BLAS or FFT, whose last bits vary with the CPU and the library), so
the files are byte-identical wherever the JPEG encoder is libjpeg-turbo.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import time
from pathlib import Path

import numpy as np

from ._cli import Progress, check_int
from ._cores import usable_cores
from ._optional import require_pillow
from ._pool import process_pool
from .sources.files import IMAGE_EXTENSIONS, image_folder

# Bump when the pixels or the layout change: an existing dataset with another generator is
# regenerated.
GENERATOR = "fastdata.synthetic/1"
MANIFEST = "manifest.json"

_CLASS_DIR = re.compile(r"n\d{5}")
_IMAGE_FILE = re.compile(r"(\d{8})\.JPEG")

# Tuned so that the mean file is about 100 KB, as in ImageNet's training set.
_TEXTURE = 130.0  # luminance texture at full size, 0-255 units (times a per-image 0.6-1.4)
_GAIN = 1.4  # texture grows by this per level towards the coarse ones
_SHAPES = 16  # at most this many sharp shapes, half as many blurred
_CHROMA = 0.4  # chroma texture relative to luminance texture, at most
_COARSE = np.array([130, 50, 50], np.float32)[:, None, None]
_MIDDLE = np.array([60, 24, 24], np.float32)[:, None, None]


def _class_dir(c: int) -> str:
    return f"n{c:05d}"


def _image_name(i: int) -> str:
    return f"{i:08d}.JPEG"


# ----------------------------------------------------------------- one image

def _params(rng: np.random.Generator) -> tuple[int, int, int]:
    """(width, height, quality) of one image, ImageNet-like."""
    if rng.random() < 0.03:
        long_side = int(rng.integers(500, 1001))
    else:
        long_side = int(rng.integers(333, 501))
    ratio = 3 / 4 if rng.random() < 0.8 else 2 / 3
    short_side = int(long_side * ratio + 0.5)
    shape = rng.random()
    if shape < 0.7:
        w, h = long_side, short_side
    elif shape < 0.9:
        w, h = short_side, long_side
    else:
        w = h = long_side
    return w, h, int(rng.integers(75, 96))


def _f32(x) -> np.float32:
    return np.float32(x)


def _up2(a: np.ndarray) -> np.ndarray:
    """Bilinear 2x upsampling of the last two axes of a float32 array (weights 3/4 and 1/4,
    edges repeated): the synthesis step of the noise pyramid. Four passes over the input per
    axis, written straight into the output."""
    for axis in (a.ndim - 2, a.ndim - 1):
        shape = list(a.shape)
        shape[axis] *= 2
        out = np.empty(shape, np.float32)
        src, dst = np.moveaxis(a, axis, 0), np.moveaxis(out, axis, 0)
        quarter = src * _f32(0.25)
        rest = src - quarter  # 3/4 of src, rounded as src * 0.75 would be
        dst[0], dst[-1] = src[0], src[-1]
        np.add(rest[1:], quarter[:-1], out=dst[2::2])
        np.add(rest[:-1], quarter[1:], out=dst[1:-1:2])
        a = out
    return a


def _shapes(rng: np.random.Generator, planes: np.ndarray, n: int) -> None:
    """Paints n hard-edged ellipses and rectangles of random colours into planes (3, h, w)
    (Y, Cb, Cr) in place; the next upsampling softens their edges. Each keeps part of the
    texture under it."""
    _, h, w = planes.shape
    for _ in range(n):
        cy, cx = rng.random() * h, rng.random() * w
        r = 0.02 + 0.3 * rng.random() ** 2  # many small shapes, a few large ones
        ry, rx = r * (0.5 + rng.random()) * h, r * (0.5 + rng.random()) * w
        color = (rng.random((3, 1), dtype=np.float32) - _f32(0.5)) * _f32([[220], [120], [120]]) + _f32(128)
        keep = _f32(0.1 + 0.4 * rng.random())
        ellipse = rng.random() < 0.6
        y0, y1 = max(0, int(cy - ry)), min(h, int(cy + ry) + 1)
        x0, x1 = max(0, int(cx - rx)), min(w, int(cx + rx) + 1)
        if y0 >= y1 or x0 >= x1:
            continue
        region = planes[:, y0:y1, x0:x1]
        if ellipse:
            dy = (np.arange(y0, y1, dtype=np.float32) - _f32(cy)) * _f32(1 / ry)
            dx = (np.arange(x0, x1, dtype=np.float32) - _f32(cx)) * _f32(1 / rx)
            mask = (dy * dy)[:, None] + (dx * dx)[None, :] <= 1
            region[:, mask] = region[:, mask] * keep + color * (1 - keep)
        else:
            region *= keep
            region += (color * (1 - keep))[:, :, None]


def _render(rng: np.random.Generator, w: int, h: int) -> np.ndarray:
    """An (h, w, 3) uint8 YCbCr photo-like image, its chroma constant over 2x2 blocks (what
    4:2:0 JPEG keeps anyway, so the encoder's downsampling returns it exactly and the colour
    work is done at a quarter of the pixels).

    A noise pyramid synthesised from a few pixels to full size (each level upsampled 2x, then
    noise added): colour noise at the coarse levels, then luminance texture modulated by a
    coarse strength field (sky next to foliage), with soft-edged shapes painted in between.
    Equal noise per level would give the 1/f amplitude spectrum of natural images; the fine
    levels get less, as optics and downscaling leave photos."""
    levels = (max(w, h) // 6).bit_length() - 1  # coarsest level about 6-12 px across
    scale = 1 << levels
    h0, w0 = -(-h // scale) + 2, -(-w // scale) + 2
    detail = _f32(_TEXTURE * (0.6 + 0.8 * rng.random()))  # per-image texture strength
    mean = np.array([60 + 130 * rng.random(), 108 + 40 * rng.random(), 108 + 40 * rng.random()], np.float32)
    planes = mean[:, None, None] + (rng.random((3, h0, w0), dtype=np.float32) - _f32(0.5)) * _COARSE
    # Light from above: a vertical luminance gradient of random sign and strength.
    planes[0] += (np.arange(h0, dtype=np.float32) * _f32((rng.random() - 0.4) * 120 / h0))[::-1, None]
    strength = rng.random((h0, w0), dtype=np.float32) * _f32(1.5) + _f32(0.25)
    # The colour direction the texture varies along (foliage: green to yellow, ...).
    hue = ((rng.random((2, 1, 1), dtype=np.float32) - _f32(0.5)) * _f32(2 * _CHROMA))
    # Shapes painted two levels below full size get blurred edges (out of focus), one level
    # below sharp ones.
    shapes_at = {levels - 2: int(rng.integers(0, _SHAPES // 2 + 1)), levels - 1: int(rng.integers(1, _SHAPES + 1))}
    gain = 1.0  # _GAIN ** (levels - 3) by products and quotients, bit-exact everywhere unlike pow()
    for _ in range(levels - 3):
        gain *= _GAIN
    for level in range(1, levels + 1):
        if level == levels:  # full size: luminance only
            planes = planes[0]
        planes = _up2(planes)
        strength = _up2(strength)
        if level <= 2:
            planes += (rng.random(planes.shape, dtype=np.float32) - _f32(0.5)) * _MIDDLE
            continue
        sigma = detail * _f32(gain)
        gain /= _GAIN
        texture = (rng.random(strength.shape, dtype=np.float32) - _f32(0.5)) * strength
        texture *= sigma
        if level == levels:
            planes += texture
            break
        planes[0] += texture
        planes[1:] += texture * hue
        if level in shapes_at:
            _shapes(rng, planes, shapes_at[level])
        if level == levels - 1:
            chroma = planes[1:]
    oy, ox = (planes.shape[0] - h) // 4 * 2, (planes.shape[1] - w) // 4 * 2
    out = np.empty((h, w, 3), np.uint8)
    # Luminance past black or white is reflected back rather than clipped, so bright and dark
    # areas keep their texture instead of turning into flat patches.
    y = planes[oy:oy + h, ox:ox + w]
    y = _f32(255) - np.abs(_f32(255) - np.abs(y))
    out[:, :, 0] = _to_u8(y)
    c = _to_u8(chroma[:, oy // 2:oy // 2 + (h + 1) // 2, ox // 2:ox // 2 + (w + 1) // 2])
    c = c.repeat(2, axis=1).repeat(2, axis=2)
    out[:, :, 1] = c[0, :h, :w]
    out[:, :, 2] = c[1, :h, :w]
    return out


def _to_u8(a: np.ndarray) -> np.ndarray:
    """Rounded to the nearest integer in 0-255 (clip, add 1/2, truncate: exact in float32)."""
    a = np.clip(a, 0, 255)
    a += _f32(0.5)
    return a.astype(np.uint8)


def _image(seed: int, i: int) -> bytes:
    """The JPEG file of image i: a function of (seed, i) alone."""
    from PIL import Image

    rng = np.random.default_rng([seed, i])
    w, h, quality = _params(rng)
    buf = io.BytesIO()
    # Pillow's defaults otherwise: baseline, standard Huffman tables, 4:2:0.
    Image.fromarray(_render(rng, w, h), "YCbCr").save(buf, "JPEG", quality=quality)
    return buf.getvalue()


# ----------------------------------------------------------------- the dataset

def _write_image(job: tuple[str, int, int, int]) -> int:
    """Writes image i into its class folder (through a temporary name, so a file that exists
    is complete even after a crash); returns its size in bytes."""
    root, seed, n_classes, i = job
    data = _image(seed, i)
    path = os.path.join(root, _class_dir(i % n_classes), _image_name(i))
    tmp = os.path.join(os.path.dirname(path), f".{_image_name(i)}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return len(data)


def _read_manifest(root: Path) -> dict | None:
    try:
        with open(root / MANIFEST) as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def _write_manifest(root: Path, manifest: dict) -> None:
    tmp = root / f".{MANIFEST}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(tmp, root / MANIFEST)


def _existing_images(root: Path) -> dict[int, Path]:
    """The images already under root, by index; removes temporary files left by a crash.
    Refuses a folder that holds anything else, as it is not ours to change."""
    found = {}
    for entry in sorted(root.iterdir()):
        if entry.name == MANIFEST or entry.name.startswith("."):
            continue
        if not (entry.is_dir() and _CLASS_DIR.fullmatch(entry.name)):
            raise ValueError(f"`root` should be empty or hold a dataset made by make_imagenet_like, "
                             f"but it holds {entry}")
        for f in sorted(entry.iterdir()):
            m = _IMAGE_FILE.fullmatch(f.name)
            if m and f.is_file():
                found[int(m.group(1))] = f
            elif f.name.startswith(".") and f.name.endswith(".tmp"):
                f.unlink()
            else:
                raise ValueError(f"`root` should be empty or hold a dataset made by make_imagenet_like, "
                                 f"but it holds {f}")
    return found


def _wanted(n_images: int, n_classes: int, seed: int) -> dict:
    return {"generator": GENERATOR, "n_images": n_images, "n_classes": n_classes, "seed": seed}


def _complete(manifest: dict | None, want: dict) -> bool:
    return manifest is not None and manifest.get("complete") is True and \
        all(manifest.get(k) == v for k, v in want.items())


def default_root() -> Path:
    """Where the README's first command (`fastdata profile synthetic`) makes its set of 2,000
    images, and where the examples look for it (so that they train on it with its tune):
    demo-imagenet-like in fastdata's cache folder ($FASTDATA_CACHE, default ~/.cache/fastdata)."""
    from .tunecache import cache_root

    root = cache_root()
    if root is None:
        raise OSError("there is no cache folder for the synthetic set ($FASTDATA_CACHE is not set and this user has "
                      "no home directory); set FASTDATA_CACHE to a writable folder")
    return root / "demo-imagenet-like"


def make_imagenet_like(root, n_images: int = 2000, n_classes: int = 10, seed: int = 0,
                       workers: int | None = None, progress: bool = False) -> Path:
    """Makes (or completes) the synthetic ImageNet-like dataset under `root` and returns its
    path: `root/n00000/00000000.JPEG`, ..., image i in class i % n_classes (see the module
    docstring for what the files are like).

    Returns at once when `root/manifest.json` says the dataset with these arguments is
    complete. Otherwise only what is missing is made: images of the same seed are kept (moved
    when `n_classes` changed), the others removed; a crash leaves no partial file. `workers`
    processes encode (default: the cores this process may use); `progress` shows how many
    are made on stderr (a bar on a terminal, a few lines in a log)."""
    n_images = check_int("n_images", n_images, 1)
    n_classes = check_int("n_classes", n_classes, 1)
    seed = check_int("seed", seed, 0)
    if n_classes > n_images:  # ImageFolder refuses empty class folders
        raise ValueError(f"`n_classes` should be at most `n_images` ({n_images}), but got {n_classes}")
    workers = usable_cores() if workers is None else check_int("workers", workers, 1)
    root = Path(root)
    want = _wanted(n_images, n_classes, seed)
    old = _read_manifest(root)
    if _complete(old, want):
        return root
    require_pillow("to encode the synthetic JPEGs")
    root.mkdir(parents=True, exist_ok=True)
    existing = _existing_images(root)
    same_pixels = old is not None and old.get("generator") == GENERATOR and old.get("seed") == seed
    _write_manifest(root, {**want, "complete": False})
    for c in range(n_classes):
        (root / _class_dir(c)).mkdir(exist_ok=True)
    todo = []
    for i in range(n_images):
        path = root / _class_dir(i % n_classes) / _image_name(i)
        src = existing.pop(i, None)
        if src is not None and same_pixels:
            if src != path:  # n_classes changed: same image, another class
                os.replace(src, path)
            continue
        if src is not None and src != path:
            src.unlink()
        todo.append(i)
    for src in existing.values():  # images past n_images
        src.unlink()
    for d in root.iterdir():
        if _CLASS_DIR.fullmatch(d.name) and int(d.name[1:]) >= n_classes:
            d.rmdir()  # emptied above
    _make(root, seed, n_classes, todo, workers, progress, n_images)

    import PIL.features

    # For the record (which encoder made the files), not compared.
    codec = PIL.features.version("libjpeg_turbo")
    codec = f"libjpeg-turbo {codec}" if codec else f"libjpeg {PIL.features.version('jpg')}"
    total = sum((root / _class_dir(i % n_classes) / _image_name(i)).stat().st_size for i in range(n_images))
    _write_manifest(root, {**want, "complete": True, "bytes": total, "pillow": PIL.__version__, "codec": codec})
    return root


def _make(root: Path, seed: int, n_classes: int, todo: list[int], workers: int, progress: bool, total: int) -> None:
    """Writes the images `todo` of the `total` the set holds (the others are there: a run resumed
    counts them as done)."""
    jobs = [(str(root), seed, n_classes, i) for i in todo]
    if not jobs:
        return
    there = total - len(jobs)
    shown = Progress(f"synthetic images under {root}", total) if progress else contextlib.nullcontext()
    with shown:
        report = (lambda done: shown.update(there + done)) if progress else (lambda done: None)
        report(0)
        workers = min(workers, len(jobs))
        if workers == 1 or len(jobs) < 8:
            for done, job in enumerate(jobs, 1):
                _write_image(job)
                report(done)
            return
        from concurrent.futures import as_completed

        chunk = max(1, min(16, len(jobs) // (workers * 8)))  # images a job
        with process_pool(workers) as pool:
            futures = [pool.submit(_write_images, jobs[i:i + chunk]) for i in range(0, len(jobs), chunk)]
            try:
                done = 0
                for f in as_completed(futures):
                    done += f.result()
                    report(done)
            finally:  # on an error or Ctrl-C, the jobs not started are dropped
                pool.shutdown(wait=True, cancel_futures=True)


def _write_images(jobs: list[tuple[str, int, int, int]]) -> int:
    for job in jobs:
        _write_image(job)
    return len(jobs)


def make_file_list(root) -> list[tuple[str, int]]:
    """The (path, label) pairs of an image folder by torchvision's ImageFolder rules
    (`fastdata.sources.image_folder`), class after class. As ImageFolder, raises
    FileNotFoundError for a class folder without images."""
    samples = image_folder(root)
    labels = samples.labels.tolist()
    found = set(labels)
    empty = [name for label, name in enumerate(samples.classes or []) if label not in found]
    if empty:
        raise FileNotFoundError(f"Found no valid file for the classes {', '.join(empty)}. "
                                f"Supported extensions are: {', '.join(IMAGE_EXTENSIONS)}")
    return list(zip(samples.paths, labels))


# ----------------------------------------------------------------- CLI

def main(argv: list[str] | None = None) -> int:
    # The docstring's first line and what follows its first paragraph (not the maintainers' note
    # on the module's length); None under python -OO.
    doc = __doc__ or ""
    about = doc.partition("\n")[0] + "\n\n" + doc.partition("\n\n")[2]
    ap = argparse.ArgumentParser(prog="python -m fastdata.synthetic", description=about,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", metavar="ROOT", help="folder to make (or complete) the dataset in")
    ap.add_argument("--images", type=int, default=2000, help="number of images (default 2000)")
    ap.add_argument("--classes", type=int, default=10, help="number of class folders (default 10)")
    ap.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    ap.add_argument("--workers", type=int, default=None, help="encoding processes (default: the usable cores)")
    args = ap.parse_args(argv)

    require_pillow("to encode the synthetic JPEGs and time their decode")
    from PIL import Image

    there = _complete(_read_manifest(Path(args.root)), _wanted(args.images, args.classes, args.seed))
    t = time.perf_counter()
    try:
        root = make_imagenet_like(args.root, args.images, args.classes, args.seed, args.workers, progress=True)
    except ValueError as e:
        ap.error(str(e))
    made = "already there" if there else f"made in {time.perf_counter() - t:.1f} s"
    files = make_file_list(root)
    sizes = np.array([os.path.getsize(p) for p, _ in files])
    dims = []
    for p, _ in files:
        with Image.open(p) as im:  # reads the header only
            dims.append(im.size)
    dims = np.array(dims)
    sample = files[:: max(1, len(files) // 200)]  # decode about 200 of them, spread out
    t = time.perf_counter()
    for p, _ in sample:
        with Image.open(p) as im:
            im.convert("RGB")
    decode_ms = (time.perf_counter() - t) / len(sample) * 1e3

    from ._pillow import PILLOW

    print(root)
    print(f"{len(files)} images in {args.classes} classes, {sizes.sum() / 1e6:.1f} MB ({made}); "
          f"mean file {sizes.mean() / 1e3:.1f} KB, mean size {dims[:, 0].mean():.0f}x{dims[:, 1].mean():.0f}, "
          f"decode {decode_ms:.2f} ms/image ({PILLOW})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
