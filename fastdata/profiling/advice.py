"""The advice a report gives: each change the rate model (`model.py`) predicts to help, measured
before it is advised where the loader can be remade; what bounds an input-bound step and what
would help (the headline's words); the nodes a cluster would need."""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
from typing import Any, Callable

import torch
from torch.utils.data import IterableDataset

from .. import _optional as optional
from .._cores import usable_cores
from .._pillow import pillow_info
from ..backends.torch import remaker
from ..errors import error_line
from .model import RateModel
from .report import (INPUT_BOUND, NO_CHANGE, NOTHING_TO_CHANGE, WORKER_STAGES, Advice, Report, reads_storage,
                     stage_text)


# measure(change) -> (the change's rates, the current config's rates), measured interleaved
Measure = Callable[[dict], "tuple[list[float], list[float]]"]

NO_FASTER = "more workers measured no faster"  # the headline's "not" once a larger worker count was measured
IMAGE_BACKENDS = ("pil", "wds", "dali", "ray")  # loaders over image files or shards, which the ray backend serves
# One training process's pulls of batches from Ray's object store: about 3,000 images/s of
# 224-pixel images (docs/guide.md, "Scale out with Ray": 56-85 ms a 256-image batch)
RAY_PULLS_IMAGES_PER_S = 3000.0
MAIN_STAGES = {"device_stage": "the device stage", "deliver": "taking batches"}  # the training process's own
# A measured rate under this share of what the rate model gives for the same config: the timed
# stages do not account for it (`unexplained`)
FIT = 0.45
# Other processes keeping at least this many cores, and this share of the usable cores, busy
# while the rates were timed (`Report.other_cores`): the rates are the machine's under that load
OTHER_CORES, OTHER_SHARE = 0.5, 0.2


def unexplained(report: Report, model: RateModel | None, workers: Any) -> str | None:
    """Where a measured rate (the loader alone, or together) is under FIT of what the timed
    stages account for in the same config (the rate model's figure, at most the ceiling): other
    work on these cores, or time spent outside the timed stages. Then the model explains none
    of the run, and what it would advise is held back: these words say so, with the machine's
    load average. So is a rate together over the loader's alone, which bounds it (the load
    changed between the two), and so are rates timed while other processes kept a share of the
    cores busy (measured: `Report.other_cores`), whatever the model says. None where the rates
    fit, or the model has nothing to say."""
    together, alone = report.together_images_per_s, report.loader_images_per_s
    other, cores = report.other_cores, model.cores if model is not None else usable_cores()
    if other is not None and other >= max(OTHER_CORES, OTHER_SHARE * cores):
        return (f"other processes kept {other:.1f} of the {cores} usable cores busy while the rates were timed, so the "
                "rates are this machine's under that load; the rate model's advice is held back: profile again on a "
                "quiet machine")
    if together and alone and together > 1.1 * alone:  # the loader alone bounds the rate together
        return (f"the rate together ({together:,.0f} images/s) passes the loader's alone ({alone:,.0f}), which bounds "
                "it: the machine's load changed between the measurements; the rate model's advice is held back: "
                "profile again on a quiet machine")
    if model is None or not isinstance(workers, int) or workers == 0:
        return None  # (with 0 workers the model takes the loader's rate from the run itself)
    ceiling = report.ceiling_images_per_s or math.inf
    pairs = [("loader alone", report.loader_images_per_s, dataclasses.replace(model, step=0.0).rate(workers))]
    if report.together_images_per_s and model.step > 0:
        pairs.append(("together", report.together_images_per_s, model.rate(workers)))
    low = [(name, got, min(want, ceiling)) for name, got, want in pairs if got < FIT * min(want, ceiling)]
    if not low:
        return None
    figures = "; ".join(f"{name} {got:,.0f} images/s against {want:,.0f}" for name, got, want in low)
    try:
        load = f" (load average {os.getloadavg()[0]:.1f} on {model.cores} usable cores)"
    except (AttributeError, OSError):  # no load average on this system
        load = ""
    return (f"the measured rates are well below what the timed stages account for ({figures}): other work on these "
            f"cores{load}, or time spent outside the timed stages; the rate model's advice is held back: profile "
            "again on a quiet machine")


