"""`fastdata run`: which DataLoaders fastdata serves, and how (`decide`, from the arguments the
script made one with): natively decoded (a torchvision image folder whose transform
`fastdata.run._lowering` lowers), natively collated, or batched by the script's collate_fn; and
the worker count.

num_workers: where the script left the default (0), a served loader gets "auto" only where that
cannot change a batch: a torchvision image folder served natively (fastdata decodes it, each
sample a function of its batch's seed and its place in it, in whatever process) without a
target_transform or an op of the script's in its transform (the script's code, which may count,
cache or draw from Python's RNG in the process it runs in) or timm's RandAugment or AutoAugment
(which draw from Python's and NumPy's there), torch's default samplers, no shuffle from torch's
RNG (torch draws it at iter() with workers, at the first next() without: the script's own draws
between would change), workers started by fork (spawn or
forkserver would run the script's main module again; they fork also where forkserver is only
the platform's default, Linux from Python 3.14: `fastdata._workers.own_start_method`; a start
method, a transform fastdata does not serve, or a target_transform or collate_fn of the script's
set since the loader was made takes the workers back at iter()), and none of the keywords that
mean something else with workers (worker_init_fn, prefetch_factor, multiprocessing_context,
persistent_workers); and only where /dev/shm has room for their batches (`fastdata.run._shm`: a
container's may be small). A Dataset whose own __getitem__ makes the samples keeps the script's
count: nothing outside it can tell whether it holds an open file (whose offset forked workers
would share), reads an iterator, counts, caches, or draws random numbers, each of which workers
would change; so does a collate_fn of the script's, which workers would run.
"""

from __future__ import annotations

import inspect
import types
from typing import Any

import torch
import torch.utils.data.dataloader
from torch.utils.data import IterableDataset

from ._arrays import lower_any
from ._folders import leaves, target_transformed
from ._lowering import Lowering, samples_refused
from ._mixup import mixing_of
from ._shm import shm_room
from .._collate import collate as native_collate
from .._workers import own_start_method

SIGNATURE = inspect.signature(torch.utils.data.dataloader.DataLoader.__init__)
# Keywords whose meaning changes when a loader gets workers the script did not ask for.
_WORKER_KEYWORDS = ("worker_init_fn", "prefetch_factor", "multiprocessing_context", "persistent_workers")


KEPT = "num_workers=0 kept: "  # in a reason, before why the run kept the script's 0 workers


def decide(args: tuple, kwargs: dict) -> tuple[bool, str, Any, Lowering | None]:
    """(served, the reason, num_workers to set or None, the lowering or None) for `DataLoader(...)`."""
    try:
        call = SIGNATURE.bind(None, *args, **kwargs).arguments
    except TypeError as e:
        return False, f"arguments torch's DataLoader does not take ({e})", None, None
    dataset = call.get("dataset")
    if isinstance(dataset, IterableDataset):
        return False, ("an IterableDataset: its iteration may have side effects (fastdata fast-forwards an iterable "
                       "on resume by reading it again)"), None, None
    reason, lowering = _collation(call)
    if "num_workers" in call:
        return True, f"{reason}; num_workers={call['num_workers']} as the script set it", None, lowering
    if lowering is None:
        return True, (f"{reason}; {KEPT}the dataset's own __getitem__ makes the samples, and "
                      "workers could change them (shared files, state, random draws)"), None, lowering
    if _scripts_collate(call):
        return True, (f"{reason}; {KEPT}workers would run the script's collate_fn (its state, its "
                      "random draws)"), None, lowering
    if lowering.in_memory:
        return True, (f"{reason}; {KEPT}an in-memory dataset's batches are cut from its arrays in this "
                      "process, faster than workers would ship them"), None, lowering
    auto, why = auto_workers(call, lowering)
    if not auto:
        return True, f"{reason}; {KEPT}{why}", None, lowering
    return True, f"{reason}; num_workers='auto' (the script left the default)", "auto", lowering


