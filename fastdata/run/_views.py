"""`fastdata run`: the multi-view wrappers of self-supervised scripts, read as the transforms they call.

A contrastive script's dataset gives each image as several views, each the image through its own
random draw of an augmentation: MoCo's `TwoCropsTransform` (one transform twice; in MoCo v3 two
transforms), SimCLR's `ContrastiveLearningViewGenerator` and the Lightning tutorial's
`ContrastiveTransformations` (one transform n times). Their `__call__` is a few lines, written
again in each script, so a wrapper is read by what its code does, not by its name: it is read as
its views only where its `__call__` is one of `_SHAPES`' instruction for instruction, in the
running interpreter's bytecode (the names of its attributes and locals may differ: they are read
from its own code), so that it is known to call those transforms on the image, in order, and
return the list of what they give. Its attributes must lie in the instance plainly (the class
has no `__getattribute__` or descriptor of those names), `range` must be the builtin, and a view
count an int from 1 to `MAX_VIEWS`. Any other code is a transform fastdata cannot see into.

A `Lambda` of torchvision's is read so too (`converts_to_rgb`): one that converts its image to RGB,
as scripts put first for files that may be grey, is the identity on the RGB images a folder gives.
"""

from __future__ import annotations

import builtins
import inspect
import sys
import types
from typing import Any

MAX_VIEWS = 64  # each view decodes its batch's files again


class _Twice:  # MoCo v1 and v2's TwoCropsTransform
    def __call__(self, x):
        q = self.t(x)
        k = self.t(x)
        return [q, k]


class _Pair:  # MoCo v3's TwoCropsTransform
    def __call__(self, x):
        im1 = self.t1(x)
        im2 = self.t2(x)
        return [im1, im2]


class _Repeated:  # SimCLR's ContrastiveLearningViewGenerator, the Lightning tutorial's ContrastiveTransformations
    def __call__(self, x):
        return [self.t(x) for i in range(self.n)]


class _MultiCrop:  # DINO's DataAugmentationDINO: two global crops, then n local ones
    def __call__(self, image):
        crops = []
        crops.append(self.g1(image))
        crops.append(self.g2(image))
        for _ in range(self.n):
            crops.append(self.t(image))
        return crops


def _rgb(img):  # a Lambda's function that converts its image to RGB, as a def or a lambda, testing its mode or not
    return img.convert("RGB")


def _rgb_unless(img):
    return img.convert("RGB") if img.mode != "RGB" else img


_SHAPES = (_Twice, _Pair, _Repeated, _MultiCrop)
_RGB = (_rgb, _rgb_unless, lambda img: img.convert("RGB"), lambda img: img.convert("RGB") if img.mode != "RGB" else img)
_SHAPE_FIELDS = ("co_code", "co_argcount", "co_posonlyargcount", "co_kwonlyargcount", "co_nlocals", "co_exceptiontable")
_BUILTIN = ("range", "append")  # `range` read as a global (the builtin), `append` the method of the list it made
# The code's own flags (above them: the __future__ imports of its module), but CO_NESTED, which
# only says it was defined in a function (a class a script's main() defines; free variables are
# compared apart)
_FLAGS = 0xFFFF & ~inspect.CO_NESTED


def converts_to_rgb(op: Any) -> bool:
    """Whether `op` is torchvision's `Lambda` (v1's, or v2's of every type) of a plain function of
    one of `_RGB`'s shapes, its names those: `img.convert("RGB")`, testing `img.mode` or not."""
    v1, v2 = (getattr(sys.modules.get(f"torchvision.transforms{m}"), "Lambda", None) for m in ("", ".v2"))
    f = getattr(op, "__dict__", {}).get("lambd")
    if type(op) not in (v1, v2) or (type(op) is v2 and op.types != (object,)) or \
            type(f) is not types.FunctionType or f.__defaults__ or f.__kwdefaults__ or f.__closure__:
        return False
    return any(same_shape(f.__code__, ref.__code__, names) and all(k == v for k, v in names.items())
               for ref in _RGB for names in [{}])


