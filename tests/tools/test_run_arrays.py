"""`fastdata run` serving torchvision's in-memory datasets natively (`fastdata.run._arrays`):
CIFAR10/100, SVHN and the MNIST family, their geometry run on a batch's rows at once.

The datasets are torchvision's own classes over files these tests write (CIFAR's pickled
batches, with its md5 check stubbed; MNIST's processed tensors, which it reads as they are), so
this file runs where torchvision is installed: .ci/run makes a virtualenv as a user's and runs
it there. Pixels encode where they come from, so a served batch says which crop offsets and
flips were drawn, and the test checks it against torchvision's own ops for those.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import types

import numpy as np
import pytest
import torch

from _images import write_cifar10

CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)
N = 250  # images in each split


@pytest.fixture(scope="module")
def tv():
    return pytest.importorskip("torchvision")


@pytest.fixture(scope="module")
def roots(tmp_path_factory, tv):
    """(CIFAR10's root, MNIST's root) holding N training and N test images each; label = index % 10."""
    root = tmp_path_factory.mktemp("arrays")
    write_cifar10(root, N)
    p = root / "MNIST" / "processed"
    p.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in ("training.pt", "test.pt"):
        data = torch.from_numpy(rng.integers(0, 256, (N, 28, 28), dtype=np.uint8))
        data[:, 0, 0] = torch.arange(N) % 250 + 1  # the index, in the top-left pixel
        torch.save((data, torch.arange(N) % 10), p / name)
    return root


@pytest.fixture
def cifar(tv, roots, monkeypatch):
    import torchvision.datasets.cifar as C

    monkeypatch.setattr(C, "check_integrity", lambda *a, **k: True)  # (the files are these tests')
    monkeypatch.setattr(C.CIFAR10, "_check_integrity", lambda self: True)

    def make(transform, train=False, cls=None, **kwargs):
        return (cls or tv.datasets.CIFAR10)(str(roots), train=train, transform=transform, **kwargs)
    return make


def _served(dataset, **kwargs):
    from fastdata.run._hook import Served

    return Served(dataset, **kwargs)


def _batches(loader) -> list:
    return [(x.clone(), y.clone()) for x, y in loader]


@contextlib.contextmanager
def natively_only():
    """Inside, torchvision's own fetch of CIFAR and MNIST raises (their PIL image): a batch
    fastdata did not serve natively fails the test (in forked workers too)."""
    import torchvision.datasets.cifar as C
    import torchvision.datasets.mnist as M
    import torchvision.datasets.svhn as S

    def refuse(*args, **kwargs):
        raise AssertionError("the dataset's own __getitem__ ran")

    saved = C.Image, M._Image_fromarray, S.Image
    C.Image, M._Image_fromarray = types.SimpleNamespace(fromarray=refuse), refuse
    S.Image = C.Image
    try:
        yield
    finally:
        C.Image, M._Image_fromarray, S.Image = saved


def _both(dataset, **kwargs):
    """(DataLoader's batches, the served loader's batches, all natively served, the served loader)."""
    plain = _batches(torch.utils.data.DataLoader(dataset, **kwargs))
    loader = _served(dataset, **kwargs)
    with natively_only():
        return plain, _batches(loader), loader


def _same(a: list, b: list) -> None:
    assert len(a) == len(b)
    for (x, y), (u, v) in zip(a, b):
        assert x.dtype == u.dtype and x.shape == u.shape and u.is_contiguous() and torch.equal(x, u)
        assert y.dtype == v.dtype and torch.equal(y, v)


def _deterministic(tv) -> dict:
    import torchvision.transforms as T
    import torchvision.transforms.v2 as v2

    return {
        "v1 pad, flip, center crop, normalize": T.Compose([
            T.Pad((1, 2, 3, 4), padding_mode="symmetric"), T.RandomHorizontalFlip(1.0), T.CenterCrop((30, 31)),
            T.ToTensor(), T.Normalize(CIFAR_MEAN, CIFAR_STD)]),
        "v1 reflect pad, vertical flip p=1, uint8": T.Compose([
            T.Pad(3, padding_mode="reflect"), T.RandomVerticalFlip(1.0), T.PILToTensor()]),
        "v2 on tensors, edge pad, ToDtype": v2.Compose([
            v2.ToImage(), v2.Pad([2, 5], fill=7), v2.RandomHorizontalFlip(0.0), v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(CIFAR_MEAN, CIFAR_STD)]),
        "v1 geometry on a float tensor": T.Compose([T.ToTensor(), T.Pad(2), T.CenterCrop(32), T.Normalize(
            CIFAR_MEAN, CIFAR_STD)]),
        "v1 ConvertImageDtype to float64": T.Compose([T.PILToTensor(), T.ConvertImageDtype(torch.float64)]),
        # one ColorJitter factor of a fixed value (so its order draws change nothing): Pillow's contrast
        # reads the mean of the image as cropped
        "v1 crop then a fixed contrast": T.Compose([T.Pad(3, padding_mode="edge"), T.CenterCrop(36),
                                                    T.ColorJitter(contrast=(0.6, 0.6)), T.ToTensor()]),
        "v2 fixed saturation": v2.Compose([v2.RandomHorizontalFlip(1.0), v2.ColorJitter(saturation=(0.3, 0.3)),
                                           v2.PILToTensor()]),
        # torchvision pads a smaller image with zeros, the odd pixel after; a PIL image's reflect and
        # symmetric pads (numpy's) take any size; edge takes any on a tensor too
        "v1 center crop past the image, reflect pad past it": T.Compose([
            T.CenterCrop((37, 34)), T.Pad((40, 3), padding_mode="reflect"), T.Pad(50, padding_mode="symmetric"),
            T.PILToTensor()]),
        "v2 center crop past a tensor, edge pad past it": v2.Compose([
            v2.ToImage(), v2.CenterCrop(35), v2.Pad(70, padding_mode="edge"), v2.ToPureTensor()]),
        "a crop that cannot move": T.Compose([T.RandomCrop(32), v2.RandomCrop(32, padding=0), T.PILToTensor()]),
        # Resize: the script's own on each row's PIL image, or on its uint8 tensor (torch's resize there)
        "v1 Resize up, flip p=1, normalize": T.Compose([T.Resize(45), T.RandomHorizontalFlip(1.0), T.ToTensor(),
                                                         T.Normalize(CIFAR_MEAN, CIFAR_STD)]),
        # a weights' transforms(), as transfer-learning scripts give CIFAR: Resize(256), CenterCrop(224), ...
        "ResNet-18's weights' transforms()": tv.models.ResNet18_Weights.DEFAULT.transforms(),
        # a Lambda converting to RGB, as scripts written for folders of any mode add: the identity here
        "a convert-to-RGB Lambda before and after a flip": T.Compose([
            T.Lambda(lambda img: img.convert("RGB")), T.RandomVerticalFlip(1.0),
            v2.Lambda(lambda x: x.convert("RGB") if x.mode != "RGB" else x), T.PILToTensor()]),
        "v1 Resize down lanczos, center crop": T.Compose([
            T.Resize([20], interpolation=T.InterpolationMode.LANCZOS), T.CenterCrop(18), T.PILToTensor()]),
        "v2 Resize of a uint8 tensor, bicubic, to a pair": v2.Compose([
            v2.ToImage(), v2.Resize((36, 44), interpolation=v2.InterpolationMode.BICUBIC),
            v2.ToDtype(torch.float32, scale=True)]),
    }


@pytest.mark.parametrize("workers", [0, 2])
def test_cifar_is_served_natively_bit_for_bit_where_nothing_is_drawn(cifar, tv, workers):
    """Transforms that draw nothing (or whose draws are certain): the served batches are
    DataLoader's over torchvision's samples, bit for bit, dtype and labels included."""
    for what, transform in _deterministic(tv).items():
        dataset = cifar(transform)
        plain, got, loader = _both(dataset, batch_size=64, num_workers=workers)
        assert loader._fastdata_lowering is not None and loader._fastdata_lowering.in_memory, what
        _same(plain, got)
        loader._stop()


@pytest.mark.parametrize("workers", [0, 2])
def test_mnist_is_served_natively_bit_for_bit(tv, roots, workers):
    import torchvision.transforms as T
    import torchvision.transforms.v2 as v2

    for transform in (T.Compose([T.ToTensor(), T.Normalize((0.1307,), (0.3081,))]),
                      T.Compose([T.CenterCrop(24), T.PILToTensor()]),
                      v2.Compose([v2.ToImage(), v2.Pad(2, padding_mode="edge"), v2.ToDtype(torch.float16, scale=True)]),
                      T.Compose([T.Resize(40), T.ToTensor()]),
                      v2.Compose([v2.ToImage(), v2.Resize(20, antialias=False),
                                  v2.ToDtype(torch.float32, scale=True)])):
        for cls in (tv.datasets.MNIST, tv.datasets.FashionMNIST):
            if cls is tv.datasets.FashionMNIST:
                (roots / "FashionMNIST").mkdir(exist_ok=True)
                if not (roots / "FashionMNIST" / "processed").exists():
                    (roots / "FashionMNIST" / "processed").symlink_to(roots / "MNIST" / "processed")
            dataset = cls(str(roots), train=True, transform=transform, target_transform=lambda t: t * 3)
            plain, got, loader = _both(dataset, batch_size=50, num_workers=workers)
            assert loader._fastdata_lowering.in_memory and loader._fastdata_lowering.channels == 1
            assert got[0][0].shape[1] == 1
            _same(plain, got)
            loader._stop()


@pytest.fixture
def svhn(tv, cifar):
    """torchvision's SVHN over CIFAR's test images and labels, its arrays as its `__init__` lays out
    scipy's load of `train_32x32.mat` (X of H, W, C, N made N, C, H, W by a transposed view; the
    labels an int64 vector): made without the file, whose reading needs scipy."""
    def make(transform, target_transform=None):
        images = cifar(None)
        ds = tv.datasets.SVHN.__new__(tv.datasets.SVHN)
        tv.datasets.VisionDataset.__init__(ds, "svhn", transform=transform, target_transform=target_transform)
        ds.split, ds.labels = "train", np.asarray(images.targets, dtype=np.int64)
        ds.data = np.transpose(np.ascontiguousarray(images.data.transpose(1, 2, 3, 0)), (3, 2, 0, 1))
        return ds
    return make


@pytest.mark.parametrize("workers", [0, 2])
def test_svhn_is_served_natively_bit_for_bit_where_nothing_is_drawn(svhn, tv, workers):
    for what, transform in _deterministic(tv).items():
        dataset = svhn(transform, target_transform=lambda t: t + 100)
        assert not dataset.data.flags.c_contiguous
        plain, got, loader = _both(dataset, batch_size=64, num_workers=workers)
        assert loader._fastdata_lowering is not None and loader._fastdata_lowering.in_memory, what
        _same(plain, got)
        loader._stop()


def test_svhns_random_crop_is_torchvisions_pixels_for_the_offsets_drawn(svhn, tv):
    """An SVHN recipe (RandomCrop(32, padding=4), no flip for digits, ToTensor, Normalize): each
    served image is torchvision's crop of its own image at the offsets read back from its pixels,
    its label its own, every image once an epoch."""
    import torchvision.transforms as T
    import torchvision.transforms.functional as F
    from PIL import Image

    normalize = T.Normalize(CIFAR_MEAN, CIFAR_STD)
    dataset = svhn(T.Compose([T.RandomCrop(32, padding=4), T.ToTensor(), normalize]))
    loader = _served(dataset, batch_size=50, shuffle=True, num_workers=2)
    with natively_only():
        batches = list(loader)
    seen, offsets = [], set()
    for images, labels in batches:
        for k, (index, top, left, flipped) in enumerate(_drawn(_uint8_of(images), 4)):
            img = F.crop(F.pad(Image.fromarray(np.transpose(dataset.data[index - 1], (1, 2, 0))), 4), top, left, 32, 32)
            assert not flipped and torch.equal(images[k], normalize(F.to_tensor(img)))
            assert labels[k] == (index - 1) % 10
            seen.append(index - 1), offsets.add((top, left))
    assert sorted(seen) == list(range(N)) and len(offsets) > 40
    loader._stop()


@pytest.mark.parametrize("workers", [0, 2])
def test_mnist_made_rgb_is_served_natively_bit_for_bit(tv, roots, workers):
    """MNIST's L images made RGB before the tensor, as scripts make them for a 3-channel network
    (Grayscale(num_output_channels=3) or a Lambda converting to RGB; first, or after moves of pixels
    or a Resize; a Resize after it too):
    served natively, each of the 3 channels the image's, the batches DataLoader's bit for bit (a
    pixel op after it on the RGB image); after a rotation, or Grayscale to 1 channel, not lowered."""
    import torchvision.transforms as T
    import torchvision.transforms.v2 as v2

    from fastdata.run._arrays import lower_arrays

    for transform in (T.Compose([T.Grayscale(num_output_channels=3), T.ToTensor(), T.Normalize((0.5,), (0.5,))]),
                      T.Compose([T.Pad(2, padding_mode="edge"), T.CenterCrop(30), v2.Grayscale(3), T.PILToTensor()]),
                      T.Compose([T.Lambda(lambda x: x.convert("RGB")), T.ColorJitter(contrast=(0.6, 0.6)),
                                 T.ToTensor()]),
                      # a Resize before it (on the L image, as torchvision) or after it (on the RGB image)
                      T.Compose([T.Resize(40), T.Grayscale(3), T.ToTensor(), T.Normalize((0.5,), (0.5,))]),
                      T.Compose([T.Grayscale(3), T.Resize((20, 36), interpolation=T.InterpolationMode.BICUBIC),
                                 T.RandomHorizontalFlip(1.0), T.PILToTensor()])):
        dataset = tv.datasets.MNIST(str(roots), train=True, transform=transform)
        plain, got, loader = _both(dataset, batch_size=50, num_workers=workers)
        assert loader._fastdata_lowering.in_memory and loader._fastdata_lowering.channels == 3
        assert got[0][0].shape[1] == 3 and torch.equal(got[0][0][:, 0], got[0][0][:, 2])
        _same(plain, got)
        loader._stop()
    for transform in (T.Compose([T.RandomRotation(10), T.Grayscale(3), T.ToTensor()]),
                      T.Compose([T.Grayscale(1), T.ToTensor()])):
        lowering, reason = lower_arrays(tv.datasets.MNIST(str(roots), train=True, transform=transform))
        assert lowering is None and reason.startswith("Grayscale has no faithful lowering for an in-memory"), reason


def test_a_resize_the_extension_gets_wrong_is_pillows(cifar, tv, monkeypatch):
    """The extension's resize (`_gather._native_resize`) is checked against Pillow's own on each
    batch's first row: where they differ (a Pillow of arithmetic it does not know; here an
    extension that writes zeros), that batch and the later ones are Pillow's; without the
    extension, Pillow's too. The batches are DataLoader's bit for bit either way."""
    import torchvision.transforms as T

    import fastdata.run._gather as G

    dataset = cifar(T.Compose([T.Resize(45, interpolation=T.InterpolationMode.BICUBIC), T.ToTensor()]))
    plain = _batches(torch.utils.data.DataLoader(dataset, batch_size=64))
    calls = []
    zeros = types.SimpleNamespace(resize_images=lambda src, out, *args: calls.append(out.fill(0)))
    for extension, exact in ((zeros, False), (None, True)):
        monkeypatch.setattr(G, "native", extension)
        monkeypatch.setattr(G, "_NATIVE_EXACT", True)
        loader = _served(dataset, batch_size=64, num_workers=0)
        with natively_only():
            _same(plain, _batches(loader))
        assert G._NATIVE_EXACT is exact and len(calls) == 1
        loader._stop()


def _drawn(images: torch.Tensor, pad: int) -> list[tuple[int, int, int, bool]]:
    """(index mod 250, top, left, flipped) of each CIFAR crop laid out as uint8 (`cifar_rows`'s
    pixels, cut from the image padded with zeros by `pad`)."""
    out = []
    for img in images.numpy():
        red, green, blue = img.astype(int)
        rows, cols = np.flatnonzero(green.max(1)), np.flatnonzero(blue.max(0))
        y0, x0 = rows[0], cols[0]
        top = (green[y0].max() - 10) // 7 - y0 + pad
        flipped = bool(cols.size > 1 and blue[y0, cols[0]] > blue[y0, cols[-1]])
        left = (blue[y0, x0] - 10) // 7 - x0 + pad if not flipped else (
            (blue[y0, cols[-1]] - 10) // 7 - (31 - cols[-1]) + pad)
        out.append((int(red[y0, x0]), int(top), int(left), flipped))
    return out


def _within(name: str, hits: int, n: int, p: float, sigmas: float = 4.5) -> None:
    sd = (n * p * (1 - p)) ** 0.5
    assert abs(hits - n * p) <= sigmas * sd, f"{name}: {hits}/{n}, expected {n * p:.1f}"


@pytest.mark.parametrize("flip", ["after the crop", "after Normalize"])
@pytest.mark.parametrize("workers", [0, 2])
def test_random_crop_and_flip_are_torchvisions_pixels_for_what_was_drawn(cifar, tv, workers, flip):
    """The CIFAR recipe (RandomCrop(32, padding=4), RandomHorizontalFlip, ToTensor, Normalize; or
    the flip last, which fastdata runs first: it commutes with the conversion): each served image
    is torchvision's own ops, in the script's order, run with the offsets and flip read back from
    its pixels; the labels are the images' own; every image once an epoch; each of the 9 offsets a
    ninth of the time, the two apart, and flips half (binomial bounds, 4.5 sigmas, on a fixed seed)."""
    import torchvision.transforms as T
    import torchvision.transforms.functional as F
    from PIL import Image

    torch.manual_seed(0)
    normalize = T.Normalize(CIFAR_MEAN, CIFAR_STD)
    last = flip == "after Normalize"
    dataset = cifar(T.Compose([T.RandomCrop(32, padding=4), *([] if last else [T.RandomHorizontalFlip()]),
                               T.ToTensor(), normalize, *([T.RandomHorizontalFlip()] if last else [])]))
    loader = _served(dataset, batch_size=50, shuffle=True, num_workers=workers)
    assert loader._fastdata_lowering.in_memory
    tops, lefts, flips = [], [], []
    for epoch in range(6):
        seen = []
        with natively_only():
            batches = list(loader)
        for images, labels in batches:
            for k, (index, top, left, flipped) in enumerate(_drawn(_uint8_of(images), 4)):
                img = F.crop(F.pad(Image.fromarray(dataset.data[index - 1]), 4), top, left, 32, 32)
                if last:
                    expected = normalize(F.to_tensor(img))
                    expected = F.hflip(expected) if flipped else expected
                else:
                    expected = normalize(F.to_tensor(F.hflip(img) if flipped else img))
                assert torch.equal(images[k], expected) and labels[k] == (index - 1) % 10
                tops.append(top), lefts.append(left), flips.append(flipped)
                seen.append(index - 1)
        assert sorted(seen) == list(range(N))
    for name, drawn in (("top", tops), ("left", lefts)):
        counts = np.bincount(np.array(drawn), minlength=9)
        assert counts.size == 9, name
        for offset, hits in enumerate(counts):
            _within(f"{name} {offset}", int(hits), len(drawn), 1 / 9)
    _within("top == left (drawn apart)", sum(t == u for t, u in zip(tops, lefts)), len(tops), 1 / 9)
    _within("flips", sum(flips), len(flips), 0.5)
    loader._stop()


@pytest.mark.parametrize("version", ["v1 bilinear", "v2 bicubic", "MNIST v1 nearest", "v2 on a tensor, bilinear",
                                     "v1 on a tensor, bicubic"])
def test_random_resized_crop_is_torchvisions_resized_crop_for_a_box_drawn(cifar, tv, roots, version):
    """RandomResizedCrop on the PIL image or its uint8 tensor (a quarter of the area, square: a
    16x16 box of a 32x32 CIFAR image, 14x14 of MNIST's 28x28): each served image is torchvision's
    `F.resized_crop` (Pillow's crop, then its resize; on a tensor, torch's, the op's version's
    functional) of one of the boxes it could draw, to the bit; every offset drawn, uniformly
    (binomial bounds on a fixed seed), top and left apart."""
    import torchvision.transforms as T
    import torchvision.transforms.functional as F
    import torchvision.transforms.v2 as v2
    import torchvision.transforms.v2.functional as F2
    from PIL import Image

    M = v2 if version.startswith("v2") else T
    mode = next(m for m in ("bilinear", "bicubic", "nearest") if version.endswith(m))
    mnist, on_tensor = version.startswith("MNIST"), "tensor" in version
    crop = M.RandomResizedCrop(24, scale=(0.25, 0.25), ratio=(1.0, 1.0), interpolation=T.InterpolationMode(mode))
    transform = M.Compose([T.PILToTensor(), crop] if on_tensor else [crop, T.PILToTensor()])
    dataset = tv.datasets.MNIST(str(roots), transform=transform) if mnist else cifar(transform)
    side, box = (28, 14) if mnist else (32, 16)
    torch.manual_seed(1)
    loader = _served(dataset, batch_size=50, shuffle=False)
    with natively_only():
        batches = list(loader)
    assert loader._fastdata_lowering.in_memory and sum(len(y) for _, y in batches) == N
    images = torch.cat([x for x, _ in batches])
    data = dataset.data.numpy() if mnist else dataset.data
    places = []
    for index, served in enumerate(images):
        img = Image.fromarray(data[index])
        if on_tensor:  # (the op's version's functional, as the op calls it)
            resized = [(F2 if M is v2 else F).resized_crop(F.pil_to_tensor(img), top, left, box, box, [24, 24],
                                                          T.InterpolationMode(mode), antialias=True)
                       for top in range(side - box + 1) for left in range(side - box + 1)]
        else:
            resized = [F.pil_to_tensor(F.resized_crop(img, top, left, box, box, [24, 24], T.InterpolationMode(mode)))
                       for top in range(side - box + 1) for left in range(side - box + 1)]
        found = [divmod(k, side - box + 1) for k, r in enumerate(resized) if torch.equal(r, served)]
        assert found, f"sample {index}: no box of torchvision's gives its pixels"
        places.append(found[0])
    for name, drawn in (("top", [t for t, _ in places]), ("left", [u for _, u in places])):
        counts = np.bincount(np.array(drawn), minlength=side - box + 1)
        for offset, hits in enumerate(counts):
            _within(f"{name} {offset}", int(hits), len(drawn), 1 / (side - box + 1))
    _within("top == left (drawn apart)", sum(t == u for t, u in places), len(places), 1 / (side - box + 1))
    loader._stop()


def _uint8_of(images: torch.Tensor) -> torch.Tensor:
    """The uint8 pixels of a CIFAR batch laid out through ToTensor and Normalize."""
    m, s = torch.tensor(CIFAR_MEAN).view(1, 3, 1, 1), torch.tensor(CIFAR_STD).view(1, 3, 1, 1)
    return (images * s + m).mul(255).round().to(torch.uint8)


def _collate_with_storage(batch):
    """A collate_fn of the script's: the samples stacked, and whether each owned its storage."""
    images, targets = zip(*batch)
    owns = all(x.untyped_storage().nbytes() == x.numel() * x.element_size() for x in images)
    return torch.stack(images), torch.tensor(targets), owns


@pytest.mark.parametrize("workers", [0, 2])
def test_a_subset_and_a_collate_fn_of_the_scripts_get_natively_served_samples(cifar, tv, roots, workers):
    """A Subset (random_split's) of CIFAR10 and of MNIST, batched by a collate_fn of the
    script's: served natively, the collate_fn handed torchvision's samples bit for bit, each
    its own tensor."""
    import torchvision.transforms as T

    from fastdata.run._arrays import NativeArrays

    for dataset in (cifar(_deterministic(tv)["v1 pad, flip, center crop, normalize"]),
                    tv.datasets.MNIST(str(roots), transform=T.Compose([T.Pad(1), T.ToTensor()]))):
        subset = torch.utils.data.Subset(dataset, list(range(N - 1, 0, -3)))
        kwargs = dict(batch_size=16, num_workers=workers, collate_fn=_collate_with_storage)
        loader = _served(subset, **kwargs)
        assert isinstance(loader._loader.dataset, NativeArrays)
        plain = list(torch.utils.data.DataLoader(subset, **kwargs))
        with natively_only():
            got = list(loader)
        assert len(got) == len(plain)
        for (a, y, owns), (b, z, _) in zip(got, plain):
            assert owns and torch.equal(a, b) and torch.equal(y, z)
        loader._stop()


class _Split(torch.utils.data.Dataset):  # a script's class giving a split's part its transform
    def __init__(self, subset, transform=None):
        self.subset = subset
        self.transform = transform

    def __getitem__(self, index):
        x, y = self.subset[index]
        if self.transform:
            x = self.transform(x)
        return x, y

    def __len__(self):
        return len(self.subset)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_scripts_wrapper_giving_a_split_of_cifar_its_transform_is_served_natively(cifar, tv, workers):
    """CIFAR10 without a transform, random_split, each part given its transform by the script's
    own Dataset class (`_wrapped`'s shapes), and a join of one CIFAR10 with itself: served
    natively, torchvision's batches bit for bit;
    a CIFAR10 with a transform of its own under the wrapper is not served, saying why."""
    import torchvision.transforms as T

    from fastdata.run._arrays import NativeArrays, lower_arrays

    train, val = torch.utils.data.random_split(cifar(None), [0.8, 0.2], generator=torch.Generator().manual_seed(0))
    pipelines = _deterministic(tv)
    twice = cifar(pipelines["v1 pad, flip, center crop, normalize"])
    for wrapper in (_Split(train, pipelines["v1 pad, flip, center crop, normalize"]),
                    _Split(val, pipelines["v1 ConvertImageDtype to float64"]),
                    twice + twice):  # (a join of one dataset: its rows, as the join indexes them)
        plain, got, loader = _both(wrapper, batch_size=16, num_workers=workers)
        assert isinstance(loader._loader.dataset, NativeArrays)
        _same(plain, got)
        loader._stop()
    owned = _Split(cifar(T.ToTensor()), T.ToTensor())
    assert lower_arrays(owned) == (None, "the CIFAR10 under _Split has a transform of its own: fastdata lowers one "
                                        "transform an image")


def test_what_is_not_lowered_falls_back_and_says_why(cifar, tv, roots):
    """Each case the in-memory path does not take: the loader is served by the drop-in, its
    batches the script's own (torchvision's samples), and the reason names what was not lowered."""
    import torchvision.transforms as T
    import torchvision.transforms.v2 as v2

    from fastdata.run._decide import decide

    cases = [
        (cifar(T.Compose([T.ElasticTransform(), T.ToTensor()])), "ElasticTransform has no faithful lowering for an "),
        (cifar(T.Compose([T.RandomApply([T.RandomCrop(32, padding=4)]), T.ToTensor()])),
         "RandomCrop in a RandomApply"),
        (cifar(T.Compose([T.ToTensor(), T.GaussianBlur(3)])), "GaussianBlur on a float tensor"),
        (cifar(T.Compose([T.ToTensor(), T.RandomRotation(15)])), "RandomRotation on a tensor"),
        (cifar(T.Compose([T.RandomRotation(15, expand=True), T.ToTensor()])), "with expand"),
        (cifar(T.Compose([T.AutoAugment(), T.RandomCrop(32, padding=4), T.ToTensor()])),
         "RandomCrop after AutoAugment"),
        (cifar(T.Compose([T.ToTensor(), T.ColorJitter(0.4)])), "ColorJitter on a float tensor"),
        (cifar(T.Compose([T.ToTensor(), T.RandomErasing(), T.RandomHorizontalFlip()])),
         "RandomHorizontalFlip after RandomErasing"),
        (cifar(T.Compose([T.ColorJitter(0.4), T.RandomCrop(32, padding=4), T.ToTensor()])),
         "RandomCrop after ColorJitter"),
        (cifar(T.Compose([T.RandomCrop(32, padding=4, fill=(1, 2, 3)), T.ToTensor()])), "fill (1, 2, 3)"),
        (cifar(T.Compose([T.ToTensor(), T.RandomCrop(32, padding=4, fill=9)])), "0 on a scaled tensor"),
        (cifar(v2.Compose([v2.ToImage(), v2.RandomCrop(32, padding=4, fill={tv.tv_tensors.Image: 0}),
                           v2.ToDtype(torch.float32, scale=True)])), "with fill {"),
        (cifar(T.Compose([T.ToTensor(), T.RandomResizedCrop(24)])), "RandomResizedCrop on a float tensor"),
        (cifar(T.Compose([T.RandomResizedCrop(24, interpolation=T.InterpolationMode.LANCZOS), T.ToTensor()])),
         "interpolation lanczos"),
        (cifar(T.Compose([T.ToTensor(), T.Resize(40)])), "Resize on a float tensor"),
        (cifar(T.Compose([T.ColorJitter(0.4), T.Resize(40), T.ToTensor()])), "Resize after ColorJitter"),
        (cifar(None), "no transform"),
        (cifar(T.RandomCrop(32, padding=4)), "gives PIL images"),
        (tv.datasets.MNIST(str(roots), transform=T.Compose([T.ToTensor(), T.Normalize(CIFAR_MEAN, CIFAR_STD)])),
         "3 means or stds for 1-channel images"),
        (tv.datasets.MNIST(str(roots), transform=T.Compose([T.ToTensor(), T.RandomErasing()])),
         "RandomErasing on 1-channel images"),
        (tv.datasets.MNIST(str(roots), transform=T.Compose([T.ColorJitter(0.4), T.ToTensor()])),
         "ColorJitter on 1-channel images"),
    ]
    for dataset, words in cases:
        served, reason, _, lowering = decide((dataset,), {"batch_size": 8})
        assert served and lowering is None and words in reason and "not served natively" in reason, reason
    # the script's own samples and errors
    mnist3 = next(dataset for dataset, words in cases if words.startswith("3 means"))
    with pytest.raises(RuntimeError) as plain:
        next(iter(torch.utils.data.DataLoader(mnist3, batch_size=8)))
    with pytest.raises(RuntimeError) as got:
        next(iter(_served(mnist3, batch_size=8)))
    assert str(got.value) == str(plain.value)
    affine = cases[0][0]
    torch.manual_seed(3)
    a = next(iter(torch.utils.data.DataLoader(affine, batch_size=8)))
    torch.manual_seed(3)
    b = next(iter(_served(affine, batch_size=8)))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])

    class OwnGetitem(tv.datasets.CIFAR10):
        def __getitem__(self, index):
            return super().__getitem__(index)

    from fastdata.run._arrays import lower_arrays

    assert lower_arrays(cifar(T.ToTensor(), cls=OwnGetitem)) == (None, "OwnGetitem overrides __getitem__")


