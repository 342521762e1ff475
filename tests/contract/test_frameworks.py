"""fastdata inside the training frameworks: Lightning's Trainer (one device, DDP, DDP spawn, a
mid-epoch resume), Fabric and Accelerate (one process and two, gloo on 127.0.0.1). Each case
runs the same small training job (tests/_framework_job.py) once with a plain DataLoader and
once with fastdata.loader given the same keywords, and compares what each rank saw, batch by
batch, epoch by epoch.

Drop-in mode must give every rank the batches (and so the losses) a DataLoader gives it, down
to the random draws its dataset makes.
Image mode has no DataLoader twin, and keeps its own (seed, epoch, rank) split: there each rank
must see what fastdata.loader with that rank and world size gives outside any framework, which
is a disjoint share of the epoch, the shares together every sample, in an order that changes
with the epoch; and as many batches, as large, as a DataLoader over the same images gets from
that framework.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import fastdata
from _framework_job import SIDE, TRAIN, sample_ids
from _images import color_folder
from fastdata import transforms as T

pytest.importorskip("pytorch_lightning")
pytest.importorskip("accelerate")

JOB = str(Path(__file__).resolve().parents[1] / "_framework_job.py")
CLASSES, PER_CLASS = 2, 20  # image mode: 40 images, as many as drop-in mode's training samples
BATCH = 4
EPOCHS = 2


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return color_folder(tmp_path_factory.mktemp("imgs"), CLASSES, PER_CLASS, (10, 24), lambda i: f"{i:03d}.jpg")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill_tree(pid: int) -> None:
    """SIGKILL to the job's process and everything descended from it (torchrun starts each rank
    in a session of its own, out of the job's process group)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(text[text.rindex(")") + 2:].split()[1])
    tree, grew = {pid}, True
    while grew:
        more = {p for p, parent in parents.items() if parent in tree} - tree
        tree |= more
        grew = bool(more)
    for p in tree:  # `pid` is not reaped yet; the others were alive a moment ago
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_job(out: Path, job: dict, runs: list[dict], *, torchrun: int = 0, timeout: float = 240) -> dict[str, dict]:
    """Runs the job (its runs in turn) in a process group of its own, killed whole on a timeout
    and after the job, so that no rank outlives the test; returns per run, per rank, the
    records."""
    job = {"out": str(out), "epochs": EPOCHS, "batch_size": BATCH, "num_workers": 0, "per_class": PER_CLASS,
           "runs": runs, **job}
    cmd = [sys.executable, JOB, json.dumps(job)]
    if torchrun:
        cmd[1:1] = ["-m", "torch.distributed.run", f"--nproc_per_node={torchrun}", "--master_addr=127.0.0.1",
                    f"--master_port={_free_port()}"]
    env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
               PYTHONWARNINGS="ignore")
    for attempt in range(2):
        proc = subprocess.Popen(cmd, cwd=out, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_tree(proc.pid)
            output, _ = proc.communicate()
            pytest.fail(f"the job ran past {timeout} s:\n{output[-8000:]}")
        finally:
            try:  # the group's stragglers (a group id is not reused while the group lives)
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if proc.returncode == 0 or attempt or not _reference_aborted(output, runs):
            break
        for run in runs:  # the retry writes every run's records anew
            shutil.rmtree(out / run["name"], ignore_errors=True)
    if proc.returncode != 0:
        pytest.fail(f"the job failed ({proc.returncode}):\n{output[-8000:]}")
    logs = {}
    for run in runs:
        logs[run["name"]] = {int(path.stem[4:]): [json.loads(line) for line in path.read_text().splitlines()]
                             for path in sorted((out / run["name"]).glob("rank*.jsonl"))}
    return logs


def _reference_aborted(output: str, runs: list[dict]) -> bool:
    """Whether the job died of gloo's abort at a rank's exit (a flake of torch's own,
    pytorch/pytorch#190489: a ddp_spawn rank finalizes with the group's threads live) while
    its reference run, a plain DataLoader with no fastdata in it, was the one running: that
    alone gets one retry; a fastdata run gets none."""
    started = [line[len("== run "):] for line in output.splitlines() if line.startswith("== run ")]
    reference = {run["name"] for run in runs if run.get("loader") == "dataloader"}
    return ("terminate called without an active exception" in output and bool(started)
            and started[-1] in reference)


def seen(records: list[dict], draws: bool = True) -> list[tuple]:
    """What a rank saw, in order: (stage, epoch, batch, sample ids[, the samples' random draws])."""
    return [(r["stage"], r["epoch"], r["batch"], r["ids"]) + ((r["draws"],) if draws else ()) for r in records]


def losses(records: list[dict]) -> list:
    """The training steps' losses, in order (a validation batch has none; which batch each
    record is, `seen` compares)."""
    return [r["loss"] for r in records if r["loss"] is not None]


def shape(logs: dict[int, list[dict]]) -> dict[int, list[tuple]]:
    """Per rank, each batch's place and size: what a DataLoader twin must match in image mode."""
    return {rank: [(r["stage"], r["epoch"], r["batch"], len(r["ids"])) for r in records] for rank, records in logs.items()}


def check_dropin(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want), f"ranks {sorted(got)} logged, a DataLoader's job logged {sorted(want)}"
    for rank in want:
        assert seen(got[rank]) == seen(want[rank]), f"rank {rank} saw other batches than with a DataLoader"
        assert losses(got[rank]) == pytest.approx(losses(want[rank]), rel=1e-5), f"rank {rank}: other losses"
    every = sorted(i for rank in want for r in want[rank] if r["stage"] == "train" and r["epoch"] == 0 for i in r["ids"])
    assert every == list(range(TRAIN)), "the DataLoader's job: the ranks' shares do not make one epoch"


def standalone(folder: Path, stage: str, epoch: int, rank: int, world_size: int) -> list[list[int]]:
    """What fastdata.loader gives a rank outside any framework: its batches' ids in `epoch`."""
    loader = fastdata.loader(str(folder), batch_size=BATCH, shuffle=stage == "train", num_workers=0, device="cpu",
                             transform=T.Compose([T.Resize(SIDE), T.CenterCrop(SIDE)]), rank=rank,
                             world_size=world_size)
    loader.set_epoch(epoch)
    spec = {"mode": "image", "per_class": PER_CLASS}
    return [sample_ids(spec, x, y) for x, y in loader]


def check_image(got: dict, twin: dict, folder: Path, world_size: int, stages=("train", "val")) -> None:
    assert sorted(got) == list(range(world_size)), f"ranks {sorted(got)} logged, expected {world_size}"
    assert shape(got) == shape(twin), "other batch counts or sizes than a DataLoader over the same images"
    for stage in stages:
        epochs = sorted({r["epoch"] for r in got[0] if r["stage"] == stage})
        for epoch in epochs:
            shares = []
            for rank in range(world_size):
                batches = [r["ids"] for r in got[rank] if r["stage"] == stage and r["epoch"] == epoch]
                assert batches == standalone(folder, stage, epoch if stage == "train" else 0, rank, world_size), \
                    f"rank {rank}, {stage} epoch {epoch}: not fastdata's own split for rank {rank} of {world_size}"
                shares.append([i for b in batches for i in b])
            every = sorted(i for share in shares for i in share)
            assert every == list(range(CLASSES * PER_CLASS)), f"{stage} epoch {epoch}: the ranks' shares overlap or miss"
    for rank in range(world_size):
        orders = [[i for r in got[rank] if r["stage"] == "train" and r["epoch"] == e for i in r["ids"]]
                  for e in range(EPOCHS)]
        assert orders[0] != orders[1], f"rank {rank}: the same training order in epochs 0 and 1"


def run_both(tmp_path: Path, folder: Path, mode: str, job: dict, **how) -> tuple[dict, dict]:
    """The job with a DataLoader, then with fastdata: (fastdata's logs, the DataLoader's)."""
    job = {"mode": mode, "folder": str(folder), **job}
    logs = run_job(tmp_path, job, [{"name": "dataloader", "loader": "dataloader"},
                                   {"name": "fastdata", "loader": "fastdata"}], **how)
    return logs["fastdata"], logs["dataloader"]


def check(mode: str, got: dict, want: dict, folder: Path, world_size: int, stages=("train", "val")) -> None:
    if mode == "dropin":
        check_dropin(got, want)
    else:
        check_image(got, want, folder, world_size, stages)


# ------------------------------------------------------------------------------ Lightning

LIGHTNING_CASES = [
    # devices, strategy, where the loaders are made, and a few of the job's keys
    pytest.param(1, "auto", "hooks", {"num_workers": 1}, id="single"),
    pytest.param(1, "auto", "hooks", {"reload": 1}, id="single-reload-every-epoch"),
    # seed_everything(workers=True): Lightning sets each loader's worker_init_fn after it is made
    pytest.param(1, "auto", "hooks", {"num_workers": 1, "seed_workers": True}, id="single-seed-workers"),
    pytest.param(2, "ddp", "hooks", {}, id="ddp", marks=pytest.mark.slow),
    pytest.param(2, "ddp", "before_fit", {}, id="ddp-made-before-fit", marks=pytest.mark.slow),
    pytest.param(2, "ddp_spawn", "before_fit", {}, id="ddp_spawn", marks=pytest.mark.slow),
]


@pytest.mark.timeout(400)
@pytest.mark.parametrize("mode", ["dropin", "image"])
@pytest.mark.parametrize("devices,strategy,built,keys", LIGHTNING_CASES)
def test_lightning_fit(tmp_path, folder, mode, devices, strategy, built, keys):
    """Trainer.fit, two epochs with validation: a DataLoader's batches per rank and epoch (the
    DistributedSampler Lightning puts in, advanced by its set_epoch; the worker seeding it sets),
    whether the loaders come from the module's hooks (once, or anew every epoch) or are made
    before the process group exists and given to fit()."""
    job = {"framework": "lightning", "devices": devices, "strategy": strategy, "built": built, **keys}
    got, want = run_both(tmp_path, folder, mode, job)
    check(mode, got, want, folder, devices)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["dropin", "image"])
