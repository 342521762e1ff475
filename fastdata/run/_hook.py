"""What `fastdata run` changes in the command's processes: `torch.utils.data.DataLoader`.

`install()` puts `DataLoader` (below) in torch's place. Making one decides, per loader, from its
arguments: served by fastdata's drop-in loader (`Served`, a `TorchCore`) or torch's own
DataLoader (an instance of `DataLoader` itself, which adds nothing to torch's class). Both are
instances of the class the script sees as `DataLoader` and of torch's. Each decision is appended
to `$FASTDATA_RUN_DIR/loaders-<pid>.jsonl` when it is made; at the process's exit, each served
loader's copies ahead to the GPU (`fastdata.run._copy`, where CUDA is and FASTDATA_RUN_NO_COPY is
not set) and, with `FASTDATA_RUN_PROFILE` set, its measurements (`fastdata.run._profile`).

Which loaders are served, and how (native decode, num_workers): `fastdata.run._decide`.

What the script sees is torch's: `inspect.signature` of the class and of a loader's `__init__`,
`DataLoader[T]` (Generic), `len()` and `_num_yielded` of iter(loader), `get_worker_info().dataset`
in a worker, and with timeout=0 a wait for a batch without fastdata's stall limit.
"""

from __future__ import annotations

import abc
import atexit
import copyreg
import functools
import inspect
import itertools
import json
import os
import sys
import sysconfig
import types
import weakref
from typing import Any

import torch
import torch.utils.data.dataloader

from ._copy import CopyAhead, install as install_copy
from ._profile import TimedPass, Timing
from ._decide import SIGNATURE, decide
from ._arrays import NativeArrays, lower_any
from ._folders import target_transformed
from ._layout import CarryingCollate, Finish
from ._mixup import MixCollate, mixing_of
from ._timm import is_timm_collate
from ._timm_collate import TimmCollate
from ._torchvision import NativeFolder
from .._collate import RingCollate, collate as native_collate
from .._stall import wait_forever
from .._workers import own_start_method, start_method
from ..backends.torch import TorchCore
from ..backends.torch_iter import Fetches, replayable

TorchDataLoader = torch.utils.data.dataloader.DataLoader
_CLASS_SIGNATURE = inspect.signature(TorchDataLoader)
# torch's DataLoader is Generic (DataLoader[T]): so is this one, over torch's own type variable
_GENERIC = getattr(TorchDataLoader, "__parameters__", ())
# Frames of these packages are skipped when naming where a loader was made, and so are those of
# any installed library (timm's create_loader, say) where the script's own frame is below them.
_LIBRARIES = {"torch", "fastdata", "lightning", "pytorch_lightning", "lightning_fabric", "accelerate"}
_STDLIB = tuple({os.path.join(path, "") for key in ("stdlib", "platstdlib")
                 if (path := sysconfig.get_paths().get(key))})

_served: list[tuple[weakref.ref, Timing]] = []
_copying: list[tuple[int, CopyAhead]] = []
_count = itertools.count()


class _AnyTorchLoader(abc.ABCMeta):
    """DataLoader's metaclass: any torch DataLoader (made before the hook, a `TorchLoader`) is a
    `DataLoader`. An ABCMeta, so that a script's abstract subclass (`class L(DataLoader, ABC)`,
    `metaclass=ABCMeta`) has a metaclass as it has on torch's class (whose metaclass is type)."""

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, TorchDataLoader) if cls is DataLoader else super().__instancecheck__(obj)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, TorchDataLoader) if cls is DataLoader else super().__subclasscheck__(sub)

    @property
    def __signature__(cls) -> inspect.Signature | None:
        """`inspect.signature` of the class: torch's DataLoader's (not `__new__`'s); a subclass's first
        `__init__`'s, or None where one of the script's defines `__new__`, as on torch's class."""
        if cls is DataLoader or cls is Served:
            return _CLASS_SIGNATURE
        mro = cls.__mro__
        if any("__new__" in vars(c) for c in mro[:mro.index(DataLoader)]):
            return None
        try:
            return inspect.signature(types.MethodType(cls.__init__, cls))
        except (TypeError, ValueError):
            return None


