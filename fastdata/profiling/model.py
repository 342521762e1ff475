"""The rate model (images/s of another loader config, from the stage costs of one run) and the
advice a report gives from it."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

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


def advise(loader: Any, report: Report) -> None:
    """Fills report.advice: each predicted change with its keywords and the images/s the rate
    model gives it (with the step, if any), and what else the stages show."""
    advice = report.advice
    stall, stages = report.stall_fraction, report.stages
    if stall is not None and stall <= INPUT_BOUND:
        advice.append(Advice("nothing to change on the input side"))
        return
    measured = report.together_images_per_s or report.loader_images_per_s
    workers = getattr(loader, "num_workers", None)
    cores = usable_cores()
    model = RateModel.of(report, cores)
    if model is not None and isinstance(workers, int) and report.config.get("backend") not in ("dali", "ray"):
        now = model.rate(workers)
        options = {w: model.rate(w) for w in sorted({0, 1, cores, 2 * cores} - {workers})}
        best = max(options, key=options.get)
        if options[best] >= 1.1 * max(measured, now):  # better than both the run and the model's own figure for it
            advice.append(Advice(f"num_workers={best} instead of {workers}: about {options[best]:,.0f} images/s "
                                 f"(measured now: {measured:,.0f}; the model gives {now:,.0f} for the current config)",
                                 {"num_workers": best}, options[best], "model"))
    elif workers == 0 and cores > 1:
        advice.append(Advice(f"num_workers='auto' ({cores} here) instead of 0: decoding moves off the training process",
                             {"num_workers": "auto"}))
    pixel = stages.get("cpu_transforms", 0)
    device = getattr(loader, "device", None)
    if (model is not None and getattr(loader, "placement", None) == "cpu" and device is not None
            and device.type == "cuda" and pixel > 0.1 * 1e3 * model.work):
        gain = model.moved(pixel / 1e3).rate(max(workers or 0, 0))
        advice.append(Advice(f"placement='gpu': moves ColorJitter/TrivialAugment ({pixel * report.batch_size:,.0f} ms "
                             f"of CPU a batch) to the GPU: about {gain:,.0f} images/s", {"placement": "gpu"}, gain, "model"))
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
    more = scale_out(step_rate, model, cores, workers if report.config.get("backend") == "ray" else None)
    if more is not None:
        advice.append(more)
    if step_rate is not None and report.loader_images_per_s < step_rate:
        advice.append(Advice(f"the loader alone gives {report.loader_images_per_s:,.0f} images/s against the step's "
                             f"{step_rate:,.0f}: input is the bound"))
    if not advice:
        advice.append(Advice("no change found to suggest"))


def scale_out(step_rate: float | None, model: RateModel | None, cores: int, actors: int | None) -> Advice | None:
    """When the step consumes more images/s than these CPUs can decode (their cores over the
    CPU seconds an image costs; with the `ray` backend, its actors' CPUs): how many more nodes
    of `cores` CPUs the `ray` backend needs to close the gap."""
    if not step_rate or model is None or model.cpu <= 0:
        return None
    node = cores / model.cpu  # images/s one node of this machine's cores decodes
    have = (actors if actors else cores) / model.cpu
    if step_rate <= 1.1 * have:
        return None
    nodes = math.ceil((step_rate - have) / node)
    where = f"the cluster's {actors} Ray CPUs give" if actors else "this machine's CPUs give"
    text = (f"this step consumes {step_rate:,.0f} images/s; {where} {have:,.0f}; {nodes} more {cores}-core "
            f"node{'s' if nodes > 1 else ''} close{'' if nodes > 1 else 's'} the gap")
    if not actors:
        text += " (backend='ray' decodes on a Ray cluster's CPUs)"
    return Advice(text, confidence="model")  # nodes to add, not a keyword: no change to apply
