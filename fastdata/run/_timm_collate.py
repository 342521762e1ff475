"""`fastdata run`'s timm collate_fns, on a natively served batch of uint8 images: the ones timm's
train.py gives its loader, `timm.data.loader.fast_collate` (its default: the samples stacked,
the targets collated) and, for --mixup and --cutmix, `timm.data.mixup.FastCollateMixup` (that
class exactly). Both give a tuple, (uint8 images [N, C, H, W], targets); `TimmCollate` gives
what they give, the batch decoded into the collation's slot (NHWC) and laid out in the training
process as a plain batch is.

timm's own call collates the samples into uint8 [N, C, H, W], sample i mixed with sample
N-1-i as it was: blended, `(x_i.float() * lam + x_j.float() * (1 - lam))` rounded half to even
and made bytes, or with sample j's CutMix box over it. Its Mixup draws from NumPy's RNG of the
process that collates: `_params_per_batch` ('batch' mode), `_params_per_elem` per sample
('elem') or per pair ('pair'), then `cutmix_bbox_and_lam` per box; the targets are
`mixup_target`'s. `TimmCollate` makes those very calls of the op and its module, in its order,
so the draws and targets are timm's; only the pixels are fastdata's: the batch was decoded into
the collation's slot (NHWC) and is mixed there in place, where the script's collate_fn ran (in
the workers), each blended value natively (`mix_reversed`: as torch's float products, sum and
round give it), the boxes copied.

Once a process and mode, `_agrees` checks this against the op's own call, on a small batch for
a few seeds (NumPy's RNG state kept): a timm whose FastCollateMixup computes anything else gets
its own call on the samples. So do 'half' mode (half the batch out), a batch of odd size (timm's
assertion), targets other than class indices (either function), and a batch of the dataset's
own samples.
"""

from __future__ import annotations

import copy
import sys
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from .._collate import Prepared, RingCollate, default_threads
from .._ext import native as _ext
from ._folders import target_transformed
from ._layout import FolderBatch
from ._lowering import Lowering
from ._timm import is_fast_mixup, is_timm_collate

_MODES = ("batch", "pair", "elem")


def timm_collate_of(collate_fn: Any, lowering: Lowering | None, dataset: Any) -> Any:
    """The script's collate_fn where it is timm's fast_collate or FastCollateMixup and a natively
    served batch of `lowering` is what it collates: one view of uint8 images with no tensor step
    or erasing after the conversion (timm's MaybePILToTensor, PILToTensor), the dataset's own
    targets; else None."""
    if lowering is None or lowering.views or lowering.steps or lowering.erasing or lowering.tv_image:
        return None
    if not is_timm_collate(collate_fn) or target_transformed(dataset):
        return None
    return collate_fn


