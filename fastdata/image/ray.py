"""Who decodes on a Ray cluster: Ray actors of one CPU each, anywhere in the cluster, each
holding the reader and decoder, run each batch's read-and-decode task (`BatchTask`) and return
it to Ray's object store; the training process takes the batches in order.

- Placement: the actors spread over the nodes (`SPREAD`); batch k goes to actor k mod n (with
  shards, actor w serves lane w, so it reads its shards in order), or to the next live one.
- Backpressure: at most `prefetch_factor` x actors batches are submitted or ready and not yet
  taken, so a slow consumer leaves the cluster idle instead of filling its object store.
- Faults: a task is a pure function of its batch's keys (the random parameters are a function
  of (seed, epoch, sample)), so the batches of an actor or node that died are submitted again
  to a live actor, with the same result, and a replacement starts. No batch within the stall
  limit ends the pass with an error naming the batch, the actor and its node.
- A batch crosses as plain arrays: the actor decodes into its own (unpinned) ring slot, Ray
  copies it into the object store, and the training process maps it from there without a copy
  (the tensor keeps the object alive, as a lease keeps a slot).
- Ray in this process: the running one (`ray.init` called, or `RAY_ADDRESS` set), else a local
  one. Its threads make `fork` unsafe here: DataLoader workers started after it use `forkserver`.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import logging
import os
import shutil
import time
import warnings
import weakref
from typing import Any, Callable, Iterator

import numpy as np
import ray
import torch
from ray import exceptions as rex

from .._buffers import ProcessRings
from .._cores import usable_cores
from .._workers import NoWatchdog, hold_threads, release_threads, stall_limit
from ..errors import DataError
from .cpu import BatchTask
from .parts import BatchOrder

logger = logging.getLogger("fastdata")

_STORE_BYTES = 1 << 30  # a local cluster's object store: the prefetch window, not a cache
_START_GRACE = 30.0  # s the actors after the first have to start before the first pass runs without them
_LOST = (rex.RayActorError, rex.ObjectLostError, rex.WorkerCrashedError, rex.NodeDiedError)


class _RayThreads:
    """Ray's threads in this process, for `hold_threads`: from `connect` until `disconnect`."""


_RAY_THREADS = _RayThreads()


def connect(workers: int) -> None:
    """Ray in this process: the cluster already connected, else the one `RAY_ADDRESS` names,
    else a local one with the usable cores (at least `workers` CPUs) and a small object store."""
    hold_threads(_RAY_THREADS)
    if ray.is_initialized():
        return
    quiet = {"log_to_driver": False, "logging_level": logging.WARNING}
    if os.environ.get("RAY_ADDRESS"):
        ray.init(**quiet)
        return
    shm = shutil.disk_usage("/dev/shm").free // 4 if os.path.isdir("/dev/shm") else _STORE_BYTES
    store = max(128 << 20, min(_STORE_BYTES, shm))  # Ray's store lives in /dev/shm: at most a quarter of it
    ray.init(num_cpus=max(usable_cores(), workers), object_store_memory=store, include_dashboard=False, **quiet)


def disconnect() -> None:
    """Shuts down Ray in this process (a cluster it joined goes on without it); DataLoader
    workers started after it fork again."""
    ray.shutdown()
    release_threads(_RAY_THREADS)


def cluster_cpus() -> int:
    """The CPUs of the connected cluster, all nodes."""
    return int(ray.cluster_resources().get("CPU", 1))


