"""`fastdata run` serving an ImageFolder whose transform timm's `create_transform` made, as
DeiT's, ConvNeXt's and MAE's fine-tuning main.py make theirs (`fastdata.run._timm`).

It builds transforms with timm itself, so it runs where timm is installed: .ci/run installs it
in the virtualenv made as a user's (the registry's torch and torchvision) and runs this file there.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from _images import blue_folder

SCRIPTS = Path(__file__).resolve().parents[1] / "run_scripts"
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


@pytest.fixture(scope="module")
def timm():
    pytest.importorskip("torchvision")
    return pytest.importorskip("timm")


@pytest.fixture(scope="module")
def folder(tmp_path_factory, timm):
    return blue_folder(tmp_path_factory.mktemp("folder"))


def _served(dataset, **kwargs):
    from fastdata.run._hook import Served

    return Served(dataset, **kwargs)


def _class_of(images: torch.Tensor) -> torch.Tensor:
    blue = (images[:, 2] * STD[2] + MEAN[2]) * 255
    return ((blue.mean(dim=(1, 2)) - 55) / 50).round().long()


def test_create_transforms_are_lowered_as_the_torchvision_ops_they_run(timm):
    """timm's training and evaluation transforms read op by op: its crop as torchvision's
    RandomResizedCrop with its filter, MaybeToTensor as ToTensor, its RandAugment as fastdata's
    TimmAugment (drawing from the process's RNGs), its RandomErasing with its mode and count, the summary in timm's names."""
    from timm.data import create_transform

    import fastdata.transforms.ops as fd
    from fastdata.run._lowering import lower_transform

    lowering = lower_transform(create_transform(224, is_training=True))  # (bilinear, ColorJitter 0.4)
    assert lowering.names == "RandomResizedCropAndInterpolation, RandomHorizontalFlip, ColorJitter, MaybeToTensor, " \
                             "Normalize"
    crop, flip = lowering.geometry
    assert (type(crop), crop.size, crop.scale, crop.ratio) == (fd.RandomResizedCrop, (224, 224), (0.08, 1.0),
                                                               (3 / 4, 4 / 3))
    assert type(flip) is fd.RandomHorizontalFlip and lowering.resample == "bilinear"
    assert [type(op) for op in lowering.pixel_ops] == [fd.ColorJitter] and lowering.pixel_ops[0].brightness == (0.6, 1.4)
    assert lowering.steps[0] == ("to", None, "div") and lowering.steps[1][0] == "normalize"
    assert np.allclose(lowering.steps[1][1], MEAN) and np.allclose(lowering.steps[1][2], STD)

    deit = lower_transform(create_transform(224, is_training=True, color_jitter=0.3, interpolation="bicubic",
                                            auto_augment="rand-m9-mstd0.5-inc1", re_prob=0.25, re_mode="pixel"))
    assert deit.resample == "bicubic" and deit.script_ops == () and deit.own_draws == ("RandAugment",) and deit.random
    assert [type(op).__name__ for op in deit.pixel_ops] == ["TimmAugment"]
    (erase,) = deit.erasing
    assert (erase.p, erase.count, erase.value, erase.per_channel, erase.at) == (0.25, (1, 1), None, False, 2)
    assert erase.scale == (0.02, 1 / 3) and erase.log_ratio == (math.log(0.3), math.log(1 / 0.3))
    rand = lower_transform(create_transform(224, is_training=True, re_prob=0.5, re_mode="rand", re_count=3))
    assert [(e.count, e.value, e.per_channel) for e in rand.erasing] == [((1, 3), None, True)]
    const = lower_transform(create_transform(224, is_training=True, re_prob=0.5))
    assert [(e.count, e.value) for e in const.erasing] == [((1, 1), (0.0,))]

    uint8 = lower_transform(create_transform(224, is_training=True, use_prefetcher=True))  # (MaybePILToTensor)
    assert uint8.steps == () and uint8.dtype == torch.uint8

    evaluation = lower_transform(create_transform(224, is_training=False, interpolation="bicubic"))  # crop_pct 0.875
    assert [type(op) for op in evaluation.geometry] == [fd.Resize, fd.CenterCrop]
    assert evaluation.geometry[0].size == 256 and evaluation.resample == "bicubic" and not evaluation.random


def _noise(rng, h, w):
    return rng.integers(0, 256, (h, w, 3), dtype=np.uint8)


def _outcome(call, img):
    """What a call gives: its pixels, or its error's type and message; then Python's RNG state."""
    import random

    try:
        out = np.asarray(call(img))
    except Exception as e:
        out = f"{type(e).__name__}: {e}"
    return out, random.getstate()


def _same_outcome(a, b) -> bool:
    (x, state_x), (y, state_y) = a, b
    if isinstance(x, str) or isinstance(y, str):
        return x == y and state_x == state_y
    return x.shape == y.shape and np.array_equal(x, y) and state_x == state_y


def test_timms_pixel_functions_are_timms(timm):
    """fastdata's twin of each of timm.data.auto_augment's pixel functions, on an array, against
    timm's own on the PIL image: over images of 1 to 40 px, each function's arguments through
    its levels at magnitudes 0 to 10 (both signs), drawn and fixed filters, timm's fills and none:
    the same pixels (or the same error: Pillow 13 refuses timm's posterize to 0 bits), the same
    draws from Python's RNG; on a PIL image too."""
    import random

    import timm.data.auto_augment as aa
    from PIL import Image

    from fastdata.run import _timm

    rng = np.random.default_rng(0)
    names = {fn.__name__: name for name, fn in aa.NAME_TO_OP.items()}  # (a function: one of its op names)
    assert set(_timm._FUNCTIONS) <= set(names)
    kwargs_cases = [{"fillcolor": (128, 128, 128), "resample": (Image.BILINEAR, Image.BICUBIC)},
                    {"fillcolor": (124, 116, 104), "resample": Image.BICUBIC},
                    {"fillcolor": (3, 250, 77), "resample": Image.BILINEAR}, {"resample": Image.NEAREST}]
    checked = 0
    for name, ours in _timm._FUNCTIONS.items():
        theirs, level = getattr(aa, name), aa.LEVEL_TO_ARG[names[name]]
        for k in range(12):
            pixels = _noise(rng, int(rng.integers(1, 41)), int(rng.integers(1, 41)))
            magnitude = float(rng.uniform(0, 10)) if k > 1 else 10.0 * k
            seed = int(rng.integers(1 << 30))
            random.seed(seed)
            args = level(magnitude, {"translate_const": 100}) if level else ()
            kwargs = kwargs_cases[k % len(kwargs_cases)]
            state = random.getstate()
            want = _outcome(lambda img: theirs(img, *args, **kwargs), Image.fromarray(pixels))
            for form in (pixels, Image.fromarray(pixels)):
                random.setstate(state)
                got = _outcome(lambda img: ours(img, *args, **kwargs), form)
                assert _same_outcome(got, want), (name, args, kwargs, pixels.shape)
                checked += 1
    assert checked == 2 * 12 * len(_timm._FUNCTIONS)


@pytest.mark.parametrize("policy", ["rand-m9-mstd0.5-inc1", "rand-m7-n3-mstd101", "rand-m9-mstd0.5-inc1-mmax12",
                                    "original", "v0r", "3a"])
def test_timms_auto_augments_run_as_timm_draws_them(timm, policy, monkeypatch):
    """timm's RandAugment (DeiT's, uniform magnitudes, past 10, the 3-Augment's weighted choice
    with its blur, computed natively, and desaturation) and AutoAugment (its original and v0r
    policies), lowered: with the same seeds of Python's and NumPy's RNGs, each image the one
    timm's own op gives (or its error) and the RNGs left where timm's leave them, over 40 images."""
    import random

    from PIL import Image
    from timm.data.auto_augment import auto_augment_transform, rand_augment_transform

    from fastdata.run import _blur
    from fastdata.run._pixels import pixel_op
    from fastdata.run._timm import TimmAugment

    native_blur = _blur._agrees() and not _blur._simd()  # (its probe first, uncounted; stock Pillow's blur only)
    blurs = []
    blurred = _blur.blurred
    monkeypatch.setattr(_blur, "blurred", lambda img, f: blurs.append(f) or blurred(img, f))

    hparams = {"translate_const": 100, "img_mean": (124, 116, 104)}
    if policy == "3a":
        op = rand_augment_transform("rand-m10-n1-t3a", hparams)  # (weighted: its choice without replacement)
    elif policy.startswith("rand"):
        op = rand_augment_transform(policy, hparams)
    else:
        op = auto_augment_transform(policy, hparams)
    lowered = pixel_op(op, "pil")
    assert type(lowered) is TimmAugment and lowered.call is not op
    rng = np.random.default_rng(1)
    for k in range(40):
        pixels = _noise(rng, int(rng.integers(8, 48)), int(rng.integers(8, 48)))
        outcomes = []
        for call, img in ((op, Image.fromarray(pixels)), (lambda a: lowered.on_pillow(a, {}), pixels)):
            random.seed(k)
            np.random.seed(k)
            outcomes.append((_outcome(call, img), np.random.get_state()[1].copy()))
        (got, got_np), (want, want_np) = outcomes[1], outcomes[0]
        assert _same_outcome(got, want) and np.array_equal(got_np, want_np), (policy, k)
    assert (len(blurs) > 3) == (policy == "3a" and native_blur), len(blurs)  # (its blurs: the native one's)


def test_timms_ops_fastdata_does_not_twin_are_timms_own_calls(timm, monkeypatch):
    """An AugmentOp whose twin was not found the same (a sabotaged twin) is timm's own function
    on the PIL image; a RandAugment holding a function of the script's, and AugMixAugment, which
    mixes PIL images itself, stay the script's own ops."""
    import random

    from PIL import Image
    from timm.data.auto_augment import augment_and_mix_transform, rand_augment_transform

    from fastdata.run import _timm
    from fastdata.run._pixels import ScriptOp, pixel_op

    def darker(img, *args, **kwargs):
        return img.point(lambda v: v // 2)

    op = rand_augment_transform("rand-m9-n2-p1.0", {"translate_const": 100})
    monkeypatch.setitem(_timm._FUNCTIONS, "shear_x", lambda img, *a, **kw: np.zeros_like(img))
    monkeypatch.setattr(_timm, "_SAME", {})
    lowered = pixel_op(op, "pil")
    twins = {one.name: one.aug_fn for one in lowered.call.ops}
    assert twins["ShearX"].func is _timm._on_image and twins["ShearX"].args[0].__name__ == "shear_x"
    assert twins["Equalize"] is _timm._FUNCTIONS["equalize"] and not _timm._SAME["shear_x"]
    pixels = _noise(np.random.default_rng(2), 24, 30)
    for k in range(20):
        outcomes = []
        for call, img in ((op, Image.fromarray(pixels)), (lambda a: lowered.on_pillow(a, {}), pixels)):
            random.seed(k)
            np.random.seed(k)
            outcomes.append(_outcome(call, img))
        assert _same_outcome(*outcomes), k
    assert type(pixel_op(augment_and_mix_transform("augmix-m3", {}), "pil")) is ScriptOp
    own = rand_augment_transform("rand-m9-n2", {"translate_const": 100})
    own.ops[0].aug_fn = darker  # (AutoContrast's slot: a function of the script's)
    assert type(pixel_op(own, "pil")) is ScriptOp


@pytest.mark.filterwarnings("ignore:range should be of kind")
def test_what_fastdata_does_not_lower_of_timms_says_why(timm):
    import torchvision.transforms as T
    from timm.data.random_erasing import RandomErasing
    from timm.data.transforms import (MaybePILToTensor, MaybeToTensor, RandomResizedCropAndInterpolation,
                                      ResizeKeepRatio, ToNumpy)

    from fastdata.run._lowering import Unlowerable, lower_transform

    cases = [
        (T.Compose([MaybePILToTensor(), RandomResizedCropAndInterpolation(64, interpolation="random")]),
         "RandomResizedCropAndInterpolation drawing its filter from bilinear, bicubic on a tensor: not lowered"),
        (T.Compose([RandomResizedCropAndInterpolation(64, interpolation="random"), T.Resize(32), MaybeToTensor()]),
         "geometric ops with different interpolations (bilinear, bilinear or bicubic): not lowered"),
        (T.Compose([T.Resize(64), ToNumpy()]), "timm's ToNumpy has no faithful lowering"),
        (T.Compose([ResizeKeepRatio(64), MaybeToTensor()]), "timm's ResizeKeepRatio has no faithful lowering"),
        (T.Compose([T.Resize(64), MaybeToTensor(), RandomErasing(device="cuda")]), "on device 'cuda'"),
        (T.Compose([T.Resize(64), MaybePILToTensor(), RandomErasing(device="cpu")]),
         "of a uint8 tensor: timm erases the normalized float image"),
        (T.Compose([T.Resize(64), MaybeToTensor(), RandomErasing(max_count=17, device="cpu")]),
         "max_count 17: fastdata lowers at most 16"),
        (T.Compose([T.Resize(64), MaybeToTensor(), MaybeToTensor()]), "ToTensor of a tensor"),
    ]
    for transform, words in cases:
        with pytest.raises(Unlowerable) as e:
            lower_transform(transform)
        assert words in str(e.value) and "\n" not in str(e.value), (words, str(e.value))


def test_what_fastdata_does_not_serve_of_timms_datasets_says_why(timm, folder):
    """timm's ImageDataset of a folder is served, its reader's list read as the samples, unless
    its samples are not RGB images (load_bytes, another mode): then the reason, in one line."""
    from timm.data import create_dataset, create_transform

    from fastdata.run._folders import listed, lower

    transform = create_transform(48, is_training=True, use_prefetcher=True)
    plain = create_dataset("", root=str(folder), split="train")
    plain.transform = transform
    lowering, why = lower(plain)
    assert lowering is not None and why == "" and listed(plain) is plain.reader.samples
    for kwargs, words in [({"load_bytes": True}, "ImageDataset with load_bytes=True: its samples are the files' bytes"),
                          ({"input_img_mode": "L"}, "ImageDataset with input_img_mode='L': fastdata decodes to RGB")]:
        dataset = create_dataset("", root=str(folder), split="train", **kwargs)
        dataset.transform = transform
        assert lower(dataset) == (None, words)


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
def test_timms_crop_is_torchvisions_resized_crop(timm, interpolation):
    """For the box it draws, timm's RandomResizedCropAndInterpolation gives torchvision's
    RandomResizedCrop's pixels for that box, bit for bit: the op fastdata lowers it as."""
    import torchvision.transforms as T
    from PIL import Image
    from timm.data.transforms import RandomResizedCropAndInterpolation

    from fastdata.run._timm import translated

    timms = RandomResizedCropAndInterpolation((40, 56), scale=(0.2, 1.0), interpolation=interpolation)
    (tv,) = translated(timms)
    assert type(tv) is T.RandomResizedCrop and tv.interpolation.value == interpolation
    assert (tuple(tv.size), tv.scale, tv.ratio) == ((40, 56), (0.2, 1.0), (3 / 4, 4 / 3))
    rng = np.random.default_rng(3)
    img = Image.fromarray(rng.integers(0, 256, (90, 130, 3), dtype=np.uint8))
    for box in [(0, 0, 90, 130), (7, 11, 33, 61), (50, 3, 40, 127)]:
        timms.get_params = tv.get_params = lambda *a, box=box: box  # (the instance's, not the class's)
        assert np.array_equal(np.asarray(timms(img)), np.asarray(tv(img))), box


def test_timms_random_interpolation_draws_bilinear_or_bicubic_per_image(timm, tmp_path):
    """interpolation='random' (timm's train.py default): each image resized bilinear or bicubic,
    drawn per image and epoch, each about half the time, its pixels torchvision's resize with
    the filter drawn. Square noise images, whose two resizes differ everywhere, cropped whole
    (scale 1, ratio 1: the crop's one box) and shrunk by less than 2 (where fastdata's pixels
    are torchvision's bit for bit: docs/guide.md)."""
    import torchvision.transforms as T
    import torchvision.transforms.functional as F
    from PIL import Image
    from timm.data import create_dataset
    from timm.data.transforms import MaybePILToTensor, RandomResizedCropAndInterpolation

    rng = np.random.default_rng(5)
    for c in range(2):
        (tmp_path / f"c{c}").mkdir()
        for i in range(24):
            side = int(rng.integers(41, 80))
            noise = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
            Image.fromarray(noise).save(tmp_path / f"c{c}" / f"{i:02d}.jpg", quality=95)
    dataset = create_dataset("", root=str(tmp_path), split="train")
    dataset.transform = T.Compose([RandomResizedCropAndInterpolation(40, scale=(1.0, 1.0), ratio=(1.0, 1.0),
                                                                     interpolation="random"), MaybePILToTensor()])
    want = {}
    for k, (path, _) in enumerate(dataset.reader.samples):
        with Image.open(path) as img:
            img = img.convert("RGB")
            want[k] = {mode: F.pil_to_tensor(F.resize(img, [40, 40], getattr(T.InterpolationMode, mode.upper())))
                       for mode in ("bilinear", "bicubic")}
    loader = _served(dataset, batch_size=8, num_workers=0)
    drawn = []
    for epoch in range(2):
        k = 0
        for images, labels in loader:
            assert images.dtype == torch.uint8 and images.shape[1:] == (3, 40, 40)
            for image, label in zip(images, labels.tolist()):
                assert label == k // 24
                same = [mode for mode, ref in want[k].items() if torch.equal(image, ref)]
                assert len(same) == 1, (k, epoch, [int((image.int() - ref).abs().max()) for ref in want[k].values()])
                drawn.append(same[0])
                k += 1
    loader._stop()
    bicubic = drawn.count("bicubic")
    assert 25 <= bicubic <= 71, bicubic  # (96 draws of p = 1/2)
    assert drawn[:48] != drawn[48:]  # (drawn again each epoch)


class _Drawn:
    """Python's `random` as timm's `_erase` calls it, answering from fastdata's uniforms for
    one sample (`u`, laid out as `_erasing.timm_rows` reads them): the p test, the count (none
    drawn where it is fixed), then per rectangle its attempts' (area, log-aspect) pairs and its
    top-left."""

    def __init__(self, u: np.ndarray, fixed_count: bool) -> None:
        from fastdata.run._erasing import _ATTEMPTS, _DRAWS

        self.u, self.width, self.attempts = u, _DRAWS - 1, _ATTEMPTS
        self.counted, self.slot, self.k, self.placed = fixed_count, 0, 0, 0

    def random(self) -> float:
        return float(self.u[0])

    def randint(self, a: int, b: int) -> int:
        if not self.counted:
            self.counted, at = True, 1
        else:
            at = 2 + self.slot * self.width + 2 * self.attempts + self.placed
            self.placed += 1
            if self.placed == 2:
                self.slot, self.k, self.placed = self.slot + 1, 0, 0
        return a + min(int(self.u[at] * (b - a + 1)), b - a)

    def uniform(self, a: float, b: float) -> float:
        if self.k == 2 * self.attempts:  # every attempt failed: timm goes on with its next rectangle
            self.slot, self.k = self.slot + 1, 0
        value = a + (b - a) * float(self.u[2 + self.slot * self.width + self.k])
        self.k += 1
        return value


@pytest.mark.parametrize("mode,counts", [("const", (1, 1)), ("rand", (1, 3)), ("pixel", (2, 2)), ("const", (1, 4))])
def test_timms_erasing_rectangles_are_drawn_as_timm_draws_them(timm, monkeypatch, mode, counts):
    """For the same uniforms, the rectangles fastdata draws are the ones timm's own `_erase`
    writes, in its order: timm's op run with Python's RNG answering from those uniforms, each
    rectangle it writes filled with its number, against fastdata's rows written the same way."""
    import timm.data.random_erasing as tre

    from fastdata.run._erasing import lowered_timm, timm_rows

    op = tre.RandomErasing(0.7, min_area=0.05, max_area=0.6, mode=mode, min_count=counts[0], max_count=counts[1],
                           device="cpu")
    erase = lowered_timm(op, "float", 2)
    n, h, w = 300, 23, 37
    u = np.random.default_rng(1).random((n, erase.draws))
    u[:5, 2:2 + 20] = 0.999  # (five samples whose first rectangle fits in no attempt)
    rows = timm_rows(erase, u, h, w)
    filled = []
    monkeypatch.setattr(tre, "_get_pixels", lambda per_pixel, rand_color, size, dtype, device: torch.full(
        (size[0], 1, 1), float(len(filled.append(size) or filled))))
    erased = 0
    for k in range(n):
        filled.clear()
        monkeypatch.setattr(tre, "random", _Drawn(u[k], counts[0] == counts[1]))
        timms = torch.zeros(3, h, w)
        op._erase(timms, 3, h, w, timms.dtype)
        ours = torch.zeros(3, h, w)
        mine = rows[rows[:, 0] == k]
        for number, (_, i, j, hh, ww) in enumerate(mine.tolist(), 1):
            ours[:, i:i + hh, j:j + ww] = number
        assert len(mine) == sum(1 for size in filled if size[1] and size[2]), k
        assert torch.equal(timms, ours), k
        erased += len(mine) > 0
    assert 0.5 * n < erased < 0.85 * n  # (p = 0.7)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_timm_transform_is_served_natively_with_its_labels(timm, folder, workers):
    """timm's training transform (bicubic crop, flip, MaybeToTensor, Normalize) served natively:
    torchvision's batch layout, each image's class read back from its pixels, every sample once
    an epoch; DeiT's (timm's RandAugment and RandomErasing after it) served natively too, its
    RandAugment keeping the script's worker count (it draws from the process's RNGs)."""
    from timm.data import create_transform
    from torchvision.datasets import ImageFolder

    from fastdata.run import _torchvision as rt
    from fastdata.run._decide import decide

    dataset = ImageFolder(str(folder), create_transform(48, is_training=True, color_jitter=None,
                                                        interpolation="bicubic"))
    loader = _served(dataset, batch_size=10, shuffle=True, num_workers=workers)
    assert isinstance(loader._loader.dataset, rt.NativeFolder)
    for epoch in range(2):
        seen = []
        for images, labels in loader:
            assert images.dtype == torch.float32 and images.shape[1:] == (3, 48, 48) and images.is_contiguous()
            assert torch.equal(_class_of(images), labels)
            seen += labels.tolist()
        assert sorted(seen) == sorted(dataset.targets)
    loader._stop()

    # DeiT's but for its magnitude's spread (mstd0.5): at magnitude 10 timm's posterize keeps 0 bits,
    # which Pillow 13 refuses (a ValueError in about 1 image of 650, in the plain run too)
    deit = ImageFolder(str(folder), create_transform(48, is_training=True, color_jitter=0.3, interpolation="bicubic",
                                                     auto_augment="rand-m9-inc1", re_prob=0.25, re_mode="pixel"))
    loader = _served(deit, batch_size=10, shuffle=True, num_workers=workers)
    assert isinstance(loader._loader.dataset, rt.NativeFolder)
    served, reason, added, _ = decide((deit,), {"batch_size": 10})  # (a script that left num_workers at 0)
    assert served and added is None, reason
    assert "timm's RandAugment, which draws from Python's and NumPy's RNGs (in workers" in reason, reason
    seen = []
    for images, labels in loader:
        assert images.dtype == torch.float32 and images.shape[1:] == (3, 48, 48)
        seen += labels.tolist()
    assert sorted(seen) == sorted(deit.targets)
    loader._stop()


@pytest.mark.parametrize("kwargs", [{}, {"interpolation": "bicubic", "crop_pct": 0.95}, {"crop_mode": "squash"}])
def test_timms_eval_transform_is_served_as_timms_pixels(timm, folder, kwargs):
    """timm's evaluation transform (its Resize of the shorter side or of both, then CenterCrop,
    MaybeToTensor, Normalize) on its ImageDataset, served natively: the native decoder makes the
    window of the whole image's resize, so each batch is the plain run's, bit for bit."""
    from timm.data import create_dataset, create_transform

    from fastdata.run import _torchvision as rt

    dataset = create_dataset("", root=str(folder), split="validation")
    dataset.transform = create_transform(48, is_training=False, **kwargs)
    loader = _served(dataset, batch_size=8, shuffle=False, num_workers=0)
    assert isinstance(loader._loader.dataset, rt.NativeFolder)
    done = 0
    for images, labels in loader:
        want = torch.stack([dataset[done + k][0] for k in range(len(labels))])
        assert torch.equal(images, want), (kwargs, done, float((images - want).abs().max()))
        done += len(labels)
    assert done == len(dataset)
    loader._stop()


@pytest.mark.parametrize("workers", [0, 2])
def test_timms_image_dataset_is_served_natively_with_its_labels(timm, folder, workers):
    """timm's train.py data path: create_dataset's ImageDataset of the folder with the transform
    create_loader makes (interpolation 'random', no colour jitter so that the class stays
    readable, uint8 for its prefetcher), its fast_collate and worker_init_fn: served natively,
    uint8 batches as timm's, each image's class read back from its pixels, every sample once
    an epoch."""
    from functools import partial

    from timm.data import create_dataset, create_transform
    from timm.data.loader import _worker_init, fast_collate

    from fastdata.run import _torchvision as rt

    dataset = create_dataset("", root=str(folder), split="train")
    dataset.transform = create_transform(48, is_training=True, interpolation="random", color_jitter=None,
                                         use_prefetcher=True)
    loader = _served(dataset, batch_size=12, shuffle=True, drop_last=True, num_workers=workers, collate_fn=fast_collate,
                     worker_init_fn=partial(_worker_init, worker_seeding="all"), persistent_workers=workers > 0)
    assert isinstance(loader._loader.dataset, rt.NativeFolder)
    targets = [target for _, target in dataset.reader.samples]
    for epoch in range(2):
        seen = []
        for images, labels in loader:
            assert images.dtype == torch.uint8 and images.shape == (12, 3, 48, 48) and labels.dtype == torch.int64
            guessed = ((images[:, 2].float().mean(dim=(1, 2)) - 55) / 50).round().long()
            assert torch.equal(guessed, labels)
            seen += labels.tolist()
        assert sorted(seen) == sorted(targets)
    loader._stop()


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("mode", ["const", "rand", "pixel"])
def test_timms_erasing_served_natively(timm, folder, mode, workers):
    """timm's RandomErasing after Normalize, served natively: each image is the one laid out
    without it (a Resize to a fixed size: Pillow's pixels, torchvision's batch bit for bit) but
    inside the rectangles it erased: zeros ('const'), one value per channel ('rand'), noise
    ('pixel'); one or two of them, each under the image's sides."""
    import torchvision.transforms as T
    from timm.data.random_erasing import RandomErasing
    from timm.data.transforms import MaybeToTensor
    from torchvision.datasets import ImageFolder

    def transform(p):
        return T.Compose([T.Resize((40, 48)), MaybeToTensor(), T.Normalize(MEAN, STD),
                          RandomErasing(p, mode=mode, max_count=2, device="cpu")])

    loader = _served(ImageFolder(str(folder), transform(1.0)), batch_size=10, num_workers=workers)
    want = list(torch.utils.data.DataLoader(ImageFolder(str(folder), transform(0.0)), batch_size=10))
    batches = list(loader)
    loader._stop()
    assert len(batches) == len(want)
    for (images, labels), (ref, ref_labels) in zip(batches, want):
        assert torch.equal(labels, ref_labels) and images.shape == ref.shape
        for k in range(len(images)):
            changed = (images[k] != ref[k]).any(0)
            ys, xs = torch.nonzero(changed, as_tuple=True)
            assert len(ys), f"sample {k} not erased"
            assert int(ys.max() - ys.min()) < 40 or int(xs.max() - xs.min()) < 48
            inside = images[k][:, changed]
            if mode == "const":
                assert torch.equal(inside, torch.zeros_like(inside))
            elif mode == "rand":  # (one value a channel in a rectangle; a second rectangle may hold others)
                assert all(len(torch.unique(row)) <= 2 for row in inside)
            else:
                assert len(torch.unique(inside)) > inside.numel() // 2


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind,summary", [
    ("timm", "served natively: ImageFolder with RandomResizedCropAndInterpolation, RandomHorizontalFlip, "
             "MaybeToTensor, Normalize"),
    ("timm_train", "served natively: ImageDataset with RandomResizedCropAndInterpolation, RandomHorizontalFlip, "
                   "MaybePILToTensor decoded by fastdata, natively collated as the script's collate_fn collates "
                   "(fast_collate)")])
def test_an_unchanged_timm_script_under_fastdata_run(timm, folder, tmp_path, kind, summary):
    """tests/run_scripts/train_torchvision.py with timm's transform on an ImageFolder, and with
    timm's train.py data path (its dataset, loader and prefetcher), under `fastdata run`: served
    natively (the summary says so), labels matching the images, the plain run's layout."""
    runs = {}
    for plain in (False, True):
        out = tmp_path / f"{plain}.json"
        command = [sys.executable, str(SCRIPTS / "train_torchvision.py"), str(folder), str(out), kind, "2"]
        if not plain:
            command = [sys.executable, "-m", "fastdata", "run", "--", *command]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=tmp_path,
                              env=dict(os.environ, OMP_NUM_THREADS="1"))
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[plain] = json.loads(out.read_text()), proc.stderr
    (got, err), (want, _) = runs[False], runs[True]
    assert got["wrong"] == 0 and want["wrong"] == 0 and got["seen"] == want["seen"] == 2 * 48
    assert got["layout"] == want["layout"]
    assert summary in err, err


