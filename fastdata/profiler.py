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
import dataclasses
import html
import importlib
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

from ._cli import Parser

INPUT_BOUND = 0.10  # stall fraction above which the step is input-bound
COMPUTE_BOUND = 1.5  # loader rate / step rate above which the step is compute-bound

# What each stage is, as the report says it (ms an image; where: worker, training process, GPU).
STAGES = {
    "read": "reading the bytes (wall time)",
    "dataset": "the Dataset's __getitem__ (CPU)",
    "decode": "JPEG decode, crop, resize (CPU)",
    "cpu_transforms": "pixel ops on the CPU (CPU)",
    "collate": "batching into shared memory (CPU)",
    "deliver": "taking batches in the training process (CPU)",
    "device_stage": "Normalize, dtype, device-placed ops",
    "h2d_copy": "host-to-device copy (GPU time)",
    "consumer_wait": "the step waiting for data (wall time, together)",
}


@dataclasses.dataclass
class Report:
    """What `profile` measured. Rates are images/s; `steps` holds (wait_s, compute_s) per step
    of the run together."""

    source: str
    batch_size: int
    loader_images_per_s: float
    step_images_per_s: float | None
    together_images_per_s: float | None
    stall_fraction: float | None
    verdict: str
    steps: list[tuple[float, float]]
    advice: list[str]
    config: dict[str, Any]
    stages: dict[str, float] = dataclasses.field(default_factory=dict)  # ms per image (see _per_image)
    bound: str | None = None  # the stage that costs the most per image
    predictions: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # the advice's, machine-readable
    # steps of the run together that began an epoch: left out of the rates, since worker queues
    # may refill then (a cost each epoch, not the steady state); their waits are in `steps`
    epoch_starts: list[int] = dataclasses.field(default_factory=list)
    # images in a steady step of the run together, on average: below the batch size when a short
    # last batch of an epoch fell among them (the step costs a whole step all the same)
    images_per_step: float | None = None

    def epoch_start_note(self) -> str | None:
        if not self.epoch_starts or len(self.epoch_starts) == len(self.steps):
            return None
        wait = 1e3 * max(self.steps[k][0] for k in self.epoch_starts)
        others = [w for k, (w, _) in enumerate(self.steps) if k not in self.epoch_starts]
        return (f"left out of the rates: {len(self.epoch_starts)} step(s) that began an epoch (waited up to "
                f"{wait:,.0f} ms, the others {1e3 * sum(others) / len(others):,.0f} ms on average: the workers' "
                f"queues refill at an epoch start unless they run ahead)")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        lines = [f"fastdata-profile: {self.source}", f"  config: {json.dumps(self.config)}",
                 f"  loader alone:   {self.loader_images_per_s:10,.0f} images/s"]
        if self.step_images_per_s is not None:
            lines.append(f"  step alone:     {self.step_images_per_s:10,.0f} images/s")
            lines.append(f"  together:       {self.together_images_per_s:10,.0f} images/s "
                         f"(the step waited for data {100 * self.stall_fraction:.0f}% of the time)")
            if self.epoch_start_note():
                lines.append(f"  {self.epoch_start_note()}")
        if self.stages:
            lines.append("  where an image's time goes (ms an image, loader alone; worker stages summed over workers):")
            lines += [f"    {name:<15}{ms:8.2f}  {STAGES.get(name, '')}" + ("   <- the most" if name == self.bound else "")
                      for name, ms in self.stages.items()]
        lines.append(f"  verdict: {self.verdict}")
        lines += [f"  - {a}" for a in self.advice]
        return "\n".join(lines)

    def print(self, console: Any = None) -> None:
        """The summary in the terminal, with rich: the rates, a bar per stage, the verdict in
        colour, the advice."""
        from rich.console import Console
        from rich.table import Table

        console = console or Console(width=None if sys.stdout.isatty() else 120)
        console.rule(f"[bold]fastdata-profile[/]: {self.source}")
        console.print(f"[dim]{json.dumps(self.config)}[/]")
        rates = Table(show_header=False, box=None, padding=(0, 2))
        rates.add_row("loader alone", f"{self.loader_images_per_s:,.0f} images/s")
        if self.step_images_per_s is not None:
            rates.add_row("step alone", f"{self.step_images_per_s:,.0f} images/s")
            rates.add_row("together", f"{self.together_images_per_s:,.0f} images/s",
                          f"the step waited for data {100 * self.stall_fraction:.0f}% of the time")
        console.print(rates)
        if self.epoch_start_note():
            console.print(f"[dim]{self.epoch_start_note()}[/]")
        if self.stages:
            table = Table(title="where an image's time goes (loader alone; worker stages summed over workers)",
                          title_justify="left", box=None, padding=(0, 2))
            table.add_column("stage")
            table.add_column("ms/image", justify="right")
            table.add_column("")
            table.add_column("what", style="dim")
            top = max(self.stages.values()) or 1.0
            for name, ms in self.stages.items():
                colour = "red" if name == self.bound else "cyan"
                table.add_row(name, f"{ms:.2f}", f"[{colour}]{'█' * max(0, round(30 * ms / top))}[/]",
                              STAGES.get(name, ""))
            console.print(table)
        colour = "red" if self.verdict.startswith("input") else "green" if self.verdict.startswith("compute") else "yellow"
        console.print(f"verdict: [bold {colour}]{self.verdict}[/]")
        for a in self.advice:
            console.print(f"  • {a}")

    def to_html(self) -> str:
        """A self-contained page: the summary, and one bar per step (wait, then compute)."""
        width, height = 760, 180
        total = max((w + c for w, c in self.steps), default=1.0) or 1.0
        bar = width / max(len(self.steps), 1)
        rects = []
        for k, (w, c) in enumerate(self.steps):
            x = k * bar
            hw, hc = height * w / total, height * c / total
            rects.append(f'<rect x="{x:.1f}" y="{height - hw:.1f}" width="{max(bar - 1, 1):.1f}" height="{hw:.1f}" '
                         f'fill="#e15759"><title>step {k}: waited {1e3 * w:.1f} ms</title></rect>'
                         f'<rect x="{x:.1f}" y="{height - hw - hc:.1f}" width="{max(bar - 1, 1):.1f}" '
                         f'height="{hc:.1f}" fill="#4e79a7"><title>step {k}: computed {1e3 * c:.1f} ms</title></rect>')
        svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height + 20}" '
               f'font-family="sans-serif" font-size="11">{"".join(rects)}'
               f'<text x="0" y="{height + 15}">steps: red = waiting for data, blue = compute '
               f'(tallest {1e3 * total:.0f} ms)</text></svg>')
        top = max(self.stages.values(), default=1.0) or 1.0
        stage_svg = "".join(
            f'<text x="0" y="{18 * k + 13}">{html.escape(name)}</text><rect x="110" y="{18 * k + 2}" '
            f'width="{500 * ms / top:.1f}" height="14" fill="{"#e15759" if name == self.bound else "#76b7b2"}"/>'
            f'<text x="{116 + 500 * ms / top:.1f}" y="{18 * k + 13}">{ms:.2f} ms</text>'
            for k, (name, ms) in enumerate(self.stages.items()))
        stages = (f'<h4>Where an image\'s time goes (ms per image)</h4><svg xmlns="http://www.w3.org/2000/svg" '
                  f'width="700" height="{18 * len(self.stages) + 4}" font-family="sans-serif" font-size="11">'
                  f'{stage_svg}</svg>') if self.stages else ""
        return ("<!doctype html><html><head><meta charset='utf-8'><title>fastdata-profile</title></head><body>"
                f"<h3>fastdata-profile: {html.escape(self.source)}</h3><pre>{html.escape(str(self))}</pre>"
                f"{'<h4>Steps</h4>' + svg if self.steps else ''}{stages}</body></html>")

    def write(self, out: str | os.PathLike) -> Path:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.json").write_text(json.dumps(self.to_json(), indent=2) + "\n")
        (out / "report.html").write_text(self.to_html())
        return out


