"""A ring of reusable batch buffers, for collating in place instead of allocating per batch.

NOTE: why a ring, and why leases. A fresh batch buffer costs more than filling it:
page-faulting new memory is about ten times slower than a native copy into memory already
mapped (worse from two threads at once). DataLoader pays that every batch twice over: workers
collate into a fresh shared-memory block, and with `pin_memory=True` its pin thread copies
each batch again into fresh pinned memory. Here each process collates into one of a few slots
that it maps once and reuses; worker slots are shared memory, so the batch reaches the main
process with no copy, and main-process slots are pinned when an accelerator is there, so
pinning costs no copy.

A slot may be reused only when every tensor handed out of it is dead, and the user may hold a
batch for as long as they like. So each tensor the user gets aliases its slot through a *lease*
(a buffer object that `torch.frombuffer` keeps alive for as long as the tensor's storage, views
included); when the last of them dies the lease clears its byte in the slot's flag row. Flags
live in shared memory, so a worker sees its slots come free without any message. When no slot
is free, collation falls back to a fresh buffer: nothing ever waits on the user.
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
import weakref
from typing import Any, Sequence

import numpy as np
import torch

from ._torch_internals import new_shared_storage, new_shared_tensor
from .errors import shared_memory_error

_ALIGN = 64
MAX_LEAVES = 32  # tensors per batch that can live in one slot; more go to fresh buffers


class Flags:
    """One byte per (slot, leaf): 1 while a tensor handed out of that leaf may be alive."""

    def __init__(self, storage: torch.UntypedStorage) -> None:
        self.storage = storage  # keeps the (maybe shared) memory mapped while a lease needs it
        self.array = np.ctypeslib.as_array(
            (ctypes.c_uint8 * storage.nbytes()).from_address(storage.data_ptr())
        ).reshape(-1, MAX_LEAVES)


@functools.lru_cache(maxsize=256)
def _lease_type(nbytes: int) -> type:
    class Lease(ctypes.c_uint8 * nbytes):  # type: ignore[misc, valid-type]
        """Aliases `nbytes` of a slot; frees its flag when the last tensor over it dies."""

        def __del__(self) -> None:
            self.flags.array[self.slot, self.leaf] = 0
            if self.live is not None:
                self.live.discard((self.slot, self.leaf))

    return Lease


def leased_tensor(
    storage: torch.UntypedStorage,
    offset: int,
    shape: Sequence[int],
    dtype: torch.dtype,
    flags: Flags,
    slot: int,
    leaf: int,
    live: set | None = None,
) -> torch.Tensor:
    """A tensor over `storage[offset:]` that clears `flags[slot, leaf]` when it dies."""
    itemsize = dtype.itemsize
    nbytes = math.prod(shape) * itemsize
    if nbytes == 0:
        flags.array[slot, leaf] = 0
        return torch.empty(shape, dtype=dtype)
    lease = _lease_type(nbytes).from_address(storage.data_ptr() + offset)
    lease.storage, lease.flags, lease.slot, lease.leaf, lease.live = storage, flags, slot, leaf, live
    if live is not None:
        live.add((slot, leaf))
    return torch.frombuffer(lease, dtype=dtype, count=nbytes // itemsize).view(shape)


class WorkerRings:
    """The main process's record of each worker's ring, for one pass of a DataLoader iterator
    (one generation of workers), so that the next pass's workers (new processes, unless
    persistent) adopt the slots instead of page-faulting new ones.

    A generation owns its rings until it ends (`end`: its workers are gone and the slots of
    batches it never delivered are freed); only then does the next generation adopt them
    (`successor`). So ending an old pass late, after a newer one started, can never free a
    slot that the newer pass's workers are filling: a newer pass that starts before the old
    one ended gets rings of its own."""

    def __init__(self) -> None:
        self.token = os.urandom(8).hex()
        self.rings: dict[int, tuple[torch.UntypedStorage, list]] = {}  # worker id -> (flags, slot storages)
        self._flags: dict[int, Flags] = {}  # worker id -> a view of its flags, made once
        self.live: dict[int, set] = {}  # worker id -> (slot, leaf) with a lease alive here
        self.ended = True  # nothing under way yet: a successor may adopt (nothing)
        _WORKER_RINGS[self.token] = self

    def __getstate__(self) -> dict:
        # To a spawned worker: the storages travel as shared-memory handles.
        return {"token": self.token, "rings": self.rings, "live": {}, "_flags": {}, "ended": False}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def successor(self) -> "WorkerRings":
        """The record for the next generation of workers: this one's rings when it has ended
        (they pass over whole, with the leases still alive here), else empty."""
        new = WorkerRings()
        if self.ended:
            new.rings, new._flags, new.live = self.rings, self._flags, self.live
            self.rings, self._flags, self.live = {}, {}, {}
        new.ended = False
        return new

    def received(self, worker: int, flags: torch.UntypedStorage | None, slot: int, storage) -> tuple:
        """Records a worker's slot as its batch arrives: (its flags, the leases alive here, the
        slot's storage). None for flags or storage: the one recorded (the worker sent it before)."""
        ring = self.rings.get(worker)
        if flags is not None and (ring is None or ring[0].data_ptr() != flags.data_ptr()):
            ring = self.rings[worker] = (flags, [])
            self._flags[worker] = Flags(flags)
        if ring is None or (storage is None and (slot >= len(ring[1]) or ring[1][slot] is None)):
            raise RuntimeError(f"a batch from DataLoader worker {worker} names a buffer this process was never sent")
        storages = ring[1]
        if storage is None:
            storage = storages[slot]
        else:
            storages.extend([None] * (slot + 1 - len(storages)))
            storages[slot] = storage
        return self._flags[worker], self.live.setdefault(worker, set()), storage

    def end(self) -> None:
        """After this generation's workers exited: frees the slots of batches that were in
        flight and never delivered (an epoch left early), which no lease will ever free."""
        if self.ended:
            return
        self.ended = True
        for worker, (flags, _) in self.rings.items():
            array = self._flags.setdefault(worker, Flags(flags)).array
            live = self.live.get(worker, set())
            for slot, leaf in zip(*np.nonzero(array)):
                if (int(slot), int(leaf)) not in live:
                    array[slot, leaf] = 0


