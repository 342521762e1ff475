"""`fastdata.loader`: validates the call, picks the mode and backend, returns the Loader."""

from __future__ import annotations

import inspect
import json
import logging
from typing import Any

import torch

from . import _optional as optional
from . import sources
from ._cores import usable_cores
from ._loader import Loader
from .backends.dali import DaliLoader
from .backends.pil import PilLoader
from .backends.torch import DATALOADER_KEYWORDS, TorchLoader
from .backends.wds import WdsLoader
from .image import options as image_options
from .tunecache import BACKENDS, MAX_PREFETCH, cached_tune

_DROPIN_KEYWORDS = frozenset(DATALOADER_KEYWORDS) | {"device"}
logger = logging.getLogger("fastdata")


_IMAGE_KEYWORDS = image_options.KEYWORDS
_NO_SOURCE: Any = object()
# DataLoader's parameters that may be given by position after batch_size, in their order
_POSITIONAL = tuple(name for name, p in list(inspect.signature(torch.utils.data.DataLoader.__init__).parameters.items())[3:]
                    if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD)
_BACKENDS = ("auto", *BACKENDS)  # "ray" only when asked for: it needs a cluster to pay off


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
        expected = _config_value(name, value)
        if expected is not None:
            raise ValueError(f"config {path!r} sets {name!r} to {json.dumps(value)[:50]}, which should be {expected}")
        options.setdefault(name, value)
    return options


def _config_value(name: str, value: Any) -> str | None:
    """What a config file's `value` for the keyword `name` should be, where it is not that; None
    where it is. A file's values are data: each is held to the JSON type and range the keyword
    takes ("false" is a truthy string; a prefetch_factor of 1e9 would have torch's workers
    queue a billion requests), as a tune writes them."""
    def integer(v: Any, low: int, high: float = float("inf")) -> bool:
        return type(v) is int and low <= v <= high

    cap = max(64, 4 * usable_cores())  # a tune tries at most a worker a core, of its own machine
    checks = {
        "num_workers": (lambda v: v == "auto" or integer(v, 0, cap), f'"auto" or an integer in [0, {cap}]'),
        "prefetch_factor": (lambda v: v is None or integer(v, 1, MAX_PREFETCH), f"an integer in [1, {MAX_PREFETCH}]"),
        "persistent_workers": (lambda v: v is None or type(v) is bool, "true, false or null"),
        "timeout": (lambda v: type(v) in (int, float) and 0 <= v < float("inf"), "a number of seconds >= 0"),
        "seed": (lambda v: integer(v, 0, 2**63 - 1), "an integer >= 0"),
        "rank": (lambda v: v is None or integer(v, 0), "an integer >= 0 or null"),
        "world_size": (lambda v: v is None or integer(v, 1), "an integer >= 1 or null"),
        "hw_decoder_load": (lambda v: v is None or (type(v) in (int, float) and 0 <= v <= 1), "a number in [0, 1]"),
        "device": (lambda v: v is None or type(v) is str, "a device name such as \"cuda\" or null"),
    }
    if name in ("shuffle", "drop_last", "pin_memory", "channels_last"):
        ok, expected = type(value) is bool, "true or false"
    elif name in ("backend", "placement", "on_error", "dtype"):
        ok, expected = type(value) is str, "a name (a string)"
    elif name in checks:
        test, expected = checks[name]
        ok = test(value)
    else:  # transform, sampler: objects, which JSON cannot hold
        ok, expected = False, "given in the call (a config file cannot hold one)"
    return None if ok else expected


