"""examples/lightning_train.py as a user runs it: Lightning's Trainer with DDP on 2 CPU processes
(gloo; the Trainer starts the second process itself), killed with SIGKILL mid-epoch and started
again with --resume, which hands last.ckpt to fit(). The fastdata loader's position travels in
Lightning's checkpoint (the fit loop saves a loader's state_dict()), so across both runs and both
ranks every epoch trains on each sample exactly once, the resumed run replays the steps after
the checkpoint with the same batches and losses, and no process of the job outlives it.

The images are flat colours that name their sample (see _images.py); the script's --log-samples
lines say which samples every step trained on."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from _images import color_folder
from _jobs import check_resumed, finish, free_port, kill_once_past, launch, logged_steps, no_job_left

pytest.importorskip("pytorch_lightning")

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "lightning_train.py"
CLASSES, PER_CLASS = 6, 20  # 120 images: 60 a rank, no padding
BATCH = 20  # batches this large make the loss fall steadily within a few dozen steps
STEPS = CLASSES * PER_CLASS // 2 // BATCH  # steps an epoch: 3
EPOCHS = 11  # 33 steps: the last checkpoint is the one at the end, not a step's
LR = 0.02
EVERY = 10  # checkpoints at steps 10 (mid-epoch: the one resumed from), 20 and 30
_MARK = "FASTDATA_TEST_LIGHTNING_JOB"  # in every job process's environment: the test's tmp_path


def _fit(tmp_path: Path, folder: Path, run: str, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, str(SCRIPT), "--data", str(folder), "--devices", "2", "--epochs", str(EPOCHS),
           "--batch-size", str(BATCH), "--lr", str(LR), "--image-size", "32", "--workers", "1",
           "--checkpoint-dir", str(tmp_path / "ckpt"), "--steps-per-checkpoint", str(EVERY),
           "--log-samples", str(tmp_path / run), *extra]
    return launch(cmd, tmp_path, run, _MARK, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))


def _steps(tmp_path: Path, run: str, rank: int) -> dict[int, dict]:
    return logged_steps(tmp_path / f"{run}.{rank}", PER_CLASS)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_killed_mid_epoch_and_resumed(tmp_path):
    folder = color_folder(tmp_path / "images", CLASSES, PER_CLASS, (40, 64), lambda i: f"{i:03d}.jpg")
    out1, out2 = tmp_path / "run1.out", tmp_path / "run2.out"
    ckpt = tmp_path / "ckpt" / "last.ckpt"
    job = _fit(tmp_path, folder, "run1")
    # Killed once both ranks are two steps past the first checkpoint: rank 0 writes it at
    # the end of step EVERY, before the next step's gradients are reduced across the
    # ranks, so it is complete by then.
    kill_once_past(job, lambda r: _steps(tmp_path, "run1", r), EVERY + 2, out1)
    no_job_left(SCRIPT, tmp_path, _MARK)
    saved = torch.load(ckpt, weights_only=True)
    (state,) = saved["loops"]["fit_loop"]["state_dict"]["combined_loader"]  # the loader's state_dict()
    done, epoch, batches = saved["global_step"], state["epoch"], state["batches"]
    assert 0 < batches < STEPS and done == epoch * STEPS + batches, f"not a mid-epoch checkpoint: {state}"
    assert saved["epoch"] == epoch, "Lightning's epoch and the loader's differ"
    first = {r: _steps(tmp_path, "run1", r) for r in (0, 1)}
    killed_at = min(max(first[r]) for r in (0, 1))
    assert killed_at > done, "no step ran after the checkpoint before the kill"

    job = _fit(tmp_path, folder, "run2", "--resume")
    finish(job, out2)
    no_job_left(SCRIPT, tmp_path, _MARK)
    assert f"resumed from {ckpt}: step {done}" in out2.read_text()
    second = {r: _steps(tmp_path, "run2", r) for r in (0, 1)}

    check_resumed(first, second, done=done, epoch=epoch, epochs=EPOCHS, steps=STEPS, samples=CLASSES * PER_CLASS)
    # The run ends with a checkpoint of its last step, whose loader starts the next epoch.
    saved = torch.load(ckpt, weights_only=True)
    (state,) = saved["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    assert (saved["global_step"], state["epoch"], state["batches"]) == (EPOCHS * STEPS, EPOCHS, 0)


@pytest.mark.parametrize("args,says", [
    (["--data", "{tmp}/missing"], "--data '{tmp}/missing' does not exist"),
    (["--data", "{tmp}/empty"], "--data: image folder '{tmp}/empty' has no class folders"),
])
def test_bad_arguments_are_one_line_errors(tmp_path, args, says):
    """A folder the loader would refuse is refused before the Trainer starts: one line, exit 2."""
    (tmp_path / "empty").mkdir()
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=100)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("lightning_train.py: error: ") and says.replace("{tmp}", str(tmp_path)) in line, line
    assert not (tmp_path / "checkpoints").exists()
