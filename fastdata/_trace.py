"""Named ranges in a torch profiler's trace (`fastdata.read`, `fastdata.collate`, ...).

NOTE: `torch.autograd.profiler.record_function` costs tens of microseconds a range even when no
profiler records, more than the stage timing may cost. So a range is entered only
while a profiler records in this process.
"""

from __future__ import annotations

import contextlib
from typing import ContextManager

import torch

from ._torch_internals import profiler_enabled


def trace_range(name: str) -> ContextManager:
    """`record_function(name)` while a torch profiler records, else a context that does nothing."""
    if profiler_enabled():
        return torch.autograd.profiler.record_function(name)
    return contextlib.nullcontext()
