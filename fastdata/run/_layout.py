"""`fastdata run`: the layout of a natively served batch (`fastdata.run._torchvision`,
`fastdata.run._arrays`): its uint8 NHWC images, as they cross from the fetching process
(`FolderBatch`), written into NCHW of the dtype the transform ends in through the transform's
tensor steps (`Layout`), as torchvision's own operations compute them: natively through a
lookup table of 256 values a channel (`lay_out`), in the main process (`Finish`), or where a
collate_fn of the script's gets the samples, where they are fetched; then the script's MixUp or
CutMix where its collate_fn mixes (`fastdata.run._mixup`). In workers fastdata added (the script
asked for none), a batch's error crosses as the batch, to be raised in the main process as the
script's own process raises it (`Carried`, `CarryingCollate`).
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import get_worker_info

from .._buffers import ProcessRings, new_batch
from .._collate import Prepared, RingCollate, collate_leaves, default_threads
from .._ext import native as _ext
from .._torch_internals import collate_error_in_process
from ..backends.torch_iter import Raised
from ._erasing import erase
from ._lowering import Lowering, steps_dtype


def apply_steps(out: torch.Tensor, image: torch.Tensor, steps: tuple) -> None:
    """Writes `image` (uint8 HWC) through `steps` into `out` (CHW), with torchvision's own
    operations: ToTensor's `.to(dtype).div(255)`, ConvertImageDtype's `/ 255`, ToDtype's
    `.mul_(1 / 255)`, Normalize's `.sub_(mean).div_(std)` with float mean and std of the image's
    dtype; so the values are torchvision's, bit for bit, for the same uint8 pixels."""
    out.copy_(image.permute(2, 0, 1))
    for step in steps:
        if step[0] == "to":
            if step[2] == "div":
                out.div_(255)
            elif step[2] == "mul":
                out.mul_(1.0 / 255)
        else:
            _, mean, std = step
            m = torch.as_tensor(mean, dtype=out.dtype).view(-1, 1, 1)
            s = torch.as_tensor(std, dtype=out.dtype).view(-1, 1, 1)
            out.sub_(m).div_(s)


def lookup_table(steps: tuple, dtype: torch.dtype) -> torch.Tensor:
    """[3, 256] of `dtype`: what `steps` make of each uint8 value in each channel, computed by
    `apply_steps` itself. Every step is per value and per channel, so laying out a batch
    through this table (natively, in one pass) gives `apply_steps`' values bit for bit."""
    values = torch.arange(256, dtype=torch.uint8).view(1, 256, 1).expand(1, 256, 3)
    out = torch.empty((3, 1, 256), dtype=dtype)
    apply_steps(out, values, steps)
    return out.view(3, 256)  # (a 1-channel image's: its first row, where a Normalize has one mean and std)


@dataclass(frozen=True)
class Layout:
    """The tensor steps a natively decoded batch's images take in the main process, carried with
    the batch: the lowering it was decoded with is the transform as the fetching process held it."""

    steps: tuple
    erased: tuple = ()  # per RandomErasing, (its _erasing.Erase, its rectangles: `_erasing.draw`'s bytes)
    seed: int = 0  # the batch's seed, which RandomErasing's noise (value='random') is drawn from
    # the script's MixUp or CutMix drawn for the batch (`_mixup`): ("mixup", lam), ("cutmix", (x1, y1, x2, y2))
    mixed: tuple = ()
    # whether the script's collate_fn gives a tuple (torchvision's MixUp and CutMix; timm's, `_timm_collate`)
    tupled: bool = False


class FolderBatch(Prepared):
    """A decoded batch (uint8 NHWC: in a slot of the collation's ring, `handle` as the slot hands
    it on; else in the process's scratch), its targets and `Layout`. It crosses to the main
    process as uint8 (a quarter of float32's bytes and shared pages), where `Finish` lays it out
    in the transform's dtype."""

    def __init__(self, images: torch.Tensor, targets: list, steps: tuple, erased: tuple = (), seed: int = 0,
                 handle: Any = None) -> None:
        self.images, self.targets, self.steps = images, targets, steps
        self.erased, self.seed, self.handle = erased, seed, handle

    def __len__(self) -> int:
        return len(self.images)

    def crossed(self, ring: Any) -> tuple[Any, "Layout"]:
        """(the images as a slot of `ring` hands them on, copied there from scratch if they were
        not decoded there, their `Layout`)."""
        handle = self.handle
        if handle is None:
            out, handle = new_batch(ring, tuple(self.images.shape), torch.uint8)
            out.copy_(self.images)
        return handle, Layout(self.steps, self.erased, self.seed)

    def collate_into(self, ring: Any) -> Any:
        handle, layout = self.crossed(ring)
        # (a tuple, as default_collate's transpose gives it: strings are collated as they come)
        return [handle, collate_leaves(tuple(self.targets), ring), layout]


class Views(tuple):
    """The `Layout` of each view of a multi-view wrapper's batch, in order."""


class FolderViews(Prepared):
    """A multi-view wrapper's batch: a `FolderBatch` per view, and the targets (collated once)."""

    def __init__(self, batches: list, targets: list) -> None:
        self.batches, self.targets = batches, targets

    def __len__(self) -> int:
        return len(self.targets)

    def collate_into(self, ring: Any) -> Any:
        handles, layouts = zip(*(batch.crossed(ring) for batch in self.batches))
        return [list(handles), collate_leaves(tuple(self.targets), ring), Views(layouts)]


