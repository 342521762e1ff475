"""Hostile shards and labels: damaged tar headers, truncated shards, indexes that disagree with
their tar, and labels out of range, on `wds` (0 and 2 workers) and `dali` (CPU), with
on_error="raise" and "skip".

The shards hold flat-color images whose color names the sample (class c, number j: see
_images.py) with label c, written by fastdata-shard from an ImageFolder without shuffling:
sample key "%08d" % i with i = c * PER_CLASS + j, shard 0 the keys 0-5, shard 1 the keys 6-11.
Every delivered image is checked against its label, and the delivered set against the samples
left intact; what was lost must be counted (skip) or raise a DataError naming shard, member and
cause (raise)."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import tarfile
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from _images import color, color_folder, tar_of

import fastdata
from fastdata import DataError
from fastdata._ext import native
from fastdata import transforms as T
from fastdata.shard import count_samples, read_index, write_shards
from fastdata.sources import file_list, shards
from fastdata.sources.files import MAX_PATH_BYTES
from fastdata.sources.tarformat import IMAGE_MEMBERS

CLASSES, PER_CLASS = 3, 4
N = CLASSES * PER_CLASS
SIZE = 16
TRANSFORM = T.Compose([T.Resize(SIZE), T.CenterCrop(SIZE)])
PATTERN = "train-{000000..000001}.tar"
ALL = {(c, j) for c in range(CLASSES) for j in range(PER_CLASS)}
BACKENDS = [("wds", 0), ("wds", 2), pytest.param(("dali", 1), marks=pytest.mark.dali)]


def sample(i: int) -> tuple[int, int]:
    """(class, number) of the sample with key i."""
    return divmod(i, PER_CLASS)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return color_folder(tmp_path_factory.mktemp("imgs"), CLASSES, PER_CLASS, (20, 40), lambda j: f"{j:03d}.jpg")


@pytest.fixture(scope="module")
def pristine(folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("shards")
    write_shards(folder, out / "train-%06d.tar", max_count=6, shuffle=False, workers=1)
    return out


@pytest.fixture(params=BACKENDS, ids=lambda b: f"{b[0]}-{b[1]}")
def backend(request):
    return request.param


def _copy(pristine: Path, to: Path, indexed: bool) -> Path:
    for name in ("train-000000.tar", "train-000001.tar") + (("train-index.json",) if indexed else ()):
        shutil.copy(pristine / name, to / name)
    return to


def _members(path: Path) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(path) as tf:
        return {m.name: m for m in tf.getmembers()}


def _load(where: Path, backend, on_error: str, pattern: str = PATTERN, **kw):
    """The loader, and the warnings its construction gave."""
    name, workers = backend
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = fastdata.loader(str(where / pattern), batch_size=4, transform=TRANSFORM, backend=name,
                                 num_workers=workers, device="cpu", on_error=on_error, shuffle=True, **kw)
    return loader, [str(w.message) for w in caught]


def _delivered(loader) -> list[tuple[int, int]]:
    """(class, number) of every delivered sample, each image checked against its label."""
    out = []
    for images, labels in loader:
        assert images.shape[0] == labels.shape[0]
        if not len(labels):
            continue
        px = images[:, :, SIZE // 2, SIZE // 2].to(torch.int64)
        c = ((px[:, 0] - 20).float() / 40).round().long()
        j = ((px[:, 1] - 10).float() / 12).round().long()
        assert torch.equal(c, labels), (c, labels)  # the label is the image's own
        out += list(zip(c.tolist(), j.tolist()))
    return out


def _expect(loader, on_error: str, lost: set[int], shard: str, member: str, cause: str, skipped: int | None = None):
    """Raise: a DataError naming `shard`, `member` and matching `cause`. Skip: every sample but
    the keys `lost` delivered once, with its label, and `skipped` (default len(lost)) counted,
    each error naming `shard`, one of them `member` with `cause`."""
    if on_error == "raise":
        with pytest.raises(DataError) as e:
            _delivered(loader)
        # (Raised in a DataLoader worker, torch re-raises it under a traceback: its own line last.)
        message = str(e.value).rstrip("\n").splitlines()[-1]
        assert shard in message and f"(member {member})" in message, message
        assert cause in message, message
        return
    got = _delivered(loader)
    assert len(got) == len(set(got))
    assert set(got) == ALL - {sample(i) for i in lost}
    skipped = len(lost) if skipped is None else skipped
    assert loader.stats["skipped"] == skipped and loader.stats["samples"] == N - len(lost)
    errors = loader.stats["errors"]
    assert len(errors) == skipped and all(shard in e["path"] for e in errors)
    assert any(e["path"].endswith(f"(member {member})") and cause in e["cause"] for e in errors), errors


# ------------------------------------------------------------------ damaged member headers


def _garbage(path: Path, offset: int, how: str) -> None:
    raw = bytearray(path.read_bytes())
    if how == "garbage":  # random bytes: neither name nor checksum readable
        raw[offset:offset + 512] = np.random.default_rng(offset).integers(0, 256, 512, dtype=np.uint8).tobytes()
    elif how == "checksum":  # only the checksum wrong: the name still shows
        raw[offset + 148:offset + 156] = b"0000001\0"
    elif how == "zeros":  # a zeroed header: tarfile takes it for the end of the archive
        raw[offset:offset + 512] = bytes(512)
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("indexed", [False, True], ids=["scanned", "indexed"])
@pytest.mark.parametrize("on_error", ["raise", "skip"])
@pytest.mark.parametrize("member", ["00000003.jpg", "00000003.cls", "00000006.jpg"])
def test_garbage_member_header(pristine, tmp_path, backend, indexed, on_error, member):
    """A header of random bytes mid-shard (or the first of a shard, which is the first header
    of a read): the walk steps over it to the next valid header; only its sample is lost."""
    shard = "train-000000.tar" if member < "00000006" else "train-000001.tar"
    at = _members(pristine / shard)[member].offset
    _garbage(_copy(pristine, tmp_path, indexed) / shard, at, "garbage")
    loader, warned = _load(tmp_path, backend, on_error)
    assert len(loader) == 3 and len(loader.samples) == N  # every sample counted, the damaged one too
    if not indexed:
        assert any(f"{shard} is damaged: invalid tar header at byte {at}" in w for w in warned), warned
        assert count_samples(tmp_path / shard) == 6
    key = member.split(".")[0]
    _expect(loader, on_error, {int(key)}, shard, f"{key}.*", f"invalid tar header at byte {at}")


@pytest.mark.parametrize("indexed", [False, True], ids=["scanned", "indexed"])
@pytest.mark.parametrize("how", ["checksum", "zeros"])
def test_damaged_header_named(pristine, tmp_path, indexed, how):
    """A header whose checksum alone is wrong is named by the name it still shows; a zeroed one
    is not the end of the archive when a header follows its member."""
    at = _members(pristine / "train-000000.tar")["00000002.jpg"].offset
    _garbage(_copy(pristine, tmp_path, indexed) / "train-000000.tar", at, how)
    assert count_samples(tmp_path / "train-000000.tar") == 6
    member, cause = {"checksum": ("00000002.jpg", f"invalid tar header at byte {at} (bad checksum)"),
                     "zeros": ("00000002.*", f"a block of zeros at byte {at}")}[how]
    for on_error in ("raise", "skip"):
        loader, _ = _load(tmp_path, ("wds", 0), on_error)
        _expect(loader, on_error, {2}, "train-000000.tar", member, cause)


def test_tarfile_would_stop_at_the_damage(pristine, tmp_path):
    """What the walk replaces: tarfile ends the archive at a damaged header mid-shard."""
    at = _members(pristine / "train-000000.tar")["00000002.jpg"].offset
    _garbage(_copy(pristine, tmp_path, False) / "train-000000.tar", at, "garbage")
    with tarfile.open(tmp_path / "train-000000.tar") as tf:
        assert len(tf.getmembers()) == 4  # samples 0 and 1: the 4 after the damage are gone
    with pytest.warns(UserWarning, match=r"train-000000\.tar is damaged: invalid tar header at byte"):
        assert len(shards(str(tmp_path / PATTERN), progress=False)) == N


@pytest.mark.parametrize("how", ["garbage", "checksum"])
def test_damaged_header_in_a_stream_is_stepped_over_as_in_a_file(pristine, tmp_path, how):
    """A shard read as a stream (pipe:, HTTP without an index): after a damaged header the walk
    goes back to the valid header it found reading ahead, and counts what a file's scan counts."""
    at = _members(pristine / "train-000000.tar")["00000002.jpg"].offset
    path = _copy(pristine, tmp_path, False) / "train-000000.tar"
    _garbage(path, at, how)
    with pytest.warns(UserWarning, match="is damaged"):
        local = shards(str(path), progress=False)
    with pytest.warns(UserWarning, match="is damaged"):
        piped = shards(f"pipe:cat {path}", progress=False)
    assert list(piped.keys[0]) == list(local.keys[0]) and len(local.keys[0]) == 6
    assert np.array_equal(piped.spans[0], local.spans[0])


