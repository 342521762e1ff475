"""fastdata against the loaders a user would pick instead on a CPU box, in one paired run.

Every side does the ImageNet training transform on the same synthetic ImageNet-like files
(`fastdata.synthetic`; the shard sides on the same images written as shards by
`fastdata-shard`): decode, RandomResizedCrop(224, scale=(0.08, 1), ratio=(3/4, 4/3)), random
horizontal flip, uint8 batches of 256 (NCHW, or NHWC where the loader makes that) with the
labels, 2 workers or threads (one a core):

- pil: fastdata.loader(folder, backend="pil"), persistent workers;
- wds: fastdata.loader(shards, backend="wds"), persistent workers;
- dataloader: DataLoader over the Dataset a PyTorch user writes, with the Pillow this
  environment runs (Pillow-SIMD after scripts/install.sh);
- webdataset: webdataset + DataLoader (benchmarks/wds.py's baseline);
- dali: DALI's CPU pipeline, fn.decoders.image_random_crop -> fn.resize -> fn.flip, through
  DALIGenericIterator (benchmarks/dali.py's hand-written pipeline);
- dali-decode: DALI's CPU ROI decode alone (fn.decoders.image_random_crop, nothing after it,
  the batch left in DALI's buffers): the decode ceiling, not a whole pipeline;
- nodes-thread, nodes-process: torchdata 0.11 `nodes`, SamplerWrapper -> ParallelMapper
  (method="thread" or "process") over the same Dataset -> Batcher -> Mapper(default_collate)
  -> Prefetcher -> Loader;
- spdl: SPDL 0.8's thread pipeline (PipelineBuilder), FFmpeg decoding the whole image through
  spdl.io with one filter graph per image (crop, scale, flip), batches by convert_frames.

Timing, the same rule for every side (steady state): each side runs in its own process, built
once; one warm-up epoch, which is also the check (every batch uint8, 224x224x3 in either
layout, at most 256 images, at most 2 partial batches; the labels, as a multiset, those of the
files), then --epochs timed epochs, each a full pass over all images timed from asking for its
first batch to its last. A fresh process per side per round, the sides one after another,
every other round in reverse order, so drift on this shared machine hits all alike. DALI
decodes whole batches: an epoch's last batch is padded, and the padding is decoded but not
counted (none when --images is a multiple of 256).

Prints, per side, images/s (median and range over all timed epochs) and how many times faster
fastdata pil and wds are; writes benchmarks/results/peers.json. A side whose package is missing
is skipped with the reason. The peers are the `bench` extra (pip install -e ".[bench]"; DALI is
the `dali` extra); SPDL also needs FFmpeg's shared libraries (Debian 12: apt-get install
libavfilter8 libavformat59 libavdevice59 libswscale6).

    OMP_NUM_THREADS=1 python benchmarks/peers.py [--images 2000] [--rounds 3] [--epochs 2]
                                                 [--sides pil,wds,...] [--json PATH]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import random
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import _common

BATCH, SIZE, WORKERS = _common.BATCH, _common.SIZE, _common.WORKERS

# side -> (name in the table, the package it needs beyond fastdata's own)
SIDES = {
    "pil": ("fastdata pil", None),
    "wds": ("fastdata wds", None),
    "dataloader": ("DataLoader + Pillow", None),
    "webdataset": ("webdataset + DataLoader", "webdataset"),
    "dali": ("DALI CPU pipeline", "nvidia.dali"),
    "dali-decode": ("DALI CPU ROI decode alone", "nvidia.dali"),
    "nodes-thread": ("torchdata nodes, threads", "torchdata"),
    "nodes-process": ("torchdata nodes, processes", "torchdata"),
    "spdl": ("SPDL pipeline", "spdl"),
}
INSTALL = {"nvidia.dali": 'pip install -e ".[dali]"', "torchdata": 'pip install -e ".[bench]"',
           "spdl": 'pip install -e ".[bench]"', "webdataset": "pip install webdataset"}


# ----------------------------------------------------------------- the peers not in other benchmarks

def nodes_loader(files: list[tuple[str, int]], method: str) -> Callable[[], Any]:
    """torchdata.nodes as its migration guide maps a DataLoader: the same Dataset as the
    DataLoader side, `method` "thread" or "process" workers."""
    import torch
    from torch.utils.data import RandomSampler, default_collate
    from torchdata.nodes import Batcher, Loader, Mapper, ParallelMapper, Prefetcher, SamplerWrapper

    from fastdata.demo import PillowRRC

    dataset = PillowRRC(files, SIZE)
    node = SamplerWrapper(RandomSampler(dataset, generator=torch.Generator().manual_seed(0)))
    node = ParallelMapper(node, map_fn=dataset.__getitem__, num_workers=WORKERS, method=method)
    node = Prefetcher(Mapper(Batcher(node, batch_size=BATCH, drop_last=False), default_collate), prefetch_factor=2)
    loader = Loader(node)
    return lambda: loader


def spdl_loader(files: list[tuple[str, int]]) -> Callable[[], Any]:
    """An SPDL pipeline an epoch, WORKERS threads: a shuffled source -> decode (concurrency
    WORKERS) -> aggregate(256) -> collate -> sink."""
    import spdl.io
    import torch
    from spdl.pipeline import PipelineBuilder

    from fastdata.demo import rrc_params

    def decode(item: tuple[str, int, int]) -> tuple[Any, int]:
        path, label, seed = item
        rng = random.Random(seed)
        packets = spdl.io.demux_image(path)
        x, y, w, h = rrc_params(packets.width, packets.height, rng)
        flip = ",hflip" if rng.random() < 0.5 else ""
        graph = f"crop={w}:{h}:{x}:{y},scale={SIZE}:{SIZE}:flags=bilinear{flip},format=rgb24"
        return spdl.io.decode_packets(packets, filter_desc=graph), label

    def collate(items: list[tuple[Any, int]]) -> tuple[Any, Any]:
        frames, labels = zip(*items)
        return spdl.io.to_torch(spdl.io.convert_frames(list(frames))), torch.tensor(labels)

    epochs = iter(range(1 << 30))

    def epoch():
        e = next(epochs)
        order = list(range(len(files)))
        random.Random(e).shuffle(order)
        source = [(*files[i], e * len(files) + i) for i in order]
        pipeline = (PipelineBuilder().add_source(source).pipe(decode, concurrency=WORKERS).aggregate(BATCH)
                    .pipe(collate).add_sink(3).build(num_threads=WORKERS))
        with pipeline.auto_stop():
            yield from pipeline.get_iterator()

    return epoch


def dali_decode_only(files: list[tuple[str, int]]) -> Callable[[], Any]:
    """DALI's ROI decode alone: the batches stay DALI TensorLists; the last batch of an epoch
    is padded by the reader, and only its real samples' labels are given."""
    pipe = _common.dali_pipeline(files, decode_only=True, pad_last_batch=True)
    pipe.build()
    steps = math.ceil(len(files) / BATCH)

    def epoch():
        left = len(files)
        for _ in range(steps):
            images, labels = pipe.run()
            real = min(BATCH, left)
            left -= real
            yield images, labels.as_array().reshape(-1)[:real]

    return epoch


