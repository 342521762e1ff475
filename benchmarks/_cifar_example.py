"""The data pipeline of the most copied small-image training scripts, unchanged in shape:
- `--dataset cifar10`: the CIFAR-10 recipe (the PyTorch tutorial's loader, kuangliu/pytorch-cifar's
  transform): `CIFAR10(train=True)` + RandomCrop(32, padding=4), RandomHorizontalFlip, ToTensor,
  Normalize, `DataLoader(batch_size=128, shuffle=True, num_workers=2)`;
- `--dataset cifar100`: weiaicunzai/pytorch-cifar100's: `CIFAR100(train=True)` + RandomCrop(32,
  padding=4), RandomHorizontalFlip, RandomRotation(15), ToTensor, Normalize,
  `DataLoader(batch_size=128, shuffle=True, num_workers=4)`;
- `--dataset mnist`: pytorch/examples' MNIST: `MNIST(train=True)` + ToTensor, Normalize((0.1307,),
  (0.3081,)), `DataLoader(batch_size=64)` (its CPU arguments: no shuffle, no workers);
- `--dataset tutorial`: the PyTorch tutorial "Training a Classifier": `CIFAR10(train=True)` +
  ToTensor, Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)), `DataLoader(batch_size=4, shuffle=True,
  num_workers=2)`, and its step: its small CNN, CrossEntropyLoss, SGD(lr=0.001, momentum=0.9);
- `--dataset stl10`: the Lightning tutorial's SimCLR (UvA DL tutorial 17): `STL10(split="unlabeled")`
  + its `ContrastiveTransformations(contrast_transforms, n_views=2)` (flip, RandomResizedCrop(96),
  RandomApply(ColorJitter(0.5, 0.5, 0.5, 0.1), p=0.8), RandomGrayscale(0.2), GaussianBlur(9),
  ToTensor, Normalize((0.5,), (0.5,))), `DataLoader(batch_size=256, shuffle=True, drop_last=True,
  pin_memory=True, num_workers=os.cpu_count())`; the loop moves both views;
- `--dataset fashion_rgb`: FashionMNIST made RGB for a 3-channel network, as scripts that fine-tune
  an ImageNet model on it write it: `FashionMNIST(train=True)` + Grayscale(num_output_channels=3),
  ToTensor, Normalize((0.5,), (0.5,)), `DataLoader(batch_size=256, shuffle=True, num_workers=2)`;
- `--dataset cifar10_224`: CIFAR-10 upscaled for an ImageNet model, as transfer-learning scripts write
  it: `CIFAR10(train=True)` + Resize(224), RandomHorizontalFlip, ToTensor, Normalize(ImageNet's),
  `DataLoader(batch_size=64, shuffle=True, num_workers=2)`;
- `--dataset cifar10_v2`: the same in torchvision's v2 style, as its "Getting started with transforms v2"
  writes it: v2.ToImage, v2.RandomResizedCrop((224, 224), antialias=True) (on the uint8 tensor),
  v2.RandomHorizontalFlip, v2.ToDtype(torch.float32, scale=True), v2.Normalize(ImageNet's), batch 64,
  2 workers;
- `--dataset svhn`: an SVHN recipe: `SVHN(split="train")` + RandomCrop(32, padding=4) (no flip: digits),
  ToTensor, Normalize(SVHN's mean and std), `DataLoader(batch_size=128, shuffle=True, num_workers=2)`.
A fresh iterator each epoch; the step is the copy to the device (the tutorial's: its training
step). `run_cifar.py` times it plain
and under `fastdata run`. The files are synthetic (`run_cifar.py` writes them in the datasets'
own formats), so CIFAR's (STL10's, SVHN's) md5 check of them is the one line added. The last line printed is
JSON: images/s of each epoch.

    python benchmarks/_cifar_example.py ROOT [--dataset {cifar10,cifar100,mnist,tutorial,stl10,svhn,fashion_rgb,
                                                     cifar10_224,cifar10_v2}]
                                             [--epochs 3]
                                             [--workers N]
"""

import argparse
import json
import os
import time

import torch
import torchvision
import torchvision.transforms as transforms

ap = argparse.ArgumentParser()
ap.add_argument("root")
ap.add_argument("--dataset", choices=["cifar10", "cifar100", "mnist", "tutorial", "stl10", "svhn", "fashion_rgb",
                                      "cifar10_224", "cifar10_v2"],
                default="cifar10")
ap.add_argument("--epochs", type=int, default=3)
ap.add_argument("--workers", type=int, default=None,
                help="the recipe's: 2 for CIFAR-10 and the tutorial, 4 for CIFAR-100, 0 for MNIST")
args = ap.parse_args()

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torchvision.datasets.cifar.check_integrity = lambda *a, **k: True  # (synthetic files: not CIFAR's md5)
if args.dataset == "cifar10":
    transform_train = transforms.Compose([
        transforms.RandomCrop(32, padding=4),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)),
    ])
    trainset = torchvision.datasets.CIFAR10(root=args.root, train=True, download=False, transform=transform_train)
    trainloader = torch.utils.data.DataLoader(trainset, batch_size=128, shuffle=True,
                                              num_workers=2 if args.workers is None else args.workers)
