"""The optional parts fastdata uses where they are installed: DALI, Ray, Kornia, Pillow. Every
probe for them is here, and none can raise.

`importlib.util.find_spec` of a dotted name (DALI's is `nvidia.dali`) imports the parent
package first, and raises ModuleNotFoundError where no `nvidia` package exists at all (a
CPU-only torch brings none; the CUDA build brings the namespace with its libraries, but not
DALI). So a dotted name is probed a part at a time, and any error of a broken install counts as
missing. A probe finds the package without importing it (DALI's import alone takes about a
second), and is not cached: once the package is imported, finding it again is a dict lookup.
"""

from __future__ import annotations

import importlib.util
from typing import NamedTuple


class Part(NamedTuple):
    module: str  # what `import` names
    name: str  # what a user calls it
    adds: str  # the command that installs it, from a checkout


PARTS = {
    "dali": Part("nvidia.dali", "NVIDIA DALI",
                 "bash scripts/install.sh --dali (or pip install '.[dali]' in fastdata's checkout)"),
    "ray": Part("ray", "Ray", "bash scripts/install.sh --ray (or pip install '.[ray]' in fastdata's checkout)"),
    "kornia": Part("kornia", "Kornia", "pip install '.[gpu]' in fastdata's checkout"),
    "pillow": Part("PIL", "Pillow", "pip install pillow (or, from a checkout of fastdata, bash scripts/install.sh, "
                   "which builds Pillow-SIMD)"),
}


def has(part: str) -> bool:
    """Whether the optional part ("dali", "ray", "kornia", "pillow") is installed."""
    return _findable(PARTS[part].module)


def _findable(module: str) -> bool:
    names = module.split(".")
    for k in range(1, len(names) + 1):
        try:
            if importlib.util.find_spec(".".join(names[:k])) is None:
                return False
        except Exception:  # a parent that fails to import, a broken spec: not usable
            return False
    return True


def missing(part: str, what: str) -> str:
    """One line: what is missing for `what`, and the command that adds it."""
    p = PARTS[part]
    return f"{what}: {p.name} is not installed; {p.adds} adds it"


def require(part: str, what: str) -> None:
    """Raises RuntimeError with `missing`'s line when the part is not installed."""
    if not has(part):
        raise RuntimeError(missing(part, what))


def require_pillow(what: str) -> None:
    """ImportError, one line saying that fastdata needs Pillow `what` and how to install it, where
    it is not installed. Pillow is not among the package's requirements (Pillow-SIMD, which
    scripts/install.sh builds, installs the same files under another name, so a requirement on
    `pillow` would bring stock Pillow back over it), and much of fastdata runs without it: the
    drop-in, `fastdata run` of any other Dataset, JPEGs the native decoder takes. So, as for torch,
    an ImportError rather than `require`'s RuntimeError; and a path that needs it checks first,
    outside any handler of a file's errors: a missing library is no file's fault, and
    on_error="skip" must not skip every file it would read."""
    if not has("pillow"):
        raise ImportError(f"Pillow is not installed, and fastdata needs it {what}: {PARTS['pillow'].adds}")