def _sync(device) -> None:
    import torch

    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _batch_len(batch: Any) -> int:
    first = batch[0] if isinstance(batch, (tuple, list)) else batch
    return int(first.shape[0]) if hasattr(first, "shape") else len(first)


def profile(loader: Any, step: Callable[[Any], Any] | None = None, *, steps: int = 30, step_ms: float | None = None,
            warmup: int = 3, device: Any = None, source: str = "") -> Report:
    """Profiles `loader` (a fastdata Loader, or any iterable of batches) against `step` (a
    callable run on each batch), or a simulated step of `step_ms` milliseconds, over `steps`
    batches after `warmup` ones. Returns a Report (print it, or `.write(dir)`)."""
    if step is not None and step_ms is not None:
        raise ValueError("give either step or step_ms, not both")
    if step_ms is not None:
        if step_ms <= 0:
            raise ValueError(f"step_ms should be positive, but got {step_ms}")
        step = lambda batch: time.sleep(step_ms / 1e3)  # noqa: E731  (the CPU is free, as while a GPU computes)
    if steps < 1 or warmup < 0:
        raise ValueError(f"steps should be >= 1 and warmup >= 0, but got steps={steps}, warmup={warmup}")
    device = device if device is not None else getattr(loader, "device", None)
    timed = hasattr(loader, "_timing") and loader._timing(True)
    try:
        return _measure(loader, step, steps, warmup, device, source, timed)
    finally:
        if timed:
            loader._timing(False)


