"""Output sizes that change with the epoch (progressive resizing).

A size schedule is a list of (epoch, size) steps, each size holding from its epoch on, e.g.
`[(0, 160), (10, 192), (20, 224)]`, or a callable `epoch -> size`. The size of a batch is a
pure function of its epoch, which every batch's keys carry: workers running ahead into the
next epoch plan that epoch's size, no batch mixes sizes, and a resume gives the same batches.
"""

from __future__ import annotations

import bisect
import pickle
from typing import Any, Callable, Sequence


def is_int(x: Any) -> bool:
    """Whether `x` is an int and not a bool."""
    return isinstance(x, int) and not isinstance(x, bool)


def is_schedule(size: Any) -> bool:
    """Whether `size` is a schedule (a callable, or a sequence of steps) rather than one size
    (an int, or an (h, w) pair of ints)."""
    if callable(size):
        return True
    return isinstance(size, (list, tuple)) and len(size) > 0 and not all(is_int(s) for s in size)


class SizeSchedule:
    """An op's output size as a function of the epoch. `check(name, size, where)` turns one
    size into the op's form (an (h, w) pair, or an int where the op takes one) or raises
    ValueError; it runs on every step at construction, and on a callable's result at each
    epoch it is asked for (epoch 0 at construction)."""

    def __init__(self, name: str, steps: Sequence | Callable[[int], Any],
                 check: Callable[[str, Any, str], Any]) -> None:
        self.name, self.check = name, check
        self.fn: Callable[[int], Any] | None = None
        self.epochs: tuple[int, ...] = ()
        self.sizes: tuple = ()
        if callable(steps):
            self.fn = steps
            self.at(0)
            return
        epochs, sizes = [], []
        for step in steps:
            if not (isinstance(step, (list, tuple)) and len(step) == 2 and is_int(step[0]) and step[0] >= 0):
                raise ValueError(f"{name} size schedule should be (epoch, size) steps with epochs >= 0, but got step "
                                 f"{step!r}")
            if epochs and step[0] <= epochs[-1]:
                raise ValueError(f"{name} size schedule should have increasing epochs, but epoch {step[0]} comes "
                                 f"after epoch {epochs[-1]}")
            epochs.append(step[0])
            sizes.append(check(name, step[1], f"at epoch {step[0]}"))
        if not epochs:
            raise ValueError(f"{name} size schedule should have at least one (epoch, size) step, but got none")
        if epochs[0] != 0:
            raise ValueError(f"{name} size schedule should start at epoch 0, but starts at epoch {epochs[0]}; "
                             f"add a step (0, size)")
        self.epochs, self.sizes = tuple(epochs), tuple(sizes)

    def at(self, epoch: int) -> Any:
        """The size at `epoch`: the last step at or before it, or the callable's result."""
        if self.fn is None:
            return self.sizes[bisect.bisect_right(self.epochs, epoch) - 1]
        try:
            size = self.fn(epoch)
        except Exception as e:
            raise ValueError(f"{self.name} size schedule raised at epoch {epoch}: {type(e).__name__}: {e}") from e
        return self.check(self.name, size, f"at epoch {epoch}")

    def steps(self, epochs: int | None = None) -> list[tuple[int, Any]]:
        """(first epoch, size) of each step; for a callable, of each change within `epochs`
        epochs (an empty list without `epochs`)."""
        if self.fn is None:
            return list(zip(self.epochs, self.sizes))
        out: list[tuple[int, Any]] = []
        for e in range(epochs or 0):
            size = self.at(e)
            if not out or out[-1][1] != size:
                out.append((e, size))
        return out

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SizeSchedule) and (self.fn, self.epochs, self.sizes) == (other.fn, other.epochs,
                                                                                           other.sizes)

    def __hash__(self) -> int:
        return hash((self.fn, self.epochs, self.sizes))

    def __repr__(self) -> str:
        if self.fn is not None:
            # the function's name, not its address: the tune cache keys on the transform's repr
            return f"SizeSchedule({getattr(self.fn, '__module__', '?')}.{getattr(self.fn, '__qualname__', '?')})"
        return f"SizeSchedule({list(zip(self.epochs, self.sizes))})"

    def __reduce__(self):
        # Workers started by forkserver or spawn receive the transform pickled: a lambda or a
        # nested function cannot travel, and pickle's own error would not say which option.
        if self.fn is not None:
            try:
                pickle.dumps(self.fn)
            except Exception as e:
                raise TypeError(f"{self.name} size schedule should be picklable (a module-level function) to reach "
                                f"worker processes, but got {self.fn!r} ({e})") from None
        return (_rebuild, (self.name, self.fn if self.fn is not None else list(zip(self.epochs, self.sizes)),
                           self.check))


def _rebuild(name: str, steps: Any, check: Callable[[str, Any, str], Any]) -> SizeSchedule:
    return SizeSchedule(name, steps, check)
