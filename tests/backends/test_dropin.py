"""Drop-in mode: `fastdata.loader(dataset, ...)` must behave as `torch.utils.data.DataLoader`.

Every sample encodes its index in its pixels and values, so a wrong sample, a wrong order or a
buffer overwritten under a live batch fails the comparison. Batches of 3x64x64 uint8 images (and
the other big leaves below) at batch size 16 are over `fastdata._collate._NATIVE_MIN_BYTES`, so
they take the native collation path; the small leaves and the short last batches take torch's.
"""

from __future__ import annotations

import collections
import gc
import importlib.util
import multiprocessing
import os
import pickle
import time
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SubsetRandomSampler,
    get_worker_info,
)

import fastdata
import fastdata._collate
from fastdata._loader import resolve_workers

H = W = 64


def image_hwc(i: int, h: int = H, w: int = W) -> np.ndarray:
    """An HWC uint8 image that encodes i: channel 0 is i % 251, channels 1 and 2 are ramps
    shifted by i (so no two nearby indices share an image)."""
    img = np.empty((h, w, 3), np.uint8)
    img[..., 0] = i % 251
    img[..., 1] = (np.arange(w)[None, :] + 7 * i) % 256
    img[..., 2] = (3 * np.arange(h)[:, None] + 11 * i + i // 251) % 256
    return img


def image_chw(i: int, h: int = H, w: int = W) -> np.ndarray:
    """image_hwc(i) seen as CHW: a strided view, not a contiguous array."""
    return image_hwc(i, h, w).transpose(2, 0, 1)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


class TupleDS(Dataset):
    """(CHW uint8 ndarray view, int label)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        return image_chw(i), i


class ManyDS(TupleDS):
    """Fetches a batch's samples in one call (`__getitems__`, which DataLoader's fetcher uses),
    each with the batch's first index as a third field, so a batch fetched one by one shows."""

    def __getitems__(self, indices):
        return [(image_chw(i), i, indices[0]) for i in indices]


class DictDS(Dataset):
    """A dict of every kind of leaf; the big ones collate natively at batch size 16."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        return {
            "tensor": torch.arange(3 * 32 * 32, dtype=torch.float32).reshape(3, 32, 32) + i,
            "f64": np.full((32, 32), float(i)) + np.arange(32)[:, None] / 8,
            "f16": ((np.arange(3 * 32 * 32) % 97) + i).astype(np.float16).reshape(3, 32, 32),
            "i64": np.arange(16 * 64, dtype=np.int64).reshape(16, 64) * (i + 1) - 5,
            "mask": (np.arange(64 * 64).reshape(64, 64) + i) % 3 == 0,
            "small": np.array([i, -i, 2 * i, 0.5], np.float64),
            "np_scalar": np.float32(i) / 4,
            "py_float": i / 3,
            "name": f"sample-{i}",
            "nested": (i, (np.int64(i * i), torch.tensor([i, -i], dtype=torch.int64))),
        }


Sample = collections.namedtuple("Sample", ["image", "label", "weight"])


class NamedDS(Dataset):
    """Sample(image=CHW uint8 tensor (a permuted HWC view), label=int, weight=np.float32)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        return Sample(torch.from_numpy(image_hwc(i)).permute(2, 0, 1), i, np.float32(i) * 0.5)


class TensorDS(Dataset):
    """A plain float32 CHW tensor per sample."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        return torch.from_numpy(image_chw(i, 32, 32).astype(np.float32))


class IterDS(IterableDataset):
    """An iterable dataset sharded over the DataLoader workers: (CHW image view, index)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(start, self.n, step):
            yield image_chw(i), i


class RandomDS(Dataset):
    """Samples that depend on the worker's RNGs and on what worker_init_fn set."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.worker_tag = -1

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        noise = np.random.randint(0, 1 << 30)
        torch_noise = torch.randint(0, 1 << 30, ()).item()
        return image_chw(i), i, noise, torch_noise, self.worker_tag


def seed_worker(worker_id: int) -> None:
    info = get_worker_info()
    np.random.seed((info.seed + 17) % 2**32)
    info.dataset.worker_tag = 100 + worker_id


def stack_collate(samples):
    images, labels = zip(*samples)
    return {"images": torch.from_numpy(np.stack(images)), "labels": list(labels)}


def _index_list(n: int) -> list[int]:
    return [int(i) for i in np.random.default_rng(0).permutation(n)[: n - 3]]


# Each case makes (dataset, DataLoader keywords) afresh, generators and samplers included, so
# the reference DataLoader and the loader under test start from identical state.
CASES = {
    "tuple-shuffle": lambda: (TupleDS(50), dict(batch_size=16, shuffle=True, generator=gen(1))),
    "tuple-shuffle-drop_last": lambda: (
        TupleDS(50),
        dict(batch_size=16, shuffle=True, drop_last=True, generator=gen(2)),
    ),
    "dict-sequential": lambda: (DictDS(40), dict(batch_size=16)),
    "dict-shuffle-drop_last": lambda: (
        DictDS(40),
        dict(batch_size=16, shuffle=True, drop_last=True, generator=gen(3)),
    ),
    "namedtuple-subset_sampler": lambda: (
        NamedDS(40),
        dict(batch_size=16, sampler=SubsetRandomSampler(range(3, 38), generator=gen(4))),
    ),
    "getitems-shuffle": lambda: (ManyDS(40), dict(batch_size=16, shuffle=True, generator=gen(9))),
    "tensor-index_list_sampler": lambda: (TensorDS(40), dict(batch_size=16, sampler=_index_list(40))),
    "tensor-batch_sampler": lambda: (
        TensorDS(40),
        dict(batch_sampler=BatchSampler(RandomSampler(range(40), generator=gen(5)), 16, drop_last=False)),
    ),
    "tuple-batch_size_None": lambda: (TupleDS(12), dict(batch_size=None, shuffle=True, generator=gen(6))),
    "dict-batch_size_None": lambda: (DictDS(6), dict(batch_size=None)),
    "tuple-collate_fn": lambda: (
        TupleDS(40),
        dict(batch_size=16, shuffle=True, generator=gen(7), collate_fn=stack_collate),
    ),
    "tuple-pin_memory": lambda: (
        TupleDS(40),
        dict(batch_size=16, shuffle=True, generator=gen(8), pin_memory=True),
    ),
    "iterable-sharded": lambda: (IterDS(45), dict(batch_size=16)),
    "iterable-sharded-drop_last": lambda: (IterDS(45), dict(batch_size=8, drop_last=True)),
    "iterable-batch_size_None": lambda: (IterDS(10), dict(batch_size=None)),
}


def make_pair(case: str, **extra):
    """(reference DataLoader, fastdata loader) for `case`, each over its own fresh arguments."""
    ds, kw = CASES[case]()
    ref = DataLoader(ds, **kw, **extra)
    ds, kw = CASES[case]()
    fast = fastdata.loader(ds, **kw, **extra)
    return ref, fast


# 1, 2. Same batches and same len as DataLoader.


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("case", list(CASES))
def test_same_batches_as_dataloader(case, num_workers, h):
    ref, fast = make_pair(case, num_workers=num_workers)
    assert len(fast) == len(ref)
    for epoch in range(2):  # the second epoch checks the RNG advanced the same way
        want = h.collect(ref)
        got = h.collect(fast)
        assert want, "the case should yield batches"
        h.assert_same_stream(got, want)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_global_rng_shuffle_same_as_dataloader(num_workers, h):
    """generator=None: both shuffle (and seed workers) from torch's global RNG."""
    torch.manual_seed(1234)
    want = h.collect(DataLoader(TupleDS(40), batch_size=16, shuffle=True, num_workers=num_workers))
    after_ref = torch.random.get_rng_state()
    torch.manual_seed(1234)
    got = h.collect(fastdata.loader(TupleDS(40), batch_size=16, shuffle=True, num_workers=num_workers))
    h.assert_same_stream(got, want)
    assert torch.equal(torch.random.get_rng_state(), after_ref), "global RNG consumed differently"