def advise(loader: Any, report: Report, measure: Measure | None = None, *, script: bool = False,
           kept: str = "") -> None:
    """Fills report.advice: each change the rate model predicts to help, with its keywords and
    figure, and what else the stages show; and report.limit, what bounds the rate (the
    headline's words when no measured change leads it). No figure exceeds the report's ceiling
    (the cores over the CPU an image) and no worker count exceeds the usable cores. With
    `measure`, each predicted change is measured against the current config before it is
    advised (a worker count on the other side of the current one too, where the best gave no
    gain), and only a measured gain is advised as a change (confidence "measured"); without
    it, a prediction stays the model's, which the headline does not name (Report.first_change).
    `script`: a loader `fastdata run` served in a script's own run, where 0 workers were kept
    because workers could change the script's batches: no worker count is advised from 0, and
    `kept`, the run's reason for that one (its summary's), is said."""
    advice = report.advice
    stall, stages = report.stall_fraction, report.stages
    if stall is not None and stall <= INPUT_BOUND:
        advice.append(Advice(NOTHING_TO_CHANGE))
        return
    measured = report.together_images_per_s or report.loader_images_per_s
    workers = getattr(loader, "num_workers", None)
    cores = usable_cores()
    model = RateModel.of(report, cores)
    odd = None if report.config.get("backend") in ("dali", "ray") else unexplained(report, model, workers)
    if odd is not None:  # the model explains none of the run: no advice from it
        model = None
    ceiling = report.ceiling_images_per_s
    images = report.config.get("backend") in IMAGE_BACKENDS
    fixed = script and workers == 0
    how = ("fastdata profile SOURCE --tune measures it" if images else
           "the script's run with it measures it" if script else
           "fastdata.profile measures it unless confirm=0" if remaker(loader) is not None else
           "fastdata.profile(..., rebuild=...) measures it unless confirm=0")

    def bounded(rate: float) -> float:
        return min(rate, ceiling) if ceiling else rate

    more_refuted = False  # a larger worker count was measured and gave no gain
    if fixed:
        why = f"it kept 0 here: {kept}" if kept else "its summary says why this loader has none"
        advice.append(Advice("num_workers not advised: this loader runs with 0 workers in the script's run, and "
                             "workers could change its batches where the script's own Dataset, sampler or keywords "
                             f"run in them (fastdata run gives workers only where they cannot; {why})"))
    elif model is not None and isinstance(workers, int) and report.config.get("backend") not in ("dali", "ray"):
        now = bounded(model.rate(workers))
        counts = sorted({0, 1, max(1, cores - 1), cores} - {workers})
        options = {w: bounded(model.rate(w)) for w in counts}
        # The counts predicted better than both the run and the model's own figure for it, best first.
        # One measured no faster says little of a count on the other side of the current one (more
        # workers than fit beside the step, fewer than the input needs): with `measure`, the best
        # there is measured next.
        ranked = sorted((w for w in counts if options[w] >= 1.1 * max(measured, now)), key=lambda w: -options[w])
        while ranked:
            best = ranked[0]
            advice.append(_checked(
                Advice(f"num_workers={best} instead of {workers}: about {options[best]:,.0f} images/s "
                       f"(measured now: {measured:,.0f}; the model gives {now:,.0f} for the current config)",
                       {"num_workers": best}, options[best], "model"), f"num_workers={best} instead of {workers}",
                measure, how, _split(loader, best)))
            refuted = _refuted(advice[-1])
            more_refuted = more_refuted or (refuted and best > workers)
            ranked = [w for w in ranked if (w > workers) != (best > workers)] if refuted else []
    elif workers == 0 and cores > 1:
        # a count, not "auto": an image loader without persistent workers resolves "auto" to 0
        rule = Advice(f"num_workers={cores} (the usable cores) instead of 0: decoding moves off the training "
                      "process (no stage was timed: no figure)", {"num_workers": cores})
        advice.append(_checked(rule, f"num_workers={cores} instead of 0", measure, how, _split(loader, cores)))
        more_refuted = _refuted(advice[-1])
    pixel = stages.get("cpu_transforms", 0)
    device = getattr(loader, "device", None)
    if (model is not None and getattr(loader, "placement", None) == "cpu" and device is not None
            and device.type == "cuda" and pixel > 0.1 * 1e3 * model.work):
        gain = model.moved(pixel / 1e3).rate(max(workers or 0, 0))
        advice.append(_checked(
            Advice(f"placement='gpu': moves the pixel ops ({pixel * report.batch_size:,.0f} ms of CPU a "
                   f"batch) to the GPU: about {gain:,.0f} images/s", {"placement": "gpu"}, gain, "model"),
            "placement='gpu'", measure, how))
    simd = _pillow_simd(report, loader, pixel)
    if simd is not None:
        advice.append(Advice(simd))
    if model is not None and isinstance(workers, int) and workers > 0:
        in_workers = 1e3 * model.work / workers  # ms an image, in parallel
        device_ms = stages.get("device_stage", 0)
        if device_ms > 0.25 * in_workers:
            on_cpu = device is not None and device.type == "cpu"
            advice.append(Advice(
                f"the device stage (Normalize, dtype, batch ops, GPU-placed ops) takes {device_ms:.2f} ms an image "
                f"in the training process, against {in_workers:.2f} in the workers (their {1e3 * model.work:.2f} ms "
                f"an image over {workers} worker{'s' if workers > 1 else ''})"
                + (": on a CPU device it competes with them" if on_cpu else "")
                + ("; a CUDA device runs it on the GPU" if on_cpu and torch.cuda.is_available() else "")))
    step_rate = report.step_images_per_s
    if images:  # the ray backend serves image files and shards, not a Dataset
        more = scale_out(step_rate, model, cores, workers if report.config.get("backend") == "ray" else None, ceiling)
        if more is not None:
            advice.append(more)
    if step_rate is not None and report.loader_images_per_s < step_rate:
        advice.append(Advice(f"the loader alone gives {report.loader_images_per_s:,.0f} images/s against the step's "
                             f"{step_rate:,.0f}: input is the bound"))
    if report.verdict == "input-bound":  # the headline says what bounds the step and what would help
        report.limit = ({"text": odd, "helps": [], "not": NO_FASTER if more_refuted else None} if odd else
                        limit(report, model, workers, loader, fixed, more_refuted))
    elif odd:
        advice.append(Advice(odd))
    elif not advice:
        advice.append(Advice(NO_CHANGE))


