"""`fastdata run --profile`: a served loader timed in the script's own run, and its report.

In the command's process, `Timing` wraps each pass of a served loader: the wait is the time in
`next()`, the step the time from a batch handed out to the next `next()` (the script's own
work); the loader's stage timing (the profiling protocol of `fastdata._loader.LoaderCore`)
gives the stage seconds. In `fastdata run`, `report` turns those figures into the usual
`Report`: there is no loader-alone run in a real run, so the loader's own rate is the rate
model's (`RateModel`) from the stage costs, or, with no workers, the images over the waits.
"""

from __future__ import annotations

import dataclasses
import time
from types import SimpleNamespace
from typing import Any, Iterator

from .._cores import usable_cores
from ..profiling.advice import advise
from ..profiling.load import OtherLoad
from ..profiling.model import RateModel, check_ceiling
from ..profiling.report import WORKER_STAGES, Report, verdict
from ._decide import KEPT

STEPS_KEPT = 2000  # the report's step-by-step list; the rates count every step


class Timing:
    """A served loader's figures over the run: batches, images, the consumer's waits and steps,
    the first STEPS_KEPT steps, the loader's stage seconds, and the cores other processes kept
    busy from the loader's making to its last snapshot (`load.OtherLoad`: under such load the
    rates are the machine's under it, and the advice is held back, as `fastdata-profile`'s);
    `native`: what fastdata's own fetch does for a natively served loader ("files": reads and
    decodes a folder's files; "arrays": an in-memory dataset's pixel ops), whose time the
    drop-in times as its Dataset's."""

    def __init__(self, loader: Any, native: str | None = None) -> None:
        self.native = native
        self.seq = -1
        self.batches = self.images = 0
        self.wait_s = self.compute_s = 0.0
        self.steps: list[tuple[float, float, bool]] = []
        self.stages: dict[str, float] = {}
        self.num_workers, self.batch_size = loader.num_workers, loader.batch_size
        self._load, self.other_cores = OtherLoad(), None

    def wrap(self, it: Iterator[Any], loader: Any) -> "TimedPass":
        return TimedPass(it, self, loader)

    def snapshot(self, loader: Any) -> None:
        self.stages = {k: v for k, v in loader.stage_seconds().items() if isinstance(v, (int, float))}
        self.other_cores = self._load.stop()

    def add(self, wait: float, compute: float, images: int, epoch_start: bool) -> None:
        self.batches += 1
        self.images += images
        self.wait_s += wait
        self.compute_s += compute
        if len(self.steps) < STEPS_KEPT:
            self.steps.append((wait, compute, epoch_start))

    def to_json(self) -> dict[str, Any]:
        return {"batches": self.batches, "images": self.images, "wait_s": self.wait_s, "compute_s": self.compute_s,
                "steps": self.steps, "stages": self.stages, "num_workers": self.num_workers,
                "batch_size": self.batch_size, "native": self.native, "other_cores": self.other_cores}


class TimedPass:
    """A pass's iterator, timed: a step is counted when the consumer asks for the next batch
    (the last batch's step, when it never asks again, is not). As the pass's own iterator, it
    goes on after a batch that raised, and has the len() and `_num_yielded` of DataLoader's."""

    _num_yielded = 0

    def __init__(self, it: Iterator[Any], timing: Timing, loader: Any) -> None:
        self._it, self._timing, self._loader = it, timing, loader
        self._handed: tuple[float, float, int, bool] | None = None  # (when, wait, images, epoch start)
        self._first = True
        self.close = getattr(it, "close", lambda: None)

    def __iter__(self) -> "TimedPass":
        return self

    def __next__(self) -> Any:
        t0 = time.perf_counter()
        if self._handed is not None:
            when, wait, images, first = self._handed
            self._timing.add(wait, t0 - when, images, first)
            self._handed = None
        try:
            batch = next(self._it)
        except StopIteration:
            self._timing.snapshot(self._loader)
            raise
        t1 = time.perf_counter()
        self._handed = (t1, t1 - t0, _images(batch), self._first)
        self._first = False
        self._num_yielded += 1
        return batch

    def __len__(self) -> int:
        return len(self._it)


