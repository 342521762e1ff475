"""The report of a profile: the rates, the verdict, the stages, the advice; as text, in the
terminal (rich), as a self-contained HTML page and as JSON. Also the names the measurement and
the rate model share: the verdict's thresholds and the stages."""

from __future__ import annotations

import dataclasses
import datetime
import importlib.metadata
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

import torch

from .._cores import usable_cores
from ..tunecache import machine_key, versions
from .html import UNTIMED, render as render_html

INPUT_BOUND = 0.10  # stall fraction above which the step is input-bound
COMPUTE_BOUND = 1.5  # loader rate / step rate above which the step is compute-bound


def verdict(stall: float, loader_rate: float, step_rate: float) -> tuple[str, str]:
    """The verdict (one of VERDICTS) and why, from the share of the run the step waited for
    data and the loader's and the step's rates alone."""
    if stall > INPUT_BOUND:
        return "input-bound", f"the step waited for data {100 * stall:.0f}% of the time"
    if loader_rate >= COMPUTE_BOUND * step_rate:
        return "compute-bound", (f"the loader alone is {loader_rate / step_rate:.1f}x the step's rate: faster input "
                                 "would not speed this step up")
    return "balanced", "the loader just keeps up: a slower input or a faster step would make it wait"

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


def reads_storage(stages: dict[str, Any]) -> bool:
    """Whether the "read" among `stages` may wait on storage: an image backend's reads (it has
    "decode"), a drop-in's Dataset (it has "dataset"); not an in-memory dataset `fastdata run`
    serves natively (neither), whose wall time beyond its CPU is a wait for a core."""
    return "decode" in stages or "dataset" in stages


def stage_text(name: str, stages: dict[str, Any]) -> str:
    """What the stage `name` is, as the report says it, among `stages`: a drop-in's "read" (it
    has "dataset") is its Dataset's wall time beyond its CPU, which no storage need cause, and
    one that reads no storage (`reads_storage`) is a wait for a core."""
    if name == "read" and "dataset" in stages:
        return "the Dataset's waiting (I/O, sleeps, a busy core: wall time beyond its CPU)"
    if name == "read" and not reads_storage(stages):
        return "waiting (a busy core: wall time beyond the fetch's CPU)"
    return STAGES.get(name, "")


# where a worker's time goes: the image backends' stages, or the drop-in's dataset (the user's
# __getitem__) and collation
WORKER_STAGES = ("read", "dataset", "decode", "cpu_transforms", "collate")

# the stages that cost the loader's own time (a bound): not the GPU's copy, not the consumer's wait
COSTS = frozenset((*WORKER_STAGES, "device_stage"))


VERDICTS = ("input-bound", "compute-bound", "balanced")  # report.json's verdict: one of these, or null
SCHEMA = "fastdata.profile.report/3"  # report.json's schema (report.schema.json beside this module)
NOTHING_TO_CHANGE = "nothing to change on the input side"  # the advice when the step did not wait
NO_CHANGE = "no change found to suggest"  # the advice of a report that is not input-bound, with nothing else


@dataclasses.dataclass
class Advice:
    """One thing to change (or to know): the sentence, and for a change, the keywords it sets,
    the images/s predicted with it, and what that figure rests on: "measured" (a tune measured
    it), "model" (the rate model's prediction from the stage costs) or "rule" (no figure)."""

    text: str
    change: dict[str, Any] | None = None
    predicted_images_per_s: float | None = None
    confidence: str = "rule"


