"""Native collation against the Python fallback and against torch's default_collate."""

import math
import os

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate

from fastdata import _collate
from fastdata._buffers import BufferRing
from fastdata._collate import RingCollate, collate, copy_into_python

native = pytest.mark.skipif(not _collate.NATIVE, reason="native extension disabled")


def test_native_extension_is_built_unless_disabled():
    # CI builds the extension: a silent fallback would leave the native path untested.
    disabled = os.environ.get("FASTDATA_DISABLE_NATIVE", "0") not in ("", "0", "false", "no")
    assert _collate.NATIVE is not disabled


DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64, torch.bool]


def _samples(dtype, n, shape, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return [torch.rand(shape, generator=g) > 0.5 for _ in range(n)]
    if dtype.is_floating_point:
        return [torch.randn(shape, generator=g).to(dtype) * 100 for _ in range(n)]
    info = torch.iinfo(dtype)
    return [torch.randint(info.min, info.max, shape, generator=g, dtype=torch.int64).to(dtype)
            for _ in range(n)]


# Each view maker turns a contiguous sample into a strided view of the same logical shape.
VIEWS = {
    "contiguous": lambda t: t,
    "hwc_as_chw": lambda t: t.permute(1, 2, 0).contiguous().permute(2, 0, 1),
    "flipped": lambda t: t.flip(-1).contiguous().flip(-1) if t.dtype != torch.bool else t,
    "every_other": lambda t: torch.cat([t, t], -1)[..., ::2],
    "transposed": lambda t: t.transpose(-1, -2).contiguous().transpose(-1, -2),
}


@native
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("view", sorted(VIEWS))
@pytest.mark.parametrize("channels", [1, 2, 3, 4, 5])
def test_native_equals_fallback(dtype, view, channels):
    samples = [VIEWS[view](s) for s in _samples(dtype, 7, (channels, 9, 13), seed=channels)]
    ref = torch.stack(samples)
    for threads in (1, 3):
        out = torch.empty_like(ref)
        _collate.copy_into_native(samples, out, threads)
        assert torch.equal(out, ref)
        fallback = torch.empty_like(ref)
        copy_into_python(samples, fallback)
        assert torch.equal(out, fallback)


@native
@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32, torch.float64])
@pytest.mark.parametrize("source", ["chw", "hwc_as_chw"])
def test_native_into_channels_last(dtype, source):
    samples = [VIEWS["contiguous" if source == "chw" else "hwc_as_chw"](s)
               for s in _samples(dtype, 5, (3, 17, 11), seed=3)]
    out = torch.empty(5, 3, 17, 11, dtype=dtype).contiguous(memory_format=torch.channels_last)
    _collate.copy_into_native(samples, out, 2)
    assert out.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(out, torch.stack(samples))


@native
def test_native_odd_shapes_and_numpy():
    cases = [
        [np.array(float(i)) for i in range(4)],  # 0-d arrays
        [np.zeros((0, 3), np.float32) for _ in range(3)],  # empty
        [np.arange(2 * 3 * 4 * 5 * 6, dtype=np.int32).reshape(2, 3, 4, 5, 6)[:, ::-1, :, ::2] + i for i in range(3)],
        [np.broadcast_to(np.arange(5, dtype=np.int16) + i, (4, 5)) for i in range(3)],  # stride 0
        [np.full((7, 7, 3), i, np.uint8).transpose(2, 0, 1)[:, 1:, :-1] for i in range(3)],
    ]
    for samples in cases:
        ref = torch.stack([torch.as_tensor(np.array(s)) for s in samples])
        out = torch.empty_like(ref)
        _collate.copy_into_native(samples, out, 2)
        assert torch.equal(out, ref)


@native
def test_native_rejects_mismatched_samples():
    out = torch.empty(2, 3, 4)
    with pytest.raises(ValueError, match="shape"):
        _collate.copy_into_native([torch.zeros(3, 4), torch.zeros(3, 5)], out)
    with pytest.raises(ValueError, match="dtype"):
        _collate.copy_into_native([torch.zeros(3, 4), torch.zeros(3, 4, dtype=torch.float64)], out)


def _assert_same(a, b):
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
    else:
        assert a == b


