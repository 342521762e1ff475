"""`fastdata run`: a file list's label that its `__getitem__` derives from the path (`_filelist`).

Scripts for a set whose class is in each file's name (Kaggle's dogs and cats) keep no list of
labels: their `__getitem__` computes the label from the name, in a line or an if chain of their
own, different in each script:

    img_name = self.images[idx]
    label = 0 if img_name.lower().startswith("cat") else 1
    image = Image.open(os.path.join(self.img_dir, img_name)).convert("RGB")

No bytecode shape can list those lines, so they are read from the function's source (`ast`),
which must compile to the very code the class runs (`_same`). The label's statements must be
consecutive, each binding the label only, from the label itself, one other local (the name as
the list gives it, `q = self.names[idx]`, or the path the code opens) and constants, by what
`_pure` allows alone: str methods, indexing and slicing, comparisons, `in`, conditional
expressions, `int`, `len` and `os.path`'s functions of a str, and lookups in a dict, list or tuple
of strs and ints of the instance's (`self.class_to_idx[name.split("_")[0]]`, `self.classes.index(
...)`: `PathLabel.refused`). Those run nothing of the script's and finish in time bounded by the
path's length and the table's. The function is then read with those statements as one, `label =
self.<LABELS>[idx]` (`PathLabel.code`), by the shapes of a file list with a list of labels
(`_fileshapes`; the label then made a tensor or an int as a list's may be), and fastdata computes
each label by the script's own statements (`PathLabel.labels`) from the same str, which must be a
str.
"""

from __future__ import annotations

import ast
import functools
import inspect
import os
import textwrap
import types
from typing import Callable

import numpy as np

LABELS = "\0derived labels"  # (the attribute the rewritten code reads its labels from: no script's name)
_STR_METHODS = frozenset({"split", "rsplit", "lower", "upper", "casefold", "strip", "lstrip", "rstrip", "startswith",
                          "endswith", "replace", "partition", "rpartition", "removeprefix", "removesuffix",
                          "isdigit", "find", "rfind"})
_OS_PATH = frozenset({"basename", "dirname", "splitext", "split"})
_COMPARED = (ast.In, ast.NotIn, ast.Eq, ast.NotEq)
_CALLED = ("os", "int", "len")  # (names a label statement may call: `os.path`'s functions, the builtins)


class PathLabel:
    """A `__getitem__` whose label its code derives from a str: `code`, its code with the label's
    statements made `label = self.<LABELS>[idx]`; `label_of(str, tables)`, the label they give;
    `source`, which str: "element", the list's own (`q = self.<attribute>[idx]`), or "path", the
    one the code opens; `tables`, the attributes of the instance it looks labels up in."""

    def __init__(self, code: types.CodeType, label_of: Callable, source: str, attribute: str, tables: tuple) -> None:
        self.code, self.label_of, self.source, self.attribute, self.tables = code, label_of, source, attribute, tables

    def refused(self, name: str, own: dict) -> str:
        """Why a dataset named `name`, its attributes `own`, is not served natively: its tables must
        be dicts, lists or tuples of strs and ints, whose lookup runs no code of the script's."""
        for table in self.tables:
            value = own[table]
            keys = value if type(value) in (list, tuple, dict) else None
            if keys is None or not all(type(k) in (str, int) for k in keys):
                return f"{name} derives its labels through its {table}, a {type(value).__name__}" + \
                    ("" if keys is None else " of other keys") + ", whose lookup fastdata does not read"
        return ""

    def labels(self, sources: list, own: dict) -> list:
        """The labels of `sources` (the strs the script's statements read), its tables those of
        `own`; TypeError for a source that is not a str, whose methods could be the script's code."""
        for s in sources:
            if type(s) is not str and type(s) is not np.str_:
                raise TypeError(f"a label's source of type {type(s).__name__}")
        view = types.SimpleNamespace(**{t: own[t] for t in self.tables})
        return [self.label_of(s, view) for s in sources]


