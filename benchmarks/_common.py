"""What every benchmark shares: interleaved timing (in one process, or candidate processes in
rounds), the machine's facts, the JSON report, and the sides several benchmarks time (the
ImageNet training transform as DataLoader + Pillow, webdataset + DataLoader, a DALI CPU
pipeline and fastdata write it)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

RESULTS = Path(__file__).resolve().parent / "results"
# The ImageNet training transform's batch, output size and workers (or threads): one a core here.
BATCH, SIZE, WORKERS = 256, 224, 2
PER_SHARD = 250  # samples a shard, in the shards `make_shards` writes


def machine() -> dict:
    import fastdata
    from fastdata import _collate
    from fastdata._cores import usable_cores

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "fastdata": fastdata.__version__,
        "native": _collate.NATIVE,
        "cores": usable_cores(),
        "accelerator": torch.accelerator.is_available(),
        "cpu": platform.processor() or platform.machine(),
    }


def interleaved(runs: dict[str, Callable[[], float]], reps: int) -> dict[str, list[float]]:
    """Runs each candidate once per round, rounds repeated `reps` times, so drift on this shared
    machine hits every candidate alike; every other round runs them in reverse order (ABBA),
    since going first or second is itself worth a few percent here. Each callable returns the
    seconds it measured."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for r in range(reps):
        for name in names if r % 2 == 0 else reversed(names):
            times[name].append(runs[name]())
    return times


def epoch_seconds(loader: Any) -> float:
    """Seconds one pass over `loader` takes."""
    t = time.perf_counter()
    for _ in loader:
        pass
    return time.perf_counter() - t


def time_epochs(make_iter: Callable[[], Any], epochs: int, warm_up: bool = True) -> list[float]:
    """Images/s of each of `epochs` epochs of `make_iter()` (an iterable of (images, labels)
    batches), after a warm-up epoch (workers started, page cache warm) unless `warm_up` is
    False (the caller ran one)."""
    if warm_up:
        for _ in make_iter():
            pass
    rates = []
    for _ in range(epochs):
        t = time.perf_counter()
        n = sum(len(batch[1]) for batch in make_iter())
        rates.append(n / (time.perf_counter() - t))
    return rates


