"""examples/train.py as a user runs it: torchrun, 2 ranks over gloo on CPU, killed with SIGKILL
mid-epoch and started again with --resume. Across both runs and both ranks every epoch trains on
each sample exactly once, the resumed run replays the steps after the checkpoint with the same
batches and losses, and no process of the job outlives it.

The images are flat colours that name their sample (see _images.py); the script's --log-samples
lines (labels, each image's mean per channel) say which samples every step trained on."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from _images import color_folder
from _jobs import check_resumed, finish, free_port, kill_once_past, launch, logged_steps, no_job_left

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "train.py"
CLASSES, PER_CLASS = 6, 20  # 120 images: 60 a rank, no padding
BATCH = 20  # batches this large make the loss fall steadily within a few dozen steps
STEPS = CLASSES * PER_CLASS // 2 // BATCH  # steps an epoch: 3
EPOCHS = 10
LR = 0.02
EVERY = 10  # checkpoints at steps 10 and 20, both mid-epoch
_MARK = "FASTDATA_TEST_TRAIN_JOB"  # in every job process's environment: the test's tmp_path


def _torchrun(tmp_path: Path, folder: Path, run: str, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()), str(SCRIPT),
           "--data", str(folder), "--epochs", str(EPOCHS), "--batch-size", str(BATCH), "--lr", str(LR),
           "--image-size", "32", "--workers", "1", "--checkpoint", str(tmp_path / "ckpt.pt"),
           "--steps-per-checkpoint", str(EVERY), "--log-samples", str(tmp_path / run), *extra]
    return launch(cmd, tmp_path, run, _MARK)


def _steps(tmp_path: Path, run: str, rank: int) -> dict[int, dict]:
    return logged_steps(tmp_path / f"{run}.{rank}", PER_CLASS)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_killed_mid_epoch_and_resumed(tmp_path):
    folder = color_folder(tmp_path / "images", CLASSES, PER_CLASS, (40, 64), lambda i: f"{i:03d}.jpg")
    out1, out2 = tmp_path / "run1.out", tmp_path / "run2.out"
    job = _torchrun(tmp_path, folder, "run1")
    # Killed once both ranks are two steps past the first checkpoint: rank 0 writes it
    # before its next step, so it is complete by then.
    kill_once_past(job, lambda r: _steps(tmp_path, "run1", r), EVERY + 2, out1)
    no_job_left(SCRIPT, tmp_path, _MARK)
    saved = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    done, epoch, batches = saved["step"], saved["epoch"], saved["loader"]["batches"]
    assert 0 < batches < STEPS and done == epoch * STEPS + batches, f"not a mid-epoch checkpoint: {saved['loader']}"
    first = {r: _steps(tmp_path, "run1", r) for r in (0, 1)}
    killed_at = min(max(first[r]) for r in (0, 1))
    assert killed_at > done, "no step ran after the checkpoint before the kill"

    job = _torchrun(tmp_path, folder, "run2", "--resume")
    finish(job, out2)
    no_job_left(SCRIPT, tmp_path, _MARK)
    assert f"resumed from {tmp_path / 'ckpt.pt'}: step {done}" in out2.read_text()
    second = {r: _steps(tmp_path, "run2", r) for r in (0, 1)}

    check_resumed(first, second, done=done, epoch=epoch, epochs=EPOCHS, steps=STEPS, samples=CLASSES * PER_CLASS)


@pytest.mark.parametrize("args,says", [
    (["--data", "{tmp}/missing"], "--data '{tmp}/missing' does not exist"),
    (["--data", "{tmp}/empty"], "--data: image folder '{tmp}/empty' has no class folders"),
    (["--data", "{tmp}/a.jpg"], "--data '{tmp}/a.jpg' is not a folder"),
    (["--epochs", "0"], "argument --epochs: should be an integer >= 1, but got '0'"),
    (["--workers", "x"], "argument --workers: should be 'auto' or an integer >= 0, but got 'x'"),
    (["--checkpoint", "{tmp}/missing/ckpt.pt"], "--checkpoint '{tmp}/missing/ckpt.pt' cannot be written"),
])
def test_bad_arguments_are_one_line_errors(tmp_path, args, says):
    """A bad argument stops the script in one line, argparse's way (exit 2), not a traceback;
    before anything is made (the synthetic set without --data included)."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "a.jpg").write_bytes(b"")
    (tmp_path / "cache").mkdir()
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FASTDATA_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=100)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("train.py: error: ") and says.replace("{tmp}", str(tmp_path)) in line, line
    assert not any((tmp_path / "cache").iterdir()) and not (tmp_path / "checkpoint.pt").exists()
