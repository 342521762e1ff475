"""`fastdata.profile` and `fastdata-profile`: is the training step waiting on its input?

- `measure`: `profile`, the three measurements (the loader alone with its stages timed, the
  step alone, the two together), the ceiling and the verdict;
- `model`: `RateModel`, images/s of another config from the stage costs;
- `advice`: what to change (each prediction measured before it is advised where the loader
  can be remade), and what bounds an input-bound step;
- `tune`: `tune`, the search over num_workers, prefetch_factor, backend and placement;
- `report`: `Report`, as text, in the terminal and as JSON, and the verdict's rule;
- `html`: the report as a self-contained HTML page, rendered from its JSON alone;
- `cli`: `fastdata-profile`; its docstring, the command's --help, says what each measurement
  is, how the verdict follows and where a tuned config is kept.

A fastdata Loader is timed, and remade to measure a change, through the profiling protocol
declared on `fastdata._loader.LoaderCore`; of a loader, nothing else is read but its public
attributes. The tuned configs live in `fastdata.tunecache`, which the factory reads without
this package.
"""

import sys as _sys

# `import fastdata` imported torch, unless this process is a help page's (`_needs_no_torch` in
# fastdata/__init__.py), which imports `cli` alone
if _sys.modules.get("torch") is not None:
    from .cli import main
    from .measure import profile
    from .model import RateModel
    from .report import Report
    from .tune import tune

__all__ = ["RateModel", "Report", "main", "profile", "tune"]