@pytest.mark.parametrize("workers", [0, 2])
def test_data_changed_by_the_script_is_followed_and_what_fastdata_does_not_read_is_the_scripts_fetch(
        cifar, tv, workers):
    """A script that filters CIFAR's data and targets (an imbalanced or few-class split) gets
    those; data of another dtype, or an index past the data, is the script's own fetch, its
    error torchvision's."""
    dataset = cifar(_deterministic(tv)["v1 reflect pad, vertical flip p=1, uint8"])
    keep = [i for i in range(N) if i % 10 < 3]
    dataset.data, dataset.targets = dataset.data[keep], [dataset.targets[i] for i in keep]
    plain, got, loader = _both(dataset, batch_size=32, num_workers=workers)
    assert len(got) == -(-len(keep) // 32) and loader._fastdata_lowering.in_memory
    _same(plain, got)
    loader._stop()
    dataset.data = dataset.data.astype(np.float64)
    with pytest.raises(TypeError) as expected:
        next(iter(torch.utils.data.DataLoader(dataset, batch_size=8)))
    loader = _served(dataset, batch_size=8, num_workers=workers)
    with pytest.raises(TypeError) as raised:
        next(iter(loader))
    assert str(expected.value) in str(raised.value)
    loader._stop()
    past = torch.utils.data.Subset(cifar(_deterministic(tv)["v1 ConvertImageDtype to float64"]), [0, 1, N + 5])
    loader = _served(past, batch_size=3, num_workers=workers)
    with pytest.raises(IndexError, match="out of bounds"):
        next(iter(loader))
    loader._stop()


def test_random_erasing_on_cifar_is_served_natively(cifar, tv):
    """The CIFAR recipe with RandomErasing after Normalize (value 0): served natively, about
    half the images hold an erased rectangle of exact zeros, the others none."""
    import torchvision.transforms as T

    torch.manual_seed(1)
    dataset = cifar(T.Compose([T.RandomCrop(32, padding=4), T.ToTensor(), T.Normalize(CIFAR_MEAN, CIFAR_STD),
                               T.RandomErasing(p=0.5, value=0)]))
    loader = _served(dataset, batch_size=50, shuffle=True)
    assert loader._fastdata_lowering.in_memory and loader._fastdata_lowering.erasing
    erased = 0
    for _ in range(4):
        with natively_only():
            batches = list(loader)
        for images, _ in batches:
            zeros = (images == 0).all(dim=1)  # [n, h, w]: erased pixels
            erased += int(zeros.flatten(1).any(dim=1).sum())
    _within("erased images", erased, 4 * N, 0.5)
    loader._stop()


MNIST_SCRIPT = """
import sys, torch, torch.nn.functional as F
from torchvision import datasets, transforms
transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])
train = datasets.MNIST(sys.argv[1], train=True, download=False, transform=transform)
loader = torch.utils.data.DataLoader(train, batch_size=64, shuffle=True)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
seen, wrong = 0, 0
for x, y in loader:
    corner = ((x[:, 0, 0, 0] * 0.3081 + 0.1307) * 255).round().long()  # the index, + 1
    wrong += int(((corner - 1) % 10 != y).sum())
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
    seen += len(x)
print("seen", seen, "wrong", wrong, "shape", tuple(x.shape[1:]), x.dtype)
"""


@pytest.mark.timeout(300)
def test_an_unchanged_mnist_script_under_fastdata_run(tv, roots, tmp_path):
    """pytorch/examples' MNIST recipe, unchanged: served natively (the summary says so), every
    label its image's, the batches' layout the plain script's."""
    script = tmp_path / "mnist.py"
    script.write_text(MNIST_SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    # cwd: from a checkout's root, `python -m` would import the checkout's fastdata, not the installed one.
    plain = subprocess.run([sys.executable, str(script), str(roots)], capture_output=True, text=True, env=env,
                           cwd=tmp_path, timeout=240)
    got = subprocess.run([sys.executable, "-m", "fastdata", "run", "--", sys.executable, str(script), str(roots)],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=240)
    assert plain.returncode == 0 and got.returncode == 0, (plain.stderr[-2000:], got.stderr[-2000:])
    assert got.stdout == plain.stdout and f"seen {N} wrong 0" in got.stdout, (got.stdout, plain.stdout)
    assert "served natively: MNIST with ToTensor, Normalize run on its arrays by fastdata" in got.stderr, got.stderr


def _served_and_seen(monkeypatch, dataset):
    """One epoch of `dataset` served natively (batch 50, shuffled from seed 0): (its images a
    batch, the rows each batch's geometry cut, the pixel ops' parameters drawn for each)."""
    from fastdata.run import _arrays

    cut, drawn = [], []

    def gather(*args):
        out = _arrays.gather.__wrapped__(*args)
        cut.append(np.array(out))
        return out

    def plan_pixels(*args):
        plans = _arrays.plan_pixels.__wrapped__(*args)
        drawn.append(plans)
        return plans

    gather.__wrapped__, plan_pixels.__wrapped__ = _arrays.gather, _arrays.plan_pixels
    monkeypatch.setattr(_arrays, "gather", gather)
    monkeypatch.setattr(_arrays, "plan_pixels", plan_pixels)
    torch.manual_seed(0)
    loader = _served(dataset, batch_size=50, shuffle=True)
    with natively_only():
        batches = [images for images, _ in loader]
    assert len(batches) == len(cut) == len(drawn) == N // 50
    return batches, cut, drawn


def test_auto_augment_on_cifar_is_torchvisions_ops_for_what_was_drawn(cifar, tv, monkeypatch):
    """The CIFAR recipe with AutoAugment's CIFAR10 policy: served natively; each image is
    torchvision's own ops (`_apply_op`) for the sub-policy ops, magnitudes and signs fastdata
    drew, run on the crop it cut; a sample drawn twice into one batch gets draws of its own."""
    import torchvision.transforms as T
    from PIL import Image
    from torchvision.transforms.autoaugment import _apply_op

    op = T.AutoAugment(T.AutoAugmentPolicy.CIFAR10)
    dataset = cifar(T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), op, T.PILToTensor()]))
    batches, cut, drawn = _served_and_seen(monkeypatch, dataset)
    names = set()
    for images, rows, (plan,) in zip(batches, cut, drawn):
        for k in range(len(images)):
            img = Image.fromarray(rows[k])
            for q in plan[k]["ops"]:
                names.add(q["op"])
                img = _apply_op(img, q["op"], q["magnitude"], op.interpolation, None)
            assert torch.equal(images[k], torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1)), plan[k]
    assert len(names) >= 8, names
    twice = torch.utils.data.Subset(cifar(T.Compose([op, T.PILToTensor()])), [7] * 50)
    (same,) = [images for images, _ in _served(twice, batch_size=50)]
    assert len({bytes(x.numpy()) for x in same}) > 10  # (torchvision's draws: each its own; 1 if keyed by index)


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_augmix_on_cifar_is_torchvisions_own_for_the_seeds_drawn(cifar, tv, monkeypatch, version):
    """AugMix's CIFAR recipe (the paper's setting): served natively; each image is torchvision's
    own AugMix of the crop it cut, from torch's RNG seeded with the sample's seed fastdata drew."""
    import torchvision.transforms as T
    import torchvision.transforms.v2 as v2
    from PIL import Image

    op = (T if version == "v1" else v2).AugMix()
    dataset = cifar(T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), op, T.PILToTensor()]))
    batches, cut, drawn = _served_and_seen(monkeypatch, dataset)
    for images, rows, (plan,) in zip(batches, cut, drawn):
        for k in range(len(images)):
            torch.manual_seed(plan[k]["seed"])
            want = torch.from_numpy(np.asarray(op(Image.fromarray(rows[k]))).copy()).permute(2, 0, 1)
            assert torch.equal(images[k], want), k
    assert len({p["seed"] for (plan,) in drawn for p in plan}) == N


