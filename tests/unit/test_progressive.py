"""Progressive resizing: an output size that follows the epoch (`RandomResizedCrop(size=[(0,
16), ...])` or a callable). Each epoch's batches have that epoch's size on every backend, and
are pixel-equal to those of a loader built with that epoch's fixed size at the same (seed,
epoch): the crop boxes and flips do not depend on the size. Images are gradients with noise,
so a different crop box or flip would change the pixels."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

import fastdata
from fastdata import transforms as T
from fastdata.shard import write_shards
from fastdata.transforms.plan import plan_geometry

CLASSES, PER_CLASS = 2, 9
STEPS = [(0, (16, 20)), (1, 24), (3, (32, 28))]
SIZES = {0: (16, 20), 1: (24, 24), 2: (24, 24), 3: (32, 28)}  # (h, w) per epoch
EPOCHS = len(SIZES)


def schedule(epoch: int) -> int:
    """A module-level callable schedule (picklable, so it reaches spawned workers too)."""
    return 16 if epoch < 2 else 24


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("grad")
    rng = np.random.default_rng(0)
    for c in range(CLASSES):
        (root / f"class{c}").mkdir()
        for i in range(PER_CLASS):
            w, h = (int(v) for v in rng.integers(40, 90, 2))
            x = np.linspace(0, 255, w)[None, :, None] * np.ones((h, 1, 1))
            y = np.linspace(0, 255, h)[:, None, None] * np.ones((1, w, 1))
            a = np.concatenate([x, y, np.full((h, w, 1), 20.0 * i + 100 * c)], axis=2)
            a += rng.integers(-20, 21, (h, w, 3))
            Image.fromarray(np.clip(a, 0, 255).astype(np.uint8)).save(root / f"class{c}" / f"{i:03d}.jpg", quality=95)
    return root


@pytest.fixture(scope="module")
def pattern(folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("shards")
    write_shards(folder, out / "train-%06d.tar", max_count=5, workers=1)
    return str(out / "train-{000000..000003}.tar")


def _rrc(size) -> T.Compose:
    return T.Compose([T.RandomResizedCrop(size, scale=(0.2, 1.0)), T.RandomHorizontalFlip()])


def _load(source, size, **kw):
    kw.setdefault("batch_size", 5)
    if "transform" not in kw:
        kw["transform"] = _rrc(size)
    return fastdata.loader(source, shuffle=True, seed=7, **kw)


def _epoch(loader) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(x.clone(), y.clone()) for x, y in loader]


def _at(source, size, epoch, **kw):
    fixed = _load(source, size, **kw)
    fixed.set_epoch(epoch)
    return _epoch(fixed)


def _same(got, want, size):
    assert len(got) == len(want) > 0
    for (x, y), (u, v) in zip(got, want):
        assert x.shape[2:] == size, (x.shape, size)
        assert torch.equal(y, v) and torch.equal(x, u)


def test_the_crop_boxes_do_not_depend_on_the_size():
    rng = np.random.default_rng(1)
    index, widths, heights = np.arange(100, 164), rng.integers(40, 900, 64), rng.integers(40, 900, 64)
    for epoch in range(EPOCHS):
        got = plan_geometry(_rrc(STEPS).geometry, 7, epoch, index, widths, heights)
        want = plan_geometry(_rrc(224).geometry, 7, epoch, index, widths, heights)
        assert np.array_equal(got.boxes, want.boxes) and np.array_equal(got.flips, want.flips)
        assert (got.sizes == SIZES[epoch][::-1]).all()  # (w, h) per sample


@pytest.mark.parametrize("backend,workers", [("pil", 0), ("pil", 2), ("wds", 0), ("wds", 2)])
def test_each_epoch_has_its_size_and_the_fixed_size_crops(folder, pattern, backend, workers):
    source = str(folder) if backend == "pil" else pattern
    loader = _load(source, STEPS, num_workers=workers)
    assert loader.backend == backend
    fixed = _load(source, 24, num_workers=workers)
    assert len(loader) == len(fixed) and loader.batch_size == 5
    for epoch in range(EPOCHS):  # the epoch advances by itself
        _same(_epoch(loader), _at(source, SIZES[epoch], epoch, num_workers=workers), SIZES[epoch])


@pytest.mark.parametrize("backend", ["pil", "wds"])
def test_persistent_workers_running_ahead_across_a_size_change(folder, pattern, backend):
    source = str(folder) if backend == "pil" else pattern
    loader = _load(source, STEPS, num_workers=2, persistent_workers=True)
    for epoch in range(EPOCHS):
        _same(_epoch(loader), _at(source, SIZES[epoch], epoch, num_workers=2), SIZES[epoch])
        # the workers were handed the next epoch's first batches before this one ended
        assert loader._runner.passes.epoch == epoch + 1
    loader.set_epoch(1)  # back across a size change: the workers start it afresh
    _same(_epoch(loader), _at(source, SIZES[1], 1, num_workers=2), SIZES[1])


@pytest.mark.dali
def test_dali(folder):
    loader = _load(str(folder), STEPS, backend="dali", device="cpu")
    for epoch in range(EPOCHS):
        _same(_epoch(loader), _at(str(folder), SIZES[epoch], epoch, backend="dali", device="cpu"), SIZES[epoch])


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_mid_epoch_after_a_size_change(folder, workers):
    ref = _load(str(folder), STEPS, num_workers=workers)
    want = [_epoch(ref) for _ in range(3)]
    first = _load(str(folder), STEPS, num_workers=workers)
    _epoch(first)
    it = iter(first)
    next(it), next(it)  # two batches into epoch 1, the first at its new size
    state = pickle.loads(pickle.dumps(first.state_dict()))
    del it
    resumed = _load(str(folder), STEPS, num_workers=workers)
    resumed.load_state_dict(state)
    _same(_epoch(resumed), want[1][2:], SIZES[1])
    _same(_epoch(resumed), want[2], SIZES[2])


@pytest.mark.parametrize("workers", [0, 2])
def test_callable_schedule(folder, workers):
    loader = _load(str(folder), schedule, num_workers=workers)
    for epoch in range(3):
        side = schedule(epoch)
        _same(_epoch(loader), _at(str(folder), side, epoch), (side, side))


def test_resize_and_center_crop_schedules_with_normalize(folder):
    spec = lambda r, c: T.Compose([T.Resize(r), T.CenterCrop(c), T.Normalize()])  # noqa: E731
    loader = _load(str(folder), None, transform=spec([(0, 20), (1, (30, 36))], [(0, 16), (1, (24, 30))]))
    for epoch, (r, c) in enumerate([(20, 16), ((30, 36), (24, 30))]):
        got = _epoch(loader)
        assert got[0][0].dtype == torch.float32
        _same(got, _at(str(folder), None, epoch, transform=spec(r, c)), c if isinstance(c, tuple) else (c, c))


@pytest.mark.parametrize("bad,match", [
    ([(0, 16), (4, 24), (2, 32)], "increasing epochs, but epoch 2 comes after epoch 4"),
    ([(1, 16), (4, 24)], "should start at epoch 0, but starts at epoch 1"),
    ([(0, 16), (4, 0)], r"positive int or an \(h, w\) pair at epoch 4, but got 0"),
    ([(0, 16), (4, (24, -1))], r"at epoch 4, but got \(24, -1\)"),
    ([(0, 16), ("4", 24)], "steps with epochs >= 0, but got step"),
    ([(0, 16), 24], "steps with epochs >= 0, but got step 24"),
    (lambda epoch: "big", "at epoch 0, but got 'big'"),
    (lambda epoch: 1 / 0, "raised at epoch 0: ZeroDivisionError"),
])
def test_a_bad_schedule_is_refused_at_construction(bad, match):
    with pytest.raises(ValueError, match=match) as e:
        T.RandomResizedCrop(bad)
    assert "\n" not in str(e.value) and str(e.value).startswith("RandomResizedCrop size")


def test_a_callable_going_wrong_later_names_the_epoch(folder):
    loader = _load(str(folder), lambda epoch: 16 if epoch < 2 else 0)
    _epoch(loader)
    loader.set_epoch(2)
    with pytest.raises(ValueError, match="RandomResizedCrop size should be a positive int .* at epoch 2, but got 0"):
        next(iter(loader))


def test_schedules_pickle_and_compare():
    a, b = _rrc(STEPS), _rrc([(0, (16, 20)), (1, (24, 24)), (3, (32, 28))])
    assert a == b and hash(a) == hash(b) and a != _rrc(24)
    assert pickle.loads(pickle.dumps(a)) == a
    assert pickle.loads(pickle.dumps(_rrc(schedule))) == _rrc(schedule)
    with pytest.raises(TypeError, match="size schedule should be picklable"):
        pickle.dumps(_rrc(lambda epoch: 16))


def test_profile_gives_the_rate_at_each_size(folder):
    report = fastdata.profile(_load(str(folder), STEPS), step_ms=1, steps=2, warmup=0)
    assert [(s["epoch"], tuple(s["size"])) for s in report.sizes] == [(e, SIZES[e]) for e in (0, 1, 3)]
    assert all(s["batches"] >= 1 and s["images_per_s"] > 0 for s in report.sizes)
    assert "from epoch 3" in str(report) and report.to_json()["sizes"] == report.sizes
    assert fastdata.profile(_load(str(folder), 24), steps=2, warmup=0).sizes == []


def test_profile_cli_takes_a_schedule(folder, tmp_path):
    cli = "import sys; from fastdata.profiling.cli import main; sys.exit(main())"
    common = [str(folder), "--steps", "2", "--batch-size", "5", "--workers", "0"]
    run = lambda *a: subprocess.run([sys.executable, "-c", cli, *common, *a],  # noqa: E731
                                    capture_output=True, text=True, timeout=300)
    done = run("--step-ms", "1", "--size", "0:16,2:24", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    sizes = json.loads((tmp_path / "report.json").read_text())["sizes"]
    assert [(s["epoch"], s["size"]) for s in sizes] == [(0, [16, 16]), (2, [24, 24])]
    done = run("--size", "2:16,0:24")
    assert done.returncode == 2 and "increasing epochs, but epoch 0 comes after epoch 2" in done.stderr
