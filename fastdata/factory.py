"""`fastdata.loader`: validates the call, picks the mode and backend, returns the Loader."""

from __future__ import annotations

import os
from typing import Any

from .backends.base import Loader
from .backends.torch import DATALOADER_KEYWORDS, TorchLoader

_DROPIN_KEYWORDS = frozenset(DATALOADER_KEYWORDS) | {"device"}


def _is_image_source(source: Any) -> bool:
    if isinstance(source, (str, os.PathLike)):
        return True
    if isinstance(source, (list, tuple)) and source:
        first = source[0]
        if isinstance(first, (str, os.PathLike)):
            return True
        if isinstance(first, (list, tuple)) and len(first) == 2 and isinstance(first[0], (str, os.PathLike)):
            return True
    return False


def loader(source: Any, batch_size: int | None = 1, **options: Any) -> Loader:
    """Returns a Loader over `source`.

    Given a `torch.utils.data.Dataset` (map-style or iterable; any object DataLoader accepts),
    it is a drop-in for `torch.utils.data.DataLoader`: the same keywords, defaults and batches,
    collated natively, plus `num_workers="auto"` and `device=` (batches copied to that device
    on a side stream, one batch ahead).
    """
    if _is_image_source(source):
        raise NotImplementedError(
            "image mode (a folder, a file list or WebDataset shards) is not built yet; "
            "wrap your images in a torch Dataset to use the drop-in mode meanwhile"
        )
    for name in options:
        if name not in _DROPIN_KEYWORDS:
            raise TypeError(f"loader() got an unexpected keyword argument {name!r}")
    return TorchLoader(source, batch_size=batch_size, **options)
