"""`tune`: the search over num_workers, prefetch_factor, backend and placement. One probe per
backend and placement is measured with its stages timed, the rate model predicts every config
from those costs, and the finalists (the best predictions, the best with workers at each
prefetch_factor, and the default) are measured
repeatedly, interleaved; a config other than the default is picked only when it beats the
default by more than the noise of the measurements."""

from __future__ import annotations

import dataclasses
import itertools
import json
import statistics
import sys
from typing import Any, Callable

from .._cores import usable_cores
from .measure import profile
from .model import RateModel
from .report import Report, config_text


@dataclasses.dataclass
class Candidate:
    """A measured config: the images/s the rate model predicted for it (None for a probe or a
    config the model cannot predict) and the images/s of each run, with the step."""

    config: dict[str, Any]
    predicted: float | None
    runs: list[float] = dataclasses.field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.runs)

    @property
    def low(self) -> float:
        return min(self.runs)

    @property
    def high(self) -> float:
        return max(self.runs)

    def to_json(self) -> dict[str, Any]:
        return {"config": self.config, "predicted_images_per_s": self.predicted, "runs_images_per_s": self.runs,
                "median_images_per_s": self.median, "interval_images_per_s": [self.low, self.high]}


@dataclasses.dataclass
class TuneResult:
    """What `tune` found: the config it chose and why, the finalists with their runs, and the
    probes (one run each)."""

    chosen: dict[str, Any]
    reason: str
    candidates: list[Candidate]
    probes: list[Candidate]

    def to_json(self) -> dict[str, Any]:
        """Plain dicts and lists: chosen, reason, candidates and probes (each with config,
        predicted_images_per_s, runs_images_per_s, median_images_per_s, interval_images_per_s)."""
        return {"chosen": self.chosen, "reason": self.reason, "candidates": [c.to_json() for c in self.candidates],
                "probes": [p.to_json() for p in self.probes]}


def _rate(loader_factory: Callable[[dict], Any], config: dict, step, step_ms, steps: int, device) -> tuple[float, Report]:
    loader = loader_factory(config)
    report = profile(loader, step, steps=steps, step_ms=step_ms, warmup=2, device=device, confirm=0)
    rate = report.together_images_per_s if report.together_images_per_s is not None else report.loader_images_per_s
    return rate, report


def _key(config: dict) -> str:
    return json.dumps(config, sort_keys=True)


def _figure(c: Candidate) -> str:
    return f"{c.median:,.0f} images/s ({c.low:,.0f}-{c.high:,.0f})"


def pick(candidates: list[Candidate], default: dict | None = None, default_backend: str | None = None
         ) -> tuple[Candidate, str]:
    """The candidate to use and a sentence saying why, from measured candidates (`default`,
    when given, among them). Two candidates differ only when their intervals do not overlap.
    The best median wins only when its interval lies wholly above the default's and above every
    simpler candidate's (simpler: fewer workers, then cpu placement, then the default's backend
    or else `default_backend`, then a smaller prefetch_factor). Otherwise the pick is the
    simplest candidate that lies wholly above the default and overlaps the best; with none, the
    default; without a default, the simplest candidate that overlaps the best."""
    backend = (default or {}).get("backend", default_backend)

    def simplicity(c: Candidate) -> tuple:
        cfg = c.config
        return (cfg.get("num_workers", 0), cfg.get("placement", "cpu") != "cpu",
                backend is not None and cfg.get("backend", backend) != backend, cfg.get("prefetch_factor", 0))

    best = max(candidates, key=lambda c: c.median)
    base = next((c for c in candidates if default is not None and _key(c.config) == _key(default)), None)
    if base is None and default is not None:
        raise ValueError("the default config should be among the candidates")
    near = sorted((c for c in candidates if c.high >= best.low), key=simplicity)  # within the noise of the best
    if base is best:
        return base, f"the default ({config_text(base.config)}) measured best: {_figure(base)}"
    if base is not None and base.high >= best.low:
        return base, (f"kept the default ({config_text(base.config)}) at {_figure(base)}: the best, "
                      f"{config_text(best.config)} at {_figure(best)}, is within the noise of it")
    above = [c for c in near if base is None or c.low > base.high]
    chosen = above[0]
    if chosen is not best:
        default_part = f", and lies above the default's {_figure(base)}" if base is not None else ""
        return chosen, (f"{config_text(chosen.config)} at {_figure(chosen)}: the simplest config within the noise "
                        f"of the best, {config_text(best.config)} at {_figure(best)}{default_part}")
    if near[0] is best:
        simpler = [c for c in candidates if c is not base and simplicity(c) < simplicity(best)]
        parts = ([f"above the default's {_figure(base)}"] if base is not None else []) + (
            ["above every simpler config's"] if simpler else [])
        verdict = "lies " + " and ".join(parts) if parts else "measured best"
        return best, f"{config_text(best.config)} at {_figure(best)} {verdict}"
    return best, (f"{config_text(best.config)} at {_figure(best)} lies above the default's {_figure(base)}; the "
                  f"simpler {config_text(near[0].config)} at {_figure(near[0])} is within the noise of both")


