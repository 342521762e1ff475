"""What frameworks do with a DataLoader, under `fastdata run`: pickle it (ddp_spawn), copy it,
rebuild it as type(loader)(dataset, ...) (Lightning, Accelerate). Prints one JSON line: each
copy's type, whether it is a DataLoader, and whether its batches are the original's; and
whether fastdata's own loader, made by the script, is a DataLoader as without the hook."""

import copy
import json
import pickle

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, SequentialSampler


class Encoded(Dataset):
    def __len__(self):
        return 20

    def __getitem__(self, i):
        return torch.full((3,), float(i)), i


class Stream(IterableDataset):
    def __iter__(self):
        return (Encoded()[i] for i in range(20))


def ids(loader):
    return [b[1].tolist() for b in loader]


if __name__ == "__main__":
    loader = DataLoader(Encoded(), batch_size=4)
    want = ids(loader)
    copies = {"pickled": pickle.loads(pickle.dumps(loader)), "copied": copy.copy(loader),
              "rebuilt": type(loader)(loader.dataset, batch_size=4, sampler=SequentialSampler(loader.dataset)),
              "rebuilt_custom": type(loader)(loader.dataset, batch_size=4, sampler=list(range(20))),
              "rebuilt_iterable": type(loader)(Stream(), batch_size=4)}
    out = {name: {"type": type(c).__qualname__, "name": type(c).__name__, "is_dataloader": isinstance(c, DataLoader),
                  "same": ids(c) == want} for name, c in copies.items()}
    import fastdata

    own = fastdata.loader(Encoded(), batch_size=4)
    out["fastdata.loader"] = {"type": type(own).__name__, "is_dataloader": isinstance(own, DataLoader),
                              "same": ids(own) == want}
    print(json.dumps(out))