def test_collate_equals_default_collate_on_nested_samples():
    batch = [
        {
            "image": np.full((64, 64, 3), i, np.uint8).transpose(2, 0, 1),  # native path
            "mask": torch.full((1, 128, 128), float(i)),  # native path
            "label": i,
            "score": np.float32(i) / 2,
            "name": f"s{i}",
            "pair": (torch.tensor([i, -i]), [float(i)]),
        }
        for i in range(8)
    ]
    _assert_same(collate(batch), default_collate(batch))
    _assert_same(RingCollate(slots=2)(batch), default_collate(batch))


def test_batch_len_is_the_first_arrays_rows():
    rows = torch.zeros(5, 3)
    assert _collate.batch_len(rows) == 5
    assert _collate.batch_len((rows, torch.arange(5))) == 5
    assert _collate.batch_len({"label": 3, "image": torch.zeros(7, 2)}) == 7  # the first array, not the first value
    assert _collate.batch_len({"id": ["a", "b", "c", "d"], "x": np.zeros((4, 2))}) == 4
    assert _collate.batch_len([{"x": np.zeros(6)}, "meta"]) == 6
    assert _collate.batch_len(["a", "b", "c"]) == 3  # no arrays: a list of samples
    assert _collate.batch_len({"loss": torch.tensor(1.0), "y": torch.zeros(9)}) == 9  # a 0-d tensor has no rows
    assert _collate.batch_len(torch.tensor(2.0)) == 1 and _collate.batch_len(7) == 1
    assert _collate.batch_len({"text": ["a", "b"], "label": [0, 1]}) == 2  # a dict of columns
    assert _collate.batch_len({}) == 1 and _collate.batch_len([]) == 0
    # given the batch size drawn: that, unless the first array is shorter (time-first padding: 34 steps of 8)
    assert _collate.batch_len((torch.zeros(34, 8), torch.zeros(8)), 8) == 8
    assert _collate.batch_len((torch.zeros(5, 3), torch.zeros(5)), 8) == 5
    assert _collate.batch_len((["a"] * 8, ["b"] * 8), 8) == 8


def test_ring_reuses_a_slot_only_when_no_tensor_holds_it():
    collate_fn = RingCollate(slots=2)
    batch = [np.full((64, 64, 3), i, np.uint8).transpose(2, 0, 1) for i in range(16)]  # strided: native
    first = collate_fn(batch)
    view = first[3:5]  # a view keeps the slot held after `first` is gone
    first_ptr = view.data_ptr() - 3 * 3 * 64 * 64
    del first
    seen = {collate_fn(batch).data_ptr() for _ in range(6)}
    assert first_ptr not in seen
    assert torch.equal(view, torch.stack([torch.as_tensor(np.ascontiguousarray(b)) for b in batch[3:5]]))
    del view
    assert first_ptr in {collate_fn(batch).data_ptr() for _ in range(4)}


def test_full_ring_falls_back_to_fresh_buffers():
    ring = BufferRing(slots=1, shared=False)
    assert ring.begin()
    target, held = ring.alloc((2, 3), torch.float32)
    ring.end()
    assert not ring.begin()  # the only slot is held by `held`
    assert ring.alloc((2, 3), torch.float32) is None
    del target, held
    assert ring.begin()


@pytest.mark.parametrize("forks", [False, True])
def test_a_ring_of_a_process_that_forks_is_made_in_shared_memory(forks, monkeypatch):
    """A main-process ring of a process that forks workers holds its slots in shared pages (no
    copy-on-write after a fork), made there at once: `share_memory_`, which copies a storage into
    new pages, is never called. Without forks the slots are private."""
    def copied(self):
        raise AssertionError("share_memory_ copies the storage")

    monkeypatch.setattr(torch.UntypedStorage, "share_memory_", copied)
    ring = BufferRing(slots=2, shared=False, forks=forks)
    for k in range(4):
        assert ring.begin()
        target, held = ring.alloc((3, 1000 * (k + 1)), torch.float32)  # (larger each time: the slot grows)
        target.copy_(torch.arange(3000 * (k + 1), dtype=torch.float32).view(3, -1) + k)
        ring.end()
        assert [storage.is_shared() for storage in ring.storages if storage is not None] == [forks] * min(k + 1, 2)
        assert torch.equal(held, torch.arange(3000 * (k + 1), dtype=torch.float32).view(3, -1) + k)
        del target, held