def _mixup(timm, mode, **kwargs):
    from timm.data import FastCollateMixup

    return FastCollateMixup(**{"mixup_alpha": 0.8, "cutmix_alpha": 1.0, "prob": 0.9, "switch_prob": 0.5,
                               "mode": mode, "label_smoothing": 0.1, "num_classes": 4, **kwargs})


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("mode", ["batch", "pair", "elem"])
def test_timms_fast_collate_mixup_mixes_as_its_own_call(timm, mode, native, monkeypatch):
    """fastdata's FastCollateMixup (`_timm_collate._collated`, natively and without the extension)
    on a slot's NHWC noise gives timm's own call's images and targets byte for byte, for the
    same NumPy draws: blends, boxes, a box per sample ('elem'), the alphas and minmax set apart;
    its check of timm (`_agrees`) passes and leaves NumPy's RNG as it was."""
    from fastdata.run import _timm_collate as tm

    if not native:
        monkeypatch.setattr(tm, "_ext", None)
    rng = np.random.default_rng(1)
    pixels = torch.from_numpy(rng.integers(0, 256, (16, 20, 24, 3), dtype=np.uint8))
    targets = [int(t) for t in rng.integers(0, 4, 16)]
    kinds = {}
    for kwargs in ({}, {"cutmix_alpha": 0.0}, {"mixup_alpha": 0.0}, {"cutmix_minmax": (0.2, 0.8)},
                   {"correct_lam": False, "prob": 1.0}):
        op = _mixup(timm, mode, **kwargs)
        np.random.seed(5)
        state = np.random.get_state()
        assert tm._agrees(op)
        assert np.random.get_state()[1].tolist() == state[1].tolist()
        for seed in range(25):
            np.random.seed(seed)
            want_images, want_targets = op([(x.permute(2, 0, 1).clone(), t) for x, t in zip(pixels, targets)])
            np.random.seed(seed)
            images = pixels.clone()
            _, got_targets = tm._collated(op, images.permute(0, 3, 1, 2), targets)
            assert torch.equal(images.permute(0, 3, 1, 2), want_images), (kwargs, seed)
            assert got_targets.dtype == want_targets.dtype and torch.equal(got_targets, want_targets), (kwargs, seed)
            changed = (want_images != pixels.permute(0, 3, 1, 2)).flatten(1).any(1)
            kinds.update(dict.fromkeys(changed.tolist(), True))
    assert kinds == {True: True, False: True}  # (samples mixed, and samples left as they were)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("mode", ["batch", "elem", "half", "fast_collate"])