def _refuted(advice: Advice) -> bool:
    """Whether `_checked` measured the change and found no gain."""
    return advice.confidence == "measured" and advice.change is None


def _pillow_simd(report: Report, loader: Any, pixel: float) -> str | None:
    """Pillow-SIMD where Pillow is not it and a timed stage is known to run Pillow: an image
    loader's pixel ops on the CPU. A JPEG that fastdata decodes itself, with its crop and
    bilinear resize, runs none; whether a Dataset's __getitem__ does is not known here."""
    if pillow_info().get("simd", False) or not pixel > 0 or report.config.get("placement") != "cpu":
        return None
    if not getattr(getattr(loader, "transform", None), "pixel_ops", ()):
        return None
    return (f"Pillow-SIMD is not active: the pixel ops on the CPU ({pixel:.2f} ms an image) run in Pillow, whose "
            "resize and blends Pillow-SIMD vectorizes (not measured here): it replaces Pillow, built from source with "
            "the CPU's vector flags (bash scripts/install.sh in fastdata's source does it)")


def _split(loader: Any, workers: int) -> str:
    """What worker advice adds for an IterableDataset: DataLoader runs it whole in each worker,
    so above 1 worker one that does not split its stream by get_worker_info() yields every
    sample once a worker (faster, and wrong)."""
    if workers > 1 and isinstance(getattr(loader, "dataset", None), IterableDataset):
        return ("; an IterableDataset must split its stream by torch.utils.data.get_worker_info(), or each worker "
                "yields all of it (and a rate counts each sample once a worker)")
    return ""