def _windows(img: torch.Tensor, h: int, w: int) -> set[bytes]:
    """Every h x w window of a CHW image, as bytes."""
    return {bytes(img[:, i:i + h, j:j + w].contiguous().numpy()) for i in range(img.shape[1] - h + 1)
            for j in range(img.shape[2] - w + 1)}


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect", "symmetric"])
@pytest.mark.parametrize("version", ["v1", "v2", "v2 tensor"])
def test_random_crop_padding_and_pad_if_needed_are_torchvisions(cifar, tv, version, mode):
    """RandomCrop(36, padding=(1, 2), pad_if_needed=True): v1 pads the padding, then the shortfall
    (two pads); v2 pads both at once (one pad, where reflect and symmetric differ from two). Each
    served image is a window of the image torchvision's own pad makes, and not always the same."""
    import torchvision.transforms as T
    import torchvision.transforms.functional as F
    import torchvision.transforms.v2 as v2
    import torchvision.transforms.v2.functional as F2

    crop = (T.RandomCrop if version == "v1" else v2.RandomCrop)(36, padding=(1, 2), pad_if_needed=True, fill=9,
                                                               padding_mode=mode)
    pre = [v2.ToImage()] if version == "v2 tensor" else []
    dataset = cifar(v2.Compose([*pre, crop, v2.PILToTensor() if not pre else v2.ToPureTensor()]))
    raw = cifar(T.PILToTensor())
    torch.manual_seed(0)
    loader = _served(dataset, batch_size=25)
    assert loader._fastdata_lowering.in_memory
    with natively_only():
        images = torch.cat([x for x, _ in loader])
    fill = 9 if mode == "constant" else 0
    offsets = set()
    for k in range(0, N, 7):
        img = raw[k][0]
        if version == "v1":  # (36 rows, 34 columns after the padding: the shortfall, 2 columns a side, apart)
            padded = F.pad(F.pad(img, [1, 2], fill, mode), [2, 0], fill, mode)
        else:  # (the same sides, 3 columns and 2 rows, in one pad)
            padded = F2.pad(img, [3, 2, 3, 2], fill, mode)
        windows = _windows(padded, 36, 36)
        assert bytes(images[k].numpy()) in windows, (version, mode, k)
        offsets.add(bytes(images[k].numpy()))
    assert len(offsets) > 10