class BatchActor:
    """A Ray actor (one CPU): reads and decodes batches with its copy of the task."""

    def __init__(self, task: BatchTask, index: int) -> None:
        self.task, self.index = task, index

    def where(self) -> str:
        """Its node, as "address (node id)" (answered once it runs: the actor is live)."""
        return f"{ray.util.get_node_ip_address()} ({ray.get_runtime_context().get_node_id()[:8]})"

    def run(self, keys: list, timing: bool) -> Any:
        """(images NHWC uint8, labels, errors, sample ids, stage seconds or None) as numpy
        arrays; a DataError is returned, not raised, so it reaches the consumer as itself."""
        task = self.task
        task.timing = timing
        try:
            images, labels, errors, ids, stages = task.__getitems__(keys)
        except DataError as e:
            return e
        if stages is not None:
            stages["worker"] = self.index
        return images.numpy(), labels.numpy(), errors, ids, stages


_RemoteActor = ray.remote(num_cpus=1, max_restarts=0, max_task_retries=0)(BatchActor)


class _Pool:
    """The actors, which of them are live (answered `where`), and their replacements."""

    def __init__(self, task: BatchTask, n: int, limit: float) -> None:
        self.task_ref = ray.put(task)
        self.actors: list[Any] = [None] * n
        self.nodes: list[str | None] = [None] * n  # a live actor's node; None while it starts
        self.starting: dict[Any, int] = {}  # its `where` answer -> actor index
        self.replaced = 0
        for i in range(n):
            self._start(i)
        # Wait for one to start, then a while for the others; the pass runs on those that
        # started (the cluster may have fewer free CPUs than actors asked), the rest join later.
        ready, _ = ray.wait(list(self.starting), num_returns=1, timeout=limit)
        self._answered(ready)
        if self.starting:
            ready, _ = ray.wait(list(self.starting), num_returns=len(self.starting), timeout=_START_GRACE)
            self._answered(ready)
        if not self.live():
            self.shutdown()
            free = ray.available_resources().get("CPU", 0)
            raise RuntimeError(f"no Ray actor started within {limit:g} s ({n} asked, 1 CPU each; the cluster has "
                               f"{free:g} free CPUs of {cluster_cpus()}): add nodes or lower num_workers")

    def _start(self, i: int) -> None:
        actor = _RemoteActor.options(scheduling_strategy="SPREAD").remote(self.task_ref, i)
        self.actors[i], self.nodes[i] = actor, None
        self.starting[actor.where.remote()] = i

    def _answered(self, refs: list) -> None:
        for ref in refs:
            i = self.starting.pop(ref)
            try:
                self.nodes[i] = ray.get(ref)
            except _LOST:
                self.lost(i)

    def poll(self) -> None:
        """Replacements that started since become live."""
        if self.starting:
            ready, _ = ray.wait(list(self.starting), num_returns=len(self.starting), timeout=0)
            self._answered(ready)

    def live(self) -> list[int]:
        return [i for i, node in enumerate(self.nodes) if node is not None]

    def pick(self, k: int) -> int:
        """The actor for batch k: k mod n, or the next live one after it."""
        n = len(self.actors)
        for j in range(n):
            i = (k + j) % n
            if self.nodes[i] is not None:
                return i
        return k % n  # none live: it queues on one that is starting

    def lost(self, i: int) -> None:
        """Actor i died (or its node did): killed for sure, and a replacement started."""
        logger.warning("Ray actor %d (node %s) was lost; its batches run on the other actors", i, self.nodes[i])
        ray.kill(self.actors[i], no_restart=True)
        self.starting = {ref: j for ref, j in self.starting.items() if j != i}
        self.replaced += 1
        self._start(i)

    def shutdown(self) -> None:
        """Kills every actor now (not left to the collector)."""
        for actor in self.actors:
            if actor is not None and ray.is_initialized():  # at exit Ray may have shut down (and killed them) first
                ray.kill(actor, no_restart=True)
        self.actors = [None] * len(self.actors)
        self.nodes = [None] * len(self.nodes)
        self.starting = {}


@dataclasses.dataclass
class _Batch:  # batch k of `epoch`: its keys, and the task under way for it (its result, its actor)
    epoch: int
    k: int
    keys: list
    ref: Any = None
    actor: int = -1


