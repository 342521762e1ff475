"""backend="ray" with its window capped at what this node's object store holds, against the
window as asked (prefetch_factor x actors, however large), in the regime where they differ: a
step slower than the actors, so the actors run ahead until the window is full.

A local Ray with 2 CPUs and a `--store-mib` object store (256 MiB; Ray's local default is 1 GiB,
and 16 actors x 2 of these 37 MiB batches already pass it); the ImageNet training transform
(RandomResizedCrop 224 + flip, uint8 batches of 256) on the synthetic ImageNet-like set; 2
actors, prefetch_factor 8 (16 batches asked ahead, 590 MiB); a step of `--step-ms` a batch
(time.sleep). As asked, the window's batches overflow the store and Ray spills them to disk
and reads them back; capped, it holds 4. Each side gets a fresh loader a round (one at a time:
the 2 CPUs hold 2 actors), a warm-up epoch, then `--epochs` timed ones (the actors run ahead
across them); rounds in ABBA order. It prints each side's images/s, the ratio, and the most
bytes Ray held spilled on disk at once.

    OMP_NUM_THREADS=1 python benchmarks/ray_window.py [--images 2000] [--rounds 3] [--epochs 2] [--step-ms 400]
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import _common

BATCH, SIZE = _common.BATCH, _common.SIZE


def _spilled(ray) -> int:
    """Bytes in this Ray session's spill folders."""
    session = ray._private.worker._global_node.get_session_dir_path()  # no public name for it
    return sum(f.stat().st_size for f in Path(session).glob("ray_spilled_objects*/**/*") if f.is_file())


def main() -> None:
    ap = _common.rounds_parser(__doc__)
    ap.add_argument("--store-mib", type=int, default=256)
    ap.add_argument("--step-ms", type=float, default=400.0)
    args = ap.parse_args()

    import ray

    import fastdata
    import fastdata.image.ray as fray
    from fastdata import transforms as T
    from fastdata.synthetic import make_imagenet_like

    make_imagenet_like(args.root, n_images=args.images, progress=True)
    ray.init(num_cpus=2, object_store_memory=args.store_mib << 20, include_dashboard=False, log_to_driver=False,
             logging_level=logging.WARNING)
    store_bytes = fray.node_store_bytes
    spilled: dict[str, list[int]] = {"as asked": [], "capped": []}  # the most on disk at once, each run
    counts: dict[str, int] = {}

    def side(name: str):
        def run() -> float:
            # As asked: the window before the cap, prefetch_factor x actors whatever the store holds.
            fray.node_store_bytes = store_bytes if name == "capped" else (lambda: 1 << 40)
            loader = fastdata.loader(args.root, batch_size=BATCH, shuffle=True, num_workers=2, prefetch_factor=8,
                                     device="cpu", backend="ray", seed=0,
                                     transform=T.Compose([T.RandomResizedCrop(SIZE), T.RandomHorizontalFlip()]))
            try:
                before, peak, n = _spilled(ray), 0, 0  # (Ray deletes a spill file once its objects are gone)
                for epoch in range(1 + args.epochs):  # a warm-up epoch (the actors start), then the timed ones
                    if epoch == 1:
                        t, n = time.perf_counter(), 0
                    for _images, labels in loader:
                        time.sleep(args.step_ms / 1e3)
                        n += len(labels)
                        peak = max(peak, _spilled(ray) - before)
                seconds = time.perf_counter() - t
                spilled[name].append(peak)
                counts[name] = n
                return seconds
            finally:
                loader.shutdown()
        return run

    print(f"{args.images} images, batch {BATCH}, 2 actors, prefetch_factor 8, a {args.store_mib} MiB store, "
          f"a {args.step_ms:g} ms step; {args.rounds} rounds", file=sys.stderr)
    try:
        seconds = _common.interleaved({name: side(name) for name in spilled}, args.rounds)
    finally:
        fray.node_store_bytes = store_bytes
        ray.shutdown()
    rates = {name: [counts[name] / s for s in secs] for name, secs in seconds.items()}
    med = {name: _common.median(v) for name, v in rates.items()}
    lo, hi = _common.ratio_ci(seconds["as asked"], seconds["capped"])
    ratio = med["capped"] / med["as asked"]
    step_rate = BATCH / (args.step_ms / 1e3)
    print(f"\n{'window':<10}{'images/s':>10}{'most spilled, MiB':>20}")
    for name, v in med.items():
        print(f"{name:<10}{v:>10.0f}{_common.median(spilled[name]) / 2**20:>20.0f}")
    print(f"capped / as asked: {ratio:.2f}x (95% CI {lo:.2f}-{hi:.2f}); the step alone allows {step_rate:.0f} images/s")
    _common.write("ray_window", {
        "images": args.images, "batch": BATCH, "actors": 2, "prefetch_factor": 8, "store_mib": args.store_mib,
        "step_ms": args.step_ms, "images_per_s": med, "all": rates, "spilled_bytes": spilled,
        "ratio_capped_to_as_asked": ratio, "ratio_ci95": [lo, hi], "step_alone_images_per_s": step_rate,
    }, args.json)


if __name__ == "__main__":
    main()
