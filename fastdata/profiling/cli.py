"""`fastdata-profile` and `fastdata.profile`: is the training step waiting on its input?

    fastdata-profile SOURCE [--step-ms MS | --model module:callable] [--transform imagenet_train]
                     [--size 224] [--batch-size 256] [--workers auto] [--steps 30] [--device D]
                     [--tune] [--out DIR] [--debug]

It measures three things, one after the other:
- the loader alone: batches as fast as they come;
- the consumer step alone, replaying one cached batch, so that data costs nothing;
- the two together, as training runs them, timing each step's wait for data and its compute.

The stall fraction is 1 - ideal/real. Here "ideal" is the steps' own compute time in the run
together (as if data were always ready), and "real" is the time the loop took: the share of
the time the step waited for data. (The step-alone rate is reported beside it.) The rates and the stall are of the steady
state: a step that begins an epoch can wait while the workers' queues refill (DataLoader's
workers, and fastdata's without persistent_workers, do not run ahead into the next epoch), so
it is left out and reported apart; on a short dataset that would otherwise decide a run's
figure by where its epochs happen to end.
The verdict follows from the stall:
- input-bound: the step waited for more than 10% of the time;
- compute-bound: the loader alone is at least 1.5x the step's rate;
- balanced: otherwise.

The report prints a summary, returns (from Python) a `Report`, and with --out DIR writes
`report.json` and a self-contained `report.html` (a step timeline of wait against compute, no
scripts, no links).

The consumer: `--model module:callable` builds a torch.nn.Module. The profiler then runs its
forward, backward (cross-entropy) and SGD step in bfloat16 autocast and channels_last, on the
device. `--step-ms MS` simulates a step of that duration; the process sleeps, as it does while
a GPU computes. With neither, only the loader's ceiling is reported.

With a fastdata loader, the loader-alone run also times the stages: read, decode (with the
header checks), CPU transforms and collate in the workers (`pil`, `wds`); the Dataset's time and
collate (drop-in); read, DALI's decode and the copy out (`dali`); and, in the training process,
taking batches, the device stage and the host-to-device copy. They appear as `fastdata.*`
ranges in a torch profiler trace too. The report gives their milliseconds per image, names the
costliest, and advises: a rate model (RateModel) predicts what another worker count (or, on
a GPU, placement="gpu") would give.

`--tune` searches num_workers, prefetch_factor, backend and placement. It measures one probe
per backend and placement with the stages timed, predicts every config from those stage
costs, and measures the best predictions. The winner is kept for this source, transform,
batch size and machine (under ~/.cache/fastdata/tuned), where `num_workers="auto"` and
`placement="auto"` find it; with --out, it is also written as `config.json` for
`fastdata.loader(config=...)`.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

from .. import factory
from .. import transforms as T
from .._cli import Parser
from .._cores import usable_cores
from ..sources import is_shard_source
from ..synthetic import make_imagenet_like
from ..tunecache import machine_key, store_tune
from .measure import profile
from .report import Report
from .tune import tune


class _Fail(Exception):
    """A one-line cause for the command line."""


def _model_step(spec: str, device: str) -> Callable[[Any], None]:
    module, _, name = spec.partition(":")
    if not module or not name:
        raise _Fail(f"--model should be module:callable, but got {spec!r}")
    try:
        build = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise _Fail(f"cannot import --model {spec}: {e}") from None
    try:
        model = build().to(device).to(memory_format=torch.channels_last)
    except Exception as e:
        raise _Fail(f"--model {spec} raised while being built: {type(e).__name__}: {e}") from None
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    kind = torch.device(device).type

    def step(batch):
        images, labels = batch[0], batch[1]
        with torch.autocast(kind, dtype=torch.bfloat16):
            out = model(images)
            loss = torch.nn.functional.cross_entropy(out.float(), labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def _transform(spec: str, size: int):
    if spec in ("imagenet_train", "imagenet_eval"):
        return getattr(T, spec)(size)
    module, _, name = spec.partition(":")
    try:
        return getattr(importlib.import_module(module), name)()
    except Exception as e:
        raise _Fail(f"--transform should be imagenet_train, imagenet_eval or module:callable, but {spec!r}: "
                    f"{type(e).__name__}: {e}") from None


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="fastdata-profile", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source", metavar="SOURCE", help="an ImageFolder, WebDataset shards, or 'synthetic' (made here)")
    consumer = ap.add_mutually_exclusive_group()
    consumer.add_argument("--step-ms", type=float, help="simulate a training step of this many milliseconds")
    consumer.add_argument("--model", help="module:callable returning a torch.nn.Module to train a step of")
    ap.add_argument("--transform", default="imagenet_train", help="imagenet_train (default), imagenet_eval, or module:callable")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--workers", default="auto", help="num_workers (default auto)")
    ap.add_argument("--steps", type=int, default=30, help="batches timed per measurement (default 30)")
    ap.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    ap.add_argument("--tune", action="store_true",
                    help="search workers, prefetch, backend and placement; write the best as a config")
    ap.add_argument("--out", help="write report.json and report.html (and config.json with --tune) in this folder")
    ap.add_argument("--debug", action="store_true", help="tracebacks instead of one-line errors")
    args = ap.parse_args(argv)
    try:
        setup = _setup(args)
        report = _run(args, *setup)
        report.print()
        if args.out:
            print(f"wrote {report.write(args.out)}/report.json and report.html")
        if args.tune:
            _run_tune(args, *setup)
    except KeyboardInterrupt:
        print(f"{ap.prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if args.debug:
            raise
        cause = str(e) if isinstance(e, _Fail) else f"{type(e).__name__}: {e}"
        print(f"{ap.prog}: error: {cause}".replace("\n", " "), file=sys.stderr)
        return 1
    return 0


def _source(args: argparse.Namespace) -> str:
    source = args.source
    if source == "synthetic":
        return str(make_imagenet_like(Path.home() / ".cache" / "fastdata" / "demo-imagenet-like", n_images=2000,
                                      progress=True))
    if not (os.path.exists(source) or "{" in source or "://" in source or source.startswith("pipe:")):
        raise _Fail(f"source {source!r} does not exist")
    return source


def _setup(args: argparse.Namespace) -> tuple[str, str, Any, Callable[[Any], None] | None]:
    """(device, source, transform, step) of the command line, made once for the profile and the
    tune (the source may be made here; --model builds a model)."""
    if args.steps < 1 or args.batch_size < 1 or args.size < 1:
        raise _Fail("--steps, --batch-size and --size should be at least 1")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    source = _source(args)
    step = _model_step(args.model, device) if args.model else None
    return device, source, _transform(args.transform, args.size), step


def _run_tune(args: argparse.Namespace, device: str, source: str, transform: Any, step) -> None:
    cores = usable_cores()
    backends = ["wds" if is_shard_source(source) else "pil"]
    if importlib.util.find_spec("nvidia.dali") is not None and not transform.pixel_ops:
        backends.append("dali")
    placements = ["cpu", "gpu"] if transform.pixel_ops and importlib.util.find_spec("kornia") else ["cpu"]
    space = {"num_workers": sorted({0, 1, *[w for w in (2, 4, 8, 16) if w <= cores], cores}),
             "prefetch_factor": [2, 4], "backend": backends, "placement": placements}

    def make(config: dict):
        w = config["num_workers"]
        extra = {"prefetch_factor": config["prefetch_factor"], "persistent_workers": True} if w else {}
        return factory.loader(source, batch_size=args.batch_size, shuffle=True, num_workers=w, transform=transform,
                               device=device, backend=config["backend"], placement=config["placement"], **extra)

    print(f"tuning over {space}...", file=sys.stderr)
    t = time.perf_counter()
    best, trials = tune(make, space=space, step=step, step_ms=args.step_ms, steps=max(6, args.steps // 2),
                        device=device)
    best = {k: v for k, v in best.items() if not (k == "prefetch_factor" and best["num_workers"] == 0)}
    config = {"loader": best, "measured_images_per_s": max(t.measured for t in trials if t.measured),
              "machine": machine_key(), "tuning_s": time.perf_counter() - t}
    store_tune(source, transform, args.batch_size, config)
    print(f"tuned: {json.dumps(best)} at {config['measured_images_per_s']:,.0f} images/s "
          f"({config['tuning_s']:.0f} s); num_workers='auto' and placement='auto' use it for this source")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        print(f"wrote {out}/config.json: fastdata.loader(..., config={str(out / 'config.json')!r})")


def _run(args: argparse.Namespace, device: str, source: str, transform: Any, step) -> Report:
    workers = args.workers if args.workers == "auto" else int(args.workers)
    loader = factory.loader(source, batch_size=args.batch_size, shuffle=True, num_workers=workers,
                             persistent_workers=workers != 0, transform=transform, device=device)
    print(f"profiling {loader.backend} over {source}: {args.steps} steps a measurement...", file=sys.stderr)
    return profile(loader, step, steps=args.steps, step_ms=args.step_ms, device=device, source=source)
