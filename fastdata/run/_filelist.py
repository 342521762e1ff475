"""`fastdata run`: a script's own Dataset that opens each image by its path (Pillow, torchvision.io).

Scripts whose images are listed in a CSV file, or gathered with glob, write a small Dataset
class for them, the same few lines in each:

    def __getitem__(self, idx):
        image = Image.open(self.paths[idx]).convert("RGB")
        label = self.labels[idx]
        if self.transform:
            image = self.transform(image)
        return image, label

Such a dataset is read as an image folder (`file_list`): each sample the file at the path its code
names, opened by Pillow and converted to RGB (as torchvision's folders open theirs; in one
statement or two, within `with open(path, "rb")` or not; or by torchvision's own loader, as
torchvision's Food101, DTD, Flowers102 and others open theirs: `loader_refused`; torchvision's
OxfordIIITPet, Places365, Caltech101 and Caltech256, whose `__getitem__`s are no shape, are read
by what each reads: `_pets`, `_joint`, `_caltech`), or opened as it
is (fastdata decodes a batch of those only where each file opens as RGB: `_folders.first_not_rgb`;
else the batch is the script's own fetch; or where its transform converts each to RGB first:
`_folders.must_open`), or read as a uint8 tensor by torchvision.io's
`read_image` (a batch fastdata's only where each file is a JPEG of 3 components; its transform
lowered on the tensor), through its transform, with the label its code names (through a
target_transform where the code applies one after the transform, as the PyTorch tutorial's
CustomImageDataset does), or with a label its code derives from the name or the path
(read as a list's, computed by its own statements). A `__getitem__` that is no shape is read again
from its source (`_itemsource`): a label derived, a method of the class's or a function of the
script's it calls read in its place, torchvision's own loader called by name as `self.loader`, a
return under the transform's condition as one (`_inline`), then read by the same shapes.

It is read by its code, not its name, as `_views` reads a multi-view wrapper: its `__getitem__`
must be one of the shapes `_fileshapes.shapes_of` gives, instruction for instruction in the running
interpreter's bytecode (the names of its attributes and locals free; `Image` Pillow's module (or
`PIL.Image`), `read_image` torchvision.io's, `os`, `torch` and `open` themselves), its class
without `__getitems__`, `__getattr__` or `__getattribute__` of its own, its attributes plainly in
the instance. The lists must be lists, tuples, numpy arrays, tensors or pandas Series (a frame a
DataFrame; a mapping a dict too), whose indexing changes nothing: fastdata then evaluates the same
expressions on them (`FileList.samples`: code written from the same parts as the shape's, without
the open and the transforms) and gets the paths and labels the script's code would. Any other code
is a dataset fastdata cannot see into, served by the plain drop-in.
"""

from __future__ import annotations

import builtins
import os
import pathlib
import sys
import types
from typing import Any

import numpy as np
import torch

from ._fileshapes import COLUMNS, Shape, pick, shapes_of
from ._inline import LOADER
from ._itemsource import LABELS, ItemSource, item_source
from ._pixels import named
from ._views import read_shape

# How each file must open for fastdata, which decodes it as RGB, to give the image (`FileList.must_open`)
_MUST = {"plain": "rgb", "read": "jpeg", "read_rgb": "jpeg"}
# Names the shapes read that must be spelled as written: the modules, and their attributes' names
_FIXED = ("PIL", "Image", "open", "convert", "os", "path", "join", "iloc", "loc", "torch", "tensor", "long", "int64",
          "int", "is_tensor", "tolist", "read_image", "ImageReadMode", "RGB")
_LISTS = (list, tuple, np.ndarray, torch.Tensor)
# OxfordIIITPet's samples by its target types (`_pets`): its images and the list of that target's labels, its
# transform and target_transform called as its StandardTransform calls them
_PETS = {(target,): type("Shape", (Shape,), {"picked": (f"return self._images[i], self.{labels}[i]",),
                                             "labels": labels, "opens": "convert", "guard": "not_none",
                                             "target": "not_none"})
         for target, labels in (("category", "_labels"), ("binary-category", "_bin_labels"))}
