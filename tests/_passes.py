"""What the loader tests share: a pass over a loader as a script that catches each batch's error
sees it."""

import pytest


def steps(loader) -> list:
    """Each batch's labels (a list), or (the error's type, its message) for a batch that raised,
    the pass going on after it as DataLoader's does, to its end; a served loader stopped after."""
    out, it = [], iter(loader)
    for _ in range(len(loader)):
        try:
            out.append(next(it)[1].tolist())
        except Exception as e:  # the error, and the pass goes on
            out.append((type(e), str(e)))
    with pytest.raises(StopIteration):
        next(it)
    stop = getattr(loader, "_stop", None)  # (fastdata's: its workers end now, not at garbage collection)
    if stop is not None:
        stop()
    return out
