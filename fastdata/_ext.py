"""The native extension (`fastdata._native`), or None: the one place it is imported.

None when FASTDATA_DISABLE_NATIVE is set (to anything but "", "0", "false" or "no"), or when it
is not built or does not load (a pure-Python wheel, made where there was no C++17 compiler or no
CMake; a source checkout never compiled): then one warning, here, says how to get it, and
callers take their Python fallback.

Imported, it also guards every later fork of this process against CPython gh-112275, where the
interpreter has it (3.10 before 3.10.15, 3.11 before 3.11.10): a worker forked while one of
torch's native threads (gloo's, under DDP) makes its Python thread state would wait forever
inside `os.fork()` (csrc/forksafe.c). Without the extension there is no guard.
"""

from __future__ import annotations

import importlib.util
import os
import warnings
from typing import Any

native: Any = None
if os.environ.get("FASTDATA_DISABLE_NATIVE", "0").lower() in ("", "0", "false", "no"):
    try:
        from . import _native as native
    except ImportError as e:
        # Importing a missing submodule while the package initialises reads as a circular import:
        # say "not built" for that, and the loader's own error for a built module that fails.
        built = importlib.util.find_spec(f"{__package__}._native") is not None
        warnings.warn(
            f"fastdata's native extension {f'does not load ({e})' if built else 'is not built'}, so batches "
            "are collated in Python and JPEGs decoded with Pillow, more slowly. For the native one: from a checkout, "
            "`bash scripts/install.sh`; or install a C++17 compiler and CMake 3.18+ and reinstall "
            "fastdata (pip install .)", RuntimeWarning, stacklevel=2)
if native is not None:
    native.guard_fork()
