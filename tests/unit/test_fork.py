"""A fork while another thread holds the interpreter's thread-state lock (CPython gh-112275).

A native thread that calls into Python without a thread state (gloo's under DDP, freeing a
collective's tensors) makes one under the interpreter's list lock before it takes the GIL, so
that lock may be held when a DataLoader worker forks. On 3.10 before 3.10.15 and 3.11 before
3.11.10 the child takes it before re-creating it and waits forever inside `os.fork()`; importing
fastdata guards against that (csrc/forksafe.c). The moment is made certain here: the script
holds the lock itself across `os.fork()`, as such a thread would, and says whether the child
ran."""

import os
import subprocess
import sys
import textwrap

import pytest

from fastdata._ext import native

pytestmark = pytest.mark.skipif(sys.version_info >= (3, 12),
                                reason="3.12 and later re-create the lock before the child takes it")

_SCRIPT = textwrap.dedent("""
    import ctypes, gc, os, signal, sys, time
    if sys.argv[1] == "guarded":
        import fastdata
        from fastdata._ext import native
        assert native.guard_fork() == 1
    api = ctypes.pythonapi
    api.PyInterpreterState_Main.restype = ctypes.c_void_p
    api.PyThread_acquire_lock.argtypes = [ctypes.c_void_p, ctypes.c_int]
    api.PyThread_release_lock.argtypes = [ctypes.c_void_p]
    runtime = ctypes.addressof(ctypes.c_char.in_dll(api, "_PyRuntime"))
    # 3.10 and 3.11: five ints and a pointer, then interpreters = {mutex, head, main, ...}
    mutex, main = (ctypes.c_void_p.from_address(runtime + offset).value for offset in (32, 48))
    assert mutex and main == api.PyInterpreterState_Main(), "not this interpreter's layout"
    gc.disable()  # nothing in this process may want the lock while this thread holds it
    api.PyThread_acquire_lock(mutex, 1)
    pid = os.fork()
    if pid == 0:
        os._exit(3)
    api.PyThread_release_lock(mutex)
    gc.enable()
    deadline = time.monotonic() + float(sys.argv[2])
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            print("exit", os.waitstatus_to_exitcode(status))
            break
        if time.monotonic() > deadline:  # stuck for good: the lock it waits for is never released
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            print("stuck")
            break
        time.sleep(0.01)
""")


def _fork_under_the_lock(how: str, wait: float) -> str:
    done = subprocess.run([sys.executable, "-c", _SCRIPT, how, str(wait)], capture_output=True, text=True, timeout=90,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.skipif(native is None, reason="the guard is part of the native extension")
@pytest.mark.timeout(120)
def test_a_child_forked_while_the_lock_is_held_runs():
    assert native.guard_fork() == 1  # installed at import, and again a no-op
    assert _fork_under_the_lock("guarded", 60) == "exit 3"


@pytest.mark.skipif(not (3, 11) <= sys.version_info < (3, 11, 10), reason="the interpreter has the fix")
@pytest.mark.timeout(120)
def test_without_the_guard_such_a_child_is_stuck_on_this_interpreter():
    """The other side of the test above: the same fork, fastdata not imported. The child exits
    in milliseconds when it can; 10 s without an exit is the lock that never comes."""
    assert _fork_under_the_lock("plain", 10) == "stuck"