def _collation(call: dict) -> tuple[str, Lowering | None]:
    """How a served loader's batches are made (for the summary), and a natively served folder's lowering."""
    own = _scripts_collate(call)
    collation = "the script's collate_fn" if own else "native collation"
    lowering, why = lower_any(call.get("dataset"))
    if why:
        return f"{collation}; not served natively: {why}", None
    if lowering is not None and call.get("batch_size", 1) is None:
        return f"{collation}; not served natively: batch_size=None (samples one by one)", None
    mixing = mixing_of(call.get("collate_fn"), lowering, call.get("dataset")) if own else None
    refused = samples_refused(lowering) if lowering is not None and own and mixing is None else ""
    if refused:
        return f"{collation}; not served natively: {refused}", None
    if lowering is not None:
        shown = " of ".join(dict.fromkeys(type(d).__name__ for d in (call["dataset"], *leaves(call["dataset"]))))
        how = "run on its arrays" if lowering.in_memory else "decoded"
        return (f"served natively: {shown} with {lowering.names} {how} by fastdata"
                + (f", natively {_named(mixing)}"
                   if mixing is not None else ", its samples batched by the script's collate_fn" if own else "")
                + ("; random parameters drawn by fastdata (torchvision's distributions, not the plain run's numbers)"
                   if lowering.random else "")
                + (f"; {', '.join(dict.fromkeys(lowering.script_ops))} called as the script's own op"
                   if lowering.script_ops else "")), lowering
    return "the script's collate_fn (no native collation)" if own else collation, None


def _named(mixing: Any) -> str:
    """How the summary says a collate_fn of the script's (`mixing_of`) is run: "collated and mixed
    as the script's collate_fn mixes (RandomChoice(MixUp, CutMix))", ..., "collated as the
    script's collate_fn collates (fast_collate)" (timm's, a function)."""
    if isinstance(mixing, types.FunctionType):
        return f"collated as the script's collate_fn collates ({mixing.__name__})"
    ops = getattr(mixing, "transforms", None)
    name = type(mixing).__name__
    name = f"{name}({', '.join(type(op).__name__ for op in ops)})" if ops is not None else name
    return f"collated and mixed as the script's collate_fn mixes ({name})"


def _scripts_collate(call: dict) -> bool:
    """Whether the loader batches with a collate_fn of the script's (torch's default named, or
    fastdata's handed back by a rebuild, are the default)."""
    return call.get("collate_fn") not in (None, torch.utils.data.default_collate, native_collate)


def auto_workers(call: dict, lowering: Lowering) -> tuple[bool, str]:
    """Whether a natively served folder the script left at num_workers=0 may get workers without
    a change in any batch (see the module's docstring) and with room for them in /dev/shm, and if
    not, why not."""
    if lowering.script_ops:
        return False, (f"{lowering.script_ops[0]}, an op of the script's, which may keep state or draw from Python's "
                       "RNG (in workers, it would do so there)")
    if lowering.own_draws:
        return False, (f"timm's {lowering.own_draws[0]}, which draws from Python's and NumPy's RNGs (in workers, it "
                       "would draw there)")
    size = call.get("batch_size", 1)
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:  # torch's BatchSampler raises for it
        return False, f"batch_size={size!r}, which torch refuses"
    if call.get("sampler") is not None or call.get("batch_sampler") is not None:
        return False, "a sampler given by the script (its draws may depend on where they run)"
    if call.get("shuffle") and call.get("generator") is None:  # (see the module's docstring)
        return False, "shuffle=True without a generator: with workers torch would draw it from its RNG at iter()"
    given = [k for k in _WORKER_KEYWORDS if call.get(k) not in (None, False)]
    if given:
        return False, f"{given[0]} is set, which means something else with workers"
    if target_transformed(call.get("dataset")):
        return False, "a target_transform of the script's, which may keep state (in workers, it would keep it there)"
    method = own_start_method()
    if method != "fork":
        return False, f"workers would start by {method}, which runs the script's main module again"
    why = shm_room(call, lowering)
    return not why, why
