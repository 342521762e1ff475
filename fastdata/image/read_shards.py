"""Reading WebDataset shards: the samples of a batch (epoch, k), by byte ranges, one block ahead.

A worker reads a block's samples (see `ShardOrder`) as one byte range per shard (files seek, HTTP asks for the
range; pipe: streams and compressed tars are read on) into one of two buffers it keeps, checks each sample's
span of it (`shard_samples.check_sample`: its tar headers, members, sizes, CRC-32 and label), slices the image members
out without a copy, and reads the next block in a thread while the batch of this one is decoded. Where
nothing was read ahead (a pass's first batch, a resume), the batch's own samples are read first, by
themselves. A block over MAX_PART_BYTES (one batch of large samples) is neither read ahead nor whole: its
batch is read in parts (`parts`). A damaged header, a member cut off, or a span that holds other members,
or bytes that do not have the index's CRC-32 (a sample changed at the same size), fails that sample alone (a
DataError naming the shard, the member and the byte, or a counted skip).
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Iterator

import numpy as np

from ..sources import Shards
from ..sources.streams import (describe_error, discard, drop, fill, local_path, open_stream, read_file_range,
                               read_range)
from .order import ShardOrder
from .read import (MAX_FILE_BYTES, MAX_PART_BYTES, BlockBuffer, Failures, MemberName, Read, give_back, take_buffer,
                   too_large)
from .record import samples_key, shared_record
from .shard_samples import Block, check_sample


# Streams (pipe: commands, compressed tars) a process keeps open at where it stopped: a lane's
# run of samples spans at most a few shards, and each one left open holds a process or a file.
_OPEN_STREAMS = 4
_MAX_GAP = 1 << 20  # bytes between two samples read with them; a run of samples is cut at a wider gap


def _index_key(shards: Shards) -> bytes:
    """The shards' `samples_key` and what their index says of each sample (where it is, its
    CRC-32): a loader over the same files with another index compares its CRC-32s afresh."""
    h = hashlib.blake2b(samples_key(shards), digest_size=16)
    for s, spans in enumerate(shards.spans):
        h.update(np.ascontiguousarray(spans, dtype=np.int64).tobytes())
        crcs = shards.checksums[s] if shards.checksums is not None else None
        h.update(b"-" if crcs is None else np.ascontiguousarray(crcs, dtype=np.int64).tobytes())
    return h.digest()


class ShardReader:
    """Reads the samples of batch (epoch, k) from the block that holds it, read (or being
    read) by this process's read-ahead thread."""

    def __init__(self, shards: Shards, order: ShardOrder, fail: Failures, persistent: bool) -> None:
        self.shards = shards
        self.order = order
        self.fail = fail
        self.persistent = persistent  # the process serves the next epoch too: read its first block ahead
        self._proc: tuple | None = None  # per process: (pid, reader thread, {block key: Future}, 2 buffers)
        self._pipes: dict[str, list] = {}  # streams left open at [stream, position] (_read)
        self._reads = 0  # reads submitted in this process: which buffer the next one fills
        self._current: tuple | None = None  # (key, Future of the Block) of the block being decoded
        self._sized: dict[tuple[int, int, int], bool] = {}  # blocks over MAX_PART_BYTES (`_large`)
        self._files = not any(shards.streamed) and all(local_path(url) is not None for url in shards.urls)
        # 1 at each sample id whose bytes were found with the index's CRC-32 (see _read_run): in
        # shared memory, for this loader's workers, fresh ones each epoch included, and the
        # loaders this process builds over the same shards with the same index
        self._verified = shared_record(len(shards), (b"crc", _index_key(shards)))
        # labels are in [0, limit): the index's classes, else [0, 2**31)
        self._labels = (shards.label_limit,
                        f"the {len(shards.classes)} classes of the index" if shards.classes else "no classes named")

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_proc"], state["_pipes"], state["_current"] = None, {}, None
        return state

    def __len__(self) -> int:
        return len(self.shards)

    def close(self) -> None:
        """Stops this process's read-ahead thread and closes its pipes (in the training
        process, when a 0-worker pass ends: no thread of it may be live at a fork)."""
        if self._proc is None or self._proc[0] != os.getpid():
            return
        _, reader, pending, buffers = self._proc
        for future in pending.values():
            future.cancel()
        reader.shutdown(wait=True)  # nothing reads into the buffers from here on
        give_back(buffers)
        for stream, _ in self._pipes.values():
            drop(stream)
        self._proc, self._pipes, self._current = None, {}, None

    def num_classes(self, transform) -> int | None:
        if self.shards.classes:
            return len(self.shards.classes)
        if transform is not None and transform.soft_labels:
            raise ValueError("MixUp, CutMix and LabelSmoothing need the number of classes, but these shards' index "
                             "does not name the classes (or there is no index): write the shards with fastdata-shard "
                             "from an ImageFolder")
        return None

    def parts(self, keys) -> Iterator[tuple[Read, bool]]:
        """The samples of batch (epoch, k) from its block, read ahead: one part. But where the
        block's samples come to more than MAX_PART_BYTES (a block holds at most 256 MiB but for
        one batch of larger samples: `ShardOrder`), the batch's alone, in parts of at most
        MAX_PART_BYTES (the first sample always), each read here once the one before is taken."""
        ((epoch, k),) = keys
        order = self.order
        lane, block, row = order.locate(epoch, k)
        if not self._large((epoch, lane, block)):
            yield self.read(keys), False
            return
        ids = order.block_ids(epoch, lane, block)
        # (in the batch's order: a pipe: stream read with shuffle is opened again for each part
        # that starts before where the last one stopped)
        places = order.block_permutation(epoch, lane, block, len(ids))[row:row + order.batch_size]
        sizes = self._sample_bytes(ids[places])
        ends, lo = np.cumsum(sizes), 0
        while lo < len(places):
            hi = max(lo + 1, int(np.searchsorted(ends, ends[lo] - sizes[lo] + MAX_PART_BYTES, side="right")))
            yield self._part(epoch, ids, places[lo:hi]), hi < len(places)
            lo = hi

    def read(self, keys) -> Read:
        """The samples of batch (epoch, k), its block read whole."""
        ((epoch, k),) = keys
        lane, block, row = self.order.locate(epoch, k)
        data = self._block(epoch, lane, block, row)
        return self._batch(epoch, data, data.order[row : row + self.order.batch_size])

    def _batch(self, epoch: int, data: Block, rows: np.ndarray) -> Read:
        """The samples at `rows` of `data`, in that order; those that failed reported."""
        errors: list[tuple[str, str]] = []
        index, paths, datas, labels = [], [], [], []
        for r in rows.tolist():
            if data.causes[r] is not None:
                self.fail(errors, data.names[r], data.causes[r])
                continue
            index.append(data.ids[r])
            paths.append(data.names[r])
            datas.append(data.datas[r])
            labels.append(data.labels[r])
        return Read(epoch, np.asarray(index, dtype=np.int64), paths, datas, np.asarray(labels, dtype=np.int64), errors)

    # ------------------------------------------------------------- reading, one block ahead

    def _block(self, epoch: int, lane: int, block: int, row: int) -> Block:
        """The block holding the batch at `row` of its order (a block of that batch alone, when
        the batch was not read ahead: see below)."""
        pid = os.getpid()
        if self._proc is None or self._proc[0] != pid:  # a new worker (or a fork of one)
            buffers = [take_buffer(), take_buffer()]
            self._proc = (pid, ThreadPoolExecutor(1, thread_name_prefix="fastdata-wds"), {}, buffers)
            self._pipes, self._current = {}, None
        _, reader, pending, _ = self._proc
        key = (epoch, lane, block)
        if self._current is not None and self._current[0] == key:  # the block's next batch
            self._read_ahead(epoch, lane, block)
            return self._current[1].result()
        future: Future | None = pending.pop(key, None)
        first: Future | None = None
        lo, hi = self.order.block_range(*key)
        if future is None:
            # Nothing read ahead (a pass's start, a resume). From files, the batch's own samples
            # are read first, into their places in the block's buffer, and decoded while the
            # thread reads the rest of the block around them, so the first batch waits for a
            # quarter of a block, not all of it. Files only: that is a read per sample, a
            # request each over HTTP, and a pipe would be read twice.
            rows = slice(row, row + self.order.batch_size) if self._files and hi - lo > self.order.batch_size else None
            first, future = self._submit(key, rows)
        following = self._following(epoch, lane, block)
        for stale in [k for k in pending if k != following]:  # a resume or set_epoch skipped them
            pending.pop(stale).cancel()
        # The next block is read from the block's second batch on, not beside its first: that
        # batch's decode (the whole of a fresh pass's first batch) would share the cores with
        # two block reads. A block of one batch reads ahead at once.
        if row + self.order.batch_size >= hi - lo:
            self._read_ahead(epoch, lane, block)
        self._current = None  # its buffer may be refilled from here on
        got = (first or future).result()
        self._current = (key, future)  # the whole block, for the batches after this one
        return got

    def _large(self, key: tuple[int, int, int]) -> bool:
        """Whether block `key`'s samples come to more than MAX_PART_BYTES (kept for the last few)."""
        large = self._sized.get(key)
        if large is None:
            large = bool(self._sample_bytes(self.order.block_ids(*key)).sum() > MAX_PART_BYTES)
            if len(self._sized) >= 4:
                del self._sized[next(iter(self._sized))]
            self._sized[key] = large
        return large

    def _sample_bytes(self, ids: np.ndarray) -> np.ndarray:
        """What reading each sample takes: its bytes in the shard; none over MAX_FILE_BYTES (_runs)."""
        nbytes = self.order.sizes[ids]  # (the loader gives every ShardOrder its shards' sizes)
        return np.where(nbytes > MAX_FILE_BYTES, 0, nbytes)

    def _part(self, epoch: int, ids: np.ndarray, places: np.ndarray) -> Read:
        """The samples at `places` of a block's stream order (`ids`), in that order, read into
        memory of their own, which lives as long as the Read."""
        wanted = np.sort(places)
        out = Block(ids[wanted], np.searchsorted(wanted, places))
        runs = self._runs(out.ids)
        view = self._view(BlockBuffer(), out, runs)
        for s, first, end, start, stop, at in runs if view is not None else ():
            self._read_run(out, s, first, end, start, view[at:at + stop - start])
        return self._batch(epoch, out, out.order)

    def _following(self, epoch: int, lane: int, block: int) -> tuple[int, int, int] | None:
        """The next block of the lane, or after its last, the first of the next epoch (which
        this worker serves too when it persists: DataLoader starts each epoch at worker 0)."""
        if block + 1 < self.order.blocks(epoch, lane):
            return (epoch, lane, block + 1)
        return (epoch + 1, lane, 0) if self.persistent else None

    def _read_ahead(self, epoch: int, lane: int, block: int) -> None:
        """Submits the read of the block after (epoch, lane, block), unless it is under way."""
        following = self._following(epoch, lane, block)
        pending = self._proc[2]
        if following is not None and following not in pending and not self._large(following):
            pending[following] = self._submit(following)[1]  # (a large block's batches are read by parts())

    def _submit(self, key: tuple[int, int, int], rows: slice | None = None) -> tuple[Future | None, Future]:
        """(the read of `rows` of block `key`'s order, None without rows; the block's read)."""
        # Blocks are read into two buffers kept for the process, in turn: the one thread reads
        # blocks in the order they are submitted, and the next is submitted only when the
        # decoder moves on to the block before it, so a buffer is never refilled while a block
        # in it is decoded. (Fresh 100 MB buffers would cost more in page faults than the read.)
        _, reader, _, buffers = self._proc
        buf = buffers[self._reads % 2]
        self._reads += 1
        # the pieces of the buffer the rows' read filled, which the block's read, after it on
        # the thread, leaves as they are
        held: list[tuple[int, int]] = []
        first = reader.submit(self._read_block, *key, buf, rows, held) if rows is not None else None
        return first, reader.submit(self._read_block, *key, buf, None, held)

    def _read_block(self, epoch: int, lane: int, block: int, buf: BlockBuffer, rows: slice | None,
                    held: list[tuple[int, int]]) -> Block:
        """The block's samples, read into `buf`, but for the pieces (offset, bytes) of it `held` names;
        with `rows`, only those of its order (the block's `order` then maps those rows alone, into the
        samples read), into their places in the block's layout, which are appended to `held`."""
        order = self.order
        ids = order.block_ids(epoch, lane, block)
        out = Block(ids, order.block_permutation(epoch, lane, block, len(ids)))
        runs = self._runs(ids)
        view = self._view(buf, out, runs)
        if view is None:  # (the whole block failed in its order, with `rows` too)
            return out
        if rows is None:
            for s, first, end, start, stop, at in runs:
                have = [(o - at, n) for o, n in held if at <= o < at + stop - start]
                self._read_run(out, s, first, end, start, view[at:at + stop - start], have)
            return out
        wanted = np.sort(out.order[rows])
        mapping = np.full(len(ids), -1, dtype=np.int64)
        mapping[rows] = np.searchsorted(wanted, out.order[rows])
        out = Block(ids[wanted], mapping)
        # each run of the wanted samples lies in one run of the block: where it starts there
        whole = np.searchsorted(np.cumsum([end - first for _, first, end, *_ in runs]), wanted, side="right")
        for s, first, end, start, stop, _ in self._runs(ids[wanted]):
            n = len(out.names)  # the run's first sample, of those wanted
            _, _, _, block_start, _, block_at = runs[whole[n]]
            at = block_at + start - block_start
            listed = self._read_run(out, s, first, end, start, view[at:at + stop - start])
            if listed and all(c is None for c in out.causes[n:]):  # (a shard cut short fails a sample: read again)
                held.append((at, stop - start))
        return out

    def _view(self, buf: BlockBuffer, out: Block, runs: list) -> memoryview | None:
        """`buf`, as long as `runs` take; None where that memory cannot be had, their samples failed
        in `out` (each sample is bounded; a block of a batch of them may not be)."""
        total = sum(stop - start for *_, start, stop, _ in runs)
        try:
            return buf.view(total)
        except (OSError, MemoryError) as e:
            cause = (f"its block of {len(out.ids)} samples, {total} bytes, cannot be held in memory "
                     f"({describe_error(e)})")
            for s, first, end, *_ in runs:
                for key in self.shards.keys[s][first:end]:
                    out.add(MemberName(self.shards.urls[s], f"{key}.*"), None, 0, cause)
            return None

    def _runs(self, ids: np.ndarray) -> list[tuple[int, int, int, int, int, int]]:
        """Runs of consecutive samples of one shard, one read each: (shard, first sample, end
        sample, shard bytes [start, stop), where in the buffer)."""
        order = self.order
        shard = np.searchsorted(order.first, ids, side="right") - 1
        local = ids - order.first[shard]
        breaks = np.flatnonzero((np.diff(shard) != 0) | (np.diff(local) != 1)) + 1
        runs, at = [], 0
        for lo, hi in zip([0, *breaks.tolist()], [*breaks.tolist(), len(ids)]):
            s, first, end = int(shard[lo]), int(local[lo]), int(local[hi - 1]) + 1
            spans = self.shards.spans[s]
            # a sample over MAX_FILE_BYTES is a run of its own that reads nothing (_read_run)
            big = (first + np.flatnonzero(spans[first:end, 1] > MAX_FILE_BYTES)).tolist()
            # Bytes between two samples (members of no sample, end blocks, a hole in a sparse
            # file, or what a crafted index leaves out) are read only where they are few.
            gaps = spans[first + 1:end, 0] - spans[first:end - 1].sum(axis=1)
            apart = (first + 1 + np.flatnonzero(gaps > _MAX_GAP)).tolist()
            cuts = sorted({first, end, *big, *(b + 1 for b in big), *apart})
            for a, b in zip(cuts, cuts[1:]):
                start = int(spans[a, 0])
                stop = start if a in big else int(spans[b - 1].sum())
                runs.append((s, a, b, start, stop, at))
                at += stop - start
        return runs

    def _read_run(self, out: Block, s: int, first: int, end: int, start: int, view: memoryview,
                  have: list[tuple[int, int]] = ()) -> bool:
        """Samples [first, end) of shard s (bytes [start, start + len(view))) read into `view`,
        but for the pieces (offset, bytes) of it it already holds (read from the shard as
        listed), and appended to `out` in order; the image bytes stay views of it. Whether the
        bytes read are the shard's as listed (its file's identity unchanged)."""
        url, keys = self.shards.urls[s], self.shards.keys[s]
        if end - first == 1 and (n := int(self.shards.spans[s][first, 1])) > MAX_FILE_BYTES:
            out.add(MemberName(url, f"{keys[first]}.*"), None, 0, too_large(n, "a sample"))
            return False
        stamp = self.shards.stamps[s] if self.shards.stamps is not None else None
        listed = stamp is not None
        try:
            got, at = 0, 0
            for o, n in [*sorted(have), (len(view), 0)]:
                if o > at:  # a piece not held: read it; one cut short ends what there is
                    count, read_from = self._read(s, start + at, view[at:o])
                    got = at + count
                    listed = listed and read_from == stamp
                    if got < o:
                        break
                got = at = o + n
        except Exception as e:  # OSError, URLError, a pipe's failed command
            cause = f"cannot read the shard ({describe_error(e)})"
            for key in keys[first:end]:
                out.add(MemberName(url, f"{key}.*"), None, 0, cause)
            return False
        raw = view[:got]
        contents = self.shards.contents[s] if self.shards.contents is not None else None
        indexed = self.shards.indexed[s] if self.shards.indexed is not None else True
        stale = "the index is stale: " if indexed else "the shard changed since its headers were counted: "
        spans = self.shards.spans[s][first:end].tolist()
        expected = contents[first:end].tolist() if contents is not None else [(-1, -1)] * (end - first)
        # A sample's CRC-32 is compared the first time one of the processes sharing the record
        # reads it (a few percent of a decode, benchmarks/results/MEASURED.md): a sample found
        # changed fails every time, one found intact is not hashed again by them, as long as
        # its bytes come from the shard's file as listed. A stream's bytes are hashed each time:
        # nothing tells its versions apart.
        checksums = self.shards.checksums[s] if self.shards.checksums is not None else None
        if checksums is None:
            crcs = [-1] * (end - first)
        else:
            seen = self._verified.numpy()[self.order.first[s] + first:self.order.first[s] + end]
            crcs = np.where((seen != 0) & listed, -1, checksums[first:end]).tolist()
        for i, (key, (a, n), expect, crc) in enumerate(zip(keys[first:end], spans, expected, crcs)):
            passed = check_sample(out, url, key, a, a + n, raw, start, expect, crc, stale, self._labels)
            if passed and crc >= 0 and listed:
                seen[i] = 1
        return listed

    def _read(self, s: int, start: int, view: memoryview) -> tuple[int, tuple[int, ...] | None]:
        """Reads bytes [start, start + len(view)) of shard s into `view`: (the count read, fewer
        where the shard ends sooner; the identity of the file read, None for a stream)."""
        url = self.shards.urls[s]
        if not self.shards.streamed[s]:
            local = local_path(url)
            return read_file_range(local, start, view) if local is not None else (read_range(url, start, view), None)
        # A stream (a pipe:, a compressed tar) cannot seek: keep it open, and read on from where
        # the last read stopped.
        stream, at = self._pipes.get(url, (None, 0))
        if stream is None or at > start:
            if stream is not None:
                drop(stream)
            stream, at = open_stream(url), 0
        try:
            at += discard(stream, start - at)
            got = fill(stream, view)
        except BaseException:  # where it stopped is not known: the next read opens it again
            self._pipes.pop(url, None)
            drop(stream)
            raise
        self._pipes.pop(url, None)
        self._pipes[url] = [stream, at + got]  # (the last used last)
        if len(self._pipes) > _OPEN_STREAMS:  # a lane reads its shards in turn: one it left is done
            drop(self._pipes.pop(next(iter(self._pipes)))[0])
        return got, None
