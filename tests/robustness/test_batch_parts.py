"""A batch of large files is read and decoded a part at a time (`read.MAX_PART_BYTES`), so that
crafted or merely large files cannot make a batch's read hold batch_size x 256 MiB: here the
limit is set to about two of the test's files, so each batch of 6 is read in 3 or more parts.
The batches, their errors and their skips are the same as read whole, with and without workers
and the native reader, and on the `dali` backend (each part a DALI batch of its own); a part holds
at most the limit, or one file."""

import os

import pytest
import torch

import fastdata
from fastdata.image import read
from _images import color_folder

CLASSES, PER_CLASS, BATCH = 3, 6, 6


@pytest.fixture
def folder(tmp_path):
    root = color_folder(tmp_path / "images", CLASSES, PER_CLASS, (40, 64), lambda i: f"{i:02d}.jpg")
    (root / "class1" / "03.jpg").write_bytes((root / "class1" / "03.jpg").read_bytes()[:300])  # cut short
    return root


def _largest(folder) -> int:
    return max(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(folder) for f in fs)


def _epochs(folder, workers, **kw):
    kw.setdefault("transform", fastdata.transforms.imagenet_train(24))
    loader = fastdata.loader(str(folder), batch_size=BATCH, shuffle=True, seed=3, num_workers=workers,
                             on_error="skip", **kw)
    out = [[(x.clone(), y.clone()) for x, y in loader] for _ in range(2)]
    return out, loader.stats["skipped"], [(e["path"], e["count"]) for e in loader.stats["errors"]]


def _same(a, b):
    assert len(a) == len(b)
    for ea, eb in zip(a, b):
        assert [len(y) for _, y in ea] == [len(y) for _, y in eb]
        for (xa, ya), (xb, yb) in zip(ea, eb):
            assert torch.equal(ya, yb) and torch.equal(xa, xb)


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_batch_read_in_parts_is_the_batch_read_whole(folder, monkeypatch, workers, native):
    if not native:
        monkeypatch.setattr(read, "_ext", None)
    whole = _epochs(folder, workers)
    budget = 2 * _largest(folder)
    calls = []
    reads = read.read_files

    def spied(paths, threads, budget=None):
        got = reads(paths, threads, budget)
        sizes = [len(d) for d in got if isinstance(d, bytes)]
        calls.append((budget, sizes))
        return got

    monkeypatch.setattr(read, "MAX_PART_BYTES", budget)
    monkeypatch.setattr(read, "read_files", spied)
    parts = _epochs(folder, workers)
    _same(parts[0], whole[0])
    assert parts[1:] == whole[1:] == (2, [(str(folder / "class1" / "03.jpg"), 2)])  # skipped once an epoch
    labels = sorted(int(v) for epoch in whole[0][:1] for _, y in epoch for v in y)
    assert labels == sorted(c for c in range(CLASSES) for i in range(PER_CLASS) if (c, i) != (1, 3))
    if workers == 0:  # (the workers' calls are theirs)
        assert len(calls) > 2 * 3 * 2, "no batch was read in parts"
        assert all(sum(sizes) <= budget or len(sizes) == 1 for b, sizes in calls if b is not None)


@pytest.mark.dali
def test_dali_fed_in_parts_gives_the_batches_it_gives_whole(folder, monkeypatch):
    """DALI holds what its prefetch queue holds: a batch of large files goes to it a part at a
    time, each part a DALI batch, and the parts are joined into the batch read whole."""
    from fastdata.image.dali import DaliDecoders

    transform = fastdata.transforms.Compose([fastdata.transforms.RandomResizedCrop(24),
                                             fastdata.transforms.RandomHorizontalFlip()])
    whole = _epochs(folder, 2, backend="dali", transform=transform)
    fed = []
    feed = DaliDecoders._inputs
    monkeypatch.setattr(DaliDecoders, "_inputs", lambda self, read, more, timing: fed.append(
        sum(len(d) for d in read.datas)) or feed(self, read, more, timing))
    budget = 2 * _largest(folder)
    monkeypatch.setattr(read, "MAX_PART_BYTES", budget)
    parts = _epochs(folder, 2, backend="dali", transform=transform)
    _same(parts[0], whole[0])
    assert parts[1:] == whole[1:] == (2, [(str(folder / "class1" / "03.jpg"), 2)])
    assert len(fed) > 2 * 3 * 2 and max(fed) <= budget, "no batch was fed in parts"


