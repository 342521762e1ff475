"""`fastdata run`: a script's dataset that wraps another to give its images a transform.

A script that splits one ImageFolder with `random_split` and gives each part a transform of its
own (augmentation to train on, none to validate on) writes a small Dataset class for it, the same
few lines in each script (the common answer to "different transforms for random_split's parts"):

    def __getitem__(self, index):
        x, y = self.subset[index]
        if self.transform:
            x = self.transform(x)
        return x, y

Such a wrapper is read as the dataset it wraps, each image through the wrapper's transform, each
target as that dataset gives it (`wrapped`). It is read by its code, not its name, as `_views`
reads a multi-view wrapper: its `__getitem__` must be one of `_SHAPES` instruction for instruction
in the running interpreter's bytecode (the names of its attributes and locals may differ), its
class may have no `__getitems__`, `__getattr__` or `__getattribute__` of its own, and the two
attributes must lie in the instance plainly (no property of those names). Any other code is a
dataset fastdata cannot see into, served by the plain drop-in.
"""

from __future__ import annotations

import types
from typing import Any

from ._views import same_shape


class _IfTransform:
    def __getitem__(self, index):
        x, y = self.subset[index]
        if self.transform:
            x = self.transform(x)
        return x, y


class _IfNotNone:
    def __getitem__(self, index):
        x, y = self.subset[index]
        if self.transform is not None:
            x = self.transform(x)
        return x, y


class _Always:
    def __getitem__(self, index):
        x, y = self.subset[index]
        x = self.transform(x)
        return x, y


class _Inline:
    def __getitem__(self, index):
        x, y = self.subset[index]
        return self.transform(x), y


_SHAPES = (_IfTransform, _IfNotNone, _Always, _Inline)


def wrapped(dataset: Any) -> tuple[Any, Any] | None:
    """(the dataset it wraps, the transform it gives each image) for a wrapper of `_SHAPES`
    whose transform is not None; None for any other dataset."""
    cls = type(dataset)
    get = getattr(cls, "__getitem__", None)
    if type(get) is not types.FunctionType or get.__defaults__ or get.__kwdefaults__ or get.__closure__:
        return None
    if cls.__getattribute__ is not object.__getattribute__ or hasattr(cls, "__getattr__") or \
            hasattr(cls, "__getitems__"):
        return None
    own = getattr(dataset, "__dict__", None)
    if type(own) is not dict:
        return None
    for shape in _SHAPES:
        names: dict[str, str] = {}
        if not same_shape(get.__code__, shape.__getitem__.__code__, names):
            continue
        inner, transform = names["subset"], names["transform"]
        if inner == transform or any(name not in own or any(name in vars(c) for c in cls.__mro__)
                                     for name in (inner, transform)):
            return None
        transform = own[transform]
        # (`if self.transform:` asks the transform's truth: only where that cannot run its code)
        if transform is None or shape is _IfTransform and any(hasattr(type(transform), m) for m in ("__bool__",
                                                                                                    "__len__")):
            return None
        return own[inner], transform
    return None