def test_profiler_ranges_kept_with_0_workers(h):
    # With 0 workers the drop-in fetches without DataLoader's __next__ (its ~10 us a batch),
    # except while a torch profiler records, whose trace then has DataLoader's own ranges.
    ref, fast = make_pair("tuple-shuffle", num_workers=0)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        got = h.collect(fast)
    h.assert_same_stream(got, h.collect(ref))
    names = {e.name for e in prof.events()}
    assert "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__" in names


def test_persistent_workers_same_as_dataloader(h):
    ref, fast = make_pair("tuple-shuffle", num_workers=2, persistent_workers=True, prefetch_factor=3)
    for epoch in range(3):
        h.assert_same_stream(h.collect(fast), h.collect(ref))


def test_persistent_workers_iterable_same_as_dataloader(h):
    ref, fast = make_pair("iterable-sharded", num_workers=2, persistent_workers=True)
    for epoch in range(2):
        h.assert_same_stream(h.collect(fast), h.collect(ref))


def test_worker_init_fn_and_worker_seeding_same_as_dataloader(h):
    """Workers are seeded as DataLoader seeds them (base seed from the generator), and
    worker_init_fn runs in each worker: the per-sample noise and worker tags must match."""

    def run(make):
        return h.collect(
            make(RandomDS(40), batch_size=8, shuffle=True, generator=gen(9), num_workers=2, worker_init_fn=seed_worker)
        )

    want = run(DataLoader)
    got = run(fastdata.loader)
    h.assert_same_stream(got, want)
    tags = torch.cat([b[4] for b in got]).unique().tolist()
    assert tags == [100, 101], "worker_init_fn should have run in both workers"
    noise = torch.cat([b[2] for b in got])
    assert noise.unique().numel() > 30, "the noise should vary"


class WhereDS(Dataset):
    """Samples that say where they were made (-1: this process, else the worker's id) and what
    this process's torch RNG gave (with workers, the worker's, seeded from the base seed)."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, i):
        info = get_worker_info()
        return i, -1 if info is None else info.id, torch.randint(0, 1 << 30, ()).item()


def tagged_collate(samples):
    return ("tagged", [s[0] for s in samples])


SETTINGS = {  # attribute -> (the value at construction, the value assigned after an epoch)
    # (torch's own iterator needs a prefetch_factor with workers, which a loader made without
    # them has not: TypeError)
    "num_workers (0 to 2)": ("num_workers", 0, 2, {"prefetch_factor": 2}),
    "num_workers (2 to 0)": ("num_workers", 2, 0, {}),
    "collate_fn": ("collate_fn", None, tagged_collate, {}),
    "generator": ("generator", None, "new", {}),
    "timeout": ("timeout", 0, 30.0, {}),
}


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_a_setting_assigned_after_construction_counts_from_the_next_iter_as_torchs(setting, h):
    """torch's DataLoader reads num_workers, collate_fn, generator, timeout, ... at each iter(),
    so a script may assign them after construction; the drop-in loader's batches follow them
    too (where each sample was made, the order, the RNG draws, the collation)."""
    name, before, after, also = SETTINGS[setting]
    runs = []
    for make in (DataLoader, fastdata.loader):
        torch.manual_seed(5)
        kw = {} if before is None else {name: before}
        workers = kw.get("num_workers", 2 if name == "timeout" else 0)
        loader = make(WhereDS(), batch_size=4, shuffle=True, **{"num_workers": workers, **kw})
        epochs = [h.collect(loader)]
        setattr(loader, name, gen(3) if after == "new" else after)
        for key, value in also.items():
            setattr(loader, key, value)
        epochs += [h.collect(loader), h.collect(loader)]
        runs.append((epochs, torch.rand(2)))
    (want, want_rng), (got, got_rng) = runs
    for g, w in zip(got, want):
        h.assert_same_stream(g, w)
    assert torch.equal(got_rng, want_rng)
    if name == "num_workers":  # the samples were made where torch made them
        assert {int(x) for b in got[1] for x in b[1]} == ({-1} if after == 0 else {0, 1})
    if name == "collate_fn":
        assert got[1][0][0] == "tagged"


@pytest.mark.timeout(60)
def test_a_forked_child_dropping_a_pass_leaves_its_workers_alone():
    """A process forked while a pass with workers is under way (a worker of another loader, a
    subprocess the script forks) holds a copy of the pass; dropping that copy there does not
    shut down the parent's workers, and says nothing."""
    import contextlib
    import io

    loader = fastdata.loader(TupleDS(40), batch_size=4, num_workers=2)
    it = iter(loader)
    first = next(it)
    pid = os.fork()
    if pid == 0:  # the child: drop its copy of the pass, then report what that printed
        code = 3
        try:
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                del it
                gc.collect()
            code = 1 if err.getvalue() else 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    rest = [labels for _, labels in it]
    assert torch.cat([first[1], *rest]).tolist() == list(range(40))


