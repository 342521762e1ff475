"""`fastdata run` wraps `Tensor.to` and `Tensor.cuda` in the script's process (fastdata/run/_copy.py).
Every documented form of each call, and forms torch refuses, must give torch's own result or
torch's own error through the wrappers: on a tensor that is not a batch, on a batch tensor with
a copy made ahead (served from it or not), and through `Module.to`, `Module.cuda` and
`pin_memory()`. Each form is run once on torch's own methods and once on the wrapped ones, and
the outcomes (device, dtype, shape, strides, values, whether the tensor itself came back; or
the exception's type and message) must be equal.

On a machine without CUDA every `.cuda` form raises, and the errors are compared; the copies
ahead go to the meta device there. With CUDA, the same forms run against cuda:0.

It also replaces `torch.utils.data.DataLoader` (fastdata/run/_hook.py): `inspect.signature` of
the class, of a loader's `__init__` and of the script's subclasses, and subscripting it
(`DataLoader[T]`, torch's is Generic), must be as on torch's own class (the end of this file)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fastdata.run import _copy as _run_copy
from fastdata.run._copy import CopyAhead

CUDA = torch.cuda.is_available()
DESTINATIONS = ["meta"] + (["cuda"] if CUDA else [])
ORIGINAL = {"to": torch.Tensor.to, "cuda": torch.Tensor.cuda}


def _batch() -> torch.Tensor:
    # values that say where each one came from: a wrong copy or a wrong layout shows
    return torch.arange(2 * 3 * 4 * 5, dtype=torch.uint8).view(2, 3, 4, 5)


OTHER = {"meta-f64": torch.zeros(1, dtype=torch.float64, device="meta"), "cpu-i32": torch.zeros(1, dtype=torch.int32)}
if CUDA:
    OTHER["cuda-f16"] = torch.zeros(1, dtype=torch.float16, device="cuda")

# (args, kwargs) of Tensor.to: its three documented forms, positional and keyword, and what torch refuses
TO_FORMS = [
    ((), {}),
    (("cpu",), {}), ((torch.device("cpu"),), {}), (("meta",), {}), ((), {"device": "meta"}),
    ((torch.device("meta"),), {"non_blocking": True}),
    ((torch.float64,), {}), ((), {"dtype": torch.float16}), ((torch.int64, True), {}), ((torch.uint8,), {"copy": True}),
    ((torch.uint8, False, True), {}),
    (("meta", torch.float64), {}), (("meta",), {"dtype": torch.int32}), ((), {"device": "meta", "dtype": torch.int16}),
    (("meta", None, True), {}), (("meta", torch.int64, True, True), {}), (("meta",), {"copy": True}),
    (("cpu",), {"copy": True}), (("cpu", None, False, True), {}),
    (("meta",), {"memory_format": torch.channels_last}), (("cpu",), {"memory_format": torch.channels_last}),
    ((), {"memory_format": torch.contiguous_format}), (("meta",), {"memory_format": torch.preserve_format}),
    ((OTHER["meta-f64"],), {}), ((OTHER["cpu-i32"], True), {}), ((OTHER["meta-f64"], False, True), {}),
    ((), {"tensor": OTHER["meta-f64"]}), ((OTHER["cpu-i32"],), {"non_blocking": True, "copy": True}),
    # refused by torch: its errors must come through unchanged
    (("nonsense",), {}), ((1.5,), {}), (("cpu",), {"bogus": 1}), (("cpu", torch.float32, True, True, torch.channels_last), {}),
    ((torch.float32, "cpu"), {}), (("cpu", "meta"), {}), ((), {"device": "cpu", "dtype": "float"}),
    ((), {"other": OTHER["meta-f64"]}), (("meta",), {"memory_format": "channels_last"}), ((0,), {}),
    (("cuda",), {}), (("cuda:0", torch.float16), {}),
    ((OTHER["meta-f64"], torch.int32), {}), (("meta",), {"non_blocking": "yes"}), (("meta",), {"copy": 1}),
    (("meta", torch.int64, 1), {}),
]
if CUDA:
    TO_FORMS += [(("cuda",), {"non_blocking": True}), ((torch.device("cuda", 0), torch.float32), {}),
                 ((OTHER["cuda-f16"],), {}), ((0,), {"non_blocking": True})]

# (args, kwargs) of Tensor.cuda(device=None, non_blocking=False, *, memory_format=torch.preserve_format)
CUDA_FORMS = [
    ((), {}), ((0,), {}), (("cuda",), {}), (("cuda:0",), {}), ((torch.device("cuda", 0),), {}), ((), {"device": 0}),
    ((None, True), {}), ((0,), {"non_blocking": True}), ((), {"non_blocking": True}), ((0, True), {}),
    ((), {"memory_format": torch.channels_last}), ((0, False), {"memory_format": torch.contiguous_format}),
    ((), {"device": "cuda", "non_blocking": True, "memory_format": torch.preserve_format}),
    # refused by torch
    ((0, True, torch.channels_last), {}), (("cpu",), {}), ((), {"bogus": 1}), ((1.5,), {}), ((0, True, True), {}),
    ((), {"memory_format": "channels_last"}), (("meta",), {}), ((0, 1), {}), ((), {"non_blocking": "yes"}),
]


def _ids(forms):
    return [f"{args!r:.60} {kwargs!r:.60}" for args, kwargs in forms]


def outcome(t: torch.Tensor | None, call) -> tuple:
    """What `call()` gives: a description of the tensor (or module) it returns, or its error."""
    try:
        out = call()
    except Exception as e:  # the error itself is the outcome compared
        return ("raised", type(e).__name__, str(e))
    return ("returned", describe(out, t))


def describe(out, t: torch.Tensor | None) -> tuple:
    if isinstance(out, nn.Module):
        return tuple((name, describe(p, None)) for name, p in out.named_parameters())
    values = None if out.device.type == "meta" else out.cpu().tolist()
    return (out.device, out.dtype, tuple(out.shape), out.stride(), out is t, values)


@pytest.fixture()
def wrapped():
    _run_copy.install()
    yield
    torch.Tensor.to, torch.Tensor.cuda = ORIGINAL["to"], ORIGINAL["cuda"]
    _run_copy._pending.clear()


def torchs(method: str, t: torch.Tensor, args: tuple, kwargs: dict) -> tuple:
    return outcome(t, lambda: ORIGINAL[method](t, *args, **kwargs))


def wrappers(method: str, t: torch.Tensor, args: tuple, kwargs: dict) -> tuple:
    return outcome(t, lambda: getattr(t, method)(*args, **kwargs))


def with_copy_ahead(destination: str) -> tuple[torch.Tensor, CopyAhead]:
    """A batch tensor as `fastdata run` hands it to the script: its copy to `destination` made
    ahead, waiting for the script's move."""
    ahead = CopyAhead()
    ahead.learn(torch.device(destination))
    it = ahead.batches(iter([_batch(), _batch() + 1]))
    x = next(it)
    assert _run_copy._entry(x) is not None
    return x, ahead


