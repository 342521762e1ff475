"""`fastdata run`'s MixUp and CutMix: the collate_fn that torchvision's docs and references
write, `mixing(*default_collate(batch))` with `mixing` a transforms.v2 MixUp, CutMix or
RandomChoice of them, on a natively served batch.

`mixing_of` recognizes that function by its code: its bytecode is that of the same expression
compiled here (`_SHAPES`: a def or a lambda, `mixing` a global or a closure's variable, torch's
`default_collate` a global or `torch.utils.data.default_collate`), so it computes nothing else.
`mixing` is read when the loader is built and again at each batch, as the function reads it.
Any other collate_fn of the script's gets torchvision's samples.

The batch is then collated natively and mixed in two halves (`MixCollate`). Where the script's
collate_fn runs (a worker, or the training process without workers), its draws come from
that process's torch RNG in torchvision's calls and order: RandomChoice's
`torch.multinomial(p, 1)`, then the chosen op's own `make_params`. The labels are mixed there
by the op's own `_mixup_label`. The images, as uint8, go to the training process, which lays
them out and mixes them (`_layout.lay_out`): MixUp's blend natively, each value as torch's
roll, mul_ and add_ round it (`mix_rolled`), CutMix's box copied from the previous sample.
Mixing in the workers would send each batch as float32: four times the bytes, written
twice more.
"""

from __future__ import annotations

import functools
import inspect
import types
from dataclasses import replace
from typing import Any

import torch

from .._collate import Prepared, RingCollate
from ._folders import target_transformed
from ._layout import FolderBatch, Layout, lay_out
from ._lowering import Lowering, steps_dtype
from ._timm_collate import timm_collate_of

# The function's shapes that are `mixing(*default_collate(batch))`, compiled by this Python:
# default_collate by its name or as torch.utils.data's, `mixing` a global or a closure's variable
_CALLS = ("default_collate", "torch.utils.data.default_collate")
_SHAPES = """
def by_name(batch):
    return mixing(*{call}(batch))
by_name_lambda = lambda batch: mixing(*{call}(batch))
def enclosing():
    mixing = None
    def by_cell(batch):
        return mixing(*{call}(batch))
    return by_cell, lambda batch: mixing(*{call}(batch))
"""
# flags that make the same bytecode mean another call (extra arguments, a generator, a coroutine)
_OTHER_CALLS = (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS | inspect.CO_GENERATOR | inspect.CO_COROUTINE
                | inspect.CO_ITERABLE_COROUTINE | inspect.CO_ASYNC_GENERATOR)


@functools.lru_cache(maxsize=1)
def _shapes() -> tuple[tuple[types.CodeType, bool], ...]:
    """(code, whether `mixing` is a closure's variable) of each shape."""
    shapes = []
    for call in _CALLS:
        ns: dict = {}
        exec(compile(_SHAPES.format(call=call), "<fastdata: a mixing collate_fn>", "exec"), ns)
        by_cell, by_cell_lambda = ns["enclosing"]()
        shapes += [(ns["by_name"].__code__, False), (ns["by_name_lambda"].__code__, False),
                   (by_cell.__code__, True), (by_cell_lambda.__code__, True)]
    return tuple(shapes)


def _global(fn: types.FunctionType, name: str) -> Any:
    if name in fn.__globals__:
        return fn.__globals__[name]
    return vars(fn.__builtins__)[name] if isinstance(fn.__builtins__, types.ModuleType) else fn.__builtins__[name]


def _applied(fn: Any) -> Any:
    """`mixing` where `fn` is `mixing(*default_collate(batch))` with torch's default_collate, else None."""
    if type(fn) is not types.FunctionType:
        return None
    code = fn.__code__
    if code.co_argcount != 1 or code.co_kwonlyargcount or code.co_flags & _OTHER_CALLS:
        return None
    for shape, by_cell in _shapes():
        if code.co_code != shape.co_code or len(code.co_freevars) != len(shape.co_freevars) \
                or len(code.co_names) != len(shape.co_names):
            continue
        try:
            if by_cell:
                mixing, path = fn.__closure__[0].cell_contents, code.co_names
            else:
                mixing, path = _global(fn, code.co_names[0]), code.co_names[1:]
            collate = _global(fn, path[0])
            for name in path[1:]:  # (the attributes the function reads, as it reads them)
                collate = getattr(collate, name)
        except (KeyError, ValueError, TypeError, IndexError, AttributeError):  # (a name not bound, an empty cell)
            return None
        return mixing if collate is torch.utils.data.default_collate else None
    return None


