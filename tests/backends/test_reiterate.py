"""A new `iter(loader)` while an older iterator is still alive, and epochs consumed by count.

Trainers (Lightning's fetchers, `limit_train_batches`, a sanity check) take exactly
`len(loader)` batches and never call `next()` again, and often make the next epoch's iterator
before the last one is dropped. Every sample must still come exactly once per epoch, each
with its own label, however the old iterator dies: kept referenced, or dropped a few batches
into the next epoch (as a reference cycle would have it)."""

import random

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


class Drawn(torch.utils.data.Dataset):
    """Sample i: (i, a draw from the fetching process's RNG)."""

    def __len__(self):
        return 22

    def __getitem__(self, i):
        return i, torch.rand(())


class Counted(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(22))


class Reshuffled(torch.utils.data.Sampler):
    """A sampler of the script's with state of its own: each pass a new order from its own
    `random.Random`, so an order drawn again is another one."""

    def __init__(self):
        self.rng = random.Random(0)

    def __iter__(self):
        order = list(range(22))
        self.rng.shuffle(order)
        return iter(order)

    def __len__(self):
        return 22


def _overlapping(make, scenario):
    """What a script gets from two iterators of one loader made by `make`, alive together:
    (the older pass's batches, the newer's, this process's RNG after)."""
    torch.manual_seed(0)
    loader = make()
    older, newer = [], []
    if scenario == "peek":  # a look at a batch inside the loop
        for k, batch in enumerate(loader):
            older.append(_kept(batch))
            if k == 1:
                newer.append(_kept(next(iter(loader))))
    elif scenario == "zip":  # the same loader twice
        for a, b in zip(loader, loader):
            older.append(_kept(a))
            newer.append(_kept(b))
    else:  # a second pass run whole, then the first goes on
        first = iter(loader)
        older.append(_kept(next(first)))
        newer = [_kept(b) for b in iter(loader)]
        older += [_kept(b) for b in first]
    return older, newer, torch.rand(())  # torch's leaves the RNG where the draws put it


def _kept(batch):
    """A batch cloned out of the loader's reused slots."""
    if isinstance(batch, (list, tuple)):
        return type(batch)(_kept(b) for b in batch)
    return batch.clone() if isinstance(batch, torch.Tensor) else batch


@pytest.mark.parametrize("scenario", ["peek", "zip", "second_whole"])
@pytest.mark.parametrize("workers,persistent", [(0, False), (2, False), (2, True)])
@pytest.mark.parametrize("data", ["shuffled", "unbatched", "iterable", "own-sampler"])
def test_a_pass_a_newer_iter_started_goes_on_as_torchs(h, scenario, workers, persistent, data):
    """Each iterator of torch's DataLoader goes on by itself. An older fastdata pass, ended when
    a newer one started, gives the rest of its batches when asked: the same samples in the same
    order as torch's, with 0 workers the same RNG draws, and this process's RNG left where
    torch's leaves it. With persistent workers the reference is torch's DataLoader without
    them (torch's own would restart the older pass on them); a newer pass on persistent
    workers draws less from the RNG (as torch's), so there only the older pass is compared. A
    sampler of the script's goes on from the older pass's own sampler iterator."""
    if data == "iterable" and persistent:
        pytest.skip("persistent workers over an iterable dataset: as without them, for the older pass")
    dataset = Counted() if data == "iterable" else Drawn()
    kw = dict(batch_size=None if data == "unbatched" else 4, shuffle=data in ("shuffled", "unbatched"),
              num_workers=workers)
    sampler = (lambda: {"sampler": Reshuffled()}) if data == "own-sampler" else dict
    want = _overlapping(lambda: torch.utils.data.DataLoader(dataset, **kw, **sampler()), scenario)
    got = _overlapping(lambda: fastdata.loader(dataset, persistent_workers=persistent, **kw, **sampler()), scenario)
    if workers:  # each worker draws from its own RNG, which a pass on new workers does not carry on
        want, got = ([[_ids(b) for b in batches] for batches in run[:2]] + [run[2]] for run in (want, got))
    assert len(got[0]) == len(want[0]) > 5
    h.assert_same(got[0], want[0], "older")
    if persistent:
        ids = torch.cat([torch.as_tensor(b).reshape(-1) for b in got[1]]).tolist()
        assert len(ids) == len(set(ids)) == sum(torch.as_tensor(b).numel() for b in want[1])
    else:
        h.assert_same(got[1], want[1], "newer")
        assert torch.equal(got[2], want[2])


@pytest.mark.parametrize("scenario", ["peek", "zip", "second_whole"])
@pytest.mark.parametrize("workers,persistent", [(0, False), (2, False), (2, True)])
def test_an_image_pass_a_newer_iter_started_goes_on_with_its_own_batches(folder, scenario, workers, persistent):
    """Image mode: the older pass, asked for more after a newer iter(), gives the rest of its
    epoch, pixel for pixel the batches it would have given; the newer pass runs an epoch whole
    (the next, or the same when the older one had handed out nothing)."""
    want = [(x.clone(), y.clone()) for x, y in _make("image", folder, 0, False)]
    older, newer, _ = _overlapping(lambda: _make("image", folder, workers, persistent), scenario)
    assert len(older) == len(want)
    for (a, b), (c, d) in zip(older, want):
        assert torch.equal(a, c) and torch.equal(b, d)
    if scenario != "peek":
        _check_images(newer)


def _ids(batch):
    return batch[0] if isinstance(batch, list) else batch


def test_the_rest_of_a_pass_counts_in_stats_and_the_newest_pass_holds_the_state():
    loader = fastdata.loader(Indexed(), batch_size=BATCH, shuffle=True, num_workers=0)
    first = iter(loader)
    head = [_kept(next(first))]
    second = iter(loader)
    next(second), next(second)
    _check_dropin(head + list(first))
    assert loader.stats["batches"] == len(loader) + 2 and loader.stats["samples"] == N + 2 * BATCH
    assert loader.state_dict()["batches"] == 2  # where the newest pass stands
    assert len(list(second)) == len(loader) - 2


@pytest.mark.parametrize("workers", [0, 2])
def test_a_dropin_state_taken_before_a_pass_draws_its_shuffle_resumes_that_pass(workers):
    """With 0 workers a pass draws its shuffle at its first batch: a state taken between iter()
    and that batch resumes the pass's own order, not the previous pass's."""
    make = lambda: fastdata.loader(Indexed(), batch_size=BATCH, shuffle=True, num_workers=workers)  # noqa: E731
    torch.manual_seed(0)
    loader = make()
    list(loader)
    it = iter(loader)
    state = loader.state_dict()
    want = [y.clone() for _, y in it]
    resumed = make()
    resumed.load_state_dict(state)
    got = [y.clone() for _, y in resumed]
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))


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
