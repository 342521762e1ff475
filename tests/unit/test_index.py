"""The checkpoint index (csrc/index.h): one memory-mapped file a machine, shared by every
process that decodes and by every later run; a file changed in any way, forged or torn never
uses another's checkpoints; two jobs writing it at once both get a whole index; a file it cannot
trust is left alone. Each job here is a process of its own, as a user's jobs are: the index is
opened once a process (`_codec.open_index`).
"""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import fastdata
from fastdata import _codec
from fastdata import transforms as T

pytestmark = pytest.mark.skipif(not _codec.AVAILABLE, reason="native JPEG decoder not built")

# A job: opens the index at argv[1] (with the test's small sizes when argv[3] says so), decodes
# the files listed in argv[2] (a JSON list of paths) with each file's crops, and prints its
# findings: the index's stats before and after, and, per file, whether the decode matches
# libjpeg's own (index=False) pixel for pixel.
JOB = r"""
import json, sys
import numpy as np, torch
from fastdata import _codec
from fastdata._ext import native
path, listing, small = sys.argv[1], sys.argv[2], sys.argv[3] == "small"
why = native.open_index(path, 64, 1 << 16, 64) if small else _codec.open_index(path)
before = _codec.index_stats()
files = json.loads(open(listing).read())
datas = [open(f, "rb").read() for f in files]
rng = np.random.default_rng(int(sys.argv[4]) if len(sys.argv) > 4 else 0)
same = []
for _ in range(int(sys.argv[5]) if len(sys.argv) > 5 else 2):
    crops = np.array([[int(rng.integers(0, 60)), int(rng.integers(0, 60)), 100, 80] for _ in datas], np.int32)
    flips = np.zeros(len(datas), np.uint8)
    want = torch.zeros(len(datas), 3, 40, 50, dtype=torch.uint8)
    got = torch.zeros_like(want)
    assert _codec.decode_crop_resize(datas, crops, flips, want, 1, index=False) == [None] * len(datas)
    assert _codec.decode_crop_resize(datas, crops, flips, got, 2, whole=np.zeros(len(datas), np.uint8)) == [None] * len(datas)
    same.append([bool(torch.equal(a, b)) for a, b in zip(got, want)])
print(json.dumps({"why": why or None, "before": before, "after": _codec.index_stats(), "same": same}))
"""


