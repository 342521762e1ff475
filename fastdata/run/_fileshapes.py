"""`fastdata run`: the shapes of a file list's `__getitem__` (`_filelist`), written out as code.

The shapes (each opens the image at a path as `_OPENS` does, then transforms it): the path
`self.paths[i]` or a pandas frame's (`self.frame.iloc[i, 0]`, or by the name of its column:
`self.frame.iloc[i]["path"]`, `self.frame.loc[i, "path"]`, `self.frame["path"][i]`, `r["path"]` of
`r = self.frame.iloc[i]`, or its attribute `r.path`), joined to a root with `os.path.join` (under a
folder of it or not; an extension added to the name or the joined path, or not), pathlib's `/`, an
f-string (`f"{self.root}/{name}.jpg"`, its text free) or `+` (`self.root + name`) or not, bound to a
local first or not (the image's own or another; or its name bound, then joined, the path bound or
not); the label from a list of its own (`self.labels[i]`) or the same frame (`self.frame.iloc[i, 1]`,
...), or a mapping's for it (`self.mapping[self.labels[i]]`), as it is or made a tensor or an int
where it is bound or in the return (`torch.tensor(y)`, with `dtype=torch.long` or `torch.int64`,
`int(y)`, `torch.tensor(int(y))`: `_LABELS`), before or after the image, after the transform or in
the return; or both from `path, label = self.samples[i]` or `= self.paths[i], self.labels[i]`
(`_PAIRED`); a docstring and the PyTorch tutorial's `if torch.is_tensor(i): i = i.tolist()` first
or not (`_LEADS`); the transform under `if self.transform:` or `if self.transform is not None:`,
always, or in the return.

`shapes_of` gives the shapes a class's `__getitem__` may be, from the names its code reads and what
it does (`_features`), each written out (`_written`) by the running interpreter's compiler, so that
its bytecode is compared instruction for instruction (`_views.same_shape`): only those whose parts
need nothing the code has not (a frame's `iloc`, os.path's `join`, a conditional jump): a shape
that reads a name or makes a jump the code does not cannot be its, and each one written out is a
compile (`benchmarks/run_reading.py`); `pick`, a shape's statements but the open and the
transforms, which give a sample's path and label.
"""

from __future__ import annotations

import ast
import builtins
import dis
import functools
import os
import types
from typing import Callable

import torch

from ._inline import LOADER

# Where a sample's path and label come from: (statements before them, the path, the label). A
# frame's columns are named by the script ({P}, {L}: any str, `COLUMNS`), but for `iloc`'s 0 and 1.
_SOURCES = (((), "self.paths[i]", "self.labels[i]"),
            ((), "self.frame.iloc[i, 0]", "self.frame.iloc[i, 1]"),
            ((), "self.frame.iloc[i][{P}]", "self.frame.iloc[i][{L}]"),
            ((), "self.frame.loc[i, {P}]", "self.frame.loc[i, {L}]"),
            ((), "self.frame[{P}][i]", "self.frame[{L}][i]"),
            (("r = self.frame.iloc[i]",), "r[{P}]", "r[{L}]"))
# What each of them needs of the code it could be (`_features`: the fixed name it reads, or a str constant it indexes
# by)
_SOURCE_NEEDS = ("", "iloc", "iloc", "loc", "\0[s]", "iloc")
# (and a row's columns read as its attributes, `r.path` (a class whose code reads an attribute of a row: `_features`'
# "."), their names free too)
_ROWS = (((), "self.frame.iloc[i].{AP}", "self.frame.iloc[i].{AL}"), (("r = self.frame.iloc[i]",), "r.{AP}", "r.{AL}"))
# A sample's path and label bound together (torchvision's own datasets bind them so), the path opened as it
# is or joined to a root (in the open, or bound first)
_PAIRED = ("p, y = self.samples[i]", "p, y = self.paths[i], self.labels[i]")
# How a path is joined to a root (`_written`'s `join`): with os.path.join, or pathlib's `/` (a class whose code divides)
# (or in an f-string: `f"{self.root}/{name}"`, `f"{self.root}/images/{name}.jpg"`; or with an extension added:
# `os.path.join(self.root, name + ".jpg")`, the text an f-string too, which compiles to the str where it is free;
# the braces doubled twice: `_written` formats the path in, then `_compiled` the free constants; or added to a root,
# to a text, or to a root and a text: `self.root + name`, `"./data/" + name`, `self.root + "/" + name`; or joined
# to a root and a folder under it, a text or another attribute: `os.path.join(self.root, "images", name)`)
_JOINS = {"os": "os.path.join(self.root, {})", "slash": "self.root / {}",
          "text": 'f"{{{{self.root}}}}{{S}}{{{{{}}}}}"', "text_after": 'f"{{{{self.root}}}}{{S}}{{{{{}}}}}{{T}}"',
          "os_text": 'os.path.join(self.root, {} + f"{{S}}")', "text_os": 'os.path.join(self.root, {}) + f"{{S}}"',
          "plus": "self.root + {}", "plus_text": 'f"{{S}}" + {}', "plus_slash": 'self.root + f"{{S}}" + {}',
          "os_three": 'os.path.join(self.root, f"{{S}}", {})', "os_folder": "os.path.join(self.root, self.folder, {})"}
