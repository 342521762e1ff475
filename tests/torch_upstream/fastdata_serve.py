"""Serves the DataLoaders that PyTorch's test_dataloader.py builds by `fastdata.loader`.

`serve(module)` rebinds the module's `DataLoader` name, which nearly every test calls. A few
tests call `torch.utils.data.DataLoader(...)` instead: the harness patches that attribute for
the length of each test in its own process, and `serve_process` patches it for good in a
process that exists only to run a test (the vendored module calls it there on import).
"""

import inspect
import sys
import types

import torch.utils.data

import fastdata

SIGNATURE = inspect.signature(torch.utils.data.DataLoader)


class ServedDataLoader:
    """Stands where the tests name DataLoader: `ServedDataLoader(dataset, ...)` returns
    `fastdata.loader(dataset, ...)` with the same arguments, positional ones bound to
    DataLoader's parameter names (an argument DataLoader does not take raises its TypeError)."""

    def __new__(cls, *args, **kwargs):
        arguments = dict(SIGNATURE.bind(*args, **kwargs).arguments)
        return fastdata.loader(arguments.pop("dataset"), **arguments)

    # `DataLoader[List[Tensor]]` in an annotation, as DataLoader is Generic.
    __class_getitem__ = classmethod(types.GenericAlias)


def serve(module):
    """`module.DataLoader(...)` builds a fastdata loader from now on."""
    module.DataLoader = ServedDataLoader


def serve_process(module):
    """`serve`, and `torch.utils.data.DataLoader` too, for the rest of this process."""
    serve(module)
    torch.utils.data.DataLoader = ServedDataLoader


def check_served():
    """Raises unless this process builds fastdata loaders for the vendored module's DataLoader
    and for torch.utils.data.DataLoader. Meant as the target of a process the vendored module
    spawns (which has imported it, as `test_dataloader`, by then)."""
    module = sys.modules["test_dataloader"]
    if module.DataLoader is not ServedDataLoader or torch.utils.data.DataLoader is not ServedDataLoader:
        raise RuntimeError("this process builds torch's DataLoader, not fastdata's")
