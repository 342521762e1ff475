"""The `wds` backend: WebDataset shards streamed by DataLoader's workers, each reading its own
contiguous range of the rank's shards, decoded as `pil` decodes."""

from __future__ import annotations

from ..image.loader import ImageLoader
from ..image.read import Failures


class WdsLoader(ImageLoader):
    """Shards, in shard order (one lane per worker), decoded by CPU workers."""

    backend = "wds"

    def _parts(self, shuffle: bool, drop_last: bool, num_workers: int, fail: Failures):
        # Persistent workers, which serve the next epoch too, read its first block ahead. A pass
        # in this process does not: its reader's thread stops at the pass's end (no thread may
        # be live at a fork), and a block read ahead then would be thrown away.
        return self._shard_parts(shuffle, drop_last, max(1, num_workers), fail, self.persistent_workers)