_GUARDS = {"if": ["if self.transform:", "    x = self.transform(x)"],
           "not_none": ["if self.transform is not None:", "    x = self.transform(x)"],
           "always": ["x = self.transform(x)"],
           "inline": []}
# What a guard needs of the code it could be (`_features`): a conditional jump; one on None
_GUARD_NEEDS = {"if": {"\0if"}, "not_none": {"\0if", "\0none"}, "always": set(), "inline": set()}
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
# (torchvision's pil_loader written in: the file opened by Python, then by Pillow within it; or Pillow's
# image as a context, converted within it)
_OPENS.update({k: 'with open({}, "rb") as f:\n    ' + v for k, v in (
    ("with", 'x = Image.open(f).convert("RGB")'), ("with_after", 'x = Image.open(f)\n    x = x.convert("RGB")'),
    ("with_two", 'g = Image.open(f)\n    x = g.convert("RGB")'))})
_OPENS["with_image"] = 'with Image.open({}) as g:\n    x = g.convert("RGB")'
# Which of them a class may open by, from the names its code reads and what it does (`_features`: the
# first that it has all of)
_CHOICES = (({"ImageReadMode"}, ("read_rgb",)), ({"read_image"}, ("read",)), ({"PIL", "convert"}, ("pil",)),
            ({"convert", "\0with"}, ("with", "with_after", "with_two", "with_image")),
            ({"convert"}, ("convert", "convert_after")), ({"Image", "open"}, ("plain",)), ({"loader"}, ("loader",)))
# The shapes' free constants (`_views.same_shape` reads a "\0" str as the script's): a frame's
# columns' names, and the text an f-string puts before and after a path's name (`_TEXTS`)
COLUMNS = {"P": "\0path column", "L": "\0label column", "S": "\0text", "T": "\0text after"}
_TEXTS = ("S", "T")
# What shapes' parts may need of a code (`_written`'s `has`: every one where all shapes are written out): `iloc`
# or `loc` read, a str constant indexed by, a conditional jump, one on None, a join's names (`_JOIN_NEEDS`)
EVERY = frozenset({"iloc", "loc", "\0[s]", "\0if", "\0none", "\0joined"})
_OS = frozenset({"os", "path", "join"})
_JOIN_NEEDS = {"os": _OS, "os_text": _OS, "text_os": _OS, "os_three": _OS, "os_folder": _OS}


class Shape:
    """One shape of `__getitem__` (its code in the class's `__getitem__`), with `picked`, the
    same statements but the open and the transform, which `pick` makes a function `(self, i, P,
    L, S, T)` of, the free constants given: (path, label) of an index (`path_only`: those but the
    label's, (path, None)); `opens`: how it opens the
    image (a key of `_OPENS`); `guard`: how its transform is called (of `_GUARDS`); `target`: how
    its target_transform is guarded ("" without one)."""

    guard: str
    opens: str
    target: str
    picked: tuple
    path_only: tuple


def _shape(head: list[str], opened: str, guard: str, tail: list[str], label: str, path: str, opens: str,
           target: str) -> type:
    """The Shape of the statements `head` (`opened` among them, which opens `path`), then the
    transform as `guard` puts it and the target_transform as `target` does, then `tail`, then
    the return of the image and `label`."""
    image = "self.transform(x)" if guard == "inline" else "x"
    body = head + _GUARDS[guard] + _TARGETS[target] + tail + [f"return {image}, {label}"]
    picked = (*[s for s in head if s is not opened], *tail, f"return {path}, {label}")
    path_only = (*[s for s in head if s is not opened and not s.startswith("y = ")], f"return {path}, None")
    get = types.FunctionType(_compiled(body, free=True), {})
    return type("Shape", (Shape,), {"__getitem__": get, "picked": picked, "path_only": path_only, "guard": guard,
                                    "opens": opens, "target": target})


