"""Sources (`fastdata.sources`): what a path, a list or a shard pattern names, and the shard
format (`fastdata.sources.tarformat`): how samples group in a tar, the index's checks."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
import warnings

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
