"""PyTorch's own DataLoader tests (test/test_dataloader.py of PyTorch, a copy put beside this harness) with every
DataLoader(...) they build served by `fastdata.loader(...)`.

The vendored module is imported under its own name (the processes it spawns, and its
`self_module`, import it by that name), its `DataLoader` is rebound to a shim that calls
`fastdata.loader`, and each of its TestCase classes is collected here through a subclass of
the same name. During each test `torch.utils.data.DataLoader` is the shim too, and
FASTDATA_UPSTREAM_SHIM=1 makes a process the tests spawn serve its DataLoaders the same way.
What is not run as upstream wrote it is in NOT_RUN, each with why.

FASTDATA_TORCH_BASELINE=1 runs the same tests, NOT_RUN included, on torch's DataLoader: what
passes on this machine at all.
"""

import functools
import os
import sys
import tempfile
import unittest

import pytest
import torch.backends
import torch.utils.data

_HERE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "torch_upstream")
# PyTorch's test file is PyTorch's code, not vendored here: the harness runs a copy put beside
# it (git ignores it), or the one FASTDATA_TORCH_TESTS names, e.g. test/test_dataloader.py of
# a pytorch checkout at the installed torch's version.
_SOURCE = os.environ.get("FASTDATA_TORCH_TESTS", os.path.join(_HERE, "test_dataloader.py"))
if not os.path.exists(_SOURCE):
    pytest.skip(f"PyTorch's test/test_dataloader.py is not at {_SOURCE}: put a copy there (or name it in "
                "FASTDATA_TORCH_TESTS) to run it against fastdata.loader", allow_module_level=True)
pytest.importorskip("expecttest", reason="torch's test utilities import expecttest (pip install expecttest)")

# The copy that runs: the file, plus the hook by which a process it spawns (ErrorTrackingProcess,
# spawn-context workers), which imports it afresh by name, serves DataLoader by fastdata.loader
# too while FASTDATA_UPSTREAM_SHIM=1 (set during each test).
_SERVED = tempfile.mkdtemp(prefix="fastdata-torch-tests-")
with open(_SOURCE) as f:
    _text = f.read()
with open(os.path.join(_SERVED, "test_dataloader.py"), "w") as f:
    f.write(_text + '\n\nif os.environ.get("FASTDATA_UPSTREAM_SHIM") == "1":\n'
            '    import fastdata_serve\n    fastdata_serve.serve_process(sys.modules[__name__])\n')
sys.path[:0] = [_SERVED, _HERE]

import fastdata_serve  # noqa: E402

# torch's test utilities, on import, forbid setting torch.backends flags (cudnn.benchmark, ...)
# for the rest of the process, which here runs the rest of this suite (a Lightning Trainer given
# benchmark= sets cudnn.benchmark): that one call is made a no-op while they are imported.
_freeze_flags = torch.backends.disable_global_flags
torch.backends.disable_global_flags = lambda: None
try:
    import test_dataloader as upstream
finally:
    torch.backends.disable_global_flags = _freeze_flags

BASELINE = os.environ.get("FASTDATA_TORCH_BASELINE") == "1"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

_PRIVATE = "DataLoader internals a fastdata loader need not have: "
_SLOW = "too slow for CI on 2 cores (spawned workers, each importing torch); "

# "Class.test" -> (what, why). "xfail": the test reads DataLoader's private internals; it runs,
# and may fail only by the AttributeError of the missing attribute. "skip": not run.
NOT_RUN = {
    "TestDataLoader.test_partial_workers": ("xfail", _PRIVATE + "reads the iterator's _workers"),
    "TestDataLoaderPersistentWorkers.test_partial_workers": ("xfail", _PRIVATE + "reads the iterator's _workers"),
    # Everything before it (the warning past an IterableDataset's len included) is checked.
    "TestDataLoader.test_iterable_style_dataset": ("xfail", _PRIVATE + "reads the iterator's _workers"),
    "TestDataLoaderPersistentWorkers.test_iterable_style_dataset": (
        "xfail", _PRIVATE + "reads the iterator's _workers"),
    "TestDataLoader.test_get_worker_info": (
        "skip", "fails on torch 2.13's own DataLoader (WorkerInfo is a frozen dataclass: assigning "
        "raises FrozenInstanceError, not the RuntimeError the test expects); also reads the "
        "iterator's private _workers"),
    "TestDataLoaderPersistentWorkers.test_get_worker_info": (
        "skip", "fails on torch 2.13's own DataLoader (see TestDataLoader.test_get_worker_info)"),
    "IntegrationTestDataLoaderDataPipe.test_shuffler_iterdatapipe": (
        "skip", _SLOW + "90 s alone: 60 passes of spawned workers"),
    "TestDataLoaderPersistentWorkers.test_multiprocessing_contexts": (
        "skip", _SLOW + "TestDataLoader.test_multiprocessing_contexts runs every context"),
    "TestDataLoaderPersistentWorkers.test_multiprocessing_iterdatapipe": (
        "skip", _SLOW + "TestDataLoader.test_multiprocessing_iterdatapipe runs every context"),
}


def _not_run(test, what, why):
    @functools.wraps(test)
    def run(self):
        return test(self)

    if what == "xfail":
        return pytest.mark.xfail(raises=AttributeError, reason=why, strict=False)(run)
    return unittest.skip(why)(run)


def _collect(module):
    """Each TestCase class `module` defines, as a subclass of the same name with NOT_RUN applied."""
    found = {}
    for name, cls in vars(module).items():
        if isinstance(cls, type) and issubclass(cls, unittest.TestCase) and cls.__module__ == module.__name__:
            overrides = {}
            for key, (what, why) in NOT_RUN.items():
                owner, test = key.split(".")
                if owner == name and not BASELINE:
                    overrides[test] = _not_run(getattr(cls, test), what, why)
            found[name] = type(name, (cls,), overrides)
    return found


@pytest.fixture(autouse=True)
def _serve_by_fastdata(monkeypatch):
    if not BASELINE:
        monkeypatch.setattr(torch.utils.data, "DataLoader", fastdata_serve.ServedDataLoader)
        monkeypatch.setenv("FASTDATA_UPSTREAM_SHIM", "1")
    yield


def test_dataloaders_are_fastdata_loaders():
    """What the tests build is fastdata's: in this process, through either name, and in a
    process they spawn."""
    if BASELINE:
        pytest.skip("FASTDATA_TORCH_BASELINE=1 runs the tests on torch's DataLoader")
    for build in (upstream.DataLoader, torch.utils.data.DataLoader):
        loader = build(upstream.CountingDataset(4), 2)
        assert loader.backend == "torch"
        assert [b.tolist() for b in loader] == [[0, 1], [2, 3]]
    child = upstream.ErrorTrackingProcess(target=fastdata_serve.check_served)
    child.start()
    child.join(upstream.JOIN_TIMEOUT)
    assert child.exitcode == 0, child.exception


if not BASELINE:
    fastdata_serve.serve(upstream)
globals().update(_collect(upstream))
