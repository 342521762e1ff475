"""The memory this process may use and the kernel's out-of-memory kills in its cgroup: what the
error of a worker that died of SIGKILL says about its cause.

DataLoader says "DataLoader worker (pid N) is killed by signal: Killed." whatever sent the
SIGKILL. Most often it is the kernel's out-of-memory killer, and the kernel counts each of its
kills in the victim's cgroup (v2's memory.events, v1's memory.oom_control: `oom_kill N`) before
it sends the signal; the count taken when a pass starts and again at the error says whether the
out-of-memory killer struck during the pass, where that count can be read. Only a count that
moved is reported as an out-of-memory kill. Written here because no library fastdata depends on
reads these files (psutil, not a dependency, reads a process's memory, not its cgroup's limit or
kills).
"""

from __future__ import annotations

import functools
import os

from ._cores import cgroup_folders


@functools.lru_cache(maxsize=4)
def _oom_file(root: str, cgroups: str) -> str | None:
    """The file of this process's own cgroup that counts its out-of-memory kills, or None where
    there is none to read. The cgroup a process is in rarely changes, so it is looked up once;
    the count is read each time."""
    for v2, folder in cgroup_folders("memory", root, cgroups):
        path = os.path.join(folder, "memory.events" if v2 else "memory.oom_control")
        if _count(path) is not None:
            return path
    return None


def _count(path: str) -> int | None:
    """The `oom_kill` count in memory.events or memory.oom_control at `path`, or None."""
    try:
        with open(path) as f:
            for line in f.read(1 << 12).splitlines():
                name, _, value = line.partition(" ")
                if name == "oom_kill":
                    return int(value)
    except (OSError, ValueError):
        pass
    return None


def oom_kills(root: str = "/sys/fs/cgroup", cgroups: str = "/proc/self/cgroup") -> int | None:
    """The out-of-memory kills the kernel has counted in this process's cgroup (its workers
    are in it too), or None where no such count can be read."""
    found = _oom_file(root, cgroups)
    return _count(found) if found else None


def memory_limit(root: str = "/sys/fs/cgroup", cgroups: str = "/proc/self/cgroup") -> int | None:
    """The memory this process's cgroup may use, in bytes: the least of the limits set on it and
    on those above it (v2's memory.max, v1's memory.limit_in_bytes), or None where none is set
    below the machine's memory or none can be read."""
    limits = []
    for v2, folder in cgroup_folders("memory", root, cgroups):
        try:
            with open(os.path.join(folder, "memory.max" if v2 else "memory.limit_in_bytes")) as f:
                limits.append(int(f.read(64)))
        except (OSError, ValueError):  # no such file, or "max": no limit
            continue
    try:
        machine = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError, AttributeError):
        machine = None
    limit = min(limits) if limits else None
    # (v1 writes "no limit" as a huge number: 9223372036854771712)
    return limit if limit is not None and (machine is None or limit < machine) else None


def killed_why(oom_before: int | None, workers: int) -> str:
    """What sent the SIGKILL that ended a worker (one of `workers`), which fastdata did not send,
    from the out-of-memory kills counted since `oom_before` (`oom_kills()` when its pass
    started): a sentence to add to DataLoader's error."""
    now = oom_kills()
    if oom_before is None or now is None:
        return ("SIGKILL, not sent by fastdata; the kernel's out-of-memory killer sends it, and the kernel's log "
                "(dmesg) says whether it did")
    if now == oom_before:
        return ("SIGKILL, sent neither by fastdata nor by the kernel's out-of-memory killer (whose count of kills in "
                "this cgroup did not change during the pass)")
    limit, kills = memory_limit(), now - oom_before
    room = (f"this process's cgroup, limited to {limit / 2**20:,.0f} MiB, ran out of memory" if limit is not None
            else "the machine ran out of memory")
    return (f"SIGKILL, from the kernel's out-of-memory killer: {room} ({kills} kill{'s' * (kills > 1)} counted in "
            f"the cgroup during the pass). Each worker holds memory of its own: fewer workers (num_workers={workers} "
            "now), a smaller batch_size or prefetch_factor, or more memory for the job")
