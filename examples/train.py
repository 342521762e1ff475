"""Train a small ResNet on an image folder with fastdata, on one process or several (torchrun).

    python examples/train.py --data /path/to/train --checkpoint run.pt
    torchrun --nproc_per_node 2 examples/train.py --data /path/to/train --checkpoint run.pt
    torchrun --nproc_per_node 2 examples/train.py --data /path/to/train --checkpoint run.pt --resume

--data is an ImageFolder (one folder per class); without it, the synthetic ImageNet-like set of
the README's first command (~/.cache/fastdata/demo-imagenet-like), made here if it is not there.
On GPUs: DDP over NCCL and bf16 autocast; on CPU: DDP over gloo in float32; channels_last on both. The checkpoint holds the model, the optimizer and the
loader's position, so --resume goes on with the batch after the last checkpoint, mid-epoch too.
`num_workers="auto"` takes the config `fastdata-profile --tune` chose for this data, if any.
"""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import fastdata


class BasicBlock(nn.Module):
    """ResNet's two 3x3 convolutions with a skip connection (1x1 where the shape changes)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        nn.init.zeros_(self.bn2.weight)  # the block starts as the identity: the first steps train faster
        self.skip = nn.Identity()
        if stride != 1 or cin != cout:
            self.skip = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.skip(x))


def resnet(num_classes: int, widths: tuple[int, ...] = (32, 64, 128, 256)) -> nn.Module:
    """ResNet-18's layout (two blocks a stage) at half its width."""
    layers = [nn.Conv2d(3, widths[0], 3, 2, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU(inplace=True)]
    cin = widths[0]
    for i, width in enumerate(widths):
        layers += [BasicBlock(cin, width, 1 if i == 0 else 2), BasicBlock(width, width, 1)]
        cin = width
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes))


def save(path: str, checkpoint: dict) -> None:
    """Written whole or not at all: a kill mid-write leaves the previous checkpoint."""
    torch.save(checkpoint, path + ".tmp")
    os.replace(path + ".tmp", path)


class Parser(argparse.ArgumentParser):
    """argparse, with a bad argument answered in one line (no usage block), exit 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def at_least(minimum: int):
    """An argparse type: an integer >= minimum."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"should be an integer >= {minimum}, but got {text!r}")
        return value
    return parse