@pytest.mark.parametrize("case", list(CASES))
def test_len_same_as_dataloader(case):
    ref, fast = make_pair(case)
    assert len(fast) == len(ref)


class Buckets:
    """A batch sampler with no __len__, as bucketing samplers often are: any iterable of index
    lists serves DataLoader, which needs a length only for len(loader)."""

    def __iter__(self):
        yield from ([0, 1, 2], [3, 4], [5, 6, 7, 8], [9])


class Picks(torch.utils.data.Sampler):
    """A sampler with no __len__ (torch's Sampler makes it optional)."""

    def __init__(self) -> None:
        pass

    def __iter__(self):
        return iter([9, 7, 5, 3, 1])


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("kw", [dict(batch_sampler=Buckets()), dict(sampler=Picks(), batch_size=2),
                                dict(sampler=Picks(), batch_size=None)], ids=["batch_sampler", "sampler", "sampler-1"])
def test_samplers_without_len_iterate_as_dataloaders(kw, num_workers, h):
    ds = TupleDS(10)
    ref, fast = DataLoader(ds, num_workers=num_workers, **kw), fastdata.loader(ds, num_workers=num_workers, **kw)
    for loader in (ref, fast):
        with pytest.raises(TypeError, match="has no len"):
            len(loader)
    for _ in range(2):
        h.assert_same_stream(h.collect(fast), h.collect(ref))
    it = iter(fast)
    next(it)
    state = fast.state_dict()
    again = fastdata.loader(ds, num_workers=num_workers, **kw)
    again.load_state_dict(state)
    h.assert_same_stream(h.collect(again), h.collect(ref)[1:])


@pytest.mark.parametrize(
    "n, batch_size, drop_last, expected",
    [(50, 16, False, 4), (50, 16, True, 3), (48, 16, False, 3), (48, 16, True, 3), (5, 16, True, 0), (5, 16, False, 1)],
)
def test_len_drop_last(n, batch_size, drop_last, expected):
    fast = fastdata.loader(TupleDS(n), batch_size=batch_size, drop_last=drop_last)
    assert len(fast) == len(DataLoader(TupleDS(n), batch_size=batch_size, drop_last=drop_last)) == expected
    fast = fastdata.loader(IterDS(n), batch_size=batch_size, drop_last=drop_last)
    assert len(fast) == expected


@pytest.mark.parametrize("num_workers", [0, 2])
def test_iterator_counts_its_batches_as_dataloaders(num_workers):
    """`_num_yielded` of iter(loader), as DataLoader's iterator counts the batches it handed out;
    a pass given its loader's index sampler has that sampler's len() (TypeError without len(),
    as DataLoader's iterator over an IterableDataset); without one, len() raises TypeError and the
    pass is true."""
    from fastdata.backends.torch_iter import Pass

    fast = iter(fastdata.loader(TupleDS(40), batch_size=16, num_workers=num_workers))
    ref = iter(DataLoader(TupleDS(40), batch_size=16, num_workers=num_workers))
    for _ in range(2):
        next(fast), next(ref)
    assert fast._num_yielded == ref._num_yielded == 2 and len(fast) == len(ref) == 3
    del fast, ref
    sized = Pass((x for x in [1, 2]), BatchSampler(range(5), 2, False))
    assert len(sized) == 3 and sized and list(sized) == [1, 2] and sized._num_yielded == 2
    assert not Pass((x for x in []), BatchSampler(range(0), 2, False))
    with pytest.raises(TypeError):
        len(Pass((x for x in []), iter(range(3))))
    unsized = Pass((x for x in [1]))
    assert unsized
    with pytest.raises(TypeError, match="has no len"):
        len(unsized)


def test_native_path_is_exercised(monkeypatch, h):
    """Leaves routed to the native core pass through `_new_batch` (a ring slot or a fresh
    buffer). In a worker every leaf of at least 64 KiB goes there; in the main process only
    strided ones (or batches of 32 MiB and more), since torch.stack is as fast on the rest."""
    calls = []
    real = fastdata._collate._new_batch

    def spy(n, shape, dtype):
        calls.append((n, (n, *shape), dtype, n * int(np.prod(shape)) * dtype.itemsize))
        return real(n, shape, dtype)

    monkeypatch.setattr(fastdata._collate, "_new_batch", spy)
    # The policy inside a worker process (the spy cannot see into real ones).
    monkeypatch.setattr(fastdata._collate, "_worth_it", lambda nbytes, contiguous: nbytes >= fastdata._collate._NATIVE_MIN_BYTES)
    ref, fast = make_pair("dict-sequential")
    h.assert_same_stream(h.collect(fast), h.collect(ref))
    dtypes = {dtype for n, shape, dtype, nbytes in calls if n == 16}
    assert dtypes == {torch.float32, torch.float64, torch.float16, torch.int64, torch.bool}
    # Only batches of at least 64 KiB go there: in the last batch (8 samples) the 48 KiB float16
    # leaf, the 32 KiB masks and the tiny leaves are stacked by torch.
    assert all(nbytes >= fastdata._collate._NATIVE_MIN_BYTES for *_, nbytes in calls)
    assert {dtype for n, shape, dtype, nbytes in calls if n == 8} == {torch.float32, torch.float64, torch.int64}

    monkeypatch.undo()
    monkeypatch.setattr(fastdata._collate, "_new_batch", spy)
    calls.clear()
    ref, fast = make_pair("tuple-shuffle")  # HWC images seen as CHW: strided
    h.assert_same_stream(h.collect(fast), h.collect(ref))
    assert (16, (16, 3, H, W), torch.uint8, 16 * 3 * H * W) in calls


