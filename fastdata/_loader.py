"""The `Loader` every mode and backend returns, and what `num_workers` means for each
(`resolve_workers`): below both `fastdata.backends` and `fastdata.image`."""

from __future__ import annotations

import atexit
import functools
import numbers
import operator
import os
import weakref
from typing import Any, Callable, Iterator

import torch

from ._cores import usable_cores
from ._torch_internals import python_exiting
from ._workers import end_persistent_workers


def resolve_workers(num_workers: int | str, device: Any = None, *, fresh_in_process: bool = False,
                    cluster: bool = False) -> int:
    """The worker count `num_workers` means: a count as given, or for "auto" (which a tuned
    config for the source, when `fastdata.loader` finds one, has already replaced):
    - with `cluster` (the ray backend): 0, which it reads as one actor per CPU of the cluster;
    - with `fresh_in_process` (image mode without persistent workers, on a backend that can
      decode in the training process): 0, a decode thread in this process that spreads each
      batch over the cores, which starts a pass at once where worker processes start anew each
      pass (benchmarks/startup.py);
    - else one worker per core this process may use, at most 16, and one core left to the
      training process where it drives a CUDA device (`device`, or without one, a CUDA device
      present): its Python thread launches the step's kernels all the time, and a worker
      beside it on every core delays each launch (benchmarks/gpu.py sweeps the count on a GPU
      machine). On a CPU device the step's own threads yield the cores while it waits, and
      workers sleep while their prefetch queue is full, so there one a core."""
    if num_workers == "auto":
        if cluster or fresh_in_process:
            return 0
        cores = usable_cores()
        return max(1, min(16, cores - 1 if cores > 1 and _drives_cuda(device) else cores))
    try:  # any integer DataLoader takes: numpy's, a 0-d integer tensor (what has __index__)
        return operator.index(num_workers)  # a negative count gets DataLoader's own ValueError
    except TypeError:
        raise TypeError(f"num_workers should be a non-negative integer or 'auto', but got {num_workers!r}") from None


def _drives_cuda(device: Any) -> bool:
    try:
        if device is not None:
            return torch.device(device).type == "cuda"
        return torch.cuda.is_available()
    except (RuntimeError, TypeError):
        return False


def new_stats() -> dict[str, Any]:
    # skipped: samples left out (on_error="skip"), each time; skipped_files: the distinct files
    # (or tar members) among them; errors: the first 100 of those, each once: path, cause and
    # count (the times it was skipped: a bad file is read again each epoch)
    return {"samples": 0, "batches": 0, "skipped": 0, "skipped_files": 0, "errors": [], "wait_s": 0.0}


def check_position(state: dict[str, Any], length: int | None, batch_size: Any, epoch_may_be_none: bool = False) -> None:
    """Refuses, in one line, a state dict whose position is not one this loader can resume:
    `epoch` and `batches` each an int >= 0 (not a bool), the batches at most the epoch's
    `length` where it is known, counted in batches of this loader's `batch_size` (where the
    state says its own). A checkpoint is a file like any other: a negative count would replay an
    epoch and a huge one silently end it, where the user asked for neither."""
    if state.get("batch_size", batch_size) != batch_size:
        raise ValueError(f"the state was taken with batch_size={state['batch_size']}: its position counts batches "
                         f"of that size, so resume with batch_size={state['batch_size']}, not {batch_size}")
    for field, top in (("epoch", None), ("batches", length)):
        value = state.get(field)
        if value is None and field == "epoch" and epoch_may_be_none:
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0 or \
                (top is not None and value > top):
            bound = f"from 0 to {top} (this loader's batches an epoch)" if top is not None else ">= 0"
            raise ValueError(f"the state's {field} should be an integer {bound}, but is {value!r:.80}: "
                             "pass a dict from this loader's state_dict()")