def _checked(predicted: Advice, name: str, measure: Measure | None, how: str, caveat: str = "") -> Advice:
    """A predicted change (the model's, or a rule of thumb's), measured when `measure` is given:
    advised as measured when every run with it beat every run without it, else said to give no
    gain (confidence "measured", no change), or that it could not be measured (and not advised).
    Without `measure`, said to be not measured (the model's figure, for the model's), and `how`
    it would be. A change advised either way ends with `caveat`."""
    if measure is None:
        whose = "the rate model's figure, " if predicted.confidence == "model" else ""
        return dataclasses.replace(predicted, text=f"{predicted.text}; {whose}not measured ({how}){caveat}")
    try:
        runs, base = measure(predicted.change)
    except Exception as e:  # a loader that cannot be made or run with the change: not advised
        return Advice(f"{name} could not be measured, so it is not advised: {error_line(e)}")
    got, now = statistics.median(runs), statistics.median(base)
    figures = f"{got:,.0f} images/s against {now:,.0f} now ({len(runs)} runs each, interleaved)"
    if min(runs) > max(base):
        return Advice(f"{name}: measured {figures}{caveat}", predicted.change, got, "measured")
    predicted_rate = predicted.predicted_images_per_s
    return Advice(f"{name} gave no clear gain when measured: {figures}, not every run with it above every run "
                  "without" + (f"; the rate model had predicted {predicted_rate:,.0f}" if predicted_rate else ""),
                  confidence="measured")  # measured, and no change to make


