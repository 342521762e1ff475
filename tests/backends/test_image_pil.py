"""Image mode on the `pil` backend, on images the tests make.

Every image is one flat color that encodes its sample: red = 40 * class + 20, green = the
image's number within its class * 12 + 10, blue a constant. Flat colors survive any crop and
resampling exactly, so the content of every output row names the sample it came from and
must agree with its label."""

import logging
import os
import pickle
import re
import warnings

import numpy as np
import pytest
import torch
from PIL import Image, ImageFilter

import fastdata
from _images import color_folder
from fastdata import transforms as T

CLASSES, PER_CLASS = 4, 9


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    # PNGs go through Pillow, JPEGs through the native decoder.
    return color_folder(tmp_path_factory.mktemp("imgs"), CLASSES, PER_CLASS, (60, 200),
                        lambda i: f"{i:03d}." + ("png" if i % 4 == 3 else "jpg"))


def _decode_ids(images):
    """(class, number) per row from the flat colors, checked flat."""
    x = images.float()
    r, g = x[:, 0].mean((1, 2)), x[:, 1].mean((1, 2))
    assert (x[:, 0] - r[:, None, None]).abs().max() <= 3, "a row is not one flat color"
    return torch.round((r - 20) / 40).long(), torch.round((g - 10) / 12).long()


def _epoch(loader):
    images, labels = [], []
    for x, y in loader:
        assert x.dtype == torch.uint8 and x.shape[1:] == (3, 32, 48)
        assert x.is_contiguous(memory_format=torch.channels_last)
        assert y.dtype == torch.int64
        images.append(x.clone())
        labels.append(y.clone())
    return torch.cat(images), torch.cat(labels)


def _train(size=(32, 48)):
    return T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip()])


@pytest.mark.parametrize("name, value", [("batch_size", 9), ("drop_last", True), ("shuffle", True), ("num_workers", 2),
                                         ("transform", T.Compose([T.Resize((16, 16))])), ("pin_memory", True),
                                         ("sampler", None), ("dataset", None), ("seed", 5), ("backend", "wds"),
                                         ("rank", 1), ("world_size", 2)])
def test_assigning_what_a_pass_is_built_from_raises_as_dataloader_does(folder, name, value):
    """torch's DataLoader refuses batch_size, sampler, drop_last, ... once made; an image loader
    builds its passes from all it was given, so a later value would be ignored: each is refused,
    in one line, and the batches stay those it was made with."""
    loader = fastdata.loader(str(folder), batch_size=5, transform=_train(), num_workers=0)
    with pytest.raises(ValueError) as e:
        setattr(loader, name, value)
    assert str(e.value).startswith(f"{name} attribute should not be set after PilLoader is initialized")
    assert "\n" not in str(e.value)
    images, labels = _epoch(loader)  # 36 samples in batches of 5, every one with its own label
    assert torch.equal(_decode_ids(images)[0], labels) and len(labels) == 36 and len(loader) == 8
    loader.note = "a name of the script's own"  # as on a DataLoader: anything else may be set
    assert loader.note == "a name of the script's own"


@pytest.mark.parametrize("num_workers", [0, 2])
def test_labels_match_content_and_every_sample_once(folder, num_workers):
    loader = fastdata.loader(str(folder), batch_size=5, shuffle=True, transform=_train(), num_workers=num_workers)
    assert loader.backend == "pil" and len(loader) == 8
    images, labels = _epoch(loader)
    cls, num = _decode_ids(images)
    assert torch.equal(cls, labels)
    seen = sorted(zip(cls.tolist(), num.tolist()))
    assert seen == [(c, i) for c in range(CLASSES) for i in range(PER_CLASS)]
    assert loader.stats["samples"] == 36 and loader.stats["batches"] == 8 and loader.stats["skipped"] == 0


def test_same_output_across_workers_and_batch_sizes(folder):
    runs = [
        _epoch(fastdata.loader(str(folder), batch_size=bs, shuffle=True, transform=_train(), num_workers=nw, seed=3))
        for bs, nw in [(4, 0), (7, 2), (36, 0)]
    ]
    for images, labels in runs[1:]:
        assert torch.equal(images, runs[0][0]) and torch.equal(labels, runs[0][1])


