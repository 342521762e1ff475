"""A CenterCrop larger than the image pads it with zeros, as torchvision's does, on every backend
and decoder: Pillow (a PNG), the native JPEG decoder (`pil` and `wds`), and DALI. The reference
is torchvision's `center_crop` written out with Pillow (pad (crop - side) // 2 before a short
side and the rest after, then crop the long side at the rounded centre), applied to each file
as Pillow decodes it; each image is textured and its own, and its label names its file."""

import os

import numpy as np
import pytest
import torch
from PIL import Image, ImageFilter, ImageOps

import fastdata
from fastdata import transforms as T
from fastdata.shard import write_shards

# (w, h): shorter than the crops below on one side, on both, on none; odd and even differences.
SIDES = [(30, 50), (64, 40), (50, 50), (80, 90), (17, 101), (100, 21)]


def center_crop(img: Image.Image, h: int, w: int) -> Image.Image:
    """torchvision.transforms.functional.center_crop, for a PIL image."""
    W, H = img.size
    if w > W or h > H:
        pad = ((w - W) // 2 if w > W else 0, (h - H) // 2 if h > H else 0,
               (w - W + 1) // 2 if w > W else 0, (h - H + 1) // 2 if h > H else 0)
        img = ImageOps.expand(img, pad, fill=0)
        W, H = img.size
    top, left = int(round((H - h) / 2.0)), int(round((W - w) / 2.0))
    return img.crop((left, top, left + w, top + h))


def mirror(img: Image.Image) -> Image.Image:
    return img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)


CASES = {
    "crop": (T.Compose([T.CenterCrop(64)]), lambda im: center_crop(im, 64, 64)),
    "crop-then-flip": (T.Compose([T.CenterCrop((48, 70)), T.RandomHorizontalFlip(1.0)]),
                       lambda im: mirror(center_crop(im, 48, 70))),
    "flip-then-crop": (T.Compose([T.RandomHorizontalFlip(1.0), T.CenterCrop((48, 70))]),
                       lambda im: center_crop(mirror(im), 48, 70)),
    "crop-of-a-crop": (T.Compose([T.CenterCrop(100), T.CenterCrop((60, 33))]),
                       lambda im: center_crop(center_crop(im, 100, 100), 60, 33)),
    # (no box twice its output or more: no reduced-size JPEG decode, see the guide)
    "resize-then-crop": (T.Compose([T.Resize((60, 50)), T.CenterCrop((66, 40))]),
                         lambda im: center_crop(im.resize((50, 60), Image.BILINEAR), 66, 40)),
}


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """An ImageFolder of textured images in SIDES, one a class, as PNG and as JPEG."""
    root = tmp_path_factory.mktemp("pad")
    rng = np.random.default_rng(0)
    for k, (w, h) in enumerate(SIDES):
        noise = rng.integers(30, 226, (h, w, 3), dtype=np.uint8)
        img = Image.fromarray(noise).filter(ImageFilter.GaussianBlur(1.0))
        for ext in ("png", "jpg"):
            os.makedirs(root / ext / f"c{k}")
            img.save(root / ext / f"c{k}" / f"x.{ext}", quality=95)
    pairs = [(str(root / "jpg" / f"c{k}" / "x.jpg"), k) for k in range(len(SIDES))]
    write_shards(pairs, str(root / "shards-%d.tar"), max_count=100, shuffle=False)
    return root


def _source(images, source: str) -> str:
    return str(images / "shards-0.tar") if source == "shards" else str(images / source)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("backend,source", [
    ("pil", "png"), ("pil", "jpg"), ("wds", "shards"), pytest.param("dali", "jpg", marks=pytest.mark.dali)])
def test_a_center_crop_larger_than_the_image_pads_it_as_torchvision_does(images, backend, source, case):
    transform, reference = CASES[case]
    loader = fastdata.loader(_source(images, source), batch_size=len(SIDES), transform=transform, backend=backend,
                             num_workers=0, device="cpu")
    x, y = next(iter(loader))
    assert sorted(y.tolist()) == list(range(len(SIDES)))
    for got, label in zip(x, y.tolist()):
        decoded = Image.open(images / "jpg" / f"c{label}" / "x.jpg" if source != "png"
                             else images / "png" / f"c{label}" / "x.png").convert("RGB")
        want = torch.from_numpy(np.array(reference(decoded))).permute(2, 0, 1)
        assert got.shape == want.shape
        diff = (got.int() - want.int()).abs()
        # Exact, but after a resize: the box then has fractions of a pixel, which Pillow's
        # resize(box=) and the native decoder resample within a level of torchvision's resize
        # then crop, and DALI's slicing decoder rounds to whole pixels.
        bound = 0 if case != "resize-then-crop" else 255 if backend == "dali" else 1
        assert int(diff.max()) <= bound, (SIDES[label], float(diff.float().mean()), int(diff.max()))
        # The padding is zeros and the image is not: a stretched image would have no zero rows.
        w, h = SIDES[label]
        if case == "crop" and (w < 64 or h < 64):
            assert (want == 0).all(dim=0).any() and ((got == 0).all(dim=0) == (want == 0).all(dim=0)).all()


def test_a_crop_of_padding_only_is_zeros_and_a_corrupt_file_still_fails(tmp_path):
    """A RandomResizedCrop after a padding CenterCrop may cut padding only: the output is zeros,
    and the file is still decoded, so a corrupt one fails as on any crop."""
    os.makedirs(tmp_path / "a")
    Image.new("RGB", (4, 4), (200, 100, 50)).save(tmp_path / "a" / "x.jpg", quality=95)
    geo = fastdata.transforms.plan.plan_geometry(
        [T.CenterCrop(400), T.Resize((8, 8))], 0, 0, np.arange(1), np.array([4]), np.array([4]))
    assert geo.padded().all() and (geo.placements()[0, 2:] == 0).all()  # 4 of 400 pixels: none of 8 left
    loader = fastdata.loader(str(tmp_path), batch_size=1, transform=T.Compose([T.CenterCrop(400), T.Resize((8, 8))]),
                             num_workers=0, device="cpu")
    x, _ = next(iter(loader))
    assert x.shape == (1, 3, 8, 8) and int(x.max()) == 0
    good = (tmp_path / "a" / "x.jpg").read_bytes()
    cut = good[:len(good) // 2] + bytes(len(good) - len(good) // 2)  # the entropy-coded data zeroed
    (tmp_path / "a" / "x.jpg").write_bytes(cut)
    loader = fastdata.loader(str(tmp_path), batch_size=1, transform=T.Compose([T.CenterCrop(400), T.Resize((8, 8))]),
                             num_workers=0, device="cpu")
    with pytest.raises(fastdata.DataError, match="x.jpg"):
        next(iter(loader))