def test_default_collate_named_is_collated_natively(monkeypatch, h):
    """collate_fn=default_collate, as torchvision's references pass it: the same batches as
    DataLoader's, collated natively (the spy sees the image leaves)."""
    calls = []
    real = fastdata._collate._new_batch

    def spy(n, shape, dtype):
        calls.append((n, shape, dtype))
        return real(n, shape, dtype)

    monkeypatch.setattr(fastdata._collate, "_new_batch", spy)
    ref, fast = make_pair("tuple-shuffle", collate_fn=torch.utils.data.default_collate)
    h.assert_same_stream(h.collect(fast), h.collect(ref))
    assert (16, (3, H, W), torch.uint8) in calls


def test_native_flag_follows_environment():
    disabled = os.environ.get("FASTDATA_DISABLE_NATIVE", "0").lower() not in ("", "0", "false", "no")
    built = importlib.util.find_spec("fastdata._native") is not None
    assert fastdata._collate.NATIVE is (built and not disabled)


# 3. backend and stats.


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize(
    "make, samples",
    [
        (lambda: (TupleDS(50), dict(batch_size=16, shuffle=True, generator=gen(1))), 50),
        (lambda: (TupleDS(50), dict(batch_size=16, drop_last=True)), 48),
        (lambda: (DictDS(40), dict(batch_size=16)), 40),
        (lambda: (TupleDS(7), dict(batch_size=None)), 7),
        (lambda: (IterDS(45), dict(batch_size=16)), 45),
    ],
    ids=["tuple", "drop_last", "dict", "batch_size_None", "iterable"],
)
def test_backend_and_stats(make, samples, num_workers, h):
    ds, kw = make()
    fast = fastdata.loader(ds, num_workers=num_workers, **kw)
    assert fast.backend == "torch"
    assert isinstance(fast, fastdata.Loader)
    batches = h.collect(fast)
    stats = fast.stats
    assert set(stats) >= {"samples", "batches", "skipped", "errors", "wait_s"}
    assert stats["batches"] == len(batches)
    if not (isinstance(ds, IterableDataset) and num_workers > 1):
        # (each worker of an iterable dataset batches its own shard: more, shorter batches)
        assert len(batches) == len(fast)
    assert stats["samples"] == samples
    assert stats["skipped"] == 0
    assert list(stats["errors"]) == []
    assert isinstance(stats["wait_s"], float) and stats["wait_s"] >= 0


# 1 (continued). Buffer reuse never overwrites a batch the user still holds.


def _check_tuple_batch(batch, what):
    images, labels = batch
    assert images.shape[1:] == (3, H, W) and images.dtype == torch.uint8, what
    for image, label in zip(images, labels.tolist()):
        assert torch.equal(image, torch.from_numpy(image_chw(label))), f"{what}: sample {label} overwritten"


@pytest.mark.parametrize("num_workers, persistent", [(0, False), (2, False), (2, True)], ids=["0", "2", "2-persistent"])
@pytest.mark.parametrize("keep", ["all", "every-other", "views"])
def test_held_batches_stay_intact(keep, num_workers, persistent, h):
    """Holds batches (or only views of them) without cloning across two epochs, while the
    loader keeps collating: every held tensor must keep its values."""
    kw = dict(batch_size=16, shuffle=True, num_workers=num_workers, persistent_workers=persistent)
    ref = DataLoader(TupleDS(150), generator=gen(11), **kw)
    want = h.collect(ref) + h.collect(ref)
    fast = fastdata.loader(TupleDS(150), generator=gen(11), **kw)
    held = []
    for epoch in range(2):
        for i, batch in enumerate(fast):
            n = epoch * len(fast) + i
            if keep == "all":
                held.append((n, batch))
            elif keep == "every-other" and n % 2 == 0:
                held.append((n, batch))
            elif keep == "views":
                # Only views of the batch survive it: a slice of the images, a numpy view.
                held.append((n, (batch[0][1:5], batch[1][1:5].numpy())))
            del batch
            gc.collect()
    assert len(held) == {"all": 20, "every-other": 10, "views": 20}[keep]
    for n, batch in held:
        if keep == "views":
            images, labels = batch
            assert torch.equal(images, want[n][0][1:5]), f"view of batch {n} overwritten"
            assert np.array_equal(labels, want[n][1][1:5].numpy())
            _check_tuple_batch((images, torch.from_numpy(labels)), f"view of batch {n}")
        else:
            h.assert_same(batch, want[n], f"held batch {n}")
            _check_tuple_batch(batch, f"held batch {n}")


@pytest.mark.parametrize("num_workers", [0, 2])
def test_released_buffers_are_reused(num_workers):
    """The premise of the tests above: a batch dropped at once gives its buffer back (the
    images land in a few recycled buffers), a batch held keeps its own."""
    fast = fastdata.loader(TupleDS(150), batch_size=16, num_workers=num_workers)
    ptrs = []
    for batch in fast:
        ptrs.append(batch[0].data_ptr())
        del batch
    assert len(set(ptrs)) < len(ptrs) == 10
    held = list(fast)
    assert len({batch[0].data_ptr() for batch in held}) == len(held) == 10
    for batch in held:
        _check_tuple_batch(batch, "held batch")


@pytest.mark.parametrize("num_workers", [0, 2])
def test_held_dict_batches_stay_intact(num_workers, h):
    """Many leaves per batch, all held for the whole epoch."""
    ref, fast = make_pair("dict-shuffle-drop_last", num_workers=num_workers)
    want = h.collect(ref) + h.collect(ref)
    held = list(fast) + list(fast)
    gc.collect()
    h.assert_same_stream(held, want)


# 4. Exact mid-epoch resume.


