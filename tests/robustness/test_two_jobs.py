"""Two jobs on one machine: two training processes read the same folder and the same shards at
the same time, with 2 workers each, while a third process keeps rewriting the tune cache they
both read (`num_workers="auto"`). Neither disturbs the other: every sample arrives once an
epoch with the label its pixels name, no error, the cache is always whole when read, and no
job maps a shared-memory segment that another job's process made.

Shared memory here is torch's: a worker collates a batch (or a ring slot) into a segment named
/dev/shm/torch_<pid of its creator>_<random>_<count>, created with O_EXCL and unlinked at once
(the file_descriptor strategy); fastdata names none of its own (its rings are such segments).
So a clash would show as a segment in one job whose name carries a process id of the other.
Each job records the segments its processes map at each epoch's last batch (from
/proc/<pid>/maps, as benchmarks/soak.py reads them), with its process ids; the two jobs' sets
must not meet either (that covers DataLoader's queue locks, POSIX semaphores in /dev/shm too).

The tuned value must be observable: each job runs on one core of its own (sched_setaffinity;
workers inherit it), where `num_workers="auto"` alone gives 0 (without persistent workers it
decodes in the training process), while the cache, keyed by the same source, transform, batch
size and machine (one usable core) as the writer's, says 2. A torn cache file would read as no
cache, hence 0 workers.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from _images import color_folder

from fastdata.shard import write_shards

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
CLASSES, PER_CLASS = 4, 16
ALL = sorted((c, i) for c in range(CLASSES) for i in range(PER_CLASS))
ROUNDS = 6  # epochs a job reads, alternately the folder and the shards

# The loader both jobs make, and the cache entry the writer keeps for it.
_SETUP = """
import json, os, sys
os.environ["OMP_NUM_THREADS"] = "1"
os.sched_setaffinity(0, {{{CPU}}})  # before anything asks how many cores there are
import torch
torch.set_num_threads(1)
from fastdata import transforms as T
SIZE, BATCH = 16, 8
SPEC = T.Compose([T.RandomResizedCrop(SIZE), T.RandomHorizontalFlip()])
FOLDER, PATTERN = {folder!r}, {pattern!r}
"""

_JOB = """
import fastdata
sys.path.insert(0, {benchmarks!r})
from soak import descendants, shm_segments

