"""torch's and DALI's private names, behind `fastdata._torch_internals` alone: each is there on
the installed torch (so an upgrade that renames one fails here, naming it), the torch is one
the module supports, no other module of fastdata names one, and the functions do on a real
DataLoader what their callers rely on."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from fastdata import _optional
from fastdata import _torch_internals as internals

PACKAGE = Path(internals.__file__).parent
NAMES = set(internals.DATALOADER_ATTRIBUTES) | set(internals.ITERATOR_ATTRIBUTES) | set(internals.OTHER_NAMES)


def _version(text: str) -> tuple[int, int]:
    major, minor = text.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def test_the_installed_torch_is_supported():
    oldest, newest = internals.SUPPORTED_TORCH
    assert oldest <= _version(torch.__version__) <= newest, (
        f"torch {torch.__version__} is outside the range fastdata._torch_internals was checked on "
        f"({oldest} to {newest}): check each private name there, then widen SUPPORTED_TORCH")


def test_every_private_name_is_on_this_torch():
    loader = DataLoader(list(range(8)), batch_size=2, num_workers=1, persistent_workers=True)
    for name in internals.DATALOADER_ATTRIBUTES:
        assert hasattr(loader, name), name
    single = iter(DataLoader(list(range(8)), batch_size=2, pin_memory=False))
    assert type(single).__name__ == "_SingleProcessDataLoaderIter"
    for name in ("_dataset_fetcher", "_sampler_iter", "_pin_memory", "_pin_memory_device"):
        assert hasattr(single, name), name
    multi = iter(loader)
    try:
        for name in ("_workers", "_shutdown_workers", "_worker_pids_set", "_workers_status", "_persistent_workers",
                     "_mark_worker_as_unavailable"):
            assert hasattr(multi, name), name
        assert internals.live_iterator(loader) is multi and len(internals.iterator_workers(multi)) == 1
    finally:
        internals.end_live_iterator(loader)
    assert internals.live_iterator(loader) is None
    assert all(w.exitcode is not None for w in internals.iterator_workers(multi))  # shut down, reaped
    assert callable(torch.UntypedStorage._new_shared) and callable(torch.autograd._profiler_enabled)
    assert callable(torch.empty(())._typed_storage()._new_shared)
    t = torch.zeros(3)
    before = internals.write_count(t)
    t[1:].add_(1)
    assert internals.write_count(t) > before  # a write through a view counts too
    from torch.utils.data._utils import signal_handling, worker

    assert callable(signal_handling._remove_worker_pids) and hasattr(worker, "_worker_info")


class _Collated(torch.utils.data.Dataset):
    """Samples 0-3 of shape [3], sample 4 of shape [2]: the batches 0-1 and 2-3 collate, 4-5 do not."""

    def __len__(self):
        return 6

    def __getitem__(self, i):
        return torch.full((2 if i == 4 else 3,), float(i))

    def __getitems__(self, indices):  # (each batch's error as the training process's collation raises it)
        from torch.utils.data import get_worker_info

        samples = [self[i] for i in indices]
        assert get_worker_info() is not None
        error = internals.collate_error_in_process(samples)
        assert get_worker_info() is not None  # (the worker's own again)
        return [(s, repr(error)) for s in samples]


def test_the_collate_error_in_process_is_the_training_processs():
    """In a worker (whose own collation stacks into shared memory it sizes from the samples:
    "Trying to resize storage ..." for these), the error the training process's collation
    raises for a batch: torch's stack error, None where the batch collates."""
    loader = DataLoader(_Collated(), batch_size=2, num_workers=1, collate_fn=lambda batch: batch)
    errors = [batch[0][1] for batch in loader]
    assert errors[:2] == ["None", "None"] and errors[2].startswith("RuntimeError('stack expects each tensor"), errors


@pytest.mark.skipif(not _optional.has("dali"), reason="DALI is not installed")
def test_dalis_teardown_is_there():
    from nvidia.dali import Pipeline

    assert callable(Pipeline._shutdown)


def test_no_other_module_names_one():
    """No attribute, string or import naming one of them outside `_torch_internals`; a module
    path with a private part (`torch.utils.data._utils`) counts as one."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "_torch_internals.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            name = None
            if isinstance(node, ast.Attribute) and node.attr in NAMES:
                name = node.attr
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in NAMES:
                name = node.value
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and (
                    node.module.split(".")[0] in ("torch", "nvidia")
                    and any(part.startswith("_") for part in node.module.split("."))):
                name = node.module
            elif isinstance(node, ast.Import):
                name = next((a.name for a in node.names if a.name.split(".")[0] in ("torch", "nvidia")
                             and any(p.startswith("_") for p in a.name.split("."))), None)
            if name is not None:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {name}")
    assert not found, "torch's or DALI's private names outside fastdata/_torch_internals.py:\n" + "\n".join(found)


def test_single_process_fetch_gives_the_iterators_batches():
    data = [torch.full((2,), i) for i in range(7)]
    expected = [b.tolist() for b in DataLoader(data, batch_size=3)]
    indices, fetch = internals.single_process_fetch(iter(DataLoader(data, batch_size=3)))
    assert [fetch(i).tolist() for i in indices] == expected
    assert internals.single_process_fetch(object()) is None


def test_shared_memory_as_a_worker_gets_it():
    t = internals.new_shared_tensor((3, 4), torch.float16)
    assert t.shape == (3, 4) and t.dtype == torch.float16 and t.is_shared()
    s = internals.new_shared_storage(64)
    assert s.nbytes() == 64 and s.is_shared()
