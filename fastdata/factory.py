"""`fastdata.loader`: validates the call, picks the mode and backend, returns the Loader."""

from __future__ import annotations

import json
import logging
from typing import Any

import torch

from . import _optional as optional
from . import sources
from ._loader import Loader
from .backends.dali import DaliLoader
from .backends.pil import PilLoader
from .backends.torch import DATALOADER_KEYWORDS, TorchLoader
from .backends.wds import WdsLoader
from .image import options as image_options
from .tunecache import cached_tune

_DROPIN_KEYWORDS = frozenset(DATALOADER_KEYWORDS) | {"device"}
logger = logging.getLogger("fastdata")


_IMAGE_KEYWORDS = image_options.KEYWORDS
_BACKENDS = ("auto", "pil", "wds", "dali", "ray")  # "ray" only when asked for: it needs a cluster to pay off


def _with_config(options: dict[str, Any]) -> dict[str, Any]:
    """`config=PATH`: a JSON file (as `fastdata-profile --tune` writes) whose values fill every
    keyword the caller did not give."""
    path = options.pop("config", None)
    if path is None:
        return options
    try:
        with open(path) as f:
            tuned = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"config should be a readable JSON file from fastdata-profile --tune, but {path!r}: {e}") from e
    values = tuned.get("loader", tuned) if isinstance(tuned, dict) else None
    if not isinstance(values, dict):
        raise ValueError(f"config {path!r} should hold a JSON object of loader keywords")
    for name, value in values.items():
        if name not in _IMAGE_KEYWORDS or name == "config":
            raise ValueError(f"config {path!r} sets {name!r}, which is not a loader keyword")
        options.setdefault(name, value)
    return options


def _with_tune(source: Any, batch_size: Any, options: dict[str, Any]) -> dict[str, Any]:
    """num_workers="auto" and placement="auto" take a config `fastdata-profile --tune` chose for
    this source, transform, batch size and machine, when a valid one is cached (logged at INFO:
    the file, when it was tuned, what it applied)."""
    workers_auto = options.get("num_workers") == "auto"
    placement_auto = options.get("placement", "auto") == "auto"
    if not (workers_auto or placement_auto):
        return options
    entry = cached_tune(source, options.get("transform"), batch_size)
    if entry is None:
        return options
    tuned, applied = entry["loader"], {}
    if workers_auto and "num_workers" in tuned:
        applied["num_workers"] = options["num_workers"] = tuned["num_workers"]
        if tuned["num_workers"] and "prefetch_factor" in tuned and "prefetch_factor" not in options:
            applied["prefetch_factor"] = options["prefetch_factor"] = tuned["prefetch_factor"]
    if placement_auto and "placement" in tuned:
        applied["placement"] = options["placement"] = tuned["placement"]
    if applied:
        logger.info("applied the tuned config in %s (tuned %s, expires %s): %s", entry["path"], entry["created"],
                    entry["expires"], ", ".join(f"{k}={v!r}" for k, v in applied.items()))
    return options


def _image_loader(source: Any, batch_size: Any, options: dict[str, Any]) -> Loader:
    for name in options:
        if name not in _IMAGE_KEYWORDS:
            raise TypeError(f"loader() got an unexpected keyword argument {name!r} for an image source")
    options = _with_config(dict(options))
    options = _with_tune(source, batch_size, options)
    backend = options.pop("backend", "auto")
    if backend not in _BACKENDS:
        raise ValueError(f"backend should be one of {', '.join(map(repr, _BACKENDS))}, but got {backend!r}")
    shards = sources.is_shard_source(source)
    if backend == "pil" and shards:
        raise ValueError("backend 'pil' reads image files; WebDataset shards are read by backend 'wds' (or 'auto')")
    if backend == "wds" and not shards:
        raise ValueError("backend 'wds' reads WebDataset shards (.tar); write a folder or file list as shards with "
                         "fastdata-shard, or use backend 'pil' (or 'auto')")
    samples = sources.resolve(source)
    why = "chosen"
    if backend == "auto":
        backend, why = _auto(shards, options.get("device"))
    kind = _ray_loader() if backend == "ray" else {"dali": DaliLoader, "wds": WdsLoader, "pil": PilLoader}[backend]
    if "hw_decoder_load" in options and kind is not DaliLoader:
        raise ValueError(f"hw_decoder_load tunes DALI's GPU decoding, but backend {backend!r} was picked")
    logger.info("image mode: %s, backend %r (%s)", samples.description, backend, why)
    return kind(samples, batch_size, image_options.ImageOptions(**options))


def _ray_loader() -> type:
    """The `ray` backend's loader, imported only when asked for (Ray is an extra)."""
    optional.require("ray", "backend 'ray'")
    from .backends.ray import RayLoader

    return RayLoader


def _auto(shards: bool, device: Any) -> tuple[str, str]:
    """The contract's rule: `dali` when a CUDA device is the target and DALI is installed, else
    `wds` for shards, else `pil`."""
    cuda = torch.device(device).type == "cuda" if device is not None else torch.cuda.is_available()
    if cuda and optional.has("dali"):
        return "dali", "auto: a CUDA target and DALI installed"
    if shards:
        return "wds", "auto: shards" + (" (DALI is not installed)" if cuda else "")
    return "pil", "auto: image files" + (" (DALI is not installed)" if cuda else ", a CPU target")


def loader(source: Any, batch_size: int | None = 1, **options: Any) -> Loader:
    """Returns a Loader over `source`.

    Given a `torch.utils.data.Dataset` (map-style or iterable; any object DataLoader accepts),
    it is a drop-in for `torch.utils.data.DataLoader`: the same keywords, defaults and batches,
    collated natively, plus `num_workers="auto"` and `device=` (batches copied to that device
    on a side stream, one batch ahead).

    Given images (an ImageFolder folder, a list of (path, label) pairs, WebDataset shards:
    a .tar path, a brace pattern, a list of shard paths or URLs) it decodes them into
    `(images, labels)` batches with the fastest backend this machine has; see docs/guide.md for
    the keywords (transform, backend, device, dtype, channels_last, placement, seed, rank,
    world_size, on_error, config, sampler (`fastdata.samplers`); hw_decoder_load for the dali
    backend).
    """
    _check_device(options.get("device"))
    if sources.is_image_source(source):
        return _image_loader(source, batch_size, options)
    for name in options:
        if name not in _DROPIN_KEYWORDS:
            raise TypeError(f"loader() got an unexpected keyword argument {name!r}")
    return TorchLoader(source, batch_size=batch_size, **options)


def _check_device(device: Any) -> None:
    """A CUDA device on a machine without one fails here, not at the first batch."""
    if device is None:
        return
    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device={device!r} is not a torch device ({e})") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r}, but this machine has no CUDA device (torch.cuda.is_available() is "
                         "False): use device='cpu'")
