"""Samplers whose epoch order is a pure function of (seed, epoch, their per-sample data), usable
in both modes.

- `WeightedSampler`: draws indices with probability proportional to per-sample weights.
- `RepeatFactorSampler`: the LVIS rule: a sample is repeated by the factor of its rarest category.
- `CurriculumSampler`: easy to hard: each epoch draws from the easiest fraction a pacing says.

Each is a `torch.utils.data.Sampler`: given to `fastdata.loader(dataset, sampler=...)` (or
to a DataLoader) it yields this rank's share of the epoch (the epoch padded by wrapping to a
multiple of the world size, then strided, as DistributedSampler; rank and world size read from
torch.distributed at each iteration unless given). Given to image mode,
`fastdata.loader(folder, sampler=...)`, the loader takes the whole epoch from `indices(epoch)`
and splits it among the ranks itself.

The order never touches a global RNG: an epoch's draws come from a generator seeded with
(seed, epoch), so a resume that skips batches by index (both modes do) is exact. An epoch's
length is fixed at construction (`num_samples`), so `len(loader)` is the same every epoch.
Per-sample data changed with `set_weights` / `set_difficulty` takes effect from the next
epoch that starts and is held by `state_dict()`; a callable given instead is the user's, and
is called again for each epoch.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Hashable, Iterable, Iterator, Sequence, Union

import numpy as np
import torch
from torch.utils.data import Sampler

from ._ranks import ranks, share

__all__ = ["CurriculumSampler", "RepeatFactorSampler", "WeightedSampler"]

PerSample = Union[Sequence[float], np.ndarray, torch.Tensor]
_STREAM = 0x5A3  # a stream of its own: the sampler's draws are independent of other (seed, epoch) uses


def _generator(seed: int, epoch: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64([seed, epoch, _STREAM]))


def _per_sample(values: Any, name: str, size: int | None = None) -> np.ndarray:
    """`values` as a 1-D float64 array of finite numbers (checked), of `size` when given."""
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    try:
        out = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{name} should be a sequence of numbers, but got {type(values).__name__}: {e}") from None
    if out.ndim != 1 or not len(out):
        raise ValueError(f"{name} should be a non-empty 1-D sequence (one value per sample), but got shape {out.shape}")
    if size is not None and len(out) != size:
        raise ValueError(f"{name} should have one value per sample ({size}), but got {len(out)}")
    if not np.isfinite(out).all():
        raise ValueError(f"{name} should be finite numbers, but got {out[~np.isfinite(out)][:3].tolist()}")
    return out


def _seed(seed: Any) -> int:
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed should be a non-negative integer, but got {seed!r}")
    return int(seed)


class IndexSampler(Sampler[int]):
    """The samplers' common part: the epoch, the rank split, the cache of the epoch's list, and
    the state. A subclass draws an epoch (`_draw`) and names its state (`_state`,
    `_load_state`)."""

    def __init__(self, population: int, num_samples: int, seed: int, rank: int | None,
                 world_size: int | None) -> None:
        if not isinstance(num_samples, (int, np.integer)) or isinstance(num_samples, bool) or num_samples <= 0:
            raise ValueError(f"num_samples should be a positive integer, but got {num_samples!r}")
        if world_size is not None and (not isinstance(world_size, int) or world_size <= 0):
            raise ValueError(f"world_size should be a positive integer, but got {world_size!r}")
        if rank is not None and not 0 <= rank < (world_size if world_size is not None else math.inf):
            raise ValueError(f"rank should be in [0, world_size), but got rank={rank}, world_size={world_size}")
        self.population = population  # the samples it indexes: the dataset's length
        self.num_samples = int(num_samples)  # indices an epoch holds, all ranks together
        self.seed = _seed(seed)
        self.rank, self.world_size = rank, world_size
        self.epoch = 0
        self._data_version = 0  # counts the changes of per-sample data (the cache's key)
        self._cached: tuple[int, int, np.ndarray] | None = None

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration runs (as DistributedSampler: it does not advance by itself)."""
        self.epoch = int(epoch)

    def indices(self, epoch: int | None = None) -> np.ndarray:
        """The whole epoch's index list (before any rank split), `num_samples` long; `epoch`
        defaults to the one set. Read-only: it is cached for the epoch."""
        epoch = self.epoch if epoch is None else int(epoch)
        cached = self._cached
        if cached is None or cached[:2] != (epoch, self._data_version):
            order = np.ascontiguousarray(self._draw(epoch), dtype=np.int64)
            order.setflags(write=False)
            cached = self._cached = (epoch, self._data_version, order)
        return cached[2]

    def share(self, rank: int, world_size: int, epoch: int | None = None) -> np.ndarray:
        """Rank `rank`'s share of the epoch: the list padded by wrapping to a multiple of
        `world_size`, then every world_size-th index from `rank` on."""
        return share(self.indices(epoch), rank, world_size)

    def _ranks(self) -> tuple[int, int]:
        return ranks(self.rank, self.world_size)

    def __len__(self) -> int:
        """This rank's share: the indices one iteration yields."""
        return math.ceil(self.num_samples / self._ranks()[1])

    def __iter__(self) -> Iterator[int]:
        return iter(self.share(*self._ranks()).tolist())

    def state_dict(self) -> dict[str, Any]:
        """What the order depends on besides the constructor's arguments: the seed, the epoch,
        and per-sample data set since construction (tensors: `torch.load` reads them with
        weights_only)."""
        return {"sampler": type(self).__name__, "seed": self.seed, "epoch": self.epoch, "population": self.population,
                "num_samples": self.num_samples, **self._state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores `state_dict()`'s state; raises ValueError, changing nothing, when it was taken
        from another kind of sampler or another dataset or epoch length."""
        self.check_state(state)
        self.epoch = int(state["epoch"])
        self._load_state(state)

    def check_state(self, state: dict[str, Any]) -> None:
        """Raises ValueError when `state` cannot be loaded into this sampler."""
        if not isinstance(state, dict) or "epoch" not in state:
            raise ValueError(f"state should be a dict from a sampler's state_dict(), but got {state!r:.200}")
        kind = type(self).__name__
        for key, mine in (("sampler", kind), ("seed", self.seed), ("population", self.population),
                          ("num_samples", self.num_samples)):
            if state.get(key, mine) != mine:
                raise ValueError(f"the state was taken from a {state.get('sampler')} with {key}={state[key]!r}, but "
                                 f"this is a {kind} with {key}={mine!r}: load it into a sampler made as that one was")

    def _draw(self, epoch: int) -> np.ndarray:
        raise NotImplementedError

    def _state(self) -> dict[str, Any]:
        return {}

    def _load_state(self, state: dict[str, Any]) -> None:
        pass

    def __repr__(self) -> str:
        return f"{type(self).__name__}(population={self.population}, num_samples={self.num_samples}, seed={self.seed})"


class WeightedSampler(IndexSampler):
    """Draws `num_samples` indices an epoch (default: one per sample), index i with probability
    weights[i] / sum(weights); with `replacement=False`, without repeats (successive draws, as
    torch.multinomial: needs num_samples <= the number of positive weights).

    `weights`: one non-negative number per sample, or a callable `weights(epoch)` returning them
    (called once here, with epoch 0, for the dataset's length). `set_weights` replaces them from
    the next epoch that starts on."""

    def __init__(self, weights: PerSample | Callable[[int], PerSample], num_samples: int | None = None,
                 replacement: bool = True, seed: int = 0, *, rank: int | None = None,
                 world_size: int | None = None) -> None:
        self._fn = weights if callable(weights) and not isinstance(weights, torch.Tensor) else None
        first = self._check(weights(0) if self._fn is not None else weights)
        self._weights = None if self._fn is not None else first
        self._set: np.ndarray | None = None  # set by set_weights: part of the state
        self.replacement = bool(replacement)
        super().__init__(len(first), len(first) if num_samples is None else num_samples, seed, rank, world_size)
        if not self.replacement:
            self._check_without_replacement(first)

    def _check(self, weights: Any, size: int | None = None) -> np.ndarray:
        w = _per_sample(weights, "weights", size)
        if (w < 0).any() or w.sum() <= 0:
            raise ValueError("weights should be non-negative with a positive sum, but got "
                             f"min={w.min()}, sum={w.sum()}")
        return w

    def _check_without_replacement(self, w: np.ndarray) -> None:
        positive = int((w > 0).sum())
        if self.num_samples > positive:
            raise ValueError(f"num_samples should be at most the {positive} positive weights without replacement, "
                             f"but got {self.num_samples}; pass replacement=True or fewer num_samples")

    def set_weights(self, weights: PerSample) -> None:
        """The weights from the next epoch that starts on (replacing a callable too)."""
        w = self._check(weights, self.population)
        if not self.replacement:
            self._check_without_replacement(w)
        self._weights, self._fn, self._set = w, None, w
        self._data_version += 1

    def weights(self, epoch: int | None = None) -> np.ndarray:
        """The weights `epoch` (default: the one set) draws with."""
        if self._fn is None:
            return self._weights
        w = self._check(self._fn(self.epoch if epoch is None else int(epoch)), self.population)
        if not self.replacement:
            self._check_without_replacement(w)
        return w

    def _draw(self, epoch: int) -> np.ndarray:
        w = self.weights(epoch)
        rng = _generator(self.seed, epoch)
        if self.replacement:
            cdf = np.cumsum(w)
            return np.searchsorted(cdf, rng.random(self.num_samples) * cdf[-1], side="right").clip(max=len(w) - 1)
        # Gumbel top-k: the k largest log(w) + Gumbel keys, in key order, are k successive
        # draws without replacement (zero weights get -inf and are never among them).
        with np.errstate(divide="ignore"):
            keys = np.log(w) + rng.gumbel(size=len(w))
        top = np.argpartition(-keys, self.num_samples - 1)[: self.num_samples]
        return top[np.argsort(-keys[top], kind="stable")]

    def _state(self) -> dict[str, Any]:
        return {} if self._set is None else {"weights": torch.from_numpy(self._set.copy())}

    def _load_state(self, state: dict[str, Any]) -> None:
        if "weights" in state:
            self.set_weights(state["weights"])


class RepeatFactorSampler(IndexSampler):
    """Repeat-factor sampling (LVIS, Gupta et al. 2019): for each category c, f_c is the
    fraction of samples that hold it and r_c = max(1, sqrt(t / f_c)); a sample's repeat factor
    r_i is the largest r_c of its categories (1 with none). An epoch holds sample i floor(r_i)
    times, plus once more with probability frac(r_i), shuffled.

    The extra copies are drawn by systematic sampling over the samples in a random order: each
    sample gets its extra with probability frac(r_i) exactly, and the epoch's length is
    ceil(sum r_i) or one less; a short epoch is padded by wrapping (its first index repeated),
    so every epoch holds `num_samples = ceil(sum r_i)` indices.

    `categories`: one iterable of category ids (any hashable) per sample."""

    def __init__(self, categories: Sequence[Iterable[Hashable]], t: float, seed: int = 0, *,
                 rank: int | None = None, world_size: int | None = None) -> None:
        if not (isinstance(t, (int, float)) and not isinstance(t, bool) and 0 < t <= 1):
            raise ValueError(f"t should be a frequency threshold in (0, 1], but got {t!r}")
        sets = [frozenset(c) for c in categories]
        if not sets:
            raise ValueError("categories should hold one list of category ids per sample, but got none")
        n = len(sets)
        counts: dict[Hashable, int] = {}
        for s in sets:
            for c in s:
                counts[c] = counts.get(c, 0) + 1
        self.t = float(t)
        self.category_factors = {c: max(1.0, math.sqrt(self.t * n / k)) for c, k in counts.items()}
        self.repeat_factors = np.array([max((self.category_factors[c] for c in s), default=1.0) for s in sets])
        self._whole = np.floor(self.repeat_factors).astype(np.int64)
        self._frac = self.repeat_factors - self._whole
        length = int(self._whole.sum()) + math.ceil(round(float(self._frac.sum()), 9))
        super().__init__(n, length, seed, rank, world_size)

    def _draw(self, epoch: int) -> np.ndarray:
        rng = _generator(self.seed, epoch)
        n = self.population
        order = rng.permutation(n)
        ends = np.cumsum(self._frac[order])
        u = rng.random()
        # One point at u, u + 1, u + 2, ...: a sample gets its extra copy when a point falls in
        # its interval (ends - frac, ends], of length frac < 1, so with probability frac.
        extra = np.zeros(n, dtype=np.int64)
        extra[order] = np.floor(ends - u) > np.floor(ends - self._frac[order] - u)
        epoch_list = rng.permutation(np.repeat(np.arange(n), self._whole + extra))
        return np.resize(epoch_list, self.num_samples)


class CurriculumSampler(IndexSampler):
    """Easy to hard: samples ranked by `difficulty` (lower is easier; ties by index), and epoch
    e draws from the easiest ceil(pacing(e) * n) of them.

    Every epoch holds `num_samples` indices (default: one per sample), whatever the pacing: the
    subset's samples in shuffled passes (each pass a permutation of the subset), cut to
    num_samples. A fixed length keeps what counts steps per epoch (LR schedules, progress,
    the batch count of every rank) unchanged while the subset grows, as curriculum training
    takes a fixed number of steps drawn from the current subset.

    `pacing(epoch)` returns a fraction in (0, 1]. `set_difficulty` re-ranks from the next epoch
    that starts on."""

    def __init__(self, difficulty: PerSample, pacing: Callable[[int], float], num_samples: int | None = None,
                 seed: int = 0, *, rank: int | None = None, world_size: int | None = None) -> None:
        if not callable(pacing):
            raise TypeError(f"pacing should be a callable pacing(epoch) -> fraction in (0, 1], but got {pacing!r}")
        d = _per_sample(difficulty, "difficulty")
        self.pacing = pacing
        self._ranked = np.argsort(d, kind="stable")
        self._set: np.ndarray | None = None
        super().__init__(len(d), len(d) if num_samples is None else num_samples, seed, rank, world_size)

    def set_difficulty(self, difficulty: PerSample) -> None:
        """The difficulty from the next epoch that starts on."""
        d = _per_sample(difficulty, "difficulty", self.population)
        self._ranked, self._set = np.argsort(d, kind="stable"), d
        self._data_version += 1

    def pool(self, epoch: int | None = None) -> np.ndarray:
        """The samples `epoch` (default: the one set) draws from, easiest first."""
        epoch = self.epoch if epoch is None else int(epoch)
        fraction = self.pacing(epoch)
        if not (isinstance(fraction, (int, float, np.floating)) and 0 < fraction <= 1):
            raise ValueError(f"pacing({epoch}) should be a fraction in (0, 1], but got {fraction!r}")
        return self._ranked[: max(1, math.ceil(round(fraction * self.population, 9)))]

    def _draw(self, epoch: int) -> np.ndarray:
        pool = self.pool(epoch)
        rng = _generator(self.seed, epoch)
        passes = math.ceil(self.num_samples / len(pool))
        return rng.permuted(np.tile(pool, (passes, 1)), axis=1).ravel()[: self.num_samples]

    def _state(self) -> dict[str, Any]:
        return {} if self._set is None else {"difficulty": torch.from_numpy(self._set.copy())}

    def _load_state(self, state: dict[str, Any]) -> None:
        if "difficulty" in state:
            self.set_difficulty(state["difficulty"])