def _measure(loader, step, steps: int, warmup: int, device, source: str, timed: bool) -> Report:
    epochs = [0]  # epochs begun so far

    def batches():
        while True:  # epochs end; the profile goes on into the next
            empty = True
            epochs[0] += 1
            for b in loader:
                empty = False
                yield b
            if empty:
                raise ValueError("the loader yields no batches")

    # 1. the loader alone, with its stages timed
    it = batches()
    for _ in range(warmup):
        cached = next(it)
    before = _stage_totals(loader) if timed else {}
    cpu = time.process_time()
    alone: list[tuple[float, int, bool]] = []  # (s, images, began an epoch) a batch
    for _ in range(steps):
        e, t = epochs[0], time.perf_counter()
        cached = next(it)
        alone.append((time.perf_counter() - t, _batch_len(cached), epochs[0] != e))
    _sync(device)
    n = sum(k for _, k, _ in alone)
    loader_rate = _rate_over(alone, _steady(alone))
    cpu = time.process_time() - cpu
    stages = _per_image(before, _stage_totals(loader)) if timed else {}
    if stages:
        # "deliver": the training process's CPU an image beyond the stages it ran itself (taking
        # batches from the workers, the loop's own work)
        own = _COSTS if _in_process(loader) else {"device_stage"}
        stages["deliver"] = max(0.0, 1e3 * cpu / n - sum(v for k, v in stages.items() if k in own))
    bound = max((_COSTS | {"deliver"}).intersection(stages), key=stages.get, default=None)
    batch_size = _batch_len(cached)
    config = {k: getattr(loader, k) for k in ("backend", "num_workers", "batch_size", "placement") if hasattr(loader, k)}
    config["device"] = str(device) if device is not None else "cpu"

    if step is None:
        report = Report(source, batch_size, loader_rate, None, None, None, "no consumer given: the loader's ceiling",
                        [], [], config, stages, bound)
        _advice(loader, report)
        return report

    # 2. the step alone, on one cached batch
    for _ in range(min(warmup, 2)):
        step(cached)
    _sync(device)
    t = time.perf_counter()
    for _ in range(steps):
        step(cached)
    _sync(device)
    step_s = (time.perf_counter() - t) / steps
    step_rate = batch_size / step_s

    # 3. both, as training runs them; first as many steps as batches can queue up ahead, since
    # the loader filled its queues while the step ran alone and a full queue is no steady state
    for _ in range(_ahead(loader) + min(warmup, 2)):
        step(next(it))
    _sync(device)
    timeline: list[tuple[float, float]] = []
    together_steps: list[tuple[float, int, bool]] = []
    for _ in range(steps):
        e, t0 = epochs[0], time.perf_counter()
        batch = next(it)
        t1 = time.perf_counter()
        step(batch)
        _sync(device)
        t2 = time.perf_counter()
        timeline.append((t1 - t0, t2 - t1))
        together_steps.append((t2 - t0, _batch_len(batch), epochs[0] != e))
    steady = _steady(together_steps)
    together = _rate_over(together_steps, steady)
    epoch_starts = [k for k, (_, _, began) in enumerate(together_steps) if began]
    if stages:  # wall ms an image
        stages["consumer_wait"] = 1e3 * sum(timeline[k][0] for k in steady) / sum(together_steps[k][1] for k in steady)
    # ideal: the steps' own compute in this run (a simulated step's sleep overshoots by
    # milliseconds on a busy host, more in one phase than another); real: compute and waits
    stall = max(0.0, 1.0 - sum(timeline[k][1] for k in steady) / sum(together_steps[k][0] for k in steady))
    if stall > INPUT_BOUND:
        verdict = f"input-bound: the step waited for data {100 * stall:.0f}% of the time"
    elif loader_rate >= COMPUTE_BOUND * step_rate:
        verdict = "compute-bound: the loader has headroom; faster input would not speed this step up"
    else:
        verdict = "balanced: the loader just keeps up; a slower input or a faster step would make it wait"
    per_step = sum(together_steps[k][1] for k in steady) / len(steady)  # images
    report = Report(source, batch_size, loader_rate, step_rate, together, stall, verdict, timeline, [], config, stages,
                    bound, epoch_starts=epoch_starts, images_per_step=per_step)
    _advice(loader, report)
    return report