# Places365's (`_joint`): its (path, class) pairs `imgs`, each opened by its loader, called as OxfordIIITPet's are
_PLACES = type("Shape", (Shape,), {"picked": ("p, y = self.samples[i]", "return p, y"), "opens": "loader",
                                   "guard": "not_none", "target": "not_none"})
# Caltech101's (its target "category") and Caltech256's (`_caltech`): the file its root, its category's folder and
# its number name (the braces doubled: `pick` formats the statements), opened as it is, its label its `y`
_CALTECH = {name: type("Shape", (Shape,), {
    "picked": (f'return os.path.join(self.root, "{folder}", self.categories[self.y[i]], {file}), self.y[i]',),
    "opens": "plain", "guard": "not_none", "target": "not_none"}) for name, folder, file in (
        ("Caltech101", "101_ObjectCategories", 'f"image_{{self.index[i]:04d}}.jpg"'),
        ("Caltech256", "256_ObjectCategories", 'f"{{self.y[i] + 1:03d}}_{{self.index[i]:04d}}.jpg"'))}


class FileList:
    """A script's file-list dataset as `file_list` reads it: `transform`, the one its
    `__getitem__` gives each image, `target_transform` (None without one) each label;
    `samples(indices)`, their paths and labels (before the target_transform); `must_open`, how
    each file must open for fastdata to give its image: None where the code converts it to RGB;
    "rgb", in mode RGB (opened as it is); "jpeg", as a JPEG of 3 components (read by torchvision.io)."""

    def __init__(self, shape: type, values: dict, why: str, derived: ItemSource | None = None,
                 own: dict | None = None) -> None:
        self.shape, self.values, self.why = shape, values, why
        # (a label derived from the path: `_itemsource`; `own`, the attributes its statements read)
        self.derived, self.own = derived, own
        self.transform, self.target_transform = values["transform"], values.get("target_transform")
        self.must_open = _MUST.get(shape.opens)

    def samples(self, indices: list) -> tuple[list[str], list]:
        """(the paths, the labels) the dataset's code gives `indices`; raises what evaluating
        it raises, or TypeError for a path that is not a str or a pathlib path."""
        # (the attributes where the shape's code reads them: `self.paths` of the namespace)
        view = types.SimpleNamespace(**{k: v for k, v in self.values.items() if not k.startswith("\0")})
        get, columns = pick(self.shape.picked), [self.values.get(v) for v in COLUMNS.values()]
        if self.derived is not None:  # (the labels its own statements derive, where the shape reads its list's)
            if self.derived.source == "path":
                sources = [pick(self.shape.path_only)(view, i, *columns)[0] for i in indices]
            else:
                sources = [self.own[self.derived.attribute][i] for i in indices]
            view.labels = dict(zip(indices, self.derived.labels(sources, self.own)))
        picked = [get(view, i, *columns) for i in indices]
        paths = []
        for path, _ in picked:
            if isinstance(path, pathlib.PurePath):
                path = os.fspath(path)
            if not isinstance(path, str):
                raise TypeError(f"a path of type {type(path).__name__}")
            paths.append(str(path))
        return paths, [label for _, label in picked]