def photo(w: int, h: int, seed: int, quality: int = 85) -> bytes:
    """A JPEG with detail everywhere (noise over gradients), so every MCU has coefficients."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 // w, y * 255 // h, (x + y) * 127 // (w + h)], -1)
    pixels = np.clip(base + rng.integers(-40, 40, (h, w, 3)), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def write_files(root: Path, seeds, size=(230, 170)) -> list[str]:
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for s in seeds:
        p = root / f"{s}.jpg"
        p.write_bytes(photo(*size, seed=s))
        paths.append(str(p))
    return paths


def job(index: Path, paths: list[str], tmp_path: Path, *, small: bool = False, seed: int = 0, rounds: int = 2,
        wait: bool = True):
    listing = tmp_path / f"list-{seed}-{len(paths)}.json"
    listing.write_text(json.dumps(paths))
    cmd = [sys.executable, "-c", JOB, str(index), str(listing), "small" if small else "full", str(seed), str(rounds)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return p if not wait else finish(p)


def finish(p: subprocess.Popen) -> dict:
    out, err = p.communicate(timeout=100)
    assert p.returncode == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert all(all(r) for r in result["same"]), result["same"]  # libjpeg's pixels, every round
    return result


def test_a_later_job_finds_the_first_jobs_checkpoints(tmp_path):
    """The first job indexes each file once (its first decode reads the file whole, whatever
    `whole` says); a second job opening the same file finds them all, adds nothing, and
    decodes from them with libjpeg's pixels. The file is the owner's alone (0600, in a 0700
    directory)."""
    index = tmp_path / "cache" / "jpeg-index" / "host-v1.idx"
    paths = write_files(tmp_path / "files", range(12))
    first = job(index, paths, tmp_path)
    assert first["why"] is None and first["before"]["files"] == 0 and first["after"]["files"] == 12
    assert first["after"]["path"] == str(index)
    second = job(index, paths, tmp_path, seed=1)
    assert second["before"]["files"] == second["after"]["files"] == 12
    assert stat.S_IMODE(index.stat().st_mode) == 0o600
    assert stat.S_IMODE(index.parent.stat().st_mode) == 0o700
    # At most 64 checkpoints of 8 bytes and a 48-byte record a file.
    assert first["after"]["used"] <= 12 * (48 + 64 * 8)


def test_a_changed_file_gets_its_own_record(tmp_path):
    """Content, not path: a file rewritten with other bytes of the same size is a new record,
    decoded whole once and then from its own checkpoints (libjpeg's pixels for the new bytes);
    the old record stays, used by no one."""
    index = tmp_path / "i.idx"
    paths = write_files(tmp_path / "files", range(4))
    old, new = Path(paths[0]).read_bytes(), photo(230, 170, seed=99)
    size = max(len(old), len(new)) + 16
    Path(paths[0]).write_bytes(old + bytes(size - len(old)))  # zeros after the end marker
    job(index, paths, tmp_path)
    Path(paths[0]).write_bytes(new + bytes(size - len(new)))
    assert job(index, paths, tmp_path, seed=2)["after"]["files"] == 5


def test_workers_share_one_index(tmp_path, monkeypatch):
    """A loader's two workers and the training process use the index at $FASTDATA_CACHE: after
    one pass every file is indexed once (not once a worker), and a new job finds them all."""
    monkeypatch.setenv("FASTDATA_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "folder"
    for c in range(2):
        write_files(root / f"c{c}", range(10 * c, 10 * c + 10))
    loader = fastdata.loader(str(root), backend="pil", batch_size=5, num_workers=2,
                             transform=T.Compose([T.RandomResizedCrop(64)]))
    labels = sorted(int(y) for _, ys in loader for y in ys)
    assert labels == [0] * 10 + [1] * 10
    index = Path(_codec.index_path())
    assert index.parent.parent == tmp_path / "cache"
    found = job(index, sorted(str(p) for p in root.rglob("*.jpg")), tmp_path)
    assert found["before"]["files"] == found["after"]["files"] == 20


def test_two_jobs_at_once(tmp_path):
    """Two jobs decoding overlapping files into one index at the same time: each file has one
    record, every record checks, and a third job decodes every file from them."""
    index = tmp_path / "i.idx"
    paths = write_files(tmp_path / "files", range(40))
    a = job(index, paths[:30], tmp_path, seed=3, rounds=3, wait=False)
    b = job(index, paths[10:], tmp_path, seed=4, rounds=3, wait=False)
    finish(a), finish(b)
    third = job(index, paths, tmp_path, seed=5)
    assert third["before"]["files"] == third["after"]["files"] == 40


def test_a_torn_or_tampered_record_is_not_used(tmp_path):
    """A record whose bytes changed after it was written (a crash mid-write on a power loss, or
    someone writing the file) fails its MAC: the decode goes on as for a file not indexed, with
    libjpeg's pixels."""
    index = tmp_path / "i.idx"
    paths = write_files(tmp_path / "files", range(3))
    job(index, paths, tmp_path, small=True)
    raw = bytearray(index.read_bytes())
    arena = 4096 + 64 * 16
    ncps = int.from_bytes(raw[arena + 32:arena + 36], "little")  # the same for the 3 files
    assert ncps > 10
    for k in range(3):  # the bit position of checkpoint 10 (a row every window crosses) of each
        raw[arena + k * (48 + 8 * ncps) + 48 + 8 * 10] ^= 0x10
    index.write_bytes(bytes(raw))
    os.chmod(index, 0o600)
    job(index, paths, tmp_path, small=True, seed=6)  # finish() checks libjpeg's pixels


def test_an_index_it_cannot_trust_is_left_alone(tmp_path):
    """A file others may write (mode 0644) is not used: the job says why and decodes with an
    index in its own memory; the file is left as it was."""
    index = tmp_path / "i.idx"
    paths = write_files(tmp_path / "files", range(3))
    job(index, paths, tmp_path)
    os.chmod(index, 0o644)
    before = index.read_bytes()[:8192]
    result = job(index, paths, tmp_path, seed=7)
    assert "not a regular file of this user's alone" in result["why"]
    assert result["after"]["path"] == "" and result["before"]["files"] == 0
    assert index.read_bytes()[:8192] == before


def test_a_full_or_foreign_index_is_replaced(tmp_path):
    """An index nearly full, or of another format, is replaced by a new file at the next open
    (a job that has the old one mapped keeps it); a full one takes no more files, and its
    decodes still give libjpeg's pixels."""
    index = tmp_path / "i.idx"
    paths = write_files(tmp_path / "files", range(200, 260))
    full = job(index, paths, tmp_path, small=True)
    # 64 slots: no decode starts to index a file past 3/4 of them (two threads may pass it at once)
    assert 48 <= full["after"]["files"] <= 49
    assert job(index, paths[:2], tmp_path, small=True)["before"]["files"] == 0
    index.write_bytes(b"not an index" * 100)
    os.chmod(index, 0o600)
    fresh = job(index, paths[:2], tmp_path, small=True)
    assert fresh["why"] is None and fresh["before"]["files"] == 0 and fresh["after"]["files"] == 2