def limit(report: Report, model: RateModel | None, workers: Any, loader: Any, fixed: bool,
          refuted: bool = False) -> dict | None:
    """What bounds the rate under the rate model, for the headline: the least of its bounds
    (RateModel.terms) and the costliest stage of what sets it (worker stages over the workers,
    the CPU stages over the cores, the training process's own stages in series with the step),
    as a sentence ("text"), with what would help ("helps": (words, the keywords it sets or
    None)), only what this machine offers: a GPU decode or placement="gpu" only where a CUDA
    device is, a worker count only below the usable cores and never for a `fixed` loader, nor
    once a larger count was measured no faster (`refuted`: "not" says so); and what would not
    ("not"). A bound the measured rate together passes by over 5% is not what holds
    it (the model's figure for it was too low: the training process's stages overlap the workers
    more than the model gives them) where another would hold the rate under the step's: that one
    is named. None when the model cannot say (no stages, or the step alone holds the rate: the
    wait the verdict saw is then not the model's to explain)."""
    if model is None or not isinstance(workers, int):
        return None
    terms, together = model.terms(workers), report.together_images_per_s
    held = {k: v for k, v in terms.items() if v >= together / 1.05} if together else terms
    if held and min(held.values()) < (report.step_images_per_s or math.inf):
        terms = held
    kind = min(terms, key=terms.get)
    if kind == "workers" and terms.get("cores", math.inf) <= 1.01 * terms["workers"]:
        kind = "cores"  # as many workers as the cores keep busy: the cores bound them
    if kind == "step":
        return None  # the step itself, with no stages of the training process's own: the model cannot say
    st, rate, step = report.stages, terms[kind], report.step_images_per_s or 0.0
    names = {"workers": WORKER_STAGES, "main": tuple(MAIN_STAGES),
             "cores": [s for s in (*WORKER_STAGES, "device_stage", "deliver") if s != "read"],
             "loader": (*WORKER_STAGES, "device_stage", "deliver")}[kind]
    stage = max((s for s in names if st.get(s, 0) > 0), key=st.get, default=None)
    if stage is None:
        return None
    what, ms, against = stage_text(stage, st).split(" (")[0], st[stage], f"against the step's {step:,.0f}"
    if kind == "main":
        alone = 1.0 / (model.main + model.step)  # with a core of its own
        own = ", ".join(f"{MAIN_STAGES[s]} {st[s]:.2f}" for s in sorted(MAIN_STAGES, key=lambda s: -st.get(s, 0))
                        if st.get(s, 0) > 0)
        text = (f"the training process runs its own stages ({1e3 * model.main:.2f} ms an image: {own}) in series "
                "with the step")
        # (named though the measured rate is over 5% off the model's figure: the measured one is said)
        off = together and abs(together - rate) > 0.05 * rate
        held = (f"is {together:,.0f} images/s {against} (the rate model's figure: {rate:,.0f})" if off
                else f"holds at about {rate:,.0f} images/s {against}")
        if rate < 0.95 * alone:  # it shares its core with busy workers
            return {"text": f"{text}, on a core it shares with the workers: the rate together {held}, and at most "
                            f"{alone:,.0f} with a core of its own",
                    "helps": _helps(report, stage, loader, [("more CPU cores", None)]),
                    "not": NO_FASTER if refuted else None}
        return {"text": f"{text}: the rate together {held}",
                "helps": _helps(report, stage, loader, []), "not": "more workers, cores or nodes would not"}
    if kind == "workers":
        text = (f"{workers} worker{'s give' if workers > 1 else ' gives'} at most {rate:,.0f} images/s {against}; "
                f"{what} costs the most of a worker's {1e3 * model.work:.2f} ms an image")
        more = ([("more CPU cores (with as many workers)", None)] if workers >= model.cores else
                [] if refuted else [(f"more workers (up to the {model.cores} usable cores{_split(loader, 2)})", None)])
    elif kind == "cores" and model.step > 0 and model.step_cpu > 0:  # the step's own CPU among it
        step_ms, loader_ms = 1e3 * model.step_cpu, 1e3 * (model.all_cpu() - model.step_cpu)
        text = (f"the {model.cores} cores give at most {rate:,.0f} images/s together {against}: the step's own CPU "
                f"({step_ms:.2f} ms an image) shares them with the loader's ({loader_ms:.2f} ms)")
        if step_ms >= ms:
            text += "; the step costs the most of it"
            cuda_step = [("device='cuda' for the step", {"device": "cuda"})] if torch.cuda.is_available() else []
            helps = [("more CPU cores", None), *cuda_step]
            return {"text": text, "helps": helps, "not": NO_FASTER if refuted else None}
        text += f"; {what} costs the most of the loader's ({ms:.2f} ms)"
        more = [("more CPU cores", None)]
    elif kind == "cores":
        text = (f"the {model.cores} cores give at most {rate:,.0f} images/s (the ceiling) {against}; {what} costs the "
                f"most of the CPU an image ({ms:.2f} ms)")
        more = [("more CPU cores", None)]
    else:  # no workers
        text = (f"with no workers the training process makes each batch before its step, in series: at most "
                f"{rate:,.0f} images/s together {against}" if not model.ahead else
                f"with no workers the training process makes the batches, at most {rate:,.0f} images/s {against}")
        text += f"; {what} costs the most ({ms:.2f} ms an image)"
        more = [] if fixed or refuted or model.cores < 2 else [(f"workers (num_workers above 0{_split(loader, 2)})",
                                                                None)]
    return {"text": text, "helps": _helps(report, stage, loader, more), "not": NO_FASTER if refuted else None}


