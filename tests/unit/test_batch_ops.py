"""Batch ops: Normalize, MixUp, CutMix, LabelSmoothing on collated batches."""

import os

import pytest
import torch
from PIL import Image

import fastdata
from fastdata import transforms as T
from fastdata.transforms import batch


def _flat_batch(n=6, size=16):
    """Image i is flat with value 10 * i + 5 in every channel, label i % 3."""
    images = torch.stack([torch.full((3, size, size), 10 * i + 5, dtype=torch.uint8) for i in range(n)])
    return images, torch.arange(n) % 3


def _run(ops, b=0, **kw):
    images, labels = _flat_batch(**kw)
    return batch.apply(images, labels, ops, dtype=torch.float32, num_classes=3, seed=1, epoch=2, rank=0, batch=b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("channels_last", [True, False])
def test_normalize_into_a_given_buffer_matches_fresh(dtype, channels_last):
    # The loader's CPU device stage gives Normalize a reused buffer: same values, layout, dtype.
    images = torch.randint(0, 256, (4, 3, 8, 10), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    if channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    made = []
    new = lambda shape, dt: made.append(torch.empty(tuple(shape), dtype=dt)) or made[-1]  # noqa: E731
    ops = [T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))]
    kw = dict(dtype=dtype, num_classes=3, seed=1, epoch=0, rank=0, batch=0)
    want, _ = batch.apply(images, torch.zeros(4, dtype=torch.long), ops, **kw)
    got, _ = batch.apply(images, torch.zeros(4, dtype=torch.long), ops, new=new, **kw)
    assert len(made) == 1 and got.data_ptr() == made[0].data_ptr()
    assert got.dtype == dtype and got.stride() == want.stride() and torch.equal(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("channels_last", [True, False])
@pytest.mark.parametrize("side", [16, 160])  # 160: 8 images, in several chunks on several threads
def test_normalize_into_a_buffer_natively_gives_torchs_values_for_every_value(dtype, channels_last, side, monkeypatch):
    # The CPU device stage's Normalize goes through a table of each channel's 256 values: every
    # value of every channel (each channel in another order) must be what the torch operations give.
    if batch.native is None:
        pytest.skip("the native extension is not built")
    n = 2 if side == 16 else 8
    pixels = torch.arange(n * side * side)
    images = torch.stack([(pixels * (2 * ch + 1) + 7 * ch) % 256 for ch in range(3)]).view(3, n, side, side)
    images = images.permute(1, 0, 2, 3).to(torch.uint8)  # every 256 pixels hold each value in each channel
    images = images.contiguous(memory_format=torch.channels_last) if channels_last else images.contiguous()
    ops = [T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))]
    kw = dict(dtype=dtype, num_classes=3, seed=1, epoch=0, rank=0, batch=0)

    def new(shape, dt):
        return torch.empty(tuple(shape), dtype=dt)

    calls = []
    lookup = batch.native.lookup_values
    monkeypatch.setattr(batch.native, "lookup_values", lambda *a: calls.append(1) or lookup(*a))
    got, _ = batch.apply(images, torch.zeros(n, dtype=torch.long), ops, new=new, **kw)
    assert len(calls) == 1  # the table, not the torch operations
    monkeypatch.setattr(batch, "native", None)
    want, _ = batch.apply(images, torch.zeros(n, dtype=torch.long), ops, new=new, **kw)
    assert got.dtype == dtype and got.stride() == want.stride() and torch.equal(got, want)


def test_normalize_of_an_empty_batch_into_a_buffer():
    ops = [T.Normalize()]
    for shape in ((0, 3, 4, 4), (2, 3, 0, 4)):
        out, _ = batch.apply(torch.empty(shape, dtype=torch.uint8), torch.zeros(shape[0], dtype=torch.long), ops,
                             dtype=torch.float32, num_classes=3, seed=0, epoch=0, rank=0, batch=0,
                             new=lambda shape, dt: torch.empty(tuple(shape), dtype=dt))
        assert out.shape == shape and out.dtype == torch.float32