def test_epoch_and_seed_change_order_and_augmentation(folder):
    a = fastdata.loader(str(folder), batch_size=6, shuffle=True, transform=_train(), seed=1)
    first, again = _epoch(a), None
    a.set_epoch(0)
    again = _epoch(a)
    assert torch.equal(first[0], again[0])
    second = _epoch(a)  # the epoch advanced by itself
    assert not torch.equal(first[1], second[1])
    other_seed = _epoch(fastdata.loader(str(folder), batch_size=6, shuffle=True, transform=_train(), seed=2))
    assert not torch.equal(first[1], other_seed[1])


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("k", [1, 4])
def test_resume_mid_epoch(folder, num_workers, k):
    make = lambda: fastdata.loader(str(folder), batch_size=5, shuffle=True, transform=_train(), num_workers=num_workers, seed=9)  # noqa: E731
    ref = make()
    want = [(x.clone(), y.clone()) for x, y in ref] + [(x.clone(), y.clone()) for x, y in ref]
    first = make()
    it = iter(first)
    for _ in range(k):
        next(it)
    state = pickle.loads(pickle.dumps(first.state_dict()))
    del it
    resumed = make()
    resumed.load_state_dict(state)
    got = [(x.clone(), y.clone()) for x, y in resumed] + [(x.clone(), y.clone()) for x, y in resumed]
    assert len(got) == len(want) - k
    for (x, y), (wx, wy) in zip(got, want[k:]):
        assert torch.equal(x, wx) and torch.equal(y, wy)


def test_resuming_under_another_shuffle_or_seed_warns_what_the_epoch_loses(folder):
    resize = T.Compose([T.Resize((32, 48))])
    make = lambda **kw: fastdata.loader(str(folder), batch_size=5, transform=resize,  # noqa: E731
                                        **{"shuffle": True, "seed": 9, **kw})
    first = make()
    it = iter(first)
    seen = [_decode_ids(next(it)[0]) for _ in range(2)]
    state = first.state_dict()
    del it
    assert state["shuffle"] is True and state["seed"] == 9
    ids = lambda pairs: [(int(c), int(n)) for c, n in zip(*pairs)]  # noqa: E731
    delivered = [i for pairs in seen for i in ids(pairs)]
    for change, said in [({}, None), ({"shuffle": False}, "shuffle=False, but the state was taken with shuffle=True"),
                         ({"seed": 3}, "seed=3, but the state was taken with seed=9")]:
        resumed = make(**change)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            resumed.load_state_dict(state)
        ours = [str(w.message) for w in caught if "resuming with" in str(w.message)]
        rest = [i for x, _ in resumed for i in ids(_decode_ids(x))]
        if said is None:
            assert not ours and sorted(delivered + rest) == sorted(set(delivered + rest))  # the epoch whole, once
            assert len(delivered + rest) == CLASSES * PER_CLASS
            continue
        assert len(ours) == 1 and said in ours[0] and "may repeat some of their samples and leave out others" in ours[0]
        assert caught[0].filename == __file__  # at the caller's load_state_dict
        assert len(set(delivered) & set(rest)) > 0  # what the warning says: the rest repeats delivered samples
    # Without a shuffle the seed sets no order: a warning, without the order's consequence.
    plain = make(shuffle=False)
    it = iter(plain)
    next(it)
    taken = plain.state_dict()
    del it
    with pytest.warns(UserWarning, match=r"resuming with seed=3, but the state was taken with seed=9$"):
        make(shuffle=False, seed=3).load_state_dict(taken)


def test_a_file_list_zipped_with_a_tensor_or_array_of_labels(folder):
    """`zip(paths, labels)` over a tensor or an array of labels gives 0-d elements: each is the
    integer it holds, and every image comes with its own label."""
    paths = sorted(str(p) for p in folder.glob("class*/*.*"))
    classes = [int(p.split("class")[1][0]) for p in paths]
    for labels in (torch.tensor(classes), np.asarray(classes, dtype=np.int32)):
        loader = fastdata.loader(list(zip(paths, labels)), batch_size=5, transform=T.Compose([T.Resize((32, 48))]))
        images, got = _epoch(loader)
        assert got.tolist() == classes and torch.equal(_decode_ids(images)[0], got)


