"""An ImageFolder whose symlinks loop: the listing follows links, as torchvision's ImageFolder
does, but enters each folder once, so a link back to an ancestor neither repeats samples nor
makes the walk exponential, and says so in one warning; a link to a folder above the root (`/`)
is not entered. A tree deeper than Python's recursion limit is listed whole."""

from __future__ import annotations

import os
import shutil
import sys
import warnings

import pytest
from _images import color_folder

import fastdata
from fastdata import transforms as T
from fastdata.shard import read_index, write_shards
from fastdata.sources import image_folder


@pytest.fixture
def folder(tmp_path):
    return color_folder(tmp_path / "imgs", 2, 2, (20, 30), lambda i: f"{i:03d}.jpg")


def _listed(root):
    """(the samples' file names, relative to `root`, with their labels; the warnings)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        samples = image_folder(root)
    names = [(os.path.relpath(p, root), int(label)) for p, label in zip(samples.paths, samples.labels)]
    return names, [str(w.message) for w in caught]


PLAIN = [("class0/000.jpg", 0), ("class0/001.jpg", 0), ("class1/000.jpg", 1), ("class1/001.jpg", 1)]


def test_a_link_to_its_own_folder_lists_each_image_once(folder):
    (folder / "class0" / "loop").symlink_to(".")
    names, warned = _listed(folder)
    assert names == PLAIN  # without the check: each image of class0 ~40 times, to ELOOP's depth
    [line] = warned
    assert os.path.join(str(folder), "class0", "loop") in line and "already entered" in line


@pytest.mark.timeout(30)
def test_two_loops_do_not_explode(folder):
    # two self-links: 2**depth paths to ELOOP's depth without the check
    for name in ("l1", "l2"):
        (folder / "class0" / name).symlink_to(".")
    (folder / "class1" / "up").symlink_to("..")  # the root: every class again, under class1
    (folder / "class1" / "sub").mkdir()
    (folder / "class1" / "sub" / "back").symlink_to("../..")  # class1 itself, from below
    names, warned = _listed(folder)
    assert names == PLAIN
    [line] = warned  # one warning a listing, naming the first link
    assert os.path.join(str(folder), "class0", "l1") in line and "and 3 more" in line


def test_links_to_other_folders_are_still_followed(folder, tmp_path):
    outside = color_folder(tmp_path / "outside", 1, 1, (20, 30), lambda i: f"x{i}.jpg") / "class0"
    (folder / "class1" / "linked").symlink_to(outside)  # a linked folder, reached once
    (folder / "class2").symlink_to(outside)  # a linked class folder
    names, warned = _listed(folder)
    assert names == PLAIN[:2] + [("class1/000.jpg", 1), ("class1/001.jpg", 1), ("class1/linked/x0.jpg", 1),
                                 ("class2/x0.jpg", 2)]
    assert warned == []


def test_a_looped_folder_loads_and_shards_each_image_once(folder, tmp_path):
    (folder / "class0" / "loop").symlink_to(".")
    with pytest.warns(UserWarning, match="already entered"):
        loader = fastdata.loader(str(folder), batch_size=2, transform=T.Compose([T.Resize(8), T.CenterCrop(8)]),
                                 backend="pil", device="cpu")
    labels = [int(v) for _, batch in loader for v in batch]
    assert sorted(labels) == [0, 0, 1, 1]
    # fastdata-shard lists a folder with the same function
    with pytest.warns(UserWarning, match="already entered"):
        index = write_shards(folder, tmp_path / "out" / "s-%06d.tar", workers=1)
    assert read_index(index)["total"] == 4


def _chain(top, depth: int) -> list[str]:
    """`depth` nested folders a/a/.../a under `top` (os.makedirs recurses once a level), their
    paths from the shallowest."""
    paths, path = [], os.fspath(top)
    for _ in range(depth):
        path = os.path.join(path, "a")
        os.mkdir(path)
        paths.append(path)
    return paths


def _unchain(paths: list[str]) -> None:
    """Removes what `_chain` made and what its folders hold (shutil.rmtree recurses once a
    level too, so pytest could not remove the tree)."""
    for path in reversed(paths):
        for entry in os.scandir(path):
            os.unlink(entry.path)
        os.rmdir(path)


def test_a_tree_deeper_than_the_recursion_limit_is_listed(tmp_path):
    # os.walk of Python < 3.12 recurses once a level: RecursionError naming no folder
    root = color_folder(tmp_path / "imgs", 2, 2, (20, 30), lambda i: f"{i:03d}.jpg")
    depth = sys.getrecursionlimit() + 100
    chain = _chain(root / "class0", depth)
    try:
        assert len(chain[-1]) < 4000  # within PATH_MAX: every path of it can be opened
        deep = [chain[depth // 2], chain[-1]]
        for n, path in enumerate(deep):
            shutil.copy(root / "class1" / f"{n:03d}.jpg", os.path.join(path, f"deep{n}.jpg"))
        os.symlink(".", os.path.join(chain[-1], "loop"))  # loops at the bottom end too
        os.symlink(os.fspath(root / "class0"), os.path.join(chain[-1], "top"))
        names, warned = _listed(root)
        assert names == PLAIN[:2] + [(os.path.relpath(p, root) + f"/deep{n}.jpg", 0) for n, p in enumerate(deep)] + \
            PLAIN[2:]
        [line] = warned
        assert os.path.join(chain[-1], "loop") in line and "and 1 more" in line
        # the images themselves: pixels of class 1 (copied), labels of the class they are in
        with pytest.warns(UserWarning, match="already entered"):
            loader = fastdata.loader(str(root), batch_size=6, transform=T.Compose([T.Resize(8), T.CenterCrop(8)]),
                                     backend="pil", device="cpu", shuffle=False)
        [(images, labels)] = list(loader)
        red = images[:, 0, 4, 4].tolist()
        assert labels.tolist() == [0, 0, 0, 0, 1, 1]
        assert [round((r - 20) / 40) for r in red] == [0, 0, 1, 1, 1, 1]
    finally:
        _unchain(chain)


@pytest.mark.timeout(30)
def test_a_link_above_the_root_is_not_entered(folder, tmp_path):
    # the folder above `root` (and `/`) hold the listing: entered, they would list `other`'s
    # images, and the whole file system, into class0
    color_folder(tmp_path / "other", 1, 1, (20, 30), lambda i: f"{i:03d}.jpg")
    (folder / "class0" / "parent").symlink_to(tmp_path)
    (folder / "class1" / "slash").symlink_to("/")
    (folder / "class2").symlink_to(".")  # a class folder that is the root: an empty class
    names, warned = _listed(folder)
    assert names == PLAIN
    [line] = warned
    assert os.path.join(str(folder), "class0", "parent") in line and "and 2 more" in line


def test_a_folder_that_cannot_be_listed_is_said_so(folder, monkeypatch):
    """A folder the listing cannot read (permissions, an I/O error, gone) is left out, as
    ImageFolder's os.walk leaves it out, but said in one warning naming it and the cause: its
    images are not lost without a word. (Faked with os.scandir: these tests may run as root,
    which reads any folder.)"""
    (folder / "class1" / "sub").mkdir()
    shutil.copy(folder / "class1" / "000.jpg", folder / "class1" / "sub" / "002.jpg")
    names, warned = _listed(folder)
    assert names == PLAIN + [("class1/sub/002.jpg", 1)] and not warned
    real = os.scandir
    refused = {str(folder / "class1" / "sub"), str(folder / "class0")}

    def scandir(path="."):
        if os.fspath(path) in refused:
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    names, warned = _listed(folder)
    assert names == PLAIN[2:]
    [line] = warned
    assert repr(str(folder / "class0")) in line and "(PermissionError: Permission denied) (and 1 more)" in line
    assert "left out" in line and "\n" not in line
