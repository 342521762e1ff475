"""Bounded memory over many epochs (a short run of benchmarks/soak.py on each backend).

Each case runs `benchmarks/soak.py --child CONFIG` in its own process: 12 epochs of 256 small
flat-colour images (tests/_images.py), batches of 32 at 128x128, 2 workers, persistent workers
off and on (`dali`: 2 threads, no worker processes; `torch`: the drop-in mode over ready
tensors, whose child checks every sample id against its label). The figure is the job's
memory at each epoch's last batch: Pss_Anon summed over the process and its workers, plus the
/dev/shm segments they hold (see the soak's docstring for why). Over epochs 4..12 its median
change from one epoch to the next must stay under a quarter of a batch, and its whole growth
under three batches: a leak of one batch an epoch, in the training process or in a persistent
worker, breaks both (checked by injecting one). Not a least-squares slope: a batch slot of a
worker's ring touched for the first time late in the run (the rings fill lazily, up to their
fixed number of slots) is a one-batch step, which the median ignores and a slope would not.

The children run with glibc's trim threshold at 0, so memory freed is handed back at once and
the figure follows live memory: without it glibc keeps large freed blocks for reuse (its mmap
threshold rises after the first is freed), and memory it keeps for reuse is the allocator's,
not a leak, and could hide one; the full soak measures with the defaults.

/dev/shm: the bytes of the segments the job holds follow the same rule, and once the job has
exited no name of any of its processes is left there.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _images import color_folder

from fastdata.shard import write_shards

pytestmark = pytest.mark.slow

SOAK = Path(__file__).resolve().parents[2] / "benchmarks" / "soak.py"
CLASSES, PER_CLASS = 8, 32
N = CLASSES * PER_CLASS
BATCH, SIZE, EPOCHS, WORKERS = 32, 128, 12, 2
BATCH_BYTES = BATCH * 3 * SIZE * SIZE
STEADY = 3  # epochs 4.. are the steady part (rings filled, arenas warm)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = color_folder(tmp_path_factory.mktemp("soak-imgs"), CLASSES, PER_CLASS, (64, 160),
                          lambda i: f"{i:03d}.jpg")
    out = tmp_path_factory.mktemp("soak-shards")
    write_shards(folder, out / "s-%06d.tar", max_count=64, workers=1)
    return str(folder), str(out / "s-{000000..000003}.tar")


def _soak(config: str, data: tuple[str, str]) -> tuple[list[dict], dict]:
    folder, pattern = data
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_TRIM_THRESHOLD_": "0"}
    cmd = [sys.executable, str(SOAK), "--child", config, "--root", folder, "--shards", pattern,
           "--images", str(N), "--classes", str(CLASSES), "--epochs", str(EPOCHS), "--batch", str(BATCH),
           "--size", str(SIZE), "--workers", str(WORKERS)]
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=100)
    assert run.returncode == 0, f"{config}: {run.stderr.strip()[-3000:]}"
    records = [json.loads(line) for line in run.stdout.splitlines()]
    assert records and records[-1].get("done"), run.stdout[-2000:]
    return records[:-1], records[-1]


def _mb(x: float) -> str:
    return f"{x / 2**20:.2f} MB"


@pytest.mark.parametrize("config", ["pil", "pil-persistent", "wds", "wds-persistent",
                                    pytest.param("dali", marks=pytest.mark.dali), "torch", "torch-persistent"])
def test_memory_and_shm_stay_bounded(config, data):
    persistent = config.endswith("-persistent")
    before = set(os.listdir("/dev/shm"))
    epochs, done = _soak(config, data)

    assert [e["epoch"] for e in epochs] == list(range(1, EPOCHS + 1))
    for e in epochs:  # every sample once an epoch (the drop-in child checks the ids too)
        assert e["labels"] == [PER_CLASS] * CLASSES, f"epoch {e['epoch']}: labels {e['labels']}"
        # The workers (none for dali) are alive at the last batch, and gone after the epoch
        # unless persistent.
        assert e["n_workers"] == (0 if config == "dali" else WORKERS), e
        assert e["children_after"] == (WORKERS if persistent else 0), e

    for what in ("total", "shm_bytes"):
        curve = np.array([e[what] for e in epochs], dtype=np.float64)
        steady = curve[STEADY:]
        shown = ", ".join(_mb(x) for x in curve)
        step = np.median(np.diff(steady))
        assert step < BATCH_BYTES / 4, \
            f"{config}: {what} grows {_mb(step)} an epoch (a batch is {_mb(BATCH_BYTES)}): {shown}"
        growth = steady[-1] - steady[0]
        assert growth < 3 * BATCH_BYTES, f"{config}: {what} grows {_mb(growth)} over epochs 4-{EPOCHS}: {shown}"
    shm = [e["shm_bytes"] for e in epochs]
    if config != "dali":  # the workers' batches cross in shared memory
        assert min(shm) > 0, shm

    pids = {pid for e in epochs for pid in e["pids"]}
    assert done["children_left"] == 0
    assert done["shm_names_left"] == []
    # torch names a segment torch_<pid of its creator>_<random>_<count>.
    left = [n for n in set(os.listdir("/dev/shm")) - before
            if (m := re.match(r"torch_(\d+)_", n)) and int(m.group(1)) in pids]
    assert left == [], f"{config}: names left in /dev/shm: {left}"
