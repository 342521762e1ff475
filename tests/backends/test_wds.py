"""The `wds` backend over shards the tests write: every image is one flat color that names its
sample (class, number), so each delivered image says which sample it is and must agree with
its label. Shards of unequal sizes (7 and 21 samples) make the rank and worker splits uneven."""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from _images import color_folder

import fastdata
from fastdata import DataError
from fastdata import transforms as T
from fastdata._serve import serve
from fastdata.image import order as order_module
from fastdata.image import read as read_module
from fastdata.image import read_shards
from fastdata.image.order import ShardOrder
from fastdata.shard import write_shards

CLASSES, PER_CLASS = 4, 15
N = CLASSES * PER_CLASS
SIZE = 16
TRANSFORM = T.Compose([T.Resize(SIZE), T.CenterCrop(SIZE)])


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return color_folder(tmp_path_factory.mktemp("imgs"), CLASSES, PER_CLASS, (20, 48), lambda i: f"{i:03d}.jpg")


def _write(folder, out: Path, counts=(7, 21, 7, 14, 11)) -> list[str]:
    """Shards holding `counts` samples each (sizes that differ by 3x), and their index."""
    pairs = [(str(folder / f"class{c}" / f"{i:03d}.jpg"), c) for c in range(CLASSES) for i in range(PER_CLASS)]
    order = np.random.default_rng(1).permutation(N)
    paths, start = [], 0
    for s, n in enumerate(counts):
        part = [pairs[i] for i in order[start:start + n]]
        write_shards(part, out / f"part{s}-%d.tar", max_count=n, shuffle=False)
        shutil.move(out / f"part{s}-0.tar", out / f"train-{s:06d}.tar")
        paths.append(str(out / f"train-{s:06d}.tar"))
        start += n
    assert start == N
    # one index for the set, as fastdata-shard writes for one run
    shards = []
    for s in range(len(counts)):
        part = json.load(open(out / f"part{s}-index.json"))
        (entry,) = part["shards"]
        entry["name"] = f"train-{s:06d}.tar"
        shards.append(entry)
        os.unlink(out / f"part{s}-index.json")
    index = {"version": 1, "format": "fastdata-wds-index", "shards": shards,
             "classes": [f"class{c}" for c in range(CLASSES)], "total": N}
    (out / "train-index.json").write_text(json.dumps(index))
    return paths


@pytest.fixture(scope="module")
def shards(folder, tmp_path_factory):
    return _write(folder, tmp_path_factory.mktemp("shards"))


PATTERN = "train-{000000..000004}.tar"


def _pattern(paths) -> str:
    return os.path.join(os.path.dirname(paths[0]), PATTERN)


def _copy(shards, to: Path, indexed: bool) -> Path:
    """The shards copied into `to`, with their index or without."""
    for p in shards:
        shutil.copy(p, to)
    if indexed:
        shutil.copy(os.path.join(os.path.dirname(shards[0]), "train-index.json"), to)
    return to