me, pids, names = os.getpid(), set(), set()
for r in range({rounds}):
    source = FOLDER if r % 2 == 0 else PATTERN
    loader = fastdata.loader(source, batch_size=BATCH, shuffle=True, seed=r, num_workers="auto", transform=SPEC,
                             device="cpu")
    seen = []
    for k, (images, labels) in enumerate(loader):
        px = images[:, :, SIZE // 2, SIZE // 2].long()  # flat colours: red names the class, green the image
        c = ((px[:, 0] - 20).float() / 40).round().long()
        i = ((px[:, 1] - 10).float() / 12).round().long()
        if not torch.equal(c, labels):
            sys.exit(f"round {{r}}: labels {{labels.tolist()}} but pixels of classes {{c.tolist()}}")
        seen += zip(c.tolist(), i.tolist())
        if k == len(loader) - 1:
            tree = [me, *descendants(me)]
            pids.update(tree)
            names.update(name for name, _ in shm_segments(tree).values())
    print(json.dumps({{"round": r, "workers": loader.num_workers, "samples": sorted(seen)}}), flush=True)
    del loader
print(json.dumps({{"done": True, "pids": sorted(pids), "names": sorted(names)}}), flush=True)
"""

_WRITER = """
import time
from fastdata.tunecache import store_tune
pad = list(range(20000))  # about 120 KB: a file written in several pieces, as a real tune's can be
n = 0
while not os.path.exists({stop!r}):
    for source in (FOLDER, PATTERN):
        path = store_tune(source, SPEC, BATCH, {{"loader": {{"num_workers": 2, "prefetch_factor": 2 + n % 3}},
                                                "write": n, "pad": pad}})
        if n == 0:
            print(path, flush=True)
    n += 1
    time.sleep(0.002)
print(json.dumps({{"writes": n}}), flush=True)
"""


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = color_folder(tmp_path_factory.mktemp("imgs"), CLASSES, PER_CLASS, (20, 48), lambda i: f"{i:03d}.jpg")
    out = tmp_path_factory.mktemp("shards")
    write_shards(folder, out / "s-%06d.tar", max_count=16, workers=1)
    return str(folder), str(out / "s-{000000..000003}.tar")


def _script(path: Path, cpu: int, data: tuple[str, str], body: str) -> Path:
    folder, pattern = data
    path.write_text(textwrap.dedent(_SETUP.format(CPU=cpu, folder=folder, pattern=pattern)) + body)
    return path


@pytest.mark.slow
def test_two_jobs_share_data_and_tune_cache(data, tmp_path):
    cpus = sorted(os.sched_getaffinity(0))
    env = {**os.environ, "FASTDATA_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(sys.path)}
    stop = tmp_path / "stop"
    writer_py = _script(tmp_path / "writer.py", cpus[0], data, _WRITER.format(stop=str(stop)))
    job_py = [_script(tmp_path / f"job{j}.py", cpu, data, _JOB.format(benchmarks=str(BENCHMARKS), rounds=ROUNDS))
              for j, cpu in enumerate((cpus[0], cpus[-1]))]
    procs = []
    try:
        writer = subprocess.Popen([sys.executable, str(writer_py)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=env)
        procs.append(writer)
        caches = [writer.stdout.readline().strip() for _ in range(2)]  # after the first writes
        if not all(caches):
            writer.wait(30)
            pytest.fail(f"the cache writer failed: {writer.stderr.read().strip()[-3000:]}")
        caches = [Path(p) for p in caches]
        jobs = [subprocess.Popen([sys.executable, str(p)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env=env) for p in job_py]
        procs += jobs
        # Meanwhile this process reads the cache files as fast as it can: each read must be whole.
        reads, torn = 0, []
        deadline = time.monotonic() + 100
        while any(j.poll() is None for j in jobs) and time.monotonic() < deadline:
            for path in caches:
                text = path.read_text()
                try:
                    json.loads(text)["loader"]["num_workers"]
                except (ValueError, KeyError, TypeError) as e:
                    torn.append(f"{len(text)} bytes: {e}")
                reads += 1
            time.sleep(0.001)
        outs = [j.communicate(timeout=max(1.0, deadline - time.monotonic())) for j in jobs]
        stop.touch()
        writer_out, writer_err = writer.communicate(timeout=30)
    finally:
        for p in procs:  # only on failure: a process still running here is stuck
            if p.poll() is None:
                p.kill()
                p.wait()

    assert writer.returncode == 0, writer_err[-3000:]
    writes = json.loads(writer_out.splitlines()[-1])["writes"]
    assert not torn, f"{len(torn)} of {reads} reads of the cache were torn: {torn[:3]}"
    assert reads > 50 and writes > 10, (reads, writes)  # the reads and writes did overlap

    records = []
    for j, (job, (out, err)) in enumerate(zip(jobs, outs)):
        assert job.returncode == 0, f"job {j}: {err.strip()[-3000:]}"
        lines = [json.loads(line) for line in out.splitlines()]
        assert [r["round"] for r in lines[:-1]] == list(range(ROUNDS)), out[-2000:]
        for r in lines[:-1]:
            assert r["workers"] == 2, f"job {j}, round {r['round']}: {r['workers']} workers, not the cache's 2"
            assert [tuple(s) for s in r["samples"]] == ALL, f"job {j}, round {r['round']}: not every sample once"
        records.append(lines[-1])

    for j, rec in enumerate(records):
        torch_names = [n for n in rec["names"] if n.startswith("torch_")]
        assert torch_names, f"job {j} mapped no torch segment: the check below would be empty"
        pids = set(rec["pids"])
        foreign = [n for n in torch_names if not ((m := re.match(r"torch_(\d+)_", n)) and int(m.group(1)) in pids)]
        assert not foreign, f"job {j} maps segments that none of its processes made: {foreign[:5]}"
        # The rest are DataLoader's queue locks: POSIX semaphores, which glibc's sem_open makes
        # under a fresh random name (sem.XXXXXX, created exclusively) before linking them to
        # multiprocessing's own random one.
        others = [n for n in rec["names"] if not n.startswith(("torch_", "sem."))]
        assert not others, f"job {j} maps shared memory that is neither torch's nor a lock's: {others[:5]}"
    both = set(records[0]["names"]) & set(records[1]["names"])
    assert not both, f"both jobs map {sorted(both)[:5]}"
    assert not set(records[0]["pids"]) & set(records[1]["pids"])
