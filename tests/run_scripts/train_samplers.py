"""A training loop over a DataLoader with a sampler of the script's own, as scripts write them:

    python train_samplers.py OUT.json {ra,numpy,lazy,buckets,ends} WORKERS [--peek]

- ra: torchvision's references' repeated-augmentation sampler (`--ra-sampler`): each index three
  times, shuffled by a generator of its own seeded with seed + epoch, this rank's share of two;
- numpy: a shuffle from NumPy's global RNG, drawn in `__iter__`;
- lazy: each index drawn from torch's global RNG as it is asked for (between the step's own
  dropout draws);
- buckets: a batch_sampler (not torch's BatchSampler) of batches of one class each, of varying
  size, shuffled by Python's `random`;
- ends: torch's order in full batches, and a draw from torch's global RNG once the sampler is
  asked past its end (torch's BatchSampler asks after the last batch is out).

--peek looks at a batch of a second iterator in the middle of each epoch (two iterators of the
loader alive). OUT gets the ids of each batch, the losses, and a draw of each RNG after each
epoch: the same with and without `fastdata run` when the run takes the script as it is."""

import json
import random
import sys

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, Sampler


class Encoded(Dataset):
    """Sample i: 8 features that are a function of i, its label i % 3, and i itself."""

    def __len__(self):
        return 50

    def __getitem__(self, i):
        return torch.arange(8, dtype=torch.float32) * (i % 7) / 7 + i / 50, i % 3, i


class RASampler(Sampler):
    """As torchvision's references/classification/sampler.py behaves (written here, not copied),
    but for a set under 256 samples, of which it selects none: here, the rank's whole share."""

    def __init__(self, dataset, num_replicas, rank, shuffle=True, seed=0, repetitions=3):
        self.dataset, self.num_replicas, self.rank = dataset, num_replicas, rank
        self.shuffle, self.seed, self.repetitions, self.epoch = shuffle, seed, repetitions, 0
        self.num_samples = -(-len(dataset) * repetitions // num_replicas)
        self.total_size = self.num_samples * num_replicas
        self.num_selected_samples = len(dataset) // 256 * 256 // num_replicas or len(dataset) // num_replicas

    def __iter__(self):
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        order = torch.randperm(len(self.dataset), generator=g).tolist() if self.shuffle else list(range(len(self.dataset)))
        order = [i for i in order for _ in range(self.repetitions)]
        order += order[: self.total_size - len(order)]
        return iter(order[self.rank:self.total_size:self.num_replicas][: self.num_selected_samples])

    def __len__(self):
        return self.num_selected_samples

    def set_epoch(self, epoch):
        self.epoch = epoch


class Sized(Sampler):
    """A sampler of n indices a pass; the subclasses below say how they are drawn."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


class NumpyShuffle(Sized):
    def __iter__(self):
        return iter(np.random.permutation(self.n).tolist())


class Lazy(Sized):
    def __iter__(self):
        for _ in range(self.n):
            yield int(torch.randint(self.n, ()))


class Buckets(Sized):
    def __iter__(self):
        batches = []
        for c in range(3):
            ids = [i for i in range(self.n) if i % 3 == c]
            random.shuffle(ids)
            batches += [ids[k:k + 4 + c] for k in range(0, len(ids), 4 + c)]
        random.shuffle(batches)
        return iter(batches)

    def __len__(self):
        return sum(-(-len(range(c, self.n, 3)) // (4 + c)) for c in range(3))


class Ends(Sized):
    def __init__(self, n):
        super().__init__(n)
        self.after = []

    def __iter__(self):
        yield from range(self.n)
        self.after.append(torch.rand(()).item())


def main():
    out, kind, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
    peek = "--peek" in sys.argv
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    data = Encoded()
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if kind == "buckets":
        loader = DataLoader(data, batch_sampler=Buckets(len(data)), num_workers=workers)
    else:
        sampler = {"ra": lambda: RASampler(data, num_replicas=2, rank=0), "numpy": lambda: NumpyShuffle(len(data)),
                   "lazy": lambda: Lazy(len(data)), "ends": lambda: Ends(len(data))}[kind]()
        loader = DataLoader(data, batch_size=5 if kind == "ends" else 4, sampler=sampler, num_workers=workers)
    seen, losses, peeked, after = [], [], [], []
    for epoch in range(3):
        if hasattr(loader.sampler, "set_epoch"):
            loader.sampler.set_epoch(epoch)
        for k, (x, y, ids) in enumerate(loader):
            if peek and k == 3:
                peeked.append(next(iter(loader))[2].tolist())
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            seen.append(ids.tolist())
            losses.append(loss.item())
        after.append([torch.rand(()).item(), float(np.random.rand()), random.random()])
    with open(out, "w") as f:
        json.dump({"ids": seen, "losses": losses, "peeked": peeked, "after": after,
                   "ends": getattr(loader.sampler, "after", None), "loader": type(loader).__qualname__}, f)


if __name__ == "__main__":
    main()
