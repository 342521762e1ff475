"""fastdata.samplers: the sampled frequencies against the weights, the repeat factors and the
pacing, the order as a function of (seed, epoch, per-sample data), the rank shares, the state,
and exact mid-epoch resume in both modes.

Statistical checks use fixed seeds (the draws are a function of them, so nothing can flake)
and bounds of 4.5 binomial standard deviations: a sampler off by a few percent fails them."""

import math
import pickle

import numpy as np
import pytest
import torch

import fastdata
from _images import color_folder
from fastdata.samplers import CurriculumSampler, RepeatFactorSampler, WeightedSampler

CLASSES, PER_CLASS = 3, 12  # 36 images, their pixels naming (class, number)


def _within_binomial(counts, draws, p, sigmas=4.5):
    """Every count within `sigmas` binomial standard deviations of draws * p; returns the
    largest deviation in standard deviations."""
    mean = draws * p
    std = np.sqrt(draws * p * (1 - p))
    assert (np.abs(counts - mean) <= sigmas * np.maximum(std, 1e-9)).all(), (counts, mean, std)
    return float(np.max(np.abs(counts - mean) / np.maximum(std, 1e-9)))


# ------------------------------------------------------------------ the statistics


def test_weighted_frequencies_follow_the_weights():
    w = np.array([0.0, 1, 2, 3, 4, 5, 6, 7, 8, 20])
    s = WeightedSampler(w, num_samples=1000, seed=3)
    counts = sum(np.bincount(s.indices(e), minlength=10) for e in range(200))
    assert counts[0] == 0
    _within_binomial(counts, 200_000, w / w.sum())


def test_weighted_callable_and_set_weights_change_the_epoch_they_start():
    s = WeightedSampler(lambda e: [1.0, 0.0, 0.0] if e % 2 == 0 else [0.0, 0.0, 1.0], seed=1)
    assert len(s.indices(0)) == 3 and set(s.indices(0)) == {0} and set(s.indices(1)) == {2}
    s.set_weights([0.0, 1.0, 3.0])  # replaces the callable
    counts = sum(np.bincount(s.indices(e), minlength=3) for e in range(4000))
    assert counts[0] == 0
    _within_binomial(counts, 12_000, np.array([0.0, 0.25, 0.75]))


def test_weighted_without_replacement_draws_distinct_positive_samples():
    w = np.array([5.0, 0, 1, 1, 1, 1, 0, 1])
    s = WeightedSampler(w, num_samples=6, replacement=False, seed=2)
    firsts = np.zeros(8)
    for e in range(3000):
        idx = s.indices(e)
        assert len(idx) == 6 and len(set(idx.tolist())) == 6 and not {1, 6} & set(idx.tolist())
        firsts[idx[0]] += 1
    _within_binomial(firsts, 3000, w / w.sum())  # the first draw is a weighted draw
    with pytest.raises(ValueError, match="at most the 6 positive weights"):
        WeightedSampler(w, num_samples=7, replacement=False)


def test_repeat_factors_follow_the_lvis_rule():
    # 100 samples: 80 hold only category "a", 15 also "b", 5 "c" (and "a"); t = 0.1.
    cats = [["a"]] * 80 + [["a", "b"]] * 15 + [["c", "a"]] * 5
    s = RepeatFactorSampler(cats, t=0.1, seed=4)
    rb, rc = math.sqrt(0.1 / 0.15), math.sqrt(0.1 / 0.05)
    assert s.category_factors == pytest.approx({"a": 1.0, "b": 1.0, "c": rc}) and rb < 1
    want = np.array([1.0] * 95 + [rc] * 5)
    assert s.repeat_factors == pytest.approx(want)
    assert s.num_samples == math.ceil(want.sum()) == len(s.indices(0))
    epochs = 4000
    counts = np.zeros(100)
    for e in range(epochs):
        per = np.bincount(s.indices(e), minlength=100)
        # floor(r) or floor(r) + 1 copies, and one more for the one index a short epoch is padded with
        over = per - np.floor(want)
        assert (over >= 0).all() and (over <= 2).all() and (over == 2).sum() <= 1
        counts += per
    pad = (s.num_samples - want.sum()) / s.num_samples  # a short epoch's pad: this fraction more, in proportion
    frac, padded = want - np.floor(want), want * pad  # the Bernoulli extra's and the pad's probabilities
    mean, std = counts / epochs, np.sqrt((frac * (1 - frac) + padded * (1 - padded)) / epochs)
    assert (np.abs(mean - want * (1 + pad)) <= 4.5 * std).all()
    assert np.abs(mean[95:].mean() - rc) < 0.02


