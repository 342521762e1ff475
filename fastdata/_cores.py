"""The cores this process may run on: what every "default: the usable cores" means."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, which a container or taskset
    narrows), or the machine's count where the platform has no affinity."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def batch_threads(threads: int | None = None) -> int:
    """The threads a batch's native work (reads, checks, decodes) runs on: `threads` when set,
    else 1 in a DataLoader worker (the workers split the cores, a batch each), else the usable
    cores (the training process works for no one else)."""
    if threads:
        return threads
    from torch.utils.data import get_worker_info

    return 1 if get_worker_info() is not None else usable_cores()
