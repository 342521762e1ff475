"""`fastdata-demo`: fastdata against torch's DataLoader, side by side, on data it makes.

1. Drop-in mode: a Dataset of ready uint8 images; checks both deliver the same batches.
2. Image mode: a synthetic ImageNet-like JPEG folder, RandomResizedCrop(224) + flip, the
   Dataset a PyTorch user writes today (Pillow) against `fastdata.loader(folder, ...)`.

    fastdata-demo [--samples 4096] [--images 512] [--batch-size 256] [--workers 2] [--epochs 3]
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
import time
from pathlib import Path

import numpy as np


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


def _epoch_seconds(loader) -> float:
    t = time.perf_counter()
    for images, labels in loader:
        images[0, 0, 0, 0].item()  # the consumer touches the batch
    return time.perf_counter() - t


def _side_by_side(baseline: str, torch_loader, fast_loader, n: int, epochs: int) -> float:
    """Alternates epochs of the two loaders, prints each and the best of each; the speedup."""
    t_torch, t_fast = [], []
    for epoch in range(epochs):
        t_torch.append(_epoch_seconds(torch_loader))
        t_fast.append(_epoch_seconds(fast_loader))
        print(f"  epoch {epoch + 1}/{epochs}: {baseline} {n / t_torch[-1]:7.0f} img/s   "
              f"fastdata ({fast_loader.backend}) {n / t_fast[-1]:7.0f} img/s", file=sys.stderr)
    best_torch, best_fast = min(t_torch), min(t_fast)
    print(f"{'loader':<22}{'images/s':>10}")
    print(f"{baseline:<22}{n / best_torch:>10.0f}")
    print(f"{'fastdata.loader':<22}{n / best_fast:>10.0f}")
    return best_torch / best_fast


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fastdata-demo", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=4096)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--images", type=int, default=512, help="synthetic JPEGs for the image-mode part (0: skip it)")
    ap.add_argument("--data", default=str(Path.home() / ".cache" / "fastdata" / "demo-imagenet-like"))
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    import torch
    from torch.utils.data import DataLoader

    import fastdata
    from fastdata import _collate

    torch.set_num_threads(1)
    data = ReadyImages(args.samples)
    common = dict(batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                  pin_memory=torch.accelerator.is_available(), persistent_workers=args.workers > 0)
    torch_loader = DataLoader(data, generator=torch.Generator().manual_seed(0), **common)
    fast_loader = fastdata.loader(data, generator=torch.Generator().manual_seed(0), **common)

    print(f"fastdata {fastdata.__version__} ({'native' if _collate.NATIVE else 'Python fallback'} "
          f"collation), torch {torch.__version__}", file=sys.stderr)
    print(f"{args.samples} ready 3x224x224 uint8 images, batch {args.batch_size}, "
          f"{args.workers} workers, {args.epochs} epochs each, interleaved", file=sys.stderr)
    same = all(
        torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        for a, b in zip(DataLoader(data, generator=torch.Generator().manual_seed(1), batch_size=args.batch_size, shuffle=True),
                        fastdata.loader(data, generator=torch.Generator().manual_seed(1), batch_size=args.batch_size, shuffle=True))
    )
    speedup = _side_by_side("torch DataLoader", torch_loader, fast_loader, args.samples, args.epochs)
    print(f"speedup {speedup:.2f}x; same batches as DataLoader: {'yes' if same else 'NO'}")
    if args.images > 0:
        _image_mode(args)
    return 0 if same else 1


def _image_mode(args) -> None:
    from torch.utils.data import DataLoader

    import fastdata
    from fastdata import transforms as T
    from fastdata._pillow import PILLOW
    from fastdata.synthetic import make_file_list, make_imagenet_like

    root = make_imagenet_like(args.data, n_images=args.images, progress=True)
    files = make_file_list(root)
    print(f"\nimage mode: {len(files)} synthetic JPEGs, RandomResizedCrop(224) + flip, batch {args.batch_size}, "
          f"{args.workers} workers; {PILLOW}", file=sys.stderr)
    common = dict(batch_size=args.batch_size, shuffle=True, num_workers=args.workers, persistent_workers=args.workers > 0)
    torch_loader = DataLoader(PillowRRC(files), **common)
    fast_loader = fastdata.loader(str(root), transform=T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip()]),
                                  device="cpu", **common)
    speedup = _side_by_side("DataLoader + Pillow", torch_loader, fast_loader, len(files), args.epochs)
    print(f"speedup {speedup:.2f}x (images/s, decode + RandomResizedCrop + flip)")


if __name__ == "__main__":
    raise SystemExit(main())
