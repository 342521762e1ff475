"""fastdata.transforms: the spec, its parameter sampling, and its Pillow lowering."""

import io
import math

import numpy as np
import pytest
import torch
from PIL import Image, ImageEnhance

import fastdata
from fastdata import transforms as T
from fastdata.transforms import pil as lowering
from fastdata.transforms._random import uniforms
from fastdata.transforms.plan import _rrc, plan_geometry, plan_pixels, trivial_magnitude


def test_draws_are_a_function_of_the_sample_alone():
    a = uniforms(7, 3, np.array([5, 9, 11]), stream=2, count=6)
    b = uniforms(7, 3, np.array([11, 9]), stream=2, count=6)
    assert np.array_equal(a[1], b[1]) and np.array_equal(a[2], b[0])
    assert not np.array_equal(a, uniforms(7, 4, np.array([5, 9, 11]), 2, 6))  # epoch
    assert not np.array_equal(a, uniforms(8, 3, np.array([5, 9, 11]), 2, 6))  # seed
    assert not np.array_equal(a, uniforms(7, 3, np.array([5, 9, 11]), 3, 6))  # op
    big = uniforms(0, 0, np.arange(20000), 0, 4)
    assert 0 <= big.min() and big.max() < 1 and abs(big.mean() - 0.5) < 0.01


def test_random_resized_crop_follows_torchvision():
    op = T.RandomResizedCrop(224)
    n = 4000
    W, H = np.full(n, 500), np.full(n, 375)
    left, top, w, h = _rrc(op, uniforms(0, 0, np.arange(n), 0, 40), W, H)
    assert (left >= 0).all() and (top >= 0).all() and (left + w <= W).all() and (top + h <= H).all()
    area = w * h / (500 * 375)
    assert area.min() >= 0.07 and area.max() <= 1.0
    aspect = w / h
    assert aspect.min() > 0.74 and aspect.max() < 1.34
    # The same distribution as torchvision's loop, written out independently with `random`.
    import random

    rng = random.Random(0)
    ref = []
    for _ in range(n):
        for _ in range(10):
            t = 500 * 375 * rng.uniform(0.08, 1.0)
            r = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
            cw, ch = round(math.sqrt(t * r)), round(math.sqrt(t / r))
            if 0 < cw <= 500 and 0 < ch <= 375:
                ref.append(math.sqrt(cw * ch))
                break
    assert abs(np.median(np.sqrt(w * h)) / np.median(ref) - 1) < 0.03
    # An image no attempt fits: the fallback is a central crop clamped to the ratio range.
    left, top, w, h = _rrc(op, uniforms(0, 0, np.arange(3), 0, 40), np.full(3, 1000), np.full(3, 10))
    assert (w == round(10 * 4 / 3)).all() and (h == 10).all() and (left == (1000 - w) // 2).all()


def test_resize_and_center_crop_fold_into_one_box():
    g = plan_geometry(T.imagenet_eval(224).geometry, 0, 0, np.arange(2), np.array([500, 300]), np.array([375, 400]))
    assert (g.sizes == 224).all() and not g.flips.any()
    # 500x375 -> 341x256 (shorter side 256, the longer truncated), centre 224 of that.
    assert np.allclose(g.boxes[0, 3] - g.boxes[0, 1], 224 * 375 / 256)
    assert np.allclose(g.boxes[0, 2] - g.boxes[0, 0], 224 * 500 / 341)
    assert np.allclose(g.boxes[0, 0], round((341 - 224) / 2) * 500 / 341)


def _gradient(w=120, h=90):
    a = np.zeros((h, w, 3), np.uint8)
    a[..., 0] = np.linspace(0, 255, w)[None, :]
    a[..., 1] = np.linspace(0, 255, h)[:, None]
    a[..., 2] = (np.arange(w)[None, :] * 7 + np.arange(h)[:, None] * 3) % 256
    return a


def _png(a):
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, "PNG")
    return buf.getvalue()


