"""The `pil` backend: image files, decoded in DataLoader's workers (the native crop-aware JPEG
decoder, Pillow for the rest) straight into reused batch slots."""

from __future__ import annotations

from ..image.loader import ImageLoader
from ..image.order import FileOrder
from ..image.read import Failures, FileReader


class PilLoader(ImageLoader):
    """Image files, in file order, decoded by CPU workers."""

    backend = "pil"

    def _parts(self, shuffle: bool, drop_last: bool, workers: int, fail: Failures):
        order = FileOrder(len(self.samples), self.batch_size, shuffle, drop_last, self.seed, self.rank,
                          self.world_size)
        return order, FileReader(self.samples, fail)
