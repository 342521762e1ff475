"""The training jobs tests/contract/test_frameworks.py runs: one small training loop under Lightning's
Trainer, Fabric or Accelerate, fed by a plain DataLoader or by fastdata.loader with the same
keywords, and writing what each rank saw, batch by batch, to <out>/<run>/rank<r>.jsonl.

Run as `python tests/_framework_job.py '<job as JSON>'`; the DDP launchers of Lightning and
Fabric re-run that same command for rank 1, and Accelerate's 2-process case runs it under
torchrun. A job makes its runs in turn in the same processes (imports and process groups are
the slow part); a run is the job's keys with its own over them:
- framework ("lightning", "fabric", "accelerate"), loader ("dataloader", "fastdata"), mode
  ("dropin": a Dataset whose samples hold their index; "image": a folder of images whose
  pixels encode it; folder and per_class say which), devices, strategy, epochs, batch_size,
  num_workers, out;
- Lightning: built ("hooks": the loaders come from train_dataloader()/val_dataloader();
  "before_fit": they are made before the process group exists and passed to fit()), reload
  (reload_dataloaders_every_n_epochs), seed_workers (seed_everything(workers=True)), ckpt_every (a checkpoint every k steps),
  ckpt_epochs (a checkpoint at each epoch's end), resume_step (fit from the checkpoint an
  earlier run, the one named resume_from if several, took at that step);
- Accelerate: save_at, load_from (see `accelerate`).
"""

from __future__ import annotations

import functools
import glob
import json
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

import fastdata
from fastdata import transforms as T

TRAIN = 40  # drop-in samples 0..39 train; VAL_FIRST.. validate
VAL_FIRST, VAL = 100, 12
SIDE = 8  # image mode: every image becomes SIDE x SIDE


class Indexed(Dataset):
    """Sample i: ([its id x3, a random draw], id % 2): any batch names its samples, and the draw
    (which the model does not see) shows the RNG state the dataset ran with (in a worker: the
    worker's seeding)."""

    def __init__(self, n: int, first: int = 0) -> None:
        self.n, self.first = n, first

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        j = self.first + int(i)
        return torch.tensor([j, j, j, torch.rand(()).item()]), j % 2


class Folder(Dataset):
    """An ImageFolder as a plain map-style Dataset (sorted classes, sorted files), each image
    resized to uint8 CHW SIDE x SIDE: what a DataLoader user would write for image mode."""

    def __init__(self, root: str) -> None:
        classes = sorted(os.listdir(root))
        self.items = [(os.path.join(root, c, f), label) for label, c in enumerate(classes)
                      for f in sorted(os.listdir(os.path.join(root, c)))]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        from PIL import Image

        path, label = self.items[i]
        with Image.open(path) as im:
            pixels = im.convert("RGB").resize((SIDE, SIDE))
        return torch.frombuffer(bytearray(pixels.tobytes()), dtype=torch.uint8).view(SIDE, SIDE, 3).permute(2, 0, 1), label


def make_loader(spec: dict, stage: str):
    """The loader for `stage` ("train": shuffled; "val": in order), of the spec's kind."""
    kw = dict(batch_size=spec["batch_size"], shuffle=stage == "train", num_workers=spec["num_workers"])
    if spec["mode"] == "dropin":
        data = Indexed(TRAIN) if stage == "train" else Indexed(VAL, VAL_FIRST)
        return fastdata.loader(data, **kw) if spec["loader"] == "fastdata" else DataLoader(data, **kw)
    if spec["loader"] == "fastdata":
        return fastdata.loader(spec["folder"], transform=T.Compose([T.Resize(SIDE), T.CenterCrop(SIDE)]),
                               device="cpu", **kw)
    return DataLoader(Folder(spec["folder"]), **kw)


def make_model(spec: dict) -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(3 if spec["mode"] == "dropin" else 3 * SIDE * SIDE, 2)


def features(spec: dict, x: torch.Tensor) -> torch.Tensor:
    return x[:, :3] / TRAIN if spec["mode"] == "dropin" else x.float().flatten(1) / 255


def sample_ids(spec: dict, x: torch.Tensor, y: torch.Tensor) -> list[int]:
    """The ids of a batch's samples, read from the data; in image mode the pixels also say
    the class, which must be the label."""
    if spec["mode"] == "dropin":
        return x[:, 0].round().long().tolist()
    px = x.float()
    cls = torch.round((px[:, 0].mean((1, 2)) - 20) / 40).long()
    num = torch.round((px[:, 1].mean((1, 2)) - 10) / 12).long()
    if not torch.equal(cls, y.cpu()):
        raise AssertionError(f"labels {y.tolist()} do not match the images' classes {cls.tolist()}")
    return (cls * spec["per_class"] + num).tolist()