def positive_float(text: str) -> float:
    """An argparse type: a number > 0."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"should be a number > 0, but got {text!r}")
    return value


def workers(text: str) -> int | str:
    """An argparse type: num_workers, "auto" or an integer >= 0."""
    if text == "auto":
        return text
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"should be 'auto' or an integer >= 0, but got {text!r}")
    return int(text)


def check_paths(ap: argparse.ArgumentParser, data: str | None, *outputs: tuple[str, str | None]) -> None:
    """A one-line error (exit 2) for a --data that is not a folder, or an output file (flag,
    path) whose folder does not exist: before any process group, model or loader is made."""
    if data is not None and not os.path.exists(data):
        ap.error(f"--data {data!r} does not exist")
    if data is not None and not os.path.isdir(data):
        ap.error(f"--data {data!r} is not a folder (an ImageFolder: root/<class>/<image>)")
    for flag, path in outputs:
        folder = os.path.dirname(os.path.abspath(path)) if path else None
        if folder and not os.path.isdir(folder):
            ap.error(f"{flag} {path!r} cannot be written: its folder {folder!r} does not exist")


def main() -> None:
    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", help="an ImageFolder (default: the synthetic set of the README's first command, "
                                   "~/.cache/fastdata/demo-imagenet-like)")
    ap.add_argument("--epochs", type=at_least(1), default=10)
    ap.add_argument("--batch-size", type=at_least(1), default=128, help="per process")
    ap.add_argument("--lr", type=positive_float, default=0.1)
    ap.add_argument("--image-size", type=at_least(1), default=176)
    ap.add_argument("--workers", default="auto", type=workers)
    ap.add_argument("--on-error", choices=("raise", "skip"), default="raise",
                    help="skip: leave unreadable images out, counted (default: stop at the first, naming it)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--checkpoint", default="checkpoint.pt")
    ap.add_argument("--steps-per-checkpoint", type=at_least(1), default=100)
    ap.add_argument("--resume", action="store_true", help="go on from --checkpoint, if it exists")
    ap.add_argument("--max-steps", type=at_least(0), default=0, help="stop after this many steps in all (0: no limit)")
    ap.add_argument("--log-samples", help="each rank appends a JSON line a step to FILE.RANK: epoch, step, "
                    "loss, labels and each image's mean per channel (which samples it trained on)")
    args = ap.parse_args()
    check_paths(ap, args.data, ("--checkpoint", args.checkpoint), ("--log-samples", args.log_samples))

    distributed = "RANK" in os.environ  # started by torchrun
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if distributed:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank = dist.get_rank() if distributed else 0

    folder = args.data
    if folder is None:
        from fastdata.synthetic import default_root, make_imagenet_like

        folder = str(default_root())
        if int(os.environ.get("LOCAL_RANK", 0)) == 0:  # one a machine; the others wait at the barrier
            make_imagenet_like(folder, n_images=2000, progress=True)
    if distributed:
        dist.barrier()

    # Made after init_process_group: each rank gets its own share of every epoch.
    try:
        loader = fastdata.loader(folder, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                                 transform=fastdata.transforms.imagenet_train(args.image_size), device=device,
                                 seed=args.seed, on_error=args.on_error)
    except (OSError, ValueError, fastdata.DataError) as e:  # a folder without classes or images, say
        ap.error(f"--data: {e}")
    torch.manual_seed(args.seed)  # reproducible weights (DDP starts every rank from rank 0's)
    # channels_last as the loader's images: no layout change in the convolutions.
    model = resnet(loader.num_classes).to(device, memory_format=torch.channels_last)
    ddp = DistributedDataParallel(model) if distributed else model
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-5)

    epoch, step = 0, 0
    if args.resume and os.path.exists(args.checkpoint):
        saved = torch.load(args.checkpoint, map_location=device, weights_only=True)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        loader.load_state_dict(saved["loader"])  # the next pass starts after its batches
        epoch, step = saved["epoch"], saved["step"]
        if rank == 0:
            print(f"resumed from {args.checkpoint}: step {step}, loss {saved['loss']:.4f}", flush=True)
    log = open(f"{args.log_samples}.{rank}", "a") if args.log_samples else None

    def save_checkpoint(loss: float) -> None:
        # Every rank stands at the same batch of the epoch, and its share of the epoch follows
        # from (seed, epoch, rank), so rank 0's loader state is every rank's.
        state = loader.state_dict()  # taken mid-pass: the pass's position, not the next epoch
        save(args.checkpoint, {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "loader": state,
                               "epoch": state["epoch"], "step": step, "loss": loss})
        print(f"step {step}: loss {loss:.4f}, checkpoint saved", flush=True)

    last = args.max_steps or float("inf")
    while epoch < args.epochs and step < last:
        loader.set_epoch(epoch)  # the epoch of the loader's resume point keeps that point
        t0, seen = time.perf_counter(), 0
        for images, labels in loader:
            with torch.autocast(device.type, torch.bfloat16, enabled=device.type == "cuda"):
                loss = F.cross_entropy(ddp(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            seen += len(labels)
            if log:
                log.write(json.dumps({"epoch": epoch, "step": step, "loss": loss.item(), "labels": labels.tolist(),
                                      "means": images.float().mean((2, 3)).tolist()}) + "\n")
                log.flush()
            if rank == 0 and (step % args.steps_per_checkpoint == 0 or step == last):
                save_checkpoint(loss.item())
            if step == last:
                break
        else:  # the epoch ran to its end
            if rank == 0:
                rate = seen * (dist.get_world_size() if distributed else 1) / (time.perf_counter() - t0)
                print(f"epoch {epoch}: loss {loss.item():.4f}, {rate:.0f} images/s", flush=True)
            epoch += 1
            if rank == 0 and epoch == args.epochs and step % args.steps_per_checkpoint:
                save_checkpoint(loss.item())
    if log:
        log.close()
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