def test_a_crop_that_cannot_move_draws_nothing_from_torchs_rng(cifar, tv):
    """torchvision's RandomCrop of an image's own size (no padding, or padding=0) draws nothing:
    served, the script's torch RNG after the epoch is the plain script's; a crop that moves draws."""
    import torchvision.transforms as T

    def run(make, transform):
        torch.manual_seed(0)
        loader = make(cifar(transform), batch_size=50, shuffle=True)
        batches = [b for _ in range(2) for b in loader]
        return batches, torch.rand(3)

    still = _deterministic(tv)["a crop that cannot move"]
    (served, after), (plain, plain_after) = run(_served, still), run(torch.utils.data.DataLoader, still)
    _same(plain, served)
    assert torch.equal(after, plain_after)
    moving = T.Compose([T.RandomCrop(30), T.PILToTensor()])
    assert not torch.equal(run(_served, moving)[1], plain_after)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_tensor_pad_torch_refuses_raises_torchs_error(cifar, tv, workers):
    """A reflect pad of a tensor as wide as the image (torch refuses it; a PIL image's would be
    numpy's, which takes it): the script's own fetch, its error torch's."""
    import torchvision.transforms.v2 as v2

    dataset = cifar(v2.Compose([v2.ToImage(), v2.Pad(32, padding_mode="reflect"), v2.ToPureTensor()]))
    with pytest.raises(RuntimeError) as plain:
        next(iter(torch.utils.data.DataLoader(dataset, batch_size=8)))
    loader = _served(dataset, batch_size=8, num_workers=workers)
    assert loader._fastdata_lowering.in_memory
    with pytest.raises(RuntimeError) as got:
        next(iter(loader))
    assert str(plain.value).splitlines()[-1] in str(got.value), (plain.value, got.value)
    loader._stop()