def _resume_run(h, make, k, num_workers, **extra):
    """make(seed, num_workers, factory=fastdata.loader, **extra) -> loader. Returns (epochs 0 and
    1 of an uninterrupted DataLoader, the first k batches of an interrupted fastdata run, what a
    fresh fastdata loader built with a different seed yields for the rest of epoch 0 and for
    epoch 1 after loading the state taken after those k batches and round-tripped through
    pickle). All loaders are gone when it returns: a failing assertion must not keep worker
    processes alive in a traceback."""
    ref = make(1, num_workers, factory=DataLoader, **extra)
    epoch0, epoch1 = h.collect(ref), h.collect(ref)
    del ref
    assert 0 <= k <= len(epoch0)

    first = make(1, num_workers, **extra)
    it = iter(first)
    head = h.take(it, k)
    state = pickle.loads(pickle.dumps(first.state_dict()))
    del it, first

    resumed = make(2, num_workers, **extra)
    resumed.load_state_dict(state)
    rest = h.collect(resumed)
    following = h.collect(resumed)
    del resumed
    return epoch0, epoch1, head, rest, following


def _resume_check(h, make, k, num_workers, **extra):
    epoch0, epoch1, head, rest, following = _resume_run(h, make, k, num_workers, **extra)
    h.assert_same_stream(head, epoch0[:k])
    h.assert_same_stream(rest, epoch0[k:])
    h.assert_same_stream(following, epoch1)


def _shuffled(seed, num_workers, factory=fastdata.loader, **extra):
    """50 samples in batches of 8: 7 batches per epoch."""
    return factory(TupleDS(50), batch_size=8, shuffle=True, generator=gen(seed), num_workers=num_workers, **extra)


@pytest.mark.parametrize(
    "num_workers, k",
    [
        (0, 0),
        (0, 1),
        (0, 3),
        (0, 6),  # len - 1
        (2, 0),
        (2, 1),
        (2, 3),
        (2, 6),  # len - 1
    ],
)
def test_resume_mid_epoch_shuffled(num_workers, k, h):
    assert len(_shuffled(1, 0)) == 7
    _resume_check(h, _shuffled, k, num_workers)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("k", [1, 3])
def test_resume_mid_epoch_sequential(num_workers, k, h):
    """No shuffle, so no RNG: the skip itself must land on the right batch."""

    def make(seed, num_workers, factory=fastdata.loader):
        return factory(DictDS(40), batch_size=8, num_workers=num_workers)

    _resume_check(h, make, k, num_workers)


@pytest.mark.parametrize(
    "num_workers, k",
    [
        (0, 0),
        (0, 2),
        (2, 2),
    ],
)
def test_resume_global_rng(num_workers, k, h):
    """generator=None: the shuffle comes from torch's global RNG, which the state restores
    (the resumed loader is made after reseeding the global RNG differently)."""

    def make(seed, num_workers, factory=fastdata.loader):
        torch.manual_seed(76 + seed)
        return factory(TupleDS(50), batch_size=8, shuffle=True, num_workers=num_workers)

    _resume_check(h, make, k, num_workers)


def test_resume_persistent_workers(h):
    _resume_check(h, _shuffled, 2, 2, persistent_workers=True)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_between_epochs(num_workers, h):
    """A state taken after a full epoch resumes to the same next epochs."""
    ref = _shuffled(1, num_workers, factory=DataLoader)
    epochs = [h.collect(ref) for _ in range(3)]
    first = _shuffled(1, num_workers)
    h.assert_same_stream(h.collect(first), epochs[0])
    state = pickle.loads(pickle.dumps(first.state_dict()))
    resumed = _shuffled(2, num_workers)
    resumed.load_state_dict(state)
    h.assert_same_stream(h.collect(resumed), epochs[1])
    h.assert_same_stream(h.collect(resumed), epochs[2])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_from_a_state_taken_at_the_last_batch(num_workers, h):
    """A state taken inside the loop at the epoch's last batch (a checkpoint every N steps that
    lands there), before the loop asks past it: RandomSampler draws from the generator once
    more at its end, and the resumed loader's next epochs are the unbroken run's. 48 samples in
    batches of 8: the last batch is whole, so the batch sampler gives it before its sampler ends
    (a partial one comes only after)."""
    def make(seed, factory=fastdata.loader):
        return factory(TupleDS(48), batch_size=8, shuffle=True, generator=gen(seed), num_workers=num_workers)

    ref = make(1, DataLoader)
    epochs = [h.collect(ref) for _ in range(3)]
    first = make(1)
    for k, _ in enumerate(first):
        if k == len(first) - 1:
            state = pickle.loads(pickle.dumps(first.state_dict()))
    h.assert_same_stream(h.collect(first), epochs[1])
    resumed = make(2)
    resumed.load_state_dict(state)
    h.assert_same_stream(h.collect(resumed), epochs[1])
    h.assert_same_stream(h.collect(resumed), epochs[2])


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("k", [1, 4])
def test_resume_iterable(num_workers, k, h):
    """An iterable dataset cannot seek: it is fast-forwarded to the same place."""

    def make(seed, num_workers, factory=fastdata.loader):
        return factory(IterDS(45), batch_size=8, num_workers=num_workers, generator=gen(seed))

    _resume_check(h, make, k, num_workers)


def test_load_state_dict_rejects_garbage():
    fast = fastdata.loader(TupleDS(4), batch_size=2)
    with pytest.raises(ValueError):
        fast.load_state_dict({"version": -1})
    with pytest.raises(ValueError):
        fast.load_state_dict("not a state")


def test_a_state_taken_with_another_batch_size_is_refused():
    """The position counts batches: 3 batches of 8 are not 3 batches of 4, so a state taken with
    batch_size=8 resumes only a loader with batch_size=8, mid-epoch or between epochs."""
    taken = fastdata.loader(TupleDS(40), batch_size=8, shuffle=True, generator=gen(0))
    it = iter(taken)
    first = [i for _ in range(3) for i in next(it)[1].tolist()]
    state = taken.state_dict()
    assert state["batch_size"] == 8
    with pytest.raises(ValueError, match=r"taken with batch_size=8: .* resume with batch_size=8, not 4"):
        fastdata.loader(TupleDS(40), batch_size=4, shuffle=True, generator=gen(0)).load_state_dict(state)
    resumed = fastdata.loader(TupleDS(40), batch_size=8, shuffle=True, generator=gen(0))
    resumed.load_state_dict(state)
    rest = [i for _, y in resumed for i in y.tolist()]
    assert len(rest) == 16 and sorted(first + rest) == list(range(40))