def _helps(report: Report, stage: str, loader: Any, more: list) -> list[tuple[str, dict | None]]:
    """What would make `stage` cheaper, of what this machine offers, after `more`."""
    cuda, images = torch.cuda.is_available(), report.config.get("backend") in IMAGE_BACKENDS
    on_cpu = str(report.config.get("device", "cpu")).startswith("cpu")
    helps = list(more)
    if stage == "decode" and images:
        pixel_ops = getattr(getattr(loader, "transform", None), "pixel_ops", ())
        if cuda and not pixel_ops and report.config.get("backend") != "dali":  # the dali backend runs no pixel ops
            got = "" if optional.has("dali") else f" ({optional.missing('dali', 'backend dali')})"
            helps.append((f"a GPU decode (backend='dali'{got})", {"backend": "dali"}))
        helps.append(("a smaller crop", None))
    elif stage == "cpu_transforms" and cuda and images:
        helps.append(("placement='gpu' for the pixel ops", {"placement": "gpu"}))
    elif stage == "device_stage":
        if cuda and on_cpu:
            helps.append(("device='cuda', which runs the device stage on the GPU", {"device": "cuda"}))
        helps.append(("fewer ops in the device stage", None))
    else:
        # ("decode" here: `fastdata run`'s natively served folder, whose script sets the sizes)
        helps += {"read": [("faster storage", None)] if reads_storage(report.stages) else [],
                  "dataset": [("a cheaper __getitem__", None)],
                  "decode": [("smaller stored images (a file's decode time grows with its pixels)", None)],
                  "collate": [("fewer or smaller tensors a sample", None)]}.get(stage, [])
    return helps


def scale_out(step_rate: float | None, model: RateModel | None, cores: int, actors: int | None,
              ceiling: float | None = None) -> Advice | None:
    """When the step consumes more images/s than these CPUs can decode (the report's ceiling:
    their cores over the CPU seconds an image costs; with the `ray` backend, its actors' CPUs):
    how many more nodes of `cores` CPUs the `ray` backend needs to close the gap, and how to
    install Ray where it is not. Nodes decode, but one training process still runs its own
    stages in series with the step and pulls every batch from Ray's object store: the rate
    together stays below both bounds, whatever the nodes. Where the lower of the two is below
    the step's rate, the advice says so and counts the nodes to reach it, or none where these
    CPUs (within 10%) already give it."""
    if not step_rate or model is None or model.cpu <= 0:
        return None
    node = ceiling if ceiling else cores / model.cpu  # images/s one node of this machine's cores decodes
    have = node * (actors / cores if actors else 1)
    if step_rate <= 1.1 * have:
        return None
    where = f"the cluster's {actors} Ray CPUs give" if actors else "this machine's CPUs give"
    text = f"this step consumes {step_rate:,.0f} images/s; {where} {have:,.0f}"
    series = 1.0 / (model.main + model.step) if model.main + model.step > 0 else math.inf
    bound, why = min((series, f"its own stages taking {1e3 * model.main:.2f} ms an image in series with the step's "
                              f"{1e3 * model.step:.2f} ms"),
                     (RAY_PULLS_IMAGES_PER_S, "its pulls from Ray's object store giving about 3,000 images/s of "
                                              "224-pixel images (docs/guide.md)"))
    target = min(step_rate, bound)
    if target <= 1.1 * have:
        return Advice(f"{text}, but one training process takes at most about {bound:,.0f} images/s here, {why}: "
                      "more nodes would not lift the rate past that", confidence="model")
    nodes = math.ceil((target - have) / node)
    plural = nodes > 1
    text += f"; {nodes} more {cores}-core node{'s' if plural else ''} "
    if target < step_rate:
        text += (f"bring{'' if plural else 's'} it to about {bound:,.0f}, not to the step's rate: one training process "
                 f"takes at most that, {why}")
    else:
        text += f"close{'' if plural else 's'} the gap"
    if not actors:
        text += " (backend='ray' decodes on a Ray cluster's CPUs"
        text += ")" if optional.has("ray") else f"; {optional.PARTS['ray'].adds} adds Ray, not installed here)"
    return Advice(text, confidence="model")  # nodes to add, not a keyword: no change to apply
