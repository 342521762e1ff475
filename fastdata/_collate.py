"""Collation: torch's own `collate` walk, with tensor and ndarray leaves copied by the native core.

Nested structure (tuples, lists, dicts, namedtuples), numbers, strings and every leaf the
native core does not take are handled by torch's `default_collate` machinery itself, so the
result is the same object `default_collate` would build, value for value.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np
import torch
from torch.utils.data import get_worker_info

from ._buffers import BufferRing, ProcessRings, new_batch
from ._cores import usable_cores
from ._ext import native as _ext
from ._torch_internals import collate_tensor_fn, default_collate_fn_map
from ._torch_internals import torch_collate as _torch_collate
from ._trace import trace_range

NATIVE = _ext is not None
"""True when collation runs in the native extension, False when in the Python fallback."""

# Below this many bytes a batch is cheaper to stack in torch than to hand to the native core:
# the call's fixed overhead outweighs the copy (benchmarks/collate.py).
_NATIVE_MIN_BYTES = 1 << 16
# In the main process a contiguous batch below this size is as fast through torch.stack:
# malloc recycles a cache-warm block. Above it malloc maps fresh pages every batch (glibc's
# mmap threshold tops out at 32 MiB), which the ring avoids. Strided sources (HWC seen as CHW)
# go native at any size: torch's strided copy is several times slower than the native kernels.
_MAIN_CONTIGUOUS_MIN_BYTES = 32 << 20


def _worth_it(nbytes: int, contiguous: bool) -> bool:
    if nbytes < _NATIVE_MIN_BYTES:
        return False
    if get_worker_info() is not None:
        return True  # torch's path maps a fresh shared-memory block per batch: always slower
    return not contiguous or nbytes >= _MAIN_CONTIGUOUS_MIN_BYTES


_NUMPY_TO_TORCH = {
    np.dtype(np.bool_): torch.bool,
    np.dtype(np.uint8): torch.uint8,
    np.dtype(np.int8): torch.int8,
    np.dtype(np.int16): torch.int16,
    np.dtype(np.int32): torch.int32,
    np.dtype(np.int64): torch.int64,
    np.dtype(np.float16): torch.float16,
    np.dtype(np.float32): torch.float32,
    np.dtype(np.float64): torch.float64,
}
_NATIVE_DTYPES = frozenset(_NUMPY_TO_TORCH.values()) | {torch.bfloat16}


def batch_len(batch: Any, size: int | None = None) -> int:
    """How many samples `batch` holds: the first dimension of its first array (a tensor or an
    ndarray of at least one dimension, looked for depth first through mappings, lists and
    tuples), else the length of a list or tuple of other things (strings, paths) or of a
    mapping's first such value (a dict of columns), else 1. Given `size`, the batch size a batch
    sampler asked for: that, unless the first array has fewer rows (a short last batch), since a
    first dimension may be another one (time-first padded sequences)."""
    rows = _first_rows(batch)
    if size is not None:
        return size if rows is None or rows >= size else rows
    if rows is not None:
        return rows
    if isinstance(batch, Mapping):
        batch = next((v for v in batch.values() if isinstance(v, (list, tuple))), None)
        if batch is None:
            return 1
    return len(batch) if isinstance(batch, (list, tuple)) else 1


def _first_rows(x: Any) -> int | None:
    if isinstance(x, (torch.Tensor, np.ndarray)):
        return int(x.shape[0]) if x.ndim else None
    items = x.values() if isinstance(x, Mapping) else x if isinstance(x, (list, tuple)) else ()
    for item in items:
        rows = _first_rows(item)
        if rows is not None:
            return rows
    return None


def default_threads() -> int:
    """Copy threads for one collation: 1 inside a worker process (the workers are the
    parallelism there), else the cores this process may run on, at most 8."""
    if get_worker_info() is not None:
        return 1
    return max(1, min(8, usable_cores()))


def copy_into_python(samples: Sequence[Any], out: torch.Tensor, threads: int = 1) -> torch.Tensor:
    """The fallback: out[i] = samples[i] with torch's `copy_`, which gives the native core's bits."""
    for i, s in enumerate(samples):
        out[i].copy_(torch.as_tensor(s))
    return out


def copy_into_native(samples: Sequence[Any], out: torch.Tensor, threads: int = 1) -> torch.Tensor:
    """out[i] = samples[i] (tensors or ndarrays of out's dtype and shape[1:]) on `threads`
    threads with the GIL released, whatever the strides on either side."""
    _ext.collate(list(samples), out, threads)
    return out


def _copy_checked_tensors(samples: Sequence[torch.Tensor], out: torch.Tensor, threads: int) -> None:
    """copy_into for tensors that `_native_ok` passed (CPU, out's dtype and shape[1:]): raw
    addresses and strides instead of a DLPack export per tensor, which would cost more than
    the copy of a small tensor."""
    if _ext is None:
        copy_into_python(samples, out)
        return
    strides = [s for t in samples for s in t.stride()]
    _ext.collate_ptrs([t.data_ptr() for t in samples], strides, out, threads)


copy_into = copy_into_native if _ext is not None else copy_into_python


_ring: BufferRing | None = None  # the slot ring of the collation under way in this process


def _new_batch(n: int, shape: Sequence[int], dtype: torch.dtype) -> tuple[torch.Tensor, Any]:
    """(buffer to collate into, what the batch holds) for the collation under way."""
    return new_batch(_ring, (n, *shape), dtype)


def _native_ok(batch: Sequence[torch.Tensor]) -> bool:
    """Whether the native core can take these tensors: plain dense CPU tensors of one dtype
    and shape (`_all_like`), of a size worth its call."""
    elem = batch[0]
    return _plain_first(elem) and _worth_it(_batch_bytes(batch), elem.is_contiguous()) and _all_like(batch)


def _batch_bytes(batch: Sequence[torch.Tensor]) -> int:
    """The batch's bytes, as its first sample gives them (the size is decided on it)."""
    return batch[0].numel() * batch[0].dtype.itemsize * len(batch)


def _plain_first(elem: torch.Tensor) -> bool:
    # (a nested tensor has a strided layout but no shape: torch's collate says it cannot batch them)
    return not elem.is_nested and elem.dtype in _NATIVE_DTYPES and elem.layout == torch.strided


def _all_like(batch: Sequence[torch.Tensor]) -> bool:
    """Whether every tensor is a plain dense CPU tensor of the first one's dtype and shape, with
    no autograd and no lazy negation bit. Plain attribute reads only: it runs on every tensor of
    every batch."""
    dtype, shape = batch[0].dtype, batch[0].shape
    for t in batch:
        if type(t) is not torch.Tensor or t.is_nested or t.layout != torch.strided or t.dtype is not dtype \
                or t.shape != shape:
            return False
        if t.requires_grad or not t.is_cpu or t.is_neg():
            return False
    return True


class ByValue:
    """A small batch leaf made in a worker, as it crosses to the main process: its bytes in the
    message. torch's own pickling would move it to a fresh shared-memory block and hand the
    main process its file descriptor over a socket, a connection per tensor per batch that
    costs the main process more than copying 64 KB (`benchmarks/run_cifar.py --dataset
    tutorial`: a batch of 4 images and its labels). It unpickles to a plain tensor of the
    same dtype, shape and values. Only a worker's RingCollate makes one (`_SENT_FN_MAP`): its
    batches go straight to the main process."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def __reduce__(self):
        t = self.tensor.contiguous()
        # (an empty tensor may have stride 0, torch.from_numpy's of an empty array: no bytes to view)
        data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        return (_from_bytes, (data, t.dtype, tuple(t.shape)))


def _from_bytes(data: bytes, dtype: torch.dtype, shape: tuple) -> torch.Tensor:
    out = torch.empty(shape, dtype=dtype)
    if data:
        np.copyto(out.reshape(-1).view(torch.uint8).numpy(), np.frombuffer(data, dtype=np.uint8))
    return out


def by_value(made: Any) -> Any:
    """`made` (a tensor made in a worker's private memory, bound for the main process): a
    ByValue if it is a plain tensor under 64 KB, else itself."""
    if type(made) is torch.Tensor and made.is_cpu and _plain_first(made) \
            and made.numel() * made.dtype.itemsize < _NATIVE_MIN_BYTES:
        return ByValue(made)  # (torch.tensor and as_tensor of numbers: CPU, no autograd)
    return made


def _collate_tensors(batch: Sequence[torch.Tensor], *, collate_fn_map: dict | None = None) -> Any:
    if not _native_ok(batch) or _stacks_to_a_layout(batch):
        return collate_tensor_fn(batch, collate_fn_map=collate_fn_map)
    elem = batch[0]
    out, result = _new_batch(len(batch), elem.shape, elem.dtype)
    _copy_checked_tensors(batch, out, default_threads())
    return result


def _stacks_to_a_layout(batch: Sequence[torch.Tensor]) -> bool:
    """Whether torch's collate would give this batch a layout of its own: in the training process
    it stacks without `out=`, which keeps samples' memory format (channels_last ones), where
    fastdata's buffer is contiguous; a worker's stacks into shared memory, contiguous. Told by
    stacking the first sample alone (the format follows the samples', not their count)."""
    elem = batch[0]
    return not elem.is_contiguous() and get_worker_info() is None and not torch.stack(batch[:1]).is_contiguous()


def _sent_tensors(batch: Sequence[torch.Tensor], *, collate_fn_map: dict | None = None) -> Any:
    """`_collate_tensors` for a worker's batch: a small plain one stacked in private memory, by value."""
    if _plain_first(batch[0]) and _batch_bytes(batch) < _NATIVE_MIN_BYTES and _all_like(batch):
        return ByValue(torch.stack(batch))
    return _collate_tensors(batch, collate_fn_map=collate_fn_map)


def _collate_arrays(batch: Sequence[np.ndarray], *, collate_fn_map: dict | None = None) -> Any:
    elem = batch[0]
    dtype = _NUMPY_TO_TORCH.get(elem.dtype)
    if (
        dtype is None
        or not _worth_it(elem.nbytes * len(batch), elem.flags.c_contiguous)  # decided on the first
        or any(a.dtype != elem.dtype or a.shape != elem.shape for a in batch)
        or any(s < 0 for a in batch for s in a.strides)  # (torch.as_tensor refuses a negative stride)
    ):
        # torch's path: the string/object dtype check, then as_tensor and the map's tensor function.
        return default_collate_fn_map[np.ndarray](batch, collate_fn_map=collate_fn_map)
    global _READ_ONLY_WARNED
    if not _READ_ONLY_WARNED:  # torch.as_tensor's warning on a read-only array, once a process as default_collate's
        read_only = next((a for a in batch if not a.flags.writeable), None)
        if read_only is not None:
            torch.as_tensor(read_only)
            _READ_ONLY_WARNED = True
    out, result = _new_batch(len(batch), elem.shape, dtype)
    copy_into(batch, out, default_threads())
    return result


_READ_ONLY_WARNED = False


def _numbers(fn: Callable) -> Callable:
    """torch's collate function `fn` for numbers (a new tensor in private memory), by value if small."""
    return lambda batch, *, collate_fn_map=None: by_value(fn(batch, collate_fn_map=collate_fn_map))


COLLATE_FN_MAP: dict[type | tuple[type, ...], Callable] = {
    **default_collate_fn_map, torch.Tensor: _collate_tensors, np.ndarray: _collate_arrays}
# A worker's RingCollate: COLLATE_FN_MAP, with numbers and small tensors sent by value.
_SENT_FN_MAP: dict[type | tuple[type, ...], Callable] = {
    **{t: _numbers(fn) if t in (int, float) or (isinstance(t, tuple) and np.bool_ in t) else fn
       for t, fn in COLLATE_FN_MAP.items()}, torch.Tensor: _sent_tensors}


class Prepared:
    """A batch its dataset built whole, in `__getitems__` (which torch's fetcher calls in place
    of `__getitem__` per index): the collate functions here lay it out with `collate_into`
    instead of collating samples."""

    def collate_into(self, ring: BufferRing | None) -> Any:
        """The batch, as default_collate gives it, its tensors in a slot of `ring` (None: fresh)."""
        raise NotImplementedError


def collate(batch: Sequence[Any]) -> Any:
    """`torch.utils.data.default_collate`, value for value, with native tensor and array leaves."""
    if isinstance(batch, Prepared):
        return batch.collate_into(None)
    return _torch_collate(batch, collate_fn_map=COLLATE_FN_MAP)


def collate_leaves(batch: Sequence[Any], ring: BufferRing | None) -> Any:
    """`collate` for a Prepared batch's other leaves (its labels) as `collate_into(ring)` lays
    it out: from a worker's ring (the batch goes straight to the main process), small ones by value."""
    return _torch_collate(batch, collate_fn_map=_SENT_FN_MAP if ring is not None and ring.shared else COLLATE_FN_MAP)


class Timed(NamedTuple):
    """A batch collated with stage timing on, and its stage seconds (what the loader sums)."""

    batch: Any
    stages: dict


def _cpu_clock() -> Callable[[], float]:
    """The CPU clock stage timing reads: the process's in a worker (its only work), the thread's
    in the training process (whose other threads are not the fetch's)."""
    return time.process_time if get_worker_info() is not None else time.thread_time


class RingCollate:
    """The loader's collate_fn: `collate`, writing into a reused slot of this process's ring
    (see `ProcessRings`). Picklable, so worker processes get it."""

    def __init__(self, slots: int, pin: bool = False) -> None:
        self.rings = ProcessRings(slots, pin)
        self._calls = 0
        # Stage timing (fastdata.profile): None when off (one check a batch); True: each batch
        # comes out as Timed, with its stage seconds.
        self.timing: bool | None = None
        self._left: tuple[float, float] | None = None  # (CPU, wall) clocks when this process's last collation ended

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_left": None}

    def __call__(self, batch: Sequence[Any]) -> Any:
        if self.timing is None:
            return self._collate(batch)
        return self._timed(batch)

    def fetching(self) -> None:
        """Marks that this process starts fetching a batch: a loader with no workers asked for
        one, or a worker took its indices (`_torch_internals.mark_fetches`)."""
        self._left = (_cpu_clock()(), time.perf_counter())

    def _timed(self, batch: Sequence[Any]) -> Timed:
        """The collation, timed. The time since `fetching` marked the fetch's start is the
        dataset's: its CPU seconds as "dataset", the rest of its wall time (I/O, sleeps) as
        "read", counted in "fetched" batches. Not the time since the last collation: a worker
        then waited for its next indices, and with no workers the consumer ran its step.
        Without a mark (a collate_fn called by other code), the time since this process's
        last collation, if any. CPU seconds, not wall time, for what computes, like the image
        backends' stages: under contention wall time counts the waits for a core too."""
        info = get_worker_info()
        clock = _cpu_clock()
        start, wall = clock(), time.perf_counter()
        with trace_range("fastdata.collate"):
            out = self._collate(batch)
        end = clock()
        stages = {"worker": info.id if info is not None else -1, "collate": end - start, "images": len(batch),
                  "batches": 1}
        if self._left is not None:
            cpu = start - self._left[0]
            stages.update(dataset=cpu, read=max(0.0, wall - self._left[1] - cpu), fetched=1)
        self._left = (end, time.perf_counter())
        return Timed(out, stages)

    def _collate(self, batch: Sequence[Any]) -> Any:
        global _ring
        if isinstance(batch, Prepared):
            ring = self.rings.ring()
            try:
                return batch.collate_into(ring)
            finally:
                ring.end()
        # A worker's batches go straight to the main process: their small leaves by value.
        sent = get_worker_info() is not None
        if self._calls < 0:
            # The first batches had nothing for the native core (small or contiguous leaves in
            # this process): torch's own collate from here on, with no routing cost per leaf.
            # (The result is the same either way; this only skips the checks.)
            return _torch_collate(batch, collate_fn_map=_SENT_FN_MAP if sent else default_collate_fn_map)
        ring = self.rings.ring()
        _ring = ring  # a slot is claimed at the batch's first native leaf, if it has one
        try:
            return _torch_collate(batch, collate_fn_map=_SENT_FN_MAP if sent else COLLATE_FN_MAP)
        finally:
            _ring = None
            used = ring.claimed is not None
            ring.end()
            self._calls = 0 if used else (self._calls + 1 if self._calls < 2 else -1)
