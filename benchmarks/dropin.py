"""fastdata's drop-in loader against torch's DataLoader, end to end, same arguments.

Headline: ready uint8 images (HWC arrays seen as CHW), batch 256, 2 workers, pin_memory=True,
shuffled; one fresh epoch per round as a training loop runs it (target: >= 1.3x). Then the
configurations of the test matrix at a smaller scale (target: never slower, within noise).
Every pair is measured interleaved in one run; ratios are DataLoader time / fastdata time.

The matrix epochs are short, so a shared host's noise is of the size of the differences:
each configuration runs --matrix-reps interleaved epochs a side, and is reported by the median
epoch, by the fastest one (noise only ever adds time, as timeit's docs argue), and by a 95%
bootstrap interval of the ratio of medians. "Never slower" is read as: no configuration's
interval lies wholly below 1. An A/A row, DataLoader against a second DataLoader, measures the
noise floor in the same run.

    OMP_NUM_THREADS=1 python benchmarks/dropin.py [--samples 10240] [--reps 5] [--matrix-reps 20]
                                                  [--no-matrix] [--json PATH]
"""

from __future__ import annotations

import argparse
import sys

import _common
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

import fastdata
from fastdata.demo import ReadyImages


class DictSamples(Dataset):
    def __len__(self):
        return 4096

    def __getitem__(self, i):
        return {"x": torch.full((16,), float(i)), "y": i, "name": f"s{i}"}


class Tensors(Dataset):
    def __init__(self):
        self.t = torch.randn(64, 3, 64, 64)

    def __len__(self):
        return 4096

    def __getitem__(self, i):
        return self.t[i % 64]


class Stream(IterableDataset):
    def __init__(self):
        self.a = np.random.default_rng(0).integers(0, 256, (64, 3, 64, 64), dtype=np.uint8)

    def __iter__(self):
        info = get_worker_info()
        w, n = (info.id, info.num_workers) if info else (0, 1)
        for i in range(w, 4096, n):
            yield self.a[i % 64], i



def _pair(dataset, reps: int, aa: bool = False, **kw) -> dict:
    make_torch = lambda: DataLoader(dataset, generator=torch.Generator().manual_seed(0), **kw)  # noqa: E731
    make_fast = make_torch if aa else lambda: fastdata.loader(dataset, generator=torch.Generator().manual_seed(0), **kw)  # noqa: E731
    persistent = kw.get("persistent_workers", False)
    loaders = {"DataLoader": make_torch(), "fastdata": make_fast()}
    if persistent:  # warm both: workers started once, as a multi-epoch run has them
        for ld in loaders.values():
            _common.epoch_seconds(ld)
    runs = {name: (lambda ld=ld: _common.epoch_seconds(ld)) for name, ld in loaders.items()}
    times = _common.interleaved(runs, reps)
    t_torch, t_fast = _common.median(times["DataLoader"]), _common.median(times["fastdata"])
    return {"DataLoader_s": t_torch, "fastdata_s": t_fast, "ratio": t_torch / t_fast,
            "ratio_fastest": min(times["DataLoader"]) / min(times["fastdata"]),
            "ci95": _common.ratio_ci(times["DataLoader"], times["fastdata"]), "all": times}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=10240)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--matrix-reps", type=int, default=20)
    ap.add_argument("--no-matrix", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    images = ReadyImages(args.samples)
    print(f"headline: {args.samples} ready images, batch 256, 2 workers, pin_memory=True, "
          f"{args.reps} interleaved epochs each", file=sys.stderr)
    report: dict = {"headline": {}, "matrix": {}}
    for persistent in (False, True):
        r = _pair(images, args.reps, batch_size=256, shuffle=True, num_workers=2, pin_memory=True,
                  persistent_workers=persistent)
        key = f"persistent_workers={persistent}"
        r["images_per_s"] = {"DataLoader": args.samples / r["DataLoader_s"], "fastdata": args.samples / r["fastdata_s"]}
        report["headline"][key] = r
        print(f"  {key:<28} DataLoader {r['images_per_s']['DataLoader']:7.0f} img/s   "
              f"fastdata {r['images_per_s']['fastdata']:7.0f} img/s   {r['ratio']:.2f}x", file=sys.stderr)

    if not args.no_matrix:
        small = ReadyImages(2048, size=96)
        configs = {
            "images w0": (small, dict(batch_size=64, shuffle=True)),
            "images w2": (small, dict(batch_size=64, shuffle=True, num_workers=2)),
            "images w2 persistent": (small, dict(batch_size=64, shuffle=True, num_workers=2, persistent_workers=True)),
            "images w2 drop_last": (small, dict(batch_size=100, drop_last=True, num_workers=2)),
            "images w0 no batching": (small, dict(batch_size=None)),
            "dict w0": (DictSamples(), dict(batch_size=64, shuffle=True)),
            "dict w2": (DictSamples(), dict(batch_size=64, num_workers=2)),
            "tensors w0": (Tensors(), dict(batch_size=64)),
            "tensors w2 pin": (Tensors(), dict(batch_size=64, num_workers=2, pin_memory=True)),
            "iterable w2": (Stream(), dict(batch_size=64, num_workers=2)),
            "custom collate w2": (small, dict(batch_size=64, num_workers=2, collate_fn=lambda b: len(b))),
            "A/A: DataLoader vs DataLoader, dict w0": (DictSamples(), dict(batch_size=64, shuffle=True, aa=True)),
        }
        print(f"matrix: {len(configs)} configurations, {args.matrix_reps} interleaved epochs each", file=sys.stderr)
        for i, (name, (ds, kw)) in enumerate(configs.items()):
            r = _pair(ds, args.matrix_reps, **kw)
            report["matrix"][name] = r
            print(f"  [{i + 1}/{len(configs)}] {name:<24} DataLoader {r['DataLoader_s'] * 1e3:8.1f} ms   "
                  f"fastdata {r['fastdata_s'] * 1e3:8.1f} ms   {r['ratio']:.2f}x (95% interval "
                  f"{r['ci95'][0]:.2f}-{r['ci95'][1]:.2f})", file=sys.stderr)

    head = report["headline"]["persistent_workers=False"]["ratio"]
    print(f"\n{'configuration':<40}{'DataLoader ms':>14}{'fastdata ms':>13}{'ratio':>8}{'fastest':>9}"
          f"{'95% interval':>15}")
    for section in ("headline", "matrix"):
        for name, r in report[section].items():
            print(f"{name:<40}{r['DataLoader_s'] * 1e3:>14.1f}{r['fastdata_s'] * 1e3:>13.1f}{r['ratio']:>7.2f}x"
                  f"{r['ratio_fastest']:>8.2f}x{r['ci95'][0]:>9.2f}-{r['ci95'][1]:.2f}")
    print(f"\nheadline (2 workers, pin_memory, fresh workers per epoch): {head:.2f}x (target >= 1.3x)")
    if report["matrix"]:
        # "never slower": no configuration whose whole interval lies below 1 (the A/A row shows
        # how wide the host's noise makes an interval when nothing differs)
        slower = [name for name, r in report["matrix"].items() if not name.startswith("A/A") and r["ci95"][1] < 1.0]
        below = [name for name, r in report["matrix"].items() if not name.startswith("A/A") and r["ratio"] < 1.0]
        print(f"slower beyond noise (95% interval below 1): {', '.join(slower) or 'none'}; "
              f"median below 1 but within noise: {', '.join(below) or 'none'}")
        report["slower_beyond_noise"] = slower
    report["ratio"] = head
    report["target"] = 1.3
    _common.write("dropin", report, args.json)


if __name__ == "__main__":
    main()
