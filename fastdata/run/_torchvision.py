"""`fastdata run` serving image folders natively: the decode, crop and resize of a
`torchvision.datasets.ImageFolder` (or `DatasetFolder`) with torchvision's own image loader, or
timm's ImageDataset of a folder (`fastdata.run._folders`), and a `Compose` of transforms
fastdata can lower (`fastdata.run._lowering`), done by fastdata's image pipeline.

`NativeFolder` is the dataset the served loader's workers read: `__getitems__` (which torch's
fetcher calls with a batch's indices) reads the files named by the dataset's own list (holding
at most `read.MAX_PART_BYTES` of their bytes at once, each part decoded before the next is read),
decodes them (`image.decode.BatchDecoder`: JPEGs natively, other formats and CMYK with Pillow,
as `convert("RGB")`, the conversion torchvision's loader makes) and returns a `Prepared` batch,
which crosses to the main process as uint8; there `_layout.Finish` lays it out as default_collate
would have: `[images, targets]`, the images a contiguous NCHW tensor of the dtype the transform ends
in; for a collate_fn of the script's, where it is fetched, as torchvision's samples: a list of
(CHW tensor, target). Labels are the dataset's, through its `target_transform`. Random
parameters follow torchvision's distributions, drawn per batch from a seed the process's torch
RNG gives (in a worker, the seed torch gave it), as torchvision's transforms draw from it per
sample; a transform without a random op draws nothing, as torchvision's. (An in-memory dataset's
batches take the same way from `fastdata.run._arrays`' subclass.)

Each batch lowers the dataset's transform as it is then, in the process that fetches: a script
may swap it or change an op's attribute between passes (progressive resizing, an eval phase),
and a worker holds the copy of the dataset it started with, as torch's own workers do. A
transform that cannot be lowered then gives the dataset's own samples, collated as DataLoader
collates them, and so does a batch holding a file fastdata does not read (missing, cut, a format
or size past its own limits) or one where an op of the script's changed an image's size or mode
(`_pixels.ScriptOp`): its samples, warnings and errors are then the script's fetch's
(Pillow's, open's); images of different sizes raise torch's stack error (a collate_fn of the
script's is handed fastdata's samples only where they have one size). In workers fastdata
added (the script asked for none), a fetch's error crosses as the batch (`Carried`), and so does
the collation's error for the script's own samples (`CarryingCollate`), each raised in the main
process as the script's own process would have raised it, where torch would re-raise it with its
message rewritten ("Caught ... in DataLoader worker process k").
"""

from __future__ import annotations

import array
import operator
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from .._buffers import new_batch
from .._cores import batch_threads
from .._pillow import pillow_info
from ..errors import DataError, one_line
from ..image.decode import BatchDecoder
from ..image.read import MAX_PART_BYTES, Failures, read_files
from ..sources import Names
from ._erasing import draw, erase
from ._layout import Carried, FolderBatch, FolderViews, Layout, apply_steps, lay_out, picklable
from ._filelist import file_list
from ._folders import first_not_rgb, leaves, listed, locate, lower, must_open, samples_of, target_transform_of
from ._lowering import Lowering, samples_refused, steps_dtype
from ._pixels import NotAPixelOp


class FolderError(DataError):
    """A file of a natively served folder that fastdata cannot read or decode: its batch is then
    the script's own fetch (`NativeFolder._fetch`)."""


class Raise(Failures):
    """A file that cannot be read or decoded raises FolderError naming it and the cause."""

    def __init__(self) -> None:
        super().__init__("raise", "pil")

    def __call__(self, errors: list[tuple[str, str]], path: str, cause: str) -> None:
        raise FolderError(one_line(f"cannot read {path}: {cause} (its folder served natively by fastdata run)"),
                          path=path)


