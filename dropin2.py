import torch, fastdata
from torch.utils.data import DataLoader, get_worker_info
class W(torch.utils.data.Dataset):
    def __len__(self): return 16
    def __getitem__(self, i):
        if i == 5: raise ValueError("bad sample 5")
        w = get_worker_info(); return torch.tensor([i, -1 if w is None else w.id])
for nw in (0, 2):
    for maker in (DataLoader, fastdata.loader):
        l = maker(W(), batch_size=4, num_workers=nw); it = iter(l); out = []
        for _ in range(4):
            try: out.append(next(it)[:, 0].tolist())
            except StopIteration: out.append("stop"); break
            except Exception as e: out.append(f"{type(e).__name__}: {str(e).splitlines()[0][:60]}")
        print(nw, maker.__name__, out)
l = fastdata.loader(W(), batch_size=4); first = None
l.num_workers = 2
ws = set()
for i in range(3, 4):
    pass
class V(W):
    def __getitem__(self, i):
        w = get_worker_info(); return torch.tensor([i, -1 if w is None else w.id])
l = fastdata.loader(V(), batch_size=4); print("before", {int(b[0, 1]) for b in l}); l.num_workers = 2; print("after num_workers=2:", {int(b[0, 1]) for b in l})