def _with_tune(source: Any, batch_size: Any, options: dict[str, Any]) -> dict[str, Any]:
    """num_workers="auto" and placement="auto" take a config `fastdata-profile --tune` chose for
    this source, transform, batch size and machine, when a valid one is cached (logged at INFO:
    the file, when it was tuned, what it applied): its backend where the loader's is "auto", and
    its workers persistent unless told otherwise, as the tune measured them. A loader that names
    another backend, or targets another device, than the tune measured takes none of it."""
    workers_auto = options.get("num_workers") == "auto"
    placement_auto = options.get("placement", "auto") == "auto"
    if not (workers_auto or placement_auto):
        return options
    entry = cached_tune(source, options.get("transform"), batch_size)
    if entry is None:
        return options
    tuned, applied = entry["loader"], {}
    named = options.get("backend", "auto")
    device = options.get("device")
    target = torch.device(device if device is not None else "cuda" if torch.cuda.is_available() else "cpu").type
    measured = entry["tune"].get("device", target) if isinstance(entry.get("tune"), dict) else target
    other = f"backend {tuned['backend']!r}, not {named!r}" if named != "auto" and tuned.get("backend", named) != named \
        else f"a {str(measured)[:20]!r} target, not {target!r}" if str(measured).split(":")[0] != target else None
    if other:  # measured otherwise: none of it applies
        logger.info("the tuned config in %s is for %s: not applied", entry["path"], other)
        return options
    if named == "auto" and "backend" in tuned:
        applied["backend"] = options["backend"] = tuned["backend"]
    if workers_auto and "num_workers" in tuned:
        applied["num_workers"] = options["num_workers"] = tuned["num_workers"]
        if tuned["num_workers"] and "prefetch_factor" in tuned and "prefetch_factor" not in options:
            applied["prefetch_factor"] = options["prefetch_factor"] = tuned["prefetch_factor"]
        if tuned["num_workers"] and "persistent_workers" not in options:
            applied["persistent_workers"] = options["persistent_workers"] = True
    if placement_auto and "placement" in tuned:
        applied["placement"] = options["placement"] = tuned["placement"]
    if applied:
        logger.info("applied the tuned config in %s (tuned %s, expires %s): %s", entry["path"], entry["created"],
                    entry["expires"], ", ".join(f"{k}={v!r}" for k, v in applied.items()))
    return options


def _image_loader(source: Any, batch_size: Any, options: dict[str, Any]) -> Loader:
    instead = {"generator": "; seed= takes its place (the order is a function of seed and the epoch)"}
    for name in options:
        if name not in _IMAGE_KEYWORDS:
            raise TypeError(f"loader() got an unexpected keyword argument {name!r} for an image source"
                            f"{instead.get(name, '')}")
    options = _with_config(dict(options))
    _check_as_dataloader(options)
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


def _check_as_dataloader(options: dict[str, Any]) -> None:
    """DataLoader's refusals of the keywords image mode shares with it, in its words."""
    timeout = options.get("timeout", 0)
    if isinstance(timeout, (int, float)) and timeout < 0:
        raise ValueError("timeout option should be non-negative")
    # ray reads num_workers=0 as an actor per CPU of the cluster, which persist
    if options.get("persistent_workers") and options.get("num_workers", 0) == 0 and options.get("backend") != "ray":
        raise ValueError("persistent_workers option needs num_workers > 0")


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


def loader(source: Any = _NO_SOURCE, batch_size: int | None = 1, *args: Any, **options: Any) -> Loader:
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

    DataLoader's positional arguments after `batch_size` (`shuffle`, `sampler`, ...) and its
    `dataset=` keyword are taken as DataLoader takes them.
    """
    source = _as_dataloader_call(source, args, options)
    _check_device(options.get("device"))
    if sources.is_image_source(source):
        return _image_loader(source, batch_size, options)
    for name in options:
        if name not in _DROPIN_KEYWORDS:
            image = f" (an image source's keyword, but {type(source).__name__} {source!r:.60} is not an image source: " \
                "a folder, (path, label) pairs or shards)" if name in _IMAGE_KEYWORDS else ""
            raise TypeError(f"loader() got an unexpected keyword argument {name!r}{image}")
    return TorchLoader(source, batch_size=batch_size, **options)


def _as_dataloader_call(source: Any, args: tuple, options: dict[str, Any]) -> Any:
    """The source, and `options` given DataLoader's positional arguments by name: a call
    written for DataLoader (`DataLoader(ds, 64, True)`, `DataLoader(dataset=ds)`) means the
    same here, and fails as it would there."""
    if "dataset" in options:
        if source is not _NO_SOURCE:
            raise TypeError("loader() got multiple values for argument 'dataset' (the source)")
        source = options.pop("dataset")
    if source is _NO_SOURCE:
        raise TypeError("loader() missing 1 required positional argument: 'source'")
    if len(args) > len(_POSITIONAL):
        raise TypeError(f"loader() takes from 1 to {len(_POSITIONAL) + 2} positional arguments but "
                        f"{len(args) + 2} were given")
    for name, value in zip(_POSITIONAL, args):
        if name in options:
            raise TypeError(f"loader() got multiple values for argument {name!r}")
        options[name] = value
    return source


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
