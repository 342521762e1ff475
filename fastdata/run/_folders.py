"""`fastdata run`: which image folders are served natively (`lower`).

A `torchvision.datasets.ImageFolder` (or `DatasetFolder`) with torchvision's own image loader, or
timm's `ImageDataset` on its folder reader (`_timm.image_dataset`), or torch's `Subset` of either
(what `random_split` gives: `folder`), or a `ConcatDataset` joining such folders (what `a + b`
gives: `leaves`), or a script's wrapper giving one's images its transform (`_wrapped`: a
random_split's part with a transform of its own), or a script's own Dataset that opens each file by
its path (`_filelist`), each with a transform that lowers the same: a list of (path, class) pairs
(`listed`; a script's file list, its own expressions: `samples_of`), each file opened by Pillow and
converted to RGB (a file list's as its code opens it: `must_open`; whether a batch's files open so:
`first_not_rgb`), then the transform, which `_lowering` lowers. Any other dataset is not an image
folder here; one of those that reads its files otherwise gives the reason, and the loader falls
back to the plain drop-in.
"""

from __future__ import annotations

import bisect
import inspect
import io
import sys
from functools import partial
from typing import Any

import torch

from ._filelist import file_list, loader_refused
from ._lowering import Lowering, Unlowerable, flatten, lower_transform, lower_views
from ._timm import image_dataset
from ._views import converts_to_rgb
from ._wrapped import wrapped

# How a dataset's `__getitem__` may open its images by path (the names its code reads), for `_unread`
_READERS = (("Image.open", {"Image", "open"}), ("read_image", {"read_image"}), ("decode_image", {"decode_image"}),
            ("imread", {"imread"}))


def folder(dataset: Any) -> Any:
    """The dataset under any torch `Subset`s of it (of that exact class: a subclass's own
    methods may do anything), whose samples they pick by index."""
    while type(dataset) is torch.utils.data.Subset:
        dataset = dataset.dataset
    return dataset


def leaves(dataset: Any) -> list:
    """The datasets that torch's `Subset`s and `ConcatDataset`s (of those exact classes) of
    `dataset`, and a script's wrapper (`wrapped`), pick their samples from, each once, in order:
    `[folder(dataset)]` but for a join or a wrapper."""
    found = {id(ds): ds for ds, _ in sources(dataset)}
    return list(found.values())


def sources(dataset: Any) -> list[tuple[Any, Any]]:
    """(a dataset of `leaves`, the script's wrapper that gives its images a transform, or None)
    for each way down to one, each once, in order. A wrapper under a wrapper is a dataset of its own."""
    found, seen, joins, joined = [], set(), [(dataset, None)], set()
    while joins:
        ds, wrapper = joins.pop()
        ds = folder(ds)
        inner = wrapped(ds) if wrapper is None else None
        if type(ds) is torch.utils.data.ConcatDataset:
            if (id(ds), id(wrapper)) not in joined:  # (a join that holds itself: each once)
                joined.add((id(ds), id(wrapper)))
                joins += [(d, wrapper) for d in reversed(ds.datasets)]
        elif inner is not None:
            joins.append((inner[0], ds))
        elif (id(ds), id(wrapper)) not in seen:  # (each held by the dataset while this runs: ids are not reused)
            seen.add((id(ds), id(wrapper)))
            found.append((ds, wrapper))
    return found


def locate(dataset: Any, indices: list) -> list[tuple[Any, int]]:
    """(the dataset of `leaves`, the index there) of each of `indices` into `dataset`, read as
    torch's Subset and ConcatDataset and the script's wrapper read them; an index they would
    refuse raises IndexError."""
    located, inner = [], {}
    for i in indices:
        ds, wrapper = dataset, None
        while True:
            key = (id(ds), wrapper is None)
            if key not in inner:
                inner[key] = wrapped(ds) if wrapper is None else None
            if inner[key] is not None:  # (its __getitem__ passes the index on as it is)
                ds, wrapper = inner[key][0], ds
            elif type(ds) is torch.utils.data.Subset:
                ds, i = ds.dataset, ds.indices[i]
            elif type(ds) is torch.utils.data.ConcatDataset:
                n = len(ds)
                if not -n <= i < n:
                    raise IndexError(i)
                i = i + n if i < 0 else i
                k = bisect.bisect_right(ds.cumulative_sizes, i)
                ds, i = ds.datasets[k], i - (ds.cumulative_sizes[k - 1] if k else 0)
            else:
                break
        located.append((ds, i))
    return located