# ----------------------------------------------------------------- a side's process

def build(side: str, root: str, shards: Path, files: list[tuple[str, int]]) -> Callable[[], Any]:
    if side in ("pil", "wds"):
        count = len(list(shards.glob("train-*.tar")))
        source = root if side == "pil" else str(shards / f"train-{{000000..{count - 1:06d}}}.tar")
        loader = _common.fastdata_loader(source, side, persistent_workers=True)
        return lambda: loader
    if side == "dataloader":
        return _common.dataloader_pillow(files)
    if side == "webdataset":
        return _common.webdataset_loader(sorted(str(p) for p in shards.glob("train-*.tar")))
    if side == "dali":
        return _common.dali_loader(files)
    if side == "dali-decode":
        return dali_decode_only(files)
    if side.startswith("nodes-"):
        return nodes_loader(files, side.removeprefix("nodes-"))
    return spdl_loader(files)


def check_epoch(side: str, batches: Any, want: Counter) -> None:
    """Raises SystemExit naming what is wrong unless the epoch's batches are uint8 images of
    224x224x3 (CHW or HWC; any size for dali-decode), at most BATCH a batch with at most WORKERS
    partial ones, and their labels are `want` as a multiset."""
    got: Counter = Counter()
    partial = 0
    for images, labels in batches:
        labels = [int(v) for v in _numpy(labels).reshape(-1)]
        shapes, dtype = _describe(images)
        if dtype != "uint8":
            raise SystemExit(f"{side}: images of {dtype}, not uint8")
        if len(shapes) != (BATCH if side == "dali-decode" else len(labels)) or len(labels) > BATCH:
            raise SystemExit(f"{side}: a batch of {len(shapes)} images and {len(labels)} labels")
        ok = ((lambda s: len(s) == 3 and s[2] == 3) if side == "dali-decode"
              else (lambda s: s in ((3, SIZE, SIZE), (SIZE, SIZE, 3))))
        if not all(ok(tuple(s)) for s in shapes):
            raise SystemExit(f"{side}: images of shapes {sorted(set(map(tuple, shapes)))[:4]}")
        partial += len(labels) < BATCH
        got.update(labels)
    if partial > WORKERS:
        raise SystemExit(f"{side}: {partial} batches of fewer than {BATCH} images in one epoch")
    if got != want:
        raise SystemExit(f"{side}: the epoch's labels are not the files': {sum(got.values())} labels, "
                         f"{sum((got - want).values())} extra, {sum((want - got).values())} missing")


def _numpy(x: Any) -> Any:
    import numpy as np

    return np.asarray(x.as_array() if hasattr(x, "as_array") else x)