def _claim_size(path: Path, offset: int, how: str) -> None:
    """The header at `offset` made to give its member 8 GiB (octal or base-256), its checksum
    made right again: a header tarfile takes, of a size no member of the shard can have."""
    raw = bytearray(path.read_bytes())
    raw[offset + 124:offset + 136] = b"77777777777\0" if how == "octal" else b"\x80" + (8 << 30).to_bytes(11, "big")
    raw[offset + 148:offset + 156] = b" " * 8
    raw[offset + 148:offset + 156] = b"%06o\0 " % sum(raw[offset:offset + 512])
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("how", ["octal", "base-256"])
def test_a_header_whose_size_passes_the_shards_end(pristine, tmp_path, how):
    """A header (valid checksum) whose member would run past the end of a shard that holds
    more headers after it is damage, stepped over as a bad checksum is: every intact sample
    after it is delivered, and its own counted. In a stream, which has no end to compare with,
    the loss its size steps over is said when the shard is listed."""
    at = _members(pristine / "train-000000.tar")["00000002.jpg"].offset
    path = _copy(pristine, tmp_path, False) / "train-000000.tar"
    _claim_size(path, at, how)
    tarfile.TarInfo.frombuf(path.read_bytes()[at:at + 512], "utf-8", "surrogateescape")  # (tarfile takes it)
    loader, warned = _load(tmp_path, ("wds", 0), "skip")
    size = 8 << 30 if how == "base-256" else (8 << 30) - 1
    assert any(f"invalid tar header at byte {at} (member 00000002.jpg of {size} bytes, past the shard's end" in w
               for w in warned), warned
    _expect(loader, "skip", {2}, "train-000000.tar", "00000002.jpg", "member 00000002.jpg")  # (read: its bytes end)
    with pytest.warns(UserWarning, match=r"train-000000\.tar ends early: it ends at byte \d+, inside sample "
                                         r"00000002's members, .*the samples after that point cannot be found"):
        piped = shards(f"pipe:cat {path}", progress=False)
    assert list(piped.keys[0]) == [f"{i:08d}" for i in range(3)]  # what a stream can know


def test_a_pax_size_no_stream_is_read_for_is_damage(tmp_path):
    """A pax header giving a member 10**23 bytes in a compressed shard (a stream): damage,
    stepped over, not a stream too long to list; the samples after it are found."""
    import gzip

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, data, pax in [("a.cls", b"1", {}), ("b.jpg", b"x" * 100, {"size": "9" * 23}), ("b.cls", b"2", {}),
                                ("c.cls", b"3", {}), ("d.cls", b"4", {})]:
            info = tarfile.TarInfo(name)
            info.size, info.pax_headers = len(data), pax
            tf.addfile(info, io.BytesIO(data))
    (tmp_path / "p-000000.tar.gz").write_bytes(gzip.compress(raw.getvalue()))
    with pytest.warns(UserWarning, match=r"is damaged: invalid tar header at byte \d+ \(member b\.jpg of 9+ bytes, "
                                         r"more than a stream is read for\)"):
        listed = shards(str(tmp_path / "p-000000.tar.gz"), progress=False)
    assert list(listed.keys[0]) == ["a", "b", "c", "d"]


# ------------------------------------------------------------------ truncated shards


@pytest.mark.parametrize("indexed", [False, True], ids=["scanned", "indexed"])
@pytest.mark.parametrize("on_error", ["raise", "skip"])
@pytest.mark.parametrize("cut", ["mid-member", "mid-header"])
def test_truncated_shard(pristine, tmp_path, backend, indexed, on_error, cut):
    """Shard 1 cut in sample 9's image (or 100 bytes into sample 10's first header): every
    sample before the cut is delivered with its label; the cut one fails naming its member;
    with an index, the samples past the end are reported too."""
    path = _copy(pristine, tmp_path, indexed) / "train-000001.tar"
    m = _members(pristine / "train-000001.tar")["00000009.jpg" if cut == "mid-member" else "00000010.jpg"]
    end = m.offset_data + m.size // 2 if cut == "mid-member" else m.offset + 100
    path.write_bytes(path.read_bytes()[:end])
    loader, warned = _load(tmp_path, backend, on_error)
    first = 9 if cut == "mid-member" else 10
    if indexed:
        assert any("keeping the index" in w for w in warned), warned
        assert len(loader.samples) == N
        lost, skipped = set(range(first, 12)), 12 - first
    else:
        assert any("train-000001.tar is damaged: the shard is cut off" in w for w in warned), warned
        assert len(loader.samples) == first + 1  # the samples after the cut are not in the file
        lost, skipped = set(range(first, 12)), 1
    cause = "the shard is cut off in member" if cut == "mid-member" else "the shard is cut off in a tar header"
    _expect(loader, on_error, lost, "train-000001.tar", m.name, cause, skipped)
    if on_error == "skip" and indexed:
        past = [e for e in loader.stats["errors"] if "no such sample" in e["cause"]]
        assert len(past) == 11 - first and all("the shard ends at byte" in e["cause"] for e in past)