@pytest.mark.parametrize("idx", range(6))
def test_flip_before_a_crop_crops_the_mirrored_image(idx):
    """The folded geometry equals applying the ops one after another with Pillow."""
    a = _gradient()
    ops = (T.RandomHorizontalFlip(1.0), T.RandomResizedCrop((24, 32), scale=(0.2, 0.6)))
    g = plan_geometry(ops, 5, 1, np.array([idx]), np.array([120]), np.array([90]))
    got = lowering.open_window(_png(a), g.boxes[0], bool(g.flips[0]), (32, 24))
    left, top, w, h = _rrc(ops[1], uniforms(5, 1, np.array([idx]), 1, 40), np.array([120]), np.array([90]))
    mirrored = Image.fromarray(a).transpose(Image.FLIP_LEFT_RIGHT)
    box = (int(left[0]), int(top[0]), int(left[0] + w[0]), int(top[0] + h[0]))
    ref = np.asarray(mirrored.resize((32, 24), Image.BILINEAR, box=box))
    assert np.abs(got.astype(int) - ref.astype(int)).max() <= 1


def test_color_jitter_parameters_and_pillow_lowering():
    op = T.ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1)
    assert op.brightness == (0.6, 1.4) and op.hue == (-0.1, 0.1)
    (params,) = plan_pixels([op], 0, 0, np.arange(500))
    b = np.array([p["brightness"] for p in params])
    assert 0.6 <= b.min() and b.max() <= 1.4 and b.std() > 0.2
    assert all(sorted(p["order"]) == [0, 1, 2, 3] for p in params)
    assert len({tuple(p["order"]) for p in params}) > 12  # random order, as torchvision
    only_b = T.ColorJitter(brightness=0.5)
    (p,) = plan_pixels([only_b], 1, 2, np.array([3]))[0:1][0][0:1]
    row = _gradient()
    lowering.apply_pixel_ops(row, [only_b], [p])
    ref = np.asarray(ImageEnhance.Brightness(Image.fromarray(_gradient())).enhance(p["brightness"]))
    assert np.array_equal(row, ref)
    with pytest.raises(ValueError, match="hue"):
        T.ColorJitter(hue=0.7)


def test_trivial_augment_draws_every_op_with_torchvision_magnitudes():
    (params,) = plan_pixels([T.TrivialAugment()], 0, 0, np.arange(3000))
    names = {p["op"] for p in params}
    assert len(names) == 14
    assert trivial_magnitude("Posterize", 0, 31) == 8 and trivial_magnitude("Posterize", 30, 31) == 2
    assert trivial_magnitude("Solarize", 0, 31) == 255 and trivial_magnitude("Rotate", 30, 31) == 135
    assert any(p["magnitude"] < 0 for p in params if p["op"] == "Rotate")
    for p in params[:60]:  # every op runs on a real image and keeps its shape
        row = _gradient(48, 40)
        lowering.apply_pixel_ops(row, [T.TrivialAugment()], [p])
        assert row.shape == (40, 48, 3)


def test_compose_checks_order_and_types():
    with pytest.raises(ValueError, match="before the batch ops"):
        T.Compose([T.Normalize(), T.RandomHorizontalFlip()])
    with pytest.raises(ValueError, match="before ColorJitter"):
        T.Compose([T.ColorJitter(0.2), T.CenterCrop(8)])
    with pytest.raises(TypeError, match="ops"):
        T.Compose([lambda x: x])
    with pytest.raises(ValueError, match="size"):
        T.RandomResizedCrop(0)
    train = T.imagenet_train(160)
    assert [type(op) for op in train] == [T.RandomResizedCrop, T.RandomHorizontalFlip, T.Normalize]
    assert train.ops[0].size == (160, 160)
    assert [type(op) for op in T.imagenet_eval(224)] == [T.Resize, T.CenterCrop, T.Normalize]
    assert T.imagenet_eval(224).ops[0].size == 256


def test_pixel_ops_in_the_loader_are_deterministic(tmp_path):
    import os

    os.makedirs(tmp_path / "a")
    for i in range(12):
        Image.fromarray(np.roll(_gradient(), i * 5, axis=1)).save(tmp_path / "a" / f"{i}.jpg", quality=90)
    t = T.Compose([T.RandomResizedCrop(32), T.ColorJitter(0.4, 0.4, 0.4, 0.1), T.TrivialAugment()])
    runs = [torch.cat([x for x, _ in fastdata.loader(str(tmp_path), batch_size=bs, transform=t, num_workers=nw, seed=4)])
            for bs, nw in [(5, 0), (12, 2)]]
    assert torch.equal(runs[0], runs[1])
