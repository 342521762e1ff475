"""`fastdata-demo`: fastdata's drop-in loader against torch's DataLoader on a synthetic set of
ready uint8 images, side by side, with a check that both deliver the same batches.

    fastdata-demo [--samples 4096] [--batch-size 256] [--workers 2] [--epochs 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

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


def _epoch_seconds(loader) -> float:
    t = time.perf_counter()
    for images, labels in loader:
        images[0, 0, 0, 0].item()  # the consumer touches the batch
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fastdata-demo", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=4096)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=3)
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
    t_torch, t_fast = [], []
    for epoch in range(args.epochs):
        t_torch.append(_epoch_seconds(torch_loader))
        t_fast.append(_epoch_seconds(fast_loader))
        print(f"  epoch {epoch + 1}/{args.epochs}: DataLoader {args.samples / t_torch[-1]:7.0f} img/s   "
              f"fastdata {args.samples / t_fast[-1]:7.0f} img/s", file=sys.stderr)
    best_torch, best_fast = min(t_torch), min(t_fast)
    print(f"{'loader':<22}{'images/s':>10}")
    print(f"{'torch DataLoader':<22}{args.samples / best_torch:>10.0f}")
    print(f"{'fastdata.loader':<22}{args.samples / best_fast:>10.0f}")
    print(f"speedup {best_torch / best_fast:.2f}x; same batches as DataLoader: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