HALF_READ = """
import sys, torch, torchvision, torchvision.transforms as transforms
torchvision.datasets.cifar.check_integrity = lambda *a, **k: True  # (the tests' own files)
transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))])
trainset = torchvision.datasets.CIFAR10(root=sys.argv[1], train=True, download=False, transform=transform)
trainloader = torch.utils.data.DataLoader(trainset, batch_size=4, shuffle=True, num_workers=2)
dataiter = iter(trainloader)  # the CIFAR tutorial's "show some images": its iterator kept half read
images, labels = next(dataiter)
print(images.shape, labels)
"""


@pytest.mark.timeout(300)
def test_a_natively_served_pass_left_half_read_at_exit_ends_quietly(tv, roots, tmp_path):
    """The tutorial's pattern under `fastdata run`: the script exits 0 with nothing on stderr but
    the run's summary (the pass, its workers and its slots, ended while the interpreter is whole)."""
    script = tmp_path / "half_read.py"
    script.write_text(HALF_READ)
    done = subprocess.run([sys.executable, "-m", "fastdata", "run", "--", sys.executable, str(script),
                           str(roots)], capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"),
                          cwd=tmp_path, timeout=240)
    assert done.returncode == 0 and done.stdout.startswith("torch.Size([4, 3, 32, 32])"), done.stderr[-3000:]
    assert done.stderr.startswith("fastdata run: 1 DataLoader(s)"), done.stderr[-3000:]
    assert "served natively: CIFAR10" in done.stderr


