"""Faults end in a clear error or a clean stop, in bounded time, with nothing left behind.

Each case checks the process table (no worker of the loader alive, stopped or orphaned
afterwards) and /dev/shm (no segment left). The DALI cases check that a loader that used a
DALI pipeline leaves no thread of it behind, so that worker processes forked later (by
fastdata or by torch's own DataLoader) cannot inherit a half-alive pipeline."""

import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import weakref

import pytest
import torch

import fastdata
from _images import color_folder
from fastdata import _workers
from fastdata import transforms as T


def _shm():
    return set(os.listdir("/dev/shm"))


def _alive(pid):
    """Whether `pid` is a live process (running or stopped, not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _threads():
    return len(os.listdir("/proc/self/task"))


def _children():
    import multiprocessing

    return {p.pid for p in multiprocessing.active_children()}


@pytest.fixture
def clean():
    """Asserts, after the test, that no child process it started is alive and /dev/shm holds
    nothing new."""
    gc.collect()
    before, shm = _children(), _shm()
    yield
    gc.collect()
    deadline = time.monotonic() + 10
    while (_children() - before) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not (_children() - before), "a worker process is still alive"
    left = {n for n in _shm() - shm if n.startswith(("torch_", "psm_", "fastdata"))}
    assert not left, f"left in /dev/shm: {sorted(left)}"


class Slow(torch.utils.data.Dataset):
    """Sample i is i; sample `stuck` sleeps far beyond any limit in a test."""

    def __init__(self, n=64, stuck=-1):
        self.n, self.stuck = n, stuck

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.stuck:
            time.sleep(3600)
        return torch.full((16,), float(i))


class Raises(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        if i == 20:
            raise ValueError("sample 20 is broken")
        return torch.full((16,), float(i))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return color_folder(tmp_path_factory.mktemp("imgs"), 5, 20, (40, 90), lambda i: f"{i:03d}.jpg")


def _image_ids(images, labels):
    x = images.float()
    r, g = x[:, 0].mean((1, 2)), x[:, 1].mean((1, 2))
    cls, num = torch.round((r - 20) / 40).long(), torch.round((g - 10) / 12).long()
    assert torch.equal(cls, labels)
    return (cls * 20 + num).tolist()


def _image_loader(folder, **kw):
    kw.setdefault("batch_size", 16)
    return fastdata.loader(str(folder), transform=T.Compose([T.RandomResizedCrop(24)]), **kw)


# --------------------------------------------------------------- dead, stopped and stuck workers


def _a_pass_one_batch_in(folder, kind):
    """(loader, its pass after one batch, the pass's 2 worker pids) of the drop-in or image mode;
    25 batches of 4, so that a worker killed after the first still has batches of the pass to
    make (of 7 batches of 16 small images, a worker may have made all its own by then)."""
    before = _children()
    loader = fastdata.loader(Slow(), batch_size=4, num_workers=2) if kind == "dropin" else \
        _image_loader(folder, num_workers=2, batch_size=4)
    it = iter(loader)
    next(it)
    workers = sorted(_children() - before)
    assert len(workers) == 2
    return loader, it, workers


@pytest.mark.parametrize("kind", ["dropin", "image"])
def test_worker_killed_mid_epoch_is_an_error_at_once(folder, kind, clean):
    """A worker SIGKILLed from outside: the error comes at once, and says that the out-of-memory
    killer did not send the signal where this cgroup's count of its kills can be read."""
    from fastdata._memory import oom_kills

    loader, it, workers = _a_pass_one_batch_in(folder, kind)
    t = time.monotonic()
    error = _error_of_pass_after_kill(it, workers[0])
    assert time.monotonic() - t < 10
    cause = "sent neither by fastdata nor by the kernel's out-of-memory killer" if oom_kills() is not None else \
        "not sent by fastdata; the kernel's out-of-memory killer sends it"
    assert f"SIGKILL, {cause}" in str(error)
    del it, loader


def _error_of_pass_after_kill(it, pid):
    """The error the pass `it` raises once its worker `pid` is SIGKILLed from here. torch's
    SIGCHLD handler raises its own error wherever this thread is when the worker dies: mostly in
    the pass's wait, else (on a busy machine) at any line before it, the kill's included, and the
    pass raises once more (fastdata's watchdog sends the signal again). Only the pass's error
    names the signal's sender ("SIGKILL, ..."); any other error is passed over, for 10 s."""
    deadline, killed = time.monotonic() + 10, False
    while True:
        try:
            if not killed:
                killed = True
                os.kill(pid, signal.SIGKILL)
            for _ in it:
                pass
            return None
        except RuntimeError as e:
            assert "killed by signal" in str(e) or "exited unexpectedly" in str(e), e
            if "SIGKILL, " in str(e) or time.monotonic() > deadline:
                return e


def _writable_memory_cgroup():
    """This process's own cgroup v1 memory folder, where root may make a child with a limit."""
    from fastdata._cores import cgroup_folders

    for v2, path in cgroup_folders("memory"):
        if not v2 and os.path.isfile(os.path.join(path, "memory.limit_in_bytes")):
            return path if os.access(path, os.W_OK) else None
    return None


@pytest.mark.timeout(120)
@pytest.mark.skipif(_writable_memory_cgroup() is None, reason="no writable cgroup v1 memory hierarchy (root)")
def test_a_worker_the_out_of_memory_killer_ended_is_named_so():
    """A worker that allocates past its cgroup's memory limit (`docker run --memory=1000m`) is
    SIGKILLed by the kernel's out-of-memory killer, where DataLoader says only that it exited or
    was killed: the error names the killer, the limit and the worker count to lower. In a real
    cgroup of 1,000 MiB, a worker touching 1.5 GiB at sample 20. (An image loader's pass ends in
    the same watchdog: the test above has its error.)"""
    group = os.path.join(_writable_memory_cgroup(), f"fastdata-test-{os.getpid()}")
    os.mkdir(group)
    try:
        for name in ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes"):  # (memsw: no swapping instead)
            if os.path.exists(os.path.join(group, name)):
                with open(os.path.join(group, name), "w") as f:
                    f.write(str(1000 << 20))
        code = textwrap.dedent("""
            import fastdata, torch
            class Growing(torch.utils.data.Dataset):
                def __len__(self):
                    return 32
                def __getitem__(self, i):
                    if i == 20:
                        bytearray(1500 << 20)
                    return torch.tensor(i)
            try:
                for batch in fastdata.loader(Growing(), batch_size=4, num_workers=2):
                    pass
            except RuntimeError as e:
                print(e)
            """)
        script = f'echo $$ > {group}/cgroup.procs && exec "$0" -c "$1"'
        done = subprocess.run(["sh", "-c", script, sys.executable, code], capture_output=True, text=True, timeout=100,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert done.returncode == 0, done.stderr
        assert "SIGKILL, from the kernel's out-of-memory killer: this process's cgroup, limited to 1,000 MiB, ran out " \
               "of memory (1 kill counted in the cgroup during the pass)" in done.stdout, done.stdout + done.stderr
        assert "fewer workers (num_workers=2 now)" in done.stdout
    finally:
        os.rmdir(group)  # (empty once the process has exited)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["dropin", "image"])
def test_a_dead_workers_signal_lost_is_sent_again(folder, kind, clean):
    """DataLoader's SIGCHLD handler raises in the main thread wherever it runs; raised inside a
    finalizer the garbage collector runs, it is only printed, and the consumer would wait for the
    dead worker's batch until the stall limit (600 s). Here the first SIGCHLD after the kill is
    lost so: the error still comes within seconds, from the signal the watchdog sends again."""
    loader, it, workers = _a_pass_one_batch_in(folder, kind)
    torchs = signal.getsignal(signal.SIGCHLD)
    lost = []

    def lose_the_first(signum, frame):
        if not lost:
            lost.append(signum)
            return
        torchs(signum, frame)

    signal.signal(signal.SIGCHLD, lose_the_first)
    try:
        os.kill(workers[0], signal.SIGKILL)
        t = time.monotonic()
        with pytest.raises(RuntimeError, match="killed by signal|exited unexpectedly"):
            for _ in it:
                pass
        assert lost and time.monotonic() - t < 10
    finally:
        signal.signal(signal.SIGCHLD, torchs)
    del it, loader


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["dropin", "image"])
def test_a_dead_worker_whose_error_came_in_the_step_fails_the_pass_within_seconds(folder, kind, clean):
    """DataLoader's SIGCHLD handler raises once for a pass's dead worker, wherever the main
    thread is, then forgets the pass's workers. Raised in the training step, which a script may
    catch and read on, the next batch's wait would last the stall limit (600 s; DataLoader's own
    check, with timeout=0, comes every 5 s): the pass raises within seconds."""
    loader, it, workers = _a_pass_one_batch_in(folder, kind)
    with pytest.raises(RuntimeError, match="killed by signal"):
        os.kill(workers[0], signal.SIGKILL)
        time.sleep(5)  # the step, where the handler raises
    t = time.monotonic()
    with pytest.raises(RuntimeError, match="SIGKILL, "):
        for _ in it:
            pass
    assert time.monotonic() - t < 10
    del it, loader


@pytest.mark.timeout(120)
def test_a_next_after_a_dead_worker_goes_on_with_the_rest_of_the_epoch(clean):
    """torch's iterator goes on after its "exited unexpectedly" error (without the batches the
    dead worker held); the drop-in's pass goes on from the first batch it did not hand out,
    with workers of its own: one error, then every sample of the epoch once."""
    before = _children()
    it = iter(fastdata.loader(Slow(), batch_size=4, num_workers=2))
    got = [next(it)]
    try:
        os.kill(min(_children() - before), signal.SIGKILL)
    except RuntimeError as e:  # (torch's SIGCHLD handler raises wherever this thread is when the worker dies:
        assert "killed by signal" in str(e), e  # here too, on a busy machine; the pass then raises once more)
    errors = 0
    while errors < 3:
        try:
            got.append(next(it))
        except RuntimeError as e:
            assert "exited unexpectedly" in str(e) or "killed by signal" in str(e), e
            errors += 1
        except StopIteration:
            break
    assert errors == 1 and sorted(torch.cat([b[:, 0] for b in got]).tolist()) == list(range(64))
    del it


@pytest.mark.parametrize("kind", ["dropin", "image"])
def test_stopped_worker_times_out_within_its_timeout_and_is_not_left_behind(folder, kind, clean):
    before = _children()
    timeout = 4
    loader = fastdata.loader(Slow(), batch_size=4, num_workers=2, timeout=timeout) if kind == "dropin" else \
        _image_loader(folder, num_workers=2, timeout=timeout)
    it = iter(loader)
    next(it)
    workers = sorted(_children() - before)
    for pid in workers:
        os.kill(pid, signal.SIGSTOP)  # stopped: DataLoader's watchdog sees it alive
    t = time.monotonic()
    with pytest.raises(RuntimeError, match=f"timed out after {timeout} seconds.*were killed"):
        for _ in it:
            pass
    took = time.monotonic() - t
    # within its timeout (and the kill), not the timeout plus DataLoader's joins
    assert took < timeout * 1.6, f"the error took {took:.1f} s for timeout={timeout}"
    assert not any(_alive(pid) for pid in workers), "a stopped worker was left behind"
    del it, loader


class SleepsAt(torch.utils.data.Dataset):
    """Eight samples, each its index; sample `at` takes `seconds` to make."""

    def __init__(self, at: int, seconds: float) -> None:
        self.at, self.seconds = at, seconds

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        if i == self.at:
            time.sleep(self.seconds)
        return i


@pytest.mark.timeout(120)
def test_a_next_after_a_timeout_goes_on_with_the_batch_that_did_not_come(clean):
    """torch's iterator survives its timeout: a script that catches it and asks again gets the
    late batch once it comes, then the rest of the epoch. The drop-in's pass (its workers
    killed at the timeout) goes on the same way, from that batch, with workers of its own."""
    def run(make):
        it = iter(make(SleepsAt(2, 3.0), batch_size=2, num_workers=1, timeout=1))
        got, errors = [next(it).tolist()], 0
        while True:
            try:
                got.append(next(it).tolist())
            except RuntimeError as e:
                assert str(e).startswith("DataLoader timed out after 1 seconds"), e
                errors += 1
                assert errors < 10
            except StopIteration:
                return got, errors

    want, _ = run(torch.utils.data.DataLoader)
    got, errors = run(fastdata.loader)
    assert got == want == [[0, 1], [2, 3], [4, 5], [6, 7]] and errors >= 1


@pytest.mark.parametrize("kind", ["dropin", "image"])
def test_persistent_workers_after_a_stall_are_replaced(folder, kind, clean):
    """Persistent workers killed for a stall cannot serve another pass: the next iter() starts
    fresh ones and delivers the whole epoch."""
    before = _children()
    make = (lambda: fastdata.loader(Slow(), batch_size=4, num_workers=2, timeout=3, persistent_workers=True)) \
        if kind == "dropin" else (lambda: _image_loader(folder, num_workers=2, timeout=3, persistent_workers=True))
    loader = make()
    it = iter(loader)
    next(it)
    for pid in _children() - before:
        os.kill(pid, signal.SIGSTOP)
    with pytest.raises(RuntimeError, match="timed out"):
        for _ in it:
            pass
    del it
    batches = list(loader)
    assert len(batches) == len(loader)
    if kind == "dropin":
        assert torch.equal(torch.cat([b[:, 0] for b in batches]), torch.arange(64.0))
    else:
        assert sorted(i for x, y in batches for i in _image_ids(x, y)) == list(range(100))
    del batches, loader


@pytest.fixture(scope="module")
def shards(folder, tmp_path_factory):
    from fastdata.shard import write_shards

    pairs = [(str(p), int(p.parent.name[5:])) for p in sorted(folder.glob("*/*.jpg"))]
    out = tmp_path_factory.mktemp("shards")
    write_shards(pairs, out / "s-%06d.tar", shuffle=False, max_count=25, workers=1)
    return str(out / "s-{000000..000003}.tar")


@pytest.mark.timeout(120)  # a pass waiting on a dead worker would wait the stall limit (600 s)
@pytest.mark.parametrize("when", ["mid-pass", "between passes"])
@pytest.mark.parametrize("kind", ["dropin", "pil", "wds"])
def test_persistent_workers_after_a_kill_are_replaced(folder, shards, kind, when, clean):
    """A persistent worker killed from outside (the out-of-memory killer, a user's kill -9),
    in a pass or between two: the next iter() starts fresh workers at once and delivers the
    whole epoch, again and again; a new loader too, and nothing is left behind."""
    before = _children()

    def make():
        if kind == "dropin":
            return fastdata.loader(Slow(), batch_size=4, num_workers=2, persistent_workers=True)
        source = str(folder) if kind == "pil" else shards
        return fastdata.loader(source, batch_size=16, transform=T.Compose([T.Resize((24, 24))]), num_workers=2,
                               persistent_workers=True, backend=kind, device="cpu", shuffle=True, seed=0)

    def every_sample(loader):
        batches = list(loader)
        if kind == "dropin":
            return sorted(torch.cat([b[:, 0] for b in batches]).long().tolist()) == list(range(64))
        return sorted(i for x, y in batches for i in _image_ids(x, y)) == list(range(100))

    loader = make()
    it = iter(loader)
    next(it)
    if when == "between passes":
        for _ in it:
            pass
    worker = min(_children() - before)
    try:  # torch's SIGCHLD handler raises in this thread when it sees the worker die
        os.kill(worker, signal.SIGKILL)
        if when == "mid-pass":
            with pytest.raises(RuntimeError, match="killed by signal|exited unexpectedly"):
                for _ in it:
                    pass
        else:
            while _alive(worker):
                time.sleep(0.01)
            time.sleep(0.2)
    except RuntimeError as e:
        assert "killed by signal" in str(e) or "exited unexpectedly" in str(e)
    del it
    assert every_sample(loader) and every_sample(loader)
    del loader
    gc.collect()
    assert every_sample(make())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fault", ["a stall", "a killed worker"])
def test_a_worker_dead_holding_the_workers_shared_lock_does_not_hang_the_next_pass(fault, clean):
    """A worker killed by a signal inside `done_event.is_set()` dies holding the lock of the
    event its pool shares, and DataLoader's shutdown sets that event first. Here the lock is
    left held for certain (a forked child takes it and is SIGKILLed), then the workers are
    stopped until the stall limit kills them, or one is killed between passes: the next pass
    starts fresh workers and delivers the epoch, where it would wait forever."""
    from fastdata._torch_internals import live_iterator

    before = _children()
    loader = fastdata.loader(Slow(), batch_size=4, num_workers=2, timeout=3, persistent_workers=True)
    it = iter(loader)
    next(it)
    workers = _children() - before
    if fault == "a killed worker":  # between passes, when idle workers do not take the lock
        for _ in it:
            pass
    child = os.fork()
    if child == 0:  # takes the shared lock and dies by a signal, as a worker can (never back into pytest)
        try:
            live_iterator(loader._loader)._workers_done_event._cond._lock.acquire()
        finally:
            os.kill(os.getpid(), signal.SIGKILL)
    os.waitpid(child, 0)
    if fault == "a stall":  # (the other workers wait for that lock too: a stall as well)
        for pid in workers:
            os.kill(pid, signal.SIGSTOP)
        with pytest.raises(RuntimeError, match="timed out"):
            for _ in it:
                pass
    else:
        try:  # torch's SIGCHLD handler raises in this thread when it sees the worker die
            os.kill(min(workers), signal.SIGKILL)
            while _alive(min(workers)):
                time.sleep(0.01)
            time.sleep(0.2)
        except RuntimeError as e:
            assert "killed by signal" in str(e)
    del it
    batches = list(loader)
    assert torch.equal(torch.cat([b[:, 0] for b in batches]), torch.arange(64.0))
    assert not (workers & _children())
    del batches, loader


def test_stuck_worker_with_timeout_0_hits_the_stall_limit(monkeypatch, clean):
    monkeypatch.setenv("FASTDATA_STALL_TIMEOUT", "3")
    before = _children()
    loader = fastdata.loader(Slow(stuck=9), batch_size=4, num_workers=2)  # timeout=0, DataLoader's default
    with pytest.raises(RuntimeError, match="FASTDATA_STALL_TIMEOUT=3"):
        for _ in loader:
            pass
    workers = _children() - before
    assert not workers


def test_dataset_that_raises_stops_cleanly(clean):
    loader = fastdata.loader(Raises(), batch_size=4, num_workers=2)
    with pytest.raises(ValueError, match="sample 20 is broken"):
        for _ in loader:
            pass


class Named(torch.utils.data.Dataset):
    """Sample i: {"x": 8192 values i (a batch's is over the size that crosses by value: it goes
    in the worker's buffer ring), "name": "i"}; the names of samples in `locked` hold a lock,
    which cannot be pickled (the name is a str, so collation passes it through untouched)."""

    class Name(str):
        pass

    def __init__(self, locked=()):
        self.locked = set(locked)

    def __len__(self):
        return 64

    def __getitem__(self, i):
        name = self.Name(str(i))
        if i in self.locked:
            name.lock = threading.Lock()
        return {"x": torch.full((8192,), float(i)), "name": name}


@pytest.mark.parametrize("context,persistent", [(None, False), (None, True), ("forkserver", False)])
def test_a_batch_that_cannot_be_pickled_is_that_batchs_error(context, persistent, clean):
    """A worker's batch that fails to pickle (DataLoader's worker drops it in its queue's
    feeder thread and waits for it forever) is raised at that batch, naming it and the cause,
    and the pass goes on with the next batch, as after a Dataset's error. Its tensor was
    pickled (its buffer marked as sent) before the name failed: the worker's later batches in
    that buffer (its ring's slots come round again within the epoch) still reach the main
    process, in this epoch and the next."""
    loader = fastdata.loader(Named(locked={9}), batch_size=4, num_workers=2, persistent_workers=persistent,
                             multiprocessing_context=context, timeout=60)
    for _ in range(2):
        it, seen, errors = iter(loader), [], []
        while True:
            try:
                batch = next(it)
            except StopIteration:
                break
            except TypeError as e:
                errors.append(str(e))
                continue
            values = batch["x"][:, 0].long().tolist()
            assert batch["name"] == [str(v) for v in values]
            assert torch.equal(batch["x"], batch["x"][:, :1].expand(-1, 8192))
            seen += values
        assert seen == [i for i in range(64) if i // 4 != 2]
        assert len(errors) == 1
        assert "batch 2 cannot be pickled" in errors[0] and "_thread.lock" in errors[0]
    del it, loader


def test_image_worker_error_leaves_nothing_behind(folder, tmp_path, clean):
    bad = tmp_path / "bad"
    (bad / "a").mkdir(parents=True)
    for i in range(20):
        (bad / "a" / f"{i:02d}.jpg").write_bytes(b"\xff\xd8\xff" + b"\0" * (50 + i))  # no image in there
    for persistent in (False, True):
        loader = _image_loader(bad, num_workers=2, persistent_workers=persistent)
        with pytest.raises(fastdata.DataError, match=r"bad/a/\d\d\.jpg") as e:
            for _ in loader:
                pass
        # the worker's error arrives as itself: one line, with the file for code to read
        assert "\n" not in str(e.value) and "Traceback" not in str(e.value)
        assert e.value.path.startswith(str(bad / "a"))
        del loader, e


def test_shared_memory_error_says_what_gives_more_and_passes_others_on():
    from fastdata.errors import shared_memory_error

    torch_says = RuntimeError("unable to allocate shared memory(shm) for file </torch_1_2_3>: "
                              "No space left on device (28)")
    said = str(shared_memory_error(torch_says, 3 << 20, "/dev/shm"))
    assert said.startswith("cannot allocate 3.0 MiB of shared memory for a batch: /dev/shm has ") and "\n" not in said
    assert "docker run --shm-size=8g, or --ipc=host" in said and said.endswith("No space left on device (28))")
    assert "/nowhere is full" in str(shared_memory_error(torch_says, 1, "/nowhere"))
    other = RuntimeError("something else")
    assert shared_memory_error(other, 1) is other


_FULL_SHM = """
import sys, torch, fastdata
from fastdata import transforms as T
if sys.argv[1] == "image":
    loader = fastdata.loader(sys.argv[2], batch_size=32, num_workers=2, device="cpu",
                             transform=T.Compose([T.RandomResizedCrop(512)]))
else:
    loader = fastdata.loader(torch.utils.data.TensorDataset(torch.zeros(64, 3, 256, 256)), batch_size=32, num_workers=2)
try:
    for batch in loader:
        pass
except RuntimeError as e:
    print(str(e).rstrip().splitlines()[-1])
"""


@pytest.mark.parametrize("kind", ["image", "dropin"])
def test_a_full_dev_shm_is_an_error_that_says_what_gives_more(folder, kind):
    """A container's small /dev/shm (Docker's is 64 MiB; 16 here, in a mount namespace of the
    test's own) that a batch does not fit: torch's error for it, as one line that names the
    room left and the remedies (DataLoader gives torch's raw `No space left on device`)."""
    if subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=16m tmpfs /dev/shm"],
                      capture_output=True).returncode != 0:
        pytest.skip("no private mount namespace here (unshare -m and mount need CAP_SYS_ADMIN)")
    script = 'mount -t tmpfs -o size=16m tmpfs /dev/shm && exec "$0" -c "$1" "$2" "$3"'
    done = subprocess.run(["unshare", "-m", "sh", "-c", script, sys.executable, _FULL_SHM, kind, str(folder)],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    line = done.stdout.strip()
    assert done.returncode == 0 and line.startswith("RuntimeError: cannot allocate "), (line, done.stderr[-2000:])
    assert "MiB of shared memory for a batch: /dev/shm has " in line and " MiB free of 16 (a Docker container" in line
    assert "docker run --shm-size=8g, or --ipc=host" in line and "No space left on device" in line


def test_shard_server_that_stops_answering(folder, tmp_path, clean):
    """A shard server that hangs mid-epoch: the workers' reads block, and the loader ends with
    a timeout error instead of waiting forever."""
    from fastdata._serve import _Handler
    import http.server

    from fastdata.shard import write_shards

    write_shards(str(folder), str(tmp_path / "s-%04d.tar"), max_count=25, progress=False)
    hang = threading.Event()
    release = threading.Event()

    class Handler(_Handler):
        root = str(tmp_path)

        def do_GET(self):
            if hang.is_set():
                release.wait(30)  # holds the connection without a byte
                return
            super().do_GET()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/s-{{0000..0003}}.tar"
        loader = fastdata.loader(url, batch_size=16, transform=T.Compose([T.RandomResizedCrop(24)]),
                                 num_workers=2, timeout=4)
        hang.set()
        with pytest.raises(RuntimeError, match="timed out"):
            for _ in loader:
                pass
    finally:
        release.set()
        server.shutdown()
        server.server_close()


_PERSISTENT_AT_EXIT = """
import sys, torch, fastdata
from fastdata import transforms as T
image = fastdata.loader(sys.argv[1], batch_size=16, num_workers=2, persistent_workers=True, device="cpu",
                        transform=T.Compose([T.RandomResizedCrop(24)]))
dropin = fastdata.loader(torch.utils.data.TensorDataset(torch.arange(64.0).view(-1, 1).expand(-1, 4096).contiguous()),
                         batch_size=8, num_workers=2, persistent_workers=True)
print(sum(len(y) for _, y in image), sum(len(x) for (x,) in dropin))
"""


def test_persistent_workers_alive_at_exit_leave_no_temporary_folder(folder, tmp_path):
    """Loaders whose persistent workers still run when the script ends (image mode and the
    drop-in, a whole epoch each): the workers are told to end at exit and end as at any
    shutdown, so none leaves multiprocessing's temporary folder (pymp-*, with the socket it
    sends descriptors through) in TMPDIR, where DataLoader's own, terminated at exit, do."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    run = subprocess.run([sys.executable, "-c", _PERSISTENT_AT_EXIT, str(folder)], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "TMPDIR": str(tmp)})
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["100", "64"]
    assert sorted(os.listdir(tmp)) == []


_STUCK_AT_EXIT = """
import os, sys, time, torch, fastdata
from fastdata._torch_internals import iterator_workers, live_iterator

class Slow(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        if i >= 4:
            time.sleep(300)  # a worker busy far past the exit's wait
        return torch.full((4,), float(i))

loader = fastdata.loader(Slow(), batch_size=4, num_workers=2, persistent_workers=True)
it = iter(loader)
next(it)
print(" ".join(str(w.pid) for w in iterator_workers(live_iterator(loader._loader))), flush=True)
"""


def test_persistent_workers_busy_at_exit_do_not_hold_it(tmp_path):
    """Persistent workers busy in a long `__getitem__` when the script ends: the exit tells them
    to end, waits its few seconds for them in all, then multiprocessing's exit terminates them as
    it terminates DataLoader's: the script ends, and no worker is left."""
    run = subprocess.run([sys.executable, "-c", _STUCK_AT_EXIT], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    pids = [int(p) for p in run.stdout.split()]
    assert len(pids) == 2 and not [p for p in pids if _alive(p)]


def test_ctrl_c_in_the_consumer_stops_cleanly(folder, tmp_path):
    """SIGINT to a training process mid-epoch: it exits at once, and none of its workers is
    left running."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(f"""
        import multiprocessing, signal, sys, time
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a terminal's, whatever this test inherited
        import fastdata
        from fastdata import transforms as T
        loader = fastdata.loader({str(folder)!r}, batch_size=8, num_workers=2,
                                 transform=T.Compose([T.RandomResizedCrop(24)]))
        for epoch in range(100):
            for i, batch in enumerate(loader):
                if epoch == 0 and i == 1:
                    print(*[p.pid for p in multiprocessing.active_children()], flush=True)
                time.sleep(0.05)
    """))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                         text=True)
    try:
        workers = [int(x) for x in p.stdout.readline().split()]
        assert len(workers) == 2
        # Python drops a KeyboardInterrupt raised in fork's at-fork callbacks (logging's lock
        # release: "Exception ignored in ... _releaseLock"), and each epoch forks fresh workers,
        # here as under torch's DataLoader: then a user presses Ctrl-C again.
        for attempt in range(3):
            p.send_signal(signal.SIGINT)
            try:
                err = p.communicate(timeout=20)[1]
                break
            except subprocess.TimeoutExpired:
                if attempt == 2:
                    raise
    finally:
        p.kill()
    assert p.returncode != 0 and "KeyboardInterrupt" in err
    deadline = time.monotonic() + 10
    while any(_alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(w) for w in workers), "a worker outlived its training process"


# --------------------------------------------------------------- threads in the parent, fork in the child


@pytest.mark.dali
def test_dali_then_worker_loaders_three_rounds(folder, clean):
    """The issue's reproduction: a dali loader used and dropped, then a worker-based loader over
    every image, three times; every image arrives, no worker crashes or blocks."""
    for _ in range(3):
        dali = _image_loader(folder, backend="dali", device="cpu", num_workers=1)
        it = iter(dali)
        next(it), next(it)
        del it, dali
        ids = []
        for images, labels in _image_loader(folder, backend="pil", num_workers=2, shuffle=True):
            ids += _image_ids(images, labels)
        assert sorted(ids) == list(range(100))


@pytest.mark.dali
def test_dali_leaves_no_thread_behind(folder):
    """Its pipeline's threads end with the pass (whole, or left early): none outlive it."""
    before = _threads()
    dali = _image_loader(folder, backend="dali", device="cpu", num_workers=2)
    it = iter(dali)
    next(it)
    assert _threads() > before  # the pipeline runs its own threads while the pass is live
    del it
    assert _threads() == before
    assert len(list(dali)) == len(dali)
    assert _threads() == before
    ref = weakref.ref(dali)
    del dali
    assert ref() is None, "the loader is in a reference cycle: only the garbage collector would free it"


@pytest.mark.parametrize("backend", ["pil", "torch"])
def test_loaders_are_freed_without_the_garbage_collector(folder, backend):
    """A loader and its iterator hold no reference cycle, also after a pass left early, so
    dropping them frees them (and their workers) at once, never in a later collection."""
    loader = _image_loader(folder, num_workers=2) if backend == "pil" else \
        fastdata.loader(Slow(), batch_size=4, num_workers=2)
    it = iter(loader)
    next(it)
    refs = [weakref.ref(loader), weakref.ref(it)]
    gc.disable()
    try:
        del it, loader
        assert [r() for r in refs] == [None, None]
    finally:
        gc.enable()


def _collect_in_worker(_):
    gc.collect()  # a collection in the child: it would run the finalizer of any inherited DALI garbage


@pytest.mark.dali
def test_torch_dataloader_forked_after_dali(folder, clean):
    """The suite's old hang: torch's own DataLoader forked after a dali loader was used, with a
    garbage collection in each worker."""
    dali = _image_loader(folder, backend="dali", device="cpu", num_workers=1)
    it = iter(dali)
    next(it), next(it)
    del it, dali
    loader = torch.utils.data.DataLoader(Slow(), batch_size=8, num_workers=2, worker_init_fn=_collect_in_worker,
                                         timeout=60)
    assert torch.equal(torch.cat([b[:, 0] for b in loader]), torch.arange(64.0))


def test_the_forkserver_preloads_what_a_worker_runs():
    """What the forkserver imports once holds torch and the workers' code, so that a worker it
    starts imports none of it again."""
    code = ("import importlib, sys\n"
            f"for name in {list(_workers.FORKSERVER_PRELOAD)!r}: importlib.import_module(name)\n"
            "missing = {'torch', 'fastdata.image.cpu', 'fastdata.backends.torch'} - set(sys.modules)\n"
            "assert not missing, missing")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.dali
def test_worker_loader_beside_a_live_dali_pipeline_starts_by_forkserver(folder, clean):
    """A dali pass still live (its pipeline's threads running) while a worker-based loader
    starts: the workers do not fork from this process."""
    gc.collect()  # earlier tests' iterators left in reference cycles, with their decode threads
    assert _workers.start_method(None).get_start_method() == "fork"  # nothing else runs threads here
    dali = _image_loader(folder, backend="dali", device="cpu", num_workers=1)
    it = iter(dali)
    next(it)
    pil = _image_loader(folder, backend="pil", num_workers=2, shuffle=True)
    ids = []
    for images, labels in pil:
        ids += _image_ids(images, labels)
    assert sorted(ids) == list(range(100))
    assert pil._runner.loader.multiprocessing_context.get_start_method() == "forkserver"
    rest = sum(1 for _ in it)
    assert rest == len(dali) - 1
    del it, dali
    pil2 = _image_loader(folder, backend="pil", num_workers=2)
    assert len(list(pil2)) == len(pil2)
    # no threads live here now: fork again
    assert pil2._runner.loader.multiprocessing_context.get_start_method() == "fork"


def test_a_dead_workers_error_raised_inside_the_watchdog_is_the_passs_error():
    """DataLoader's SIGCHLD handler raises its "is killed by signal" error at whatever line the
    main thread runs. Raised inside the watchdog's error() (here from its thread's join), it is
    the error the pass raises, so a next() goes on after it, as after any dead worker's error
    (where it escaped, the pass ended: 2 runs in 15 of the test above under load). Any other
    error there is raised as it is."""
    from fastdata._stall import Watchdog

    def raising(message):
        def close():
            raise RuntimeError(message)
        return close

    dog = Watchdog.__new__(Watchdog)
    dog.close = raising("DataLoader worker (pid 1) is killed by signal: Killed. ")
    assert str(dog.error(RuntimeError("a read failed"))) == "DataLoader worker (pid 1) is killed by signal: Killed. "
    dog.close = raising("something else")
    with pytest.raises(RuntimeError, match="something else"):
        dog.error(RuntimeError("a read failed"))
