"""Sources (`fastdata.sources`): what a path, a list or a shard pattern names, and the shard
format (`fastdata.sources.tarformat`): how samples group in a tar, the index's checks."""

from __future__ import annotations

import gzip
import io
import json
import os
import tarfile
import warnings

import numpy as np
import pytest

import fastdata
from fastdata.sources.tarformat import count_samples, read_index


def test_source_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        fastdata.loader(str(tmp_path / "nope"), batch_size=2)
    with pytest.raises(ValueError, match="no class folders"):
        fastdata.loader(str(tmp_path), batch_size=2)
    with pytest.raises(TypeError, match="shufle"):
        fastdata.loader(str(tmp_path), batch_size=2, shufle=True)
    with pytest.raises(ValueError, match="backend 'wds' reads WebDataset shards"):
        fastdata.loader(str(tmp_path), batch_size=2, backend="wds")
    with pytest.raises(FileNotFoundError, match=r"shards-\*\.tar' does not exist \(a shard pattern is a brace range, "
                                                r"as train-\{000000\.\.000127\}\.tar, not a glob\)"):
        fastdata.loader(str(tmp_path / "shards-*.tar"), batch_size=2)


def test_a_source_that_is_no_image_folder_says_what_it_holds(tmp_path):
    """A first call's usual slips: a glob of images, a folder of shards, a folder of images
    without class folders. Each error says what to give instead, in one line, and the brace
    pattern it suggests for shards loads them."""
    from PIL import Image

    from fastdata.shard import write_shards

    for c in range(2):
        (tmp_path / "imgs" / f"c{c}").mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (8, 8), (c * 100, i, 0)).save(tmp_path / "imgs" / f"c{c}" / f"{i}.png")
    with pytest.raises(FileNotFoundError, match=r"\*\.png' does not exist \(a glob is no source: give the folder in "
                                                r"ImageFolder layout, or a list of \(path, label\) pairs"):
        fastdata.loader(str(tmp_path / "imgs" / "*" / "*.png"), batch_size=2)
    (tmp_path / "flat").mkdir()
    for i in range(3):
        Image.new("RGB", (8, 8)).save(tmp_path / "flat" / f"{i}.png")
    with pytest.raises(ValueError, match=r"no class folders: expected root/<class>/<image>; it holds 3 images "
                                         r"itself: move them into a folder per class, or give a list of "
                                         r"\(path, label\) pairs$"):
        fastdata.loader(str(tmp_path / "flat"), batch_size=2)
    (tmp_path / "shards").mkdir()
    write_shards(str(tmp_path / "imgs"), str(tmp_path / "shards" / "train-%04d.tar"), max_count=2, workers=1)
    with pytest.raises(ValueError) as e:
        fastdata.loader(str(tmp_path / "shards"), batch_size=2)
    pattern = str(tmp_path / "shards" / "train-{0000..0002}.tar")
    assert str(e.value).endswith(f"it holds 3 .tar files (train-0000.tar ... train-0002.tar): give WebDataset shards "
                                 f"as a brace pattern ({pattern}) or a list of their paths")
    labels = [int(y) for _, y in fastdata.loader(pattern, batch_size=1)]
    assert sorted(labels) == [0, 0, 0, 1, 1, 1]
    (tmp_path / "shards" / "x\ny.tar").write_bytes(b"")  # a name that would break the line
    with pytest.raises(ValueError) as e:
        fastdata.loader(str(tmp_path / "shards"), batch_size=2)
    assert "\n" not in str(e.value) and "4 .tar files (train-0000.tar ... x\\ny.tar)" in str(e.value)


def test_a_path_under_home_is_written_with_a_tilde_as_imagefolder_takes_it(tmp_path, monkeypatch):
    from PIL import Image

    from fastdata import sources
    from fastdata.shard import write_shards

    for c in range(2):
        (tmp_path / "imgs" / f"c{c}").mkdir(parents=True)
        Image.new("RGB", (8, 8), (c * 100, 0, 0)).save(tmp_path / "imgs" / f"c{c}" / "0.png")
    monkeypatch.setenv("HOME", str(tmp_path))
    folder = sources.resolve("~/imgs")
    assert folder.paths == [str(tmp_path / "imgs" / f"c{c}" / "0.png") for c in range(2)]
    write_shards("~/imgs", str(tmp_path / "s-%03d.tar"), workers=1)
    shards = sources.resolve("~/s-{000..000}.tar")
    assert shards.urls == [str(tmp_path / "s-000.tar")] and shards.indexed == [True]


def test_count_samples_groups_as_webdataset_does(tmp_path):
    """A tar from elsewhere: folders, metadata, multi-dot names, members without extension."""
    path = tmp_path / "other.tar"
    with tarfile.open(path, "w") as tf:
        def add(name, data=b"x"):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        d = tarfile.TarInfo("dir")
        d.type = tarfile.DIRTYPE
        tf.addfile(d)
        add("__meta__")
        for name in ["a.jpg", "a.cls", "dir/b.x.jpg", "dir/b.cls", "noext", "c.txt", "a.png", "d.seg.png"]:
            add(name)
    assert count_samples(path) == 5  # a, dir/b, c, a again (not consecutive), d
    gz = tmp_path / "other.tar.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    assert count_samples(gz) == 5
    wds = pytest.importorskip("webdataset")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        assert len(list(wds.WebDataset([str(path)], shardshuffle=False))) == 5


