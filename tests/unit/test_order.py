"""The batch order and the rank split, directly: `fastdata._ranks` against torch's
DistributedSampler, `FileOrder` and `ShardOrder` as pure functions of (seed, epoch, rank)."""

from __future__ import annotations

import numpy as np
import pytest
from torch.utils.data import DistributedSampler

from fastdata._ranks import per_rank, ranks, share
from fastdata.image.order import FileOrder, ShardOrder
from fastdata.image.parts import BatchOrder


@pytest.mark.parametrize("n, world, drop_last", [(10, 3, False), (10, 3, True), (9, 3, False), (2, 5, False),
                                                 (7, 1, False)])
def test_a_ranks_share_is_distributed_samplers(n, world, drop_last):
    order = np.random.default_rng(n).permutation(n)
    for rank in range(world):
        torch_share = list(DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=False,
                                              drop_last=drop_last))
        assert share(order, rank, world, drop_last).tolist() == order[torch_share].tolist()
        assert len(torch_share) == per_rank(n, world, drop_last)


def test_ranks_as_given_else_one_process():
    assert ranks(None, None) == (0, 1)
    assert ranks(2, 4) == (2, 4)
    for bad in ((4, 4), (-1, 2)):
        with pytest.raises(ValueError, match=r"rank should be in \[0, world_size\)"):
            ranks(*bad)


def _epoch(order, epoch: int) -> list[int]:
    return [key[1] for k in range(len(order)) for key in order.keys(epoch, k)]


@pytest.mark.parametrize("drop_last", [False, True])
def test_file_order_splits_each_epoch_among_the_ranks(drop_last):
    n, batch, world = 23, 4, 3
    orders = [FileOrder(n, batch, True, drop_last, seed=5, rank=r, world_size=world) for r in range(world)]
    assert isinstance(orders[0], BatchOrder)
    for epoch in (0, 1):
        got = [_epoch(o, epoch) for o in orders]
        assert len({len(g) for g in got}) == 1 and len({len(o) for o in orders}) == 1  # equal shares
        seen = [i for g in got for i in g]
        if drop_last:
            assert len(seen) == len(set(seen)) == world * (n // world // batch) * batch  # whole batches
        else:
            assert set(seen) == set(range(n)) and len(seen) == per_rank(n, world, False) * world
    assert _epoch(orders[0], 0) != _epoch(orders[0], 1)  # a new permutation each epoch
    again = FileOrder(n, batch, True, drop_last, seed=5, rank=0, world_size=world)
    assert _epoch(again, 1) == _epoch(orders[0], 1)  # a function of (seed, epoch, rank) alone
    plain = FileOrder(n, batch, False, False, seed=5, rank=2, world_size=world)
    assert _epoch(plain, 3) == list(range(2, n, world)) + [0]  # strided, the last rank padded by wrapping
    # The padding's repeat of sample 0 draws its own crop: keyed 0 + n, where sample 0 is keyed 0.
    first = FileOrder(n, batch, False, False, seed=5, rank=0, world_size=world)
    assert plain.keys(3, len(plain) - 1)[-1] == (3, 0, n) and first.keys(3, 0)[0] == (3, 0, 0)
    assert all(len(key) == 2 for key in FileOrder(24, batch, True, False, 5, 1, world).keys(0, 0))  # none repeat


MIB = 1 << 20
SIZES = {  # 30 samples' lengths in the shards
    "unknown": None,
    "small": np.full(30, 100_000),
    "64 MiB": np.full(30, 64 * MIB),
    "1 TiB": np.full(30, 1 << 40),
    "skewed": np.where(np.arange(30) % 7 == 3, 200 * MIB, 10_000),  # a few large among small ones
}


@pytest.mark.parametrize("world, lanes", [(1, 1), (1, 3), (2, 2)])
@pytest.mark.parametrize("sizes", SIZES)
def test_shard_order_reads_every_sample_once_an_epoch(world, lanes, sizes):
    """Blocks of whole batches: 1024 samples' worth, cut short where the samples would pass
    256 MiB in the epoch's order (the most batches that do not), and never less than a batch."""
    counts = np.array([5, 7, 3, 9, 6])  # 30 samples
    batch, most = 3, 1026
    lengths = SIZES[sizes]
    for epoch in (0, 1):
        seen = []
        for rank in range(world):
            order = ShardOrder(counts, batch, True, False, seed=1, rank=rank, world_size=world, lanes=lanes,
                               sizes=lengths)
            assert isinstance(order, BatchOrder) and order.block == most
            for lane in range(lanes):
                blocks = [order.block_ids(epoch, lane, b) for b in range(order.blocks(epoch, lane))]
                seen += np.concatenate(blocks).tolist() if blocks else []
                for b, ids in enumerate(blocks):
                    held = 0 if lengths is None else int(lengths[ids].sum())
                    assert 0 < len(ids) <= most and (held <= 256 * MIB or len(ids) <= batch)
                    if b + 1 < len(blocks) and lengths is not None:  # the block is as long as it may be
                        assert held + lengths[blocks[b + 1][:batch]].sum() > 256 * MIB
            for k in range(len(order)):  # every batch lies in its lane's block, within its rows
                lane, block, row = order.locate(epoch, k)
                ids = order.block_ids(epoch, lane, block)
                assert row + batch <= max(len(ids), batch) and block < order.blocks(epoch, lane)
        assert sorted(seen) == list(range(30))
    later = ShardOrder(counts, batch, True, False, seed=1, rank=0, world_size=world, lanes=lanes)
    assert not np.array_equal(later.block_ids(0, 0, 0), later.block_ids(1, 0, 0))  # shards permuted anew


def test_shard_blocks_of_a_skewed_epoch_are_cut_where_its_large_samples_are():
    """A few 200 MiB samples among 10 KB ones: each block holding one is cut to keep under
    256 MiB (at most one of them), and the blocks of small samples still hold 1024 of them."""
    counts = np.full(40, 1000)
    lengths = np.full(40_000, 10_000)
    lengths[np.random.default_rng(0).choice(40_000, 30, replace=False)] = 200 * MIB
    order = ShardOrder(counts, 8, True, False, seed=3, rank=0, world_size=1, lanes=1, sizes=lengths)
    for epoch in (0, 1):
        blocks = [order.block_ids(epoch, 0, b) for b in range(order.blocks(epoch, 0))]
        held = [int(lengths[ids].sum()) for ids in blocks]
        assert max(held) <= 256 * MIB and sorted(np.concatenate(blocks).tolist()) == list(range(40_000))
        assert sum(len(ids) == 1024 for ids in blocks) >= len(blocks) - 2 * 30 - 1


def test_shard_order_refuses_a_state_of_other_lanes():
    order = ShardOrder(np.array([4, 4]), 2, False, False, seed=0, rank=0, world_size=1, lanes=2)
    order.check_state(order.state())
    with pytest.raises(ValueError, match="resume with num_workers=3, not 2"):
        order.check_state({"lanes": 3})
    with pytest.raises(ValueError, match="taken with num_workers=0 or 1 .* resume with num_workers=0 or 1, not 2"):
        order.check_state({"lanes": 1})  # one lane: a loader of no worker, or of one