@functools.lru_cache(maxsize=None)
def pick(picked: tuple) -> Callable:
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
    # as in "\\0", may not stand in an f-string's braces before Python 3.12; a row's attributes
    # `fastdata_P`, put in its names, or read by `getattr(r, P)` where not free)
    marks = {f"fastdata.{k}": v for k, v in COLUMNS.items()}
    named = {f"fastdata_{k}": COLUMNS[k] for k in ("P", "L")}
    if free:
        columns = {k: f"fastdata.{k}" if k in _TEXTS else repr(f"fastdata.{k}") for k in COLUMNS}
    else:
        columns = {k: "{%s}" % k if k in _TEXTS else k for k in COLUMNS}
    source = "import PIL.Image\nfrom PIL import Image\nimport os\nimport torch\n" \
        "from torchvision.io import ImageReadMode, read_image\n" \
        f"def f(self, i{'' if free else ', ' + ', '.join(COLUMNS)}):\n" + \
        "".join(f"    {line}\n" for s in statements
                for line in s.format(**columns, AP="fastdata_P", AL="fastdata_L").split("\n"))
    tree = source if free else ast.fix_missing_locations(_Attributes().visit(ast.parse(source)))
    module = compile(tree, "<fastdata shape>", "exec", dont_inherit=True)
    code = next(c for c in module.co_consts if isinstance(c, types.CodeType))
    return code.replace(co_consts=tuple(marks.get(c, c) if type(c) is str else c for c in code.co_consts),
                        co_names=tuple(named.get(n, n) for n in code.co_names))


class _Attributes(ast.NodeTransformer):
    """A row's attribute `r.fastdata_P` made `getattr(r, P)`, its name the argument `P`."""

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        node = self.generic_visit(node)
        if node.attr not in ("fastdata_P", "fastdata_L"):
            return node
        return ast.Call(ast.Name("getattr", ast.Load()), [node.value, ast.Name(node.attr[-1], ast.Load())], [])


@functools.lru_cache(maxsize=None)
def _written(family: str, opens: str, target: str = "", leads: tuple = (), join: str = "os",
             mapped: bool = False, rows: bool = False, has: frozenset = EVERY) -> dict[bytes, tuple[type, ...]]:
    """Every shape whose label is returned as `_LABELS[family]` makes it (made where it is bound,
    or in the return) and whose image is opened as `_OPENS[opens]`, keyed by its code's bytes
    (the running interpreter's compiler writes them), its first statements `_LEADS`' `leads`, a
    path joined to a root as `_JOINS[join]` joins it; `mapped`: the label looked up in a mapping
    of the script's (`self.mapping[self.labels[i]]`: a dict of class names); `rows`: a frame's
    row's columns read as its attributes too (`_ROWS`).
    With a `target` guard, those that bind the label before the transform and return it as it is
    (the family ""), the target_transform after it. Only the shapes whose parts' needs are all in `has`
    (`_features`' marks and names the code has: a source's `_SOURCE_NEEDS`, a guard's `_GUARD_NEEDS`, a
    join's "\\0joined"): a shape whose part needs what a code lacks cannot be that code's."""
    made, open_, join_ = _LABELS[family].format, _OPENS[opens].format, _JOINS[join].format
    lead = [_LEADS[k] for k in leads]
    shapes = []
    sources = [source for source, needs in zip(_SOURCES, _SOURCE_NEEDS) if not needs or needs in has]
    joined = "\0joined" in has
    for guard in [g for g in _GUARDS if not (target and g == "inline") and _GUARD_NEEDS[g] <= has]:
        for before, path, label in sources + list(_ROWS if rows else ()):
            before, label = (*lead, *before), f"self.mapping[{label}]" if mapped else label
            whole = join_(path)
            # (the statements that bind what is opened, and what is opened: the path as it is or joined to a
            # root, in the open, bound first (to the image's own name or another), or its name bound, then joined
            # (and bound, to its own name or another, or in the open);
            # or joined and bound, the extension added in the open)
            suffixed = [([f"p = {_JOINS['os'].format(path)}"], 'p + f"{S}"')] if join == "text_os" else []
            plain = [([], path), ([f"p = {path}"], "p"), ([f"x = {path}"], "x")]
            for binds, path_at in plain + ([([], whole), ([f"p = {whole}"], "p"), ([f"x = {whole}"], "x"),
                                            ([f"n = {path}", f"p = {join_('n')}"], "p"), ([f"n = {path}"], join_("n")),
                                            ([f"p = {path}", f"p = {join_('p')}"], "p"), *suffixed] if joined else []):
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
        for pair in () if mapped else _PAIRED:  # (the path as it is or joined, in the open or bound first)
            for binds, path in [([], "p")] + ([([], join_("p")), ([f"q = {join_('p')}"], "q"),
                                               ([f"x = {join_('p')}"], "x")] if joined else []):
                opened = open_(path)
                shapes.append(_shape([*lead, pair, *binds, opened], opened, guard, [], made("y"), path, opens,
                                     target))
    written: dict[bytes, list[type]] = {}
    for shape in shapes:
        written.setdefault(shape.__getitem__.__code__.co_code, []).append(shape)
    return {code: tuple(found) for code, found in written.items()}


