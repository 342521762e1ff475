"""The loop structure of the PyTorch ImageNet example (pytorch/examples, imagenet/main.py), as a
user's copy of it runs: argparse (data, -j, -b, --epochs, --lr, --seed, --gpu), an ImageFolder of
JPEG files under data/train and data/val, the transforms (a random flip, which draws from
torch's global RNG, on the train side; resize, center crop, to-tensor, normalize), train and val
DataLoaders with pin_memory=True and num_workers=args.workers, train()/validate() with
AverageMeter/ProgressMeter, accuracy(). torchvision is not needed: the dataset and the
transforms are written here with PIL and torch, as torchvision's do them.

Each image's red and green name its class and number (tests/_images.py: red = 40 * class + 20,
green = 12 * number + 10) and its blue is dark on the left half, bright on the right, so the
script reads each sample's id (100 * class + number) back from the pixels of the batch it trained
on, checks the label against the color, and sees whether the random flip (drawn in the workers,
with -j > 0) turned it. It writes to the JSON file named by --out the ids and flips of each batch,
the train losses (loss.item()), and val's ids, losses and top-1 accuracy."""

import argparse
import json
import os
import random
import time
from enum import Enum

import numpy as np
import torch
import torch.backends.cudnn as cudnn
import torch.nn as nn
import torch.utils.data
from PIL import Image

parser = argparse.ArgumentParser(description="PyTorch ImageNet Training (its loop, on a tiny folder)")
parser.add_argument("data", metavar="DIR", help="path to dataset (with train/ and val/)")
parser.add_argument("-j", "--workers", default=4, type=int, metavar="N", help="number of data loading workers")
parser.add_argument("--epochs", default=2, type=int, metavar="N")
parser.add_argument("-b", "--batch-size", default=8, type=int, metavar="N")
parser.add_argument("--lr", "--learning-rate", default=0.1, type=float, metavar="LR", dest="lr")
parser.add_argument("--momentum", default=0.9, type=float, metavar="M")
parser.add_argument("--wd", "--weight-decay", default=1e-4, type=float, metavar="W", dest="weight_decay")
parser.add_argument("-p", "--print-freq", default=2, type=int, metavar="N")
parser.add_argument("--seed", default=None, type=int)
parser.add_argument("--gpu", default=None, type=int, help="GPU id to use (the example's .cuda(args.gpu) path)")
parser.add_argument("--out", required=True, help="where the JSON record goes")

MEAN = torch.tensor([0.485, 0.456, 0.406])
STD = torch.tensor([0.229, 0.224, 0.225])


# -- what torchvision.datasets.ImageFolder and torchvision.transforms do, by hand ---------------

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png")


def pil_loader(path):
    with open(path, "rb") as f:
        img = Image.open(f)
        return img.convert("RGB")


class ImageFolder(torch.utils.data.Dataset):
    """root/class_x/xxx.jpg: classes sorted, samples sorted within a class (as torchvision's)."""

    def __init__(self, root, transform=None):
        self.classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
        self.class_to_idx = {c: k for k, c in enumerate(self.classes)}
        self.samples = [(os.path.join(root, c, name), self.class_to_idx[c]) for c in self.classes
                        for name in sorted(os.listdir(os.path.join(root, c))) if name.lower().endswith(IMG_EXTENSIONS)]
        self.targets = [s[1] for s in self.samples]
        self.transform = transform

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        path, target = self.samples[index]
        sample = pil_loader(path)
        if self.transform is not None:
            sample = self.transform(sample)
        return sample, target


class Compose:
    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, img):
        for t in self.transforms:
            img = t(img)
        return img


class Resize:
    """The shorter side to `size`, the aspect kept (bilinear)."""

    def __init__(self, size):
        self.size = size

    def __call__(self, img):
        w, h = img.size
        if w <= h:
            ow, oh = self.size, int(self.size * h / w)
        else:
            ow, oh = int(self.size * w / h), self.size
        return img.resize((ow, oh), Image.BILINEAR)


class CenterCrop:
    def __init__(self, size):
        self.size = size

    def __call__(self, img):
        w, h = img.size
        left, top = int(round((w - self.size) / 2.0)), int(round((h - self.size) / 2.0))
        return img.crop((left, top, left + self.size, top + self.size))


class RandomHorizontalFlip:
    """torchvision's: one draw from torch's global RNG per sample."""

    def __init__(self, p=0.5):
        self.p = p

    def __call__(self, img):
        if torch.rand(1) < self.p:
            return img.transpose(Image.FLIP_LEFT_RIGHT)
        return img


