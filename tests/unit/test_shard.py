"""fastdata-shard: WebDataset shards and their index, on images the tests make.

Every image is one flat color that encodes its sample: red = 40 * class + 20, green = the
image's number within its class * 12 + 10, blue a constant. So a sample read back from a shard
names itself, and must agree with its label and its key (its position in the source order;
shards hold the samples in a seeded shuffled order unless written with shuffle=False)."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import warnings
import zlib

import numpy as np
import pytest
from PIL import Image

from _images import color_folder
from fastdata import DataError
from fastdata.shard import index_path, main, write_shards
from fastdata.sources.tarformat import count_samples, read_index

CLASSES, PER_CLASS = 3, 7
N = CLASSES * PER_CLASS


def _name(i):
    # PNG and JPEG, and one .JPEG, whose member must be named .jpg
    return f"{i:03d}." + ("png" if i % 3 == 2 else "JPEG" if i == 4 else "jpg")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return color_folder(tmp_path_factory.mktemp("imgs"), CLASSES, PER_CLASS, (16, 64), _name)


def _pairs(folder):
    """The folder's samples in ImageFolder order, as (path, label)."""
    return [(str(folder / f"class{c}" / _name(i)), c) for c in range(CLASSES) for i in range(PER_CLASS)]


def _ids(data):
    """(class, number) from an image file's flat color."""
    r, g, _ = Image.open(io.BytesIO(data)).convert("RGB").getpixel((3, 3))
    return round((r - 20) / 40), round((g - 10) / 12)


def _ext(path):
    ext = os.path.splitext(path)[1][1:].lower()
    return "jpg" if ext == "jpeg" else ext


def _check(index_file, pairs, max_count=None, max_size=None, classes=None, order=None):
    """Everything the shards and their index promise, read back with tarfile and by hand:
    returns the shards' paths."""
    index = read_index(index_file)
    assert index["version"] == 1 and index["format"] == "fastdata-wds-index"
    assert index["total"] == len(pairs) and index["classes"] == classes
    assert list(index) == ["version", "format", "shards", "classes", "total"]
    root = os.path.dirname(index_file)
    if order is None:  # write_shards' default: shuffled with seed 0
        order = np.random.Generator(np.random.PCG64(0)).permutation(len(pairs))
    position, paths = 0, []
    for s, shard in enumerate(index["shards"]):
        assert list(shard) == ["name", "samples", "bytes", "sha256", "samples_index", "members", "crc32"]
        path = os.path.join(root, shard["name"])
        paths.append(path)
        raw = open(path, "rb").read()
        assert len(raw) == shard["bytes"] and hashlib.sha256(raw).hexdigest() == shard["sha256"]
        assert raw[-1024:] == bytes(1024)  # the end of archive, and nothing after it
        n = shard["samples"]
        assert len(shard["samples_index"]) == len(shard["members"]) == len(shard["crc32"]) == n >= 1
        if max_count is not None:
            assert n <= max_count
        if max_size is not None and n > 1:
            assert len(raw) <= max_size
        # tarfile: two members a sample, in order, with the fixed header fields
        with tarfile.open(path) as tf:
            members = tf.getmembers()
        assert len(members) == 2 * n
        for j, (key, offset, length) in enumerate(shard["samples_index"]):
            src, label = pairs[order[position]]
            assert key == f"{order[position]:08d}" and shard["members"][j][0] == key
            image, cls = members[2 * j], members[2 * j + 1]
            assert (image.name, cls.name) == (f"{key}.{_ext(src)}", f"{key}.cls")
            for m in (image, cls):
                assert m.isreg() and m.mode == 0o644 and m.mtime == 0 and (m.uid, m.gid) == (0, 0)
                assert m.uname == "" and m.gname == "" and m.pax_headers == {}
                assert raw[m.offset + 257:m.offset + 265] == b"ustar\x0000"  # USTAR, no pax or GNU header
            # samples_index: the sample's first header is at offset, its members fill [offset, offset + length)
            assert offset == image.offset
            header = tarfile.TarInfo.frombuf(raw[offset:offset + 512], "utf-8", "strict")
            assert header.name == image.name
            end = shard["samples_index"][j + 1][1] if j + 1 < n else len(raw) - 1024
            assert offset + length == end
            assert shard["crc32"][j] == zlib.crc32(raw[offset:offset + length])
            with tarfile.open(fileobj=io.BytesIO(raw[offset:offset + length] + bytes(1024))) as one:
                assert one.getnames() == [image.name, cls.name]
            # members: the payloads are the file's bytes and the label
            (ext, data_offset, data_size), (cls_ext, cls_offset, cls_size) = shard["members"][j][1]
            assert (ext, cls_ext) == (_ext(src), "cls")
            assert (data_offset, data_size) == (image.offset_data, image.size)
            assert raw[data_offset:data_offset + data_size] == open(src, "rb").read()
            assert raw[cls_offset:cls_offset + cls_size] == str(label).encode()
            position += 1
        assert count_samples(path) == n
        # a shard is full: the next sample would pass a bound
        if s + 1 < len(index["shards"]):
            following = index["shards"][s + 1]["samples_index"][0][2]
            assert (max_count is not None and n == max_count) or \
                   (max_size is not None and len(raw) + following > max_size)
    assert position == len(pairs)
    return paths


