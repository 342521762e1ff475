"""The rate model (images/s of another loader config, from the stage costs of one run) and the
advice a report gives from it."""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any, Callable

from .. import _optional as optional
from .._cores import usable_cores
from .._pillow import pillow_info
from .report import INPUT_BOUND, WORKER_STAGES, Advice, Report


@dataclasses.dataclass
class RateModel:
    """images/s of a loader config together with the step, from the stage costs of one run.

    A worker handles one image at a time: its stages' time, waits included ("read"), bounds
    each worker. All the CPU work, workers' and training process's, shares the cores. The
    training process's own stages (the device stage, taking batches) run in series with the
    step, in its thread, at the share of a core the scheduler leaves it beside the busy workers:
    it joins one core's run queue and shares that core with the workers there. Taking a batch
    sets a worker to work, so the workers busy at that rate, rounded up, are busy then (with as
    many busy workers as cores, a stage there takes nearly twice its CPU time). The step costs a whole step a
    batch, a short last batch too (`step` is a step over the images a step took on average).
    With 0 workers a thread of the training process decodes ahead of the step, each batch over
    all the cores: the slower of the two bounds, the loader at its loader-alone time an image
    when the profile measured it so (its CPU seconds would overstate it: the decode threads
    overlap), else its reads in series and its decode spread over the cores. Prefetch depth does not enter: it absorbs jitter, it adds no capacity. Left out: cores
    slowing each other down (memory bandwidth, caches)."""

    work: float  # s an image in a worker: its stages, waits included
    cpu: float  # CPU s an image in the workers
    main: float  # s an image of the training process's stages
    step: float  # s of the step an image; 0 for the loader alone
    cores: int
    main_on_cpu: bool = True  # False when the device stage runs on a GPU
    serial: float | None = None  # s an image of the loader alone, measured with 0 workers

    @classmethod
    def of(cls, report: Report, cores: int) -> RateModel | None:
        st = report.stages
        work = sum(st.get(k, 0) for k in WORKER_STAGES) / 1e3
        if work <= 0:
            return None
        cpu = work - st.get("read", 0) / 1e3
        main = (st.get("device_stage", 0) + st.get("deliver", 0)) / 1e3
        serial = 1.0 / report.loader_images_per_s if report.config.get("num_workers") == 0 else None
        return cls(work, cpu, main, cls.step_of(report), cores, report.config.get("device", "cpu") == "cpu", serial)

    @staticmethod
    def step_of(report: Report) -> float:
        """The step's seconds an image in `report`: a step over the images a step took."""
        if not report.step_images_per_s:
            return 0.0
        return report.batch_size / report.step_images_per_s / (report.images_per_step or report.batch_size)

    def rate(self, workers: int) -> float:
        if workers == 0:
            # The decode thread runs ahead of the step; its batch spreads over the cores
            # (reads in series, the decode in parallel).
            loader = self.serial if self.serial is not None else (self.work - self.cpu) + self.cpu / self.cores + self.main
            return 1.0 / max(loader, self.main + self.step)
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

    def moved(self, seconds: float) -> RateModel:
        """The model with `seconds` an image of CPU work taken off the workers (onto the GPU)."""
        serial = None if self.serial is None else max(self.serial - seconds, 1e-9)
        return dataclasses.replace(self, work=max(self.work - seconds, 1e-9), cpu=max(self.cpu - seconds, 0.0),
                                   serial=serial)


# measure(change) -> (the change's rates, the current config's rates), measured interleaved
Measure = Callable[[dict], "tuple[list[float], list[float]]"]