def tune(loader_factory: Callable[[dict], Any], *, space: dict[str, list], step=None, step_ms: float | None = None,
         steps: int = 8, device=None, confirm: int = 2, repeats: int = 3, default: dict | None = None,
         progress: bool = True, predictions: list | None = None) -> TuneResult:
    """Searches `space` (keyword -> values: num_workers, prefetch_factor, backend, placement)
    for the config with the highest images/s with the step; `loader_factory(config)` makes a
    fresh loader for a config.

    It measures one probe per backend and placement with their stages timed, predicts every
    config from those stage costs (see `RateModel`), then measures the finalists, the `confirm`
    best distinct predictions plus `default` (the config a user gets without tuning), `repeats`
    times each, interleaved (A, B, C, A, B, C, ...) so that a drift of the machine hits all of
    them alike. A finalist's interval is the min..max of its runs: with 3 runs it holds the
    median of its rate with a probability of 3/4 (each run falls on either side of it with
    probability 1/2). Returns a TuneResult; `pick` gives the rule of its choice. `predictions`, when given a list, gets (config,
    predicted images/s) for every config of the space. Configs that differ only in
    prefetch_factor predict alike (the model has no term for it): the first stands for all in
    the ranking, and the best prediction with workers is measured at each prefetch_factor."""
    if repeats < 1 or confirm < 0 or (confirm == 0 and default is None):
        raise ValueError(f"repeats should be >= 1 and confirm >= 1 (or 0 with a default), but got repeats={repeats}, "
                         f"confirm={confirm}")
    cores = usable_cores()
    workers = sorted(space.get("num_workers", [cores]))
    probe_w = max(w for w in workers if w <= cores) if any(w <= cores for w in workers) else workers[0]
    models: dict[tuple, RateModel] = {}  # (backend, placement) -> the rate model of its probe
    probes: list[Candidate] = []
    base = {k: v[0] for k, v in space.items()}

    def say(msg: str) -> None:
        if progress:
            print(msg, file=sys.stderr)

    for backend in space.get("backend", [base.get("backend")]):
        for placement in space.get("placement", [base.get("placement")]):
            config = {**base, "num_workers": probe_w, "backend": backend, "placement": placement}
            config = {k: v for k, v in config.items() if v is not None}
            rate, report = _rate(loader_factory, config, step, step_ms, steps, device)
            probes.append(Candidate(config, None, [rate]))
            model = RateModel.of(report, cores)
            if model is None:  # no stage timing: the probe's rate stands for the whole loader
                work = max(1, probe_w) / report.loader_images_per_s
                model = RateModel(work, work, 0.0, RateModel.step_of(report), cores)
            models[(backend, placement)] = model
            say(f"  probe {config}: {rate:,.0f} images/s; worker {1e3 * model.work:.2f} ms, "
                f"main {1e3 * model.main:.2f} ms an image")

    def predict(config: dict) -> float | None:
        model = models.get((config.get("backend"), config.get("placement")))
        return model.rate(config.get("num_workers", 0)) if model is not None else None

    keys = list(space)
    configs = [dict(zip(keys, values)) for values in itertools.product(*(space[k] for k in keys))]
    configs = [{k: v for k, v in c.items() if v is not None} for c in configs]
    predicted = sorted(((predict(c), c) for c in configs), key=lambda pc: -(pc[0] or 0.0))
    if predictions is not None:
        predictions.extend((c, p) for p, c in predicted)
    finalists: dict[str, Candidate] = {}
    seen: set[str] = set()
    for p, config in predicted:
        if len(seen) == confirm:
            break
        key = _key({k: v for k, v in config.items() if k != "prefetch_factor"})
        if key not in seen:
            seen.add(key)
            finalists[_key(config)] = Candidate(config, p)
    # The model has no term for prefetch_factor (nor has a loader without workers): the best
    # prediction with workers is measured at each.
    pooled = next((config for _, config in predicted if config.get("num_workers", 0)), None)
    for prefetch in space.get("prefetch_factor", []) if pooled is not None else []:
        config = {**pooled, "prefetch_factor": prefetch}
        finalists.setdefault(_key(config), Candidate(config, predict(config)))
    if default is not None:
        finalists.setdefault(_key(default), Candidate(dict(default), predict(default)))
    candidates = list(finalists.values())
    for r in range(repeats):
        for c in candidates:
            rate, _ = _rate(loader_factory, c.config, step, step_ms, steps, device)
            c.runs.append(rate)
            say(f"  run {r + 1}/{repeats} {c.config}: {rate:,.0f} images/s")
    default_backend = space["backend"][0] if space.get("backend") else None
    chosen, reason = pick(candidates, default, default_backend)
    say(f"  picked: {config_text(chosen.config)}")  # (why: the caller's line, TuneResult.reason)
    return TuneResult(dict(chosen.config), reason, candidates, probes)