def _listing(d):
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


# ----------------------------------------------------------------- bounds and content

def test_max_count(folder, tmp_path):
    index = write_shards(folder, tmp_path / "train-%06d.tar", max_count=4, workers=1)
    assert index == tmp_path / "train-index.json"
    paths = _check(str(index), _pairs(folder), max_count=4, classes=[f"class{c}" for c in range(CLASSES)])
    assert [os.path.basename(p) for p in paths] == [f"train-{k:06d}.tar" for k in range(6)]  # 21 = 5 x 4 + 1
    assert [s["samples"] for s in read_index(index)["shards"]] == [4, 4, 4, 4, 4, 1]
    assert sorted(os.listdir(tmp_path)) == sorted([os.path.basename(p) for p in paths] + ["train-index.json"])


def test_max_size(folder, tmp_path):
    index = write_shards(_pairs(folder), str(tmp_path / "s-%03d.tar"), max_size=5000, workers=2)
    paths = _check(str(index), _pairs(folder), max_size=5000)
    assert len(paths) > 3 and all(os.path.getsize(p) <= 5000 for p in paths)


def test_too_big_sample_gets_its_own_shard(folder, tmp_path):
    big = tmp_path / "big.png"
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(big)
    assert big.stat().st_size > 10000
    pairs = _pairs(folder)
    pairs.insert(5, (str(big), 2))
    index = write_shards(pairs, tmp_path / "out" / "b-%d.tar", max_size=6000, max_count=3)
    paths = _check(str(index), pairs, max_count=3, max_size=6000)
    shards = read_index(index)["shards"]
    alone = [s for s in shards if s["bytes"] > 6000]
    assert len(alone) == 1 and alone[0]["samples"] == 1 and alone[0]["samples_index"][0][0] == "00000005"
    assert len(paths) == len(shards)