def test_a_batch_that_reserves_its_bytes_gets_one_storage_made_once():
    """With `reserve` (the bytes of all a batch's buffers, as `fastdata run`'s views give it) the
    slot is made that large at its first buffer: every buffer of the batch in that one storage,
    and the next batch in that slot in it again; without, the slot grows buffer by buffer."""
    from fastdata._buffers import new_batch

    shapes = [(4, 3, 32, 32), (4, 3, 32, 32), (4, 3, 16, 16), (4, 3, 16, 16)]
    total = sum(math.prod(shape) * 4 for shape in shapes)
    for reserve in (total, 0):
        ring = BufferRing(slots=1, shared=False, forks=True)
        made = []
        for batch in range(2):
            held = []
            for k, shape in enumerate(shapes):
                target, handle = new_batch(ring, shape, torch.float32, reserve)
                target.fill_(10 * batch + k)
                held.append(handle)
                made.append(ring.storages[0])
            ring.end()
            assert [float(h.flatten()[0]) for h in held] == [10 * batch + k for k in range(len(shapes))]
            del target, handle, held
        distinct = len({id(storage) for storage in made})
        assert (distinct == 1) if reserve else (distinct > 1), (reserve, distinct)


@native
@pytest.mark.parametrize("view", sorted(VIEWS))
def test_raw_address_path_equals_fallback(view):
    samples = [VIEWS[view](s) for s in _samples(torch.float32, 6, (3, 8, 5), seed=9)]
    out = torch.empty(6, 3, 8, 5)
    _collate._copy_checked_tensors(samples, out, 2)
    assert torch.equal(out, torch.stack(samples))


def test_nested_tensors_get_torch_own_error():
    nested = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])
    with pytest.raises(RuntimeError) as theirs:
        torch.utils.data.default_collate([nested, nested])
    with pytest.raises(RuntimeError) as ours:
        collate([nested, nested])
    assert str(ours.value) == str(theirs.value)


class _Leaves(torch.utils.data.Dataset):
    """Samples of every kind of small leaf (each a function of its index), and a large one."""

    def __len__(self):
        return 40

    def __getitem__(self, i):
        return {"int": i, "float": i / 4, "bool": i % 2 == 0, "np_float": np.float32(i) / 2, "np_bool": np.bool_(i % 3),
                "tensor": torch.full((3, 4), float(i)), "bf16": torch.full((2,), float(i), dtype=torch.bfloat16),
                "array": np.arange(5, dtype=np.int16) + i, "scalar": torch.tensor(i), "empty": torch.zeros(0),
                "large": torch.full((3, 64, 64), float(i))}  # 48 KB a sample: native, into the worker's ring


@pytest.mark.timeout(120)
@pytest.mark.parametrize("persistent", [False, True])
def test_a_workers_batches_are_default_collates_and_cross_without_a_descriptor_per_leaf(monkeypatch, persistent):
    """From workers, small leaves cross by value and the ring's storages once each: torch's
    sharing would hand the main process a file descriptor over a socket per tensor per batch."""
    from multiprocessing import resource_sharer

    received = []  # the descriptors this process takes from the workers' sockets
    real = resource_sharer.DupFd.detach
    monkeypatch.setattr(resource_sharer.DupFd, "detach", lambda self: received.append(1) or real(self))
    ds = _Leaves()
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2, collate_fn=RingCollate(slots=4),
                                         persistent_workers=persistent)
    batches = 0
    for _ in range(3):
        for k, got in enumerate(loader):
            want = default_collate([ds[i] for i in range(4 * k, 4 * k + 4)])
            _assert_same(got, want)
            assert not any(got[key].is_shared() for key in got if key != "large")  # (by value)
            batches += 1
    # Each worker's ring (flags, then each slot's storage) is sent once; fresh workers each
    # epoch adopt it, so nothing more is sent after the first epoch.
    assert batches == 30 and 0 < len(received) <= 2 * (1 + 4)


