"""The device copy `fastdata run` adds to a served loader: each batch crosses to the device the
script moves its batches to one batch ahead, on a side stream, while the script works on the
batch before.

The script is not changed, so where its batches go is learned from the script itself: the first
batch is handed out as is, and the first of its tensors that the script moves to another device
(`.to(...)`, `.cuda()`) names the destination. From then on each batch is copied there as it
comes from the workers, one batch ahead of the script, and the script still gets the host batch,
its tensors as they were. The script's `.to()` of one of those tensors then returns the copy
made ahead, once, instead of copying again: `Tensor.to` and `Tensor.cuda` are wrapped in the
process for that (`install`), and a tensor with no copy ahead pays one dict lookup. The copy is
not used, and the call does what it always does, when it asks for something else (another
device, a memory format, converting a floating-point tensor, whose rounding could differ between
devices), when the tensor was changed in place since the copy (its version counter moved), or
when it requires grad (torch's copy would be part of its graph). Writes that torch does not
count, through `.data` or a NumPy view, are not seen: `fastdata run --no-copy-ahead` for a
script that changes its host batches that way before it moves them.

Safety of the buffers: a batch is handed out only once its copy is done (the copy was started a
batch earlier, so this rarely waits), so the script may drop or overwrite the host batch at once;
the copy is handed to the script's stream with `record_stream`. A copy not asked for within two
batches is dropped (two, as a trainer may take the next batch before it moves this one: Lightning
does from a loader without len()), so a script that keeps host batches does not keep device
copies.

Only with workers: there the next batch is made whether or not it is taken early. With
num_workers=0 the dataset runs in the script's process when a batch is taken, and taking one
early would move its random draws before the script's step.
"""

from __future__ import annotations

import collections
import functools
import inspect
import weakref
from typing import Any, Iterator

import torch

from .._torch_internals import write_count
from ..device import tensors

_to = torch.Tensor.to
_cuda = torch.Tensor.cuda
# id(host tensor) -> its _Copy or _Watch; an entry is live while its weak reference still
# points at that tensor (an id is reused once a tensor dies).
_pending: dict[int, Any] = {}
_KEEP = 2  # batches an unused copy (or a watched batch) stays before it is dropped


def install() -> None:
    """Wraps `Tensor.to` and `Tensor.cuda` so that a tensor with a copy ahead is served from it."""
    if torch.Tensor.to is not to:
        torch.Tensor.to = to  # type: ignore[method-assign]
        torch.Tensor.cuda = cuda  # type: ignore[method-assign]


@functools.wraps(_to)
def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    entry = _entry(self)
    if entry is None:
        return _to(self, *args, **kwargs)
    out = entry.serve(self, _target(args, kwargs))
    if out is None:
        out = _to(self, *args, **kwargs)
        entry.saw(out)
    return out


