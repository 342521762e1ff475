"""A new `iter(loader)` while an older iterator is still alive, and epochs consumed by count.

Trainers (Lightning's fetchers, `limit_train_batches`, a sanity check) take exactly
`len(loader)` batches and never call `next()` again, and often make the next epoch's iterator
before the last one is dropped. Every sample must still come exactly once per epoch, each
with its own label, however the old iterator dies: kept referenced, or dropped a few batches
into the next epoch (as a reference cycle would have it)."""

import numpy as np
import pytest
import torch

import fastdata
from _images import color_folder
from fastdata import transforms as T

N, BATCH = 80, 8


class Indexed(torch.utils.data.Dataset):
    """Sample i: a (3, 48, 48) float image filled with i (a batch is 221 KB, over the size
    at which batches are collated into ring slots), and the label i."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        return torch.full((3, 48, 48), float(i)), i


def _check_dropin(batches):
    ids = []
    for images, labels in batches:
        flat = images.flatten(1)
        assert torch.equal(flat.min(1).values, flat.max(1).values), "an image is not one value"
        assert torch.equal(flat[:, 0].long(), labels), "an image came with another sample's label"
        ids += labels.tolist()
    assert sorted(ids) == list(range(N)), f"{len(set(ids))} distinct samples of {N}"
    return ids


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    # 4 classes x 20 images, flat colors naming (class, number): see tests/_images.py
    return color_folder(tmp_path_factory.mktemp("imgs"), 4, 20, (40, 90), lambda i: f"{i:03d}.jpg")


def _check_images(batches):
    ids = []
    for images, labels in batches:
        x = images.float()
        r, g = x[:, 0].mean((1, 2)), x[:, 1].mean((1, 2))
        cls, num = torch.round((r - 20) / 40).long(), torch.round((g - 10) / 12).long()
        assert torch.equal(cls, labels), "an image came with another image's label"
        ids += (cls * 20 + num).tolist()
    assert sorted(ids) == list(range(N)), f"{len(set(ids))} distinct images of {N}"
    return ids


def _make(kind, folder, workers, persistent):
    if kind == "dropin":
        return fastdata.loader(Indexed(), batch_size=BATCH, shuffle=True, num_workers=workers,
                               persistent_workers=persistent, generator=torch.Generator().manual_seed(0))
    return fastdata.loader(str(folder), batch_size=BATCH, shuffle=True, num_workers=workers,
                           persistent_workers=persistent, backend="pil",
                           transform=T.Compose([T.RandomResizedCrop(24), T.RandomHorizontalFlip()]))


CASES = [(kind, workers, persistent) for kind in ("dropin", "image") for workers in (0, 2)
         for persistent in ((False, True) if workers else (False,))]


@pytest.mark.parametrize("kind, workers, persistent", CASES)
@pytest.mark.parametrize("old", ["kept", "dropped_late"])
def test_every_sample_once_per_epoch_when_iterators_overlap(folder, kind, workers, persistent, old):
    loader = _make(kind, folder, workers, persistent)
    check = _check_dropin if kind == "dropin" else _check_images
    kept, previous, orders = [], None, []
    for epoch in range(4):
        it = iter(loader)
        batches = []
        for k in range(len(loader)):  # by count: next() is never called past the last batch
            images, labels = next(it)
            batches.append((images.clone(), labels.clone()))
            del images, labels
            if k == 2 and old == "dropped_late":
                previous = None  # the last epoch's iterator dies here, mid-way through this one
        orders.append(check(batches))
        if old == "kept":
            kept.append(it)
        else:
            previous = it
        del it
    # a new pass each time: the shuffle differs from epoch to epoch
    assert len({tuple(o) for o in orders}) == 4


@pytest.mark.parametrize("workers", [0, 2])
def test_image_epoch_counts_as_finished_at_its_last_batch(folder, workers):
    """An epoch consumed by count is finished: the next iter() runs the next epoch whole, and
    state_dict() says so."""
    loader = _make("image", folder, workers, False)
    it = iter(loader)
    for _ in range(len(loader)):
        next(it)
    assert loader.state_dict()["epoch"] == 1 and loader.state_dict()["batches"] == 0
    second = list(iter(loader))
    assert len(second) == len(loader)
    assert loader.state_dict()["epoch"] == 2


def test_image_early_break_then_iter_starts_a_new_pass(folder):
    """An iterator left after 2 batches: the next iter() is a new pass (the next epoch, from
    its first batch), unless load_state_dict was just called."""
    loader = _make("image", folder, 0, False)
    it = iter(loader)
    next(it), next(it)
    state = loader.state_dict()
    assert (state["epoch"], state["batches"]) == (0, 2)
    del it
    _check_images([(x.clone(), y.clone()) for x, y in loader])  # epoch 1, whole
    assert loader.state_dict()["epoch"] == 2

    resumed = _make("image", folder, 0, False)
    resumed.load_state_dict(state)
    resumed.set_epoch(0)  # as Lightning does before each epoch: keeps the resume point
    rest = [(x.clone(), y.clone()) for x, y in resumed]
    assert len(rest) == len(loader) - 2
    full = _make("image", folder, 0, False)
    want = [(x.clone(), y.clone()) for x, y in full][2:]
    for (a, b), (c, d) in zip(rest, want):
        assert torch.equal(a, c) and torch.equal(b, d)


def test_dropin_state_after_the_last_batch_is_the_next_pass(folder):
    loader = _make("dropin", folder, 0, False)
    it = iter(loader)
    for _ in range(len(loader)):
        next(it)
    state = loader.state_dict()
    assert state["batches"] == 0


def test_a_dropped_pass_does_not_undo_a_load_or_a_set_epoch(folder):
    """Lightning makes an iterator as a check and drops it before loading the loader's state,
    and ends passes by count before calling set_epoch: neither may move the resume point."""
    make = lambda: fastdata.loader(str(folder), batch_size=5, shuffle=True, num_workers=0,  # noqa: E731
                                   transform=T.Compose([T.RandomResizedCrop(16)]), seed=2)
    want = make()
    want.set_epoch(3)
    expected = [y.clone() for _, y in want][1:]
    fresh = make()
    iter(fresh)  # the check pass, dropped before its first batch
    fresh.load_state_dict({**want.state_dict(), "epoch": 3, "batches": 1})
    got = [y.clone() for _, y in fresh]
    assert len(got) == len(expected) and all(torch.equal(a, b) for a, b in zip(got, expected))
    a = make()
    it = iter(a)
    next(it)
    next(it)
    a.set_epoch(1)
    assert len(list(a)) == len(a)


@pytest.mark.parametrize("workers,persistent", [(0, False), (2, False), (2, True)])
def test_image_set_epoch_between_iter_and_the_first_batch(folder, workers, persistent):
    """Lightning, resuming from an epoch-end checkpoint, makes the iterator and then calls
    set_epoch(1): as a DataLoader (whose sampler is read at the first batch), that iterator runs
    epoch 1, whole, in epoch 1's order."""
    want = _make("image", folder, 0, False)
    want.set_epoch(1)
    expected = _check_images([(x.clone(), y.clone()) for x, y in want])
    loader = _make("image", folder, workers, persistent)
    it = iter(loader)
    loader.set_epoch(1)
    got = _check_images([(x.clone(), y.clone()) for x, y in it])
    assert got == expected, "the iterator did not run the epoch set before its first batch"
    assert loader.state_dict()["epoch"] == 2
    assert _check_images([(x.clone(), y.clone()) for x, y in loader]) != expected, "epoch 2 repeated epoch 1's order"


