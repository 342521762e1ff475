"""`fastdata run` serving torchvision image folders natively (`fastdata.run._torchvision`).

The lookup table's layout needs no torchvision and runs everywhere. The rest builds datasets and
transforms with torchvision itself, so it runs where torchvision is installed: .ci/run makes a
virtualenv as a user's (the registry's torch and torchvision) and runs this file there. The
distributions and pixels against torchvision's own ops: tests/contract/test_torchvision_faithful.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate

from fastdata.run import _layout
from fastdata.run import _torchvision as rt
from fastdata._ext import native
from _images import blue_folder
from _passes import steps

SCRIPTS = Path(__file__).resolve().parents[1] / "run_scripts"
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
STEPS = {
    "ToTensor + Normalize": (("to", None, "div"), ("normalize", tuple(MEAN), tuple(STD))),
    "ToDtype(scale) + Normalize": (("to", torch.float32, "mul"), ("normalize", tuple(MEAN), tuple(STD))),
    "ToDtype(float64, scale)": (("to", torch.float64, "mul"),),
    "ToDtype(bfloat16, no scale)": (("to", torch.bfloat16, None),),
    "PILToTensor": (),
}


# ----------------------------------------------------------------- the layout, without torchvision

@pytest.mark.parametrize("name", list(STEPS))
def test_lookup_table_layout_is_the_torch_steps_bit_for_bit(name):
    """The native lookup (one pass, table built from the steps) against the steps run by torch
    on every sample, for every uint8 value in every channel."""
    steps = STEPS[name]
    lowering = rt.Lowering((), (), "bilinear", steps, name)
    rng = np.random.default_rng(0)
    images = torch.from_numpy(rng.integers(0, 256, (5, 7, 256, 3), dtype=np.uint8))
    images[0, 0, :, :] = torch.arange(256, dtype=torch.uint8)[:, None]  # every value in every channel
    expected = torch.empty((5, 3, 7, 256), dtype=lowering.dtype)
    for k in range(5):
        _layout.apply_steps(expected[k], images[k], steps)
    labels = torch.arange(5)
    finish = _layout.Finish(lowering, slots=2, pin=False, forks=False)
    got = finish([images, labels, _layout.Layout(steps)])
    assert got[1] is labels
    assert got[0].dtype == lowering.dtype and got[0].shape == (5, 3, 7, 256) and got[0].is_contiguous()
    assert torch.equal(got[0], expected)
    if name == "ToTensor + Normalize":  # torchvision's arithmetic, written out
        ref = (images.permute(0, 3, 1, 2).float().div(255) - torch.tensor(MEAN).view(1, 3, 1, 1)) \
            / torch.tensor(STD).view(1, 3, 1, 1)
        assert torch.equal(got[0], ref)
    plain = [images.permute(0, 3, 1, 2), labels]  # the dataset's own samples, collated (a transform not lowered)
    assert finish(plain) is plain


def test_lookup_planes_refuses_what_it_cannot_lay_out():
    if native is None:
        pytest.skip("no native extension")
    src = torch.zeros((2, 4, 4, 3), dtype=torch.uint8)
    with pytest.raises(ValueError, match="lookup_planes takes"):
        native.lookup_planes(src, torch.zeros(3, 255), torch.zeros(2, 3, 4, 4), 1)
    with pytest.raises(ValueError, match="lookup_planes takes"):
        native.lookup_planes(src, torch.zeros(3, 256), torch.zeros(2, 3, 4, 4, dtype=torch.float64), 1)
    with pytest.raises(ValueError, match="contiguous"):
        native.lookup_planes(src, torch.zeros(3, 256), torch.zeros(2, 4, 4, 3).permute(0, 3, 1, 2), 1)


@pytest.mark.skipif(native is None, reason="no native extension")
def test_mix_rolled_is_torchvisions_mixup_bit_for_bit():
    """MixUp's blend in place against torchvision's `x.roll(1, 0).mul_(1.0 - lam).add_(x.mul(lam))`:
    batches of 1 to 5, values of every scale, lambdas from Beta(0.2, 0.2) and uniform; and the
    layout's fallback (torch's operations) the same."""
    g = torch.Generator().manual_seed(0)
    for trial in range(60):
        n = 1 + trial % 5
        x = torch.randn((n, 3, 9, 11), generator=g) * 10 ** (trial % 7 - 3)
        lam = float(torch.rand((), generator=g)) if trial % 2 else float(torch.distributions.Beta(0.2, 0.2).sample())
        want = x.roll(1, 0).mul_(1.0 - lam).add_(x.mul(lam))
        got = x.clone()
        native.mix_rolled(got, lam, 2)
        assert torch.equal(got, want), (n, lam)
        fallback = x.double().clone()  # (not float32: torch's operations)
        _layout.mix(fallback, ("mixup", lam))
        assert torch.equal(fallback, x.double().roll(1, 0).mul_(1.0 - lam).add_(x.double().mul(lam)))
    big = torch.randn((3, 3, 300, 300), generator=g)  # (spans over several threads)
    got = big.clone()
    native.mix_rolled(got, 0.3, 2)
    assert torch.equal(got, big.roll(1, 0).mul_(0.7).add_(big.mul(0.3)))
    for other in (torch.zeros((2, 3), dtype=torch.float64), torch.zeros((3, 2)).t()):  # (never a converted copy)
        with pytest.raises(TypeError):
            native.mix_rolled(other, 0.5, 1)


def test_not_a_torchvision_dataset_is_left_alone():
    assert rt.lower([1, 2, 3]) == (None, "")


# ----------------------------------------------------------------- with torchvision

@pytest.fixture(scope="module")
def tv():
    return pytest.importorskip("torchvision")


@pytest.fixture(scope="module")
def folder(tmp_path_factory, tv):
    return blue_folder(tmp_path_factory.mktemp("folder"))


def _class_of(images: torch.Tensor, normalized: bool) -> torch.Tensor:
    blue = images[:, 2].float()
    if normalized:
        blue = blue * STD[2] + MEAN[2]
    blue = blue * 255 if images.is_floating_point() else blue
    return ((blue.mean(dim=(1, 2)) - 55) / 50).round().long()


def _served(dataset, **kwargs):
    from fastdata.run._hook import Served

    loader = Served(dataset, **kwargs)
    return loader


def _fallbacks(tv):
    """(what the script does, how to make its dataset and loader arguments, words of the reason)."""
    import torchvision.transforms as T
    import torchvision.transforms.v2 as v2
    from torchvision import tv_tensors
    from torchvision.datasets import ImageFolder

    train = [T.RandomResizedCrop(32), T.ToTensor()]

    class OwnGetitem(ImageFolder):
        def __getitem__(self, index):
            return super().__getitem__(index)

    def own_loader(path):
        from PIL import Image

        return Image.open(path).convert("RGB")

    return [
        ("a custom image loader", lambda r: (ImageFolder(r, T.Compose(train), loader=own_loader), {}),
         "has its own image loader"),
        ("a Lambda", lambda r: (ImageFolder(r, T.Compose([*train, T.Lambda(lambda x: x)])), {}),
         "Lambda has no faithful lowering"),
        ("an op with no lowering", lambda r: (ImageFolder(r, T.Compose([T.ElasticTransform(), *train])), {}),
         "ElasticTransform has no faithful lowering"),
        ("a perspective on a tensor", lambda r: (ImageFolder(r, T.Compose([*train, T.RandomPerspective()])), {}),
         "RandomPerspective on a tensor"),
        ("geometry in a RandomApply", lambda r: (ImageFolder(r, T.Compose([
            T.RandomApply([T.RandomResizedCrop(32)]), T.ToTensor()])), {}), "RandomResizedCrop in a RandomApply"),
        ("geometry in a RandomChoice", lambda r: (ImageFolder(r, T.Compose([
            T.RandomChoice([T.ColorJitter(0.2), T.RandomCrop(8)]), T.ToTensor()])), {}),
         "RandomCrop in a RandomChoice"),
        ("a RandomChoice of weights that are all zero", lambda r: (ImageFolder(r, T.Compose([
            *train[:1], T.RandomChoice([T.ColorJitter(0.2), T.RandomGrayscale()], p=[0, 0]), *train[1:]])), {}),
         "RandomChoice with weights [0, 0]"),
        ("an op with no lowering in a RandomOrder", lambda r: (ImageFolder(r, T.Compose([
            *train[:1], v2.RandomOrder([v2.ColorJitter(0.2), v2.ElasticTransform()]), *train[1:]])), {}),
         "ElasticTransform in a RandomOrder"),
        ("GaussianBlur on a float tensor", lambda r: (ImageFolder(r, T.Compose([*train, T.GaussianBlur(3)])), {}),
         "GaussianBlur on a float tensor"),
        ("a crop after a vertical flip", lambda r: (ImageFolder(r, T.Compose([T.RandomVerticalFlip(), *train])), {}),
         "RandomResizedCrop after RandomVerticalFlip"),
        ("a flip after RandomErasing", lambda r: (ImageFolder(r, T.Compose([
            *train, T.RandomErasing(), T.RandomHorizontalFlip()])), {}),
         "RandomHorizontalFlip after RandomErasing"),
        ("a pixel op after RandomErasing", lambda r: (ImageFolder(r, v2.Compose([
            v2.RandomResizedCrop(32), v2.ToImage(), v2.RandomErasing(), v2.ColorJitter(0.4),
            v2.ToDtype(torch.float32, scale=True)])), {}), "ColorJitter after RandomErasing"),
        ("a rotation before the crop", lambda r: (ImageFolder(r, T.Compose([T.RandomRotation(10), *train])), {}),
         "RandomResizedCrop after RandomRotation"),
        ("a rotation with expand", lambda r: (ImageFolder(r, T.Compose([T.RandomRotation(10, expand=True),
                                                                         *train[1:]])), {}), "with expand"),
        ("a subclass with its own __getitem__", lambda r: (OwnGetitem(r, T.Compose(train)), {}),
         "OwnGetitem overrides __getitem__"),
        ("no transform", lambda r: (ImageFolder(r), {}), "no transform"),
        ("a transform ending in PIL images", lambda r: (ImageFolder(r, T.RandomResizedCrop(32)), {}),
         "gives PIL images"),
        ("ColorJitter on a float tensor", lambda r: (ImageFolder(r, T.Compose([*train, T.ColorJitter(0.4)])), {}),
         "ColorJitter on a float tensor"),
        ("TrivialAugmentWide on a float tensor", lambda r: (ImageFolder(r, T.Compose([
            T.RandomResizedCrop(32), T.ToTensor(), T.TrivialAugmentWide()])), {}),
         "TrivialAugmentWide on a float tensor"),
        ("geometry after a pixel op", lambda r: (ImageFolder(r, T.Compose([T.ColorJitter(0.4), *train])), {}),
         "RandomResizedCrop after ColorJitter"),
        ("a resize after a crop that may pad", lambda r: (ImageFolder(r, T.Compose([
            T.CenterCrop(96), T.Resize(32), T.ToTensor()])), {}), "blends the padding's edge"),
        ("Resize with max_size", lambda r: (ImageFolder(r, T.Compose([T.Resize(32, max_size=40), T.ToTensor()])), {}),
         "max_size"),
        ("two interpolations", lambda r: (ImageFolder(r, T.Compose([
            T.Resize(40, interpolation=T.InterpolationMode.BICUBIC), T.RandomResizedCrop(32), T.ToTensor()])), {}),
         "different interpolations"),
        ("Normalize of a uint8 tensor", lambda r: (ImageFolder(r, T.Compose([
            T.RandomResizedCrop(32), T.PILToTensor(), T.Normalize(MEAN, STD)])), {}), "uint8 tensor"),
        ("a resize of a float tensor", lambda r: (ImageFolder(r, T.Compose([
            T.ToTensor(), T.RandomResizedCrop(32)])), {}), "on a float tensor"),
        ("an unantialiased tensor resize", lambda r: (ImageFolder(r, v2.Compose([
            v2.ToImage(), v2.RandomResizedCrop(32, antialias=False), v2.ToDtype(torch.float32, scale=True)])), {}),
         "antialias=False"),
        ("a dtype per type", lambda r: (ImageFolder(r, v2.Compose([
            v2.RandomResizedCrop(32), v2.ToImage(), v2.ToDtype({tv_tensors.Image: torch.float32, "others": None}, scale=True)])), {}),
         "a dtype per type"),
        ("two dtype conversions", lambda r: (ImageFolder(r, T.Compose([
            T.RandomResizedCrop(32), T.ToTensor(), T.ConvertImageDtype(torch.float64)])), {}),
         "a second dtype conversion"),
        ("a batch_size of None", lambda r: (ImageFolder(r, T.Compose(train)), {"batch_size": None}),
         "batch_size=None"),
        ("TrivialAugmentWide nearest-exact", lambda r: (ImageFolder(r, T.Compose([
            T.RandomResizedCrop(32), T.TrivialAugmentWide(interpolation=T.InterpolationMode.NEAREST_EXACT),
            T.ToTensor()])), {}), "interpolation nearest-exact"),
        ("RandAugment with a fill", lambda r: (ImageFolder(r, T.Compose([
            T.RandomResizedCrop(32), T.RandAugment(fill=[128, 128, 128]), T.ToTensor()])), {}), "a fill other than 0"),
        ("RandAugment past its bins", lambda r: (ImageFolder(r, T.Compose([
            T.RandomResizedCrop(32), v2.RandAugment(magnitude=31), T.ToTensor()])), {}), "magnitude should be a bin"),
        ("a v1 interpolation named by a string", lambda r: (ImageFolder(r, T.Compose([
            T.RandomResizedCrop(32), T.TrivialAugmentWide(interpolation="bilinear"), T.ToTensor()])), {}),
         "a string: torchvision's v1 ops raise"),
        ("RandomCrop with reflected padding of a tensor", lambda r: (ImageFolder(r, v2.Compose([
            v2.ToImage(), v2.Resize(40), v2.RandomCrop(32, padding=4, padding_mode="reflect"), v2.ToPureTensor()])),
            {}), "'reflect' and fill 0 on a tensor"),
        ("RandomCrop reflected after a Pad", lambda r: (ImageFolder(r, T.Compose([
            T.Resize(40), T.Pad(2), T.RandomCrop(32, padding=4, padding_mode="reflect"), T.ToTensor()])), {}),
         "RandomCrop's padding after Pad: fastdata pads an image once"),
        ("a CenterCrop that may pad after a reflection", lambda r: (ImageFolder(r, T.Compose([
            T.RandomCrop(32, padding=4, padding_mode="symmetric"), T.CenterCrop(48), T.ToTensor()])), {}),
         "CenterCrop on images of sizes not known to fit it after RandomCrop's padding (symmetric)"),
        ("pad_if_needed reflected", lambda r: (ImageFolder(r, T.Compose([
            T.RandomCrop(32, pad_if_needed=True, padding_mode="reflect"), T.ToTensor()])), {}),
         "pad_if_needed and padding_mode 'reflect'"),
        ("RandomCrop padded with a fraction", lambda r: (ImageFolder(r, T.Compose([
            v2.RandomCrop(32, pad_if_needed=True, fill=7.5), T.ToTensor()])), {}), "fill 7.5"),
        ("Pad with a fill of a float tensor", lambda r: (ImageFolder(r, T.Compose([
            T.Resize((32, 32)), T.ToTensor(), T.Pad(2, fill=1)])), {}), "fill 1 on a float tensor"),
        ("Pad with a fill per channel of a tensor", lambda r: (ImageFolder(r, T.Compose([
            T.Resize((32, 32)), T.PILToTensor(), T.Pad(2, fill=(9, 9, 9))])), {}), "fill (9, 9, 9) on a tensor"),
        ("a CenterCrop that may pad after a fill", lambda r: (ImageFolder(r, T.Compose([
            T.Pad(2, fill=9), T.CenterCrop(48), T.ToTensor()])), {}), "after Pad (fill (9, 9, 9))"),
        ("Pad with a fill per type", lambda r: (ImageFolder(r, v2.Compose([
            v2.Resize(32), v2.Pad(2, fill={tv_tensors.Image: 0}), v2.ToImage()])), {}), "fill {"),
        ("a resize after a Pad", lambda r: (ImageFolder(r, T.Compose([T.Pad(4), T.Resize(32), T.ToTensor()])), {}),
         "Resize after Pad: torchvision blends"),
        ("a Pad of a normalized tensor", lambda r: (ImageFolder(r, T.Compose([
            T.Resize((32, 32)), T.ToTensor(), T.Normalize(MEAN, STD), T.Pad(2)])), {}), "Pad after Normalize"),
        ("AugMix on a float tensor", lambda r: (ImageFolder(r, T.Compose([
            T.RandomResizedCrop(32), T.ToTensor(), T.AugMix()])), {}), "AugMix on a float tensor"),
        ("AugMix with a fill per type", lambda r: (ImageFolder(r, v2.Compose([
            v2.RandomResizedCrop(32), v2.AugMix(fill={tv_tensors.Image: 1}), v2.ToImage()])), {}), "a fill per type"),
        ("AugMix with an integer alpha", lambda r: (ImageFolder(r, T.Compose([
            T.RandomResizedCrop(32), T.AugMix(alpha=1), T.ToTensor()])), {}), "a float alpha"),
    ]


# Fall-back cases whose samples have one size (the others fail in the script's own collation)
BATCHABLE = ("a custom image loader", "a Lambda", "an op with no lowering", "a subclass with its own __getitem__",
             "ColorJitter on a tensor", "geometry after a pixel op", "two interpolations", "a resize of a float tensor",
             "an unantialiased tensor resize", "a dtype per type", "two dtype conversions",
             "TrivialAugmentWide nearest-exact", "RandAugment with a fill",
             "AugMix with a fill per type", "RandomCrop with reflected padding of a tensor",
             "RandomCrop padded with a fraction")


def test_every_fall_back_is_served_by_the_drop_in_and_names_its_reason(tv, folder):
    """Each case the native path does not take: the loader is still served (the drop-in, the
    script's own samples through torchvision) and the reason names what was not lowered."""
    from fastdata.run._decide import decide

    cases = _fallbacks(tv)
    assert len(cases) >= 15
    for what, make, words in cases:
        dataset, kwargs = make(str(folder))
        served, reason, _, lowering = decide((dataset,), {"batch_size": 4, **kwargs})
        assert served and lowering is None, what
        assert words in reason, f"{what}: {reason}"
        if words != "the script's collate_fn":
            assert "not served natively" in reason, f"{what}: {reason}"
        loader = _served(dataset, **{"batch_size": 4, **kwargs})
        assert not isinstance(loader._loader.dataset, rt.NativeFolder), what
        if what in BATCHABLE:  # torchvision's own samples, collated as DataLoader does
            batch = next(iter(loader))
            assert batch[0].shape == (4, 3, 32, 32), what
        loader._stop()


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", ["v1", "v2", "v2 tensor geometry", "eval uint8"])
def test_served_natively_batches_as_torchvision_gives_them(tv, folder, kind, workers):
    """Shape, dtype, layout and type of torchvision's own batches; labels the dataset's and the
    images theirs (each class's blue level read back from the pixels); every sample once an
    epoch under shuffle."""
    import torchvision.transforms as T
    import torchvision.transforms.v2 as v2
    from torchvision.datasets import ImageFolder

    transform = {
        "v1": T.Compose([T.RandomResizedCrop(48), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)]),
        "v2": v2.Compose([v2.RandomResizedCrop(48), v2.RandomHorizontalFlip(), v2.ToImage(),
                          v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]),
        "v2 tensor geometry": v2.Compose([v2.ToImage(), v2.RandomResizedCrop((48, 40)), v2.RandomHorizontalFlip(),
                                          v2.ToDtype(torch.float32, scale=True)]),
        "eval uint8": T.Compose([T.Resize(56), T.CenterCrop(48), T.PILToTensor()]),
    }[kind]
    dataset = ImageFolder(str(folder), transform, target_transform=lambda t: t + 100)
    loader = _served(dataset, batch_size=10, shuffle=True, num_workers=workers)
    assert isinstance(loader._loader.dataset, rt.NativeFolder)
    reference = torch.utils.data.default_collate([dataset[i] for i in range(10)])
    for epoch in range(2):
        seen = []
        for images, labels in loader:
            assert type(images) is type(reference[0]) is torch.Tensor
            assert images.dtype == reference[0].dtype and images.shape[1:] == reference[0].shape[1:]
            assert images.is_contiguous() and labels.dtype == reference[1].dtype == torch.int64
            assert torch.equal(_class_of(images, kind in ("v1", "v2")), labels - 100)
            seen += labels.tolist()
        assert sorted(seen) == sorted(t + 100 for t in dataset.targets)
    loader._stop()