@functools.lru_cache(maxsize=256)
def shapes_of(code: types.CodeType, doc: bool) -> tuple:
    """The shapes whose code `code` is (a `__getitem__`'s, with a docstring or not): read from
    its code once (each batch reads its class again, to follow a swapped transform)."""
    names = _features(code)
    opens = next((ways for needs, ways in _CHOICES if needs <= names), ())
    if not opens:
        return ()  # (the shapes are written out only for a dataset that may be one: by the names they read)
    leads = (("doc",) if doc else ()) + (("index",) if "is_tensor" in names else ())
    joins = ("slash",) if "\0/" in names else ("text", "text_after") if "\0f" in names else \
        ("os_text", "text_os") if "\0+" in names else ("os",)
    joins += ("plus", "plus_text", "plus_slash") if "\0++" in names else ()
    joins += ("os_three", "os_folder") if "\0join3" in names else ()
    # (a shape reads the names its code reads, no more: the label's family is the one of the label names it reads;
    # the ways it may open, and the target_transform's guards, written one after another until one has its code)
    made = names & _MADE
    family = next((f for f, needs in _NEEDS.items() if needs & _MADE == made), None)
    if family is None:
        return ()
    # (only the shapes whose parts' needs the code has are written out: `_written`'s `has`)
    has = frozenset(names & EVERY)
    tries = [(family, way, "") for way in opens] + [("", way, target) for target in ("if", "not_none") for way in
                                                    opens if family == "" and _GUARD_NEEDS[target] <= has]
    maps, rows = (True, False) if "\0[][]" in names else (False,), "\0." in names and "iloc" in names
    return next((found for mapped in maps for join in joins
                 for given in [has | ({"\0joined"} if _JOIN_NEEDS.get(join, frozenset()) <= names else set())]
                 for f, way, target in tries
                 for found in [_written(f, way, target, leads, join, mapped, rows, given).get(code.co_code, ())]
                 if found), ())


def _features(code: types.CodeType) -> set[str]:
    """The names `code` reads, and marks (each a "\\0" str) of what it does that tells shapes
    apart: "/", it divides (pathlib's `/`); "f", it builds an f-string; "+", it adds a str
    constant (an extension); "++", it adds (but a number); "with", it has a with statement;
    "[][]", it indexes by what it has just indexed (a mapping's label of a list's:
    `self.mapping[self.labels[i]]`); ".", it reads an attribute of what it has just indexed or of
    a local (a row's column: `r.path`); "join3", it calls something of three arguments after it
    reads `join` (a root, a folder and a name); "[s]", it indexes by a str constant (a frame's
    column); "if", it jumps on a condition (an `if`, a `with`'s exit); "none", it tests for None."""
    features, last, text, number, local, joining = set(code.co_names), "", False, False, False, False
    features |= {"loader"} if LOADER in features else set()  # (torchvision's loader called by name: `_inline`)
    for ins in dis.get_instructions(code):
        if ins.opname == "LOAD_ATTR" and (last == "[]" or local) and ins.argval not in ("convert", "tolist"):
            features.add("\0.")  # (an attribute of what it has just indexed, or of a local but `self`)
        joining = joining or (ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and ins.argval == "join")
        if joining and ins.opname in ("CALL", "CALL_METHOD", "CALL_FUNCTION") and ins.arg == 3:
            features.add("\0join3")  # (a call of 3 arguments after `join` is read: `os.path.join(root, folder, name)`)
        op = {"BINARY_SUBSCR": "[]", "BINARY_TRUE_DIVIDE": "/", "BINARY_ADD": "+", "BEFORE_WITH": "with",
              "SETUP_WITH": "with", "BUILD_STRING": "f", "BINARY_OP": ins.argrepr}.get(ins.opname, "")
        if op in ("/", "f", "with", "[]") or (op == "+" and text):
            features.add("\0" + op)
        if op == "+" and not number:  # (an add of a number, as to a label, joins no path)
            features.add("\0++")
        if op == last == "[]":
            features.add("\0[][]")
        if op == "[]" and text:
            features.add("\0[s]")
        if "_IF_" in ins.opname:
            features.add("\0if")
        if ins.opname == "IS_OP" or "NONE" in ins.opname:
            features.add("\0none")
        last, text = op, ins.opname == "LOAD_CONST" and type(ins.argval) is str
        number = ins.opname in ("LOAD_CONST", "LOAD_SMALL_INT") and type(ins.argval) in (int, float)
        local = ins.opname == "LOAD_FAST" and ins.arg != 0
    return features
