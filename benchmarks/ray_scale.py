"""backend="ray" on a loopback Ray cluster against backend="pil" on the same cores, and the
scaling model for N remote nodes from the per-image costs measured here.

The ImageNet training transform (RandomResizedCrop 224 + flip, uint8 batches of 256) on the
synthetic ImageNet-like set. One process, one loopback cluster: a head raylet with no CPUs (the
training process) and `--nodes` raylets of one CPU each on 127.0.0.1, so every batch crosses
from another raylet's object store, as from a remote node. `pil` runs as many workers as the
cluster has actors, on the same cores. Both persist across epochs and neither runs ahead into
the next epoch (it would decode while the other side is timed); epochs alternate between the
two, in ABBA order (`_common.interleaved`).

Then the costs the model rests on: an image's decode + augment CPU seconds in an actor (stage
timing), a batch's object-store put (the actor's copy in) and pull from another raylet (the
training process's copy out: alone, and several under way at once, as the loader runs them),
and the training process's own CPU seconds a batch. With N nodes of C cores the rate is bounded
by the CPUs, N * C / cpu_per_image, and by the one training process the batches stream into,
batch / max(pipelined pull, own); the table prints both.

    OMP_NUM_THREADS=1 python benchmarks/ray_scale.py [--images 2000] [--rounds 3] [--epochs 2] [--nodes 2]
"""

from __future__ import annotations

import logging
import statistics
import sys
import time

import _common
import numpy as np

BATCH, SIZE = _common.BATCH, _common.SIZE
STORE = 512 << 20


def _cluster(nodes: int):
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "object_store_memory": STORE,
                                                            "include_dashboard": False})
    for _ in range(nodes):
        cluster.add_node(num_cpus=1, object_store_memory=STORE)
    ray.init(address=cluster.address, log_to_driver=False, logging_level=logging.WARNING)
    cluster.wait_for_nodes()
    return cluster


def _loader(root: str, backend: str, workers: int):
    """_common's ImageNet loader, with `workers` workers (actors), persistent."""
    import fastdata
    from fastdata import transforms as T

    return fastdata.loader(root, batch_size=BATCH, shuffle=True, num_workers=workers, persistent_workers=True,
                           device="cpu", backend=backend,
                           transform=T.Compose([T.RandomResizedCrop(SIZE), T.RandomHorizontalFlip()]))


def _epoch_seconds(loader) -> tuple[float, int]:
    t = time.perf_counter()
    n = sum(len(labels) for _, labels in loader)
    return time.perf_counter() - t, n


def _store_costs(reps: int = 5) -> dict:
    """Seconds to put a batch into this raylet's object store, and to pull one that a task on
    another raylet made."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    shape = (BATCH, SIZE, SIZE, 3)
    batch = np.random.default_rng(0).integers(0, 255, shape, dtype=np.uint8)
    put = []
    for _ in range(reps):
        t = time.perf_counter()
        ref = ray.put(batch)
        put.append(time.perf_counter() - t)
        del ref
    here = ray.get_runtime_context().get_node_id()
    other = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] != here)

    @ray.remote(num_cpus=0)  # beside the actors, which hold the raylets' CPUs
    def make(shape):
        return np.ones(shape, dtype=np.uint8)

    there = NodeAffinitySchedulingStrategy(other, soft=False)
    pull = []
    for _ in range(reps):
        ref = make.options(scheduling_strategy=there).remote(shape)
        ray.wait([ref], fetch_local=False)  # made, over there
        t = time.perf_counter()
        ray.get(ref)
        pull.append(time.perf_counter() - t)
        del ref
    # several pulls under way at once, as the loader starts them for every ready batch
    refs = [make.options(scheduling_strategy=there).remote(shape) for _ in range(reps)]
    ray.wait(refs, num_returns=len(refs), fetch_local=False)
    t = time.perf_counter()
    ray.wait(refs, num_returns=len(refs), fetch_local=True)
    pipelined = (time.perf_counter() - t) / len(refs)
    del refs
    return {"put_s_per_batch": statistics.median(put), "pull_s_per_batch": statistics.median(pull),
            "pull_pipelined_s_per_batch": pipelined, "batch_bytes": int(batch.nbytes)}


def _costs(loader) -> dict:
    """An epoch with stage timing on: an image's CPU seconds in the actors, the training
    process's seconds a batch."""
    import resource

    loader.set_stage_timing(True)
    before = dict(loader.stats.get("stages", {}))
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t = time.perf_counter()
    batches = sum(1 for _ in loader)
    wall = time.perf_counter() - t
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    loader.set_stage_timing(False)
    st = {k: v - before.get(k, 0) for k, v in loader.stats["stages"].items() if not isinstance(v, dict)}
    images = st["images"]
    own = (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)
    return {"cpu_s_per_image": (st.get("decode", 0) + st.get("cpu_transforms", 0) + st.get("collate", 0)) / images,
            "read_s_per_image": st.get("read", 0) / images, "driver_cpu_s_per_batch": own / batches,
            "epoch_s": wall, "images": images}