class FolderDecoder(BatchDecoder):
    """The decoder of a natively served folder: images of different sizes in a batch raise what
    default_collate's stack raises on torchvision's samples (CHW tensors, 3 channels)."""

    def draw_keys(self, index: np.ndarray, before: int) -> np.ndarray:
        # Each sample's place in its batch (whose seed is drawn per batch): a sample drawn twice
        # into one batch, as a sampler with replacement may, gets draws of its own, as torchvision's.
        return np.arange(before, before + len(index), dtype=np.int64)

    def mixed_sizes(self, first: str, first_size: tuple, other: str, other_size: tuple, entry: int) -> None:
        (w0, h0), (w, h) = first_size, other_size
        raise RuntimeError(f"stack expects each tensor to be equal size, but got [3, {h0}, {w0}] at entry 0 and "
                           f"[3, {h}, {w}] at entry {entry}")


class NativeFolder(Dataset):
    """The dataset a natively served loader's workers read: the script's torchvision folder
    (`dataset`, or the Subsets, joins and script's wrappers of folders `_folders.leaves` reads
    through), decoded by fastdata per batch (`__getitems__`) as its transform is lowered at that
    batch; a single index is the script's own `dataset[index]`. A batch is a `FolderBatch`, which the loader's collation and `Finish`
    lay out; with `samples` (the script's collate_fn batches them) it is laid out where it is
    fetched, as torchvision's samples: a list of (image, target), each image a CHW tensor."""

    def __init__(self, dataset: Any, lowering: Lowering, carry: bool = False, samples: bool = False) -> None:
        self.dataset = dataset
        self.carry = carry  # a fetch's error crosses as the batch (`Carried`): in workers fastdata added
        self.samples = samples
        self._tables: dict[tuple, torch.Tensor] = {}  # (samples) lay_out's lookup tables
        self.decoder = self._decoder(dataset)
        self._use(lowering)
        self._scratch: list[torch.Tensor] = []  # a view's decoded images (`_images`)
        # The loader's collate_fn's rings (`_hook`), where it is fastdata's: a batch's images are
        # decoded straight into the slot the collation then hands on (`_images`)
        self.rings: Any = None
        # Each folder's samples (one a folder of `leaves(dataset)`) as workers read them
        # (`list_for_workers`): the list, its paths and targets, the items it was made of
        self._listings: list[tuple[list, Names, array.array, list] | None] = []
        self._checked: list[bool] = []  # (a worker) a folder's samples compared with its items, once

    def _decoder(self, dataset: Any) -> Any:  # (made before any worker forks: its record of whole files is shared)
        decoder = FolderDecoder(None, 0, Raise(), slots=1, pin=False, ids=sum(map(len, leaves(dataset))))
        decoder.crop_first = True
        # torchvision's resize is the installed Pillow's: Pillow-SIMD rounds its weights to 16 bits
        decoder.weights = "pillow-simd" if pillow_info()["simd"] else "pillow"
        return decoder

    def _lowered(self, dataset: Any) -> Lowering | None:  # (the transform as this process holds it now)
        return lower(dataset)[0]

    def _use(self, lowering: Lowering) -> None:
        self.lowering = lowering
        self.decoder.geometry, self.decoder.pixel_ops = lowering.geometry, lowering.pixel_ops
        self.decoder.resample = lowering.resample
        # (torch's interpolation of a tensor runs the horizontal pass first; Pillow, its own order)
        self.decoder.order = "horizontal" if lowering.tensor_resize else None

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_scratch": []}

    def list_for_workers(self) -> None:
        """Called in the main process before workers start: each folder's list (`listed`: (str,
        int) pairs, as DatasetFolder and timm's folder reader make it) listed again as `Names`
        and an int64 array, which workers read the batches' paths and targets from. A worker that
        read them from the list would write the reference counts of its tuples, strings and ints,
        and so copy the pages they lie on: over an epoch, the whole list, into every worker (137
        MB a worker at ImageNet's 1.28M samples: benchmarks/listing_memory.py). A listing is made
        again when the list is another or holds other items (compared by identity, so that an
        item replaced by an equal one of another type counts). A worker checks once, at its
        first batch from a folder (after its worker_init_fn), that the folder's list is that list
        and holds those very items (list equality, which passes identical items without
        touching them), and uses the listing only then, and while the list keeps its length."""
        had = self._listings
        self._listings = [_listing(listed(ds), had[k] if k < len(had) else None)
                          for k, ds in enumerate(leaves(self.dataset))]
        self._checked = [False] * len(self._listings)

    def _picked(self, indices: list[int]) -> tuple[list, list[int], list[int]]:
        """(the folders `leaves` finds under the dataset's Subsets and ConcatDatasets, the folder
        of each of `indices` as its number there, the index into that folder), each Subset's
        `indices` and each join's sizes read as their `__getitems__` read them (an index they
        refuse: FolderError, and the batch is the script's own fetch, which raises their error)."""
        found = leaves(self.dataset)
        try:
            located = locate(self.dataset, indices)
        except (IndexError, TypeError, ValueError) as e:
            raise FolderError(f"an index the dataset refuses ({type(e).__name__})") from None
        if len(found) == 1:
            return found, [0] * len(located), [i for _, i in located]
        number = {id(ds): k for k, ds in enumerate(found)}
        numbers = [number.get(id(ds)) for ds, _ in located]
        if None in numbers:  # (a dataset the join reaches that its leaves do not list: one changed meanwhile)
            raise FolderError("the dataset changed while its batch was picked")
        return found, numbers, [i for _, i in located]

    def _samples(self, k: int, ds: Any, indices: list) -> tuple[list[str], list]:
        """The paths and targets of the folder `ds`'s `indices` (`ds` the dataset's `k`th folder):
        from its listing in a worker (`list_for_workers`), else from its list (`listed`), whose
        errors (an index out of range) are the script's; a script's file list's as its code names
        them (an error there: FolderError, and the batch is the script's own fetch)."""
        files = file_list(ds)  # (read once: `samples_of` would read the class again)
        if files is not None:
            try:
                return files.samples(indices)
            except Exception as e:
                raise FolderError(f"{type(ds).__name__}'s samples: {type(e).__name__}") from None
        now = listed(ds)
        listing = self._listings[k] if k < len(self._listings) else None
        if listing is not None and torch.utils.data.get_worker_info() is not None:
            samples, paths, targets, kept = listing
            if not self._checked[k]:  # (a worker_init_fn may have changed the list in place)
                self._checked[k] = True
                if not (now is samples and kept == samples):
                    self._listings[k] = listing = None
            if listing is not None and now is samples and len(samples) == len(paths):
                try:
                    return [paths[i] for i in indices], [targets[i] for i in indices]
                except (IndexError, TypeError):
                    pass
        return samples_of(ds, indices)

    def __getitems__(self, indices: list[int]) -> Any:
        try:
            return self._fetch(indices)
        except Exception as e:
            if not (self.carry and picklable(e)):  # (one that cannot cross as it is: torch's worker re-raises it)
                raise
            return Carried(e)

    def _fetch(self, indices: list[int]) -> Any:
        ds = self.dataset
        lowering = self._lowered(ds)
        if lowering is None or (self.samples and samples_refused(lowering)):
            return [ds[i] for i in indices]  # torchvision's own samples, collated as DataLoader collates them
        try:
            return self._native(indices, lowering)
        except (FolderError, NotAPixelOp):
            pass
        # A file fastdata does not read (missing, cut, a format or a size past its limits, which
        # Pillow may still read as the script set it up), or an op of the script's that changed an
        # image's size or mode (not lowered again in this process): the script's own fetch, whose
        # samples, warnings and errors are then those of the script without fastdata run (outside
        # the except clause: its error does not carry fastdata's as its context).
        return [ds[i] for i in indices]

    def _native(self, indices: list[int], lowering: Lowering) -> Any:
        found, numbers, indices = self._picked(indices)
        if len(found) == 1:
            paths, targets = self._samples(0, found[0], indices)
            index = np.asarray(indices, dtype=np.int64)  # (the record of files that decoded whole: the folder's ids)
        else:  # a join: each folder's samples, back in the batch's order; its ids after the folders before it
            paths, targets, ids = [""] * len(indices), [None] * len(indices), [0] * len(indices)
            rows: dict[int, list[int]] = {}
            for j, k in enumerate(numbers):
                rows.setdefault(k, []).append(j)
            bases = np.cumsum([0] + [len(ds) for ds in found]).tolist()
            for k, picked in rows.items():
                for j, path, target in zip(picked, *self._samples(k, found[k], [indices[j] for j in picked])):
                    paths[j], targets[j], ids[j] = path, target, bases[k] + indices[j]
            index = np.asarray(ids, dtype=np.int64)
        views = lowering.views or (lowering,)  # (a multi-view wrapper's: each view decodes the files again)
        images: list = [None] * len(views)
        handles: list = [None] * len(views)  # (each view's images as the collation hands them on: `_images`)
        ring = None if self.samples or self.rings is None else self.rings.ring()
        must = [must_open(ds) for ds in found]  # (how each file must open: `_decoded`)
        rgb = [must[k] for k in numbers] if any(must) else None
        try:
            seeds = self._decoded(paths, index, views, images, handles, ring, rgb)
            given = [target_transform_of(ds) for ds in found]
            if any(t is not None for t in given):
                targets = [t if given[k] is None else given[k](t) for k, t in zip(numbers, targets)]
            return self._joined([self._batch(x, targets, view, seed, handle) for x, view, seed, handle
                                 in zip(images, views, seeds, handles)], targets, lowering)
        except BaseException:
            if ring is not None:  # (no batch: the slot's leaves it took are free again, the claim ended)
                ring.drop(handles)
            raise

    def _decoded(self, paths: list, index: np.ndarray, views: tuple, images: list, handles: list,
                 ring: Any, rgb: list | None = None) -> list[int]:
        """Decodes each view's images of the files at `paths` into `images` (`_images`' buffers,
        as the collation hands them on in `handles`); returns the seed each view drew. Where
        `rgb[j]` ("rgb" or "jpeg": `_folders.must_open`), the file must open so (fastdata decodes
        each as RGB), else FolderError: the batch is the script's own fetch."""
        seeds, likes, done = [0] * len(views), [None] * len(views), 0
        while done < len(paths):
            # The files in parts of at most read.MAX_PART_BYTES (one but for batches of large
            # files), each decoded into its rows of the batch before the next is read. Every
            # error raises, so the batch has a row for each index.
            part = self._read(paths[done:])
            n = len(part)
            for kind in ("rgb", "jpeg") if rgb is not None else ():
                rows = [j for j in range(n) if rgb[done + j] == kind]
                odd = first_not_rgb([part[j] for j in rows], kind == "jpeg") if rows else None
                if odd is not None:
                    raise FolderError(f"{paths[done + rows[odd]]} does not open as its dataset's others must "
                                      f"({kind}), and the dataset does not convert it")
            for v, view in enumerate(views):
                self._use(view)
                if view.random and not done:
                    # One seed a batch (and view) from this process's torch RNG: torchvision's random
                    # transforms draw from it per sample, and a worker's is seeded by the DataLoader.
                    seeds[v] = int(torch.randint(0, 2**62, (), dtype=torch.int64))
                self.decoder.seed = seeds[v]
                errors: list[tuple[str, str]] = []
                like = likes[v]
                c = self.decoder.check(0, index[done:done + n], paths[done:done + n], part, np.zeros(n, np.int64),
                                       errors, like=like)
                if images[v] is None:
                    w, h = c.size
                    images[v], handles[v] = self._images(v, len(paths), h, w, ring, len(views) == 1)
                likes[v] = (paths[0], c.size, done + n) if like is None else (*like[:2], done + n)
                self.decoder.fill(images[v][done:done + n], c, 0, errors)
                del c
            del part  # its bytes go before the next part's are read
            done += n
        return seeds

    def _joined(self, batches: list, targets: list, lowering: Lowering) -> Any:
        """The batch of a lowering's views (`_batch` each): the one view's batch as it is; a
        multi-view wrapper's samples each the list of its views, as the wrapper gives them."""
        if not lowering.views:
            return batches[0]
        if self.samples:
            return [([b[k][0] for b in batches], target) for k, target in enumerate(targets)]
        return FolderViews(batches, targets)

    def _batch(self, images: torch.Tensor, targets: list, lowering: Lowering, seed: int, handle: Any = None) -> Any:
        """The batch of uint8 NHWC `images` (drawn from `seed`; `handle`: as a slot hands them on)
        and `targets` (the dataset's, through its target_transform)."""
        # RandomErasing's rectangles, drawn here as numbers (keyed as `FolderDecoder.draw_keys`);
        # the main process writes them over the laid-out batch
        erased = draw(lowering.erasing, seed, np.arange(len(images)), *images.shape[1:3]) if lowering.erasing else ()
        if self.samples:
            n, h, w, c = images.shape
            dtype, plain = steps_dtype(lowering.steps), Layout(lowering.steps)
            # each sample its own tensor, as torchvision's: one the collate_fn keeps holds only itself
            outs = [torch.empty((c, h, w), dtype=dtype) for _ in range(n)]
            for k in range(n):
                lay_out(images[k:k + 1], plain, outs[k][None], self._tables)
            if erased:
                erase(outs, lowering.steps, erased, seed, apply_steps)
            return list(zip(outs, targets))
        return FolderBatch(images, targets, lowering.steps, erased, seed if erased else 0, handle)

    def _read(self, paths: list[str]) -> list:
        """The first files of `paths` whose sizes add up to at most MAX_PART_BYTES (at least one);
        a file that cannot be read raises (`Raise`), naming it."""
        datas = read_files(paths, batch_threads(self.decoder.threads), MAX_PART_BYTES)
        n = next((j for j, data in enumerate(datas) if data is None), len(datas))
        for path, data in zip(paths, datas[:n]):
            if isinstance(data, str):
                self.decoder.fail([], path, data)
        return datas[:n]

    def _images(self, view: int, n: int, h: int, w: int, ring: Any, alone: bool) -> tuple[torch.Tensor, Any]:
        """(uint8 [n, h, w, 3] to decode the view into, how the collation hands it on): with
        `ring` (the collate function's, in this process), the buffer of a slot of it that the
        collation then hands on as it is, no copy (the slot made large enough for the labels too
        where the view is `alone`); else this process's scratch for the view, None (reused: the
        collation copies the batch into its buffers right after it is decoded, in this process)."""
        if ring is not None:
            return new_batch(ring, (n, h, w, 3), torch.uint8, reserve=n * h * w * 3 + 16 * n if alone else 0)
        need = n * h * w * 3
        scratch = self._scratch
        while len(scratch) <= view:
            scratch.append(torch.empty(0, dtype=torch.uint8))
        if scratch[view].numel() < need:
            scratch[view] = torch.empty(need, dtype=torch.uint8)
        return scratch[view][:need].view(n, h, w, 3), None


def _listing(samples: Any, had: tuple | None) -> tuple[list, Names, array.array, list] | None:
    """A folder's listing (`NativeFolder.list_for_workers`) of its list `samples`: `had` where
    that was made of this list and its very items; None where the list is not (str, int) pairs."""
    if type(samples) is not list:
        return None
    if had is not None and had[0] is samples and len(had[3]) == len(samples) and all(map(operator.is_, had[3],
                                                                                        samples)):
        return had
    if not all(type(s) is tuple and len(s) == 2 and type(s[0]) is str and type(s[1]) is int for s in samples):
        return None
    try:
        targets = array.array("q", [target for _, target in samples])
    except OverflowError:  # a target past int64: read from the list
        return None
    return samples, Names([path for path, _ in samples]), targets, list(samples)