class Pass:
    """What iter() of a Loader returns: the pass's batches (a generator's), until a newer
    iter() of its loader ends it (`Loader._supersede`); its next `next()` then goes on with
    the rest of its batches, made by `then`'s `rest()` (or, with its epoch done, stops)."""

    __slots__ = ("_take", "close", "__weakref__")

    def __init__(self, batches: Iterator[Any]) -> None:
        self._take, self.close = batches.__next__, batches.close
        _open[self] = os.getpid()

    def __iter__(self) -> "Pass":
        return self

    def __next__(self) -> Any:
        return self._take()

    def then(self, rest: Callable[[], Iterator[Any]]) -> None:
        self._take = _Rest(self, rest)


# The passes not yet collected, with the process that made them: at exit, one still open (an
# iterator kept half read, as a script's top-level `dataiter = iter(loader); next(dataiter)`
# keeps it) is ended while the interpreter is whole, its workers and slots freed as at any end;
# the interpreter's teardown would close its generator after the modules it needs are gone.
_open: "weakref.WeakKeyDictionary[Pass, int]" = weakref.WeakKeyDictionary()


@atexit.register
def _end_open_passes() -> None:
    end_persistent_workers()  # (first: DataLoader's shutdown, told the interpreter exits, terminates them)
    mine = [one for one, pid in list(_open.items()) if pid == os.getpid()]
    if mine:
        python_exiting()  # (workers terminated, as at torch's exit, not waited for)
    for one in mine:
        try:
            one.close()
        except Exception:  # (what a pass raises as it ends: nothing is left to tell at exit)
            pass


class _Rest:
    """A superseded pass's `_take` until it is called: then the rest of the pass takes over.
    It holds the pass weakly: a pass holding itself would wait for a garbage collection."""

    __slots__ = ("_owner", "_rest")

    def __init__(self, owner: Pass, rest: Callable[[], Iterator[Any]]) -> None:
        self._owner, self._rest = weakref.ref(owner), rest

    def __call__(self) -> Any:
        owner = self._owner()
        owner._take = self._rest().__next__
        return owner._take()