def advise(loader: Any, report: Report, measure: Measure | None = None) -> None:
    """Fills report.advice: each change the rate model predicts to help, with its keywords and
    figure, and what else the stages show. No figure exceeds the report's ceiling (the cores
    over the CPU an image) and no worker count exceeds the usable cores. With `measure`, each
    predicted change is measured against the current config before it is advised, and only a
    measured gain is advised as a change (confidence "measured"); without it, a prediction
    stays the model's, which the headline does not name (Report.first_change)."""
    advice = report.advice
    stall, stages = report.stall_fraction, report.stages
    if stall is not None and stall <= INPUT_BOUND:
        advice.append(Advice("nothing to change on the input side"))
        return
    measured = report.together_images_per_s or report.loader_images_per_s
    workers = getattr(loader, "num_workers", None)
    cores = usable_cores()
    model = RateModel.of(report, cores)
    ceiling = report.ceiling_images_per_s

    def bounded(rate: float) -> float:
        return min(rate, ceiling) if ceiling else rate

    if model is not None and isinstance(workers, int) and report.config.get("backend") not in ("dali", "ray"):
        now = bounded(model.rate(workers))
        counts = sorted({0, 1, max(1, cores - 1), cores} - {workers})
        options = {w: bounded(model.rate(w)) for w in counts}
        best = max(options, key=options.get)
        if options[best] >= 1.1 * max(measured, now):  # better than both the run and the model's own figure for it
            advice.append(_checked(
                Advice(f"num_workers={best} instead of {workers}: about {options[best]:,.0f} images/s "
                       f"(measured now: {measured:,.0f}; the model gives {now:,.0f} for the current config)",
                       {"num_workers": best}, options[best], "model"), f"num_workers={best} instead of {workers}",
                measure))
    elif workers == 0 and cores > 1:
        advice.append(Advice(f"num_workers='auto' ({cores} here) instead of 0: decoding moves off the training process",
                             {"num_workers": "auto"}))
    pixel = stages.get("cpu_transforms", 0)
    device = getattr(loader, "device", None)
    if (model is not None and getattr(loader, "placement", None) == "cpu" and device is not None
            and device.type == "cuda" and pixel > 0.1 * 1e3 * model.work):
        gain = model.moved(pixel / 1e3).rate(max(workers or 0, 0))
        advice.append(_checked(
            Advice(f"placement='gpu': moves ColorJitter/TrivialAugment ({pixel * report.batch_size:,.0f} ms of CPU a "
                   f"batch) to the GPU: about {gain:,.0f} images/s", {"placement": "gpu"}, gain, "model"),
            "placement='gpu'", measure))
    if not pillow_info().get("simd", False):
        advice.append(Advice("Pillow-SIMD is not active: bash scripts/install.sh builds it (the README's ImageNet "
                             "benchmark compares the two)"))
    if model is not None and isinstance(workers, int) and workers > 0:
        in_workers = 1e3 * model.work / workers  # ms an image, in parallel
        device_ms = stages.get("device_stage", 0)
        if device_ms > 0.25 * in_workers:
            advice.append(Advice(f"the device stage (Normalize, dtype, batch ops, GPU-placed ops) takes {device_ms:.2f} ms "
                                 f"an image in the training process, against {in_workers:.2f} in the workers"
                                 + (": on a CPU device it competes with them; a CUDA device runs it on the GPU"
                                    if device is not None and device.type == "cpu" else "")))
    step_rate = report.step_images_per_s
    more = scale_out(step_rate, model, cores, workers if report.config.get("backend") == "ray" else None, ceiling)
    if more is not None:
        advice.append(more)
    if step_rate is not None and report.loader_images_per_s < step_rate:
        advice.append(Advice(f"the loader alone gives {report.loader_images_per_s:,.0f} images/s against the step's "
                             f"{step_rate:,.0f}: input is the bound"))
    if not advice:
        advice.append(Advice("no change found to suggest"))


def _checked(predicted: Advice, name: str, measure: Measure | None) -> Advice:
    """A predicted change, measured when `measure` is given: advised as measured when every run
    with it beat every run without it, else said to give no gain (and not advised)."""
    if measure is None:
        return dataclasses.replace(predicted, text=f"{predicted.text}; the rate model's figure, not measured "
                                                    "(fastdata profile SOURCE --tune measures it)")
    runs, base = measure(predicted.change)
    got, now = statistics.median(runs), statistics.median(base)
    figures = f"{got:,.0f} images/s against {now:,.0f} now ({len(runs)} runs each, interleaved)"
    if min(runs) > max(base):
        return Advice(f"{name}: measured {figures}", predicted.change, got, "measured")
    return Advice(f"{name} gave no gain when measured: {figures}; the rate model had predicted "
                  f"{predicted.predicted_images_per_s:,.0f}")


def scale_out(step_rate: float | None, model: RateModel | None, cores: int, actors: int | None,
              ceiling: float | None = None) -> Advice | None:
    """When the step consumes more images/s than these CPUs can decode (the report's ceiling:
    their cores over the CPU seconds an image costs; with the `ray` backend, its actors' CPUs):
    how many more nodes of `cores` CPUs the `ray` backend needs to close the gap, and how to
    install Ray where it is not."""
    if not step_rate or model is None or model.cpu <= 0:
        return None
    node = ceiling if ceiling else cores / model.cpu  # images/s one node of this machine's cores decodes
    have = node * (actors / cores if actors else 1)
    if step_rate <= 1.1 * have:
        return None
    nodes = math.ceil((step_rate - have) / node)
    where = f"the cluster's {actors} Ray CPUs give" if actors else "this machine's CPUs give"
    text = (f"this step consumes {step_rate:,.0f} images/s; {where} {have:,.0f}; {nodes} more {cores}-core "
            f"node{'s' if nodes > 1 else ''} close{'' if nodes > 1 else 's'} the gap")
    if not actors:
        text += " (backend='ray' decodes on a Ray cluster's CPUs"
        text += ")" if optional.has("ray") else f"; {optional.missing('ray', 'backend ray')})"
    return Advice(text, confidence="model")  # nodes to add, not a keyword: no change to apply
