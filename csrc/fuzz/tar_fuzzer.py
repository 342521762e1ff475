"""atheris target for the tar and index reading (Python: fastdata.sources, its shard format
fastdata.sources.tarformat, and the wds backend's member parsing), fed mutated shards and indexes.

    python3 csrc/fuzz/tar_fuzzer.py [libFuzzer flags] CORPUS_DIR [SEED_DIR ...]

An input is a shard and optionally its index (`seeds.tar_input`): 2 bytes little-endian, the
index's length (0: no index), the index JSON, then the shard's bytes. They are written as
train-000000.tar and train-index.json in a scratch folder, then read by every reader there is:
`count_samples`, `read_index`, `shards` (index or header scan), and a `wds` loader with on_error="skip" that decodes every
sample (the block reads, the member parsing of each sample, Pillow's decode).

Each must return, or raise fastdata.DataError or ValueError with a one-line message: any other
exception fails the input, as does a loader whose samples and skipped samples do not add up to
what `shards` counted (a sample lost silently), or a read that takes more memory than a few-KiB
shard can explain (a buffer sized from a header's claim). Hangs are libFuzzer's -timeout.
tests/robustness/test_fuzz.py replays the checked-in inputs through `check` too.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import tracemalloc
import warnings

os.environ.setdefault("OMP_NUM_THREADS", "1")


def split(data: bytes) -> tuple[bytes | None, bytes]:
    """(index or None, shard) of an input."""
    n = int.from_bytes(data[:2].ljust(2, b"\0"), "little")
    index = data[2:2 + n]
    return (index if n else None), data[2 + n:]


# The Python-heap peak allowed for reading one input's samples: the shards here are a few KiB,
# so more means a buffer sized from what a header claims rather than what the file holds.
_MEMORY = 64 << 20


def _clean(what: str, call, *args, **kwargs):
    """call(*args, **kwargs), or None when it raised DataError/ValueError with a one-line message."""
    from fastdata import DataError

    try:
        return call(*args, **kwargs)
    except (DataError, ValueError) as e:
        message = str(e)
        if not message.strip() or "\n" in message:
            raise AssertionError(f"{what} raised {type(e).__name__} with a message that is not one line: "
                                 f"{message!r}") from e
        return None


def check(data: bytes, folder: str) -> None:
    """Reads one input with every reader; raises on anything but a clean result or error."""
    import fastdata
    from fastdata import transforms as T
    from fastdata.sources import shards
    from fastdata.sources.tarformat import count_samples, read_index

    index, shard = split(data)
    tar = os.path.join(folder, "train-000000.tar")
    index_file = os.path.join(folder, "train-index.json")
    with open(tar, "wb") as f:
        f.write(shard)
    if index is None:
        if os.path.exists(index_file):
            os.unlink(index_file)
    else:
        with open(index_file, "wb") as f:
            f.write(index)

    count = _clean("count_samples", count_samples, tar)
    if count is not None and count < 0:
        raise AssertionError(f"count_samples gave {count}")
    if index is not None:
        _clean("read_index", read_index, index_file)
    found = _clean("shards", shards, tar, progress=False)
    if found is None or len(found) == 0:
        return
    loader = _clean("loader", fastdata.loader, tar, batch_size=4, backend="wds", num_workers=0, device="cpu",
                    on_error="skip", transform=T.Compose([T.Resize(8), T.CenterCrop(8)]))
    if loader is None:
        return
    # on_error="skip": nothing may be raised while iterating, and every sample is either
    # delivered or counted as skipped.
    tracemalloc.start()
    try:
        seen = _count(loader)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    if peak > _MEMORY:
        raise AssertionError(f"reading {len(found)} samples of a {len(shard)}-byte shard took {peak >> 20} MiB")
    if seen + loader.stats["skipped"] != len(found):
        raise AssertionError(f"the loader gave {seen} samples and skipped {loader.stats['skipped']} of the "
                             f"{len(found)} that shards() counted")


def _count(loader) -> int:
    seen = 0
    for images, labels in loader:
        if images.shape[0] != labels.shape[0]:
            raise AssertionError(f"a batch of {images.shape[0]} images and {labels.shape[0]} labels")
        seen += int(labels.shape[0])
    return seen


def quiet() -> None:
    """Skipped samples are logged and warned about, once per input: not wanted at fuzzing speed."""
    logging.getLogger("fastdata").setLevel(logging.CRITICAL)
    warnings.simplefilter("ignore")


def main() -> None:
    import atheris

    # Coverage for the readers and the libraries they parse with; torch and numpy stay plain.
    with atheris.instrument_imports(include=["fastdata", "webdataset", "tarfile", "json"]):
        import fastdata  # noqa: F401
        import fastdata.image.read_shards  # noqa: F401
        import fastdata.sources  # noqa: F401
        import fastdata.sources.tarformat  # noqa: F401
    quiet()
    # libFuzzer ends the process with exit(), past Python's atexit, so a folder made here stays:
    # scripts/fuzz.sh names one inside its $FUZZ_DIR, reused from run to run.
    folder = os.environ.get("FASTDATA_FUZZ_SCRATCH") or tempfile.mkdtemp(prefix="fastdata-tar-fuzz-")
    atheris.Setup(sys.argv, lambda data: check(data, folder))
    atheris.Fuzz()


if __name__ == "__main__":
    main()
