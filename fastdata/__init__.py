"""fastdata: keeps GPUs fed during PyTorch training.

Public names: `loader` (the factory), `Loader` (what it returns), `transforms`, `samplers`
(weighted, repeat-factor and curriculum sampling), `DataError`, `profile` (is the training step
waiting on its input?).

They are imported here, not on first use: Lightning records how a DataLoader subclass was built
(to rebuild it with a DistributedSampler) only for the subclasses that exist when it asks a
module for its loaders, so the drop-in loader's class must exist once `import fastdata` returns,
or a `fastdata.loader(...)` inside `train_dataloader()` is rebuilt from its attributes alone
(tests/contract/test_frameworks.py, `test_lightning_fit[ddp-dropin]`).
"""

__version__ = "0.1.0"

import os as _os
import re as _re
import sys as _sys


def _launches_a_run() -> bool:
    """Whether this process is `fastdata run`'s launcher: the `fastdata` command (or `python -m
    fastdata`) given `run`. It starts the command and waits for it, and needs neither torch nor
    the loader, whose import would be most of what `fastdata run` adds to a command's start; its
    command's processes import them as any other process does."""
    argv, orig = getattr(_sys, "argv", []), getattr(_sys, "orig_argv", [])  # (an embedded Python may have no argv)
    # (the element of the interpreter's own arguments just before the ones sys.argv holds after
    # its first: the script's path, or the module -m ran; `python -m` sets sys.argv[0] to "-m"
    # while it imports this package)
    return argv[1:2] == ["run"] and len(orig) >= len(argv) and _os.path.basename(orig[-len(argv)]) == "fastdata"


if not _launches_a_run():
    try:
        import torch
    except ImportError as e:  # torch is deliberately not a pip requirement: see pyproject.toml
        raise ImportError(
            "fastdata needs PyTorch, but it is not installed; install torch first, then fastdata. "
            "On a machine without an NVIDIA GPU, the CPU wheel: "
            "pip install torch --index-url https://download.pytorch.org/whl/cpu "
            "(a plain `pip install torch` on Linux fetches the CUDA build, GBs of CUDA libraries); "
            "on a GPU machine, that CUDA build: pip install torch"
        ) from e
    # DataLoader's `in_order` and `torch.accelerator` came with 2.6; an older torch would fail at
    # the first loader with an AttributeError, and under `fastdata run` would break the script
    # (this error switches the hook off instead, and the script runs as it is).
    if tuple(int(n) for n in _re.findall(r"\d+", torch.__version__)[:2]) < (2, 6):
        raise ImportError(f"fastdata needs torch 2.6 or newer, but this is torch {torch.__version__}: upgrade it "
                          "(pip install -U torch, from the index of the CUDA build you use)")

    from ._collate import NATIVE as _NATIVE  # noqa: F401
    from . import samplers, transforms
    from ._loader import Loader
    from .errors import DataError
    from .factory import loader
    from .profiling import profile

__all__ = ["DataError", "Loader", "loader", "profile", "samplers", "transforms", "__version__"]