def test_the_native_table_refuses_what_it_cannot_write():
    if batch.native is None:
        pytest.skip("the native extension is not built")
    src, lookup = torch.zeros(8, 3, 1, dtype=torch.uint8), batch.native.lookup_values
    for table, out in ((torch.zeros(3, 255), torch.zeros(8, 3, 1)),  # a short table
                       (torch.zeros(2, 256), torch.zeros(8, 3, 1)),  # a table for 2 channels
                       (torch.zeros(3, 256), torch.zeros(8, 3, 1, dtype=torch.float64)),  # out not the table's dtype
                       (torch.zeros(3, 256), torch.zeros(4, 3, 1))):  # out of another shape
        with pytest.raises(ValueError, match="lookup_values takes uint8 src"):
            lookup(src, table, out, 1)
    with pytest.raises(ValueError, match="lookup_values takes contiguous"):
        lookup(src, torch.zeros(3, 256), torch.zeros(3, 8, 1).permute(1, 0, 2), 1)
    with pytest.raises(ValueError, match="lookup_values takes uint8 src"):
        lookup(src.float(), torch.zeros(3, 256), torch.zeros(8, 3, 1), 1)


def test_label_smoothing():
    _, soft = _run([T.LabelSmoothing(0.1)])
    assert soft.shape == (6, 3) and soft.dtype == torch.float32
    assert torch.allclose(soft.sum(1), torch.ones(6))
    assert torch.allclose(soft.max(1).values, torch.full((6,), 0.9 + 0.1 / 3))
    assert torch.equal(soft.argmax(1), torch.arange(6) % 3)


def test_mixup_mixes_images_and_labels_alike():
    images, soft = _run([T.MixUp(alpha=1.0)])
    lam = (images[:, 0, 0, 0] - torch.roll(torch.arange(6) * 10 + 5, 1).float()) / (
        (torch.arange(6) * 10 + 5).float() - torch.roll(torch.arange(6) * 10 + 5, 1).float())
    assert torch.allclose(lam, lam[0].expand(6), atol=1e-4)  # one lam per batch
    assert (images[0] == images[0, 0, 0, 0]).all()  # still flat: a pixelwise mix
    own = torch.nn.functional.one_hot(torch.arange(6) % 3, 3).float()
    assert torch.allclose(soft, lam[0] * own + (1 - lam[0]) * own.roll(1, 0), atol=1e-5)


def test_cutmix_label_weight_is_the_pasted_area():
    images, soft = _run([T.CutMix(alpha=1.0)], b=3, size=32)
    own_value = (torch.arange(6) * 10 + 5).float().view(6, 1, 1)
    kept = (images[:, 0] == own_value).float().mean((1, 2))
    own = torch.nn.functional.one_hot(torch.arange(6) % 3, 3).float()
    want = kept.view(6, 1) * own + (1 - kept.view(6, 1)) * own.roll(1, 0)
    assert torch.allclose(soft, want, atol=1e-5)


def test_batch_randomness_is_a_function_of_the_batch():
    a = _run([T.MixUp(0.4), T.CutMix(1.0)], b=5)
    b = _run([T.MixUp(0.4), T.CutMix(1.0)], b=5)
    c = _run([T.MixUp(0.4), T.CutMix(1.0)], b=6)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[1], c[1])


def test_ops_validate():
    with pytest.raises(ValueError, match="alpha"):
        T.MixUp(0)
    with pytest.raises(ValueError, match="eps"):
        T.LabelSmoothing(1.0)


def test_loader_gives_soft_labels(tmp_path):
    for c in range(4):
        os.makedirs(tmp_path / f"c{c}")
        for i in range(3):
            Image.new("RGB", (40, 30), (60 * c, 20 * i, 9)).save(tmp_path / f"c{c}" / f"{i}.png")
    t = T.Compose([T.CenterCrop(16), T.Normalize(), T.MixUp(0.5), T.LabelSmoothing(0.1)])
    loader = fastdata.loader(str(tmp_path), batch_size=6, shuffle=True, transform=t, device="cpu")
    for x, y in loader:
        assert x.dtype == torch.float32 and y.shape == (6, 4) and y.dtype == torch.float32
        assert torch.allclose(y.sum(1), torch.ones(6))