_WORKER_RINGS: "weakref.WeakValueDictionary[str, WorkerRings]" = weakref.WeakValueDictionary()


def _rebuild(token, worker, flags_storage, storage, slot, leaf, offset, shape, dtype) -> torch.Tensor:
    # Runs in the main process as a worker's batch is unpickled: a leased tensor over the
    # worker's slot, and the slot recorded so the mapping stays. A storage this process holds
    # already comes as None (see SlotLeaf) and is taken from the record.
    record = _WORKER_RINGS.get(token)
    if record is None:  # unpickled outside the loader that made it
        if flags_storage is None or storage is None:
            raise RuntimeError("a batch from a DataLoader worker arrived after its loader was gone")
        return leased_tensor(storage, offset, shape, dtype, Flags(flags_storage), slot, leaf)
    flags, live, storage = record.received(worker, flags_storage, slot, storage)
    return leased_tensor(storage, offset, shape, dtype, flags, slot, leaf, live)


class SlotLeaf:
    """A tensor collated into a worker's slot, as it crosses to the main process: it pickles to
    a leased tensor over the same shared memory (no copy). A storage goes as a file descriptor
    the first time only (torch's sharing hands each one over a socket, a connection per storage
    per batch, about as costly as laying out a small batch); after that the main process takes
    it from its record of the ring (`WorkerRings.received`). A worker's batches are pickled in
    the order they are sent and unpickled in that order, so the first one reaches the record
    before any that leaves it out."""

    __slots__ = ("ring", "storage", "slot", "leaf", "offset", "shape", "dtype")

    def __init__(self, ring: "BufferRing", storage, slot, leaf, offset, shape, dtype) -> None:
        self.ring, self.storage, self.slot, self.leaf = ring, storage, slot, leaf
        self.offset, self.shape, self.dtype = offset, tuple(shape), dtype

    def narrow(self, dim: int, start: int, length: int) -> "SlotLeaf":
        """The first `length` rows (as Tensor.narrow(0, 0, length)), for a batch with samples left out."""
        if dim != 0 or start != 0:
            raise ValueError("a slot leaf narrows along dimension 0 from row 0 only")
        return SlotLeaf(self.ring, self.storage, self.slot, self.leaf, self.offset, (length, *self.shape[1:]), self.dtype)

    def __reduce__(self):
        r = self.ring
        flags = None if r.told[-1] is r.flags_storage else r.flags_storage
        storage = None if r.told[self.slot] is self.storage else self.storage
        r.told[-1], r.told[self.slot] = r.flags_storage, self.storage
        return (_rebuild, (r.token, r.worker, flags, storage, self.slot, self.leaf, self.offset, self.shape, self.dtype))