@pytest.mark.parametrize("where", ["mid-epoch", "epoch-end"])
def test_lightning_resume(tmp_path, folder, mode, where):
    """A checkpoint taken mid-epoch (ModelCheckpoint(every_n_train_steps)) or at an epoch's end
    (every_n_epochs), resumed with fit(ckpt_path=...): the batches, and the losses, after it are
    the uninterrupted run's (Lightning makes the loader's iterator before it calls set_epoch
    for the resumed epoch). In drop-in mode at an epoch's end, what a DataLoader gives. A plain DataLoader cannot resume mid-epoch: it has no state_dict, so
    Lightning warns and takes the epoch's remaining steps from a fresh shuffle (samples repeated
    and missed)."""
    job = {"framework": "lightning", "devices": 1, "mode": mode, "folder": str(folder), "loader": "fastdata"}
    per_epoch = len(range(0, TRAIN, BATCH))
    if where == "mid-epoch":
        step, at, keys = per_epoch + 3, ("train", 1, 3), {"ckpt_every": per_epoch + 3}  # after batch 2 of epoch 1
    else:
        step, at, keys = per_epoch, ("train", 1, 0), {"ckpt_epochs": True}  # after epoch 0 (and its validation)
    if mode == "dropin" and where == "epoch-end":
        # Lightning restores no loader state from an epoch-end checkpoint, so a Dataset's next
        # shuffle comes from torch's RNG as seeded: the resumed job must match a DataLoader's
        runs = [{"name": f"{name}-{loader}", "loader": loader, **run} for loader in ("dataloader", "fastdata")
                for name, run in (("whole", keys), ("resumed", {"resume_step": step, "resume_from": f"whole-{loader}"}))]
        logs = run_job(tmp_path, job, runs)
        got, want = logs["resumed-fastdata"][0], logs["resumed-dataloader"][0]
        assert seen(got) == seen(want), "after the resume, other batches than a DataLoader's"
        assert losses(got) == pytest.approx(losses(want), rel=1e-5), "after the resume, other losses than a DataLoader's"
        return
    logs = run_job(tmp_path, job, [{"name": "whole", **keys}, {"name": "resumed", "resume_step": step}])
    whole, resumed = logs["whole"][0], logs["resumed"][0]
    start = next(i for i, r in enumerate(whole) if (r["stage"], r["epoch"], r["batch"]) == at)
    # (a resume skips batches by index: the random draws of the skipped samples are not made)
    assert seen(resumed, draws=False) == seen(whole[start:], draws=False), \
        "after the resume, other batches than the uninterrupted run's"
    assert losses(resumed) == pytest.approx(losses(whole[start:]), rel=1e-5), "the loss did not continue"


