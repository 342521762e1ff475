"""`fastdata run`: a file list's `__getitem__` read from its source (`_filelist`), where no bytecode
shape of `_fileshapes` is its code.

Scripts whose class is in each file's name or folder derive the label in lines of their own; a
much-copied PyTorch course's ImageFolderCustom also opens its image in a method, returning under a condition:

    img = self.load_image(index)           # image_path = self.paths[index]; return Image.open(image_path)
    class_name = self.paths[index].parent.name
    class_idx = self.class_to_idx[class_name]
    if self.transform:
        return self.transform(img), class_idx
    else:
        return img, class_idx

No bytecode shape can list such lines, so they are read from the source (`ast`), which must
compile to the very code the class runs (`_same`), as must each method of the class's and function
of its module's it calls, read in its place (`_inline`: so is a return under the transform's
condition, as `if self.transform: x = self.transform(x)` and one return). The label's statements
must be consecutive, each binding the label or a local only they read, from one str or path (the
list's element, `q = self.names[idx]` or read in place, or the path the code opens) and constants,
by what `_pure` allows alone: str methods, pathlib's attributes of a path (`name`, `parent`, ...),
indexing, comparisons, `in`, conditional expressions, `int`, `len`, `str`, `Path`, `os.path`'s
functions, and lookups in plain tables of the instance's (`ItemSource.refused`): they run nothing
of the script's, in time bounded by the path's length and the table's. The function is then read with those
statements as one, `label = self.<LABELS>[idx]` (`ItemSource.code`), by the shapes of a file list
with a list of labels, and fastdata computes each label by the script's own statements
(`ItemSource.labels`) from the same str or path, which must be exactly a str or pathlib's own.
"""

from __future__ import annotations

import ast
import copy
import functools
import inspect
import os
import pathlib
import textwrap
import types
from typing import Callable

import numpy as np

from ._inline import attribute_of, folded, inlined, stored

LABELS = "\0derived labels"  # (the attribute the rewritten code reads its labels from: no script's name)
_STR_METHODS = frozenset({"split", "rsplit", "lower", "upper", "casefold", "strip", "lstrip", "rstrip", "startswith",
                          "endswith", "replace", "partition", "rpartition", "removeprefix", "removesuffix",
                          "isdigit", "find", "rfind"})
_OS_PATH = frozenset({"basename", "dirname", "splitext", "split"})
_PATH_ATTRIBUTES = frozenset({"name", "stem", "suffix", "suffixes", "parent", "parents", "parts"})  # (pathlib's)
_COMPARED = (ast.In, ast.NotIn, ast.Eq, ast.NotEq)
# (names a label statement may call: `os.path`'s functions, the builtins, pathlib's Path)
_CALLED = ("os", "int", "len", "str", "Path")
# What a label's source may be: a str, or one of pathlib's own paths (whose methods are not the script's)
_SOURCES = (str, np.str_, pathlib.PurePosixPath, pathlib.PosixPath, pathlib.PureWindowsPath, pathlib.WindowsPath)
_ELEMENT = "fastdata_element"  # (the name a list's element read in place takes in the label's statements)


class ItemSource:
    """A `__getitem__` as its source reads: `code`, its code with the helpers it calls read in their
    place, a return under a condition folded, and a label its statements derive made `label =
    self.<LABELS>[idx]`; `label_of(str, tables)`, the label they give (None where the label is a
    list's); `source`, which str: "element", the list's own (`q = self.<attribute>[idx]`, or that
    element read in place), or "path", the one the code opens; `tables`, the attributes of the
    instance it looks labels up in."""

    def __init__(self, code: types.CodeType, label_of: Callable | None, source: str, attribute: str,
                 tables: tuple) -> None:
        self.code, self.label_of, self.source, self.attribute, self.tables = code, label_of, source, attribute, tables

    def refused(self, name: str, own: dict) -> str:
        """Why a dataset named `name`, its attributes `own`, is not served natively: its tables must
        be dicts, lists or tuples of strs and ints (a dict's values those or numbers), whose lookup
        runs no code of the script's."""
        for table in self.tables:
            value = own[table]
            keys = value if type(value) in (list, tuple, dict) else None
            other = keys is not None and not all(type(k) in (str, int) for k in keys)
            values = type(value) is dict and not all(type(v) in (str, int, float, bool) or (  # (or numpy's numbers)
                isinstance(v, np.generic) and type(v).__module__ == "numpy") for v in value.values())
            if keys is None or other or values:
                return f"{name} derives its labels through its {table}, a {type(value).__name__}" + \
                    (" of other keys" if other else " of other values" if values else "") + \
                    ", whose lookup fastdata does not read"
        return ""

    def labels(self, sources: list, own: dict) -> list:
        """The labels of `sources` (the strs or paths the script's statements read), its tables
        those of `own`; TypeError for a source that is neither a str nor one of pathlib's paths,
        whose methods could be the script's code."""
        for s in sources:
            if type(s) not in _SOURCES:
                raise TypeError(f"a label's source of type {type(s).__name__}")
        view = types.SimpleNamespace(**{t: own[t] for t in self.tables})
        return [self.label_of(s, view) for s in sources]