def test_a_small_leaf_crosses_by_value():
    from multiprocessing.reduction import ForkingPickler

    for t in (torch.arange(6, dtype=torch.bfloat16).view(2, 3), torch.tensor([True, False]), torch.tensor(7),
              torch.zeros(0, 3), torch.arange(10.0)[::2], torch.from_numpy(np.zeros(0, np.int64)),
              torch.zeros(3, 0, 2)):  # (from_numpy of an empty array: stride 0)
        back = ForkingPickler.loads(ForkingPickler.dumps(_collate.ByValue(t)))
        assert type(back) is torch.Tensor and back.dtype == t.dtype and back.shape == t.shape
        assert torch.equal(back, t) and back.is_contiguous() and not back.is_shared()


def test_a_worker_slot_sends_its_storage_only_when_the_main_process_lacks_it():
    from fastdata._buffers import WorkerRings

    record = WorkerRings()
    ring = BufferRing(slots=2, shared=True, token=record.token, worker=0)

    def batch(n):
        ring.begin()
        out, leaf = ring.alloc((n,), torch.float32)
        out.copy_(torch.arange(float(n)))
        ring.end()
        rebuild, args = leaf.__reduce__()
        return rebuild, args

    first = batch(4)
    assert first[1][2] is not None and first[1][3] is not None  # the flags and the slot's storage
    got = first[0](*first[1])
    assert torch.equal(got, torch.arange(4.0))
    del got
    again = batch(4)  # the other slot: its storage is new, the flags are known
    assert again[1][2] is None and again[1][3] is not None
    again[0](*again[1])
    known = batch(4)  # the first slot again
    assert known[1][2] is None and known[1][3] is None
    assert torch.equal(known[0](*known[1]), torch.arange(4.0))
    grown = batch(1 << 16)  # a larger batch: the slot's storage is replaced, and sent
    assert grown[1][3] is not None
    assert torch.equal(grown[0](*grown[1]), torch.arange(float(1 << 16)))
    stranger = WorkerRings()  # a record that never received this worker's ring
    with pytest.raises(RuntimeError, match="never sent"):
        known[0](stranger.token, *known[1][1:])


class _Growing(torch.utils.data.Dataset):
    """Small samples first (so a worker's RingCollate takes its shortcut), then 48 KB ones."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.full((3, 64, 64) if i >= 32 else (3,), float(i)), i


@pytest.mark.timeout(120)
def test_a_workers_shortcut_sends_small_leaves_by_value_and_large_ones_in_shared_memory():
    loader = torch.utils.data.DataLoader(_Growing(), batch_size=4, num_workers=2, collate_fn=RingCollate(slots=4))
    for k, (x, y) in enumerate(loader):
        assert torch.equal(y, torch.arange(4 * k, 4 * k + 4))
        assert torch.equal(x, torch.stack([torch.full(x.shape[1:], float(i)) for i in y]))
        assert not y.is_shared()
        assert x.is_shared() == (k >= 8)  # a 196 KB batch is never copied through the message


def _collated_types(batch):
    out = collate(batch)  # as a collate_fn of the user's that wraps the drop-in's would call it
    return {k: type(v).__name__ for k, v in out.items()}, out["int"].float()


@pytest.mark.timeout(60)
def test_collate_called_in_a_worker_gives_tensors():
    loader = torch.utils.data.DataLoader(_Leaves(), batch_size=4, num_workers=1, collate_fn=_collated_types)
    types, floats = next(iter(loader))
    assert set(types.values()) == {"Tensor"} and torch.equal(floats, torch.arange(4.0))


def test_a_small_mixed_layout_batch_in_a_worker_gets_torchs_error(monkeypatch):
    from torch.utils.data._utils import worker

    # As in a worker (torch's collate then allocates shared memory: its error names that op),
    # without forking one.
    monkeypatch.setattr(worker, "_worker_info", worker.WorkerInfo(id=0, num_workers=1, seed=0, dataset=None))
    batch = [torch.zeros(3), torch.zeros(3).to_sparse()]
    with pytest.raises(Exception) as theirs:
        default_collate(batch)
    with pytest.raises(Exception) as ours:
        RingCollate(slots=2)(batch)
    assert type(ours.value) is type(theirs.value) and str(ours.value) == str(theirs.value)