class DataLoader(TorchDataLoader[_GENERIC] if _GENERIC else TorchDataLoader, metaclass=_AnyTorchLoader):
    """torch's DataLoader, as `fastdata run` gives it to the script: `DataLoader(...)` returns a
    `Served` loader or torch's own (an instance of this class, with torch's behaviour). A
    subclass the script defines is torch's own, unchanged."""

    def __repr__(self) -> str:
        # torch's DataLoader's (object's, naming torch's class) for this class and Served; a
        # script's subclass gets its own, as from object
        cls = TorchDataLoader if type(self) in (DataLoader, Served) else type(self)
        return f"<{cls.__module__}.{cls.__qualname__} object at {id(self):#x}>"

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if not args and not kwargs:  # unpickling, copy: the state follows
            return object.__new__(cls)
        if cls is not DataLoader and cls is not Served:
            _record(None, kwargs.get("dataset", args[0] if args else None), "fell back",
                    f"a subclass of DataLoader ({cls.__qualname__}): its methods may rely on torch's internals", cls)
            return object.__new__(cls)
        served, reason, workers, lowering = decide(args, kwargs)
        if not served:
            _record(None, kwargs.get("dataset", args[0] if args else None), "fell back", reason, cls)
            if cls is DataLoader:
                return object.__new__(cls)
            # Served rebuilt (a framework's type(loader)(...)) with what it cannot serve
            obj = object.__new__(DataLoader)
            TorchDataLoader.__init__(obj, *args, **kwargs)
            return obj
        obj = object.__new__(Served)
        obj._fastdata_decision = (reason, workers, lowering)
        return obj