def _mixes(mixing: Any) -> bool:
    """Whether `mixing` is v2's MixUp or CutMix (exactly those classes), or a RandomChoice of them,
    each with index labels' `num_classes` and the default labels_getter."""
    try:
        from torchvision.transforms import v2
    except Exception:  # (no torchvision, or one that does not import)
        return False
    ops = list(mixing.transforms) if type(mixing) is v2.RandomChoice else [mixing]
    return bool(ops) and all(
        type(op) in (v2.MixUp, v2.CutMix) and type(op.num_classes) is int and op.num_classes > 0
        and getattr(op, "_labels_getter", None) is _default_labels() and hasattr(op, "_mixup_label")
        and (hasattr(op, "make_params") or hasattr(op, "_get_params")) for op in ops)


@functools.lru_cache(maxsize=1)
def _default_labels() -> Any:
    """The labels_getter v2's MixUp and CutMix hold for labels_getter="default"."""
    from torchvision.transforms import v2

    return v2.MixUp(num_classes=1)._labels_getter


def mixing_of(collate_fn: Any, lowering: Lowering | None, dataset: Any) -> Any:
    """The script's MixUp, CutMix or RandomChoice of them where `collate_fn` applies it to
    default_collate's batch (see the module) and a natively served batch of `lowering` can be
    mixed as it: one view, a floating-point image, the dataset's own targets (no
    target_transform); or timm's fast_collate or FastCollateMixup where `_timm_collate` serves
    it; else None."""
    timms = timm_collate_of(collate_fn, lowering, dataset)
    if timms is not None:
        return timms
    if lowering is None or lowering.views or not steps_dtype(lowering.steps).is_floating_point:
        return None
    if target_transformed(dataset):
        return None
    mixing = _applied(collate_fn)
    return mixing if mixing is not None and _mixes(mixing) else None


def draw(mixing: Any, shape: tuple) -> tuple[Any, dict]:
    """(the op RandomChoice picks, its parameters) for a batch of images of `shape` (N, C, H, W),
    from this process's torch RNG in torchvision's calls: the op's own `make_params` of
    the batch's images (a stand-in of their shape: the parameters read the size alone)."""
    from torchvision.transforms import v2

    op = mixing
    if type(op) is v2.RandomChoice:
        op = op.transforms[int(torch.multinomial(torch.tensor(op.p), 1))]
    params = getattr(op, "make_params", None) or op._get_params
    return op, params([torch.empty(()).expand(shape)])


class MixCollate(RingCollate):
    """The working loader's collate_fn for a script's collate_fn that mixes (`mixing_of`): a
    natively decoded batch collated natively, with its mixing drawn and its labels mixed here
    (`Layout.mixed` carries what the training process does to the images); the dataset's own
    samples (a fetch fastdata fell back on) go to the script's function."""

    def __init__(self, slots: int, pin: bool, fn: Any, mixing: Any) -> None:
        RingCollate.__init__(self, slots, pin)
        self.fn, self.mixing = fn, mixing
        self._tables: dict = {}

    def _collate(self, batch: Any) -> Any:
        if type(batch) is not FolderBatch:
            return RingCollate._collate(self, batch) if isinstance(batch, Prepared) else self.fn(batch)
        # the op the function reads now, as it reads it at each call (a script may bind another between passes)
        mixing = _applied(self.fn)
        mixing = self.mixing if mixing is None else mixing
        n, h, w, c = batch.images.shape
        labels = torch.utils.data.default_collate(batch.targets)  # (default_collate's batch of them, as torch's)
        if not (all(type(t) is int for t in batch.targets) and (mixing is self.mixing or _mixes(mixing))):
            # the op itself on the laid-out batch: labels of the dataset's other than class
            # indices, or an op bound since that fastdata does not run
            images = torch.empty((n, c, h, w), dtype=steps_dtype(batch.steps))
            lay_out(batch.images, Layout(batch.steps, batch.erased, batch.seed), images, self._tables)
            self.rings.ring().drop([batch.handle])  # (a slot it was decoded into, `NativeFolder._images`: free again)
            return mixing(images, labels)
        ring = self.rings.ring()
        try:
            handle, layout = batch.crossed(ring)
        finally:
            ring.end()
        op, params = draw(mixing, (n, c, h, w))
        if "box" in params:  # CutMix
            return [handle, op._mixup_label(labels, lam=params["lam_adjusted"]),
                    replace(layout, mixed=("cutmix", tuple(params["box"])), tupled=True)]
        return [handle, op._mixup_label(labels, lam=params["lam"]),
                replace(layout, mixed=("mixup", params["lam"]), tupled=True)]