class MocoBlur:
    """MoCo v2's moco/loader.py GaussianBlur, as it is written there (SimSiam's is the same): a
    radius drawn from Python's RNG, Pillow's blur. It records its draws."""

    def __init__(self, sigma=(0.1, 2.0)):
        self.sigma = sigma
        self.drawn: list[float] = []

    def __call__(self, x):
        import random

        from PIL import ImageFilter

        sigma = random.uniform(self.sigma[0], self.sigma[1])
        self.drawn.append(sigma)
        return x.filter(ImageFilter.GaussianBlur(radius=sigma))


def _moco_v2(T, blur):
    """MoCo v2's augmentation (main_moco.py --aug-plus) at 40 px: the script's blur in a
    RandomApply, and the flip after it."""
    return T.Compose([T.RandomResizedCrop(40, scale=(0.2, 1.0)), T.RandomApply([T.ColorJitter(0.4, 0.4, 0.4, 0.1)],
                      p=0.8), T.RandomGrayscale(p=0.2), T.RandomApply([blur], p=0.5), T.RandomHorizontalFlip(),
                      *([T.ToImage(), T.ToDtype(torch.float32, scale=True)] if hasattr(T, "ToImage") else
                        [T.ToTensor()]), T.Normalize(MEAN, STD)])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("v2", [False, True])
def test_gaussian_blur_with_denormals_flushed_is_torchvisions(tv, v2, monkeypatch):
    """fastdata's GaussianBlur (`_pixels.Blur`, denormals flushed to zero while torchvision's
    blur runs) against torchvision's own call with them kept: the same pixels for sigmas across
    SimCLR's range (both ends of each band where a tap of the kernel falls below float32's normal
    range), kernels of 23, 9 and 3 taps, on noise, a photo-like image, a dark one with sparse
    bright pixels and a black one, as PIL images and uint8 tensors; the flush on while it runs
    and off after, as it was."""
    import torchvision.transforms.functional as F1
    import torchvision.transforms.v2.functional as F2
    from PIL import Image

    from fastdata.run._pixels import Blur

    F = F2 if v2 else F1
    rng = np.random.default_rng(5)
    y, x = np.mgrid[0:40, 0:44]
    photo = np.stack([x * 5, y * 6, (x + y) * 3], -1).astype(np.uint8)
    sparse = np.zeros((40, 44, 3), np.uint8)
    sparse[rng.integers(0, 40, 30), rng.integers(0, 44, 30)] = rng.integers(1, 256, (30, 3))
    images = [rng.integers(0, 256, (40, 44, 3), dtype=np.uint8), photo, sparse, np.zeros((40, 44, 3), np.uint8)]
    # each tap r of a kernel falls below 2^-126 for sigma in about (r / 14.35, r / 13.2): both ends of each band
    edges = [r / d for r in range(1, 12) for d in (14.4, 14.3, 13.25, 13.15)]
    sigmas = sorted(set(np.float32(s).item() for s in [*edges, *np.linspace(0.1, 2.0, 20)] if 0.05 < s <= 2.0))
    compared = 0
    for kernel in (23, 9, 3):
        for pixels in images:
            for sigma in sigmas[::3] if kernel != 23 else sigmas:
                img = Image.fromarray(pixels) if compared % 2 else torch.from_numpy(pixels).permute(2, 0, 1)
                ours = Blur((kernel, kernel), (0.1, 2.0), v2, tensor=not compared % 2).on_pillow(img, {"sigma": sigma})
                want = F.gaussian_blur(img, [kernel, kernel], [sigma, sigma])
                assert np.array_equal(np.asarray(ours), np.asarray(want)), (kernel, sigma, compared)
                compared += 1
    assert compared == len(images) * (len(sigmas) + 2 * len(sigmas[::3])) > 400
    assert (torch.tensor([1e-39]) * 1.0).item() != 0.0  # (put back: denormals kept)

    seen = []
    monkeypatch.setattr(F, "gaussian_blur", lambda img, k, s: seen.append((torch.tensor([1e-39]) * 1.0).item()) or img)
    Blur((3, 3), (0.1, 2.0), v2).on_pillow(Image.fromarray(photo), {"sigma": 0.5})
    assert seen == [0.0] and (torch.tensor([1e-39]) * 1.0).item() != 0.0  # (flushed while it ran)


