"""What other processes ran on the profiled process's cores while a window was timed: the time
the cores it may run on (its CPU affinity) spent busy, less the CPU time of this process's own
(its descendants: DataLoader workers, a forkserver and its workers; its process group: a
launcher's other ranks), each with the children it has waited for (a worker that ended inside
the window counts in its parent's), over the window's wall time, in cores. Read from Linux's
/proc (no library reads a process tree's CPU time without being installed: psutil is not a
dependency); None elsewhere, for a window under MIN_WINDOW_S (the counts are 10 ms ticks), and
under a CPU quota (a container's `--cpus`), whose /proc/stat may be the host's: cores shared
with other tenants say nothing of this process's share of them."""

from __future__ import annotations

import os
import time

_TICK = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0
MIN_WINDOW_S = 1.0  # a tick or two of difference between the two counts is then a few hundredths of a core


def _busy(cpus: set[int]) -> float:
    """Seconds the cores in `cpus` ran processes (user and system time: not idle, waiting for
    I/O, stolen by a hypervisor, or serving interrupts, which this process's I/O raises too),
    since boot."""
    ticks = 0
    with open("/proc/stat") as f:
        for line in f:
            name, _, rest = line.partition(" ")
            if name[:3] == "cpu" and name[3:].isdigit() and int(name[3:]) in cpus:
                user, nice, system = map(int, rest.split()[:3])
                ticks += user + nice + system
    return ticks / _TICK


def _own(root: int) -> float:
    """CPU seconds of process `root`, its descendants and its process group's processes, each
    with the children it has waited for."""
    parents, groups, cpu = {}, {}, {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                # after "(comm)", which may hold spaces: state, ppid, pgrp, ..., then from the
                # 12th field on utime, stime, cutime, cstime
                fields = f.read().rpartition(")")[2].split()
        except OSError:  # (a process that ended meanwhile)
            continue
        pid = int(name)
        parents[pid], groups[pid], cpu[pid] = int(fields[1]), int(fields[2]), sum(int(v) for v in fields[11:15])
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    group = os.getpgid(root)
    own, todo = {pid for pid, g in groups.items() if g == group}, [root]
    while todo:
        pid = todo.pop()
        own.add(pid)
        todo += children.get(pid, ())
    return sum(cpu.get(pid, 0) for pid in own) / _TICK


def _quota() -> bool:
    """Whether a CPU quota (cgroup v2's cpu.max, v1's cfs_quota_us) limits this process."""
    try:
        with open("/proc/self/cgroup") as f:
            paths = {line.rstrip("\n").split(":", 2)[2] for line in f}
    except OSError:
        return False
    files = [f"/sys/fs/cgroup{p.rstrip('/')}/cpu.max" for p in paths | {"/"}]
    files += [f"/sys/fs/cgroup/{c}{p.rstrip('/')}/cpu.cfs_quota_us" for c in ("cpu", "cpu,cpuacct")
              for p in paths | {"/"}]
    for path in files:
        try:
            with open(path) as f:
                limit = f.read().split()[0]
        except (OSError, IndexError):
            continue
        if limit not in ("max", "-1"):
            return True
    return False


class OtherLoad:
    """Started before a timed window and stopped after it: `stop()` gives how many of the
    usable cores other processes kept busy meanwhile, or None where that cannot be told."""

    def __init__(self) -> None:
        try:
            cpus = os.sched_getaffinity(0)
        except (AttributeError, OSError):
            cpus = set()
        self._cpus = cpus if cpus and not _quota() else None
        self._start = self._read()

    def _read(self) -> tuple[float, float, float] | None:
        if self._cpus is None:
            return None
        try:
            return _busy(self._cpus), _own(os.getpid()), time.perf_counter()
        except (OSError, ValueError, IndexError):  # no /proc, or one laid out otherwise
            return None

    def stop(self) -> float | None:
        start, end = self._start, self._read()
        if start is None or end is None or end[2] - start[2] < MIN_WINDOW_S:
            return None
        other = ((end[0] - start[0]) - (end[1] - start[1])) / (end[2] - start[2])
        return min(max(0.0, other), float(len(self._cpus or ())))
