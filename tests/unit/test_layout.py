"""The package's shape, read from its source with `ast` (nothing is imported): no import cycle,
no long module without a stated reason, no private name imported across module lines.

Import graph. A node is a module of `fastdata` (a package is named by its `__init__`; the
native extension, named in CMakeLists.txt, is a node without source). Every import statement
counts, at any depth: inside functions, `try` blocks and `if TYPE_CHECKING:` alike. Relative
imports are resolved against the importer's package. `from P import x` is an import of the
submodule `P.x` when `P/x.py`, `P/x/` or the extension `P.x` exists, and otherwise an import
of the name `x` from `P` (its `__init__`). An import of `a.b.c` runs the `__init__` of `a.b`
and `a` first unless they are already being imported, so the importer M gets an edge to
`a.b.c` and to each package above it, except to M itself and the packages above M: those are
always in `sys.modules` while M runs (importing M imported them first), and finding them
there runs nothing. Hence:

- `pkg/__init__` importing `pkg.x`, while `pkg.x` imports its sibling `pkg.y`, is no cycle:
  the edges are pkg -> pkg.x -> pkg.y, and pkg.x finds `pkg` already there.
- `pkg.x` importing `pkg` itself (`from pkg import name`, `from . import name` where `name`
  is no submodule, `import pkg`) while `pkg/__init__` imports `pkg.x` is a cycle: at import
  time pkg.x reads a package whose `__init__` has not finished, and inside a function the
  import only postpones that (the two modules still need each other).

Long modules. A module over 400 lines states why in the first paragraph of its docstring, in
a sentence holding the words "over 400 lines" and at least five more words of reason, e.g.
"Over 400 lines: the tar walk and its resync share one state machine."

Private names. No module imports a name starting with one underscore from another module,
neither with `from m import _x` nor by reading `m._x` through a name bound to a fastdata
module. Modules with a private name (`fastdata._buffers`) are fine to import: their public
names are their interface. The image backends (`fastdata/backends/`, `fastdata/image/`) are
checked on their own first, for a message that names them. Nor does a module read or set
`obj._x` (other than on `self` or `cls`) where only classes of other modules define `_x`: a
protocol that other modules use is public methods of a base class.
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 400
REASON = re.compile(r"over 400 lines", re.IGNORECASE)
BACKEND_PACKAGES = ("fastdata.backends", "fastdata.image")


@dataclass
class Tree:
    """What the scan of one package found."""

    modules: dict[str, Path | None] = field(default_factory=dict)  # name -> source (None: no source)
    packages: set[str] = field(default_factory=set)
    edges: dict[str, dict[str, int]] = field(default_factory=dict)  # importer -> {imported: line}
    private: list[tuple[str, int, str, str]] = field(default_factory=list)  # (importer, line, module, name)
    members: list[tuple[str, int, str, str]] = field(default_factory=list)  # (user, line, expression, owners)


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _parents(name: str) -> list[str]:
    """The packages above a dotted name, innermost first: a.b.c -> [a.b, a]."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(len(parts) - 1, 0, -1)]


def _extensions(root: Path, package: str) -> set[str]:
    """The native modules of the package: those CMakeLists.txt builds, and any built in place."""
    names = set()
    cmake = root / "CMakeLists.txt"
    if cmake.exists():
        names |= {f"{package}.{m}" for m in re.findall(r"nanobind_add_module\(\s*(\w+)", cmake.read_text())}
    for lib in (root / package).rglob("*.so"):
        rel = lib.relative_to(root).parent.parts + (lib.name.split(".")[0],)
        names.add(".".join(rel))
    return names


def scan(root: Path, package: str) -> Tree:
    """The import graph and the private-name imports of `root/package`."""
    tree = Tree()
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
            tree.packages.add(".".join(parts))
        tree.modules[".".join(parts)] = path
        for i in range(1, len(parts)):  # a folder without __init__.py is a namespace package
            tree.packages.add(".".join(parts[:i]))
            tree.modules.setdefault(".".join(parts[:i]), None)
    for name in _extensions(root, package):
        tree.modules.setdefault(name, None)
    syntax = {name: ast.parse(path.read_text(), str(path)) for name, path in tree.modules.items() if path}
    for name, module in syntax.items():
        _scan_module(tree, package, name, module)
    _scan_members(tree, syntax)
    return tree