@pytest.mark.parametrize("v2", [False, True])
def test_an_op_of_the_scripts_is_called_on_each_image_served_natively(tv, folder, v2):
    """MoCo v2's augmentation, its GaussianBlur the script's own class: served natively, the blur
    called on each image it applies to in turn, drawing from Python's RNG as in the script's own
    fetch (the same draws after random.seed), the flip after it run on the image it made; the
    script's num_workers kept (the op may keep state), and the summary says so. (Its pixels
    against torchvision's: test_torchvision_faithful.py, configuration xxv.)"""
    import random

    import torchvision.transforms as T1
    import torchvision.transforms.v2 as T2
    from torchvision.datasets import ImageFolder

    from fastdata.run._decide import decide

    blur = MocoBlur()
    dataset = ImageFolder(str(folder), _moco_v2(T2 if v2 else T1, blur))
    served, reason, workers, lowering = decide((dataset,), {"batch_size": 8, "shuffle": True})
    assert served and lowering is not None and lowering.script_ops == ("MocoBlur",), reason
    assert "MocoBlur called as the script's own op" in reason and workers is None, reason
    assert "MocoBlur, an op of the script's, which may keep state" in reason, reason
    loader = _served(dataset, batch_size=8, shuffle=True)
    assert isinstance(loader._loader.dataset, rt.NativeFolder)
    random.seed(7)
    seen = []
    for images, labels in loader:
        assert images.shape[1:] == (3, 40, 40) and images.dtype == torch.float32
        seen += labels.tolist()
    loader._stop()
    assert sorted(seen) == sorted(dataset.targets)
    n = len(blur.drawn)
    assert 0.2 * len(seen) < n < 0.8 * len(seen)  # (p=0.5 of each image)
    random.seed(7)
    assert blur.drawn == [random.uniform(0.1, 2.0) for _ in range(n)]


@pytest.mark.parametrize("workers", [0, 2])
def test_an_op_of_the_scripts_that_changes_an_image_gives_the_datasets_own_samples(tv, folder, workers):
    """An op of the script's that gives another size (or mode, or type) than it got is no pixel
    op: the batch where it does so is the dataset's own samples, as torchvision's fetch gives
    them, and the op is not lowered again in that process (the reason says why)."""
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder

    def shrink(img):
        return img.resize((16, 16))

    dataset = ImageFolder(str(folder), T.Compose([T.RandomResizedCrop(32), shrink, T.PILToTensor()]))
    assert rt.lower(dataset)[0] is not None  # (before it ran)
    loader = _served(dataset, batch_size=4, num_workers=workers)
    assert isinstance(loader._loader.dataset, rt.NativeFolder)
    batches = list(loader)
    loader._stop()
    assert [tuple(images.shape) for images, _ in batches] == [(4, 3, 16, 16)] * (len(dataset) // 4)
    for images, labels in batches:
        assert torch.equal(_class_of(images, False), labels)
    if workers == 0:  # (workers learn it in their own process)
        lowering, why = rt.lower(dataset)
        assert lowering is None and "shrink, an op of the script's, changed an image's size or mode" in why, why


@pytest.mark.parametrize("weights", ["ResNet50_Weights.IMAGENET1K_V2", "EfficientNet_B0_Weights.IMAGENET1K_V1"])
def test_a_weights_transforms_is_served_natively(tv, folder, weights):
    """A weights' `transforms()` (torchvision's ImageClassification preset: the model docs'
    evaluation, bilinear 232/224 and bicubic 256/224 here) is served natively, its batches
    torchvision's bit for bit."""
    import torchvision.models as models
    from torchvision.datasets import ImageFolder

    name, member = weights.split(".")
    dataset = ImageFolder(str(folder), getattr(models, name)[member].transforms())
    loader = _served(dataset, batch_size=10, num_workers=0)
    assert isinstance(loader._loader.dataset, rt.NativeFolder)
    for (a, y), (b, z) in zip(loader, torch.utils.data.DataLoader(dataset, batch_size=10), strict=True):
        assert a.dtype == b.dtype == torch.float32 and torch.equal(a, b) and torch.equal(y, z)
    loader._stop()


def _stack_collate(batch):
    """A script's collate_fn: what it is given, checked to be torchvision's samples, stacked."""
    assert type(batch) is list and all(type(s) is tuple and len(s) == 2 for s in batch)
    assert all(type(x) is torch.Tensor and x.is_contiguous() and type(y) is int for x, y in batch)
    # each its own tensor, as torchvision's: one kept holds only itself
    assert all(x.untyped_storage().nbytes() == x.numel() * x.element_size() for x, _ in batch)
    return torch.stack([x for x, _ in batch]), torch.tensor([y for _, y in batch]), len(batch)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_collate_fn_of_the_scripts_gets_natively_decoded_samples(tv, folder, workers):
    """A loader with a collate_fn of the script's (torchvision's references pass one for MixUp and
    CutMix) is served natively: the collate_fn gets torchvision's samples, a list of (CHW tensor,
    int) tuples, the same values bit for bit (a deterministic transform); num_workers stays the
    script's (workers would run its collate_fn). Random ops (RandAugment, RandomErasing) too."""
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder

    from fastdata.run._decide import decide

    transform = T.Compose([T.Resize(56), T.CenterCrop(48), T.ToTensor(), T.Normalize(MEAN, STD)])
    dataset = ImageFolder(str(folder), transform)
    served, reason, added, _ = decide((dataset,), {"batch_size": 10, "collate_fn": _stack_collate})
    assert served and added is None and "served natively" in reason and "the script's collate_fn" in reason, reason
    loader = _served(dataset, batch_size=10, num_workers=workers, collate_fn=_stack_collate)
    assert isinstance(loader._loader.dataset, rt.NativeFolder) and loader._fastdata_finish is None
    plain = torch.utils.data.DataLoader(dataset, batch_size=10, collate_fn=_stack_collate)
    for (a, y, n), (b, z, m) in zip(loader, plain, strict=True):
        assert torch.equal(a, b) and torch.equal(y, z) and n == m
    randomized = ImageFolder(str(folder), T.Compose([
        T.RandomResizedCrop(48), T.RandAugment(interpolation=T.InterpolationMode.BILINEAR), T.PILToTensor(),
        T.ConvertImageDtype(torch.float), T.RandomErasing(p=0.5)]))
    loader = _served(randomized, batch_size=10, num_workers=workers, collate_fn=_stack_collate, shuffle=True)
    assert isinstance(loader._loader.dataset, rt.NativeFolder)
    labels = []
    for images, y, _ in loader:  # (RandAugment changes colours: the labels are not read from the pixels)
        assert images.shape[1:] == (3, 48, 48) and images.dtype == torch.float32
        labels += y.tolist()
    assert sorted(labels) == sorted(randomized.targets)
    loader._stop()


def test_a_collate_fn_of_the_scripts_gets_torchvisions_own_samples_where_fastdata_would_differ(tv, folder):
    """Where fastdata's batch is not torchvision's samples, the script's collate_fn gets the
    dataset's own: images of different sizes (a collate_fn may take them), and v2's ToImage
    without ToPureTensor (its samples are tv_tensors.Image)."""
    import torchvision.transforms as T
    import torchvision.transforms.v2 as v2
    from torchvision import tv_tensors
    from torchvision.datasets import ImageFolder

    from fastdata.run._decide import decide

    sizes = ImageFolder(str(folder), T.Compose([T.Resize(40), T.PILToTensor()]))
    got = []
    collate = lambda batch: got.append(batch) or len(batch)  # noqa: E731
    reason = decide((sizes,), {"batch_size": 8, "collate_fn": collate})[1]
    assert "not served natively: its images may come out in different sizes" in reason, reason
    loader = _served(sizes, batch_size=8, collate_fn=collate)
    assert not isinstance(loader._loader.dataset, rt.NativeFolder)
    assert sum(loader) == len(sizes)
    for k, batch in enumerate(got):
        assert len({x.shape for x, _ in batch}) > 1 or k  # different sizes, as torchvision's
        for j, (x, y) in enumerate(batch):
            assert torch.equal(x, sizes[8 * k + j][0]) and y == sizes[8 * k + j][1]
    images = ImageFolder(str(folder), v2.Compose([v2.Resize((40, 40)), v2.ToImage(), v2.ToDtype(torch.float32)]))
    kinds = set()
    collate = lambda batch: kinds.update(type(x) for x, _ in batch)  # noqa: E731
    assert "its samples are tv_tensors.Image" in decide((images,), {"batch_size": 8, "collate_fn": collate})[1]
    list(_served(images, batch_size=8, collate_fn=collate))
    assert kinds == {tv_tensors.Image}


def _mixing(classes: int):
    """The references' and torchvision's docs' MixUp or CutMix, one drawn a batch (v2)."""
    import torchvision.transforms.v2 as v2

    return v2.RandomChoice([v2.MixUp(alpha=0.2, num_classes=classes), v2.CutMix(alpha=1.0, num_classes=classes)])


_MIXING = None  # a module's own, as the docs' script holds it


def _mixed_by_name(batch):
    return _MIXING(*default_collate(batch))


def _mixing_collates(mixing):
    """The collate_fn shapes the module `_mixup` recognizes: a def or lambda, the op a global or a closure's."""
    global _MIXING
    _MIXING = mixing

    def by_cell(batch):
        return mixing(*default_collate(batch))

    return {"def, by name": _mixed_by_name, "def, a closure's": by_cell,
            "lambda, a closure's": lambda batch: mixing(*default_collate(batch)),
            "lambda, torch.utils.data's": lambda batch: mixing(*torch.utils.data.default_collate(batch))}


def test_a_collate_fn_that_mixes_gives_torchvisions_batches_bit_for_bit(tv, folder):
    """The natively collated batch, mixed in two halves (draws and labels where the collate_fn
    runs, the images after the layout), equals the script's MixUp or CutMix of default_collate's
    batch of the same samples, drawn from the same torch RNG state: images (RandomErasing's
    rectangles in them too) and labels, bit for bit, both ops drawn."""
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder

    from fastdata.run._mixup import MixCollate

    dataset = ImageFolder(str(folder), T.Compose([
        T.RandomResizedCrop(40), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD),
        T.RandomErasing(p=0.5, value="random")]))
    lowering = rt.lower(dataset)[0]
    mixing = _mixing(len(dataset.classes))
    collate = _mixing_collates(mixing)["def, a closure's"]
    finish = _layout.Finish(lowering, slots=2, pin=False, forks=False)
    kinds = set()
    for seed in range(8):
        indices = [(7 * seed + 5 * k) % len(dataset) for k in range(9)]
        torch.manual_seed(seed)
        crossed = MixCollate(2, False, collate, mixing)(rt.NativeFolder(dataset, lowering).__getitems__(indices))
        kinds.add(crossed[2].mixed[0])
        images, labels = got = finish(crossed)
        torch.manual_seed(seed)
        want = collate(rt.NativeFolder(dataset, lowering, samples=True).__getitems__(indices))
        assert type(got) is tuple and type(want) is tuple
        assert images.dtype == want[0].dtype and torch.equal(images, want[0]), crossed[2].mixed
        assert labels.dtype == want[1].dtype and torch.equal(labels, want[1])
    assert kinds == {"mixup", "cutmix"}
    # The op the function reads at each batch: another bound since (fastdata's mixing; torchvision's own op)
    global _MIXING
    import torchvision.transforms.v2 as v2

    classes = len(dataset.classes)
    for bound in (v2.CutMix(alpha=0.5, num_classes=classes),
                  v2.MixUp(alpha=3.0, num_classes=classes, labels_getter=lambda inputs: inputs[1])):
        _MIXING = bound
        torch.manual_seed(9)
        mixer, served = MixCollate(2, False, _mixed_by_name, mixing), rt.NativeFolder(dataset, lowering)
        served.rings = mixer.rings  # (decoded into the collation's slot, as `_hook` connects them)
        got = finish(mixer(served.__getitems__(list(range(9)))))
        assert mixer.rings.ring().claimed is None
        torch.manual_seed(9)
        want = _mixed_by_name(rt.NativeFolder(dataset, lowering, samples=True).__getitems__(list(range(9))))
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), bound