class Log:
    """This rank's records, one JSON line a batch, flushed at once (a killed run keeps them)."""

    def __init__(self, spec: dict) -> None:
        self.spec, self.file = spec, None

    def write(self, rank: int, stage: str, epoch: int, batch: int, x: torch.Tensor, y: torch.Tensor,
              loss: float | None = None) -> None:
        if self.file is None:
            self.file = open(os.path.join(self.spec["out"], f"rank{rank}.jsonl"), "a")
        record = {"stage": stage, "epoch": epoch, "batch": batch, "ids": sample_ids(self.spec, x, y), "loss": loss,
                  "draws": x[:, 3].tolist() if self.spec["mode"] == "dropin" else None}
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()

    def note(self, rank: int, what: str, loader: object) -> None:
        """Which class a framework iterates, in <out>/loaders-rank<r>.txt (for reading, not tested)."""
        with open(os.path.join(self.spec["out"], f"loaders-rank{rank}.txt"), "a") as f:
            f.write(f"{what}: {type(loader).__module__}.{type(loader).__qualname__}\n")

    def __getstate__(self) -> dict:
        return {"spec": self.spec, "file": None}  # each process opens its own


# ------------------------------------------------------------------------------ Lightning

def lightning(spec: dict) -> None:
    """Trainer.fit with validation every epoch, on the CPU (gloo under DDP)."""
    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import ModelCheckpoint

    pl.seed_everything(0, workers=spec.get("seed_workers", False))
    callbacks = []
    if spec.get("ckpt_every"):
        callbacks.append(ModelCheckpoint(dirpath=os.path.join(spec["out"], "ckpt"),
                                         every_n_train_steps=spec["ckpt_every"], save_top_k=-1))
    if spec.get("ckpt_epochs"):
        callbacks.append(ModelCheckpoint(dirpath=os.path.join(spec["out"], "ckpt"), every_n_epochs=1, save_top_k=-1,
                                         save_on_train_epoch_end=True))
    trainer = pl.Trainer(accelerator="cpu", devices=spec["devices"], strategy=spec.get("strategy", "auto"),
                         max_epochs=spec["epochs"], logger=False, enable_checkpointing=bool(callbacks),
                         callbacks=callbacks, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, default_root_dir=spec["out"],
                         reload_dataloaders_every_n_epochs=spec.get("reload", 0))
    module = _lightning_module()(spec)
    if spec.get("built") == "before_fit":
        trainer.fit(module, make_loader(spec, "train"), make_loader(spec, "val"), ckpt_path=spec.get("ckpt_path"))
    else:
        trainer.fit(module, ckpt_path=spec.get("ckpt_path"))


@functools.cache
def _lightning_module() -> type:
    """The LightningModule class, made on first use (so that the other jobs need not import
    Lightning) and reachable as this module's `Module`, which is how ddp_spawn pickles it."""
    import pytorch_lightning as pl

    class Module(pl.LightningModule):
        """The job as a LightningModule; its loaders come from the hooks unless given to fit()."""

        def __init__(self, spec: dict) -> None:
            super().__init__()
            self.spec, self.net, self.log_ = spec, make_model(spec), Log(spec)

        def on_train_start(self):
            self.log_.note(self.global_rank, "train", self.trainer.train_dataloader)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = F.cross_entropy(self.net(features(self.spec, x)), y)
            self.log_.write(self.global_rank, "train", self.current_epoch, batch_idx, x, y, loss.item())
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log_.write(self.global_rank, "val", self.current_epoch, batch_idx, x, y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):
            return make_loader(self.spec, "train")

        def val_dataloader(self):
            return make_loader(self.spec, "val")

    Module.__qualname__ = "Module"
    return Module


def __getattr__(name: str):
    if name == "Module":
        return _lightning_module()
    raise AttributeError(name)


# ------------------------------------------------------------------------------ Fabric

def fabric(spec: dict) -> None:
    """A Fabric loop over setup_dataloaders' loader (launch starts rank 1 for strategy="ddp")."""
    from lightning_fabric import Fabric

    f = Fabric(accelerator="cpu", devices=spec["devices"], strategy=spec.get("strategy", "auto"))
    f.launch(_fabric_run, spec)


def _fabric_run(f, spec: dict) -> None:
    f.seed_everything(0)
    model = make_model(spec)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = f.setup(model, optimizer)
    made = make_loader(spec, "train")
    try:
        loader = f.setup_dataloaders(made)
    except TypeError:
        # image mode is no DataLoader, which Fabric rejects: iterated as it is, it splits by rank
        # and sets its epoch itself (the README's way with Fabric)
        if spec["loader"] != "fastdata" or spec["mode"] != "image":
            raise
        loader = made
    log = Log(spec)
    log.note(f.global_rank, "setup_dataloaders", getattr(loader, "_dataloader", loader))
    for epoch in range(spec["epochs"]):
        for k, (x, y) in enumerate(loader):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(features(spec, x)), y)
            f.backward(loss)
            optimizer.step()
            log.write(f.global_rank, "train", epoch, k, x, y, loss.item())


# ------------------------------------------------------------------------------ Accelerate

