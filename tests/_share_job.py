"""The training jobs tests/contract/test_trainer_shares.py runs: each rank's share of the samples, the
way users write the script, under Lightning's Trainer (ddp, ddp_spawn), Fabric's
setup_dataloaders and Accelerate's prepare, on 2 processes (gloo on 127.0.0.1).

Run as `python tests/_share_job.py '<job as JSON>'` (tests/contract/test_frameworks.py's `run_job`
launches it; Accelerate's under torchrun). A job holds ONE loader kind, `loader`
("fastdata": `fastdata.loader(dataset, ...)`, or "dataloader": a plain DataLoader with the
same keywords), so that nothing of the other kind (a process group, seeds, a framework's
state) exists before this kind's first loader is made. Its runs go in turn in the same
processes, each with a loader made anew; a run is the job's keys with its own over them:
- framework ("lightning", "fabric", "accelerate"), strategy (Lightning: "ddp", "ddp_spawn"),
  epochs, batch_size, samples, seed, out;
- num_workers, persistent_workers;
- built: where the loader is made. Lightning: "hook" (inside train_dataloader()),
  "before_fit" (before the Trainer and fit(), and returned from train_dataloader()) or
  "fit_arg" (before the Trainer, and given to fit(model, loader)); Fabric:
  "launched" (in the launched function) or "before_launch"; Accelerate: "after" (after
  Accelerator()) or "before" (before it, so before the process group exists).

Each rank writes, per batch, a JSON line to <out>/<run name>/rank<r>.jsonl: the epoch, the
batch, the samples' ids, and which loader the framework iterated (its class, its sampler's,
its collate function's module, its len()).
"""

from __future__ import annotations

import faulthandler
import functools
import json
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

import fastdata
from _framework_job import leave_process_group  # this folder is sys.path[0] when the job runs


class Ids(Dataset):
    """Sample i is ([i], i % 2): every batch names its samples."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return torch.tensor([float(i)]), int(i) % 2


def make_loader(spec: dict):
    """The run's training loader, of the job's kind: what the user writes."""
    kw = dict(batch_size=spec["batch_size"], shuffle=True, num_workers=spec["num_workers"],
              persistent_workers=spec["persistent_workers"])
    make = fastdata.loader if spec["loader"] == "fastdata" else DataLoader
    return make(Ids(spec["samples"]), **kw)


def make_model() -> nn.Module:
    return nn.Linear(1, 2)


def describe(loader) -> dict:
    """Which loader a framework iterates: type() (not __class__, which Accelerate's wrapper
    forwards to the DataLoader it holds), its sampler's class, its collate function's module."""
    sampler = getattr(loader, "sampler", None)
    batch_sampler = getattr(loader, "batch_sampler", None)
    return {"cls": f"{type(loader).__module__}.{type(loader).__qualname__}",
            "sampler": type(sampler).__name__, "batch_sampler": type(batch_sampler).__name__,
            "collate": getattr(getattr(loader, "collate_fn", None), "__module__", None),
            "len": len(loader)}


class Log:
    """This rank's records for one run, one JSON line a batch, flushed at once."""

    def __init__(self, out: str) -> None:
        self.out, self.file, self.loader = out, None, {}

    def write(self, rank: int, epoch: int, batch: int, x: torch.Tensor) -> None:
        if self.file is None:
            self.file = open(os.path.join(self.out, f"rank{rank}.jsonl"), "a")
        record = {"epoch": epoch, "batch": batch, "ids": x[:, 0].round().long().tolist(), **self.loader}
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()

    def __getstate__(self) -> dict:
        return {**self.__dict__, "file": None}  # each process opens its own


def step(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x / 80), y)


# ------------------------------------------------------------------------------ Lightning

def lightning(spec: dict) -> None:
    """Trainer.fit on the CPU, the loader from train_dataloader(); made there or before fit()."""
    import pytorch_lightning as pl

    torch.manual_seed(spec["seed"])
    made = make_loader(spec) if spec["built"] in ("before_fit", "fit_arg") else None
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=spec["strategy"], max_epochs=spec["epochs"],
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=spec["out"])
    if spec["built"] == "fit_arg":
        trainer.fit(_lightning_module()(spec, None), made)
    else:
        trainer.fit(_lightning_module()(spec, made))