def test_webdataset_reads_every_sample_once(folder, tmp_path):
    wds = pytest.importorskip("webdataset")
    index = write_shards(folder, tmp_path / "train-%06d.tar", max_count=5, workers=2)
    urls = [str(tmp_path / s["name"]) for s in read_index(index)["shards"]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # webdataset leaves its shard files to the GC
        samples = list(wds.WebDataset(urls, shardshuffle=False))
    order = np.random.Generator(np.random.PCG64(0)).permutation(N)  # the default shuffle, seed 0
    assert [s["__key__"] for s in samples] == [f"{k:08d}" for k in order]
    seen = []
    for k, s in zip(order, samples):
        (ext,) = {"jpg", "png"} & set(s)
        assert set(s) - {"__key__", "__url__", "__local_path__"} == {ext, "cls"}
        path, label = _pairs(folder)[k]
        assert ext == _ext(path) and s[ext] == open(path, "rb").read()
        c, i = _ids(s[ext])
        assert int(s["cls"]) == label == c
        seen.append((c, i))
    assert sorted(seen) == [(c, i) for c in range(CLASSES) for i in range(PER_CLASS)]
    assert seen != sorted(seen)  # shuffled: the classes are mixed


def test_no_shuffle_keeps_the_source_order(folder, tmp_path):
    index = write_shards(folder, tmp_path / "train-%06d.tar", max_count=5, shuffle=False)
    _check(index, _pairs(folder), max_count=5, classes=[f"class{c}" for c in range(CLASSES)], order=np.arange(N))
    keys = [k for s in read_index(index)["shards"] for k, _, _ in s["samples_index"]]
    assert keys == [f"{k:08d}" for k in range(N)]
    other = write_shards(folder, tmp_path / "seed1" / "train-%06d.tar", max_count=5, seed=1)
    _check(other, _pairs(folder), max_count=5, classes=[f"class{c}" for c in range(CLASSES)],
           order=np.random.Generator(np.random.PCG64(1)).permutation(N))


def test_byte_identical_runs_and_workers(folder, tmp_path):
    outs = []
    for k, workers in enumerate([1, 2, 2]):
        d = tmp_path / f"run{k}"
        write_shards(folder, d / "train-%04d.tar", max_count=3, workers=workers)
        outs.append(_listing(d))
    assert len(outs[0]) == 8  # 7 shards and the index, no temporary file
    assert outs[0] == outs[1] == outs[2]


# ----------------------------------------------------------------- helpers

def test_index_names():
    assert index_path("out/train-%06d.tar") == index_path("out/train_%d.tar") == \
        index_path("out/train.%06d.tar") != index_path("out/val-%06d.tar")
    assert str(index_path("out/train-%06d.tar")) == os.path.join("out", "train-index.json")
    assert str(index_path("out/%06d.tar")) == os.path.join("out", "index.json")


@pytest.mark.parametrize("pattern", ["out/train.tar", "out/a-%d-%d.tar", "out/a-{000000..000009}.tar", "out%d/a.tar",
                                     "out/a-%s.tar", "out/a-%5d.tar", "out/a-%06d.tar.gz"])
def test_bad_patterns(folder, tmp_path, pattern):
    with pytest.raises(ValueError, match="pattern"):
        write_shards(folder, str(tmp_path / pattern))
    assert not (tmp_path / "out").exists()


def _left(folder) -> list[str]:
    """What a failed run left in `folder` (nothing where it removed the folder it made)."""
    return os.listdir(folder) if os.path.exists(folder) else []


def test_bad_sources_and_arguments(folder, tmp_path):
    out = str(tmp_path / "out" / "x-%d.tar")
    with pytest.raises(FileNotFoundError, match="nope"):
        write_shards(tmp_path / "nope", out)
    pairs = _pairs(folder)
    with pytest.raises(DataError, match="missing.jpg"):
        write_shards(pairs[:3] + [(str(tmp_path / "missing.jpg"), 0)], out)
    assert not (tmp_path / "out").exists()  # checked before anything was written: the folder it made is gone
    (tmp_path / "noext").write_bytes(b"x")  # named by its content, which is no image
    with pytest.raises(DataError, match="noext: not a readable image"):
        write_shards([(str(tmp_path / "noext"), 0)], out)
    with pytest.raises(ValueError, match="labels"):
        write_shards([(pairs[0][0], "cat")], out)
    with pytest.raises(ValueError, match="max_count"):
        write_shards(folder, out, max_count=0)
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError, match="cannot write"):
        write_shards(folder, str(tmp_path / "file" / "x-%d.tar"))