def test_not_a_tar_at_all(tmp_path):
    (tmp_path / "x-000000.tar").write_bytes(np.random.default_rng(1).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    with pytest.raises(DataError, match=r"x-000000\.tar: not a tar file \(invalid tar header at byte 0"):
        fastdata.loader(str(tmp_path / "x-000000.tar"), batch_size=2, transform=TRANSFORM)
    with pytest.raises(DataError, match=r"not a tar file"):
        count_samples(tmp_path / "x-000000.tar")
    (tmp_path / "y-000000.tar").write_bytes(b"")
    with pytest.raises(DataError, match=r"y-000000\.tar: not a tar file \(empty file\)"):
        fastdata.loader(str(tmp_path / "y-000000.tar"), batch_size=2, transform=TRANSFORM)


def test_counting_a_shard_that_is_no_file_does_not_wait(tmp_path):
    """count_samples opens a shard as the loader does: a FIFO (whose open waits for a writer)
    and /dev/zero (zeros without end) are refused at once."""
    os.mkfifo(tmp_path / "f-000000.tar")
    (tmp_path / "z-000000.tar").symlink_to("/dev/zero")
    with pytest.raises(DataError, match=r"^cannot read shard .*/f-000000\.tar: not a regular file \(a FIFO\)$"):
        count_samples(tmp_path / "f-000000.tar")
    with pytest.raises(DataError, match=r"z-000000\.tar: not a regular file \(a character device\)$"):
        count_samples(tmp_path / "z-000000.tar")
    with pytest.raises(DataError, match=r"m-000000\.tar: No such file or directory$"):
        count_samples(tmp_path / "m-000000.tar")


def _bytes_read() -> int:
    """What this process has read so far (/proc/self/io's rchar: every read(), of holes too)."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="counts reads in /proc/self/io (Linux)")
@pytest.mark.parametrize("backend", [("wds", 0), pytest.param(("dali", 0), marks=pytest.mark.dali)],
                         ids=lambda b: b[0])
def test_a_sparse_shard_is_read_at_the_cost_of_what_it_holds(pristine, tmp_path, backend):
    """A shard with 16 GiB of holes (made by a seek or `truncate -s`) between its end blocks and
    more samples is listed and read by what it holds on disk: the scan for the next header
    steps over holes, which are zero blocks, so it still finds the samples after them, and the
    samples on either side of them are two reads. Read block by block, the 16 GiB took about 5 s
    to list and 25 to count, and a read of samples 5 and 6 together took 16 GiB of memory; a
    sparse file may say it holds 16 TiB."""
    shard = tmp_path / "train-000000.tar"
    shutil.copy(pristine / "train-000000.tar", shard)
    with open(shard, "r+b") as f:
        f.seek(16 << 30)
        f.write((pristine / "train-000001.tar").read_bytes())  # samples 6-11 after the holes
    if os.stat(shard).st_blocks * 512 > 1 << 30:
        pytest.skip("this file system keeps no holes")
    before = _bytes_read()
    assert count_samples(shard) == N
    loader, warned = _load(tmp_path, backend, "raise", pattern="train-000000.tar")
    assert warned == [] and sorted(_delivered(loader)) == sorted(ALL)
    assert _bytes_read() - before < 256 << 20


# ------------------------------------------------------------------ an index that disagrees with its tar


def _edit_index(where: Path, edit) -> None:
    index = json.loads((where / "train-index.json").read_text())
    edit(index)
    (where / "train-index.json").write_text(json.dumps(index))


def _drop(key: str):
    """An index edit: the sample `key` left out of its shard's entry, the counts kept consistent."""

    def edit(index):
        for entry in index["shards"]:
            keep = [i for i, row in enumerate(entry["samples_index"]) if row[0] != key]
            if len(keep) < len(entry["samples_index"]):
                entry["samples_index"] = [entry["samples_index"][i] for i in keep]
                entry["members"] = [entry["members"][i] for i in keep]
                entry["crc32"] = [entry["crc32"][i] for i in keep]
                entry["samples"] -= 1
                index["total"] -= 1

    return edit


@pytest.mark.parametrize("missed", [[8], [11], [7, 8, 9, 10, 11]], ids=["middle", "last", "five"])
def test_index_missing_samples(pristine, tmp_path, backend, missed):
    """An index that misses samples of a shard (stale: the shard was written again with more)
    does not tile it: the bytes in no sample may hold any number of samples, so the shard is
    counted from its headers and every sample it holds is delivered, with its own label."""
    for i in missed:
        _edit_index(_copy(pristine, tmp_path, True) if i == missed[0] else tmp_path, _drop(f"{i:08d}"))
    loader, warned = _load(tmp_path, backend, "raise")
    at = _members(pristine / "train-000001.tar")[f"{missed[0]:08d}.jpg"].offset
    assert [w for w in warned if "does not fit" in w] == [
        f"the index {tmp_path / 'train-index.json'} does not fit shard {tmp_path / 'train-000001.tar'}: it lists no "
        f"sample in 1 byte range(s) of it, the first at byte {at}; reading its headers instead"], warned
    assert len(loader.samples) == N
    assert sorted(_delivered(loader)) == sorted(ALL) and loader.stats["skipped"] == 0


def test_an_index_listing_a_shard_twice_is_malformed(pristine, tmp_path):
    """Which of two entries for one shard describes it is not known: the index is refused."""
    def edit(index):
        index["shards"].append(index["shards"][0])
        index["total"] += index["shards"][0]["samples"]

    _edit_index(_copy(pristine, tmp_path, True), edit)
    with pytest.raises(ValueError, match=r"train-index\.json is malformed: it has two entries for 'train-000000\.tar'"):
        shards(str(tmp_path / PATTERN), progress=False)


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_index_member_sizes_disagree(pristine, tmp_path, backend, on_error):
    """The index gives sample 4's image one byte more than its header: the sample fails."""

    def edit(index):
        members = index["shards"][0]["members"]
        key, exts = members[4]
        assert key == "00000004" and exts[0][0] == "jpg"
        exts[0][2] += 1

    _edit_index(_copy(pristine, tmp_path, True), edit)
    loader, _ = _load(tmp_path, backend, on_error)
    _expect(loader, on_error, {4}, "train-000000.tar", "00000004.*",
            "the index is stale: sample 00000004 at byte")


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_sample_changed_at_the_same_size(pristine, tmp_path, backend, on_error):
    """Sample 4's JPEG with one quantization table value changed: the same size, still a JPEG
    that decodes (to other pixels), every header as the index says; its bytes no longer have
    the index's CRC-32, so it fails, and the other samples are delivered."""
    _copy(pristine, tmp_path, True)
    path = tmp_path / "train-000000.tar"
    image = _members(path)["00000004.jpg"]
    raw = bytearray(path.read_bytes())
    dqt = raw.index(b"\xff\xdb", image.offset_data) + 5  # the first value of the first table
    assert dqt < image.offset_data + image.size and 0 < raw[dqt] < 254
    raw[dqt] += 1
    path.write_bytes(bytes(raw))
    loader, warned = _load(tmp_path, backend, on_error)
    assert not warned
    _expect(loader, on_error, {4}, "train-000000.tar", "00000004.*",
            f"the index is stale: sample 00000004's bytes [{image.offset}, ")


def test_a_later_loader_with_another_index_compares_its_checksums(pristine, tmp_path):
    """The record of samples found with their index's CRC-32 is kept for the later loaders
    this process builds over the same shards with the same index: one built after the index
    changed (here sample 4's CRC-32, the shard untouched) compares each sample afresh, and
    sample 4 fails as it fails in a fresh process."""
    _copy(pristine, tmp_path, True)
    loader, _ = _load(tmp_path, ("wds", 0), "skip")
    assert set(_delivered(loader)) == ALL

    def edit(index):
        index["shards"][0]["crc32"][4] ^= 1

    _edit_index(tmp_path, edit)
    later, _ = _load(tmp_path, ("wds", 0), "skip")
    _expect(later, "skip", {4}, "train-000000.tar", "00000004.*", "the index is stale: sample 00000004's bytes [")


@pytest.mark.parametrize("workers", [0, 2])
def test_checksums_compared_once_a_sample(pristine, tmp_path, monkeypatch, workers):
    """Each intact sample is hashed at its first read only, by the loader's processes together
    (workers started afresh each epoch included) and by a later loader over the same shards in
    this process; a changed one fails in every epoch and every loader."""
    from fastdata._workers import start_method
    from fastdata.image import shard_samples

    tally, crc32 = tmp_path / "hashed", zlib.crc32

    def counted(data, *a):  # each hash's value, from whichever process (forked workers inherit this)
        got = crc32(data, *a)
        if isinstance(data, memoryview):  # the reader hashes views of its read buffer; nothing else counts
            fd = os.open(tally, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            os.write(fd, got.to_bytes(4, "little"))
            os.close(fd)
        return got

    def hashed() -> tuple[int, int]:
        """(hashes of intact samples, hashes of the changed one) so far."""
        values = np.frombuffer(tally.read_bytes(), dtype="<u4")
        return int((values != changed).sum()), int((values == changed).sum())

    monkeypatch.setattr(shard_samples.zlib, "crc32", counted)
    assert start_method(None).get_start_method() == "fork"  # fork: the workers run the patched crc32
    (tmp_path / "data").mkdir()
    data = _copy(pristine, tmp_path / "data", True)
    path = data / "train-000001.tar"
    members = _members(path)
    image = members["00000008.jpg"]
    raw = bytearray(path.read_bytes())
    raw[raw.index(b"\xff\xdb", image.offset_data) + 5] += 1
    path.write_bytes(bytes(raw))
    first = min(m.offset for n, m in members.items() if n.startswith("00000008."))
    end = max(m.offset_data + m.size for n, m in members.items() if n.startswith("00000008."))
    end += -end % 512  # the sample's span: its members' headers and padded payloads
    changed = crc32(bytes(raw[first:end]))
    loader, _ = _load(data, ("wds", workers), "skip", persistent_workers=False)
    for epoch in range(3):
        loader.set_epoch(epoch)
        assert set(_delivered(loader)) == ALL - {sample(8)}
        intact, again = hashed()
        assert intact == N - 1 and again >= epoch + 1  # the intact ones at their first read only
    later, _ = _load(data, ("wds", workers), "skip", persistent_workers=False)
    assert set(_delivered(later)) == ALL - {sample(8)}
    intact, again = hashed()
    assert intact == N - 1 and again >= 4
    assert loader.stats["skipped"] == 3 and later.stats["skipped"] == 1


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_index_of_another_order(folder, tmp_path, backend, on_error):
    """The index of a shard written in another order (the same bytes in all): no sample is
    delivered from where the index wrongly puts it, every delivered one carries its own label,
    and every sample is delivered or counted."""
    for seed in (0, 1):
        write_shards(folder, tmp_path / f"s{seed}" / "one-%06d.tar", seed=seed, workers=1)
    shutil.copy(tmp_path / "s1" / "one-000000.tar", tmp_path / "s0" / "one-000000.tar")
    assert os.path.getsize(tmp_path / "s1" / "one-000000.tar") == json.loads(
        (tmp_path / "s0" / "one-index.json").read_text())["shards"][0]["bytes"]
    loader, _ = _load(tmp_path / "s0", backend, on_error, pattern="one-000000.tar")
    if on_error == "raise":
        with pytest.raises(DataError, match=r"one-000000\.tar \(member .*\): (the index is stale|invalid tar header)"):
            _delivered(loader)
        return
    got = _delivered(loader)
    assert len(got) == len(set(got)) and loader.stats["skipped"] >= 1
    assert len(got) + loader.stats["skipped"] == N


def test_index_that_does_not_fit_is_not_used(pristine, tmp_path):
    """Spans that overlap are no layout of the shard: it is counted from its headers instead."""

    def edit(index):
        rows = index["shards"][0]["samples_index"]
        rows[2][1] -= 512  # sample 2 starts inside sample 1

    _edit_index(_copy(pristine, tmp_path, True), edit)
    loader, warned = _load(tmp_path, ("wds", 0), "raise")
    assert any("does not fit shard" in w and "train-000000.tar" in w for w in warned), warned
    assert sorted(_delivered(loader)) == sorted(ALL)


@pytest.mark.parametrize("field", [1, 2], ids=["offset", "length"])
def test_an_index_span_that_wraps_past_int64_is_not_used(pristine, tmp_path, field):
    """An offset or a length (each within int64) that makes offset + length wrap past int64
    would pass for a range before the shard's end: the index is not used and the shard is
    counted from its headers."""

    def edit(index):
        row = index["shards"][0]["samples_index"][-1]
        row[field] = 2**63 - 1 - row[3 - field] + 1000

    _edit_index(_copy(pristine, tmp_path, True), edit)
    loader, warned = _load(tmp_path, ("wds", 0), "raise")
    assert any("pass the shard's end" in w and "train-000000.tar" in w for w in warned), warned
    assert sorted(_delivered(loader)) == sorted(ALL)


@pytest.mark.parametrize("nbytes", [2**62, 2**63 - 1, -1])
def test_an_index_giving_a_shard_no_file_can_have_is_malformed(pristine, tmp_path, nbytes):
    _edit_index(_copy(pristine, tmp_path, True), lambda index: index["shards"][0].update(bytes=nbytes))
    with pytest.raises(ValueError, match=r"train-index\.json is malformed: its entry for 'train-000000\.tar' "
                                         r"\(ValueError: a shard of -?\d+ bytes\)"):
        shards(str(tmp_path / PATTERN), progress=False)


def test_malformed_index_entry_is_a_value_error(pristine, tmp_path):
    _edit_index(_copy(pristine, tmp_path, True), lambda index: index["shards"][1].pop("samples_index"))
    with pytest.raises(ValueError, match=r"train-index\.json is malformed: its entry for 'train-000001\.tar'"):
        shards(str(tmp_path / PATTERN), progress=False)


def _set(field: str, at: tuple, value):
    """An index edit: shard 0's `field` at the path `at` set to `value`."""

    def edit(index):
        where = index["shards"][0][field]
        for step in at[:-1]:
            where = where[step]
        where[at[-1]] = value

    return edit


def _members_past_the_shard(index):
    entry = index["shards"][0]
    entry["members"][0][1] = [["jpg", 0, entry["bytes"]], ["cls", 0, entry["bytes"]]]


@pytest.mark.parametrize("edit", [
    _set("crc32", (0,), True), _set("crc32", (0,), 2**32), _set("crc32", (0,), -1), _set("crc32", (0,), 1.0),
    lambda index: index["shards"][0]["crc32"].pop(),
    _set("samples_index", (0, 1), 512.0), _set("samples_index", (0, 2), True), _set("samples_index", (0, 1), 2**64),
    _set("samples_index", (0, 0), ""), _set("samples_index", (0, 0), 5), _set("samples_index", (0,), "ab"),
    _set("members", (0, 0), "other"), _set("members", (0, 1), {"jpg": 1}), _set("members", (0, 1, 0, 2), "7"),
    _set("members", (0, 1, 0, 2), 2**63), _set("members", (0, 1, 0, 2), -1), _members_past_the_shard,
    lambda index: index["shards"][0]["members"].pop(),
], ids=["crc-bool", "crc-2**32", "crc-negative", "crc-float", "crc-short", "offset-float", "length-bool",
        "offset-past-uint64", "key-empty", "key-int", "row-a-string", "member-key", "member-row-dict",
        "member-size-text", "member-size-past-int64", "member-size-negative", "members-past-the-shard",
        "members-short"])
def test_an_index_entry_of_the_wrong_types_is_malformed(pristine, tmp_path, edit):
    """Each field of a shard's entry is checked for its type and range as a whole list at once:
    a wrong one is the ValueError naming the index and the entry (and the collector, paused
    while an index is parsed and listed, is on again after it)."""
    import gc

    _edit_index(_copy(pristine, tmp_path, True), edit)
    with pytest.raises(ValueError, match=r"train-index\.json is malformed: its entry for 'train-000000\.tar' \("):
        shards(str(tmp_path / PATTERN), progress=False)
    assert gc.isenabled()


def test_an_index_entry_is_read_as_its_rows_say(pristine, tmp_path):
    """What an entry gives each sample (its span, its members' count and bytes, its CRC) is its
    rows' values, summed per sample."""
    index = json.loads((_copy(pristine, tmp_path, True) / "train-index.json").read_text())
    got = shards(str(tmp_path / PATTERN), progress=False)
    for s, entry in enumerate(index["shards"]):
        assert got.keys[s] == [r[0] for r in entry["samples_index"]]
        assert got.spans[s].tolist() == [r[1:] for r in entry["samples_index"]]
        assert got.contents[s].tolist() == [[len(m[1]), sum(x[2] for x in m[1])] for m in entry["members"]]
        assert got.checksums[s].tolist() == entry["crc32"]
        assert got.contents[s][:, 0].min() >= 2 and got.spans[s].dtype == np.int64


# ------------------------------------------------------------------ labels


def _labelled_shard(path: Path, labels: list[bytes | None]) -> None:
    """A shard written with tarfile: sample i is an image of color(i % CLASSES, i) (a JPEG) and,
    unless its label is None, a cls member holding it."""

    from PIL import Image

    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
        for i, label in enumerate(labels):
            out = io.BytesIO()
            Image.new("RGB", (24, 24), color(i % CLASSES, i)).save(out, "JPEG", quality=95)
            for name, data in ((f"{i:08d}.jpg", out.getvalue()), (f"{i:08d}.cls", label)):
                if data is not None:
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))


