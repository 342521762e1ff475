"""The batch order: which samples each of this rank's batches holds, as a pure function of
(seed, epoch), so that any batch of any epoch can be named without reading what came before.

Two orders of the protocol `parts.BatchOrder`:
- `FileOrder` (image files): the epoch is a permutation of all samples (or a sampler's list of
  them, `fastdata.samplers`), split among the ranks by striding, as DistributedSampler does;
  batch k of a rank is k's slice of its share.
- `ShardOrder` (WebDataset shards, read sequentially): the epoch is the shards in a permuted
  order, a rank takes a contiguous range of it, each worker ("lane") a contiguous part of that,
  and a lane is shuffled in blocks (see its docstring).
Both give every rank the same number of samples (the epoch wraps around to pad the last rank,
or is cut with drop_last) and so of batches: DDP never waits on a rank with a batch less.

`order.keys(epoch, k)` names batch k of `epoch` for the reader; `len(order)` is the batches
per epoch. `Passes` is what DataLoader gets as its batch sampler: the keys from the point a
pass starts at (`seek`), to the epoch's end, or on into the next epochs (`run_ahead`).
`EpochSampler` is what trainers see as an image loader's sampler.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Iterator

import numpy as np

from .._ranks import per_rank, share
from ..samplers import IndexSampler
from ..sources import Shards
from .parts import BatchOrder

# ShardOrder's shuffle buffer: a block of whole batches, the fewest that hold 1024 samples, cut
# short where its samples would pass _BLOCK_BYTES (a reader holds two blocks, so a worker reads
# into about 512 MiB, or two batches where one batch alone is more).
_BLOCK_SAMPLES = 1024
_BLOCK_BYTES = 256 << 20


def _block_batches(batch_size: int) -> int:
    """The most batches a shuffle block holds: the fewest that hold 1024 samples."""
    return max(1, math.ceil(_BLOCK_SAMPLES / batch_size))


def _cut(sizes: np.ndarray, batch_size: int, most: int, cap: int) -> np.ndarray:
    """Where a lane's blocks start, in its batches, and its batch count after them: greedily,
    each block the most whole batches (at most `most`) whose samples, of byte lengths `sizes`
    in the lane's order, come to at most `cap` bytes, and at least one batch."""
    per_batch = np.add.reduceat(sizes, np.arange(0, len(sizes), batch_size)) if len(sizes) else sizes[:0]
    total = np.concatenate([[0], np.cumsum(per_batch)])
    starts, s = [0], 0
    while s < len(per_batch):
        fits = int(np.searchsorted(total, total[s] + cap, side="right")) - 1
        s = max(s + 1, min(s + most, fits))
        starts.append(s)
    return np.asarray(starts, dtype=np.int64)


def permutation(seed: int, epoch: int, n: int, shuffle: bool) -> np.ndarray:
    """The epoch's order of n items: a permutation drawn from (seed, epoch), or as given."""
    if shuffle:
        return np.random.Generator(np.random.PCG64([seed, epoch])).permutation(n)
    return np.arange(n)


def occurrences(order: np.ndarray) -> np.ndarray:
    """For each entry of `order`, how many times its value came before it (0 the first time)."""
    sort = np.argsort(order, kind="stable")
    ranked = order[sort]
    place = np.arange(len(order))
    first = np.maximum.accumulate(np.where(np.r_[True, ranked[1:] != ranked[:-1]], place, 0))
    out = np.empty(len(order), dtype=np.int64)
    out[sort] = place - first
    return out


def check_source(state: dict[str, Any], n: int, shards: bool) -> None:
    """Refuses a state taken over other data: files and shards number their samples in other
    orders (a shard state is the one with "lanes"), and a position in n samples means nothing
    in m. States written before "samples" was kept are checked for their kind only."""
    if ("lanes" in state) != shards:
        kind = "WebDataset shards" if "lanes" in state else "image files"
        raise ValueError(f"the state was taken by a loader over {kind} (backend {state.get('backend')!r}), so it "
                         "resumes only a loader over the same " + ("shards" if "lanes" in state else "files"))
    samples = state.get("samples", n)
    if samples != n:
        raise ValueError(f"the state was taken over {samples!r:.40} samples, but this loader has {n}: it resumes "
                         "only a loader over the same data")


