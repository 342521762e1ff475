"""How a drop-in pass iterates: the resumable sampler, the single-process fast path, and the
iterator that, as DataLoader's, survives a batch that raised."""

from __future__ import annotations

import collections
import itertools
import weakref
from typing import Any, Iterator

import torch
from torch.utils.data import (BatchSampler, RandomSampler, SequentialSampler, SubsetRandomSampler,
                              WeightedRandomSampler)
from torch.utils.data.distributed import DistributedSampler

from .._collate import batch_len
from .._loader import Pass as LoaderPass
from .._torch_internals import single_process_fetch


# Samplers whose order is a function of the RNG state a pass starts from (their generator's, or
# torch's global one) and of their attributes: the rest of a pass can be drawn again from that
# state. The exact types: a subclass may draw its order any way (NumPy's global RNG, a count).
_REPLAYABLE = (SequentialSampler, RandomSampler, DistributedSampler, SubsetRandomSampler, WeightedRandomSampler)


def replayable(index_sampler: Any) -> bool:
    """Whether a pass over `index_sampler` (a sampler, or torch's BatchSampler of one) can be
    drawn again from the RNG state it started from: torch's samplers and fastdata's."""
    sampler = index_sampler.sampler if type(index_sampler) is BatchSampler else index_sampler
    return type(sampler) in _REPLAYABLE or type(sampler).__module__.startswith("fastdata.")


class Resumable:
    """Wraps the epoch's (batch) sampler: records the RNG state its shuffle starts from, and on
    resume restores it and skips the batches already delivered, by index only: no sample of a
    skipped batch is read.

    `ask_past`: the last index is given once the sampler was asked past it (see `_rest`), for a
    loader whose state may be taken at an epoch's last batch. A sampler that is not `replayable`
    keeps the indices of its pass's last `keep` batches (those asked for and not handed out are
    among them): `left` continues such a pass from its own iterator, as torch's iterator would go
    on, since drawing its order again need not give the same one."""

    def __init__(self, inner: Any, generator: torch.Generator | None, *, ask_past: bool = True,
                 keep: int = 0) -> None:
        self.inner, self.generator = inner, generator
        self.skip = 0
        self.restore: torch.Tensor | None = None
        self.restore_after: torch.Tensor | None = None  # the RNG state once the skipped batches are passed
        self.rng_at_start: torch.Tensor | None = None
        self.ask_past = ask_past
        self.keep = 0 if replayable(inner) else keep
        self._pass: weakref.ref | None = None  # the live pass's _Kept

    @property
    def rng(self) -> torch.Generator:
        # torch's global generator is looked up, never held: a loader holding it cannot be
        # sent to a spawned process (ddp_spawn), as a DataLoader made without `generator=` can.
        return self.generator if self.generator is not None else torch.default_generator

    def __len__(self) -> int:
        return len(self.inner)

    def __iter__(self) -> Iterator[Any]:
        self.rng_at_start = None  # until this iteration's first index: a state taken before it has none
        # Nothing may run before the first index is asked for: DataLoader calls iter() on its
        # sampler before drawing its worker seed (and, with workers, twice, dropping the
        # first), while torch's samplers draw lazily; resuming must keep that order. So the
        # restore-and-skip runs on the first next(), and after it the sampler's own iterator
        # is chained on at C speed (a Python generator here would run a frame per index).
        inner = iter(self.inner)  # lazy for torch's samplers: nothing is drawn yet
        given = [0]  # the indices _prepare gives, the skipped ones counted
        # (chain calls iter() on _Later only once _prepare's part is done)
        it = itertools.chain(self._prepare(inner, given), _Later(lambda: self._rest(inner, given[0])))
        if not self.keep:
            return it
        kept = _Kept(it, self.keep, self.skip)
        # held weakly: the pass's DataLoader iterator holds it, and `it` holds this object (a
        # cycle would leave both to the garbage collector, whose finalizers run at any line)
        self._pass = weakref.ref(kept)
        return kept

    def left(self, delivered: int) -> tuple[list[Any], Iterator[Any]] | None:
        """The rest of the live pass of a sampler that is not `replayable`, `delivered` batches
        handed out: (the indices asked for and not handed out, the pass's iterator on); None where
        more were asked for than `keep` holds (the pass is then drawn again, as a replayable one)."""
        kept = self._pass() if self._pass is not None else None
        if kept is None:
            return None
        ahead = kept.at - delivered
        return (list(kept.last)[len(kept.last) - ahead:], kept.it) if 0 <= ahead <= len(kept.last) else None

    def _rest(self, inner: Iterator[Any], given: int) -> Iterator[Any]:
        """The indices after those `_prepare` gave, at C speed, but for the last (as `len` counts
        them), which is given once the sampler was asked past it: RandomSampler draws from its
        generator once more at its end, and a state taken at the last batch must see that draw, as
        it does with workers (whose prefetch asks past the end before the last batch is out)."""
        if not self.ask_past:
            return inner
        try:
            left = len(self.inner) - given
        except TypeError:  # a sampler without len()
            return inner
        return itertools.chain(itertools.islice(inner, left - 1), _last_asked_past(inner)) if left > 0 else inner

    def _prepare(self, inner: Iterator[Any], given: list[int]) -> Iterator[Any]:
        restored = self.restore is not None
        if restored:
            self.rng.set_state(self.restore)
            self.restore = None
        self.rng_at_start = self.rng.get_state()
        skip, self.skip = self.skip, 0
        for _ in range(skip):
            next(inner, None)
        first = ()
        if self.restore_after is not None:
            if restored and not skip:
                # a sampler draws its shuffle at its first index: from the restored state
                first = tuple(itertools.islice(inner, 1))
            # where the RNG stood when the state was taken (or, for the rest of a pass a newer
            # one ended, stands now): what was drawn from it since is drawn past, not again
            self.rng.set_state(self.restore_after)
            self.restore_after = None
        given[0] = skip + len(first)
        yield from first  # often nothing: the body runs on the first next() all the same


