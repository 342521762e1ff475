"""The report of a profile: the rates, the verdict, the stages, the advice; as text, in the
terminal (rich), as a self-contained HTML page and as JSON. Also the names the measurement and
the rate model share: the verdict's thresholds and the stages."""

from __future__ import annotations

import dataclasses
import html
import json
import os
import sys
from pathlib import Path
from typing import Any

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

# where a worker's time goes: the image backends' stages, or the drop-in's dataset (the user's
# __getitem__) and collation
WORKER_STAGES = ("read", "dataset", "decode", "cpu_transforms", "collate")

# the stages that cost the loader's own time (a bound): not the GPU's copy, not the consumer's wait
COSTS = frozenset((*WORKER_STAGES, "device_stage"))


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
    stages: dict[str, float] = dataclasses.field(default_factory=dict)  # ms per image (see measure.py)
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