class Served(DataLoader[_GENERIC] if _GENERIC else DataLoader, TorchCore):
    """A loader `fastdata run` serves: fastdata's drop-in loader, and a `DataLoader`. Like torch's,
    it has no `state_dict` (see `LoaderCore`): a trainer resumes its epoch from the start, and
    its checkpoints resume without fastdata."""

    # With no state to take at an epoch's last batch, the sampler is asked past it when torch's
    # iterator asks: a sampler's draws at its end (or a sampler of the script's, whatever it does
    # there) come after the script's last step, as without fastdata.
    _asks_past = False

    def __init__(self, dataset: Any, *args: Any, **kwargs: Any) -> None:
        # `dataset` named, as in DataLoader's signature: Lightning finds a loader's dataset by
        # that name among the arguments it records, to rebuild the loader with a sampler
        reason, workers, lowering = self.__dict__.pop("_fastdata_decision", (None, None, None))
        if reason is None:  # made as Served(...) directly: decided again
            _, reason, workers, lowering = decide((dataset, *args), kwargs)
        self._fastdata_lowering = lowering
        if workers is not None:
            kwargs["num_workers"] = workers
        self._fastdata_added = workers is not None  # fastdata gave the workers: see NativeFolder.carry
        TorchCore.__init__(self, dataset, *args, **kwargs)
        self._fastdata_added = self.num_workers if workers is not None else 0  # (once the count is known)
        self._fastdata_where = _where()
        native = None if lowering is None else "arrays" if lowering.in_memory else "files"
        timing = Timing(self, native) if os.environ.get("FASTDATA_RUN_PROFILE") else None
        if timing is not None:
            self.set_stage_timing(True)
            _served.append((weakref.ref(self), timing))
        self._fastdata_timing = timing
        # With workers and a GPU, batches are copied ahead to where the script moves them; not
        # from a sampler of the script's, which may draw from torch's RNG as each batch is asked
        # for, where taking one early would move the draw before the script's step.
        copy = self._fastdata_copy = CopyAhead() if (
            self.num_workers > 0 and _copy_ahead() and replayable(self._index_source())) else None
        seq = _record(self, self.dataset, "served" if lowering is None else "native", reason, type(self))
        if copy is not None and seq is not None:
            _copying.append((seq, copy))

    def _build(self) -> None:
        TorchCore._build(self)
        self._loader.__class__ = _Working  # torch's DataLoader with no state of its own added: see _Working
        if not self.timeout:
            self._loader.timeout = 0  # the script's timeout=0, as torch's: a wait as long as it takes
        lowering = self._fastdata_lowering
        native = self.collate_fn is native_collate or self._fastdata_mixing is not None
        self._fastdata_finish = None if lowering is None or not native else Finish(
            lowering, *self._ring_settings(), forks=self.num_workers > 0)
        working = self._loader
        if type(working.dataset) is NativeFolder and isinstance(working.collate_fn, RingCollate):
            working.dataset.rings = working.collate_fn.rings  # (its batches decoded into the collation's slots)

    def _working_collate(self) -> Any:
        # A collate_fn of the script's that mixes (`_mixup`): natively collated, mixed as it mixes
        mixing = self._fastdata_mixing = mixing_of(self.collate_fn, getattr(self, "_fastdata_lowering", None),
                                                  self.dataset)
        if mixing is None:
            if self.collate_fn is native_collate and self._carries():  # (fastdata's collation in workers it gave)
                return CarryingCollate(*self._ring_settings())
            return TorchCore._working_collate(self)
        if is_timm_collate(mixing):
            return TimmCollate(*self._ring_settings(), self.collate_fn)
        return MixCollate(*self._ring_settings(), self.collate_fn, mixing)

    def _fetched_from(self, dataset: Any) -> Any:
        lowering = getattr(self, "_fastdata_lowering", None)
        carry = self._carries()
        # (a collate_fn of the script's batches the samples: they are laid out where they are fetched)
        samples = self.collate_fn is not native_collate and self._fastdata_mixing is None
        if lowering is None:
            return dataset
        return (NativeArrays if lowering.in_memory else NativeFolder)(dataset, lowering, carry=carry, samples=samples)

    def _carries(self) -> bool:
        """Whether a batch's error crosses unwrapped from its workers: from workers fastdata gave,
        not from the script's own."""
        added = getattr(self, "_fastdata_added", 0)
        return added is True or (self.num_workers > 0 and self.num_workers == added)

    def _to_device(self, it: Any, timed: bool) -> Any:
        finish = getattr(self, "_fastdata_finish", None)
        if finish is not None:  # natively served: the batches' images in the transform's layout and dtype
            it = Fetches(iter(it), finish)  # an iterator that goes on after a batch that raised
        copy = getattr(self, "_fastdata_copy", None)
        return copy.batches(it) if copy is not None and self.device is None else TorchCore._to_device(self, it, timed)

    def __iter__(self) -> Any:
        why = self._workers_back()
        if why:
            print(f"fastdata run: the loader made at {self._fastdata_where} goes on without the {self.num_workers} "
                  f"workers fastdata gave it: {why}", file=sys.stderr)
            self._fastdata_added = self.num_workers = 0
        it = TorchCore.__iter__(self)
        timing = getattr(self, "_fastdata_timing", None)
        return it if timing is None else TimedPass(it, timing, self)

    def _workers_back(self) -> str | None:
        """Why the workers fastdata gave go back (the script's 0) at this iter(), or None (see the module)."""
        if not self._gave_workers():
            return None
        method = own_start_method()
        if method != "fork":
            return f"they would start by {method}, which runs the script's main module again"
        if lower_any(self.dataset)[0] is None:
            return "its dataset's transform is no longer one fastdata serves (its draws and state would move to them)"
        if target_transformed(self.dataset):
            return "its dataset has a target_transform now, the script's code (its state would move to them)"
        if self.collate_fn is not native_collate:
            return "it has a collate_fn of the script's now (its state and draws would move to them)"
        return None

    @property
    def multiprocessing_context(self) -> Any:
        return DataLoader.multiprocessing_context.fget(self)

    @multiprocessing_context.setter
    def multiprocessing_context(self, context: Any) -> None:
        # A context set on a loader whose workers fastdata gave gets torch's error for the
        # script's 0 workers (its setter raises without reading more than num_workers).
        if context is not None and self._gave_workers():
            DataLoader.multiprocessing_context.fset(types.SimpleNamespace(num_workers=0), context)
        DataLoader.multiprocessing_context.fset(self, context)

    def _gave_workers(self) -> bool:
        """Whether its workers are the ones fastdata gave (the script has not set a count since)."""
        added = getattr(self, "_fastdata_added", 0)
        return bool(added) and self.num_workers == added

    def _worker_context(self) -> Any:  # the workers fastdata gave start as fastdata's own (see _workers_back)
        ours = self._gave_workers() and self.multiprocessing_context is None
        return start_method(None, own=True) if ours else TorchCore._worker_context(self)

    def __getstate__(self) -> dict[str, Any]:
        state = TorchCore.__getstate__(self)
        state.pop("_fastdata_timing", None)  # a copy in another process is not this one's record
        state.pop("_fastdata_copy", None)
        return state


Served.__init__.__signature__ = SIGNATURE  # inspect.signature(loader.__init__): torch's
# torch's name in DataLoader's messages (DataLoader.__repr__ gives torch's repr); pickle looks up
# the qualname, Served
Served.__name__ = "DataLoader"