def _pil_op_served(monkeypatch, tv, roots, cifar, op, mnist: bool, tensor: bool = False) -> tuple:
    """MNIST's (or CIFAR's) set with `op` (a RandomRotation or RandomAffine, or a Compose of pixel
    ops) then PILToTensor (`tensor`: PILToTensor first), one epoch served natively in batches of 50
    from seed 0: (the set, its images, per sample the lowered op and the parameters it drew, per op
    in turn in each batch)."""
    import torchvision.transforms as T

    from fastdata.run._pixels import Blur, Chance, Choice, Order, RandomCall
    from fastdata.run._rotation import Affine, Perspective, Rotation

    drawn = []
    for cls in (Rotation, Affine, Perspective, Blur, Chance, Choice, Order, RandomCall):
        def recorded(self, *args, plan=cls.plan):
            out = plan(self, *args)
            drawn.extend((self, p) for p in out)
            return out

        monkeypatch.setattr(cls, "plan", recorded)
    transform = T.Compose([T.PILToTensor(), op] if tensor else [op, T.PILToTensor()])
    dataset = tv.datasets.MNIST(str(roots), transform=transform) if mnist else cifar(transform)
    torch.manual_seed(0)
    loader = _served(dataset, batch_size=50)
    assert loader._fastdata_lowering.in_memory
    with natively_only():
        images = torch.cat([x for x, _ in loader])
    loader._stop()
    assert len(drawn) % N == 0 and drawn and len({bytes(x.numpy()) for x in images}) > N // 2
    return dataset, images, drawn


