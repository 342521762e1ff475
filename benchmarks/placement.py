"""Where the pixel augmentations should run on the machine at hand: the ImageNet training pipeline
(RandomResizedCrop(224), flip, ColorJitter(0.4, 0.4, 0.4, 0.1), TrivialAugment, Normalize to
bfloat16) with placement="cpu" (Pillow lowering in the 2 workers) against placement="gpu"
(Kornia lowering in the device stage, on the target device: here the CPU), batch 256, on the
synthetic ImageNet-like set. Interleaved epochs (ABBA) in one process; prints images/s and
the ratio; writes JSON. This is the measurement behind placement="auto"'s rule in the README.

    OMP_NUM_THREADS=1 python benchmarks/placement.py [--images 2000] [--reps 4] [--json PATH]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import _common
import torch

import fastdata
from fastdata import transforms as T
from fastdata.synthetic import make_imagenet_like

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--root", default=str(HERE / "data" / "imagenet-like"))
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    make_imagenet_like(args.root, n_images=args.images, progress=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    spec = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ColorJitter(0.4, 0.4, 0.4, 0.1),
                      T.TrivialAugment(), T.Normalize(T.IMAGENET_MEAN, T.IMAGENET_STD)])
    loaders = {p: fastdata.loader(args.root, batch_size=256, shuffle=True, num_workers=2, persistent_workers=True,
                                  transform=spec, dtype=torch.bfloat16, device=device, placement=p)
               for p in ("cpu", "gpu")}

    def epoch(loader) -> float:
        t = time.perf_counter()
        for images, _ in loader:
            pass
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t

    for loader in loaders.values():  # warm: workers started, page cache
        epoch(loader)
    print(f"{args.images} images, batch 256, 2 workers, device {device}, {args.reps} interleaved epochs each",
          file=sys.stderr)
    times = _common.interleaved({p: (lambda ld=ld: epoch(ld)) for p, ld in loaders.items()}, args.reps)
    rate = {p: args.images / _common.median(t) for p, t in times.items()}
    for p, r in rate.items():
        print(f"placement={p!r:<6} {r:7.0f} images/s")
    print(f"gpu placement vs cpu placement on device {device}: {rate['gpu'] / rate['cpu']:.2f}x")
    _common.write("placement", {"device": device, "images": args.images, "images_per_s": rate, "all": times,
                                "ratio_gpu_vs_cpu": rate["gpu"] / rate["cpu"]}, args.json)


if __name__ == "__main__":
    main()