BAD_LABELS = {2: b"-1", 4: b"1000000000000", 5: b"2147483648", 7: b"x1", 9: None, 10: b""}


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_shard_labels_checked(tmp_path, backend, on_error):
    """Shards without classes: a label is an integer in [0, 2**31); anything else (negative,
    too big, not an integer, missing) fails its sample naming the member."""
    labels = [BAD_LABELS.get(i, b"%d" % (i % CLASSES)) for i in range(12)]
    _labelled_shard(tmp_path / "lab-000000.tar", labels)
    name, workers = backend
    loader = fastdata.loader(str(tmp_path / "lab-000000.tar"), batch_size=4, transform=TRANSFORM, backend=name,
                             num_workers=workers, device="cpu", on_error=on_error)
    if on_error == "raise":
        with pytest.raises(DataError, match=r"lab-000000\.tar \(member 00000002\.cls\): the label should be in "
                                            r"\[0, 2147483648\) \(no classes named\), but the cls member holds -1"):
            _delivered(loader)
        return
    got = []
    for images, labels_ in loader:
        if len(labels_):
            px = images[:, :, SIZE // 2, SIZE // 2].to(torch.int64)
            j = ((px[:, 1] - 10).float() / 12).round().long()
            assert torch.equal(j % CLASSES, labels_)  # sample j's label is j % CLASSES
            got += j.tolist()
    assert sorted(got) == [i for i in range(12) if i not in BAD_LABELS]
    causes = {e["path"].rpartition("(member ")[2][:-1]: e["cause"] for e in loader.stats["errors"]}
    assert loader.stats["skipped"] == len(BAD_LABELS) == len(causes)
    assert "holds -1" in causes["00000002.cls"] and "holds 1000000000000" in causes["00000004.cls"]
    assert "holds 2147483648" in causes["00000005.cls"]
    assert "should be an integer" in causes["00000007.cls"] and "should be an integer" in causes["00000010.cls"]
    assert "no cls member" in causes["00000009.jpg"]


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_shard_label_beyond_the_index_classes(pristine, tmp_path, on_error):
    """Shards whose index names 3 classes: a cls member holding 3 is out of range."""
    path = _copy(pristine, tmp_path, True) / "train-000000.tar"
    m = _members(path)["00000005.cls"]
    raw = bytearray(path.read_bytes())
    assert raw[m.offset_data:m.offset_data + m.size] == b"1"
    raw[m.offset_data] = ord("3")
    path.write_bytes(bytes(raw))

    def written_so(index):  # a shard written with that label: its index's CRC-32 agrees
        entry = index["shards"][0]
        offset, length = entry["samples_index"][5][1:]
        entry["crc32"][5] = zlib.crc32(raw[offset:offset + length])

    _edit_index(tmp_path, written_so)
    loader, _ = _load(tmp_path, ("wds", 0), on_error)
    _expect(loader, on_error, {5}, "train-000000.tar", "00000005.cls",
            "the label should be in [0, 3) (the 3 classes of the index), but the cls member holds 3")


def test_file_list_labels_checked(folder):
    path = str(folder / "class0" / "000.jpg")
    for bad in (-1, 2 ** 31, 10 ** 12):
        with pytest.raises(ValueError, match=rf"labels should be in \[0, 2\*\*31\), but item 1 \(.*000\.jpg\) has "
                                             rf"label {bad}"):
            file_list([(path, 0), (path, bad)])
    for bad in (True, 1.0, "1", torch.tensor(True), torch.tensor(1.0), torch.tensor([1]), np.array([1]), np.bool_(1)):
        with pytest.raises(ValueError, match=r"labels should be integers, but item 1"):
            file_list([(path, 0), (path, bad)])
    with pytest.raises(ValueError, match=r"labels should be in \[0, 2\*\*31\), but item 1 .* has label -2$"):
        file_list([(path, 0), (path, torch.tensor(-2))])
    assert file_list([(path, 0), (path, np.int64(2 ** 31 - 1))]).labels.tolist() == [0, 2 ** 31 - 1]
    assert file_list([(path, torch.tensor(2)), (path, np.array(3, dtype=np.uint8))]).labels.tolist() == [2, 3]
    with pytest.raises(ValueError, match=r"item 0 .* has label -3"):
        fastdata.loader([(path, -3)], batch_size=1, transform=TRANSFORM)


def test_file_list_paths_checked(folder):
    path = str(folder / "class0" / "000.jpg")
    for bad in (3, None, 1.5):
        with pytest.raises(ValueError, match=rf"paths should be str or os.PathLike, but item 1 has path {bad}"):
            file_list([(path, 0), (bad, 1)])
    samples = file_list([(path, 0), (os.fsencode(path), 1), (Path(path), 2)])
    assert samples.paths == [path] * 3 and samples.labels.tolist() == [0, 1, 2]
    loader = fastdata.loader([(os.fsencode(path), 3), (path, 4)], batch_size=2, transform=TRANSFORM)
    assert loader.samples.paths == [path] * 2 and next(iter(loader))[1].tolist() == [3, 4]


def test_a_path_longer_than_the_os_opens_is_refused_in_a_short_line(folder):
    """A path no OS call can open would be named whole in each message about its sample (a
    megabyte path, a megabyte line); the list is refused up front, its length and head said."""
    path = str(folder / "class0" / "000.jpg")
    longest = "/" * (MAX_PATH_BYTES - len(path)) + path  # "//...//a/b" is the same file
    assert next(iter(fastdata.loader([(longest, 7)], batch_size=1, transform=TRANSFORM)))[1].tolist() == [7]
    for bad, size in ((longest[0] + longest, MAX_PATH_BYTES + 1), ("\n" + "\u00e9" * 2048 + ".jpg", 4101),
                      ("x" * 10 ** 6 + ".jpg", 10 ** 6 + 4)):
        for on_error in ("raise", "skip"):
            with pytest.raises(ValueError) as e:
                fastdata.loader([(path, 0), (bad, 1)], batch_size=1, on_error=on_error, transform=TRANSFORM)
            line = str(e.value)
            assert line.startswith(f"a file list's paths should be at most {MAX_PATH_BYTES} bytes (the longest the "
                                   f"OS opens), but item 1's path has {size:,}: ") and len(line) < 400, line[:400]
            assert "\n" not in line


def _with_checksum(h: bytearray) -> bytes:
    h[148:156] = b" " * 8
    h[148:156] = f"{sum(h):06o}\0 ".encode()
    return bytes(h)


def _headers() -> list[bytes]:
    """Tar headers as writers make them (USTAR and GNU, long names split into a prefix, pax,
    spaces or NULs after the octal digits), then each with bytes overwritten at random, with
    the checksum left or made right again."""
    out = []
    for fmt in (tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
        for name in ("a.jpg", "dir/" * 20 + "b.cls", "x" * 99, "sub/ünï.jpg"):
            for kind in (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE):
                info = tarfile.TarInfo(name)
                info.size, info.type, info.mtime = (1234 if kind in (tarfile.REGTYPE, tarfile.AREGTYPE) else 0), kind, 1e9
                try:
                    raw = info.tobuf(fmt, "utf-8", "surrogateescape")
                except ValueError:
                    continue
                out += [raw[i:i + 512] for i in range(0, len(raw), 512)]
    spaced = bytearray(out[0])
    spaced[100:108] = b"  644 \0 "
    out.append(_with_checksum(spaced))
    rng = np.random.default_rng(0)
    for base in list(out):
        for k in range(30):
            m = bytearray(base)
            for _ in range(int(rng.integers(1, 3))):
                m[int(rng.integers(0, 512))] = int(rng.choice([0, 32, 48, 55, 56, 255, int(rng.integers(0, 256))]))
            out.append(_with_checksum(m) if k % 2 else bytes(m))
    assert len({bytes(h) for h in out}) > 1000
    return out


@pytest.mark.skipif(native is None, reason="the native extension is not built")
def test_native_walk_gives_walk_tars_members():
    """The plain headers' walk in C++ (csrc/tar.cpp, through walk_tar_bytes) gives walk_tar's
    members and damage for every header of _headers(), each followed by its data and a plain
    member: the shard read from byte 0 or from byte 512 on, whole or cut off, the walk stopped
    at its end or inside, with and without resync."""
    from fastdata.sources.tarformat import walk_tar, walk_tar_bytes

    info = tarfile.TarInfo("next.cls")
    info.size = 2
    tail = info.tobuf(tarfile.USTAR_FORMAT) + b"7\n".ljust(512, b"\0") + bytes(1024)
    taken = 0
    for h in _headers():
        body = h + bytes(range(256)) * 6 + tail
        for start in (0, 512):
            for raw in (body, body[:-1800]):
                raw = memoryview(raw)
                taken += bool(native.tar_plain_members(raw, start, start, start + len(raw))[0])
                for stop in (start + len(raw), start + 512):
                    for resync in (False, True):
                        want = list(walk_tar(lambda p, n: bytes(raw[p - start:p - start + n]), start, stop,
                                             start + len(raw), resync))
                        assert list(walk_tar_bytes(raw, start, start, stop, resync)) == want, (h, start, stop)
    assert taken > 600  # the native walk took the plain ones (in both starts and both cuts)


def test_plain_header_parses_as_tarfile_does():
    """The fast path of the header walk gives tarfile's name, size and type for every header it
    takes, and takes the plain regular files writers make; everything else goes to tarfile."""
    from fastdata.sources.tarformat import _plain_header

    taken = 0
    for h in _headers():
        fast = _plain_header(h)
        if fast is None:
            continue
        taken += 1
        info = tarfile.TarInfo.frombuf(h, "utf-8", "surrogateescape")  # raises where tarfile refuses it
        assert (fast.name, fast.size, fast.type) == (info.name, info.size, info.type), h
    assert taken > 150
    # a long name goes in the USTAR prefix and comes back whole
    info = tarfile.TarInfo("dir/" * 20 + "b.cls")
    info.size = 7
    assert _plain_header(info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape")) == \
        ("dir/" * 20 + "b.cls", 7, tarfile.REGTYPE)


# ------------------------------------------------------------------ an index crafted to break its reader


@pytest.mark.parametrize("shards_value", [[1], [{"samples": "x"}], [{"samples": -1}], [{"samples": True}],
                                          [{"samples": None}], "x", None], ids=json.dumps)
def test_crafted_index_is_malformed(pristine, tmp_path, shards_value):
    """Every malformed index is the one ValueError naming it, not an AttributeError or
    TypeError from the reader."""
    _copy(pristine, tmp_path, True)
    _edit_index(tmp_path, lambda index: index.update(shards=shards_value, total=0))
    with pytest.raises(ValueError, match=r"the shard index .*train-index\.json is malformed: its shards"):
        shards(str(tmp_path / PATTERN), progress=False)
    with pytest.raises(ValueError, match=r"train-index\.json is malformed"):
        _load(tmp_path, ("wds", 0), "raise")


@pytest.mark.parametrize("text", [b"{", b"\xff\xfe{}", b"[        " * 100000],  # deep: nesting past the stack
                         ids=["cut", "not-utf8", "deep"])
def test_index_that_is_not_json_is_malformed(pristine, tmp_path, text):
    _copy(pristine, tmp_path, False)
    (tmp_path / "train-index.json").write_bytes(text)
    with pytest.raises(ValueError, match=r"train-index\.json is malformed: it is not JSON"):
        shards(str(tmp_path / PATTERN), progress=False)


@pytest.mark.parametrize("text", [b'{"description": "a dataset card"}', b"[1, 2]",
                                  b'{"format": "other", "shards": []}'], ids=["card", "list", "other"])
def test_json_of_another_kind_where_the_index_would_be_is_not_the_index(pristine, tmp_path, text):
    """`index.json` beside shards named 000000.tar may be a dataset's own: JSON that is not of
    the index's format is passed over and the shards' headers are read, as over HTTP (a
    malformed index of fastdata's format still raises, above)."""
    for n in range(2):
        shutil.copy(pristine / f"train-{n:06d}.tar", tmp_path / f"{n:06d}.tar")
    (tmp_path / "index.json").write_bytes(text)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader = fastdata.loader(str(tmp_path / "{000000..000001}.tar"), batch_size=4, transform=TRANSFORM,
                                 backend="wds", num_workers=0, device="cpu")
    assert sorted(_delivered(loader)) == sorted(ALL)
    with pytest.raises(ValueError, match=r"index\.json is malformed: it is not a fastdata-wds-index file"):
        read_index(tmp_path / "index.json")  # (what `fastdata shard` and a user calling it are told)


@pytest.mark.timeout(30)
def test_index_that_is_a_fifo_is_refused_at_once(pristine, tmp_path):
    """A FIFO named like the index, with no writer: opened without blocking, refused as no
    regular file (a plain open() would wait for a writer forever)."""
    _copy(pristine, tmp_path, False)
    os.mkfifo(tmp_path / "train-index.json")
    with pytest.raises(ValueError, match=r"train-index\.json is malformed: it is not a regular file"):
        shards(str(tmp_path / PATTERN), progress=False)


def test_a_sample_changed_after_it_was_found_intact(pristine, tmp_path, backend):
    """Sample 4's label is written over in place (1 becomes 2, the same size) after an epoch
    found it intact: its bytes come from the shard's file as it is now, not as it was listed,
    so their CRC-32 is compared again, in the next epoch (fresh workers included) and in a new
    loader of this process, and the sample fails."""
    _copy(pristine, tmp_path, True)
    loader, _ = _load(tmp_path, backend, "skip")
    assert set(_delivered(loader)) == ALL and loader.stats["skipped"] == 0
    path = tmp_path / "train-000000.tar"
    label = _members(path)["00000004.cls"]
    with open(path, "r+b") as f:
        f.seek(label.offset_data)
        assert f.read(1) == b"1"
        f.seek(label.offset_data)
        f.write(b"2")
    loader.set_epoch(1)
    assert set(_delivered(loader)) == ALL - {sample(4)} and loader.stats["skipped"] == 1
    (error,) = loader.stats["errors"]
    assert error["path"].endswith("train-000000.tar (member 00000004.*)") and "CRC-32" in error["cause"], error
    _expect(_load(tmp_path, backend, "skip")[0], "skip", {4}, "train-000000.tar", "00000004.*",
            "sample 00000004's bytes [")


# ------------------------------------------------------------------ bounds on what a shard or its index makes the reader do


def test_an_index_over_its_size_bound_is_refused_unread(pristine, tmp_path):
    """An index file of more than MAX_INDEX_BYTES (here a sparse 2 GiB file: no disk, and nothing
    of it read) is malformed, said in one line, before any allocation for it."""
    from fastdata.sources import tarformat

    _copy(pristine, tmp_path, False)
    with open(tmp_path / "train-index.json", "wb") as f:
        f.truncate(tarformat.MAX_INDEX_BYTES + 1)
    with pytest.raises(ValueError, match=r"train-index\.json is malformed: it is over 1 GiB .*remove the index"):
        shards(str(tmp_path / PATTERN), progress=False)


def test_an_index_denser_in_lists_than_an_index_is_refused_before_parsing(pristine, tmp_path):
    """Parsed, `[],` takes 22 times its bytes, where a real index takes 9: an index holding more
    than one list or object in 8 bytes is malformed, said before json.loads builds it."""
    _copy(pristine, tmp_path, True)
    real = (tmp_path / "train-index.json").read_bytes()
    (tmp_path / "train-index.json").write_bytes(real[:-2] + b',"junk":[' + b"[]," * 200_000 + b"[]]}\n")
    with pytest.raises(ValueError, match=r"train-index\.json is malformed: it holds \d+ lists or objects in \d+ bytes"):
        shards(str(tmp_path / PATTERN), progress=False)


@pytest.mark.parametrize("where", ["file", "http"])
def test_a_shard_longer_than_its_index_is_read_from_its_headers(pristine, tmp_path, where):
    """An index that lists only the first 3 of shard 0's 6 samples (a shard rewritten with more):
    the shard's size tells, a file's or an HTTP object's, and the shard is read from its headers
    with a warning: every sample is delivered with its label, none past the index's end lost."""
    import json

    from fastdata._serve import serve

    _copy(pristine, tmp_path, True)
    index = json.loads((tmp_path / "train-index.json").read_text())
    entry = index["shards"][0]
    for k in ("samples_index", "members", "crc32"):
        entry[k] = entry[k][:3]
    entry["samples"], index["total"] = 3, index["total"] - 3
    entry["bytes"] = entry["samples_index"][-1][1] + entry["samples_index"][-1][2] + 1024
    (tmp_path / "train-index.json").write_text(json.dumps(index))
    with serve(tmp_path) as base:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loader = fastdata.loader(f"{tmp_path if where == 'file' else base}/{PATTERN}", batch_size=4,
                                     transform=TRANSFORM, backend="wds", num_workers=0, device="cpu")
        warned = [str(w.message) for w in caught]
        assert any(f"train-000000.tar is {(tmp_path / 'train-000000.tar').stat().st_size} bytes, not the "
                   f"{entry['bytes']} its index" in w and "reading its headers instead" in w for w in warned), warned
        assert sorted(_delivered(loader)) == sorted(ALL)


def test_an_index_over_http_is_read_within_its_size_bound(pristine, tmp_path, monkeypatch):
    """Over HTTP the index's size is not known beforehand: at most MAX_INDEX_BYTES + 1 bytes of
    it are read (here the bound lowered below the real index's size), then it is refused as
    over the bound; within the bound it is used."""
    from fastdata._serve import serve
    from fastdata.sources import tarformat, webdataset

    _copy(pristine, tmp_path, True)
    with serve(tmp_path) as base:
        assert "index" in shards(f"{base}/{PATTERN}", progress=False).description
        size = (tmp_path / "train-index.json").stat().st_size
        for module in (tarformat, webdataset):
            monkeypatch.setattr(module, "MAX_INDEX_BYTES", size - 1)
        with pytest.raises(ValueError, match=r"train-index\.json is malformed: it is over"):
            shards(f"{base}/{PATTERN}", progress=False)


def _stream_shard(tmp_path: Path, pristine: Path) -> str:
    """The first pristine shard as a stream (`pipe:cat`), its index left behind: scanned."""
    shutil.copy(pristine / "train-000000.tar", tmp_path / "s-000000.tar")
    return f"pipe:cat {tmp_path / 's-000000.tar'}"


@pytest.mark.parametrize("bound", ["samples", "bytes"])
def test_a_stream_is_scanned_within_its_bounds(pristine, tmp_path, monkeypatch, bound):
    """A shard read as a stream (pipe:, HTTP, a compressed tar) has no size to stop at: its scan
    stops at MAX_STREAM_SAMPLES samples or MAX_STREAM_BYTES bytes with one line naming it (here
    the bounds are lowered below the 6 samples of the shard), where an endless one would be
    scanned, and its samples kept, forever."""
    from fastdata.sources import tarformat

    url = _stream_shard(tmp_path, pristine)
    assert len(shards(url, progress=False)) == 6
    monkeypatch.setattr(tarformat, "MAX_STREAM_SAMPLES" if bound == "samples" else "MAX_STREAM_BYTES",
                        3 if bound == "samples" else 3 * 1024)
    with pytest.raises(DataError, match=r"cannot read shard pipe:cat .*s-000000\.tar: a stream scanned without an "
                                        r"index may hold .* at most, and this one goes on past that; split it"):
        shards(url, progress=False)
    import gzip

    (tmp_path / "z.tar.gz").write_bytes(gzip.compress((tmp_path / "s-000000.tar").read_bytes()))
    with pytest.raises(DataError, match=r"z\.tar\.gz: a stream scanned without an index"):
        count_samples(tmp_path / "z.tar.gz")


@pytest.mark.parametrize("tail", [b"\0", b"x"])
def test_a_stream_of_no_headers_is_scanned_within_its_bound(pristine, tmp_path, monkeypatch, tail):
    """After its members a stream goes on with zero blocks (or bytes that are no header): the
    scan looking for the next header stops at MAX_STREAM_BYTES too, with the same line (an
    endless one, /dev/zero, would be read forever)."""
    from fastdata.sources import tarformat

    data = (pristine / "train-000000.tar").read_bytes()
    (tmp_path / "long.tar").write_bytes(data[:len(data) - 1024] + tail * (1 << 20))  # no end blocks, 1 MiB after
    monkeypatch.setattr(tarformat, "MAX_STREAM_BYTES", len(data) + (256 << 10))
    with pytest.raises(DataError, match=r"long\.tar: a stream scanned without an index may hold .* at most"):
        shards(f"pipe:cat {tmp_path / 'long.tar'}", progress=False)


@pytest.mark.parametrize("kind", [tarfile.XHDTYPE, tarfile.GNUTYPE_LONGNAME])
def test_a_run_of_extended_headers_is_bounded(pristine, tmp_path, monkeypatch, kind):
    """After its members a stream goes on with pax (or GNU long-name) headers, each naming the
    member that would follow, without end (here 16 MiB of them): their run is damage past 4 MiB,
    so the stream's bound applies (lowered to 8 MiB past the members), where the walk through
    the run read on without it. In a file the run is damage, reported, its samples kept."""
    from fastdata.sources import tarformat

    data = (pristine / "train-000000.tar").read_bytes()[:-1024]  # without its end blocks
    info = tarfile.TarInfo("././@LongLink")
    info.type, payload = kind, b"00000099.jpg\0"
    if kind == tarfile.XHDTYPE:
        payload = b"21 path=00000099.jpg\n"
    info.size = len(payload)
    one = info.tobuf(tarfile.GNU_FORMAT)[:512] + payload + bytes(-len(payload) % 512)
    (tmp_path / "s-000000.tar").write_bytes(data + one * ((16 << 20) // len(one)) + bytes(1024))
    with pytest.warns(UserWarning, match=r"is damaged: invalid tar header at byte \d+ \(extended headers of more "
                                         r"than 4194304 bytes before a member\)"):
        assert len(shards(str(tmp_path / "s-000000.tar"), progress=False)) > 6
    monkeypatch.setattr(tarformat, "MAX_STREAM_BYTES", len(data) + (8 << 20))
    with pytest.raises(DataError, match=r"a stream scanned without an index may hold .* at most"):
        shards(f"pipe:cat {tmp_path / 's-000000.tar'}", progress=False)


@pytest.mark.parametrize("kind", [tarfile.DIRTYPE, tarfile.SYMTYPE, b"Z"])
def test_a_stream_of_headers_that_hold_no_member_is_bounded(tmp_path, monkeypatch, kind):
    """Directory, link or unknown-type headers without end (here 4 MiB of them, each with 64 KiB
    of data for the unknown type) give no sample: the stream's byte bound (lowered to 1 MiB) is
    checked at each header, where it was checked only at members and damage."""
    from fastdata.sources import tarformat

    info = tarfile.TarInfo("d/" if kind == tarfile.DIRTYPE else "x")
    info.type, info.linkname, info.size = kind, "y", (64 << 10) if kind == b"Z" else 0
    one = info.tobuf(tarfile.USTAR_FORMAT) + bytes(info.size)
    (tmp_path / "s-000000.tar").write_bytes(one * ((4 << 20) // len(one)))  # (no end blocks: no resync either)
    monkeypatch.setattr(tarformat, "MAX_STREAM_BYTES", 1 << 20)
    with pytest.raises(DataError, match=r"a stream scanned without an index may hold .* at most"):
        shards(f"pipe:cat {tmp_path / 's-000000.tar'}", progress=False)


def test_honest_extended_headers_and_damaged_ones_read_alike_as_a_file_and_a_stream(tmp_path):
    """A global pax header of 300 KB and a member's 800 KB of xattr records (each header under
    1 MiB, writers' own) scan clean; two damaged pax headers in a row are stepped over in a
    stream as in a file (the stream's reader keeps what the resync reads back)."""

    from fastdata.sources.tarformat import scan_tar

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT, pax_headers={"comment": "g" * 300_000}) as t:
        for i in range(2):
            info = tarfile.TarInfo(f"{i:04d}.cls")
            info.size = 1
            if i == 0:
                info.pax_headers = {f"SCHILY.xattr.user.k{k}": "v" * 8000 for k in range(100)}
            t.addfile(info, io.BytesIO(b"1"))
    scan = scan_tar(io.BytesIO(out.getvalue()))
    assert scan.keys == ["0000", "0001"] and not scan.damage
    bad = tarfile.TarInfo("././@PaxHeader")
    bad.type, bad.size = tarfile.XHDTYPE, 4096
    damaged = bad.tobuf(tarfile.USTAR_FORMAT) + b"9999 path=x\n" + bytes(4096 - 12)
    (tmp_path / "s-000000.tar").write_bytes(2 * damaged + out.getvalue())
    with pytest.warns(UserWarning, match="is damaged"):
        as_file = shards(str(tmp_path / "s-000000.tar"), progress=False)
    with pytest.warns(UserWarning, match="is damaged"):
        as_stream = shards(f"pipe:cat {tmp_path / 's-000000.tar'}", progress=False)
    assert len(as_file) == len(as_stream) == 3  # the damage, a sample of its own, and the two


def test_a_stream_that_goes_on_with_zeros_ends_within_its_gap(pristine, tmp_path, monkeypatch):
    """Two archives joined by 1 MiB of zeros: a file, or a stream, holds both's samples; a
    stream whose gap passes _MAX_STREAM_GAP (lowered to 256 KiB; 256 MiB, one member's most)
    ends there, where zeros served without end would be read to MAX_STREAM_BYTES (64 GiB)."""
    from fastdata.sources import tarformat

    first, second = ((pristine / f"train-00000{k}.tar").read_bytes() for k in (0, 1))
    (tmp_path / "s-000000.tar").write_bytes(first + bytes(1 << 20) + second)
    assert len(shards(str(tmp_path / "s-000000.tar"), progress=False)) == 12
    assert len(shards(f"pipe:cat {tmp_path / 's-000000.tar'}", progress=False)) == 12
    monkeypatch.setattr(tarformat, "_MAX_STREAM_GAP", 256 << 10)
    assert len(shards(str(tmp_path / "s-000000.tar"), progress=False)) == 12
    assert len(shards(f"pipe:cat {tmp_path / 's-000000.tar'}", progress=False)) == 6


@pytest.mark.parametrize("on_error", ["raise", "skip"])
@pytest.mark.parametrize("second", ["00000001.JPG", "00000001.jpg", "00000001.CLS"])
def test_a_sample_with_two_members_of_one_extension_fails(tmp_path, backend, on_error, second):
    """Sample 1 holds a second jpg (or cls) member, the last of its members: which one is the
    sample is not known (webdataset refuses it as a duplicate), so the sample fails naming it;
    the others are delivered with their own labels."""

    from PIL import Image

    def jpeg(i):
        out = io.BytesIO()
        Image.new("RGB", (24, 24), color(i % CLASSES, i)).save(out, "JPEG", quality=95)
        return out.getvalue()

    members = []
    for i in range(4):
        members += [(f"{i:08d}.jpg", jpeg(i)), (f"{i:08d}.cls", b"%d" % (i % CLASSES))]
        if i == 1:
            members.append((second, jpeg(2) if second.lower().endswith("jpg") else b"2"))
    tar_of(tmp_path / "dup-000000.tar", members)
    name, workers = backend
    loader = fastdata.loader(str(tmp_path / "dup-000000.tar"), batch_size=2, transform=TRANSFORM, backend=name,
                             num_workers=workers, device="cpu", on_error=on_error)
    ext = second.rpartition(".")[2].lower()
    cause = f"sample 00000001 has two {ext} members (in any case)"
    if on_error == "raise":
        with pytest.raises(DataError, match=rf"dup-000000\.tar \(member {second}\): {re.escape(cause)}"):
            _delivered(loader)
        return
    assert sorted(_delivered(loader)) == sorted((i % CLASSES, i) for i in (0, 2, 3))  # image i: color(i % 3, i)
    (error,) = loader.stats["errors"]
    assert error["path"].endswith(f"(member {second})") and cause in error["cause"], error


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_sample_whose_image_or_label_is_a_link_fails_naming_it(tmp_path, backend, on_error):
    """GNU tar writes a file it meets a second time as a hard link to the first, and webdataset
    reads no link: sample 1 of hard links alone (which webdataset drops without a word), sample 2
    whose label is a hard link and sample 3 whose image is a symbolic one fail naming the link
    and what it links to, and sample 6, a json link alone, names it among what it has; a link
    the loader does not read (sample 5's json) and a directory member change nothing;
    count_samples counts samples 1 and 6 as the loader lists them."""
    from PIL import Image

    def jpeg(i):
        out = io.BytesIO()
        Image.new("RGB", (24, 24), color(i % CLASSES, i)).save(out, "JPEG", quality=95)
        return out.getvalue()

    path = tmp_path / "links-000000.tar"
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
        def add(name, data=None, link=None, kind=tarfile.LNKTYPE):
            info = tarfile.TarInfo(name)
            if link is not None:
                info.type, info.linkname = kind, link
            elif data is None:
                info.type = tarfile.DIRTYPE
            else:
                info.size = len(data)
            tf.addfile(info, None if data is None else io.BytesIO(data))

        add("extra")  # a directory
        for i in range(6):
            jpg, cls = f"{i:08d}.jpg", f"{i:08d}.cls"
            add(jpg, link="00000000.jpg", kind=tarfile.SYMTYPE if i == 3 else tarfile.LNKTYPE) if i in (1, 3) \
                else add(jpg, jpeg(i))
            add(cls, link="00000000.cls") if i in (1, 2) else add(cls, b"%d" % (i % CLASSES))
            if i == 5:
                add(f"{i:08d}.json", link="00000000.json")
        add("00000006.json", link="00000000.json")
    assert count_samples(path) == 7
    name, workers = backend
    loader = fastdata.loader(str(path), batch_size=2, transform=TRANSFORM, backend=name, num_workers=workers,
                             device="cpu", on_error=on_error)
    why = "{} link to 00000000.{}, and links are not read (as webdataset reads none): store the file itself"
    if on_error == "raise":
        with pytest.raises(DataError, match=rf"links-000000\.tar \(member 00000001\.jpg\): the member is a hard "
                                            rf"{re.escape(why.format('', 'jpg')[1:])}"):
            _delivered(loader)
        return
    assert sorted(_delivered(loader)) == sorted((i % CLASSES, i) for i in (0, 4, 5))
    assert loader.stats["skipped"] == 4
    assert [(e["path"].rpartition("(member ")[2], e["cause"]) for e in loader.stats["errors"]] == [
        ("00000001.jpg)", "the member is a " + why.format("hard", "jpg")),
        ("00000002.cls)", "the member is a " + why.format("hard", "cls")),
        ("00000003.jpg)", "the member is a " + why.format("symbolic", "jpg")),
        ("00000006.*)", f"the sample has no image member ({', '.join(IMAGE_MEMBERS)}), only: json (a hard link to "
                        "00000000.json)")]


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT], ids=["gnu", "pax"])
def test_a_links_long_target_is_named_whole(tmp_path, fmt):
    """A link's target past the header's 100 bytes is in a GNU long-link header or a pax
    linkpath record: the sample's error names the whole of it."""
    target = "d" * 120 + "/00000000.jpg"
    path = tmp_path / "long-000000.tar"
    with tarfile.open(path, "w", format=fmt) as tf:
        info = tarfile.TarInfo("00000000.jpg")
        info.type, info.linkname = tarfile.SYMTYPE, target
        tf.addfile(info)
        info = tarfile.TarInfo("00000000.cls")
        info.size = 1
        tf.addfile(info, io.BytesIO(b"0"))
    loader = fastdata.loader(str(path), batch_size=1, transform=TRANSFORM, num_workers=0, device="cpu",
                             on_error="skip")
    assert _delivered(loader) == []
    assert loader.stats["errors"][0]["cause"].startswith(f"the member is a symbolic link to {target}, and links")


def test_a_member_name_longer_than_a_path_is_damage(tmp_path):
    """A GNU long name of 100,000 characters (up to 1 MiB of them fits an extended header) is
    taken as a damaged header: the message naming it stays short, and the samples around it are
    read."""

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (24, 24), color(0, 0)).save(out, "JPEG", quality=95)
    tar_of(tmp_path / "long-000000.tar", [("00000000.jpg", out.getvalue()), ("00000000.cls", b"0"),
                                          ("k" * 100_000 + ".jpg", out.getvalue()), ("k" * 100_000 + ".cls", b"0")],
           tarfile.GNU_FORMAT)  # a GNU long name
    loader = fastdata.loader(str(tmp_path / "long-000000.tar"), batch_size=1, transform=TRANSFORM, backend="wds",
                             device="cpu", on_error="skip")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert _delivered(loader) == [sample(0)]
    assert loader.stats["skipped"] >= 1
    for error in loader.stats["errors"]:
        assert len(error["path"]) + len(error["cause"]) < 1000, error
    assert any("a member name of 100004 characters, more than the 4096 of a path" in e["cause"]
               for e in loader.stats["errors"]), loader.stats["errors"]


def test_an_index_naming_too_many_classes_for_soft_targets_is_refused(pristine, tmp_path):
    """MixUp's targets are [batch, classes] floats, the classes counted from the index: an index
    naming 300,000 of them gives a batch of 1,024 1.2 GB of targets, refused when the loader is
    built, in one line; 3 classes (as written) or no soft targets load."""
    _copy(pristine, tmp_path, True)
    mix = T.Compose([T.Resize(SIZE), T.CenterCrop(SIZE), T.MixUp(0.2)])
    loader = fastdata.loader(str(tmp_path / PATTERN), batch_size=1024, transform=mix, device="cpu")
    assert next(iter(loader))[1].shape == (N, 3)
    _edit_index(tmp_path, lambda index: index.update(classes=[str(c) for c in range(300_000)]))
    with pytest.raises(ValueError, match=r"targets of \[1024, 300000\] a batch, over 1 GiB"):
        fastdata.loader(str(tmp_path / PATTERN), batch_size=1024, transform=mix, device="cpu")
    fastdata.loader(str(tmp_path / PATTERN), batch_size=1024, transform=TRANSFORM, device="cpu")


class _Endless(io.RawIOBase):
    """A stream of `n` one-byte samples `%08d.cls`, made as it is read (`name`: their key's length)."""

    def __init__(self, n: int, name: int = 8):
        self.n, self.i, self.name, self.buf = n, 0, name, b""

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while len(self.buf) < len(b) and self.i < self.n:
            info = tarfile.TarInfo(f"{self.i:08d}".rjust(self.name, "k") + ".cls")
            info.size = 1
            self.buf += info.tobuf(tarfile.GNU_FORMAT) + b"1" + bytes(511)
            self.i += 1
        n = min(len(b), len(self.buf))
        b[:n], self.buf = self.buf[:n], self.buf[n:]
        return n


def test_a_streams_listing_takes_little_more_than_its_keys():
    """A stream scanned without an index (up to MAX_STREAM_SAMPLES samples, 8 at a time) keeps
    each sample as a key and numbers, not a Python object a sample: 20,000 samples of 8-character
    keys peak under 200 bytes each (a list of 6 fields and a set each took 654), so that 8
    endless streams served at once stop at their bound within a few GB where they took 5."""
    import tracemalloc

    from fastdata.sources.tarformat import scan_tar

    n = 20_000
    tracemalloc.start()
    try:
        scan = scan_tar(io.BufferedReader(_Endless(n), 1 << 16))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert scan.keys[::9999] == ["00000000", "00009999", "00019998"] and len(scan.keys) == n
    assert scan.spans[1].tolist() == [1024, 1024] and scan.contents[1].tolist() == [1, 1]
    assert peak / n < 200, f"{peak / n:.0f} bytes a sample"


def test_the_keys_a_scan_keeps_are_bounded(pristine, tmp_path, monkeypatch):
    """Names of up to 4,096 characters would make a listing of GBs from a stream of a million
    samples (or from a big file): a scan keeps keys of MAX_SCAN_KEY_CHARS characters at most,
    then refuses the shard in one line naming it, stream and file alike."""
    from fastdata.sources import tarformat

    stream = _stream_shard(tmp_path, pristine)
    shutil.copy(pristine / "train-000000.tar", tmp_path / "f-000000.tar")  # a file without an index: scanned
    monkeypatch.setattr(tarformat, "MAX_SCAN_KEY_CHARS", 5 * 8)  # the shard's 6 keys have 8 characters
    for url in (stream, str(tmp_path / "f-000000.tar")):
        with pytest.raises(DataError, match=r"cannot read shard .*-000000\.tar: the keys of its samples come to "
                                            r"more than 40 characters; split it$"):
            shards(url, progress=False)
    monkeypatch.setattr(tarformat, "MAX_SCAN_KEY_CHARS", 6 * 8)
    assert len(shards(stream, progress=False)) == len(shards(str(tmp_path / "f-000000.tar"), progress=False)) == 6


def test_an_xz_shard_asking_for_much_memory_is_refused(pristine, tmp_path):
    """xz lets a file of a few KB ask for a dictionary of 1.5 GiB, which the decompressor takes
    as it goes (a .lzma one, 4 GiB), in each of 8 scans and each worker's open streams: a shard
    whose stream needs more than MAX_XZ_MEMORY (128 MiB; `xz -9` needs 65) is refused naming it,
    whatever its name; one within it reads."""
    import lzma

    from fastdata.sources.compressed import MAX_XZ_MEMORY

    data = (pristine / "train-000000.tar").read_bytes()
    for name, dict_size in (("big-000000.tar", 1 << 30), ("fine-000000.tar.xz", 1 << 26)):
        packed = lzma.compress(data, filters=[{"id": lzma.FILTER_LZMA2, "dict_size": dict_size}])
        assert len(packed) < len(data)
        (tmp_path / name).write_bytes(packed)
    with pytest.raises(DataError, match=rf"cannot read shard .*big-000000\.tar: the xz stream fails at byte 0 .* "
                                        rf"needs more than the {MAX_XZ_MEMORY >> 20} MiB"):
        shards(str(tmp_path / "big-000000.tar"), progress=False)
    assert len(shards(str(tmp_path / "fine-000000.tar.xz"), progress=False)) == 6


@pytest.mark.parametrize("kind", ["bz2", "xz"])
def test_a_compressed_shard_that_decompresses_to_far_more_than_gzip_can_ends_there(pristine, tmp_path, monkeypatch,
                                                                                    kind):
    """bzip2 and xz decompress a few hundred bytes to gigabytes, each time a shard is read: a
    stream that gives more than MAX_RATIO bytes (gzip's most) for each compressed byte read,
    past its first MAX_RATIO_FREE (lowered here to 1 MiB), ends there, with a warning naming the
    shard; the samples before it are read, each with its label, and the one it splits is
    skipped and counted. The same shard gzip-compressed reads whole."""
    import bz2
    import gzip
    import lzma

    from fastdata.sources import compressed

    monkeypatch.setattr(compressed, "MAX_RATIO_FREE", 1 << 20)
    out = io.BytesIO()
    with tarfile.open(pristine / "train-000000.tar") as src, tarfile.open(fileobj=out, mode="w") as tf:
        for m in src.getmembers():
            tf.addfile(m, src.extractfile(m))
        bomb = tarfile.TarInfo("zz.bin")
        bomb.size = 16 << 20
        tf.addfile(bomb, io.BytesIO(bytes(bomb.size)))
    (tmp_path / "train-000000.tar.gz").write_bytes(gzip.compress(out.getvalue()))
    assert len(shards(str(tmp_path / "train-000000.tar.gz"), progress=False)) == 7
    (tmp_path / "train-000000.tar.gz").unlink()
    packed = (bz2.compress if kind == "bz2" else lzma.compress)(out.getvalue())
    (tmp_path / f"train-000000.tar.{kind}").write_bytes(packed)
    loader, said = _load(tmp_path, ("wds", 0), "skip", pattern=f"train-000000.tar.{kind}")
    assert any(re.search(rf"train-000000\.tar\.{kind} ends early: the {kind} stream fails at byte \d+ .*over 1,032 "
                         r"times its size .*a decompression bomb", w) for w in said), said
    got = _delivered(loader)
    assert sorted(got) == sorted(sample(i) for i in range(6))
    assert loader.stats["skipped"] == 1 and loader.stats["errors"][0]["path"].endswith("(member zz.bin)")
