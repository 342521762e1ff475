"""The `ray` backend: image files or shards, in the order and with the readers of `pil` and
`wds`, read and decoded by Ray actors anywhere in a Ray cluster (`fastdata.image.ray`); the
batches stream to the training process through Ray's object store."""

from __future__ import annotations

import dataclasses
from typing import Any

from .._loader import resolve_workers
from ..image.cpu import BatchTask
from ..image.loader import ImageLoader
from ..image.options import ImageOptions
from ..image.ray import RayWorkers, cluster_cpus, connect
from ..image.read import Failures, FileReader
from ..sources import Shards


class RayLoader(ImageLoader):
    """Image files or shards, decoded by Ray actors (one CPU each). num_workers is the number
    of actors (0 or "auto": one per CPU of the cluster); they persist across epochs unless
    persistent_workers=False."""

    backend = "ray"

    _persistent_default = True  # actors are slow to start: they persist unless told not to

    def __init__(self, samples: Any, batch_size: int, options: ImageOptions = ImageOptions()) -> None:
        num_workers = resolve_workers(options.num_workers, cluster=True)
        connect(num_workers)
        if num_workers == 0:
            num_workers = cluster_cpus()
        super().__init__(samples, batch_size, dataclasses.replace(options, num_workers=num_workers))

    def _parts(self, shuffle: bool, drop_last: bool, num_workers: int, fail: Failures):
        if isinstance(self.samples, Shards):  # shards: actor w reads lane w, as wds's worker w does
            return self._shard_parts(shuffle, drop_last, max(1, num_workers), fail, self.persistent_workers)
        return self._file_order(shuffle, drop_last), FileReader(self.samples, fail)

    def _make_runner(self, num_workers: int, timeout: float, prefetch_factor: int | None, pin: bool) -> RayWorkers:
        run_ahead = self._run_ahead and self.index_sampler is None  # as CpuWorkers (see ImageLoader._make_runner)
        return RayWorkers(self._order, BatchTask(self._reader, self._decoder), num_workers, timeout, prefetch_factor,
                          self.persistent_workers, run_ahead)

    def _rest(self, state: dict[str, Any]) -> Any:
        raise RuntimeError("this iterator's pass was ended by a newer iter() of its loader, and the ray backend "
                           "runs one pass at a time on its actors (a second set could wait for the CPUs the first "
                           "holds): make a second loader to read two passes side by side")

    def shutdown(self) -> None:
        """Kills the Ray actors now (the next pass starts new ones)."""
        self._stop()
        self._runner.shutdown()
