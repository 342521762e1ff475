"""The `sitecustomize` that `fastdata run` puts first on the child's PYTHONPATH.

Every Python process of the command (the script, torchrun's ranks, spawned workers) runs it at
start-up. It imports nothing heavy: it waits for `torch` to be imported, then has
`fastdata.run._hook` replace `torch.utils.data.DataLoader`. A process that never imports torch
pays one finder lookup. The `sitecustomize` this one shadows (the next on sys.path) still runs.
"""

import importlib.util
import os
import sys


class _AfterTorch:
    """A meta-path finder that wraps the loading of the `torch` package: once torch's own
    `__init__` has run, the hook is installed (torch is whole by then, so fastdata can import it)."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        real = spec.loader.exec_module

        def exec_module(module):
            real(module)
            try:
                from fastdata.run._hook import install

                install()
            except Exception as e:  # no fastdata in this interpreter, say: torch's own DataLoader
                # A line, not a warning: a process run with -W error (pytest's filterwarnings) would
                # raise it from its `import torch`, which runs without fastdata run.
                sys.stderr.write(f"fastdata run: the hook is off in {sys.executable}: {type(e).__name__}: {e}\n")

        spec.loader.exec_module = exec_module  # this loader instance loads torch alone
        return spec


def _chain() -> None:
    """Runs the sitecustomize that this one shadows, if there is one, as `import sitecustomize`
    would have: it is then `sys.modules["sitecustomize"]`, so that a script that imports it by
    name gets its own (this module's functions keep what they need)."""
    here = os.path.dirname(os.path.abspath(__file__))
    mine = sys.modules.pop("sitecustomize", None)
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    theirs = None
    try:
        spec = importlib.util.find_spec("sitecustomize")
        if spec is not None and spec.loader is not None:
            theirs = importlib.util.module_from_spec(spec)
            sys.modules["sitecustomize"] = theirs
            try:
                spec.loader.exec_module(theirs)
            except BaseException:  # (site.py reports it; a failed import leaves no module behind)
                theirs = None
                raise
    finally:
        sys.path[:] = saved
        if theirs is None:
            sys.modules.pop("sitecustomize", None)
            if mine is not None:
                sys.modules["sitecustomize"] = mine


if os.environ.get("FASTDATA_RUN_DIR") and "torch" not in sys.modules:
    sys.meta_path.insert(0, _AfterTorch())
_chain()
