"""fastdata: keeps GPUs fed during PyTorch training.

Public names: `loader` (the factory), `Loader` (what it returns), `transforms`, `DataError`,
`profile` (is the training step waiting on its input?).
"""

__version__ = "0.1.0"

try:
    import torch  # noqa: F401
except ImportError as e:  # torch is deliberately not a pip requirement: see pyproject.toml
    raise ImportError(
        "fastdata needs PyTorch, but it is not installed; install torch first "
        "(pip install torch), then fastdata"
    ) from e

from ._collate import NATIVE as _NATIVE  # noqa: F401
from . import transforms
from .backends.base import Loader
from .errors import DataError
from .factory import loader
from .profiling import profile

__all__ = ["DataError", "Loader", "loader", "profile", "transforms", "__version__"]
