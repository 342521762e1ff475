"""The Kornia (device) lowering of the pixel ops against the Pillow lowering, op by op, with the
same parameters, on photographs the test makes (fastdata.synthetic): within the per-op
tolerance of `fastdata.transforms.kornia.PARITY`. And the two lowerings agree per sample in a
mixed batch, so a sample gets its own parameters."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from fastdata.synthetic import make_file_list, make_imagenet_like
from fastdata.transforms import ColorJitter, RandAugment, TrivialAugment
from fastdata.transforms.ops import AutoAugment
from fastdata.transforms import pil as P
from fastdata.transforms.plan import TRIVIAL_OPS, plan_pixels, trivial_magnitude

K = pytest.importorskip("fastdata.transforms.kornia", exc_type=ImportError)
pytest.importorskip("kornia")


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    root = tmp_path_factory.mktemp("photos")
    make_imagenet_like(root, n_images=12, n_classes=3, workers=1)
    imgs = [np.asarray(Image.open(p).convert("RGB").resize((72, 56))) for p, _ in make_file_list(root)]
    return imgs, torch.from_numpy(np.stack(imgs)).permute(0, 3, 1, 2).contiguous()


def _pillow(op, imgs, params):
    if isinstance(op, ColorJitter):
        return np.stack([np.asarray(P.color_jitter(Image.fromarray(a), p)) for a, p in zip(imgs, params)])
    return np.stack([np.asarray(P.trivial_augment(Image.fromarray(a), p, op.interpolation))
                     for a, p in zip(imgs, params)])


def _kornia(op, batch, params):
    return K.apply_pixel_ops(batch, [op], [params]).permute(0, 2, 3, 1).numpy()


@pytest.mark.parametrize("sampling", ["nearest", "bilinear", "bicubic"])
@pytest.mark.parametrize("name", TRIVIAL_OPS)
def test_trivial_augment_ops_match_pillow(photos, name, sampling):
    if sampling != "nearest" and name not in ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate"):
        pytest.skip("only the geometric ops sample")
    imgs, batch = photos
    op = TrivialAugment(interpolation=sampling)
    rng = np.random.default_rng(TRIVIAL_OPS.index(name))
    params = []
    for _ in imgs:
        mag = trivial_magnitude(name, int(rng.integers(1, 31)), 31)
        params.append({"op": name, "magnitude": -mag if rng.random() < 0.5 and name not in
                       ("Posterize", "Solarize") else mag})
    ref, out = _pillow(op, imgs, params), _kornia(op, batch, params)
    diff = np.abs(out.astype(int) - ref.astype(int)).mean()
    assert diff <= K.PARITY[name], (name, diff)
    if name != "Identity":
        assert np.abs(ref.astype(int) - np.stack(imgs).astype(int)).mean() > 3 * K.PARITY[name]  # the op does something


@pytest.mark.parametrize("sampling", ["nearest", "bilinear", "bicubic"])
@pytest.mark.parametrize("size", [(56, 72), (64, 64)])
def test_rotations_pillow_turns_exactly_match_pillow(photos, sampling, size):
    """Pillow turns by 0 and 180 degrees, and by 90 and 270 on a square image, by transposing,
    whatever the filter; other angles (and a quarter turn of an oblong image) through its affine
    map, whose matrix it rounds to 15 decimals: equal, level for level."""
    h, w = size
    imgs = [np.asarray(Image.fromarray(a).resize((w, h))) for a in photos[0][:7]]
    batch = torch.from_numpy(np.stack(imgs)).permute(0, 3, 1, 2).contiguous()
    op = TrivialAugment(interpolation=sampling)
    params = [{"op": "Rotate", "magnitude": m} for m in (90.0, -90.0, 180.0, 135.0, -4.5, 0.0, 270.0)]
    ref, out = _pillow(op, imgs, params), _kornia(op, batch, params)
    assert np.array_equal(out, ref), np.abs(out.astype(int) - ref.astype(int)).reshape(7, -1).max(axis=1)


@pytest.mark.parametrize("kind", ["rand", "auto"])
def test_rand_and_auto_augment_plans_match_pillow_per_sample(photos, kind):
    """RandAugment (each sample its own two ops, bilinear) and AutoAugment (a sub-policy a sample,
    each op with its probability: samples with 0, 1 or 2 ops, Invert among them; bicubic) with
    the parameters plan_pixels draws for the batch's size: every sample equal to its Pillow twin
    but for a rare level."""
    imgs, batch = photos
    if kind == "rand":
        op = RandAugment(num_ops=2, magnitude=9, interpolation="bilinear")
        (plan,) = plan_pixels([op], 5, 1, np.arange(len(imgs)), (56, 72))
        assert all(len(p["ops"]) == 2 for p in plan) and len({q["op"] for p in plan for q in p["ops"]}) > 4
        translations = [q["magnitude"] for p in plan for q in p["ops"] if q["op"] == "TranslateX"]
        assert all(abs(abs(m) - 150 / 331 * 72 * 9 / 30) < 1e-4 for m in translations)  # bin 9 of 31, 72 wide
    else:
        op = AutoAugment(((("Invert", 0.6, None), ("Rotate", 0.5, 8)), (("ShearX", 0.7, 4), ("Invert", 0.4, None)),
                          (("Posterize", 0.8, 5), ("Equalize", 1.0, None))), interpolation="bicubic")
        (plan,) = plan_pixels([op], 2, 0, np.arange(len(imgs)), (56, 72))
        assert {len(p["ops"]) for p in plan} >= {1, 2} and "Invert" in {q["op"] for p in plan for q in p["ops"]}
    ops = [op]
    out = K.apply_pixel_ops(batch, ops, [plan]).permute(0, 2, 3, 1).numpy().astype(int)
    for i, a in enumerate(imgs):
        ref = Image.fromarray(a)
        for q in plan[i]["ops"]:
            ref = P.trivial_augment(ref, q, op.interpolation)
        assert np.abs(out[i] - np.asarray(ref).astype(int)).mean() < 0.01, (i, plan[i])


@pytest.mark.parametrize("key,lo,hi", [("brightness", 0.5, 1.5), ("contrast", 0.5, 1.5), ("saturation", 0.3, 1.7),
                                       ("hue", -0.2, 0.2)])
def test_color_jitter_parts_match_pillow(photos, key, lo, hi):
    imgs, batch = photos
    rng = np.random.default_rng(1)
    params = [{"order": [0, 1, 2, 3], "brightness": 1.0, "contrast": 1.0, "saturation": 1.0, "hue": 0.0, key: v}
              for v in rng.uniform(lo, hi, len(imgs))]
    diff = np.abs(_kornia(ColorJitter(), batch, params).astype(int) - _pillow(ColorJitter(), imgs, params).astype(int))
    assert diff.mean() <= K.PARITY[f"ColorJitter.{key}"], diff.mean()


def test_planned_pipeline_matches_pillow_per_sample(photos):
    """ColorJitter (each sample in its own order) then TrivialAugment (each sample its own op),
    with the parameters plan_pixels draws: every sample close to its Pillow twin."""
    imgs, batch = photos
    ops = [ColorJitter(0.4, 0.4, 0.4, 0.1), TrivialAugment()]
    plans = plan_pixels(ops, 7, 2, np.arange(len(imgs)))
    assert len({tuple(p["order"]) for p in plans[0]}) > 1 and len({p["op"] for p in plans[1]}) > 3
    out = K.apply_pixel_ops(batch, ops, plans).permute(0, 2, 3, 1).numpy().astype(int)
    refs = [np.asarray(P.trivial_augment(P.color_jitter(Image.fromarray(a), plans[0][i]), plans[1][i])).astype(int)
            for i, a in enumerate(imgs)]
    # Chained, a rare one-level difference can grow (a threshold or Equalize moves it), but each
    # sample is its own twin to within a hundredth of a level on average.
    for i, ref in enumerate(refs):
        diff = np.abs(out[i] - ref).mean()
        assert diff < 0.01, (i, plans[0][i], plans[1][i], diff)
        assert diff < min(np.abs(out[j] - ref).mean() for j in range(len(refs)) if j != i)


def _mixed_plans(n: int, size: tuple = (56, 72)):
    """ColorJitter, TrivialAugment, and bilinear RandAugment and bicubic AutoAugment (Invert
    among their ops): every sampling and op of the device lowering."""
    policies = ((("Invert", 0.6, None), ("Rotate", 0.7, 8)), (("ShearY", 0.8, 6), ("TranslateX", 0.6, 3)))
    ops = [ColorJitter(0.4, 0.4, 0.4, 0.1), TrivialAugment(), RandAugment(interpolation="bilinear"),
           AutoAugment(policies, interpolation="bicubic")]
    return ops, [plan_pixels(ops, 11, epoch, np.arange(n), size) for epoch in range(4)]


def test_autocast_changes_nothing(photos):
    """A loop under autocast (bfloat16 matmuls and convolutions) gets the float32 result: the
    lowering has no matmul or convolution, and turns autocast off around itself."""
    _, batch = photos
    ops, epochs = _mixed_plans(len(batch))
    for plans in epochs:
        plain = K.apply_pixel_ops(batch, ops, plans)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert torch.equal(K.apply_pixel_ops(batch, ops, plans), plain)


@pytest.mark.gpu
def test_cuda_gives_the_cpu_result(photos):
    """On a CUDA device, with TF32 allowed for matmuls and convolutions and under autocast (as
    a training script sets them), the lowering gives what it gives on the CPU, which is Pillow's
    to within PARITY (the tests above)."""
    _, batch = photos
    ops, epochs = _mixed_plans(len(batch))
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        for plans in epochs:
            cpu = K.apply_pixel_ops(batch, ops, plans).int()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                cuda = K.apply_pixel_ops(batch.cuda(), ops, plans).cpu().int()
            diff = (cpu - cuda).abs()
            assert diff.float().mean() < 0.01 and (diff > 1).float().mean() < 1e-4, (diff.float().mean(), diff.max())
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def test_any_strides_and_input_untouched(photos):
    _, batch = photos
    channels_last = batch.contiguous(memory_format=torch.channels_last)
    before = channels_last.clone()
    ops = [TrivialAugment()]
    plans = plan_pixels(ops, 0, 0, np.arange(len(batch)))
    a = K.apply_pixel_ops(channels_last, ops, plans)
    assert torch.equal(a, K.apply_pixel_ops(batch, ops, plans)) and torch.equal(channels_last, before)
    assert a.dtype == torch.uint8 and a.shape == batch.shape


# ------------------------------------------------------------------ placement="gpu": the device stage


@pytest.fixture(scope="module")
def photo_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("folder")
    make_imagenet_like(root, n_images=24, n_classes=3, workers=1)
    return root


@pytest.mark.parametrize("pixel", ["jitter+trivial", "rand bilinear"])
@pytest.mark.parametrize("workers", [0, 2])
def test_gpu_placement_matches_cpu_placement(photo_folder, workers, pixel):
    """ColorJitter + TrivialAugment, or RandAugment sampling bilinearly, in the device stage
    (Kornia, here on the CPU device) give each sample what the workers' Pillow lowering gives it,
    within the parity of chained ops; Normalize, dtype and channels_last follow as on the CPU side."""
    import fastdata
    from fastdata import transforms as T

    ops = [T.ColorJitter(0.4, 0.4, 0.4, 0.1), T.TrivialAugment()] if pixel == "jitter+trivial" else \
        [T.RandAugment(num_ops=3, magnitude=12, interpolation="bilinear")]
    spec = T.Compose([T.RandomResizedCrop(48), T.RandomHorizontalFlip(), *ops])
    kw = dict(batch_size=8, shuffle=True, seed=3, transform=spec, num_workers=workers, device="cpu")
    cpu = list(fastdata.loader(str(photo_folder), placement="cpu", **kw))
    gpu = list(fastdata.loader(str(photo_folder), placement="gpu", **kw))
    assert len(cpu) == len(gpu) == 3
    for (x, y), (u, v) in zip(cpu, gpu):
        assert torch.equal(y, v) and u.dtype == torch.uint8 and u.shape == x.shape
        assert u.is_contiguous(memory_format=torch.channels_last)
        d = (x.float() - u.float()).abs().mean(dim=(1, 2, 3))
        assert (d < 4).all(), d
    norm = T.Compose([*spec.ops, T.Normalize([0.5] * 3, [0.25] * 3)])
    (x, _), (u, _) = (next(iter(fastdata.loader(str(photo_folder), **{**kw, "transform": norm, "dtype": torch.bfloat16},
                                                placement=p))) for p in ("cpu", "gpu"))
    assert u.dtype == torch.bfloat16 and (x.float() - u.float()).abs().mean() < 4 / 255 / 0.25
