"""Python 3.14's multiprocessing defaults on an older Python, for tests that run a process with
this folder on PYTHONPATH (site imports `sitecustomize` at start-up): on Linux 3.14 the default
start method is "forkserver" and `get_all_start_methods()` lists the default first. Nothing
else changes: fork, forkserver and spawn stay what this Python's are."""

import multiprocessing
import multiprocessing.context as _context

_ORDER = ["forkserver", "fork", "spawn"]
_context._default_context._default_context = _context._concrete_contexts["forkserver"]
_context.DefaultContext.get_all_start_methods = lambda self: list(_ORDER)
multiprocessing.get_all_start_methods = lambda: list(_ORDER)
