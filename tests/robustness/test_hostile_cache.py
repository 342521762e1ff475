"""The machine's caches where the machine is odd or the cache is not the user's: a CUDA that
says it is there but cannot start, no home directory, a tune-cache entry someone else may have
written or with values no tune gives. Every image loader reads the cache, so none of these may
stop one from building; an untrusted or out-of-range entry is not applied."""

from __future__ import annotations

import json
import logging
import os
import sys
import warnings
from pathlib import Path

import pytest
import torch
from _images import color_folder

import fastdata
from fastdata import _codec, tunecache
from fastdata import transforms as T

SPEC = T.Compose([T.Resize(8), T.CenterCrop(8)])


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return str(color_folder(tmp_path_factory.mktemp("imgs"), 2, 3, (20, 30), lambda i: f"{i:03d}.jpg"))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTDATA_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("FASTDATA_TUNE_TTL_DAYS", raising=False)
    return tmp_path / "cache"


def _labels(loader) -> list[int]:
    return sorted(int(v) for _, labels in loader for v in labels)


def _auto(folder):
    """A loader with num_workers="auto" and the warnings its construction gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = fastdata.loader(folder, batch_size=2, transform=SPEC, num_workers="auto", device="cpu")
    return loader, [str(w.message) for w in caught]


# ------------------------------------------------------------------ a CUDA that cannot start

def test_cuda_that_cannot_start_leaves_a_cpu_loader_working(folder, cache, monkeypatch):
    def no_init(*args, **kwargs):
        raise RuntimeError("Cannot re-initialize CUDA in forked subprocess")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", no_init)
    assert tunecache.machine_key().endswith(", cuda?")
    loader = fastdata.loader(folder, batch_size=2, transform=SPEC, backend="pil", num_workers=0, device="cpu")
    assert _labels(loader) == [0, 0, 0, 1, 1, 1]


# ------------------------------------------------------------------ no home directory

@pytest.fixture
def homeless(monkeypatch):
    """No $FASTDATA_CACHE and no home directory (HOME unset, a uid without a passwd entry: what
    Path.home() raises then)."""

    def no_home(cls=None):
        raise RuntimeError("Could not determine home directory.")

    for name in ("FASTDATA_CACHE", "HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(Path, "home", classmethod(no_home))


def test_no_home_means_no_tune_cache_and_an_index_in_memory(folder, homeless):
    assert tunecache.cache_root() is None and _codec.index_path() == ""
    assert tunecache.cached_tune(folder, SPEC, 2) is None
    assert tunecache.list_tunes() == [] and tunecache.clear_tunes() == 0
    loader, _ = _auto(folder)
    assert _labels(loader) == [0, 0, 0, 1, 1, 1]
    if _codec.AVAILABLE:
        assert _codec.index_stats()["path"] == ""  # the guide's promise: an index in this process's memory
    with pytest.raises(OSError, match=r"cannot keep the tune: there is no cache folder .*set FASTDATA_CACHE") as e:
        tunecache.store_tune(folder, SPEC, 2, {"chosen": {"num_workers": 1}})
    assert "\n" not in str(e.value)


def test_an_unwritable_cache_says_where(folder, cache):
    cache.write_text("a file where the cache folder should be")
    with pytest.raises(OSError, match=rf"cannot keep the tune in {cache}/tuned: .*set FASTDATA_CACHE"):
        tunecache.store_tune(folder, SPEC, 2, {"chosen": {"num_workers": 1}})


def test_a_tune_that_could_not_be_kept_stops_before_measuring(folder, cache):
    """`fastdata profile --tune` where the tune cache cannot be written: the one-line error
    that says what to set, before the profile's and the tune's minutes, not after them; and
    the check leaves nothing in a cache that can be written."""
    import shutil
    import subprocess

    tunecache.check_keepable(folder, SPEC, 2)
    assert [p.name for p in cache.rglob("*") if p.is_file()] == []
    shutil.rmtree(cache)
    cache.write_text("a file where the cache folder should be")
    done = subprocess.run([sys.executable, "-m", "fastdata", "profile", str(folder), "--tune", "--step-ms", "5",
                           "--size", "16", "--batch-size", "2"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "FASTDATA_CACHE": str(cache), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 1 and "profiling" not in done.stderr and "tuning" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (f"fastdata profile: error: OSError: cannot keep the tune in "
                                                    f"{cache}/tuned: Not a directory; set FASTDATA_CACHE to a "
                                                    "writable folder")


# ------------------------------------------------------------------ an entry not to be trusted

def test_an_entry_others_may_write_is_not_applied(folder, cache):
    path = tunecache.store_tune(folder, SPEC, 2, {"chosen": {"num_workers": 1, "prefetch_factor": 3}})
    assert os.stat(path).st_mode & 0o777 == 0o644  # as a tune keeps it: applied
    loader, warned = _auto(folder)
    assert loader.num_workers == 1 and warned == []
    os.chmod(path, 0o666)
    loader, warned = _auto(folder)
    assert loader.num_workers == 0  # untuned "auto" without persistent workers
    [line] = warned
    assert line.startswith(f"ignoring the tuned config in {path}: it is not this user's alone to write")
    assert "mode 0666" in line
    [listed] = tunecache.list_tunes()
    assert not listed["valid"] and "mode 0666" in listed["why_not"]


def test_an_entry_that_is_a_link_is_not_applied(folder, cache, tmp_path):
    path = tunecache.store_tune(folder, SPEC, 2, {"chosen": {"num_workers": 1}})
    os.replace(path, tmp_path / "elsewhere.json")
    path.symlink_to(tmp_path / "elsewhere.json")
    loader, warned = _auto(folder)
    assert loader.num_workers == 0
    assert len(warned) == 1 and "it is a symlink" in warned[0]


@pytest.mark.parametrize("chosen", [
    {"num_workers": 100000, "prefetch_factor": 2},
    {"num_workers": -1},
    {"num_workers": "2"},
    {"num_workers": True},
    {"num_workers": 1, "prefetch_factor": 100000},
    {"num_workers": 1, "prefetch_factor": 0},
    {"num_workers": 1, "placement": "everywhere"},
    {"num_workers": 1, "backend": "nonsense"},
], ids=lambda c: json.dumps(c))
def test_an_out_of_range_entry_is_not_applied(folder, cache, chosen):
    path = tunecache.store_tune(folder, SPEC, 2, {"chosen": chosen})
    loader, warned = _auto(folder)
    assert loader.num_workers == 0  # untuned: not 1, nor the entry's count
    [line] = warned
    assert line.startswith(f"ignoring the tuned config in {path}: its ") and "is not" in line


def test_an_entry_kept_for_another_key_is_not_applied(folder, cache, tmp_path):
    """An entry moved under another source's name (its name is a hash of the key) says so."""
    other = tmp_path / "other"
    other.mkdir()
    kept = tunecache.store_tune(str(other), SPEC, 2, {"chosen": {"backend": "wds", "num_workers": 1}})
    path = tunecache.cache_path(folder, SPEC, 2)
    os.replace(kept, path)
    loader, warned = _auto(folder)
    assert loader.num_workers == 0 and _labels(loader) == [0, 0, 0, 1, 1, 1]  # the folder's, by pil
    [line] = warned
    assert line.startswith(f"ignoring the tuned config in {path}: it was kept for another source")
    assert repr(str(other)) in line