def test_curriculum_draws_from_the_easiest_fraction_the_pacing_says():
    difficulty = np.random.default_rng(0).permutation(100).astype(float)  # sample i's rank
    pacing = lambda e: min(1.0, 0.1 + 0.3 * e)  # noqa: E731
    s = CurriculumSampler(difficulty, pacing, seed=5)
    for e, size in [(0, 10), (1, 40), (2, 70), (3, 100), (7, 100)]:
        idx = s.indices(e)
        assert len(idx) == 100 and len(s) == 100
        assert set(idx.tolist()) == set(np.flatnonzero(difficulty < size).tolist())
        counts = np.bincount(idx, minlength=100)[difficulty < size]
        assert counts.max() - counts.min() <= 1  # shuffled passes over the subset
    with pytest.raises(ValueError, match=r"pacing\(0\) should be a fraction in \(0, 1\]"):
        CurriculumSampler(difficulty, lambda e: 0.0).indices(0)


# ------------------------------------------------------------------ determinism, ranks, state


def _samplers(seed=0):
    return [WeightedSampler(np.arange(1, 51, dtype=float), seed=seed),
            RepeatFactorSampler([[i % 7] for i in range(45)] + [[9]] * 5, t=0.2, seed=seed),
            CurriculumSampler(np.arange(50.0), lambda e: 0.5, seed=seed)]


def test_order_is_a_function_of_seed_and_epoch_only():
    for a, b, other in zip(_samplers(), _samplers(), _samplers(seed=1)):
        first = a.indices(3).copy()
        torch.manual_seed(123)
        np.random.seed(123)
        b.set_epoch(3)
        assert np.array_equal(first, b.indices()) and list(b) == first.tolist()
        assert not np.array_equal(first, a.indices(4)) and not np.array_equal(first, other.indices(3))


@pytest.mark.parametrize("world_size", [2, 3, 7])
def test_rank_shares_are_equal_and_make_the_epoch(world_size):
    for make in range(3):
        shares = []
        for rank in range(world_size):
            s = _samplers()[make]
            s.rank, s.world_size = rank, world_size
            s.set_epoch(2)
            shares.append(list(s))
            assert len(s) == len(shares[-1]) == math.ceil(s.num_samples / world_size)
        epoch = _samplers()[make].indices(2).tolist()
        merged = [x for row in zip(*shares) for x in row]
        assert merged[: len(epoch)] == epoch and merged[len(epoch):] == epoch[: len(merged) - len(epoch)]


def test_state_holds_set_weights_and_the_epoch(tmp_path):
    s = WeightedSampler(np.ones(20), seed=7)
    s.set_weights(np.arange(20.0))
    s.set_epoch(5)
    torch.save(s.state_dict(), tmp_path / "state.pt")
    fresh = WeightedSampler(np.ones(20), seed=7)
    assert not np.array_equal(fresh.indices(5), s.indices(5))
    fresh.load_state_dict(torch.load(tmp_path / "state.pt"))  # weights_only: tensors and numbers
    assert fresh.epoch == 5 and np.array_equal(fresh.indices(), s.indices(5))
    c = CurriculumSampler(np.arange(20.0), lambda e: 0.25)
    c.set_difficulty(-np.arange(20.0))
    again = CurriculumSampler(np.arange(20.0), lambda e: 0.25)
    again.load_state_dict(pickle.loads(pickle.dumps(c.state_dict())))
    assert set(again.indices(0).tolist()) == {15, 16, 17, 18, 19}
    with pytest.raises(ValueError, match="population=20"):
        WeightedSampler(np.ones(21), seed=7).load_state_dict(s.state_dict())
    with pytest.raises(ValueError, match="WeightedSampler"):
        again.load_state_dict(s.state_dict())


# ------------------------------------------------------------------ drop-in mode


class _Ids(torch.utils.data.Dataset):
    def __len__(self):
        return 50

    def __getitem__(self, i):
        return torch.tensor(i), torch.rand(())  # a draw from the global RNG: resume must keep it


