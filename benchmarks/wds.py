"""WebDataset shards on the CPU: fastdata `wds` against webdataset + DataLoader + Pillow.

The ImageNet training transform of benchmarks/imagenet_cpu.py (RandomResizedCrop(224,
scale=(0.08, 1)), random horizontal flip, uint8 CHW batches of 256, 2 workers) on the synthetic
ImageNet-like set written as shards by `fastdata-shard` (250 samples a shard):

- webdataset + DataLoader, the pipeline a user writes today: WebDataset(shards, shardshuffle)
  .shuffle(1000).to_tuple("jpg", "cls"), a Pillow transform per sample, .batched(256), in a
  DataLoader with 2 workers; with the Pillow this environment runs (Pillow-SIMD after the install),
- fastdata.loader(shards, backend="wds") from the local shards,
- the same from a loopback HTTP server (127.0.0.1, answering Range requests) in the process.

With --gzip every side reads the same shards gzip-compressed (.tar.gz, written once beside
them; fastdata then reads each shard on from its start, as webdataset does).

Each candidate runs in its own process, one after another in rounds (ABBA order), so drift on
a shared machine hits all alike; a process times `--epochs` epochs after a warm-up one and
the median counts. Prints images/s and the ratios; writes JSON.

    OMP_NUM_THREADS=1 python benchmarks/wds.py [--images 2000] [--rounds 3] [--gzip] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import _common

HERE = Path(__file__).resolve().parent
BATCH, WORKERS, PER_SHARD = _common.BATCH, _common.WORKERS, _common.PER_SHARD


def run_webdataset(shards: list[str], epochs: int) -> list[float]:
    return _common.time_epochs(_common.webdataset_loader(shards), epochs)


def run_fastdata(source: str, epochs: int) -> list[float]:
    loader = _common.fastdata_loader(source, "wds", persistent_workers=True)
    assert len(loader.samples) > 0
    return _common.time_epochs(lambda: loader, epochs)


def _child(name: str, folder: str, epochs: int, suffix: str) -> None:
    shards = sorted(str(p) for p in Path(folder).glob(f"train-*{suffix}"))
    pattern = f"train-{{000000..{len(shards) - 1:06d}}}{suffix}"
    if name == "webdataset":
        times = run_webdataset(shards, epochs)
    elif name == "local":
        times = run_fastdata(os.path.join(folder, pattern), epochs)
    else:
        from fastdata._serve import serve

        with serve(folder) as base:
            times = run_fastdata(f"{base}/{pattern}", epochs)
    import PIL

    print(json.dumps({"images_per_s": times, "pillow": PIL.__version__}))


def _gzipped(folder: Path) -> Path:
    """The shards of `folder` gzip-compressed (level 6, gzip's default) into a folder beside it, once."""
    import gzip

    out = Path(f"{folder}-gz")
    out.mkdir(exist_ok=True)
    shards = sorted(folder.glob("train-*.tar"))
    for stale in set(out.glob("train-*.tar.gz")) - {out / (p.name + ".gz") for p in shards}:
        stale.unlink()
    for shard in shards:
        target = out / (shard.name + ".gz")
        if not target.exists() or target.stat().st_mtime < shard.stat().st_mtime:  # (shards rewritten since)
            target.write_bytes(gzip.compress(shard.read_bytes(), compresslevel=6))
    return out


def main() -> None:
    ap = _common.rounds_parser(__doc__)
    ap.add_argument("--shards", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--gzip", action="store_true", help="every side reads the shards gzip-compressed")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    folder = Path(args.shards or f"{args.root}-shards")
    suffix = ".tar.gz" if args.gzip else ".tar"
    if args.child:
        _child(args.child, str(folder), args.epochs, suffix)
        return

    from fastdata._pillow import PILLOW

    _common.make_shards(args.root, folder, args.images)
    if args.gzip:
        folder = _gzipped(folder)
    candidates = {"webdataset + DataLoader + Pillow": "webdataset", "fastdata wds, local shards": "local",
                  "fastdata wds, HTTP 127.0.0.1": "http"}
    print(f"{args.images} images in {PER_SHARD}-sample shards, batch {BATCH}, {WORKERS} workers, "
          f"{args.rounds} rounds x {args.epochs} epochs; this environment: {PILLOW}", file=sys.stderr)
    names = list(candidates)
    commands = {name: [sys.executable, __file__, "--child", child, "--root", args.root, "--shards", str(folder),
                       "--epochs", str(args.epochs), *(["--gzip"] if args.gzip else [])]
                for name, child in candidates.items()}
    results, _ = _common.process_rounds(commands, args.rounds)

    med = {name: statistics.median(v) for name, v in results.items()}
    base, local, http = (med[n] for n in names)
    print(f"\n{'pipeline':<36}{'images/s':>10}{'vs baseline':>13}")
    for name, v in med.items():
        print(f"{name:<36}{v:>10.0f}{v / base:>12.2f}x")
    report = {"images": args.images, "batch": BATCH, "workers": WORKERS, "per_shard": PER_SHARD, "pillow": PILLOW,
              "shards": suffix,
              "images_per_s": med, "all": results,
              "ratios": {"local vs webdataset": local / base, "http vs webdataset": http / base,
                         "http vs local": http / local},
              "targets": {"local vs webdataset": 1.6, "http vs local": 0.9}}
    print(f"fastdata wds (local) vs webdataset + DataLoader + {PILLOW}: {local / base:.2f}x (target >= 1.6x)")
    print(f"fastdata wds over HTTP vs local shards: {http / local:.2f} (target >= 0.90: within 10%)")
    _common.write("wds_gzip" if args.gzip else "wds", report, args.json)


if __name__ == "__main__":
    main()