def _model(costs: dict, store: dict, node_cores: int) -> list[dict]:
    cpu = costs["cpu_s_per_image"] + costs["read_s_per_image"]
    # The pulls run in the background, beside the training process's own work a batch.
    consumer = BATCH / max(store["pull_pipelined_s_per_batch"], costs["driver_cpu_s_per_batch"])
    rows = []
    for n in (1, 2, 4, 8, 16, 32):
        cpus = n * node_cores / cpu
        rows.append({"nodes": n, "node_cores": node_cores, "cpu_bound": cpus, "consumer_bound": consumer,
                     "images_per_s": min(cpus, consumer)})
    return rows


def main() -> None:
    ap = _common.rounds_parser(__doc__)
    ap.add_argument("--nodes", type=int, default=_common.WORKERS, help="loopback raylets of one CPU each")
    ap.add_argument("--node-cores", type=int, default=16, help="cores of a remote node, for the model")
    args = ap.parse_args()

    import ray

    from fastdata.image.loader import ImageLoader
    from fastdata.synthetic import make_imagenet_like

    make_imagenet_like(args.root, n_images=args.images, progress=True)
    cluster = _cluster(args.nodes)
    ImageLoader._run_ahead = False  # see the docstring
    try:
        workers = args.nodes
        ray_loader = _loader(args.root, "ray", workers)
        pil_loader = _loader(args.root, "pil", workers)
        sides = {"pil": pil_loader, "ray": ray_loader}
        for loader in sides.values():  # warm-up: workers and actors started, page cache warm
            _epoch_seconds(loader)
        counts: dict[str, int] = {}

        def timed(name):
            def run() -> float:
                seconds, counts[name] = _epoch_seconds(sides[name])
                return seconds
            return run

        print(f"{args.images} images, batch {BATCH}, {workers} pil workers / {workers} Ray actors on {args.nodes} "
              f"loopback raylets; {args.rounds} rounds x {args.epochs} epochs", file=sys.stderr)
        seconds = _common.interleaved({name: timed(name) for name in sides}, args.rounds * args.epochs)
        rates = {name: [counts[name] / s for s in secs] for name, secs in seconds.items()}
        med = {name: _common.median(v) for name, v in rates.items()}
        lo, hi = _common.ratio_ci(seconds["pil"], seconds["ray"])  # pil's seconds over ray's: ray's rate over pil's
        costs = _costs(ray_loader)
        store = _store_costs()
        rows = _model(costs, store, args.node_cores)
        ray_loader.shutdown()
    finally:
        ray.shutdown()
        cluster.shutdown()

    ratio = med["ray"] / med["pil"]
    print(f"\n{'side':<8}{'images/s':>10}")
    for name, v in med.items():
        print(f"{name:<8}{v:>10.0f}")
    print(f"ray / pil on the same {workers} cores: {ratio:.2f}x (95% CI {lo:.2f}-{hi:.2f}): "
          f"the object-store path's overhead")
    print(f"costs: {1e3 * costs['cpu_s_per_image']:.2f} ms CPU an image (decode + augment, in an actor), "
          f"{1e3 * costs['read_s_per_image']:.3f} ms read; a batch of {store['batch_bytes'] / 2**20:.0f} MiB: "
          f"put {1e3 * store['put_s_per_batch']:.1f} ms, "
          f"pull from another raylet {1e3 * store['pull_s_per_batch']:.1f} ms "
          f"({1e3 * store['pull_pipelined_s_per_batch']:.1f} ms a batch with several under way), "
          f"{1e3 * costs['driver_cpu_s_per_batch']:.1f} ms of the training process's CPU")
    print(f"\nthe model for N remote nodes of {args.node_cores} cores (one training process):")
    print(f"{'nodes':>6}{'CPU bound':>12}{'consumer bound':>16}{'images/s':>10}")
    for r in rows:
        print(f"{r['nodes']:>6}{r['cpu_bound']:>12,.0f}{r['consumer_bound']:>16,.0f}{r['images_per_s']:>10,.0f}")
    report = {"images": args.images, "batch": BATCH, "workers": workers, "nodes": args.nodes,
              "images_per_s": med, "all": rates, "ratio_ray_to_pil": ratio, "ratio_ci95": [lo, hi],
              "costs": {**costs, **store}, "model": rows}
    _common.write("ray_scale", report, args.json)


if __name__ == "__main__":
    main()
