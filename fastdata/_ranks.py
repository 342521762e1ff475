"""The ranks an epoch is split among, for both modes: this process's rank and the world size
(as given, else torch.distributed's when a process group is up, else 0 of 1), and a rank's
share of an epoch's order (DistributedSampler's striding)."""

from __future__ import annotations

import math

import numpy as np
import torch


def ranks(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """(rank, world size): each as given, else from torch.distributed when it is initialized,
    else 0 and 1. ValueError unless 0 <= rank < world size."""
    dist = torch.distributed
    live = dist.is_available() and dist.is_initialized()
    if rank is None:
        rank = dist.get_rank() if live else 0
    if world_size is None:
        world_size = dist.get_world_size() if live else 1
    if not 0 <= rank < world_size:
        raise ValueError(f"rank should be in [0, world_size), but got rank={rank}, world_size={world_size}")
    return rank, world_size


def per_rank(n: int, world_size: int, drop_last: bool) -> int:
    """Samples a rank: the epoch cut to a multiple of world_size with drop_last, else padded up
    to one."""
    return n // world_size if drop_last else math.ceil(n / world_size)


def share(order: np.ndarray, rank: int, world_size: int, drop_last: bool = False) -> np.ndarray:
    """Rank `rank`'s share of an epoch's `order`: the order cut (drop_last) or padded by
    wrapping around to a multiple of world_size, then every world_size-th item from `rank` on.
    Every rank gets per_rank(len(order), ...) items: DDP never waits on a rank with fewer."""
    total = per_rank(len(order), world_size, drop_last) * world_size
    return np.resize(order, total)[rank::world_size]