@functools.lru_cache(maxsize=256)
def path_label(code: types.CodeType, imported: tuple) -> PathLabel | None:
    """The reading of a `__getitem__` of `code` whose label is derived from a str (see the module);
    None for any other, or where its source cannot be read or does not compile to `code`.
    `imported`: the names of its globals that are modules (each compiled as imported: the
    compiler calls a method of an imported name by another instruction)."""
    try:  # (any failure to read the source, a file gone or a parse too deep, leaves the dataset unread)
        tree = ast.parse(textwrap.dedent(inspect.getsource(code)))
    except Exception:
        return None
    func = tree.body[0] if len(tree.body) == 1 else None
    if not isinstance(func, ast.FunctionDef) or func.name != code.co_name or len(func.args.args) != 2:
        return None
    compiled = _compiled(func, imported)
    if compiled is None or not _same(compiled, code):
        return None
    self_, index = (a.arg for a in func.args.args)
    body = func.body
    last = body[-1]
    if not (isinstance(last, ast.Return) and isinstance(last.value, ast.Tuple) and len(last.value.elts) == 2):
        return None
    # (the label: the local the return's second item reads, as it is or made a tensor or an int there)
    local = set().union(*(_stored(s) for s in body))
    returned = {n.id for n in ast.walk(last.value.elts[1]) if isinstance(n, ast.Name)} & local
    if len(returned) != 1:
        return None
    (label,) = returned
    at = [k for k, s in enumerate(body) if label in _stored(s)]
    if not at or at != list(range(at[0], at[-1] + 1)):
        return None
    statements = body[at[0]:at[-1] + 1]
    read = {n for s in statements for n in _read(s, label, self_)}
    if None in read or len(read - {label, self_, *_CALLED}) != 1:
        return None
    (q,) = read - {label, self_, *_CALLED}
    if q in (self_, index):
        return None
    binds = [s for s in ast.walk(func) if isinstance(s, ast.Name) and s.id == q and isinstance(s.ctx, ast.Store)]
    bound = [s for s in body[:at[0]] if isinstance(s, ast.Assign) and len(s.targets) == 1 and
             isinstance(s.targets[0], ast.Name) and s.targets[0].id == q]
    if len(binds) != 1 or len(bound) != 1:
        return None
    value, attribute = bound[0].value, ""
    if isinstance(value, ast.Subscript) and isinstance(value.value, ast.Attribute) and \
            isinstance(value.value.value, ast.Name) and value.value.value.id == self_ and \
            isinstance(value.slice, ast.Name) and value.slice.id == index:
        source, attribute = "element", value.value.attr
    elif any(_opens(c, q, self_) for s in body for c in ast.walk(s)):
        source = "path"
    else:
        return None
    made = ast.Assign(targets=[ast.Name(label, ast.Store())],
                      value=ast.Subscript(ast.Attribute(ast.Name(self_, ast.Load()), LABELS, ast.Load()),
                                          ast.Name(index, ast.Load()), ast.Load()))
    rewritten = _compiled(ast.FunctionDef(func.name, func.args, body[:at[0]] + [made] + body[at[-1] + 1:], [],
                                          None, None, **_type_params()), imported)
    tables = tuple(sorted({t for s in statements for n in ast.walk(s) for t in [_table(n, self_)] if t is not None}))
    of = ast.FunctionDef("label_of", ast.arguments([], [ast.arg(q), ast.arg(self_)], None, [], [], None, []),
                         statements + [ast.Return(ast.Name(label, ast.Load()))], [], None, None, **_type_params())
    scope = {"os": os, "int": int, "len": len, "__builtins__": {}}
    code_of = _compiled(of, ())
    if rewritten is None or code_of is None:
        return None
    return PathLabel(rewritten, types.FunctionType(code_of, scope), source, attribute, tables)


def _type_params() -> dict:
    return {"type_params": []} if "type_params" in ast.FunctionDef._fields else {}


def _compiled(func: ast.FunctionDef, imported: tuple) -> types.CodeType | None:
    """The code of the function `func` alone (undecorated, compiled at the top of a module that
    imports the names `imported`)."""
    func = ast.FunctionDef(func.name, func.args, func.body, [], None, None, **_type_params())
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


def _stored(statement: ast.stmt) -> set[str]:
    """The names `statement` binds."""
    return {n.id for n in ast.walk(statement) if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}


def _read(statement: ast.stmt, label: str, self_: str) -> set:
    """The names a label statement reads (None among them where it is not one: it binds another
    name, or does more than `_pure` allows)."""
    if isinstance(statement, ast.Assign):
        ok = len(statement.targets) == 1 and isinstance(statement.targets[0], ast.Name) and \
            statement.targets[0].id == label and _pure(statement.value, self_)
        return _loaded(statement.value) if ok else {None}
    if isinstance(statement, ast.If) and _pure(statement.test, self_):
        inner = [_read(s, label, self_) for s in statement.body + statement.orelse]
        return set().union(_loaded(statement.test), *inner)
    return {None}


def _loaded(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _table(node: ast.AST, self_: str) -> str | None:
    """The attribute's name where `node` is `self.<attribute>` (a table a label is looked up in)."""
    return node.attr if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
        node.value.id == self_ else None


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
        return (_table(node.value, self_) is not None or _pure(node.value, self_)) and _pure(node.slice, self_)
    if isinstance(node, ast.Slice):
        return all(p is None or _pure(p, self_) for p in (node.lower, node.upper, node.step))
    if isinstance(node, ast.Call):
        f, args = node.func, node.args + [k.value for k in node.keywords]
        if not all(_pure(a, self_) for a in args) or any(k.arg is None for k in node.keywords):
            return False
        if isinstance(f, ast.Name):
            return f.id in ("int", "len") and len(node.args) == 1 and not node.keywords
        if isinstance(f, ast.Attribute) and f.attr in _OS_PATH and isinstance(f.value, ast.Attribute) and \
                f.value.attr == "path" and isinstance(f.value.value, ast.Name) and f.value.value.id == "os":
            return len(node.args) == 1 and not node.keywords
        if isinstance(f, ast.Attribute) and f.attr == "index" and _table(f.value, self_) is not None:
            return len(node.args) == 1 and not node.keywords
        return isinstance(f, ast.Attribute) and f.attr in _STR_METHODS and _pure(f.value, self_)
    return False
