"""The `dali` backend's cost on the CPU: fastdata `dali` against a hand-written DALI pipeline
doing the same work, on the synthetic ImageNet-like set (`fastdata.synthetic`).

Both decode a RandomResizedCrop(224, scale=(0.08, 1)) window, resize it to 224x224 and flip
half the images, into uint8 batches of 256 as torch tensors, with 2 DALI threads on the CPU:

- hand-written: fn.readers.file (shuffled) -> fn.decoders.image_random_crop -> fn.resize ->
  fn.flip, through DALI's own PyTorch iterator (DALIGenericIterator), as DALI's docs show it;
- fastdata.loader(folder, backend="dali", device="cpu"): fastdata reads the files, checks
  them, samples the windows itself and feeds them to fn.decoders.image_slice -> fn.resize ->
  fn.flip (see fastdata/backends/dali.py).

Each candidate runs in its own process, one after another in rounds (ABBA order), timing
--epochs epochs after a warm-up one; the median counts. Target: fastdata >= 0.95x. Prints
images/s and the ratio; writes JSON.

    OMP_NUM_THREADS=1 python benchmarks/dali.py [--images 2000] [--rounds 4] [--json PATH]
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
BATCH, THREADS, SIZE = 256, 2, 224


def run_hand_written(root: str, epochs: int) -> list[float]:
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    from fastdata.synthetic import make_file_list

    files = make_file_list(root)
    listing = HERE / "results" / ".dali_files.txt"
    listing.write_text("".join(f"{os.path.abspath(p)} {label}\n" for p, label in files))

    @pipeline_def(batch_size=BATCH, num_threads=THREADS, device_id=None, seed=0)
    def pipe():
        jpegs, labels = fn.readers.file(file_list=str(listing), random_shuffle=True, name="reader")
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                               random_area=[0.08, 1.0], random_aspect_ratio=[3 / 4, 4 / 3])
        images = fn.resize(images, resize_x=SIZE, resize_y=SIZE)
        return fn.flip(images, horizontal=fn.random.coin_flip()), labels

    loader = DALIGenericIterator(pipe(), ["images", "labels"], reader_name="reader",
                                 last_batch_policy=LastBatchPolicy.PARTIAL, auto_reset=True)

    def epoch():
        for (out,) in loader:
            yield out["images"], out["labels"]

    assert math.ceil(len(files) / BATCH) == len(loader)
    return _common.time_epochs(epoch, epochs)


def run_fastdata(root: str, epochs: int) -> list[float]:
    import torch

    import fastdata
    from fastdata import transforms as T

    torch.set_num_threads(1)
    loader = fastdata.loader(root, batch_size=BATCH, shuffle=True, num_workers=THREADS, backend="dali", device="cpu",
                             transform=T.Compose([T.RandomResizedCrop(SIZE), T.RandomHorizontalFlip()]))
    return _common.time_epochs(lambda: loader, epochs)


def main() -> None:
    ap = _common.rounds_parser(__doc__, rounds=4)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.child:
        run = run_hand_written if args.child == "hand" else run_fastdata
        print(json.dumps({"images_per_s": run(args.root, args.epochs)}))
        return
    try:
        import nvidia.dali
    except ImportError:
        raise SystemExit("DALI is not installed: pip install nvidia-dali-cuda120") from None

    from fastdata.synthetic import make_imagenet_like

    make_imagenet_like(args.root, n_images=args.images, progress=True)
    candidates = {"hand-written DALI CPU pipeline": "hand", "fastdata dali (CPU)": "fastdata"}
    print(f"{args.images} images, batch {BATCH}, {THREADS} DALI threads, {args.rounds} rounds x {args.epochs} epochs, "
          f"DALI {nvidia.dali.__version__}", file=sys.stderr)
    names = list(candidates)
    commands = {name: [sys.executable, __file__, "--child", child, "--root", args.root, "--epochs", str(args.epochs)]
                for name, child in candidates.items()}
    results, _ = _common.process_rounds(commands, args.rounds)
    med = {name: statistics.median(v) for name, v in results.items()}
    hand, fast = (med[n] for n in names)
    print(f"\n{'pipeline':<34}{'images/s':>10}")
    for name, v in med.items():
        print(f"{name:<34}{v:>10.0f}")
    print(f"fastdata dali vs the hand-written DALI CPU pipeline: {fast / hand:.2f}x (target >= 0.95x)")
    _common.write("dali", {"images": args.images, "batch": BATCH, "threads": THREADS, "dali": nvidia.dali.__version__,
                           "images_per_s": med, "all": results, "ratio": fast / hand, "target": 0.95}, args.json)


if __name__ == "__main__":
    main()