@pytest.mark.parametrize("workers", [0, 2])
def test_a_collate_fn_that_mixes_is_collated_natively(tv, folder, workers):
    """The docs' `collate_fn(batch): return cutmix_or_mixup(*default_collate(batch))`, in each
    shape, is served with native collation (no samples handed to it) and num_workers as the
    script set it: each batch a tuple of mixed images and soft labels, whose weights are those
    of the classes in its pixels (the blue channel encodes the class). A collate_fn of other
    code, or a mixing op fastdata does not run, gets torchvision's samples."""
    import torchvision.transforms as T
    import torchvision.transforms.v2 as v2
    from torchvision.datasets import ImageFolder

    from fastdata.run._decide import decide

    dataset = ImageFolder(str(folder), T.Compose([T.RandomResizedCrop(48, scale=(0.5, 1.0)), T.ToTensor()]))
    classes = len(dataset.classes)
    blue = 255 * torch.tensor([55.0 + 50 * c for c in range(classes)])  # (the class's mean blue, in [0, 255])
    mixing = _mixing(classes)
    for shape, collate in _mixing_collates(mixing).items():
        served, reason, added, _ = decide((dataset,), {"batch_size": 8, "collate_fn": collate})
        assert served and added is None and "mixed as the script's collate_fn mixes (RandomChoice(MixUp, CutMix))" \
            in reason, (shape, reason)
        loader = _served(dataset, batch_size=8, num_workers=workers, collate_fn=collate, shuffle=True)
        assert loader._fastdata_mixing is mixing and loader._fastdata_finish is not None, shape
        batches = list(loader)
        assert len(batches) == 6
        for images, labels in batches:
            assert images.shape == (8, 3, 48, 48) and labels.shape == (8, classes)
            assert torch.allclose(labels.sum(1), torch.ones(8))
            assert torch.allclose(images[:, 2].mean(dim=(1, 2)) * 255, (labels @ blue) / 255, atol=8), shape
        loader._stop()

    def unpacked(batch):
        images, labels = default_collate(batch)
        return mixing(images, labels)

    own = v2.MixUp(num_classes=classes, labels_getter=lambda inputs: inputs[1])
    for other in (unpacked, lambda batch: own(*default_collate(batch)),
                  lambda batch: T.RandomChoice([own])(*default_collate(batch))):
        assert "its samples batched by the script's collate_fn" in decide(
            (dataset,), {"batch_size": 8, "collate_fn": other})[1]
        loader = _served(dataset, batch_size=8, num_workers=workers, collate_fn=other)
        assert loader._fastdata_mixing is None and loader._fastdata_finish is None
        assert all(images.shape == (8, 3, 48, 48) for images, _ in loader)
        loader._stop()


@pytest.mark.parametrize("workers", [0, 2])
def test_a_folder_with_the_references_ra_sampler_is_served_natively(tv, folder, workers):
    """torchvision's references with `--ra-sampler` (a sampler of the script's: each index three
    times, this rank's share, shuffled by seed + epoch) get their folder decoded natively, with
    torchvision's batches in the sampler's order (a deterministic transform, bit for bit)."""
    import importlib.util

    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder

    from fastdata.run._decide import decide

    spec = importlib.util.spec_from_file_location("train_samplers", Path(__file__).parents[1] / "run_scripts" /
                                                  "train_samplers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dataset = ImageFolder(str(folder), T.Compose([T.Resize((20, 16)), T.ToTensor()]))
    sampler = module.RASampler(dataset, num_replicas=2, rank=1)
    sampler.set_epoch(1)
    served, why, _, _ = decide((dataset,), {"batch_size": 5, "sampler": sampler, "num_workers": workers})
    assert served and why.startswith("served natively: ImageFolder"), why
    loader = _served(dataset, batch_size=5, sampler=sampler, num_workers=workers)
    assert isinstance(loader._loader.dataset, rt.NativeFolder)
    want = list(torch.utils.data.DataLoader(dataset, batch_size=5, sampler=sampler))
    got = list(loader)
    assert len(got) == len(want) == 5 and sum(len(y) for _, y in got) == 24
    for (a, la), (b, lb) in zip(got, want):
        assert torch.equal(a, b) and torch.equal(la, lb) and torch.equal(_class_of(a, False), la)
    loader._stop()


@pytest.mark.parametrize("workers", [0, 2])
def test_a_subset_of_a_folder_is_served_natively(tv, folder, workers):
    """random_split's Subsets of an ImageFolder (a script's train/val split), and a Subset of a
    Subset, are served natively: each Subset's indices picked as its own __getitems__ picks
    them, the batches torchvision's own (a deterministic transform, bit for bit; the labels
    through the folder's target_transform), a changed split followed, and an index past the
    Subset's end raises torch's IndexError."""
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder

    from fastdata.run._decide import _collation

    dataset = ImageFolder(str(folder), T.Compose([T.Resize((20, 16)), T.ToTensor()]), target_transform=lambda t: t * 3)
    train, val = torch.utils.data.random_split(dataset, [0.75, 0.25], generator=torch.Generator().manual_seed(0))
    inner = torch.utils.data.Subset(train, list(range(len(train)))[::-2])
    for subset in (train, val, inner):
        assert "served natively: Subset of ImageFolder" in _collation({"dataset": subset})[0]
        loader = _served(subset, batch_size=7, shuffle=True, num_workers=workers,
                         generator=torch.Generator().manual_seed(1))
        assert isinstance(loader._loader.dataset, rt.NativeFolder)
        want = list(torch.utils.data.DataLoader(subset, batch_size=7, shuffle=True,
                                                generator=torch.Generator().manual_seed(1)))
        got = list(loader)
        assert len(got) == len(want)
        for (a, la), (b, lb) in zip(got, want):
            assert torch.equal(a, b) and torch.equal(la, lb) and torch.equal(_class_of(a, False) * 3, la)
        loader._stop()
    loader = _served(train, batch_size=7, num_workers=workers)
    train.indices = train.indices[:5]
    assert [t for _, labels in loader for t in labels.tolist()] == [dataset.targets[i] * 3 for i in train.indices]
    loader._stop()
    loader = _served(train, batch_size=2, num_workers=workers,
                     sampler=torch.utils.data.SubsetRandomSampler([0, 1, 9], generator=torch.Generator()))
    with pytest.raises(IndexError):
        list(loader)
    loader._stop()
    from fastdata.run._decide import decide  # workers where the script left 0: as for the folder itself

    plain = ImageFolder(str(folder), T.ToTensor())  # no size fixed: the first file's, for /dev/shm's room
    part, _ = torch.utils.data.random_split(plain, [0.5, 0.5], generator=torch.Generator().manual_seed(0))
    (_, why, given, _), (_, part_why, part_given, _) = (decide((ds,), {"batch_size": 4}) for ds in (plain, part))
    assert part_given == given and part_why.split("; ", 1)[1] == why.split("; ", 1)[1], (why, part_why)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_join_of_folders_is_served_natively(tv, folder, tmp_path, workers):
    """A ConcatDataset of image folders (`train + extra`, with a Subset of one, a join of a
    join, random_split's Subset of a join) whose transforms lower the same is served natively:
    each index picked as the join's own __getitem__ picks it, the batches torchvision's own (a
    deterministic transform, bit for bit; each folder's labels through its own target_transform),
    and an index the join refuses raises its error. Folders whose transforms differ, or a join
    with a dataset that is not an image folder, fall back, saying why."""
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder
    from torch.utils.data import ConcatDataset, Subset, TensorDataset

    from fastdata.run._decide import _collation

    other = blue_folder(tmp_path / "other", per_class=5, classes=3, seed=1)
    a = ImageFolder(str(folder), T.Compose([T.Resize((20, 16)), T.ToTensor()]))
    b = ImageFolder(str(other), T.Compose([T.Resize((20, 16)), T.ToTensor()]), target_transform=lambda t: t + 10)
    part = Subset(a, list(range(len(a)))[::-3])
    split, _ = torch.utils.data.random_split(a + b, [0.6, 0.4], generator=torch.Generator().manual_seed(0))
    for join, shown in ((a + b, "ConcatDataset of ImageFolder"), (ConcatDataset([b, part]), "ConcatDataset of "
                        "ImageFolder"), (a + b + part, "ConcatDataset of ImageFolder"), (split, "Subset of ImageFolder")):
        assert f"served natively: {shown} with Resize, ToTensor" in _collation({"dataset": join})[0]
        loader = _served(join, batch_size=7, shuffle=True, num_workers=workers,
                         generator=torch.Generator().manual_seed(1))
        assert isinstance(loader._loader.dataset, rt.NativeFolder)
        want = list(torch.utils.data.DataLoader(join, batch_size=7, shuffle=True,
                                                generator=torch.Generator().manual_seed(1)))
        got = list(loader)
        assert len(got) == len(want) and sum(len(labels) for _, labels in got) == len(join)
        for (x, lx), (y, ly) in zip(got, want):
            assert torch.equal(x, y) and torch.equal(lx, ly) and torch.equal(_class_of(x, False), lx % 10)
        assert {t for _, labels in got for t in labels.tolist()} >= {0, 10}  # (both folders in the batches)
        loader._stop()
    for index, error in ((len(a + b), IndexError), (-len(a + b) - 1, ValueError)):
        loader = _served(a + b, batch_size=2, num_workers=workers, sampler=[0, index])
        with pytest.raises(error):
            list(loader)
        loader._stop()
    class Same:  # an op of the script's that compares as no op should
        def __call__(self, image):
            return image

        def __eq__(self, other):
            raise RuntimeError("not comparable")

        __hash__ = object.__hash__

    differs = ImageFolder(str(other), T.Compose([T.Resize((24, 16)), T.ToTensor()]))
    own, own_too = (ImageFolder(str(root), T.Compose([T.Resize((20, 16)), Same(), T.ToTensor()])) for root in (folder,
                                                                                                             other))
    assert rt.lower(own)[1] == "" and rt.lower(own + own)[1] == ""  # (one transform: never compared)
    for join, why in ((a + differs, "ConcatDataset joins image folders whose transforms differ"),
                      (own + own_too, "ConcatDataset joins image folders whose transforms differ"),
                      (a + TensorDataset(torch.zeros(3, 3, 20, 16), torch.zeros(3)),
                       "ConcatDataset joins a TensorDataset, which is not an image folder")):
        lowering, reason = rt.lower(join)
        assert lowering is None and why in reason, reason
        assert why in _collation({"dataset": join})[0]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_scripts_wrapper_giving_a_split_its_transform_is_served_natively(tv, folder, workers):
    """A script's Dataset that gives random_split's parts transforms of their own, written as
    scripts write it (`x, y = self.subset[index]`, then the transform, `if self.transform:`, `is
    not None`, always, or inline; any names), over a Subset of an ImageFolder without a transform, is
    served natively: the batches torchvision's own (bit for bit; the labels the folder's, through
    its target_transform), each part with its own transform, a transform changed between passes
    followed. A wrapper with other code, one whose transform is a property or may answer its own
    truth, or one over a folder with a transform of its own, is not read."""
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder
    from torch.utils.data import Dataset

    from fastdata.run._decide import _collation

    class Split(Dataset):  # (defined in a function, as a script's main() may)
        def __init__(self, subset, transform=None):
            self.subset, self.transform = subset, transform

        def __getitem__(self, index):
            x, y = self.subset[index]
            if self.transform:
                x = self.transform(x)
            return x, y

        def __len__(self):
            return len(self.subset)

    class NotNone(Split):
        def __getitem__(self, idx):
            image, label = self.subset[idx]
            if self.transform is not None:
                image = self.transform(image)
            return image, label

    class Inline:
        def __init__(self, data, tf):
            self.data, self.tf = data, tf

        def __getitem__(self, i):
            img, target = self.data[i]
            return self.tf(img), target

        def __len__(self):
            return len(self.data)

    class Always(Split):
        def __getitem__(self, k):
            sample, target = self.subset[k]
            sample = self.transform(sample)
            return sample, target

    class More(Split):
        def __getitem__(self, index):
            x, y = self.subset[index]
            if self.transform:
                x = self.transform(x)
            return x, y + 1

    class Property(Split):
        transform = property(lambda self: T.Compose([T.Resize((20, 16)), T.ToTensor()]))

        def __init__(self, subset):
            self.subset = subset

    class Sized(T.Compose):
        def __len__(self):
            return 0

    base = ImageFolder(str(folder), target_transform=lambda t: t * 3)
    train, val = torch.utils.data.random_split(base, [0.75, 0.25], generator=torch.Generator().manual_seed(0))
    sized = T.Compose([T.Resize((20, 16)), T.ToTensor()])
    cropped = T.Compose([T.Resize((24, 24)), T.CenterCrop((20, 16)), T.PILToTensor()])
    for wrapper in (Split(train, sized), NotNone(val, cropped), Inline(train, cropped), Always(val, sized),
                    Split(base, sized)):
        assert f"served natively: {type(wrapper).__name__} of ImageFolder" in _collation({"dataset": wrapper})[0]
        loader = _served(wrapper, batch_size=7, shuffle=True, num_workers=workers,
                         generator=torch.Generator().manual_seed(1))
        assert isinstance(loader._loader.dataset, rt.NativeFolder)
        plain = torch.utils.data.DataLoader(wrapper, batch_size=7, shuffle=True,
                                            generator=torch.Generator().manual_seed(1))
        for _ in range(2):
            want, got = list(plain), list(loader)
            assert len(got) == len(want) and sum(len(labels) for _, labels in got) == len(wrapper)
            for (a, la), (b, lb) in zip(got, want):
                assert torch.equal(a, b) and torch.equal(la, lb) and torch.equal(_class_of(a, False) * 3, la)
            if isinstance(wrapper, Inline):
                wrapper.tf = sized  # (the next pass lowers the transform as it is then)
            else:
                wrapper.transform = cropped if wrapper.transform is sized else sized
        loader._stop()
    assert rt.lower(Split(val, None)) == (None, "")  # (its samples PIL images: not an image folder's)
    for wrapper in (More(train, sized), Property(train), Split(train, Sized([T.Resize((20, 16)), T.ToTensor()]))):
        assert rt.lower(wrapper) == (None, ""), type(wrapper).__name__
        assert "served natively" not in _collation({"dataset": wrapper})[0]
    own = ImageFolder(str(folder), T.ToTensor())
    why = "the ImageFolder under Split has a transform of its own: fastdata lowers one transform an image"
    assert rt.lower(Split(own, sized)) == (None, why)
    lowering, why = rt.lower(Split(train, sized) + Split(val, cropped))
    assert lowering is None and "joins image folders whose transforms differ" in why


def test_a_loader_rebuilt_from_a_served_ones_attributes_is_served_natively(tv, folder):
    """Code that rebuilds a loader from a served one's attributes passes collate_fn=loader.collate_fn,
    fastdata's own collate: the rebuilt loader is served natively too, with the same batches."""
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder

    dataset = ImageFolder(str(folder), T.Compose([T.Resize((16, 16)), T.ToTensor()]))
    loader = _served(dataset, batch_size=8)
    rebuilt = _served(loader.dataset, batch_size=loader.batch_size, collate_fn=loader.collate_fn)
    assert isinstance(rebuilt._loader.dataset, rt.NativeFolder)
    for (a, la), (b, lb) in zip(loader, rebuilt, strict=True):
        assert torch.equal(a, b) and torch.equal(la, lb)
    loader._stop()
    rebuilt._stop()


def test_only_a_thin_wrapper_of_a_compose_is_looked_into(tv, folder):
    """An object whose __call__ is `return self.transforms(img)` (torchvision's references'
    presets) is its Compose; one that does anything more, or finds `transforms` through a
    property, is a transform fastdata cannot see into."""
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder

    inner = T.Compose([T.Resize(56), T.CenterCrop(48), T.PILToTensor()])

    class Thin:
        def __init__(self, transforms):
            self.transforms = transforms

        def __call__(self, image):
            return self.transforms(image)

    class More(Thin):
        def __call__(self, image):
            return self.transforms(image).flip(-1)

    class Property(Thin):
        transforms = property(lambda self: T.Compose([T.Resize(56), T.CenterCrop(48), T.PILToTensor(),
                                                      T.ConvertImageDtype(torch.float)]))

        def __init__(self, transforms):
            pass

    lowering, why = rt.lower(ImageFolder(str(folder), Thin(inner)))
    assert why == "" and lowering.names == "Resize, CenterCrop, PILToTensor"
    for wrapper in (More(inner), Property(inner)):
        lowering, why = rt.lower(ImageFolder(str(folder), wrapper))
        assert lowering is None and why == f"{type(wrapper).__name__} has no faithful lowering in fastdata", why


def test_a_sample_drawn_twice_into_a_batch_gets_draws_of_its_own(tv, folder):
    """A sampler with replacement (WeightedRandomSampler, a Subset repeating an index) may put a
    sample in a batch twice: torchvision draws each occurrence's crop, flip and pixel ops anew,
    and so does fastdata (the draws keyed by the place in the batch, not the sample)."""
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder

    for transform in (T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip(), T.PILToTensor()]),
                      T.Compose([T.Resize((32, 32)), T.TrivialAugmentWide(), T.PILToTensor()]),
                      T.Compose([T.Resize((32, 32)), T.ToTensor(), T.RandomErasing(p=1.0)])):
        dataset = ImageFolder(str(folder), transform)
        weights = [1.0] + [0.0] * (len(dataset) - 1)
        for loader in (_served(torch.utils.data.Subset(dataset, [3] * 40), batch_size=40),
                       _served(dataset, batch_size=40, sampler=torch.utils.data.WeightedRandomSampler(weights, 40))):
            assert isinstance(loader._loader.dataset, rt.NativeFolder)
            (images, _), = list(loader)
            assert len({bytes(x.numpy()) for x in images}) > 10, transform
            loader._stop()


