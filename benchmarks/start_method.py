"""An image loader's first pass in a fresh process, its workers started by fork or by forkserver.

Where forkserver is the platform's default (Linux from Python 3.14) an image loader's workers
still fork (`fastdata._workers.own_start_method`); this measures what following the default
would cost: the ImageNet training transform of benchmarks/imagenet_cpu.py on the synthetic
ImageNet-like set, 2 workers, one process per candidate that builds the loader and times its
first pass (to the first batch, and whole) and a second pass with a fresh loader; forkserver's
server preloads torch and fastdata, as Python 3.14's preloads a script's imports. forkserver is
asked for with `multiprocessing.set_start_method`, which this Python (whose default is fork)
takes as the script's choice. Candidates alternate in ABBA rounds after a warm-up process
(imports, page cache). Prints the medians and forkserver's ratio to fork; writes JSON.

    OMP_NUM_THREADS=1 python benchmarks/start_method.py [--images 2000] [--rounds 4] [--json PATH]
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import time

import _common
from fastdata._workers import FORKSERVER_PRELOAD

CANDIDATES = ("fork", "forkserver")


def _child(method: str, root: str) -> None:
    if method != "fork":
        multiprocessing.set_start_method(method)
        # Python 3.14's server preloads the main module, and with it a script's imports (before 3.13.8
        # it never did: gh-126631); here the server preloads them by name.
        multiprocessing.set_forkserver_preload(list(FORKSERVER_PRELOAD))
    passes, firsts = [], []
    for _ in range(2):  # the first pass starts the forkserver (with forkserver); the second finds it
        t = time.perf_counter()
        first, n = None, 0
        for batch in _common.fastdata_loader(root, "pil", num_workers=2):
            if first is None:
                first = time.perf_counter() - t
            n += len(batch[1])
        passes.append(time.perf_counter() - t)
        firsts.append(first)
    print(json.dumps({"images_per_s": [n / s for s in passes], "pass_s": passes, "first_s": firsts}))


def main() -> None:
    ap = _common.rounds_parser(__doc__, rounds=4)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.child:
        _child(args.child, args.root)
        return
    from fastdata.synthetic import make_imagenet_like

    make_imagenet_like(args.root, n_images=args.images, progress=True)
    commands = {m: [sys.executable, __file__, "--child", m, "--root", args.root] for m in CANDIDATES}
    _common.process_rounds({"warm-up": commands["fork"]}, 1)
    _, reports = _common.process_rounds(commands, args.rounds)
    med = _common.median
    results = {}
    for m in CANDIDATES:
        runs = reports[m]
        results[m] = {key: [r[field][i] for r in runs] for key, field, i in (
            ("first_batch_s", "first_s", 0), ("first_pass_s", "pass_s", 0), ("second_first_batch_s", "first_s", 1),
            ("second_pass_s", "pass_s", 1))}
    print(f"\n{args.images} images, batch {_common.BATCH}, 2 workers; medians over {args.rounds} processes each")
    print(f"{'':12} {'first batch':>12} {'first pass':>11} {'2nd: first batch':>17} {'2nd pass':>9}")
    for m in CANDIDATES:
        r = results[m]
        print(f"{m:12} " + " ".join(f"{med(r[k]):{w}.2f}s" for k, w in (
            ("first_batch_s", 11), ("first_pass_s", 10), ("second_first_batch_s", 16), ("second_pass_s", 8))))
    ratios = {k: med(results["forkserver"][k]) / med(results["fork"][k]) for k in results["fork"]}
    results["forkserver_to_fork"] = ratios
    print("forkserver / fork: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))
    _common.write("start_method", {"images": args.images, "rounds": args.rounds, "candidates": results}, args.json)


if __name__ == "__main__":
    main()
