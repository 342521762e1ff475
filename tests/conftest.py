"""Shared helpers for the fastdata tests: batch-stream comparison, cloning, worker checks, and
the skips of `gpu` and `dali` tests where no CUDA device or no DALI is present."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import collections.abc  # noqa: E402
import faulthandler  # noqa: E402
import functools  # noqa: E402
import gc  # noqa: E402
import multiprocessing  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import types  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


def assert_same(a, b, path="batch"):
    """a and b are the same batch: same container types and nesting, tensors with the same
    dtype, shape and values, other leaves equal (and of the same type)."""
    assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype, f"{path}: dtype {a.dtype} != {b.dtype}"
        assert a.shape == b.shape, f"{path}: shape {tuple(a.shape)} != {tuple(b.shape)}"
        assert a.device == b.device, f"{path}: device {a.device} != {b.device}"
        assert torch.equal(a, b), f"{path}: values differ"
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert np.array_equal(a, b), f"{path}: values differ"
    elif isinstance(a, (str, bytes)):
        assert a == b, f"{path}: {a!r} != {b!r}"
    elif isinstance(a, collections.abc.Mapping):
        assert list(a.keys()) == list(b.keys()), f"{path}: keys {list(a)} != {list(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b), f"{path}: len {len(a)} != {len(b)}"
        if hasattr(a, "_fields"):
            assert a._fields == b._fields, path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def assert_same_stream(got, want):
    assert len(got) == len(want), f"{len(got)} batches != {len(want)} batches"
    for i, (g, w) in enumerate(zip(got, want)):
        assert_same(g, w, f"batch {i}")


def clone(data):
    """A deep copy of a batch whose tensors own fresh memory."""
    if isinstance(data, torch.Tensor):
        return data.clone()
    if isinstance(data, (str, bytes)):
        return data
    if isinstance(data, collections.abc.Mapping):
        return type(data)({k: clone(v) for k, v in data.items()})
    if isinstance(data, tuple):
        if hasattr(data, "_fields"):
            return type(data)(*(clone(v) for v in data))
        return tuple(clone(v) for v in data)
    if isinstance(data, list):
        return [clone(v) for v in data]
    return data


def take(iterator, n):
    """The next n batches of `iterator`, cloned (so no buffer of the loader is held)."""
    out = []
    for _ in range(n):
        batch = next(iterator)
        out.append(clone(batch))
        del batch
    return out


def collect(loader):
    """One epoch of `loader`, each batch cloned and the original dropped at once."""
    out = []
    for batch in loader:
        out.append(clone(batch))
        del batch
    return out


def new_children(before, timeout=10.0):
    """Child processes not in `before` still alive after waiting up to `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        gc.collect()
        alive = [p for p in multiprocessing.active_children() if p.pid not in before]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


@functools.cache
def _missing(marker: str) -> str | None:
    """Why tests marked `marker` cannot run here, or None when they can."""
    if marker == "gpu":
        return None if torch.cuda.is_available() else "needs a CUDA device"
    try:  # imported only when a dali test is about to run, as pytest.importorskip would
        import nvidia.dali  # noqa: F401
    except ImportError as e:
        return f"needs NVIDIA DALI ({e})"
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Every thread's stack, by faulthandler, 10 s before the test's own time limit (its
    @pytest.mark.timeout, else the configured one) ends it: to pytest's stderr, not captured."""
    marker = item.get_closest_marker("timeout")
    limit = marker.args[0] if marker is not None and marker.args else (marker.kwargs.get("timeout") if marker else None)
    limit = float(limit if limit is not None else item.config.getini("timeout") or 0)
    if limit <= 0:
        yield
        return
    try:
        from _pytest.faulthandler import fault_handler_stderr_fd_key
        stderr = item.config.stash[fault_handler_stderr_fd_key]
    except (ImportError, KeyError):
        stderr = sys.__stderr__
    faulthandler.dump_traceback_later(max(limit - 10, 1), file=stderr)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
        for pid in _child_pids():
            _SEEN_AFTER.setdefault(pid, item.nodeid)


# Child pid -> the first test after which it was seen alive: a failing test's report says which
# test left the processes it finds, and what each is doing.
_SEEN_AFTER: dict[int, str] = {}


def _child_pids() -> list[int]:
    """This process's children, read from /proc (not multiprocessing's `active_children`, which
    reaps those that ended: a test may yet read their exit through `waitid`)."""
    pids = []
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children") as f:
                pids += map(int, f.read().split())
    except OSError:
        pass
    return pids


def _child_state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
        with open(f"/proc/{pid}/wchan") as f:
            wchan = f.read()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            command = f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
    except OSError as e:
        return f"unreadable ({e.strerror})"
    keys = ("Name", "State", "Threads", "SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")
    return " ".join(f"{k}={fields.get(k, '?').strip()}" for k in keys) + f" wchan={wchan} command: {command}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test's report lists the child processes alive at its end: the test whose end
    first saw each, and its state."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and (pids := _child_pids()):
        lines = [f"pid {pid}: seen after {_SEEN_AFTER.get(pid, 'this test')}; {_child_state(pid)}" for pid in pids]
        report.sections.append(("live child processes", "\n".join(lines)))


def pytest_runtest_setup(item):
    for marker in ("gpu", "dali"):
        if item.get_closest_marker(marker) is not None and (reason := _missing(marker)):
            pytest.skip(reason)


@pytest.fixture(autouse=True)
def _quiet_pin_memory_warning():
    # Without an accelerator, DataLoader warns that pin_memory has nothing to pin for.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*pin_memory.*")
        yield


@pytest.fixture
def h():
    """The helpers above, for the test modules (which should not import conftest)."""
    return types.SimpleNamespace(
        assert_same=assert_same,
        assert_same_stream=assert_same_stream,
        clone=clone,
        take=take,
        collect=collect,
        new_children=new_children,
    )
