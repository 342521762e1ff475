"""What other processes ran on the profiled process's cores while a window was timed: the time
the cores it may run on (its CPU affinity) spent busy, less the CPU time of this process and its
descendants (DataLoader workers, a forkserver and its workers) with the children each has
waited for (a worker that ended inside the window counts in its parent's), over the window's
wall time, in cores. Read from Linux's /proc (no library reads a process tree's CPU time
without it being installed: psutil is not a dependency); None elsewhere, and where a CPU quota
gives fewer cores than the affinity allows, since cores shared with a host's other tenants say
nothing of this process's share of them."""

from __future__ import annotations

import os
import time

_TICK = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0


def _busy(cpus: set[int]) -> float:
    """Seconds the cores in `cpus` ran anything (not idle, waiting for I/O, or stolen by a
    hypervisor), since boot."""
    ticks = 0
    with open("/proc/stat") as f:
        for line in f:
            name, _, rest = line.partition(" ")
            if name[:3] == "cpu" and name[3:].isdigit() and int(name[3:]) in cpus:
                user, nice, system, _idle, _iowait, irq, softirq = map(int, rest.split()[:7])
                ticks += user + nice + system + irq + softirq
    return ticks / _TICK


def _tree(root: int) -> float:
    """CPU seconds of process `root` and its descendants, each with its waited-for children."""
    parents, cpu = {}, {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                # after "(comm)", which may hold spaces: state, ppid, ..., then from the 12th
                # field on utime, stime, cutime, cstime
                fields = f.read().rpartition(")")[2].split()
        except OSError:  # (a process that ended meanwhile)
            continue
        pid = int(name)
        parents[pid], cpu[pid] = int(fields[1]), sum(int(v) for v in fields[11:15])
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    ticks, todo = 0, [root]
    while todo:
        pid = todo.pop()
        ticks += cpu.get(pid, 0)
        todo += children.get(pid, ())
    return ticks / _TICK


class OtherLoad:
    """Started before a timed window and stopped after it: `stop()` gives how many of the
    `cores` usable cores other processes kept busy meanwhile, or None where that cannot be told."""

    def __init__(self, cores: int) -> None:
        try:
            cpus = os.sched_getaffinity(0)
        except (AttributeError, OSError):
            cpus = set()
        self._cpus = cpus if 0 < len(cpus) <= cores else None
        self._start = self._read()

    def _read(self) -> tuple[float, float, float] | None:
        if self._cpus is None:
            return None
        try:
            return _busy(self._cpus), _tree(os.getpid()), time.perf_counter()
        except (OSError, ValueError, IndexError):  # no /proc, or one laid out otherwise
            return None

    def stop(self) -> float | None:
        start, end = self._start, self._read()
        if start is None or end is None or end[2] <= start[2]:
            return None
        return max(0.0, ((end[0] - start[0]) - (end[1] - start[1])) / (end[2] - start[2]))
