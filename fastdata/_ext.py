"""The native extension (`fastdata._native`), or None: the one place it is imported.

None when FASTDATA_DISABLE_NATIVE is set (to anything but "", "0", "false" or "no") or when it
is not built (a source checkout never compiled: one warning, here); callers then take their
Python fallback.
"""

from __future__ import annotations

import logging
import os
from typing import Any

native: Any = None
if os.environ.get("FASTDATA_DISABLE_NATIVE", "0").lower() in ("", "0", "false", "no"):
    try:
        from . import _native as native
    except ImportError as e:
        logging.getLogger("fastdata").warning(
            "fastdata's native extension is not built (%s); using the Python fallback", e)