def test_persistent_workers_run_ahead_into_the_next_epoch(folder):
    make = lambda **kw: fastdata.loader(str(folder), batch_size=5, shuffle=True, transform=_train(),  # noqa: E731
                                        num_workers=2, seed=4, **kw)
    fresh, kept = make(), make(persistent_workers=True)

    def same(a, b):
        return torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])

    for epoch in range(2):
        assert same(_epoch(kept), _epoch(fresh))
        # the workers were handed the next epoch's first batches before this one ended
        assert kept._runner.passes.epoch == epoch + 1
    # left mid-epoch, the loader carries on where it stopped (with the queued batches dropped)
    for loader in (kept, fresh):
        it = iter(loader)
        next(it)
        next(it)
        del it
    assert same(_epoch(kept), _epoch(fresh))
    for epoch in (7, 3):  # another epoch than the one under way: the workers start it afresh
        kept.set_epoch(epoch)
        fresh.set_epoch(epoch)
        assert same(_epoch(kept), _epoch(fresh))


@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_get_equal_disjoint_shares(folder, drop_last):
    shares = []
    for rank in range(3):
        loader = fastdata.loader(str(folder), batch_size=4, shuffle=True, transform=_train(), rank=rank,
                                 world_size=3, drop_last=drop_last)
        images, _ = _epoch(loader)
        shares.append(list(zip(*(t.tolist() for t in _decode_ids(images)))))
    assert len({len(s) for s in shares}) == 1  # the same number of samples, so of batches
    assert len(set(shares[0]) & set(shares[1])) == 0 and len(set(shares[1]) & set(shares[2])) == 0
    assert len(set().union(*shares)) == 36  # 36 = 3 x 12: nothing padded or dropped here


def test_ranks_pad_to_equal_batch_counts(folder):
    lens = [len(fastdata.loader(str(folder), batch_size=4, transform=_train(), rank=r, world_size=5)) for r in range(5)]
    assert len(set(lens)) == 1


@pytest.mark.timeout(120)
@pytest.mark.parametrize("persistent", [False, True])
def test_labels_cross_from_workers_without_a_descriptor_a_batch(folder, monkeypatch, persistent):
    # A worker's batch is its ring slot (sent once) and its labels by value: torch would hand the
    # training process a file descriptor over a socket for the labels' tensor, batch after batch.
    from multiprocessing import resource_sharer

    received = []
    real = resource_sharer.DupFd.detach
    monkeypatch.setattr(resource_sharer.DupFd, "detach", lambda self: received.append(1) or real(self))
    loader = fastdata.loader(str(folder), batch_size=2, shuffle=True, transform=_train(), num_workers=2,
                             persistent_workers=persistent)
    for _ in range(2):
        images, labels = _epoch(loader)
        assert torch.equal(_decode_ids(images)[0], labels) and len(labels) == 36
    assert 0 < len(received) <= 12, len(received)  # 36 batches in all; each worker's ring: its flags and slots


def test_normalize_gives_dtype_and_values(folder):
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.5)
    t = T.Compose([T.CenterCrop(16), T.Normalize(mean, std)])
    for dtype in (torch.float32, torch.bfloat16):
        loader = fastdata.loader(str(folder), batch_size=36, transform=t, dtype=dtype, device="cpu")
        x, y = next(iter(loader))
        assert x.dtype == dtype and x.shape == (36, 3, 16, 16)
        assert x.is_contiguous(memory_format=torch.channels_last)
        red = x[:, 0, 8, 8].float() * 0.2 + 0.5  # back to [0, 1]
        assert torch.allclose(red * 255, (40 * y + 20).float(), atol=3)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_held_normalized_batches_stay_whole(folder, num_workers):
    # On a CPU device the float batches come from reused slots: a batch still held must not be
    # written over by later ones, and dropped ones' slots are reused.
    t = T.Compose([T.CenterCrop(16), T.Normalize((0.5,) * 3, (0.25,) * 3)])
    loader = fastdata.loader(str(folder), batch_size=4, transform=t, device="cpu", num_workers=num_workers)
    held, copies, addresses = [], [], set()
    for k, (x, y) in enumerate(loader):
        addresses.add(x.data_ptr())
        if k % 3 == 0:  # hold every third batch to the end, drop the others
            held.append((x, y))
            copies.append(x.clone())
    assert len(held) == 3 and len(addresses) < len(loader)  # slots reused
    for (x, y), c in zip(held, copies):
        assert torch.equal(x, c)
        red = x[:, 0, 8, 8] * 0.25 + 0.5
        assert torch.allclose(red * 255, (40 * y + 20).float(), atol=3)  # still its own labels' images