def file_list(dataset: Any) -> FileList | None:
    """The reading of a dataset whose `__getitem__` is one of the shapes; None for any other. Its
    `why` says why it is not served natively ("" where it is)."""
    cls = type(dataset)
    code = getattr(getattr(cls, "__getitem__", None), "__code__", None)
    if code is None or hasattr(cls, "__getitems__"):
        return None
    folder = sys.modules.get("torchvision.datasets.folder")
    if folder is not None and isinstance(dataset, folder.DatasetFolder):
        return None  # (a torchvision folder, whose `samples` the workers read from a listing: `_folders`)
    pets = sys.modules.get("torchvision.datasets.oxford_iiit_pet")
    if pets is not None and isinstance(dataset, pets.OxfordIIITPet):
        return _pets(dataset, pets, code)
    places = sys.modules.get("torchvision.datasets.places365")
    if places is not None and isinstance(dataset, places.Places365):  # (its own __getitem__ opens `self.loader(p)`)
        return _joint(dataset, places, code, _PLACES, {"samples": "imgs", "loader": "loader"})
    caltech = sys.modules.get("torchvision.datasets.caltech")
    if caltech is not None and isinstance(dataset, (caltech.Caltech101, caltech.Caltech256)):
        return _caltech(dataset, caltech, code)
    doc, names, derived = cls.__getitem__.__doc__ is not None, code.co_names, None
    shapes = shapes_of(code, doc)
    scope = getattr(cls.__getitem__, "__globals__", {})
    read = read_shape(dataset, "__getitem__", shapes, _FIXED) if shapes else None
    # (a loader of the script's own is read in its place from the source; where it cannot be, `_refused` names it)
    own_loader = read is not None and read[0].opens == "loader" and _plain(read[1]["loader"], scope)
    if read is None or own_loader:  # (its source read: its helpers in their place, a return folded, a label derived)
        first = read
        held, functions, loaders = _helpers(dataset, code, scope)
        names = tuple(dict.fromkeys([*code.co_names, *(n for h in held + functions for n in h[1].co_names)]))
        derived = item_source(code, tuple(n for n in names if isinstance(scope.get(n), types.ModuleType)), held,
                              functions, loaders)
        shapes = shapes_of(derived.code, doc) if derived is not None else ()
        # (a derived label's list is no attribute of the instance: `FileList.samples` puts the labels there;
        # nor is torchvision's loader called by name)
        labelled = derived is not None and derived.label_of is not None
        extra = {**({LABELS: None} if labelled else {}), **({LOADER: scope[loaders[0]]} if loaders else {})}
        read = read_shape(dataset, "__getitem__", shapes, _FIXED, derived.code, extra) if shapes else None
        if read is None or (labelled and "labels" not in read[1]):  # (a derived label read as a list's)
            if first is None:
                return None
            read, derived, names = first, None, code.co_names
    shape, got, func = read
    if ("os" in names and scope.get("os") is not os) or ("torch" in names and scope.get("torch") is not torch) or \
            ("Path" in names and scope.get("Path") is not pathlib.Path) or \
            any(scope.get(n, func.__builtins__.get(n)) is not getattr(builtins, n)
                for n in ("int", "len", "open", "str") if n in names):  # ("open" where a with statement opens the file)
        return None
    if shape.opens.startswith("read"):
        io_ = sys.modules.get("torchvision.io")
        if io_ is None or any(scope.get(name) is not getattr(io_, name, None) for name in ("read_image",
                                                                                          "ImageReadMode")
                              if name in names):
            return None
    elif shape.opens != "loader":  # (the loader's own checks: `_refused`)
        pil = scope.get("PIL") if shape.opens == "pil" else None
        if not _pillows_image(scope.get("Image") if pil is None else getattr(pil, "Image", None)) or \
                (pil is not None and pil is not sys.modules.get("PIL")):
            return None
    if derived is None or derived.label_of is None:
        return FileList(shape, got, _refused(type(dataset).__name__, shape, got))
    own, name = vars(dataset), type(dataset).__name__
    if (derived.source == "element" and got.get("paths") is not own.get(derived.attribute)) or \
            any(t not in own or any(t in vars(c) for c in cls.__mro__) for t in derived.tables):
        return None  # (the str the label is derived from the list's own; its tables plainly in the instance)
    why = _refused(name, shape, {k: v for k, v in got.items() if k != "labels"}) or derived.refused(name, own)
    return FileList(shape, got, why, derived, {k: own[k] for k in (derived.attribute, *derived.tables) if k})


