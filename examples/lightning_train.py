"""train.py's job as a LightningModule: the same ResNet on an image folder, fed by fastdata.

    python examples/lightning_train.py --data /path/to/train --checkpoint-dir run
    python examples/lightning_train.py --data /path/to/train --checkpoint-dir run --devices 2
    python examples/lightning_train.py --data /path/to/train --checkpoint-dir run --devices 2 --resume

With --devices 2 the Trainer runs DDP and starts the other process itself (no torchrun). On GPUs:
NCCL and bf16-mixed; on CPU: gloo in float32; channels_last on both. Every --steps-per-checkpoint
steps and at the end, --checkpoint-dir/last.ckpt is rewritten; besides the model and the
optimizer it holds the loader's position (Lightning saves a loader's state_dict() with its
loops), so --resume goes on with the batch after the checkpoint, mid-epoch too. --data and the
synthetic default are as in train.py, which holds the model.
"""

import argparse
import json
import os
import time

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from pytorch_lightning.callbacks import Callback, ModelCheckpoint

import fastdata
from fastdata.sources import image_folder
from train import Parser, at_least, check_paths, positive_float, resnet, workers  # this folder is sys.path[0]


class ImageFolderData(pl.LightningDataModule):
    """A fastdata image loader over an ImageFolder, or over the synthetic set when `folder` is
    None. The loader is made in setup(), on every process once the process group exists, so
    each rank reads its own share of every epoch; the Trainer calls its sampler's set_epoch."""

    def __init__(self, folder: str | None, batch_size: int, image_size: int, workers: int | str, seed: int) -> None:
        super().__init__()
        if folder is None:
            from fastdata.synthetic import default_root

            folder = str(default_root())
            self.synthetic = True
        else:
            self.synthetic = False
        self.folder, self.batch_size, self.image_size, self.workers, self.seed = (
            folder, batch_size, image_size, workers, seed)
        self.loader = None

    def prepare_data(self) -> None:
        """One process a machine; the others wait."""
        if self.synthetic:
            from fastdata.synthetic import make_imagenet_like

            make_imagenet_like(self.folder, n_images=2000, progress=True)

    def setup(self, stage: str) -> None:
        if self.loader is None:
            self.loader = fastdata.loader(self.folder, batch_size=self.batch_size, shuffle=True,
                                          num_workers=self.workers, seed=self.seed,
                                          transform=fastdata.transforms.imagenet_train(self.image_size),
                                          device=self.trainer.strategy.root_device)
        self.num_classes = self.loader.num_classes

    def train_dataloader(self):
        return self.loader