def test_served_natively_same_seed_same_batches(tv, folder):
    """The script's torch.manual_seed makes the run repeat: the order (the sampler's generator)
    and the crops (a seed a batch from the torch RNG of the process that decodes)."""
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder

    dataset = ImageFolder(str(folder), T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip(), T.ToTensor()]))
    runs = []
    for _ in range(2):
        torch.manual_seed(7)
        loader = _served(dataset, batch_size=8, shuffle=True, num_workers=2)
        runs.append([b for b in loader])
        loader._stop()
    for (a, la), (b, lb) in zip(*runs):
        assert torch.equal(la, lb) and torch.equal(a, b)
    torch.manual_seed(8)
    other = _served(dataset, batch_size=8, shuffle=True, num_workers=2)
    assert not torch.equal(next(iter(other))[0], runs[0][0][0])
    other._stop()


def _erasing(version: str, p: float, value):
    """Resize, the conversion, Normalize, then RandomErasing: torchvision's references' order."""
    import torchvision.transforms as T
    import torchvision.transforms.v2 as v2

    if version == "v1":
        return T.Compose([T.Resize((40, 48)), T.ToTensor(), T.Normalize(MEAN, STD), T.RandomErasing(p, value=value)])
    return v2.Compose([v2.Resize((40, 48)), v2.ToImage(), v2.ToDtype(torch.float32, scale=True),
                       v2.Normalize(MEAN, STD), v2.RandomErasing(p, value=value), v2.ToPureTensor()])


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("version", ["v1", "v2"])
def test_random_erasing_served_natively(tv, folder, version, workers):
    """RandomErasing after Normalize is served natively: each image is the one laid out without
    it (torchvision's own here: a Resize to a fixed size is Pillow's pixels) but inside one
    rectangle a sample, which holds the value exactly; with p=0 the batches are torchvision's
    own, bit for bit."""
    from torchvision.datasets import ImageFolder

    value = (1.5, -2.0, 0.25) if version == "v1" else -5.0
    dataset = ImageFolder(str(folder), _erasing(version, 1.0, value))
    plain = ImageFolder(str(folder), _erasing(version, 0.0, value))
    fill = torch.tensor(value if version == "v1" else [value]).expand(3).view(3, 1, 1)
    loader = _served(dataset, batch_size=10, num_workers=workers)
    assert isinstance(loader._loader.dataset, rt.NativeFolder) and loader._loader.dataset.lowering.random
    want = list(torch.utils.data.DataLoader(plain, batch_size=10))
    batches = list(loader)
    assert len(batches) == len(want)
    for (images, labels), (ref, ref_labels) in zip(batches, want):
        assert torch.equal(labels, ref_labels) and images.dtype == ref.dtype and images.shape == ref.shape
        for k in range(len(images)):
            ys, xs = torch.nonzero((images[k] != ref[k]).any(0), as_tuple=True)
            assert len(ys), f"sample {k} not erased"
            box = (slice(None), slice(int(ys.min()), int(ys.max()) + 1), slice(int(xs.min()), int(xs.max()) + 1))
            inside = torch.zeros(images.shape[2:], dtype=torch.bool)
            inside[box[1:]] = True
            assert torch.equal(images[k][box], fill.expand_as(images[k][box]))
            assert torch.equal(images[k][:, ~inside], ref[k][:, ~inside])
    loader._stop()
    loader = _served(plain, batch_size=10, num_workers=workers)
    assert isinstance(loader._loader.dataset, rt.NativeFolder)
    for (images, labels), (ref, ref_labels) in zip(loader, want, strict=True):
        assert torch.equal(images, ref) and torch.equal(labels, ref_labels)
    loader._stop()


@pytest.mark.filterwarnings("ignore:Scale and ratio should be of kind")
def test_random_erasing_refusals(tv):
    """What RandomErasing fastdata does not lower, and why: the transform falls back."""
    import torchvision.transforms as T
    import torchvision.transforms.v2 as v2

    from fastdata.run._lowering import Unlowerable, lower_transform

    cases = [
        (T.Compose([T.RandomErasing(), T.ToTensor()]), "RandomErasing of a PIL image: torchvision raises"),
        (v2.Compose([v2.RandomErasing(), v2.ToImage()]), "torchvision's v2 erases it before the conversion"),
        (T.Compose([T.ToTensor(), T.RandomErasing(value=(1, 2))]), "value (1, 2) for 3 channels: torchvision raises"),
        (T.Compose([T.ToTensor(), T.RandomErasing(value=[])]), "for 3 channels: torchvision raises"),
        (v2.Compose([v2.ToImage(), v2.RandomErasing(value="random")]), "(value='random') on a uint8 image"),
        (v2.Compose([v2.ToImage(), v2.RandomErasing(value=256)]), "on a uint8 image: the cast of a value past"),
        (T.Compose([T.PILToTensor(), T.RandomErasing(), T.Resize(8)]), "Resize after RandomErasing"),
        (T.Compose([T.ToTensor(), T.RandomErasing(scale=(0.5, 0.1))]), "scale (0.5, 0.1)"),
    ]
    for transform, words in cases:
        with pytest.raises(Unlowerable) as e:
            lower_transform(transform)
        assert words in str(e.value) and "\n" not in str(e.value), (words, str(e.value))
    op = T.RandomErasing()
    op.value = np.float32(0.5)  # a number v1's forward does not take (it takes len() of it)
    with pytest.raises(Unlowerable, match="torchvision raises"):
        lower_transform(T.Compose([T.ToTensor(), op]))
    # lowered: uint8 values that cast (truncated), two ops, the value 'random' on a float tensor
    lowering = lower_transform(v2.Compose([v2.ToImage(), v2.RandomErasing(value=(0, 255.9, 3)),
                                           v2.ToDtype(torch.float32, scale=True), v2.RandomErasing(value="random")]))
    assert [(e.at, e.value) for e in lowering.erasing] == [(0, (0.0, 255.9, 3.0)), (1, None)] and lowering.random


def _outcomes(loader) -> list:
    """Each batch (labels and images), or the type and last line of the error it raised, as a
    script that catches OSError around each batch and goes on sees them."""
    out, it = [], iter(loader)
    while True:
        try:
            images, labels = next(it)
            out.append((labels.tolist(), images))
        except StopIteration:
            return out
        except OSError as e:
            assert "FolderError" not in str(e) and not isinstance(e.__context__, rt.FolderError)  # the script's own
            out.append((type(e), str(e).splitlines()[-1]))


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("what", ["corrupt", "missing", "a TGA named .jpg"])
def test_a_file_fastdata_does_not_read_is_the_scripts_own_fetch(tv, tmp_path, what, workers):
    """A batch holding a file fastdata does not read (cut, missing, or a format it leaves alone
    that Pillow reads by its content) is the script's own fetch: the same images, or the same
    error (Pillow's, open's: type and message, through a worker's re-raise as well), and the pass
    goes on with the next batch, as DataLoader's."""
    import torchvision.transforms as T
    from PIL import Image
    from torchvision.datasets import ImageFolder

    root = blue_folder(tmp_path / "data", per_class=6, classes=2)
    bad = root / "class1" / "001.jpg"
    bicubic = T.InterpolationMode.BICUBIC  # Pillow's resize on the whole decode, as torchvision's: the same pixels
    dataset = ImageFolder(str(root), T.Compose([T.Resize((32, 32), bicubic), T.PILToTensor()]))
    if what == "corrupt":
        bad.write_bytes(bad.read_bytes()[:300])
    elif what == "missing":
        bad.unlink()
    else:
        with Image.open(bad) as img:
            img.save(bad, format="TGA")
    loader = _served(dataset, batch_size=4, num_workers=workers)
    assert isinstance(loader._loader.dataset, rt.NativeFolder)
    got = _outcomes(loader)
    want = _outcomes(torch.utils.data.DataLoader(dataset, batch_size=4, num_workers=workers))
    assert len(got) == len(want) == 3
    for g, w in zip(got, want):
        assert g[0] == w[0] and (torch.equal(g[1], w[1]) if type(g[0]) is list else g[1] == w[1]), (g, w)
    errors = [g for g in got if type(g[0]) is not list]
    assert len(errors) == (0 if what == "a TGA named .jpg" else 1)
    loader._stop()