@pytest.mark.parametrize("args,kwargs", TO_FORMS, ids=_ids(TO_FORMS))
def test_to_on_any_tensor_is_torchs(wrapped, args, kwargs):
    t = _batch()
    assert wrappers("to", t, args, kwargs) == torchs("to", t, args, kwargs)


@pytest.mark.parametrize("destination", DESTINATIONS)
@pytest.mark.parametrize("args,kwargs", TO_FORMS, ids=_ids(TO_FORMS))
def test_to_on_a_batch_with_a_copy_ahead_is_torchs(wrapped, destination, args, kwargs):
    x, ahead = with_copy_ahead(destination)
    reference = _batch()
    got, want = wrappers("to", x, args, kwargs), torchs("to", reference, args, kwargs)
    assert got == want
    assert x.tolist() == reference.tolist()  # the host batch is the script's, unchanged


@pytest.mark.parametrize("args,kwargs", CUDA_FORMS, ids=_ids(CUDA_FORMS))
def test_cuda_on_any_tensor_is_torchs(wrapped, args, kwargs):
    t = _batch()
    assert wrappers("cuda", t, args, kwargs) == torchs("cuda", _batch(), args, kwargs)


@pytest.mark.parametrize("destination", DESTINATIONS)
@pytest.mark.parametrize("args,kwargs", CUDA_FORMS, ids=_ids(CUDA_FORMS))
def test_cuda_on_a_batch_with_a_copy_ahead_is_torchs(wrapped, destination, args, kwargs):
    x, _ = with_copy_ahead(destination)
    assert wrappers("cuda", x, args, kwargs) == torchs("cuda", _batch(), args, kwargs)


