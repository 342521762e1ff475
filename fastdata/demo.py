"""`fastdata demo` (or `fastdata-demo`): fastdata against torch's DataLoader, side by side, on
data it makes.

1. Drop-in mode: a Dataset of ready uint8 images; checks both deliver the same batches.
2. Image mode: a synthetic ImageNet-like JPEG folder, RandomResizedCrop(224) + flip, the
   Dataset a PyTorch user writes today (Pillow) against `fastdata.loader(folder, ...)`.

Each side runs `--repeats` times, alternating with the other: each run is a fresh loader,
timed from before it is built to the last batch of its last epoch, so start-up counts as a
user pays it. Workers are not persistent: each epoch's end shuts them down, and the next
run starts only when no worker is left. Per side: the median images/s, min..max over the
runs, and the machine's ceiling for that pipeline (`fastdata.ceiling`); a figure above the
ceiling is flagged, not printed, and the exit status is 1 (as when the batches differ), with
a line naming the cause.

    fastdata demo [--samples 4096] [--images 512] [--batch-size 256] [--workers 2] [--epochs 3]
                  [--repeats 5] [--data DIR] [--debug]
"""

from __future__ import annotations

import argparse
import functools
import math
import multiprocessing
import os
import random
import statistics
import sys
import time
from typing import Any, Callable, Iterable

import numpy as np

from ._cli import (CommandError, Parser, add_debug, natural_int, not_a_directory, positive_int, run_alone,
                   run_command)
from ._cores import usable_cores
from .ceiling import ceiling, within
from .tunecache import cache_root


class ReadyImages:
    """A map-style dataset of decoded images, as a decode step leaves them: uint8 HWC arrays
    seen as CHW (a strided view), with the label. Pixel values encode the sample index, so a
    wrong or misplaced sample shows. 64 distinct arrays are reused to keep memory small."""

    def __init__(self, n: int = 4096, size: int = 224, distinct: int = 64) -> None:
        rng = np.random.default_rng(0)
        self.n = n
        self.arrays = [rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for _ in range(distinct)]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return self.arrays[i % len(self.arrays)].transpose(2, 0, 1), i


def rrc_params(w: int, h: int, rng: random.Random) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop.get_params written out (there is no CPU torchvision)."""
    area = w * h
    log_ratio = (math.log(3 / 4), math.log(4 / 3))
    for _ in range(10):
        target = area * rng.uniform(0.08, 1.0)
        aspect = math.exp(rng.uniform(*log_ratio))
        cw, ch = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
        if 0 < cw <= w and 0 < ch <= h:
            return rng.randint(0, w - cw), rng.randint(0, h - ch), cw, ch
    side = min(w, h)
    return (w - side) // 2, (h - side) // 2, side, side


class PillowRRC:
    """The Dataset a PyTorch user writes today: open, RGB, RandomResizedCrop, flip, to CHW."""

    def __init__(self, files: list, size: int = 224) -> None:
        self.files, self.size = files, size

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        path, label = self.files[i]
        return pillow_rrc(path, self.size, random.Random(i)), label


def pillow_rrc(fp, size: int, rng: random.Random):
    """An image file (a path or a binary stream) as a PyTorch user's transform leaves it:
    RGB, RandomResizedCrop(size), random horizontal flip, uint8 CHW tensor."""
    import torch
    from PIL import Image

    with Image.open(fp) as img:
        img = img.convert("RGB")
        x, y, w, h = rrc_params(img.width, img.height, rng)
        img = img.resize((size, size), Image.BILINEAR, box=(x, y, x + w, y + h))
    if rng.random() < 0.5:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    return torch.from_numpy(np.array(img).transpose(2, 0, 1))


_NAME = 28  # the width of the loader column
# How each run is timed, said once in the output.
_HOW = ("each run a fresh loader, timed from before it is built to its last batch (worker start-up "
        "included: persistent_workers=False, so each epoch starts its workers and its end shuts them down)")


def _run(make: Callable[[], Iterable[Any]], epochs: int) -> tuple[int, float]:
    """(images, seconds) of one run: a loader made by `make`, iterated for `epochs` epochs,
    timed from before it is built to its last batch. Its workers are gone when this returns."""
    from ._collate import batch_len  # imports torch, which a help page does without

    images = 0
    before = {p.pid for p in multiprocessing.active_children()}
    t = time.perf_counter()
    loader = make()
    for _ in range(epochs):
        for batch in loader:
            batch[0][0, 0, 0, 0].item()  # the consumer touches the batch
            images += batch_len(batch)
    seconds = time.perf_counter() - t
    del loader
    _await_no_workers(before)
    return images, seconds


def _await_no_workers(before: set[int], limit: float = 30.0) -> None:
    """Waits until no child process of this process that was not alive `before` a run is alive
    (a pass over non-persistent workers shuts them down at its end; this checks it), so nothing
    of one run overlaps the next run's timed window. (Children the caller had before, a pool of
    its own, are not the run's.)"""
    deadline = time.monotonic() + limit
    while {p.pid for p in multiprocessing.active_children()} - before:  # it also reaps those that ended
        if time.monotonic() > deadline:
            raise RuntimeError(f"worker processes still alive {limit:.0f} s after a run ended")
        time.sleep(0.01)