# ------------------------------------------------------------------------------ Fabric

@pytest.mark.timeout(400)
@pytest.mark.parametrize("mode", ["dropin", "image"])
@pytest.mark.parametrize("devices", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_fabric_setup_dataloaders(tmp_path, folder, mode, devices):
    """Fabric.setup_dataloaders (a DistributedSampler with 2 processes, set_epoch per pass)."""
    job = {"framework": "fabric", "devices": devices, "strategy": "ddp" if devices > 1 else "auto"}
    got, want = run_both(tmp_path, folder, mode, job)
    check(mode, got, want, folder, devices, stages=("train",))


# ------------------------------------------------------------------------------ Accelerate

@pytest.mark.timeout(400)
@pytest.mark.parametrize("mode", ["dropin", "image"])
@pytest.mark.parametrize("processes", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_accelerate_prepare(tmp_path, folder, mode, processes):
    """accelerator.prepare(model, optimizer, loader), two epochs, then
    accelerator.skip_first_batches(loader, 2) for a third pass (in image mode, or what its
    error says to do instead); 2 processes under torchrun."""
    got, want = run_both(tmp_path, folder, mode, {"framework": "accelerate"}, torchrun=processes if processes > 1 else 0)
    if mode == "dropin":
        check_dropin(got, want)
        return
    check_image({r: [x for x in v if x["stage"] == "train"] for r, v in got.items()},
                {r: [x for x in v if x["stage"] == "train"] for r, v in want.items()}, folder, processes, ("train",))
    assert shape(got) == shape(want), "skip_first_batches: other batch counts than with a DataLoader"
    for rank in range(processes):
        skipped = [r["ids"] for r in got[rank] if r["stage"] == "skip"]
        assert skipped == standalone(folder, "train", EPOCHS, rank, processes)[2:], \
            f"rank {rank}: the next epoch's batches after the first 2 were not what skipping them gives"
        declined = tmp_path / "fastdata" / f"skip-error-rank{rank}.txt"
        if declined.exists():  # where skip_first_batches cannot serve image mode, it must say what will
            assert "load_state_dict" in declined.read_text(), declined.read_text()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["dropin", "image"])
def test_accelerate_mid_epoch_resume(tmp_path, folder, mode):
    """The prepared loader registered with register_for_checkpointing, save_state mid-epoch,
    load_state in a new Accelerator: the batches, and the losses, after that point are the
    uninterrupted run's."""
    job = {"framework": "accelerate", "mode": mode, "folder": str(folder), "loader": "fastdata"}
    logs = run_job(tmp_path, job, [{"name": "whole", "save_at": [0, 5]}, {"name": "resumed", "load_from": "whole"}])
    whole, resumed = logs["whole"][0], logs["resumed"][0]
    start = next(i for i, r in enumerate(whole) if (r["stage"], r["epoch"], r["batch"]) == ("train", 0, 6))
    assert seen(resumed, draws=False) == seen(whole[start:], draws=False), \
        "after load_state, other batches than the uninterrupted run's"
    assert losses(resumed) == pytest.approx(losses(whole[start:]), rel=1e-5), "the loss did not continue"
