"""The device stage on a CPU device: Normalize into reused slots, by a table, against torch's
operations into reused slots and into fresh memory.

With `device="cpu"`, Normalize (uint8 to float) runs in the training process on every batch.
Written as `images.to(dtype).sub_(mean).div_(std)` it asks the allocator for a fresh float
batch (19.6 MB at batch 64 and 160 px) each time. Whether glibc hands back memory it still
has, or returns it to the kernel and page-faults it in again, depends on the heap's state; in
the second case the stage costs several times its CPU in page faults, and the whole run slows.
fastdata's `pil` loader gives the stage a ring of reused output slots instead, leased like the
workers' batch slots, so a batch the user still holds is never written over; and writes each
value through a table of what those operations make of each uint8 value (one pass over the
batch, natively, where the operations take three).

The loop: 2,000 synthetic ImageNet-like JPEGs, RandomResizedCrop(160) + flip + ColorJitter +
TrivialAugment + Normalize, batch 64 (with --imagenet: the README's first command's loader,
imagenet_train(224), batch 256), 2 persistent workers, a simulated step of --step-ms a batch
(the CPU is free meanwhile, as while a GPU computes; 0: the loader alone). Each candidate runs
in its own process (the heap's state is a process's history), --epochs timed epochs after a
warm one, processes in ABBA order over --rounds:

- fastdata `pil` with the output ring removed and no table (fresh memory, torch's operations);
- fastdata `pil` with no table (reused slots, torch's operations);
- fastdata `pil` as shipped.

Prints images/s, the training process's CPU seconds a batch, the ratios with their 95%
bootstrap intervals, each side's slowest and fastest epoch, its page faults an epoch (median
and most), and how many processes page-faulted their batches (the heap's state decides it,
process by process); writes JSON (device_stage.json, device_stage_imagenet.json).

    OMP_NUM_THREADS=1 python benchmarks/device_stage.py [--rounds 6] [--epochs 3] [--step-ms 100] [--imagenet]
                                                        [--json PATH]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import _common

import fastdata
from fastdata import transforms as T
from fastdata.synthetic import make_imagenet_like
from fastdata.transforms import batch as batch_ops

CANDIDATES = {"fresh memory, operations": "fresh", "reused slots, operations": "ops",
              "slots, table (fastdata)": "table"}


def _faults() -> int:
    """Minor page faults of this process so far."""
    return int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[7])


def child(args) -> None:
    if args.imagenet:
        spec, batch = T.imagenet_train(224), 256
    else:
        spec, batch = T.Compose([T.RandomResizedCrop(160), T.RandomHorizontalFlip(),
                                 T.ColorJitter(0.4, 0.4, 0.4, 0.1), T.TrivialAugment(), T.Normalize()]), 64
    loader = fastdata.loader(args.root, batch_size=batch, shuffle=True, transform=spec, device="cpu", num_workers=2,
                             persistent_workers=True)
    if args.child == "fresh":
        loader._device_stage.out_ring = None  # the ablation: Normalize allocates its output
    if args.child in ("fresh", "ops"):
        batch_ops._normalize_by_table = lambda *a: False  # the ablation: torch's three operations
    rates, faults, cpu = [], [], []
    for epoch in range(args.epochs + 1):
        f, t, c, n, k = _faults(), time.perf_counter(), time.process_time(), 0, 0
        for images, labels in loader:
            n, k = n + len(labels), k + 1
            time.sleep(args.step_ms / 1e3)
        if epoch:  # the first epoch starts the workers and fills the slots
            rates.append(n / (time.perf_counter() - t))
            faults.append(_faults() - f)
            cpu.append((time.process_time() - c) / k)
    print(json.dumps({"images_per_s": rates, "faults": faults, "cpu_s_per_batch": cpu}))


def main() -> None:
    ap = _common.rounds_parser(__doc__, rounds=6)
    ap.add_argument("--step-ms", type=float, default=100)
    ap.add_argument("--imagenet", action="store_true", help="imagenet_train(224), batch 256")
    ap.set_defaults(epochs=3)
    args = ap.parse_args()
    if args.child:
        return child(args)
    make_imagenet_like(Path(args.root), n_images=args.images, progress=True)
    commands = {name: [sys.executable, __file__, "--child", c, "--root", args.root, "--epochs", str(args.epochs),
                       "--step-ms", str(args.step_ms), *(["--imagenet"] if args.imagenet else [])]
                for name, c in CANDIDATES.items()}
    rates, reports = _common.process_rounds(commands, args.rounds)
    faults = {name: [f for r in reps for f in r["faults"]] for name, reps in reports.items()}
    cpu = {name: _common.median([c for r in reps for c in r["cpu_s_per_batch"]]) for name, reps in reports.items()}
    med = {name: _common.median(v) for name, v in rates.items()}
    print(f"\n{'device stage output':<28}{'images/s':>10}{'slowest':>10}{'fastest':>10}{'CPU ms/batch':>14}"
          f"{'faults/epoch':>14}{'most':>10}  processes faulting")
    for name, v in rates.items():
        # a process "faults" when its epochs page-fault the batch in (1 MB of faults an epoch and up)
        faulting = sum(max(r["faults"]) > 256 for r in reports[name])
        print(f"{name:<28}{med[name]:>10,.0f}{min(v):>10,.0f}{max(v):>10,.0f}{cpu[name] * 1e3:>14.1f}"
              f"{_common.median(faults[name]):>14,.0f}{max(faults[name]):>10,}  {faulting} of {len(reports[name])}")
    *baselines, after = CANDIDATES
    ratios = {}
    for before in baselines:
        lo, hi = _common.ratio_ci([1 / r for r in rates[before]], [1 / r for r in rates[after]])
        ratios[before] = {"ratio": med[after] / med[before], "interval": [lo, hi],
                          "slowest_epoch": min(rates[after]) / min(rates[before])}
        print(f"fastdata / {before + ':':<26} {ratios[before]['ratio']:.2f}x (95% interval {lo:.2f}-{hi:.2f}); "
              f"slowest epoch {ratios[before]['slowest_epoch']:.2f}x")
    _common.write("device_stage_imagenet" if args.imagenet else "device_stage",
                  {"step_ms": args.step_ms, "imagenet": args.imagenet, "images_per_s": med, "all": rates,
                   "cpu_s_per_batch": cpu, "ratios": ratios, "faults": faults}, args.json)

if __name__ == "__main__":
    main()
