"""The `wds` backend: WebDataset shards streamed by DataLoader's workers, each reading its own
contiguous range of the rank's shards, decoded as `pil` decodes."""

from __future__ import annotations

from ..image.loader import ImageLoader
from ..image.order import ShardOrder
from ..image.read import Failures
from ..image.read_shards import ShardReader


class WdsLoader(ImageLoader):
    """Shards, in shard order (one lane per worker), decoded by CPU workers."""

    backend = "wds"

    def _parts(self, shuffle: bool, drop_last: bool, workers: int, fail: Failures):
        order = ShardOrder(self.samples.counts, self.batch_size, shuffle, drop_last, self.seed, self.rank,
                           self.world_size, max(1, workers))
        # a process that serves the next epoch too reads its first block ahead
        return order, ShardReader(self.samples, order, fail, persistent=self.persistent_workers or workers == 0)
