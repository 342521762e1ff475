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
torchvision's Food101, DTD, Flowers102 and others open theirs: `loader_refused`), or opened as it
is (fastdata decodes a batch of those only where each file opens as RGB: `_folders.first_not_rgb`;
else the batch is the script's own fetch), or read as a uint8 tensor by torchvision.io's
`read_image` (a batch fastdata's only where each file is a JPEG of 3 components; its transform
lowered on the tensor), through its transform, with the label its code names (through a
target_transform where the code applies one after the transform, as the PyTorch tutorial's
CustomImageDataset does).

It is read by its code, not its name, as `_views` reads a multi-view wrapper: its `__getitem__`
must be one of the shapes `_written` writes out, instruction for instruction in the running
interpreter's bytecode (the names of its attributes and locals free; `Image` Pillow's module (or
`PIL.Image`), `read_image` torchvision.io's, `os`, `torch` and `open` themselves), its class
without `__getitems__`, `__getattr__` or `__getattribute__` of its own, its attributes plainly in
the instance. The shapes: the path `self.paths[i]` or a pandas frame's (`self.frame.iloc[i, 0]`, or
by the name of its column: `self.frame.iloc[i]["path"]`, `self.frame.loc[i, "path"]`,
`self.frame["path"][i]`, `r["path"]` of `r = self.frame.iloc[i]`), joined to a root with
`os.path.join` (an extension added to the name or the joined path, or not), pathlib's `/` or an
f-string (`f"{self.root}/{name}.jpg"`, its text free) or not, bound to a local first or not (the
image's own or another; or its name bound, then joined); the label from a list of its own
(`self.labels[i]`) or the same frame (`self.frame.iloc[i, 1]`, ...), or a mapping's for it
(`self.mapping[self.labels[i]]`), as it is or made a tensor or an int where it is bound or in the
return (`torch.tensor(y)`, with `dtype=torch.long` or `torch.int64`, `int(y)`,
`torch.tensor(int(y))`: `_LABELS`), before or after the image, after the transform or in the
return; or both from `path, label = self.samples[i]` or `= self.paths[i], self.labels[i]`
(`_PAIRED`); a docstring and the PyTorch tutorial's `if torch.is_tensor(i): i = i.tolist()` first
or not (`_LEADS`); the transform under `if self.transform:` or `if self.transform is not None:`,
always, or in the return. The lists must be lists, tuples, numpy arrays, tensors or pandas Series
(a frame a DataFrame; a mapping a dict too), whose indexing changes nothing: fastdata then
evaluates the same expressions on them (`FileList.samples`: code written from the same parts as the
shape's, without the open and the transforms) and gets the paths and labels the script's code
would. Any other code is a dataset fastdata cannot see into, served by the plain drop-in.
"""

from __future__ import annotations

import builtins
import dis
import functools
import os
import pathlib
import sys
import types
from typing import Any, Callable

import numpy as np
import torch

from ._pixels import named
from ._views import read_shape

# Where a sample's path and label come from: (statements before them, the path, the label). A
# frame's columns are named by the script ({P}, {L}: any str, `COLUMNS`), but for `iloc`'s 0 and 1.
_SOURCES = (((), "self.paths[i]", "self.labels[i]"),
            ((), "self.frame.iloc[i, 0]", "self.frame.iloc[i, 1]"),
            ((), "self.frame.iloc[i][{P}]", "self.frame.iloc[i][{L}]"),
            ((), "self.frame.loc[i, {P}]", "self.frame.loc[i, {L}]"),
            ((), "self.frame[{P}][i]", "self.frame[{L}][i]"),
            (("r = self.frame.iloc[i]",), "r[{P}]", "r[{L}]"))
# A sample's path and label bound together (torchvision's own datasets bind them so), the path opened as it
# is or joined to a root
_PAIRED = ("p, y = self.samples[i]", "p, y = self.paths[i], self.labels[i]")
# How a path is joined to a root (`_written`'s `join`): with os.path.join, or pathlib's `/` (a class whose code divides)
# (or in an f-string: `f"{self.root}/{name}"`, `f"{self.root}/images/{name}.jpg"`; or with an extension added:
# `os.path.join(self.root, name + ".jpg")`, the text an f-string too, which compiles to the str where it is free;
# the braces doubled twice: `_written` formats the path in, then `_compiled` the free constants)
_JOINS = {"os": "os.path.join(self.root, {})", "slash": "self.root / {}",
          "text": 'f"{{{{self.root}}}}{{S}}{{{{{}}}}}"', "text_after": 'f"{{{{self.root}}}}{{S}}{{{{{}}}}}{{T}}"',
          "os_text": 'os.path.join(self.root, {} + f"{{S}}")', "text_os": 'os.path.join(self.root, {}) + f"{{S}}"'}
_GUARDS = {"if": ["if self.transform:", "    x = self.transform(x)"],
           "not_none": ["if self.transform is not None:", "    x = self.transform(x)"],
           "always": ["x = self.transform(x)"],
           "inline": []}
# A target_transform after the transform (the PyTorch tutorial's CustomImageDataset), as its guard puts it
_TARGETS = {"": [], "if": ["if self.target_transform:", "    y = self.target_transform(y)"],
            "not_none": ["if self.target_transform is not None:", "    y = self.target_transform(y)"]}
# How the label is returned (`_written`'s families): as the list or frame gives it, or made a tensor or an int
_LABELS = {"": "{}", "tensor": "torch.tensor({})", "long": "torch.tensor({}, dtype=torch.long)",
           "int64": "torch.tensor({}, dtype=torch.int64)", "int": "int({})", "int_tensor": "torch.tensor(int({}))"}
_NEEDS = {"": set(), "tensor": {"torch", "tensor"}, "long": {"torch", "tensor", "long"},
          "int64": {"torch", "tensor", "int64"}, "int": {"int"}, "int_tensor": {"torch", "tensor", "int"}}
_MADE = {"tensor", "long", "int64", "int"}  # (the names that tell the families apart)
# What may come first (`_written`'s `leads`): a docstring (its text the script's), and the PyTorch
# tutorial's line that makes a tensor index a list
_LEADS = {"doc": '"""\\0doc"""', "index": "if torch.is_tensor(i):\n    i = i.tolist()"}
# How the image is opened (`_written`'s families): by Pillow, converted to RGB (in one statement or
# two, `Image` or `PIL.Image`; or by torchvision's own loader, which converts it) or as it is; or
# read as a uint8 tensor by torchvision.io (as the file is, or made RGB)
_OPENS = {"convert": 'x = Image.open({}).convert("RGB")', "convert_after": 'x = Image.open({})\nx = x.convert("RGB")',
          "pil": 'x = PIL.Image.open({}).convert("RGB")', "loader": "x = self.loader({})",
          "plain": "x = Image.open({})", "read": "x = read_image({})",
          "read_rgb": "x = read_image({}, ImageReadMode.RGB)"}
# (torchvision's pil_loader written in: the file opened by Python, then by Pillow within it)
_OPENS.update({k: 'with open({}, "rb") as f:\n    ' + v for k, v in (
    ("with", 'x = Image.open(f).convert("RGB")'), ("with_after", 'x = Image.open(f)\n    x = x.convert("RGB")'),
    ("with_two", 'g = Image.open(f)\n    x = g.convert("RGB")'))})
# Which of them a class may open by, from the names its code reads and what it does (`_features`: the
# first that it has all of)
_CHOICES = (({"ImageReadMode"}, ("read_rgb",)), ({"read_image"}, ("read",)), ({"PIL", "convert"}, ("pil",)),
            ({"convert", "\0with"}, ("with", "with_after", "with_two")), ({"convert"}, ("convert", "convert_after")),
            ({"Image", "open"}, ("plain",)), ({"loader"}, ("loader",)))
# How each file must open for fastdata, which decodes it as RGB, to give the image (`FileList.must_open`)
_MUST = {"plain": "rgb", "read": "jpeg", "read_rgb": "jpeg"}
# The shapes' free constants (`_views.same_shape` reads a "\0" str as the script's): a frame's
# columns' names, and the text an f-string puts before and after a path's name (`_TEXTS`)
COLUMNS = {"P": "\0path column", "L": "\0label column", "S": "\0text", "T": "\0text after"}
_TEXTS = ("S", "T")
# Names the shapes read that must be spelled as written: the modules, and their attributes' names
_FIXED = ("PIL", "Image", "open", "convert", "os", "path", "join", "iloc", "loc", "torch", "tensor", "long", "int64",
          "int", "is_tensor", "tolist", "read_image", "ImageReadMode", "RGB")
_LISTS = (list, tuple, np.ndarray, torch.Tensor)


class Shape:
    """One shape of `__getitem__` (its code in the class's `__getitem__`), with `picked`, the
    same statements but the open and the transform, which `_pick` makes a function `(self, i,
    P, L)` of, the columns given: (path, label) of an index; `opens`: how it opens the image (a
    key of `_OPENS`); `target`: how its target_transform is guarded ("" without one)."""

    guard: str
    opens: str
    target: str
    picked: tuple


def _shape(head: list[str], opened: str, guard: str, tail: list[str], label: str, path: str, opens: str,
           target: str) -> type:
    """The Shape of the statements `head` (`opened` among them, which opens `path`), then the
    transform as `guard` puts it and the target_transform as `target` does, then `tail`, then
    the return of the image and `label`."""
    image = "self.transform(x)" if guard == "inline" else "x"
    body = head + _GUARDS[guard] + _TARGETS[target] + tail + [f"return {image}, {label}"]
    picked = (*[s for s in head if s is not opened], *tail, f"return {path}, {label}")
    get = types.FunctionType(_compiled(body, free=True), {})
    return type("Shape", (Shape,), {"__getitem__": get, "picked": picked, "guard": guard, "opens": opens,
                                    "target": target})


@functools.lru_cache(maxsize=None)
def _pick(picked: tuple) -> Callable:
    """The function `(self, i, P, L, S, T)` of a shape's `picked` statements, given the script's
    free constants (`COLUMNS`; compiled for the shape a dataset has only)."""
    return types.FunctionType(_compiled(list(picked), free=False),
                              {"os": os, "torch": torch, "__builtins__": builtins})


def _compiled(statements: list[str], free: bool) -> types.CodeType:
    """The code of a method `(self, i)` of `statements` whose `COLUMNS` are its free constants,
    or (not `free`) `(self, i, P, L, S, T)`, that reads them from its arguments, in a module that
    imports `PIL`, Pillow's `Image`, `os`, `torch` and torchvision.io's names (the compiler reads an
    attribute of an imported module as such, not as a method), not run."""
    # (the free constants written as plain marks, then put in the code's constants: a backslash,
    # as in "\\0", may not stand in an f-string's braces before Python 3.12)
    marks = {f"fastdata.{k}": v for k, v in COLUMNS.items()}
    if free:
        columns = {k: f"fastdata.{k}" if k in _TEXTS else repr(f"fastdata.{k}") for k in COLUMNS}
    else:
        columns = {k: "{%s}" % k if k in _TEXTS else k for k in COLUMNS}
    source = "import PIL.Image\nfrom PIL import Image\nimport os\nimport torch\n" \
        "from torchvision.io import ImageReadMode, read_image\n" \
        f"def f(self, i{'' if free else ', ' + ', '.join(COLUMNS)}):\n" + \
        "".join(f"    {line}\n" for s in statements for line in s.format(**columns).split("\n"))
    module = compile(source, "<fastdata shape>", "exec", dont_inherit=True)
    code = next(c for c in module.co_consts if isinstance(c, types.CodeType))
    return code.replace(co_consts=tuple(marks.get(c, c) if type(c) is str else c for c in code.co_consts))


@functools.lru_cache(maxsize=None)
def _written(family: str, opens: str, target: str = "", leads: tuple = (), join: str = "os",
             mapped: bool = False) -> dict[bytes, tuple[type, ...]]:
    """Every shape whose label is returned as `_LABELS[family]` makes it (made where it is bound,
    or in the return) and whose image is opened as `_OPENS[opens]`, keyed by its code's bytes
    (the running interpreter's compiler writes them), its first statements `_LEADS`' `leads`, a
    path joined to a root as `_JOINS[join]` joins it; `mapped`: the label looked up in a mapping
    of the script's (`self.mapping[self.labels[i]]`: a dict of class names).
    With a `target` guard, those that bind the label before the transform and return it as it is
    (the family ""), the target_transform after it."""
    made, open_, join_ = _LABELS[family].format, _OPENS[opens].format, _JOINS[join].format
    lead = [_LEADS[k] for k in leads]
    shapes = []
    for guard in [g for g in _GUARDS if not (target and g == "inline")]:
        for before, path, label in _SOURCES:
            before, label = (*lead, *before), f"self.mapping[{label}]" if mapped else label
            joined = join_(path)
            # (the statements that bind what is opened, and what is opened: the path as it is or joined to a
            # root, in the open, bound first (to the image's own name or another), or its name bound, then joined;
            # or joined and bound, the extension added in the open)
            suffixed = [([f"p = {_JOINS['os'].format(path)}"], 'p + f"{S}"')] if join == "text_os" else []
            for binds, path_at in (([], path), ([f"p = {path}"], "p"), ([f"x = {path}"], "x"), ([], joined),
                                   ([f"p = {joined}"], "p"), ([f"x = {joined}"], "x"),
                                   ([f"n = {path}", f"p = {join_('n')}"], "p"), *suffixed):
                opened = open_(path_at)
                head = [*before, *binds, opened]
                for bind, returned in dict.fromkeys([(made(label), "y"), (label, made("y"))]):
                    bind = f"y = {bind}"
                    for at in range(len(before), len(head) + 1):  # the label bound before, between or after them
                        shapes.append(_shape(head[:at] + [bind] + head[at:], opened, guard, [], returned, path_at,
                                             opens, target))
                    if guard != "inline" and not target:  # the label bound after the transform
                        shapes.append(_shape(head, opened, guard, [bind], returned, path_at, opens, target))
                if not target:  # the label in the return
                    shapes.append(_shape(head, opened, guard, [], made(label), path_at, opens, target))
        for pair in () if mapped else _PAIRED:
            for path in ("p", join_("p")):
                opened = open_(path)
                shapes.append(_shape([*lead, pair, opened], opened, guard, [], made("y"), path, opens, target))
    written: dict[bytes, list[type]] = {}
    for shape in shapes:
        written.setdefault(shape.__getitem__.__code__.co_code, []).append(shape)
    return {code: tuple(found) for code, found in written.items()}


class FileList:
    """A script's file-list dataset as `file_list` reads it: `transform`, the one its
    `__getitem__` gives each image, `target_transform` (None without one) each label;
    `samples(indices)`, their paths and labels (before the target_transform); `must_open`, how
    each file must open for fastdata to give its image: None where the code converts it to RGB;
    "rgb", in mode RGB (opened as it is); "jpeg", as a JPEG of 3 components (read by torchvision.io)."""

    def __init__(self, shape: type, values: dict, why: str) -> None:
        self.shape, self.values, self.why = shape, values, why
        self.transform, self.target_transform = values["transform"], values.get("target_transform")
        self.must_open = _MUST.get(shape.opens)

    def samples(self, indices: list) -> tuple[list[str], list]:
        """(the paths, the labels) the dataset's code gives `indices`; raises what evaluating
        it raises, or TypeError for a path that is not a str or a pathlib path."""
        # (the attributes where the shape's code reads them: `self.paths` of the namespace)
        view = types.SimpleNamespace(**{k: v for k, v in self.values.items() if not k.startswith("\0")})
        pick, columns = _pick(self.shape.picked), [self.values.get(v) for v in COLUMNS.values()]
        picked = [pick(view, i, *columns) for i in indices]
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
    shapes = _shapes(code, cls.__getitem__.__doc__ is not None)
    read = read_shape(dataset, "__getitem__", shapes, _FIXED) if shapes else None
    if read is None:
        return None
    shape, got, func = read
    scope, names = func.__globals__, func.__code__.co_names
    if ("os" in names and scope.get("os") is not os) or ("torch" in names and scope.get("torch") is not torch) or \
            any(scope.get(n, func.__builtins__.get(n)) is not getattr(builtins, n) for n in ("int", "open")
                if n in names):  # ("open" the builtin where a with statement opens the file)
        return None
    if shape.opens.startswith("read"):
        io_ = sys.modules.get("torchvision.io")
        if io_ is None or any(scope.get(name) is not getattr(io_, name, None) for name in ("read_image",
                                                                                          "ImageReadMode")
                              if name in names):
            return None
    elif shape.opens != "loader":  # (the loader's own checks: `_refused`)
        image = sys.modules.get("PIL.Image")
        pil = scope.get("PIL") if shape.opens == "pil" else None
        if image is None or (scope.get("Image") if pil is None else getattr(pil, "Image", None)) is not image or \
                (pil is not None and pil is not sys.modules.get("PIL")) or \
                not (_pillows(image.open) and _pillows(image.Image.convert)):
            return None
    return FileList(shape, got, _refused(type(dataset).__name__, shape, got))


@functools.lru_cache(maxsize=256)
def _shapes(code: types.CodeType, doc: bool) -> tuple:
    """The shapes whose code `code` is (a `__getitem__`'s, with a docstring or not): read from
    its code once (each batch reads its class again, to follow a swapped transform)."""
    names = _features(code)
    opens = next((ways for needs, ways in _CHOICES if needs <= names), ())
    if not opens:
        return ()  # (the shapes are written out only for a dataset that may be one: by the names they read)
    leads = (("doc",) if doc else ()) + (("index",) if "is_tensor" in names else ())
    joins = ("slash",) if "\0/" in names else ("text", "text_after") if "\0f" in names else \
        ("os_text", "text_os") if "\0+" in names else ("os",)
    # (a shape reads the names its code reads, no more: the label's family is the one of the label names it reads;
    # the ways it may open, and the target_transform's guards, written one after another until one has its code)
    made = names & _MADE
    family = next((f for f, needs in _NEEDS.items() if needs & _MADE == made), None)
    if family is None:
        return ()
    tries = [(family, way, "") for way in opens] + [("", way, target) for target in ("if", "not_none") for way in
                                                    opens if family == ""]
    maps = (True, False) if "\0[][]" in names else (False,)
    return next((found for mapped in maps for join in joins for f, way, target in tries
                 for found in [_written(f, way, target, leads, join, mapped).get(code.co_code, ())] if found), ())


def _features(code: types.CodeType) -> set[str]:
    """The names `code` reads, and marks (each a "\\0" str) of what it does that tells shapes
    apart: "/", it divides (pathlib's `/`); "f", it builds an f-string; "+", it adds a str
    constant (an extension); "with", it has a with statement; "[][]", it indexes by what it has
    just indexed (a mapping's label of a list's: `self.mapping[self.labels[i]]`)."""
    features, last, text = set(code.co_names), "", False
    for ins in dis.get_instructions(code):
        op = {"BINARY_SUBSCR": "[]", "BINARY_TRUE_DIVIDE": "/", "BINARY_ADD": "+", "BEFORE_WITH": "with",
              "SETUP_WITH": "with", "BUILD_STRING": "f", "BINARY_OP": ins.argrepr}.get(ins.opname, "")
        if op in ("/", "f", "with", "[]") or (op == "+" and text):
            features.add("\0" + op)
        if op == last == "[]":
            features.add("\0[][]")
        last, text = op, ins.opname == "LOAD_CONST" and type(ins.argval) is str
    return features


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
        if key == "root" and not isinstance(value, (str, pathlib.PurePath)):
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
