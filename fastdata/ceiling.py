"""The most images/s a machine can reach with a pipeline, measured: a figure above it is not a
measurement of the pipeline (a loader that ran ahead outside the timed window, a warm cache,
a timer read at the wrong place).

The bound: the pipeline's work done serially in this process costs some CPU seconds per image
(`time.process_time`, which counts every thread of the process); run by workers, the same
work costs at least as much per image (the workers' batches still cross to the consumer), so
N usable cores deliver at most N / (CPU seconds per image).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable

from ._cores import usable_cores

# A figure up to this factor over the ceiling still counts as a measurement. The ceiling is one
# short serial measurement whose CPU seconds per image vary from run to run (clock frequency:
# one busy core may run at a turbo clock that all busy cores do not); workers spend no less CPU
# per image than the serial run, so a real figure stays under the ceiling itself, and the
# factor only absorbs that noise.
MARGIN = 1.25


def ceiling(make_loader: Callable[[int], Iterable[Any]], batches: int = 8, cores: int | None = None,
            warmup: int | None = None) -> float:
    """The images/s this machine can reach at most with the pipeline `make_loader(num_workers)`
    builds: `cores` (default: the usable cores) over the CPU seconds per image of
    `make_loader(0)` run in this process. The first `warmup` batches (default: `batches`) are
    not counted: start-up, and buffers touched for the first time, are no steady state. Then
    `batches` batches are, over as many passes of the loader as that takes."""
    if batches < 1:
        raise ValueError(f"batches should be a positive integer, but got {batches!r}")
    warmup = batches if warmup is None else warmup
    if warmup < 0:
        raise ValueError(f"warmup should be a non-negative integer, but got {warmup!r}")
    cores = usable_cores() if cores is None else cores
    if cores < 1:
        raise ValueError(f"cores should be a positive integer, but got {cores!r}")
    from ._collate import batch_len  # imports torch: `fastdata demo --help` imports this module without it

    loader = make_loader(0)
    seen, images, cpu = 0, 0, 0.0
    t = time.process_time()
    while seen < warmup + batches:
        got = False
        for batch in loader:
            got = True
            seen += 1
            if seen > warmup:
                images += batch_len(batch)
                cpu = time.process_time() - t
            elif seen == warmup:
                t = time.process_time()
            if seen == warmup + batches:
                break
        if not got:
            break
    if images == 0 or cpu <= 0:
        raise ValueError(f"the loader gave too few batches to measure: it needs more than warmup={warmup}")
    return cores * images / cpu


def within(rate: float, limit: float) -> bool:
    """Whether `rate` images/s can be a measurement on a machine whose ceiling is `limit`."""
    return rate <= limit * MARGIN
