"""The `pil` backend: image files, decoded in DataLoader's workers (the native crop-aware JPEG
decoder, Pillow for the rest) straight into reused batch slots."""

from __future__ import annotations

from ..image.loader import ImageLoader
from ..image.read import Failures, FileReader


class PilLoader(ImageLoader):
    """Image files, in file order, decoded by CPU workers."""

    backend = "pil"

    def _parts(self, shuffle: bool, drop_last: bool, num_workers: int, fail: Failures):
        order = self._file_order(shuffle, drop_last)
        return order, FileReader(self.samples, fail)