@functools.lru_cache(maxsize=256)
def item_source(code: types.CodeType, imported: tuple, held: tuple = (), functions: tuple = (),
                loaders: tuple = ()) -> ItemSource | None:
    """The reading of a `__getitem__` of `code` from its source (see the module); None where its
    source cannot be read or does not compile to `code`, or where it is no different from `code`
    (no helper read in its place, no return folded, no label derived). `imported`: the names of its
    globals that are modules (each compiled as imported: the compiler calls a method of an imported
    name by another instruction); `held`: (name, code, whether it takes the instance) of each
    method of the class's and function of its module's the instance holds, `functions`: (name,
    code) of each function of its module's, that it may call; `loaders`: the names of its globals
    that are torchvision's loaders (`_inline`)."""
    try:
        return _reading(code, imported, held, functions, loaders)
    except RecursionError:  # (a tree deeper than these functions may walk, though Python ran it)
        return None


def _reading(code: types.CodeType, imported: tuple, held: tuple, functions: tuple,
             loaders: tuple) -> ItemSource | None:
    func = _source(code, imported, 2)
    if func is None:
        return None
    self_, index = (a.arg for a in func.args.args)
    held = {name: (f, method) for name, c, method in held for f in [_source(c, imported, 1 + method)] if f is not None}
    functions = {name: f for name, c in functions for f in [_source(c, imported, 1)] if f is not None}
    body = inlined(func.body, self_, index, held, functions, loaders, set(code.co_varnames))
    if body is None:
        return None
    body = folded(body)
    derived = _derived(func, body, imported)
    if derived is not None or body == func.body:
        return derived
    rewritten = _compiled(_function(func.name, func.args, body), imported)
    return None if rewritten is None else ItemSource(rewritten, None, "", "", ())


def _derived(func: ast.FunctionDef, body: list, imported: tuple) -> ItemSource | None:
    """The reading of `func`, its statements `body`, whose label its statements derive from a str or
    a path (see the module); None for any other."""
    self_, index = (a.arg for a in func.args.args)
    last = body[-1]
    if not (isinstance(last, ast.Return) and isinstance(last.value, ast.Tuple) and len(last.value.elts) == 2):
        return None
    # (the label: the local the return's second item reads, as it is or made a tensor or an int there)
    local = set().union(*(stored(s) for s in body))
    returned = {n.id for n in ast.walk(last.value.elts[1]) if isinstance(n, ast.Name)} & local
    if len(returned) != 1:
        return None
    (label,) = returned
    at = [k for k, s in enumerate(body) if label in stored(s)]
    if not at or at != list(range(at[0], at[-1] + 1)):
        return None
    lo, hi = at[0], at[-1]
    # (and the locals bound just before, that only the label's statements read: `class_name = path.parent.name`)
    while lo > 0 and isinstance(body[lo - 1], ast.Assign) and len(body[lo - 1].targets) == 1 and \
            isinstance(body[lo - 1].targets[0], ast.Name) and body[lo - 1].targets[0].id not in (label, self_, index):
        t = body[lo - 1].targets[0].id
        elsewhere = {n.id for s in body[:lo - 1] + body[hi + 1:] for n in ast.walk(s) if isinstance(n, ast.Name)}
        if t in elsewhere or t not in {n.id for s in body[lo:hi + 1] for n in ast.walk(s) if isinstance(n, ast.Name)}:
            break
        lo -= 1
    bound = set().union(*(stored(s) for s in body[lo:hi + 1]))
    # (the list's element read where it is used, `self.paths[index].parent.name`: read as a local's)
    elements = _Elements(self_, index)
    statements = [elements.visit(copy.deepcopy(s)) for s in body[lo:hi + 1]]
    read = {n for s in statements for n in _read(s, bound, self_)}
    free = read - {*bound, self_, *_CALLED}
    if None in read or len(free) != 1 or index in free or len(elements.attributes) > 1 or \
            any(isinstance(n, ast.Name) and n.id == _ELEMENT for s in body for n in ast.walk(s)):  # (a name of its own)
        return None
    (q,) = free
    attribute = next(iter(elements.attributes), "")
    if q == _ELEMENT:  # (an element of the list the code reads elsewhere too: a label list's own is no derived label)
        source = "element"
        if not any(_element(n, self_, index) == attribute for s in body[:lo] + body[hi + 1:] for n in ast.walk(s)):
            return None
    else:
        binds = [s for s in ast.walk(func) if isinstance(s, ast.Name) and s.id == q and isinstance(s.ctx, ast.Store)]
        first = [s for s in body[:lo] if isinstance(s, ast.Assign) and len(s.targets) == 1 and
                 isinstance(s.targets[0], ast.Name) and s.targets[0].id == q]
        if len(binds) != 1 or len(first) != 1 or attribute:
            return None
        attribute = _element(first[0].value, self_, index) or ""
        if attribute:
            source = "element"
        elif any(_opens(c, q, self_) for s in body for c in ast.walk(s)):
            source = "path"
        else:
            return None
    made = ast.parse(f"{label} = {self_}.labels[{index}]").body[0]
    made.value.value.attr = LABELS  # (an attribute no script can name)
    rewritten = _compiled(_function(func.name, func.args, body[:lo] + [made] + body[hi + 1:]), imported)
    tables = tuple(sorted({t for s in statements for n in ast.walk(s)
                           for t in [attribute_of(n, self_)] if t is not None}))
    of = _function("label_of", ast.arguments([], [ast.arg(q), ast.arg(self_)], None, [], [], None, []),
                   statements + [ast.Return(ast.Name(label, ast.Load()))])
    scope = {"os": os, "int": int, "len": len, "str": str, "Path": pathlib.Path, "__builtins__": {}}
    code_of = _compiled(of, ())
    if rewritten is None or code_of is None:
        return None
    return ItemSource(rewritten, types.FunctionType(code_of, scope), source, attribute, tables)