@dataclasses.dataclass
class Report:
    """What `profile` measured. Rates are images/s; `steps` holds (wait_s, compute_s) per step
    of the run together. `verdict` is one of VERDICTS, or None when no step was measured;
    `explanation` says why, in a sentence."""

    source: str
    batch_size: int
    loader_images_per_s: float
    step_images_per_s: float | None
    together_images_per_s: float | None
    stall_fraction: float | None
    verdict: str | None
    explanation: str
    steps: list[tuple[float, float]]
    config: dict[str, Any]
    advice: list[Advice] = dataclasses.field(default_factory=list)
    stages: dict[str, float] = dataclasses.field(default_factory=dict)  # ms per image (see measure.py)
    bound: str | None = None  # the stage that costs the most per image
    # steps of the run together that began an epoch (worker queues may refill then)
    epoch_starts: list[int] = dataclasses.field(default_factory=list)
    # images in a step of the run together, on average: below the batch size when a short last
    # batch of an epoch fell among them (the step costs a whole step all the same)
    images_per_step: float | None = None
    ceiling_images_per_s: float | None = None  # the most this pipeline can give on these cores
    # CPU ms an image of the step alone on a CPU device (this process's CPU, intra-op threads too)
    step_cpu_ms: float | None = None
    flags: list[str] = dataclasses.field(default_factory=list)  # figures not to be trusted, and why
    # samples left out (on_error="skip"): the skips ("count"), the distinct files ("files") and
    # those files once each, with their cause and times skipped ("examples"; measure.skipped_since)
    skipped: dict[str, Any] = dataclasses.field(default_factory=lambda: {"count": 0, "files": 0, "examples": []})
    tune: dict[str, Any] | None = None  # the tune's outcome (TuneResult.to_json() and its seconds)
    # with an output size that follows the epoch: the loader's rate alone at each size
    # (measure.rates_per_size: epoch, size [h, w], batches, images_per_s)
    sizes: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    created: str = dataclasses.field(default_factory=lambda: now_utc())
    # what bounds the rate under the rate model, for the headline (advice.limit): "text", "helps"
    # (words, the keywords they set or None), "not"; None where the model cannot say
    limit: dict[str, Any] | None = None
    # how many of the usable cores other processes kept busy while the rates were timed (the
    # more of its windows'; `load.OtherLoad`), None where that cannot be told
    other_cores: float | None = None

    @property
    def first_change(self) -> Advice | None:
        """The one change to make first: the measured change with the highest rate (a tune's
        winner, `add_tune`, or the profile's own check of a prediction); None without one."""
        changes = [a for a in self.advice if a.change and a.confidence == "measured"]
        if changes:
            return max(changes, key=lambda a: a.predicted_images_per_s or 0.0)
        return None

    @property
    def headline(self) -> str:
        """The report's one line: the measured change to make first, or else what bounds the
        step and what would help (`limit`, less what a tune measured and did not pick)."""
        first = self.first_change
        if first is not None:
            return first.text
        if self.verdict is None:
            return "the loader was timed alone: give a step to see what bounds training"
        if self.verdict != "input-bound":
            return "nothing to change on the input side: the step itself bounds training"
        if self.limit is None:  # the rate model cannot say what bounds it: only what was measured
            step = self.step_images_per_s or 0.0
            figures = f"the loader alone gives {self.loader_images_per_s:,.0f} images/s against the step's {step:,.0f}"
            if self.loader_images_per_s >= COMPUTE_BOUND * step:  # a wait that the loader's speed does not explain
                return (f"input bounds the step though {figures}: the wait is in handing batches to the step (the "
                        "training process's own stages, a queue refilling at an epoch's start), not in the loader's "
                        "speed")
            if self.bound not in self.stages:
                return f"input bounds the step: {figures}"
            what = stage_text(self.bound, self.stages).split(" (")[0] or self.bound
            return f"input bounds the step: {figures}; {what} costs the most ({self.stages[self.bound]:.2f} ms an image)"
        text = f"input bounds the step: {self.limit['text']}"
        helps = [words for words, change in self.limit["helps"] if not (change and self._tune_passed_over(change))]
        if helps:
            text += f": {', '.join(helps[:-1])}{' or ' if len(helps) > 1 else ''}{helps[-1]} would help"
        return f"{text}; {self.limit['not']}" if self.limit.get("not") else text

    def _tune_passed_over(self, change: dict) -> bool:
        """Whether the tune measured a config with `change` and picked another."""
        if not self.tune:
            return False
        configs = [c.get("config") or {} for c in (*self.tune.get("candidates", ()), *self.tune.get("probes", ()))]
        chosen = self.tune.get("chosen") or {}
        return any(change.items() <= c.items() for c in configs) and not change.items() <= chosen.items()

    def add_tune(self, outcome: dict[str, Any]) -> None:
        """Takes the tune's outcome (with "default", the untuned config it was measured against).
        A winner other than the default lies above the default beyond the noise (tune.pick): it
        is advised as a measured change, and leads the headline where no measured change beats
        it. A change the profile measured that the tune measured too and did not pick is no
        longer advised as one, and the lines that said nothing was to change go."""
        self.tune = outcome
        default, chosen = outcome.get("default"), outcome.get("chosen") or {}
        if default is None:
            return
        for k, a in enumerate(self.advice):
            if a.change and a.confidence == "measured" and self._tune_passed_over({**default, **a.change}):
                self.advice[k] = Advice(f"{a.text}; the tune measured it too and picked {config_text(chosen)}")
        change = {k: v for k, v in chosen.items() if default.get(k) != v}
        runs = {json.dumps(c["config"], sort_keys=True): c for c in outcome.get("candidates", ())}
        won = next((c for c in runs.values() if chosen.items() <= c["config"].items()), None)
        base = runs.get(json.dumps(default, sort_keys=True))
        if not change or won is None or base is None:
            return
        low, high = won["interval_images_per_s"]
        b_low, b_high = base["interval_images_per_s"]
        self.advice[:] = [a for a in self.advice if a.text not in (NO_CHANGE, NOTHING_TO_CHANGE)]
        was = {k: default.get(k) for k in change}
        was_text = config_text(was) if len(was) > 1 else repr(*was.values())
        self.advice.append(Advice(
            f"{config_text(change)} instead of {was_text}: the tune measured "
            f"{won['median_images_per_s']:,.0f} images/s ({low:,.0f}-{high:,.0f}) against the default's "
            f"{base['median_images_per_s']:,.0f} ({b_low:,.0f}-{b_high:,.0f}), {len(won['runs_images_per_s'])} runs "
            "each, interleaved", change, won["median_images_per_s"], "measured"))

    def _rate(self, name: str, rate: float) -> str:
        """A rate as the terminal shows it: not at all where it is flagged as above the ceiling."""
        return "invalid" if any(f.startswith(f"{name}:") for f in self.flags) else f"{rate:,.0f}"

    def _step_cpu_note(self) -> str:
        """The step's own CPU an image, where it was measured (a CPU device): it shares the cores with the loader."""
        if self.step_cpu_ms is None or self.step_cpu_ms < 0.005:  # (a step that waits: a sleep, a GPU's)
            return ""
        return f" (its own CPU: {self.step_cpu_ms:.2f} ms an image, beside the loader's)"

    def epoch_start_note(self) -> str | None:
        if not self.epoch_starts or len(self.epoch_starts) == len(self.steps):
            return None
        wait = 1e3 * max(self.steps[k][0] for k in self.epoch_starts)
        others = [w for k, (w, _) in enumerate(self.steps) if k not in self.epoch_starts]
        average = 1e3 * sum(others) / len(others)
        if wait <= average:  # the epoch starts waited no longer than the other steps: nothing to note
            return None
        return (f"{len(self.epoch_starts)} step(s) began an epoch and waited up to {wait:,.0f} ms, the others "
                f"{average:,.0f} ms on average (the workers' queues refill at an epoch start "
                f"unless they run ahead); counted in the rates, as training pays them each epoch")

    def skipped_line(self) -> str | None:
        """How many files were skipped, and how many times in all (a bad file is read again each
        epoch); None when none was. The files themselves are named once each as they are first
        skipped (the loader's warning) and listed in report.json."""
        count = self.skipped.get("count") or 0
        if not count:
            return None
        files = self.skipped.get("files") or len(self.skipped.get("examples") or ()) or count
        line = f"skipped: {files} file{'s' if files != 1 else ''} that could not be read"
        return line if count == files else f"{line}, left out {count} times in all (each epoch reads a file again)"

    def size_lines(self) -> list[str]:
        """The loader's rate at each size of a progressive-resizing schedule, against the step's."""
        if not self.sizes:
            return []
        lines = ["the loader alone at each size of the schedule (the epoch's first batches):"]
        for s in self.sizes:
            size = "x".join(map(str, s["size"][::-1])) if s["size"] else "?"  # [height, width] written as WxH
            note = ""
            if self.step_images_per_s is not None:
                slower = s["images_per_s"] < self.step_images_per_s
                note = "  below the step's rate: input-bound at this size" if slower else ""
            lines.append(f"  from epoch {s['epoch']:<4} {size:>9}: {s['images_per_s']:10,.0f} images/s "
                         f"({s['batches']} batches){note}")
        return lines

    def to_json(self) -> dict[str, Any]:
        """report.json: the schema SCHEMA (report.schema.json) describes each field."""
        first = self.first_change
        return {
            "schema": SCHEMA, "created": self.created, "source": self.source,
            "verdict": self.verdict, "explanation": self.explanation,
            "first_change": dataclasses.asdict(first) if first else None, "headline": self.headline,
            "config": self.config, "batch_size": self.batch_size,
            "rates": {"loader_alone_images_per_s": self.loader_images_per_s,
                      "step_alone_images_per_s": self.step_images_per_s,
                      "together_images_per_s": self.together_images_per_s,
                      "ceiling_images_per_s": self.ceiling_images_per_s,
                      "step_alone_cpu_ms_per_image": self.step_cpu_ms},
            "stall_fraction": self.stall_fraction,
            "stages": [{"name": name, "ms_per_image": ms, "what": stage_text(name, self.stages), "where": _where(name),
                        "bound": name == self.bound} for name, ms in self.stages.items()],
            "steps": [{"wait_ms": 1e3 * w, "compute_ms": 1e3 * c, "epoch_start": k in self.epoch_starts}
                      for k, (w, c) in enumerate(self.steps)],
            "advice": [dataclasses.asdict(a) for a in self.advice],
            "tune": self.tune, "skipped": self.skipped, "flags": self.flags, "environment": environment(),
            "sizes": self.sizes,
        }

    def __str__(self) -> str:
        lines = [f"fastdata-profile: {self.source}", f"  config: {json.dumps(self.config)}",
                 f"  loader alone:   {self._rate('loader alone', self.loader_images_per_s):>10} images/s"]
        if self.ceiling_images_per_s:
            lines.append(f"  ceiling:        {self.ceiling_images_per_s:10,.0f} images/s "
                         "(the cores over the CPU an image)")
        if self.step_images_per_s is not None:
            lines.append(f"  step alone:     {self.step_images_per_s:10,.0f} images/s" + self._step_cpu_note())
            lines.append(f"  together:       {self._rate('together', self.together_images_per_s):>10} images/s "
                         f"(the step waited for data {100 * self.stall_fraction:.0f}% of the time)")
            if self.epoch_start_note():
                lines.append(f"  {self.epoch_start_note()}")
        if self.stages:
            lines.append("  where an image's time goes (ms an image, loader alone; worker stages summed over workers):")
            lines += [f"    {name:<15}{ms:8.2f}  {stage_text(name, self.stages)}"
                      + ("   <- the most" if name == self.bound else "") for name, ms in self.stages.items()]
        else:
            lines.append(f"  where an image's time goes: {UNTIMED}")
        lines += [f"  {line}" for line in self.size_lines()]
        lines.append(f"  verdict: {self.verdict or 'none'}: {self.explanation}")
        lines.append(f"  first: {self.headline}")
        if self.skipped_line():
            lines.append(f"  {self.skipped_line()}")
        lines += [f"  ! {flag}" for flag in self.flags]
        lines += [f"  - {a.text}" for a in self.advice]
        return "\n".join(lines)

    def print(self, console: Any = None) -> None:
        """The summary in the terminal, with rich: the rates, a bar per stage, the verdict in
        colour, the advice. Text from elsewhere (the source's name, the advice: `pip install
        '.[ray]'`) is escaped, or rich would take its brackets for markup."""
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table

        console = console or Console(width=None if sys.stdout.isatty() else 120)
        console.rule(f"[bold]fastdata-profile[/]: {escape(str(self.source))}")
        console.print(f"[dim]{escape(json.dumps(self.config))}[/]")
        rates = Table(show_header=False, box=None, padding=(0, 2))
        rates.add_row("loader alone", f"{self._rate('loader alone', self.loader_images_per_s)} images/s")
        if self.ceiling_images_per_s:
            rates.add_row("ceiling", f"{self.ceiling_images_per_s:,.0f} images/s",
                          "the most this pipeline can give here: the cores over the CPU an image")
        if self.step_images_per_s is not None:
            rates.add_row("step alone", f"{self.step_images_per_s:,.0f} images/s", self._step_cpu_note().strip(" ()"))
            rates.add_row("together", f"{self._rate('together', self.together_images_per_s)} images/s",
                          f"the step waited for data {100 * self.stall_fraction:.0f}% of the time")
        console.print(rates)
        if self.epoch_start_note():
            console.print(f"[dim]{escape(self.epoch_start_note())}[/]")
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
                table.add_row(escape(name), f"{ms:.2f}", f"[{colour}]{'█' * max(0, round(30 * ms / top))}[/]",
                              escape(stage_text(name, self.stages)))
            console.print(table)
        else:
            console.print(f"[dim]where an image's time goes: {escape(UNTIMED)}[/]")
        for line in self.size_lines():
            console.print(escape(line))
        colour = {"input-bound": "red", "compute-bound": "green", "balanced": "yellow"}.get(self.verdict, "white")
        console.print(f"verdict: [bold {colour}]{escape(self.verdict or 'none')}[/]: {escape(self.explanation)}")
        console.print(f"[bold]first:[/] {escape(self.headline)}")
        if self.skipped_line():
            console.print(f"[yellow]{escape(self.skipped_line())}[/]")
        for flag in self.flags:
            console.print(f"[bold red]! {escape(flag)}[/]")
        for a in self.advice:
            console.print(f"  • {escape(a.text)}")

    def to_html(self) -> str:
        """A self-contained page, rendered from `to_json()` (see html.py)."""
        return render_html(self.to_json())

    def write(self, out: str | os.PathLike) -> Path:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.json").write_text(json.dumps(self.to_json(), indent=2) + "\n")
        (out / "report.html").write_text(self.to_html())
        return out


def config_text(config: dict[str, Any]) -> str:
    """A loader config as its keywords are written in a call: num_workers=2, backend='pil'."""
    return ", ".join(f"{k}={v!r}" for k, v in config.items())


def _where(stage: str) -> str:
    if stage in WORKER_STAGES:
        return "workers"
    return {"h2d_copy": "GPU", "consumer_wait": "together"}.get(stage, "training process")


def now_utc() -> str:
    """Now, as report files write it: ISO 8601 in UTC, to the second."""
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def environment() -> dict[str, Any]:
    """The machine and the versions a figure was measured with."""
    v = versions()
    try:
        dali = importlib.metadata.version("nvidia-dali-cuda120")
    except importlib.metadata.PackageNotFoundError:
        dali = None
    return {"machine": machine_key(), "cores": usable_cores(), "python": v["python"], "platform": platform.platform(),
            "torch": v["torch"], "fastdata": v["fastdata"] or "unknown", "pillow": v["pillow"]["version"],
            "pillow_simd": v["pillow"]["simd"], "dali": dali,
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