class ToTensor:
    def __call__(self, img):
        return torch.from_numpy(np.array(img, dtype=np.uint8)).permute(2, 0, 1).contiguous().float().div(255)


class Normalize:
    def __init__(self, mean, std):
        self.mean, self.std = torch.as_tensor(mean)[:, None, None], torch.as_tensor(std)[:, None, None]

    def __call__(self, tensor):
        return (tensor - self.mean) / self.std


# -- the example's helpers ------------------------------------------------------------------------

class Summary(Enum):
    NONE = 0
    AVERAGE = 1


class AverageMeter:
    """Computes and stores the average and current value"""

    def __init__(self, name, fmt=":f", summary_type=Summary.AVERAGE):
        self.name, self.fmt, self.summary_type = name, fmt, summary_type
        self.reset()

    def reset(self):
        self.val = 0
        self.avg = 0
        self.sum = 0
        self.count = 0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count

    def __str__(self):
        fmtstr = "{name} {val" + self.fmt + "} ({avg" + self.fmt + "})"
        return fmtstr.format(**self.__dict__)

    def summary(self):
        return "{name} {avg:.3f}".format(**self.__dict__) if self.summary_type is Summary.AVERAGE else ""


class ProgressMeter:
    def __init__(self, num_batches, meters, prefix=""):
        self.batch_fmtstr = self._get_batch_fmtstr(num_batches)
        self.meters = meters
        self.prefix = prefix

    def display(self, batch):
        entries = [self.prefix + self.batch_fmtstr.format(batch)]
        entries += [str(meter) for meter in self.meters]
        print("\t".join(entries))

    def display_summary(self):
        print(" ".join([" *"] + [meter.summary() for meter in self.meters]))

    def _get_batch_fmtstr(self, num_batches):
        num_digits = len(str(num_batches // 1))
        fmt = "{:" + str(num_digits) + "d}"
        return "[" + fmt + "/" + fmt.format(num_batches) + "]"


def accuracy(output, target, topk=(1,)):
    """Computes the accuracy over the k top predictions for the specified values of k"""
    with torch.no_grad():
        maxk = max(topk)
        batch_size = target.size(0)
        _, pred = output.topk(maxk, 1, True, True)
        pred = pred.t()
        correct = pred.eq(target.view(1, -1).expand_as(pred))
        res = []
        for k in topk:
            correct_k = correct[:k].reshape(-1).float().sum(0, keepdim=True)
            res.append(correct_k.mul_(100.0 / batch_size))
        return res


def sample_ids(images, target):
    """Each sample's id (100 * class + number) read from its pixels, the label checked against
    the color; and whether each was flipped (its bright blue half on the left)."""
    pixels = (images.detach().float().cpu() * STD.view(1, 3, 1, 1) + MEAN.view(1, 3, 1, 1)) * 255
    red, green = pixels[:, 0].mean(dim=(1, 2)), pixels[:, 1].mean(dim=(1, 2))
    cls, num = ((red - 20) / 40).round().long(), ((green - 10) / 12).round().long()
    if not torch.equal(cls, target.cpu()):
        raise SystemExit(f"labels {target.tolist()} do not match the images' colors {cls.tolist()}")
    side = pixels.shape[3] // 3
    flipped = pixels[:, 2, :, :side].mean(dim=(1, 2)) > pixels[:, 2, :, -side:].mean(dim=(1, 2))
    return (100 * cls + num).tolist(), flipped.int().tolist()


def move(images, target, device, args):
    """As the example moves a batch: .cuda(args.gpu) with --gpu (where CUDA is), else .to(device)."""
    if args.gpu is not None and torch.cuda.is_available():
        images = images.cuda(args.gpu, non_blocking=True)
        target = target.cuda(args.gpu, non_blocking=True)
    else:
        images = images.to(device, non_blocking=True)
        target = target.to(device, non_blocking=True)
    return images, target


class TinyNet(nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2),
                                      nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(inplace=True),
                                      nn.AdaptiveAvgPool2d(1))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Dropout(0.2), nn.Linear(16, num_classes))

    def forward(self, x):
        return self.classifier(self.features(x))


# -- the example's main, main_worker, train, validate --------------------------------------------

def main():
    args = parser.parse_args()
    if args.seed is not None:
        random.seed(args.seed)
        np.random.seed(args.seed)
        torch.manual_seed(args.seed)
        cudnn.deterministic = True
        cudnn.benchmark = False
    main_worker(args.gpu, args)


