"""The `dali` backend: files or shards read and checked in the training process (the order
and reader of `pil` or `wds`, with one lane), decoded, cropped, resized and flipped by an
NVIDIA DALI pipeline (`fastdata.image.dali`)."""

from __future__ import annotations

from typing import Any

from ..image.dali import DaliDecoders
from ..image.loader import ImageLoader
from ..image.options import ImageOptions
from ..image.read import Failures, FileReader
from ..image.read_shards import ShardReader
from ..sources import Shards


class DaliLoader(ImageLoader):
    """Image files or shards, decoded by DALI (on the GPU when the target is CUDA)."""

    backend = "dali"
    _auto_in_process = False  # num_workers is DALI's thread count

    def __init__(self, samples: Any, batch_size: int, options: ImageOptions = ImageOptions()) -> None:
        # hw_decoder_load: the share of JPEGs DALI gives the hardware decoder of A100/H100-class
        # GPUs (the rest go to nvJPEG on the CUDA cores); 0.65 is DALI's default. Unused on the CPU.
        load = 0.65 if options.hw_decoder_load is None else options.hw_decoder_load
        if not (isinstance(load, (int, float)) and 0.0 <= load <= 1.0):
            raise ValueError(f"hw_decoder_load should be a number in [0, 1], but got {load!r}")
        self.hw_decoder_load = float(load)
        super().__init__(samples, batch_size, options)

    def _parts(self, shuffle: bool, drop_last: bool, num_workers: int, fail: Failures):
        if isinstance(self.samples, Shards):
            # not the next epoch's first block ahead: the reader's thread stops with each pass
            return self._shard_parts(shuffle, drop_last, 1, fail, False)
        order = self._file_order(shuffle, drop_last)
        return order, FileReader(self.samples, fail)

    def _make_runner(self, num_workers: int, timeout: float, prefetch_factor: int | None, pin: bool) -> DaliDecoders:
        pixel_ops = self.transform.pixel_ops if self.transform is not None else ()
        if pixel_ops:
            names = ", ".join(type(op).__name__ for op in pixel_ops)
            raise ValueError(f"backend 'dali' runs the geometry and Normalize; {names} has no DALI lowering yet: "
                             "use backend 'pil' or 'wds' for it")
        # num_workers is DALI's CPU thread count here (at least one).
        return DaliDecoders(self._order, self._reader, self._decoder, batch_size=self.batch_size,
                            threads=max(1, num_workers), depth=prefetch_factor or 2, device=self.device, seed=self.seed,
                            on_error=self.on_error, hw_decoder_load=self.hw_decoder_load,
                            copy_inputs=isinstance(self._reader, ShardReader))
