"""What stage timing costs a loader, with timing on against off: interleaved epochs (ABBA) in one
process, with a second timing-off loader as an A/A row (epochs move by several percent from
one to the next, so the A/A ratio says how far apart two equal loaders come out). The ratio
is the median epoch of both timing-off loaders over the timing-on one's, with a 95% bootstrap
interval. Target: on < 3% slower. Two loaders:

- image mode: the `pil` ImageNet training loader (RandomResizedCrop(224), flip, batch 256,
  2 persistent workers) on the synthetic ImageNet-like set;
- drop-in: `fastdata.loader(dataset)` over ready uint8 images (HWC seen as CHW), batch 64,
  2 persistent workers: short batches, so the per-batch cost of the timing shows most.

And the drop-in's timing alone, where epoch noise cannot hide it: one collation of 64 of those
images timed against untimed, 400 times each in turns. Prints the ratios; writes JSON.

    OMP_NUM_THREADS=1 python benchmarks/profiling_cost.py [--reps 12] [--json PATH]
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
from fastdata._collate import RingCollate
from fastdata.demo import ReadyImages
from fastdata.synthetic import make_imagenet_like

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    root = make_imagenet_like(HERE / "data" / "imagenet-like", n_images=2000, progress=True)
    spec = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip()])
    ready = ReadyImages(8192, size=96)
    makers = {
        "image mode (pil)": lambda: fastdata.loader(str(root), batch_size=256, shuffle=True, num_workers=2,
                                                    persistent_workers=True, transform=spec, device="cpu"),
        "drop-in": lambda: fastdata.loader(ready, batch_size=64, shuffle=True, num_workers=2, persistent_workers=True),
    }
    report = {}
    for what, make in makers.items():
        loaders = {}
        for name, on in (("off", False), ("on", True), ("off, again", False)):
            loader = make()
            assert loader.set_stage_timing(on) or not on  # before the workers start: they take the flag with them
            loaders[name] = loader
        images = len(loaders["off"].dataset) if what == "drop-in" else 2000
        for loader in loaders.values():
            _common.epoch_seconds(loader)  # workers started, page cache warm
        assert loaders["on"].stage_seconds().get("images")  # the timing ran
        runs = {name: (lambda ld=ld: _common.epoch_seconds(ld)) for name, ld in loaders.items()}
        times = _common.interleaved(runs, args.reps)
        off, on, again = (_common.median(times[k]) for k in ("off", "on", "off, again"))
        # on against both timing-off loaders' epochs together, with a 95% bootstrap interval
        offs = times["off"] + times["off, again"]
        ratio, ci = _common.median(offs) / on, _common.ratio_ci(offs, times["on"])
        aa, aa_ci = again / off, _common.ratio_ci(times["off, again"], times["off"])
        print(f"{what}: stage timing off: {images / off:,.0f} images/s; on: {images / on:,.0f}; "
              f"off again: {images / again:,.0f}", file=sys.stderr)
        print(f"{what}: throughput with timing on / off: {ratio:.3f} (95% interval {ci[0]:.3f}-{ci[1]:.3f}; "
              f"target >= 0.97); A/A, off / off again: {aa:.3f} ({aa_ci[0]:.3f}-{aa_ci[1]:.3f})")
        report[what] = {"images_per_s": {"off": images / off, "on": images / on, "off, again": images / again},
                        "all": times, "ratio": ratio, "ci95": ci, "aa": aa, "aa_ci95": aa_ci}
        del loaders
    # The drop-in's timing on its own, where epoch noise cannot hide it: a collation of 64 of
    # those images, timed against untimed, in turns, in this process.
    collate = RingCollate(slots=4)
    batch = [ready[i] for i in range(64)]
    timing = torch.zeros((2, 5), dtype=torch.float64)
    costs: dict[str, list[float]] = {"off": [], "on": []}
    for r in range(400):
        for on in (False, True) if r % 2 == 0 else (True, False):
            collate.timing = timing if on else None
            t = time.perf_counter()
            collate(batch)
            costs["on" if on else "off"].append(time.perf_counter() - t)
    off_us, on_us = (1e6 * _common.median(costs[k]) for k in ("off", "on"))
    per_batch = 1e3 * 64 / report["drop-in"]["images_per_s"]["off"] * 2  # ms a batch takes a worker (2 workers)
    print(f"drop-in collation of 64 images: {off_us:.0f} us untimed, {on_us:.0f} us timed: {on_us - off_us:+.0f} us "
          f"a batch, {100 * (on_us - off_us) / 1e3 / per_batch:.2f}% of the {per_batch:.2f} ms a batch takes a worker")
    report["drop-in"]["collate_us"] = {"off": off_us, "on": on_us, "batch_ms": per_batch}
    _common.write("profiling_cost", {"loaders": report, "target": 0.97}, args.json)


if __name__ == "__main__":
    main()
