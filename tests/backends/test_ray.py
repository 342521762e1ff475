"""The `ray` backend on a real Ray: a local one with 2 CPUs, then a cluster of three raylets on
loopback (`ray.cluster_utils.Cluster`). Every image is one flat color that names its sample
(see _images.py), and every batch is compared with the `pil` (files) or `wds` (shards)
backend's with the same seed: pixels, labels and order, whatever actor or node decoded it."""

from __future__ import annotations

import gc
import logging
import os
import re
import signal
import time
from pathlib import Path

import pytest
import torch
from _images import color_folder

ray = pytest.importorskip("ray")

import fastdata  # noqa: E402
from fastdata import DataError  # noqa: E402
from fastdata import transforms as T  # noqa: E402
from fastdata._workers import start_method  # noqa: E402
from fastdata.image.ray import disconnect  # noqa: E402
from fastdata.profiling.advice import scale_out  # noqa: E402
from fastdata.profiling.model import RateModel  # noqa: E402
from fastdata.shard import write_shards  # noqa: E402

CLASSES, PER_CLASS = 4, 15
SIZE = 16
STORE = 100 << 20
QUIET = {"log_to_driver": False, "logging_level": logging.WARNING}


def _transform():
    return T.Compose([T.RandomResizedCrop(SIZE, scale=(0.5, 1.0)), T.RandomHorizontalFlip()])


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return color_folder(tmp_path_factory.mktemp("imgs"), CLASSES, PER_CLASS, (20, 48), lambda i: f"{i:03d}.jpg")


@pytest.fixture(scope="module")
def shards(folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("shards")
    write_shards(str(folder), out / "train-%06d.tar", max_count=13, workers=1)
    return str(out / "train-{000000..000004}.tar")


class _Rays:
    """The Ray this module runs on: one at a time, started once, switched between kinds once."""

    def __init__(self) -> None:
        self.kind, self.cluster = None, None

    def use(self, kind: str):
        if self.kind == kind:
            return self.cluster
        self.stop()
        if kind == "local":
            ray.init(num_cpus=2, object_store_memory=STORE, include_dashboard=False, **QUIET)
        else:
            from ray.cluster_utils import Cluster

            self.cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": STORE,
                                                                         "include_dashboard": False})
            for _ in range(2):
                self.cluster.add_node(num_cpus=1, object_store_memory=STORE)
            ray.init(address=self.cluster.address, **QUIET)
            self.cluster.wait_for_nodes()
        self.kind = kind
        return self.cluster

    def stop(self) -> None:
        disconnect()  # the modules after this one fork their workers again
        if self.cluster is not None:
            self.cluster.shutdown()
        self.kind, self.cluster = None, None


@pytest.fixture(scope="module")
def rays():
    r = _Rays()
    yield r
    r.stop()


@pytest.fixture
def local(rays):
    rays.use("local")


@pytest.fixture
def cluster(rays):
    return rays.use("cluster")