def test_a_state_resumed_under_another_order_is_warned_of():
    """The position counts batches of the order the state was taken in: a train loader's state
    (shuffled) given to a loader of the same data in order resumes with a warning that names
    both, as image mode's does; under the same order, none. The batches are this loader's."""
    taken = fastdata.loader(TupleDS(40), batch_size=8, shuffle=True, generator=gen(0))
    it = iter(taken)
    next(it)
    state = taken.state_dict()
    assert state["order"] == "RandomSampler"
    ordered = fastdata.loader(TupleDS(40), batch_size=8)
    with pytest.warns(UserWarning, match=r"^resuming with a SequentialSampler, but the state was taken with a "
                      r"RandomSampler: the 1 batches .* the rest of its epoch may repeat") as caught:
        ordered.load_state_dict(state)
    assert caught[0].filename == __file__
    assert [y.tolist() for _, y in ordered] == [list(range(k, k + 8)) for k in range(8, 40, 8)]
    buckets = fastdata.loader(TupleDS(40), batch_sampler=[[0, 1], [2, 3]])
    next(iter(buckets))
    other = fastdata.loader(TupleDS(40), batch_sampler=([2, 3], [0, 1]))
    with pytest.warns(UserWarning, match=r"resuming with a tuple, but the state was taken with a list"):
        other.load_state_dict(buckets.state_dict())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same = fastdata.loader(TupleDS(40), batch_size=8, shuffle=True, generator=gen(0))
        same.load_state_dict(state)
        between = fastdata.loader(TupleDS(40), batch_size=8)
        between.load_state_dict(fastdata.loader(TupleDS(40), batch_size=8, shuffle=True).state_dict())


# 5. Early exit shuts the workers down.


def _alive_children():
    return {p.pid for p in multiprocessing.active_children()}


def test_early_exit_shuts_down_workers(h):
    before = _alive_children()
    fast = fastdata.loader(TupleDS(200), batch_size=16, shuffle=True, generator=gen(3), num_workers=2)
    it = iter(fast)
    batch = next(it)
    assert len(h.new_children(before, timeout=0)) == 2, "two workers should be running"
    del it
    gc.collect()
    assert h.new_children(before, timeout=10) == [], "workers still alive after the iterator died"
    # The batch lives in memory a dead worker collated into: it must still be whole, also after
    # a whole new epoch whose workers may recycle that worker's buffers.
    _check_tuple_batch(batch, "batch held past its workers")
    view = batch[0][3:7]
    labels = batch[1].clone()
    del batch
    assert len(h.collect(fast)) == len(fast)
    assert len(h.collect(fast)) == len(fast)
    _check_tuple_batch((view, labels[3:7]), "view held across the next epochs")
    assert h.new_children(before, timeout=10) == []


def test_break_out_of_epoch_shuts_down_workers(h):
    before = _alive_children()
    fast = fastdata.loader(TupleDS(200), batch_size=16, num_workers=2)
    for i, batch in enumerate(fast):
        if i == 2:
            break
    del batch
    assert h.new_children(before, timeout=10) == []


def test_persistent_workers_exit_with_loader(h):
    before = _alive_children()
    fast = fastdata.loader(TupleDS(64), batch_size=16, num_workers=2, persistent_workers=True)
    h.collect(fast)
    h.collect(fast)
    del fast
    assert h.new_children(before, timeout=10) == []


# 6. Argument errors.


def test_unknown_keyword_raises_type_error():
    with pytest.raises(TypeError, match="shufle"):
        fastdata.loader(TupleDS(8), batch_size=2, shufle=True)


@pytest.mark.parametrize(
    "make",
    [
        lambda: (TupleDS(8), dict(batch_size=4, batch_sampler=BatchSampler(range(8), 2, False))),
        lambda: (TupleDS(8), dict(batch_size=4, sampler=range(8), shuffle=True)),
        lambda: (IterDS(8), dict(batch_size=4, shuffle=True)),
        lambda: (TupleDS(8), dict(batch_size=4, num_workers=-1)),
        lambda: (TupleDS(8), dict(batch_size=4, num_workers=0, prefetch_factor=2)),
    ],
    ids=["batch_sampler+batch_size", "sampler+shuffle", "iterable+shuffle", "negative-workers", "prefetch-no-workers"],
)
def test_dataloader_argument_errors(make):
    ds, kw = make()
    with pytest.raises(ValueError):
        DataLoader(ds, **kw)
    with pytest.raises(ValueError):
        fastdata.loader(ds, **kw)


@pytest.mark.parametrize("count", [np.int64(2), torch.tensor(1), True], ids=["numpy", "tensor", "bool"])
def test_num_workers_of_any_integer_type_dataloader_takes(count, h):
    ref, fast = (make(TupleDS(12), batch_size=4, num_workers=count) for make in (DataLoader, fastdata.loader))
    assert fast.num_workers == int(count)
    h.assert_same_stream(h.collect(fast), h.collect(ref))


def test_the_worker_count_warning_comes_as_often_as_dataloaders():
    """torch warns of more workers than cores at construction and at each iter(): once each, not
    again for the DataLoader the loader works through."""
    import warnings

    counts = []
    for make in (DataLoader, fastdata.loader):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            loader = make(TupleDS(8), batch_size=4, num_workers=len(os.sched_getaffinity(0)) + 1)
            built = sum("worker processes in total" in str(w.message) for w in seen)
            assert len(list(loader)) == 2
            counts.append((built, sum("worker processes in total" in str(w.message) for w in seen)))
    assert counts[1] == counts[0] == (1, 2)


_READ_ONLY = """
import sys
import numpy as np, torch
import fastdata

class DS(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        a = np.full((64, 64, 3), i, np.uint8).transpose(2, 0, 1)  # a view: collated natively
        a.setflags(write=False)  # np.load(mmap_mode="r"), np.frombuffer: arrays torch cannot write
        return a

make = torch.utils.data.DataLoader if sys.argv[1] == "torch" else fastdata.loader
(batch,) = list(make(DS(), batch_size=8))
assert batch.flatten(1).float().mean(1).tolist() == list(range(8))
"""


