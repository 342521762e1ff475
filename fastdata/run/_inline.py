"""`fastdata run`: a `__getitem__`'s statements (`_itemsource` reads them from the source) with the
script's own code it calls read in its place, and its return under the transform's condition read
as one return, so that the shapes of `_fileshapes` may read them.

Scripts open their images in a helper of their own: a method of the class's (`img =
self.load_image(index)`, as a much-copied PyTorch course's ImageFolderCustom does), or a function of
the script's module, called by name or held by the instance (`self.loader = loader`, its default a
function of the script's), often torchvision's pil_loader copied in:

    def pil_loader(path):
        with open(path, "rb") as f:
            img = Image.open(f)
            return img.convert("RGB")

Such a call of one argument bound to a local (`x = self.<helper>(a)`, `x = <function>(a)`) is read
as the helper's statements (`inlined`), its return bound to `x` (within the `with` where a return
ends the `with` that ends the helper: the same calls in the same order); the helper's argument
named as the caller's local where the caller passes one, else bound to its own name first. The
helper is so read only where it returns only at its end, binds neither its arguments nor a name the
caller has, and reads none of the caller's locals (so that in its place each name means what it
meant in it); its source must compile to its code, as the caller's must (`_itemsource`). A call of
torchvision's own `pil_loader` or `default_loader` imported by the script is read as the shapes'
`x = self.loader(p)`, the function in the attribute `LOADER` (checked then as a folder's loader).
"""

from __future__ import annotations

import ast
import copy

LOADER = "\0loader"  # (the attribute the reading reads torchvision's loader from: no script's name)


def inlined(body: list, self_: str, index: str, held: dict, functions: dict, loaders: tuple,
            locals_: set) -> list | None:
    """`body` (of a `__getitem__` of the instance `self_` and the index `index`, its locals
    `locals_`) with each call bound to a local of `held` (name: (the tree, whether it takes the
    instance) of each method of the class's, or function of one argument the instance holds) or
    of `functions` (trees of the module's functions of one argument) read in its place, and each
    call of `loaders` (names of torchvision's loaders) read as `self.<LOADER>(p)`; None where a
    helper may not be so read (see the module)."""
    taken = {n.id for s in body for n in ast.walk(s) if isinstance(n, ast.Name)}
    out = []
    for s in body:
        call = s.value if isinstance(s, ast.Assign) and len(s.targets) == 1 and \
            isinstance(s.targets[0], ast.Name) else None
        if not (isinstance(call, ast.Call) and len(call.args) == 1 and not call.keywords and
                not isinstance(call.args[0], ast.Starred)):
            out.append(s)
            continue
        f, helper, method, made = call.func, None, False, None
        if isinstance(f, ast.Name) and f.id in loaders and f.id not in locals_:
            made = [ast.Assign(targets=s.targets, value=ast.Call(
                ast.Attribute(ast.Name(self_, ast.Load()), LOADER, ast.Load()), call.args, []))]
        elif isinstance(f, ast.Name) and f.id not in locals_:
            helper = functions.get(f.id)
        elif attribute_of(f, self_) is not None:
            helper, method = held.get(f.attr, (None, False))
        if helper is not None:
            made = _made(helper, call.args[0], s.targets[0], self_, taken, locals_ | {self_, index}, method)
            if made is None:
                return None
        out += made if made is not None else [s]
    return out


def _made(helper: ast.FunctionDef, arg: ast.expr, target: ast.Name, self_: str, taken: set, locals_: set,
          method: bool) -> list | None:
    """The statements of `helper` (a method, or a function of one argument) called with `arg`, its
    return bound to `target`, in a caller of the instance `self_` whose names are `taken`, its
    locals `locals_`; None where they may not be read so (see the module)."""
    params = [a.arg for a in helper.args.args]
    statements = helper.body[1:] if ast.get_docstring(helper, clean=False) is not None else helper.body
    last = statements[-1] if statements else None
    within = last if isinstance(last, ast.With) and isinstance(last.body[-1], ast.Return) else None
    end = within.body[-1] if within is not None else last
    nodes = [n for x in statements for n in ast.walk(x)]
    if not isinstance(end, ast.Return) or end.value is None or \
            [n for n in nodes if isinstance(n, ast.Return)] != [end] or \
            any(isinstance(n, (ast.Yield, ast.YieldFrom, ast.Await, ast.Global, ast.Nonlocal)) for n in nodes) or \
            set().union(*(stored(x) for x in statements)) & ({*params} | taken | locals_) or \
            ({n.id for n in nodes if isinstance(n, ast.Name)} - {*params}) & locals_:
        return None
    names = {params[0]: self_} if method else {}
    head = []
    if isinstance(arg, ast.Name) and arg.id in locals_:  # (the caller's local or index, named as the caller names it)
        names[params[-1]] = arg.id
    elif params[-1] in taken | locals_:
        return None
    else:  # (anything else bound to the helper's own name first)
        head = [ast.Assign(targets=[ast.Name(params[-1], ast.Store())], value=arg)]
    bound = ast.Assign(targets=[target], value=_renamed(end.value, names))
    last = bound if within is None else _renamed(within, names)
    if within is not None:
        last.body[-1] = bound  # (the return that ends the with, bound within it)
    return head + [_renamed(x, names) for x in statements[:-1]] + [last]


def folded(body: list) -> list:
    """`body` with a transform applied in a return under a condition, `if self.transform: return
    self.transform(x), y` then (or else) `return x, y`, made `if self.transform: x =
    self.transform(x)` and `return x, y`: the same calls in the same order, the same result
    (where `y` does not read `x`)."""
    last = body[-1] if body else None
    if isinstance(last, ast.If) and len(last.body) == 1 and len(last.orelse) == 1:
        cond, plain, head = last, last.orelse[0], body[:-1]
    elif len(body) > 1 and isinstance(body[-2], ast.If) and len(body[-2].body) == 1 and not body[-2].orelse:
        cond, plain, head = body[-2], last, body[:-2]
    else:
        return body
    done = cond.body[0]
    if not all(isinstance(r, ast.Return) and isinstance(r.value, ast.Tuple) and len(r.value.elts) == 2
               for r in (done, plain)):
        return body
    (made, y1), (x, y2) = done.value.elts, plain.value.elts
    if not (isinstance(x, ast.Name) and isinstance(made, ast.Call) and not made.keywords and len(made.args) == 1 and
            isinstance(made.args[0], ast.Name) and made.args[0].id == x.id and ast.dump(y1) == ast.dump(y2) and
            x.id not in {n.id for n in ast.walk(y1) if isinstance(n, ast.Name)}):
        return body
    return head + [ast.If(cond.test, [ast.Assign(targets=[ast.Name(x.id, ast.Store())], value=made)], []), plain]


def stored(statement: ast.stmt) -> set[str]:
    """The names `statement` binds."""
    return {n.id for n in ast.walk(statement) if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}


def attribute_of(node: ast.AST, self_: str) -> str | None:
    """The attribute's name where `node` is `self.<attribute>` (`self_` the instance's name)."""
    return node.attr if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
        node.value.id == self_ else None


def _renamed(node: ast.AST, names: dict) -> ast.AST:
    """A copy of `node`, its names renamed by `names` (a helper's arguments named as its caller's)."""
    node = copy.deepcopy(node)
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            n.id = names.get(n.id, n.id)
    return node
