"""`fastdata run` serving the multi-view wrappers of self-supervised scripts (`fastdata.run._views`):
MoCo's TwoCropsTransform (v1/v2 and v3), SimCLR's ContrastiveLearningViewGenerator, the
Lightning tutorial's ContrastiveTransformations and DINO's multi-crop DataAugmentationDINO, each as
its script writes it (tests/_ssl_wrappers.py),
over a torchvision image folder, CIFAR10 and STL10. Needs torchvision: .ci/run runs it in a virtualenv made
as a user's. The views' pixels against torchvision's at the same draws:
tests/contract/test_torchvision_faithful.py (test_two_views_are_each_torchvisions_at_their_draws).
"""

from __future__ import annotations

import inspect
import pickle
import types

import numpy as np
import pytest
import torch

from _images import blue_folder, write_cifar10
from _ssl_wrappers import (ContrastiveLearningViewGenerator, ContrastiveTransformations, DataAugmentationDINO,
                           TwoCropsTransform, TwoCropsTransformV3)
from fastdata.run import _torchvision as rt
from fastdata.run._layout import FolderViews
from fastdata.run._views import MAX_VIEWS

tv = pytest.importorskip("torchvision")

import torchvision.transforms as T  # noqa: E402
import torchvision.transforms.v2 as v2  # noqa: E402
from torchvision.datasets import ImageFolder  # noqa: E402

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def _augment(size: int = 48):
    return T.Compose([T.RandomResizedCrop(size, scale=(0.2, 1.0)), T.RandomGrayscale(p=0.2),
                      T.ColorJitter(0.4, 0.4, 0.4, 0.1), T.RandomHorizontalFlip(), T.ToTensor(),
                      T.Normalize(MEAN, STD)])


def _eval():
    return T.Compose([T.Resize(56), T.CenterCrop(48), T.ToTensor(), T.Normalize(MEAN, STD)])


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return blue_folder(tmp_path_factory.mktemp("views"), per_class=10)


def _class_of(images: torch.Tensor) -> torch.Tensor:  # (of normalized images without a colour change)
    blue = (images[:, 2].float() * STD[2] + MEAN[2]) * 255
    return ((blue.mean(dim=(1, 2)) - 55) / 50).round().long()


def _served(dataset, **kwargs):
    from fastdata.run._hook import Served

    return Served(dataset, **kwargs)


@pytest.mark.parametrize("make, count", [
    (lambda a, b: TwoCropsTransform(a), 2),
    (lambda a, b: TwoCropsTransformV3(a, b), 2),
    (lambda a, b: ContrastiveLearningViewGenerator(a, n_views=3), 3),
    (lambda a, b: ContrastiveTransformations(a), 2),
], ids=["MoCo v1/v2", "MoCo v3", "SimCLR", "Lightning"])
def test_the_scripts_wrappers_are_read_as_their_views(folder, make, count):
    from fastdata.run._decide import decide

    a, b = _augment(), T.Compose([T.RandomResizedCrop(40), v2.RandomSolarize(128, 0.2), T.PILToTensor()])
    wrapper = make(a, b)
    lowering, why = rt.lower(ImageFolder(str(folder), wrapper))
    assert why == "" and len(lowering.views) == count and lowering.random and lowering.sized
    names = [view.names for view in lowering.views]
    assert names[0] == "RandomResizedCrop, RandomGrayscale, ColorJitter, RandomHorizontalFlip, ToTensor, Normalize"
    if isinstance(wrapper, TwoCropsTransformV3):
        assert names[1] == "RandomResizedCrop, RandomSolarize, PILToTensor"
        assert lowering.names == f"TwoCropsTransformV3: 2 views: ({names[0]}), ({names[1]})"
    else:
        assert set(names) == {names[0]} and lowering.names == f"{type(wrapper).__name__}: {count} views of ({names[0]})"
    served, reason, _, _ = decide((ImageFolder(str(folder), wrapper),), {"batch_size": 8})
    assert served and f"served natively: ImageFolder with {lowering.names} decoded by fastdata" in reason, reason