def test_a_served_move_is_served(wrapped):
    """The forms the copy serves are served (or the tests above would pass with no copy ahead)."""
    served = 0
    for args, kwargs in [(("meta",), {}), (("meta",), {"non_blocking": True}), (("meta", torch.int64, True, True), {}),
                         (("meta",), {"copy": True}), ((), {"device": "meta", "dtype": torch.int16})]:
        x, ahead = with_copy_ahead("meta")
        x.to(*args, **kwargs)
        served += ahead.served
    assert served == 5


def test_a_batch_that_requires_grad_is_moved_by_torch(wrapped):
    """Marked for a gradient after its copy was made (saliency, adversarial examples): the move
    is torch's, part of the graph, so the gradient reaches the host tensor."""
    ahead = CopyAhead()
    ahead.learn(torch.device("meta"))
    it = ahead.batches(iter([torch.rand(2, 3), torch.rand(2, 3)]))
    x = next(it)
    assert _run_copy._entry(x) is not None
    x.requires_grad_()
    moved = x.to("meta")
    assert ahead.served == 0 and moved.requires_grad and moved.grad_fn is not None


def test_the_wrappers_pickle_as_torchs():
    """By reference, as what they replace: a partial of Tensor.to reaches a spawned worker."""
    import functools
    import pickle

    from fastdata.run import _copy

    before = torch.Tensor.to, torch.Tensor.cuda
    _copy.install()
    try:
        assert pickle.loads(pickle.dumps(torch.Tensor.to)) is torch.Tensor.to is _copy.to
        assert pickle.loads(pickle.dumps(torch.Tensor.cuda)) is _copy.cuda
        half = pickle.loads(pickle.dumps(functools.partial(torch.Tensor.to, dtype=torch.float16)))
        assert half(torch.zeros(2)).dtype == torch.float16
    finally:
        torch.Tensor.to, torch.Tensor.cuda = before


MODULE_FORMS = [
    (("meta",), {}), ((torch.float64,), {}), (("cpu", torch.float16), {}), ((), {"memory_format": torch.channels_last}),
    (("cpu",), {"non_blocking": True}), ((OTHER["meta-f64"],), {}), ((torch.int64,), {}), (("nonsense",), {}),
]


@pytest.mark.parametrize("args,kwargs", MODULE_FORMS, ids=_ids(MODULE_FORMS))
def test_module_to_is_torchs(args, kwargs):
    def moved(wrap: bool) -> tuple:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
        if wrap:
            _run_copy.install()
        try:
            return outcome(None, lambda: model.to(*args, **kwargs))
        finally:
            torch.Tensor.to, torch.Tensor.cuda = ORIGINAL["to"], ORIGINAL["cuda"]

    assert moved(True) == moved(False)


@pytest.mark.parametrize("args,kwargs", [((), {}), ((0,), {}), ((), {"device": "cuda:0"})])
def test_module_cuda_and_pin_memory_are_torchs(args, kwargs):
    def results(wrap: bool) -> tuple:
        torch.manual_seed(0)
        model = nn.Linear(3, 2)
        t = _batch()
        if wrap:
            _run_copy.install()
        try:
            return outcome(None, lambda: model.cuda(*args, **kwargs)), outcome(t, t.pin_memory)
        finally:
            torch.Tensor.to, torch.Tensor.cuda = ORIGINAL["to"], ORIGINAL["cuda"]

    assert results(True) == results(False)


# -- the DataLoader class the hook puts in torch's place: its signatures and its type parameter


class _Stream(torch.utils.data.IterableDataset):
    """A dataset `fastdata run` leaves to torch's DataLoader."""

    def __iter__(self):
        return iter(torch.arange(8.0))