def test_failure_while_writing_leaves_no_partial_file(folder, tmp_path):
    (tmp_path / "dir.jpg").mkdir()  # stat works, reading fails
    pairs = _pairs(folder)
    pairs.insert(15, (str(tmp_path / "dir.jpg"), 1))
    out = tmp_path / "out"
    with pytest.raises(DataError, match="dir.jpg"):
        write_shards(pairs, out / "x-%03d.tar", max_count=2, workers=2)
    assert not any(".tmp" in f or f.endswith(".json") for f in _left(out))


@pytest.mark.timeout(60)
def test_a_failure_stops_the_other_workers_between_samples(folder, tmp_path, monkeypatch):
    """A shard that cannot be packed stops the run; the workers writing other shards are told
    to stop (and do, before their next sample) rather than killed: killing one that holds the
    pool's result lock could leave the run waiting forever. Here every good sample waits until
    the stop is given, so a run that stopped its workers otherwise cannot pass."""
    from fastdata import _tarwriter

    bad = tmp_path / "cut.jpg"
    bad.write_bytes((folder / "class0" / "000.jpg").read_bytes()[:300])
    image_bytes = _tarwriter._image_bytes

    def wait_for_the_stop(path, size):
        if path != str(bad):
            deadline = time.monotonic() + 30
            while not _tarwriter._SHARED[-1]:
                assert time.monotonic() < deadline, "the workers were never told to stop"
                time.sleep(0.01)
        return image_bytes(path, size)

    monkeypatch.setattr(_tarwriter, "_image_bytes", wait_for_the_stop)
    out = tmp_path / "out"
    with pytest.raises(DataError, match=r"^cannot pack .*cut\.jpg: truncated JPEG"):
        write_shards([(str(bad), 0)] + _pairs(folder), out / "x-%03d.tar", max_count=2, workers=2, shuffle=False)
    assert not out.exists()  # no shard, no temporary file, no index: nor the folder the run made


@pytest.mark.timeout(60)
def test_a_worker_that_dies_fails_the_run(folder, tmp_path, monkeypatch):
    """A worker killed mid-shard (by the OOM killer, say) fails the run with an error instead of
    leaving it waiting for that shard forever, and leaves no file behind."""
    from concurrent.futures.process import BrokenProcessPool

    from fastdata import _tarwriter

    victim = _pairs(folder)[5][0]
    image_bytes = _tarwriter._image_bytes

    def killed_at_victim(path, size):
        if path == victim:
            os.kill(os.getpid(), signal.SIGKILL)
        return image_bytes(path, size)

    monkeypatch.setattr(_tarwriter, "_image_bytes", killed_at_victim)
    out = tmp_path / "out"
    with pytest.raises(BrokenProcessPool):
        write_shards(_pairs(folder), out / "x-%03d.tar", max_count=2, workers=2, shuffle=False)
    assert not any(".tmp" in f or f.endswith(".json") for f in _left(out))