def test_channels_last_false_gives_contiguous(folder):
    loader = fastdata.loader(str(folder), batch_size=4, transform=_train(), channels_last=False)
    x, _ = next(iter(loader))
    assert x.is_contiguous()


@pytest.mark.parametrize("ext", ["png", "jpg"])
def test_eval_preset_is_torchvisions_resize_then_crop(tmp_path, ext):
    """Resize(146) then CenterCrop(128) maps the crop to a box with fractions of a pixel in
    the image; each decoder (Pillow for the PNG, the native one for the JPEG) resamples that
    box itself, and the output is torchvision's resize of the whole image then crop, within a
    level (a box rounded to whole pixels would shift it by up to half a pixel). The box is
    under twice the output, so no reduced-size decode is taken (see the guide)."""
    w, h = 300, 200
    rng = np.random.default_rng(0)
    texture = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).filter(ImageFilter.GaussianBlur(1.5))
    os.makedirs(tmp_path / "a")
    texture.save(tmp_path / "a" / f"g.{ext}", quality=95)
    decoded = Image.open(tmp_path / "a" / f"g.{ext}").convert("RGB")
    loader = fastdata.loader(str(tmp_path), batch_size=1, transform=T.imagenet_eval(128), device="cpu")
    x, _ = next(iter(loader))
    mean = torch.tensor(T.IMAGENET_MEAN).view(3, 1, 1)
    std = torch.tensor(T.IMAGENET_STD).view(3, 1, 1)
    got = (x[0] * std + mean) * 255
    ref = decoded.resize((int(146 * w / h), 146), Image.BILINEAR)
    left, top = round((ref.width - 128) / 2), round((ref.height - 128) / 2)
    ref = torch.from_numpy(np.array(ref.crop((left, top, left + 128, top + 128)))).permute(2, 0, 1).float()
    diff = (got - ref).abs()
    assert diff.mean() < 0.1 and diff.max() < 1.01, (float(diff.mean()), float(diff.max()))


@pytest.mark.parametrize("workers", [0, 2])
def test_images_of_different_sizes_need_a_transform(folder, workers):
    """One line, as itself, with workers too (not DataLoader's re-raise of a worker's traceback)."""
    with pytest.raises(ValueError) as e:
        next(iter(fastdata.loader(str(folder), batch_size=8, num_workers=workers, device="cpu")))
    assert "\n" not in str(e.value) and str(e.value).startswith("images in a batch should have one size, but ")
    assert str(e.value).endswith("add a resize or crop to the transform, e.g. "
                                 "transform=fastdata.transforms.imagenet_train(224)")