def _steady(runs: list[tuple[float, int, bool]]) -> list[int]:
    """Of (seconds, images, began an epoch) a step: the steps that did not begin an epoch (all
    of them when every step did)."""
    return [k for k, (_, _, began) in enumerate(runs) if not began] or list(range(len(runs)))


def _rate_over(runs: list[tuple[float, int, bool]], steps: list[int]) -> float:
    """images/s over those `steps` of `runs`."""
    return sum(runs[k][1] for k in steps) / max(sum(runs[k][0] for k in steps), 1e-9)


# where a worker's time goes: the image backends' stages, or the drop-in's dataset (the user's
# __getitem__) and collation
_WORKER_STAGES = ("read", "dataset", "decode", "cpu_transforms", "collate")


# the stages that cost the loader's own time (a bound): not the GPU's copy, not the consumer's wait
_COSTS = frozenset((*_WORKER_STAGES, "device_stage"))


def _ahead(loader: Any) -> int:
    """How many batches the loader can have ready ahead of the consumer."""
    workers = getattr(loader, "num_workers", 0) or 0
    inner = getattr(loader, "_loader", None)
    depth = getattr(inner, "prefetch_factor", None) or getattr(loader, "_depth", None) or 2
    return (workers or 1) * depth + 1


def _in_process(loader: Any) -> bool:
    """Whether the loader's stages run in the training process (no worker processes)."""
    return getattr(loader, "num_workers", 0) == 0 or getattr(loader, "backend", "") == "dali"


def _stage_totals(loader: Any) -> dict[str, float]:
    return {k: v for k, v in loader._stages().items() if not isinstance(v, dict)}


def _per_image(before: dict, after: dict) -> dict[str, float]:
    """ms per image of each stage between two snapshots of stats["stages"]."""
    images = after.get("images", 0) - before.get("images", 0)
    if images <= 0:
        return {}
    names = [*_WORKER_STAGES, "device_stage", "h2d_copy"]
    return {k: 1e3 * (after.get(k, 0) - before.get(k, 0)) / images for k in names if k in after}