def accelerate(spec: dict) -> None:
    """An Accelerate loop; after the epochs, `skip_first_batches(loader, 2)` for one more pass
    (what a mid-epoch resume does), recorded as stage "skip". With save_at [epoch, batch], the
    prepared loader is registered for checkpointing and `save_state` runs after that batch; a
    run with load_from (an earlier run's name) does `load_state` from it and goes on from there."""
    from accelerate import Accelerator

    acc = Accelerator(cpu=True)
    model = make_model(spec)
    if spec["loader"] == "fastdata" and spec["mode"] == "dropin" and ("save_at" in spec or "load_from" in spec):
        # prepare() would rebuild the drop-in as Accelerate's own DataLoader, whose state
        # save_state cannot take (as with a plain DataLoader): for an exact mid-epoch resume the
        # README registers fastdata's loader unprepared (one process here; with more, give it
        # a DistributedSampler)
        model, optimizer = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
        loader = make_loader(spec, "train")
    else:
        model, optimizer, loader = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                               make_loader(spec, "train"))
    log = Log(spec)
    log.note(acc.process_index, "prepare", loader)
    first_epoch, first_batch = 0, 0
    if "save_at" in spec or "load_from" in spec:
        acc.register_for_checkpointing(loader)
    if "load_from" in spec:
        saved = os.path.join(os.path.dirname(spec["out"]), spec["load_from"], "state")
        acc.load_state(saved)
        with open(os.path.join(saved, "where.json")) as f:
            epoch, batch = json.load(f)
        first_epoch, first_batch = epoch, batch + 1
    for epoch in range(first_epoch, spec["epochs"]):
        for k, (x, y) in enumerate(loader, start=first_batch if epoch == first_epoch else 0):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(features(spec, x)), y)
            acc.backward(loss)
            optimizer.step()
            log.write(acc.process_index, "train", epoch, k, x, y, loss.item())
            if spec.get("save_at") == [epoch, k]:
                acc.save_state(os.path.join(spec["out"], "state"))
                if acc.is_main_process:
                    with open(os.path.join(spec["out"], "state", "where.json"), "w") as f:
                        json.dump([epoch, k], f)
    try:
        skipped = acc.skip_first_batches(loader, 2)
    except AttributeError as e:
        # image mode declines (it has no Dataset to rebuild a DataLoader from); its error says
        # what to do instead, which is what this does then
        if spec["loader"] != "fastdata" or spec["mode"] != "image":
            raise
        with open(os.path.join(spec["out"], f"skip-error-rank{acc.process_index}.txt"), "w") as f:
            f.write(str(e))
        loader.load_state_dict({**loader.state_dict(), "epoch": spec["epochs"], "batches": 2})
        skipped = loader
    log.note(acc.process_index, "skip_first_batches", skipped)
    for k, (x, y) in enumerate(skipped, start=2):
        log.write(acc.process_index, "skip", spec["epochs"], k, x, y)


def main(job: dict) -> None:
    """Runs the job's runs in turn, in this process (and, under DDP, in each rank's): a run's
    keys override the job's, and it writes to <out>/<its name>/."""
    framework = {"lightning": lightning, "fabric": fabric, "accelerate": accelerate}[job["framework"]]
    for run in job["runs"]:
        spec = {**job, **run, "out": os.path.join(job["out"], run["name"])}
        os.makedirs(spec["out"], exist_ok=True)
        if "resume_step" in spec:  # the checkpoint an earlier run took at that step
            (spec["ckpt_path"],) = glob.glob(os.path.join(job["out"], spec.get("resume_from", "*"), "ckpt", f"*-step={spec['resume_step']}.ckpt"))
        print(f"== run {run['name']}", flush=True)
        framework(spec)
    leave_process_group()


def leave_process_group() -> None:
    """Under DDP, the rank's exit once its records are written."""
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
        # The process group outlives that call while the framework's objects (a DDP model's
        # reducer) still hold it, so its gloo threads are still live when the interpreter
        # finalizes; one still freeing a finished collective's tensors then needs the GIL and
        # aborts the process ("terminate called without an active exception", in
        # ProcessGroupGloo::runLoop; pytorch/pytorch#190489). Every record is already written
        # and flushed, so the rank leaves here, before finalization.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _leave_spawned_rank() -> None:
    """In a rank that ddp_spawn started (this file imported as the spawned process's main
    module, before its target is unpickled): the rank leaves as `leave_process_group` does once
    its function has returned (its records written, rank 0's results put in Lightning's
    SimpleQueue, which writes before it returns). A rank whose function failed exits as torch's
    `_wrap` has it exit (its error written to the file the parent reads, then exit code 1)."""
    import importlib

    spawn = importlib.import_module("torch.multiprocessing.spawn")  # (the package's `spawn` is its function)
    wrap = spawn._wrap

    def wrapped(*args, **kwargs):
        wrap(*args, **kwargs)
        leave_process_group()

    spawn._wrap = wrapped


if __name__ == "__mp_main__":
    _leave_spawned_rank()

if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