def _uniform_angles(drawn: list, lo: float, hi: float) -> None:
    """The angles drawn lie in [lo, hi], a quarter of them in each quarter of it (binomial bounds)."""
    got = np.array([p["angle"] for _, p in drawn])
    assert lo <= got.min() and got.max() <= hi
    for q in range(4):
        inside = int(((got >= lo + q * (hi - lo) / 4) & (got < lo + (q + 1) * (hi - lo) / 4)).sum())
        _within(f"quarter {q}", inside, N, 0.25)


@pytest.mark.parametrize("version", ["v1 nearest", "v2 bilinear, fill and center", "MNIST v1 bicubic"])
def test_random_rotation_is_torchvisions_rotate_for_the_angles_drawn(cifar, tv, roots, monkeypatch, version):
    """RandomRotation (weiaicunzai/pytorch-cifar100's recipe has RandomRotation(15)): each served
    image is torchvision's own `F.rotate` of the image for the angle drawn; the angles uniform
    over the degrees (a quarter of them in each quarter of the range, binomial bounds)."""
    import torchvision.transforms as T
    import torchvision.transforms.functional as F
    import torchvision.transforms.v2 as v2
    from PIL import Image

    if version == "v1 nearest":
        op, call = T.RandomRotation(15), dict(interpolation=T.InterpolationMode.NEAREST, fill=0)
    elif version.startswith("v2"):
        op = v2.RandomRotation(10, interpolation="bilinear", center=[10, 20], fill=3)
        call = dict(interpolation=T.InterpolationMode.BILINEAR, center=[10, 20], fill=3)
    else:
        op, call = T.RandomRotation((-30, 5), T.InterpolationMode.BICUBIC), dict(
            interpolation=T.InterpolationMode.BICUBIC, fill=0)
    mnist = version.startswith("MNIST")
    dataset, images, drawn = _pil_op_served(monkeypatch, tv, roots, cifar, op, mnist)
    for k in range(0, N, 5):
        img = Image.fromarray(dataset.data[k].numpy() if mnist else dataset.data[k])
        angle = drawn[k][1]["angle"]
        want = F.pil_to_tensor(F.rotate(img, angle, **call))
        assert torch.equal(images[k], want), (version, k, angle)
    _uniform_angles(drawn, *((-30, 5) if mnist else ((-10, 10) if version.startswith("v2") else (-15, 15))))


@pytest.mark.parametrize("version", ["MNIST v1 nearest", "v2 bilinear, shears, fill and center"])
def test_random_affine_is_torchvisions_affine_for_the_parameters_drawn(cifar, tv, roots, monkeypatch, version):
    """RandomAffine (MNIST scripts' RandomAffine(10, translate=(0.1, 0.1), scale=(0.9, 1.1))): each
    served image is torchvision's own `F.affine` of the image for the parameters drawn, the
    translation in whole pixels within the op's share of the image (test_random_affine_draws in
    test_torchvision_faithful.py holds the draws to get_params' distributions)."""
    import torchvision.transforms as T
    import torchvision.transforms.functional as F
    import torchvision.transforms.v2 as v2
    from PIL import Image

    mnist = version.startswith("MNIST")
    if mnist:
        op = T.RandomAffine(10, translate=(0.1, 0.1), scale=(0.9, 1.1))
        call = dict(interpolation=T.InterpolationMode.NEAREST, fill=0)
    else:
        op = v2.RandomAffine((-20, 5), translate=(0.2, 0.1), shear=(-8, 8, -4, 4), interpolation="bilinear",
                             center=[10, 20], fill=3)
        call = dict(interpolation=T.InterpolationMode.BILINEAR, center=[10, 20], fill=3)
    dataset, images, drawn = _pil_op_served(monkeypatch, tv, roots, cifar, op, mnist)
    side = 28 if mnist else 32
    for k in range(0, N, 5):
        img = Image.fromarray(dataset.data[k].numpy() if mnist else dataset.data[k])
        lowered, p = drawn[k]
        move = lowered.move(p, img.size)
        assert abs(move[0]) <= round(op.translate[0] * side) and abs(move[1]) <= round(op.translate[1] * side), move
        want = F.pil_to_tensor(F.affine(img, p["angle"], move, p["scale"], list(p["shear"]), **call))
        assert torch.equal(images[k], want), (version, k, p)
    _uniform_angles(drawn, *((-10, 10) if mnist else (-20, 5)))


def test_lowered_random_affine_maps_rows_and_images_as_f_affine(tv):
    """The lowered RandomAffine's map of an HWC row (1 or 3 channels: what the in-memory sets'
    gather hands it) and of a PIL image: `F.affine`'s pixels, each filter, in the form given."""
    import torchvision.transforms as T
    import torchvision.transforms.functional as F
    from PIL import Image

    from fastdata.run._rotation import affine
    from fastdata.transforms.geometry import _native_affine as native_maps

    rng = np.random.default_rng(0)
    for mode in (T.InterpolationMode.NEAREST, T.InterpolationMode.BILINEAR, T.InterpolationMode.BICUBIC):
        op = T.RandomAffine(25, translate=(0.2, 0.1), scale=(0.7, 1.3), shear=(-10, 10, -5, 5), interpolation=mode,
                            fill=7)
        lowered = affine(op, tensor=False)
        for p, channels in zip(lowered.plan(rng.random((6, 6))), (1, 3) * 3):
            row = rng.integers(0, 256, (30, 26, channels), dtype=np.uint8)
            img = Image.fromarray(row[:, :, 0] if channels == 1 else row)
            want = np.asarray(F.affine(img, p["angle"], lowered.move(p, img.size), p["scale"], list(p["shear"]),
                                       interpolation=mode, fill=7)).reshape(row.shape)
            assert not np.array_equal(want, row)
            got = lowered.on_pillow(row, p)
            assert np.array_equal(np.asarray(got).reshape(row.shape), want), (mode, p)
            assert isinstance(got, np.ndarray) or not native_maps()
            assert np.array_equal(np.asarray(lowered.on_pillow(img, p)).reshape(row.shape), want), (mode, p)


