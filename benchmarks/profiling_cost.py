"""What stage timing costs the loader: the `pil` ImageNet training loader (RandomResizedCrop(224),
flip, batch 256, 2 persistent workers) with stage timing on against off, interleaved epochs
(ABBA) in one process, on the synthetic ImageNet-like set, with a second timing-off loader as
an A/A row: epochs here move by +-10%, so the A/A ratio says how far apart two equal loaders
come out. Target: on < 3% slower. Prints the ratios; writes JSON.

    OMP_NUM_THREADS=1 python benchmarks/profiling_cost.py [--reps 12] [--json PATH]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import _common

import fastdata
from fastdata import transforms as T
from fastdata.synthetic import make_imagenet_like

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    root = make_imagenet_like(HERE / "data" / "imagenet-like", n_images=2000, progress=True)
    spec = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip()])
    loaders = {}
    for name, on in (("off", False), ("on", True), ("off, again", False)):
        loader = fastdata.loader(str(root), batch_size=256, shuffle=True, num_workers=2, persistent_workers=True,
                                 transform=spec, device="cpu")
        assert loader._timing(on) or not on  # before the workers start: they take the flag with them
        loaders[name] = loader

    def epoch(loader) -> float:
        t = time.perf_counter()
        for _ in loader:
            pass
        return time.perf_counter() - t

    for loader in loaders.values():
        epoch(loader)  # workers started, page cache warm
    assert "stages" in loaders["on"].stats and loaders["on"].stats["stages"].get("images")
    times = _common.interleaved({name: (lambda ld=ld: epoch(ld)) for name, ld in loaders.items()}, args.reps)
    off, on, again = (_common.median(times[k]) for k in ("off", "on", "off, again"))
    print(f"stage timing off: {2000 / off:,.0f} images/s; on: {2000 / on:,.0f}; off again: {2000 / again:,.0f}",
          file=sys.stderr)
    print(f"throughput with timing on / off: {off / on:.3f} (target >= 0.97); A/A, off again / off: {off / again:.3f}")
    _common.write("profiling_cost", {"images_per_s": {"off": 2000 / off, "on": 2000 / on, "off, again": 2000 / again},
                                     "all": times, "ratio": off / on, "aa": off / again, "target": 0.97}, args.json)


if __name__ == "__main__":
    main()
