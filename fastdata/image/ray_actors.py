"""The Ray actors of the `ray` backend (`fastdata.image.ray` runs the passes on them): each
holds a copy of the batch task and returns a batch as plain arrays; the pool starts them spread
over the nodes, knows which answered (are live) and where, and replaces one that was lost."""

from __future__ import annotations

import logging
from typing import Any

import ray
from ray import exceptions as rex

from ..errors import DataError
from .cpu import BatchTask

logger = logging.getLogger("fastdata")

_START_GRACE = 30.0  # s the actors after the first have to start before the first pass runs without them
LOST = (rex.RayActorError, rex.ObjectLostError, rex.WorkerCrashedError, rex.NodeDiedError)  # an actor or node gone


class BatchActor:
    """A Ray actor (one CPU): reads and decodes batches with its copy of the task."""

    def __init__(self, task: BatchTask, index: int) -> None:
        self.task, self.index = task, index

    def where(self) -> str:
        """Its node, as "address (node id)" (answered once it runs: the actor is live)."""
        return f"{ray.util.get_node_ip_address()} ({ray.get_runtime_context().get_node_id()[:8]})"

    def run(self, keys: list, timing: bool) -> Any:
        """(images NHWC uint8, labels, errors, draw keys, stage seconds or None) as numpy
        arrays; a DataError is returned, not raised, so it reaches the consumer as itself."""
        task = self.task
        task.timing = timing
        try:
            images, labels, errors, draws, stages = task.__getitems__(keys)
        except DataError as e:
            return e
        if stages is not None:
            stages["worker"] = self.index
        return images.numpy(), labels.numpy(), errors, draws, stages


_RemoteActor = ray.remote(num_cpus=1, max_restarts=0, max_task_retries=0)(BatchActor)


class Pool:
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
            free, cpus = ray.available_resources().get("CPU", 0), ray.cluster_resources().get("CPU", 1)
            raise RuntimeError(f"no Ray actor started within {limit:g} s ({n} asked, 1 CPU each; the cluster has "
                               f"{free:g} free CPUs of {cpus:g}): add nodes or lower num_workers")

    def _start(self, i: int) -> None:
        actor = _RemoteActor.options(scheduling_strategy="SPREAD").remote(self.task_ref, i)
        self.actors[i], self.nodes[i] = actor, None
        self.starting[actor.where.remote()] = i

    def _answered(self, refs: list) -> None:
        for ref in refs:
            i = self.starting.pop(ref)
            try:
                self.nodes[i] = ray.get(ref)
            except LOST:
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