class ImageClassifier(pl.LightningModule):
    """train.py's ResNet, loss and optimizer. The network is made in configure_model(), once
    the data module knows the number of classes."""

    def __init__(self, lr: float, seed: int, log_samples: str | None = None) -> None:
        super().__init__()
        self.lr, self.seed, self.log_samples = lr, seed, log_samples
        self.net = None
        self.last_loss = torch.tensor(float("nan"))
        self._log = None

    def configure_model(self) -> None:
        if self.net is not None:  # called again by each fit/validate/test
            return
        torch.manual_seed(self.seed)  # reproducible weights (DDP starts every rank from rank 0's)
        # channels_last as the loader's images: no layout change in the convolutions.
        self.net = resnet(self.trainer.datamodule.num_classes).to(memory_format=torch.channels_last)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9, weight_decay=5e-5)

    def training_step(self, batch, batch_idx):
        images, labels = batch
        loss = F.cross_entropy(self.net(images), labels)
        self.last_loss = loss.detach()
        self._seen += len(labels)
        self.log("loss", loss, prog_bar=True)
        if self.log_samples:
            if self._log is None:
                self._log = open(f"{self.log_samples}.{self.global_rank}", "a")
            # global_step counts the optimizer steps before this one: train.py's step numbers.
            self._log.write(json.dumps({"epoch": self.current_epoch, "step": self.global_step + 1,
                                        "loss": loss.item(), "labels": labels.tolist(),
                                        "means": images.float().mean((2, 3)).tolist()}) + "\n")
            self._log.flush()
        return loss

    def on_train_start(self) -> None:
        self.on_train_epoch_start()  # a resume mid-epoch starts no epoch: its rate counts from here

    def on_train_epoch_start(self) -> None:
        self._epoch_start, self._seen = time.perf_counter(), 0

    def on_train_epoch_end(self) -> None:
        rate = self._seen * self.trainer.world_size / (time.perf_counter() - self._epoch_start)
        self.print(f"epoch {self.current_epoch}: loss {self.last_loss.item():.4f}, {rate:.0f} images/s")

    def on_train_end(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["loss"] = self.last_loss.item()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.print(f"resumed from {self.trainer.ckpt_path}: step {checkpoint['global_step']}, "
                   f"loss {checkpoint['loss']:.4f}")


class FinalCheckpoint(Callback):
    """last.ckpt at the end of training too, when steps ran after ModelCheckpoint's last save.
    Saved here, not after fit(): by then the loader's pass has ended, and its state points at
    the next epoch."""

    def __init__(self, path: str, every: int) -> None:
        self.path, self.every = path, every

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.global_step % self.every:
            trainer.save_checkpoint(self.path)


def main() -> None:
    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", help="an ImageFolder (default: the synthetic set of the README's first command, "
                                   "~/.cache/fastdata/demo-imagenet-like)")
    ap.add_argument("--devices", type=at_least(1), default=max(torch.cuda.device_count(), 1),
                    help="processes on this machine (default: one a GPU, else 1)")
    ap.add_argument("--epochs", type=at_least(1), default=10)
    ap.add_argument("--batch-size", type=at_least(1), default=128, help="per process")
    ap.add_argument("--lr", type=positive_float, default=0.1)
    ap.add_argument("--image-size", type=at_least(1), default=176)
    ap.add_argument("--workers", default="auto", type=workers)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--checkpoint-dir", default="checkpoints", help="last.ckpt and Lightning's logs")
    ap.add_argument("--steps-per-checkpoint", type=at_least(1), default=100)
    ap.add_argument("--resume", action="store_true", help="go on from --checkpoint-dir/last.ckpt, if it exists")
    ap.add_argument("--log-samples", help="each rank appends a JSON line a step to FILE.RANK: epoch, step, "
                    "loss, labels and each image's mean per channel (which samples it trained on)")
    args = ap.parse_args()
    check_paths(ap, args.data, ("--log-samples", args.log_samples))
    if args.data is not None:
        # the loader is made in setup(), inside fit(): a folder it would refuse is refused here,
        # in one line, not as a traceback from the Trainer
        try:
            image_folder(args.data)
        except (OSError, ValueError) as e:
            ap.error(f"--data: {e}")

    gpu = torch.cuda.is_available()
    data = ImageFolderData(args.data, args.batch_size, args.image_size, args.workers, args.seed)
    model = ImageClassifier(args.lr, args.seed, args.log_samples)
    # save_top_k=0: no numbered copies, only last.ckpt, rewritten at each checkpoint.
    checkpoints = [ModelCheckpoint(dirpath=args.checkpoint_dir, every_n_train_steps=args.steps_per_checkpoint,
                                   save_top_k=0, save_last=True),
                   FinalCheckpoint(os.path.join(args.checkpoint_dir, "last.ckpt"), args.steps_per_checkpoint)]
    trainer = pl.Trainer(accelerator="gpu" if gpu else "cpu", devices=args.devices,
                         strategy="ddp" if args.devices > 1 else "auto",
                         precision="bf16-mixed" if gpu else "32-true", max_epochs=args.epochs,
                         callbacks=checkpoints, default_root_dir=args.checkpoint_dir)
    # "last": the newest last.ckpt under --checkpoint-dir; none yet starts from scratch.
    trainer.fit(model, datamodule=data, ckpt_path="last" if args.resume else None)
    # torch asks each process to destroy its process group before it exits, and Lightning does
    # only NCCL's: a gloo group left to the interpreter's exit may still hold work whose tensors
    # need the GIL as it goes, and the process aborts ("terminate called without an active exception").
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