@pytest.mark.parametrize("shared", [False, True])
def test_a_batch_is_decoded_into_the_collations_slot_and_a_failed_one_frees_it(tv, tmp_path, shared,
                                                                                    monkeypatch):
    """The served folder decodes a batch straight into a slot of the collate function's ring,
    which the collation hands on as it is (no copy; the images and labels right). A fetch that
    fails after it took the slot (an op of the script's that changed an image, found as the
    batch is filled) ends the claim and frees the leaves it took, in the training process's
    ring and in a worker's (shared) alike; its batch is the script's own fetch, and the next
    batch takes a slot again."""
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder

    from fastdata._buffers import BufferRing, WorkerRings

    root = blue_folder(tmp_path / "data", per_class=4, classes=2)
    dataset = ImageFolder(str(root), T.Compose([T.Resize((32, 32)), T.PILToTensor()]))
    loader = _served(dataset, batch_size=4)
    working = loader._loader
    assert type(working.dataset) is rt.NativeFolder and working.dataset.rings is working.collate_fn.rings
    if shared:  # (a worker's ring: its leaves are records the training process rebuilds, freed only by flags)
        record = WorkerRings()
        ring = BufferRing(slots=2, shared=True, token=record.token, worker=0)
        monkeypatch.setattr(working.collate_fn.rings, "ring", lambda: ring)
    else:
        ring = working.collate_fn.rings.ring()
    batch = working.dataset.__getitems__([0, 1, 4, 5])
    assert type(batch) is _layout.FolderBatch and batch.handle is not None and ring.claimed
    images, labels, layout = working.collate_fn(batch)
    assert ring.claimed is None and getattr(labels, "tensor", labels).tolist() == [0, 0, 1, 1]  # (a worker's: by value)
    if not shared:
        assert images.data_ptr() == batch.images.data_ptr()  # handed on, not copied
        assert torch.equal(images[:, :, :, 2].float().mean((1, 2)).div(50).round(), torch.tensor([1.0, 1.0, 2.0, 2.0]))
    held = ring.flags.array.copy()
    decoder = working.dataset.decoder

    def changed(*args, **kwargs):  # (as an op of the script's that changes an image's size raises, in the fill)
        raise rt.NotAPixelOp("an op of the script's gave another size")

    monkeypatch.setattr(decoder, "fill", changed)
    fallback = working.dataset.__getitems__([1, 2, 6, 7])  # (the script's own fetch)
    assert type(fallback) is list and ring.claimed is None
    assert (ring.flags.array == held).all()  # the leaves the failed fetch took are free again
    monkeypatch.undo()
    if shared:
        monkeypatch.setattr(working.collate_fn.rings, "ring", lambda: ring)
    again = working.dataset.__getitems__([0, 1, 2, 3])
    assert type(again) is _layout.FolderBatch and again.handle is not None and ring.claimed
    working.collate_fn(again)
    loader._stop()


@pytest.mark.parametrize("target", ["a class name", "an int"])
def test_labels_a_target_transform_gives_are_collated_as_dataloader_collates_them(tv, folder, target):
    """Strings come out as default_collate leaves them, a tuple; numbers as a tensor."""
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder

    dataset = ImageFolder(str(folder), T.Compose([T.Resize((16, 16)), T.PILToTensor()]))
    dataset.target_transform = dataset.classes.__getitem__ if target == "a class name" else (lambda t: 2 * t)
    loader = _served(dataset, batch_size=4)
    assert isinstance(loader._loader.dataset, rt.NativeFolder)
    got = [labels for _, labels in loader]
    want = [labels for _, labels in torch.utils.data.DataLoader(dataset, batch_size=4)]
    kind = tuple if target == "a class name" else torch.Tensor
    assert [type(g) for g in got] == [type(w) for w in want] == [kind] * 12
    assert all((g == w) if type(g) is tuple else torch.equal(g, w) for g, w in zip(got, want))
    loader._stop()


@pytest.mark.parametrize("v2", [False, True])
def test_a_filter_given_as_pils_integer_and_a_normalize_of_numbers_are_lowered(tv, folder, v2):
    """interpolation=3 (PIL's bicubic, as v2 keeps it) and v1's Normalize(0.5, 0.5), which
    torchvision broadcasts: served natively, with torchvision's batches."""
    import torchvision.transforms as T
    import torchvision.transforms.v2 as V
    from torchvision.datasets import ImageFolder

    resize = (V if v2 else T).Resize((16, 16), interpolation=3)
    dataset = ImageFolder(str(folder), T.Compose([resize, T.ToTensor(), T.Normalize(0.5, 0.5)]))
    loader = _served(dataset, batch_size=8)
    assert isinstance(loader._loader.dataset, rt.NativeFolder)
    for (x, y), (u, v) in zip(loader, torch.utils.data.DataLoader(dataset, batch_size=8), strict=True):
        assert torch.equal(x, u) and torch.equal(y, v)
    loader._stop()


def test_subclasses_of_torchvision_transforms_fall_back(tv, folder):
    """A subclass of a torchvision transform may do anything in its own methods: only
    torchvision's own classes are lowered, and the reason names the subclass. The batches are
    torchvision's own samples."""
    import torchvision.transforms as T
    import torchvision.transforms.functional as F
    from torchvision.datasets import ImageFolder

    class InvertingCompose(T.Compose):
        def __call__(self, img):
            return 1 - super().__call__(img)

    class VFlip(T.RandomHorizontalFlip):
        def forward(self, img):
            return F.vflip(img) if torch.rand(1) < self.p else img

    class ToTensorInv(T.ToTensor):
        def __call__(self, pic):
            return 1 - F.to_tensor(pic)

    class SquareResize(T.Resize):
        def forward(self, img):
            return F.resize(img, [self.size, self.size] if isinstance(self.size, int) else self.size)

    class Compose(T.Compose):  # the same name and behaviour as torchvision's: still not torchvision's
        pass

    cases = [(InvertingCompose([T.Resize((32, 32)), T.ToTensor()]), "InvertingCompose", "Compose"),
             (T.Compose([T.Resize((32, 32)), VFlip(p=1.0), T.ToTensor()]), "VFlip", "RandomHorizontalFlip"),
             (T.Compose([T.Resize((32, 32)), ToTensorInv()]), "ToTensorInv", "ToTensor"),
             (T.Compose([SquareResize(24), T.ToTensor()]), "SquareResize", "Resize"),
             (Compose([T.Resize((32, 32)), T.ToTensor()]), "Compose", "Compose")]
    for transform, name, base in cases:
        dataset = ImageFolder(str(folder), transform)
        lowering, why = rt.lower(dataset)
        assert lowering is None and why.startswith(f"{name} has no faithful lowering") and \
            f"a subclass of torchvision's {base}" in why, why
        loader = _served(dataset, batch_size=6, num_workers=0)
        assert not isinstance(loader._loader.dataset, rt.NativeFolder), name
        got = next(iter(loader))
        want = torch.utils.data.default_collate([dataset[i] for i in range(6)])
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), name
        loader._stop()


def _normalize_cases():
    import torchvision.transforms as T
    import torchvision.transforms.v2 as v2

    head = [T.Resize((16, 16)), T.ToTensor()]
    return {
        "a zero std": T.Compose([*head, T.Normalize(MEAN, [0.2, 0.0, 0.2])]),
        "a std zero in float32": T.Compose([*head, T.Normalize(MEAN, [0.2, 1e-50, 0.2])]),
        "v2, a zero std": v2.Compose([v2.Resize((16, 16)), v2.ToImage(), v2.ToDtype(torch.float32, scale=True),
                                      v2.Normalize(MEAN, [0.0] * 3)]),
        "four means": T.Compose([*head, T.Normalize([0.5] * 4, [0.2] * 4)]),
        "two means": T.Compose([*head, T.Normalize([0.5] * 2, [0.2] * 2)]),
    }


@pytest.mark.parametrize("name", ["a zero std", "a std zero in float32", "v2, a zero std", "four means", "two means"])
def test_a_normalize_torchvision_refuses_falls_back_with_its_error(tv, folder, name):
    """torchvision raises for a std of zero (in the image's dtype) and for means or stds that do
    not broadcast over the channels: not lowered, so the script gets torchvision's own error."""
    from torchvision.datasets import ImageFolder

    dataset = ImageFolder(str(folder), _normalize_cases()[name])
    lowering, why = rt.lower(dataset)
    assert lowering is None and "Normalize with" in why and "torchvision raises" in why, why
    loader = _served(dataset, batch_size=4, num_workers=0)
    with pytest.raises(Exception) as served:
        next(iter(loader))
    with pytest.raises(Exception) as plain:
        next(iter(torch.utils.data.DataLoader(dataset, batch_size=4)))
    assert type(served.value) is type(plain.value) and str(served.value) == str(plain.value)
    loader._stop()


