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
import os
import statistics
import sys

import _common

BATCH, THREADS = _common.BATCH, _common.WORKERS


def run_hand_written(root: str, epochs: int) -> list[float]:
    from fastdata.synthetic import make_file_list

    return _common.time_epochs(_common.dali_loader(make_file_list(root)), epochs)


def run_fastdata(root: str, epochs: int) -> list[float]:
    loader = _common.fastdata_loader(root, "dali")
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