class FileOrder:
    """Image files: batch k of a rank holds samples (epoch, i) of its strided share of the
    epoch's permutation."""

    def __init__(self, n: int, batch_size: int, shuffle: bool, drop_last: bool, seed: int, rank: int,
                 world_size: int, sampler: Any = None) -> None:
        self.n, self.batch_size, self.shuffle, self.seed = n, batch_size, shuffle, seed
        self.rank, self.world_size = rank, world_size
        self.sampler = sampler  # a fastdata.samplers sampler: its epoch list replaces the permutation
        self.length = sampler.num_samples if sampler is not None else n  # the epoch's samples, all ranks
        self.drop_last = drop_last
        self.per_rank = per_rank(self.length, world_size, drop_last)
        self.batches = self.per_rank // batch_size if drop_last else math.ceil(self.per_rank / batch_size)
        self._mine: tuple | None = None  # (epoch, this rank's order of it, its draw keys or None)

    def __len__(self) -> int:
        return self.batches

    def rank_order(self, epoch: int) -> tuple[np.ndarray, np.ndarray | None]:
        """This rank's samples of `epoch`, in order, and what their random draws are keyed by
        where a sample comes more than once in the epoch (None where none can): the id for its
        first time, id + n * r for its r-th repeat. A sampler drawing with replacement, or
        repeating rare samples, and the wrap that pads the ranks, would otherwise give each
        repeat the first one's crop, flip and pixel ops."""
        if self._mine is None or self._mine[0] != epoch:
            if self.sampler is not None:
                order = self.sampler.indices(epoch)
            else:
                order = permutation(self.seed, epoch, self.n, self.shuffle)
            padded = np.resize(order, per_rank(len(order), self.world_size, self.drop_last) * self.world_size)
            draws = None
            if self.sampler is not None and np.bincount(order, minlength=self.n).max(initial=0) > 1:
                draws = (padded + self.n * occurrences(padded))[self.rank::self.world_size]
            elif len(padded) > len(order):  # only the wrap repeats: its r-th turn, r times
                draws = (padded + self.n * (np.arange(len(padded)) // len(order)))[self.rank::self.world_size]
            self._mine = (epoch, share(order, self.rank, self.world_size, self.drop_last), draws)
        return self._mine[1], self._mine[2]

    def keys(self, epoch: int, k: int) -> list[tuple[int, ...]]:
        """(epoch, sample id), or (epoch, sample id, draw key) where samples repeat (`rank_order`)."""
        b = self.batch_size
        mine, draws = self.rank_order(epoch)
        if draws is None:
            return [(epoch, int(i)) for i in mine[k * b : (k + 1) * b]]
        return [(epoch, int(i), int(d)) for i, d in zip(mine[k * b : (k + 1) * b], draws[k * b : (k + 1) * b])]

    def state(self) -> dict[str, Any]:
        return {"samples": self.n, **({} if self.sampler is None else {"sampler": self.sampler.state_dict()})}

    def check_state(self, state: dict[str, Any]) -> None:
        check_source(state, self.n, shards=False)
        taken = state.get("sampler")
        if (taken is None) != (self.sampler is None):
            raise ValueError("the state was taken with " + (f"sampler {taken.get('sampler')!r}, so resume with that "
                             "sampler" if taken is not None else "no sampler, so resume without one"))
        if taken is not None:
            self.sampler.check_state(taken)


def warn_other_order(state: dict[str, Any], seed: int, shuffle: bool) -> None:
    """Warns when a loader resumes `state` with another seed or shuffle than it was taken with.
    The state's position counts batches of the order it was taken in; under another order the
    rest of that epoch holds other samples: some the skipped batches held come again, and some
    never come. A state without "shuffle" (taken before states kept it) has its seed checked."""
    taken = {"seed": state.get("seed", seed), "shuffle": state.get("shuffle", shuffle)}
    now = {"seed": seed, "shuffle": shuffle}
    changed = [k for k in now if taken[k] != now[k]]
    if not changed:
        return
    said = ", ".join(f"{k}={now[k]}" for k in changed)
    text = f"resuming with {said}, but the state was taken with " + ", ".join(f"{k}={taken[k]}" for k in changed)
    if state.get("batches") and (taken["shuffle"] != shuffle or shuffle):  # an order drawn from the seed
        text += (f": the {state['batches']} batches it counts as delivered came in another order, so the rest of "
                 f"epoch {state.get('epoch')} may repeat some of their samples and leave out others")
    warnings.warn(text, stacklevel=4)  # at the caller of Loader.load_state_dict


def check_sampler(sampler: Any, samples: Any, shuffle: bool) -> None:
    """Refuses an image loader's `sampler` that cannot set the order of `samples`."""
    if not isinstance(sampler, IndexSampler):
        raise TypeError("sampler should be a fastdata.samplers sampler (WeightedSampler, RepeatFactorSampler, "
                        f"CurriculumSampler) in image mode, but got {type(sampler).__name__}")
    if shuffle:
        raise ValueError("sampler option is mutually exclusive with shuffle: the sampler sets the order")
    if isinstance(samples, Shards):
        raise ValueError("sampler should be given with image files, but got WebDataset shards: shards are read "
                         "sequentially, so an order of single samples cannot be served from them; pass the image "
                         "folder or file list the shards were written from, or drop sampler=")
    if sampler.population != len(samples):
        raise ValueError(f"sampler should index the {len(samples)} samples of this source, but it indexes "
                         f"{sampler.population} (its per-sample list has that length)")


class ShardOrder:
    """WebDataset shards, which are read sequentially:
    - the epoch's shard order is a permutation of the shards drawn from (seed, epoch) (or their
      order as given, without shuffle); the epoch is the concatenation of the shards in that
      order, and rank r takes its contiguous range [r * P, (r + 1) * P), P the samples per rank
      (cut to whole batches with drop_last);
    - within a rank, lane w (worker w; one lane with num_workers=0) takes the contiguous range
      that holds its batches (DataLoader hands batch k to worker k % num_workers), so a worker
      reads only the shards its range covers, in order;
    - the shuffle buffer: a lane's range is cut into blocks of whole batches, the fewest that
      hold 1024 samples, but where their samples (`sizes`: each one's bytes in the shards) would
      come to more than 256 MiB, the most that do not (at least one batch); the cut follows the
      epoch's order, so a few large samples among small ones shorten only their own blocks. Each
      block is permuted by a generator seeded with (seed, epoch, rank, lane, block). Unlike a
      streaming shuffle buffer, that makes every batch addressable: a resume seeks to the block
      of its next batch instead of reading and discarding what came before.
    A batch's key is (epoch, k); the reader finds its samples with `locate` and `block_ids`."""

    def __init__(self, counts: np.ndarray, batch_size: int, shuffle: bool, drop_last: bool, seed: int,
                 rank: int, world_size: int, lanes: int, sizes: np.ndarray | None = None) -> None:
        self.counts = counts
        self.first = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)  # first sample id of each shard
        self.n = n = int(counts.sum())
        self.batch_size, self.shuffle, self.seed, self.rank = batch_size, shuffle, seed, rank
        rank_n = per_rank(n, world_size, drop_last)
        if drop_last:
            rank_n -= rank_n % batch_size
        self.per_rank = rank_n
        self.batches = math.ceil(rank_n / batch_size)
        self.lanes = lanes
        short = self.batches * batch_size - rank_n  # the last batch's missing samples
        self.lane_samples = [len(range(w, self.batches, lanes)) * batch_size for w in range(lanes)]
        if self.batches:
            self.lane_samples[(self.batches - 1) % lanes] -= short
        self.lane_start = np.concatenate([[0], np.cumsum(self.lane_samples)[:-1]]).astype(np.int64)
        self.sizes = sizes
        self.block = _block_batches(batch_size) * batch_size  # the most samples a block holds
        self.block_bytes: int | None = None if sizes is None else _BLOCK_BYTES  # None: blocks of `block` alone
        self._starts: dict[tuple[int, int], np.ndarray] = {}

    def __len__(self) -> int:
        return self.batches

    def keys(self, epoch: int, k: int) -> list[tuple[int, int]]:
        return [(epoch, k)]

    def state(self) -> dict[str, Any]:
        return {"samples": self.n, "lanes": self.lanes, "block": self.block, "block_bytes": self.block_bytes}

    def check_state(self, state: dict[str, Any]) -> None:
        """Refuses a state this order cannot resume; takes its shuffle blocks, which place
        every batch (a state without them was taken with blocks of 1024 samples' batches, one
        without `block_bytes` with blocks of `block` samples whatever their bytes)."""
        check_source(state, self.n, shards=True)
        lanes = state["lanes"]
        if lanes != self.lanes:
            said = [str(n) if n > 1 else "0 or 1" for n in (lanes, self.lanes)]  # one lane: no worker, or one
            raise ValueError(f"the state was taken with num_workers={said[0]} (shards split a rank's samples among "
                             f"its workers), so resume with num_workers={said[0]}, not {said[1]}")
        most = _block_batches(self.batch_size) * self.batch_size
        block, cap = state.get("block", most), state.get("block_bytes")
        if isinstance(block, bool) or not isinstance(block, int) or not 0 < block <= most or block % self.batch_size:
            raise ValueError(f"the state's block should be a whole number of batches of {self.batch_size}, at most "
                             f"{most} samples, but is {block!r:.80}: pass a dict from this loader's state_dict()")
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap <= 0 or self.sizes is None):
            raise ValueError(f"the state's block_bytes should be a positive int or None, but is {cap!r:.80}: pass a "
                             "dict from this loader's state_dict()")
        if (block, cap) != (self.block, self.block_bytes):
            self.block, self.block_bytes, self._starts = block, cap, {}

    def block_starts(self, epoch: int, lane: int) -> np.ndarray:
        """Where the lane's blocks start in its batches, then its batch count (kept for the
        last few (epoch, lane): a reader asks for each batch's block)."""
        key = (epoch, lane)
        starts = self._starts.get(key)
        if starts is None:
            batches, most = math.ceil(self.lane_samples[lane] / self.batch_size), self.block // self.batch_size
            if self.block_bytes is None:
                starts = np.append(np.arange(0, batches, most), batches)
            else:
                ids = self._ids(epoch, lane, 0, self.lane_samples[lane])
                starts = _cut(self.sizes[ids], self.batch_size, most, self.block_bytes)
            if len(self._starts) >= 4:
                del self._starts[next(iter(self._starts))]
            self._starts[key] = starts
        return starts

    def locate(self, epoch: int, k: int) -> tuple[int, int, int]:
        """Batch k of the rank: (lane, block in the lane, first row in the block's order)."""
        lane, j = k % self.lanes, k // self.lanes
        starts = self.block_starts(epoch, lane)
        block = int(np.searchsorted(starts, j, side="right")) - 1
        return lane, block, (j - int(starts[block])) * self.batch_size

    def blocks(self, epoch: int, lane: int) -> int:
        return len(self.block_starts(epoch, lane)) - 1

    def block_range(self, epoch: int, lane: int, block: int) -> tuple[int, int]:
        """The block's samples: [lo, hi) of the lane's."""
        starts = self.block_starts(epoch, lane)
        return int(starts[block]) * self.batch_size, min(int(starts[block + 1]) * self.batch_size,
                                                         self.lane_samples[lane])

    def block_ids(self, epoch: int, lane: int, block: int) -> np.ndarray:
        """The sample ids of a block, in stream order (ids number the samples of the shards in
        their given order: the first shard's are 0..)."""
        return self._ids(epoch, lane, *self.block_range(epoch, lane, block))

    def _ids(self, epoch: int, lane: int, lo: int, hi: int) -> np.ndarray:
        """The sample ids of [lo, hi) of the lane's samples in `epoch`, in stream order."""
        q = (self.rank * self.per_rank + self.lane_start[lane] + np.arange(lo, hi)) % self.n
        order = permutation(self.seed, epoch, len(self.counts), self.shuffle)
        ends = np.cumsum(self.counts[order])
        i = np.searchsorted(ends, q, side="right")
        shard = order[i]
        return self.first[shard] + q - (ends[i] - self.counts[shard])

    def block_permutation(self, epoch: int, lane: int, block: int, size: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(size)
        rng = np.random.Generator(np.random.PCG64([self.seed, epoch, self.rank, lane, block]))
        return rng.permutation(size)


class Passes:
    """DataLoader's batch sampler over an order: a pass yields the keys from (epoch, skip), set
    by `seek`, to the epoch's end; with `run_ahead`, on into the next epochs (`epoch` follows).

    Run-ahead is for persistent workers: DataLoader asks for indices only within an epoch, so
    at an epoch's end its workers would idle while the consumer works through the queued
    batches, and the next epoch's first batch would be made while the consumer waits. An
    epoch's batches are a function of (seed, epoch), so the next epoch's can be decoded before
    it begins: the loader then takes `len` batches an epoch from one running iterator."""

    def __init__(self, order: BatchOrder, run_ahead: bool = False) -> None:
        self.order, self.run_ahead = order, run_ahead
        self.epoch = 0
        self.skip = 0

    def seek(self, epoch: int, skip: int) -> None:
        """Where the next pass starts: batch `skip` of `epoch`."""
        self.epoch, self.skip = epoch, skip

    def __len__(self) -> int:
        return len(self.order)

    def __iter__(self) -> Iterator[list]:
        skip, self.skip = self.skip, 0
        order = self.order
        while True:
            epoch = self.epoch
            for k in range(skip, len(order)):
                yield order.keys(epoch, k)
            if not self.run_ahead:
                return
            skip = 0
            self.epoch = epoch + 1


class EpochSampler:
    """An image loader's stand-in for a DataLoader's sampler: `set_epoch` and `len`."""

    def __init__(self, loader: Any) -> None:  # an ImageLoader
        self._loader = loader

    def set_epoch(self, epoch: int) -> None:
        self._loader.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self._loader) * self._loader.batch_size