def same_shape(code: types.CodeType, ref: types.CodeType, names: dict) -> bool:
    """Whether `code` has `ref`'s shape (the same instructions, arguments and constants, its
    nested code alike), adding to `names` each of `ref`'s global and attribute names with the
    one `code` has in its place, and each of its str constants that begin with "\\0" (a name the
    script chooses, a column's) with the str `code` has there."""
    if any(getattr(code, f, None) != getattr(ref, f, None) for f in _SHAPE_FIELDS) or \
            code.co_flags & _FLAGS != ref.co_flags & _FLAGS:
        return False
    if (len(code.co_names), len(code.co_cellvars), len(code.co_freevars), len(code.co_consts)) != \
            (len(ref.co_names), len(ref.co_cellvars), len(ref.co_freevars), len(ref.co_consts)):
        return False
    for mine, theirs in zip(code.co_consts, ref.co_consts):
        if isinstance(theirs, types.CodeType):
            if not (isinstance(mine, types.CodeType) and same_shape(mine, theirs, names)):
                return False
        elif isinstance(theirs, str) and theirs.startswith("\0"):
            if type(mine) is not str or names.setdefault(theirs, mine) != mine:
                return False
        elif type(mine) is not type(theirs) or mine != theirs:
            return False
    for mine, theirs in zip(code.co_names, ref.co_names):
        if names.setdefault(theirs, mine) != mine:
            return False
    return True


def read_shape(obj: Any, method: str, shapes: tuple, builtin: tuple = (), code: types.CodeType | None = None,
               extra: dict | None = None) -> tuple[type, dict, Any] | None:
    """(the one of `shapes` whose `method` the class of `obj` has, instruction for instruction,
    the values of its attributes in `obj` keyed by the shape's names for them, and its free
    constants (`same_shape`) keyed by the shape's, the method); None
    where none is, or where the method has defaults or a closure, the class its own attribute
    lookup, or an attribute is not plainly in the instance (a property, a class attribute).
    `builtin`: names the method reads that must be themselves (a builtin, a method of a local);
    `code`: the code to read in place of the method's (one made from it), `extra` the attributes
    that code reads beside the instance's."""
    cls = type(obj)
    func = getattr(cls, method, None)
    if type(func) is not types.FunctionType or func.__defaults__ or func.__kwdefaults__ or func.__closure__:
        return None
    if cls.__getattribute__ is not object.__getattribute__ or hasattr(cls, "__getattr__"):
        return None
    own = getattr(obj, "__dict__", None)
    if type(own) is not dict:
        return None
    own = {**own, **extra} if extra else own
    for shape in shapes:
        names: dict[str, str] = {}
        if not same_shape(code or func.__code__, getattr(shape, method).__code__, names):
            continue
        attrs = {ref: mine for ref, mine in names.items() if ref not in builtin and not ref.startswith("\0")}
        if any(names.get(b, b) != b for b in builtin) or len(set(attrs.values())) != len(attrs):
            continue  # (another shape of the same instructions may read these names)
        if any(mine not in own or any(mine in vars(c) for c in cls.__mro__) for mine in attrs.values()):
            continue
        consts = {ref: mine for ref, mine in names.items() if ref.startswith("\0")}
        return shape, {**{ref: own[mine] for ref, mine in attrs.items()}, **consts}, func
    return None


def views(transform: Any) -> list | None:
    """The transforms a multi-view wrapper calls, one per view in order; None for any other transform."""
    read = read_shape(transform, "__call__", _SHAPES, _BUILTIN)
    if read is None:
        return None
    shape, got, call = read
    if shape is _Repeated and call.__globals__.get("range", builtins.range) is not builtins.range:
        return None
    if shape is _Twice:
        return [got["t"], got["t"]]
    if shape is _Pair:
        return [got["t1"], got["t2"]]
    n, first = got["n"], [got["g1"], got["g2"]] if shape is _MultiCrop else []
    if type(n) is not int or n < 0 or not 1 <= len(first) + n <= MAX_VIEWS:
        return None
    return first + [got["t"]] * n
