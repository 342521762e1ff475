"""`tune`: the search over num_workers, prefetch_factor, backend and placement. One probe per
backend and placement is measured with its stages timed, the rate model predicts every config
from those costs, and the best predictions are measured."""

from __future__ import annotations

import dataclasses
import itertools
import json
import sys
from typing import Any, Callable

from .._cores import usable_cores
from .measure import profile
from .model import RateModel
from .report import Report


@dataclasses.dataclass
class Trial:
    """A config of the search: the images/s predicted for it and the images/s measured."""

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