def test_an_entry_over_its_byte_bound_is_not_read(folder, cache):
    path = tunecache.store_tune(folder, SPEC, 2, {"chosen": {"num_workers": 1}})
    with open(path, "r+b") as f:  # a valid entry, then 4 GiB of holes: not read whole
        f.truncate(4 << 30)
    loader, warned = _auto(folder)
    assert loader.num_workers == 0
    assert warned == [f"ignoring the tuned config in {path}: it is over {tunecache.MAX_ENTRY_BYTES:,} bytes "
                      "(a tune writes a few KB)"]


def test_a_relative_source_is_keyed_by_where_it_resolves(cache, tmp_path, monkeypatch):
    """`data/train-{0..1}.tar` in two projects is two sources: a tune kept in one is not applied
    in the other (a pattern that names no file as such was keyed by its text)."""
    pattern = "shards/train-{000000..000001}.tar"
    for project in ("p1", "p2"):
        (tmp_path / project / "shards").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "p1")
    tunecache.store_tune(pattern, SPEC, 2, {"chosen": {"num_workers": 1}})
    tunecache.store_tune(["a.jpg", "b.jpg"], SPEC, 2, {"chosen": {"num_workers": 1}})
    assert tunecache.cached_tune(pattern, SPEC, 2)["source"] == str(tmp_path / "p1" / pattern)
    assert tunecache.cached_tune(["a.jpg", "b.jpg"], SPEC, 2) is not None
    monkeypatch.chdir(tmp_path / "p2")
    assert tunecache.cached_tune(pattern, SPEC, 2) is None
    assert tunecache.cached_tune(["a.jpg", "b.jpg"], SPEC, 2) is None
    assert tunecache.cached_tune("pipe:cat " + pattern, SPEC, 2) is None  # a command is its text
    tunecache.store_tune("pipe:cat " + pattern, SPEC, 2, {"chosen": {"num_workers": 1}})
    monkeypatch.chdir(tmp_path / "p1")
    assert tunecache.cached_tune("pipe:cat " + pattern, SPEC, 2)["source"] == "pipe:cat " + pattern
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()  # a working folder removed under the process: relative sources name nothing, and nothing raises
    assert tunecache.cached_tune(pattern, SPEC, 2) is None and tunecache.cached_tune(["a.jpg"], SPEC, 2) is None