def _images(batch: Any) -> int:
    first = batch[0] if isinstance(batch, (tuple, list)) and batch else batch
    if isinstance(first, dict) and first:
        first = next(iter(first.values()))
    if isinstance(first, (tuple, list)) and first:  # a multi-view wrapper's: the first view's images
        first = first[0]
    shape = getattr(first, "shape", None)
    return int(shape[0]) if shape else 1


# a natively served loader's fetch: the stage its Dataset time is, and what fastdata does in it
NATIVE = {"files": ("decode", "fastdata reads, decodes, crops and resizes the files"),
          "arrays": ("cpu_transforms", "fastdata runs the transform's ops on the arrays")}

FEW_STEPS = 5  # a report of fewer steps says its figures are no steady state


def report(profile: dict[str, Any], source: str, reason: str = "") -> Report:
    """The Report of one served loader's figures (`Timing.to_json()`); `reason`: the run's
    decision for it, as its summary gives it (why it kept 0 workers, where it did)."""
    images, wait, compute = profile["images"], profile["wait_s"], profile["compute_s"]
    seconds = max(wait + compute, 1e-9)
    stall = wait / seconds
    totals = profile["stages"]
    staged = totals.get("images", 0)
    native = NATIVE.get(profile.get("native"))
    if native is not None:  # the Dataset's time is fastdata's own fetch: named as the image backends name it
        totals = {native[0] if k == "dataset" else k: v for k, v in totals.items()}
    stages = {k: 1e3 * totals[k] / staged for k in WORKER_STAGES if k in totals and staged}
    stages["consumer_wait"] = 1e3 * wait / max(images, 1)
    workers = profile["num_workers"]
    config = {"backend": "torch", "num_workers": workers, "batch_size": profile["batch_size"], "device": "cpu"}
    steps = [(w, c) for w, c, _ in profile["steps"]]
    starts = [k for k, (_, _, first) in enumerate(profile["steps"]) if first]
    step_rate = images / max(compute, 1e-9)
    r = Report(source, profile["batch_size"] or 1, 0.0, step_rate, images / seconds, stall, None, "", steps, config,
               stages=stages, bound=max((s for s in stages if s in WORKER_STAGES), key=stages.get, default=None),
               epoch_starts=starts, images_per_step=images / max(profile["batches"], 1),
               other_cores=profile.get("other_cores"))
    if workers == 0:
        r.loader_images_per_s = images / max(wait, 1e-9)  # in-process: the wait is the loader's own time
        how = "the loader alone: the images over the waits"
    model = RateModel.of(r, usable_cores())
    if workers and model is not None:
        r.loader_images_per_s = dataclasses.replace(model, main=0.0, step=0.0).rate(workers)
        how = "the loader alone: the rate model's figure from the stage costs"
    elif workers:
        r.loader_images_per_s = images / seconds  # it delivered that much: a lower bound
        how = "the loader alone: at least the rate together (no stage timing: a collate_fn of the script's)"
    r.verdict, why = verdict(stall, r.loader_images_per_s, step_rate)
    served = f"; served natively: {native[1]}" if native is not None else ""
    r.explanation = f"{why} (measured in the script's run: {profile['batches']} steps{served}; {how})"
    check_ceiling(r, max(profile["batches"], 1))
    if profile["batches"] < FEW_STEPS:  # (a short validation loader's pass; an epoch's start weighs it all)
        n, firsts = profile["batches"], len(starts)
        which = (f", {firsts} of them an epoch's first" if n > 1 else ", an epoch's first" if firsts else "")
        r.flags.append(f"only {n} step{'s' if n > 1 else ''} timed{which}: too few for a steady state; the verdict "
                       "is a glimpse, not a measure")
    kept = reason.partition(KEPT)[2]
    advise(SimpleNamespace(num_workers=workers, device=None, placement=None), r, script=True, kept=kept)
    return r
