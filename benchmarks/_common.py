"""What every benchmark shares: interleaved timing, the machine's facts, and the JSON report."""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(1)

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict:
    import fastdata
    from fastdata import _collate

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "fastdata": fastdata.__version__,
        "native": _collate.NATIVE,
        "cores": len(os.sched_getaffinity(0)),
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


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def write(name: str, report: dict, path: str | None = None) -> Path:
    out = Path(path) if path else RESULTS / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {"benchmark": name, "when": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": machine(), **report}
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    return out