def _scan_members(tree: Tree, syntax: dict[str, ast.Module]) -> None:
    """`obj._x` outside `self`/`cls`, where `_x` is a member that only other modules' classes
    define (a `def _x` or a `self._x = ...` in a class body): a class's private protocol used
    from outside its module."""
    owners: dict[str, set[str]] = {}
    for name, module in syntax.items():
        for cls in (n for n in ast.walk(module) if isinstance(n, ast.ClassDef)):
            for node in ast.walk(cls):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    member = node.name
                elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                      and isinstance(node.value, ast.Name) and node.value.id == "self"):
                    member = node.attr
                else:
                    continue
                if _is_private(member):
                    owners.setdefault(member, set()).add(name)
    for name, module in syntax.items():
        for node in ast.walk(module):
            if (isinstance(node, ast.Attribute) and node.attr in owners and name not in owners[node.attr]
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
                tree.members.append((name, node.lineno, ast.unparse(node), ", ".join(sorted(owners[node.attr]))))


def _scan_module(tree: Tree, package: str, me: str, syntax: ast.Module) -> None:
    edges = tree.edges.setdefault(me, {})
    here = set(_parents(me)) | {me}  # in sys.modules while this module runs
    bound: dict[str, str] = {}  # local name -> the fastdata module it is bound to

    def ours(name: str) -> bool:
        return name == package or name.startswith(package + ".")

    def depend(target: str, line: int) -> None:
        implied = [t for t in _parents(target) if t not in here]  # they run first, unless already running
        for t in implied + ([target] if target != me else []):
            edges[t] = min(edges.get(t, line), line)  # the first line that imports it

    for node in ast.walk(syntax):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if ours(alias.name):
                    depend(alias.name, node.lineno)
                    if alias.asname:
                        bound[alias.asname] = alias.name
                    else:
                        bound[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = me if me in tree.packages else me.rpartition(".")[0]
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            if not ours(base):
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in tree.modules:
                    depend(sub, node.lineno)
                    bound[alias.asname or alias.name] = sub
                    continue
                depend(base, node.lineno)
                if _is_private(alias.name):
                    tree.private.append((me, node.lineno, base, alias.name))

    def module_of(expr: ast.expr) -> str | None:
        if isinstance(expr, ast.Name):
            return bound.get(expr.id)
        if isinstance(expr, ast.Attribute):
            outer = module_of(expr.value)
            if outer is not None and f"{outer}.{expr.attr}" in tree.modules:
                return f"{outer}.{expr.attr}"
        return None

    for node in ast.walk(syntax):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            owner = module_of(node.value)
            if owner is not None and owner != me and f"{owner}.{node.attr}" not in tree.modules:
                tree.private.append((me, node.lineno, owner, node.attr))


def find_cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle (a list of modules, first repeated last) per strongly connected component."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan; the graph has a few dozen nodes, recursion is fine
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)

    cycles = []
    for component in components:  # a shortest path from the component's first node back to it
        inside, start = set(component), component[0]
        came = {start: None}
        frontier = [start]
        while frontier and start not in [w for v in frontier for w in edges.get(v, {})]:
            nxt = []
            for v in frontier:
                for w in sorted(edges.get(v, {})):
                    if w in inside and w not in came:
                        came[w] = v
                        nxt.append(w)
            frontier = nxt
        last = next(v for v in frontier if start in edges.get(v, {}))
        path = [start]
        while last is not None:
            path.append(last)
            last = came[last]
        cycles.append(path[::-1])
    return cycles


def describe(tree: Tree, cycle: list[str]) -> str:
    steps = [cycle[0]]
    for a, b in zip(cycle, cycle[1:]):
        path = tree.modules[a]
        where = path.relative_to(ROOT) if path is not None else a
        steps.append(f"-> {b} ({where}:{tree.edges[a][b]})")
    return " ".join(steps)


@functools.lru_cache(maxsize=None)
def fastdata_tree() -> Tree:
    return scan(ROOT, "fastdata")


def test_no_import_cycle():
    tree = fastdata_tree()
    cycles = [describe(tree, c) for c in find_cycles(tree.edges)]
    assert not cycles, "import cycles:\n  " + "\n  ".join(cycles)


def _unit(tree: Tree, name: str) -> str:
    """The unit of the layout a module belongs to: its subpackage of fastdata (fastdata.image
    for fastdata.image.order), else itself (a module at the package root)."""
    parts = name.split(".")
    top = ".".join(parts[:2])
    return top if top in tree.packages and top != "fastdata" else name


def test_units_depend_one_way():
    """No subpackage or root module imports one that imports it back (backends/ above image/,
    not beside it): the module graph may have no cycle and still weave two packages together."""
    tree = fastdata_tree()
    uses: dict[str, dict[str, str]] = {}
    for importer, imported in tree.edges.items():
        a = _unit(tree, importer)
        for target in imported:
            b = _unit(tree, target)
            if a != b and b != "fastdata" and a != "fastdata":
                uses.setdefault(a, {}).setdefault(b, importer)
    both = sorted(f"{a} <-> {b} ({uses[a][b]} imports {b}; {uses[b][a]} imports {a})"
                  for a in uses for b in uses[a] if a < b and a in uses.get(b, {}))
    assert not both, "units that import each other:\n  " + "\n  ".join(both)


def _first_paragraph(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return doc.split("\n\n")[0]


def _states_reason(paragraph: str) -> bool:
    for sentence in re.split(r"(?<=[.!?])\s+", " ".join(paragraph.split())):
        if REASON.search(sentence) and len(REASON.sub("", sentence).split()) >= 5:
            return True
    return False


def test_long_modules_state_why():
    tree = fastdata_tree()
    long = {}
    for name, path in sorted(tree.modules.items()):
        if path is not None:
            lines = len(path.read_text().splitlines())
            if lines > LIMIT and not _states_reason(_first_paragraph(path)):
                long[str(path.relative_to(ROOT))] = lines
    assert not long, (f"modules over {LIMIT} lines without a reason ('Over 400 lines: <why>.' in the first "
                      f"paragraph of the docstring): {long}")


def _in(name: str, packages: tuple[str, ...]) -> bool:
    return any(name.startswith(p + ".") for p in packages)


def _listing(found: list[tuple[str, int, str, str]]) -> str:
    tree = fastdata_tree()
    return "\n  ".join(f"{tree.modules[me].relative_to(ROOT)}:{line}: {module}.{name}"
                       for me, line, module, name in found)


def test_backends_use_no_private_name_of_another_backend():
    found = [p for p in fastdata_tree().private if _in(p[0], BACKEND_PACKAGES) and _in(p[2], BACKEND_PACKAGES)]
    assert not found, "a backend uses another backend's private names:\n  " + _listing(found)


def test_no_private_name_crosses_a_module_line():
    found = fastdata_tree().private
    assert not found, "private names used from another module (make them public there):\n  " + _listing(found)


def test_no_private_member_used_from_another_module():
    """A protocol other modules rely on (the profiler's view of a loader) is public methods on a
    base class, not private members read from outside."""
    tree = fastdata_tree()
    found = [f"{tree.modules[me].relative_to(ROOT)}:{line}: {expr} (defined in {owners})"
             for me, line, expr, owners in sorted(tree.members)]
    assert not found, "private members of another module's classes:\n  " + "\n  ".join(found)


# ---------------------------------------------------------------- the rules on a small package


def _package(root: Path, files: dict[str, str]) -> Tree:
    for name, text in files.items():
        path = root / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return scan(root, "pkg")


@pytest.mark.parametrize("x, sub, cyclic", [
    ("from .y import f", "", False),  # a sibling: pkg is already in sys.modules
    ("from . import y", "", False),  # the submodule y, not the package
    ("import pkg.y", "", False),
    ("from . import f", "", True),  # the name f from pkg/__init__, which is importing x
    ("def g():\n    import pkg", "", True),  # a function-level import counts all the same
    ("def g():\n    from pkg.sub.z import h", "from ..y import f", False),
    ("def g():\n    from pkg.sub.z import h", "from ..x import g", True),  # importing pkg.sub.z runs pkg.sub
])
def test_rules(tmp_path, x, sub, cyclic):
    tree = _package(tmp_path, {
        "__init__.py": "from .x import g\nfrom .y import f\n",
        "x.py": x + "\n",
        "y.py": "def f(): pass\n",
        "sub/__init__.py": sub + "\n",
        "sub/z.py": "def h(): pass\n",
    })
    assert bool(find_cycles(tree.edges)) == cyclic, tree.edges


def test_rules_private_names(tmp_path):
    tree = _package(tmp_path, {
        "__init__.py": "",
        "_impl.py": "A = 1\n_b = 2\n",
        "a.py": "from . import _impl\nfrom ._impl import A\nX = _impl.A\n",
        "b.py": "from ._impl import _b\nimport pkg._impl as m\nY = m._b\n",
        "c.py": "class C:\n    def _hook(self): pass\n    def run(self): return self._hook()\n",
        "d.py": "class D:\n    def _own(self): pass\n\ndef f(c, d):\n    return c._hook(), d._own()\n",
    })
    assert sorted((me, module, name) for me, _, module, name in tree.private) == [
        ("pkg.b", "pkg._impl", "_b"), ("pkg.b", "pkg._impl", "_b")]
    assert [(me, expr) for me, _, expr, _ in tree.members] == [("pkg.d", "c._hook")]
    assert not _states_reason("A module. Over 400 lines.")
    assert _states_reason("A module.\nOver 400 lines: the walk and its resync share one state machine.")
