"""Short epochs and start-up: a fresh loader each epoch, no persistent workers.

What a job pays each time it builds a loader (a validation loader each epoch, fine-tuning on a
small set, a resume, the tuner's probes): the ImageNet training transform of
benchmarks/imagenet_cpu.py (RandomResizedCrop(224, scale=(0.08, 1)), random horizontal flip,
uint8 batches of 256) on the synthetic ImageNet-like set (2,000 images: 8 batches an epoch),
files and the same images as shards:

- DataLoader + Pillow-SIMD (the Dataset a PyTorch user writes), 2 workers, a new DataLoader each epoch;
- fastdata pil, num_workers="auto" (without persistent workers: decoding in the training process);
- fastdata pil, num_workers=2 (worker processes started each epoch);
- webdataset + DataLoader, 2 workers, a new DataLoader each epoch;
- fastdata wds, num_workers="auto", and num_workers=2.

Each epoch is timed from building the loader to its last batch, and the time to its first
batch is recorded. Each candidate runs in its own process (one epoch first as a warm-up for the
imports and the page cache, then --epochs timed ones), one candidate after another in rounds,
ABBA order. No tuned config applies (an empty FASTDATA_CACHE). Prints images/s, time to the
first batch and the ratios against each baseline; writes JSON.

    OMP_NUM_THREADS=1 python benchmarks/startup.py [--images 2000] [--rounds 5] [--epochs 3] [--json PATH]
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import _common

HERE = Path(__file__).resolve().parent
SHARDS = HERE / "data" / "imagenet-like-shards"
# candidate -> (the baseline it is measured against, how its child builds a loader)
CANDIDATES = {
    "DataLoader + Pillow-SIMD": (None, "dataloader"),
    "fastdata pil (auto: in process)": ("DataLoader + Pillow-SIMD", "pil-auto"),
    "fastdata pil, 2 workers": ("DataLoader + Pillow-SIMD", "pil-2"),
    "webdataset + DataLoader": (None, "webdataset"),
    "fastdata wds (auto: in process)": ("webdataset + DataLoader", "wds-auto"),
    "fastdata wds, 2 workers": ("webdataset + DataLoader", "wds-2"),
}


def _make(child: str, root: str):
    """A function that builds one epoch's fresh loader."""
    from fastdata.synthetic import make_file_list

    shards = sorted(str(p) for p in SHARDS.glob("train-*.tar"))
    pattern = str(SHARDS / f"train-{{000000..{len(shards) - 1:06d}}}.tar")
    if child == "dataloader":
        return _common.dataloader_pillow(make_file_list(root), persistent=False)
    if child == "webdataset":
        return _common.webdataset_loader(shards, persistent=False)
    backend, workers = child.split("-")
    source = root if backend == "pil" else pattern
    nw = "auto" if workers == "auto" else int(workers)
    return lambda: _common.fastdata_loader(source, backend, num_workers=nw)


def _child(child: str, root: str, epochs: int) -> None:
    make = _make(child, root)
    rates, firsts = [], []
    for e in range(epochs + 1):
        t = time.perf_counter()
        first, n = None, 0
        for batch in make():
            if first is None:
                first = time.perf_counter() - t
            n += len(batch[1])
        if e:  # the first epoch warms the imports and the page cache
            rates.append(n / (time.perf_counter() - t))
            firsts.append(first)
    print(json.dumps({"images_per_s": rates, "first_s": firsts}))


def main() -> None:
    ap = _common.rounds_parser(__doc__, rounds=5)
    ap.set_defaults(epochs=3)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.child:
        _child(args.child, args.root, args.epochs)
        return
    _common.make_shards(args.root, SHARDS, args.images)
    os.environ["FASTDATA_CACHE"] = tempfile.mkdtemp(prefix="fastdata-startup-")  # no tuned config
    commands = {name: [sys.executable, __file__, "--child", child, "--root", args.root, "--epochs", str(args.epochs)]
                for name, (_, child) in CANDIDATES.items()}
    print(f"{args.images} images, batch {_common.BATCH}, a fresh loader each epoch, {args.rounds} rounds x "
          f"{args.epochs} epochs", file=sys.stderr)
    rates, reports = _common.process_rounds(commands, args.rounds)
    firsts = {name: [f for r in reports[name] for f in r["first_s"]] for name in CANDIDATES}
    med = _common.median
    print(f"\n{'':34} {'images/s':>9} {'first batch':>12}   against its baseline")
    results = {}
    for name, (base, _) in CANDIDATES.items():
        row = {"images_per_s": rates[name], "first_batch_s": firsts[name],
               "median_images_per_s": med(rates[name]), "median_first_batch_s": med(firsts[name])}
        line = f"{name:34} {med(rates[name]):9.0f} {med(firsts[name]):11.3f}s"
        if base is not None:
            # speed: baseline time / candidate time, i.e. candidate rate / baseline rate
            lo, hi = _common.ratio_ci([1 / r for r in rates[base]], [1 / r for r in rates[name]])
            speed = med(rates[name]) / med(rates[base])
            first = med(firsts[name]) / med(firsts[base])
            row.update(baseline=base, speedup=speed, speedup_95=[lo, hi], first_batch_ratio=first)
            line += f"   {speed:.2f}x (95% {lo:.2f}-{hi:.2f}); first batch {first:.2f}x its time"
        results[name] = row
        print(line)
    _common.write("startup", {"images": args.images, "rounds": args.rounds, "epochs": args.epochs,
                              "candidates": results}, args.json)


if __name__ == "__main__":
    main()
