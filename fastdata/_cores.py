"""The cores this process may run on: what every "default: the usable cores" means."""

from __future__ import annotations

import functools
import math
import os


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (which a container's cpuset or
    taskset narrows), or the machine's count where the platform has no affinity; and at most its
    cgroup's CPU bandwidth limit, rounded up (`cpu_quota`: `docker run --cpus=4`, a Kubernetes
    CPU limit). Such a limit leaves the affinity at every core of the host, but lets the
    process's threads run only that many cores' worth of time: a worker for each host core
    would share those few, and wait on the throttle."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    quota = cpu_quota()
    return max(1, min(cores, math.ceil(quota))) if quota else cores


@functools.lru_cache(maxsize=1)
def cpu_quota(root: str = "/sys/fs/cgroup", cgroups: str = "/proc/self/cgroup") -> float | None:
    """The CPU bandwidth limit of this process's cgroup, in cores: quota over period, of cgroup
    v2's cpu.max or v1's cpu.cfs_quota_us and cpu.cfs_period_us, the least over the process's
    cgroup and those above it (a limit may be set on a parent: a Kubernetes pod's); None where
    none is set or none can be read. Read once a process. Written here because Python has no
    such call (3.13's os.process_cpu_count is the affinity) and the libraries that have one
    (loky's cpu_count) are not dependencies."""
    limits = []
    for v2, folder in cgroup_folders("cpu", root, cgroups):
        limit = _limit(folder, ("cpu.max",) if v2 else ("cpu.cfs_quota_us", "cpu.cfs_period_us"))
        if limit is not None:
            limits.append(limit)
    return min(limits) if limits else None


def cgroup_folders(controller: str, root: str = "/sys/fs/cgroup",
                   cgroups: str = "/proc/self/cgroup") -> list[tuple[bool, str]]:
    """(whether it is cgroup v2's, folder) for each cgroup of this process that `controller`
    may set limits in: its own, then each above it, in the order /proc/self/cgroup lists the
    hierarchies (none where that file cannot be read or is not what the kernel writes). Its
    cgroup's path as that file names it may not be where the hierarchy is mounted in a container
    (without a cgroup namespace it is the host's path): the walk up then finds the mount's root,
    the container's own cgroup."""
    folders = []
    try:
        with open(cgroups) as f:
            lines = f.read(1 << 16).splitlines()
        for line in lines:
            _, controllers, path = line.split(":", 2)
            if controllers == "":  # v2: one hierarchy
                mounts, v2 = [root], True
            elif controller in controllers.split(","):
                # (the hierarchy is mounted at cpu,cpuacct with a cpu link to it, or at cpu alone)
                mounts = list(dict.fromkeys([os.path.join(root, controllers), os.path.join(root, controller)]))
                v2 = False
            else:
                continue
            folders += [(v2, folder) for mount in mounts for folder in _up(mount, path)]
    except (OSError, ValueError):
        return []
    return folders


def _up(mount: str, path: str) -> list[str]:
    """The folders of cgroup `path` under `mount`, from it up to the mount's root."""
    parts = [p for p in path.split("/") if p and p not in (".", "..")]
    return [os.path.join(mount, *parts[:n]) for n in range(len(parts), -1, -1)]


def _limit(folder: str, files: tuple[str, ...]) -> float | None:
    """One cgroup's limit in cores, or None (no such cgroup, no limit: "max", -1, or files that
    are not what the kernel writes)."""
    try:
        values = []
        for name in files:
            with open(os.path.join(folder, name)) as f:
                values += f.read(256).split()
        if values[0] in ("max", "-1"):
            return None
        quota, period = int(values[0]), int(values[1])  # microseconds
    except (OSError, ValueError, IndexError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def batch_threads(threads: int | None = None) -> int:
    """The threads a batch's native work (reads, checks, decodes) runs on: `threads` when set,
    else 1 in a DataLoader worker (the workers split the cores, a batch each), else the usable
    cores (the training process works for no one else)."""
    if threads:
        return threads
    from torch.utils.data import get_worker_info

    return 1 if get_worker_info() is not None else usable_cores()
