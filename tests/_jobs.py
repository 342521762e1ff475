"""What the example tests share: a training job started as a user starts it, SIGKILLed as a
machine failure ends it, the processes it leaves, and the steps its ranks logged with the
scripts' --log-samples (labels, each image's mean per channel), decoded back into sample ids
from the colours of _images.py, and what those steps must show after a kill and a resume."""

import collections
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fastdata.transforms import IMAGENET_MEAN, IMAGENET_STD


def launch(cmd: list[str], tmp_path: Path, run: str, mark: str, **env: str) -> subprocess.Popen:
    """Starts `cmd` in a session of its own, its output in <tmp_path>/<run>.out, with this
    process's sys.path, one intra-op thread, a fastdata cache of its own, and `mark` in its
    environment (what `job_processes` looks for)."""
    full = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1",
            "PYTHONFAULTHANDLER": "1", "FASTDATA_CACHE": str(tmp_path / "cache"), mark: str(tmp_path), **env}
    with open(tmp_path / f"{run}.out", "w") as out:
        return subprocess.Popen(cmd, cwd=tmp_path, env=full, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def kill_once_past(job: subprocess.Popen, steps, at: int, out: Path, ranks=(0, 1), limit: float = 180) -> None:
    """Waits until every rank has logged step `at` (`steps(rank)`: its logged steps), then
    SIGKILLs the job's whole tree; fails, with the job's output, if it ends or stalls first."""
    try:
        deadline = time.monotonic() + limit
        while min(max(steps(r), default=0) for r in ranks) < at:
            assert job.poll() is None, "the first run ended before it was killed:\n" + out.read_text()
            if time.monotonic() > deadline:
                native = _stacks_then_kill(job)
                pytest.fail(f"step {at} not reached in {limit:.0f} s; the job's output and stacks:\n{out.read_text()}"
                            + native)
            time.sleep(0.01)
    finally:
        kill(job)
    assert job.returncode == -signal.SIGKILL


def finish(job: subprocess.Popen, out: Path, limit: float = 240) -> None:
    """Waits for the job to end well; one that does not end in time fails the test with the
    stacks of its processes (see `_stacks_then_kill`)."""
    try:
        code = job.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        native = _stacks_then_kill(job)
        pytest.fail(f"the job did not end in {limit:.0f} s; its output and stacks:\n{out.read_text()}" + native)
    finally:
        if job.poll() is None:
            kill(job)
    assert code == 0, out.read_text()


def _stacks_then_kill(job: subprocess.Popen) -> str:
    """SIGABRT to every process of a stalled job, on which faulthandler (PYTHONFAULTHANDLER,
    set by `launch`) writes each thread's stack into the job's output, then SIGKILL to all
    that are left: the tree is taken first, since a process's children outlive it. Returns
    each process's native stacks, taken first by gdb where there is one (a lock held inside
    fork or a C library shows only there), else ""."""
    tree = _tree(job.pid)
    groups = _groups(tree)
    native = ""
    gdb = shutil.which("gdb")
    deadline = time.monotonic() + 90  # about 4 s a process here; the test's own limit is near
    for pid in sorted(tree) if gdb else ():
        left = deadline - time.monotonic()
        if left < 5:
            native += f"\n--- no native stacks of {pid}: out of time ---"
            continue
        try:
            got = subprocess.run([gdb, "-p", str(pid), "-batch", "-ex", "thread apply all bt 30"],
                                 capture_output=True, text=True, timeout=left)
            native += f"\n--- native stacks of {pid} ---\n" + "\n".join(
                line for line in got.stdout.splitlines() if line.startswith(("#", "Thread ")))
        except (OSError, subprocess.TimeoutExpired) as e:
            native += f"\n--- no native stacks of {pid}: {e} ---"
    for pid in sorted(tree):  # one at a time, so that their stacks do not interleave
        try:
            os.kill(pid, signal.SIGABRT)
        except ProcessLookupError:
            continue
        time.sleep(0.3)
    time.sleep(1)  # the last stacks are written
    kill(job, groups)
    return native


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kill(job: subprocess.Popen, groups: set[int] | None = None) -> None:
    """SIGKILL to the whole job. A launcher may start a rank in a session of its own (torchrun
    does; a rank's workers are in its process group), so killing the launcher's group would
    leave the ranks training: every group in the job's process tree is killed (`groups`, where
    they were taken before a signal that may have ended the launcher)."""
    for group in _groups(_tree(job.pid)) if groups is None else groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            continue
    job.wait(timeout=30)


def _tree(root: int) -> set[int]:
    """`root` and every process descended from it."""
    parents = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                parents[int(pid)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    tree, grew = {root}, True
    while grew:
        more = {p for p, parent in parents.items() if parent in tree} - tree
        tree |= more
        grew = bool(more)
    return tree


def _groups(pids: set[int]) -> set[int]:
    groups = set()
    for pid in pids:
        try:
            groups.add(os.getpgid(pid))
        except ProcessLookupError:
            continue
    return groups


def job_processes(script: Path, tmp_path: Path, mark: str) -> list[str]:
    """Live processes of a test's jobs: the script's command line (forked workers keep it), or
    `mark=tmp_path` in the environment, which every descendant inherits whatever its command
    line (a launcher, a forkserver, multiprocessing's resource tracker)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:  # gone, or not ours to read
            continue
        if (str(script) in cmd and str(tmp_path) in cmd) or f"{mark}={tmp_path}".encode() in env:
            found.append(f"{pid}: {cmd}")
    return found


def no_job_left(script: Path, tmp_path: Path, mark: str) -> None:
    deadline = time.monotonic() + 10
    while job_processes(script, tmp_path, mark) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = job_processes(script, tmp_path, mark)
    assert not left, f"processes outlived the job: {left}"


def logged_steps(path: Path, per_class: int) -> dict[int, dict]:
    """A rank's logged steps, by step number, each with its sample ids decoded from the colours."""
    if not path.exists():
        return {}
    steps = {}
    for line in path.read_text().splitlines():
        if not line.endswith("}"):  # a line cut by the kill
            continue
        step = json.loads(line)
        rgb = torch.tensor(step["means"]) * torch.tensor(IMAGENET_STD) + torch.tensor(IMAGENET_MEAN)
        rgb = rgb * 255
        c, i = torch.round((rgb[:, 0] - 20) / 40), torch.round((rgb[:, 1] - 10) / 12)
        assert (rgb[:, 0] - (40 * c + 20)).abs().max() < 6 and (rgb[:, 1] - (12 * i + 10)).abs().max() < 4
        assert c.long().tolist() == step["labels"], "an image's colour disagrees with its label"
        step["ids"] = (c * per_class + i).long().tolist()
        steps[step["step"]] = step
    return steps


def _mean_loss(runs: dict[int, dict], lo: int, hi: int) -> float:
    """Over both ranks and steps lo..hi: one batch's loss varies too much to compare."""
    return sum(runs[r][s]["loss"] for r in (0, 1) for s in range(lo, hi + 1)) / (2 * (hi - lo + 1))


def check_resumed(first: dict[int, dict], second: dict[int, dict], *, done: int, epoch: int, epochs: int,
                  steps: int, samples: int) -> None:
    """The logged steps of two ranks, `first` from a run killed after its checkpoint at step
    `done` (in `epoch`, `steps` steps an epoch) and `second` from the run resumed from it up to
    `epochs`: the resumed run replays the steps after the checkpoint the same, every epoch trains
    on each of `samples` exactly once, the order changes per epoch, and the loss goes on."""
    killed_at = min(max(first[r]) for r in (0, 1))

    def epoch_steps(e: int) -> range:
        return range(e * steps + 1, (e + 1) * steps + 1)

    for r in (0, 1):
        assert sorted(second[r]) == list(range(done + 1, epochs * steps + 1)), f"rank {r} resumed at the wrong step"
        # The steps after the checkpoint that ran before the kill run again, the same (bit-exact
        # here; the tolerance is for kernels that sum in another order).
        for s in range(done + 1, killed_at + 1):
            assert second[r][s]["ids"] == first[r][s]["ids"], f"rank {r} step {s}: another batch after the resume"
            assert second[r][s]["loss"] == pytest.approx(first[r][s]["loss"], rel=1e-4), \
                f"rank {r} step {s}: the resumed model or optimizer is not the checkpoint's"
    # What the model learnt from: run 1 up to the checkpoint, then run 2.
    trained = {r: {**{s: v for s, v in first[r].items() if s <= done}, **second[r]} for r in (0, 1)}
    for e in range(epochs):
        ids = [i for r in (0, 1) for s in epoch_steps(e) for i in trained[r][s]["ids"]]
        assert sorted(ids) == list(range(samples)), \
            f"epoch {e}{' (the interrupted one)' if e == epoch else ''}: seen {collections.Counter(ids)}"
        assert all(trained[r][s]["epoch"] == e for r in (0, 1) for s in epoch_steps(e))
    order = [[i for s in epoch_steps(e) for i in trained[0][s]["ids"]] for e in range(epochs)]
    assert all(a != b for a, b in zip(order, order[1:])), "an epoch in the order of the one before"
    # The loss goes on from the checkpoint's, not from a fresh model's.
    fresh, before = _mean_loss(first, 1, 3), _mean_loss(first, done - 2, done)
    after = _mean_loss(second, done + 1, done + 3)
    assert abs(after - before) < abs(fresh - before) / 2 and after < fresh, (fresh, before, after)
