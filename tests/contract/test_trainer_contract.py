"""What trainers (Lightning, Fabric, Accelerate) rely on, checked here without them: the
drop-in loader is a DataLoader (its attributes, its checks, an iterator that goes on after a
batch raised, a loader that pickles for a spawned process); an image loader has a sampler that
trainers call set_epoch on, and takes its rank and world size from a process group started
after it was made. (tests/contract/test_frameworks.py runs the frameworks themselves.)"""

from __future__ import annotations

import copy
import os
import pickle
import socket
import warnings

import pytest
import torch
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

import fastdata
from _images import color_folder
from fastdata import transforms as T

CLASSES, PER_CLASS = 3, 8


def _indexed(n=20):
    return TensorDataset(torch.arange(n).float().unsqueeze(1), torch.arange(n))


def test_dropin_is_a_dataloader_with_its_attributes():
    gen = torch.Generator().manual_seed(3)
    kw = dict(batch_size=4, shuffle=True, num_workers=0, drop_last=True, generator=gen)
    mine, ref = fastdata.loader(_indexed(), **kw), DataLoader(_indexed(), **kw)
    assert isinstance(mine, DataLoader)
    for name in ("batch_size", "drop_last", "num_workers", "pin_memory", "timeout", "worker_init_fn",
                 "prefetch_factor", "persistent_workers", "multiprocessing_context", "generator"):
        assert getattr(mine, name) == getattr(ref, name), name
    assert type(mine.sampler) is type(ref.sampler) and type(mine.batch_sampler) is type(ref.batch_sampler)
    assert len(mine) == len(ref) == 5
    assert mine.collate_fn is not None


@pytest.mark.parametrize("name, value", [("batch_size", 2), ("sampler", None), ("batch_sampler", None),
                                          ("drop_last", True), ("dataset", _indexed(4))])
def test_assigning_after_construction_raises_as_dataloader_does(name, value):
    loader = fastdata.loader(_indexed(), batch_size=4)
    with pytest.raises(ValueError, match=name):
        setattr(loader, name, value)
    assert [len(y) for _, y in loader] == [4] * 5


class _Flaky(Dataset):
    def __len__(self):
        return 12

    def __getitem__(self, i):
        if i in (2, 7):
            raise KeyError(f"sample {i} is broken")
        return i