@pytest.mark.parametrize("version", ["MNIST v1 bilinear", "v2 nearest with a fill"])
def test_random_perspective_is_torchvisions_perspective_for_the_corners_drawn(cifar, tv, roots, monkeypatch,
                                                                              version):
    """RandomPerspective: each served image is torchvision's own `F.perspective` of the image for
    the corners drawn (whole pixels within the op's share of each half side), applied at its rate
    (test_random_perspective_draws in test_torchvision_faithful.py holds the corners to
    get_params' distributions)."""
    import torchvision.transforms as T
    import torchvision.transforms.functional as F
    import torchvision.transforms.v2 as v2
    import torchvision.transforms.v2.functional as F2
    from PIL import Image

    mnist = version.startswith("MNIST")
    if mnist:
        op, call = T.RandomPerspective(0.4, p=0.6), dict(interpolation=T.InterpolationMode.BILINEAR, fill=0)
    else:
        op = v2.RandomPerspective(0.7, p=0.5, interpolation="nearest", fill=9)
        call = dict(interpolation=T.InterpolationMode.NEAREST, fill=9)
    dataset, images, drawn = _pil_op_served(monkeypatch, tv, roots, cifar, op, mnist)
    assert len(drawn) == N
    for k in range(0, N, 5):
        img = Image.fromarray(dataset.data[k].numpy() if mnist else dataset.data[k])
        lowered, p = drawn[k]
        if p["apply"]:
            start, end = lowered.points(p, img.size)
            img = (F if mnist else F2).perspective(img, start, end, **call)
        assert torch.equal(images[k], F.pil_to_tensor(img)), (version, k, p)
    _within("RandomPerspective", sum(p["apply"] for _, p in drawn), N, 0.6 if mnist else 0.5)


@pytest.mark.parametrize("version", ["v1", "v2 on the uint8 tensor"])
def test_random_choice_and_order_are_torchvisions_for_the_draws(cifar, tv, roots, monkeypatch, version):
    """RandomChoice and RandomOrder of pixel ops on CIFAR: each served image is torchvision's
    functional ops of the image, the one op drawn (at its weight's rate), then the two of the
    RandomOrder in the order drawn (each order half the time)."""
    import torchvision.transforms as T
    import torchvision.transforms.functional as F
    import torchvision.transforms.v2 as v2
    import torchvision.transforms.v2.functional as F2
    from PIL import Image

    from fastdata.run._pixels import Choice, Order

    M, Fv = (T, F) if version == "v1" else (v2, F2)
    tensor = version.endswith("tensor")
    # (the images' green and blue ramps make the two orders differ; red, the index, keeps them apart)
    op = M.Compose([M.RandomChoice([M.RandomInvert(1.0), M.RandomSolarize(100, 1.0), M.RandomAdjustSharpness(2, 1.0)],
                                   p=[1, 1, 2]),
                    M.RandomOrder([M.RandomSolarize(200, 1.0), M.RandomAutocontrast(1.0)])])
    dataset, images, drawn = _pil_op_served(monkeypatch, tv, roots, cifar, op, False, tensor)
    picks = [p["order"] for op, p in drawn if isinstance(op, Choice)]
    orders = [p["order"] for op, p in drawn if isinstance(op, Order)]
    assert len(picks) == len(orders) == N
    chosen = (Fv.invert, lambda x: Fv.solarize(x, 100), lambda x: Fv.adjust_sharpness(x, 2))
    ordered = (lambda x: Fv.solarize(x, 200), Fv.autocontrast)
    for k in range(0, N, 3):
        img = Image.fromarray(dataset.data[k])
        img = F.pil_to_tensor(img) if tensor else img
        (j,) = picks[k]
        img = chosen[j](img)
        for j in orders[k]:
            img = ordered[j](img)
        assert torch.equal(images[k], img if tensor else F.pil_to_tensor(img)), (version, k)
    for j, rate in enumerate((0.25, 0.25, 0.5)):
        _within(f"RandomChoice's op {j}", sum(p == [j] for p in picks), N, rate)
    assert sum(p == [0, 1] for p in orders) < N
    _within("RandomOrder's solarization first", sum(p == [0, 1] for p in orders), N, 0.5)


@pytest.mark.parametrize("version", ["v1", "v2", "v2 on the uint8 tensor"])
def test_self_supervised_ops_are_torchvisions_for_the_parameters_drawn(cifar, tv, roots, monkeypatch, version):
    """SimCLR's and BYOL's pixel ops on CIFAR (RandomApply of a ColorJitter, RandomGrayscale,
    GaussianBlur, RandomSolarize), on the PIL image or after PILToTensor: each served image is
    torchvision's own functional ops of the image for the parameters drawn (its tensor kernels
    on the tensor), the ColorJitter's factors in their order where its RandomApply applied, and
    each op applied at its rate (binomial bounds)."""
    import torchvision.transforms as T
    import torchvision.transforms.functional as F
    import torchvision.transforms.v2 as v2
    import torchvision.transforms.v2.functional as F2
    from PIL import Image

    M, Fv = (T, F) if version == "v1" else (v2, F2)
    tensor = version.endswith("tensor")
    op = M.Compose([M.RandomApply([M.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8), M.RandomGrayscale(0.2),
                    M.GaussianBlur(3, (0.1, 2.0)), M.RandomSolarize(128, 0.3)])
    dataset, images, drawn = _pil_op_served(monkeypatch, tv, roots, cifar, op, False, tensor)
    assert len(drawn) == 4 * N
    # each batch of 50 draws RandomApply's, RandomGrayscale's, GaussianBlur's, then RandomSolarize's
    by_op = [[p for k in range(0, 4 * N, 200) for _, p in drawn[k + 50 * j:k + 50 * (j + 1)]] for j in range(4)]
    chance, gray, blur, solarize = by_op
    adjust = (Fv.adjust_brightness, Fv.adjust_contrast, Fv.adjust_saturation, Fv.adjust_hue)
    for k in range(0, N, 3):
        img = Image.fromarray(dataset.data[k])
        img = F.pil_to_tensor(img) if tensor else img
        if chance[k]["apply"]:
            jitter = chance[k]["inner"][0]
            for j in jitter["order"]:
                name = ("brightness", "contrast", "saturation", "hue")[j]
                img = adjust[j](img, jitter[name])
        img = Fv.rgb_to_grayscale(img, 3) if gray[k]["apply"] else img
        img = Fv.gaussian_blur(img, [3, 3], [blur[k]["sigma"], blur[k]["sigma"]])
        img = Fv.solarize(img, 128) if solarize[k]["apply"] else img
        assert torch.equal(images[k], img if tensor else F.pil_to_tensor(img)), (version, k)
    _within("RandomApply", sum(p["apply"] for p in chance), N, 0.8)
    _within("RandomGrayscale", sum(p["apply"] for p in gray), N, 0.2)
    _within("RandomSolarize", sum(p["apply"] for p in solarize), N, 0.3)
    sigmas = np.array([p["sigma"] for p in blur])
    assert 0.1 <= sigmas.min() and sigmas.max() <= 2.0
    _within("sigma below the middle", int((sigmas < 1.05).sum()), N, 0.5)