elif args.dataset == "cifar100":
    transform_train = transforms.Compose([
        transforms.RandomCrop(32, padding=4),
        transforms.RandomHorizontalFlip(),
        transforms.RandomRotation(15),
        transforms.ToTensor(),
        transforms.Normalize((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
    ])
    trainset = torchvision.datasets.CIFAR100(root=args.root, train=True, download=False, transform=transform_train)
    trainloader = torch.utils.data.DataLoader(trainset, batch_size=128, shuffle=True,
                                              num_workers=4 if args.workers is None else args.workers)
elif args.dataset == "tutorial":
    import torch.nn as nn
    import torch.nn.functional as F

    transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))])
    trainset = torchvision.datasets.CIFAR10(root=args.root, train=True, download=False, transform=transform)
    trainloader = torch.utils.data.DataLoader(trainset, batch_size=4, shuffle=True,
                                              num_workers=2 if args.workers is None else args.workers)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 6, 5)
            self.pool = nn.MaxPool2d(2, 2)
            self.conv2 = nn.Conv2d(6, 16, 5)
            self.fc1 = nn.Linear(16 * 5 * 5, 120)
            self.fc2 = nn.Linear(120, 84)
            self.fc3 = nn.Linear(84, 10)

        def forward(self, x):
            x = self.pool(F.relu(self.conv1(x)))
            x = self.pool(F.relu(self.conv2(x)))
            x = torch.flatten(x, 1)
            x = F.relu(self.fc1(x))
            x = F.relu(self.fc2(x))
            return self.fc3(x)

    net = Net().to(device)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.001, momentum=0.9)
elif args.dataset == "stl10":
    torchvision.datasets.STL10._check_integrity = lambda self: True  # (synthetic files: not STL10's md5)

    class ContrastiveTransformations:  # the tutorial's, as it is written there
        def __init__(self, base_transforms, n_views=2):
            self.base_transforms = base_transforms
            self.n_views = n_views

        def __call__(self, x):
            return [self.base_transforms(x) for i in range(self.n_views)]

    contrast_transforms = transforms.Compose([
        transforms.RandomHorizontalFlip(),
        transforms.RandomResizedCrop(size=96),
        transforms.RandomApply([transforms.ColorJitter(brightness=0.5, contrast=0.5, saturation=0.5, hue=0.1)],
                               p=0.8),
        transforms.RandomGrayscale(p=0.2),
        transforms.GaussianBlur(kernel_size=9),
        transforms.ToTensor(),
        transforms.Normalize((0.5,), (0.5,)),
    ])
    trainset = torchvision.datasets.STL10(root=args.root, split="unlabeled", download=False,
                                          transform=ContrastiveTransformations(contrast_transforms, n_views=2))
    trainloader = torch.utils.data.DataLoader(trainset, batch_size=256, shuffle=True, drop_last=True, pin_memory=True,
                                              num_workers=os.cpu_count() if args.workers is None else args.workers)
elif args.dataset == "fashion_rgb":
    transform = transforms.Compose([
        transforms.Grayscale(num_output_channels=3),
        transforms.ToTensor(),
        transforms.Normalize((0.5,), (0.5,)),
    ])
    trainset = torchvision.datasets.FashionMNIST(root=args.root, train=True, download=False, transform=transform)
    trainloader = torch.utils.data.DataLoader(trainset, batch_size=256, shuffle=True,
                                              num_workers=2 if args.workers is None else args.workers)
elif args.dataset == "cifar10_224":
    transform_train = transforms.Compose([
        transforms.Resize(224),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
    ])
    trainset = torchvision.datasets.CIFAR10(root=args.root, train=True, download=False, transform=transform_train)
    trainloader = torch.utils.data.DataLoader(trainset, batch_size=64, shuffle=True,
                                              num_workers=2 if args.workers is None else args.workers)
elif args.dataset == "cifar10_v2":
    import torchvision.transforms.v2 as v2

    transform_train = v2.Compose([
        v2.ToImage(),
        v2.RandomResizedCrop(size=(224, 224), antialias=True),
        v2.RandomHorizontalFlip(p=0.5),
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
    ])
    trainset = torchvision.datasets.CIFAR10(root=args.root, train=True, download=False, transform=transform_train)
    trainloader = torch.utils.data.DataLoader(trainset, batch_size=64, shuffle=True,
                                              num_workers=2 if args.workers is None else args.workers)
elif args.dataset == "svhn":
    torchvision.datasets.SVHN._check_integrity = lambda self: True  # (synthetic files: not SVHN's md5)
    transform_train = transforms.Compose([
        transforms.RandomCrop(32, padding=4),
        transforms.ToTensor(),
        transforms.Normalize((0.4377, 0.4438, 0.4728), (0.1980, 0.2010, 0.1970)),
    ])
    trainset = torchvision.datasets.SVHN(root=args.root, split="train", download=False, transform=transform_train)
    trainloader = torch.utils.data.DataLoader(trainset, batch_size=128, shuffle=True,
                                              num_workers=2 if args.workers is None else args.workers)
else:
    transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])
    trainset = torchvision.datasets.MNIST(args.root, train=True, download=False, transform=transform)
    trainloader = torch.utils.data.DataLoader(trainset, batch_size=64, num_workers=args.workers or 0)

rates = []
for epoch in range(args.epochs):
    start, seen = time.perf_counter(), 0
    for inputs, targets in trainloader:
        if args.dataset == "stl10":  # the views moved (Lightning moves the batch), then its step's torch.cat
            inputs = torch.cat([x.to(device) for x in inputs])
        inputs, targets = inputs.to(device), targets.to(device)
        if args.dataset == "tutorial":
            optimizer.zero_grad()
            loss = criterion(net(inputs), targets)
            loss.backward()
            optimizer.step()
        seen += len(targets)
    if device.type == "cuda":
        torch.cuda.synchronize()
    rates.append(seen / (time.perf_counter() - start))
print(json.dumps({"images_per_s": rates}))
