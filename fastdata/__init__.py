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


def _command() -> str:
    """The name this process was started by: the script's file name, or the module `python -m`
    ran ("" where neither can be read). It is the element of the interpreter's own arguments just
    before the ones sys.argv holds after its first (`python -m` sets sys.argv[0] to "-m" while it
    imports this package); an embedded Python may have no argv."""
    argv, orig = getattr(_sys, "argv", []), getattr(_sys, "orig_argv", [])
    return _os.path.basename(orig[-len(argv)]) if argv and len(orig) >= len(argv) else ""


def _needs_no_torch() -> bool:
    """Whether this process is the `fastdata` command (or `python -m fastdata`) given `run`, or
    one of fastdata's commands asked for a help page (or `fastdata` given nothing). `fastdata
    run`'s launcher starts the command and waits for it, and needs neither torch nor the loader,
    whose import would be most of what `fastdata run` adds to a command's start (its command's
    processes import them as any other process does); a help page is its command's parser alone
    (each command module imports what needs torch where it runs, not at its import), and torch's
    import would be most of its time. argparse answers -h or --help wherever it stands before a
    `--`; --version prints torch's version."""
    args = getattr(_sys, "argv", [])[1:]
    command = _command()
    if command == "fastdata" and (args[:1] == ["run"] or not args):
        return True
    options = args[:args.index("--")] if "--" in args else args
    return command in _COMMANDS and bool({"-h", "--help"} & set(options)) and "--version" not in options


_COMMANDS = ("fastdata", "fastdata-demo", "fastdata-bench", "fastdata-profile", "fastdata-shard")


def _refused(message: str) -> BaseException:
    """What `import fastdata` raises where it cannot run: an ImportError, or, in one of fastdata's
    own commands (whose console script imports this package before the command's error
    handling), the command's one-line error, exit 1, without the import's traceback."""
    name = _command()
    if name in _COMMANDS:
        return SystemExit(f"{name}: error: ImportError: {message}")
    return ImportError(message)


if not _needs_no_torch():
    try:
        import torch
    except ImportError as e:  # torch is deliberately not a pip requirement: see pyproject.toml
        raise _refused(
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
        raise _refused(f"fastdata needs torch 2.6 or newer, but this is torch {torch.__version__}: upgrade it "
                       "(pip install -U torch, from the index of the CUDA build you use)")

    from ._collate import NATIVE as _NATIVE  # noqa: F401
    from . import samplers, transforms
    from ._loader import Loader
    from .errors import DataError
    from .factory import loader
    from .profiling import profile

__all__ = ["DataError", "Loader", "loader", "profile", "samplers", "transforms", "__version__"]