def test_timms_collate_fns_are_served_as_timms_own_loader(timm, folder, mode, workers, monkeypatch):
    """A loader with timm's FastCollateMixup as its collate_fn (train.py's with --mixup and
    --cutmix), or its fast_collate (train.py's default), on a fixed-size transform that ends in
    timm's MaybePILToTensor: served natively, collated (and mixed) where the batches are fetched,
    each batch and its targets those of torch's loader with the same seeds, byte for byte, as a
    tuple ('half': the op's own call on fastdata's samples); the run's summary says so."""
    import torchvision.transforms as T
    from timm.data.loader import fast_collate
    from timm.data.transforms import MaybePILToTensor
    from torchvision.datasets import ImageFolder

    from fastdata.run import _decide, _timm_collate as tc

    def seeded(_):
        np.random.seed(torch.initial_seed() % 2**32)

    def collate_fn():
        return fast_collate if mode == "fast_collate" else _mixup(timm, mode)

    mixed = []
    mix = tc._mix
    monkeypatch.setattr(tc, "_mix", lambda images, rows: (mixed.append(tuple(images.shape)), mix(images, rows)))
    dataset = ImageFolder(str(folder), T.Compose([T.Resize((40, 48)), MaybePILToTensor()]))
    loaders = [cls(dataset, batch_size=10, shuffle=True, num_workers=workers, collate_fn=collate_fn(),
                   worker_init_fn=seeded, generator=torch.Generator().manual_seed(3))
               for cls in (_served, torch.utils.data.DataLoader)]
    said = ("collated as the script's collate_fn collates (fast_collate)" if mode == "fast_collate" else
            "collated and mixed as the script's collate_fn mixes (FastCollateMixup)")
    assert said in _decide.decide((dataset,), {"collate_fn": collate_fn(), "batch_size": 10, "num_workers": workers})[1]
    for epoch in range(2):
        np.random.seed(epoch)
        got = list(loaders[0])
        np.random.seed(epoch)
        want = list(loaders[1])
        assert len(got) == len(want) == 5
        for (images, target), (ref, ref_target), batch in zip(got, want, got):
            assert type(batch) is tuple and type(images) is torch.Tensor and images.dtype == torch.uint8
            assert torch.equal(images, ref) and target.dtype == ref_target.dtype and torch.equal(target, ref_target)
    assert isinstance(loaders[0]._loader.collate_fn, tc.TimmCollate)
    if workers == 0:
        batches = [(10, 3, 40, 48)] * 4 + [(8, 3, 40, 48)]  # (48 images; the check of timm's call mixes 8 of 6x5)
        native = mode in ("batch", "elem")
        assert [shape for shape in mixed if shape[2:] == (40, 48)] == (batches * 2 if native else [])
    loaders[0]._stop()