def side_row(name: str, rates: list[float], limit: float) -> str:
    """A side's result row: its median images/s, min..max over the runs and the ceiling, or,
    when a figure is above the ceiling, the flag in place of the figures."""
    if not all(within(r, limit) for r in rates):
        return f"{name:<{_NAME}}(above the machine's ceiling of {limit:.0f} images/s: not a valid measurement)"
    spread = f"{min(rates):.0f}..{max(rates):.0f}"
    return f"{name:<{_NAME}}{statistics.median(rates):>9.0f}  {spread:>13}{limit:>10.0f}"


def run_cell(name: str, rate: float, limit: float) -> str:
    """One run's figure for the progress line, or the flag."""
    if not within(rate, limit):
        return f"{name} (above the machine's ceiling of {limit:.0f} images/s: not a valid measurement)"
    return f"{name} {rate:7.0f} img/s"


def _side_by_side(sides: list[tuple[str, Callable[[int], Iterable[Any]]]], workers: int, epochs: int,
                  repeats: int, ceiling_batches: int) -> tuple[str, bool]:
    """Measures the two sides (baseline first): their ceilings, then `repeats` runs of each,
    alternating. Prints the table; returns (the speedup line, whether every figure is valid)."""
    limits = [ceiling(make, batches=ceiling_batches) for _, make in sides]
    rates: list[list[float]] = [[] for _ in sides]
    for r in range(repeats):
        cells = []
        for (name, make), got, limit in zip(sides, rates, limits):
            images, seconds = _run(functools.partial(make, workers), epochs)
            got.append(images / seconds)
            cells.append(run_cell(name, got[-1], limit))
        print(f"  run {r + 1}/{repeats}: " + "   ".join(cells), file=sys.stderr)
    print(f"{'loader':<{_NAME}}{'median':>9}  {'min..max':>13}{'ceiling':>10}  (images/s, {repeats} runs)")
    for (name, _), got, limit in zip(sides, rates, limits):
        print(side_row(name, got, limit))
    valid = all(within(r, limit) for got, limit in zip(rates, limits) for r in got)
    if not valid:
        return "speedup: none (a figure above the machine's ceiling)", False
    pairs = [f / b for b, f in zip(*rates)]
    speedup = statistics.median(rates[1]) / statistics.median(rates[0])
    return f"speedup {speedup:.2f}x (paired runs {min(pairs):.2f}..{max(pairs):.2f}x)", True


EXAMPLE = "fastdata demo --repeats 3"


def _image_count(text: str) -> int:
    """An argparse type: 0, or enough images for the synthetic set's 10 classes."""
    value = natural_int(text)
    if 0 < value < 10:
        raise argparse.ArgumentTypeError(f"should be 0 (skip) or at least 10 (one image a class), but got {text!r}")
    return value


def add_arguments(ap: Parser) -> None:
    """The command's arguments, on its parser (`fastdata-demo`, or `fastdata demo`)."""
    ap.add_argument("--samples", metavar="N", type=positive_int, default=4096,
                    help="ready images of the drop-in part (default 4096)")
    ap.add_argument("--batch-size", metavar="N", type=positive_int, default=256,
                    help="images a batch, both parts (default 256)")
    ap.add_argument("--workers", metavar="N", type=natural_int, default=2,
                    help="num_workers of every loader (default 2)")
    ap.add_argument("--epochs", metavar="N", type=positive_int, default=3, help="epochs of each timed run (default 3)")
    ap.add_argument("--repeats", metavar="N", type=positive_int, default=5,
                    help="timed runs of each side, alternating (default 5)")
    ap.add_argument("--images", metavar="N", type=_image_count, default=512,
                    help="synthetic JPEGs of the image-mode part, in 10 classes: 0 skips it, else at least 10 "
                         "(default 512)")
    # its own folder (the README's set keeps its 2,000), in fastdata's cache; None without one
    cache = cache_root()
    ap.add_argument("--data", metavar="DIR", default=None if cache is None else str(cache / "demo-images"),
                    help="where the synthetic JPEGs are made, or found when made before "
                         "(default ~/.cache/fastdata/demo-images, in $FASTDATA_CACHE where it is set)")
    add_debug(ap)
    ap.set_defaults(run=functools.partial(run, ap))


