"""`fastdata bench augment` (or `fastdata-bench augment`): the throughput of each augmentation
on each engine this machine has.

    fastdata bench augment [--size 224] [--images 256] [--reps 3] [--json PATH] [--plot PATH.html]
                           [--no-pipeline] [--quiet] [--debug]

Engines (each where it can run here):
  pillow       per image, the Pillow this process runs (Pillow-SIMD when installed), as `pil`/`wds`
               workers apply the ops; the batch ops (Normalize, MixUp, CutMix, LabelSmoothing) as
               the device stage runs them on the CPU, batched torch
  kornia-cpu   batched torch tensors on the CPU: Kornia, and fastdata's Kornia lowering of the
               pixel ops (fastdata/transforms/kornia.py) and torch batch ops
  kornia-cuda  the same on the GPU, when there is one
  dali-cpu     an NVIDIA DALI pipeline of the op, on the CPU, when DALI is installed
  dali-gpu     the same on the GPU, when there is one

Every op of fastdata.transforms is measured on decoded uint8 synthetic photographs (320x288):
the geometric ops from that size to --size, the others at --size. A cell is images/s: the
median of --reps timed passes over --images images after a warm-up pass; "-" where the engine
has no lowering of the op. With a GPU the timing synchronizes the device. Then, unless
--no-pipeline, the ImageNet training pipeline (RandomResizedCrop, flip, ColorJitter,
TrivialAugment, Normalize) through fastdata.loader (batch 256, num_workers="auto") with each
placement this machine has ("gpu" only with a GPU and Kornia). Prints a table; --json writes
it, --plot a self-contained HTML bar chart on a labelled log axis (no scripts, no links, no
plotting library that could replace Pillow-SIMD). Both paths are checked before measuring.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import html
import json
import statistics
import sys
import time
from typing import Any, Callable

import numpy as np

from ._cli import Parser, Progress, add_debug, check_writable, positive_int, run_alone, run_command
from ._cores import usable_cores
from ._optional import has, require_pillow
from ._optional import missing as optional_missing

SOURCE = (320, 288)  # (w, h) of the decoded images the ops start from
SCHEMA = "fastdata.bench.augment/1"  # --json's schema (bench.schema.json beside this module)


def _ops(size: int) -> dict[str, Any]:
    from . import transforms as T

    return {
        "RandomResizedCrop": T.RandomResizedCrop(size), "Resize": T.Resize(size), "CenterCrop": T.CenterCrop(size),
        "RandomHorizontalFlip": T.RandomHorizontalFlip(), "ColorJitter": T.ColorJitter(0.4, 0.4, 0.4, 0.1),
        "TrivialAugment": T.TrivialAugment(), "Normalize": T.Normalize(), "MixUp": T.MixUp(), "CutMix": T.CutMix(),
        "LabelSmoothing": T.LabelSmoothing(),
    }


def _images(n: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """n decoded photographs at SOURCE size and at size x size, uint8 NHWC."""
    import tempfile

    from PIL import Image

    from .synthetic import make_file_list, make_imagenet_like

    with tempfile.TemporaryDirectory() as root:
        make_imagenet_like(root, n_images=min(max(n, 4), 64), n_classes=4, workers=1)
        files = make_file_list(root)
        big = [np.asarray(Image.open(p).convert("RGB").resize(SOURCE, Image.BILINEAR)) for p, _ in files]
    small = [np.asarray(Image.fromarray(a).resize((size, size), Image.BILINEAR)) for a in big]
    pick = np.arange(n) % len(big)
    return np.stack(big)[pick], np.stack(small)[pick]


# ----------------------------------------------------------------- engines: op -> one pass

def _pillow(name: str, op, big: np.ndarray, small: np.ndarray, size: int) -> Callable[[], None] | None:
    import torch
    from PIL import Image

    from .transforms import batch as batch_ops
    from .transforms import pil as P
    from .transforms.plan import plan_geometry, plan_pixels

    n = len(big)
    if op.geometric:
        imgs = [Image.fromarray(a) for a in big]
        geo = plan_geometry((op,), 0, 0, np.arange(n), np.full(n, SOURCE[0]), np.full(n, SOURCE[1]))
        if name == "RandomHorizontalFlip":
            def run():
                for k, img in enumerate(imgs):
                    if geo.flips[k]:
                        img.transpose(Image.FLIP_LEFT_RIGHT)
            return run

        def run():
            for k, img in enumerate(imgs):
                w, h = (int(v) for v in geo.sizes[k])
                out = img.resize((w, h), Image.BILINEAR, box=tuple(float(v) for v in geo.boxes[k]))
                if geo.flips[k]:
                    out.transpose(Image.FLIP_LEFT_RIGHT)
        return run
    if op.batch:  # not a worker's op: the device stage's (torch), as a loader on the CPU runs it
        images = torch.from_numpy(small).permute(0, 3, 1, 2)  # the loader's channels_last batch
        labels, out = torch.arange(n) % 10, torch.empty(small.shape)  # (out: the slot Normalize writes into)

        def run():
            batch_ops.apply(images, labels, (op,), dtype=torch.float32, num_classes=10, seed=0, epoch=0, rank=0,
                            batch=0, new=lambda shape, dtype: out)
        return run
    plans = plan_pixels((op,), 0, 0, np.arange(n))[0]

    def run():
        for a, p in zip(small, plans):
            P.apply_pixel_ops(a.copy(), (op,), [p])
    return run


def _kornia(name: str, op, big: np.ndarray, small: np.ndarray, size: int, device: str) -> Callable[[], None] | None:
    import kornia
    import torch

    from .transforms import batch as batch_ops
    from .transforms import kornia as K
    from .transforms.plan import plan_geometry, plan_pixels

    n = len(big)
    src = torch.from_numpy(big).permute(0, 3, 1, 2).contiguous().to(device)
    at = torch.from_numpy(small).permute(0, 3, 1, 2).contiguous().to(device)
    labels = torch.arange(n, device=device) % 10
    if op.geometric:
        geo = plan_geometry((op,), 0, 0, np.arange(n), np.full(n, SOURCE[0]), np.full(n, SOURCE[1]))
        b = torch.tensor(geo.boxes, dtype=torch.float32, device=device)
        corners = torch.stack([b[:, [0, 1]], b[:, [2, 1]], b[:, [2, 3]], b[:, [0, 3]]], dim=1) - 0.5
        w, h = (int(v) for v in geo.sizes[0])
        flips = torch.tensor(geo.flips, device=device)

        def run():
            if name == "RandomHorizontalFlip":
                torch.where(flips.view(-1, 1, 1, 1), src.flip(-1), src)
                return
            out = kornia.geometry.transform.crop_and_resize(src.float(), corners, (h, w))
            out.round_().clamp_(0, 255).to(torch.uint8)
        return run
    if op.batch:
        def run():
            batch_ops.apply(at, labels, (op,), dtype=torch.float32, num_classes=10, seed=0, epoch=0, rank=0, batch=0)
        return run
    plans = plan_pixels((op,), 0, 0, np.arange(n))

    def run():
        K.apply_pixel_ops(at, (op,), plans)
    return run


def _dali(name: str, op, big: np.ndarray, small: np.ndarray, size: int, device: str) -> Callable[[], None] | None:
    from nvidia.dali import fn, pipeline_def

    from .transforms import ColorJitter, Normalize, RandomHorizontalFlip
    from .transforms import dali as lowering
    from .transforms.plan import plan_geometry

    n = len(big)
    gpu = device == "gpu"
    if name in ("TrivialAugment", "MixUp", "CutMix", "LabelSmoothing"):
        return None  # no DALI lowering in fastdata
    data = big if op.geometric else small
    geo = plan_geometry((op,), 0, 0, np.arange(n), np.full(n, SOURCE[0]), np.full(n, SOURCE[1])) if op.geometric else None
    rng = np.random.default_rng(0)

    def fed(values):
        return fn.external_source(source=lambda: values, batch=True)

    @pipeline_def(batch_size=n, num_threads=2, device_id=0 if gpu else None, seed=0, prefetch_queue_depth=1)
    def pipeline():
        x = fn.external_source(source=lambda: list(data), batch=True, layout="HWC", no_copy=True)
        if gpu:
            x = x.gpu()
        if isinstance(op, RandomHorizontalFlip):
            return lowering.flip(x, fed(list(geo.flips.astype(np.int32))))
        if op.geometric:
            starts, shapes = lowering.window_inputs(geo.windows())
            w, h = (float(v) for v in geo.sizes[0])
            return lowering.resize(lowering.crop(x, fed(starts), fed(shapes)), (h, w))
        if isinstance(op, ColorJitter):
            def draw(lo, hi):
                return fed([np.float32(v) for v in rng.uniform(lo, hi, n)])
            return lowering.color_jitter(x, draw(*op.brightness), draw(*op.contrast), draw(*op.saturation),
                                         draw(op.hue[0] * 360, op.hue[1] * 360))
        if isinstance(op, Normalize):
            return lowering.normalize(x, op.mean, op.std)
        return x

    pipe = pipeline()
    pipe.build()

    def run():
        pipe.run()
    return run


def _engines() -> tuple[dict[str, Callable], list[str]]:
    """The engines this machine has, and a line for each optional one it lacks."""
    engines: dict[str, Callable] = {"pillow": _pillow}
    missing = []
    import torch

    cuda = torch.cuda.is_available()
    if has("kornia"):
        engines["kornia-cpu"] = lambda *a: _kornia(*a, device="cpu")
        if cuda:
            engines["kornia-cuda"] = lambda *a: _kornia(*a, device="cuda")
    else:
        missing.append(optional_missing("kornia", "engines kornia-cpu, kornia-cuda" if cuda else "engine kornia-cpu"))
    if has("dali"):
        engines["dali-cpu"] = lambda *a: _dali(*a, device="cpu")
        if cuda:
            engines["dali-gpu"] = lambda *a: _dali(*a, device="gpu")
    else:
        missing.append(optional_missing("dali", "engines dali-cpu, dali-gpu" if cuda else "engine dali-cpu"))
    return engines, missing


def _time(run: Callable[[], None], n: int, reps: int, sync: Callable[[], None]) -> float:
    run()  # warm-up: first-call costs, allocations
    sync()
    rates = []
    for _ in range(reps):
        t = time.perf_counter()
        run()
        sync()
        rates.append(n / (time.perf_counter() - t))
    return statistics.median(rates)


def _pipeline(images: int, size: int) -> dict[str, float]:
    """The ImageNet training pipeline through fastdata.loader, with each placement."""
    import tempfile

    import torch

    import fastdata
    from fastdata import transforms as T

    from .synthetic import make_imagenet_like

    device = "cuda" if torch.cuda.is_available() else "cpu"
    spec = T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ColorJitter(0.4, 0.4, 0.4, 0.1),
                      T.TrivialAugment(), T.Normalize()])
    out = {}
    with tempfile.TemporaryDirectory() as root:
        make_imagenet_like(root, n_images=images, n_classes=4)
        # "gpu" only on a GPU (on a CPU device the "device stage" is the CPU again), with Kornia
        for placement in ("cpu", "gpu") if device == "cuda" and has("kornia") else ("cpu",):
            loader = fastdata.loader(root, batch_size=256, num_workers="auto", persistent_workers=True, transform=spec,
                                     device=device, dtype=torch.bfloat16, placement=placement)
            sum(len(y) for _, y in loader)  # the first pass starts the workers; the next two are one window
            t = time.perf_counter()  # (persistent workers run ahead: a pass timed alone holds the last one's work)
            n = sum(len(y) for _ in range(2) for _, y in loader)
            if device == "cuda":
                torch.cuda.synchronize()
            out[f"placement={placement}"] = n / (time.perf_counter() - t)
    return out


def _plot(path: str, report: dict) -> None:
    """A self-contained HTML page: one grouped horizontal bar chart (SVG), images/s on a log axis
    from a power of ten to a power of ten, a labelled gridline at each, each bar with its figure
    (the rates span three decades: a linear axis would hide the slow ops)."""
    engines, rows = report["engines"], report["ops"]
    colors = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#b07aa1"]
    logs = [np.log10(v) for r in rows.values() for v in r.values() if v] or [0.0, 1.0]
    first, last = int(np.floor(min(logs))), max(int(np.ceil(max(logs))), int(np.floor(min(logs))) + 1)
    bar, gap, left, width, top = 12, 10, 170, 560, 30
    bottom = top + len(rows) * (len(engines) * bar + gap)
    scale = width / (last - first)  # pixels a decade
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 140}" height="{bottom + 40}" '
             'font-family="sans-serif" font-size="11">']
    for d in range(first, last + 1):  # the axis: a gridline and a label at each power of ten
        x = left + scale * (d - first)
        parts.append(f'<line x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" y2="{bottom}" stroke="#ccc"/>'
                     f'<text x="{x:.1f}" y="{bottom + 14}" text-anchor="middle">{10 ** d:,}</text>')
    parts.append(f'<line x1="{left}" y1="{bottom}" x2="{left + width}" y2="{bottom}" stroke="#333"/><text x="'
                 f'{left + width / 2}" y="{bottom + 30}" text-anchor="middle">images/s (log scale: each gridline is '
                 '10x the one before)</text>')
    y = top
    for op, cells in rows.items():
        parts.append(f'<text x="{left - 8}" y="{y + len(engines) * bar / 2 + 4}" text-anchor="end">{html.escape(op)}</text>')
        for k, engine in enumerate(engines):
            v = cells.get(engine)
            if v:
                w = max(2.0, scale * (np.log10(v) - first))
                parts.append(f'<rect x="{left}" y="{y}" width="{w:.1f}" height="{bar - 2}" fill="{colors[k % 6]}"/>'
                             f'<text x="{left + w + 4:.1f}" y="{y + bar - 3}">{v:,.0f}</text>')
            y += bar
        y += gap
    parts += [f'<rect x="{left + 110 * k}" y="8" width="10" height="10" fill="{colors[k % 6]}"/><text x="{left + 110 * k + 14}" '
              f'y="17">{html.escape(engine)}</text>' for k, engine in enumerate(engines)]
    title = f"fastdata-bench augment: images/s per op and engine ({html.escape(report['machine'])})"
    with open(path, "w") as f:
        f.write(f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title></head><body><h3>{title}"
                f"</h3><p>{report['images']} images, output {report['size']}px.</p>{''.join(parts)}</svg></body></html>")


def augment(args: argparse.Namespace) -> dict:
    import platform

    import torch

    from ._pillow import PILLOW

    require_pillow("for its first engine, the Pillow the workers run")
    ops = _ops(args.size)
    engines, missing = _engines()
    for line in () if args.quiet else missing:
        print(f"not measured: {line}", file=sys.stderr)
    big, small = _images(args.images, args.size)
    cuda_sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    table: dict[str, dict[str, float | None]] = {name: {} for name in ops}
    cells = [(name, engine) for name in ops for engine in engines]
    with contextlib.nullcontext() if args.quiet else Progress("op x engine cells", len(cells)) as shown:
        for i, (name, engine) in enumerate(cells, 1):
            one_pass = engines[engine](name, ops[name], big, small, args.size)
            sync = cuda_sync if engine.endswith(("cuda", "gpu")) else (lambda: None)
            table[name][engine] = _time(one_pass, len(big), args.reps, sync) if one_pass is not None else None
            if shown is not None:
                shown.update(i)
    from .profiling.report import environment, now_utc

    report = {"schema": SCHEMA, "created": now_utc(), "environment": environment(),
              "machine": f"{platform.processor() or platform.machine()}, {usable_cores()} "
                         f"cores" + (f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ", no GPU"),
              "pillow": PILLOW, "size": args.size, "images": args.images, "reps": args.reps, "unit": "images/s",
              "engines": list(engines), "ops": table}
    if args.pipeline:
        if not args.quiet:
            print("the ImageNet training pipeline with each placement...", file=sys.stderr)
        report["pipeline"] = _pipeline(args.pipeline_images, args.size)
    return report


def _print(report: dict) -> None:
    engines = report["engines"]
    print(f"images/s, {report['images']} images, output {report['size']}px; {report['machine']}; {report['pillow']}")
    print(f"{'op':<22}" + "".join(f"{e:>13}" for e in engines))
    for op, row in report["ops"].items():
        print(f"{op:<22}" + "".join(f"{row[e]:>13,.0f}" if row.get(e) else f"{'-':>13}" for e in engines))
    for name, rate in report.get("pipeline", {}).items():
        print(f"ImageNet training pipeline, {name}: {rate:,.0f} images/s")


EXAMPLE = "fastdata bench augment --images 64 --reps 1 --no-pipeline"


def add_arguments(ap: Parser) -> None:
    """The command's arguments, on its parser (`fastdata-bench`, or `fastdata bench`)."""
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    aug = sub.add_parser("augment", help="images/s of each augmentation on each engine", description=__doc__,
                         example=EXAMPLE)
    aug.add_argument("--size", type=positive_int, default=224, help="output size of the geometric ops (default 224)")
    aug.add_argument("--images", type=positive_int, default=256, help="images a timed pass (the batch; default 256)")
    aug.add_argument("--reps", type=positive_int, default=3, help="timed passes a cell (default 3)")
    aug.add_argument("--json", metavar="PATH", help="write the table as JSON")
    aug.add_argument("--plot", metavar="PATH", help="write an HTML bar chart")
    aug.add_argument("--no-pipeline", dest="pipeline", action="store_false",
                     help="skip the whole ImageNet pipeline with each placement")
    aug.add_argument("--pipeline-images", type=positive_int, default=512, help=argparse.SUPPRESS)
    aug.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    add_debug(aug)
    aug.set_defaults(run=functools.partial(run, aug))


def run(ap: Parser, args: argparse.Namespace) -> int:
    """`augment` on parsed arguments; its exit status."""
    def body() -> int:
        for flag, path in (("--json", args.json), ("--plot", args.plot)):
            if path:
                check_writable(flag, path)
        report = augment(args)
        _print(report)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(report, f, indent=2)
        if args.plot:
            _plot(args.plot, report)
        return 0
    return run_command(ap.prog, body, args.debug)


def main(argv: list[str] | None = None) -> int:
    """`fastdata-bench`: the same command as `fastdata bench`."""
    return run_alone("fastdata-bench", __doc__, EXAMPLE, add_arguments, argv)


if __name__ == "__main__":
    raise SystemExit(main())