@functools.wraps(_cuda)
def cuda(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    # The arguments reach torch as the script wrote them: torch parses them, and its errors
    # and results are the script's.
    entry = _entry(self)
    if entry is None:
        return _cuda(self, *args, **kwargs)
    out = entry.serve(self, _cuda_target(args, kwargs))
    if out is None:
        out = _cuda(self, *args, **kwargs)
        entry.saw(out)
    return out


# Pickled by reference as what they replace (torch.Tensor.to, a partial of it sent to a spawned
# worker, say): the name functools.wraps gives them, TensorBase.to, is not where they are.
to.__module__ = cuda.__module__ = "torch"
to.__qualname__, cuda.__qualname__ = "Tensor.to", "Tensor.cuda"


def _entry(t: torch.Tensor) -> Any:
    if not _pending or torch.compiler.is_compiling():
        return None
    entry = _pending.get(id(t))
    return entry if entry is not None and entry.ref() is t else None


def _to_device(device: Any = None, dtype: Any = None, non_blocking: bool = False, copy: bool = False, *,
               memory_format: Any = None) -> None:
    """`Tensor.to(device, dtype, ...)`, the first of its three forms as torch documents them."""


def _to_dtype(dtype: Any, non_blocking: bool = False, copy: bool = False, *, memory_format: Any = None) -> None:
    """`Tensor.to(dtype, ...)`."""


def _to_tensor(tensor: Any, non_blocking: bool = False, copy: bool = False, *, memory_format: Any = None) -> None:
    """`Tensor.to(tensor, ...)`: the other tensor's device and dtype."""


_TO = {form: inspect.signature(form) for form in (_to_device, _to_dtype, _to_tensor)}


def _target(args: tuple, kwargs: dict) -> tuple | None:
    """(device, dtype, memory_format) that a `.to` call asks for, or None for arguments `.to`
    would refuse, or that this does not know (an int device, a subclass's own arguments): the
    call then takes torch's path, to torch's result or error. Parsed here rather than by torch's
    private parser, which refuses `copy`."""
    first = args[0] if args else None
    if isinstance(first, torch.Tensor) or "tensor" in kwargs:
        form = _to_tensor
    elif isinstance(first, torch.dtype):
        form = _to_dtype
    else:
        form = _to_device
    try:
        call = _TO[form].bind(*args, **kwargs).arguments
    except TypeError:
        return None
    if not _flags(call):
        return None
    memory_format = call.get("memory_format")
    if memory_format is not None and not isinstance(memory_format, torch.memory_format):
        return None
    if form is _to_tensor:
        other = call["tensor"]
        return (other.device, other.dtype, memory_format) if isinstance(other, torch.Tensor) else None
    device, dtype = call.get("device"), call.get("dtype")
    if dtype is not None and not isinstance(dtype, torch.dtype):
        return None
    if device is not None:
        device = _device(device)
        if device is None:
            return None
    return device, dtype, memory_format


def _flags(call: dict) -> bool:
    """Whether non_blocking and copy, where given, are bools: torch refuses others (a tensor in
    dtype's place binds to non_blocking here), and says so on its own path."""
    return all(type(call.get(k, False)) is bool for k in ("non_blocking", "copy"))


def _device(value: Any) -> torch.device | None:
    """A device named by a string or a torch.device, or None for anything else (an int's
    meaning is torch's to say) or a name torch refuses."""
    if not isinstance(value, (str, torch.device)):
        return None
    try:
        return torch.device(value)
    except (RuntimeError, TypeError, ValueError):
        return None


def _cuda_signature(device: Any = None, non_blocking: bool = False, *,
                    memory_format: torch.memory_format = torch.preserve_format) -> None:
    """`Tensor.cuda`'s signature, as torch documents and parses it."""


_CUDA = inspect.signature(_cuda_signature)


def _cuda_target(args: tuple, kwargs: dict) -> tuple | None:
    """(device, dtype, memory_format) that a `.cuda` call asks for, or None for arguments
    `.cuda` itself would refuse (or that this does not know): the call then takes its usual path."""
    try:
        call = _CUDA.bind(*args, **kwargs).arguments
    except TypeError:
        return None
    if not _flags(call):
        return None
    device = call.get("device")
    if device is None:
        where = torch.device("cuda")
    elif isinstance(device, int) and not isinstance(device, bool):
        where = _device(f"cuda:{device}")
    else:
        where = _device(device)
    if where is None or where.type != "cuda":  # torch refuses it: let it say so
        return None
    return where, None, call.get("memory_format", torch.preserve_format)


def _same_device(asked: torch.device | None, have: torch.device) -> bool:
    if asked is None or asked.type != have.type:
        return False
    if asked.index is None and asked.type == "cuda":
        asked = torch.device("cuda", torch.cuda.current_device())
    return asked.index is None or asked == have


class CopyAhead:
    """A served loader's copy stage: the destination learned, the side stream, and counts of
    the copies made and the ones the script took."""

    def __init__(self) -> None:
        self.device: torch.device | None = None
        self.stream: Any = None
        self.made = self.served = 0

    def batches(self, it: Iterator[Any]) -> Iterator[Any]:
        return _Pass(self, it)

    def learn(self, device: torch.device) -> None:
        if self.device is None:
            self.device = device

    def start(self, host: Any) -> tuple:
        """Starts copying `host`'s CPU tensors to the destination: (host, [(tensor, copy)], done)."""
        leaves = [t for t in tensors(host) if t.device.type == "cpu"]
        if self.device.type != "cuda":
            return host, [(t, _to(t, self.device)) for t in leaves], None
        if self.stream is None:
            self.stream = torch.cuda.Stream(self.device)
        with torch.cuda.stream(self.stream):
            copies = [(t, _to(t, self.device, non_blocking=True)) for t in leaves]
            done = torch.cuda.Event()
            done.record(self.stream)
        return host, copies, done

    def to_json(self) -> dict[str, Any]:
        return {"device": str(self.device) if self.device is not None else None,
                "copies": self.made, "taken": self.served}


class _Watch:
    """A tensor of a batch handed out before the destination is known: its move names it."""

    __slots__ = ("ref", "ahead")

    def __init__(self, t: torch.Tensor, ahead: CopyAhead) -> None:
        self.ref, self.ahead = _ref(t), ahead

    def serve(self, t: torch.Tensor, target: Any) -> None:
        return None

    def saw(self, out: Any) -> None:
        if isinstance(out, torch.Tensor) and out.device.type != "cpu":  # (the watched tensors are on the CPU)
            self.ahead.learn(out.device)


class _Copy:
    """A tensor of a batch handed out with its copy on the destination."""

    __slots__ = ("ref", "version", "copy", "ahead")

    def __init__(self, t: torch.Tensor, copy: torch.Tensor, ahead: CopyAhead) -> None:
        self.ref, self.version, self.copy, self.ahead = _ref(t), write_count(t), copy, ahead

    def serve(self, t: torch.Tensor, target: tuple | None) -> torch.Tensor | None:
        if target is None:
            return None
        device, dtype, memory_format = target
        if memory_format not in (None, torch.preserve_format) or not _same_device(device, self.copy.device):
            return None
        convert = dtype is not None and dtype != t.dtype
        if convert and (t.is_floating_point() or t.is_complex()):
            return None
        if write_count(t) != self.version or t.requires_grad:  # (torch's copy would link back to t)
            return None
        del _pending[id(t)]
        copy, self.copy = self.copy, None
        if copy.is_cuda:
            copy.record_stream(torch.cuda.current_stream(copy.device))
        self.ahead.served += 1
        return _to(copy, dtype) if convert else copy

    def saw(self, out: Any) -> None:
        pass


class _Pass:
    """One pass's batches, each handed out once its copy is done while the next one's copy runs.
    A dataset error from the next batch is raised after the batch before it is handed out, and
    the pass goes on past it as the loader's own would."""

    def __init__(self, ahead: CopyAhead, it: Iterator[Any]) -> None:
        self.ahead, self.it = ahead, it
        self.held: tuple | None = None
        self.error: BaseException | None = None
        self.recent: collections.deque = collections.deque()

    def __iter__(self) -> "_Pass":
        return self

    def __next__(self) -> Any:
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        ahead = self.ahead
        if ahead.device is None:
            batch = next(self.it)
            self._hand_out([(t, _Watch(t, ahead)) for t in tensors(batch) if t.device.type == "cpu"])
            return batch
        if self.held is None:
            self.held = ahead.start(next(self.it))
        try:
            following = next(self.it)
        except StopIteration:
            out, self.held = self.held, None
        except Exception as e:
            out, self.held = self.held, None
            self.error = e
        else:
            out, self.held = self.held, ahead.start(following)
        host, copies, done = out
        if done is not None:
            done.synchronize()
        ahead.made += len(copies)
        self._hand_out([(t, _Copy(t, copy, ahead)) for t, copy in copies])
        return host

    def _hand_out(self, entries: list) -> None:
        """Registers a batch's entries and drops those of the batch `_KEEP` before it."""
        for t, entry in entries:
            _pending[id(t)] = entry
        self.recent.append([(id(t), entry) for t, entry in entries])
        while len(self.recent) > _KEEP:
            for key, entry in self.recent.popleft():
                if _pending.get(key) is entry:
                    del _pending[key]


def _ref(t: torch.Tensor) -> weakref.ref:
    """A weak reference to `t` whose death drops `t`'s entry (and with it a copy never asked for)."""
    key = id(t)

    def forget(ref: weakref.ref) -> None:
        entry = _pending.get(key)
        if entry is not None and entry.ref is ref:
            del _pending[key]

    return weakref.ref(t, forget)
