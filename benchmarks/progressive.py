"""Progressive resizing on the CPU: images/s at each output size, fastdata `pil` against
DataLoader + Pillow-SIMD at the same size.

RandomResizedCrop(size, scale=(0.08, 1)) + random horizontal flip, uint8 CHW batches of 256,
2 workers, on the synthetic ImageNet-like set (`fastdata.synthetic`), at 128, 160, 192 and
224 px (the sizes a progressive-resizing schedule such as FFCV's ImageNet recipe steps
through). fastdata decodes only the crop window, at a reduced DCT scale when the window is at
least twice the output, so a smaller size costs it less; the baseline (the Dataset a PyTorch
user writes, `fastdata.demo.PillowRRC`) decodes the whole image at every size.

Each (candidate, size) runs in its own process, all of them one after another in rounds (in
ABBA order), so drift on a shared machine hits all alike; a process times `--epochs` epochs
after a warm-up one, both sides alike (`_common.time_epochs`), and the median epoch counts.
Prints images/s and fastdata's ratio at each size; writes JSON.

    OMP_NUM_THREADS=1 python benchmarks/progressive.py [--images 2000] [--rounds 3] [--epochs 2]
        [--sizes 128,160,192,224] [--json PATH]
"""

from __future__ import annotations

import json
import os
import sys

import _common

BATCH, WORKERS = 256, 2
SIZES = (128, 160, 192, 224)


# ----------------------------------------------------------------- candidates (run in children)

def run_dataloader(root: str, size: int, epochs: int) -> list[float]:
    import torch
    from torch.utils.data import DataLoader

    from fastdata.demo import PillowRRC
    from fastdata.synthetic import make_file_list

    torch.set_num_threads(1)
    loader = DataLoader(PillowRRC(make_file_list(root), size), batch_size=BATCH, shuffle=True, num_workers=WORKERS,
                        persistent_workers=True)
    return _common.time_epochs(lambda: loader, epochs)


def run_fastdata(root: str, size: int, epochs: int) -> list[float]:
    import torch

    import fastdata
    from fastdata import transforms as T

    torch.set_num_threads(1)
    loader = fastdata.loader(root, batch_size=BATCH, shuffle=True, num_workers=WORKERS, persistent_workers=True,
                             transform=T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip()]),
                             device="cpu", backend="pil")
    return _common.time_epochs(lambda: loader, epochs)


def _child(spec: str, root: str, epochs: int) -> None:
    name, size = spec.rsplit(":", 1)
    run = run_fastdata if name == "fastdata" else run_dataloader
    rates = run(root, int(size), epochs)
    import PIL

    print(json.dumps({"images_per_s": rates, "pillow": PIL.__version__}))


# ----------------------------------------------------------------- the parent

def _sizes(text: str) -> list[int]:
    sizes = [int(s) for s in text.split(",") if s.strip()]
    if not sizes or min(sizes) < 1:
        raise SystemExit(f"--sizes should be positive ints separated by commas, but got {text!r}")
    return sizes


def main() -> None:
    ap = _common.rounds_parser(__doc__)
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="output sizes in px (default 128,160,192,224)")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.child:
        _child(args.child, args.root, args.epochs)
        return
    sizes = _sizes(args.sizes)

    from fastdata._pillow import PILLOW
    from fastdata.synthetic import make_imagenet_like

    make_imagenet_like(args.root, n_images=args.images, progress=True)
    sides = {"DataLoader + Pillow-SIMD": "dataloader", "fastdata pil": "fastdata"}
    commands = {f"{name} @ {size}": [sys.executable, __file__, "--child", f"{child}:{size}", "--root", args.root,
                                     "--epochs", str(args.epochs)]
                for size in sizes for name, child in sides.items()}
    print(f"{args.images} images, batch {BATCH}, {WORKERS} workers, sizes {sizes}, {args.rounds} rounds x "
          f"{args.epochs} epochs; this environment: {PILLOW}", file=sys.stderr)
    results, reports = _common.process_rounds(commands, args.rounds)

    table = {}
    print(f"\n{'size':>6}{'DataLoader + Pillow-SIMD':>27}{'fastdata pil':>15}{'fastdata is':>14}{'95% interval':>16}")
    for size in sizes:
        base, fast = results[f"DataLoader + Pillow-SIMD @ {size}"], results[f"fastdata pil @ {size}"]
        # ratio_ci takes times (lower is faster): seconds per image
        ci = _common.ratio_ci([1 / r for r in base], [1 / r for r in fast])
        row = {"DataLoader + Pillow-SIMD": _common.median(base), "fastdata pil": _common.median(fast)}
        row["ratio"] = row["fastdata pil"] / row["DataLoader + Pillow-SIMD"]
        row["ci95"] = ci
        table[size] = row
        print(f"{size:>6}{row['DataLoader + Pillow-SIMD']:>27.0f}{row['fastdata pil']:>15.0f}{row['ratio']:>13.2f}x"
              f"{ci[0]:>10.2f}-{ci[1]:.2f}")
    _common.write("progressive", {
        "images": args.images, "batch": BATCH, "workers": WORKERS, "sizes": sizes, "unit": "images/s",
        "pillow": {name: reps[-1]["pillow"] for name, reps in reports.items()},
        "images_per_s": {str(s): row for s, row in table.items()}, "all": results,
    }, args.json)


if __name__ == "__main__":
    main()