class _Working(TorchDataLoader):
    """A served loader's working DataLoader (see TorchCore), as the script sees torch's: its
    workers' `get_worker_info().dataset` is the script's dataset (not the NativeFolder that a
    natively served folder's batches are fetched from, which lists its samples for them before
    they start); with timeout 0 it waits for a batch as long as it takes (`wait_forever`)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "worker_init_fn" and isinstance(self.__dict__.get("dataset"), NativeFolder):
            value = functools.partial(_scripts_dataset, value)
        TorchDataLoader.__setattr__(self, name, value)

    def __iter__(self) -> Any:
        if self.num_workers and isinstance(self.dataset, NativeFolder):
            self.dataset.list_for_workers()
        it = TorchDataLoader.__iter__(self)
        if self.num_workers and not self.timeout:
            wait_forever(it)
        return it


def _scripts_dataset(init: Any, worker_id: int) -> None:
    """A natively served loader's worker_init_fn: `get_worker_info().dataset` the script's, then `init`."""
    info = torch.utils.data.get_worker_info()
    if info is not None and isinstance(info.dataset, NativeFolder):
        object.__setattr__(info, "dataset", info.dataset.dataset)  # WorkerInfo refuses a plain assignment
    if init is not None:
        init(worker_id)


def _copy_ahead() -> bool:
    return torch.cuda.is_available() and not os.environ.get("FASTDATA_RUN_NO_COPY")


def _where() -> str:
    """file:line of the first frame outside torch, fastdata, the trainers and installed libraries:
    where the script made the loader, or called the library that did (for a loader a trainer
    rebuilt, the call into the trainer); with no such frame, the first outside torch, fastdata
    and the trainers."""
    frame, library = sys._getframe(1), None
    while frame is not None:
        if frame.f_globals.get("__name__", "").split(".")[0] not in _LIBRARIES:
            here = f"{os.path.relpath(frame.f_code.co_filename)}:{frame.f_lineno}"
            if not _installed(frame.f_code.co_filename):
                return here
            library = library or here
        frame = frame.f_back
    return library or "?"


def _installed(path: str) -> bool:
    """Whether `path` is a file of the standard library or of an installed package (in a
    site-packages or dist-packages folder: a virtualenv's, the user's, a distribution's)."""
    return path.startswith(_STDLIB) or not {"site-packages", "dist-packages"}.isdisjoint(path.split(os.sep))


def _record(loader: Any, dataset: Any, decision: str, reason: str, cls: type) -> int | None:
    """Appends the decision to the run's record; the loader's number there (None: no record)."""
    out = os.environ.get("FASTDATA_RUN_DIR")
    if not out:
        return None
    line = {"pid": os.getpid(), "seq": next(_count), "where": _where(), "dataset": type(dataset).__qualname__,
            "loader": "DataLoader" if cls in (DataLoader, Served) else cls.__qualname__, "decision": decision,
            "reason": reason}
    if loader is not None:
        line["num_workers"], line["batch_size"] = loader.num_workers, loader.batch_size
        timing = getattr(loader, "_fastdata_timing", None)
        if timing is not None:
            timing.seq = line["seq"]
    _append(out, line)
    return line["seq"]


def _append(out: str, line: dict) -> None:
    with open(os.path.join(out, f"loaders-{os.getpid()}.jsonl"), "a") as f:
        f.write(json.dumps(line) + "\n")


def _write_at_exit(pid: int) -> None:
    """The served loaders' measurements and device copies, appended to the run's record."""
    out = os.environ.get("FASTDATA_RUN_DIR")
    if not out or os.getpid() != pid:  # a forked child inherits the handler, not the loaders
        return
    for ref, timing in _served:
        loader = ref()
        if loader is not None:
            timing.snapshot(loader)
        if timing.batches:
            _append(out, {"pid": pid, "seq": timing.seq, "profile": timing.to_json()})
    for seq, copy in _copying:
        if copy.device is not None:
            _append(out, {"pid": pid, "seq": seq, "copy": copy.to_json()})


def torch_loader() -> Any:
    """An empty torch DataLoader, for unpickling one (its state follows)."""
    return object.__new__(TorchDataLoader)


def _reduce_torch_loader(loader: Any) -> tuple:
    # pickle names a class by where it lives, and torch's own DataLoader (the working loader
    # inside a served one) no longer lives at torch.utils.data.dataloader.DataLoader
    return torch_loader, (), loader.__getstate__()


def install() -> None:
    """Puts `DataLoader` in the place of torch's, where scripts and trainers look it up."""
    if torch.utils.data.DataLoader is DataLoader:
        return
    copyreg.pickle(TorchDataLoader, _reduce_torch_loader)
    torch.utils.data.DataLoader = DataLoader
    torch.utils.data.dataloader.DataLoader = DataLoader
    if _copy_ahead():
        install_copy()
    atexit.register(_write_at_exit, os.getpid())
