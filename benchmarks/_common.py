"""What every benchmark shares: interleaved timing (in one process, or candidate processes in
rounds), the machine's facts, and the JSON report."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(1)

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict:
    import fastdata
    from fastdata import _collate
    from fastdata._cores import usable_cores

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "fastdata": fastdata.__version__,
        "native": _collate.NATIVE,
        "cores": usable_cores(),
        "accelerator": torch.accelerator.is_available(),
        "cpu": platform.processor() or platform.machine(),
    }


def interleaved(runs: dict[str, Callable[[], float]], reps: int) -> dict[str, list[float]]:
    """Runs each candidate once per round, rounds repeated `reps` times, so drift on this shared
    machine hits every candidate alike; every other round runs them in reverse order (ABBA),
    since going first or second is itself worth a few percent here. Each callable returns the
    seconds it measured."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for r in range(reps):
        for name in names if r % 2 == 0 else reversed(names):
            times[name].append(runs[name]())
    return times


def epoch_seconds(loader: Any) -> float:
    """Seconds one pass over `loader` takes."""
    t = time.perf_counter()
    for _ in loader:
        pass
    return time.perf_counter() - t


def time_epochs(make_iter: Callable[[], Any], epochs: int) -> list[float]:
    """Images/s of each of `epochs` epochs of `make_iter()` (an iterable of (images, labels)
    batches), after a warm-up epoch (workers started, page cache warm)."""
    for _ in make_iter():
        pass
    rates = []
    for _ in range(epochs):
        t = time.perf_counter()
        n = sum(len(batch[1]) for batch in make_iter())
        rates.append(n / (time.perf_counter() - t))
    return rates


def rounds_parser(doc: str, rounds: int = 3) -> argparse.ArgumentParser:
    """The arguments every process-rounds benchmark takes: --images, --rounds, --epochs (timed
    per candidate process), --root (the synthetic set), --json, and the hidden --child that
    runs one candidate."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--epochs", type=int, default=2, help="timed epochs per candidate process")
    ap.add_argument("--root", default=str(RESULTS.parent / "data" / "imagenet-like"))
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    return ap


def process_rounds(commands: dict[str, list[str]], rounds: int, abba: bool = True) -> tuple[dict, dict]:
    """Runs each candidate's command in its own process, one after another, `rounds` times (in
    ABBA order unless abba=False), so drift on this shared machine hits all alike. A command
    prints a JSON object with "images_per_s" (a list) as its last line. Returns the rates of
    each candidate over all rounds, and its reports, one a round."""
    rates: dict[str, list[float]] = {name: [] for name in commands}
    reports: dict[str, list[dict]] = {name: [] for name in commands}
    names = list(commands)
    for r in range(rounds):
        for name in names if not abba or r % 2 == 0 else reversed(names):
            out = subprocess.run(commands[name], capture_output=True, text=True)
            if out.returncode != 0:
                raise SystemExit(f"{name} failed: {out.stderr.strip()[-2000:]}")
            report = json.loads(out.stdout.strip().splitlines()[-1])
            reports[name].append(report)
            rates[name] += report["images_per_s"]
            print(f"  round {r + 1}/{rounds}  {name:<34} {median(report['images_per_s']):7.0f} img/s",
                  file=sys.stderr)
    return rates, reports


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def ratio_ci(baseline: list[float], candidate: list[float], resamples: int = 2000) -> tuple[float, float]:
    """A 95% bootstrap interval for median(baseline) / median(candidate) (times: above 1 means
    the candidate is faster), resampling each side's runs; seeded, so a report reproduces."""
    import random

    rng = random.Random(0)
    ratios = sorted(
        median(rng.choices(baseline, k=len(baseline))) / median(rng.choices(candidate, k=len(candidate)))
        for _ in range(resamples)
    )
    return ratios[int(0.025 * resamples)], ratios[int(0.975 * resamples) - 1]


def write(name: str, report: dict, path: str | None = None) -> Path:
    out = Path(path) if path else RESULTS / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {"benchmark": name, "when": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": machine(), **report}
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    return out
