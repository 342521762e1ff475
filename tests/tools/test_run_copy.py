"""`fastdata run`'s copy ahead (fastdata/run/_copy.py), on the CPU: the destination learned from
the script's first move, the script's `.to()` served from the copy made ahead only where it
gives what the call would, unused copies dropped, and a dataset error raised in its place.

Here the destination is the meta device (shapes and dtypes, no values), the only one a CPU
machine has; tests/tools/test_run.py::test_gpu_same_batches_copied_ahead checks the values on a GPU."""

import gc

import pytest
import torch

from fastdata.run import _copy as _run_copy
from fastdata.run._copy import CopyAhead


@pytest.fixture(autouse=True)
def wrapped():
    before = torch.Tensor.to, torch.Tensor.cuda
    _run_copy.install()
    yield
    torch.Tensor.to, torch.Tensor.cuda = before
    _run_copy._pending.clear()


class Source:
    """Batch k: images whose every value is k, labels k..k+3, a dict of ids; at `fail_at` a
    ValueError instead, and the batches after it, as DataLoader's iterator goes on after a
    dataset error."""

    def __init__(self, n, fail_at=None):
        self.k, self.n, self.fail_at = 0, n, fail_at

    def __iter__(self):
        return self

    def __next__(self):
        k = self.k
        if k == self.n:
            raise StopIteration
        self.k += 1
        if k == self.fail_at:
            raise ValueError(f"sample {k} is bad")
        return torch.full((4, 3, 2, 2), k, dtype=torch.uint8), torch.arange(k, k + 4), {"ids": torch.arange(4) + 4 * k}


def test_learns_the_destination_then_serves_each_move():
    ahead = CopyAhead()
    moved = []
    for k, (x, y, extra) in enumerate(ahead.batches(Source(5))):
        assert int(x[0, 0, 0, 0]) == k and y.tolist() == list(range(k, k + 4))  # the host batch, as made
        before = ahead.served
        gx, gy = x.to("meta", non_blocking=True), y.to(torch.device("meta"))
        moved.append(ahead.served - before)
        assert gx.device.type == gy.device.type == "meta" and gx.shape == x.shape and gy.dtype == y.dtype
        assert x.device.type == "cpu"
    # batch 0 names the destination; from batch 1 on both moves are served, ids never asked for
    assert moved == [0, 2, 2, 2, 2] and ahead.device == torch.device("meta")
    assert ahead.made == 4 * 3 and ahead.served == 8


def test_served_once_and_only_for_what_the_call_would_give():
    ahead = CopyAhead()
    ahead.learn(torch.device("meta"))
    it = ahead.batches(Source(6))
    x, y, _ = next(it)
    assert x.to("meta") is not None and ahead.served == 1
    x.to("meta")
    assert ahead.served == 1  # taken once: a second move copies again, as it always did
    y.to("meta", torch.float32)
    assert ahead.served == 2  # an integer tensor converted: exact on any device

    x, y, _ = next(it)
    x = x.float()
    x.to("meta")  # a new tensor (float() on the host): its own copy
    y.to(torch.float32)  # no device asked: a host conversion
    assert ahead.served == 2
    assert y.to("meta").dtype == torch.int64 and ahead.served == 3

    x, y, _ = next(it)
    x.add_(1)  # changed in place after its copy was made: the copy is stale
    assert x.to("meta") is not None and ahead.served == 3
    y.float().to("meta")
    f = torch.zeros(2)
    assert f.to("meta").device.type == "meta"  # never handed out: untouched
    assert ahead.served == 3

    x, y, _ = next(it)
    x.to("meta", memory_format=torch.channels_last)
    x.to("cpu")
    assert ahead.served == 3
    x.to("meta", copy=True)
    assert ahead.served == 4


def test_a_float_batch_is_not_converted_from_the_copy():
    ahead = CopyAhead()
    ahead.learn(torch.device("meta"))
    for x in ahead.batches(iter([torch.rand(3), torch.rand(3)])):
        assert x.to("meta", torch.float16).dtype == torch.float16
        assert x.to("meta").dtype == torch.float32
    assert ahead.served == 2 and ahead.made == 2


