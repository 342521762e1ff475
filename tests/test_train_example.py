"""examples/train.py as a user runs it: torchrun, 2 ranks over gloo on CPU, killed with SIGKILL
mid-epoch and started again with --resume. Across both runs and both ranks every epoch trains on
each sample exactly once, the resumed run replays the steps after the checkpoint with the same
batches and losses, and no process of the job outlives it.

The images are flat colours that name their sample (see _images.py); the script's --log-samples
lines (labels, each image's mean per channel) say which samples every step trained on."""

import collections
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from _images import color_folder
from fastdata.transforms import IMAGENET_MEAN, IMAGENET_STD

SCRIPT = Path(__file__).resolve().parent.parent / "examples" / "train.py"
CLASSES, PER_CLASS = 6, 20  # 120 images: 60 a rank, no padding
BATCH = 20  # batches this large make the loss fall steadily within a few dozen steps
STEPS = CLASSES * PER_CLASS // 2 // BATCH  # steps an epoch: 3
EPOCHS = 10
LR = 0.02
EVERY = 10  # checkpoints at steps 10 and 20, both mid-epoch
_MARK = "FASTDATA_TEST_TRAIN_JOB"  # in every job process's environment: the test's tmp_path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(tmp_path: Path, folder: Path, run: str, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), str(SCRIPT),
           "--data", str(folder), "--epochs", str(EPOCHS), "--batch-size", str(BATCH), "--lr", str(LR),
           "--image-size", "32", "--workers", "1", "--checkpoint", str(tmp_path / "ckpt.pt"),
           "--steps-per-checkpoint", str(EVERY), "--log-samples", str(tmp_path / run), *extra]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1",
           "FASTDATA_CACHE": str(tmp_path / "cache"), _MARK: str(tmp_path)}
    with open(tmp_path / f"{run}.out", "w") as out:
        return subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _kill(job: subprocess.Popen) -> None:
    """SIGKILL to the whole job, as a machine failure ends it. torchrun starts each rank in a
    session of its own (a rank's workers are in its process group), so killing torchrun's group
    would leave the ranks training: every group in the job's process tree is killed."""
    parents = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                parents[int(pid)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    tree, grew = {job.pid}, True
    while grew:
        more = {p for p, parent in parents.items() if parent in tree} - tree
        tree |= more
        grew = bool(more)
    groups = set()
    for pid in tree:
        try:
            groups.add(os.getpgid(pid))
        except ProcessLookupError:
            continue
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            continue
    job.wait(timeout=30)


def _steps(tmp_path: Path, run: str, rank: int) -> dict[int, dict]:
    """A rank's logged steps, by step number, each with its sample ids decoded from the colours."""
    path = tmp_path / f"{run}.{rank}"
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
        step["ids"] = (c * PER_CLASS + i).long().tolist()
        steps[step["step"]] = step
    return steps


def _job_processes(tmp_path: Path) -> list[str]:
    """Live processes of this test's jobs: the script's command line (forked workers keep it),
    or the job's mark in the environment, which every descendant inherits whatever its command
    line (torchrun itself, a forkserver, multiprocessing's resource tracker)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:  # gone, or not ours to read
            continue
        if (str(SCRIPT) in cmd and str(tmp_path) in cmd) or f"{_MARK}={tmp_path}".encode() in env:
            found.append(f"{pid}: {cmd}")
    return found


def _no_job_left(tmp_path: Path) -> None:
    deadline = time.monotonic() + 10
    while _job_processes(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _job_processes(tmp_path), f"processes outlived the job: {_job_processes(tmp_path)}"


def _epoch_steps(e: int) -> range:
    return range(e * STEPS + 1, (e + 1) * STEPS + 1)


def _mean_loss(runs: dict[int, dict], lo: int, hi: int) -> float:
    """Over both ranks and steps lo..hi: one batch's loss varies too much to compare."""
    return sum(runs[r][s]["loss"] for r in (0, 1) for s in range(lo, hi + 1)) / (2 * (hi - lo + 1))


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_killed_mid_epoch_and_resumed(tmp_path):
    folder = color_folder(tmp_path / "images", CLASSES, PER_CLASS, (40, 64), lambda i: f"{i:03d}.jpg")
    out1, out2 = tmp_path / "run1.out", tmp_path / "run2.out"
    job = _torchrun(tmp_path, folder, "run1")
    try:
        # Killed once both ranks are two steps past the first checkpoint: rank 0 writes it
        # before its next step, so it is complete by then.
        deadline = time.monotonic() + 180
        while min(max(_steps(tmp_path, "run1", r), default=0) for r in (0, 1)) < EVERY + 2:
            assert job.poll() is None, "the first run ended before it was killed:\n" + out1.read_text()
            assert time.monotonic() < deadline, "no checkpoint in time:\n" + out1.read_text()
            time.sleep(0.01)
    finally:
        _kill(job)
    assert job.returncode == -signal.SIGKILL
    _no_job_left(tmp_path)
    saved = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    done, epoch, batches = saved["step"], saved["epoch"], saved["loader"]["batches"]
    assert 0 < batches < STEPS and done == epoch * STEPS + batches, f"not a mid-epoch checkpoint: {saved['loader']}"
    first = {r: _steps(tmp_path, "run1", r) for r in (0, 1)}
    killed_at = min(max(first[r]) for r in (0, 1))
    assert killed_at > done, "no step ran after the checkpoint before the kill"

    job = _torchrun(tmp_path, folder, "run2", "--resume")
    try:
        assert job.wait(timeout=240) == 0, out2.read_text()
    finally:
        if job.poll() is None:
            _kill(job)
    _no_job_left(tmp_path)
    assert f"resumed from {tmp_path / 'ckpt.pt'}: step {done}" in out2.read_text()
    second = {r: _steps(tmp_path, "run2", r) for r in (0, 1)}

    for r in (0, 1):
        assert sorted(second[r]) == list(range(done + 1, EPOCHS * STEPS + 1)), f"rank {r} resumed at the wrong step"
        # The steps after the checkpoint that ran before the kill run again, the same (bit-exact
        # here; the tolerance is for kernels that sum in another order).
        for s in range(done + 1, killed_at + 1):
            assert second[r][s]["ids"] == first[r][s]["ids"], f"rank {r} step {s}: another batch after the resume"
            assert second[r][s]["loss"] == pytest.approx(first[r][s]["loss"], rel=1e-4), \
                f"rank {r} step {s}: the resumed model or optimizer is not the checkpoint's"
    # What the model learnt from: run 1 up to the checkpoint, then run 2.
    trained = {r: {**{s: v for s, v in first[r].items() if s <= done}, **second[r]} for r in (0, 1)}
    for e in range(EPOCHS):
        ids = [i for r in (0, 1) for s in _epoch_steps(e) for i in trained[r][s]["ids"]]
        assert sorted(ids) == list(range(CLASSES * PER_CLASS)), \
            f"epoch {e}{' (the interrupted one)' if e == epoch else ''}: seen {collections.Counter(ids)}"
        assert all(trained[r][s]["epoch"] == e for r in (0, 1) for s in _epoch_steps(e))
    order = [[i for s in _epoch_steps(e) for i in trained[0][s]["ids"]] for e in range(EPOCHS)]
    assert all(a != b for a, b in zip(order, order[1:])), "an epoch in the order of the one before"
    # The loss goes on from the checkpoint's, not from a fresh model's.
    fresh, before = _mean_loss(first, 1, 3), _mean_loss(first, done - 2, done)
    after = _mean_loss(second, done + 1, done + 3)
    assert abs(after - before) < abs(fresh - before) / 2 and after < fresh, (fresh, before, after)
