"""Image mode with num_workers=0 (and "auto" without persistent workers): a decode thread in the
training process, alive only while its pass is; the same batches as worker processes give."""

import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

import fastdata
from _images import color_folder
from fastdata import _workers
from fastdata import transforms as T
from fastdata._loader import resolve_workers
from fastdata.shard import write_shards

CLASSES, PER_CLASS = 3, 8


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return color_folder(tmp_path_factory.mktemp("imgs"), CLASSES, PER_CLASS, (60, 120), lambda i: f"{i:03d}.jpg")


def _loader(source, **kw):
    kw = {"batch_size": 4, "shuffle": True, "seed": 1, **kw}
    return fastdata.loader(str(source), transform=T.Compose([T.RandomResizedCrop(24), T.RandomHorizontalFlip()]),
                           device="cpu", **kw)


def _decode_threads():
    return [t for t in threading.enumerate() if t.name == "fastdata-decode"]


def _batches(loader):
    return [(x.clone(), y.clone()) for x, y in loader]


def test_auto_decodes_in_process_unless_persistent(folder):
    auto = _loader(folder, num_workers="auto")
    assert auto.num_workers == 0
    persistent = _loader(folder, num_workers="auto", persistent_workers=True)
    assert persistent.num_workers == resolve_workers("auto", persistent.device) >= 1
    got, want = _batches(auto), _batches(_loader(folder, num_workers=2))
    assert len(got) == len(want) == 6
    for (x, y), (wx, wy) in zip(got, want):
        assert torch.equal(x, wx) and torch.equal(y, wy)
    # every sample once, each with its own label (the red channel says the class)
    labels = torch.cat([y for _, y in got])
    reds = torch.cat([x[:, 0].float().mean((1, 2)) for x, _ in got])
    assert torch.equal(torch.round((reds - 20) / 40).long(), labels)
    assert sorted(labels.tolist()) == sorted(c for c in range(CLASSES) for _ in range(PER_CLASS))


def test_decode_thread_lives_only_while_its_pass_does(folder):
    loader = _loader(folder, num_workers=0)
    assert not _decode_threads()
    _batches(loader)  # a whole epoch
    assert not _decode_threads()
    it = iter(loader)
    next(it)
    assert len(_decode_threads()) == 1
    # workers started now would not fork the thread
    assert _workers.start_method(None).get_start_method() == "forkserver"
    it2 = iter(loader)  # a new pass ends the old one first
    next(it2)
    assert len(_decode_threads()) == 1
    it2.close()  # left early
    assert not _decode_threads()
    assert _workers.start_method(None).get_start_method() == "fork"
    del it


def test_error_in_the_decode_thread_names_the_file(tmp_path):
    root = color_folder(tmp_path / "imgs", 2, 6, (40, 60), lambda i: f"{i:03d}.jpg")
    bad = root / "class1" / "003.jpg"
    bad.write_bytes(bad.read_bytes()[:200])
    with pytest.raises(fastdata.DataError, match="003.jpg"):
        _batches(_loader(root, num_workers=0, shuffle=False))
    assert not _decode_threads()
    skipping = _loader(root, num_workers=0, on_error="skip")
    assert sum(len(y) for _, y in skipping) == 11 and skipping.stats["skipped"] == 1


@pytest.mark.parametrize("workers", [0, 2])
def test_an_error_choosing_the_next_keys_reaches_the_loop(folder, workers):
    """A sampler that raises in its second epoch (weights gone NaN, say) raises in the training
    loop, with the thread as with workers, instead of ending the epoch as if it were complete."""
    def weights(epoch):
        return [float("nan") if epoch == 1 else 1.0] * (CLASSES * PER_CLASS)
    loader = _loader(folder, num_workers=workers, shuffle=None,
                     sampler=fastdata.samplers.WeightedSampler(weights, seed=0))
    assert len(_batches(loader)) == len(loader) == 6
    loader.set_epoch(1)
    with pytest.raises(ValueError):
        _batches(loader)
    assert not _decode_threads()


def test_a_stuck_decode_thread_ends_the_pass_within_its_timeout(folder, monkeypatch):
    loader = _loader(folder, num_workers=0, timeout=1)
    release = threading.Event()
    read = type(loader._reader)._read  # what reads a batch's files, whole or in parts

    def stuck(self, keys, budget):
        release.wait(60)  # a read that does not return
        return read(self, keys, budget)

    monkeypatch.setattr(type(loader._reader), "_read", stuck)
    t = time.monotonic()
    with pytest.raises(RuntimeError, match="no batch in 1 seconds from the decode thread"):
        next(iter(loader))
    assert time.monotonic() - t < 30  # not the 60 s the read waits
    release.set()
    for thread in _decode_threads():
        thread.join(10)
    assert not _decode_threads()


@pytest.mark.parametrize("kind", ["files", "shards"])
def test_exit_with_a_pass_under_way_is_clean(folder, tmp_path, kind):
    """A script that takes a batch and exits, its iterator never finished or closed: the
    decode thread (in the native decoder, or waiting on the shard read-ahead) is stopped at
    exit, not ended by the interpreter's finalization (which aborts the process)."""
    source = str(folder)
    if kind == "shards":
        write_shards(str(folder), str(tmp_path / "s-%06d.tar"), max_count=8)
        source = str(tmp_path / "s-{000000..000002}.tar")
    script = textwrap.dedent(f"""
        import fastdata
        from fastdata import transforms as T
        loader = fastdata.loader({source!r}, batch_size=2, shuffle=True, num_workers=0, device="cpu",
                                 transform=T.Compose([T.RandomResizedCrop(24)]), prefetch_factor=4)
        it = iter(loader)
        x, y = next(it)
        print("got", tuple(x.shape), flush=True)
    """)
    for _ in range(3):
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=90)
        assert out.returncode == 0 and "got (2, 3, 24, 24)" in out.stdout, out.stderr[-2000:]
        assert "terminate" not in out.stderr
