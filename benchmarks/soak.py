"""Bounded memory: host memory and /dev/shm over a long run, per backend (a measurement, not a
speed claim).

Each configuration runs `--epochs` epochs (20 by default) in its own process, so that none
inherits another's heap: the synthetic ImageNet-like set (2,000 images) with RandomResizedCrop
+ horizontal flip (fastdata.transforms), uint8 batches of 256 on the CPU, shuffled, 2 workers:

- `pil` (the folder) and `wds` (its shards, 250 samples each), persistent workers off and on;
- `dali` on the folder (device="cpu"; num_workers is DALI's thread count, there are no worker
  processes, so one setting);
- the drop-in mode (`torch`) over a TensorDataset of ready uint8 tensors of the same size,
  persistent workers off and on.

At the last batch of every epoch (the workers still alive, persistent or not) it reads, for the
configuration's process and every live descendant, /proc/<pid>/smaps_rollup and the /dev/shm
segments those processes map or hold open. The figure judged is the job's memory:
- anonymous memory: Pss_Anon summed over the processes. Pss, not Rss: a page mapped by k
  processes counts 1/k in each, so the pages a forked worker still shares with its parent
  count once in the sum, where summed Rss counts them in every process. Anonymous only: file
  pages (libtorch's code alone is hundreds of MB) are shared with every other Python process
  on the machine, whose number moves each process's Pss share under us, and no leak is there;
- plus shared memory: the blocks tmpfs holds for each /dev/shm segment the processes map or
  hold open, each segment once (by inode). Not Pss_Shmem: a batch slot that no process has
  touched since the workers were forked counts in nobody's Pss, yet it occupies memory. torch
  unlinks its segment names at once, so they are not in a listing of /dev/shm, only in
  /proc/<pid>/maps (sized through map_files) and fd.
Rss and Pss of each process, and the space used on the whole /dev/shm file system (other jobs
included), are recorded beside it. After the last epoch the loader is dropped and the names the
job's processes left in /dev/shm are counted (torch's are torch_<pid>_...).

Verdict per configuration: flat when max/min of the figure over epochs 3..N (after the rings,
allocator arenas and page cache have warmed up) is within 5%; the least-squares slope over
those epochs is printed with it, and the same for the last 5 epochs (a curve that climbs to a
ceiling and stays there, as a buffer ring filled lazily or an allocator's high-water mark does,
is flat there; a leak is not). The /dev/shm held is steady when its max over epochs 3..N
exceeds its max over the first two epochs by less than one batch. Prints the curves and the
verdicts; writes JSON (benchmarks/results/soak.json).

    OMP_NUM_THREADS=1 python benchmarks/soak.py [--images 2000] [--epochs 20] [--batch 256]
        [--size 224] [--configs pil,pil-persistent,...] [--malloc-trim] [--json PATH]

`--malloc-trim` runs the configurations with glibc's trim threshold at 0, so that freed heap
goes back to the system at once: a curve that is flat with it and not without is memory glibc
keeps for reuse, not a leak.

`--child CONFIG` runs one configuration and prints one JSON line per epoch and a last line
with what was left at exit; tests/robustness/test_soak.py runs it that way on a small set.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

HERE = Path(__file__).resolve().parent
PER_SHARD = 250
WORKERS = 2
STEADY_FROM = 3  # first epoch (1-based) of the steady part
FLAT = 0.05
TAIL = 5  # the last epochs, judged apart

# name -> (backend, persistent_workers); "torch" is the drop-in mode over ready tensors.
CONFIGS = {
    "pil": ("pil", False),
    "pil-persistent": ("pil", True),
    "wds": ("wds", False),
    "wds-persistent": ("wds", True),
    "dali": ("dali", False),
    "torch": ("torch", False),
    "torch-persistent": ("torch", True),
}


# ----------------------------------------------------------------- reading /proc

def descendants(pid: int) -> list[int]:
    """The live descendants of `pid`, from the parent ids in /proc/*/stat."""
    parent: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:  # exited meanwhile
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        fields = stat[stat.rfind(")") + 2:].split()
        if fields[0] != "Z":  # a zombie holds no memory
            parent.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        kids = parent.get(todo.pop(), [])
        out += kids
        todo += kids
    return sorted(out)


_ROLLUP = ("Rss", "Pss", "Pss_Anon", "Pss_Shmem")


def rollup(pid: int) -> dict[str, int] | None:
    """Rss, Pss, Pss_Anon and Pss_Shmem of `pid` in bytes (smaps_rollup), None once it is gone.
    A kernel without the Pss_Anon/Pss_Shmem split (before 5.9) gets Pss as Pss_Anon."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            text = f.read()
    except OSError:
        return None
    values = {}
    for line in text.splitlines()[1:]:
        key, _, rest = line.partition(":")
        if key in _ROLLUP:
            values[key] = int(rest.split()[0]) * 1024
    if not values:
        return None
    if "Pss_Anon" not in values:
        values["Pss_Anon"], values["Pss_Shmem"] = values.get("Pss", 0), 0
    return {k: values.get(k, 0) for k in _ROLLUP}


def shm_segments(pids: list[int]) -> dict[tuple[int, int], tuple[str, int]]:
    """The /dev/shm files the processes `pids` hold mapped or open, each once: (device, inode)
    -> (name, bytes tmpfs holds for it: its blocks, whether or not any process has touched
    them). A mapping is sized through /proc/<pid>/map_files (which needs CAP_SYS_ADMIN), else
    by its extent."""
    found: dict[tuple[int, int], tuple[str, int]] = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                lines = [line for line in f if "/dev/shm/" in line]
        except OSError:
            continue
        for line in lines:
            addr, _, offset, dev, inode, path = line.split(maxsplit=5)
            major, minor = (int(x, 16) for x in dev.split(":"))
            key = (os.makedev(major, minor), int(inode))
            if key in found:
                continue
            try:
                size = os.stat(f"/proc/{pid}/map_files/{addr}").st_blocks * 512
            except OSError:
                start, end = (int(x, 16) for x in addr.split("-"))
                size = end - start + int(offset, 16)
            found[key] = (_shm_name(path), size)
    for pid in pids:  # open and not mapped (a segment on its way between processes)
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("/dev/shm/"):
                    st = os.stat(f"/proc/{pid}/fd/{fd}")
                    found.setdefault((st.st_dev, st.st_ino), (_shm_name(target), st.st_blocks * 512))
            except OSError:
                continue
    return found


def _shm_name(path: str) -> str:
    return path.strip().removeprefix("/dev/shm/").removesuffix(" (deleted)")


def shm_fs_used() -> int:
    """Bytes in use on the /dev/shm file system (every job on the machine)."""
    st = os.statvfs("/dev/shm")
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def measure(root: int) -> dict:
    """Memory of process `root` and its live descendants: their anonymous memory (Pss) and
    the /dev/shm segments they hold (each once), and the total of the two."""
    main = rollup(root)
    kids = descendants(root)
    workers = [r for r in map(rollup, kids) if r is not None]
    summed = {k: sum(w[k] for w in workers) for k in _ROLLUP}
    segments = shm_segments([root, *kids])
    shm = sum(size for _, size in segments.values())
    return {"main": main, "workers": summed, "n_workers": len(workers), "pids": [root, *kids],
            "total": main["Pss_Anon"] + summed["Pss_Anon"] + shm,
            "shm_bytes": shm, "shm_segments": len(segments),
            "shm_names": sorted(name for name, _ in segments.values()), "shm_fs_used": shm_fs_used()}


# ----------------------------------------------------------------- one configuration

def _ready_tensors(n: int, size: int, classes: int):
    """A TensorDataset of n uint8 images [3, size, size]: image i holds i % 256 in channel 0
    and i // 256 in channel 1 (so a batch says which samples it holds), its label in channel 2."""
    import torch
    from torch.utils.data import TensorDataset

    i = torch.arange(n)
    labels = i % classes
    images = torch.empty((n, 3, size, size), dtype=torch.uint8)
    images[:, 0] = (i % 256).to(torch.uint8)[:, None, None]
    images[:, 1] = (i // 256).to(torch.uint8)[:, None, None]
    images[:, 2] = labels.to(torch.uint8)[:, None, None]
    return TensorDataset(images, labels)


def _make_loader(name: str, args: argparse.Namespace):
    import fastdata
    from fastdata import transforms as T

    backend, persistent = CONFIGS[name]
    if backend == "torch":
        dataset = _ready_tensors(args.images, args.size, args.classes)
        return fastdata.loader(dataset, batch_size=args.batch, shuffle=True, num_workers=args.workers,
                               persistent_workers=persistent)
    transform = T.Compose([T.RandomResizedCrop(args.size), T.RandomHorizontalFlip()])
    source = args.shards if backend == "wds" else args.root
    extra = {"persistent_workers": persistent} if backend != "dali" else {}
    return fastdata.loader(source, batch_size=args.batch, shuffle=True, num_workers=args.workers,
                           transform=transform, device="cpu", backend=backend, **extra)


def _check_dropin(images, labels, classes: int) -> list[int]:
    """The sample ids of a drop-in batch, checked against their labels."""
    ids = images[:, 0, 0, 0].long() + 256 * images[:, 1, 0, 0].long()
    if not (ids % classes).equal(labels) or not images[:, 2, 0, 0].long().equal(labels):
        raise SystemExit("soak: a drop-in batch's labels do not match its images")
    return ids.tolist()


def child(name: str, args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)
    me = os.getpid()
    loader = _make_loader(name, args)
    # What exists before the first epoch is frozen out of the collector, as pre-fork servers do:
    # a full collection in a forked worker writes to every object's header and so unshares its
    # pages, a step of tens of MB in the job's Pss at whichever epoch the collector's counters
    # cross their threshold, which is not memory the loader holds.
    gc.freeze()
    seen_pids: set[int] = set()
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        t = time.perf_counter()
        labels_seen = [0] * args.classes
        ids: list[int] = []
        last = len(loader) - 1
        sample = None
        for k, (images, labels) in enumerate(loader):
            for c in labels.tolist():
                labels_seen[c] += 1
            if CONFIGS[name][0] == "torch":
                ids += _check_dropin(images, labels, args.classes)
            if k == last:
                sample = measure(me)  # the workers are alive at the last batch, persistent or not
            del images, labels
        if sample is None:
            raise SystemExit(f"soak: epoch {epoch + 1} of {name} gave no batch")
        if ids and sorted(ids) != list(range(args.images)):
            raise SystemExit(f"soak: epoch {epoch + 1} of {name} did not give every sample once")
        seconds = time.perf_counter() - t
        after = measure(me)  # between epochs: persistent workers alive, others gone
        seen_pids.update(sample["pids"], after["pids"])
        sample.update(epoch=epoch + 1, seconds=seconds, labels=labels_seen, children_after=after["n_workers"],
                      total_between=after["total"])
        print(json.dumps(sample), flush=True)
    del loader
    gc.collect()
    deadline = time.monotonic() + 10
    while descendants(me) and time.monotonic() < deadline:
        time.sleep(0.05)
    seen_pids.discard(me)  # names of this process's own live segments are gone when it exits
    prefixes = tuple(f"torch_{pid}_" for pid in seen_pids)
    left = sorted(n for n in os.listdir("/dev/shm") if n.startswith(prefixes))
    print(json.dumps({"done": True, "children_left": len(descendants(me)), "shm_names_left": left,
                      "shm_fs_used": shm_fs_used()}), flush=True)


def run_child(name: str, args: argparse.Namespace, echo: bool = True) -> tuple[list[dict], dict]:
    """Runs one configuration in its own process: (its epochs, its exit record)."""
    cmd = [sys.executable, __file__, "--child", name, "--root", args.root, "--shards", args.shards,
           "--images", str(args.images), "--classes", str(args.classes), "--epochs", str(args.epochs),
           "--batch", str(args.batch), "--size", str(args.size), "--workers", str(args.workers)]
    env = dict(os.environ)
    if args.malloc_trim:
        env["MALLOC_TRIM_THRESHOLD_"] = "0"
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    epochs, done = [], {}
    for line in proc.stdout:
        record = json.loads(line)
        if record.get("done"):
            done = record
            continue
        epochs.append(record)
        if echo:
            print(f"  {name:<17} epoch {record['epoch']:>3}: {record['total'] / 2**20:8.1f} MB, "
                  f"/dev/shm held {record['shm_bytes'] / 2**20:7.1f} MB ({record['seconds']:.1f} s)",
                  file=sys.stderr, flush=True)
    if proc.wait() != 0:
        raise SystemExit(f"soak: {name} failed (exit code {proc.returncode})")
    return epochs, done


# ----------------------------------------------------------------- the verdict

def slope(ys: list[float]) -> float:
    """Least-squares slope of ys against 0, 1, 2, ... (units of y per epoch)."""
    n = len(ys)
    if n < 2:
        return 0.0
    mx, my = (n - 1) / 2, sum(ys) / n
    return sum((x - mx) * (y - my) for x, y in enumerate(ys)) / sum((x - mx) ** 2 for x in range(n))


def verdict(epochs: list[dict], batch_bytes: int, steady_from: int = STEADY_FROM) -> dict:
    """Flat (max/min within FLAT over epochs steady_from..N), the slope there, and the same
    over the last TAIL epochs (a curve that climbs to a ceiling and stays there differs from a
    leak there); whether the /dev/shm held stayed within one batch of its first epochs'."""
    steady = [e["total"] for e in epochs[steady_from - 1:]]
    tail = [e["total"] for e in epochs[-TAIL:]]
    lo, hi = min(steady), max(steady)
    shm_early = max(e["shm_bytes"] for e in epochs[:steady_from - 1]) if steady_from > 1 else 0
    shm_steady = max(e["shm_bytes"] for e in epochs[steady_from - 1:])
    return {"epochs": f"{steady_from}-{len(epochs)}", "min": lo, "max": hi, "spread": hi / lo - 1,
            "slope_per_epoch": slope(steady), "flat": hi / lo - 1 <= FLAT,
            "tail_epochs": f"{len(epochs) - len(tail) + 1}-{len(epochs)}", "tail_spread": max(tail) / min(tail) - 1,
            "tail_slope_per_epoch": slope(tail),
            "shm_max_early": shm_early, "shm_max_steady": shm_steady,
            "shm_growth_batches": (shm_steady - shm_early) / batch_bytes,
            "shm_steady": shm_steady - shm_early < batch_bytes}


def _mb(x: float) -> str:
    return f"{x / 2**20:.1f}"


def _print_config(name: str, epochs: list[dict], done: dict, v: dict) -> None:
    backend, persistent = CONFIGS[name]
    workers = "threads" if backend == "dali" else "workers"
    print(f"\n{name}: backend {backend}, {WORKERS} {workers}"
          + ("" if backend == "dali" else f", persistent_workers={persistent}"))
    print("MB; main, workers: Pss_Anon (workers summed); shm: the /dev/shm segments held; total: the three; "
          "Rss: summed over the processes, for comparison")
    print(f"{'epoch':>5} {'main':>8} {'workers':>8} {'shm':>7} {'total':>8} {'Rss':>8} {'segments':>9} "
          f"{'processes':>10}")
    for e in epochs:
        rss = e["main"]["Rss"] + e["workers"]["Rss"]
        print(f"{e['epoch']:>5} {_mb(e['main']['Pss_Anon']):>8} {_mb(e['workers']['Pss_Anon']):>8} "
              f"{_mb(e['shm_bytes']):>7} {_mb(e['total']):>8} {_mb(rss):>8} {e['shm_segments']:>9} "
              f"{1 + e['n_workers']:>10}")
    word = "flat" if v["flat"] else "NOT flat"
    shm = "steady" if v["shm_steady"] else f"grew by {v['shm_growth_batches']:.1f} batches"
    print(f"verdict: {word}: epochs {v['epochs']} within {100 * v['spread']:.1f}% (min {_mb(v['min'])} MB, max "
          f"{_mb(v['max'])} MB; limit {100 * FLAT:.0f}%), slope {v['slope_per_epoch'] / 2**20:+.2f} MB/epoch; "
          f"epochs {v['tail_epochs']} within {100 * v['tail_spread']:.1f}%, slope "
          f"{v['tail_slope_per_epoch'] / 2**20:+.2f} MB/epoch; /dev/shm held {shm} (max "
          f"{_mb(v['shm_max_steady'])} MB in epochs {v['epochs']}, {_mb(v['shm_max_early'])} MB before); at exit: "
          f"{done.get('children_left', '?')} processes left, "
          f"{len(done.get('shm_names_left', []))} names left in /dev/shm")


# ----------------------------------------------------------------- main

def _data(args: argparse.Namespace) -> None:
    """The synthetic set and its shards, made once (shared with benchmarks/wds.py)."""
    from fastdata.shard import read_index, write_shards
    from fastdata.synthetic import make_imagenet_like

    make_imagenet_like(args.root, n_images=args.images, progress=True)
    folder = Path(args.shards).parent
    index = folder / "train-index.json"
    if not (index.exists() and read_index(index)["total"] == args.images):
        print(f"writing shards to {folder}...", file=sys.stderr)
        write_shards(args.root, folder / "train-%06d.tar", max_count=PER_SHARD, progress=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--workers", type=int, default=WORKERS)
    ap.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated, of: " + ", ".join(CONFIGS))
    ap.add_argument("--root", default=str(HERE / "data" / "imagenet-like"))
    ap.add_argument("--shards", default=None, help="a shard pattern (default: the root's shards, as benchmarks/wds.py)")
    ap.add_argument("--malloc-trim", action="store_true",
                    help="run the configurations with glibc's trim threshold at 0 (MALLOC_TRIM_THRESHOLD_=0): freed "
                         "heap goes back to the system at once, so what stays is live memory (tells a leak from "
                         "memory the allocator keeps for reuse)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", choices=list(CONFIGS), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.shards is None:
        args.shards = f"{args.root}-shards/train-{{000000..{-(-args.images // PER_SHARD) - 1:06d}}}.tar"
    if args.child:
        child(args.child, args)
        return
    names = [n for n in args.configs.split(",") if n]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        ap.error(f"--configs should name some of {', '.join(CONFIGS)}, but got {', '.join(unknown)}")
    if args.epochs < STEADY_FROM + 1:
        ap.error(f"--epochs should be at least {STEADY_FROM + 1}, but got {args.epochs}")

    import _common

    _data(args)
    batch_bytes = args.batch * 3 * args.size * args.size
    print(f"{args.images} images, {args.epochs} epochs, batch {args.batch} of {args.size}x{args.size} uint8 "
          f"({_mb(batch_bytes)} MB), {args.workers} workers; figure: Pss_Anon summed over the process and "
          f"its workers + the /dev/shm segments they hold", file=sys.stderr)
    report: dict = {"images": args.images, "epochs": args.epochs, "batch": args.batch, "size": args.size,
                    "workers": args.workers, "batch_bytes": batch_bytes, "malloc_trim": args.malloc_trim,
                    "figure": "at each epoch's last batch: smaps_rollup Pss_Anon summed over the process and its live "
                              "descendants, plus the tmpfs blocks of the /dev/shm segments they map or hold open",
                    "flat_limit": FLAT, "configs": {}}
    for name in names:
        epochs, done = run_child(name, args)
        v = verdict(epochs, batch_bytes)
        for e in epochs:
            del e["pids"], e["shm_names"]  # per-run detail, not part of the record
        report["configs"][name] = {"backend": CONFIGS[name][0], "persistent_workers": CONFIGS[name][1],
                                   "epochs": epochs, "exit": done, "verdict": v}
    for name in names:
        c = report["configs"][name]
        _print_config(name, c["epochs"], c["exit"], c["verdict"])
    _common.write("soak", report, args.json)


if __name__ == "__main__":
    main()