@pytest.mark.parametrize("num_workers", [0, 2])
def test_dropin_follows_the_sampler_and_resumes_exactly(num_workers):
    def make(weights=None):
        s = WeightedSampler(np.arange(1, 51, dtype=float), num_samples=40, seed=3)
        if weights is not None:
            s.set_weights(weights)
        return s, fastdata.loader(_Ids(), batch_size=6, sampler=s, num_workers=num_workers)

    torch.manual_seed(0)
    s, ref = make(np.arange(50.0)[::-1].copy())
    want = []
    for epoch in range(2):
        ref.set_epoch(epoch)
        want += [b[0].tolist() for b in ref]
    assert [i for b in want[:7] for i in b] == s.indices(0).tolist() and len(ref) == 7
    torch.manual_seed(0)
    s, first = make(np.arange(50.0)[::-1].copy())
    first.set_epoch(0)
    it = iter(first)
    for _ in range(3):
        next(it)
    state = first.state_dict()  # the sampler's state (its set_weights) travels in the loader's
    del it
    s2, resumed = make()
    resumed.load_state_dict(state)
    assert np.array_equal(s2.weights(), s.weights())
    got = [b[0].tolist() for b in resumed]
    resumed.set_epoch(1)
    got += [b[0].tolist() for b in resumed]
    assert got == want[3:]


# ------------------------------------------------------------------ image mode


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    # all 32x32: batches need no transform; the pixels name the sample
    return color_folder(tmp_path_factory.mktemp("imgs"), CLASSES, PER_CLASS, (32, 33), lambda i: f"{i:03d}.jpg")


def _ids(loader):
    out = []
    for x, y in loader:
        x = x.float()
        c = torch.round((x[:, 0].mean((1, 2)) - 20) / 40).long()
        i = torch.round((x[:, 1].mean((1, 2)) - 10) / 12).long()
        assert torch.equal(c, y)
        out += (c * PER_CLASS + i).tolist()
    return out


def _weighted(**kw):
    return WeightedSampler(np.arange(1, CLASSES * PER_CLASS + 1, dtype=float), num_samples=30, seed=11, **kw)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_image_mode_serves_the_samplers_epochs(folder, num_workers):
    for s in (_weighted(), RepeatFactorSampler([[i % 5] for i in range(35)] + [[7]], t=0.2, seed=2),
              CurriculumSampler(np.arange(36.0), lambda e: 0.25 * (e + 1), seed=2)):
        loader = fastdata.loader(str(folder), batch_size=4, sampler=s, num_workers=num_workers,
                                 persistent_workers=num_workers > 0)
        assert len(loader) == math.ceil(s.num_samples / 4)
        for epoch in range(2):
            assert _ids(loader) == s.indices(epoch).tolist()
        assert loader.state_dict()["sampler"]["sampler"] == type(s).__name__


def test_image_mode_splits_the_samplers_epoch_among_ranks(folder):
    shares = [_ids(fastdata.loader(str(folder), batch_size=4, sampler=_weighted(), rank=r, world_size=4))
              for r in range(4)]
    assert [len(x) for x in shares] == [8] * 4  # 30 padded to 32
    epoch = _weighted().indices(0).tolist()
    assert [x for row in zip(*shares) for x in row] == epoch + epoch[:2]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_image_mode_resumes_mid_epoch_with_set_weights(folder, num_workers):
    def make():
        s = _weighted()
        return s, fastdata.loader(str(folder), batch_size=4, sampler=s, num_workers=num_workers)

    s, ref = make()
    s.set_weights(np.arange(36.0)[::-1].copy())
    want = _ids(ref) + _ids(ref)
    s, first = make()
    s.set_weights(np.arange(36.0)[::-1].copy())
    it = iter(first)
    for _ in range(3):
        next(it)
    state = pickle.loads(pickle.dumps(first.state_dict()))
    del it
    _, resumed = make()  # its sampler with the constructor's weights: the state restores the set ones
    resumed.load_state_dict(state)
    assert _ids(resumed) + _ids(resumed) == want[12:]
    _, plain = make()
    with pytest.raises(ValueError, match="resume with that sampler"):
        fastdata.loader(str(folder), batch_size=4).load_state_dict(state)
    assert _ids(plain)[:12] != want[:12]