@pytest.mark.parametrize("local", [0, 3, MAX_VIEWS - 2])
def test_dinos_multi_crop_is_read_as_its_views(folder, local):
    """DataAugmentationDINO: its two global transforms, then its local one `local_crops_number`
    times; the summary says each run of views alike once."""
    from fastdata.run._decide import decide

    g1, g2 = _augment(48), T.Compose([T.RandomResizedCrop(48), v2.RandomSolarize(128, 0.2), T.ToTensor()])
    wrapper = DataAugmentationDINO(g1, g2, _augment(24), local)
    lowering, why = rt.lower(ImageFolder(str(folder), wrapper))
    assert why == "" and len(lowering.views) == 2 + local and lowering.random and lowering.sized
    a, b = (f"({view.names})" for view in lowering.views[:2])
    assert b == "(RandomResizedCrop, RandomSolarize, ToTensor)"
    assert lowering.names == f"DataAugmentationDINO: {2 + local} views: {a}, {b}" + (f", {local} of {a}" if local > 1
                                                                                      else f", {a}" * local)
    assert [view.geometry[0].size for view in lowering.views] == [(48, 48)] * 2 + [(24, 24)] * local
    served, reason, _, _ = decide((ImageFolder(str(folder), wrapper),), {"batch_size": 8})
    assert served and f"served natively: ImageFolder with {lowering.names} decoded by fastdata" in reason, reason