def _plan(op: Any, shape: tuple) -> tuple[list, Any]:
    """(per sample of a batch of `shape` (N, C, H, W): None, ("blend", lam, 1 - lam) or ("box",
    (y1, y2, x1, x2)), what it takes from sample N-1-i; the lam `mixup_target` gets), drawn by
    the op's own calls in the order and with the values its `__call__` makes them."""
    module = sys.modules[type(op).__module__]
    n = shape[0]
    rows: list = [None] * n

    def box(lam: Any) -> tuple:
        return module.cutmix_bbox_and_lam(shape, lam, ratio_minmax=op.cutmix_minmax, correct_lam=op.correct_lam)

    if op.mode == "batch":
        lam, use_cutmix = op._params_per_batch()
        if use_cutmix:
            where, lam = box(lam)
        if lam != 1.:
            rows = [("box", where) if use_cutmix else ("blend", lam, 1 - lam)] * n
        return rows, lam
    pairs = op.mode == "pair"
    lam_batch, use_cutmix = op._params_per_elem(n // 2 if pairs else n)
    for i in range(len(lam_batch)):
        lam = lam_batch[i]
        if pairs and not 0 <= lam <= 1.0:
            raise AssertionError  # (timm's assertion)
        if lam != 1.:
            if use_cutmix[i]:
                where, lam_batch[i] = box(lam)
                rows[i] = ("box", where)
            else:
                rows[i] = ("blend", lam, 1 - lam)
            if pairs:
                rows[n - i - 1] = rows[i]
    if pairs:
        lam_batch = np.concatenate((lam_batch, lam_batch[::-1]))
    return rows, torch.tensor(lam_batch).unsqueeze(1)


def _mix(images: torch.Tensor, rows: list) -> None:
    """Mixes uint8 `images` [N, C, H, W] (contiguous, or a view of contiguous NHWC: a slot's) in
    place as `rows` (`_plan`) give, each sample from sample N-1-i's values as they were."""
    n = len(images)
    boxes = [(i, row[1]) for i, row in enumerate(rows) if row is not None and row[0] == "box"]
    if len(boxes) == n and all(where == boxes[0][1] for _, where in boxes):  # (one box for all, at once)
        y1, y2, x1, x2 = boxes[0][1]
        images[:, :, y1:y2, x1:x2] = images[:, :, y1:y2, x1:x2].flip(0)
        return
    patches = [(images[i, :, y1:y2, x1:x2], images[n - 1 - i, :, y1:y2, x1:x2].clone())
               for i, (y1, y2, x1, x2) in boxes]
    blended = [i for i, row in enumerate(rows) if row is not None and row[0] == "blend"]
    if blended:
        a, b, mask = np.zeros(n, np.float32), np.zeros(n, np.float32), np.zeros(n, np.uint8)
        for i in blended:
            a[i], b[i], mask[i] = rows[i][1], rows[i][2], 1  # (each weight as torch takes a number: to float)
        memory = images if images.is_contiguous() else images.permute(0, 2, 3, 1)
        if _ext is not None and memory.is_contiguous() and ((a >= 0) & (a <= 1) & (b >= 0) & (b <= 1)).all():
            _ext.mix_reversed(memory.view(n, -1), a, b, mask, default_threads())
        else:
            was = images.clone()
            for i in blended:
                _, lam, rest = rows[i]
                mixed = was[i].float() * lam + was[n - 1 - i].float() * rest  # (timm's own expression)
                torch.round(mixed, out=mixed)
                images[i] = mixed.byte()
    for box, patch in patches:
        box.copy_(patch)


def _collated(op: Any, images: torch.Tensor, targets: list) -> tuple[torch.Tensor, torch.Tensor]:
    """What the op's own call gives for uint8 samples `images` [N, C, H, W] (see `_mix`) and
    class-index `targets`: the images mixed in place, and its targets."""
    rows, lam = _plan(op, tuple(images.shape))
    _mix(images, rows)
    labels = torch.utils.data.default_collate(targets)  # (as timm's call collates them)
    module = sys.modules[type(op).__module__]
    return images, module.mixup_target(labels, op.num_classes, lam, op.label_smoothing, op.multi_label)[:len(images)]


_checked: dict = {}  # (the op's class, its mode): whether fastdata's mixing is the op's own call's


def _agrees(op: Any) -> bool:
    """Whether `_collated` gives what the op's own call gives, checked once a process per class and
    mode on a batch of 8 noise images, for seeds drawing each branch (a copy of the op mixing
    always, MixUp or CutMix by turns, and the op as it is); NumPy's RNG is as it was after."""
    key = (type(op), op.mode)
    if key not in _checked:
        state = np.random.get_state()
        try:
            always = copy.copy(op)
            always.mix_prob, always.switch_prob, always.mixup_alpha, always.cutmix_alpha = 1.0, 0.5, 1.0, 1.0
            always.cutmix_minmax, always.mixup_enabled = None, True
            pixels = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (8, 3, 6, 5), dtype=np.uint8))
            targets = [k % max(1, int(op.num_classes)) for k in range(8)]
            same = True
            for one in (always, op):
                for seed in range(12):
                    np.random.seed(seed)
                    theirs = one([(x.clone(), t) for x, t in zip(pixels, targets)])
                    np.random.seed(seed)
                    ours = _collated(one, pixels.clone(), targets)
                    same = same and all(type(x) is torch.Tensor and x.dtype == y.dtype and torch.equal(x, y)
                                        for x, y in zip(theirs, ours)) and len(theirs) == 2
        except Exception:  # (a timm whose call or calls differ: its own call is used)
            same = False
        finally:
            np.random.set_state(state)
        _checked[key] = same
    return _checked[key]


class TimmCollate(RingCollate):
    """The working loader's collate_fn for timm's fast_collate and FastCollateMixup
    (`timm_collate_of`): a natively decoded batch in its slot, where it was decoded, mixed there
    as the op's call mixes it (see the module); the dataset's own samples (a fetch fastdata fell
    back on) go to the script's function itself."""

    def __init__(self, slots: int, pin: bool, fn: Any) -> None:
        RingCollate.__init__(self, slots, pin)
        self.fn = fn

    def _collate(self, batch: Any) -> Any:
        if type(batch) is not FolderBatch:
            return RingCollate._collate(self, batch) if isinstance(batch, Prepared) else self.fn(batch)
        op, n = self.fn, len(batch)
        mixes = is_fast_mixup(op)
        if not (all(type(t) is int for t in batch.targets)
                and (not mixes or (n % 2 == 0 and op.mode in _MODES and _agrees(op)))):
            # the function's own call on the samples, as timm's PILToTensor gives them (a view of HWC pixels)
            samples = [(x.clone().permute(2, 0, 1), t) for x, t in zip(batch.images, batch.targets)]
            self.rings.ring().drop([batch.handle])  # (a slot it was decoded into: free again)
            return op(samples)
        try:
            if mixes:
                _, target = _collated(op, batch.images.permute(0, 3, 1, 2), batch.targets)
            else:
                target = torch.utils.data.default_collate(batch.targets)  # (fast_collate's: class indices, int64)
        except BaseException:
            self.rings.ring().drop([batch.handle])
            raise
        ring = self.rings.ring()
        try:
            handle, layout = batch.crossed(ring)
        finally:
            ring.end()
        return [handle, target, replace(layout, tupled=True)]
