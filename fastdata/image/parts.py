"""The three parts an image backend is made of, as protocols: the order (which samples each
batch holds: `order.py`'s FileOrder and ShardOrder), the reader (their bytes and labels:
`read.py`'s FileReader, `read_shards.py`'s ShardReader) and the runner (who reads and decodes
them, and where: `cpu.py`'s CpuWorkers, `threads.py`'s InProcess, `dali.py`'s DaliDecoders,
`ray.py`'s RayWorkers). `loader.ImageLoader` builds one of each and runs the passes; a backend
(`fastdata.backends`) names which."""

from __future__ import annotations

from typing import Any, Callable, Iterator, Protocol, runtime_checkable

from .read import Read


@runtime_checkable
class BatchOrder(Protocol):
    def __len__(self) -> int:
        """Batches per epoch for this rank."""

    def keys(self, epoch: int, k: int) -> list:
        """Batch k of `epoch`, as the reader takes it."""

    def state(self) -> dict[str, Any]:
        """What a resume must match besides the seed (added to the loader's state_dict)."""

    def check_state(self, state: dict[str, Any]) -> None:
        """Raises ValueError when `state` was taken with an order this one cannot resume."""


@runtime_checkable
class Reader(Protocol):
    def __len__(self) -> int:
        """The samples of the source."""

    def read(self, keys: Any) -> Read:
        """The samples of one batch, named by the order's keys: their ids, names, bytes and
        labels, and the failures the on_error policy kept."""

    def parts(self, keys: Any) -> Iterator[tuple[Read, bool]]:
        """The same batch read a part at a time where its bytes would be too many at once,
        each part with whether more follow, each read once the one before is taken."""

    def num_classes(self, transform: Any) -> int | None:
        """The number of classes, where the source names them (a transform with soft labels
        needs it)."""

    def close(self) -> None:
        """Stops this process's reading threads (before a fork, or at a pass's end in process)."""


@runtime_checkable
class Runner(Protocol):
    num_workers: int  # the worker processes, threads or actors it runs (0: in this process)
    timing: bool  # whether the batches carry their stage seconds

    def open(self, epoch: int, skip: int) -> tuple[Iterator[Any], Callable[[], None]]:
        """(the raw batches from batch `skip` of `epoch` on, the pass's end): idempotent, called
        however the pass ends."""

    def epoch_done(self, epoch: int) -> None:
        """The epoch's last batch is out (a runner running ahead is already on the next)."""

    def watchdog(self, it: Any) -> Any:
        """What watches the pass `it` for a stalled or dead worker (NoWatchdog without workers)."""

    def shutdown(self) -> None:
        """Stops its workers now (after an error: the next pass starts fresh ones)."""

    def set_timing(self, on: bool) -> bool:
        """Stage timing on or off; False when it cannot be switched now."""

    def ready_ahead(self) -> int:
        """How many batches it can have ready ahead of the consumer."""

    def in_process(self) -> bool:
        """Whether the stages run in the training process."""