def lay_out(images: torch.Tensor, layout: Layout, out: torch.Tensor, tables: dict) -> None:
    """Writes a natively served batch's uint8 NHWC `images` into `out` (NCHW, the dtype of the
    layout's steps) as `layout` gives them: through a lookup table natively (made once per steps
    and dtype, kept in `tables`), else `apply_steps`; then the RandomErasing rectangles it
    carries (`_erasing.erase`)."""
    steps = layout.steps
    if _ext is not None and len(images):
        table = tables.get((steps, out.dtype))
        if table is None:
            if len(tables) > 8:  # a transform changed pass after pass
                tables.clear()
            table = tables[(steps, out.dtype)] = lookup_table(steps, out.dtype)
        c = images.shape[3]
        _ext.lookup_planes(images, table if c == 3 else table[:c].contiguous(), out, default_threads())
    else:
        for k in range(len(images)):
            apply_steps(out[k], images[k], steps)
    if layout.erased:
        erase(out, steps, layout.erased, layout.seed, apply_steps)
    if layout.mixed:
        mix(out, layout.mixed)


def mix(out: torch.Tensor, mixed: tuple) -> None:
    """torchvision's MixUp (`x.roll(1, 0).mul_(1.0 - lam).add_(x.mul(lam))`) or CutMix (the box of
    the sample before, the first sample's from the last) of the batch `out`, in place, bit for bit."""
    kind, value = mixed
    if kind == "cutmix":
        x1, y1, x2, y2 = value
        box = out[..., y1:y2, x1:x2]
        box.copy_(box.roll(1, 0))
    elif _ext is not None and out.dtype == torch.float32 and out.is_contiguous():
        _ext.mix_rolled(out, value, default_threads())
    else:
        out.copy_(out.roll(1, 0).mul_(1.0 - value).add_(out.mul(value)))


class Finish:
    """The main process's step for a natively served loader: each natively decoded batch's uint8
    NHWC images laid out as its `Layout` gives them (`lay_out`: NCHW, the transform's dtype and
    values), in a reused slot of this process's ring (pinned with `pin`; shared pages with
    `forks`, for a loader that forks workers). A batch of the dataset's own samples (a transform
    not lowered) passes as it is."""

    def __init__(self, lowering: Lowering, slots: int, pin: bool, forks: bool) -> None:
        self.lowering = lowering
        self.rings = ProcessRings(slots, pin, forks)
        self._tables: dict[tuple, torch.Tensor] = {}

    def __call__(self, batch: Any) -> Any:
        if type(batch) is not list or len(batch) != 3 or type(batch[2]) not in (Layout, Views):
            return batch
        # (a multi-view wrapper's: a list of images per view, as default_collate gives its samples' lists)
        views = type(batch[2]) is Views
        images, layouts = (batch[0], batch[2]) if views else ([batch[0]], [batch[2]])
        ring = self.rings.ring()
        dtypes = [steps_dtype(layout.steps) for layout in layouts]
        reserve = sum(x.numel() * dtype.itemsize for x, dtype in zip(images, dtypes))  # (the views' outputs)
        try:
            outs = []
            for x, layout, dtype in zip(images, layouts, dtypes):
                n, h, w, c = x.shape
                out, handle = new_batch(ring, (n, c, h, w), dtype, reserve)
                lay_out(x, layout, out, self._tables)
                outs.append(handle)
        finally:
            ring.end()
        if layouts[0].tupled:
            return (outs[0], batch[1])
        return [outs if views else outs[0], batch[1]]


class Carried(Prepared):
    """The error of a batch's fetch in a worker fastdata added, crossing to the main process as
    the batch: collated, it is the `Raised` that the loader's pass raises there, the error
    itself (as the script's own process raised it), and the pass goes on with the next batch."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __len__(self) -> int:
        return 0

    def collate_into(self, ring: Any) -> Any:
        return Raised(self.error)


class CarryingCollate(RingCollate):
    """The loader's collate_fn (fastdata's collation) in workers fastdata added: a batch it
    cannot collate crosses as the error the script's own process raises for it (the `Raised`
    the pass raises there), not as torch's worker re-raises it ("Caught ... in DataLoader worker
    process k", and for samples of different sizes another error: a worker stacks into shared
    memory sized from the samples, and resizing it raises first). A batch fastdata built
    (`Prepared`) raises where torch's collate refuses its labels (None ones): the same error."""

    def _collate(self, batch: Any) -> Any:
        try:
            return RingCollate._collate(self, batch)
        except Exception as e:
            if get_worker_info() is None:
                raise
            error = e if isinstance(batch, Prepared) else collate_error_in_process(batch)
            if error is None or not picklable(error):  # (one that cannot cross as it is: torch's worker re-raises it)
                raise
        return Raised(error)


def picklable(error: BaseException) -> bool:
    """Whether `error` crosses to another process as it is."""
    try:
        pickle.dumps(error)
        return True
    except Exception:  # an attribute or argument pickle cannot take
        return False
