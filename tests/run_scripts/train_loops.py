"""Plain training loops, as users write them, over a Dataset whose samples encode their index (a
tiny model with dropout, SGD, shuffled batches, 2 epochs). Writes to the JSON file named by its
first argument the ids and losses of each train batch, and with --val those of each val batch.

--move: how the loop moves a batch: `to` (.to(device)), `to_nb` (.to(device, non_blocking=True)),
`cuda_nb` (.cuda(non_blocking=True); the device is then cuda). --val: a second DataLoader (val,
shuffle=False) evaluated after each epoch. --rebuild: a new train DataLoader (shuffle=True) made
at the start of each epoch. --peek: at the second step of each epoch, a look at a batch of the
train loader (`next(iter(train_loader))`, its ids in "peek_ids"). --workers N: num_workers=N to
both loaders (left out: the default)."""

import argparse
import json

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Encoded(Dataset):
    """Sample i: 8 features that are a function of i, its label i % 3, and i itself."""

    def __init__(self, n, offset=0):
        self.n, self.offset = n, offset

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        i += self.offset
        x = torch.arange(8, dtype=torch.float32) * (i % 7) / 7 + i / 64
        return x, i % 3, i


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--move", choices=("to", "to_nb", "cuda_nb"), default="to")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--val", action="store_true")
    ap.add_argument("--rebuild", action="store_true")
    ap.add_argument("--peek", action="store_true")
    ap.add_argument("--workers", type=int, default=None)
    args = ap.parse_args()
    device = torch.device("cuda" if args.move == "cuda_nb" else args.device)
    kw = {} if args.workers is None else {"num_workers": args.workers}
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 3)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train_set, val_set = Encoded(48), Encoded(20, offset=1000)

    def move(x, y):
        if args.move == "to":
            return x.to(device), y.to(device)
        if args.move == "to_nb":
            return x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        return x.cuda(non_blocking=True), y.cuda(non_blocking=True)

    loaders = []
    train_loader = None if args.rebuild else DataLoader(train_set, batch_size=8, shuffle=True, **kw)
    val_loader = DataLoader(val_set, batch_size=8, shuffle=False, **kw) if args.val else None
    loaders += [x for x in (train_loader, val_loader) if x is not None]
    out = {"ids": [], "losses": [], "val_ids": [], "val_losses": [], "peek_ids": []}
    for epoch in range(args.epochs):
        if args.rebuild:
            train_loader = DataLoader(train_set, batch_size=8, shuffle=True, **kw)
            loaders.append(train_loader)
        model.train()
        for step, (x, y, ids) in enumerate(train_loader):
            if args.peek and step == 1:
                out["peek_ids"].append(next(iter(train_loader))[2].tolist())
            x, y = move(x, y)
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            out["ids"].append(ids.tolist())
            out["losses"].append(loss.item())
        if val_loader is not None:
            model.eval()
            with torch.no_grad():
                for x, y, ids in val_loader:
                    x, y = move(x, y)
                    out["val_ids"].append(ids.tolist())
                    out["val_losses"].append(nn.functional.cross_entropy(model(x), y).item())
    out["loaders"] = [type(x).__qualname__ for x in loaders]
    out["is_dataloader"] = [isinstance(x, DataLoader) for x in loaders]
    out["workers"] = [x.num_workers for x in loaders]
    out["distinct"] = len({id(x) for x in loaders})
    with open(args.out, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
