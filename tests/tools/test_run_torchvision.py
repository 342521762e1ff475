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

from fastdata.run import _torchvision as rt
from fastdata._ext import native
from fastdata.errors import DataError

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
        rt._apply_steps(expected[k], images[k], steps)
    labels = torch.arange(5)
    got = rt.Finish(lowering, slots=2, pin=False, forks=False)([images, labels])
    assert got[1] is labels
    assert got[0].dtype == lowering.dtype and got[0].shape == (5, 3, 7, 256) and got[0].is_contiguous()
    assert torch.equal(got[0], expected)
    if name == "ToTensor + Normalize":  # torchvision's arithmetic, written out
        ref = (images.permute(0, 3, 1, 2).float().div(255) - torch.tensor(MEAN).view(1, 3, 1, 1)) \
            / torch.tensor(STD).view(1, 3, 1, 1)
        assert torch.equal(got[0], ref)


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


def test_not_a_torchvision_dataset_is_left_alone():
    assert rt.lower([1, 2, 3]) == (None, "")


# ----------------------------------------------------------------- with torchvision

@pytest.fixture(scope="module")
def tv():
    return pytest.importorskip("torchvision")


def make_folder(root: Path, per_class: int = 12, classes: int = 4, seed: int = 0) -> Path:
    """JPEGs of varied sizes; class c has its blue channel at 40 + 50c (plus noise up to 30)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for c in range(classes):
        (root / f"class{c}").mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            w, h = int(rng.integers(80, 200)), int(rng.integers(70, 180))
            a = np.zeros((h, w, 3), np.uint8)
            a[..., 0] = (np.arange(w) * 255 // w)[None]
            a[..., 1] = (np.arange(h) * 255 // h)[:, None]
            a[..., 2] = 40 + 50 * c
            a = (a.astype(int) + rng.integers(0, 30, a.shape)).clip(0, 255).astype(np.uint8)
            Image.fromarray(a).save(root / f"class{c}" / f"{i:03d}.jpg", quality=92)
    return root


@pytest.fixture(scope="module")
def folder(tmp_path_factory, tv):
    return make_folder(tmp_path_factory.mktemp("folder"))


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
        ("an op with no lowering", lambda r: (ImageFolder(r, T.Compose([T.RandomRotation(10), *train])), {}),
         "RandomRotation has no faithful lowering"),
        ("a collate_fn of the script's", lambda r: (ImageFolder(r, T.Compose(train)), {"collate_fn": lambda b: b}),
         "the script's collate_fn"),
        ("a subclass with its own __getitem__", lambda r: (OwnGetitem(r, T.Compose(train)), {}),
         "OwnGetitem overrides __getitem__"),
        ("no transform", lambda r: (ImageFolder(r), {}), "no transform"),
        ("a transform ending in PIL images", lambda r: (ImageFolder(r, T.RandomResizedCrop(32)), {}),
         "gives PIL images"),
        ("ColorJitter on a tensor", lambda r: (ImageFolder(r, T.Compose([*train, T.ColorJitter(0.4)])), {}),
         "ColorJitter on a tensor image"),
        ("geometry after a pixel op", lambda r: (ImageFolder(r, T.Compose([T.ColorJitter(0.4), *train])), {}),
         "RandomResizedCrop after ColorJitter"),
        ("a crop of images of unknown size", lambda r: (ImageFolder(r, T.Compose([T.CenterCrop(32), T.ToTensor()])), {}),
         "torchvision pads a smaller image"),
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
    ]


# Fall-back cases whose samples have one size (the others fail in the script's own collation)
BATCHABLE = ("a custom image loader", "a Lambda", "an op with no lowering", "a subclass with its own __getitem__",
             "ColorJitter on a tensor", "geometry after a pixel op", "two interpolations", "a resize of a float tensor",
             "an unantialiased tensor resize", "a dtype per type", "two dtype conversions")


def test_every_fall_back_is_served_by_the_drop_in_and_names_its_reason(tv, folder):
    """Each case the native path does not take: the loader is still served (the drop-in, the
    script's own samples through torchvision) and the reason names what was not lowered."""
    from fastdata.run._hook import decide

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


def test_a_corrupt_file_is_named_in_the_error(tv, tmp_path):
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder

    root = make_folder(tmp_path / "data", per_class=3, classes=2)
    bad = root / "class1" / "001.jpg"
    bad.write_bytes(bad.read_bytes()[:300])
    dataset = ImageFolder(str(root), T.Compose([T.RandomResizedCrop(32), T.ToTensor()]))
    loader = _served(dataset, batch_size=6, num_workers=0)
    assert isinstance(loader._loader.dataset, rt.NativeFolder)
    with pytest.raises(DataError, match=f"cannot read {bad}: .*served natively"):
        for _ in loader:
            pass


def _run(args: list[str], tmp_path: Path, plain: bool = False) -> tuple[dict, str]:
    out = tmp_path / "out.json"
    command = [sys.executable, str(SCRIPTS / "train_torchvision.py"), args[0], str(out), *args[1:]]
    if not plain:
        command = [sys.executable, "-m", "fastdata.cli", "run", "--", *command]
    # cwd apart from the checkout: its folder must not shadow the installed package
    proc = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=tmp_path,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stderr


@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind,workers", [("v1", 2), ("v2", 0), ("eval", 2), ("lambda", 2), ("v1", "default"),
                                          ("lambda", "default")])
def test_unchanged_script_under_fastdata_run(tv, folder, tmp_path, kind, workers):
    """The script of tests/run_scripts, unchanged: served natively (the summary says so) or,
    with a Lambda, by the drop-in with the reason; labels match the images in both; the
    batches' layout is the plain script's."""
    got, err = _run([str(folder), kind, str(workers)], tmp_path)
    plain, _ = _run([str(folder), kind, str(workers)], tmp_path, plain=True)
    assert got["wrong"] == 0 and plain["wrong"] == 0
    assert got["seen"] == plain["seen"] == 2 * 48
    assert got["layout"] == plain["layout"]
    if kind == "lambda":
        assert "not served natively: Lambda has no faithful lowering" in err, err
    else:
        assert "served natively: ImageFolder with" in err, err
    if workers == "default":  # workers only where fastdata makes the samples: then none changes
        assert plain["workers"] == 0 and (got["workers"] >= 1) == (kind != "lambda"), (got, err)
        assert ("num_workers='auto'" if kind != "lambda" else "num_workers=0 kept") in err, err