def _shapes(base: type) -> dict[str, type]:
    """The ways a script subclasses DataLoader, on `base` (torch's class or the hook's)."""

    class Own(base):
        def __init__(self, data, bs, tag="x", **kw):
            super().__init__(data, batch_size=bs, **kw)

    class Inherited(Own):
        pass

    class Bare(base):
        pass

    class WithNew(base):
        def __new__(cls, data, *, seed=0):
            return super().__new__(cls)

    class Typed(base[int]):
        pass

    return {"own __init__": Own, "inherited __init__": Inherited, "no __init__": Bare, "own __new__": WithNew,
            "DataLoader[int] subclass": Typed}


def test_dataloader_signatures_are_torchs():
    """A script that keeps the config keys DataLoader takes (`inspect.signature(DataLoader)
    .parameters`) passes them all, as with torch's class."""
    import inspect

    from torch.utils.data import TensorDataset

    from fastdata.run import _hook

    torchs = _hook.TorchDataLoader
    assert inspect.signature(_hook.DataLoader) == inspect.signature(torchs)
    assert "batch_size" in inspect.signature(_hook.DataLoader).parameters
    assert inspect.signature(_hook.Served) == inspect.signature(torchs)
    ds = TensorDataset(torch.arange(8.0))
    served, fell_back, plain = _hook.DataLoader(ds, batch_size=4), _hook.DataLoader(_Stream()), torchs(ds)
    assert type(served) is _hook.Served and type(fell_back) is _hook.DataLoader
    for loader in (served, fell_back):
        assert inspect.signature(loader.__init__) == inspect.signature(plain.__init__)
        assert inspect.signature(type(loader).__init__) == inspect.signature(torchs.__init__)
    mine, theirs = _shapes(_hook.DataLoader), _shapes(torchs)
    for shape in theirs:
        assert inspect.signature(mine[shape]) == inspect.signature(theirs[shape]), shape


def test_a_served_loader_goes_by_torchs_name():
    """DataLoader's own messages name the class (`self.__class__.__name__`), as do scripts that
    log type(loader).__name__: a served loader's says DataLoader, and its repr is the one torch's
    DataLoader has (object's, which names torch's module and class)."""
    from torch.utils.data import TensorDataset

    from fastdata.run import _hook

    ds = TensorDataset(torch.arange(8.0))
    errors = []
    own = _hook.DataLoader(_Stream(), batch_size=4)  # torch's own: an IterableDataset
    assert type(own) is _hook.DataLoader
    for loader in (_hook.DataLoader(ds, batch_size=4), own, _hook.TorchDataLoader(ds, batch_size=4)):
        assert type(loader).__name__ == "DataLoader"
        assert repr(loader) == f"<torch.utils.data.dataloader.DataLoader object at {hex(id(loader))}>"
        with pytest.raises(ValueError) as e:
            loader.batch_size = 3
        errors.append(str(e.value))
    assert type(_hook.DataLoader(ds, batch_size=4)) is _hook.Served
    assert errors[0] == errors[1] == errors[2] == "batch_size attribute should not be set after DataLoader is initialized"


def test_dataloader_is_generic_as_torchs():
    """`DataLoader[T]` in annotations and base classes: subscripted as torch's; a subclass of
    `DataLoader[int]` is the script's own subclass, torch's DataLoader unchanged (as any)."""
    import typing

    from torch.utils.data import TensorDataset

    from fastdata.run import _hook

    torchs = _hook.TorchDataLoader
    assert _hook.DataLoader.__parameters__ == torchs.__parameters__
    assert typing.get_args(_hook.DataLoader[typing.Any]) == (typing.Any,)
    assert typing.get_origin(_hook.DataLoader[int]) is _hook.DataLoader
    ds = TensorDataset(torch.arange(10.0))
    served = _hook.DataLoader[int](ds, batch_size=4)
    assert type(served) is _hook.Served and typing.get_args(type(served)[int]) == (int,)  # type(loader)[T] too
    typed = _shapes(_hook.DataLoader)["DataLoader[int] subclass"](ds, batch_size=4)
    assert type(typed).__name__ == "Typed" and isinstance(typed, torchs) and isinstance(typed, _hook.DataLoader)
    assert [b[0].tolist() for b in typed] == [b[0].tolist() for b in torchs(ds, batch_size=4)]