@functools.cache
def _lightning_module() -> type:
    """The LightningModule class, made on first use (the other jobs need not import Lightning)
    and reachable as this module's `Module`, which is how ddp_spawn pickles it."""
    import pytorch_lightning as pl

    class Module(pl.LightningModule):
        def __init__(self, spec: dict, made) -> None:
            super().__init__()
            self.spec, self.made, self.net, self.log_ = spec, made, make_model(), Log(spec["out"])

        def train_dataloader(self):
            return self.made if self.made is not None else make_loader(self.spec)

        def on_train_start(self):
            self.log_.loader = describe(self.trainer.train_dataloader)

        def training_step(self, batch, batch_idx):
            x, y = batch
            self.log_.write(self.global_rank, self.current_epoch, batch_idx, x)
            return step(self.net, x, y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    Module.__qualname__ = "Module"
    return Module


def __getattr__(name: str):
    if name == "Module":
        return _lightning_module()
    raise AttributeError(name)


# ------------------------------------------------------------------------------ Fabric

def fabric(job: dict, runs: list[dict]) -> None:
    """One Fabric (strategy "ddp": launch() starts rank 1), its runs in turn in the launched
    function, each loader through setup_dataloaders."""
    from lightning_fabric import Fabric

    made = {run["name"]: make_loader(run) for run in runs if run["built"] == "before_launch"}
    f = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    f.launch(_fabric_runs, runs, made)


def _fabric_runs(f, runs: list[dict], made: dict) -> None:
    for spec in runs:
        torch.manual_seed(spec["seed"])
        model = make_model()
        model, optimizer = f.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
        loader = made.pop(spec["name"], None)
        loader = f.setup_dataloaders(make_loader(spec) if loader is None else loader)
        log = Log(spec["out"])
        log.loader = describe(getattr(loader, "_dataloader", loader))
        for epoch in range(spec["epochs"]):
            for k, (x, y) in enumerate(loader):
                optimizer.zero_grad()
                f.backward(step(model, x, y))
                optimizer.step()
                log.write(f.global_rank, epoch, k, x)
        f.barrier()


# ------------------------------------------------------------------------------ Accelerate

def accelerate(job: dict, runs: list[dict]) -> None:
    """One Accelerator (under torchrun), its runs in turn, each loader through prepare()."""
    from accelerate import Accelerator

    made = {}
    for spec in runs:
        if spec["built"] == "before":
            torch.manual_seed(spec["seed"])
            made[spec["name"]] = make_loader(spec)
    acc = Accelerator(cpu=True)
    for spec in runs:
        torch.manual_seed(spec["seed"])
        model = make_model()
        loader = made.pop(spec["name"], None)
        loader = make_loader(spec) if loader is None else loader
        model, optimizer, loader = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), loader)
        log = Log(spec["out"])
        log.loader = describe(loader)
        for epoch in range(spec["epochs"]):
            for k, (x, y) in enumerate(loader):
                optimizer.zero_grad()
                acc.backward(step(model, x, y))
                optimizer.step()
                log.write(acc.process_index, epoch, k, x)
        acc.wait_for_everyone()


def main(job: dict) -> None:
    runs = [{**job, **run, "out": os.path.join(job["out"], run["name"])} for run in job["runs"]]
    for spec in runs:
        os.makedirs(spec["out"], exist_ok=True)
    if job["framework"] == "lightning":
        for spec in runs:
            print(f"== run {spec['name']}", flush=True)
            lightning(spec)
    else:
        {"fabric": fabric, "accelerate": accelerate}[job["framework"]](job, runs)
    leave_process_group()

if __name__ == "__main__":
    # A job that hangs prints each rank's stacks before the test's time limit kills it
    faulthandler.dump_traceback_later(250, exit=False)
    main(json.loads(sys.argv[1]))