class _Stream:
    """One pass: the batches from (epoch, skip) in order, through the end of the epoch or, run
    ahead, on into the next ones; at most `window` of them submitted and not yet taken."""

    def __init__(self, runner: "RayWorkers", pool: _Pool, epoch: int, skip: int) -> None:
        # Weakly: the runner holds its live stream, and a cycle would leave the actors' end
        # (the runner's finalizer) to the garbage collector.
        self._runner = weakref.ref(runner)
        self.pool = pool
        self.next = (epoch, skip)  # the batch the consumer takes next
        self.pending: collections.deque[_Batch] = collections.deque()
        self.todo = self._keys(epoch, skip)
        self.closed = False

    @property
    def runner(self) -> "RayWorkers":
        return self._runner()

    def _keys(self, epoch: int, skip: int) -> Iterator[_Batch]:
        order = self.runner.order
        while True:
            for k in range(skip, len(order)):
                yield _Batch(epoch, k, order.keys(epoch, k))
            if not self.runner.run_ahead:
                return
            epoch, skip = epoch + 1, 0

    def _submit(self, b: _Batch) -> None:
        pool = self.pool
        b.actor = pool.pick(b.k)
        b.ref = pool.actors[b.actor].run.remote(b.keys, self.runner.timing)

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        if self.closed:
            raise StopIteration
        window = self.runner.window
        while len(self.pending) < window:
            b = next(self.todo, None)
            if b is None:
                break
            self._submit(b)
            self.pending.append(b)
        if not self.pending:
            raise StopIteration
        if len(self.pending) > 1:
            # Starts pulling every batch that is ready on another node into this node's store,
            # in the background: the consumer then waits for one pull at most, not one a batch.
            refs = [b.ref for b in self.pending]
            ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=True)
        head = self.pending[0]
        out = self._take(head)
        self.pending.popleft()
        self.next = (head.epoch, head.k + 1) if head.k + 1 < len(self.runner.order) else (head.epoch + 1, 0)
        return out

    def _take(self, head: _Batch) -> Any:
        """The head batch, once ready; its actor's batches resubmitted if it was lost."""
        limit, pool = self.runner.limit, self.pool
        since = time.monotonic()
        while True:
            ready, _ = ray.wait([head.ref], timeout=min(1.0, limit))
            pool.poll()
            if ready:
                t = time.perf_counter()
                try:
                    out = ray.get(head.ref, timeout=limit)
                except rex.GetTimeoutError:
                    self.fail(head)
                except _LOST:
                    lost = head.actor
                    pool.lost(lost)
                    for b in self.pending:
                        if b.actor == lost:
                            self._submit(b)
                    continue
                except rex.RayTaskError as e:  # a bug in the task: its own exception, with the actor's traceback
                    raise e.as_instanceof_cause() from None
                return _as_batch(out, time.perf_counter() - t)
            if time.monotonic() - since > limit:
                self.fail(head)

    def fail(self, head: _Batch) -> None:
        node = self.pool.nodes[head.actor]
        where = f"on node {node}" if node is not None else "not started (no free CPU for it?)"
        runner = self.runner
        why = f"timeout={runner.timeout:g}" if runner.timeout and runner.timeout > 0 else \
            f"timeout=0, so fastdata's stall limit: FASTDATA_STALL_TIMEOUT={runner.limit:g} s"
        runner.shutdown()
        raise RuntimeError(f"the Ray cluster made no progress for {runner.limit:g} seconds ({why}): batch {head.k} "
                           f"of epoch {head.epoch} waits on Ray actor {head.actor} {where}; the actors were killed")

    def close(self) -> None:
        """Drops what is under way (queued tasks are cancelled; their results, if any, freed)."""
        self.closed = True
        for b in self.pending:
            try:
                ray.cancel(b.ref)
            except Exception:  # noqa: BLE001 (a task already running or done cannot be cancelled: dropped)
                logger.debug("could not cancel a Ray task", exc_info=True)
        self.pending.clear()