class _Kept:
    """`it`'s items, the last `keep` of them kept (`last`), `at` the pass's position after them."""

    __slots__ = ("it", "last", "at", "__weakref__")

    def __init__(self, it: Iterator[Any], keep: int, at: int) -> None:
        self.it, self.last, self.at = it, collections.deque(maxlen=keep), at

    def __iter__(self) -> "_Kept":
        return self

    def __next__(self) -> Any:
        item = next(self.it)
        self.last.append(item)
        self.at += 1
        return item


class Continued:
    """A sampler of the rest of a pass: `given` (asked for and not handed out), then `it` on. Its
    iterator starts nothing until its first next(), as DataLoader's workers ask for one, drop it,
    and ask again."""

    def __init__(self, given: list[Any], it: Iterator[Any]) -> None:
        self.given, self.it = given, it

    def __iter__(self) -> Iterator[Any]:
        yield from self.given
        yield from self.it


class _Later:
    """An iterable whose iterator is made by `make()` when it is first iterated."""

    __slots__ = ("make",)

    def __init__(self, make: Any) -> None:
        self.make = make

    def __iter__(self) -> Iterator[Any]:
        return iter(self.make())


def _last_asked_past(inner: Iterator[Any]) -> Iterator[Any]:
    """`inner`'s next item, given once `inner` was asked for the one after it; then the rest."""
    last = next(inner, _NONE)
    if last is _NONE:
        return
    after = next(inner, _NONE)
    yield last
    if after is not _NONE:  # (a sampler that gives more than its len)
        yield after
        yield from inner


_NONE = object()


def fetches(it: Any) -> Iterator[Any]:
    """What DataLoader's single-process iterator `it` yields, without its `__next__`.

    NOTE: with 0 workers, `__next__` costs more than fetching a ready item (a profiler range
    entered and left, and bookkeeping for iterable datasets: benchmarks/dropin.py). So here the
    iterator DataLoader built (its sampler iterator, RNG draws, fetcher and pin settings, all
    as DataLoader made them) is driven by its own parts. Not for
    iterable datasets (whose length warning lives in `__next__`), nor while a torch profiler
    records (its traces keep DataLoader's ranges). Any other iterator passes through."""
    parts = single_process_fetch(it)
    if parts is None:
        return it  # a DataLoader that changed inside: its own iterator
    return Fetches(*parts)


class Fetches:
    """`fetch` over `indices` (or any function over any iterator): an iterator, not a generator,
    so that, as DataLoader's own, it goes on with the next index after a fetch that raised."""

    __slots__ = ("_next", "_fetch")

    def __init__(self, indices: Iterator[Any], fetch: Any) -> None:
        self._next, self._fetch = indices.__next__, fetch

    def __iter__(self) -> "Fetches":
        return self

    def __next__(self) -> Any:
        return self._fetch(self._next())


