"""`profile`: the loader alone (its stages timed), the step alone, the two together (each
timed window with the other processes' load on these cores), and the verdict."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

import torch

from .._cli import SkipsNamedOnce
from .._collate import batch_len
from .._cores import usable_cores
from .._loader import LoaderCore
from ..backends.torch import remaker
from ..errors import DataError, one_line
from ..transforms.schedule import SizeSchedule
from .advice import advise
from .load import OtherLoad
from .model import check_ceiling
from .report import COSTS, WORKER_STAGES, Report, verdict


def _sync(device) -> None:
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _described(loader: Any) -> str:
    """What the report's title names where the caller gave no source: an image loader's samples
    (their description), a drop-in's dataset (its type), else the loader's type."""
    samples = getattr(loader, "samples", None)
    if isinstance(getattr(samples, "description", None), str):
        return samples.description
    dataset = getattr(loader, "dataset", None)
    return f"{type(dataset).__name__} (a Dataset)" if dataset is not None else type(loader).__name__


def profile(loader: Any, step: Callable[[Any], Any] | None = None, *, steps: int = 30, step_ms: float | None = None,
            warmup: int = 3, device: Any = None, source: str = "", rebuild: Callable[[dict], Any] | None = None,
            confirm: int = 2) -> Report:
    """Profiles `loader` (a fastdata Loader, or any iterable of batches) against `step` (a
    callable run on each batch), or a simulated step of `step_ms` milliseconds, over `steps`
    batches after `warmup` ones. Returns a Report (print it, or `.write(dir)`). A fastdata
    loader whose output size follows the epoch is also timed alone at each size (`sizes`).

    Each change the rate model predicts to help is measured against the current config,
    `confirm` times each, interleaved, before it is advised (see `advise`), on fresh loaders
    that `rebuild(change)` makes like this one with the keywords of `change` set ({} for this
    one's config); `step` runs on their batches too. Without `rebuild`, a fastdata loader is
    remade like itself and a DataLoader from its attributes (`backends.torch.remaker`); any other
    loader (a DataLoader subclass with its own `__init__`), or `confirm=0`, leaves each
    prediction the model's figure, said as such. `source` names what was profiled in the report
    (default: the loader's samples, or its dataset's type)."""
    if step is not None and step_ms is not None:
        raise ValueError("give either step or step_ms, not both")
    if step_ms is not None:
        if step_ms <= 0:
            raise ValueError(f"step_ms should be positive, but got {step_ms}")
        step = lambda batch: time.sleep(step_ms / 1e3)  # noqa: E731  (the CPU is free, as while a GPU computes)
    if steps < 1 or warmup < 0:
        raise ValueError(f"steps should be >= 1 and warmup >= 0, but got steps={steps}, warmup={warmup}")
    if isinstance(confirm, bool) or not isinstance(confirm, int) or confirm < 0:
        raise ValueError(f"confirm should be an int >= 0, but got {confirm!r}")
    if rebuild is None:
        rebuild = remaker(loader)
    device = device if device is not None else getattr(loader, "device", None)
    timed = isinstance(loader, LoaderCore) and loader.set_stage_timing(True)
    skipped_before = _skips(getattr(loader, "stats", {}))

    def measure(change: dict) -> tuple[list[float], list[float]]:
        # the remade loaders read the same files: one skipped is named once, by this loader
        logger, once = logging.getLogger("fastdata"), SkipsNamedOnce(_skips(getattr(loader, "stats", {}))[2])
        logger.addFilter(once)
        try:
            return _compare(rebuild, change, step, steps, warmup, device, confirm)
        finally:
            logger.removeFilter(once)

    try:
        report = _measure(loader, step, steps, warmup, device, source or _described(loader), timed,
                          measure if rebuild is not None and confirm else None)
    finally:
        if timed:
            loader.set_stage_timing(False)
    if isinstance(loader, LoaderCore):
        report.sizes = rates_per_size(loader, steps, warmup)
    report.skipped = skipped_since(skipped_before, _skips(getattr(loader, "stats", {})))
    if not report.loader_images_per_s and report.skipped["count"]:  # nothing to measure: no verdict
        first = report.skipped["examples"][:1]
        raise DataError(one_line(f"no sample could be read: the {report.skipped['count']} the profile took were all "
                                 "left out (on_error='skip')" +
                                 "".join(f"; the first, {e['path']}: {e['cause']}" for e in first)))
    return report


def _compare(rebuild: Callable[[dict], Any], change: dict, step, steps: int, warmup: int, device,
             repeats: int) -> tuple[list[float], list[float]]:
    """The rates with the step (or the loader's alone, without one) of fresh loaders with
    `change` and without it, `repeats` of each, interleaved so that a drift of the machine hits
    both alike."""
    with_change: list[float] = []
    without: list[float] = []
    for _ in range(repeats):
        for config, runs in ((change, with_change), ({}, without)):
            report = profile(rebuild(config), step, steps=steps, warmup=warmup, device=device, confirm=0)
            runs.append(report.together_images_per_s or report.loader_images_per_s)
    return with_change, without


def _skips(stats: dict[str, Any]) -> tuple[int, int, dict[str, dict[str, Any]]]:
    """What a loader's stats say it skipped so far: the skips, the distinct files, and the
    listed files (the first 100) by path, each with its cause and count."""
    listed = {e["path"]: dict(e) for e in stats.get("errors", ()) if isinstance(e, dict) and "path" in e}
    return stats.get("skipped", 0), stats.get("skipped_files", len(listed)), listed


def skipped_since(before: tuple, after: tuple) -> dict[str, Any]:
    """report.skipped from two `_skips` snapshots: the skips between them ("count"), the
    distinct files skipped ("files"), and those files once each with the times each was skipped
    ("examples", the loader's first 100). A file past the first 100 that was skipped before the
    first snapshot and again after it is not known to be among them."""
    (count0, files0, listed0), (count1, files1, listed1) = before, after
    examples = []
    for path, e in listed1.items():
        times = e.get("count", 1) - listed0.get(path, {}).get("count", 0)
        if times > 0:
            examples.append({"path": path, "cause": e.get("cause", ""), "count": times})
    new_listed = sum(path not in listed0 for path in (e["path"] for e in examples))
    files = len(examples) + max(0, files1 - files0 - new_listed)  # and the new ones past the 100
    return {"count": count1 - count0, "files": files if count1 > count0 else 0, "examples": examples}


def _measure(loader, step, steps: int, warmup: int, device, source: str, timed: bool, measure) -> Report:
    epochs = [0]  # epochs begun so far

    count = _counter(loader)

    def batches():  # (batch, its samples)
        taken = 0
        while True:  # epochs end; the profile goes on into the next
            empty = True
            epochs[0] += 1
            passing = iter(loader)
            try:
                for b in passing:
                    empty, taken = False, taken + 1
                    yield b, count(b)
            finally:  # closed with `it`: the pass's threads and workers end now (a fastdata pass has close)
                getattr(passing, "close", lambda: None)()
            if empty:  # (after some batches: an iterator, not an iterable, whose second pass is empty)
                raise ValueError(f"the loader ran out after {taken} batches, and the profile takes more (the warm-up, "
                                 "then the loader alone, the step alone and the two together): give one that can be "
                                 "iterated again, as a DataLoader can (a generator or an iterator cannot)"
                                 if taken else "the loader yields no batches")

    # 1. the loader alone, with its stages timed; first the warm-up, then as many batches as can
    # queue up ahead (made while the loader started, not in the timed window): from then on each
    # batch is made while the window runs
    it = batches()
    cached = None
    for _ in range(warmup + _ahead(loader)):
        cached = _fuller(cached, next(it))
    before = _stage_totals(loader) if timed else {}
    load = OtherLoad()
    cpu = time.process_time()
    alone: list[tuple[float, int, bool]] = []  # (s, images, began an epoch) a batch
    for _ in range(steps):
        e, t = epochs[0], time.perf_counter()
        got = next(it)
        alone.append((time.perf_counter() - t, got[1], epochs[0] != e))
        cached = _fuller(cached, got)
    _sync(device)
    others = [load.stop()]
    n = sum(k for _, k, _ in alone)
    loader_rate = n / max(sum(s for s, _, _ in alone), 1e-9)
    cpu = time.process_time() - cpu
    stages = _per_image(before, _stage_totals(loader)) if timed else {}
    if stages:
        # "deliver": the training process's CPU an image beyond the stages it ran itself (taking
        # batches from the workers, the loop's own work)
        own = COSTS if _in_process(loader) else {"device_stage"}
        stages["deliver"] = max(0.0, 1e3 * cpu / n - sum(v for k, v in stages.items() if k in own))
    bound = max((COSTS | {"deliver"}).intersection(stages), key=stages.get, default=None)
    cached, batch_size = cached
    config = {k: getattr(loader, k) for k in ("backend", "num_workers", "batch_size", "placement") if hasattr(loader, k)}
    if config.get("placement") == "auto":  # as the loader resolved it: the CPU, where no tune applied "gpu"
        config["placement"] = "cpu"
    config["device"] = str(device) if device is not None else "cpu"

    if step is None:
        report = Report(source, batch_size, loader_rate, None, None, None, None,
                        "no training step given: only the loader's own rate was measured", [], config, stages=stages,
                        bound=bound, other_cores=others[0])
        check_ceiling(report, steps)
        it.close()  # the pass ends before a change is measured (below: why)
        advise(loader, report, measure)
        return report

    # 2. the step alone, on one cached batch (a full one: an epoch's short last batch would
    # time a smaller step), and on a CPU device its CPU: the process's (its intra-op threads too),
    # at most the cores' over the window. Workers are other processes, and a loader in this process
    # has filled its bounded queue by now (the warm-up steps take none of it). Not on a GPU: a
    # CUDA wait spins a core, so the process's CPU there counts the GPU's time as well
    for _ in range(min(warmup, 2)):
        step(cached)
    _sync(device)
    t, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        step(cached)
    _sync(device)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - t
    step_s = wall / steps
    step_rate = batch_size / step_s
    on_gpu = _cuda(device) or torch.cuda.is_initialized()  # (a step that uses CUDA on a device not given)
    step_cpu_ms = None if on_gpu or not batch_size else 1e3 * min(cpu, usable_cores() * wall) / (steps * batch_size)

    # 3. both, as training runs them; first as many steps as batches can queue up ahead, since
    # the loader filled its queues while the step ran alone and a full queue is no steady state
    for _ in range(_ahead(loader) + min(warmup, 2)):
        step(next(it)[0])
    load = OtherLoad()
    timeline, together_steps, seconds, images = _together(it, step, steps, device, epochs)
    others.append(load.stop())
    together = images / max(seconds, 1e-9)
    epoch_starts = [k for k, (_, _, began) in enumerate(together_steps) if began]
    taken = sum(k for _, k, _ in together_steps)  # every step's images (`images`: those the window timed)
    per_step = taken / len(together_steps)
    if stages:  # wall ms an image
        stages["consumer_wait"] = 1e3 * sum(w for w, _ in timeline) / taken
    # ideal: the steps' own compute in this run (a simulated step's sleep overshoots by
    # milliseconds on a busy host, more in one phase than another); real: compute and waits
    compute = sum(c for _, c in (timeline[1:] if len(timeline) > 1 and _cuda(device) else timeline))
    stall = max(0.0, 1.0 - compute / max(seconds, 1e-9))
    said = verdict(stall, loader_rate, step_rate)
    report = Report(source, batch_size, loader_rate, step_rate, together, stall, *said, timeline, config,
                    stages=stages, bound=bound, epoch_starts=epoch_starts, images_per_step=per_step,
                    other_cores=max((c for c in others if c is not None), default=None), step_cpu_ms=step_cpu_ms)
    check_ceiling(report, steps)
    # The pass ends before any change is measured: a fresh loader's workers fork from a
    # process whose own decode threads and workers are gone, as they would in training.
    it.close()
    advise(loader, report, measure)
    return report


def _fuller(kept: tuple | None, got: tuple) -> tuple:
    """The (batch, samples) to keep for the step alone: the newer of the two unless it is smaller."""
    return got if kept is None or got[1] >= kept[1] else kept


def _counter(loader: Any) -> Callable[[Any], int]:
    """How many samples each batch the loader delivers holds: the loader's own count where it
    keeps one (fastdata's, stats["samples"], from its batch sampler: a collate_fn's list of
    uncollated samples counts as those samples; with batch_size=None each item is one), else
    `batch_len`."""
    if isinstance(loader, torch.utils.data.DataLoader) and loader.batch_sampler is None:
        return lambda batch: 1  # batch_size=None: a sample at a time, as the loader counts them
    stats = getattr(loader, "stats", None)
    if not (isinstance(stats, dict) and type(stats.get("samples")) is int):
        return batch_len
    last = [stats["samples"]]

    def count(batch: Any) -> int:
        now = stats["samples"]
        n, last[0] = now - last[0], now
        return n if n > 0 else batch_len(batch)

    return count


def _cuda(device) -> bool:
    return device is not None and torch.device(device).type == "cuda"


def _together(it, step, steps: int, device, epochs: list[int]):
    """The loader (`it`: (batch, its samples) pairs) and the step together, as a training loop
    runs them: (timeline, steps, seconds, images) with timeline[k] = (the step's wait for its
    batch, its compute) and steps[k] = (its seconds on the clock, its images, whether it began an
    epoch); the rate is images over seconds. Every step counts, those that began an epoch too:
    training pays for them each epoch, and leaving one out would keep the batches made while it
    waited (a fast step after a slow one).

    On CUDA nothing is synchronized before or within the window: a training loop is not (the
    CPU queues step k+1's kernels and takes batch k+2 while the GPU runs step k), and a
    synchronization before the window lets the workers fill the queue while the GPU drains,
    which the window would then count as speed (measured on an H100: 8% over the plain loop's
    rate in 30 steps). A step's compute is its GPU time, from CUDA events around it, and the
    window runs on the GPU's clock from the end of its first step to the end of its last (the
    first step's images left out). Elsewhere a step's compute is its time on the clock and the
    window is the clock's."""
    cuda = _cuda(device)
    timeline: list[tuple[float, float]] = []
    out: list[tuple[float, int, bool]] = []
    events = []
    start = time.perf_counter()
    for _ in range(steps):
        e, t0 = epochs[0], time.perf_counter()
        batch, n = next(it)
        t1 = time.perf_counter()
        if cuda:
            began, ended = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            began.record(torch.cuda.current_stream(device))
            step(batch)
            ended.record(torch.cuda.current_stream(device))
            events.append((began, ended))
        else:
            step(batch)
        t2 = time.perf_counter()
        timeline.append((t1 - t0, t2 - t1))
        out.append((t2 - t0, n, epochs[0] != e))
    _sync(device)
    seconds, images = time.perf_counter() - start, sum(k for _, k, _ in out)
    if cuda:
        timeline = [(w, a.elapsed_time(b) / 1e3) for (w, _), (a, b) in zip(timeline, events)]
        if len(events) > 1:
            seconds = events[0][1].elapsed_time(events[-1][1]) / 1e3
            images -= out[0][1]
    return timeline, out, seconds, images


def size_steps(transform: Any, horizon: int = 100) -> list[int]:
    """The epochs at which a transform's output size changes (0 first), from its ops' size
    schedules (a callable's over the first `horizon` epochs); [] when no size follows the epoch."""
    epochs: set[int] = set()
    for op in getattr(transform, "geometry", ()):
        if isinstance(getattr(op, "size", None), SizeSchedule):
            epochs.update(e for e, _ in op.size.steps(horizon))
    return sorted(epochs)


def rates_per_size(loader: LoaderCore, steps: int, warmup: int) -> list[dict[str, Any]]:
    """For a loader whose output size follows the epoch (progressive resizing): the loader's
    rate alone at each size, timed over up to `steps` batches of the first epoch at that size
    after `warmup` and the batches that queue up ahead (fewer where the epoch is shorter).
    Low-resolution epochs are where the input pipeline binds. [] for a fixed size."""
    epochs = size_steps(getattr(loader, "transform", None))
    if not epochs:
        return []
    out = []
    for epoch in epochs:
        loader.set_epoch(epoch)
        it = iter(loader)
        skip = min(warmup + _ahead(loader), max(0, len(loader) - 1))  # at least one batch left to time
        for _ in range(skip):
            next(it)
        n, timed, shape, t = 0, 0, None, time.perf_counter()
        for batch in it:
            n, timed = n + batch_len(batch), timed + 1
            shape = tuple(batch[0].shape[-2:])
            if timed == steps:
                break
        seconds = time.perf_counter() - t
        del it
        out.append({"epoch": epoch, "size": list(shape) if shape else None, "batches": timed,
                    "images_per_s": n / max(seconds, 1e-9)})
    return out


# ----------------------------------------------------------------- what it asks of a loader
# A fastdata loader answers through its profiling protocol (fastdata._loader.LoaderCore); any
# other iterable of batches (a DataLoader, say) is not timed, and its queue depth is DataLoader's.

def _ahead(loader: Any) -> int:
    """How many batches the loader can have ready ahead of the consumer."""
    if isinstance(loader, LoaderCore):
        return loader.batches_ahead()
    workers = getattr(loader, "num_workers", 0) or 0
    return (workers or 1) * (getattr(loader, "prefetch_factor", None) or 2) + 1


def _in_process(loader: Any) -> bool:
    """Whether the loader's stages run in the training process (no worker processes)."""
    if isinstance(loader, LoaderCore):
        return loader.runs_in_process()
    return getattr(loader, "num_workers", 0) == 0


def _stage_totals(loader: LoaderCore) -> dict[str, float]:
    """Seconds so far of each stage, summed over the workers, and "images"."""
    return {k: v for k, v in loader.stage_seconds().items() if not isinstance(v, dict)}


def _per_image(before: dict, after: dict) -> dict[str, float]:
    """ms per image of each stage between two snapshots of `_stage_totals`."""
    images = after.get("images", 0) - before.get("images", 0)
    if images <= 0:
        return {}
    names = [*WORKER_STAGES, "device_stage", "h2d_copy"]
    return {k: 1e3 * (after.get(k, 0) - before.get(k, 0)) / images for k in names if k in after}