def test_unused_copies_are_dropped():
    ahead = CopyAhead()
    ahead.learn(torch.device("meta"))
    kept = []
    for batch in ahead.batches(Source(10)):
        kept.append(batch)  # a script that keeps every host batch and never moves one
        assert len(_run_copy._pending) <= _run_copy._KEEP * 3
    assert ahead.served == 0 and ahead.made == 30
    del batch
    kept.clear()
    gc.collect()
    assert not _run_copy._pending


def test_a_compiled_step_under_the_wrapped_to_gives_torchs_results_in_one_graph():
    """`torch.compile` over a step that moves and converts the batch's tensors, first compiled
    while copies of them wait: torch's values, one graph for the pass (no break, no recompile as
    the copies come and go), and the moves it makes, run by the graph, served as eager ones are."""
    import torch._dynamo

    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()

    def step(x, y):
        moved = y.to("meta", non_blocking=True)
        value = x.to(torch.float32).sum() + y.to(dtype=torch.float64).mean() + x.to("cpu", copy=True).double().max()
        return value, moved

    compiled = torch.compile(step, backend="eager")
    ahead = CopyAhead()
    for k, (x, y, extra) in enumerate(ahead.batches(Source(8))):
        x.to("meta")
        if k < 2:
            continue  # compiled first at batch 2, with copies of its tensors waiting
        before = ahead.served
        value, moved = compiled(x, y)
        assert float(value) == float(step(x, y)[0]) == 4 * 3 * 2 * 2 * k + (k + 1.5) + k
        assert moved.device.type == "meta" and moved.dtype == y.dtype and ahead.served == before + 1
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"] and not counters["recompiles"]
    torch._dynamo.reset()


def test_a_trainer_one_batch_behind_is_served():
    # Lightning takes batch k+1 before it moves batch k
    ahead = CopyAhead()
    it = ahead.batches(Source(6))
    previous = next(it)
    for batch in it:
        previous[0].to("meta")
        previous = batch
    previous[0].to("meta")
    # all but batches 0 and 1, handed out before batch 0's move named the destination
    assert ahead.served == 4 and ahead.made == 4 * 3


def test_a_dataset_error_comes_in_its_place_and_the_pass_goes_on():
    ahead = CopyAhead()
    ahead.learn(torch.device("meta"))
    it = ahead.batches(Source(6, fail_at=3))
    got = []
    while True:
        try:
            x, *_ = next(it)
        except StopIteration:
            break
        except ValueError as e:
            got.append(str(e))
            continue
        x.to("meta")
        got.append(int(x[0, 0, 0, 0]))
    assert got == [0, 1, 2, "sample 3 is bad", 4, 5]
    assert ahead.served == 5


class Indexed(torch.utils.data.Dataset):
    """Sample i: a 2x2 image of value i % 256, and i."""

    def __len__(self):
        return 40

    def __getitem__(self, i):
        return torch.full((2, 2), i % 256, dtype=torch.uint8), i


def test_a_served_loader_with_workers_copies_ahead(monkeypatch):
    from fastdata.run import _hook as _run_hook

    def make(cls):
        return cls(Indexed(), batch_size=4, shuffle=True, num_workers=2, generator=torch.Generator().manual_seed(0))

    torch_loader = make(torch.utils.data.DataLoader)
    want = [[i for _, i in torch_loader] for _ in range(2)]
    monkeypatch.setattr(_run_hook, "_copy_ahead", lambda: True)  # as where CUDA is
    loader = make(_run_hook.DataLoader)
    assert type(loader) is _run_hook.Served and loader._fastdata_copy is not None
    for epoch in range(2):
        for k, (x, i) in enumerate(loader):
            assert torch.equal(i, want[epoch][k]) and torch.equal(x[:, 0, 0], (i % 256).to(torch.uint8))
            assert x.to("meta").shape == (4, 2, 2)
            if epoch == 1 and k == 4:
                # (the state a newer pass's start takes of this one: see LoaderCore._supersede)
                state = loader._state_dict()  # counts the batches handed out, not the one copied ahead
                break
    copy = loader._fastdata_copy
    # batch 0 named the destination; x of every later batch served, its ids copied and never asked for
    assert copy.device == torch.device("meta") and copy.served == 9 + 5 and copy.made == 2 * copy.served
    assert state["batches"] == 5
    resumed = make(_run_hook.DataLoader)
    resumed._load_state_dict(state)
    assert torch.equal(torch.cat([i for _, i in resumed]), torch.cat(want[1][5:]))
