"""A plain training loop, as a user writes it: a Dataset whose samples encode their index, a
tiny model with dropout, SGD, shuffled batches, a few epochs. Writes the ids of each batch and
the losses to the JSON file named by its first argument; --subclass and --iterable make the
loaders a DataLoader subclass and an IterableDataset instead, --noisy a Dataset that draws random
noise, --records one that reads its samples through one file opened once (an offset that forked
workers would share); --device cuda trains on the GPU, each batch moved there as scripts do;
--workers N sets num_workers=N."""

import argparse
import json
import os
import struct
import tempfile

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset


class Encoded(Dataset):
    """Sample i: 8 features that are a function of i (plus noise from torch's global RNG when
    `noisy`), its label i % 3, and i itself."""

    def __init__(self, noisy=False):
        self.noisy = noisy

    def __len__(self):
        return 96

    def __getitem__(self, i):
        x = torch.arange(8, dtype=torch.float32) * (i % 7) / 7 + i / 96
        if self.noisy:
            x = x + 0.1 * torch.rand(8)
        return x, i % 3, i


class Records(Dataset):
    """Encoded's samples without noise, each index read back as an 8-byte record of a file
    opened once, by seek and read."""

    def __init__(self):
        fd, path = tempfile.mkstemp()
        os.write(fd, b"".join(struct.pack("<q", i) for i in range(96)))
        os.close(fd)
        self.file = open(path, "rb")
        os.unlink(path)
        self.encoded = Encoded()

    def __len__(self):
        return 96

    def __getitem__(self, i):
        self.file.seek(8 * i)
        (j,) = struct.unpack("<q", self.file.read(8))
        return self.encoded[j]


class Stream(IterableDataset):
    def __iter__(self):
        data = Encoded()
        return (data[i] for i in range(len(data)))


class MyLoader(DataLoader):
    pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--subclass", action="store_true")
    ap.add_argument("--iterable", action="store_true")
    ap.add_argument("--noisy", action="store_true")
    ap.add_argument("--records", action="store_true")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--workers", type=int, default=None, help="num_workers=N (default: the script sets none)")
    args = ap.parse_args()
    kw = {} if args.workers is None else {"num_workers": args.workers}
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 3)).to(args.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if args.iterable:
        loader = DataLoader(Stream(), batch_size=16)
    elif args.subclass:
        loader = MyLoader(Encoded(), batch_size=16, shuffle=True)
    else:
        loader = DataLoader(Records() if args.records else Encoded(args.noisy), batch_size=16, shuffle=True, **kw)
    seen, losses = [], []
    for epoch in range(args.epochs):
        for x, y, ids in loader:
            x, y = x.to(args.device, non_blocking=True), y.to(args.device, non_blocking=True)
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            seen.append(ids.tolist())
            losses.append(loss.item())
    with open(args.out, "w") as f:
        json.dump({"ids": seen, "losses": losses, "loader": type(loader).__qualname__,
                   "is_dataloader": isinstance(loader, DataLoader), "workers": loader.num_workers}, f)


if __name__ == "__main__":
    main()