def rounds_parser(doc: str, rounds: int = 3) -> argparse.ArgumentParser:
    """The arguments every process-rounds benchmark takes: --images, --rounds, --epochs (timed
    per candidate process), --root (the synthetic set), --json, and the hidden --child that
    runs one candidate."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--epochs", type=int, default=2, help="timed epochs per candidate process")
    ap.add_argument("--root", default=str(RESULTS.parent / "data" / "imagenet-like"))
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    return ap


def process_rounds(commands: dict[str, list[str]], rounds: int, abba: bool = True) -> tuple[dict, dict]:
    """Runs each candidate's command in its own process, one after another, `rounds` times (in
    ABBA order unless abba=False), so drift on this shared machine hits all alike. A command
    prints a JSON object with "images_per_s" (a list) as its last line. Returns the rates of
    each candidate over all rounds, and its reports, one a round."""
    rates: dict[str, list[float]] = {name: [] for name in commands}
    reports: dict[str, list[dict]] = {name: [] for name in commands}
    names = list(commands)
    for r in range(rounds):
        for name in names if not abba or r % 2 == 0 else reversed(names):
            out = subprocess.run(commands[name], capture_output=True, text=True)
            if out.returncode != 0:
                raise SystemExit(f"{name} failed: {out.stderr.strip()[-2000:]}")
            report = json.loads(out.stdout.strip().splitlines()[-1])
            reports[name].append(report)
            rates[name] += report["images_per_s"]
            print(f"  round {r + 1}/{rounds}  {name:<34} {median(report['images_per_s']):7.0f} img/s",
                  file=sys.stderr)
    return rates, reports


def epoch_sides(reports: dict[str, list[dict]]) -> dict[str, dict]:
    """Each candidate's images/s from `process_rounds`' reports: its runs' first epochs and the
    epochs after them, apart (a fresh process's first epoch starts its workers), with medians."""
    sides = {}
    for name, runs in reports.items():
        first = [r["images_per_s"][0] for r in runs]
        later = [x for r in runs for x in r["images_per_s"][1:]]
        sides[name] = {"epoch_1": first, "epochs_2_on": later,
                       "epoch_1_median": statistics.median(first), "epochs_2_on_median": statistics.median(later)}
    return sides


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def ratio_ci(baseline: list[float], candidate: list[float], resamples: int = 2000) -> tuple[float, float]:
    """A 95% bootstrap interval for median(baseline) / median(candidate) (times: above 1 means
    the candidate is faster), resampling each side's runs; seeded, so a report reproduces."""
    import random

    rng = random.Random(0)
    ratios = sorted(
        median(rng.choices(baseline, k=len(baseline))) / median(rng.choices(candidate, k=len(candidate)))
        for _ in range(resamples)
    )
    return ratios[int(0.025 * resamples)], ratios[int(0.975 * resamples) - 1]


def image_ops_parser(doc: str) -> argparse.ArgumentParser:
    """The arguments every per-image op benchmark (`image_ops`) takes: --reps, --images, --json."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--images", type=int, default=64)
    ap.add_argument("--json", default=None)
    return ap


def photos(n: int) -> list:
    """The first `n` images of the synthetic ImageNet-like set (`fastdata.synthetic`, made once
    under its default root), as RGB PIL images."""
    from PIL import Image

    from fastdata.synthetic import default_root, make_file_list, make_imagenet_like

    files = make_file_list(make_imagenet_like(default_root(), n_images=2000))[:n]
    return [Image.open(path).convert("RGB") for path, _ in files]


def image_ops(cases: dict[str, Callable], baseline: Callable[[Callable], Callable], images: list, params: list,
              reps: int, baseline_name: str = "torchvision") -> dict[str, dict]:
    """Per-image ops against their baselines, interleaved in one process: each case `fn(image,
    param)` over the images, and `baseline(fn)` (the same op by the baseline's steps: the calls
    `baseline_name` makes) alike; the outputs compared once (equal pixels, else AssertionError),
    then `reps` interleaved rounds. Prints a table (ms an image each side, the ratio, its 95%
    interval); returns its rows."""
    def timed(fn: Callable) -> Callable[[], float]:
        def run() -> float:
            t = time.perf_counter()
            outs = [fn(img, p) for img, p in zip(images, params)]
            dt = time.perf_counter() - t
            run.outs = outs
            return dt
        return run

    runs = {}
    for name, fn in cases.items():
        runs[f"{name}: torchvision's"] = timed(baseline(fn))
        runs[f"{name}: fastdata"] = timed(fn)
    for fn in runs.values():  # warm-up, and the pixels compared once
        fn()
    for name in cases:
        theirs, ours = runs[f"{name}: torchvision's"].outs, runs[f"{name}: fastdata"].outs
        assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(theirs, ours)), name
    print(f"{len(images)} images, {reps} interleaved rounds, one thread; pixels equal", file=sys.stderr)
    times = interleaved(runs, reps)
    width = max(len(name) for name in cases) + 2
    rows = {}
    print(f"{'op':<{width}}{baseline_name + ' ms/image':>22}{'fastdata ms/image':>19}{'speed-up':>10}  95% interval")
    for name in cases:
        base, ours = times[f"{name}: torchvision's"], times[f"{name}: fastdata"]
        ratio = median(base) / median(ours)
        low, high = ratio_ci(base, ours)
        per = [median(x) / len(images) * 1e3 for x in (base, ours)]
        rows[name] = {f"{baseline_name.lower()}_ms_per_image": per[0], "fastdata_ms_per_image": per[1], "ratio": ratio,
                      "interval": [low, high]}
        print(f"{name:<{width}}{per[0]:>22.3f}{per[1]:>19.3f}{ratio:>9.2f}x  {low:.2f}-{high:.2f}")
    return rows


def write(name: str, report: dict, path: str | None = None) -> Path:
    out = Path(path) if path else RESULTS / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {"benchmark": name, "when": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": machine(), **report}
    part = out.with_name(out.name + ".part")  # replaced whole: a run stopped meanwhile leaves the last one
    part.write_text(json.dumps(report, indent=2) + "\n")
    os.replace(part, out)
    print(f"wrote {out}", file=sys.stderr)
    return out


# ----------------------------------------------------------------- sides several benchmarks time
# RandomResizedCrop(224, scale=(0.08, 1), ratio=(3/4, 4/3)), a random horizontal flip, uint8
# batches of 256 with the labels, 2 workers. Each builder returns `make_iter` for time_epochs:
# a callable giving one epoch's iterable of (images, labels) batches.

def make_shards(root: str, folder: Path, images: int) -> None:
    """Makes the synthetic ImageNet-like set of `images` under `root` (`fastdata.synthetic`) and
    its shards in `folder` (`fastdata-shard`, PER_SHARD samples a shard), rewriting shards that
    hold another number of samples."""
    from fastdata.shard import write_shards
    from fastdata.synthetic import make_imagenet_like

    make_imagenet_like(root, n_images=images, progress=True)
    index = folder / "train-index.json"
    if index.exists() and json.loads(index.read_text()).get("total") != images:
        for stale in [index, *folder.glob("train-*.tar")]:
            stale.unlink()
    if not index.exists():
        print(f"writing shards to {folder} (once)...", file=sys.stderr)
        write_shards(root, folder / "train-%06d.tar", max_count=PER_SHARD, progress=True)


def fastdata_loader(source: str, backend: str, **options: Any) -> Any:
    """fastdata.loader on `source` (a folder or a shard pattern) with the transform."""
    import fastdata
    from fastdata import transforms as T

    options = {"num_workers": WORKERS, **options}
    return fastdata.loader(source, batch_size=BATCH, shuffle=True, device="cpu", backend=backend,
                           transform=T.Compose([T.RandomResizedCrop(SIZE), T.RandomHorizontalFlip()]), **options)


def _epochs(make: Callable[[], Any], persistent: bool) -> Callable[[], Any]:
    """`make_iter` for time_epochs: one loader with persistent workers, or a fresh one each epoch."""
    if not persistent:
        return make
    loader = make()
    return lambda: loader


def dataloader_pillow(files: list[tuple[str, int]], persistent: bool = True) -> Callable[[], Any]:
    """DataLoader over the Dataset a PyTorch user writes (`fastdata.demo.PillowRRC`, with the
    Pillow first on the path), shuffled; persistent workers, or a fresh DataLoader each epoch."""
    from torch.utils.data import DataLoader

    from fastdata.demo import PillowRRC

    dataset = PillowRRC(files, SIZE)
    return _epochs(lambda: DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=WORKERS,
                                      persistent_workers=persistent), persistent)


def webdataset_loader(shards: list[str], persistent: bool = True) -> Callable[[], Any]:
    """webdataset + DataLoader as a user writes it: WebDataset(shards, shardshuffle)
    .shuffle(1000).to_tuple("jpg", "cls"), a Pillow transform per sample, .batched(256), in a
    DataLoader; persistent workers, or a fresh DataLoader each epoch."""
    import io
    import random

    import webdataset as wds
    from torch.utils.data import DataLoader

    from fastdata.demo import pillow_rrc

    rng = random.Random(0)

    def transform(data: bytes):
        return pillow_rrc(io.BytesIO(data), SIZE, rng)

    dataset = (wds.WebDataset(shards, shardshuffle=len(shards), seed=0, empty_check=False)
               .shuffle(1000).to_tuple("jpg", "cls").map_tuple(transform, int).batched(BATCH))
    return _epochs(lambda: DataLoader(dataset, batch_size=None, num_workers=WORKERS, persistent_workers=persistent),
                   persistent)


def dali_pipeline(files: list[tuple[str, int]], decode_only: bool = False, pad_last_batch: bool = False) -> Any:
    """A DALI CPU pipeline over `files`, WORKERS threads: fn.readers.file (shuffled, named
    "reader") -> fn.decoders.image_random_crop, then (unless `decode_only`) fn.resize to
    224x224 and fn.flip; HWC uint8 images and the labels."""
    import atexit
    import tempfile

    from nvidia.dali import fn, pipeline_def, types

    # A listing of its own, so two benchmarks running at once do not share one.
    fd, listing = tempfile.mkstemp(prefix="dali-files-", suffix=".txt")
    with os.fdopen(fd, "w") as f:
        f.write("".join(f"{os.path.abspath(p)} {label}\n" for p, label in files))
    atexit.register(os.unlink, listing)

    @pipeline_def(batch_size=BATCH, num_threads=WORKERS, device_id=None, seed=0)
    def pipe():
        jpegs, labels = fn.readers.file(file_list=listing, random_shuffle=True, name="reader",
                                        pad_last_batch=pad_last_batch)
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                               random_area=[0.08, 1.0], random_aspect_ratio=[3 / 4, 4 / 3])
        if decode_only:
            return images, labels
        images = fn.resize(images, resize_x=SIZE, resize_y=SIZE)
        return fn.flip(images, horizontal=fn.random.coin_flip()), labels

    return pipe()


def dali_loader(files: list[tuple[str, int]]) -> Callable[[], Any]:
    """The full DALI CPU pipeline (`dali_pipeline`) through DALI's own PyTorch iterator
    (DALIGenericIterator, a partial last batch), as DALI's docs show it."""
    import math

    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    loader = DALIGenericIterator(dali_pipeline(files), ["images", "labels"], reader_name="reader",
                                 last_batch_policy=LastBatchPolicy.PARTIAL, auto_reset=True)
    if len(loader) != math.ceil(len(files) / BATCH):
        raise RuntimeError(f"DALI's iterator should give {math.ceil(len(files) / BATCH)} batches an epoch, "
                           f"but gives {len(loader)}")

    def epoch():
        for (out,) in loader:
            yield out["images"], out["labels"]

    return epoch