def main_worker(gpu, args):
    traindir = os.path.join(args.data, "train")
    valdir = os.path.join(args.data, "val")
    normalize = Normalize(mean=MEAN, std=STD)
    train_dataset = ImageFolder(traindir, Compose([Resize(20), CenterCrop(16), RandomHorizontalFlip(), ToTensor(),
                                                   normalize]))
    val_dataset = ImageFolder(valdir, Compose([Resize(20), CenterCrop(16), ToTensor(), normalize]))

    model = TinyNet(len(train_dataset.classes))
    if torch.cuda.is_available():
        if args.gpu is not None:
            torch.cuda.set_device(args.gpu)
            device = torch.device("cuda:{}".format(args.gpu))
        else:
            device = torch.device("cuda")
    else:
        device = torch.device("cpu")
    model = model.to(device)

    criterion = nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)

    train_sampler = None
    val_sampler = None
    train_loader = torch.utils.data.DataLoader(
        train_dataset, batch_size=args.batch_size, shuffle=(train_sampler is None),
        num_workers=args.workers, pin_memory=True, sampler=train_sampler)
    val_loader = torch.utils.data.DataLoader(
        val_dataset, batch_size=args.batch_size, shuffle=False,
        num_workers=args.workers, pin_memory=True, sampler=val_sampler)

    record = {"ids": [], "flips": [], "losses": [], "val_ids": [], "val_losses": [], "val_acc1": [],
              "loaders": [type(train_loader).__qualname__, type(val_loader).__qualname__],
              "is_dataloader": [isinstance(x, torch.utils.data.DataLoader) for x in (train_loader, val_loader)],
              "workers": [train_loader.num_workers, val_loader.num_workers]}
    for epoch in range(args.epochs):
        train(train_loader, model, criterion, optimizer, epoch, device, args, record)
        acc1 = validate(val_loader, model, criterion, args, device, record)
        scheduler.step()
        record["val_acc1"].append(acc1)
    with open(args.out, "w") as f:
        json.dump(record, f)


def train(train_loader, model, criterion, optimizer, epoch, device, args, record):
    batch_time = AverageMeter("Time", ":6.3f")
    data_time = AverageMeter("Data", ":6.3f")
    losses = AverageMeter("Loss", ":.4e")
    top1 = AverageMeter("Acc@1", ":6.2f")
    progress = ProgressMeter(len(train_loader), [batch_time, data_time, losses, top1],
                             prefix="Epoch: [{}]".format(epoch))

    # switch to train mode
    model.train()

    end = time.time()
    for i, (images, target) in enumerate(train_loader):
        # measure data loading time
        data_time.update(time.time() - end)

        # move data to the same device as model
        images, target = move(images, target, device, args)
        ids, flipped = sample_ids(images, target)
        record["ids"].append(ids)
        record["flips"].append(flipped)

        # compute output
        output = model(images)
        loss = criterion(output, target)

        # measure accuracy and record loss
        (acc1,) = accuracy(output, target, topk=(1,))
        losses.update(loss.item(), images.size(0))
        top1.update(acc1[0], images.size(0))
        record["losses"].append(loss.item())

        # compute gradient and do SGD step
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

        # measure elapsed time
        batch_time.update(time.time() - end)
        end = time.time()

        if i % args.print_freq == 0:
            progress.display(i + 1)


def validate(val_loader, model, criterion, args, device, record):
    batch_time = AverageMeter("Time", ":6.3f", Summary.NONE)
    losses = AverageMeter("Loss", ":.4e", Summary.NONE)
    top1 = AverageMeter("Acc@1", ":6.2f", Summary.AVERAGE)
    progress = ProgressMeter(len(val_loader), [batch_time, losses, top1], prefix="Test: ")

    # switch to evaluate mode
    model.eval()

    with torch.no_grad():
        end = time.time()
        for i, (images, target) in enumerate(val_loader):
            images, target = move(images, target, device, args)
            ids, flipped = sample_ids(images, target)
            if any(flipped):
                raise SystemExit(f"val images flipped: {flipped}")
            record["val_ids"].append(ids)

            # compute output
            output = model(images)
            loss = criterion(output, target)

            # measure accuracy and record loss
            (acc1,) = accuracy(output, target, topk=(1,))
            losses.update(loss.item(), images.size(0))
            top1.update(acc1[0], images.size(0))
            record["val_losses"].append(loss.item())

            # measure elapsed time
            batch_time.update(time.time() - end)
            end = time.time()

            if i % args.print_freq == 0:
                progress.display(i + 1)

    progress.display_summary()
    return top1.avg.item()


if __name__ == "__main__":
    main()