def _describe(images: Any) -> tuple[list, str]:
    """(the shape of each image, the dtype's name) of a batch tensor or a DALI TensorList."""
    if hasattr(images, "shape") and not callable(images.shape):  # a tensor or an array
        return [tuple(images.shape[1:])] * images.shape[0], str(images.dtype).removeprefix("torch.")
    return images.shape(), str(images.dtype).rsplit(".", 1)[-1].lower()


def _versions(side: str) -> dict:
    from importlib.metadata import version

    import PIL

    out = {"pillow": PIL.__version__}
    package = {"webdataset": "webdataset", "dali": "nvidia-dali-cuda120", "dali-decode": "nvidia-dali-cuda120",
               "nodes-thread": "torchdata", "nodes-process": "torchdata", "spdl": "spdl"}.get(side)
    if package:
        out[package] = version(package)
    return out


def child(side: str, root: str, shards: Path, epochs: int) -> None:
    from fastdata.synthetic import make_file_list

    files = make_file_list(root)
    make_iter = build(side, root, shards, files)
    check_epoch(side, make_iter(), Counter(label for _, label in files))
    rates = _common.time_epochs(make_iter, epochs, warm_up=False)
    print(json.dumps({"images_per_s": rates, "versions": _versions(side)}), flush=True)


# ----------------------------------------------------------------- the parent

def missing(side: str, root: str) -> str | None:
    """Why `side` cannot run here, or None."""
    package = SIDES[side][1]
    try:
        found = package is None or importlib.util.find_spec(package) is not None
    except ImportError:  # a parent package is missing
        found = False
    if not found:
        return f"{package} is not installed ({INSTALL[package]})"
    if side == "spdl":
        import spdl.io

        try:
            spdl.io.demux_image(str(next(Path(root).glob("*/*.JPEG"))))
        except RuntimeError as e:
            return (f"SPDL cannot load FFmpeg's libraries (Debian 12: apt-get install libavfilter8 "
                    f"libavformat59 libavdevice59 libswscale6): {str(e)[:120]}")
    return None


def main() -> None:
    ap = _common.rounds_parser(__doc__)
    ap.add_argument("--sides", default=",".join(SIDES),
                    help=f"comma-separated subset of {','.join(SIDES)} (pil is the ratios' base when present)")
    ap.add_argument("--shards", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    shards = Path(args.shards or f"{args.root}-shards")
    if args.child:
        child(args.child, args.root, shards, args.epochs)
        return
    sides = [s for s in args.sides.split(",") if s]
    unknown = [s for s in sides if s not in SIDES]
    if unknown or not sides:
        raise SystemExit(f"--sides should name some of {', '.join(SIDES)}, but got {args.sides!r}")

    _common.make_shards(args.root, shards, args.images)
    skipped = {}
    for side in list(sides):
        reason = missing(side, args.root)
        if reason:
            print(f"skipping {SIDES[side][0]}: {reason}", file=sys.stderr)
            skipped[SIDES[side][0]] = reason
            sides.remove(side)
    if not sides:
        raise SystemExit("no side can run here")

    from fastdata._pillow import PILLOW

    names = {side: SIDES[side][0].replace("Pillow", PILLOW.split()[0]) for side in sides}
    print(f"{args.images} images, batch {BATCH}, {WORKERS} workers or threads, {args.rounds} rounds x "
          f"{args.epochs} epochs per side; this environment: {PILLOW}", file=sys.stderr)
    commands = {names[side]: [sys.executable, __file__, "--child", side, "--root", args.root, "--shards", str(shards),
                              "--epochs", str(args.epochs)] for side in sides}
    results, reports = _common.process_rounds(commands, args.rounds)
    report = summarize(results, names, args)
    report.update(skipped=skipped, versions={name: reps[-1]["versions"] for name, reps in reports.items()})
    _common.write("peers", report, args.json)


def summarize(results: dict[str, list[float]], names: dict[str, str], args: argparse.Namespace) -> dict:
    """Prints the table and returns the report: per side images/s (median, min, max, all) and
    how many times faster fastdata pil and wds are (median over median)."""
    med = {name: statistics.median(v) for name, v in results.items()}
    bases = [names[s] for s in ("pil", "wds") if s in names]
    print(f"\n{'side':<36}{'images/s':>10}{'range':>15}" + "".join(f"{b + ' is':>18}" for b in bases))
    for name, rates in results.items():
        cells = "".join(f"{med[b] / med[name]:>17.2f}x" for b in bases)
        print(f"{name:<36}{med[name]:>10.0f}{f'{min(rates):.0f}-{max(rates):.0f}':>15}{cells}")
    return {"images": args.images, "batch": BATCH, "workers": WORKERS, "rounds": args.rounds, "epochs": args.epochs,
            "timing": "steady state: a process per side per round, one checked warm-up epoch, then timed full epochs",
            "images_per_s": med, "range": {n: [min(v), max(v)] for n, v in results.items()}, "all": results,
            "ratios": {b: {n: med[b] / v for n, v in med.items() if n != b} for b in bases}}


if __name__ == "__main__":
    main()
