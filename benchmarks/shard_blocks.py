"""Shards of large samples: the `wds` reader's memory with shuffle blocks cut by bytes.

A worker (or a 0-worker pass) reads a shuffle block at a time into two buffers. A block is
1024 samples' batches, cut short where its samples would pass 256 MiB in the epoch's order.
This measures the peak memory (ru_maxrss) and rate of one epoch over a mixed set: shards of
large JPEGs (noise, 1600 x 1200, quality 95: about 2.3 MB a sample) beside shards of --small
small ones (noise, 64 x 64: about 10 KB), so that the mean sample stays small and only the
cut in the epoch's order sees the large ones (--small 0: large ones alone). RandomResizedCrop(64),
batches of 32, 0 workers, files in the page cache; against the same loader with 1024-sample
blocks whatever their bytes, each in a process of its own, in rounds (ABBA order). Prints both
and their ratio; writes JSON.

    OMP_NUM_THREADS=1 python benchmarks/shard_blocks.py [--images 1100] [--small 12000] [--rounds 3] [--json PATH]
"""

from __future__ import annotations

import glob
import json
import os
import resource
import sys
import tempfile
import time

from _common import median, process_rounds, rounds_parser, write


def child(root: str, blocks: str) -> None:
    import fastdata
    from fastdata import transforms as T
    from fastdata.image import order

    if blocks == "1024_samples":
        order._BLOCK_BYTES = 1 << 62  # no byte bound: every block 1024 samples' batches
    loader = fastdata.loader(sorted(glob.glob(os.path.join(root, "s-*.tar"))), batch_size=32, shuffle=True,
                             backend="wds", num_workers=0, transform=T.Compose([T.RandomResizedCrop(64)]))
    t, n = time.perf_counter(), 0
    for _, labels in loader:
        n += len(labels)
    rate = n / (time.perf_counter() - t)
    sizes, blocks = loader.samples.sizes, loader._order.blocks(0, 0)
    held = max(int(sizes[loader._order.block_ids(0, 0, b)].sum()) for b in range(blocks))
    print(json.dumps({"images_per_s": [rate], "largest_block_mb": held / 2 ** 20, "samples": n,
                      "sample_bytes": float(loader.samples.sizes.mean()),
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def make(root: str, images: int, small: int) -> None:
    import numpy as np
    from PIL import Image

    from fastdata.shard import write_shards

    rng = np.random.default_rng(0)
    for kind, count, shape in (("large", images, (1200, 1600, 3)), ("small", small, (64, 64, 3))):
        for i in range(count):
            os.makedirs(os.path.join(root, kind, f"c{i % 2}"), exist_ok=True)
            pixels = rng.integers(0, 256, shape, dtype=np.uint8)
            Image.fromarray(pixels).save(os.path.join(root, kind, f"c{i % 2}", f"{i:05d}.jpg"), quality=95)
        if count:
            write_shards(os.path.join(root, kind), os.path.join(root, f"s-{kind}-%03d.tar"), workers=1,
                         progress=False)


def main() -> None:
    ap = rounds_parser(__doc__)
    ap.set_defaults(images=1100)
    ap.add_argument("--small", type=int, default=12000, help="small samples in shards of their own")
    ap.add_argument("--blocks", help="child: 1024_samples or by_bytes")
    args = ap.parse_args()
    if args.child:
        child(args.child, args.blocks)
        return
    with tempfile.TemporaryDirectory(prefix="fastdata-bench-blocks-") as root:
        make(root, args.images, args.small)
        me = [sys.executable, os.path.abspath(__file__), "--child", root, "--blocks"]
        sides = {"1024_samples": me + ["1024_samples"], "by_bytes": me + ["by_bytes"]}
        rates, reports = process_rounds(sides, args.rounds)
    peak = {k: median([r["peak_rss_mb"] for r in v]) for k, v in reports.items()}
    out = {name: {"images_per_s": median(rates[name]), "peak_rss_mb": peak[name],
                  "largest_block_mb": reports[name][0]["largest_block_mb"], "runs": reports[name]} for name in sides}
    mean = reports["by_bytes"][0]["sample_bytes"]
    print(f"{args.images} large and {args.small} small samples, {mean / 1e6:.2f} MB on average; one epoch, 0 workers, "
          "in rounds of fresh processes")
    for name, o in out.items():
        print(f"  {name:<13} largest block {o['largest_block_mb']:6.0f} MiB  peak RSS {o['peak_rss_mb']:7.0f} MB  "
              f"{o['images_per_s']:6.0f} img/s")
    ratio = peak["1024_samples"] / peak["by_bytes"]
    speed = out["by_bytes"]["images_per_s"] / out["1024_samples"]["images_per_s"]
    print(f"  peak memory: by_bytes {ratio:.2f}x less; rate {speed:.2f}x")
    write("shard_blocks", {"images": args.images, "small": args.small, "sample_bytes": mean, "sides": out,
                           "peak_ratio": ratio}, args.json)


if __name__ == "__main__":
    main()
