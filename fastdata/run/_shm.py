"""Whether /dev/shm has room for the workers `fastdata run` gives a natively served folder whose
script left num_workers at 0 (`fastdata.run._decide.auto_workers`).

Workers pass their batches through torch's shared memory, files in /dev/shm, which a container
may keep small (Docker's default is 64 MB); a worker that cannot allocate there fails the
script's pass, where the script's own 0 workers would have used none. So workers are added only
where /dev/shm has room for what they take: each worker collates into prefetch_factor + 2 slots
(DataLoader's prefetch_factor with workers is 2) of shared memory, each a batch of uint8 HWC
images; the main process lays each batch out in as many slots of the transform's dtype, shared
pages too (its workers fork while it holds them) unless they are pinned; and a quarter more for
what else crosses (the labels, a fresh batch while the script holds every slot's). The room is
what is free, less what this process's other datasets given workers this way take, shared among
the ranks torchrun started on the node (LOCAL_WORLD_SIZE).
"""

from __future__ import annotations

import os
import weakref
from typing import Any

import torch

from .._loader import resolve_workers
from ..transforms import ops as fd
from ._crop import Pad, RandomCrop
from ._folders import leaves, samples_of

_SLOTS = 2 + 2  # a ring's slots: prefetch_factor + 2, at DataLoader's 2 (auto_workers: the script set none)
_held: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()  # dataset -> its workers' bytes


def shm_free() -> int | None:
    """Bytes free in /dev/shm; None where there is none to measure."""
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def shm_room(call: dict, lowering: Any) -> str:
    """Why /dev/shm has no room for the batches of "auto" workers of `DataLoader(**call)`, a
    folder served natively with `lowering` (a `fastdata.run._lowering.Lowering`); "" where it has."""
    free = shm_free()
    if free is None:
        return ""
    dataset, workers = call["dataset"], resolve_workers("auto")
    views = lowering.views or (lowering,)  # (a multi-view wrapper's batch holds each view's images)
    sizes = [image_size(view.geometry, dataset) for view in views]
    if None in sizes:
        return "the images' size could not be read (the first file's header) to size the workers' /dev/shm"
    pin = bool(call.get("pin_memory")) and torch.accelerator.is_available()
    laid_out = 0 if pin else max(view.dtype.itemsize for view in views)
    # uint8 in each worker's ring, the transform's dtype in this process's; and a quarter more
    pixels = sum(h * w for h, w in sizes)
    need = _SLOTS * call.get("batch_size", 1) * 3 * pixels * (workers + laid_out) * 5 // 4
    ranks = os.environ.get("LOCAL_WORLD_SIZE", "")
    ranks = int(ranks) if ranks.isdigit() and int(ranks) > 0 else 1
    room = (free - sum(n for d, n in _held.items() if d is not dataset)) // ranks
    if need > room:
        mb = [f"{max(n, 0) / 2**20:,.0f} MB" for n in (free, room, need)]
        share = f" ({mb[1]} of it for this loader)" if room != free else ""
        return (f"/dev/shm has {mb[0]} free{share}, and {workers} workers' batches would take about {mb[2]} "
                "(Docker's default is 64 MB: docker run --shm-size)")
    try:
        _held[dataset] = need
    except TypeError:  # a dataset that cannot be held weakly (or hashed): its share goes uncounted
        pass
    return ""


def image_size(geometry: tuple, dataset: Any) -> tuple[int, int] | None:
    """(h, w) of a batch's images out of fastdata's `geometry` ops: the last crop or resize to a
    size, through any later resize of the shorter side or padding; without one, from the size of
    the dataset's first file (a batch's images have one size, or the script's own collation
    fails). None where that file's size cannot be read."""
    fixed = [k for k, op in enumerate(geometry) if isinstance(op, (fd.RandomResizedCrop, fd.CenterCrop, fd.Resize,
                                                                    RandomCrop)) and not isinstance(op.size, int)]
    size = tuple(geometry[fixed[-1]].size) if fixed else _first_size(leaves(dataset)[0])
    for op in geometry[fixed[-1] + 1 if fixed else 0:]:
        if isinstance(op, fd.Resize) and size is not None:  # the shorter side to op.size, as torchvision's
            (h, w), short = size, op.size
            size = (short, int(short * w / h)) if h <= w else (int(short * h / w), short)
        elif isinstance(op, Pad) and size is not None:
            size = op.padded_size(*size)
    return size


def _first_size(dataset: Any) -> tuple[int, int] | None:
    try:
        from PIL import Image

        with Image.open(samples_of(dataset, [0])[0][0]) as image:
            return image.size[::-1]
    except Exception:  # a probe: no samples, no Pillow, a file Pillow cannot open: the size is unknown
        return None