@pytest.fixture()
def broken(tmp_path, folder):
    """The good images as a (path, label) list, with four bad ones among them."""
    pairs = [(str(folder / f"class{c}" / f"{i:03d}.{'png' if i % 4 == 3 else 'jpg'}"), c)
             for c in range(CLASSES) for i in range(PER_CLASS)]
    good = open(pairs[0][0], "rb").read()
    (tmp_path / "empty.jpg").write_bytes(b"")
    (tmp_path / "truncated.jpg").write_bytes(good[: len(good) * 6 // 10])
    (tmp_path / "text.jpg").write_bytes(b"this is not an image at all\n" * 20)
    bad = [str(tmp_path / "empty.jpg"), str(tmp_path / "truncated.jpg"), str(tmp_path / "text.jpg"),
           str(tmp_path / "missing.jpg")]
    for k, path in enumerate(bad):
        pairs.insert(5 + 7 * k, (path, 0))
    return pairs, bad


@pytest.mark.parametrize("num_workers", [0, 2])
def test_bad_file_raises_data_error_naming_it(broken, num_workers):
    pairs, bad = broken
    loader = fastdata.loader(pairs, batch_size=40, transform=_train(), num_workers=num_workers)
    with pytest.raises(fastdata.DataError) as err:
        next(iter(loader))
    assert any(os.path.basename(p) in str(err.value) for p in bad)
    # one line, ending with the way past it
    assert "\n" not in str(err.value) and str(err.value).endswith('pass on_error="skip"'), str(err.value)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_skip_counts_names_and_keeps_every_good_sample(broken, num_workers, caplog):
    pairs, bad = broken
    loader = fastdata.loader(pairs, batch_size=6, transform=_train(), num_workers=num_workers, on_error="skip")
    with caplog.at_level(logging.WARNING, logger="fastdata"):
        images, labels = _epoch(loader)
    cls, num = _decode_ids(images)
    assert torch.equal(cls, labels)
    assert sorted(zip(cls.tolist(), num.tolist())) == [(c, i) for c in range(CLASSES) for i in range(PER_CLASS)]
    assert loader.stats["skipped"] == 4
    named = {e["path"]: e["cause"] for e in loader.stats["errors"]}
    assert set(named) == set(bad)
    assert "empty" in named[bad[0]] and "truncated" in named[bad[1]] and "No such file" in named[bad[3]]
    assert sum("skipped" in r.message for r in caplog.records) == 4


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_bad_file_is_named_once_and_counted_each_epoch(tmp_path, num_workers, caplog):
    """One corrupt JPEG among good ones, over 4 epochs: each epoch leaves it out (4 skips), but
    it is one file: listed once with its count, counted once in skipped_files, warned once."""
    root = color_folder(tmp_path / "imgs", 2, 5, (40, 60), lambda i: f"{i:03d}.jpg")
    bad = root / "class1" / "002_bad.jpg"
    bad.write_bytes((root / "class1" / "000.jpg").read_bytes()[:300])
    loader = fastdata.loader(str(root), batch_size=4, transform=_train(), num_workers=num_workers,
                             persistent_workers=num_workers > 0, on_error="skip", device="cpu")
    with caplog.at_level(logging.WARNING, logger="fastdata"):
        for epoch in range(4):
            loader.set_epoch(epoch)
            images, labels = _epoch(loader)
            assert len(labels) == 10, f"epoch {epoch}: every good image, the bad one left out"
    assert loader.stats["skipped"] == 4 and loader.stats["skipped_files"] == 1
    (entry,) = loader.stats["errors"]
    assert entry["path"] == str(bad) and entry["count"] == 4 and "truncated" in entry["cause"], entry
    warned = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(warned) == 1 and str(bad) in warned[0], warned


@pytest.mark.parametrize("num_workers", [0, 2])
def test_past_the_first_100_bad_files_they_are_counted_not_named(tmp_path, num_workers, caplog):
    """macOS's AppleDouble files (._name.png beside each image) in a folder of 130 images:
    each epoch skips all 130, but the log names 101 (the 101st saying the rest are counted),
    then counts the other 29 in one line at the first epoch's end, and nothing in the second.
    Without on_error="skip", the first is named as what it is, with how to delete them."""
    for c in range(2):
        (tmp_path / f"class{c}").mkdir()
        for i in range(65):
            Image.new("RGB", (8, 8), (40 * c + 20, i, 0)).save(tmp_path / f"class{c}" / f"{i:03d}.png")
            (tmp_path / f"class{c}" / f"._{i:03d}.png").write_bytes(b"\x00\x05\x16\x07" + bytes(120))
    loader = fastdata.loader(str(tmp_path), batch_size=16, shuffle=True, num_workers=num_workers, on_error="skip",
                             device="cpu")
    with caplog.at_level(logging.WARNING, logger="fastdata"):
        for epoch in range(2):
            loader.set_epoch(epoch)
            labels = []
            for x, y in loader:
                assert torch.equal(x[:, 0, 0, 0].long() // 40, y)  # red 20 or 60: class 0 or 1
                labels.append(y)
            assert len(torch.cat(labels)) == 130 and torch.cat(labels).sum() == 65, f"epoch {epoch}: every image"
    assert loader.stats["skipped"] == 260 and loader.stats["skipped_files"] == 130
    assert len(loader.stats["errors"]) == 100 and all(e["count"] == 2 for e in loader.stats["errors"])
    lines = [r.getMessage() for r in caplog.records]
    named = [line for line in lines if line.startswith("skipped ")]
    assert len(named) == 101 and all("/._" in line and "macOS's AppleDouble file" in line for line in named)
    assert named[-1].endswith("(the 101st file skipped: the files skipped after it are counted in "
                              "loader.stats['skipped_files'] and at each epoch's end, not named one by one)")
    assert [line for line in lines if not line.startswith("skipped ")] == [
        "epoch 0 skipped 29 more files, not named one by one (loader.stats['skipped_files']: 130 files in all)"]
    with pytest.raises(fastdata.DataError, match=r"/class0/\._000\.png: not an image but macOS's AppleDouble file of "
                                                 r"the file beside it .*find DIR -name '\._\*' -delete"):
        next(iter(fastdata.loader(str(tmp_path), batch_size=16, num_workers=num_workers)))


def test_config_fills_only_what_the_call_did_not_give(folder, tmp_path):
    import json

    cfg = tmp_path / "tuned.json"
    cfg.write_text(json.dumps({"loader": {"num_workers": 2, "shuffle": True, "seed": 5, "dtype": "bfloat16"}}))
    loader = fastdata.loader(str(folder), batch_size=6, transform=_train(), config=str(cfg), seed=7)
    assert loader.num_workers == 2 and loader.seed == 7  # the call's seed wins
    assert loader.dtype == torch.bfloat16
    images, labels = _epoch(loader)
    assert sorted(labels.tolist()) != labels.tolist()  # shuffled, from the config
    cfg.write_text(json.dumps({"loader": {"shufle": True}}))
    with pytest.raises(ValueError, match="shufle"):
        fastdata.loader(str(folder), batch_size=6, config=str(cfg))
    with pytest.raises(ValueError, match="config"):
        fastdata.loader(str(folder), batch_size=6, config=str(tmp_path / "missing.json"))


@pytest.mark.parametrize("name,value", [("drop_last", "false"), ("shuffle", 1), ("prefetch_factor", 1e9),
                                        ("prefetch_factor", 10**9), ("num_workers", 10**6), ("num_workers", -1),
                                        ("num_workers", True), ("timeout", "5"), ("timeout", -1), ("seed", 1.5),
                                        ("seed", -3), ("rank", "0"), ("world_size", 0), ("hw_decoder_load", 2),
                                        ("placement", ["gpu"]), ("device", 0), ("transform", "imagenet_train"),
                                        ("persistent_workers", "yes")])
def test_a_config_value_of_the_wrong_type_or_range_is_refused_naming_it(folder, tmp_path, name, value):
    """A config file's values are data: each is checked against the type and range its keyword
    takes, and a wrong one is one ValueError naming the file, the keyword and the value, before
    a worker starts ("false" would be a truthy string; a prefetch_factor of 1e9 would have the
    workers queue forever)."""
    import json

    cfg = tmp_path / "tuned.json"
    cfg.write_text(json.dumps({"loader": {"num_workers": 0, name: value}}))
    with pytest.raises(ValueError, match=rf"config '{re.escape(str(cfg))}' sets '{name}' to .*, which should be"):
        fastdata.loader(str(folder), batch_size=6, transform=_train(), config=str(cfg))


def test_same_size_images_need_no_transform(tmp_path):
    os.makedirs(tmp_path / "k")
    for i in range(5):
        Image.new("RGB", (24, 16), (10 * i, 0, 0)).save(tmp_path / "k" / f"{i}.png")
    x, y = next(iter(fastdata.loader(str(tmp_path), batch_size=5, device="cpu")))
    assert x.shape == (5, 3, 16, 24) and x.dtype == torch.uint8
    assert x[:, 0, 0, 0].tolist() == [0, 10, 20, 30, 40] and y.tolist() == [0] * 5


def test_early_exit_leaves_no_worker(folder, h):
    import multiprocessing

    before = {p.pid for p in multiprocessing.active_children()}
    loader = fastdata.loader(str(folder), batch_size=4, transform=_train(), num_workers=2)
    it = iter(loader)
    x, _ = next(it)
    kept = x.clone()
    assert len({p.pid for p in multiprocessing.active_children()} - before) == 2  # its workers
    del it
    assert not h.new_children(before)
    assert torch.equal(x, kept)  # the batch held across the shutdown is intact


@pytest.mark.timeout(60)
@pytest.mark.parametrize("native", [True, False])
def test_read_files_gives_the_bytes_or_the_cause(tmp_path, monkeypatch, native):
    # What FileReader reads a batch with: the native reads (threads, GIL released) and the
    # Python ones give the same bytes and the same causes. A file that is not a regular one is
    # refused unread, at once: a FIFO with no writer (whose read would wait forever), /dev/null,
    # a symlink to /dev/zero (whose read would never end), a unix socket.
    import socket

    from fastdata.image import read

    if not native:
        monkeypatch.setattr(read, "_ext", None)
    elif read._ext is None:
        pytest.skip("native extension not built")
    files = []
    for k in range(40):  # sizes from 0 bytes to past a page, each file's bytes its own
        f = tmp_path / f"{k:02d}.bin"
        f.write_bytes(bytes((k * 7 + j) % 251 for j in range(k * 311)))
        files.append(str(f))
    fifo = tmp_path / "fifo.jpg"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.jpg"
    zero.symlink_to("/dev/zero")
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(tmp_path / "sock.jpg"))
        paths = files + [str(tmp_path / "missing.jpg"), str(tmp_path), "bad\0name.jpg", str(fifo), "/dev/null",
                         str(zero), str(tmp_path / "sock.jpg")]
        got = read.read_files(paths, threads=3)  # a wait on the FIFO would end in the test's time limit
    finally:
        sock.close()
    assert got[:40] == [open(f, "rb").read() for f in files]
    assert got[40:] == ["No such file or directory", "Is a directory", "embedded null byte",
                        "not a regular file (a FIFO)", "not a regular file (a character device)",
                        "not a regular file (a character device)", "not a regular file (a socket)"]


def test_unreadable_files_are_named_or_counted(tmp_path):
    pairs = [(str(tmp_path / "missing.jpg"), 0), (str(tmp_path), 1)]
    for i in range(6):
        Image.new("RGB", (16, 16), (40 * i, 0, 0)).save(tmp_path / f"{i}.jpg")
        pairs.insert(2 * i, (str(tmp_path / f"{i}.jpg"), i % 2))
    flat = T.Compose([T.Resize(8), T.CenterCrop(8)])
    with pytest.raises(fastdata.DataError, match=r"missing.jpg: No such file or directory \(backend 'pil'\)"):
        list(fastdata.loader(pairs, batch_size=4, transform=flat, device="cpu", num_workers=0))
    loader = fastdata.loader(pairs, batch_size=4, transform=flat, device="cpu", num_workers=0, on_error="skip")
    labels = torch.cat([y for _, y in loader])
    assert sorted(labels.tolist()) == [0, 0, 0, 1, 1, 1] and loader.stats["skipped"] == 2
    assert {(e["path"], e["cause"]) for e in loader.stats["errors"]} == {
        (str(tmp_path / "missing.jpg"), "No such file or directory"), (str(tmp_path), "Is a directory")}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [0, 2])
def test_files_that_are_not_regular_are_named_or_counted(tmp_path, workers):
    # A scraped folder whose x.jpg is a FIFO with no writer and z.jpg a symlink to /dev/zero:
    # neither is read (no wait on the FIFO, no endless read), each is named with its kind.
    for label in range(2):
        (tmp_path / f"c{label}").mkdir()
        for i in range(3):
            Image.new("RGB", (16, 16), (40 * i, 0, 0)).save(tmp_path / f"c{label}" / f"{i}.jpg")
    fifo, zero = tmp_path / "c0" / "x.jpg", tmp_path / "c1" / "z.jpg"
    os.mkfifo(fifo)
    zero.symlink_to("/dev/zero")
    flat = T.Compose([T.Resize(8), T.CenterCrop(8)])
    causes = {str(fifo): "not a regular file (a FIFO)", str(zero): "not a regular file (a character device)"}
    with pytest.raises(fastdata.DataError) as raised:
        list(fastdata.loader(str(tmp_path), batch_size=4, transform=flat, device="cpu", num_workers=workers))
    assert raised.value.path in causes
    assert f"cannot read {raised.value.path}: {causes[raised.value.path]} (backend 'pil')" in str(raised.value)
    loader = fastdata.loader(str(tmp_path), batch_size=4, transform=flat, device="cpu", num_workers=workers,
                             on_error="skip")
    labels = torch.cat([y for _, y in loader])
    assert sorted(labels.tolist()) == [0, 0, 0, 1, 1, 1] and loader.stats["skipped"] == 2
    assert {(e["path"], e["cause"]) for e in loader.stats["errors"]} == set(causes.items())