def _truncated_folder(root: Path) -> Path:
    blue_folder(root, per_class=5, classes=2)
    bad = root / "class1" / "002.jpg"
    data = bad.read_bytes()
    bad.write_bytes(data[:len(data) * 2 // 3])  # headers whole, the scan cut short
    return root


def test_load_truncated_images_falls_back_to_the_scripts_pillow(tv, tmp_path, monkeypatch):
    """With PIL's ImageFile.LOAD_TRUNCATED_IMAGES set (a script's `import`-time line), Pillow
    loads a truncated JPEG where fastdata's decoder refuses it: such a folder is not served
    natively, whether the flag was set before the loader was made or before a later pass."""
    import torchvision.transforms as T
    from PIL import ImageFile
    from torchvision.datasets import ImageFolder

    from fastdata.run._decide import decide

    dataset = ImageFolder(str(_truncated_folder(tmp_path / "data")), T.Compose([T.Resize((32, 32)), T.PILToTensor()]))
    early = _served(dataset, batch_size=4, num_workers=0)  # made while the flag is unset: served natively
    assert isinstance(early._loader.dataset, rt.NativeFolder)
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    served, reason, _, lowering = decide((dataset,), {"batch_size": 4})
    assert served and lowering is None and "not served natively: PIL.ImageFile.LOAD_TRUNCATED_IMAGES" in reason
    want = list(torch.utils.data.DataLoader(dataset, batch_size=4))
    for loader in (_served(dataset, batch_size=4, num_workers=0), early):
        got = list(loader)
        assert len(got) == len(want) == 3
        for (a, la), (b, lb) in zip(got, want):
            assert torch.equal(a, b) and torch.equal(la, lb)
        loader._stop()


@pytest.mark.parametrize("size", ["4", [8], 0, True, 2.0])
def test_a_batch_size_torch_refuses_gets_torchs_error(tv, folder, size):
    """A natively served folder left at 0 workers: a batch_size torch refuses raises torch's own
    error, type and message (fastdata sizes its workers' /dev/shm from it, after torch's check);
    an int subclass torch takes (an IntEnum) is taken, with workers."""
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder

    dataset = ImageFolder(str(folder), T.Compose([T.Resize((32, 32)), T.PILToTensor()]))
    with pytest.raises(Exception) as want:
        torch.utils.data.DataLoader(dataset, batch_size=size)
    with pytest.raises(type(want.value)) as got:
        _served(dataset, batch_size=size)
    assert str(got.value) == str(want.value)
    if size == "4":
        import enum

        from fastdata.run._decide import auto_workers
        from fastdata.run._folders import lower

        lowering = lower(dataset)[0]
        assert auto_workers({"dataset": dataset, "batch_size": enum.IntEnum("B", {"SIZE": 4}).SIZE}, lowering) == \
            auto_workers({"dataset": dataset, "batch_size": 4}, lowering)


@pytest.mark.parametrize("context", ["spawn", "fork", "nope", None])
def test_a_context_set_on_a_loader_given_workers_gets_torchs_error_for_0_workers(tv, folder, context):
    """`loader.multiprocessing_context = ...` on a loader the script made with 0 workers: torch
    refuses any context there (ValueError), so the loader fastdata gave workers refuses it too,
    type and message, and keeps its workers; None is taken by both."""
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder

    dataset = ImageFolder(str(folder), T.Compose([T.Resize((32, 32)), T.PILToTensor()]))
    plain, served = torch.utils.data.DataLoader(dataset, batch_size=4), _served(dataset, batch_size=4)
    assert served.num_workers > 0
    if context is None:
        plain.multiprocessing_context = served.multiprocessing_context = None
        assert served.multiprocessing_context is None and served._worker_context().get_start_method() == "fork"
        return
    with pytest.raises(Exception) as want:
        plain.multiprocessing_context = context
    with pytest.raises(type(want.value)) as got:
        served.multiprocessing_context = context
    assert str(got.value) == str(want.value) and "num_workers=0" in str(got.value)
    assert served.multiprocessing_context is None
    labels = [y for _, ys in served for y in ys.tolist()]
    assert labels == dataset.targets


def test_a_pil_loader_the_script_replaced_is_followed(tv, folder, monkeypatch):
    """torchvision's default_loader calls the module's pil_loader by name, so a script that puts
    its own there (a grey loader here; an EXIF-transposing one is as common) changes every
    ImageFolder's images: such a folder is not served natively, and its batches are the
    script's own (grey: R = G = B); nor is one given a functools.wraps wrapper of pil_loader
    (torchvision's names, the script's code), in the module or as its loader. One built with
    torchvision's pil_loader itself still is."""
    import functools

    import torchvision.datasets.folder as tv_folder
    import torchvision.transforms as T
    from PIL import Image
    from torchvision.datasets import ImageFolder

    from fastdata.run._decide import decide

    own = tv_folder.pil_loader

    def grey(path):
        with open(path, "rb") as f:
            return Image.open(f).convert("L").convert("RGB")

    monkeypatch.setattr(tv_folder, "pil_loader", grey)
    transform = T.Compose([T.Resize((32, 32)), T.PILToTensor()])
    dataset = ImageFolder(str(folder), transform)
    served, reason, _, lowering = decide((dataset,), {"batch_size": 4})
    assert served and lowering is None
    assert "torchvision.datasets.folder.pil_loader, which ImageFolder's default_loader calls, is the script's " \
           "own (test_a_pil_loader_the_script_replaced_is_followed.<locals>.grey)" in reason, reason
    loader = _served(dataset, batch_size=4, num_workers=0)
    want = list(torch.utils.data.DataLoader(dataset, batch_size=4))
    got = list(loader)
    assert len(got) == len(want) > 1
    for (a, la), (b, lb) in zip(got, want):
        assert torch.equal(a, b) and torch.equal(la, lb)
        assert torch.equal(a[:, 0], a[:, 2])  # grey
    loader._stop()

    @functools.wraps(own)
    def wrapped(path):
        return own(path).convert("L").convert("RGB")

    monkeypatch.setattr(tv_folder, "pil_loader", wrapped)
    for dataset in (ImageFolder(str(folder), transform), ImageFolder(str(folder), transform, loader=wrapped)):
        served, reason, _, lowering = decide((dataset,), {"batch_size": 4})
        assert served and lowering is None and "pil_loader" in reason, reason
    monkeypatch.setattr(tv_folder, "pil_loader", own)
    native = _served(ImageFolder(str(folder), transform, loader=own), batch_size=4, num_workers=0)
    assert isinstance(native._loader.dataset, rt.NativeFolder)
    images = next(iter(native))[0]
    assert not torch.equal(images[:, 0], images[:, 2])  # colour
    native._stop()


@pytest.mark.parametrize("error", ["a truncated file", "images of different sizes"])
def test_workers_fastdata_added_raise_the_fetchs_own_error(tv, tmp_path, error):
    """The script left num_workers at 0 and fastdata gave the loader workers: a batch's error is
    the one the script's own process raises (served with no workers: the same type and message,
    not torch's "Caught ... in DataLoader worker process k"), and the pass goes on after it with
    the next batch, as DataLoader's does."""
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder

    resize = T.Resize((32, 32)) if error == "a truncated file" else T.Resize(32)  # (aspect kept: sizes differ)
    dataset = ImageFolder(str(_truncated_folder(tmp_path / "data")), T.Compose([resize, T.PILToTensor()]))
    if error == "images of different sizes":
        dataset.samples = dataset.imgs = [s for s in dataset.samples if not s[0].endswith("class1/002.jpg")]

    added = _served(dataset, batch_size=4)
    assert isinstance(added._loader.dataset, rt.NativeFolder) and added.num_workers >= 1
    got, want = steps(added), steps(_served(dataset, batch_size=4, num_workers=0))
    assert got == want and any(type(step) is tuple for step in got), got
    if error == "a truncated file":
        assert [type(step) is tuple for step in got] == [False, True, False] and issubclass(got[1][0], OSError)
        assert "worker process" not in got[1][1]  # Pillow's "image file is truncated", as the script's fetch
    else:
        assert got[0][0] is RuntimeError and got[0][1].startswith("stack expects each tensor to be equal size")
    script = _served(dataset, batch_size=4, num_workers=2)  # workers the script asked for: torch's message
    assert all("in DataLoader worker process" in step[1] for step in steps(script) if type(step) is tuple)


def test_images_of_different_sizes_raise_torchs_stack_error(tv, folder):
    """Resize(int) keeps each image's aspect ratio: a batch of images of different sizes raises
    what default_collate raises on torchvision's samples, not a ValueError of fastdata's."""
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder

    dataset = ImageFolder(str(folder), T.Compose([T.Resize(32), T.PILToTensor()]))
    loader = _served(dataset, batch_size=4, num_workers=0)
    assert isinstance(loader._loader.dataset, rt.NativeFolder)
    with pytest.raises(RuntimeError) as served:
        next(iter(loader))
    with pytest.raises(RuntimeError) as plain:
        next(iter(torch.utils.data.DataLoader(dataset, batch_size=4)))
    assert type(served.value) is RuntimeError and str(served.value) == str(plain.value)
    assert str(plain.value).startswith("stack expects each tensor to be equal size")
    loader._stop()


def _largest(root) -> int:
    return max(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_batch_of_large_files_is_read_in_parts_with_the_same_batches(tv, folder, monkeypatch, workers):
    """A batch's files are held at most MAX_PART_BYTES at a time (here about two of the
    folder's largest files, so a batch of 10 comes in 3 or more parts): each part is decoded into its
    rows of the batch before the next is read, and the batches are those read whole, random
    crops included (the seed is drawn once a batch, the crops per sample id)."""
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder

    dataset = ImageFolder(str(folder), T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip(), T.ToTensor()]))

    def epochs():
        torch.manual_seed(5)
        loader = _served(dataset, batch_size=10, shuffle=True, num_workers=workers)
        assert isinstance(loader._loader.dataset, rt.NativeFolder)
        out = [(x.clone(), y.clone()) for _ in range(2) for x, y in loader]
        loader._stop()
        return out

    whole = epochs()
    budget = 2 * _largest(folder)
    reads, calls = rt.read_files, []

    def spied(paths, threads, budget=None):
        got = reads(paths, threads, budget)
        calls.append((budget, [len(d) for d in got if isinstance(d, bytes)]))
        return got

    monkeypatch.setattr(rt, "MAX_PART_BYTES", budget)
    monkeypatch.setattr(rt, "read_files", spied)
    parts = epochs()
    assert len(parts) == len(whole) == 2 * 5
    for (a, la), (b, lb) in zip(parts, whole):
        assert torch.equal(la, lb) and torch.equal(a, b)
        assert torch.equal(_class_of(a, False), la)
    if workers == 0:  # (the workers' calls are theirs)
        assert len(calls) >= 3 * len(parts) and all(b == budget for b, _ in calls)
        assert all(sum(sizes) <= budget or len(sizes) == 1 for _, sizes in calls)


def test_images_of_different_sizes_in_two_parts_raise_torchs_stack_error(tv, tmp_path, monkeypatch):
    """Read in parts of one file each, a batch whose last image comes out in another size
    raises torch's stack error, with the entry default_collate names."""
    import torchvision.transforms as T
    from PIL import Image
    from torchvision.datasets import ImageFolder

    (tmp_path / "a").mkdir()
    for i, side in enumerate([40, 40, 40, 56]):
        Image.new("RGB", (side, side + 8), (10 * i, 0, 0)).save(tmp_path / "a" / f"{i}.jpg", quality=95)
    dataset = ImageFolder(str(tmp_path), T.Compose([T.Resize(32), T.PILToTensor()]))
    monkeypatch.setattr(rt, "MAX_PART_BYTES", 1)
    loader = _served(dataset, batch_size=4, num_workers=0)
    with pytest.raises(RuntimeError) as served:
        next(iter(loader))
    with pytest.raises(RuntimeError) as plain:
        next(iter(torch.utils.data.DataLoader(dataset, batch_size=4)))
    assert str(served.value) == str(plain.value) and "at entry 3" in str(plain.value)
    loader._stop()


@pytest.mark.parametrize("kind", ["larger than every image", "larger than some, flipped", "v2 on a uint8 tensor"])
def test_a_center_crop_larger_than_an_image_pads_it_as_torchvision_does(tv, folder, kind):
    """The folder's images are 80-199 x 70-179: a CenterCrop larger than an image pads it with
    zeros (torchvision's center_crop), served natively, pixel for pixel torchvision's batches."""
    import torchvision.transforms as T
    import torchvision.transforms.v2 as v2
    from torchvision.datasets import ImageFolder

    transform = {
        "larger than every image": T.Compose([T.CenterCrop((190, 211)), T.PILToTensor()]),
        "larger than some, flipped": T.Compose([T.CenterCrop(121), T.RandomHorizontalFlip(1.0), T.PILToTensor()]),
        "v2 on a uint8 tensor": v2.Compose([v2.ToImage(), v2.CenterCrop((150, 99)), v2.ToPureTensor()]),
    }[kind]
    dataset = ImageFolder(str(folder), transform)
    loader = _served(dataset, batch_size=16, num_workers=0)
    assert isinstance(loader._loader.dataset, rt.NativeFolder)
    got, want = list(loader), list(torch.utils.data.DataLoader(dataset, batch_size=16))
    assert len(got) == len(want) == 3
    for (a, la), (b, lb) in zip(got, want):
        assert torch.equal(la, lb) and a.shape == b.shape and (b == 0).all(dim=1).any()
        assert torch.equal(a, b), float((a.int() - b.int()).abs().max())
    loader._stop()


def test_a_transform_without_random_ops_draws_nothing_from_torchs_rng(tv, folder):
    """torchvision's Resize, CenterCrop and conversions draw nothing: served with no workers,
    the script's torch RNG (the shuffle of later epochs, later draws) is the plain script's. A
    random op still draws its seed from it: the script's seed repeats the crops, another changes them."""
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder

    def run(make, transform, seed):
        dataset = ImageFolder(str(folder), transform)
        torch.manual_seed(seed)
        loader = make(dataset, batch_size=16, shuffle=True, num_workers=0)
        batches = [b for _ in range(2) for b in loader]
        return batches, torch.rand(3)

    # (a RandomCrop of the images' own size draws nothing either)
    eval_transform = T.Compose([T.Resize((40, 40)), T.CenterCrop(32), T.RandomCrop(32), T.ToTensor()])
    served, after = run(_served, eval_transform, 0)
    plain, plain_after = run(torch.utils.data.DataLoader, eval_transform, 0)
    assert [b[1].tolist() for b in served] == [b[1].tolist() for b in plain]
    assert torch.equal(after, plain_after)
    train = T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip(), T.ToTensor()])
    a, _ = run(_served, train, 1)
    b, _ = run(_served, train, 1)
    c, _ = run(_served, train, 2)
    assert all(torch.equal(x[0], y[0]) for x, y in zip(a, b))
    assert not torch.equal(a[0][0], c[0][0])
    # the run's summary says which of the two a plain run repeats
    from fastdata.run._decide import decide

    drawn = "random parameters drawn by fastdata (torchvision's distributions, not the plain run's numbers)"
    assert drawn in decide((ImageFolder(str(folder), train),), {"batch_size": 16})[1]
    assert "served natively" in (reason := decide((ImageFolder(str(folder), eval_transform),), {"batch_size": 16})[1])
    assert drawn not in reason


@pytest.mark.parametrize("workers", [0, 2])
def test_a_transform_changed_between_passes_is_followed(tv, folder, workers):
    """A script that swaps `dataset.transform` (progressive resizing, an eval phase) or changes
    an op's attribute between passes gets the transform it set: lowered again, or, where it
    cannot be lowered, torchvision's own samples."""
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder

    dataset = ImageFolder(str(folder), T.Compose([T.Resize((24, 24)), T.ToTensor()]))
    loader = _served(dataset, batch_size=16, num_workers=workers)
    assert isinstance(loader._loader.dataset, rt.NativeFolder)

    def layout():
        shapes = {(tuple(x.shape[1:]), x.dtype) for x, _ in loader}
        assert len(shapes) == 1, shapes
        return shapes.pop()

    assert layout() == ((3, 24, 24), torch.float32)
    dataset.transform = T.Compose([T.Resize((32, 32)), T.ToTensor()])
    assert layout() == ((3, 32, 32), torch.float32)
    dataset.transform.transforms[0].size = (40, 40)
    assert layout() == ((3, 40, 40), torch.float32)
    dataset.transform = T.Compose([T.Resize((16, 16)), T.PILToTensor()])
    assert layout() == ((3, 16, 16), torch.uint8)
    dataset.transform = T.Compose([T.Resize((16, 16)), T.ToTensor(), T.Lambda(lambda t: t * 0 + 0.5)])
    got = list(loader)
    want = list(torch.utils.data.DataLoader(dataset, batch_size=16))
    assert len(got) == len(want)
    for (a, la), (b, lb) in zip(got, want):
        assert torch.equal(a, b) and torch.equal(la, lb)
    dataset.transform = T.Compose([T.Resize((20, 20)), T.PILToTensor()])
    assert layout() == ((3, 20, 20), torch.uint8)
    loader._stop()