def test_a_state_from_elsewhere_or_out_of_range_is_refused_in_one_line(folder, tmp_path):
    """A checkpoint is a file like any other: a position outside the epoch, or one taken over
    other data (files against shards, another sample count, images against a Dataset), is
    refused when loaded or at the next pass, never resumed as another epoch's batches."""
    from fastdata.shard import write_shards
    write_shards(str(folder), str(tmp_path / "s-%03d.tar"), workers=1, progress=False)
    shards = fastdata.loader(str(tmp_path / "s-000.tar"), batch_size=BATCH, backend="wds",
                             transform=T.Compose([T.CenterCrop(24)]))
    loaders = {"image": _make("image", folder, 0, False), "dropin": _make("dropin", folder, 0, False),
               "shards": shards}
    states = {kind: loader.state_dict() for kind, loader in loaders.items()}
    bad = {"batches": [-1, len(loaders["image"]) + 1, 2.5, True, None, "1"], "epoch": [-1, 1.5, "0"]}
    for kind, loader in loaders.items():
        for field, values in bad.items():
            for value in values:
                with pytest.raises(ValueError, match=f"the state's {field} should be an integer") as e:
                    loader.load_state_dict({**states[kind], field: value})
                    list(loader)  # a count past the end is known to be so once the pass knows its length
                assert "\n" not in str(e.value)
    for kind, other, why in [("image", "shards", "over WebDataset shards"), ("shards", "image", "over image files"),
                             ("dropin", "image", "over images")]:
        with pytest.raises(ValueError, match=why):
            loaders[kind].load_state_dict(states[other])
    for kind in ("image", "shards"):
        with pytest.raises(ValueError, match=f"taken over {N // 2} samples, but this loader has {N}"):
            loaders[kind].load_state_dict({**states[kind], "samples": N // 2})
    for kind, loader in loaders.items():  # a state of its own still resumes
        loader.load_state_dict({**states[kind], "batches": 1})
        assert len(list(loader)) == len(loader) - 1