@dataclasses.dataclass
class RateModel:
    """images/s of a loader config together with the step, from the stage costs of one run.

    A worker handles one image at a time: its stages' time, waits included ("read"), bounds
    each worker. All the CPU work, workers' and training process's, shares the cores. The
    training process's own stages (the device stage, taking batches) run in series with the
    step, in its thread, at the share of a core the scheduler leaves it beside the busy workers:
    it joins one core's run queue and shares that core with the workers there. Taking a batch
    sets a worker to work, so the workers busy at that rate, rounded up, are busy then (measured
    with 2 workers on 2 cores: a 15 ms device stage took 27 ms). The step costs a whole step a
    batch, a short last batch too (`step` is a step over the images a step took on average).
    With 0 workers everything runs in series: at the loader-alone time an image, when the profile
    measured it so (the in-process decoder's threads overlap, so its CPU seconds would overstate
    it). Prefetch depth does not enter: it absorbs jitter, it adds no capacity. Left out: cores
    slowing each other down (memory bandwidth, caches)."""

    work: float  # s an image in a worker: its stages, waits included
    cpu: float  # CPU s an image in the workers
    main: float  # s an image of the training process's stages
    step: float  # s of the step an image; 0 for the loader alone
    cores: int
    main_on_cpu: bool = True  # False when the device stage runs on a GPU
    serial: float | None = None  # s an image of the loader alone, measured with 0 workers

    @classmethod
    def of(cls, report: "Report", cores: int) -> "RateModel | None":
        st = report.stages
        work = sum(st.get(k, 0) for k in _WORKER_STAGES) / 1e3
        if work <= 0:
            return None
        cpu = work - st.get("read", 0) / 1e3
        main = (st.get("device_stage", 0) + st.get("deliver", 0)) / 1e3
        serial = 1.0 / report.loader_images_per_s if report.config.get("num_workers") == 0 else None
        return cls(work, cpu, main, cls.step_of(report), cores, report.config.get("device", "cpu") == "cpu", serial)

    @staticmethod
    def step_of(report: "Report") -> float:
        """The step's seconds an image in `report`: a step over the images a step took."""
        if not report.step_images_per_s:
            return 0.0
        return report.batch_size / report.step_images_per_s / (report.images_per_step or report.batch_size)

    def rate(self, workers: int) -> float:
        if workers == 0:
            return 1.0 / ((self.work + self.main if self.serial is None else self.serial) + self.step)
        cpu = self.cpu + (self.main if self.main_on_cpu else 0.0)
        supply = min(workers / self.work, self.cores / max(cpu, 1e-9))
        if self.main + self.step <= 0:
            return supply
        # The fewest busy workers consistent with the rate they make: with b of them busy, the
        # training process's core has b - cores + 1 of them (b / cores beyond the cores).
        for busy in range(workers + 1):
            beside = max(0, busy - self.cores + 1) if busy <= self.cores else busy / self.cores
            share = 1.0 / (1 + beside) if self.main_on_cpu else 1.0
            rate = min(supply, 1.0 / (self.main / share + self.step))
            if math.ceil(min(workers, rate * self.cpu) - 1e-9) <= busy:
                break
        return rate

    def moved(self, seconds: float) -> "RateModel":
        """The model with `seconds` an image of CPU work taken off the workers (onto the GPU)."""
        serial = None if self.serial is None else max(self.serial - seconds, 1e-9)
        return dataclasses.replace(self, work=max(self.work - seconds, 1e-9), cpu=max(self.cpu - seconds, 0.0),
                                   serial=serial)


def _advice(loader: Any, report: Report) -> None:
    """Fills report.advice, and report.predictions with each predicted change:
    {"change": {keyword: value}, "images_per_s": prediction (with the step, if any)}."""
    from ._pillow import pillow_info
    from .backends.base import usable_cores

    advice, predictions = report.advice, report.predictions
    stall, stages = report.stall_fraction, report.stages
    if stall is not None and stall <= INPUT_BOUND:
        advice.append("nothing to change on the input side")
        return
    measured = report.together_images_per_s or report.loader_images_per_s
    workers = getattr(loader, "num_workers", None)
    cores = usable_cores()
    model = RateModel.of(report, cores)
    if model is not None and isinstance(workers, int) and report.config.get("backend") != "dali":
        now = model.rate(workers)
        options = {w: model.rate(w) for w in sorted({0, 1, cores, 2 * cores} - {workers})}
        best = max(options, key=options.get)
        if options[best] >= 1.1 * max(measured, now):  # better than both the run and the model's own figure for it
            advice.append(f"num_workers={best} instead of {workers}: about {options[best]:,.0f} images/s "
                          f"(measured now: {measured:,.0f}; the model gives {now:,.0f} for the current config)")
            predictions.append({"change": {"num_workers": best}, "images_per_s": options[best]})
    elif workers == 0 and cores > 1:
        advice.append(f"num_workers='auto' ({cores} here) instead of 0: decoding moves off the training process")
    pixel = stages.get("cpu_transforms", 0)
    device = getattr(loader, "device", None)
    if (model is not None and getattr(loader, "placement", None) == "cpu" and device is not None
            and device.type == "cuda" and pixel > 0.1 * 1e3 * model.work):
        gain = model.moved(pixel / 1e3).rate(max(workers or 0, 0))
        advice.append(f"placement='gpu': moves ColorJitter/TrivialAugment ({pixel * report.batch_size:,.0f} ms of CPU "
                      f"a batch) to the GPU: about {gain:,.0f} images/s")
        predictions.append({"change": {"placement": "gpu"}, "images_per_s": gain})
    if not pillow_info().get("simd", False):
        advice.append("Pillow-SIMD is not active: bash scripts/install.sh builds it (measured on the ImageNet "
                      "transform here: a DataLoader with Pillow-SIMD ran 1.2x one with stock Pillow)")
    if model is not None and isinstance(workers, int) and workers > 0:
        in_workers = 1e3 * model.work / workers  # ms an image, in parallel
        device_ms = stages.get("device_stage", 0)
        if device_ms > 0.25 * in_workers:
            advice.append(f"the device stage (Normalize, dtype, batch ops, GPU-placed ops) takes {device_ms:.2f} ms an "
                          f"image in the training process, against {in_workers:.2f} in the workers"
                          + (": on a CPU device it competes with them; a CUDA device runs it on the GPU"
                             if device is not None and device.type == "cpu" else ""))
    step_rate = report.step_images_per_s
    if step_rate is not None and report.loader_images_per_s < step_rate:
        advice.append(f"the loader alone gives {report.loader_images_per_s:,.0f} images/s against the step's "
                      f"{step_rate:,.0f}: input is the bound")
    if not advice:
        advice.append("no change found to suggest")