def _batches(loader):
    """The batches of one pass, copied out, each checked: its pixels name samples of its labels."""
    out = []
    for images, labels in loader:
        assert images.dtype == torch.uint8 and images.shape[1:] == (3, SIZE, SIZE)
        red = images[:, 0, SIZE // 2, SIZE // 2].to(torch.int64)
        assert torch.equal(torch.round((red - 20) / 40).long(), labels)
        out.append((images.clone(), labels.clone()))
    return out


def _same(a, b):
    assert len(a) == len(b)
    for k, ((x, y), (u, v)) in enumerate(zip(a, b)):
        assert torch.equal(y, v), f"batch {k}: labels differ"
        assert torch.equal(x, u), f"batch {k}: pixels differ"


def _load(source, backend, **kw):
    kw.setdefault("transform", _transform())
    kw.setdefault("shuffle", True)
    kw.setdefault("batch_size", 4)
    return fastdata.loader(source, backend=backend, device="cpu", seed=7, **kw)


# ------------------------------------------------------------------ a local Ray with 2 CPUs


@pytest.mark.timeout(180)
def test_files_same_batches_as_pil(folder, local):
    loader = _load(str(folder), "ray", num_workers=2)
    assert loader.backend == "ray" and loader.num_workers == 2 and len(loader) == 15
    pil = _load(str(folder), "pil")
    try:
        for _ in range(2):  # the second epoch runs ahead on the same actors
            _same(_batches(loader), _batches(pil))
    finally:
        loader.shutdown()


@pytest.mark.timeout(120)
def test_a_pass_a_newer_iter_ended_says_so_when_asked_for_more(folder, local):
    """The actors serve one pass: the older iterator, asked for more, raises at once (where
    other backends give the rest of its epoch); a pass left alone costs nothing."""
    loader = _load(str(folder), "ray", num_workers=2)
    try:
        older = iter(loader)
        next(older)
        assert len(_batches(loader)) == len(loader)
        with pytest.raises(RuntimeError, match="make a second loader to read two passes side by side"):
            next(older)
    finally:
        loader.shutdown()


def test_num_workers_default_is_the_clusters_cpus(folder, local):
    loader = _load(str(folder), "ray")
    assert loader.num_workers == 2


@pytest.mark.timeout(180)
def test_shards_same_batches_as_wds(shards, local):
    loader = _load(shards, "ray", num_workers=2)
    try:
        _same(_batches(loader), _batches(_load(shards, "wds", num_workers=2)))
    finally:
        loader.shutdown()


@pytest.mark.timeout(180)
def test_killed_actor_mid_epoch_gives_the_same_batches(folder, local):
    loader = _load(str(folder), "ray", num_workers=2, prefetch_factor=4)
    expected = _batches(_load(str(folder), "pil"))
    got = []
    try:
        it = iter(loader)
        images, labels = next(it)
        got.append((images.clone(), labels.clone()))
        runner = loader._runner
        ray.kill(runner.pool().actors[1], no_restart=True)  # batches 1, 3, 5, ... are queued on it
        got += [(x.clone(), y.clone()) for x, y in it]
        _same(got, expected)
        assert runner.lost >= 1
    finally:
        loader.shutdown()


@pytest.mark.timeout(120)
def test_actors_end_with_the_loader(folder, local):
    loader = _load(str(folder), "ray", num_workers=2)
    it = iter(loader)
    next(it)
    actors = list(loader._runner.pool().actors)
    gc.disable()  # by reference counting, not left to the collector
    try:
        del it, loader
        # ray.kill is asynchronous: a call right after it may still be served
        deadline = time.monotonic() + 30
        for actor in actors:
            while True:
                try:
                    ray.get(actor.where.remote(), timeout=10)
                except ray.exceptions.RayActorError:
                    break
                assert time.monotonic() < deadline, "an actor outlived its loader by 30 s"
                time.sleep(0.2)
    finally:
        gc.enable()


@pytest.mark.timeout(180)
def test_bad_file_names_it_or_is_skipped(folder, local, tmp_path):
    pairs = [(str(folder / f"class{c}" / f"{i:03d}.jpg"), c) for c in range(CLASSES) for i in range(3)]
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(open(pairs[5][0], "rb").read()[:200])  # cut short
    pairs[5] = (str(bad), pairs[5][1])
    loader = _load(pairs, "ray", num_workers=1, shuffle=False)
    with pytest.raises(DataError, match="bad.jpg") as e:
        _batches(loader)
    assert e.value.path == str(bad)
    loader = _load(pairs, "ray", num_workers=1, shuffle=False, on_error="skip")
    try:
        got = _batches(loader)
        assert sum(len(y) for _, y in got) == len(pairs) - 1
        assert loader.stats["skipped"] == 1 and loader.stats["errors"][0]["path"] == str(bad)
    finally:
        loader.shutdown()


@pytest.mark.timeout(120)
def test_no_progress_ends_the_pass_naming_the_actor(folder, local):
    # The actor stops (SIGSTOP) after batch 0: batch 1, submitted only once batch 0 is taken
    # (prefetch_factor=1, one actor), never comes.
    pairs = [(str(folder / "class0" / "000.jpg"), 0), (str(folder / "class0" / "001.jpg"), 0)]
    loader = fastdata.loader(pairs, 1, backend="ray", num_workers=1, timeout=3, device="cpu", prefetch_factor=1,
                             transform=_transform())
    it = iter(loader)
    next(it)
    actor = loader._runner._pool.actors[0]
    pid = ray.get(actor.__ray_call__.remote(lambda self: os.getpid()))
    os.kill(pid, signal.SIGSTOP)
    try:
        with pytest.raises(RuntimeError, match=r"no progress for 3 seconds.*batch 1 of epoch 0 waits on Ray actor 0"):
            next(it)
        assert loader._runner._pool is None  # the actors were killed
    finally:
        try:
            os.kill(pid, signal.SIGCONT)  # a kill Ray sent it takes effect
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 30
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_stage_times_come_back_from_the_actors(folder, local):
    loader = _load(str(folder), "ray", num_workers=2)
    try:
        assert loader.set_stage_timing(True)
        _batches(loader)
        stages = loader.stage_seconds()
        assert stages["images"] == CLASSES * PER_CLASS
        assert stages["decode"] > 0 and stages["read"] > 0 and "transfer" in stages
        assert {"worker 0", "worker 1"} <= set(stages)
    finally:
        loader.shutdown()


@pytest.mark.timeout(180)
def test_profile_says_how_many_nodes_close_the_gap(folder, local):
    loader = _load(str(folder), "ray", num_workers=2)
    try:
        report = fastdata.profile(loader, step_ms=0.01, steps=20, warmup=2)  # a step far faster than 2 CPUs decode
    finally:
        loader.shutdown()
    assert report.stages["decode"] > 0
    text = " ".join(a.text for a in report.advice)
    # nodes counted, or none where the training process's own stages bound it below the step
    assert re.search(r"this step consumes [\d,]+ images/s; the cluster's 2 Ray CPUs give [\d,]+(; \d+ more \d+-core "
                     r"nodes? (close|bring)|, but one training process takes at most about [\d,]+ images/s)", text), text


def test_scale_out_arithmetic():
    model = RateModel(work=1e-3, cpu=1e-3, main=0.0, step=0.0, cores=1)  # 1 ms of CPU an image
    advice = scale_out(2500, model, 1, None)  # 1 core gives 1,000 images/s, a node 1,000 more
    assert advice.text.startswith("this step consumes 2,500 images/s; this machine's CPUs give 1,000; "
                                  "2 more 1-core nodes close the gap")
    assert "Ray CPUs give 2,000; 1 more 1-core node closes" in scale_out(2500, model, 1, 2).text
    assert scale_out(1050, model, 1, None) is None  # within 10% of what the cores give
    # One training process pulls about 3,000 images/s from Ray: nodes count up to that, no further
    assert "2 more 1-core nodes bring it to about 3,000, not to the step's rate" in scale_out(9000, model, 1, None).text
    four = RateModel(work=1e-3, cpu=1e-3, main=0.0, step=0.0, cores=4)
    assert "one training process takes at most about 3,000 images/s here" in scale_out(9000, four, 4, None).text
    # its own stages in series with the step bound it too: 0.5 ms an image, at most 2,000
    busy = RateModel(work=1e-3, cpu=1e-3, main=5e-4, step=0.0, cores=1)
    assert "1 more 1-core node brings it to about 2,000" in scale_out(2500, busy, 1, None).text


@pytest.mark.timeout(120)
def test_pil_workers_start_safely_while_ray_is_live(folder, local):
    _load(str(folder), "ray", num_workers=1)  # connects to the Ray this process runs
    # forkserver: a fork would copy Ray's threads' state, not its threads
    assert start_method(None).get_start_method() == "forkserver"
    loader = _load(str(folder), "pil", num_workers=2)
    _same(_batches(loader), _batches(_load(str(folder), "pil")))


def _spilled() -> int:
    """Bytes in this Ray session's spill folders, where Ray writes objects its store cannot hold."""
    session = ray._private.worker._global_node.get_session_dir_path()  # no public name for it
    return sum(f.stat().st_size for f in Path(session).glob("ray_spilled_objects*/**/*") if f.is_file())


@pytest.mark.timeout(240)
def test_the_window_holds_no_more_than_the_object_store(folder, local, monkeypatch, caplog):
    """Batches of 12 MiB, 16 asked ahead (prefetch_factor 8 x 2 actors), a 100 MiB store and a
    step slower than the actors: the window is capped at the 6 that fit beside two in use, with
    a line saying so, and nothing spills to disk; with the cap lifted, the same pass spills.
    Training processes on one node (LOCAL_WORLD_SIZE) each count on their share of the store."""
    side = 1024

    def run() -> int:
        loader = _load(str(folder), "ray", num_workers=2, prefetch_factor=8, shuffle=False,
                       transform=T.Compose([T.Resize((side, side))]))
        spilled, seen = 0, []
        try:
            for images, labels in loader:
                assert images.shape[1:] == (3, side, side)
                red = images[:, 0, side // 2, side // 2].to(torch.int64)
                assert torch.equal(torch.round((red - 20) / 40).long(), labels)
                seen += labels.tolist()
                time.sleep(0.2)  # the step: the actors run ahead until the window is full
                spilled = max(spilled, _spilled())
        finally:
            loader.shutdown()
        assert sorted(seen) == sorted(label for label in range(CLASSES) for _ in range(PER_CLASS))
        return spilled

    with caplog.at_level(logging.INFO, logger="fastdata"):
        assert run() == 0
    said = [r.getMessage() for r in caplog.records if "object store" in r.getMessage()]
    assert len(said) == 1 and "(100 MiB) holds 6 batches of 12.0 MiB" in said[0] and "= 16" in said[0], said
    assert "actors decode at once" not in said[0]  # 6 ahead keep both actors busy
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # 4 training processes pulling into this node's store
    assert fastdata.image.ray.node_store_bytes() == STORE // 4
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    monkeypatch.setattr(fastdata.image.ray, "node_store_bytes", lambda: 1 << 40)
    assert run() > 0


# ------------------------------------------------------------------ three raylets on loopback


@pytest.mark.timeout(240)
def test_ranks_get_pils_shares_across_nodes(folder, cluster):
    assert len([n for n in ray.nodes() if n["Alive"]]) == 3
    for rank in range(2):
        loader = _load(str(folder), "ray", num_workers=3, rank=rank, world_size=2)
        try:
            _same(_batches(loader), _batches(_load(str(folder), "pil", rank=rank, world_size=2)))
        finally:
            loader.shutdown()


@pytest.mark.timeout(240)
def test_resume_mid_epoch_gives_the_rest_exactly(folder, cluster):
    whole = _batches(_load(str(folder), "pil"))
    loader = _load(str(folder), "ray", num_workers=3)
    try:
        it = iter(loader)
        first = [(x.clone(), y.clone()) for x, y in (next(it) for _ in range(5))]
        state = loader.state_dict()  # while the pass is live: mid-epoch
    finally:
        loader.shutdown()
    assert state["backend"] == "ray" and state["batches"] == 5
    resumed = _load(str(folder), "ray", num_workers=3)
    try:
        resumed.load_state_dict(state)
        _same(first + _batches(resumed), whole)
    finally:
        resumed.shutdown()


@pytest.mark.timeout(120)
def test_connects_to_the_cluster_ray_address_names(folder, cluster, monkeypatch):
    ray.shutdown()  # this process is off the cluster, which runs on
    monkeypatch.setenv("RAY_ADDRESS", cluster.address)
    loader = _load(str(folder), "ray")
    assert ray.is_initialized() and len([n for n in ray.nodes() if n["Alive"]]) == 3
    assert loader.num_workers == 3  # one actor per CPU of the cluster


@pytest.mark.timeout(240)
def test_killed_node_mid_epoch_gives_the_same_batches(folder, cluster):
    # batches of 2, one ahead per actor: most of the victim's batches are submitted after its node is gone
    expected = _batches(_load(str(folder), "pil", batch_size=2))
    loader = _load(str(folder), "ray", batch_size=2, num_workers=3, prefetch_factor=1)
    try:
        runner = loader._runner
        pool = runner.pool()
        head = ray.get_runtime_context().get_node_id()[:8]
        victim = next(i for i, node in enumerate(pool.nodes) if head not in node)
        node_id = pool.nodes[victim].split("(")[1][:8]
        node = next(n for n in cluster.worker_nodes if n.node_id.startswith(node_id))
        it = iter(loader)
        images, labels = next(it)
        got = [(images.clone(), labels.clone())]
        cluster.remove_node(node, allow_graceful=False)
        # Its actor's process may serve a while after its raylet is gone: go on once the cluster
        # has marked the node dead (and the actor with it).
        deadline = time.monotonic() + 60
        while any(n["NodeID"] == node.node_id and n["Alive"] for n in ray.nodes()) and time.monotonic() < deadline:
            time.sleep(0.2)
        got += [(x.clone(), y.clone()) for x, y in it]
        _same(got, expected)
        assert runner.lost >= 1
    finally:
        loader.shutdown()


def test_backend_ray_is_never_auto_and_names_its_extra(folder, monkeypatch):
    assert fastdata.loader(str(folder), 4, device="cpu").backend == "pil"
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    with pytest.raises(RuntimeError, match=r"pip install '\.\[ray\]' in fastdata's checkout"):
        fastdata.loader(str(folder), 4, backend="ray")

