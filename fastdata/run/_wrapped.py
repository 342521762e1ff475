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

from typing import Any

from ._views import read_shape


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
    if hasattr(type(dataset), "__getitems__"):
        return None
    read = read_shape(dataset, "__getitem__", _SHAPES)
    if read is None:
        return None
    shape, got, _ = read
    transform = got["transform"]
    # (`if self.transform:` asks the transform's truth: only where that cannot run its code)
    if transform is None or shape is _IfTransform and any(hasattr(type(transform), m) for m in ("__bool__",
                                                                                                "__len__")):
        return None
    return got["subset"], transform
