"""`fastdata profile` (or `fastdata-profile`) and `fastdata.profile`: is the training step
waiting on its input?

    fastdata profile SOURCE [--step-ms MS | --model module:callable] [--transform imagenet_train]
                     [--size 224 | --size 0:160,10:192] [--batch-size 256] [--workers auto] [--steps 30]
                     [--device D] [--on-error raise|skip] [--tune] [--out DIR] [--debug]
    fastdata profile --show-cache | --clear-cache

It measures three things, one after the other:
- the loader alone: batches as fast as they come;
- the consumer step alone, replaying one cached batch, so that data costs nothing;
- the two together, as training runs them, timing each step's wait for data and its compute.

The stall fraction is 1 - ideal/real. Here "ideal" is the steps' own compute time in the run
together (as if data were always ready), and "real" is the time the loop took: the share of
the time the step waited for data. (The step-alone rate is reported beside it.) A step that
begins an epoch can wait while the workers' queues refill (DataLoader's workers, and
fastdata's without persistent_workers, do not run ahead into the next epoch): such steps are
counted in the rates, as training pays them each epoch, and the report says how long they
waited beside the others.
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
a GPU, placement="gpu") would give, and says what bounds the rate (the workers, the cores, or
the training process's own stages in series with the step).

Progressive resizing: `--size 0:160,10:192,20:224` (epoch:size steps, each size from its epoch
on) gives imagenet_train a size schedule, as `RandomResizedCrop(size=[(0, 160), ...])` does;
the report then adds the loader's rate alone at each size (the low-resolution epochs are where
the input pipeline binds). A transform of `module:callable` with a schedule gets the same.

`--tune` searches num_workers, prefetch_factor, backend and placement. It measures one probe
per backend and placement with the stages timed, predicts every config from those stage
costs, and measures the best predictions. It runs before the report is printed: a winner
above the default beyond the noise is the report's first change. The winner is kept for this
source, transform, batch size and machine (under ~/.cache/fastdata/tuned), where `num_workers="auto"` and
`placement="auto"` find it; with --out, it is also written as `config.json` for
`fastdata.loader(config=...)`.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from .. import _optional as optional
from .._cli import (CommandError, Parser, add_debug, check_writable, positive_float, positive_int, run_alone,
                     run_command, workers)
from .._cores import usable_cores
from ..errors import error_line

# What imports torch is imported by the function that uses it: a help page builds this parser
# alone, without torch (see `_needs_no_torch` in fastdata/__init__.py).
if TYPE_CHECKING:
    from .report import Report


def _import(module: str) -> Any:
    """`module`, found as `python -m` finds it: in the current folder first (a console script's
    sys.path starts at its own folder, so a module of the user's beside them would not be)."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    return importlib.import_module(module)


def _model_step(spec: str, device: str) -> Callable[[Any], None]:
    import torch

    module, _, name = spec.partition(":")
    if not module or not name:
        raise CommandError(f"--model should be module:callable, but got {spec!r}")
    try:
        build = getattr(_import(module), name)
    except (ImportError, AttributeError) as e:
        raise CommandError(f"cannot import --model {spec}: {e}") from None
    try:
        model = build()
    except Exception as e:
        raise CommandError(f"--model {spec} raised while being built: {type(e).__name__}: {e}") from None
    if not isinstance(model, torch.nn.Module):
        raise CommandError(f"--model {spec} should return a torch.nn.Module, but returned {type(model).__name__}")
    if not any(p.requires_grad for p in model.parameters()):
        raise CommandError(f"--model {spec} has no parameters to train (the step trains it: forward, backward, SGD)")
    try:
        model = model.to(device).to(memory_format=torch.channels_last)
    except Exception as e:
        raise CommandError(f"--model {spec} cannot be moved to {device}: {type(e).__name__}: {e}") from None
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


def size_spec(text: str) -> int | list[tuple[int, int]]:
    """An argparse type: a size >= 1, or epoch:size steps separated by commas (a schedule)."""
    from .. import transforms as T

    try:
        if ":" not in text:
            return positive_int(text)
        steps = [tuple(int(v) for v in step.split(":")) for step in text.split(",")]
        T.RandomResizedCrop(steps)  # the schedule's own checks (sorted, from epoch 0, sizes >= 1)
    except (ValueError, TypeError) as e:
        raise argparse.ArgumentTypeError(f"should be a size >= 1 or epoch:size steps such as 0:160,10:192,20:224, "
                                         f"but got {text!r} ({e})") from None
    return steps  # type: ignore[return-value]


def _transform(spec: str, size: int | list[tuple[int, int]]):
    from .. import transforms as T

    if spec == "imagenet_eval" and not isinstance(size, int):
        raise CommandError(f"--size {size} is a schedule, which --transform imagenet_train takes, not imagenet_eval")
    if spec in ("imagenet_train", "imagenet_eval"):
        return getattr(T, spec)(size)
    module, _, name = spec.partition(":")
    try:
        return getattr(_import(module), name)()
    except Exception as e:
        raise CommandError(f"--transform should be imagenet_train, imagenet_eval or module:callable, but got {spec!r}: "
                           f"{type(e).__name__}: {e}") from None


EXAMPLE = "fastdata profile synthetic --step-ms 100"


def add_arguments(ap: Parser) -> None:
    """The command's arguments, on its parser (`fastdata-profile`, or `fastdata profile`)."""
    ap.add_argument("source", metavar="SOURCE", nargs="?",
                    help="an ImageFolder, WebDataset shards, or 'synthetic' (made here)")
    consumer = ap.add_mutually_exclusive_group()
    consumer.add_argument("--step-ms", type=positive_float, help="simulate a training step of this many milliseconds")
    consumer.add_argument("--model", help="module:callable returning a torch.nn.Module to train a step of")
    ap.add_argument("--transform", default="imagenet_train",
                    help="imagenet_train, imagenet_eval, or module:callable (default imagenet_train)")
    ap.add_argument("--size", type=size_spec, default=224,
                    help="the transform's output size, or epoch:size steps (progressive resizing, e.g. "
                         "0:160,10:192,20:224) (default 224)")
    ap.add_argument("--batch-size", type=positive_int, default=256, help="images a batch (default 256)")
    ap.add_argument("--workers", type=workers, default="auto", help="num_workers (default auto)")
    ap.add_argument("--steps", type=positive_int, default=30, help="batches timed per measurement (default 30)")
    ap.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    ap.add_argument("--on-error", choices=["raise", "skip"], default="raise",
                    help="a file that cannot be read: stop with its name and cause (raise), or skip "
                         "it and count it in the report (skip) (default raise)")
    ap.add_argument("--tune", action="store_true",
                    help="search workers, prefetch, backend and placement; write the best as a config")
    ap.add_argument("--out", help="write report.json and report.html (and config.json with --tune) in this folder")
    add_debug(ap)
    cache = ap.add_mutually_exclusive_group()
    cache.add_argument("--show-cache", action="store_true", help="list the kept tunes (no SOURCE needed) and exit")
    cache.add_argument("--clear-cache", action="store_true", help="remove the kept tunes and exit")
    ap.set_defaults(run=functools.partial(run, ap))


def run(ap: Parser, args: argparse.Namespace) -> int:
    """The command on parsed arguments; its exit status."""
    from ..tunecache import check_keepable

    if args.show_cache or args.clear_cache:
        return _cache(args)
    if args.source is None:
        ap.error("SOURCE is required (unless --show-cache or --clear-cache)")

    def body() -> int:
        setup = _setup(args)
        if args.tune:  # where the tune could not be kept, say so before minutes of measuring
            check_keepable(setup[1], setup[2], args.batch_size)
        report = _run(args, *setup)
        if args.tune:  # before the report is printed: a measured winner is its first change
            report.add_tune(_run_tune(args, *setup))
        # written before it is printed, and printed whether or not it could be written: a
        # failure of either (a closed pipe, a full disk) loses none of the measuring
        try:
            written = report.write(args.out) if args.out else None
        finally:
            report.print()
        if written:
            print(f"wrote {written}/report.json and report.html")
        return 0
    return run_command(ap.prog, body, args.debug, skip_flag="--on-error skip")


def main(argv: list[str] | None = None) -> int:
    """`fastdata-profile`: the same command as `fastdata profile`."""
    return run_alone("fastdata-profile", __doc__, EXAMPLE, add_arguments, argv)


def _cache(args: argparse.Namespace) -> int:
    from ..tunecache import clear_tunes, list_tunes

    if args.clear_cache:
        print(f"removed {clear_tunes()} kept tune(s)")
        return 0
    entries = list_tunes()
    if not entries:
        print("no kept tunes")
    for e in entries:
        state = "valid" if e["valid"] else f"not used: {e['why_not']}"
        measured = ""
        tune = e.get("tune") if isinstance(e.get("tune"), dict) else {}
        best = [c for c in tune.get("candidates", []) if c.get("config") == tune.get("chosen")]
        if best:
            low, high = best[0]["interval_images_per_s"]
            measured = f", measured {best[0]['median_images_per_s']:,.0f} images/s ({low:,.0f}-{high:,.0f})"
        print(f"{e['path']}\n  {e.get('source')} (batch {e.get('batch_size')}, {e.get('transform')})\n"
              f"  {json.dumps(e.get('loader'))}{measured}\n  tuned {e.get('created')} on {e.get('machine')}, "
              f"expires {e.get('expires')}: {state}")
    return 0


def _source(args: argparse.Namespace) -> str:
    source = args.source
    if source == "synthetic":
        # imported here, not by the package's import, so `python -m fastdata.synthetic` runs it fresh
        from ..synthetic import default_root, make_imagenet_like

        return str(make_imagenet_like(default_root(), n_images=2000, progress=True))
    if not (os.path.exists(source) or "{" in source or "://" in source or source.startswith("pipe:")):
        raise CommandError(f"source {source!r} does not exist")
    return source


def _setup(args: argparse.Namespace) -> tuple[str, str, Any, Callable[[Any], None] | None]:
    """(device, source, transform, step) of the command line, made once for the profile and the
    tune. Everything that can be checked is checked before the source is made (the synthetic
    set takes a minute) or anything measured."""
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        kind = torch.device(device).type
    except RuntimeError as e:
        raise CommandError(f"--device {device!r} is not a torch device ({error_line(e)})") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise CommandError(f"--device {device!r}, but this machine has no CUDA device "
                           "(torch.cuda.is_available() is False): use --device cpu")
    if args.out:
        check_writable("--out", args.out, folder=True)
    transform = _transform(args.transform, args.size)
    step = _model_step(args.model, device) if args.model else None
    return device, _source(args), transform, step


def _run_tune(args: argparse.Namespace, device: str, source: str, transform: Any, step) -> dict[str, Any]:
    """Tunes, keeps the choice in the tune cache (and config.json with --out); returns the
    outcome for the report."""
    import torch

    from .. import factory
    from .._loader import resolve_workers
    from ..sources import is_shard_source
    from ..tunecache import store_tune
    from .tune import tune

    cores = usable_cores()
    backends = ["wds" if is_shard_source(source) else "pil"]
    placements = ["cpu"]
    if not transform.pixel_ops:  # the dali backend runs no pixel ops
        if optional.has("dali"):
            backends.append("dali")
        else:
            print(f"not tried: {optional.missing('dali', 'backend dali')}", file=sys.stderr)
    elif torch.device(device).type != "cuda":  # ("gpu" there runs Kornia on the CPU: a twin for tests, ~7x slower)
        print(f"not tried: placement gpu: the device is {device!r} (the pixel ops go to the GPU only where there is "
              "one)", file=sys.stderr)
    elif optional.has("kornia"):
        placements.append("gpu")
    else:
        print(f"not tried: {optional.missing('kornia', 'placement gpu')}", file=sys.stderr)
    space = {"num_workers": sorted({0, 1, *[w for w in (2, 4, 8, 16) if w <= cores], max(1, cores - 1), cores}),
             "prefetch_factor": [2, 4], "backend": backends, "placement": placements}
    # what the user gets untuned (num_workers="auto"): a tune must beat it by more than the noise
    default = {"num_workers": resolve_workers("auto", device), "prefetch_factor": 2, "backend": backends[0],
               "placement": "cpu"}

    def make(config: dict):
        w = config["num_workers"]
        extra = {"prefetch_factor": config["prefetch_factor"], "persistent_workers": True} if w else {}
        return factory.loader(source, batch_size=args.batch_size, shuffle=True, num_workers=w, transform=transform,
                               device=device, backend=config["backend"], placement=config["placement"],
                               on_error=args.on_error, **extra)

    print(f"tuning over {space}...", file=sys.stderr)
    t = time.perf_counter()
    result = tune(make, space=space, step=step, step_ms=args.step_ms, steps=max(6, args.steps // 2), device=device,
                  default=default)
    chosen = {k: v for k, v in result.chosen.items()
              if not (k == "prefetch_factor" and result.chosen["num_workers"] == 0)}
    outcome = {**result.to_json(), "chosen": chosen, "default": default, "seconds": time.perf_counter() - t,
               "device": torch.device(device).type}  # the target it was measured for: applied only to one alike
    path = store_tune(source, transform, args.batch_size, outcome)
    print(f"tuned: {json.dumps(chosen)} ({outcome['seconds']:.0f} s; rates with the step): {result.reason}")
    print(f"kept in {path}: num_workers='auto' and placement='auto' use it for this source "
          "(fastdata profile --show-cache lists the kept tunes)")
    if args.out:
        out = Path(args.out)
        (out / "config.json").write_text(json.dumps({"loader": chosen, "tune": outcome}, indent=2) + "\n")
        print(f"wrote {out}/config.json: fastdata.loader(..., config={str(out / 'config.json')!r})")
    return outcome


def _run(args: argparse.Namespace, device: str, source: str, transform: Any, step) -> Report:
    from .. import factory
    from .measure import profile

    loader = factory.loader(source, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                             persistent_workers=args.workers != 0, transform=transform, device=device,
                             on_error=args.on_error)
    print(f"profiling {loader.backend} over {source}: {args.steps} steps a measurement...", file=sys.stderr)

    def rebuild(change: dict):  # a predicted change is measured against this config before it is advised
        workers = change.get("num_workers", args.workers)
        print(f"measuring {json.dumps(change) if change else 'the current config'} against it...", file=sys.stderr)
        return factory.loader(source, batch_size=args.batch_size, shuffle=True, num_workers=workers,
                              persistent_workers=workers != 0, transform=transform, device=device,
                              on_error=args.on_error, **{k: v for k, v in change.items() if k != "num_workers"})
    return profile(loader, step, steps=args.steps, step_ms=args.step_ms, device=device, source=source,
                   rebuild=rebuild)