def _helpers(dataset: Any, code: types.CodeType, scope: dict) -> tuple[tuple, tuple, tuple]:
    """What the dataset's `__getitem__` of `code`, of the module of globals `scope`, may call by
    a name it reads (`_inline`): (name, code, True) of each method of its class's (one the instance
    does not shadow) and (name, code, False) of each function the instance holds; (name, code) of
    each function of the module's; the name of its global that is torchvision's own `pil_loader`
    or `default_loader` (one or none). Each a plain function of that module (`_plain`)."""
    mro, own, names = type(dataset).__mro__, getattr(dataset, "__dict__", {}), dict.fromkeys(code.co_names)
    found = ((n, next((vars(c)[n] for c in mro if n in vars(c)), None)) for n in names if n not in own)
    folder = sys.modules.get("torchvision.datasets.folder")
    loaders = [n for n in names if folder is not None and any(scope.get(n) is f for f in (folder.pil_loader,
                                                                                       folder.default_loader))]
    return (tuple((n, f.__code__, True) for n, f in found if _plain(f, scope)) +
            tuple((n, own[n].__code__, False) for n in names if n in own and _plain(own[n], scope)),
            tuple((n, scope[n].__code__) for n in names if _plain(scope.get(n), scope)),
            tuple(loaders) if len(loaders) == 1 else ())


def _plain(f: Any, scope: dict) -> bool:
    """Whether `f` is a plain function of the module of globals `scope` (no defaults, no closure)."""
    return type(f) is types.FunctionType and f.__globals__ is scope and not f.__defaults__ and \
        not f.__kwdefaults__ and f.__closure__ is None


def _pets(dataset: Any, module: Any, code: Any) -> FileList | None:
    """torchvision's OxfordIIITPet, whose `__getitem__` (its own: no shape, a loop over the target
    types) opens `self._images[i]` with Pillow, converts it to RGB and gives the target of its one
    target type ("category" or "binary-category": a list's), then calls `self.transforms`, the
    StandardTransform of its transform and target_transform, read as a file list; None for its
    other targets (a segmentation) or a `__getitem__` of the script's (its `code`)."""
    shape = _PETS.get(tuple(vars(dataset).get("_target_types", ())))
    if shape is None or not _pillows_image(module.Image):
        return None
    return _joint(dataset, module, code, shape, {"_images": "_images", shape.labels: shape.labels})


def _caltech(dataset: Any, module: Any, code: Any) -> FileList | None:
    """torchvision's Caltech101 (its one target type "category") and Caltech256, whose own
    `__getitem__` opens the file its root, category and number name (`_CALTECH`) with Pillow as it
    is, then calls its transform and target_transform, read as a file list; None for another
    target, a `__getitem__` of the script's, or its numbers and categories not lists."""
    base = module.Caltech101 if isinstance(dataset, module.Caltech101) else module.Caltech256
    own, names = vars(dataset), ("root", "categories", "y", "index", "transform", "target_transform")
    if code is not base.__getitem__.__code__ or not _pillows_image(module.Image) or not set(names) <= own.keys() or \
            any(type(own[k]) is not list for k in names[1:4]) or own.get("target_type", ["category"]) != ["category"]:
        return None
    shape, values = _CALTECH[base.__name__], {k: own[k] for k in names}
    return FileList(shape, values, _refused(type(dataset).__name__, shape, values))


def _joint(dataset: Any, module: Any, code: Any, shape: type, names: dict) -> FileList | None:
    """torchvision's dataset of `module` whose own `__getitem__` (its `code`) reads a sample as
    `shape` does from its attributes (`names`: the shape's name of each) and calls `self.transforms`,
    the StandardTransform of its transform and target_transform, read as a file list; None where
    the `__getitem__` is the script's or an attribute is not in the instance (torchvision's own put
    them there)."""
    own = vars(dataset)
    if not {*names.values(), "transforms"} <= own.keys() or \
            (code.co_filename, code.co_name) != (module.__file__, "__getitem__"):
        return None
    joint, standard = own["transforms"], sys.modules["torchvision.datasets.vision"].StandardTransform
    values = {key: own[name] for key, name in names.items()}
    values.update(transform=getattr(joint, "transform", None),
                  target_transform=getattr(joint, "target_transform", None))
    name = type(dataset).__name__
    why = "" if joint is None or type(joint) is standard else \
        f"{name} is given transforms of the script's ({named(joint)})"
    return FileList(shape, values, why or _refused(name, shape, values))


