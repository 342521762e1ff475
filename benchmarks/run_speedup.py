"""`fastdata run` on an input-bound training script: the same script, as is and under
`fastdata run -- python ...`, paired.

The script (this file with --train; it does not import fastdata) is what a user writes: a
Dataset of decoded images (ready 224 px uint8 HWC arrays seen as CHW, which default_collate
copies into a batch), DataLoader(batch_size=256, shuffle=True, num_workers=2), and a short
simulated step (a sleep: the CPU is free, as while a GPU computes). It times itself alike on
both sides: a warm-up epoch, then images/s of each timed epoch, printed as JSON. The two sides
run in their own processes, interleaved for --rounds rounds (ABBA), so drift hits both alike;
the ratio is fastdata run's median images/s over the script's own, with a 95% bootstrap
interval.

    OMP_NUM_THREADS=1 python benchmarks/run_speedup.py [--images 2048] [--rounds 5] [--epochs 2]
                                                       [--step-ms 5] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def train(images: int, epochs: int, step_ms: float, workers: int) -> None:
    """The training script: prints {"images_per_s": [one a timed epoch]}."""
    import numpy as np
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Decoded(Dataset):
        def __init__(self, n: int) -> None:
            rng = np.random.default_rng(0)
            self.n = n
            self.arrays = [rng.integers(0, 256, (224, 224, 3), dtype=np.uint8) for _ in range(64)]

        def __len__(self) -> int:
            return self.n

        def __getitem__(self, i: int):
            return torch.from_numpy(self.arrays[i % 64]).permute(2, 0, 1), i

    loader = DataLoader(Decoded(images), batch_size=256, shuffle=True, num_workers=workers)
    rates = []
    for epoch in range(epochs + 1):  # the first is the warm-up
        t, n = time.perf_counter(), 0
        for x, y in loader:
            x[0, 0, 0, 0].item()  # the step touches the batch
            time.sleep(step_ms / 1e3)
            n += len(y)
        if epoch:
            rates.append(n / (time.perf_counter() - t))
    print(json.dumps({"images_per_s": rates}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=2048, help="images an epoch")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=2, help="timed epochs a process, after a warm-up one")
    ap.add_argument("--step-ms", type=float, default=5.0, help="the simulated step's milliseconds")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", default=None)
    ap.add_argument("--train", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.train:
        train(args.images, args.epochs, args.step_ms, args.workers)
        return

    import _common

    script = [sys.executable, str(Path(__file__).resolve()), "--train", "--images", str(args.images),
              "--epochs", str(args.epochs), "--step-ms", str(args.step_ms), "--workers", str(args.workers)]
    commands = {"script as is (DataLoader)": script,
                "fastdata run -- script": [sys.executable, "-m", "fastdata.cli", "run", "--", *script]}
    rates, _ = _common.process_rounds(commands, args.rounds)
    base, run = rates["script as is (DataLoader)"], rates["fastdata run -- script"]
    ratio = _common.median(run) / _common.median(base)
    low, high = _common.ratio_ci(run, base) if len(base) > 1 else (ratio, ratio)
    print(f"script as is:            {_common.median(base):8.0f} images/s (median of {len(base)} epochs)")
    print(f"fastdata run -- script:  {_common.median(run):8.0f} images/s")
    print(f"speed-up: {ratio:.2f}x (95% interval {low:.2f}..{high:.2f})")
    _common.write("run_speedup", {
        "config": {"images": args.images, "batch_size": 256, "num_workers": args.workers, "step_ms": args.step_ms,
                   "epochs": args.epochs, "rounds": args.rounds, "image": "224x224x3 uint8, HWC seen as CHW"},
        "images_per_s": {"script": base, "fastdata_run": run},
        "speedup": ratio, "speedup_interval": [low, high]}, args.json)


if __name__ == "__main__":
    main()
