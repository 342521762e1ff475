"""The usable cores (`fastdata._cores`): the affinity, and at most the cgroup's CPU bandwidth
limit, which `docker run --cpus` and Kubernetes CPU limits set without narrowing the affinity.
And from the same cgroup walk, its memory limit and out-of-memory kill count (`fastdata._memory`,
what a SIGKILLed worker's error says; `test_faults.py` runs a real one)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from fastdata._cores import cpu_quota, usable_cores
from fastdata._memory import memory_limit, oom_kills


def _tree(tmp_path, cgroup_lines: str, files: dict[str, str]) -> tuple[str, str]:
    """A cgroup hierarchy under tmp_path/fs (`files`: path -> contents) and a /proc/self/cgroup."""
    for path, text in files.items():
        (tmp_path / "fs" / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "fs" / path).write_text(text)
    (tmp_path / "cgroup").write_text(cgroup_lines)
    return str(tmp_path / "fs"), str(tmp_path / "cgroup")


@pytest.mark.parametrize("lines, files, cores", [
    # v2: the process's cgroup, with a limit of 4 cores, and one of 2.5 on its parent (a pod's)
    ("0::/kubepods/pod1/c1\n", {"kubepods/pod1/c1/cpu.max": "400000 100000\n",
                                "kubepods/pod1/cpu.max": "250000 100000\n", "cpu.max": "max 100000\n"}, 2.5),
    ("0::/user.slice\n", {"user.slice/cpu.max": "max 100000\n"}, None),  # no limit
    # v1, as Docker mounts it: the host's path in /proc/self/cgroup, the container's cgroup at the mount's root
    ("12:cpu,cpuacct:/docker/abc\n3:memory:/docker/abc\n",
     {"cpu,cpuacct/cpu.cfs_quota_us": "150000\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"}, 1.5),
    ("1:cpu:/\n", {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
    # files that are not what the kernel writes: no limit, and nothing raised
    ("0::/\n", {"cpu.max": "nan 100000\n"}, None),
    ("0::/\n", {"cpu.max": "\n"}, None),
    ("0::/\n", {"cpu.max": "100000 0\n"}, None),
    ("garbage\n", {"cpu.max": "100000 100000\n"}, None),
    ("0::/../../etc\n", {"cpu.max": "200000 100000\n"}, 2.0),  # no way out of the mount
])
def test_cpu_quota_reads_the_least_limit_over_the_cgroup_and_its_parents(tmp_path, lines, files, cores):
    root, cgroups = _tree(tmp_path, lines, files)
    assert cpu_quota(root, cgroups) == cores
    assert cpu_quota(root, str(tmp_path / "missing")) is None


def test_usable_cores_is_the_affinity_at_most_the_limit_rounded_up(monkeypatch):
    import fastdata._cores as cores

    affinity = len(os.sched_getaffinity(0))
    for quota, want in ((None, affinity), (0.5, 1), (1.0, 1), (1.5, min(2, affinity)), (10 ** 6, affinity)):
        monkeypatch.setattr(cores, "cpu_quota", lambda quota=quota: quota)
        assert usable_cores() == want, quota


def _writable_v1_cpu() -> str | None:
    path = "/sys/fs/cgroup/cpu"
    return path if os.path.isfile(os.path.join(path, "cpu.cfs_quota_us")) and os.access(path, os.W_OK) else None


@pytest.mark.skipif(_writable_v1_cpu() is None, reason="no writable cgroup v1 cpu hierarchy (root in a container)")
def test_a_process_limited_to_one_core_gets_one_auto_worker():
    """A real cgroup with a limit of one core (as `docker run --cpus=1` sets it): a process in it
    sees one usable core, and num_workers="auto" gives it one worker, not one per host core."""
    group = os.path.join(_writable_v1_cpu(), f"fastdata-test-{uuid.uuid4().hex[:8]}")
    os.mkdir(group)
    try:
        with open(os.path.join(group, "cpu.cfs_quota_us"), "w") as f:
            f.write(str(int(open(os.path.join(group, "cpu.cfs_period_us")).read())))
        code = ("import fastdata, torch\n"
                "from fastdata._cores import usable_cores\n"
                "ds = torch.utils.data.TensorDataset(torch.arange(8))\n"
                "loader = fastdata.loader(ds, batch_size=2, num_workers='auto', device='cpu')\n"
                "print(usable_cores(), loader.num_workers, sorted(int(i) for (b,) in loader for i in b))")
        script = f'echo $$ > {group}/cgroup.procs && exec "$0" -c "$1"'
        done = subprocess.run(["sh", "-c", script, sys.executable, code], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split("\n")[0] == "1 1 [0, 1, 2, 3, 4, 5, 6, 7]", done.stdout
    finally:
        os.rmdir(group)  # (empty once the process has exited)


_GIB = 1 << 30


@pytest.mark.parametrize("lines, files, limit, kills", [
    # v2: the container's cgroup with a limit of 2 GiB and 3 kills counted; its parent a lower limit
    ("0::/kubepods/pod1/c1\n", {"kubepods/pod1/c1/memory.max": f"{2 * _GIB}\n",
                                "kubepods/pod1/c1/memory.events": "low 0\nhigh 0\nmax 7\noom 3\noom_kill 3\n",
                                "kubepods/pod1/memory.max": f"{_GIB}\n", "memory.max": "max\n"}, _GIB, 3),
    ("0::/user.slice\n", {"user.slice/memory.max": "max\n", "user.slice/memory.events": "oom_kill 0\n"}, None, 0),
    # v1, as Docker mounts it (the host's path in /proc/self/cgroup): the mount's root is the container's
    ("4:memory:/docker/abc\n2:cpu,cpuacct:/docker/abc\n",
     {"memory/memory.limit_in_bytes": f"{_GIB // 2}\n",
      "memory/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n"}, _GIB // 2, 1),
    # v1 without a limit: the largest number it writes; a kernel before 4.13: no oom_kill line
    ("4:memory:/\n", {"memory/memory.limit_in_bytes": "9223372036854771712\n",
                      "memory/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\n"}, None, None),
    # files that are not what the kernel writes: nothing known, and nothing raised
    ("0::/\n", {"memory.max": "lots\n", "memory.events": "oom_kill many\n"}, None, None),
    ("garbage\n", {"memory.max": f"{_GIB}\n", "memory.events": "oom_kill 1\n"}, None, None),
])
def test_the_memory_limit_and_oom_kill_count_are_read_from_the_cgroups_files(tmp_path, lines, files, limit, kills):
    root, cgroups = _tree(tmp_path, lines, files)
    assert memory_limit(root, cgroups) == limit
    assert oom_kills(root, cgroups) == kills
    assert memory_limit(root, str(tmp_path / "missing")) is None and oom_kills(root, str(tmp_path / "missing")) is None