def _source(code: types.CodeType, imported: tuple, arity: int) -> ast.FunctionDef | None:
    """The tree of the function of `code` (of `arity` arguments: a method's the instance and one),
    read from its source; None where that cannot be read or does not compile to `code`."""
    try:  # (any failure to read the source, a file gone or a parse too deep, leaves the dataset unread)
        tree = ast.parse(textwrap.dedent(inspect.getsource(code)))
    except Exception:
        return None
    func = tree.body[0] if len(tree.body) == 1 else None
    if not isinstance(func, ast.FunctionDef) or func.name != code.co_name or len(func.args.args) != arity or \
            func.args.posonlyargs or func.args.kwonlyargs or func.args.vararg or func.args.kwarg:
        return None
    compiled = _compiled(func, imported)
    return func if compiled is not None and _same(compiled, code) else None


class _Elements(ast.NodeTransformer):
    """`self.<attribute>[index]` made the name `_ELEMENT`, the attributes so read kept."""

    def __init__(self, self_: str, index: str) -> None:
        self.self_, self.index, self.attributes = self_, index, set()

    def visit_Subscript(self, node: ast.Subscript) -> ast.AST:
        attribute = _element(node, self.self_, self.index)
        if attribute is not None:
            self.attributes.add(attribute)
            return ast.Name(_ELEMENT, ast.Load())
        return self.generic_visit(node)


def _element(node: ast.AST, self_: str, index: str) -> str | None:
    """The attribute's name where `node` reads `self.<attribute>[index]` (a list's element)."""
    return attribute_of(node.value, self_) if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and \
        isinstance(node.slice, ast.Name) and node.slice.id == index else None


def _function(name: str, args: ast.arguments, body: list) -> ast.FunctionDef:
    """An undecorated function of `body` (without type parameters, which Python 3.12's tree has)."""
    return ast.FunctionDef(name, args, body, [], None, None,
                           **({"type_params": []} if "type_params" in ast.FunctionDef._fields else {}))


def _compiled(func: ast.FunctionDef, imported: tuple) -> types.CodeType | None:
    """The code of the function `func` alone (undecorated, compiled at the top of a module that
    imports the names `imported`)."""
    func = _function(func.name, func.args, func.body)
    imports = [ast.Import([ast.alias(name)]) for name in imported]
    try:
        module = compile(ast.fix_missing_locations(ast.Module([*imports, func], [])), "<fastdata label>", "exec",
                         dont_inherit=True)
    except Exception:  # (a tree the compiler refuses, or one too deep for it)
        return None
    return next(c for c in module.co_consts if isinstance(c, types.CodeType))