@pytest.mark.parametrize("workers", [0, 2])
def test_dinos_views_of_two_sizes_are_served_as_default_collate_gives_them(folder, workers):
    """[the views' NCHW batches (two of 48 px, three of 24), labels], as default_collate gives
    DINO's lists; each view a crop of the image its label names (the class read back from its
    pixels), each drawn apart from the others; every sample once an epoch."""
    crop = lambda size: T.Compose([T.RandomResizedCrop(size, scale=(0.2, 1.0), interpolation=T.InterpolationMode.BICUBIC),  # noqa: E731
                                   T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
    dataset = ImageFolder(str(folder), DataAugmentationDINO(crop(48), crop(48), crop(24), 3))
    want = torch.utils.data.default_collate([dataset[i] for i in range(8)])
    torch.manual_seed(0)
    loader = _served(dataset, batch_size=8, shuffle=True, num_workers=workers)
    assert isinstance(loader._loader.dataset, rt.NativeFolder)
    seen = []
    for views, labels in loader:
        assert type(views) is list and len(views) == 5 and labels.dtype == torch.int64
        assert [tuple(x.shape[1:]) for x in views] == [tuple(y.shape[1:]) for y in want[0]] \
            == [(3, 48, 48)] * 2 + [(3, 24, 24)] * 3
        assert all(x.is_contiguous() and x.dtype == torch.float32 and len(x) == len(labels) for x in views)
        assert all(torch.equal(_class_of(x), labels) for x in views)
        for k in range(len(labels)):
            assert not torch.equal(views[0][k], views[1][k])
            assert not any(torch.equal(views[2][k], x[k]) for x in views[3:])
        seen += labels.tolist()
    assert sorted(seen) == sorted(dataset.targets)
    loader._stop()


def _others():
    """(a wrapper that is not one of the shapes, or not plainly, and words of its reason)."""
    class Rotated(TwoCropsTransform):
        def __call__(self, x):
            q = self.base_transform(x)
            k = self.base_transform(x.rotate(90))
            return [q, k]

    class Tupled(TwoCropsTransform):
        def __call__(self, x):
            q = self.base_transform(x)
            k = self.base_transform(x)
            return (q, k)

    class Looked(TwoCropsTransform):
        def __getattr__(self, name):
            return _augment()

    class Held(TwoCropsTransform):  # the transform a property of the class
        base_transform = property(lambda self: _augment())

        def __init__(self, base_transform):
            pass

    def with_range(cls):
        shadowed = types.FunctionType(cls.__call__.__code__, {**cls.__call__.__globals__, "range": lambda n: [0]})
        return type("Shadowed", (cls,), {"__call__": shadowed})

    class DinoTupled(DataAugmentationDINO):
        def __call__(self, image):
            crops = []
            crops.append(self.global_transfo1(image))
            crops.append(self.global_transfo2(image))
            for _ in range(self.local_crops_number):
                crops.append(self.local_transfo(image))
            return tuple(crops)

    return [
        (Rotated(_augment()), "Rotated has no faithful lowering"),
        (DinoTupled(_augment(), _augment(), _augment(24), 2), "DinoTupled has no faithful lowering"),
        (DataAugmentationDINO(_augment(), _augment(), _augment(24), MAX_VIEWS - 1), "has no faithful lowering"),
        (DataAugmentationDINO(_augment(), _augment(), _augment(24), -1), "has no faithful lowering"),
        (Tupled(_augment()), "Tupled has no faithful lowering"),
        (Looked(_augment()), "Looked has no faithful lowering"),
        (Held(_augment()), "Held has no faithful lowering"),
        (with_range(ContrastiveTransformations)(_augment()), "Shadowed has no faithful lowering"),
        (ContrastiveTransformations(_augment(), n_views=0), "has no faithful lowering"),
        (ContrastiveTransformations(_augment(), n_views=True), "has no faithful lowering"),
        (ContrastiveTransformations(_augment(), n_views=MAX_VIEWS + 1), "has no faithful lowering"),
        (TwoCropsTransformV3(_augment(), T.Compose([T.RandomResizedCrop(48), T.ElasticTransform(), T.ToTensor()])),
         "TwoCropsTransformV3's view 2: ElasticTransform has no faithful lowering in fastdata"),
        (TwoCropsTransform(T.Compose([T.RandomResizedCrop(48)])),
         "TwoCropsTransform's view 1: the transform gives PIL images"),
    ]


@pytest.mark.parametrize("case", range(13))
def test_other_wrappers_fall_back_with_their_reason(folder, case):
    """Code that is not one of the shapes (a rotated view, a tuple), attributes found another way
    (a __getattr__, a property), a `range` that is not the builtin, a view count that is not an
    int from 1 to MAX_VIEWS (DINO's two global crops counted), or a view that is not lowered: the
    drop-in runs the wrapper itself."""
    wrapper, words = _others()[case]
    lowering, why = rt.lower(ImageFolder(str(folder), wrapper))
    assert lowering is None and words in why, why


@pytest.mark.parametrize("workers", [0, 2])
def test_views_are_served_as_default_collate_gives_them(folder, workers):
    """[list of each view's NCHW batch, labels], as default_collate gives the wrapper's lists;
    each view the image's (its class read back from its pixels), drawn apart from the other;
    every sample once an epoch; a deterministic wrapper's views torchvision's bit for bit."""
    dataset = ImageFolder(str(folder), TwoCropsTransform(_augment()))
    # (no colour change: the class is read from the blue channel)
    plain = ImageFolder(str(folder), ContrastiveTransformations(T.Compose(_augment().transforms[:1] +
                                                                          _augment().transforms[3:]), n_views=3))
    for ds, count in ((dataset, 2), (plain, 3)):
        torch.manual_seed(0)
        loader = _served(ds, batch_size=8, shuffle=True, num_workers=workers)
        assert isinstance(loader._loader.dataset, rt.NativeFolder)
        want = torch.utils.data.default_collate([ds[i] for i in range(8)])
        seen = []
        for views, labels in loader:
            assert type(views) is list and len(views) == count and labels.dtype == torch.int64
            for x, y in zip(views, want[0]):
                assert type(x) is torch.Tensor and x.dtype == y.dtype and x.shape[1:] == y.shape[1:]
                assert x.is_contiguous() and len(x) == len(labels)
            if ds is plain:
                assert all(torch.equal(_class_of(x), labels) for x in views)
            for k in range(len(labels)):  # (crops of 48 at scales from 0.2 and flips: never twice the same)
                assert not any(torch.equal(views[0][k], x[k]) for x in views[1:])
            seen += labels.tolist()
        assert sorted(seen) == sorted(ds.targets)
        loader._stop()
    fixed = ImageFolder(str(folder), TwoCropsTransformV3(_eval(), T.Compose([T.Resize(48), T.CenterCrop(40),
                                                                              T.PILToTensor()])))
    loader = _served(fixed, batch_size=8, num_workers=workers)
    assert type(loader._loader.dataset.__getitems__([0, 1])) is FolderViews
    for (a, y), (b, z) in zip(loader, torch.utils.data.DataLoader(fixed, batch_size=8), strict=True):
        assert len(a) == len(b) == 2 and all(x.dtype == u.dtype and torch.equal(x, u) for x, u in zip(a, b))
        assert torch.equal(y, z)
    loader._stop()


MOCO_SCRIPT = """
import sys
import torch
import torchvision.datasets as datasets
import torchvision.transforms as transforms


{wrapper}

normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
augmentation = [transforms.RandomResizedCrop(48, scale=(0.2, 1.0)), transforms.RandomHorizontalFlip(),
                transforms.ToTensor(), normalize]
train_dataset = datasets.ImageFolder(sys.argv[1], TwoCropsTransform(transforms.Compose(augmentation)))
train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=8, shuffle=True, num_workers=2,
                                           pin_memory=True, drop_last=True)
for epoch in range(2):
    seen = wrong = 0
    for i, (images, target) in enumerate(train_loader):
        images[0] = images[0].to("cpu", non_blocking=True)
        images[1] = images[1].to("cpu", non_blocking=True)
        for view in images:  # the class from the blue channel's level, 40 + 50c
            blue = (view[:, 2] * 0.225 + 0.406) * 255
            wrong += int(((blue.mean(dim=(1, 2)) - 55) / 50).round().long().ne(target).sum())
        seen += len(target)
        assert images[0].shape == images[1].shape == (8, 3, 48, 48), images[0].shape
    print("epoch", epoch, "seen", seen, "wrong", wrong)
"""


@pytest.mark.timeout(300)
def test_an_unchanged_moco_script_under_fastdata_run(folder, tmp_path):
    """MoCo's data loading as main_moco.py writes it (its TwoCropsTransform, ImageFolder, workers,
    pin_memory, drop_last; each view moved), unchanged: served natively (the summary says so),
    every view of every image its class's, the same lines printed as the plain script's."""
    import os
    import subprocess
    import sys

    script = tmp_path / "moco.py"
    script.write_text(MOCO_SCRIPT.format(wrapper=inspect.getsource(TwoCropsTransform)))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    # cwd: from a checkout's root, `python -m` would import the checkout's fastdata, not the installed one.
    plain = subprocess.run([sys.executable, str(script), str(folder)], capture_output=True, text=True, env=env,
                           cwd=tmp_path, timeout=240)
    got = subprocess.run([sys.executable, "-m", "fastdata", "run", "--", sys.executable, str(script), str(folder)],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=240)
    assert plain.returncode == 0 and got.returncode == 0, (plain.stderr[-2000:], got.stderr[-2000:])
    assert got.stdout == plain.stdout == "epoch 0 seen 40 wrong 0\nepoch 1 seen 40 wrong 0\n", \
        (got.stdout, plain.stdout)
    assert "served natively: ImageFolder with TwoCropsTransform: 2 views of (RandomResizedCrop, " in got.stderr, \
        got.stderr


def _stack_views(batch):
    """A script's collate_fn: torchvision's samples (a list of ([view, view], int)), each view its own tensor."""
    assert type(batch) is list and all(type(s) is tuple and len(s) == 2 and type(s[0]) is list for s in batch)
    assert all(x.untyped_storage().nbytes() == x.numel() * x.element_size() for views, _ in batch for x in views)
    return [torch.stack([views[v] for views, _ in batch]) for v in range(2)], torch.tensor([y for _, y in batch])


def test_a_collate_fn_of_the_scripts_gets_each_sample_as_its_list_of_views(folder):
    fixed = ImageFolder(str(folder), TwoCropsTransformV3(_eval(), T.Compose([T.Resize(48), T.CenterCrop(40),
                                                                              T.PILToTensor()])))
    loader = _served(fixed, batch_size=8, collate_fn=_stack_views)
    assert isinstance(loader._loader.dataset, rt.NativeFolder)
    for (a, y), (b, z) in zip(loader, torch.utils.data.DataLoader(fixed, batch_size=8, collate_fn=_stack_views),
                              strict=True):
        assert all(torch.equal(x, u) for x, u in zip(a, b)) and torch.equal(y, z)
    loader._stop()


def test_a_views_batch_crosses_from_workers_as_uint8_per_view(folder):
    """What crosses: a FolderViews, collated into each view's uint8 NHWC block and one targets
    tensor, picklable; laid out in the main process."""
    from fastdata.run._layout import Finish, Views

    dataset = ImageFolder(str(folder), TwoCropsTransformV3(_augment(48), T.Compose([T.RandomResizedCrop(40),
                                                                                    T.PILToTensor()])))
    lowering, _ = rt.lower(dataset)
    batch = rt.NativeFolder(dataset, lowering).__getitems__(list(range(6)))
    crossed = pickle.loads(pickle.dumps(batch.collate_into(None)))
    assert type(crossed[2]) is Views and [tuple(x.shape) for x in crossed[0]] == [(6, 48, 48, 3), (6, 40, 40, 3)]
    assert all(x.dtype == torch.uint8 for x in crossed[0]) and crossed[1].tolist() == dataset.targets[:6]
    (q, k), targets = Finish(lowering, 2, pin=False, forks=False)(crossed)
    assert q.dtype == torch.float32 and k.dtype == torch.uint8 and torch.equal(k, crossed[0][1].permute(0, 3, 1, 2))
    assert torch.equal(targets, crossed[1])


def test_fastdata_run_profile_counts_a_views_batch_by_its_images():
    """--profile's images a batch: the first view's rows (not 1, the length of nothing)."""
    from fastdata.run._profile import _images

    assert _images([[torch.zeros(8, 3, 4, 4), torch.zeros(8, 3, 2, 2)], torch.zeros(8)]) == 8


# ------------------------------------------------ CIFAR10 (in memory: fastdata.run._arrays)

@pytest.fixture
def cifar(tmp_path, monkeypatch):
    """CIFAR10's test split over 120 images of `_images.cifar_rows` (its md5 check stubbed): red is
    the index plus 1, green 10 + 7 * row, blue 10 + 7 * column; label = index % 10. Inside,
    torchvision's own fetch raises (its PIL image): a batch fastdata did not serve natively fails
    the test."""
    import torchvision.datasets.cifar as C

    write_cifar10(tmp_path, 120)
    monkeypatch.setattr(C, "check_integrity", lambda *a, **k: True)
    monkeypatch.setattr(C.CIFAR10, "_check_integrity", lambda self: True)

    def make(transform):
        dataset = tv.datasets.CIFAR10(str(tmp_path), train=False, transform=transform)
        plain = torch.utils.data.default_collate([dataset[i] for i in range(4)])
        monkeypatch.setattr(C, "Image", types.SimpleNamespace(fromarray=_refuse))
        return dataset, plain
    return make


def _refuse(*args, **kwargs):
    raise AssertionError("the dataset's own __getitem__ ran")


@pytest.mark.parametrize("workers", [0, 2])
def test_cifar_views_are_cut_from_its_arrays(cifar, workers):
    """Each of three views its own crop offsets and flip (read back from the pixels: green is the
    row, blue the column), of the image its label names (red, the index)."""
    dataset, plain = cifar(ContrastiveLearningViewGenerator(T.Compose([
        T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor()]), n_views=3))
    loader = _served(dataset, batch_size=16, shuffle=True, num_workers=workers)
    places, count = [], 0
    for views, labels in loader:
        assert type(views) is list and len(views) == 3
        assert all(x.shape[1:] == plain[0][0].shape[1:] and x.dtype == torch.float32 for x in views)
        made = []
        for x in views:
            centre = (x[:, :, 16, 16] * 255).round().long()  # (inside the image at any offset)
            index = centre[:, 0] - 1
            assert torch.equal(index % 10, labels)
            row, column = (centre[:, 1] - 10) // 7 - 16, (centre[:, 2] - 10) // 7 - 16
            made.append(torch.stack([row, column], 1))
            # (a flip reads the centre one column to the left)
            assert row.abs().max() <= 4 and column.min() >= -5 and column.max() <= 4
        places += [tuple(tuple(m[k].tolist()) for m in made) for k in range(len(labels))]
        count += len(labels)
    assert count == len(dataset)
    # the views drawn apart: of 81 offsets and 2 flips, a sample's views rarely repeat one another
    repeated = sum(len(set(p)) < 3 for p in places)
    assert repeated <= 0.15 * count, repeated
    loader._stop()


def test_cifar_views_of_a_deterministic_wrapper_are_torchvisions(cifar):
    normalize = T.Normalize((0.49, 0.48, 0.45), (0.2, 0.2, 0.2))
    dataset, plain = cifar(TwoCropsTransformV3(T.Compose([T.Pad(2), T.CenterCrop(32), T.ToTensor(), normalize]),
                                               T.Compose([T.CenterCrop(24), T.PILToTensor()])))
    views, labels = next(iter(_served(dataset, batch_size=4)))
    assert all(x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(views, plain[0], strict=True))
    assert torch.equal(labels, plain[1])


# ------------------------------------------------ STL10: the Lightning tutorial's SimCLR

@pytest.fixture
def stl10(tmp_path, monkeypatch):
    """STL10's "train" split over 60 images of 96x96 (its md5 check stubbed): red is the index plus
    1, green 2 * row, blue 2 * column; label = index % 10. Inside, torchvision's own fetch raises."""
    import torchvision.datasets.stl10 as S

    n = 60
    a = np.zeros((n, 3, 96, 96), np.uint8)
    a[:, 0] = (np.arange(n) + 1)[:, None, None]
    a[:, 1] = (2 * np.arange(96))[None, :, None]
    a[:, 2] = (2 * np.arange(96))[None, None, :]
    d = tmp_path / "stl10_binary"
    d.mkdir()
    a.transpose(0, 1, 3, 2).tofile(d / "train_X.bin")  # (its files hold each plane column by column)
    (np.arange(n) % 10 + 1).astype(np.uint8).tofile(d / "train_y.bin")
    monkeypatch.setattr(S.STL10, "_check_integrity", lambda self: True)

    def make(transform):
        dataset = tv.datasets.STL10(str(tmp_path), split="train", transform=transform)
        plain = torch.utils.data.default_collate([dataset[i] for i in range(4)])
        monkeypatch.setattr(S, "Image", types.SimpleNamespace(fromarray=_refuse))
        return dataset, plain
    return make


@pytest.mark.parametrize("workers", [0, 2])
def test_the_lightning_tutorials_simclr_on_stl10_is_served_natively(stl10, workers):
    """The tutorial's `ContrastiveTransformations(contrast_transforms, n_views=2)` on STL10 (flip,
    RandomResizedCrop(96), RandomApply of ColorJitter, RandomGrayscale, GaussianBlur(9), ToTensor,
    Normalize((0.5,), (0.5,))): two views of each image, its label the dataset's."""
    contrast_transforms = T.Compose([
        T.RandomHorizontalFlip(),
        T.RandomResizedCrop(size=96),
        T.RandomApply([T.ColorJitter(brightness=0.5, contrast=0.5, saturation=0.5, hue=0.1)], p=0.8),
        T.RandomGrayscale(p=0.2),
        T.GaussianBlur(kernel_size=9),
        T.ToTensor(),
        T.Normalize((0.5,), (0.5,)),
    ])
    dataset, plain = stl10(ContrastiveTransformations(contrast_transforms, n_views=2))
    loader = _served(dataset, batch_size=16, shuffle=True, num_workers=workers, drop_last=True)
    assert loader._fastdata_lowering.in_memory and len(loader._fastdata_lowering.views) == 2
    labels_seen = []
    for views, labels in loader:
        assert len(views) == 2 and all(x.shape == (16, 3, 96, 96) and x.dtype == torch.float32 for x in views)
        assert all(x.min() >= -1 and x.max() <= 1 for x in views) and not torch.equal(views[0], views[1])
        labels_seen += labels.tolist()
    assert len(labels_seen) == 48 and set(labels_seen) <= set(range(10))
    loader._stop()


def test_stl10_views_of_crops_and_flips_are_its_images(stl10):
    """Without the colour ops, each view is a crop of the image its label names (red: the index),
    resized to 96, and the two views of an image differ."""
    dataset, plain = stl10(ContrastiveTransformations(T.Compose([
        T.RandomHorizontalFlip(), T.RandomResizedCrop(size=96), T.PILToTensor()]), n_views=2))
    views, labels = next(iter(_served(dataset, batch_size=20)))
    assert all(x.shape == plain[0][0].shape[1:] and x.dtype == torch.uint8 for x in views[0][:1])
    for x in views:
        index = x[:, 0].flatten(1).median(1).values.long() - 1  # (red: one value a picture)
        assert torch.equal(index, torch.arange(20)) and torch.equal(labels, torch.arange(20) % 10)
    assert sum(torch.equal(views[0][k], views[1][k]) for k in range(20)) == 0
