"""Speed at ImageNet scale: fastdata `pil` with the machine's checkpoint index against DALI's CPU
ROI decode alone and DataLoader + Pillow-SIMD, epoch 1 and the steady state apart.

The regime of a 1.28M-file dataset, reproduced on the synthetic ImageNet-like set (2,000 files
of about 410x350, 95 kB, in the page cache for every side alike):

- the index is as full as ImageNet makes it: each fastdata process starts with an index file
  of its own (the documented format, csrc/index.h) holding 1,279,167 other files: their slots
  filled with random tags, so every lookup probes a table loaded as ImageNet's (61%), and the
  arena's fill counter advanced by their records' bytes (sparse: nothing reads them);
- the index starts without the timed files (cold): epoch 1 is a first job's epoch 1 on the
  machine, which decodes each file whole and indexes it; from epoch 2 every file is found, as
  at any dataset size the index holds (1.57M files), in every worker and every later job.

Sides, each in its own process, in rounds (ABBA), --epochs epochs each, all timed, the first apart:

- pil: fastdata.loader(folder, backend="pil"), persistent workers, the first job to meet the files;
- pil-fresh: the same with persistent_workers=False (DataLoader's default: new workers every
  epoch);
- pil-later: a later job: an earlier one (its own process, before the timing) made one pass,
  so epoch 1 finds every file in the index;
- pil-auto: fastdata.loader's defaults (num_workers="auto", persistent_workers=False), which
  decode in the training process on a thread a core, as DALI's pipeline does; a first job;
- dali-decode: DALI's CPU ROI decode alone (fn.decoders.image_random_crop, nothing after it:
  benchmarks/peers.py's side), the decode ceiling rather than a pipeline;
- dataloader: DataLoader + the Pillow this environment runs (Pillow-SIMD after install.sh),
  persistent workers.

All: RandomResizedCrop(224, scale=(0.08, 1)), flip, uint8 batches of 256, 2 workers or threads.
Every epoch's labels are checked against the files'. Prints images/s (median over rounds) for
epoch 1, epoch 1 from its first batch on (the start is one batch of ImageNet's 5,005, here one
of 8) and epochs 2+, the ratios against DALI's decode and DataLoader, what fresh workers cost
an epoch, the index's bytes a file and its total for ImageNet; writes
benchmarks/results/large_dataset.json.

    OMP_NUM_THREADS=1 python benchmarks/large_dataset.py [--images 2000] [--rounds 3] [--epochs 5]
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import _common
import peers

IMAGENET = 1_281_167
SIDES = ["pil", "pil-fresh", "pil-later", "pil-auto", "dali-decode", "dataloader"]
# each pil side's loader keywords beyond the transform's (see the docstring)
PIL_OPTIONS = {"pil": {"persistent_workers": True}, "pil-later": {"persistent_workers": True},
               "pil-earlier": {"persistent_workers": True}, "pil-fresh": {"persistent_workers": False},
               "pil-auto": {"num_workers": "auto", "persistent_workers": False}}


def prefill(path: Path, others: int, record_bytes: int) -> None:
    """An index file at `path` as csrc/index.h lays it out, holding `others` files: their tags
    in the slots (linear probing from each tag's home slot), their records' bytes counted as
    used in the arena, which stays sparse (what a lookup of another file never reads)."""
    import numpy as np

    from fastdata import _codec

    slots, arena = _codec.INDEX_SLOTS, _codec.INDEX_ARENA
    rng = np.random.default_rng(1)
    tags = rng.integers(0, 2**63, size=others, dtype=np.uint64) * np.uint64(2) | np.uint64(1)
    table = np.zeros((slots, 2), np.uint64)
    # Linear probing's placement, which does not depend on the order of insertion: in order of
    # home slot, each tag takes the first slot at or after its home and after the one before.
    tags.sort()
    home = (tags & np.uint64(slots - 1)).astype(np.int64)
    order = np.argsort(home, kind="stable")
    tags, home = tags[order], home[order]
    k = np.arange(others)
    pos = np.maximum.accumulate(home - k) + k
    inside = pos < slots
    table[pos[inside], 0] = tags[inside]
    free = iter(np.flatnonzero(table[:, 0] == 0).tolist())  # those past the end wrap to the start
    for tag in tags[~inside].tolist():
        table[next(free), 0] = tag
    table[table[:, 0] != 0, 1] = 1  # published; never read: no real file's tag matches
    used = others * record_bytes
    header = struct.pack("<8sIIQQQQQQ", b"FDJPIDX1", 1, _codec.INDEX_CHECKPOINTS, slots, arena,
                         *struct.unpack("<QQ", os.urandom(16)), used, others)
    path.parent.mkdir(parents=True, mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(header.ljust(4096, b"\0"))
        f.write(table.tobytes())
        f.truncate(4096 + slots * 16 + arena)


def child(side: str, root: str, epochs: int, record_bytes: int) -> None:
    from fastdata.synthetic import make_file_list

    files = make_file_list(root)
    want = Counter(label for _, label in files)
    report: dict = {}
    if side.startswith("pil"):
        earlier = side == "pil-earlier"  # pil-later's earlier job: its cache, already prefilled
        cache = Path(os.environ["FASTDATA_CACHE"] if earlier else tempfile.mkdtemp(prefix="fastdata-large-"))
        os.environ["FASTDATA_CACHE"] = str(cache)
        from fastdata import _codec

        if not earlier:
            prefill(Path(_codec.index_path()), IMAGENET - len(files), record_bytes)
        if side == "pil-later":  # an earlier job on this machine: one pass, in a process of its own
            subprocess.run([sys.executable, __file__, "--child", "pil-earlier", "--root", root, "--epochs", "1"],
                           check=True, stdout=subprocess.DEVNULL)
        loader = _common.fastdata_loader(root, "pil", **PIL_OPTIONS[side])
        before = _codec.index_stats()
        make_iter = lambda: loader  # noqa: E731
    elif side == "dali-decode":
        make_iter = peers.dali_decode_only(files)
    else:
        make_iter = _common.dataloader_pillow(files)
    rates, after_first = [], []
    for e in range(epochs):
        labels = []
        t = time.perf_counter()
        for _, batch_labels in make_iter():
            if not labels:
                first_at, first_n = time.perf_counter(), len(batch_labels)
            labels.append(batch_labels)
        end = time.perf_counter()
        rates.append(len(files) / (end - t))
        after_first.append((len(files) - first_n) / (end - first_at))
        got = Counter(int(v) for b in labels for v in peers._numpy(b).reshape(-1))
        if got != want:
            raise SystemExit(f"{side}: epoch {e + 1}'s labels are not the files'")
    if side.startswith("pil"):
        after = _codec.index_stats()
        first = side != "pil-later"  # the job that met the files first indexed them all, each once
        expect = (IMAGENET - len(files), len(files)) if first else (IMAGENET, 0)
        if (before["files"], after["files"] - before["files"]) != expect:
            raise SystemExit(f"{side}: the index held {before['files']} files and took {after['files'] - before['files']}")
        if first:
            report["index"] = {"files": after["files"], "bytes_a_record": (after["used"] - before["used"]) / len(files)}
        if not earlier:
            shutil.rmtree(cache, ignore_errors=True)
    print(json.dumps({"images_per_s": rates, "after_first_batch": after_first, **report}), flush=True)


def main() -> None:
    ap = _common.rounds_parser(__doc__, rounds=3)
    ap.set_defaults(epochs=5)
    ap.add_argument("--record-bytes", type=int, default=480,
                    help="bytes a prefilled record stands for (the synthetic set's measured mean)")
    args = ap.parse_args()
    if args.child:
        child(args.child, args.root, args.epochs, args.record_bytes)
        return
    from fastdata.synthetic import make_imagenet_like

    make_imagenet_like(args.root, n_images=args.images, progress=True)
    sides = [s for s in SIDES if not (s == "dali-decode" and peers.missing(s, args.root))]
    commands = {s: [sys.executable, __file__, "--child", s, "--root", args.root, "--epochs", str(args.epochs),
                    "--record-bytes", str(args.record_bytes)] for s in sides}
    print(f"{args.images} images, batch 256, 2 workers, {args.rounds} rounds x {args.epochs} epochs, "
          f"index prefilled with {IMAGENET - args.images:,} other files", file=sys.stderr)
    _, reports = _common.process_rounds(commands, args.rounds)
    first = {s: statistics.median(r["images_per_s"][0] for r in reports[s]) for s in sides}
    steady = {s: statistics.median(x for r in reports[s] for x in r["images_per_s"][1:]) for s in sides}
    # Epoch 1 from its first batch on: what a 1.28M-file epoch 1 runs at, where the start (workers
    # forked, a first batch decoded on one core; DALI builds its pipeline before its timing) is one
    # batch of 5,005 rather than one of 8.
    running = {s: statistics.median(r["after_first_batch"][0] for r in reports[s]) for s in sides}
    # Fresh workers each epoch cost their start-up (and a first batch decoded on one core) once an
    # epoch: seconds against persistent workers, a rounding error in an epoch of ImageNet's 5,005
    # batches, where fresh and persistent workers run at one rate (the index is the machine's).
    startup = args.images / steady["pil-fresh"] - args.images / steady["pil"]
    index = reports["pil"][0]["index"]
    per_file = index["bytes_a_record"] + 16 * 2**21 / IMAGENET  # its record, and its share of the slots
    total = 4096 + 16 * 2**21 + IMAGENET * index["bytes_a_record"]
    print(f"\n{'side':<14}{'epoch 1':>10}{'(after its first batch)':>25}{'epochs 2+':>12}   (images/s, median over rounds)")
    for s in sides:
        print(f"{s:<14}{first[s]:>10,.0f}{running[s]:>25,.0f}{steady[s]:>12,.0f}")
    ratios = {}
    for s in ("pil", "pil-fresh", "pil-later", "pil-auto"):
        for base in ("dali-decode", "dataloader"):
            if base in sides:
                ratios[f"{s}/{base}"] = {"epoch_1": first[s] / first[base], "steady": steady[s] / steady[base],
                                         "epoch_1_after_first_batch": running[s] / running[base]}
                print(f"{s} against {base}: epoch 1 {first[s] / first[base]:.2f}x (after its first batch "
                      f"{running[s] / running[base]:.2f}x), epochs 2+ {steady[s] / steady[base]:.2f}x")
    print(f"fresh workers: {startup:.2f} s an epoch more than persistent ones")
    print(f"index: {index['bytes_a_record']:.0f} bytes a record, {per_file:.0f} a file with its slots; "
          f"for ImageNet's {IMAGENET:,} files {total / 2**20:,.0f} MiB (one copy a machine)")
    _common.write("large_dataset", {
        "images": args.images, "rounds": args.rounds, "epochs": args.epochs, "prefilled": IMAGENET - args.images,
        "epoch_1": first, "epoch_1_after_first_batch": running, "steady": steady, "ratios": ratios, "fresh_worker_startup_s": startup, "runs": reports,
        "index": {"bytes_a_record": index["bytes_a_record"], "bytes_a_file": per_file, "imagenet_total_bytes": total},
    }, args.json)


if __name__ == "__main__":
    main()