def run(ap: Parser, args: argparse.Namespace) -> int:
    """The command on parsed arguments; its exit status (1 when a figure is not valid or the
    batches differ)."""
    return run_command(ap.prog, functools.partial(_demo, args), args.debug)


def main(argv: list[str] | None = None) -> int:
    """`fastdata-demo`: the same command as `fastdata demo`."""
    return run_alone("fastdata-demo", __doc__, EXAMPLE, add_arguments, argv)


def _demo(args: argparse.Namespace) -> int:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.images and args.data is None:
        raise CommandError("there is no cache folder for the synthetic images ($FASTDATA_CACHE is not set and this "
                           "user has no home directory): pass --data DIR, or --images 0")
    blocked = not_a_directory(args.data) if args.images else None
    if blocked is not None:  # said now, not after the drop-in part's minutes
        raise CommandError(f"--data {args.data!r} cannot hold the images: {str(blocked)!r} is not a directory")

    import torch
    from torch.utils.data import DataLoader

    import fastdata
    from fastdata import _collate

    torch.set_num_threads(1)
    data = ReadyImages(args.samples)
    pin = torch.accelerator.is_available()

    def loaders(build: Callable[..., Iterable[Any]]) -> Callable[[int], Iterable[Any]]:
        return lambda workers: build(data, generator=torch.Generator().manual_seed(0), batch_size=args.batch_size,
                                     shuffle=True, num_workers=workers, pin_memory=pin, persistent_workers=False)

    print(f"fastdata {fastdata.__version__} ({'native' if _collate.NATIVE else 'Python fallback'} "
          f"collation), torch {torch.__version__}, {usable_cores()} usable cores", file=sys.stderr)
    print(f"{args.samples} ready 3x224x224 uint8 images, batch {args.batch_size}, {args.workers} workers; "
          f"{args.repeats} runs of {args.epochs} epochs each, alternating; {_HOW}", file=sys.stderr)
    same = all(
        torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        for a, b in zip(DataLoader(data, generator=torch.Generator().manual_seed(1), batch_size=args.batch_size, shuffle=True),
                        fastdata.loader(data, generator=torch.Generator().manual_seed(1), batch_size=args.batch_size, shuffle=True))
    )
    sides = [("torch DataLoader", loaders(DataLoader)), ("fastdata.loader", loaders(fastdata.loader))]
    speedup, valid = _side_by_side(sides, args.workers, args.epochs, args.repeats, _ceiling_batches(args.batch_size))
    print(f"{speedup}; same batches as DataLoader: {'yes' if same else 'NO'}")
    if args.images > 0:
        valid = _image_mode(args) and valid
    if not same:
        raise CommandError("fastdata.loader's batches differ from DataLoader's")
    if not valid:
        raise CommandError("a figure is above the machine's ceiling for its pipeline: not a valid measurement")
    return 0


def _ceiling_batches(batch_size: int) -> int:
    """Batches a ceiling counts (after as many uncounted): about 1,000 images, at least 4, so the
    uncounted ones cover a loader's ring of batch slots (`fastdata._buffers`)."""
    return max(4, -(-1024 // batch_size))


def _image_mode(args) -> bool:
    """The image-mode part; whether its figures are valid."""
    from torch.utils.data import DataLoader

    import fastdata
    from fastdata import transforms as T
    from fastdata._pillow import PILLOW
    from fastdata.synthetic import make_file_list, make_imagenet_like

    root = make_imagenet_like(args.data, n_images=args.images, progress=True)
    per_epoch = math.ceil(args.images / args.batch_size)
    print(f"\nimage mode: {args.images} synthetic JPEGs, RandomResizedCrop(224) + flip, batch {args.batch_size}, "
          f"{args.workers} workers; {PILLOW}; timed as above: with {per_epoch} batch{'es' if per_epoch > 1 else ''} "
          "an epoch, starting the workers weighs on the rates, below the ceiling (the cores over the CPU an image), "
          "as on every short epoch", file=sys.stderr)
    common = dict(batch_size=args.batch_size, shuffle=True, persistent_workers=False)

    def torch_loader(workers: int) -> Iterable[Any]:  # the file list is part of building it, as for fastdata
        return DataLoader(PillowRRC(make_file_list(root)), num_workers=workers, **common)

    def fast_loader(workers: int) -> Iterable[Any]:
        return fastdata.loader(str(root), transform=T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip()]),
                               device="cpu", num_workers=workers, **common)

    backend = fast_loader(0).backend
    sides = [("DataLoader + Pillow", torch_loader), (f"fastdata.loader ({backend})", fast_loader)]
    speedup, valid = _side_by_side(sides, args.workers, args.epochs, args.repeats, _ceiling_batches(args.batch_size))
    print(f"{speedup}; images/s of decode + RandomResizedCrop + flip")
    return valid


if __name__ == "__main__":
    raise SystemExit(main())