def test_read_only_arrays_get_torchs_warning_as_with_dataloader():
    """default_collate's torch.as_tensor warns (once a process) that the array is not writable;
    the native copy gives that warning too."""
    import subprocess
    import sys

    said = [subprocess.run([sys.executable, "-c", _READ_ONLY, kind], capture_output=True, text=True, timeout=60)
            for kind in ("torch", "fastdata")]
    assert [r.returncode for r in said] == [0, 0], said[1].stderr
    warned = [[line for line in r.stderr.splitlines() if "is not writable" in line] for r in said]
    assert len(warned[0]) == len(warned[1]) == 1


_HALF_READ = """
import os, sys
import numpy as np, torch
import fastdata
from fastdata import transforms as T

if sys.argv[1] == "images":
    from PIL import Image
    os.makedirs(os.path.join(sys.argv[2], "a"), exist_ok=True)
    for i in range(8):
        Image.new("RGB", (40, 30), (30 * i, 0, 0)).save(os.path.join(sys.argv[2], "a", f"{i}.png"))
    loader = fastdata.loader(sys.argv[2], batch_size=2, num_workers=2, device="cpu", transform=T.Compose([T.Resize((16, 16))]))
else:
    make = torch.utils.data.DataLoader if sys.argv[1] == "torch" else fastdata.loader
    loader = make(torch.utils.data.TensorDataset(torch.arange(64.0)), batch_size=4, num_workers=2)
dataiter = iter(loader)  # a tutorial's "show some images": a pass kept half read at the top level
batch = next(dataiter)
print("pid", os.getpid(), len(batch))
"""


@pytest.mark.timeout(120)
def test_a_pass_left_half_read_at_exit_ends_quietly(tmp_path):
    """A script that keeps a pass with workers half read at its top level and exits, plain or
    under `fastdata run`: as with DataLoader, it exits 0 and prints nothing to stderr but the
    run's summary (the pass is ended while the interpreter is whole, not by its teardown), and
    leaves nothing in /dev/shm."""
    import subprocess
    import sys

    script = tmp_path / "half_read.py"
    script.write_text(_HALF_READ)
    plain, run = [sys.executable], [sys.executable, "-m", "fastdata", "run", "--", sys.executable]
    # (a natively served torchvision dataset under fastdata run: tests/tools/test_run_arrays.py)
    for kind, launch in (("torch", plain), ("drop-in", plain), ("images", plain), ("torch", run)):
        before = set(os.listdir("/dev/shm"))  # a name left by an earlier process that had this pid is not the script's
        done = subprocess.run([*launch, str(script), kind, str(tmp_path / "set")], capture_output=True, text=True,
                              timeout=100, env=dict(os.environ, OMP_NUM_THREADS="1"))
        assert done.returncode == 0 and done.stdout.startswith("pid"), (kind, done.stderr[-2000:])
        err = done.stderr if launch is plain else done.stderr.split("fastdata run: 1 DataLoader(s)")[0]
        assert err == "", (kind, launch, done.stderr[-2000:])
        pid = done.stdout.split()[1]
        assert not [n for n in set(os.listdir("/dev/shm")) - before if f"_{pid}_" in n], kind


def test_a_generator_that_is_no_generator_fails_at_iter_as_dataloaders_does():
    """torch takes any generator= and fails when its iterator draws the base seed."""
    errors = []
    for make in (DataLoader, fastdata.loader):
        loader = make(TupleDS(8), batch_size=4, shuffle=True, generator=5)  # both take it
        with pytest.raises(TypeError) as e:
            iter(loader)
        errors.append(str(e.value))
    assert errors[0] == errors[1] and "generator" in errors[0]


def test_bad_num_workers_string():
    with pytest.raises(TypeError, match="lots"):
        fastdata.loader(TupleDS(8), batch_size=4, num_workers="lots")


# 7. device="cpu".


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu")])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_device_cpu_same_batches(device, num_workers, h):
    ds, kw = CASES["dict-shuffle-drop_last"]()
    ref = DataLoader(ds, num_workers=num_workers, **kw)
    ds, kw = CASES["dict-shuffle-drop_last"]()
    fast = fastdata.loader(ds, num_workers=num_workers, device=device, **kw)
    got, want = h.collect(fast), h.collect(ref)
    h.assert_same_stream(got, want)
    for batch in got:
        assert all(t.device.type == "cpu" for t in (batch["tensor"], batch["f64"], batch["nested"][1][1]))
        assert isinstance(batch["name"], list) and all(isinstance(s, str) for s in batch["name"])
        labels = batch["nested"][0].tolist()
        assert batch["name"] == [f"sample-{i}" for i in labels]


# 8. num_workers="auto".


def test_num_workers_auto_leaves_a_core_to_a_process_driving_cuda(monkeypatch):
    import fastdata._loader as base

    for cores, cpu, cuda in ((1, 1, 1), (2, 2, 1), (16, 16, 15), (17, 16, 16), (64, 16, 16)):
        monkeypatch.setattr(base, "usable_cores", lambda cores=cores: cores)
        assert (resolve_workers("auto", "cpu"), resolve_workers("auto", "cuda:0")) == (cpu, cuda), cores
    monkeypatch.setattr(base, "usable_cores", lambda: 16)
    monkeypatch.setattr(base.torch.cuda, "is_available", lambda: True)
    assert resolve_workers("auto") == 15  # no device named: a CUDA device present
    monkeypatch.setattr(base.torch.cuda, "is_available", lambda: False)
    assert resolve_workers("auto") == 16 and resolve_workers(3, "cuda") == 3


def test_num_workers_auto(h):
    from fastdata._cores import usable_cores

    resolved = resolve_workers("auto")
    cores = usable_cores()  # the affinity, at most a cgroup's CPU limit (tests/unit/test_cores.py)
    assert resolved == max(1, min(16, cores - 1 if torch.cuda.is_available() and cores > 1 else cores))
    for case in ("tuple-shuffle", "iterable-sharded"):
        ds, kw = CASES[case]()
        want = h.collect(DataLoader(ds, num_workers=resolved, **kw))
        ds, kw = CASES[case]()
        fast = fastdata.loader(ds, num_workers="auto", **kw)
        h.assert_same_stream(h.collect(fast), want)