def _same(mine: types.CodeType, theirs: types.CodeType) -> bool:
    """Whether two codes are the same instructions on the same names and constants."""
    if (mine.co_code, mine.co_names, mine.co_varnames, mine.co_argcount) != \
            (theirs.co_code, theirs.co_names, theirs.co_varnames, theirs.co_argcount) or \
            len(mine.co_consts) != len(theirs.co_consts):
        return False
    return all(_same(a, b) if isinstance(b, types.CodeType) else
               (not isinstance(a, types.CodeType) and type(a) is type(b) and a == b)
               for a, b in zip(mine.co_consts, theirs.co_consts))


def _opens(node: ast.AST, q: str, self_: str) -> bool:
    """Whether `node` opens the file at the path `q` (`Image.open(q)`, `open(q, "rb")`,
    `read_image(q)`, `self.loader(q)`: the calls a file list's shapes open by)."""
    if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Name) and node.args[0].id == q):
        return False
    f = node.func
    return (isinstance(f, ast.Name) and f.id in ("open", "read_image")) or \
        (isinstance(f, ast.Attribute) and (f.attr == "open" or (isinstance(f.value, ast.Name) and f.value.id == self_)))


def _read(statement: ast.stmt, bound: set, self_: str) -> set:
    """The names a label statement reads (None among them where it is not one: it binds a name not
    `bound`, or does more than `_pure` allows)."""
    if isinstance(statement, ast.Assign):
        ok = len(statement.targets) == 1 and isinstance(statement.targets[0], ast.Name) and \
            statement.targets[0].id in bound and _pure(statement.value, self_)
        return _loaded(statement.value) if ok else {None}
    if isinstance(statement, ast.If) and _pure(statement.test, self_):
        inner = [_read(s, bound, self_) for s in statement.body + statement.orelse]
        return set().union(_loaded(statement.test), *inner)
    return {None}


def _loaded(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _pure(node: ast.AST, self_: str) -> bool:
    """Whether the expression `node` does only what a label statement may (see the module); `self_`:
    the name of the instance, whose attributes it may only look a label up in (`self.classes[name]`,
    `self.classes.index(name)`)."""
    if isinstance(node, ast.Constant):
        return type(node.value) in (str, int, bool, float, type(None))
    if isinstance(node, ast.Name):  # (`_CALLED` only where they are called, the instance's tables as below)
        return isinstance(node.ctx, ast.Load) and node.id not in _CALLED and node.id != self_
    if isinstance(node, (ast.Tuple, ast.List)):
        return all(_pure(e, self_) for e in node.elts)
    if isinstance(node, ast.Attribute):  # (pathlib's, of a path: `path.parent.name`; on a str, an AttributeError)
        return node.attr in _PATH_ATTRIBUTES and _pure(node.value, self_)
    if isinstance(node, ast.Compare):
        return all(isinstance(op, _COMPARED) for op in node.ops) and _pure(node.left, self_) and \
            all(_pure(c, self_) for c in node.comparators)
    if isinstance(node, ast.IfExp):
        return _pure(node.test, self_) and _pure(node.body, self_) and _pure(node.orelse, self_)
    if isinstance(node, ast.BoolOp):
        return all(_pure(v, self_) for v in node.values)
    if isinstance(node, ast.UnaryOp):
        return isinstance(node.op, (ast.Not, ast.USub)) and _pure(node.operand, self_)
    if isinstance(node, ast.Subscript):
        return (attribute_of(node.value, self_) is not None or _pure(node.value, self_)) and _pure(node.slice, self_)
    if isinstance(node, ast.Slice):
        return all(p is None or _pure(p, self_) for p in (node.lower, node.upper, node.step))
    if isinstance(node, ast.Call):
        f, args = node.func, node.args + [k.value for k in node.keywords]
        if not all(_pure(a, self_) for a in args) or any(k.arg is None for k in node.keywords):
            return False
        if isinstance(f, ast.Name):
            return f.id in ("int", "len", "str", "Path") and len(node.args) == 1 and not node.keywords
        if isinstance(f, ast.Attribute) and f.attr in _OS_PATH and isinstance(f.value, ast.Attribute) and \
                f.value.attr == "path" and isinstance(f.value.value, ast.Name) and f.value.value.id == "os":
            return len(node.args) == 1 and not node.keywords
        if isinstance(f, ast.Attribute) and f.attr == "index" and attribute_of(f.value, self_) is not None:
            return len(node.args) == 1 and not node.keywords
        return isinstance(f, ast.Attribute) and f.attr in _STR_METHODS and _pure(f.value, self_)
    return False