# ----------------------------------------------------------------- the command line

class _Fail(Exception):
    """A one-line cause for the command line."""


def _model_step(spec: str, device: str) -> Callable[[Any], None]:
    import torch

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
    from . import transforms as T

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
    from .synthetic import make_imagenet_like

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
    import torch

    if args.steps < 1 or args.batch_size < 1 or args.size < 1:
        raise _Fail("--steps, --batch-size and --size should be at least 1")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    source = _source(args)
    step = _model_step(args.model, device) if args.model else None
    return device, source, _transform(args.transform, args.size), step


def _run_tune(args: argparse.Namespace, device: str, source: str, transform: Any, step) -> None:
    import importlib.util

    import fastdata

    from .backends.base import usable_cores
    from .sources import is_shard_source

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
        return fastdata.loader(source, batch_size=args.batch_size, shuffle=True, num_workers=w, transform=transform,
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
    import fastdata

    workers = args.workers if args.workers == "auto" else int(args.workers)
    loader = fastdata.loader(source, batch_size=args.batch_size, shuffle=True, num_workers=workers,
                             persistent_workers=workers != 0, transform=transform, device=device)
    print(f"profiling {loader.backend} over {source}: {args.steps} steps a measurement...", file=sys.stderr)
    return profile(loader, step, steps=args.steps, step_ms=args.step_ms, device=device, source=source)



# ----------------------------------------------------------------- --tune

def machine_key() -> str:
    """The machine a tuned config is for: CPU model, usable cores, GPU name."""
    import platform

    import torch

    from .backends.base import usable_cores

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    return f"{platform.processor() or platform.machine()}, {usable_cores()} cores, {gpu}"


def _cache_path(source: Any, transform: Any, batch_size: int) -> Path:
    """Where the tuned config for (source, transform, batch size, machine) is kept."""
    import hashlib

    where = os.path.abspath(source) if isinstance(source, (str, os.PathLike)) and os.path.exists(source) else str(source)
    key = json.dumps([where, repr(transform), batch_size, machine_key()])
    root = Path(os.environ.get("FASTDATA_CACHE", Path.home() / ".cache" / "fastdata")) / "tuned"
    return root / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"


def store_tune(source: Any, transform: Any, batch_size: int, config: dict[str, Any]) -> Path:
    """Keeps `config` (what `--tune` chose, under "loader") as the tuned config for this source,
    transform, batch size and machine; returns its path. Several jobs may tune and read the
    same entry at once, so it is written whole or not at all: into a temporary file in the same
    folder, flushed to disk, then renamed over the old one (a rename within a file system is
    atomic), so a reader opens the old file or the new one, never one half written."""
    import tempfile

    path = _cache_path(source, transform, batch_size)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), 0o644)  # mkstemp's 0600 would hide it from a cache shared between users
            f.write(json.dumps(config, indent=2) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def cached_tune(source: Any, transform: Any, batch_size: int) -> dict[str, Any] | None:
    """The loader keywords a `--tune` chose for this source, transform, batch size and machine,
    or None. (`store_tune` replaces the file whole, so a read never sees a torn one.)"""
    path = _cache_path(source, transform, batch_size)
    try:
        return json.loads(path.read_text())["loader"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


@dataclasses.dataclass
class Trial:
    config: dict[str, Any]
    predicted: float | None  # images/s the rate model gave, together with the step
    measured: float | None = None


def _rate(loader_factory: Callable[[dict], Any], config: dict, step, step_ms, steps: int, device) -> tuple[float, Report]:
    loader = loader_factory(config)
    report = profile(loader, step, steps=steps, step_ms=step_ms, warmup=2, device=device)
    rate = report.together_images_per_s if report.together_images_per_s is not None else report.loader_images_per_s
    return rate, report


def tune(loader_factory: Callable[[dict], Any], *, space: dict[str, list], step=None, step_ms: float | None = None,
         steps: int = 8, device=None, confirm: int = 2, progress: bool = True,
         predictions: list | None = None) -> tuple[dict, list[Trial]]:
    """Searches `space` (keyword -> values: num_workers, prefetch_factor, backend, placement)
    for the config with the highest images/s with the step. It measures one probe per backend
    and placement with their stages timed, predicts every config from those stage costs (see
    `RateModel`), and measures the `confirm` best predictions. Returns
    (best config, trials); `predictions`, when given a list, gets (config, predicted images/s)
    for every config of the space. Configs that differ only in prefetch_factor predict alike
    (the model has no term for it): the first of them stands for all."""
    from .backends.base import usable_cores

    cores = usable_cores()
    workers = sorted(space.get("num_workers", [cores]))
    probe_w = max(w for w in workers if w <= cores) if any(w <= cores for w in workers) else workers[0]
    trials: list[Trial] = []
    models: dict[tuple, RateModel] = {}  # (backend, placement) -> the rate model of its probe
    base = {k: v[0] for k, v in space.items()}

    def say(msg: str) -> None:
        if progress:
            print(msg, file=sys.stderr)

    for backend in space.get("backend", [base.get("backend")]):
        for placement in space.get("placement", [base.get("placement")]):
            config = {**base, "num_workers": probe_w, "backend": backend, "placement": placement}
            config = {k: v for k, v in config.items() if v is not None}
            rate, report = _rate(loader_factory, config, step, step_ms, steps, device)
            trials.append(Trial(config, None, rate))
            model = RateModel.of(report, cores)
            if model is None:  # no stage timing: the probe's rate stands for the whole loader
                work = max(1, probe_w) / report.loader_images_per_s
                model = RateModel(work, work, 0.0, RateModel.step_of(report), cores)
            models[(backend, placement)] = model
            say(f"  probe {config}: {rate:,.0f} images/s; worker {1e3 * model.work:.2f} ms, "
                f"main {1e3 * model.main:.2f} ms an image")

    def predict(config: dict) -> float:
        return models[(config.get("backend"), config.get("placement"))].rate(config.get("num_workers", 0))

    import itertools

    keys = list(space)
    candidates = [dict(zip(keys, values)) for values in itertools.product(*(space[k] for k in keys))]
    candidates = [{k: v for k, v in c.items() if v is not None} for c in candidates]
    predicted = sorted(((predict(c), c) for c in candidates), key=lambda pc: -pc[0])
    if predictions is not None:
        predictions.extend((c, p) for p, c in predicted)
    measured = {json.dumps(t.config, sort_keys=True): t.measured for t in trials}
    distinct, seen = [], set()
    for p, config in predicted:
        key = json.dumps({k: v for k, v in config.items() if k != "prefetch_factor"}, sort_keys=True)
        if key not in seen:
            seen.add(key)
            distinct.append((p, config))
    for p, config in distinct[:confirm]:
        key = json.dumps(config, sort_keys=True)
        if key not in measured:
            rate, _ = _rate(loader_factory, config, step, step_ms, steps, device)
            measured[key] = rate
            say(f"  confirm {config}: predicted {p:,.0f}, measured {rate:,.0f} images/s")
        trials.append(Trial(config, p, measured[key]))
    best = max((t for t in trials if t.measured is not None), key=lambda t: t.measured)
    return best.config, trials
