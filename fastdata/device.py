"""The transfer and the device stage: batches cross to the target device on a side stream, one
batch ahead (`prefetch`), then the ops placed on the device run there (`DeviceStage`)."""

from __future__ import annotations

import collections.abc
import copy
from typing import Any, Callable, Iterator, Sequence

import torch

from ._buffers import BufferRing, new_batch
from .transforms import batch as batch_ops
from .transforms.plan import plan_pixels


def map_tensors(fn: Callable[[torch.Tensor], Any], data: Any) -> Any:
    """`fn` applied to every tensor leaf of a batch, containers rebuilt the way torch's own
    `pin_memory` rebuilds them (mutable ones cloned, so their extra attributes survive);
    every other leaf untouched."""
    if isinstance(data, torch.Tensor):
        return fn(data)
    if isinstance(data, (str, bytes)):
        return data
    if isinstance(data, collections.abc.Mapping):
        try:
            if isinstance(data, collections.abc.MutableMapping):
                clone = copy.copy(data)
                clone.update({k: map_tensors(fn, v) for k, v in data.items()})
                return clone
            return type(data)({k: map_tensors(fn, v) for k, v in data.items()})  # type: ignore[call-arg]
        except TypeError:
            return {k: map_tensors(fn, v) for k, v in data.items()}
    if isinstance(data, tuple):
        if hasattr(data, "_fields"):  # namedtuple
            return type(data)(*(map_tensors(fn, v) for v in data))
        return type(data)(map_tensors(fn, v) for v in data)
    if isinstance(data, collections.abc.Sequence):
        try:
            if isinstance(data, collections.abc.MutableSequence):
                clone = copy.copy(data)
                for i, v in enumerate(data):
                    clone[i] = map_tensors(fn, v)
                return clone
            return type(data)([map_tensors(fn, v) for v in data])  # type: ignore[call-arg]
        except TypeError:
            return [map_tensors(fn, v) for v in data]
    return data


def tensors(data: Any) -> Iterator[torch.Tensor]:
    """The tensor leaves of a batch, through the containers `map_tensors` goes through."""
    if isinstance(data, torch.Tensor):
        yield data
    elif isinstance(data, collections.abc.Mapping):
        for v in data.values():
            yield from tensors(v)
    elif isinstance(data, collections.abc.Sequence) and not isinstance(data, (str, bytes)):
        for v in data:
            yield from tensors(v)


def prefetch(batches: Iterator[Any], device: torch.device,
             timer: Callable[[float], None] | None = None) -> Iterator[Any]:
    """Yields each batch on `device`. On CUDA the copy of batch i+1 runs on a side stream while
    the consumer works on batch i; tensors are handed to the consumer's stream properly
    (wait_stream, record_stream), and each host batch is kept alive until its copy is done,
    since a reused buffer must not be overwritten under an in-flight copy. With `timer` (stage
    timing), each CUDA copy's seconds, from events on the side stream, are passed to it."""
    if device.type != "cuda":
        for batch in batches:
            yield map_tensors(lambda t: t.to(device), batch)
        return

    stream = torch.cuda.Stream(device)

    def start(host: Any) -> tuple:
        with torch.cuda.stream(stream):
            began = None
            if timer is not None:
                began = torch.cuda.Event(enable_timing=True)
                began.record(stream)
            moved = map_tensors(lambda t: t.to(device, non_blocking=True), host)
            done = torch.cuda.Event(enable_timing=timer is not None)
            done.record(stream)
        return host, moved, began, done

    ahead = None
    for host in batches:
        current, ahead = ahead, start(host)
        if current is not None:
            yield _hand_over(current, device, stream, timer)
    if ahead is not None:
        yield _hand_over(ahead, device, stream, timer)


def _hand_over(item: tuple, device: torch.device, stream: "torch.cuda.Stream", timer) -> Any:
    host, moved, began, done = item
    consumer = torch.cuda.current_stream(device)
    consumer.wait_stream(stream)
    for t in tensors(moved):
        if t.device.type == "cuda":
            t.record_stream(consumer)
    done.synchronize()  # the host buffer may be reused once this returns; the copy is long done
    if began is not None:
        timer(began.elapsed_time(done) / 1e3)
    del host
    return moved


class DeviceStage:
    """Image mode's last stage, on the target device: the pixel ops placed there (Kornia, with
    placement="gpu"), then the batch ops (Normalize into `dtype`, MixUp, CutMix,
    LabelSmoothing). Their random parameters are a function of (seed, epoch, sample) and, for
    the batch ops, (seed, epoch, rank, batch k): the same whichever process or device runs them."""

    def __init__(self, pixel_ops: Sequence, ops: Sequence, *, device: torch.device, dtype: torch.dtype,
                 channels_last: bool, num_classes: int | None, seed: int, rank: int) -> None:
        self.pixel_ops, self.ops = tuple(pixel_ops), tuple(ops)
        self.dtype, self.channels_last, self.num_classes = dtype, channels_last, num_classes
        self.seed, self.rank = seed, rank
        # On a CPU device the float batch goes into reused slots: a fresh one is page-faulted
        # in every step or not at all, as the process's heap happens to have it.
        self.out_ring = BufferRing(3, shared=False) if device.type == "cpu" else None

    def __call__(self, batch: tuple, epoch: int, k: int) -> tuple:
        """(images, labels) of batch k of `epoch`, from (images, labels, the samples' draw keys)."""
        images, labels, keys = batch
        if self.pixel_ops:
            from .transforms import kornia

            plans = plan_pixels(self.pixel_ops, self.seed, epoch, keys, tuple(images.shape[-2:]))
            images = kornia.apply_pixel_ops(images, self.pixel_ops, plans)
            if self.channels_last:
                images = images.contiguous(memory_format=torch.channels_last)
        if not self.ops:
            return images, labels
        return batch_ops.apply(images, labels, self.ops, dtype=self.dtype, num_classes=self.num_classes,
                               seed=self.seed, epoch=epoch, rank=self.rank, batch=k,
                               new=self._new_output if self.out_ring is not None else None)

    def _new_output(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """A buffer for the stage's output: a free slot of the output ring, else fresh."""
        try:
            return new_batch(self.out_ring, shape, dtype)[1]
        finally:
            self.out_ring.end()
