"""The `wds` backend: WebDataset shards streamed by DataLoader's workers, each reading its own
contiguous range of the rank's shards, decoded as `pil` decodes."""

from __future__ import annotations

from ..image.loader import ImageLoader
from ..image.read import Failures


class WdsLoader(ImageLoader):
    """Shards, in shard order (one lane per worker), decoded by CPU workers."""

    backend = "wds"

    def _parts(self, shuffle: bool, drop_last: bool, workers: int, fail: Failures):
        # a process that serves the next epoch too reads its first block ahead
        return self._shard_parts(shuffle, drop_last, max(1, workers), fail, self.persistent_workers or workers == 0)