def test_read_index_checks_the_format(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps({"version": 1, "format": "something else"}))
    with pytest.raises(ValueError, match="fastdata-wds-index"):
        read_index(tmp_path / "a.json")
    (tmp_path / "b.json").write_text(json.dumps({"version": 2, "format": "fastdata-wds-index", "shards": [], "total": 0}))
    with pytest.raises(ValueError, match="version"):
        read_index(tmp_path / "b.json")


@pytest.mark.parametrize("pattern", ["x-{0..99999999999}.tar", "x-{0000..9999}-{000..999}.tar"])
def test_a_pattern_naming_too_many_shards_is_refused_before_its_names_are_made(tmp_path, pattern):
    from fastdata.sources import webdataset

    with pytest.raises(ValueError, match=r"names up to [\d,]+ shards, more than 1,000,000"):
        webdataset._expand(str(tmp_path / pattern))
    assert len(webdataset._expand(str(tmp_path / "x-{000..999}-{0..9}.tar"))) == 10_000


def test_names_read_as_the_list_they_were_made_from():
    """`Names` keeps any str as it is (a path the OS decoded with surrogateescape, a lone
    surrogate), and reads, slices, compares and pickles as a list of them."""
    import copy
    import pickle

    from fastdata.sources import Names

    items = ["a", "bé/ü", "raw-\udcff", "lone-\ud800", "", "中文.jpg"]
    names = Names(items)
    assert list(names) == items and len(names) == 6 and names == items and names != items[:-1]
    assert [names[i] for i in range(-6, 6)] == items + items
    for i in (-7, -12, 6, 2**70):
        with pytest.raises(IndexError):
            names[i]
    assert names[1:4] == items[1:4] and names[::-2] == items[::-2] and names[np.int64(5)] == items[5]
    assert all(pickle.loads(pickle.dumps(names, protocol)) == names for protocol in range(pickle.HIGHEST_PROTOCOL + 1))
    assert copy.deepcopy(names) == names and Names() == [] and not Names()
    assert names.index("") == 4 and "raw-\udcff" in names
    with pytest.raises(TypeError):
        names["0"]


def test_a_forked_worker_reads_a_listing_without_copying_it():
    """A worker forked from the process that listed the samples reads every path: from a list
    of str objects that writes each one's reference count, and the worker copies the pages of
    the listing (its Private_Dirty grows by about the listing's size: PyTorch's issue 13246);
    from `Names` it writes none of them."""
    import multiprocessing

    from fastdata.sources import Names

    if not os.path.exists("/proc/self/smaps_rollup"):
        pytest.skip("no /proc/self/smaps_rollup on this system")
    paths = [f"/data/imagenet/train/n{i % 1000:08d}/n{i % 1000:08d}_{i:07d}.JPEG" for i in range(200_000)]
    grew = {}
    for kind, listing in (("list", list(paths)), ("names", Names(paths))):
        reader, writer = multiprocessing.get_context("fork").Pipe(duplex=False)
        worker = multiprocessing.get_context("fork").Process(target=_read_all, args=(listing, writer))
        worker.start()
        grew[kind] = reader.recv()
        worker.join(timeout=60)
    listing_mb = len(paths) * (49 + len(paths[0])) / 2**20  # the str objects alone
    assert grew["list"] > 0.5 * listing_mb, grew  # the control: this test can tell a copy
    assert grew["names"] < 2, grew


def _private_dirty_mb() -> float:
    with open("/proc/self/smaps_rollup") as f:
        return sum(int(line.split()[1]) for line in f if line.startswith("Private_Dirty:")) / 1024


def _read_all(listing, writer) -> None:
    before = _private_dirty_mb()
    total = 0
    for i in range(len(listing)):
        total += len(listing[i])
    writer.send(_private_dirty_mb() - before)


def test_a_206_answer_is_held_to_the_range_asked():
    """A range answer's Content-Range must start at the byte asked for and reach the range's end
    or the object's; anything else, a header of digits Python's int() refuses or of Unicode
    digits included, is an OSError quoting it. Without one, the bytes are taken as asked."""
    from fastdata.sources.streams import _check_range

    for ok in ["bytes 100-109/16384", "bytes 100-200/16384", "bytes 100-104/105", "Bytes 100-109/*", None]:
        _check_range(ok, 100, 110)
    for bad in ["bytes 99-109/16384", "bytes 100-104/16384", "bytes 100-104/*", "bytes 1\u00b200-109/16384",
                "bytes 100-1\u00b2\u00b3/16384", "bytes " + "0" * 5000 + "100-109/16384", "bytes */16384",
                "bytes 100-99/16384", "garbage", ""]:
        with pytest.raises(OSError, match="the server answered a request for bytes 100-109 with Content-Range"):
            _check_range(bad, 100, 110)