@pytest.mark.parametrize("backend", ["wds", pytest.param("dali", marks=pytest.mark.dali)])
def test_shards_of_two_sizes_in_two_parts_fail_as_in_one(tmp_path, monkeypatch, backend):
    from PIL import Image
    from fastdata.image import read_shards
    from fastdata.shard import write_shards

    root = tmp_path / "mixed"
    (root / "a").mkdir(parents=True)
    for i, side in enumerate([32, 32, 48, 48]):
        Image.new("RGB", (side, side), (10 * i, 0, 0)).save(root / "a" / f"{i}.jpg", quality=95)
    write_shards(root, tmp_path / "s-%06d.tar", max_count=10, workers=1)
    errors = []
    for budget in (None, 2 * _largest(root)):
        if budget is not None:
            monkeypatch.setattr(read_shards, "MAX_PART_BYTES", budget)
        loader = fastdata.loader(str(tmp_path / "s-000000.tar"), batch_size=4, backend=backend)
        with pytest.raises(ValueError) as e:
            next(iter(loader))
        errors.append(str(e.value))
    assert errors[0] == errors[1] and "member 00000000.jpg) is 32x32" in errors[0] and "is 48x48" in errors[0]


def test_images_of_two_sizes_in_two_parts_fail_as_in_one(tmp_path, monkeypatch):
    from PIL import Image

    root = tmp_path / "mixed"
    (root / "a").mkdir(parents=True)
    for i, side in enumerate([32, 32, 48, 48]):
        Image.new("RGB", (side, side), (10 * i, 0, 0)).save(root / "a" / f"{i}.jpg", quality=95)
    errors = []
    for budget in (None, 2 * _largest(root)):
        if budget is not None:
            monkeypatch.setattr(read, "MAX_PART_BYTES", budget)
        loader = fastdata.loader(str(root), batch_size=4)
        with pytest.raises(ValueError) as e:
            next(iter(loader))
        errors.append(str(e.value))
    assert errors[0] == errors[1] and "0.jpg is 32x32" in errors[0] and "2.jpg is 48x48" in errors[0]


def test_reads_in_order_within_the_budget_natively_and_in_python(tmp_path, monkeypatch):
    paths = []
    for i, size in enumerate([10, 20, 30, 0, 5]):
        paths.append(str(tmp_path / f"{i}"))
        (tmp_path / f"{i}").write_bytes(bytes([i]) * size)
    paths.insert(2, str(tmp_path / "missing"))
    want = {None: [10, 20, "No such file or directory", 30, 0, 5], 0: [10] + [None] * 5,
            25: [10] + [None] * 5, 30: [10, 20, "No such file or directory"] + [None] * 3,
            60: [10, 20, "No such file or directory", 30, 0, None]}
    for native in ([True, False] if read._ext is not None else [False]):
        if not native:
            monkeypatch.setattr(read, "_ext", None)
        for budget, sizes in want.items():
            got = read.read_files(paths, 2, budget)
            assert [len(d) if isinstance(d, bytes) else d for d in got] == sizes, (native, budget)
            assert all(d == bytes([int(os.path.basename(p))]) * len(d) for p, d in zip(paths, got)
                       if isinstance(d, bytes))


@pytest.mark.parametrize("workers", [0, 1])
def test_a_part_whose_files_all_fail_keeps_its_errors(tmp_path, monkeypatch, workers):
    """Six files of one size, read two a part: the middle part's two are zeros (no image), so
    that part decodes to nothing; its two skips are counted and the other four come out."""
    from PIL import Image

    root = tmp_path / "set"
    (root / "a").mkdir(parents=True)
    for i in range(6):
        Image.new("RGB", (32, 32), (40 * i, 0, 0)).save(root / "a" / f"{i}.jpg", quality=95)
    sizes = {os.path.getsize(root / "a" / f"{i}.jpg") for i in range(6)}
    for i in (2, 3):
        (root / "a" / f"{i}.jpg").write_bytes(bytes(max(sizes)))
    monkeypatch.setattr(read, "MAX_PART_BYTES", 2 * max(sizes))
    loader = fastdata.loader(str(root), batch_size=6, num_workers=workers, on_error="skip")
    (images, labels), = list(loader)
    assert [int(v) for v in images[:, 0, 0, 0]] == [0, 40, 160, 200] and labels.tolist() == [0] * 4
    assert loader.stats["skipped"] == 2
    assert sorted(e["path"] for e in loader.stats["errors"]) == [str(root / "a" / f"{i}.jpg") for i in (2, 3)]
