"""`fastdata run` on an input-bound training script: the same script, as is and under
`fastdata run -- python ...`, paired.

The script (this file with --train; it does not import fastdata) is what a user writes: a
Dataset of decoded images (ready 224 px uint8 HWC arrays seen as CHW, which default_collate
copies into a batch), DataLoader(batch_size=256, shuffle=True, num_workers=2), and a short
simulated step: on the CPU a sleep (the CPU is free, as while a GPU computes); with
--device cuda, the batch moved to the GPU with `.to(device, non_blocking=True)` and a GPU kernel
that spins for the step's milliseconds, then a `.item()` that waits for it, as `loss.item()`
does. It times itself alike on both sides: a warm-up epoch, then images/s of each timed epoch,
printed as JSON. The sides run in their own processes, interleaved for --rounds rounds (ABBA),
so drift hits them alike; the ratio is fastdata run's median images/s over the script's own,
with a 95% bootstrap interval. With --device cuda a third side, `fastdata run --no-copy-ahead`,
measures what the copy ahead to the GPU adds.

    OMP_NUM_THREADS=1 python benchmarks/run_speedup.py [--images 2048] [--rounds 5] [--epochs 2]
        [--step-ms 5] [--device cpu|cuda] [--pin-memory] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def train(images: int, epochs: int, step_ms: float, workers: int, device: str, pin: bool) -> None:
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

    loader = DataLoader(Decoded(images), batch_size=256, shuffle=True, num_workers=workers, pin_memory=pin)
    cycles = gpu_cycles(step_ms) if device != "cpu" else 0
    rates = []
    for epoch in range(epochs + 1):  # the first is the warm-up
        t, n = time.perf_counter(), 0
        for x, y in loader:
            if device == "cpu":
                x[0, 0, 0, 0].item()  # the step touches the batch
                time.sleep(step_ms / 1e3)
            else:
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                torch.cuda._sleep(cycles)
                (x[:, 0, 0, 0].float().sum() + y.sum()).item()  # the step reads the batch and waits for the GPU
            n += len(y)
        if epoch:
            rates.append(n / (time.perf_counter() - t))
    print(json.dumps({"images_per_s": rates}))


def gpu_cycles(ms: float) -> int:
    """Clock cycles of `torch.cuda._sleep` that keep the GPU busy for `ms` milliseconds."""
    import torch

    torch.cuda._sleep(1000)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    return int(10_000_000 * ms / start.elapsed_time(end))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=2048, help="images an epoch")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=2, help="timed epochs a process, after a warm-up one")
    ap.add_argument("--step-ms", type=float, default=5.0, help="the simulated step's milliseconds")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where the step runs")
    ap.add_argument("--pin-memory", action="store_true", help="the script's DataLoader pins its batches")
    ap.add_argument("--json", default=None)
    ap.add_argument("--train", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.train:
        train(args.images, args.epochs, args.step_ms, args.workers, args.device, args.pin_memory)
        return

    import _common

    script = [sys.executable, str(Path(__file__).resolve()), "--train", "--images", str(args.images),
              "--epochs", str(args.epochs), "--step-ms", str(args.step_ms), "--workers", str(args.workers),
              "--device", args.device] + ["--pin-memory"] * args.pin_memory
    run = [sys.executable, "-m", "fastdata", "run"]
    commands = {"script as is (DataLoader)": script, "fastdata run -- script": [*run, "--", *script]}
    if args.device == "cuda":
        commands["fastdata run --no-copy-ahead"] = [*run, "--no-copy-ahead", "--", *script]
    rates, _ = _common.process_rounds(commands, args.rounds)
    keys = {"script as is (DataLoader)": "script", "fastdata run -- script": "fastdata_run",
            "fastdata run --no-copy-ahead": "no_copy_ahead"}
    rates = {keys[name]: r for name, r in rates.items()}

    def paired(a: str, b: str) -> tuple[float, list[float]]:
        """median(a) / median(b), with its 95% bootstrap interval."""
        ratio = _common.median(rates[a]) / _common.median(rates[b])
        return ratio, list(_common.ratio_ci(rates[a], rates[b])) if len(rates[b]) > 1 else [ratio, ratio]

    print(f"{'script as is':<30} {_common.median(rates['script']):8.0f} images/s (median of {len(rates['script'])} epochs)")
    result: dict = {}
    for name, key in keys.items():
        if key != "script" and key in rates:
            ratio, (low, high) = paired(key, "script")
            result[key] = {"speedup": ratio, "speedup_interval": [low, high]}
            print(f"{name:<30} {_common.median(rates[key]):8.0f} images/s: {ratio:.2f}x (95% interval "
                  f"{low:.2f}..{high:.2f})")
    result.update(result.pop("fastdata_run"))
    if "no_copy_ahead" in rates:
        gain, (low, high) = paired("fastdata_run", "no_copy_ahead")
        result["copy_ahead_gain"], result["copy_ahead_gain_interval"] = gain, [low, high]
        print(f"the copy ahead to the GPU: {gain:.2f}x fastdata run without it (95% interval {low:.2f}..{high:.2f})")
    name = "run_speedup" if args.device == "cpu" else "run_speedup_cuda" + ("" if args.pin_memory else "_pageable")
    _common.write(name, {
        "config": {"images": args.images, "batch_size": 256, "num_workers": args.workers, "step_ms": args.step_ms,
                   "epochs": args.epochs, "rounds": args.rounds, "device": args.device,
                   "pin_memory": args.pin_memory, "image": "224x224x3 uint8, HWC seen as CHW"},
        "images_per_s": rates, **result}, args.json)

if __name__ == "__main__":
    main()
