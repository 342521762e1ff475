"""A Lightning script, as a user writes it: a LightningModule whose train_dataloader returns a
plain DataLoader over a Dataset whose samples encode their index; Trainer on one device, the
CPU (or the accelerator named by a second argument: gpu; or `ddp`: two CPU processes, gloo).
Writes the ids of each batch and the losses to the JSON file named by its first argument (under
ddp, each rank to that name plus `.rank<r>`). `--save DIR` keeps a checkpoint every 3 steps
there (one mid-epoch); `--resume PATH` resumes from one; `--workers N` sets num_workers=N."""

import json
import sys

import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Encoded(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.full((4,), i / 64.0), i % 2, i


class Module(pl.LightningModule):
    def __init__(self, workers: int = 0):
        super().__init__()
        self.workers = workers
        self.net = nn.Linear(4, 2)
        self.seen, self.losses = [], []

    def training_step(self, batch, k):
        x, y, ids = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.seen.append(ids.tolist())
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        kw = {"num_workers": self.workers} if self.workers else {}
        return DataLoader(Encoded(), batch_size=8, shuffle=True, **kw)


if __name__ == "__main__":
    pl.seed_everything(0)
    args = sys.argv[2:]
    module = Module(int(args[args.index("--workers") + 1]) if "--workers" in args else 0)
    how = args[0] if args and not args[0].startswith("--") else "cpu"
    devices = {"accelerator": "cpu", "devices": 2, "strategy": "ddp"} if how == "ddp" else {"accelerator": how, "devices": 1}
    save = args[args.index("--save") + 1] if "--save" in args else None
    resume = args[args.index("--resume") + 1] if "--resume" in args else None
    keep = [pl.callbacks.ModelCheckpoint(save, every_n_train_steps=3, save_top_k=-1)] if save else []
    trainer = pl.Trainer(**devices, max_epochs=2, logger=False, enable_checkpointing=bool(save),
                         callbacks=keep, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, ckpt_path=resume)
    if torch.distributed.is_initialized():  # as torch asks (Lightning destroys only an NCCL group at exit)
        torch.distributed.destroy_process_group()
    loader = trainer.train_dataloader
    with open(sys.argv[1] + (f".rank{trainer.global_rank}" if how == "ddp" else ""), "w") as f:
        json.dump({"ids": module.seen, "losses": module.losses, "loader": type(loader).__qualname__}, f)