@pytest.mark.parametrize("workers", [0, 2])
def test_samples_changed_between_passes_are_followed(tv, folder, workers):
    """Workers read the samples' paths and targets from the listing made before they start
    (`NativeFolder.list_for_workers`): a script that reorders, filters or edits `samples` after
    making the loader (in place and at the same length too, or with an equal target of another
    type), or changes a worker's samples in worker_init_fn (another list, or the same one
    reversed in place), gets the batches torch gives it, each image with its own label."""
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder

    dataset = ImageFolder(str(folder), T.Compose([T.Resize((16, 16)), T.ToTensor()]))
    loader = _served(dataset, batch_size=8, num_workers=workers)

    def same(loader, **kw):
        want = list(torch.utils.data.DataLoader(dataset, batch_size=8, num_workers=workers, **kw))
        got = list(loader)
        assert len(got) == len(want)
        for (a, la), (b, lb) in zip(got, want):
            assert torch.equal(a, b) and la.dtype == lb.dtype and torch.equal(la, lb)
            assert torch.equal(_class_of(a, False), la.long())  # each image with its own label
        return [t for _, targets in got for t in targets.tolist()]

    assert same(loader) == dataset.targets
    dataset.samples = dataset.samples[::-1]
    assert same(loader) == [t for _, t in dataset.samples]
    dataset.samples[0], dataset.samples[-1] = dataset.samples[-1], dataset.samples[0]  # in place, same length
    assert same(loader)[0] == dataset.samples[0][1]
    dataset.samples[:] = [(path, float(t)) for path, t in dataset.samples]  # equal targets, of another type
    assert same(loader) == [t for _, t in dataset.samples]
    dataset.samples.pop()
    dataset.samples = [(path, int(t)) for path, t in dataset.samples if t != 2]
    assert same(loader) == [t for _, t in dataset.samples] and 2 not in same(loader)
    if workers:
        loader._stop()
        keep = dataset.samples

        def only_class_1(worker_id):
            torch.utils.data.get_worker_info().dataset.samples = [s for s in keep if s[1] == 1] * 10

        def reversed_in_place(worker_id):
            torch.utils.data.get_worker_info().dataset.samples.reverse()

        for init in (only_class_1, reversed_in_place):
            loader = _served(dataset, batch_size=8, num_workers=workers, worker_init_fn=init)
            got = same(loader, worker_init_fn=init)
            assert set(got) == {1} if init is only_class_1 else got[:8] == [t for _, t in keep[::-1][:8]]
            loader._stop()
    loader._stop()


def test_workers_read_a_folders_samples_without_copying_them(tv, folder, monkeypatch):
    """A worker that read each batch's paths and targets from the script's `samples` would
    write their reference counts and copy the pages they lie on into itself (PyTorch's issue
    13246): over an epoch, the whole list, in every worker. From the listing it copies none:
    200,000 samples, every 50th one fetched. The worker's Pss_Anon (read by a target_transform)
    from its first batch to its last grows by what it allocates anyway (1.7 MB here, as at 4,000
    samples); with the listing turned off (this test's control), by half the list's items' pages
    on top of that (a page shared by the two processes counted half in each, then whole)."""
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder

    if not os.path.exists("/proc/self/smaps_rollup"):
        pytest.skip("no /proc/self/smaps_rollup on this system")

    read = [0, 0.0]  # (targets seen, the last reading): read once a batch, as reading takes milliseconds

    def with_private_dirty(target):
        if read[0] % 200 == 0:
            with open("/proc/self/smaps_rollup") as f:
                read[1] = sum(int(line.split()[1]) for line in f if line.startswith("Pss_Anon:")) / 1024
        read[0] += 1
        return target, read[1]

    dataset = ImageFolder(str(folder), T.Compose([T.Resize((16, 16)), T.ToTensor()]),
                          target_transform=with_private_dirty)
    n = 200_000  # sample i: the folder's image (i // 4) % 12 of class i % 4 (distinct str objects)
    dataset.samples = [(f"{folder}/class{i % 4}/{(i // 4) % 12:03d}.jpg", i % 4) for i in range(n)]
    fetched = list(range(0, n, 50))
    grew = {}
    for kind in ("listing", "list"):
        if kind == "list":
            monkeypatch.setattr(rt.NativeFolder, "list_for_workers", lambda self: None)
        sampler = torch.utils.data.SubsetRandomSampler(fetched, generator=torch.Generator().manual_seed(0))
        loader = _served(dataset, batch_size=200, sampler=sampler, num_workers=1)
        dirty = []
        for images, (targets, mb) in loader:
            assert torch.equal(_class_of(images, False), targets)
            dirty.append(mb)
        loader._stop()
        grew[kind] = float(dirty[-1][0] - dirty[0][0])
    listing_mb = n * (56 + 49 + len(dataset.samples[0][0])) / 2**20  # the tuples and str objects
    assert grew["list"] > 0.3 * listing_mb, grew  # the control: this test can tell a copy
    assert grew["listing"] < grew["list"] / 4, grew


def test_workers_fastdata_added_go_back_when_the_transform_is_no_longer_served(tv, folder, capfd):
    """The script left num_workers at 0: fastdata's workers serve a transform it lowers and go
    back at the next iter() once the script swaps in one it does not lower, the script's own
    code, whose calls (and state, and draws) are then the main process's, as without fastdata."""
    import torchvision.transforms as T
    import torchvision.transforms.functional as F
    from torchvision.datasets import ImageFolder

    dataset = ImageFolder(str(folder), T.Compose([T.Resize((24, 24)), T.ToTensor()]))
    loader = _served(dataset, batch_size=16)
    assert loader.num_workers >= 1 and len(list(loader)) == len(loader)
    calls = []

    def counting(img):
        calls.append(img.size)
        return F.to_tensor(F.resize(img, [24, 24]))

    dataset.transform = counting
    got = list(loader)
    assert loader.num_workers == 0 and len(calls) == len(dataset)
    assert "goes on without the" in capfd.readouterr().err
    want = list(torch.utils.data.DataLoader(dataset, batch_size=16))
    assert len(got) == len(want)
    for (a, la), (b, lb) in zip(got, want):
        assert torch.equal(a, b) and torch.equal(la, lb)
    loader._stop()


def test_workers_fastdata_added_go_back_when_a_target_transform_comes(tv, folder, capfd):
    """A target_transform set after the loader was made (with fastdata's workers, as none was
    set then) is the script's code too: the workers go back at the next iter(), so that it runs,
    and keeps what it counts, in the main process, as without fastdata."""
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder

    dataset = ImageFolder(str(folder), T.Compose([T.Resize((24, 24)), T.ToTensor()]))
    loader = _served(dataset, batch_size=16)
    assert loader.num_workers >= 1 and len(list(loader)) == len(loader)
    seen = []
    dataset.target_transform = lambda t: seen.append(t) or t
    labels = [t for _, targets in loader for t in targets.tolist()]
    assert loader.num_workers == 0 and seen == labels == dataset.targets
    assert "its dataset has a target_transform now" in capfd.readouterr().err
    loader._stop()


def test_workers_fastdata_added_go_back_when_a_collate_fn_comes(tv, folder, capfd):
    """A collate_fn of the script's set after the loader was made (with fastdata's workers) is
    the script's code: the workers go back at the next iter(), and it runs in the main process,
    given the natively decoded samples."""
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder

    dataset = ImageFolder(str(folder), T.Compose([T.Resize((24, 24)), T.ToTensor()]))
    loader = _served(dataset, batch_size=16)
    assert loader.num_workers >= 1 and len(list(loader)) == len(loader)
    where = []
    loader.collate_fn = lambda batch: where.append(os.getpid()) or _stack_collate(batch)
    labels = [t for _, targets, _ in loader for t in targets.tolist()]
    assert loader.num_workers == 0 and set(where) == {os.getpid()} and labels == dataset.targets
    assert isinstance(loader._loader.dataset, rt.NativeFolder) and loader._loader.dataset.samples
    assert "it has a collate_fn of the script's now" in capfd.readouterr().err
    loader._stop()


def _run(args: list[str], tmp_path: Path, plain: bool = False) -> tuple[dict, str]:
    out = tmp_path / "out.json"
    command = [sys.executable, str(SCRIPTS / "train_torchvision.py"), args[0], str(out), *args[1:]]
    if not plain:
        command = [sys.executable, "-m", "fastdata", "run", "--", *command]
    # cwd apart from the checkout: its folder must not shadow the installed package
    proc = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=tmp_path,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stderr


@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind,workers", [("v1", 2), ("v2", 0), ("eval", 2), ("lambda", 2), ("v1", "default"),
                                          ("v1", "generator"), ("lambda", "generator")])
def test_unchanged_script_under_fastdata_run(tv, folder, tmp_path, kind, workers):
    """The script of tests/run_scripts, unchanged: served natively (the summary says so) or,
    with a Lambda, by the drop-in with the reason; labels match the images in both; the
    batches' layout is the plain script's. Left at the default count, its shuffled loader gets
    workers where the shuffle draws from the script's generator, not from torch's RNG."""
    got, err = _run([str(folder), kind, str(workers)], tmp_path)
    plain, _ = _run([str(folder), kind, str(workers)], tmp_path, plain=True)
    assert got["wrong"] == 0 and plain["wrong"] == 0
    assert got["seen"] == plain["seen"] == 2 * 48
    assert got["layout"] == plain["layout"]
    if kind == "lambda":
        assert "not served natively: Lambda has no faithful lowering" in err, err
    else:
        assert "served natively: ImageFolder with" in err, err
    if workers == "generator":  # workers only where fastdata makes the samples: then none changes
        assert plain["workers"] == 0 and (got["workers"] >= 1) == (kind != "lambda"), (got, err)
        assert ("num_workers='auto'" if kind != "lambda" else "num_workers=0 kept") in err, err
    elif workers == "default":
        assert got["workers"] == 0 and "num_workers=0 kept: shuffle=True without a generator" in err, err


LATE_SPAWN = """
import multiprocessing, sys
import torch, torchvision.transforms as T
from torchvision.datasets import ImageFolder
print("main module run as", __name__, flush=True)
dataset = ImageFolder(sys.argv[1], T.Compose([T.Resize((32, 32)), T.PILToTensor()]))
loader = torch.utils.data.DataLoader(dataset, batch_size=5)
multiprocessing.set_start_method("spawn"{force})  # after the loader: its workers would start so
labels = [y for _, ys in loader for y in ys.tolist()]
assert labels == dataset.targets, labels
print("workers", loader.num_workers, flush=True)
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("force", [False, True])
def test_a_start_method_set_after_the_loader_takes_back_the_workers_fastdata_gave(tv, folder, tmp_path, force):
    """A script that sets the start method to spawn after it made its loader (no main guard):
    workers fastdata gave would run its main module again, so the loader goes on without them,
    and says so; the script runs once, with its batches. Without force, setting it succeeds as
    it does under torch alone: deciding the workers looked at the start method without fixing it."""
    script = tmp_path / "late_spawn.py"
    script.write_text(LATE_SPAWN.format(force=", force=True" if force else ""))
    proc = subprocess.run([sys.executable, "-m", "fastdata", "run", "--", sys.executable, str(script), str(folder)],
                          capture_output=True, text=True, timeout=240, cwd=tmp_path,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == ["main module run as __main__", "workers 0"], proc.stdout
    assert "goes on without the" in proc.stderr and "num_workers='auto'" in proc.stderr, proc.stderr


PY314 = Path(__file__).resolve().parents[1] / "_py314"  # Python 3.14's start-method defaults (its sitecustomize)
UNGUARDED = """
import multiprocessing, sys
import torch, torchvision.transforms as T
from torchvision.datasets import ImageFolder
print("main module run as", __name__, flush=True)
dataset = ImageFolder(sys.argv[1], T.Compose([T.Resize((32, 32)), T.PILToTensor()]))
loader = torch.utils.data.DataLoader(dataset, batch_size=5)
labels, classes = [], []
for images, ys in loader:
    labels += ys.tolist()
    classes += ((images[:, 2].float().mean(dim=(1, 2)) - 55) / 50).round().long().tolist()
assert labels == dataset.targets == classes, (labels, classes)
print("workers", loader.num_workers > 0, multiprocessing.get_start_method(allow_none=True), flush=True)
"""


@pytest.mark.timeout(300)
def test_a_script_without_a_main_guard_gets_workers_where_forkserver_is_the_default(tv, folder, tmp_path):
    """Python 3.14 on Linux starts workers by forkserver by default (emulated here), which runs
    the main module again in each: the workers fastdata gives a script that asked for none fork,
    as on 3.13, so a script without a main guard runs once, with workers and its batches, and
    its default start method is still unset after (the script may set one)."""
    script = tmp_path / "unguarded.py"
    script.write_text(UNGUARDED)
    path = os.pathsep.join([str(PY314), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=path)
    proc = subprocess.run([sys.executable, "-m", "fastdata", "run", "--", sys.executable, str(script), str(folder)],
                          capture_output=True, text=True, timeout=240, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == ["main module run as __main__", "workers True None"], proc.stdout
    assert "num_workers='auto'" in proc.stderr, proc.stderr
