"""fastdata: keeps GPUs fed during PyTorch training.

Public names: `loader` (the factory), `Loader` (what it returns), `transforms`, `samplers`
(weighted, repeat-factor and curriculum sampling), `DataError`, `profile` (is the training step
waiting on its input?).

They are imported on first use (PEP 562), so that a command that needs none of them (`fastdata
run`'s parent process, `--help`) does not pay torch's import: `import fastdata` checks only that
torch is installed, and loads the native extension (which warns once when it is not built).
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if importlib.util.find_spec("torch") is None:  # torch is deliberately not a pip requirement: see pyproject.toml
    raise ImportError(
        "fastdata needs PyTorch, but it is not installed; install torch first, then fastdata. "
        "On a machine without an NVIDIA GPU, the CPU wheel: "
        "pip install torch --index-url https://download.pytorch.org/whl/cpu "
        "(a plain `pip install torch` on Linux fetches the CUDA build, GBs of CUDA libraries); "
        "on a GPU machine, that CUDA build: pip install torch"
    )

from . import _ext  # noqa: E402,F401  (the native extension, or its one warning)

if TYPE_CHECKING:
    from . import samplers, transforms
    from ._loader import Loader
    from .errors import DataError
    from .factory import loader
    from .profiling import profile

__all__ = ["DataError", "Loader", "loader", "profile", "samplers", "transforms", "__version__"]

# public name -> the module that defines it (None: the name is a submodule)
_PUBLIC = {"DataError": ".errors", "Loader": "._loader", "loader": ".factory", "profile": ".profiling",
           "samplers": None, "transforms": None}


def __getattr__(name: str) -> Any:
    """A public name, or a submodule (`fastdata.shard`), imported on first use."""
    if name in _PUBLIC:
        where = _PUBLIC[name]
        value = importlib.import_module(f".{name}" if where is None else where, __name__)
        value = value if where is None else getattr(value, name)
    elif not name.startswith("__") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