def unsent(batch: Any) -> None:
    """For a worker's batch that failed to pickle, so never reached the main process: the slots
    its leaves hold are free again, and their rings send every storage again (pickling marks a
    storage as sent before the whole batch is, see `SlotLeaf.__reduce__`)."""
    stack, seen = [batch], set()
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, SlotLeaf):
            obj.ring.flags.array[obj.slot, obj.leaf] = 0
            obj.ring.told[:] = [None] * len(obj.ring.told)
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
        elif isinstance(obj, dict):
            stack.extend(obj.values())


class BufferRing:
    """`slots` reusable batch slots of growing capacity, in shared, pinned or plain memory."""

    def __init__(self, slots: int, shared: bool, pin: bool = False, token: str = "", worker: int = -1,
                 adopt: tuple | None = None, forks: bool = False) -> None:
        self.shared, self.pin, self.token, self.worker, self.forks = shared, pin, token, worker, forks
        if adopt is not None and len(adopt[1]) <= slots:
            self.flags_storage = adopt[0]
            self.storages: list[torch.UntypedStorage | None] = list(adopt[1]) + [None] * (slots - len(adopt[1]))
            told = [*self.storages, self.flags_storage]
        else:
            flags = torch.zeros(slots * MAX_LEAVES, dtype=torch.uint8)
            if shared:
                flags.share_memory_()
            self.flags_storage = flags.untyped_storage()
            self.storages = [None] * slots
            told = [None] * (slots + 1)
        # A worker's: the storage of each slot (and last, the flags) the main process holds, so a
        # batch need not send it again (see SlotLeaf): an adopted ring's came from its record.
        self.told: list[Any] = told
        self.flags = Flags(self.flags_storage)
        self._last = -1  # the slot claimed last
        self._slot: int | None = None
        self.claimed: bool | None = None  # None: no claim tried for this batch yet
        self._offset = 0
        self._leaf = 0

    def _new_storage(self, nbytes: int) -> torch.UntypedStorage:
        try:
            # Pages mapped shared, too, for a process that forks workers while it holds the ring:
            # a fork makes its private pages copy-on-write while a child lives, and each slot's
            # first write after a fork (fresh workers every epoch) would copy it whole. Made
            # shared, not shared after (`share_memory_` copies the storage into new pages).
            if self.shared or (self.forks and not self.pin):
                return new_shared_storage(nbytes)
            storage = torch.UntypedStorage(nbytes)
            return storage.pin_memory() if self.pin else storage
        except RuntimeError as e:
            raise shared_memory_error(e, nbytes) from None

    def begin(self) -> bool:
        """Claims a free slot for the next batch; False when every slot is still held."""
        # The next free slot after the last one claimed, in turn: every slot is made in the
        # first few batches, so the ring's memory is at its bound from the first epoch on,
        # instead of growing a slot at a time, whenever the consumer's timing first holds one
        # more batch (the page faults are the same, paid once either way).
        n = len(self.storages)
        for i in range(1, n + 1):
            s = (self._last + i) % n
            if not self.flags.array[s].any():
                self._slot, self._offset, self._leaf = s, 0, 0
                self._last = s
                self.claimed = True
                return True
        self._slot = None
        self.claimed = False
        return False

    def end(self) -> None:
        self._slot = None
        self.claimed = None

    def drop(self, leaves: list) -> None:
        """Ends the claim of a batch that will not be sent, its slot's `leaves` (`SlotLeaf`s,
        as `new_batch` gave them) free again (`unsent`)."""
        unsent(leaves)
        self.end()

    def alloc(self, shape: Sequence[int], dtype: torch.dtype, reserve: int = 0):
        """A (tensor to collate into, handle for the user) pair in the claimed slot, or None;
        `reserve`: see `new_batch`."""
        s = self._slot
        if s is None or self._leaf >= MAX_LEAVES:
            return None
        itemsize = dtype.itemsize
        nbytes = math.prod(shape) * itemsize
        start = -(-self._offset // _ALIGN) * _ALIGN
        # (a reserve, at the first leaf: the leaves each start aligned, up to _ALIGN - 1 bytes apart)
        reserved = reserve + MAX_LEAVES * _ALIGN if reserve and self._leaf == 0 else 0
        storage = self.storages[s]
        if storage is None or storage.nbytes() < max(start + nbytes, reserved):
            old = 0 if storage is None else storage.nbytes()
            storage = self._new_storage(max(start + nbytes, reserved) if reserved else max(2 * old, start + nbytes))
            self.storages[s] = storage
        leaf = self._leaf
        self._offset, self._leaf = start + nbytes, leaf + 1
        self.flags.array[s, leaf] = 1
        target = torch.empty(0, dtype=dtype).set_(storage, start // itemsize, tuple(shape))
        if self.shared:
            return target, SlotLeaf(self, storage, s, leaf, start, shape, dtype)
        return target, leased_tensor(storage, start, shape, dtype, self.flags, s, leaf)


def new_batch(ring: BufferRing | None, shape: Sequence[int], dtype: torch.dtype,
              reserve: int = 0) -> tuple[torch.Tensor, Any]:
    """(buffer to write a batch into, what the batch holds): a slot of `ring` (claimed at the
    batch's first buffer) when one is free, else a fresh buffer: in a worker, straight into
    shared memory as default_collate does, so it crosses to the main process without a copy.
    `reserve`, at a batch's first buffer: the bytes of all its buffers, for a slot made that
    large at once (grown a buffer at a time, a slot's first pages would be written only in its
    second batch, and the larger storages made on the way dropped)."""
    if ring is not None:
        if ring.claimed is None:
            ring.begin()
        got = ring.alloc(shape, dtype, reserve)
        if got is not None:
            return got
    from torch.utils.data import get_worker_info

    if get_worker_info() is not None:
        try:
            out = new_shared_tensor(tuple(shape), dtype)
        except RuntimeError as e:
            raise shared_memory_error(e, math.prod(shape) * dtype.itemsize) from None
    else:
        out = torch.empty(tuple(shape), dtype=dtype)
    return out, out


class ProcessRings:
    """Whoever collates into rings holds one: it gives each process its own ring on first use
    (shared memory in a worker, pinned memory in the main process when `pin` is set, shared
    memory there too with `forks`: see BufferRing._new_storage), and a worker adopts the ring
    its predecessor with the same worker id left (see WorkerRings). Picklable, so it travels to
    worker processes with its owner."""

    def __init__(self, slots: int, pin: bool = False, forks: bool = False) -> None:
        self.slots, self.pin, self.forks = slots, pin, forks
        self.workers = WorkerRings()
        self._ring: BufferRing | None = None
        self._pid = 0

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_ring": None}

    def ring(self) -> BufferRing:
        # Checked by pid: a forked worker inherits its parent's ring and must not use it.
        if self._ring is None or self._pid != os.getpid():
            from torch.utils.data import get_worker_info

            info = get_worker_info()
            if info is None:
                self._ring = BufferRing(self.slots, shared=False, pin=self.pin, forks=self.forks)
            else:
                w = self.workers
                self._ring = BufferRing(self.slots, shared=True, token=w.token, worker=info.id,
                                        adopt=w.rings.get(info.id))
            self._pid = os.getpid()
        return self._ring

    def begin_pass(self) -> WorkerRings:
        """Before a DataLoader iterator starts its workers: the generation they belong to
        (they take it with them when they fork or unpickle this object)."""
        self.workers = self.workers.successor()
        return self.workers
