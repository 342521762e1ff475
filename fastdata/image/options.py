"""Image mode's keywords, once: `ImageOptions` holds every keyword `fastdata.loader` takes for
an image source (the contract's, with its defaults), built once by `fastdata.loader` after a
tuned or given config filled what the call left out, and handed to the backend's loader."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch


@dataclass(frozen=True)
class ImageOptions:
    shuffle: bool = False
    drop_last: bool = False
    num_workers: int | str = 0  # or "auto": see fastdata._loader.resolve_workers
    timeout: float = 0
    prefetch_factor: int | None = None
    persistent_workers: bool | None = None  # None: the backend's default (ray: True; the others: False)
    pin_memory: bool = False
    transform: Any = None  # a fastdata.transforms.Compose
    device: Any = None  # None: CUDA when there is one, else the CPU
    dtype: Any = torch.float32  # or its name, as a JSON config gives it
    channels_last: bool = True
    placement: str = "auto"
    seed: int = 0
    rank: int | None = None  # None: torch.distributed's when a pass starts, else 0
    world_size: int | None = None
    on_error: str = "raise"
    sampler: Any = None  # a fastdata.samplers sampler
    hw_decoder_load: float | None = None  # the dali backend's alone; None: DALI's default


# What fastdata.loader takes for an image source: the options, the backend, and a config file.
KEYWORDS = frozenset(f.name for f in fields(ImageOptions)) | {"backend", "config"}
