"""Persistent workers that run ahead into the next epoch, in a training loop, on short epochs.

DataLoader hands its workers new batches only within an epoch: at each epoch's end they idle
while the consumer works through the batches still queued, and the next epoch's first batch is
made from scratch while the consumer waits. fastdata's `pil` and `wds` backends with
`persistent_workers=True` hand them the next epoch's batches before this one ends. That matters
where epochs are short against the step (small datasets, fine-tuning); on ImageNet's 5,000
batches an epoch it is a rounding error, and with no consumer work (a loader timed alone) the
workers never idle, so it gains nothing.

The loop: 2,000 synthetic ImageNet-like JPEGs, RandomResizedCrop(224) + flip, batch 256 (8
batches an epoch), 2 persistent workers, and a simulated step of --step-ms a batch (the CPU is
free meanwhile, as while a GPU computes). Candidates, each in blocks of consecutive epochs
(the first of each block discarded: a run-ahead loader would have made its head start on the
other candidate's time), blocks in ABBA order:

- DataLoader + Pillow-SIMD with a hand-written RandomResizedCrop (PillowRRC);
- fastdata `pil` with the run-ahead turned off (the ablation);
- fastdata `pil` as shipped.

Prints images/s (epochs' images over their wall time, step included) and the ratios with 95%
bootstrap intervals; writes JSON.

    OMP_NUM_THREADS=1 python benchmarks/run_ahead.py [--step-ms 150] [--rounds 4] [--epochs 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import _common
from torch.utils.data import DataLoader

import fastdata
from fastdata import transforms as T
from fastdata.backends.pil import PilLoader
from fastdata.demo import PillowRRC
from fastdata.synthetic import make_file_list, make_imagenet_like

HERE = Path(__file__).resolve().parent
BATCH, WORKERS, SIZE = 256, 2, 224


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--step-ms", type=float, default=150)
    ap.add_argument("--rounds", type=int, default=4, help="blocks of each candidate, in ABBA order")
    ap.add_argument("--epochs", type=int, default=3, help="timed epochs a block")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    root = make_imagenet_like(HERE / "data" / "imagenet-like", n_images=2000, progress=True)
    spec = T.Compose([T.RandomResizedCrop(SIZE), T.RandomHorizontalFlip()])

    def fastdata_pil():
        return fastdata.loader(str(root), batch_size=BATCH, shuffle=True, num_workers=WORKERS,
                               persistent_workers=True, transform=spec, device="cpu")

    PilLoader._run_ahead = False
    try:
        ablation = fastdata_pil()
    finally:
        PilLoader._run_ahead = True
    loaders = {
        "DataLoader + Pillow-SIMD": DataLoader(PillowRRC(make_file_list(root), SIZE), batch_size=BATCH, shuffle=True,
                                               num_workers=WORKERS, persistent_workers=True),
        "fastdata pil, run-ahead off": ablation,
        "fastdata pil": fastdata_pil(),
    }
    step = args.step_ms / 1e3

    def epoch(loader) -> tuple[float, int]:
        t, n = time.perf_counter(), 0
        for _, labels in loader:
            n += len(labels)
            time.sleep(step)
        return time.perf_counter() - t, n

    print(f"2,000 images, batch {BATCH}, {WORKERS} persistent workers, a {args.step_ms:.0f} ms step a batch; "
          f"{args.rounds} blocks of 1 + {args.epochs} epochs a candidate", file=sys.stderr)
    times: dict[str, list[float]] = {name: [] for name in loaders}
    names = list(loaders)
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else reversed(names):
            epoch(loaders[name])  # the block's first epoch, not counted
            for _ in range(args.epochs):
                seconds, n = epoch(loaders[name])
                times[name].append(seconds / n * 2000)  # seconds per 2,000 images
            print(f"  block {r + 1}/{args.rounds}  {name:<30} {2000 / _common.median(times[name][-args.epochs:]):7.0f} "
                  f"images/s", file=sys.stderr)
    rates = {name: 2000 / _common.median(t) for name, t in times.items()}
    fast = rates["fastdata pil"]
    print(f"\n{'pipeline':<32}{'images/s':>10}{'fastdata pil is':>17}{'95% interval':>16}")
    ratios = {}
    for name, rate in rates.items():
        ci = _common.ratio_ci(times[name], times["fastdata pil"])
        ratios[name] = {"ratio": fast / rate, "ci95": ci}
        print(f"{name:<32}{rate:>10.0f}{fast / rate:>16.2f}x{ci[0]:>10.2f}-{ci[1]:.2f}")
    print(f"step alone: {BATCH / step:,.0f} images/s")
    _common.write("run_ahead", {"step_ms": args.step_ms, "batch": BATCH, "workers": WORKERS, "images_per_s": rates,
                                "ratios": ratios, "seconds_per_2000": times}, args.json)


if __name__ == "__main__":
    main()
