"""Who decodes on a Ray cluster: Ray actors of one CPU each, anywhere in the cluster, each
holding the reader and decoder, run each batch's read-and-decode task (`BatchTask`) and return
it to Ray's object store; the training process takes the batches in order.

- Placement: the actors (`ray_actors.py`) spread over the nodes (`SPREAD`); batch k goes to
  actor k mod n (with shards, actor w serves lane w, so it reads its shards in order), or to the
  next live one.
- Backpressure: at most `prefetch_factor` x actors batches are submitted or ready and not yet
  taken, and no more than this node's object store holds (each is pulled into it: past its
  capacity Ray would spill them to disk), so a slow consumer leaves the cluster idle.
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
from .._stall import NoWatchdog, stall_limit
from .._workers import hold_threads, release_threads
from ..errors import DataError
from .cpu import BatchTask
from .parts import BatchOrder
from .ray_actors import LOST, Pool

logger = logging.getLogger("fastdata")

_STORE_BYTES = 1 << 30  # a local cluster's object store: the prefetch window, not a cache


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


def node_store_bytes() -> int:
    """This training process's share of its node's object store, in bytes (0 where Ray does not
    say): the node's training processes (torchrun's LOCAL_WORLD_SIZE) pull into the same store."""
    me = ray.get_runtime_context().get_node_id()
    store = next((int(n["Resources"].get("object_store_memory", 0)) for n in ray.nodes() if n.get("NodeID") == me), 0)
    try:
        return store // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return store


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

    def __init__(self, runner: "RayWorkers", pool: Pool, epoch: int, skip: int) -> None:
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
        window = self.runner.ready_ahead()
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
                except LOST:
                    lost = head.actor
                    pool.lost(lost)
                    for b in self.pending:
                        if b.actor == lost:
                            self._submit(b)
                    continue
                except rex.RayTaskError as e:  # a bug in the task: its own exception, with the actor's traceback
                    raise e.as_instanceof_cause() from None
                self.runner.fit(out)
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
    images, labels, errors, keys, stages = out
    with warnings.catch_warnings():  # the object is immutable in the store; a batch is never written in place
        warnings.simplefilter("ignore", UserWarning)
        images, labels = torch.from_numpy(images), torch.from_numpy(labels)
    if stages is not None:
        stages["transfer"] = fetch_s
    return images, labels, errors, np.asarray(keys), stages


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
        self.fitted = False  # the window checked against the object store, at the first batch
        self.persistent, self.run_ahead = persistent, persistent and run_ahead
        self.timing = False
        self._pool: Pool | None = None
        self._stream: _Stream | None = None
        self._finalizer: Any = None  # kills the pool's actors: at shutdown(), or when this runner is collected

    def fit(self, out: Any) -> None:
        """Once a batch's size is known: the window capped at what this node's object store holds
        beside two batches the consumer may still use (the tensors map it), warned of where that
        leaves actors idle."""
        if self.fitted or isinstance(out, DataError):
            return
        self.fitted = True
        size, store = out[0].nbytes + out[1].nbytes, node_store_bytes()
        fits = max(1, store // max(1, size) - 2)
        if store and fits < self.window:
            log = logger.warning if fits < self.workers else logger.info
            log("this process's share of Ray's object store on this node (%d MiB) holds %d batches of %.1f MiB "
                "beside those in use: at most %d ahead, not prefetch_factor x num_workers = %d%s", store >> 20, fits,
                size / 2**20, fits, self.window, f", so {fits} of {self.workers} actors decode at once "
                "(ray.init(object_store_memory=...) before the loader lifts it)" if fits < self.workers else "")
            self.window = fits

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
        """The batches that may be submitted and not yet taken: one an actor until `fit`."""
        return self.window if self.fitted else min(self.window, self.workers)

    def in_process(self) -> bool:
        return False

    def pool(self) -> Pool:
        """The actors, started on first use."""
        if self._pool is None:
            # Starting an actor (a process importing torch) is not a batch: the stall limit, not `timeout`
            self._pool = Pool(self.task, self.workers, stall_limit(0))
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