def _as_batch(out: Any, fetch_s: float) -> Any:
    """The actor's arrays as the loader's batch: tensors over the object store's memory."""
    if isinstance(out, DataError):
        return out
    images, labels, errors, ids, stages = out
    with warnings.catch_warnings():  # the object is immutable in the store; a batch is never written in place
        warnings.simplefilter("ignore", UserWarning)
        images, labels = torch.from_numpy(images), torch.from_numpy(labels)
    if stages is not None:
        stages["transfer"] = fetch_s
    return images, labels, errors, np.asarray(ids), stages


class RayWorkers:
    """Runs `task` over the batches of `order` on `num_workers` Ray actors, one pass at a time."""

    def __init__(self, order: BatchOrder, task: BatchTask, num_workers: int, timeout: float,
                 prefetch_factor: int | None, persistent: bool, run_ahead: bool) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers should be at least 1 Ray actor for backend 'ray', but got {num_workers}")
        self.order = order
        # The actors' copy decodes into an unpinned ring of its own: pinned memory is for the
        # trainer's host, and a batch leaves the actor as a copy into the object store.
        decoder = copy.copy(task.decoder)
        decoder.rings = ProcessRings(2)
        decoder.threads = 1  # an actor holds one CPU
        self.task = BatchTask(task.reader, decoder)
        self.workers, self.timeout = num_workers, timeout
        self.limit = stall_limit(timeout)
        self.window = max(1, (prefetch_factor or 2) * num_workers)
        self.persistent, self.run_ahead = persistent, persistent and run_ahead
        self.timing = False
        self._pool: _Pool | None = None
        self._stream: _Stream | None = None
        self._finalizer: Any = None  # kills the pool's actors: at shutdown(), or when this runner is collected

    def __getstate__(self) -> dict:
        # To another process (ddp_spawn): the configuration, not this process's actors.
        return {**self.__dict__, "_pool": None, "_stream": None, "_finalizer": None}

    @property
    def num_workers(self) -> int:
        return self.workers

    @property
    def lost(self) -> int:
        """Actors lost and replaced so far (their batches ran again elsewhere)."""
        return self._pool.replaced if self._pool is not None else 0

    def set_timing(self, on: bool) -> bool:
        """Always: the flag goes with each task."""
        self.timing = on
        return True

    def ready_ahead(self) -> int:
        return self.window

    def in_process(self) -> bool:
        return False

    def pool(self) -> _Pool:
        """The actors, started on first use."""
        if self._pool is None:
            # Starting an actor (a process importing torch) is not a batch: the stall limit, not `timeout`
            self._pool = _Pool(self.task, self.workers, stall_limit(0))
            self._finalizer = weakref.finalize(self, self._pool.shutdown)
        return self._pool

    def open(self, epoch: int, skip: int) -> tuple[Iterator[Any], Callable[[], None]]:
        """(the batches from batch `skip` of `epoch` on, the pass's end)."""
        live = self._stream
        if live is not None and self.run_ahead and not live.closed and live.next == (epoch, skip):
            return live, lambda: None  # persistent actors, already running ahead
        if live is not None:
            live.close()
        stream = self._stream = _Stream(self, self.pool(), epoch, skip)
        if self.persistent:
            return stream, lambda: None

        def end() -> None:
            stream.close()
            self.shutdown()

        return stream, end

    def epoch_done(self, epoch: int) -> None:
        """Nothing to do: running ahead, the stream is already on the next epoch."""

    def watchdog(self, it: Any) -> NoWatchdog:
        """The stream times its own waits (`ray.wait` with a limit)."""
        return NoWatchdog()

    def shutdown(self) -> None:
        """The actors are killed now; the next pass starts new ones."""
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        if self._finalizer is not None:
            self._finalizer()  # the pool's shutdown, once
            self._finalizer = None
        self._pool = None