class LoaderCore:
    """A fastdata loader but for its public state methods, which `Loader` adds: its stats, its
    passes, the profiling protocol. `fastdata run`'s served loaders are one without them, as
    torch's DataLoader has none: a framework takes a loader with `state_dict` for a resumable
    one (Lightning's `_Stateful`), and writes its state into checkpoints that would then resume
    only under fastdata."""

    backend: str = ""
    batch_size: int | None = None

    def __init__(self) -> None:
        self.stats: dict[str, Any] = new_stats()

    def __iter__(self) -> Iterator[Any]:
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError

    def set_epoch(self, epoch: int) -> None:
        raise NotImplementedError

    def _state_dict(self) -> dict[str, Any]:
        """Where the loader stands (`Loader.state_dict`)."""
        raise NotImplementedError

    def _load_state_dict(self, state: dict[str, Any]) -> None:
        """Resumes from `state` (`Loader.load_state_dict`)."""
        raise NotImplementedError

    _live: tuple | None = None  # (weak reference to the live pass's iterator, its end, the process it runs in)
    _in_epoch = False  # a pass is live and its epoch not done

    def __getstate__(self) -> dict[str, Any]:
        # A loader crosses to a spawned process (ddp_spawn) without its live pass, as a
        # DataLoader does without its iterator.
        state = self.__dict__.copy()
        state.pop("_live", None)
        return state

    def _start(self, batches: Iterator[Any], end: Callable[[], None]) -> Iterator[Any]:
        """Records `batches` (what iter() returns) as the live pass; `end` ends it (idempotent:
        the pass's own `finally` calls it too)."""
        self._live = (weakref.ref(batches), end, os.getpid())
        return batches

    def _ours(self) -> bool:
        """Whether the live pass is this process's. A child forked during a pass has its
        parent's (its workers, queues and buffers): a pass of the child's own leaves it to the
        parent, as torch's iterator in a child leaves the parent's workers alone, and ending it
        here would end the parent's workers."""
        if self._live is not None and self._live[2] != os.getpid():
            self._live = None
        return self._live is not None

    def _supersede(self) -> None:
        """Readies the live pass, if its epoch is not done, to go on after the pass iter() is
        about to start: a next() of it then gives the batches it had not handed out (`_rest`
        of the state it stood at), as two of torch's iterators go on side by side
        (`next(iter(loader))` inside a loop over it, `zip(loader, loader)`). Its workers and
        slots go to the newer pass all the same (`_stop`): a pass a trainer left early, and
        never asks again, costs nothing more."""
        live = self._live[0]() if self._ours() else None
        if isinstance(live, Pass) and self._in_epoch:
            live.then(functools.partial(self._rest, self._rest_state()))

    def _rest_state(self) -> dict[str, Any]:
        """Where the live pass stands, for `_rest`: its state (a backend may add what only this
        process can use, such as the pass's own sampler iterator)."""
        return self._state_dict()

    def _rest(self, state: dict[str, Any]) -> Iterator[Any]:
        """The batches after `state` of the pass it was taken in, on parts of their own."""
        raise NotImplementedError

    def _stop(self) -> None:
        """Ends the live pass, whole or not, before a new one starts: a new iter() shares no
        workers or buffer slots with an older iterator, whenever that one is dropped."""
        if not self._ours():
            return
        ref, end, _ = self._live
        self._live = None
        batches = ref()
        if batches is not None:
            batches.close()  # runs its `finally` when it had started
        end()  # when it had not

    # ------------------------------------------------------------- the profiling protocol
    # What fastdata.profile calls of a loader, and nothing else of it. Public methods, but not
    # part of the contract: they may change with the profiler.

    def set_stage_timing(self, on: bool) -> bool:
        """Stage timing on or off; False when this loader cannot time its stages now."""
        return False

    def stage_seconds(self) -> dict[str, Any]:
        """Stage seconds so far (with stage timing on): per stage, "images" (decoded so far),
        and per "worker k" a dict of its own stages."""
        return self.stats.get("stages", {})

    def batches_ahead(self) -> int:
        """How many batches the loader can have ready ahead of the consumer."""
        return (self.num_workers or 1) * 2 + 1

    def runs_in_process(self) -> bool:
        """Whether the loader's stages run in the training process (no worker processes)."""
        return self.num_workers == 0

    num_workers: int = 0  # each backend says its own

    # remade(change) -> a fresh loader like this one, made as fastdata.loader made it with the
    # keywords of `change` set ({}: this one's config); fastdata.profile measures a predicted
    # change on such loaders before advising it. None: this loader cannot be remade (fastdata
    # run's served loaders).
    remade: Callable[[dict[str, Any]], "LoaderCore"] | None = None

    def _record_stages(self, stages: dict[str, Any]) -> None:
        """The one place stage seconds are summed: a batch's (or a main-process stage's)
        {stage: seconds} into stats["stages"], and under "worker k" too when it names one."""
        into = self.stats.setdefault("stages", {})
        worker = stages.get("worker")
        mine = into.setdefault(f"worker {worker}", {}) if worker is not None else None
        for name, value in stages.items():
            if name == "worker":
                continue
            into[name] = into.get(name, 0) + value
            if mine is not None:
                mine[name] = mine.get(name, 0) + value

    def _time_copy(self, seconds: float) -> None:
        """device.prefetch's timer: one host-to-device copy's seconds."""
        self._record_stages({"h2d_copy": seconds})

    def __repr__(self) -> str:
        return f"{type(self).__name__}(backend={self.backend!r}, batch_size={self.batch_size})"


class Loader(LoaderCore):
    """What `fastdata.loader` returns: iterate it for batches.

    `len(loader)` is the number of batches per epoch for this rank, `loader.backend` names the
    backend that runs it, `loader.stats` counts samples, batches, skipped samples (each time, and
    the distinct files, the first 100 in errors with their cause and count) and the seconds the
    consumer spent waiting for batches.
    """

    def state_dict(self) -> dict[str, Any]:
        """Where this loader stands: taken after k batches of an epoch, a loader given it
        (`load_state_dict`) yields the batches after those k, then carries on to later epochs
        the same way; taken between epochs, where the next pass starts. Exact when a sample is
        a function of its index (see the guide's Epochs and resume)."""
        return self._state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resumes from a `state_dict()` of a loader over the same data; a state this loader
        cannot resume (another batch size, world size, data) raises ValueError."""
        self._load_state_dict(state)