class Marked:
    """An iterator over `it` that calls `mark()` before each item is asked for (an iterator, not
    a generator, as `Fetches`)."""

    __slots__ = ("_next", "_mark")

    def __init__(self, it: Iterator[Any], mark: Any) -> None:
        self._next, self._mark = it.__next__, mark

    def __iter__(self) -> "Marked":
        return self

    def __next__(self) -> Any:
        self._mark()
        return self._next()


class Raised:
    """A batch that raised, handed out of the pass's generator (which an exception would end)
    for `Pass` to raise."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class Pass(LoaderPass):
    """What iter() returns in drop-in mode. As DataLoader's iterator, it survives a batch whose
    dataset or collate_fn raised: the error reaches the consumer, and the next call goes on with
    the next batch. (A stall, a dead worker or an interrupt ends the pass.) As DataLoader's
    iterator too, it counts the batches it handed out (`_num_yielded`) and, given its loader's
    `index_sampler` (its batch sampler, or its sampler with batch_size=None), has len(): that
    sampler's, a TypeError where it has none."""

    __slots__ = ("_num_yielded", "index_sampler")

    def __init__(self, batches: Iterator[Any], index_sampler: Any = None) -> None:
        LoaderPass.__init__(self, batches)
        self._num_yielded = 0
        self.index_sampler = index_sampler

    def __next__(self) -> Any:
        item = self._take()
        if item.__class__ is Raised:
            # The pass's frame keeps the wrapper, not the error: the error's traceback holds
            # this pass, and a cycle would keep its workers alive until a garbage collection.
            error, item.error = item.error, None
            raise error
        self._num_yielded += 1
        return item

    def __len__(self) -> int:
        if self.index_sampler is None:
            raise TypeError(f"object of type '{type(self).__name__}' has no len()")
        return len(self.index_sampler)

    def __bool__(self) -> bool:
        # DataLoader's iterator is true while len() is not 0; a pass with no sampler, always
        return self.index_sampler is None or len(self) != 0


def raised_by_dataset(error: BaseException, workers: int) -> bool:
    """Whether `error`, out of a DataLoader iterator, is the dataset's (or collate_fn's) own,
    after which DataLoader goes on: raised in this process with no workers, or re-raised from a
    live worker (its message is DataLoader's "Caught ... in DataLoader worker process k")."""
    return workers == 0 or "in DataLoader worker process" in str(error)


def batch_sizes(batch_sampler: Any, iterable: bool):
    """How many samples a delivered batch holds, as f(batch, k) for the k-th batch of a pass:
    from the batch sampler's arithmetic when it is torch's BatchSampler (no look into the batch:
    this runs every batch), else from the batch itself; 1 without a batch sampler (samples one by
    one)."""
    bs = batch_sampler
    if bs is None:
        return lambda batch, k: 1
    if not iterable and type(bs) is BatchSampler and hasattr(bs.sampler, "__len__"):
        n, size, drop = len(bs.sampler), bs.batch_size, bs.drop_last
        return (lambda batch, k: size) if drop else (lambda batch, k: min(size, n - k * size))
    if type(bs) is BatchSampler:  # an iterable's: full batches, but each worker's last
        size = bs.batch_size
        return lambda batch, k: batch_len(batch, size)
    return lambda batch, k: batch_len(batch)


def stage_seconds(summed: dict[str, Any]) -> dict[str, Any]:
    """A drop-in loader's stage seconds from its summed stats["stages"], each worker's "read" and
    "dataset" scaled up to all its batches: its first batch has no time since a previous one to
    count (see RingCollate)."""
    names = ("read", "dataset", "collate", "images")
    out: dict[str, Any] = {k: v for k, v in summed.items() if not k.startswith("worker ") and k not in
                           (*names, "batches", "fetched")}
    if not any(k.startswith("worker ") for k in summed):
        return out
    out.update(dict.fromkeys(names, 0))
    for key, own in summed.items():
        if not key.startswith("worker "):
            continue
        fetched = own.get("fetched", 0)
        scale = own["batches"] / fetched if fetched else 0.0
        mine = {"read": own.get("read", 0.0) * scale, "dataset": own.get("dataset", 0.0) * scale,
                "collate": own["collate"], "images": own["images"]}
        out[key] = mine
        for name in names:
            out[name] += mine[name]
    return out
