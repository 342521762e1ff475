"""Collating 256 uint8 images of 3x224x224 (38.5 MB), given as HWC arrays viewed as CHW.

Baseline: `default_collate`, then `pin_memory()` (with no accelerator, CPU torch cannot pin, so
the baseline pays what pin_memory costs there: a fresh buffer and a copy). fastdata: native
collation into a reused ring slot (pinned when an accelerator exists). Also shown: native into
a fresh buffer each time, and a plain copy of a contiguous batch into a reused buffer (the
ceiling). Prints medians and the ratio to the baseline, all measured interleaved in one run.

    OMP_NUM_THREADS=1 python benchmarks/collate.py [--reps 15] [--json PATH]
"""

from __future__ import annotations

import argparse
import sys
import time

import _common  # noqa: F401  (sets OMP_NUM_THREADS before torch loads)
import numpy as np
import torch
from torch.utils.data import default_collate

from fastdata._collate import RingCollate, collate, default_threads


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    rng = np.random.default_rng(0)
    hwc = [rng.integers(0, 256, (224, 224, 3), dtype=np.uint8) for _ in range(args.batch)]
    views = [a.transpose(2, 0, 1) for a in hwc]
    contiguous = torch.from_numpy(np.stack(views))
    can_pin = torch.accelerator.is_available()
    ring = RingCollate(slots=2, pin=can_pin)
    ceiling_out = torch.empty_like(contiguous)
    reference = default_collate(views)

    def baseline() -> float:
        t = time.perf_counter()
        batch = default_collate(views)
        pinned = batch.pin_memory() if can_pin else torch.empty_like(batch).copy_(batch)
        dt = time.perf_counter() - t
        del batch, pinned
        return dt

    def native_ring() -> float:
        t = time.perf_counter()
        batch = ring(views)
        dt = time.perf_counter() - t
        assert torch.equal(batch, reference)
        return dt

    def native_fresh() -> float:
        t = time.perf_counter()
        collate(views)
        return time.perf_counter() - t

    def memcpy_ceiling() -> float:
        t = time.perf_counter()
        ceiling_out.copy_(contiguous)
        return time.perf_counter() - t

    runs = {
        "default_collate+pin": baseline,
        "fastdata ring": native_ring,
        "fastdata fresh buffer": native_fresh,
        "memcpy (ceiling)": memcpy_ceiling,
    }
    for fn in runs.values():  # warm-up: the ring's slots are faulted in once
        fn(), fn()
    print(f"collating {args.batch} x 3x224x224 uint8 HWC->CHW views, {args.reps} interleaved rounds, "
          f"{default_threads()} copy threads", file=sys.stderr)
    times = _common.interleaved(runs, args.reps)
    base = _common.median(times["default_collate+pin"])
    rows = {}
    print(f"{'method':<24}{'median ms':>12}{'speedup':>10}")
    for name, ts in times.items():
        med = _common.median(ts)
        rows[name] = {"median_ms": med * 1e3, "all_ms": [t * 1e3 for t in ts], "speedup": base / med}
        print(f"{name:<24}{med * 1e3:>12.2f}{base / med:>9.2f}x")
    ratio = rows["fastdata ring"]["speedup"]
    print(f"\nfastdata ring vs default_collate+pin_memory: {ratio:.2f}x (target >= 4x)")
    _common.write("collate", {"rows": rows, "ratio": ratio, "target": 4.0, "pinned": can_pin}, args.json)


if __name__ == "__main__":
    main()
