"""`fastdata run`: which image folders are served natively (`lower`).

A `torchvision.datasets.ImageFolder` (or `DatasetFolder`) with torchvision's own image loader, or
timm's `ImageDataset` on its folder reader (`_timm.image_dataset`), or torch's `Subset` of either
(what `random_split` gives: `folder`): a list of (path, class) pairs (`listed`), each file opened
by Pillow and converted to RGB, then the transform, which `_lowering` lowers. Any other dataset is
not an image folder here; one of those that reads its files otherwise gives the reason, and the
loader falls back to the plain drop-in.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from ._lowering import Lowering, Unlowerable, lower_transform, lower_views
from ._pixels import named
from ._timm import image_dataset


def folder(dataset: Any) -> Any:
    """The dataset under any torch `Subset`s of it (of that exact class: a subclass's own
    methods may do anything), whose samples they pick by index."""
    while type(dataset) is torch.utils.data.Subset:
        dataset = dataset.dataset
    return dataset


def listed(dataset: Any) -> Any:
    """An image folder's list of (path, class) pairs: a torchvision folder's `samples`, timm's
    ImageDataset's reader's (None where there is none)."""
    holder = dataset.reader if image_dataset(dataset) is not None else dataset
    return getattr(holder, "samples", None)


def lower(dataset: Any) -> tuple[Lowering | None, str]:
    """(the lowering, "") when `dataset` (or the `folder` under its Subsets) is served natively;
    (None, why not) otherwise, and (None, "") for a dataset that is not an image folder at all."""
    tv = sys.modules.get("torchvision")  # a script that made a torchvision (or timm) dataset imported it
    if tv is None:
        return None, ""
    dataset = folder(dataset)
    why = image_dataset(dataset)
    if why is None:
        why = _torchvisions(dataset, tv)
        if why is None:
            return None, ""
    if why:
        return None, why
    image_file = sys.modules.get("PIL.ImageFile")  # imported by the loader's module
    if image_file is not None and getattr(image_file, "LOAD_TRUNCATED_IMAGES", False):
        return None, ("PIL.ImageFile.LOAD_TRUNCATED_IMAGES is set: Pillow loads a truncated file, which fastdata's "
                      "decoder refuses")
    try:
        return lower_views(dataset.transform, lower_transform), ""
    except Unlowerable as e:
        return None, str(e)


def _torchvisions(dataset: Any, tv: Any) -> str | None:
    """For a torchvision folder: "" where it reads its files with torchvision's own loader, else
    why not; None for any other dataset."""
    from torchvision.datasets import DatasetFolder
    from torchvision.datasets import folder as tv_folder

    def own(f: Any, name: str) -> bool:
        # torchvision's own function, not one a script put in its place: its code is in
        # torchvision's file (a functools.wraps wrapper takes its names, not its code)
        code = getattr(f, "__code__", None)
        return code is not None and code.co_name == name and code.co_filename == tv_folder.__file__ and \
            not hasattr(f, "__wrapped__")

    if not isinstance(dataset, DatasetFolder):
        return None
    name = type(dataset).__name__
    if type(dataset).__getitem__ is not DatasetFolder.__getitem__:
        return f"{name} overrides __getitem__"
    loader = getattr(dataset, "loader", None)
    if not (own(loader, "pil_loader") or (own(loader, "default_loader") and tv.get_image_backend() == "PIL")):
        return f"{name} has its own image loader ({named(loader)})"
    # default_loader calls the module's pil_loader by name: a script may have put its own there
    # (a grey or an EXIF-transposing loader), which only torchvision's own call follows
    if not own(loader, "pil_loader") and not own(tv_folder.pil_loader, "pil_loader"):
        return (f"torchvision.datasets.folder.pil_loader, which {name}'s default_loader calls, is the "
                f"script's own ({named(tv_folder.pil_loader)})")
    return ""