# set_epoch reaches the sampler, as DistributedSampler needs.


def test_set_epoch_reaches_distributed_sampler(h):
    def sampler():
        return DistributedSampler(TupleDS(40), num_replicas=2, rank=1, shuffle=True, seed=5)

    ref_sampler = sampler()
    ref = DataLoader(TupleDS(40), batch_size=8, sampler=ref_sampler)
    fast = fastdata.loader(TupleDS(40), batch_size=8, sampler=sampler())
    for epoch in (0, 1, 2):
        ref_sampler.set_epoch(epoch)
        fast.set_epoch(epoch)
        h.assert_same_stream(h.collect(fast), h.collect(ref))
    ref_sampler.set_epoch(0)
    fast.set_epoch(1)
    assert [b[1].tolist() for b in h.collect(fast)] != [b[1].tolist() for b in h.collect(ref)]


class _DiesInWorker(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        if i == 9 and torch.utils.data.get_worker_info() is not None:
            os._exit(3)  # a worker killed mid-epoch (OOM killer, segfault in a decoder, ...)
        return torch.full((4,), i)


def test_a_dead_worker_ends_in_an_error_not_a_hang(h):
    import multiprocessing

    before = {p.pid for p in multiprocessing.active_children()}
    loader = fastdata.loader(_DiesInWorker(), batch_size=4, num_workers=2, timeout=60)
    with pytest.raises(RuntimeError, match="exited unexpectedly|worker"):
        for _ in loader:
            pass
    assert not h.new_children(before)  # the other worker too is gone


def test_a_shutdown_cut_short_by_an_error_leaves_no_worker(monkeypatch, h):
    """DataLoader's SIGCHLD handler raises wherever the main thread is. Raised inside a pass's
    shutdown before it tells the workers to end, they would wait for their next index as long
    as this process lives (DataLoader's iterator, kept here, does not end them): the pass's end
    kills them."""
    import multiprocessing

    from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter as Iter

    real, kept = Iter._shutdown_workers, []

    def cut_short(self):
        monkeypatch.setattr(Iter, "_shutdown_workers", real)
        kept.append(self)
        raise RuntimeError("DataLoader worker (pid 1) exited unexpectedly with exit code 3")

    before = {p.pid for p in multiprocessing.active_children()}
    it = iter(fastdata.loader(TupleDS(40), batch_size=4, num_workers=2))
    next(it)
    monkeypatch.setattr(Iter, "_shutdown_workers", cut_short)
    with pytest.raises(RuntimeError, match="exit code 3"):
        it.close()
    assert kept and not h.new_children(before)


class Busy(Dataset):
    """Each item costs about 1 ms of CPU and reads nothing."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        end = time.thread_time() + 0.001
        while time.thread_time() < end:
            pass
        return torch.full((4,), float(i))


@pytest.mark.parametrize("workers", [0, 2])
def test_the_consumers_step_is_not_the_loaders_time(workers):
    """With no workers the batch is fetched when it is asked for; workers ahead of the consumer
    wait for their next indices. Either way the consumer's own step (a 50 ms sleep a batch
    here) is not counted as the loader reading or fetching, and the fetch's CPU (1 ms an item)
    is counted as the dataset's."""
    loader = fastdata.loader(Busy(), batch_size=8, num_workers=workers)
    assert loader.set_stage_timing(True)
    batches = 0
    for _ in loader:
        time.sleep(0.05)
        batches += 1
    stages = loader.stage_seconds()
    assert batches == 8 and stages["images"] == 64
    assert stages["read"] < 0.5 * 0.05 * batches, stages  # the 400 ms of sleeps are not reads
    assert 0.5 * 0.064 < stages["dataset"] < 0.05 * batches, stages


class _Flipped(Dataset):
    """HWC float32 images read BGR and flipped to RGB as a view (`[..., ::-1]`: a negative stride),
    108 KB a sample."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return np.full((96, 96, 3), i, np.float32)[..., ::-1]


class _Clips(Dataset):
    """4-D samples (frames, channels, height, width) in channels_last, 256 KB each."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.arange(2 * 8 * 64 * 64, dtype=torch.float32).reshape(2, 8, 64, 64).add(i).contiguous(
            memory_format=torch.channels_last)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_arrays_of_a_negative_stride_raise_torchs_error(num_workers):
    """torch.as_tensor refuses an array with a negative stride, so DataLoader's collate raises
    for such samples, whatever their size: fastdata's native copy raises the same, where it had
    copied them silently above its size threshold."""
    errors = []
    for make in (DataLoader, fastdata.loader):
        with pytest.raises(ValueError) as e:
            next(iter(make(_Flipped(), batch_size=4, num_workers=num_workers)))
        errors.append(str(e.value).strip().splitlines()[-1])
    assert errors[0] == errors[1] and "negative" in errors[0]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_channels_last_samples_batch_in_dataloaders_layout(num_workers):
    """In the training process DataLoader's collate stacks without `out=`, which keeps channels_last
    samples' layout (not contiguous); from workers it stacks into shared memory, contiguous.
    fastdata's batches have the same values, strides and contiguity."""
    got = [next(iter(make(_Clips(), batch_size=4, num_workers=num_workers))) for make in (DataLoader, fastdata.loader)]
    assert torch.equal(got[0], got[1])
    assert got[0].stride() == got[1].stride() and got[0].is_contiguous() == got[1].is_contiguous()
    assert got[0].is_contiguous() == (num_workers > 0)


def test_a_state_taken_out_of_order_warns_that_it_is_not_exact():
    """With in_order=False, workers hand batches out as they finish: those delivered need not
    be the epoch's first k, which a resume skips, so the state says so."""
    loader = fastdata.loader(TensorDS(32), batch_size=4, num_workers=2, in_order=False)
    it = iter(loader)
    next(it)
    with pytest.warns(UserWarning, match="in_order=False: its workers' batches came out of order"):
        loader.state_dict()
    del it
    ordered = fastdata.loader(TensorDS(32), batch_size=4, num_workers=2)
    it = iter(ordered)
    next(it)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ordered.state_dict()