def target_transformed(dataset: Any) -> bool:
    """Whether a dataset of `leaves(dataset)` has a target_transform (the script's code)."""
    return any(target_transform_of(ds) is not None for ds in leaves(dataset))


def target_transform_of(dataset: Any) -> Any:
    """The target_transform an image folder gives its labels (a script's file list: the one its code calls, or none)."""
    files = file_list(dataset)
    return getattr(dataset, "target_transform", None) if files is None else files.target_transform


def must_open(dataset: Any) -> str | None:
    """How each file of an image folder must open for fastdata, which decodes it as RGB, to give
    its image: None where it converts each to RGB (torchvision's loader does; or its transform's
    first op, a Lambda `_views.converts_to_rgb` reads); "rgb", in mode RGB (a script's file list
    that opens them as they are); "jpeg", as a JPEG of 3 components (one that reads them with
    torchvision.io, as uint8 tensors)."""
    files = file_list(dataset)
    if files is None or (files.must_open == "rgb" and "torchvision.transforms" in sys.modules and
                         converts_to_rgb(next(iter(flatten(files.transform)), None))):
        return None
    return files.must_open


def transform_of(dataset: Any) -> Any:
    """The transform an image folder gives its images (a script's file list: the one its code calls)."""
    files = file_list(dataset)
    return dataset.transform if files is None else files.transform


def listed(dataset: Any) -> Any:
    """An image folder's list of (path, class) pairs: a torchvision folder's `samples`, timm's
    ImageDataset's reader's (None where there is none, and for a script's file list)."""
    if file_list(dataset) is not None:
        return None
    holder = dataset.reader if image_dataset(dataset) is not None else dataset
    return getattr(holder, "samples", None)


def samples_of(dataset: Any, indices: list) -> tuple[list[str], list]:
    """(the paths, the classes) of an image folder's `indices`: from its list (whose errors, an
    index out of range, are the script's), or as a script's file list's code names them."""
    files = file_list(dataset)
    if files is not None:
        return files.samples(indices)
    now = listed(dataset)
    picked = [now[i] for i in indices]
    return [path for path, _ in picked], [target for _, target in picked]


def lower(dataset: Any) -> tuple[Lowering | None, str]:
    """(the lowering, "") when `dataset` (or the `folder` under its Subsets, or each of the
    `leaves` a join of them picks from) is served natively; (None, why not) otherwise, and
    (None, "") for a dataset that is not an image folder at all."""
    if "torchvision" not in sys.modules:  # (a script that made a torchvision (or timm) dataset imported it)
        return None, ""
    reached = sources(dataset)
    found = list({id(ds): ds for ds, _ in reached}.values())
    whys = [image_dataset(ds) for ds in found]
    whys = [_torchvisions(ds) if why is None else why for ds, why in zip(found, whys)]
    whys = [_files(ds) if why is None else why for ds, why in zip(found, whys)]
    if all(why is None for why in whys):
        return None, ""
    if None in whys:
        other = found[whys.index(None)]
        return None, f"{type(folder(dataset)).__name__} joins a {type(other).__name__}, which is not an image folder"
    why = next((why for why in whys if why), "")
    if why:
        return None, why
    image_file = sys.modules.get("PIL.ImageFile")  # imported by the loader's module
    if image_file is not None and getattr(image_file, "LOAD_TRUNCATED_IMAGES", False):
        return None, ("PIL.ImageFile.LOAD_TRUNCATED_IMAGES is set: Pillow loads a truncated file, which fastdata's "
                      "decoder refuses")
    lowerings: list = []
    try:
        seen = set()
        for ds, wrapper in reached:  # (each transform once: the datasets of a join mostly share one)
            transform = transform_of(ds)
            if wrapper is not None:
                if transform is not None:
                    return None, (f"the {type(ds).__name__} under {type(wrapper).__name__} has a transform of its "
                                  "own: fastdata lowers one transform an image")
                transform = wrapped(wrapper)[1]
            read = must_open(ds) == "jpeg"  # (its images uint8 tensors)
            if (id(transform), read) not in seen:
                seen.add((id(transform), read))
                lowerings.append((transform, lower_views(transform, partial(lower_transform, start="uint8") if read
                                                         else lower_transform)))
    except Unlowerable as e:
        return None, str(e)
    if not all(_alike(lowering, lowerings[0][1]) for _, lowering in lowerings):
        return None, (f"{type(folder(dataset)).__name__} joins image folders whose transforms differ: fastdata lowers "
                      "one transform a loader")
    return lowerings[0][1], ""


