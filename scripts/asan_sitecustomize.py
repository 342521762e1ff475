# Copied by scripts/sanitize.sh as the sanitized run's sitecustomize.py: every Python process that
# run starts (pytest, its DataLoader workers, subprocesses) runs it first.
import ctypes
import os
import sys
import threading
import time

# 1. The editable install's import hook would send `fastdata` to the checkout (and its _native to
#    site-packages): dropped, so that `fastdata` resolves through sys.path to the copy beside this
#    file, with the sanitized extension.
sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "ScikitBuildRedirectingFinder"]

# 2. Forks made safe from the sanitizer's own locks. GCC 12's libasan takes no allocator lock
#    around fork() (glibc's malloc does; compiler-rt gained it later): a child forked while another
#    thread of the parent holds one of ASan's allocator locks (a thread starting or ending does, e.g.
#    a finished DataLoader's queue feeder, or pytest-timeout's per-test timer) waits on that lock for
#    ever at its first thread or allocation (a parent that starts and ends threads beside its forks
#    hangs some children under ASan, none without it). So before each os.fork (multiprocessing's
#    included), wait until no other thread of this process is running: one that holds such a lock
#    is running (state R), as it holds it only while it works.
#    The check and the fork happen with the GIL held throughout (libc's calls through PyDLL keep it,
#    and the switch interval is raised so the interpreter does not hand it over): a Python thread
#    seen asleep cannot wake into the allocator before the fork. At most 2 s, then a line on stderr
#    names the running threads and the fork goes ahead: a test's own thread left running shows there.
_libc = ctypes.PyDLL(None)
_libc.open.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.read.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
_libc.read.restype = ctypes.c_ssize_t
_stat = ctypes.create_string_buffer(1024)
_interval = sys.getswitchinterval()


def _running(tid: bytes) -> bool:
    fd = _libc.open(b"/proc/self/task/" + tid + b"/stat", os.O_RDONLY)
    if fd < 0:
        return False  # it ended meanwhile
    n = _libc.read(fd, _stat, len(_stat))
    _libc.close(fd)
    fields = _stat.raw[: max(n, 0)].rsplit(b")", 1)[-1].split()  # "tid (comm) STATE ...": comm may hold ")"
    return bool(fields) and fields[0] != b"S"


def _name(tid: bytes) -> str:
    try:
        with open(b"/proc/self/task/" + tid + b"/comm", "rb") as f:
            return f.read().strip().decode(errors="replace")
    except OSError:
        return tid.decode()


def _settle() -> None:
    global _interval
    _interval = sys.getswitchinterval()
    sys.setswitchinterval(100.0)
    me = str(threading.get_native_id()).encode()
    deadline = time.monotonic() + 2.0
    while True:
        running = [tid for tid in os.listdir(b"/proc/self/task") if tid != me and _running(tid)]
        if not running:
            return
        if time.monotonic() > deadline:
            print(f"asan_sitecustomize: forking while threads {[_name(t) for t in running]} still run", file=sys.stderr)
            return
        time.sleep(0.0005)


def _resume() -> None:
    sys.setswitchinterval(_interval)


os.register_at_fork(before=_settle, after_in_parent=_resume, after_in_child=_resume)