def test_image_mode_refuses_what_it_cannot_serve(folder, tmp_path):
    with pytest.raises(ValueError, match="mutually exclusive with shuffle"):
        fastdata.loader(str(folder), batch_size=4, sampler=_weighted(), shuffle=True)
    with pytest.raises(ValueError, match="should index the 36 samples"):
        fastdata.loader(str(folder), batch_size=4, sampler=WeightedSampler(np.ones(35)))
    with pytest.raises(TypeError, match="fastdata.samplers sampler"):
        fastdata.loader(str(folder), batch_size=4, sampler=torch.utils.data.RandomSampler(range(36)))
    from fastdata.shard import write_shards

    write_shards(str(folder), str(tmp_path / "s-%d.tar"), max_count=20, shuffle=False)
    with pytest.raises(ValueError, match="read sequentially"):
        fastdata.loader(str(tmp_path / "s-{0..1}.tar"), batch_size=4, sampler=_weighted(), backend="wds")


@pytest.fixture(scope="module")
def gradients(tmp_path_factory):
    """Six 64x48 JPEGs, each its own class, whose pixels give the place they came from (red
    grows with the column, green with the row): two crops or flips of one image differ."""
    from PIL import Image

    root = tmp_path_factory.mktemp("gradients")
    x, y = np.meshgrid(np.arange(64), np.arange(48))
    for i in range(6):
        (root / f"c{i}").mkdir()
        rgb = np.stack([x * 4, y * 5, np.full_like(x, 30 * i)], axis=-1).astype(np.uint8)
        Image.fromarray(rgb).save(root / f"c{i}" / "a.jpg", quality=95)
    return root


@pytest.mark.parametrize("how", ["pil, 0 workers", "pil, 2 workers", "pil, batches read in parts",
                                 pytest.param("dali", marks=pytest.mark.dali), "placement gpu, on the CPU device"])
def test_a_sample_repeated_in_an_epoch_gets_draws_of_its_own(gradients, how, monkeypatch):
    """A sampler that repeats a sample (drawn with replacement, or by its repeat factor) gives
    each repeat its own crop, flip and pixel ops, as a DataLoader's per-sample transforms
    would; the first time keeps the draws the sample has without repeats (they are keyed by
    (seed, epoch, id) then)."""
    from fastdata import transforms as T

    if how.startswith("placement"):
        pytest.importorskip("kornia")  # (placement="gpu" runs the pixel ops through Kornia)
    # In the device stage, the pixel ops alone draw: each repeat must get jitters of its own.
    pixel = [T.ColorJitter(0.4, 0.4, 0.4)] if how.startswith("placement") else []
    geometry = [T.CenterCrop(24)] if pixel else [T.RandomResizedCrop(24), T.RandomHorizontalFlip()]
    kw = dict(batch_size=8, seed=5, transform=T.Compose(geometry + pixel), device="cpu",
              num_workers=2 if how == "pil, 2 workers" else 0, backend="dali" if how == "dali" else "pil")
    if pixel:
        kw["placement"] = "gpu"
    if how.endswith("in parts"):  # a few files a part (`read.MAX_PART_BYTES`), as for large files
        from fastdata.image import read

        monkeypatch.setattr(read, "MAX_PART_BYTES", 4000)
    sampler = WeightedSampler(np.array([60.0, 1, 1, 1, 1, 1]), num_samples=32, seed=1)
    order = sampler.indices(0).tolist()
    x, y = (torch.cat(parts) for parts in zip(*fastdata.loader(str(gradients), sampler=sampler, **kw)))
    assert y.tolist() == order
    copies = x[y == 0]
    assert len(copies) >= 20 and len({c.numpy().tobytes() for c in copies}) == len(copies)
    # The first time each sample comes, its draws are those it has without a sampler.
    alone = dict(kw, transform=T.Compose(geometry), placement="cpu")
    plain = torch.cat([b[0] for b in fastdata.loader(str(gradients), shuffle=False, **alone)])
    ours = torch.cat([b[0] for b in fastdata.loader(str(gradients), sampler=sampler, **alone)])
    for i in range(6):
        if i in order:
            assert torch.equal(ours[order.index(i)], plain[i]), i
