"""Counter-based randomness: every draw is a pure function of (seed, epoch, sample, op, k).

So a sample's augmentation does not depend on batch size, worker count, shuffling or which
engine applies it (Kornia's forward_parameters/apply split, taken one step further: the
parameters can be recomputed anywhere from the sample's identity alone). splitmix64 hashing,
vectorised over the batch in numpy, so that a batch's parameters cost a few numpy calls, not
a Python loop per sample.
"""

from __future__ import annotations

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = x + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def uniforms(seed: int, epoch: int, indices: np.ndarray, stream: int, count: int) -> np.ndarray:
    """Floats in [0, 1), shape [len(indices), count], for op number `stream` of the pipeline."""
    key = _mix(np.array([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))
    key = _mix(key ^ np.uint64(epoch & 0xFFFFFFFFFFFFFFFF))
    key = _mix(key ^ np.uint64(stream))
    idx = np.asarray(indices, dtype=np.uint64).reshape(-1, 1)
    with np.errstate(over="ignore"):
        x = _mix(_mix(key ^ idx) + np.arange(count, dtype=np.uint64).reshape(1, -1) * _GOLDEN)
    return (x >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