def _alike(one: Lowering, other: Lowering) -> bool:
    """Whether two lowerings are equal; False where comparing them raises (an op of the script's
    they hold may compare as it likes)."""
    try:
        return bool(one == other)
    except Exception:
        return False


def _files(dataset: Any) -> str | None:
    """For a script's file list: "" where it is served natively, else why not (one it does not
    read as such, that opens its images by path: `_unread`); None for any other dataset."""
    files = file_list(dataset)
    return (_unread(dataset) or None) if files is None else files.why


def _unread(dataset: Any) -> str:
    """Why a dataset that `file_list` does not read is served by the drop-in, where its
    `__getitem__` opens images by path (Pillow's, torchvision.io's, OpenCV's or scikit-image's
    calls, in it or in a method or function it calls), so that the summary tells the script's
    author; "" for any other dataset."""
    getitem = getattr(type(dataset), "__getitem__", None)
    code, scope = getattr(getitem, "__code__", None), getattr(getitem, "__globals__", {})
    names = set(code.co_names) if code is not None else set()
    for name in list(names):  # (a method of the class's or a function it calls: `img = self.load_image(index)`)
        for f in (inspect.getattr_static(type(dataset), name, None), scope.get(name)):
            names.update(getattr(getattr(f, "__code__", None), "co_names", ()))
    calls = [call for call, needs in _READERS if needs <= names]
    return (f"{type(dataset).__name__}'s __getitem__ opens its images ({', '.join(calls)}), but not as a file list "
            "fastdata reads (docs/guide.md lists them)") if calls else ""


def _torchvisions(dataset: Any) -> str | None:
    """For a torchvision folder: "" where it reads its files with torchvision's own loader, else
    why not; None for any other dataset."""
    from torchvision.datasets import DatasetFolder

    if not isinstance(dataset, DatasetFolder):
        return None
    name = type(dataset).__name__
    if type(dataset).__getitem__ is not DatasetFolder.__getitem__:
        return f"{name} overrides __getitem__"
    return loader_refused(getattr(dataset, "loader", None), name)


def first_not_rgb(datas: list, jpeg: bool = False) -> int | None:
    """The first of `datas` (files' bytes) that Pillow opens in a mode other than RGB (a grey or
    CMYK JPEG, a PNG with alpha or a palette) or cannot open (with `jpeg`, also any file but a JPEG:
    torchvision.io reads other formats in ways of its own, a 16-bit PNG as uint16); None where each
    opens as RGB. A JPEG opens as RGB where it has 3 components (Pillow's JPEG plugin;
    torchvision.io reads it as 3 channels), read from its header natively where the extension is
    built."""
    from .._codec import AVAILABLE, jpeg_info_batch

    infos = jpeg_info_batch(datas) if AVAILABLE else [None] * len(datas)
    for k, (data, info) in enumerate(zip(datas, infos)):
        if info is not None:
            if info[2] != 3:
                return k
            continue
        try:
            from PIL import Image

            with Image.open(io.BytesIO(data)) as image:  # (the header only)
                if image.mode != "RGB" or (jpeg and (AVAILABLE or image.format != "JPEG")):
                    return k
        except Exception:  # (Pillow cannot open it: the script's own fetch raises its error)
            return k
    return None
