"""The records a loader keeps of its samples, by sample id, in shared memory: which files were
checked whole (`EntropyCheck`, by a keyed hash of their bytes) and which shard samples had
their checksums compared (`read_shards.py`). Loaders built in one process over the same samples
(`samples_key`) share one, so a validation loader each epoch, the tuner's probes or a resume do
not check again what an earlier one did.
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from typing import Any, Hashable, Sequence

import numpy as np
import torch

from .. import _codec
from .._cores import batch_threads
from .._ext import native as _ext
from ..sources import Shards

# The records of the last few sample lists loaders were built over in this process, by key
# (EntropyCheck's clean files, ShardReader's verified checksums): a handful, each 8 bytes a sample.
_RECORDS: OrderedDict = OrderedDict()
_RECORDS_KEPT = 8

# This process's key for the stamps below, drawn from the OS's CSPRNG: a record's stamps are
# compared only with stamps under the same key (a worker gets it with its EntropyCheck).
_KEY = os.urandom(16)


def pillows(err: str) -> bool:
    """Whether the native decoder's error leaves the file to Pillow (a colour space it does not
    convert: CMYK and YCCK, whose data it has decoded whole without error first, or another)
    rather than saying it is corrupt."""
    return "unsupported JPEG color space" in err


def shared_record(ids: int, key: Hashable | None) -> torch.Tensor:
    """The record for `key` with `ids` entries (int64, 0 each at first): the one kept for it,
    else a new one (kept when there is a key)."""
    record = _RECORDS.get(key) if key is not None else None
    if record is None or len(record) != ids:
        # torch's file-descriptor sharing (its default) unlinks the segment's name at once, and
        # pickling for a forkserver worker sends the descriptor: the worker maps the same pages.
        record = torch.zeros(ids, dtype=torch.int64).share_memory_()
    if key is not None:
        _RECORDS[key] = record
        _RECORDS.move_to_end(key)
        while len(_RECORDS) > _RECORDS_KEPT:
            _RECORDS.popitem(last=False)
    return record


def samples_key(samples: Any) -> bytes:
    """What names a source's samples, by sample id, across the loaders of this process (the
    key of the decoder's record of clean files): a digest of the files' paths, or of the
    shards' URLs and their sample counts, with the working directory, which relative paths
    depend on. A digest, so that the record kept does not keep a copy of a million paths."""
    h = hashlib.blake2b(digest_size=16)
    if isinstance(samples, Shards):  # (with the shards' identities: a rewrite is other samples)
        names = ["shards", *samples.urls, *(str(len(k)) for k in samples.keys), *map(str, samples.stamps or ())]
    else:
        names = ["files"]
        samples.paths.digest(h)
    h.update("\0".join([os.getcwd(), *names]).encode("utf-8", "surrogateescape"))
    return h.digest()


def stamps(datas: Sequence, key: bytes, threads: int) -> np.ndarray:
    """int64 [len(datas)]: a keyed hash of each file's bytes under `key` (16 bytes), never 0:
    what the record keeps of a file checked whole. Keyed, so that no crafted file can be made
    to have another's stamp: SipHash-1-3 natively (csrc/index.cpp, on `threads` threads),
    BLAKE2b here (a process uses one or the other throughout)."""
    if _ext is not None:
        k0, k1 = int.from_bytes(key[:8], "little"), int.from_bytes(key[8:], "little")
        return np.frombuffer(_ext.stamps(list(datas), k0, k1, threads), dtype=np.int64).copy()
    out = np.empty(len(datas), dtype=np.int64)
    for i, data in enumerate(datas):
        h = int.from_bytes(hashlib.blake2b(data, key=key, digest_size=8).digest(), "little")
        out[i] = (h >> 1) | 1
    return out


class EntropyCheck:
    """The record of which samples' files decoded whole without error (`clean`, an int64 tensor
    in shared memory, one entry per sample id: 0, or the stamp of the bytes that decoded whole,
    a keyed hash: `stamps`). The processes decoding for one loader, its DataLoader workers
    included, whether forked or started by forkserver, share one record; loaders built in this
    process over the same samples (`key`) share one too. A file rewritten after its check, at
    any size, has another stamp: it is checked again. A corrupt file is never marked, so it is
    checked, and fails, each time it comes.

    Called, it checks the entropy-coded data of each unmarked JPEG for a decoder that would fill
    corrupt data with grey or repeated rows and deliver it (DALI's: libjpeg-turbo's warnings,
    and nvJPEG's, are not errors there): the native decoder is handed a 1x1 window at the top of
    the image, decoded whole. Without the native decoder nothing is checked (DALI fills, as
    Pillow does); a JPEG the native decoder leaves to Pillow (CMYK) is decoded whole by it
    first, so corrupt data is its error too, and is checked each time it comes. The PNG check
    (`check.check_rows`) keeps its marks here too. The native decoder itself needs no record:
    its checkpoint index, keyed the same way, proves the bytes it has decoded whole
    (`_codec.decode_crop_resize`). Ids outside [0, ids) are never marked."""

    def __init__(self, ids: int, key: Hashable | None = None) -> None:
        self.clean = shared_record(max(0, int(ids)), key)
        self.key = _KEY
        self.threads: int | None = None  # None: the usable cores

    def stamps(self, datas: Sequence) -> np.ndarray:
        return stamps(datas, self.key, batch_threads(self.threads))

    def whole(self, ids: np.ndarray, stamped: np.ndarray) -> np.ndarray:
        """uint8 [len(ids)]: 1 for each sample whose bytes (their `stamps`) are not marked clean,
        to be checked whole; else 0."""
        ids = np.asarray(ids, dtype=np.int64)
        clean = self.clean.numpy()
        inside = (ids >= 0) & (ids < len(clean))
        out = np.ones(len(ids), dtype=np.uint8)
        out[inside] = clean[ids[inside]] != np.asarray(stamped, dtype=np.int64)[inside]
        return out

    def mark(self, ids: np.ndarray, stamped: np.ndarray) -> None:
        """Marks the samples `ids` clean: their files, of these stamps, decoded whole without error."""
        ids = np.asarray(ids, dtype=np.int64)
        clean = self.clean.numpy()
        inside = (ids >= 0) & (ids < len(clean))
        clean[ids[inside]] = np.asarray(stamped, dtype=np.int64)[inside]

    def __call__(self, index: np.ndarray, datas: Sequence, checked: list) -> list:
        if not _codec.AVAILABLE:
            return checked
        jpegs = [j for j, (cause, is_jpeg, _, _) in enumerate(checked) if cause is None and is_jpeg]
        if not jpegs:
            return checked
        stamped = self.stamps([datas[j] for j in jpegs])
        whole = self.whole(np.asarray(index)[jpegs], stamped)
        todo = [k for k in range(len(jpegs)) if whole[k]]
        if not todo:
            return checked
        n = len(todo)
        out = np.empty((n, 3, 1, 1), dtype=np.uint8)
        top_left = np.tile(np.array([0, 0, 1, 1], np.int32), (n, 1))
        # index=False: DALI decodes these files, so checkpoints for them would never be used.
        results = _codec.decode_crop_resize([datas[jpegs[k]] for k in todo], top_left, np.zeros(n, np.uint8), out,
                                             batch_threads(self.threads), index=False)
        checked = list(checked)
        for k, err in zip(todo, results):
            if err is not None and not pillows(err):
                _, is_jpeg, w, h = checked[jpegs[k]]
                checked[jpegs[k]] = (f"corrupt JPEG ({err})", is_jpeg, w, h)
        ok = [k for k, err in zip(todo, results) if err is None]
        self.mark(np.asarray(index)[[jpegs[k] for k in ok]], stamped[ok])
        return checked