def _ids(images: torch.Tensor, labels: torch.Tensor) -> list[tuple[int, int]]:
    """(class, number) of each image from its color, checked against its label."""
    if not len(labels):  # every sample of the batch skipped
        return []
    px = images[:, :, SIZE // 2, SIZE // 2].to(torch.int64)
    c = ((px[:, 0] - 20).float() / 40).round().long()
    i = ((px[:, 1] - 10).float() / 12).round().long()
    assert torch.equal(c, labels), (c, labels)
    return list(zip(c.tolist(), i.tolist()))


def _epoch(loader) -> list[list[tuple[int, int]]]:
    return [_ids(x, y) for x, y in loader]


def _load(source, **kw):
    kw.setdefault("transform", TRANSFORM)
    kw.setdefault("batch_size", 8)
    return fastdata.loader(source, **kw)


ALL = sorted((c, i) for c in range(CLASSES) for i in range(PER_CLASS))


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("shuffle", [False, True])
def test_every_sample_once_with_its_label(shards, workers, shuffle):
    loader = _load(_pattern(shards), num_workers=workers, shuffle=shuffle)
    assert loader.backend == "wds" and len(loader) == 8
    batches = _epoch(loader)
    flat = [s for b in batches for s in b]
    assert sorted(flat) == ALL
    assert [len(b) for b in batches] == [8] * 7 + [4] or workers  # with workers, the short batch is a lane's
    assert loader.stats["samples"] == N and loader.stats["batches"] == 8 and loader.stats["skipped"] == 0


def test_loaders_in_step_read_into_buffers_of_their_own(shards):
    """Two 0-worker loaders iterated in step (a pass's reads run on a thread of its own) each
    read into buffers of their own: every epoch is the one a lone loader gives."""
    src = _pattern(shards)
    want = [_epoch(_load(src, num_workers=0, shuffle=True, seed=seed)) for seed in (3, 4)]
    assert want[0] != want[1]
    for _ in range(3):
        a, b = (_load(src, num_workers=0, shuffle=True, seed=seed) for seed in (3, 4))
        got = [[_ids(*x), _ids(*y)] for x, y in itertools.zip_longest(a, b)]
        assert [[x for x, _ in got], [y for _, y in got]] == want


def test_order_without_shuffle_is_the_shards_order(shards):
    import webdataset
    from PIL import Image

    expected = []
    for sample in webdataset.WebDataset(shards, shardshuffle=False):
        r, g, _ = Image.open(io.BytesIO(sample["jpg"])).convert("RGB").getpixel((8, 8))
        expected.append((round((r - 20) / 40), round((g - 10) / 12)))
    got = [s for b in _epoch(_load(_pattern(shards), shuffle=False)) for s in b]
    assert got == expected


def test_sources_agree(shards, tmp_path):
    """A brace pattern, a single list of paths, file: URLs, pipe: commands, and shards without an
    index give the same batches."""
    reference = _epoch(_load(_pattern(shards), shuffle=True, seed=3))
    assert _epoch(_load(list(shards), shuffle=True, seed=3)) == reference
    assert _epoch(_load([f"file:{p}" for p in shards], shuffle=True, seed=3)) == reference
    assert _epoch(_load([f"pipe:cat {p}" for p in shards], shuffle=True, seed=3)) == reference
    bare = tmp_path / "bare"
    bare.mkdir()
    _copy(shards, bare, indexed=False)
    loader = _load(str(bare / PATTERN), shuffle=True, seed=3)
    assert "no index" in loader.samples.description
    assert _epoch(loader) == reference
    one = _load(shards[1], shuffle=False)
    assert len(one) == 3 and sum(len(b) for b in _epoch(one)) == 21


def test_reproducible_and_set_epoch(shards):
    a = _load(_pattern(shards), shuffle=True, num_workers=2)
    b = _load(_pattern(shards), shuffle=True, num_workers=2)
    e0 = _epoch(a)
    assert _epoch(b) == e0
    e1 = _epoch(a)  # the epoch advances by itself
    assert e1 != e0 and sorted(s for x in e1 for s in x) == ALL
    b.set_epoch(1)
    assert _epoch(b) == e1
    c = _load(_pattern(shards), shuffle=True, num_workers=2, seed=1)
    assert _epoch(c) != e0


def test_persistent_workers_give_the_same_epochs(shards, monkeypatch):
    # 16-sample blocks: several a worker, read ahead into the two buffers in turn, and each
    # epoch's first read ahead at the end of the one before
    monkeypatch.setattr(order_module, "_BLOCK_SAMPLES", 16)
    fresh = _load(_pattern(shards), shuffle=True, num_workers=2, batch_size=4)
    kept = _load(_pattern(shards), shuffle=True, num_workers=2, batch_size=4, persistent_workers=True)
    for _ in range(3):
        assert _epoch(kept) == _epoch(fresh)
    kept.set_epoch(0)  # back to an epoch whose first block was not read ahead
    fresh.set_epoch(0)
    assert _epoch(kept) == _epoch(fresh)


def test_a_block_of_large_samples_holds_fewer_of_them(shards, monkeypatch):
    """A shuffle block is 1024 samples' batches, cut short where its samples would pass 256 MiB
    (here made 8 samples' worth), and the reader reads a block at a time into its buffers, not
    the 60 samples one block would otherwise hold; every sample still comes once."""
    sizes = _load(_pattern(shards)).samples.sizes
    cap = int(8 * sizes.mean())
    monkeypatch.setattr(order_module, "_BLOCK_BYTES", cap)
    loader = _load(_pattern(shards), shuffle=True, batch_size=4)
    asked = []
    view = read_module.BlockBuffer.view
    monkeypatch.setattr(read_module.BlockBuffer, "view", lambda self, n: asked.append(n) or view(self, n))
    got = [s for x, y in loader for s in _ids(x, y)]
    assert sorted(got) == ALL
    assert 0 < max(asked) <= max(cap, 4 * int(sizes.max())) < N * sizes.mean() and len(asked) > N // 12


@pytest.mark.parametrize("workers", [0, 2])
def test_a_batch_over_the_part_limit_is_read_in_parts_with_the_same_batches(shards, tmp_path, monkeypatch, workers):
    """Where a block's samples come to more than MAX_PART_BYTES (here 3 samples' worth, so every
    block), each batch is read by itself, a part of at most that many bytes (or one sample) at a
    time, and no block is read whole or ahead; the batches, in order, and a changed sample's
    skip are those of blocks read whole."""
    data = _copy(shards, tmp_path, True)
    with open(data / "train-000001.tar", "r+b") as f:  # a byte of a sample changed: its CRC-32 fails
        f.seek(os.path.getsize(data / "train-000001.tar") // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    kw = dict(shuffle=True, batch_size=8, num_workers=workers, seed=2, on_error="skip")

    def epochs():
        loader = _load(str(data / PATTERN), **kw)
        return [_epoch(loader) for _ in range(2)], loader.stats["skipped"]

    whole = epochs()
    sizes = _load(str(data / PATTERN)).samples.sizes
    budget = int(3 * sizes.max())
    blocks, parts = [], []
    read_block, part = read_shards.ShardReader._read_block, read_shards.ShardReader._part
    monkeypatch.setattr(read_shards, "MAX_PART_BYTES", budget)
    monkeypatch.setattr(read_shards.ShardReader, "_read_block", lambda *a: blocks.append(a) or read_block(*a))
    monkeypatch.setattr(read_shards.ShardReader, "_part", lambda self, epoch, ids, places: parts.append(
        (int(sizes[ids[places]].sum()), len(places))) or part(self, epoch, ids, places))
    got = epochs()
    assert got == whole and whole[1] == 2  # the changed sample skipped once an epoch
    seen = sorted(s for batch in got[0][0] for s in batch)
    assert len(seen) == N - 1 and set(seen) < set(ALL)
    if workers == 0:  # (the workers' calls are theirs)
        assert not blocks and len(parts) > 2 * 2 * (N // 8)
        assert all(nbytes <= budget or count == 1 for nbytes, count in parts)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_state_resumes_with_the_shuffle_blocks_it_was_taken_with(shards, monkeypatch, workers):
    """A state records its shuffle blocks, and a loader given it takes them (persistent workers
    started with other blocks start anew): the rest of the epoch is the rest of the state's,
    whatever the blocks this loader would make. A state without `block` had 1024 samples'
    batches; one without `block_bytes`, blocks of `block` samples whatever their bytes."""
    kw = dict(shuffle=True, batch_size=4, num_workers=workers, persistent_workers=bool(workers))
    small = int(8 * _load(_pattern(shards)).samples.sizes.mean())  # 8 samples' worth
    # (the blocks' samples and bytes then; the state's keys dropped; the blocks' samples and bytes now)
    for then, dropped, now in [((1024, small), (), (1024, 256 << 20)), ((1024, 256 << 20), (), (1024, small)),
                               ((1024, 256 << 20), ("block", "block_bytes"), (1024, small)),
                               ((8, 256 << 20), ("block_bytes",), (1024, 256 << 20))]:
        monkeypatch.setattr(order_module, "_BLOCK_SAMPLES", then[0])
        monkeypatch.setattr(order_module, "_BLOCK_BYTES", then[1])
        taken = _load(_pattern(shards), **kw)
        it = iter(taken)
        head = [_ids(*next(it)) for _ in range(3)]
        state = taken.state_dict()
        want = head + [_ids(x, y) for x, y in it]
        assert (state["block"], state["block_bytes"]) == then
        state = {k: v for k, v in state.items() if k not in dropped}
        monkeypatch.setattr(order_module, "_BLOCK_SAMPLES", now[0])
        monkeypatch.setattr(order_module, "_BLOCK_BYTES", now[1])
        resumed = _load(_pattern(shards), **kw)
        _epoch(resumed)  # persistent workers up, holding this loader's own blocks
        resumed.load_state_dict(state)
        assert head + _epoch(resumed) == want
    for bad in (0, 6, 4096, True, "8"):
        with pytest.raises(ValueError, match="the state's block should be a whole number of batches of 4"):
            resumed.load_state_dict({**state, "block": bad})
    for bad in (0, -1, True, "8", 1.5):
        with pytest.raises(ValueError, match="the state's block_bytes should be a positive int or None"):
            resumed.load_state_dict({**state, "block_bytes": bad})


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_balanced_and_disjoint(shards, world, drop_last):
    per_rank = []
    for rank in range(world):
        loader = _load(_pattern(shards), shuffle=True, rank=rank, world_size=world, drop_last=drop_last, num_workers=2)
        per_rank.append([s for b in _epoch(loader) for s in b])
        assert len(loader) == len(_load(_pattern(shards), rank=0, world_size=world, drop_last=drop_last))
    counts = {len(r) for r in per_rank}
    assert len(counts) == 1
    flat = [s for r in per_rank for s in r]
    if drop_last:
        assert len(set(flat)) == len(flat) and N - len(flat) < world * 8
    else:
        assert set(flat) == set(ALL) and len(flat) - N < world  # padded by wrapping, as DistributedSampler
        # disjoint up to the padding: the repeats are the epoch's first samples
        assert len(flat) - len(set(flat)) == len(flat) - N


def test_a_rank_reads_only_the_shards_its_range_covers(folder, tmp_path):
    paths = _write(folder, tmp_path)
    loader = _load(str(tmp_path / PATTERN), shuffle=False, rank=0, world_size=2)
    # rank 0's 30 samples are shards 0, 1 and 2 of 7, 21, 7: the last two shards are not read
    os.unlink(paths[3])
    os.unlink(paths[4])
    assert len([s for b in _epoch(loader) for s in b]) == 30


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_mid_epoch(shards, workers, monkeypatch):
    monkeypatch.setattr(order_module, "_BLOCK_SAMPLES", 16)  # small shuffle blocks, so a resume seeks past some
    full = _load(_pattern(shards), shuffle=True, num_workers=workers)
    expected = _epoch(full) + _epoch(full) + _epoch(full)
    n = len(full)
    for k in (0, 3, 7, 8):
        first = _load(_pattern(shards), shuffle=True, num_workers=workers)
        it = iter(first)
        for _ in range(k):
            next(it)
        state = first.state_dict()
        del it
        second = _load(_pattern(shards), shuffle=True, num_workers=workers)
        second.load_state_dict(state)
        # the rest of epoch 0, then epoch 1; after k = 8, its last batch, epoch 0 is finished:
        # epochs 1 and 2
        got = _epoch(second) + _epoch(second)
        assert len(got) == (2 * n - k if k < n else 2 * n)
        assert got == expected[k:k + len(got)]


def test_resume_seeks_instead_of_reading(shards, monkeypatch):
    monkeypatch.setattr(order_module, "_BLOCK_SAMPLES", 16)
    reads = []
    real = read_shards.read_file_range  # (the shards are files)

    def recording(url, start, view):
        reads.append((os.path.basename(url), start, len(view)))
        return real(url, start, view)

    monkeypatch.setattr(read_shards, "read_file_range", recording)
    loader = _load(_pattern(shards), shuffle=False)
    expected = _epoch(loader)
    everything = sum(r[2] for r in reads)
    reads.clear()
    resumed = _load(_pattern(shards), shuffle=False)
    resumed.load_state_dict({**loader.state_dict(), "batches": 6, "epoch": 0})
    assert _epoch(resumed) == expected[6:]
    # Batches 6 and 7 are in epoch 0's last 16-sample block (samples 48-59: the last of shard 3's
    # 14, and shard 4), which is read from shard 3's sample 13 on. Samples 0-47 of epoch 0, which
    # come before batch 6, are not, nor is epoch 1's first block: a pass in this process does not
    # read ahead into the next epoch (its reader's thread stops at the pass's end).
    read = {(r[0], r[1]): r[2] for r in reads}
    assert {name for name, _ in read} == {"train-000003.tar", "train-000004.tar"}
    shard3 = json.load(open(os.path.join(os.path.dirname(shards[0]), "train-index.json")))["shards"][3]
    _, offset, size = shard3["samples_index"][13]
    assert read[("train-000003.tar", offset)] == size
    assert sum(read.values()) < everything / 2


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_pass_reads_each_byte_once(shards, monkeypatch, shuffle):
    """A pass's first batch is read first, into its places in its block's buffer, and the block
    read around it: every sample's bytes are read once in the pass, none twice, and each batch
    is the one the order says (4 blocks of 16, each first batch of one read that way)."""
    monkeypatch.setattr(order_module, "_BLOCK_SAMPLES", 16)
    reads = []
    real = read_shards.read_file_range  # (the shards are files)

    def recording(url, start, view):
        reads.append((os.path.basename(url), start, start + len(view)))
        return real(url, start, view)

    monkeypatch.setattr(read_shards, "read_file_range", recording)
    kept = []
    for _ in range(2):  # the second pass: a new reader, which takes the first's buffers
        reads.clear()
        got = _epoch(_load(_pattern(shards), num_workers=0, shuffle=shuffle, seed=5))
        assert sorted(s for b in got for s in b) == ALL
        index = json.load(open(os.path.join(os.path.dirname(shards[0]), "train-index.json")))
        spans = {(f"train-{k:06d}.tar", off, off + n) for k, sh in enumerate(index["shards"])
                 for _, off, n in sh["samples_index"]}
        for name in {r[0] for r in reads}:
            pieces = sorted((a, b) for n, a, b in reads if n == name)
            assert all(b <= a2 for (_, b), (a2, _) in zip(pieces, pieces[1:])), (name, pieces)  # none read twice
        read = sum(b - a for _, a, b in reads)
        assert read == sum(b - a for _, a, b in spans)
        kept.append(list(read_module._spare[1]))
    assert len(kept[0]) == 2 and all(a is b for a, b in zip(sorted(kept[0], key=id), sorted(kept[1], key=id)))
    assert got == _epoch(_load(_pattern(shards), num_workers=0, shuffle=shuffle, seed=5))
    if os.fork() == 0:  # a forked child maps its own: writing to its parent's pages would copy each
        os._exit(0 if all(read_module.take_buffer() is not b for b in kept[1]) else 1)
    assert os.waitstatus_to_exitcode(os.wait()[1]) == 0


def test_resume_needs_the_same_worker_count(shards):
    a = _load(_pattern(shards), num_workers=2)
    it = iter(a)
    next(it)
    state = a.state_dict()
    del it
    assert state["lanes"] == 2 and state["backend"] == "wds"
    with pytest.raises(ValueError, match="num_workers=2"):
        _load(_pattern(shards), num_workers=0).load_state_dict(state)


@pytest.mark.parametrize("ranges", [True, False])
def test_http_streams_the_same_batches(shards, ranges):
    reference = _epoch(_load(_pattern(shards), shuffle=True, num_workers=2))
    with serve(os.path.dirname(shards[0]), ranges=ranges) as base:
        loader = _load(f"{base}/{PATTERN}", shuffle=True, num_workers=2)
        assert "index" in loader.samples.description and len(loader) == 8
        assert _epoch(loader) == reference


def test_http_without_index_counts_the_shards(shards, tmp_path):
    _copy(shards, tmp_path, indexed=False)
    reference = _epoch(_load(_pattern(shards), shuffle=False))
    with serve(tmp_path) as base:
        loader = _load(f"{base}/{PATTERN}", shuffle=False)
        assert "no index" in loader.samples.description
        assert _epoch(loader) == reference


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_url_names_it():
    url = f"http://127.0.0.1:{_free_port()}/train-000000.tar"
    with pytest.raises(DataError, match=r"127\.0\.0\.1.*train-000000\.tar.*(refused|Error)"):
        _load(url)


def test_shard_gone_after_indexing(shards, tmp_path):
    _copy(shards, tmp_path, indexed=True)
    with serve(tmp_path) as base:
        loader = _load(f"{base}/{PATTERN}", shuffle=False, on_error="skip")
        os.unlink(tmp_path / "train-000001.tar")  # 404 from now on
        got = [s for b in _epoch(loader) for s in b]
    assert len(got) == N - 21 and loader.stats["skipped"] == 21
    assert all("train-000001.tar" in e["path"] and "404" in e["cause"] for e in loader.stats["errors"])


@pytest.mark.parametrize("where", ["local", "http"])
@pytest.mark.parametrize("b_indexed", [True, False])
def test_shards_of_one_name_in_two_folders_each_use_their_own_index(folder, tmp_path, where, b_indexed):
    # a/s-000000.tar and b/s-000000.tar hold other samples: an index's entry names a shard in
    # its own folder only, and b's shards without an index of their own are counted from their
    # headers
    half = PER_CLASS // 2
    for name, numbers in (("a", range(half)), ("b", range(half, PER_CLASS))):
        pairs = [(str(folder / f"class{c}" / f"{i:03d}.jpg"), c) for c in range(CLASSES) for i in numbers]
        write_shards(pairs, tmp_path / name / "s-%06d.tar", max_count=16, shuffle=False)
    if not b_indexed:
        os.unlink(tmp_path / "b" / "s-index.json")
    names = [f"{d}/s-{k:06d}.tar" for d in "ab" for k in range(2)]
    assert all((tmp_path / n).exists() for n in names)
    with serve(tmp_path) if where == "http" else contextlib.nullcontext(str(tmp_path)) as base:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no shard taken for another's index: no size or staleness warning
            loader = _load([f"{base}/{n}" for n in names], shuffle=False)
            got = [s for batch in _epoch(loader) for s in batch]
    assert loader.samples.indexed == [True, True, b_indexed, b_indexed]
    assert sorted(got) == ALL and loader.stats["skipped"] == 0


# ------------------------------------------------------------------ bad input


def _corrupt(src: str, dst: Path, how: str) -> tuple[str, str]:
    """A copy of shard `src` made bad; returns the bad member's name and the expected cause."""
    import tarfile

    raw = bytearray(open(src, "rb").read())
    with tarfile.open(src) as tf:
        members = tf.getmembers()
    if how == "cut":  # cut off in the middle of the 5th image
        m = members[8]
        dst.write_bytes(bytes(raw[: m.offset_data + m.size // 2]))
        return m.name, "cut off"
    if how == "image":  # the 3rd image's bytes replaced (same length: the index still fits)
        m = members[4]
        raw[m.offset_data + 2: m.offset_data + m.size] = b"\x00" * (m.size - 2)
        dst.write_bytes(bytes(raw))
        return m.name, "image"
    if how == "cls":  # the 2nd label not an integer
        m = members[3]
        assert m.name.endswith(".cls")
        raw[m.offset_data: m.offset_data + m.size] = b"x" * m.size
        dst.write_bytes(bytes(raw))
        return m.name, "integer"
    raise AssertionError(how)


@pytest.mark.parametrize("how", ["cut", "image", "cls"])
@pytest.mark.parametrize("indexed", [True, False])
def test_bad_shard_raises_naming_shard_and_member(shards, tmp_path, how, indexed):
    _copy(shards, tmp_path, indexed)
    bad = tmp_path / "train-000002.tar"
    member, cause = _corrupt(shards[2], bad, how)
    if indexed and how != "cut":  # the bytes changed at the same size: the index's CRC-32 says so first
        member, cause = member.split(".")[0] + r"\.\*", "not the index's"
    if indexed and how == "cut":
        with pytest.warns(UserWarning, match="keeping the index"):
            loader = _load(str(tmp_path / PATTERN), shuffle=False)
    else:
        loader = _load(str(tmp_path / PATTERN), shuffle=False)
    with pytest.raises(DataError, match=rf"train-000002\.tar \(member {member}\).*{cause}") as e:
        _epoch(loader)
    assert e.value.path.endswith("train-000002.tar") and e.value.member == member.replace("\\", "")


@pytest.mark.parametrize("how", ["cut", "image", "cls"])
@pytest.mark.parametrize("indexed", [True, False])
def test_bad_shard_skipped_and_counted(shards, tmp_path, how, indexed):
    _copy(shards, tmp_path, indexed)
    member, _ = _corrupt(shards[2], tmp_path / "train-000002.tar", how)
    if indexed and how != "cut":
        member = member.split(".")[0] + ".*"  # named by the index's CRC-32 check, the sample as a whole
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the cut shard's size
        loader = _load(str(tmp_path / PATTERN), shuffle=True, num_workers=2, on_error="skip")
    flat = [s for b in _epoch(loader) for s in b]
    assert len(flat) == len(set(flat))  # intact samples exactly once
    # cut in the 5th sample of 7: the 4 before it come out; the index names the 2 after it too
    lost = {"cut": 3, "image": 1, "cls": 1}[how]
    skipped = 1 if how == "cut" and not indexed else lost
    assert len(flat) == N - lost and loader.stats["samples"] == N - lost
    assert loader.stats["skipped"] == skipped and len(loader.stats["errors"]) == skipped
    assert all("train-000002.tar" in e["path"] for e in loader.stats["errors"])
    assert sum(member in e["path"] for e in loader.stats["errors"]) == 1


def test_not_a_tar(tmp_path):
    (tmp_path / "x-000000.tar").write_bytes(b"this is not a tar file" * 100)
    with pytest.raises(DataError, match=r"x-000000\.tar.*not a tar"):
        _load(str(tmp_path / "x-000000.tar"))


def test_backend_and_source_must_agree(shards, folder):
    with pytest.raises(ValueError, match="'wds'"):
        _load(_pattern(shards), backend="pil")
    with pytest.raises(ValueError, match="fastdata-shard"):
        _load(str(folder), backend="wds")
    assert _load(_pattern(shards), backend="wds").backend == "wds"
    with pytest.raises(FileNotFoundError, match="train-000005"):
        _load(os.path.join(os.path.dirname(shards[0]), "train-{000000..000009}.tar"))


# ------------------------------------------------------------------ the split arithmetic


@pytest.mark.parametrize("n,bs,world,lanes,drop_last", [
    (60, 8, 1, 1, False), (60, 8, 2, 2, False), (60, 8, 3, 2, True), (61, 7, 2, 3, False), (5, 8, 2, 4, False),
    (1000, 32, 4, 3, True), (100, 1, 3, 2, False),
])
def test_plan_covers_each_rank_range_exactly(n, bs, world, lanes, drop_last):
    counts = np.array([n // 3, n - 2 * (n // 3), n // 3])
    seen = []
    batches = set()
    for rank in range(world):
        plan = ShardOrder(counts, bs, True, drop_last, 5, rank, world, lanes)
        batches.add(plan.batches)
        assert sum(plan.lane_samples) == plan.per_rank
        mine = []
        for k in range(plan.batches):
            lane, block, row = plan.locate(2, k)
            ids = plan.block_ids(2, lane, block)
            perm = plan.block_permutation(2, lane, block, len(ids))
            chunk = ids[perm[row:row + bs]]
            assert len(chunk) == (bs if k < plan.batches - 1 else plan.per_rank - bs * (plan.batches - 1))
            mine += chunk.tolist()
        assert len(mine) == plan.per_rank
        seen += mine
    assert len(batches) == 1
    if drop_last:
        assert len(set(seen)) == len(seen) and n - len(seen) <= world * bs
    else:
        assert set(seen) == set(range(n)) and len(seen) - n < world


# ------------------------------------------------------------------ DDP: torchrun, gloo

_DDP = textwrap.dedent("""
    import json, os, sys
    import torch, torch.distributed as dist
    import fastdata
    from fastdata import transforms as T

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    loader = fastdata.loader(sys.argv[1], batch_size=4, shuffle=True, num_workers=1,
                             transform=T.Compose([T.Resize(16), T.CenterCrop(16)]))
    seen, steps = [], 0
    for images, labels in loader:
        px = images[:, :, 8, 8].to(torch.int64)
        seen += [[round((int(r) - 20) / 40), round((int(g) - 10) / 12)] for r, g in px[:, :2].tolist()]
        t = torch.ones(1)
        dist.all_reduce(t)  # as DDP's gradient sync: a rank with a batch less would hang here
        steps += 1
    dist.barrier()
    json.dump({"rank": rank, "len": len(loader), "steps": steps, "seen": seen},
              open(os.path.join(sys.argv[2], f"rank{rank}.json"), "w"))
    dist.destroy_process_group()
""")


def test_torchrun_two_ranks_uneven_shards(shards, tmp_path):
    script = tmp_path / "ddp.py"
    script.write_text(_DDP)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(_free_port()),
           str(script), _pattern(shards), str(tmp_path)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.load(open(tmp_path / f"rank{r}.json")) for r in range(2)]
    assert ranks[0]["steps"] == ranks[1]["steps"] == ranks[0]["len"] == 8  # 30 samples each, batches of 4
    a, b = ({tuple(s) for s in r["seen"]} for r in ranks)
    assert len(a) == len(b) == 30 and not a & b and a | b == set(ALL)


def _compress(shards, to: Path, kind: str) -> str:
    """The shards compressed (gzip, bzip2, xz) into `to`, without their index: the pattern."""
    import bz2
    import gzip
    import lzma

    compress, suffix = {"gz": (gzip.compress, "tar.gz"), "bz2": (bz2.compress, "tar.bz2"),
                        "xz": (lzma.compress, "tar.xz")}[kind]
    for p in shards:
        (to / (Path(p).name[:-len(".tar")] + "." + suffix)).write_bytes(compress(Path(p).read_bytes()))
    return str(to / PATTERN.replace(".tar", "." + suffix))


@pytest.mark.parametrize("kind", ["gz", "bz2", "xz"])
@pytest.mark.parametrize("where", ["local", "pipe", "http"])
def test_compressed_shards_give_the_plain_shards_batches(shards, tmp_path, kind, where):
    """Shards compressed as a whole, as webdataset reads them (tarfile's "r|*": told by their
    first bytes): counted from their headers as they decompress, and read on from their start
    as a pipe: is, shuffled, 2 workers: the batches of the same shards uncompressed without
    their index."""
    (tmp_path / "plain").mkdir()
    (tmp_path / "z").mkdir()
    reference = _epoch(_load(str(_copy(shards, tmp_path / "plain", indexed=False) / PATTERN), shuffle=True,
                             num_workers=2))
    pattern = _compress(shards, tmp_path / "z", kind)
    with serve(tmp_path / "z") if where == "http" else contextlib.nullcontext(None) as base:
        source = {"local": pattern, "http": f"{base}/{os.path.basename(pattern)}",
                  "pipe": [f"pipe:cat {pattern.replace(PATTERN.replace('.tar', ''), f'train-{s:06d}')}"
                           for s in range(len(shards))]}[where]
        loader = _load(source, shuffle=True, num_workers=2)
        assert loader.samples.streamed == [True] * len(shards) and len(loader) == 8
        assert _epoch(loader) == reference


@pytest.mark.parametrize("workers", [0, 2])
def test_a_compressed_shard_cut_short_says_where(shards, tmp_path, workers):
    """A gzip shard cut off inside its stream: the samples before the cut come out, a warning
    names the shard and where its decompression failed (the samples past it cannot be found: a
    stream is not read past an error), and a sample the cut splits fails naming its member, as
    a plain shard cut there does, or is skipped and counted with on_error="skip". Bytes after a
    whole stream are no failure."""
    pattern = _compress(shards, tmp_path, "gz")
    bad = tmp_path / "train-000002.tar.gz"
    packed = bad.read_bytes()
    skipped = []
    for cut in range(len(packed) // 3, len(packed) - 8, max(1, len(packed) // 12)):
        bad.write_bytes(packed[:cut])
        with pytest.warns(UserWarning, match=r"shard .*train-000002\.tar\.gz ends early: the gz stream fails at "
                                             r"byte \d+ of what it decompresses to \(EOFError: "):
            loader = _load(pattern, shuffle=True, num_workers=workers, on_error="skip")
        flat = [s for b in _epoch(loader) for s in b]
        assert len(flat) == len(set(flat)) and N - 7 <= len(flat) < N
        assert len(flat) + loader.stats["skipped"] == len(loader.samples)
        assert all("train-000002.tar.gz" in e["path"] for e in loader.stats["errors"])
        skipped.append(loader.stats["skipped"])
    assert set(skipped) == {1}, skipped  # (the sample each cut splits: what decompressed before it is had)
    bad.write_bytes(packed + b"\n")  # bytes after a whole stream, which tarfile reads past too: nothing lost
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sorted(s for b in _epoch(_load(pattern, num_workers=workers)) for s in b) == ALL


def test_a_lane_keeps_a_few_streams_open(shards, tmp_path, monkeypatch):
    """Shards read as streams (here gzip) are kept open where the last read stopped, but a
    lane reading many shards in turn keeps only the last few (each holds a file, or a pipe:'s
    process): the batches are those of the plain shards."""
    monkeypatch.setattr(read_shards, "_OPEN_STREAMS", 1)
    (tmp_path / "plain").mkdir()
    (tmp_path / "z").mkdir()
    reference = _epoch(_load(str(_copy(shards, tmp_path / "plain", indexed=False) / PATTERN), shuffle=False))
    loader = _load(_compress(shards, tmp_path / "z", "gz"), shuffle=False)
    opened = []
    real = read_shards.open_stream
    monkeypatch.setattr(read_shards, "open_stream", lambda url: opened.append(real(url)) or opened[-1])
    assert _epoch(loader) == reference
    assert len(opened) == len(shards) and sum(not f.closed for f in opened) <= 1


def test_streams_left_part_read_are_dropped_without_failing_a_read(shards, tmp_path, monkeypatch):
    """pipe: shards whose command goes on writing after the tar (here 1 MiB of zeros) and exits
    non-zero when its reader goes away (SIGPIPE ignored, as curl exits 23): a lane keeps one
    stream open, so each shard it moves on from is left part-read and closed; its command is
    killed and its exit status is not taken for the next read's failure. Two epochs, persistent
    workers: the batches of the plain shards."""
    monkeypatch.setattr(read_shards, "_OPEN_STREAMS", 1)
    reference = _epoch(_load(_pattern(shards), shuffle=False, num_workers=2))
    pipes = [f"pipe:sh -c \"trap '' PIPE; cat {p}; head -c 1048576 /dev/zero\"" for p in shards]
    loader = _load(pipes, shuffle=False, num_workers=2, persistent_workers=True)
    assert _epoch(loader) == reference and _epoch(loader) == reference
    assert loader.stats["skipped"] == 0
