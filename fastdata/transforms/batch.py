"""The batch ops (Normalize, MixUp, CutMix, LabelSmoothing) on a collated batch, in torch, on
whatever device the batch is on. Randomness is per batch: a pure function of (seed, epoch,
rank, batch number), so a resumed run mixes the same pairs."""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np
import torch

from .._collate import default_threads
from .._ext import native
from .ops import CutMix, LabelSmoothing, MixUp, Normalize, Op


def _rng(seed: int, epoch: int, rank: int, batch: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64([seed, epoch, rank, batch, 0x6D6978]))


def apply(images: torch.Tensor, labels: torch.Tensor, ops: Sequence[Op], *, dtype: torch.dtype,
          num_classes: int, seed: int, epoch: int, rank: int, batch: int,
          new: Callable[[Sequence[int], torch.dtype], torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """images uint8 [N, 3, H, W] -> `dtype` when any op needs floats; labels int64 [N] -> float
    [N, num_classes] when a mixing or smoothing op is there. `new(shape, dtype)`, when given,
    makes the buffer Normalize writes into (a reused slot, instead of fresh memory)."""
    rng = _rng(seed, epoch, rank, batch)
    mixers = [op for op in ops if isinstance(op, (MixUp, CutMix))]
    mixer = mixers[int(rng.integers(len(mixers)))] if len(mixers) > 1 else (mixers[0] if mixers else None)
    if any(not isinstance(op, Normalize) for op in ops):
        soft = torch.nn.functional.one_hot(labels, num_classes).to(torch.float32)
    else:
        soft = None
    for op in ops:
        if isinstance(op, Normalize):
            mean = torch.tensor(op.mean, device=images.device, dtype=dtype).mul_(255).view(1, 3, 1, 1)
            std = torch.tensor(op.std, device=images.device, dtype=dtype).mul_(255).view(1, 3, 1, 1)
            out = _like(images, dtype, new) if new is not None and not images.is_floating_point() else None
            if out is None:
                images = images.to(dtype).sub_(mean).div_(std)
            elif _normalize_by_table(images, out, mean, std):
                images = out
            else:  # (torch.sub(images, mean, out=out) would cast images into a fresh temporary first)
                images = out.copy_(images).sub_(mean).div_(std)
        elif op is mixer and len(labels) > 1:
            lam = float(rng.beta(op.alpha, op.alpha))
            if not images.is_floating_point():
                images = images.to(dtype)
            other = images.roll(1, 0)
            if isinstance(op, MixUp):
                images = images.mul(lam).add_(other, alpha=1 - lam)
            else:
                H, W = images.shape[-2:]
                cut = math.sqrt(1 - lam)
                cx, cy = int(rng.integers(W)), int(rng.integers(H))
                x0, x1 = max(cx - int(W * cut / 2), 0), min(cx + int(W * cut / 2), W)
                y0, y1 = max(cy - int(H * cut / 2), 0), min(cy + int(H * cut / 2), H)
                images = images.clone()
                images[..., y0:y1, x0:x1] = other[..., y0:y1, x0:x1]
                lam = 1 - (x1 - x0) * (y1 - y0) / (W * H)
            soft = soft.mul(lam).add_(soft.roll(1, 0), alpha=1 - lam)
        elif isinstance(op, LabelSmoothing):
            soft = soft.mul(1 - op.eps).add_(op.eps / num_classes)
    return images, (soft if soft is not None else labels)


_TABLES: dict[tuple, torch.Tensor] = {}


def _normalize_by_table(images: torch.Tensor, out: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> bool:
    """Writes `out.copy_(images).sub_(mean).div_(std)`'s values for uint8 CPU `images` into
    `out` (both contiguous, or both channels_last) natively, through a table of what those torch
    operations make of each of the 256 values of each channel: one pass over the batch where
    they take three, in the training process, in series with the step (benchmarks/device_stage.py).
    False, with nothing written, where the native extension or the layout is not there."""
    if native is None or images.dtype != torch.uint8 or images.device.type != "cpu" or images.dim() != 4 \
            or images.numel() == 0:
        return False  # (an empty batch: the operations give it, and a size-0 dimension has no layout to check)
    n, c, h, w = images.shape
    if c != mean.numel():
        return False  # (the torch operations say why they cannot broadcast)
    if images.is_contiguous(memory_format=torch.channels_last) and out.is_contiguous(memory_format=torch.channels_last):
        src, dst = images.permute(0, 2, 3, 1).view(-1, c, 1), out.permute(0, 2, 3, 1).view(-1, c, 1)
    elif images.is_contiguous() and out.is_contiguous():
        src, dst = images.view(n, c, h * w), out.view(n, c, h * w)
    else:
        return False
    key = (out.dtype, repr(mean.flatten().tolist()), repr(std.flatten().tolist()))  # (repr: a NaN mean is one key)
    table = _TABLES.get(key)
    if table is None:
        if len(_TABLES) > 8:  # means and stds changed batch after batch
            _TABLES.clear()
        values = torch.arange(256, dtype=torch.uint8).view(1, 1, 256, 1).expand(1, c, 256, 1)
        table = torch.empty((1, c, 256, 1), dtype=out.dtype).copy_(values).sub_(mean).div_(std)
        table = _TABLES[key] = table.view(c, 256)
    native.lookup_values(src, table, dst, default_threads())
    return True


def _like(images: torch.Tensor, dtype: torch.dtype, new: Callable) -> torch.Tensor | None:
    """A `dtype` buffer from `new` with the shape and memory format of `images` (contiguous or
    channels_last), or None for any other layout."""
    if images.is_contiguous():
        return new(images.shape, dtype)
    if images.dim() == 4 and images.is_contiguous(memory_format=torch.channels_last):
        n, c, h, w = images.shape
        return new((n, h, w, c), dtype).permute(0, 3, 1, 2)
    return None