@pytest.mark.parametrize("backend, module", [("dali", "nvidia"), ("ray", "ray")])
def test_a_tune_of_a_backend_not_installed_here_is_not_applied(folder, cache, monkeypatch, caplog, backend,
                                                                module):
    """An entry kept where DALI (or Ray) was installed, read where it is not (uninstalled
    since, or another virtualenv sharing the home directory) is not applied: the loader would
    otherwise refuse to build."""
    path = tunecache.store_tune(folder, SPEC, 2, {"chosen": {"backend": backend, "num_workers": 1}})
    monkeypatch.setitem(sys.modules, module, None)  # (what `import` does where the package is missing)
    with caplog.at_level(logging.DEBUG, logger="fastdata"):
        loader, warned = _auto(folder)
    assert warned == [] and loader.num_workers == 0 and _labels(loader) == [0, 0, 0, 1, 1, 1]
    assert f"ignoring the tuned config in {path}: it chose backend {backend!r}, which is not installed here" \
        in caplog.text


def test_clearing_the_cache_leaves_a_folder_that_matches(cache, capsys):
    from fastdata.profiling import cli

    tunecache.store_tune("/data/a", SPEC, 2, {"chosen": {"num_workers": 1}})
    (cache / "tuned" / "not-an-entry.json").mkdir()
    assert cli.main(["--clear-cache"]) == 0
    assert capsys.readouterr().out == "removed 1 kept tune(s)\n"
    assert [p.name for p in (cache / "tuned").iterdir()] == ["not-an-entry.json"]


def test_no_home_every_command_still_parses_and_the_demo_says_what_to_pass(homeless):
    """Without a home directory every command's parser builds (none looks a home up when
    imported), and the demo, whose images would go in the cache, asks for --data."""
    import importlib

    from fastdata import _cli, cli, demo

    importlib.reload(demo)  # (imported before the fixture took the home away)
    for name in cli.COMMANDS:
        cli.parser(name)
    args = cli.parser("demo").parse_args(["demo"])
    assert args.data is None
    with pytest.raises(_cli.CommandError, match=r"no home directory\): pass --data DIR, or --images 0"):
        demo._demo(args)