@pytest.mark.parametrize("timed", [False, True], ids=["", "stage-timing"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_iteration_goes_on_after_a_batch_raises(num_workers, timed):
    """As DataLoader's iterator, also while the profiler times the stages (`fastdata run --profile`)."""
    def run(loader, timed=False):
        if timed:
            assert loader.set_stage_timing(True)
        out, it = [], iter(loader)
        while True:
            try:
                out.append(next(it).tolist())
            except StopIteration:
                return out
            except KeyError:
                out.append("error")

    kw = dict(batch_size=2, num_workers=num_workers)
    got = run(fastdata.loader(_Flaky(), **kw), timed)
    assert got == run(DataLoader(_Flaky(), **kw)) == [[0, 1], "error", [4, 5], "error", [8, 9], [10, 11]]


class _Counted(IterableDataset):
    def __iter__(self):
        return iter(range(10))

    def __len__(self):
        return 6  # fewer than it yields


def test_iterable_longer_than_its_len_warns():
    loader = fastdata.loader(_Counted(), batch_size=None)
    assert len(loader) == 6
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert list(loader) == list(range(10))
    assert any("IterableDataset" in str(w.message) and "len" in str(w.message) for w in caught)


@pytest.mark.parametrize("workers", [0, 2])
def test_dropin_pickles_for_a_spawned_process(workers):
    """ddp_spawn sends the loader to new processes: torch's global generator must not ride
    along, and the start method its workers took does (after a pass, with workers)."""
    loader = fastdata.loader(_indexed(), batch_size=4, shuffle=True, num_workers=workers)
    first = list(loader)
    for again in (pickle.loads(pickle.dumps(loader)), copy.deepcopy(loader)):
        assert sorted(torch.cat([y for _, y in again]).tolist()) == list(range(20))
    assert sorted(torch.cat([y for _, y in first]).tolist()) == list(range(20))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return color_folder(tmp_path_factory.mktemp("imgs"), CLASSES, PER_CLASS, (40, 80), lambda i: f"{i:03d}.jpg")


def _ids(images):
    x = images.float()
    return (torch.round((x[:, 0].mean((1, 2)) - 20) / 40) * 100 + torch.round((x[:, 1].mean((1, 2)) - 10) / 12)).long()


def _image_loader(folder, **kw):
    return fastdata.loader(str(folder), batch_size=4, shuffle=True, transform=T.Compose([T.CenterCrop(32)]),
                           device="cpu", **kw)


def test_image_sampler_set_epoch_sets_the_epoch(folder):
    a, b = _image_loader(folder), _image_loader(folder)
    a.sampler.set_epoch(3)
    b.set_epoch(3)
    assert torch.equal(torch.cat([_ids(x) for x, _ in a]), torch.cat([_ids(x) for x, _ in b]))
    assert len(a.sampler) == len(a) * 4


def test_image_loader_has_no_dataset_and_says_what_to_do(folder):
    with pytest.raises(AttributeError, match="load_state_dict"):
        _image_loader(folder).dataset


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_job(rank, world, port, folder, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    loader = _image_loader(folder)  # made before the process group, as a trainer's hook would
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    try:
        seen = [torch.cat([_ids(x) for x, _ in loader]).tolist() for _ in range(2)]
        torch.save({"len": len(loader), "seen": seen}, os.path.join(out, f"rank{rank}.pt"))
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.timeout(180)
def test_image_loader_made_before_the_process_group_splits_by_rank(folder, tmp_path):
    mp.spawn(_rank_job, args=(2, _free_port(), str(folder), str(tmp_path)), nprocs=2)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    n = CLASSES * PER_CLASS
    assert ranks[0]["len"] == ranks[1]["len"] == n // 2 // 4
    for epoch in range(2):
        a, b = ranks[0]["seen"][epoch], ranks[1]["seen"][epoch]
        assert not set(a) & set(b) and len(set(a) | set(b)) == n
    assert ranks[0]["seen"][0] != ranks[0]["seen"][1]  # the order changes with the epoch


def test_image_resume_checks_batch_size_and_world_size(folder):
    state = _image_loader(folder, rank=0, world_size=2).state_dict()
    with pytest.raises(ValueError, match="batch_size=4"):
        fastdata.loader(str(folder), batch_size=3, transform=T.Compose([T.CenterCrop(32)])).load_state_dict(state)
    other = _image_loader(folder)  # world size 1
    other.load_state_dict(state)
    with pytest.raises(ValueError, match="world_size=2"):
        iter(other)
    same = _image_loader(folder, rank=1, world_size=2)
    same.load_state_dict(state)
    assert len(list(same)) == len(same)


class _Draws(Dataset):
    """Each sample draws from torch's global RNG, in this process with 0 workers."""

    def __len__(self):
        return 40

    def __getitem__(self, i):
        return i, torch.rand(1).item()


def test_resume_carries_the_global_rng_past_the_skipped_batches():
    """A trainer restores torch's RNG as it was at the checkpoint (Accelerate's load_state),
    then the loader's state: the batches after it, and every epoch after, draw what the
    uninterrupted run drew."""
    def run(loader, start=0):
        return [(e, k, y.tolist(), r.tolist()) for e in range(2)
                for k, (y, r) in enumerate(loader, start=start if e == 0 else 0)]

    torch.manual_seed(0)
    whole, first = [], fastdata.loader(_Draws(), batch_size=4, shuffle=True)
    for e in range(2):
        for k, (y, r) in enumerate(first):
            whole.append((e, k, y.tolist(), r.tolist()))
            if (e, k) == (0, 5):
                state, rng = first.state_dict(), torch.get_rng_state()
    torch.manual_seed(1)
    again = fastdata.loader(_Draws(), batch_size=4, shuffle=True)
    torch.set_rng_state(rng)
    again.load_state_dict(state)
    assert run(again, start=6) == whole[6:]
