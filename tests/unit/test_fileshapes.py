"""The shapes of a file list's `__getitem__` (`fastdata.run._fileshapes`): a class's code is compared
only with the shapes it could be, and skipping the others changes no reading.

The shapes are written out by the running interpreter's compiler; `shapes_of` writes out only those
whose parts (a frame's source, a join, a guard) need what the class's code has (`_features`). Here
each shape's own code is read as a class's would be, once so and once with every shape written out.
"""

from __future__ import annotations

import pytest

from fastdata.run import _fileshapes as fs
from fastdata.run._filelist import _FIXED

_BASE = {"family": "", "opens": "convert", "target": "", "leads": (), "join": "os", "mapped": False, "rows": False}
# (each part `shapes_of` skips by what the code has: the frame's sources, the guards and the target_transform's,
# a with's exit jumps, the index lead's, a row's attributes, the mapping's label, and joins of each kind)
_COMBOS = [_BASE, {**_BASE, "target": "if"}, {**_BASE, "target": "not_none"}, {**_BASE, "leads": ("doc", "index")},
           {**_BASE, "opens": "with"}, {**_BASE, "opens": "with_image"}, {**_BASE, "rows": True},
           {**_BASE, "mapped": True}, {**_BASE, "join": "slash", "family": "long"},
           {**_BASE, "join": "text_os", "family": "int"}]


def _spec(shapes) -> set:
    return {(s.picked, s.path_only, s.opens, s.guard, s.target) for s in shapes}


@pytest.mark.timeout(120)
def test_a_code_is_read_as_one_of_the_shapes_it_could_be_and_the_skipped_ones_it_could_not(monkeypatch):
    features = fs._features
    every = lambda code: features(code) | fs.EVERY | {"os", "path", "join"}  # noqa: E731 (every shape written out)
    checked = 0
    try:
        for combo in _COMBOS:
            doc = "doc" in combo["leads"]
            for shapes in fs._written(*combo.values(), has=fs.EVERY).values():
                code = shapes[0].__getitem__.__code__
                fs.shapes_of.cache_clear()
                monkeypatch.setattr(fs, "_features", every)
                whole = fs.shapes_of(code, doc)
                fs.shapes_of.cache_clear()
                monkeypatch.setattr(fs, "_features", features)
                read = _spec(fs.shapes_of(code, doc))
                assert read and read <= _spec(whole), (combo, shapes[0].picked)
                # (each shape skipped reads a name the code does not, which `_views.read_shape` would refuse)
                for skipped in [s for s in whole if not _spec([s]) <= read]:
                    assert set(skipped.__getitem__.__code__.co_names) & set(_FIXED) - set(code.co_names), skipped.picked
                checked += 1
    finally:
        fs.shapes_of.cache_clear()
        fs._written.cache_clear()
    assert checked > 5000