def _running(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers end with their run on Linux (prctl)")
@pytest.mark.timeout(60)
def test_the_workers_of_a_killed_run_end_with_it(folder, tmp_path):
    script = f"""
import os, time
from fastdata import _tarwriter
from fastdata.shard import write_shards

def stuck(path, size):
    open(os.path.join({str(tmp_path)!r}, "worker-%d" % os.getpid()), "w").close()
    time.sleep(60)

_tarwriter._image_bytes = stuck
write_shards({str(folder)!r}, {str(tmp_path / "out" / "x-%03d.tar")!r}, max_count=2, workers=2)
"""
    run = subprocess.Popen([sys.executable, "-c", script], env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        deadline = time.monotonic() + 30
        while len(workers := [int(f[7:]) for f in os.listdir(tmp_path) if f.startswith("worker-")]) < 2:
            assert run.poll() is None and time.monotonic() < deadline, "the run's workers did not start"
            time.sleep(0.05)
    finally:
        run.kill()
        run.wait()
    deadline = time.monotonic() + 10
    while any(_running(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = [pid for pid in workers if _running(pid)]
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive, "workers outlived their killed run"


@pytest.mark.timeout(60)
def test_files_that_are_not_regular_are_refused(folder, tmp_path):
    # A FIFO with no writer is refused at once (its read would wait forever), a symlink to
    # /dev/zero unread (its read would never end): each named with its kind.
    os.mkfifo(tmp_path / "fifo.jpg")
    (tmp_path / "zero.jpg").symlink_to("/dev/zero")
    pairs = _pairs(folder)
    for name, kind in [("fifo.jpg", "a FIFO"), ("zero.jpg", "a character device")]:
        with pytest.raises(DataError, match=rf"{name}: not a regular file \({kind}\)"):
            write_shards(pairs[:3] + [(str(tmp_path / name), 0)], tmp_path / "out" / "x-%d.tar", workers=1)


def _with_bad_files(folder, tmp_path):
    """The folder's pairs with three files that are no image the loader reads, in classes 0-2:
    an empty file, text named .jpg, and a JPEG cut in half."""
    bad = {"empty.jpg": b"", "text.jpg": b"not an image\n",
           "cut.jpg": (folder / "class0" / "000.jpg").read_bytes()[:300]}
    pairs = _pairs(folder)
    for k, (name, data) in enumerate(bad.items()):
        (tmp_path / name).write_bytes(data)
        pairs.insert(5 * k + 2, (str(tmp_path / name), k))
    return pairs, {str(tmp_path / name) for name in bad}


def test_files_the_loader_would_refuse_are_named_or_left_out(folder, tmp_path):
    """Each file is checked as the loader checks it before decoding: the first that fails stops
    the run naming it (nothing written), or with on_error="skip" each is left out with a warning
    naming it and why, and the shards hold every other sample, each with its own label."""
    pairs, bad = _with_bad_files(folder, tmp_path)
    with pytest.raises(DataError, match=r"cannot pack .*(empty|text|cut)\.jpg: .*pass on_error=\"skip\"$"):
        write_shards(pairs, tmp_path / "raise" / "x-%02d.tar", max_count=4, workers=2)
    assert not [f for f in _left(tmp_path / "raise") if f.endswith((".json", ".tmp"))]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        index = write_shards(pairs, tmp_path / "skip" / "x-%02d.tar", max_count=4, workers=2, on_error="skip")
    said = {str(w.message).partition(": ")[0].removeprefix("skipped "): str(w.message) for w in caught}
    assert set(said) == bad, said
    assert "empty file" in said[str(tmp_path / "empty.jpg")]
    assert "not a readable image" in said[str(tmp_path / "text.jpg")]
    assert "truncated JPEG" in said[str(tmp_path / "cut.jpg")]
    assert read_index(index)["total"] == N
    got = []
    for shard in read_index(index)["shards"]:
        with tarfile.open(tmp_path / "skip" / shard["name"]) as tf:
            files = {m.name: tf.extractfile(m).read() for m in tf.getmembers()}
        for name, data in files.items():
            if not name.endswith(".cls"):
                c, j = _ids(data)
                assert int(files[name.rsplit(".", 1)[0] + ".cls"]) == c
                got.append((c, j))
    assert sorted(got) == [(c, j) for c in range(CLASSES) for j in range(PER_CLASS)]


def test_cli_on_error_skip_names_each_file_left_out(folder, tmp_path):
    pairs, bad = _with_bad_files(folder, tmp_path)
    src = tmp_path / "src"
    for path, label in pairs:
        (src / f"class{label}").mkdir(parents=True, exist_ok=True)
        shutil.copy(path, src / f"class{label}" / os.path.basename(path))
    r = _run(src, tmp_path / "out" / "t-%02d.tar", "--max-count", "4", "-q")
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "fastdata-shard: error: DataError: cannot pack " in r.stderr and r.stderr.rstrip().endswith(
        "pass --on-error skip")
    r = _run(src, tmp_path / "out" / "t-%02d.tar", "--max-count", "4")  # the progress line ends before the error's
    assert r.returncode == 1 and r.stderr.splitlines()[-1].startswith("fastdata-shard: error: DataError: cannot pack ")
    r = _run(src, tmp_path / "out" / "t-%02d.tar", "--max-count", "4", "-q", "--on-error", "skip")
    assert r.returncode == 0, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 3 and all(line.startswith("fastdata-shard: warning: skipped ") for line in lines), lines
    assert f", {N} samples, " in r.stdout and "; 3 file(s) skipped" in r.stdout


def test_stale_shards_are_pointed_out(folder, tmp_path):
    write_shards(folder, tmp_path / "t-%02d.tar", max_count=4)
    with pytest.warns(UserWarning, match="t-01.tar"):
        write_shards(folder, tmp_path / "t-%02d.tar", max_count=40)
    assert read_index(tmp_path / "t-index.json")["shards"][0]["samples"] == N


def test_progress(folder, tmp_path, capsys):
    write_shards(folder, tmp_path / "a-%d.tar", max_count=8, workers=2, progress=True)
    err = capsys.readouterr().err
    assert f"{N}/{N} samples" in err and "MiB/s" in err and err.endswith("\n")
    write_shards(folder, tmp_path / "b-%d.tar", max_count=8)
    assert capsys.readouterr().err == ""


# ----------------------------------------------------------------- member names, and files left out

def _loaded(source, backend):
    """(images, labels) of every sample `fastdata.loader` gives for `source` in order (nothing
    skipped: on_error raise), each image resized to 8x8."""
    import torch

    import fastdata
    from fastdata import transforms as T

    loader = fastdata.loader(source, 4, backend=backend, transform=T.Compose([T.Resize((8, 8))]), num_workers=0,
                             device="cpu", shuffle=False)
    images, labels = zip(*loader)
    assert loader.stats["skipped"] == 0
    return torch.cat(images), torch.cat(labels)


def _same(a, b):
    import torch

    return a.shape == b.shape and torch.equal(a, b)


def _image(path, fmt, c, i):
    """A flat color(c, i) image (`_images.color`) in `fmt`, with a pixel of its own so that
    each differs from the others beyond its color."""
    from _images import color

    img = Image.new("RGB", (20 + i, 12 + c), color(c, i))
    img.putpixel((i, c), (255, 255, 255))
    mode = {"PGM": "L", "GIF": "P"}.get(fmt, "RGB")
    img.convert(mode).save(path, {"PGM": "PPM"}.get(fmt, fmt), **({"quality": 95} if fmt == "JPEG" else {}))


# (file name, format of its content, the member's name in a shard): names are the content's, not the file's
_FORMATS = [("0.jpg", "JPEG", "jpg"), ("1.png", "PNG", "png"), ("2.bmp", "BMP", "bmp"), ("3.ppm", "PPM", "ppm"),
            ("4.pgm", "PGM", "pgm"), ("5.tif", "TIFF", "tif"), ("6.tiff", "TIFF", "tif"), ("7.jpg", "PNG", "png"),
            ("8.jpg", "GIF", "gif"), ("9.png", "BMP", "bmp")]


def test_every_image_a_folder_loads_loads_from_its_shards(tmp_path):
    """A folder of every format fastdata decodes from a folder, some named for another: the
    shards' members are named by content, and the wds backend delivers every sample with the
    pixels and label the pil backend gives for the same file."""
    root = tmp_path / "src"
    for c in range(2):
        (root / f"c{c}").mkdir(parents=True)
        for i, (name, fmt, _) in enumerate(_FORMATS):
            _image(root / f"c{c}" / name, fmt, c, i)
    index = write_shards(root, tmp_path / "out" / "s-%03d.tar", max_count=7, shuffle=False, workers=2)
    exts = [m[1][0][0] for s in read_index(index)["shards"] for m in s["members"]]
    assert exts == [ext for _ in range(2) for _, _, ext in _FORMATS]
    images, labels = _loaded(str(root), "pil")
    got = _loaded(str(tmp_path / "out" / "s-{000..002}.tar"), "wds")
    assert len(labels) == 2 * len(_FORMATS) and labels.tolist() == [c for c in range(2) for _ in _FORMATS]
    assert _same(got[0], images) and _same(got[1], labels)


def test_a_file_lists_names_do_not_name_members(tmp_path):
    """Files of a (path, label) list named x.cls, with no extension, an extension too long for a
    tar member's name, or one that is not UTF-8, are packed under their content's names."""
    names = [("x.cls", "PNG", "png"), ("noext", "JPEG", "jpg"), ("x.json", "BMP", "bmp"),
             ("x." + "e" * 120, "JPEG", "jpg"), (os.fsdecode(b"x.\xff"), "TIFF", "tif"), (".hidden", "PNG", "png")]
    pairs = []
    for i, (name, fmt, _) in enumerate(names):
        _image(tmp_path / name, fmt, i % 2, i)
        pairs.append((str(tmp_path / name), i % 2))
    index = write_shards(pairs, tmp_path / "out" / "s-%03d.tar", shuffle=False, workers=1)
    assert [m[1][0][0] for m in read_index(index)["shards"][0]["members"]] == [ext for _, _, ext in names]
    images, labels = _loaded(pairs, "pil")
    got = _loaded(str(tmp_path / "out" / "s-000.tar"), "wds")
    assert labels.tolist() == [i % 2 for i in range(len(names))]
    assert _same(got[0], images) and _same(got[1], labels)


def _bad_file(case, tmp_path, monkeypatch):
    """A file `fastdata shard` cannot pack, as `case` makes it; its path."""
    if case == "dangling link":
        os.symlink(tmp_path / "nowhere.jpg", tmp_path / "dead.jpg")
        return str(tmp_path / "dead.jpg")
    if case == "sparse 9 GiB":  # more than a USTAR member holds; no block of it is written
        with open(tmp_path / "huge.jpg", "wb") as f:
            f.truncate(9 << 30)
        return str(tmp_path / "huge.jpg")
    if case == "NUL in its path":
        return str(tmp_path / "a\0b.jpg")
    grows = tmp_path / "grows.jpg"  # a file that grows between the shards' plan and its read
    _image(grows, "JPEG", 0, 0)
    from fastdata import _tarwriter

    read = _tarwriter.read_files

    def read_grown(paths, *args):
        if paths == [str(grows)]:
            with open(grows, "ab") as f:
                f.write(bytes(16))
        return read(paths, *args)

    monkeypatch.setattr(_tarwriter, "read_files", read_grown)
    return str(grows)


@pytest.mark.parametrize("case", ["dangling link", "sparse 9 GiB", "growing", "NUL in its path"])
def test_each_file_that_cannot_be_packed_is_named_or_left_out(folder, tmp_path, monkeypatch, case):
    """A file that cannot be had or packed goes the one on_error way: "raise" stops the run
    with one line naming it and the way past it (nothing written); "skip" leaves it out with a
    warning naming it, counted, and the loader delivers every other sample with its label."""
    from fastdata.errors import one_line

    bad = _bad_file(case, tmp_path, monkeypatch)
    pairs = _pairs(folder)[::4]  # of every class
    pairs.insert(3, (bad, 1))
    with pytest.raises(DataError) as raised:
        write_shards(pairs, tmp_path / "raise" / "x-%02d.tar", max_count=4, workers=1)
    message = str(raised.value)
    assert "\n" not in message and message.startswith(f"cannot pack {one_line(bad)}: "), message
    assert message.endswith('pass on_error="skip"'), message
    assert not [f for f in _left(tmp_path / "raise") if f.endswith((".json", ".tmp"))]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        index = write_shards(pairs, tmp_path / "skip" / "x-%02d.tar", max_count=4, workers=1, shuffle=False,
                             on_error="skip")
    assert [str(w.message).partition(": ")[0] for w in caught] == [f"skipped {one_line(bad)}"]
    assert read_index(index)["total"] == len(pairs) - 1
    images, labels = _loaded(str(tmp_path / "skip" / "x-{00..01}.tar"), "wds")
    want = [_ids(open(path, "rb").read()) for path, _ in pairs if path != bad]
    px = images[:, :, 4, 4].tolist()
    assert [(round((r - 20) / 40), round((g - 10) / 12)) for r, g, _ in px] == want
    assert labels.tolist() == [c for c, _ in want]


def test_a_class_folder_name_that_is_not_utf8_is_refused(tmp_path):
    """The index (JSON) cannot hold a class name of bytes that are not UTF-8: refused in one
    line naming it, before anything is written."""
    root = tmp_path / "src"
    for name in (b"a", b"b\n\xff"):
        os.makedirs(os.path.join(bytes(root), name))
        _image(os.path.join(bytes(root), name, b"0.jpg").decode("utf-8", "surrogateescape"), "JPEG", 0, 0)
    for on_error in ("raise", "skip"):
        with pytest.raises(ValueError, match=r"^the class folder named b'b\\n\\xff' .* rename it$") as raised:
            write_shards(root, tmp_path / "out" / "x-%02d.tar", on_error=on_error)
        assert "\n" not in str(raised.value)
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------- CLI

def _cli():
    exe = shutil.which("fastdata-shard")
    return [exe] if exe else [sys.executable, "-m", "fastdata.shard"]


def _run(*args):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(_cli() + [str(a) for a in args], capture_output=True, text=True, env=env, timeout=120)


def test_cli_help():
    r = _run("--help")
    assert r.returncode == 0 and "OUT_PATTERN" in r.stdout and "samples_index" in r.stdout


def test_cli_writes_what_write_shards_writes(folder, tmp_path):
    r = _run(folder, tmp_path / "cli" / "train-%06d.tar", "--max-count", "5", "--max-size", "1M", "--workers", "2")
    assert r.returncode == 0, r.stderr
    index = tmp_path / "cli" / "train-index.json"
    shards = read_index(index)["shards"]
    nbytes = sum(s["bytes"] for s in shards)
    assert f"{len(shards)} shards, {N} samples, {nbytes} bytes" in r.stdout and str(index) in r.stdout
    assert f"{N}/{N} samples" in r.stderr and "MiB/s" in r.stderr and "Traceback" not in r.stderr
    write_shards(folder, tmp_path / "api" / "train-%06d.tar", max_count=5, max_size=1 << 20)
    assert _listing(tmp_path / "cli") == _listing(tmp_path / "api")


def test_cli_missing_source_exits_1():
    r = _run("/nonexistent/folder", "/tmp/x-%06d.tar")
    assert r.returncode == 1 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and "nonexistent" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("case", ["pattern", "unwritable", "size", "count", "missing-argument", "file-source"])
def test_cli_bad_input_is_one_line(folder, tmp_path, capsys, case):
    (tmp_path / "file").write_text("")
    out = str(tmp_path / "o-%d.tar")
    argv = {
        "pattern": [str(folder), str(tmp_path / "o.tar")],
        "unwritable": [str(folder), str(tmp_path / "file" / "o-%d.tar")],
        "size": [str(folder), out, "--max-size", "12X"],
        "count": [str(folder), out, "--max-count", "0"],
        "missing-argument": [str(folder)],
        "file-source": [str(tmp_path / "file"), out],
    }[case]
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's own checks
        rc = e.code
    captured = capsys.readouterr()
    # 2: the command line alone is wrong; 1: what it names cannot be read or written
    assert rc == (1 if case in ("unwritable", "file-source") else 2) and captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fastdata-shard: error: ")
    assert not list(tmp_path.glob("o*"))


def test_cli_sizes(folder, tmp_path, capsys):
    assert main([str(folder), str(tmp_path / "a-%d.tar"), "--max-size", "3K", "-q"]) == 0
    assert capsys.readouterr().err == ""
    shards = read_index(tmp_path / "a-index.json")["shards"]
    assert all(s["bytes"] <= 3072 or s["samples"] == 1 for s in shards) and len(shards) > 5
