"""The device stage directly (`fastdata.device.DeviceStage`), on the CPU: Normalize into the
asked dtype, the batch ops' random parameters a function of (seed, epoch, rank, batch k), the
output layout."""

from __future__ import annotations

import pytest
import torch

from fastdata import transforms as T
from fastdata.device import DeviceStage

MEAN, STD = (0.5, 0.25, 0.125), (0.5, 0.25, 0.2)


def _batch(n: int = 4, size: int = 6):
    """uint8 NCHW images (channels_last strides, as the loader hands them) whose pixels encode
    the sample index and channel, labels = index % 3, sample ids."""
    images = torch.empty(n, size, size, 3, dtype=torch.uint8)
    for i in range(n):
        for c in range(3):
            images[i, :, :, c] = 10 * i + 40 * c + 1
    return images.permute(0, 3, 1, 2), torch.arange(n) % 3, torch.arange(n)


def _stage(ops, dtype=torch.float32, seed=0, rank=0):
    return DeviceStage((), ops, device=torch.device("cpu"), dtype=dtype, channels_last=True, num_classes=3,
                       seed=seed, rank=rank)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_normalize_into_the_dtype(dtype):
    images, labels, ids = _batch()
    out, got_labels = _stage([T.Normalize(MEAN, STD)], dtype)((images, labels, ids), 0, 0)
    assert out.dtype == dtype and out.shape == images.shape and torch.equal(got_labels, labels)
    expect = (images.float() / 255 - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)
    assert torch.allclose(out.float(), expect, atol=1e-5 if dtype == torch.float32 else 2e-2)


def test_no_ops_hands_the_batch_through():
    images, labels, ids = _batch()
    out, got = _stage(())((images, labels, ids), 0, 0)
    assert out is images and got is labels


def test_mixing_is_a_function_of_seed_epoch_rank_and_batch():
    ops = [T.Normalize(MEAN, STD), T.MixUp(0.4), T.LabelSmoothing(0.1)]
    batch = _batch()

    def run(seed=0, epoch=0, rank=0, k=0):
        return _stage(ops, seed=seed, rank=rank)(batch, epoch, k)

    images, soft = run()
    assert soft.shape == (4, 3) and torch.allclose(soft.sum(1), torch.ones(4))  # soft labels, each summing to 1
    again_images, again_soft = run()
    assert torch.equal(images, again_images) and torch.equal(soft, again_soft)
    for other in ({"seed": 1}, {"epoch": 1}, {"rank": 1}, {"k": 1}):
        assert not torch.equal(run(**other)[1], soft), other  # another mix weight
    # sample i is mixed with sample i - 1 (the batch rolled by one) with the weight its label says
    lam = soft[1, batch[1][1]] - 0.1 / 3
    mixed = images[1].float()
    plain, _ = _stage([T.Normalize(MEAN, STD)])(batch, 0, 0)
    expect = plain[1] * (lam / 0.9) + plain[0] * (1 - lam / 0.9)
    assert torch.allclose(mixed, expect, atol=1e-4)
