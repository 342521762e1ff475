"""A GPU decode as a torchvision user writes it, for `gpu.py` (issue 33 item 4): the measurement
that decides whether fastdata should decode on the GPU without DALI.

DataLoader workers read each file's bytes and draw its RandomResizedCrop window from the header's
size (Pillow reads only the header); the training process decodes the batch with torchvision's
nvJPEG (`decode_jpeg(list, device="cuda")`), then crops, resizes (bilinear, antialiased) and
flips each image on the GPU and normalizes the batch to bfloat16, channels_last. torchvision
decodes baseline JPEGs on the hardware JPEG engine of A100/H100-class GPUs, on a stream of its
own, but waits for that stream before it returns: inline, the training thread launches nothing
while a batch decodes. `ahead=True` runs the decode, crop and resize one batch ahead in a thread
of its own on a stream of its own, as a fastdata GPU decode would. The figure that counts is
the training loop's rate with each, beside the CPU path's in the same run: `gpu.py` prints them.

Without CUDA the same code decodes on the CPU (a check of the script, not figures).
"""

from __future__ import annotations

import contextlib
import math
import queue
import random
import threading

import torch
from torch.utils.data import DataLoader, Dataset

from fastdata import transforms as T


def rrc_window(width: int, height: int, rng, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """(top, left, h, w): torchvision's RandomResizedCrop.get_params, drawn from `rng` (`random`
    or a `random.Random`)."""
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(*log_ratio))
        w, h = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, height - h), rng.randint(0, width - w), h, w
    in_ratio = width / height
    w, h = (width, int(round(width / ratio[0]))) if in_ratio < ratio[0] else (
        (int(round(height * ratio[1])), height) if in_ratio > ratio[1] else (width, height))
    h, w = min(h, height), min(w, width)
    return (height - h) // 2, (width - w) // 2, h, w


class _Bytes(Dataset):
    """Each item: (the file's bytes as a uint8 tensor, its label, its window, its flip)."""

    def __init__(self, files: list[tuple[str, int]]) -> None:
        self.files = files

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        from PIL import Image

        path, label = self.files[i]
        with open(path, "rb") as f:
            data = f.read()
        with Image.open(path) as im:  # the header only
            width, height = im.size
        # DataLoader seeds each worker's `random` apart, anew each epoch unless persistent
        window = rrc_window(width, height, random)
        return torch.frombuffer(bytearray(data), dtype=torch.uint8), label, window, random.random() < 0.5


def _keep(items):
    data, labels, windows, flips = zip(*items)
    return list(data), torch.tensor(labels), windows, torch.tensor(flips)


class NvjpegSide:
    """Batches (images bfloat16 NCHW channels_last on `device`, labels) from `files`."""

    def __init__(self, files: list[tuple[str, int]], device: torch.device, batch: int, workers: int, size: int = 224,
                 ahead: bool = False):
        self.dataset = _Bytes(files)
        self.loader = DataLoader(self.dataset, batch_size=batch, shuffle=True, num_workers=workers,
                                 persistent_workers=workers > 0, collate_fn=_keep, drop_last=False)
        self.device, self.size, self.ahead = device, size, ahead
        self.mean = torch.tensor(T.IMAGENET_MEAN, device=device).view(1, 3, 1, 1) * 255
        self.std = torch.tensor(T.IMAGENET_STD, device=device).view(1, 3, 1, 1) * 255

    def __len__(self) -> int:
        return len(self.loader)

    def _make(self, data, labels, windows, flips):
        from torch.nn.functional import interpolate
        from torchvision.io import ImageReadMode, decode_jpeg

        images = decode_jpeg(data, mode=ImageReadMode.RGB, device="cuda" if self.device.type == "cuda" else "cpu")
        out = torch.empty(len(images), 3, self.size, self.size, device=self.device)
        for k, (image, (top, left, h, w)) in enumerate(zip(images, windows)):
            crop = image[None, :, top:top + h, left:left + w].float()
            out[k] = interpolate(crop, size=(self.size, self.size), mode="bilinear", antialias=True,
                                 align_corners=False)[0]
        flips = flips.to(self.device, non_blocking=True).view(-1, 1, 1, 1)
        out = torch.where(flips, out.flip(-1), out)
        out = ((out - self.mean) / self.std).to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
        return out, labels.to(self.device, non_blocking=True)

    def __iter__(self):
        if not self.ahead:
            for batch in self.loader:
                yield self._make(*batch)
            return
        cuda = self.device.type == "cuda"
        stream = torch.cuda.Stream(self.device) if cuda else None
        ready: queue.Queue = queue.Queue(maxsize=2)

        def produce():
            try:
                for batch in self.loader:
                    with torch.cuda.stream(stream) if cuda else contextlib.nullcontext():
                        out = self._make(*batch)
                        event = torch.cuda.Event() if cuda else None
                        if cuda:
                            event.record(stream)
                    ready.put((out, event))
            except BaseException as e:  # noqa: BLE001 - handed to the consumer
                ready.put((e, None))
            ready.put((None, None))

        thread = threading.Thread(target=produce, daemon=True)
        thread.start()
        while True:
            out, event = ready.get()
            if out is None:
                break
            if isinstance(out, BaseException):
                raise out
            if cuda:
                torch.cuda.current_stream(self.device).wait_event(event)
                for t in out:
                    t.record_stream(torch.cuda.current_stream(self.device))
            yield out
        thread.join()

