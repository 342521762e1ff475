"""The ImageNet training transform on the CPU: fastdata `pil` against today's baselines.

RandomResizedCrop(224, scale=(0.08, 1)), random horizontal flip, uint8 CHW batches of 256,
2 workers (or threads), on the synthetic ImageNet-like set (`fastdata.synthetic`):

- DataLoader + stock Pillow, hand-written RandomResizedCrop (stock Pillow of Pillow-SIMD's
  release, which scripts/install.sh puts in .stock-pillow/, first on the child's PYTHONPATH),
- DataLoader + Pillow-SIMD, the same code (the Pillow this environment runs),
- a hand-written DALI CPU pipeline (fn.decoders.image_random_crop on the CPU), when DALI is installed,
- fastdata.loader(backend="pil").

Each candidate runs in its own process, one candidate after another in rounds, so drift on
a shared machine hits all alike; a process times `--epochs` epochs after a warm-up one and
the median epoch counts. Prints images/s and the ratios; writes JSON.

    OMP_NUM_THREADS=1 python benchmarks/imagenet_cpu.py [--images 2000] [--rounds 3] [--json PATH]
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
from pathlib import Path

import _common

HERE = Path(__file__).resolve().parent
BATCH, WORKERS, SIZE = _common.BATCH, _common.WORKERS, _common.SIZE


# ----------------------------------------------------------------- candidates (run in children)

def run_dataloader(files, epochs):
    return _common.time_epochs(_common.dataloader_pillow(files), epochs)


def run_dali(files, epochs):
    from nvidia.dali import fn, pipeline_def, types

    listing = HERE / "results" / ".dali_files.txt"
    listing.write_text("".join(f"{p} {l}\n" for p, l in files))

    @pipeline_def(batch_size=BATCH, num_threads=WORKERS, device_id=None, seed=0)
    def pipe():
        jpegs, labels = fn.readers.file(file_list=str(listing), random_shuffle=True, name="r")
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                               random_area=[0.08, 1.0], random_aspect_ratio=[3 / 4, 4 / 3])
        images = fn.resize(images, resize_x=SIZE, resize_y=SIZE)
        images = fn.crop_mirror_normalize(images, dtype=types.UINT8, output_layout="CHW",
                                          mirror=fn.random.coin_flip(), mean=[0.0], std=[1.0])
        return images, labels

    p = pipe()
    p.build()
    steps = math.ceil(len(files) / BATCH)

    def epoch():
        for _ in range(steps):
            images, labels = p.run()
            yield images, [0] * len(labels)

    return _common.time_epochs(epoch, epochs)


def run_fastdata(files, epochs, root):
    loader = _common.fastdata_loader(root, "pil", persistent_workers=True)
    return _common.time_epochs(lambda: loader, epochs)


def _child(name: str, root: str, epochs: int) -> None:
    from fastdata.synthetic import make_file_list

    files = make_file_list(root)
    if name == "dali":
        times = run_dali(files, epochs)
    elif name == "fastdata":
        times = run_fastdata(files, epochs, root)
    else:
        times = run_dataloader(files, epochs)
    import PIL

    print(json.dumps({"images_per_s": times, "pillow": PIL.__version__}))


# ----------------------------------------------------------------- the parent

def main() -> None:
    ap = _common.rounds_parser(__doc__)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.child:
        _child(args.child, args.root, args.epochs)
        return

    from fastdata._pillow import PILLOW, stock_pillow_path
    from fastdata.synthetic import make_imagenet_like

    make_imagenet_like(args.root, n_images=args.images, progress=True)
    candidates = {"DataLoader + Pillow-SIMD": [sys.executable, "dataloader"]}
    stock = stock_pillow_path()
    if stock:  # the same code with stock Pillow first on the path
        candidates = {"DataLoader + stock Pillow": ["env", f"PYTHONPATH={stock}", sys.executable, "dataloader"],
                      **candidates}
    else:
        print("no stock Pillow in .stock-pillow/ (scripts/install.sh puts it there): its baseline is left out",
              file=sys.stderr)
    try:
        import nvidia.dali  # noqa: F401

        candidates["DALI CPU pipeline"] = [sys.executable, "dali"]
    except ImportError:
        print("DALI is not installed: its baseline is left out (pip install nvidia-dali-cuda120)", file=sys.stderr)
    candidates["fastdata pil"] = [sys.executable, "fastdata"]

    print(f"{args.images} images, batch {BATCH}, {WORKERS} workers, {args.rounds} rounds x {args.epochs} epochs; "
          f"this environment: {PILLOW}", file=sys.stderr)
    commands = {name: [*py, __file__, "--child", child, "--root", args.root, "--epochs", str(args.epochs)]
                for name, (*py, child) in candidates.items()}
    results, reports = _common.process_rounds(commands, args.rounds, abba=False)
    pillows = {name: reps[-1]["pillow"] for name, reps in reports.items()}

    med = {name: statistics.median(v) for name, v in results.items()}
    fast = med["fastdata pil"]
    print(f"\n{'pipeline':<30}{'images/s':>10}{'fastdata is':>14}")
    for name, v in med.items():
        print(f"{name:<30}{v:>10.0f}{fast / v:>13.2f}x")
    targets = {"DataLoader + Pillow-SIMD": 1.6, "DataLoader + stock Pillow": 2.0, "DALI CPU pipeline": 1.5}
    report = {"images": args.images, "batch": BATCH, "workers": WORKERS, "images_per_s": med, "all": results,
              "pillow": pillows, "ratios": {n: fast / v for n, v in med.items() if n != "fastdata pil"},
              "targets": {n: t for n, t in targets.items() if n in med}}
    for n, t in report["targets"].items():
        print(f"fastdata pil vs {n}: {fast / med[n]:.2f}x (target >= {t}x)")
    _common.write("imagenet_cpu", report, args.json)


if __name__ == "__main__":
    main()