def loader_refused(loader: Any, name: str) -> str:
    """Why a dataset named `name` that opens its files with `loader` is not served natively: ""
    where that is torchvision's own `pil_loader`, or its `default_loader` with the image backend
    PIL (each opens the file with Pillow and converts it to RGB)."""
    folder = sys.modules.get("torchvision.datasets.folder")
    if folder is None:
        return f"{name} has its own image loader ({named(loader)})"

    def own(f: Any, function: str) -> bool:
        # torchvision's own function, not one a script put in its place: its code is in
        # torchvision's file (a functools.wraps wrapper takes its names, not its code)
        code = getattr(f, "__code__", None)
        return code is not None and code.co_name == function and code.co_filename == folder.__file__ and \
            not hasattr(f, "__wrapped__")

    backend = getattr(sys.modules.get("torchvision"), "get_image_backend", lambda: None)()
    if not (own(loader, "pil_loader") or (own(loader, "default_loader") and backend == "PIL")):
        return f"{name} has its own image loader ({named(loader)})"
    # default_loader calls the module's pil_loader by name: a script may have put its own there
    # (a grey or an EXIF-transposing loader), which only torchvision's own call follows
    if not own(loader, "pil_loader") and not own(folder.pil_loader, "pil_loader"):
        return (f"torchvision.datasets.folder.pil_loader, which {name}'s default_loader calls, is the "
                f"script's own ({named(folder.pil_loader)})")
    return ""


def _pillows_image(module: Any) -> bool:
    """Whether `module` is Pillow's Image module, its `open` and `Image.convert` Pillow's own."""
    image = sys.modules.get("PIL.Image")
    return image is not None and module is image and _pillows(image.open) and _pillows(image.Image.convert)


def _pillows(f: Any) -> bool:
    """Whether `f` is Pillow's own function (not one a script put in its place)."""
    code = getattr(f, "__code__", None)
    return code is not None and code.co_filename == getattr(sys.modules.get("PIL.Image"), "__file__", None) and \
        not hasattr(f, "__wrapped__")


def _refused(name: str, shape: type, got: dict) -> str:
    """Why a dataset of `shape` with attributes `got` is not served natively ("" where it is)."""
    pandas = sys.modules.get("pandas")
    series = (pandas.Series,) if pandas is not None else ()
    for key, value in got.items():
        if key in ("paths", "labels", "samples") and not (type(value) in _LISTS + series):
            return f"{name} reads its {key} from a {type(value).__name__}, whose indexing fastdata does not read"
        if key == "mapping" and type(value) not in _LISTS + (dict,):
            return f"{name} maps its labels with a {type(value).__name__}, whose indexing fastdata does not read"
        if key == "frame" and (pandas is None or type(value) is not pandas.DataFrame):
            return f"{name} reads its samples from a {type(value).__name__}, not a pandas DataFrame"
        if key in ("root", "folder") and not isinstance(value, (str, pathlib.PurePath)):
            return f"{name} joins its paths to a {type(value).__name__}, not a str or a path"
    why = loader_refused(got["loader"], name) if shape.opens == "loader" else ""
    if why:
        return why
    transform = got["transform"]
    if transform is None and shape.guard in ("always", "inline"):
        return f"{name} calls its transform, which is None"
    # (`if self.transform:` asks the transform's truth: only where that cannot run its code)
    for key, guard in (("transform", shape.guard), ("target_transform", shape.target)):
        if guard == "if" and got.get(key) is not None and any(hasattr(type(got[key]), m) for m in ("__bool__",
                                                                                                 "__len__")):
            return f"{name} asks its {key}'s truth, which is {type(got[key]).__name__}'s own code"
    return ""
