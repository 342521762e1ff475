"""The rate model: images/s of another loader config, from the stage costs of one run (the
advice it gives is `advice.py`'s), and the ceiling it puts on any config (`check_ceiling`)."""

from __future__ import annotations

import dataclasses
import math

from .._cores import usable_cores
from ..ceiling import MARGIN
from .report import WORKER_STAGES, Report


@dataclasses.dataclass
class RateModel:
    """images/s of a loader config together with the step, from the stage costs of one run.

    A worker handles one image at a time: its stages' time, waits included ("read"), bounds
    each worker. All the CPU work, workers' and training process's, shares the cores. The
    training process's own stages (the device stage, taking batches) run in series with the
    step, in its thread, at the share of a core the scheduler leaves it beside the busy workers:
    it joins one core's run queue and shares that core with the workers there. Taking a batch
    sets a worker to work, so the workers busy at that rate, rounded up, are busy then (with as
    many busy workers as cores, a stage there takes nearly twice its CPU time). The step costs a
    whole step a batch, a short last batch too (`step` is a step over the images a step took on
    average). With 0 workers an image loader's thread in the training process decodes ahead of
    the step, each batch over all the cores: the slower of the two bounds, the loader at its
    loader-alone time an image when the profile measured it so (its CPU seconds would overstate
    it: the decode threads overlap), else its reads in series and its decode spread over the
    cores. A drop-in (`ahead` False) makes each batch in the step's thread, as DataLoader does:
    its loader-alone time and the step's add up. Prefetch depth does not enter: it absorbs
    jitter, it adds no capacity. The step's own CPU (`step_cpu`, measured with the step alone on
    a CPU device) shares the cores with the loader's: all the CPU work together bounds the rate
    together, never the loader's alone. Left out: cores slowing each other down (memory
    bandwidth, caches), and the step's CPU slowed on a core it shares with workers (its wall
    time in series is the one measured alone)."""

    work: float  # s an image in a worker: its stages, waits included
    cpu: float  # CPU s an image in the workers
    main: float  # s an image of the training process's stages
    step: float  # s of the step an image; 0 for the loader alone
    cores: int
    main_on_cpu: bool = True  # False when the device stage runs on a GPU
    serial: float | None = None  # s an image of the loader alone, measured with 0 workers
    ahead: bool = True  # with 0 workers, whether the batches are made ahead of the step (not a drop-in)
    step_cpu: float = 0.0  # CPU s an image of the step on a CPU device (its intra-op threads too); 0 unmeasured

    @classmethod
    def of(cls, report: Report, cores: int) -> RateModel | None:
        st = report.stages
        work = sum(st.get(k, 0) for k in WORKER_STAGES) / 1e3
        if work <= 0:
            return None
        cpu = work - st.get("read", 0) / 1e3
        main = (st.get("device_stage", 0) + st.get("deliver", 0)) / 1e3
        serial = 1.0 / report.loader_images_per_s if report.config.get("num_workers") == 0 else None
        # the step's CPU was measured on a full batch: a step over the images a step took, as its time;
        # under 1% of the loader's (a step that waits: a sleep, a GPU's kernels) it moves no bound
        step_cpu = (report.step_cpu_ms or 0.0) / 1e3 * report.batch_size / (report.images_per_step or report.batch_size)
        step_cpu = step_cpu if step_cpu >= 0.01 * (cpu + main) else 0.0
        return cls(work, cpu, main, cls.step_of(report), cores, report.config.get("device", "cpu") == "cpu", serial,
                   report.config.get("backend") != "torch", step_cpu)

    @staticmethod
    def step_of(report: Report) -> float:
        """The step's seconds an image in `report`: a step over the images a step took."""
        if not report.step_images_per_s:
            return 0.0
        return report.batch_size / report.step_images_per_s / (report.images_per_step or report.batch_size)

    def all_cpu(self) -> float:
        """CPU s an image that shares the cores: the workers' (or the decode threads'), the
        training process's stages where they run on the CPU, and the step's own where there is one."""
        return self.cpu + (self.main if self.main_on_cpu else 0.0) + (self.step_cpu if self.step > 0 else 0.0)

    def rate(self, workers: int) -> float:
        return min(self.terms(workers).values())

    def terms(self, workers: int) -> dict[str, float]:
        """The bounds whose least is rate(workers), by what sets each: "loader" (0 workers: the
        loader in the training process), "workers" (each worker's stages), "cores" (all the CPU
        work over the cores, the step's own included), "main" (the training process's own stages in
        series with the step; "step" where it has none)."""
        series = "main" if self.main > 0 else "step"
        if workers == 0 and not self.ahead:  # the Dataset, the collation and the step, one after another
            loader = self.serial if self.serial is not None else self.work + self.main
            return {"loader": 1.0 / max(loader + self.step, 1e-12)}
        if workers == 0:
            # The decode thread runs ahead of the step; its batch spreads over the cores
            # (reads in series, the decode in parallel).
            loader = self.serial
            if loader is None:
                loader = (self.work - self.cpu) + self.cpu / self.cores + self.main
            out = {"loader": 1.0 / max(loader, 1e-12)}
            if self.main + self.step > 0:
                out[series] = 1.0 / (self.main + self.step)
            if self.step > 0 and self.step_cpu > 0:  # the step's CPU beside the decode threads'
                out["cores"] = self.cores / self.all_cpu()
            return out
        out = {"workers": workers / self.work, "cores": self.cores / max(self.all_cpu(), 1e-9)}
        if self.main + self.step <= 0:
            return out
        supply = min(out.values())
        # The fewest busy workers consistent with the rate they make: with b of them busy, the
        # training process's core has b - cores + 1 of them (b / cores beyond the cores).
        for busy in range(workers + 1):
            beside = max(0, busy - self.cores + 1) if busy <= self.cores else busy / self.cores
            share = 1.0 / (1 + beside) if self.main_on_cpu else 1.0
            out[series] = 1.0 / (self.main / share + self.step)
            if math.ceil(min(workers, min(supply, out[series]) * self.cpu) - 1e-9) <= busy:
                break
        return out

    def moved(self, seconds: float) -> RateModel:
        """The model with `seconds` an image of CPU work taken off the workers (onto the GPU)."""
        serial = None if self.serial is None else max(self.serial - seconds, 1e-9)
        return dataclasses.replace(self, work=max(self.work - seconds, 1e-9), cpu=max(self.cpu - seconds, 0.0),
                                   serial=serial)


def check_ceiling(report: Report, steps: int, cores: int | None = None) -> None:
    """The ceiling: the usable cores over the CPU seconds an image costs (the stages' CPU, the
    read's waits left out), which no timing window changes. A window of `steps` batches may
    begin with a batch under way in each worker; a rate above the ceiling by more than that and
    timer and clock-speed noise (`ceiling.MARGIN`) means work done outside the timed window was
    counted in it (a loader running ahead): flagged, not trusted."""
    model = RateModel.of(report, cores or usable_cores())
    if model is None:
        return
    cpu = dataclasses.replace(model, step=0.0).all_cpu()  # the pipeline's: the step's own is not the loader's
    if cpu <= 0:
        return
    report.ceiling_images_per_s = model.cores / cpu
    under_way = (steps + (report.config.get("num_workers") or 0)) / steps
    for name, rate in (("loader alone", report.loader_images_per_s), ("together", report.together_images_per_s)):
        if rate is not None and rate > MARGIN * under_way * report.ceiling_images_per_s:
            report.flags.append(f"{name}: {rate:,.0f} images/s is above this pipeline's ceiling on {model.cores} cores "
                                f"({report.ceiling_images_per_s:,.0f}): not a valid measurement")
