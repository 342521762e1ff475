"""`fastdata run` serving a script's own Dataset that opens its image files by path with Pillow
(`fastdata.run._filelist`): read by its code, decoded by fastdata, the batches torchvision's.

It builds transforms with torchvision, so it runs where torchvision is installed (.ci/run's
virtualenv made as a user's, which has pandas too for the CSV frame's shape). The datasets are
written here as scripts write them, at module level (their `Image` and `os` the modules imported
above, as a script's are).
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import Dataset

from fastdata.run import _torchvision as rt

try:  # (the datasets that read their files with torchvision; the tests that make them skip without it)
    from torchvision.datasets.folder import default_loader
    from torchvision.io import ImageReadMode, read_image
except ImportError:
    pass
from _images import blue_folder
from _passes import steps

SCRIPTS = Path(__file__).resolve().parents[1] / "run_scripts"


@pytest.fixture(scope="module")
def tv():
    return pytest.importorskip("torchvision")


@pytest.fixture(scope="module")
def folder(tmp_path_factory, tv):
    return blue_folder(tmp_path_factory.mktemp("files"))


def _listing(folder: Path) -> tuple[list[str], list[int]]:
    """The folder's files and their classes (class c in the folder class{c})."""
    paths = sorted(str(p) for p in folder.rglob("*.jpg"))
    return paths, [int(Path(p).parent.name[len("class"):]) for p in paths]


def _class_of(images: torch.Tensor) -> torch.Tensor:
    """Each image's class, read from its blue channel (about 55 + 50c: `blue_folder`)."""
    blue = images[:, 2].float() * (255 if images.is_floating_point() else 1)
    return ((blue.mean(dim=(1, 2)) - 55) / 50).round().long()


def _served(dataset, **kwargs):
    from fastdata.run._hook import Served

    return Served(dataset, **kwargs)


def _transforms():
    import torchvision.transforms as T

    return (T.Compose([T.Resize((20, 16)), T.ToTensor()]),
            T.Compose([T.Resize((24, 24)), T.CenterCrop((20, 16)), T.PILToTensor()]))


class Files(Dataset):  # a list of paths and one of labels
    def __init__(self, paths, labels, transform=None):
        self.image_paths, self.labels, self.transform = paths, labels, transform

    def __len__(self):
        return len(self.image_paths)

    def __getitem__(self, idx):
        image = Image.open(self.image_paths[idx]).convert("RGB")
        label = self.labels[idx]
        if self.transform:
            image = self.transform(image)
        return image, label


class Rooted(Dataset):  # names under a root, the label first, the path bound to a local
    def __init__(self, root, names, targets, transform=None):
        self.root, self.names, self.targets, self.tf = root, names, targets, transform

    def __len__(self):
        return len(self.names)

    def __getitem__(self, index):
        target = self.targets[index]
        img_path = os.path.join(self.root, self.names[index])
        img = Image.open(img_path).convert('RGB')
        if self.tf is not None:
            img = self.tf(img)
        return img, target


class Named(Rooted):  # the file's name bound, then joined to the root
    def __getitem__(self, index):
        img_name = self.names[index]
        img_path = os.path.join(self.root, img_name)
        image = Image.open(img_path).convert("RGB")
        label = self.targets[index]
        if self.tf:
            image = self.tf(image)
        return image, label


class Pairs(Dataset):  # (path, label) pairs, the transform in the return
    def __init__(self, samples, transform):
        self.samples, self.transform = samples, transform

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        path, y = self.samples[i]
        x = Image.open(path).convert("RGB")
        return self.transform(x), y


class Late(Files):  # the label read after the transform, always applied
    def __getitem__(self, idx):
        image = Image.open(self.image_paths[idx]).convert("RGB")
        image = self.transform(image)
        label = self.labels[idx]
        return image, label


class Tensors(Files):  # the label made a tensor in the return
    def __getitem__(self, idx):
        img_path = self.image_paths[idx]
        image = Image.open(img_path).convert("RGB")
        label = self.labels[idx]
        if self.transform:
            image = self.transform(image)
        return image, torch.tensor(label)


class Longs(Files):  # the label made a tensor of int64 where it is bound
    def __getitem__(self, idx):
        label = torch.tensor(self.labels[idx], dtype=torch.long)
        image = Image.open(self.image_paths[idx]).convert("RGB")
        if self.transform is not None:
            image = self.transform(image)
        return image, label


class Ints(Files):  # the label made an int
    def __getitem__(self, idx):
        image = Image.open(self.image_paths[idx]).convert("RGB")
        return self.transform(image), int(self.labels[idx])


class AsIs(Files):  # the image as the file opens (RGB for these JPEGs)
    def __getitem__(self, idx):
        image = Image.open(self.image_paths[idx])
        label = self.labels[idx]
        if self.transform:
            image = self.transform(image)
        return image, label


class Converted(Files):  # converted in a statement of its own
    def __getitem__(self, idx):
        image = Image.open(self.image_paths[idx])
        image = image.convert("RGB")
        if self.transform is not None:
            image = self.transform(image)
        return image, self.labels[idx]


class Documented(Files):  # a docstring, the PyTorch tutorial's line for a tensor index, a label of int64
    def __getitem__(self, idx):
        """One image and its class."""
        if torch.is_tensor(idx):
            idx = idx.tolist()
        image = Image.open(self.image_paths[idx]).convert("RGB")
        if self.transform:
            image = self.transform(image)
        return image, torch.tensor(self.labels[idx], dtype=torch.int64)


class Rebound(Rooted):  # the path bound to the name the image is bound to next
    def __getitem__(self, index):
        sample = os.path.join(self.root, self.names[index])
        sample = Image.open(sample).convert("RGB")
        target = self.targets[index]
        if self.tf:
            sample = self.tf(sample)
        return sample, target


class Slashed(Rooted):  # names under a pathlib root, joined with `/`
    def __getitem__(self, index):
        image = Image.open(self.root / self.names[index]).convert("RGB")
        if self.tf:
            image = self.tf(image)
        return image, self.targets[index]


class Mapped(Files):  # class names in the list, mapped to their numbers by a dict
    def __init__(self, paths, names, class_to_idx, transform=None):
        super().__init__(paths, names, transform)
        self.class_to_idx = class_to_idx

    def __getitem__(self, idx):
        label = self.class_to_idx[self.labels[idx]]
        image = Image.open(self.image_paths[idx]).convert("RGB")
        if self.transform:
            image = self.transform(image)
        return image, label


class Opened(Pairs):  # torchvision's pil_loader written in: the file opened first, then by Pillow
    def __getitem__(self, index):
        path, target = self.samples[index]
        with open(path, "rb") as f:
            img = Image.open(f)
            img = img.convert("RGB")
        if self.transform is not None:
            img = self.transform(img)
        return img, target


class OpenedMapped(Mapped):  # the same, Pillow's image bound to another name, the mapped label a tensor
    def __getitem__(self, idx):
        with open(self.image_paths[idx], 'rb') as f:
            img = Image.open(f)
            sample = img.convert('RGB')
        if self.transform:
            sample = self.transform(sample)
        return sample, torch.tensor(self.class_to_idx[self.labels[idx]])


class Texted(Rooted):  # names under a root, joined in an f-string
    def __getitem__(self, index):
        img_path = f"{self.root}/{self.names[index]}"
        image = Image.open(img_path).convert("RGB")
        if self.tf:
            image = self.tf(image)
        return image, self.targets[index]


class Suffixed(Rooted):  # names without their extension under a root, the extension added
    def __getitem__(self, index):
        img_path = os.path.join(self.root, self.names[index] + ".jpg")
        image = Image.open(img_path).convert("RGB")
        label = self.targets[index]
        if self.tf:
            image = self.tf(image)
        return image, label


class Extended(Suffixed):  # the joined name bound, its extension added in the open, opened as it is
    def __getitem__(self, index):
        img_name = os.path.join(self.root, self.names[index])
        image = Image.open(img_name + ".jpg")
        label = self.targets[index]
        if self.tf:
            image = self.tf(image)
        return image, label


class Read(Files):  # torchvision.io's uint8 tensor of each file
    def __getitem__(self, idx):
        image = read_image(self.image_paths[idx])
        label = self.labels[idx]
        if self.transform:
            image = self.transform(image)
        return image, label


class ReadRGB(Files):
    def __getitem__(self, idx):
        img_path = self.image_paths[idx]
        image = read_image(img_path, ImageReadMode.RGB)
        return self.transform(image), self.labels[idx]


class Frame(Dataset):  # the PyTorch tutorial's CustomImageDataset, opening its files with Pillow
    def __init__(self, img_labels, img_dir, transform=None):
        self.img_labels, self.img_dir, self.transform = img_labels, img_dir, transform

    def __len__(self):
        return len(self.img_labels)

    def __getitem__(self, idx):
        img_path = os.path.join(self.img_dir, self.img_labels.iloc[idx, 0])
        image = Image.open(img_path).convert("RGB")
        label = self.img_labels.iloc[idx, 1]
        if self.transform:
            image = self.transform(image)
        return image, label


class CustomImageDataset(Dataset):  # the PyTorch tutorial's ("Datasets & DataLoaders"), as it is written there
    def __init__(self, img_labels, img_dir, transform=None, target_transform=None):
        self.img_labels = img_labels
        self.img_dir = img_dir
        self.transform = transform
        self.target_transform = target_transform

    def __len__(self):
        return len(self.img_labels)

    def __getitem__(self, idx):
        img_path = os.path.join(self.img_dir, self.img_labels.iloc[idx, 0])
        image = read_image(img_path)
        label = self.img_labels.iloc[idx, 1]
        if self.transform:
            image = self.transform(image)
        if self.target_transform:
            label = self.target_transform(label)
        return image, label


class Rows(Frame):  # a frame's row by position, then its columns by name
    def __getitem__(self, idx):
        img_path = os.path.join(self.img_dir, self.img_labels.iloc[idx]["file"])
        label = self.img_labels.iloc[idx]["label"]
        image = Image.open(img_path).convert("RGB")
        if self.transform:
            image = self.transform(image)
        return image, label


class Row(Frame):  # the row bound to a local
    def __getitem__(self, idx):
        row = self.img_labels.iloc[idx]
        image = Image.open(os.path.join(self.img_dir, row["file"])).convert("RGB")
        label = row["label"]
        if self.transform is not None:
            image = self.transform(image)
        return image, label


class Attributes(Frame):  # the row's columns read as its attributes
    def __getitem__(self, idx):
        row = self.img_labels.iloc[idx]
        image = Image.open(os.path.join(self.img_dir, row.file)).convert("RGB")
        label = row.label
        if self.transform is not None:
            image = self.transform(image)
        return image, label


class Attribute(Frame):  # so, of the row not bound, the label made a tensor
    def __getitem__(self, idx):
        img_path = os.path.join(self.img_dir, self.img_labels.iloc[idx].file)
        image = Image.open(img_path).convert("RGB")
        label = torch.tensor(self.img_labels.iloc[idx].label)
        if self.transform:
            image = self.transform(image)
        return image, label


class Loc(Frame):  # the frame's rows by their labels
    def __getitem__(self, idx):
        path = os.path.join(self.img_dir, self.img_labels.loc[idx, "file"])
        image = Image.open(path).convert("RGB")
        image = self.transform(image)
        return image, self.img_labels.loc[idx, "label"]


class Columns(Frame):  # a column, then its row
    def __getitem__(self, idx):
        image = Image.open(os.path.join(self.img_dir, self.img_labels["file"][idx])).convert("RGB")
        label = self.img_labels["label"][idx]
        return self.transform(image), label


class Annotated(Frame):  # the label made an int, then a tensor (a much-copied video tutorial's)
    def __getitem__(self, index):
        img_path = os.path.join(self.img_dir, self.img_labels.iloc[index, 0])
        image = Image.open(img_path).convert("RGB")
        y_label = torch.tensor(int(self.img_labels.iloc[index, 1]))
        if self.transform:
            image = self.transform(image)
        return (image, y_label)


class Classes(Frame):  # the frame's class names, mapped to their numbers by a dict
    def __getitem__(self, idx):
        img_path = os.path.join(self.img_dir, self.img_labels.iloc[idx, 0])
        image = Image.open(img_path).convert("RGB")
        label = self.class_to_idx[self.img_labels.iloc[idx, 1]]
        if self.transform:
            image = self.transform(image)
        return image, label


class Stems(Frame):  # the frame's names without their extension, made paths in an f-string
    def __getitem__(self, idx):
        image = Image.open(f"{self.img_dir}/{self.img_labels.iloc[idx]['stem']}.jpg").convert("RGB")
        label = self.img_labels.iloc[idx]["label"]
        if self.transform:
            image = self.transform(image)
        return image, label


class Derived(Rooted):  # the label derived from the name the list gives (Kaggle's dogs and cats keep theirs so)
    def __getitem__(self, index):
        img_name = self.names[index]
        img_path = os.path.join(self.root, img_name)
        label = int(img_name.split("/")[0].lower()[len("class"):])
        image = Image.open(img_path).convert("RGB")
        if self.tf:
            image = self.tf(image)
        return image, label


class Chained(Rooted):  # derived from the path it opens, by an if chain
    def __getitem__(self, index):
        img_path = os.path.join(self.root, self.names[index])
        img = Image.open(img_path).convert("RGB")
        label = os.path.basename(os.path.dirname(img_path))
        if label == "class0":
            label = 0
        elif label == "class1" or label.endswith("1"):
            label = 1
        else:
            label = 2 if "class2" in label else 3
        if self.tf is not None:
            img = self.tf(img)
        return img, label


class Tabled(Rooted):  # its folder's name looked up in a dict of the instance's, made a tensor; Pillow's image a context
    def __getitem__(self, index):
        img_path = os.path.join(self.root, self.names[index])
        with Image.open(img_path) as img:
            image = img.convert("RGB")
        label = self.targets[img_path.split("/")[-2]]
        if self.tf is not None:
            image = self.tf(image)
        return image, torch.tensor(label)


class Indexed(Rooted):  # its class's place in a list of the instance's
    def __getitem__(self, index):
        img_name = self.names[index]
        label = self.targets.index(img_name.split("/")[0])
        image = Image.open(os.path.join(self.root, img_name)).convert("RGB")
        if self.tf:
            image = self.tf(image)
        return image, label


class Added(Rooted):  # names added to a root that ends in "/", the path bound to the name's own local
    def __getitem__(self, index):
        img_path = self.names[index]
        img_path = self.root + img_path
        image = Image.open(img_path).convert("RGB")
        label = self.targets[index]
        if self.tf:
            image = self.tf(image)
        return image, label


class Prefixed(Rooted):  # a text before each name (here the first "/" of an absolute path)
    def __getitem__(self, index):
        image = Image.open("/" + self.names[index]).convert("RGB")
        if self.tf is not None:
            image = self.tf(image)
        return image, self.targets[index]


class Sep(Rooted):  # a root, a "/" and the name
    def __getitem__(self, index):
        path = self.root + "/" + self.names[index]
        image = Image.open(path).convert("RGB")
        if self.tf is not None:
            image = self.tf(image)
        return image, self.targets[index]


class Under(Rooted):  # names under a folder (a text) under the root
    def __getitem__(self, index):
        img_path = os.path.join(self.root, ".", self.names[index])
        image = Image.open(img_path).convert("RGB")
        label = self.targets[index]
        if self.tf:
            image = self.tf(image)
        return image, label


class Splits(Rooted):  # names under the split's folder under the root
    def __init__(self, root, split, names, targets, transform=None):
        super().__init__(root, names, targets, transform)
        self.split = split

    def __getitem__(self, index):
        image = Image.open(os.path.join(self.root, self.split, self.names[index])).convert("RGB")
        if self.tf is not None:
            image = self.tf(image)
        return image, self.targets[index]


class Contexted(Files):  # Pillow's image opened as a context, converted within it
    def __getitem__(self, idx):
        img_path = self.image_paths[idx]
        with Image.open(img_path) as img:
            image = img.convert("RGB")
        if self.transform is not None:
            image = self.transform(image)
        label = self.labels[idx]
        return image, label


def find_classes(directory):  # (the course's own helper, at module level as it writes it)
    classes = sorted(entry.name for entry in os.scandir(directory) if entry.is_dir())
    return classes, {name: i for i, name in enumerate(classes)}


class ImageFolderCustom(Dataset):  # a PyTorch course's, much copied: a method opens the image, the label its folder's
    def __init__(self, targ_dir: str, transform=None) -> None:
        self.paths = sorted(pathlib.Path(targ_dir).glob("*/*.jpg"))
        self.transform = transform
        self.classes, self.class_to_idx = find_classes(targ_dir)

    def load_image(self, index: int) -> Image.Image:
        "Opens an image via a path and returns it."
        image_path = self.paths[index]
        return Image.open(image_path)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        "Returns one sample of data, data and label (X, y)."
        img = self.load_image(index)
        class_name = self.paths[index].parent.name  # expects path in data_folder/class_name/image.jpeg
        class_idx = self.class_to_idx[class_name]

        # Transform if necessary
        if self.transform:
            return self.transform(img), class_idx  # return data, label (X, y)
        else:
            return img, class_idx  # return data, label (X, y)


class Parented(Rooted):  # pathlib paths, the label their folder's looked up in a dict
    def __getitem__(self, index):
        path = self.names[index]
        image = Image.open(path).convert("RGB")
        label = self.targets[path.parent.name]
        if self.tf is not None:
            image = self.tf(image)
        return image, label


class Pathed(Rooted):  # strs made paths for their folder's name, its place in a list
    def __getitem__(self, index):
        img_path = os.path.join(self.root, self.names[index])
        label = self.targets.index(Path(img_path).parent.name)
        image = Image.open(img_path).convert("RGB")
        if self.tf:
            image = self.tf(image)
        return image, label


class Loaded(Files):  # a method of its own that opens and converts the image, the label a list's, returned in the if
    def _load(self, i):
        return Image.open(self.image_paths[i]).convert("RGB")

    def __getitem__(self, idx):
        image = self._load(idx)
        label = self.labels[idx]
        if self.transform is not None:
            return self.transform(image), label
        return image, label


class GreyLoaded(Loaded):  # another conversion, in its method
    def _load(self, i):
        return Image.open(self.image_paths[i]).convert("L")


def pil_loader(path):  # torchvision's, copied into the script as scripts copy it
    with open(path, "rb") as f:
        img = Image.open(f)
        return img.convert("RGB")


class Copied(Pairs):  # opens each file with its copy of torchvision's pil_loader
    def __getitem__(self, i):
        path, y = self.samples[i]
        x = pil_loader(path)
        if self.transform is not None:
            x = self.transform(x)
        return x, y


class Imported(Files):  # torchvision's own default_loader imported by name, given the path read in place
    def __getitem__(self, idx):
        image = default_loader(self.image_paths[idx])
        label = self.labels[idx]
        if self.transform:
            image = self.transform(image)
        return image, label


def image_loader(path):  # the script's own loader, a much-copied file-list Dataset's default
    return Image.open(path).convert("RGB")


class Joined(Dataset):  # (name, label) pairs under a root, the joined path bound first
    def __init__(self, root, samples, transform):
        self.root, self.samples, self.transform = root, samples, transform

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, idx):
        name, label = self.samples[idx]
        img_path = os.path.join(self.root, name)
        image = Image.open(img_path).convert("RGB")
        if self.transform:
            image = self.transform(image)
        return image, label


def grey_loader(path):
    return Image.open(path).convert("L")


class Filelist(Dataset):  # that Dataset: (name, label) pairs under a root, opened by the loader it holds
    def __init__(self, root, flist, transform=None, target_transform=None, loader=image_loader):
        self.root = root
        self.imlist = flist
        self.transform = transform
        self.target_transform = target_transform
        self.loader = loader

    def __getitem__(self, index):
        impath, target = self.imlist[index]
        img = self.loader(os.path.join(self.root, impath))
        if self.transform is not None:
            img = self.transform(img)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return img, target

    def __len__(self):
        return len(self.imlist)


class Labelled(Rooted):  # its label from a method of its own given the path, derived from the folder's name
    def label_of(self, path):
        return self.targets[os.path.basename(os.path.dirname(path))]

    def __getitem__(self, index):
        path = os.path.join(self.root, self.names[index])
        image = Image.open(path).convert("RGB")
        label = self.label_of(path)
        if self.tf:
            image = self.tf(image)
        return image, label


class Helped(Rooted):  # a method of its own given the joined path
    def load(self, path):
        return Image.open(path).convert("RGB")

    def __getitem__(self, index):
        img = self.load(os.path.join(self.root, self.names[index]))
        if self.tf is not None:
            img = self.tf(img)
        return img, self.targets[index]


CLASSES = {f"class{c}": c for c in range(4)}


class Looked(Derived):  # derived through a global of the script's, which fastdata does not read
    def __getitem__(self, index):
        img_name = self.names[index]
        label = CLASSES[img_name.split("/")[0]]
        image = Image.open(os.path.join(self.root, img_name)).convert("RGB")
        if self.tf:
            image = self.tf(image)
        return image, label


class More(Files):  # its own arithmetic on the label
    def __getitem__(self, idx):
        image = Image.open(self.image_paths[idx]).convert("RGB")
        label = self.labels[idx] + 1
        if self.transform:
            image = self.transform(image)
        return image, label


class Grey(Files):  # another conversion
    def __getitem__(self, idx):
        image = Image.open(self.image_paths[idx]).convert("L")
        label = self.labels[idx]
        if self.transform:
            image = self.transform(image)
        return image, label


class Batched(Files):  # its own batch fetch
    def __getitems__(self, indices):
        return [self[i] for i in indices]


class Split(Dataset):  # a split's part given its transform, as scripts write it
    def __init__(self, subset, transform=None):
        self.subset, self.transform = subset, transform

    def __len__(self):
        return len(self.subset)

    def __getitem__(self, index):
        x, y = self.subset[index]
        if self.transform:
            x = self.transform(x)
        return x, y


class Text(str):  # a str of the script's own, whose comparisons could be its code
    pass


# A script whose `Image` is its own, not Pillow's module (bound after the import)
OWN_IMAGE = """
import types
from PIL import Image
Image = types.SimpleNamespace(open=lambda path: None)

class Own:
    def __init__(self, paths, labels, transform):
        self.paths, self.labels, self.transform = paths, labels, transform

    def __getitem__(self, idx):
        image = Image.open(self.paths[idx]).convert("RGB")
        label = self.labels[idx]
        if self.transform:
            image = self.transform(image)
        return image, label
"""


class Property(Files):
    transform = property(lambda self: _transforms()[0])

    def __init__(self, paths, labels):
        self.image_paths, self.labels = paths, labels


def _same_batches(dataset, workers: int, swap=None, levels: int = 0, offset: int = 0) -> None:
    """The served loader's batches (native) are DataLoader's bit for bit (within `levels` of
    uint8, for a resize of a tensor: torch's arithmetic, not Pillow's) over two passes, the
    labels those of the images' content (plus `offset`: a target_transform's); `swap(dataset)`
    between them (the next pass follows)."""
    loader = _served(dataset, batch_size=7, shuffle=True, num_workers=workers,
                     generator=torch.Generator().manual_seed(1))
    assert isinstance(loader._loader.dataset, rt.NativeFolder)
    plain = torch.utils.data.DataLoader(dataset, batch_size=7, shuffle=True,
                                        generator=torch.Generator().manual_seed(1))
    try:
        for _ in range(2):
            want, got = list(plain), list(loader)
            assert len(got) == len(want) and sum(len(labels) for _, labels in got) == len(dataset)
            for (a, la), (b, lb) in zip(got, want):
                assert torch.equal(la, lb) and torch.equal(_class_of(a) + offset, la) and a.dtype == b.dtype
                scale = 255 if a.is_floating_point() else 1
                assert torch.equal(a, b) if not levels else (a.double() - b.double()).abs().max() * scale <= levels
            if swap is not None:
                swap(dataset)
    finally:
        loader._stop()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("workers", [0, 2])
def test_a_scripts_file_list_is_served_natively(tv, folder, workers):
    """A script's own Dataset that opens each file by its path with Pillow and converts it to RGB,
    written as scripts write it (converting it in one statement or two, or opening an RGB file as
    it is; paths and labels in lists, names joined to a root with os.path.join (under a folder of
    it, a text or an attribute, or not; an extension added to the name or to the joined path, in
    the open or not), pathlib's `/`, an f-string or `+` (to a root, a text or both) (in the open,
    bound first, or bound, then joined; bound to the image's or the name's own local), (path,
    label) pairs (the path joined to a root or not, in the open or bound first); opened by Pillow or first by Python's `open` (torchvision's pil_loader written
    in), or Pillow's image opened as a context, in `__getitem__` or in a method of the class's or a
    function of the script's it calls or holds (given the index, a path or an expression; a copy of
    torchvision's pil_loader), or by torchvision's own default_loader imported by name; the label
    (a folder's name looked up, from pathlib paths or made paths) before or after the image or the
    transform, as it is, mapped by a dict of class names (or a tuple) or made a tensor (of int64)
    or an int, or derived from the name or the path by its own statements (through a dict or a
    list of its own or not); `if self.transform:`, `is not None`, always, inline (or returned under
    the condition); a docstring first, the tutorial's line for a tensor index; any
    names), is served natively: the batches torchvision's own, bit for bit, the labels its
    code's, a transform swapped between passes followed."""
    from fastdata.run._decide import _collation

    paths, labels = _listing(folder)
    sized, cropped = _transforms()

    def swap(ds):
        name = "tf" if isinstance(ds, Rooted) else "transform"
        setattr(ds, name, cropped if getattr(ds, name) is sized else sized)

    names = [os.path.relpath(p, folder) for p in paths]
    classes = {f"class{c}": c for c in set(labels)}
    for dataset in (Files(paths, labels, sized), Rooted(str(folder), names, labels, cropped),
                    Pairs(list(zip(paths, labels)), sized),
                    Late([pathlib.Path(p) for p in paths], np.array(labels), cropped),
                    Rooted(folder, names, torch.tensor(labels), sized), Tensors(paths, labels, cropped),
                    Longs(paths, np.array(labels, dtype=np.int32), sized), Ints(paths, np.array(labels), cropped),
                    AsIs(paths, labels, sized), Converted(paths, labels, cropped),
                    Named(str(folder), names, labels, sized), Documented(paths, labels, cropped),
                    Rebound(str(folder), names, labels, sized), Slashed(folder, names, labels, cropped),
                    Mapped(paths, [f"class{y}" for y in labels], classes, sized),
                    Texted(str(folder), names, labels, cropped),
                    Suffixed(folder, [os.path.splitext(name)[0] for name in names], labels, sized),
                    Extended(str(folder), [os.path.splitext(name)[0] for name in names], labels, cropped),
                    Opened(list(zip(paths, labels)), cropped), OpenedMapped(paths, [3 - y for y in labels], (3, 2, 1, 0), sized),
                    Derived(str(folder), names, None, cropped), Chained(str(folder), names, None, sized),
                    Tabled(str(folder), names, classes, cropped), Indexed(str(folder), names, sorted(classes), sized),
                    Contexted(paths, labels, cropped), Added(f"{folder}/", names, labels, sized),
                    Prefixed(None, [p[1:] for p in paths], labels, cropped), Sep(str(folder), names, labels, sized),
                    Under(str(folder), names, labels, cropped), Splits(folder.parent, folder.name, names, labels, sized),
                    ImageFolderCustom(str(folder), cropped),
                    Parented(None, [Path(p) for p in paths], classes, sized),
                    Pathed(str(folder), names, sorted(classes), cropped), Loaded(paths, labels, sized),
                    Copied(list(zip(paths, labels)), cropped), Imported(paths, labels, sized),
                    Helped(str(folder), names, labels, cropped), Labelled(str(folder), names, classes, sized),
                    Filelist(str(folder), list(zip(names, labels)), cropped),
                    Joined(str(folder), list(zip(names, labels)), sized)):
        assert f"served natively: {type(dataset).__name__} with" in _collation({"dataset": dataset})[0]
        _same_batches(dataset, workers, swap)


@pytest.mark.timeout(300)
def test_a_file_list_read_with_torchvision_io_is_served_natively(tv, folder, tmp_path):
    """A file list that reads each file with torchvision.io's read_image (as it is, or made RGB),
    its transform on the uint8 tensor (v1 or v2; ToImage first or not), is served natively: the
    batches torchvision's bit for bit (a resize of the tensor within 2 levels: torch's arithmetic,
    not Pillow's, as for a folder's tensor). A grey JPEG among its files (read_image gives it one
    channel) makes its batch the script's own fetch."""
    import torchvision.transforms as T
    import torchvision.transforms.v2 as v2

    from fastdata.run._decide import _collation

    paths, labels = _listing(folder)
    tensors = (T.Compose([T.CenterCrop(40), T.RandomHorizontalFlip(1.0), T.ConvertImageDtype(torch.float32)]),
               v2.Compose([v2.ToImage(), v2.RandomResizedCrop((20, 16), antialias=True), v2.RandomHorizontalFlip(),
                           v2.ToDtype(torch.float32, scale=True)]),
               v2.Compose([v2.Resize(24), v2.CenterCrop(20)]))
    for dataset, levels in ((Read(paths, labels, tensors[0]), 0), (ReadRGB(paths, labels, tensors[2]), 2)):
        assert f"served natively: {type(dataset).__name__} with" in _collation({"dataset": dataset})[0]
        _same_batches(dataset, 2, levels=levels)
    random = Read(paths, labels, tensors[1])  # (random draws: fastdata's own, not the plain run's)
    loader = _served(random, batch_size=7, num_workers=2)
    assert isinstance(loader._loader.dataset, rt.NativeFolder)
    for images, got in loader:
        assert images.shape[1:] == (3, 20, 16) and images.dtype == torch.float32
        assert torch.equal(_class_of(images), got)
    loader._stop()
    greys = [str(tmp_path / f"grey{k}.jpg") for k in (2, 3)]  # (the second batch's: one channel each)
    for k, grey in zip((2, 3), greys):
        Image.open(paths[k]).convert("L").save(grey)
    mixed = Read(paths[:2] + greys, labels[:4], tensors[0])
    loader = _served(mixed, batch_size=2)
    got, want = list(loader), list(torch.utils.data.DataLoader(mixed, batch_size=2))
    assert [a.shape[1] for a, _ in got] == [3, 1]
    for (a, la), (b, lb) in zip(got, want, strict=True):
        assert torch.equal(a, b) and torch.equal(la, lb)
    loader._stop()


@pytest.mark.timeout(300)
def test_a_csv_frame_dataset_is_served_natively(tv, folder):
    """The PyTorch tutorial's CustomImageDataset (a pandas frame of file names and labels, the
    names joined to its folder), opening its files with Pillow, and the frames scripts index by
    their columns' names (a row's, a row bound first, `loc`, a column's, its names' stems made
    paths in an f-string; a label made an int, then a tensor; a row's columns as its attributes)
    or hold class names in (mapped by a dict), and the tutorial's own
    (read_image, a target_transform): served natively, the labels the frame's numpy integers (or
    the target_transform's) collated as DataLoader collates them."""
    from fastdata.run._decide import _collation

    pd = pytest.importorskip("pandas")
    paths, labels = _listing(folder)
    frame = pd.DataFrame({"file": [os.path.relpath(p, folder) for p in paths], "label": labels})
    sized, _ = _transforms()
    for cls in (Frame, Rows, Row, Loc, Columns, Annotated, Attributes, Attribute):  # (and by column names)
        dataset = cls(frame, str(folder), sized)
        assert f"served natively: {cls.__name__} with" in _collation({"dataset": dataset})[0]
        _same_batches(dataset, 2)
    stems = Stems(frame.assign(stem=[os.path.splitext(name)[0] for name in frame["file"]]), str(folder), sized)
    assert "served natively: Stems with" in _collation({"dataset": stems})[0]
    _same_batches(stems, 0)
    named = Classes(frame.assign(label=[f"class{y}" for y in labels]), str(folder), sized)
    named.class_to_idx = {f"class{y}": y for y in labels}
    assert "served natively: Classes with" in _collation({"dataset": named})[0]
    _same_batches(named, 0)
    shuffled = frame.sample(frac=1.0, random_state=0)  # (its index no longer its rows' order: loc reads labels)
    _same_batches(Loc(shuffled, str(folder), sized), 0)
    import torchvision.transforms.v2 as v2

    cropped = v2.Compose([v2.CenterCrop(40), v2.ToDtype(torch.float32, scale=True)])
    for target in (None, torch.tensor):  # (its target_transform applied as its code applies it)
        tutorial = CustomImageDataset(frame, str(folder), cropped, target)
        assert "served natively: CustomImageDataset with" in _collation({"dataset": tutorial})[0]
        _same_batches(tutorial, 2)


@pytest.mark.timeout(300)
def test_a_file_list_split_wrapped_or_joined_is_served_natively(tv, folder):
    """A file list under random_split, under the script's wrapper that gives a split's part its
    transform (the file list's own None), and two file lists joined: served natively, the
    batches DataLoader's bit for bit."""
    paths, labels = _listing(folder)
    sized, cropped = _transforms()
    train, val = torch.utils.data.random_split(Files(paths, labels), [0.75, 0.25],
                                               generator=torch.Generator().manual_seed(0))
    half = len(paths) // 2
    for dataset in (torch.utils.data.random_split(Files(paths, labels, sized), [0.5, 0.5])[0], Split(train, sized),
                    Split(val, cropped), Files(paths[:half], labels[:half], sized) + Pairs(
                        list(zip(paths[half:], labels[half:])), sized)):
        _same_batches(dataset, 2)


def _torchvision_datasets(folder: Path, root: Path, monkeypatch) -> dict:
    """torchvision's own datasets that list their files, laid out under `root` as each expects its
    download, from `folder`'s images (class c the c-th class of each; Places365's md5 checks of its
    lists stubbed)."""
    from torchvision.datasets import DTD, GTSRB, Caltech101, Caltech256, Food101, Imagenette, OxfordIIITPet, Places365

    paths, labels = _listing(folder)
    (root / "caltech101" / "101_ObjectCategories" / "BACKGROUND_Google").mkdir(parents=True)  # (not a class)
    for k, (path, label) in enumerate(zip(paths, labels)):
        name, number = Path(path).stem, labels[:k].count(label) + 1  # (Caltech's files numbered from 1 a class)
        for at in (root / "caltech101" / "101_ObjectCategories" / f"class{label}" / f"image_{number:04d}.jpg",
                   root / "caltech256" / "256_ObjectCategories" / f"{label + 1:03d}.class{label}" /
                   f"{label + 1:03d}_{number:04d}.jpg"):
            at.parent.mkdir(parents=True, exist_ok=True)
            os.link(path, at)
        wnid = sorted(Imagenette._WNID_TO_CLASS)[label]
        for at in (root / "food-101" / "images" / f"class{label}" / f"{name}.jpg",
                   root / "dtd" / "dtd" / "images" / f"class{label}" / f"{name}.jpg",
                   root / "imagenette2" / "train" / wnid / f"{name}.jpeg",
                   root / "oxford-iiit-pet" / "images" / f"class{label}_{name}.jpg",
                   root / "data_large_standard" / f"class{label}" / f"{name}.jpg"):
            at.parent.mkdir(parents=True, exist_ok=True)
            os.link(path, at)
        at = root / "gtsrb" / "GTSRB" / "Training" / f"{label:05d}" / f"{name}.ppm"
        at.parent.mkdir(parents=True, exist_ok=True)
        Image.open(path).save(at)
    (root / "food-101" / "meta").mkdir()
    listing = {f"class{c}": [f"class{c}/{Path(p).stem}" for p, y in zip(paths, labels) if y == c]
               for c in sorted(set(labels))}
    (root / "food-101" / "meta" / "train.json").write_text(json.dumps(listing))
    (root / "dtd" / "dtd" / "labels").mkdir()
    (root / "dtd" / "dtd" / "labels" / "train1.txt").write_text(
        "".join(f"class{y}/{Path(p).name}\n" for p, y in zip(paths, labels)))
    (root / "oxford-iiit-pet" / "annotations").mkdir()  # (each image's id, class, species and breed, from 1)
    (root / "oxford-iiit-pet" / "annotations" / "trainval.txt").write_text(
        "".join(f"class{y}_{Path(p).stem} {y + 1} {y % 2 + 1} 1\n" for p, y in zip(paths, labels)))
    (root / "categories_places365.txt").write_text("".join(f"/c/class{c} {c}\n" for c in sorted(set(labels))))
    (root / "places365_train_standard.txt").write_text(
        "".join(f"/class{y}/{Path(p).stem}.jpg {y}\n" for p, y in zip(paths, labels)))
    monkeypatch.setattr(Places365, "_check_integrity", lambda self, file, md5, download: True)
    if importlib.util.find_spec("scipy") is None:  # (Caltech101's __getitem__ imports scipy.io, as its users have it)
        scipy = types.ModuleType("scipy")
        scipy.io = types.ModuleType("scipy.io")
        monkeypatch.setitem(sys.modules, "scipy", scipy)
        monkeypatch.setitem(sys.modules, "scipy.io", scipy.io)
    return {"Food101": Food101, "DTD": DTD, "Imagenette": Imagenette, "GTSRB": GTSRB, "OxfordIIITPet": OxfordIIITPet,
            "Places365": Places365, "Caltech101": Caltech101, "Caltech256": Caltech256}


@pytest.mark.timeout(300)
def test_torchvisions_own_file_datasets_are_served_natively(tv, folder, tmp_path, monkeypatch):
    """torchvision's own datasets that list their files (Food101, DTD, Imagenette, GTSRB,
    OxfordIIITPet, Places365, Caltech101 and Caltech256 here; Flowers102, FGVCAircraft, SUN397,
    StanfordCars and RenderedSST2 read theirs as Food101 and Imagenette do) are read as file lists:
    served natively with torchvision's own loader (Caltech's open theirs as they are), the batches
    DataLoader's bit for bit, their target_transform applied; one given a loader of the script's
    (torchvision.io's decode_image), or joint transforms of the script's (OxfordIIITPet's and
    Places365's `transforms`, which their `__getitem__` calls), is not, saying why, and
    OxfordIIITPet with a segmentation target, or Caltech101 with annotations, is not read."""
    from torchvision.io import decode_image

    from fastdata.run._decide import _collation

    sized, cropped = _transforms()
    made = _torchvision_datasets(folder, tmp_path, monkeypatch)
    for name, cls in made.items():
        dataset = cls(str(tmp_path), transform=sized)
        assert len(dataset) == 48 and f"served natively: {name} with" in _collation({"dataset": dataset})[0]
        _same_batches(dataset, 2)
        _same_batches(cls(tmp_path, transform=cropped, target_transform=lambda y: y + 10), 0, offset=10)
    for name in ("Food101", "Places365"):
        lowering, reason = rt.lower(made[name](str(tmp_path), transform=sized, loader=decode_image))
        assert lowering is None and reason == f"{name} has its own image loader (decode_image)", reason

    def joint(image, target):
        return sized(image), target

    places = made["Places365"](str(tmp_path))
    places.transforms = joint  # (its __init__ takes none; its __getitem__ calls them)
    for name, dataset in (("OxfordIIITPet", made["OxfordIIITPet"](str(tmp_path), transforms=joint)),
                          ("Places365", places)):
        lowering, reason = rt.lower(dataset)
        assert lowering is None and reason.startswith(f"{name} is given transforms of the script's (") and \
            reason.endswith(".joint)"), reason
    lowering, reason = rt.lower(made["OxfordIIITPet"](str(tmp_path), target_types="segmentation", transform=sized))
    assert lowering is None and "OxfordIIITPet's __getitem__ opens its images (Image.open), but not as" in reason
    lowering, reason = rt.lower(made["Caltech101"](str(tmp_path), ["category", "annotation"], transform=sized))
    assert lowering is None and "Caltech101's __getitem__ opens its images (Image.open), but not as" in reason


@pytest.mark.timeout(300)
def test_a_lambda_that_converts_to_rgb_is_read_as_the_identity_it_is_there(tv, folder):
    """Scripts put `Lambda(lambda x: x.convert("RGB"))` first, for files that may be grey. On the RGB
    images a folder or a converting file list gives, it is the identity: served natively with no op
    of the script's called (before, the geometry after it was refused), the batches DataLoader's bit
    for bit. A def, a test of the mode and v2's Lambda are read alike; another mode, a default
    argument, or a Lambda on the tensor are not."""
    import torchvision.transforms as T
    import torchvision.transforms.v2 as v2
    from torchvision.datasets import ImageFolder

    def to_rgb(image):
        return image.convert("RGB")

    paths, labels = _listing(folder)
    for rgb in (T.Lambda(lambda x: x.convert("RGB")), T.Lambda(to_rgb),
                v2.Lambda(lambda img: img.convert("RGB") if img.mode != "RGB" else img)):
        transform = T.Compose([rgb, T.Resize((24, 24)), T.CenterCrop((20, 16)), T.PILToTensor()])
        lowering, reason = rt.lower(ImageFolder(str(folder), transform))
        assert lowering is not None and not lowering.pixel_ops and lowering.names.startswith("Lambda, Resize"), reason
        _same_batches(ImageFolder(str(folder), transform), 0)
        _same_batches(Files(paths, labels, transform), 2)
    for other in (T.Lambda(lambda x: x.convert("L")), T.Lambda(lambda x, mode="RGB": x.convert(mode))):
        lowering, reason = rt.lower(ImageFolder(str(folder), T.Compose([other, T.Resize((24, 24)), T.PILToTensor()])))
        assert lowering is None and reason == "Resize after Lambda: fastdata's decoder applies the geometry first", \
            reason
    lowering, reason = rt.lower(ImageFolder(str(folder), T.Compose([T.Resize((24, 24)), T.PILToTensor(),
                                                                   T.Lambda(lambda x: x.convert("RGB"))])))
    assert lowering is None and reason == "Lambda has no faithful lowering in fastdata", reason
    lowering, reason = rt.lower(AsIs(paths, labels, T.Compose([])))  # (no first op to read)
    assert lowering is None and reason == "the transform gives PIL images, which fastdata does not lay out", reason


def test_a_file_list_that_does_more_is_not_read(tv, folder):
    """Code that does more than open, convert to RGB, transform and return (arithmetic on the
    label, another conversion, its own batch fetch, a property for an attribute, an `Image` that
    is not Pillow's, a label derived through a global of the script's, another conversion in a
    method it calls) is a dataset fastdata
    cannot see into, which the summary says opens its images but is not read as a file list (and a
    method it calls that the instance shadows is not read); one it reads but cannot serve (paths in
    a dict, labels mapped by a Mapping of the script's, a None transform it calls, a transform whose
    truth is its own code, a label derived through a dict subclass, a list of str subclasses or a
    dict of lists, whose lookup or label may run the script's code, a loader of the script's own
    that converts otherwise, a join of one
    that opens PIL images and one that reads tensors through one transform) says why."""
    from collections import OrderedDict, UserDict

    from fastdata.run._decide import _collation

    paths, labels = _listing(folder)
    sized, _ = _transforms()
    names = [os.path.relpath(p, folder) for p in paths]
    for dataset in (More(paths, labels, sized), Grey(paths, labels, sized), Batched(paths, labels, sized),
                    Property(paths, labels), Looked(str(folder), names, None, sized), GreyLoaded(paths, labels, sized)):
        why = f"{type(dataset).__name__}'s __getitem__ opens its images (Image.open), but not as a file list"
        lowering, reason = rt.lower(dataset)
        assert lowering is None and reason.startswith(why), reason
        assert _collation({"dataset": dataset})[0].startswith(f"native collation; not served natively: {why}")
    shadowed = ImageFolderCustom(str(folder), sized)  # (its method the instance's own: not the class's code read)
    shadowed.load_image = lambda index: Image.open(shadowed.paths[index]).convert("L")
    assert rt.lower(shadowed)[0] is None and rt.lower(ImageFolderCustom(str(folder), sized))[0] is not None
    for own in (False, True):  # (the same code with Pillow's Image is read)
        scope: dict = {}
        exec(compile(OWN_IMAGE if own else OWN_IMAGE.replace("Image = types", "_ = types"), "<script>", "exec"), scope)
        assert (rt.lower(scope["Own"](paths, labels, sized))[0] is None) == own

    class Sized(type(sized)):
        def __len__(self):
            return 0

    import torchvision.transforms as T
    import torchvision.transforms.v2 as v2

    # one transform of a PIL image in one list, of a tensor in the other: two lowerings (Pillow's resize, torch's)
    shared = v2.Compose([v2.Resize((20, 16)), v2.ToImage(), v2.ToDtype(torch.float32, scale=True)])
    lowering, reason = rt.lower(Files(paths, labels, shared) + Read(paths, labels, shared))
    assert lowering is None and "joins image folders whose transforms differ" in reason, reason
    for dataset, why in ((Files(dict(enumerate(paths)), labels, sized), "Files reads its paths from a dict"),
                         (Mapped(paths, labels, UserDict({y: y for y in labels}), sized),
                          "Mapped maps its labels with a UserDict"),
                         (Late(paths, labels, None), "Late calls its transform, which is None"),
                         (Files(paths, labels, Sized([T.ToTensor()])), "Files asks its transform's truth"),
                         (Tabled(str(folder), names, OrderedDict(CLASSES), sized),
                          "Tabled derives its labels through its targets, a OrderedDict, whose lookup"),
                         (Indexed(str(folder), names, [Text(c) for c in CLASSES], sized),
                          "Indexed derives its labels through its targets, a list of other keys"),
                         (Parented(None, [Path(p) for p in paths], {k: [v] for k, v in CLASSES.items()}, sized),
                          "Parented derives its labels through its targets, a dict of other values"),
                         (Filelist(str(folder), list(zip(names, labels)), sized, loader=grey_loader),
                          "Filelist has its own image loader (")):
        lowering, reason = rt.lower(dataset)
        assert lowering is None and reason.startswith(why), reason
        assert why in _collation({"dataset": dataset})[0]


DERIVED = """
import os
from pathlib import Path
from PIL import Image

class Derived:
    def __init__(self, names, transform):
        self.names, self.transform = names, transform

    def __getitem__(self, idx):
        name = self.names[idx]
        label = {label}
        image = Image.open(name).convert("RGB")
        if self.transform:
            image = self.transform(image)
        return image, label
"""


@pytest.mark.timeout(60)
def test_a_derived_label_is_read_only_where_its_statements_run_nothing_of_the_scripts(tmp_path):
    """A label derived from the name is read where its statements do only str operations,
    pathlib's attributes, indexing, comparisons, conditionals, `int`, `len`, `str`, `Path` and
    `os.path`'s functions on the name (`_itemsource._pure`), and lookups in the instance's tables,
    computing what the script's code computes; not where they call anything else (the name's `os`
    itself, a builtin, a method that is no str's or a path's attribute), read a second local or a
    global, or where the class's code is not what its source file says (edited since); a source
    that is neither a str nor one of pathlib's paths is refused when labels are made."""
    import linecache

    from fastdata.run._itemsource import item_source

    def read(label: str, source: str | None = None):
        text = DERIVED.replace("{label}", label)
        filename = str(tmp_path / f"script{abs(hash((label, source)))}.py")
        Path(filename).write_text(text if source is None else DERIVED.replace("{label}", source))
        linecache.checkcache(filename)
        scope: dict = {}
        exec(compile(text, filename, "exec"), scope)
        code = scope["Derived"].__getitem__.__code__
        return item_source(code, ("os", "Image"))

    for label, name, want in (('1 if "dog" in name else 0', "a/dog.1.jpg", 1),
                              ('0 if name.lower().startswith("cat") else 1', "Cat.2.jpg", 0),
                              ('int(os.path.splitext(os.path.basename(name))[0].split("_")[-1])', "x/a_17.png", 17),
                              ('name.split("/")[-1].split(".")[0] == "dog"', "p/dog.3.jpg", True),
                              ('name.rpartition("/")[0][-3:] not in ("cat", "cow")', "p/cat/4.jpg", False),
                              ("name.parent.name", Path("a/dog/1.jpg"), "dog"),
                              ('int(name.stem.split("_")[-1])', pathlib.PurePosixPath("x/a_17.png"), 17),
                              ('str(name).split("/")[-2]', Path("p/cat/4.jpg"), "cat"),
                              ('Path(name).suffix == ".png"', "x/a.png", True),
                              ("name.parents[1].parts[-1]", Path("s/cat/4/1.jpg"), "cat")):
        derived = read(label)
        assert derived is not None and derived.source == "element", label
        assert derived.labels([name], {}) == [eval(label, {"os": os, "Path": Path}, {"name": name})] == [want], label
    for label in ('os.replace(name, "x")', "hash(name) % 2", "sum(name)", "len", "name.format(1)", 'name + "x"',
                  "CLASSES[name]", "self.names.count(name)", "self.transform(name)", "idx % 2", "name.encode()[0]",
                  "[c for c in name][0]", 'getattr(name, "lower")()', "name[idx]", 'name.with_suffix(".x").name',
                  "name.open()", "name.__class__", "self.parent", 'str(name, "ascii")', "Path", "name.absolute"):
        assert read(label) is None, label
    derived = read('self.names.index(name.split("/")[0])')  # (a list of the instance's, read as it is)
    assert derived.tables == ("names",) and derived.labels(["dog/1.jpg"], {"names": ["cat", "dog"]}) == [1]
    assert read("name" + ".lower()" * 300) is None  # (deeper than the reading may walk, though Python runs it)
    # (a code equal to one read before is read from the cache: this one is the first of its constants)
    assert read('2 if "dog" in name else 0', source='2 if "cat" in name else 0') is None
    with pytest.raises(TypeError, match="a label's source of type Text"):
        read('1 if "dog" in name else 0').labels([type("Text", (str,), {})("dog")], {})
    with pytest.raises(TypeError, match="a label's source of type Mine"):  # (a path class of the script's)
        read("name.parent.name").labels([type("Mine", (type(Path()),), {})("a/b")], {})
    with pytest.raises(AttributeError):  # (pathlib's attribute of a str: the script's own fetch then raises it too)
        read("name.parent.name").labels(["a/b.jpg"], {})


INLINED = """
from PIL import Image

class Course:
    def __init__(self, paths, table, transform):
        self.paths, self.table, self.transform = paths, table, transform

    def load(self, i):
        {load}

    def __getitem__(self, index):
        img = self.load(index)
        name = self.paths[index].parent.name
        label = self.table[name]
        if self.transform:
            return self.transform(img), label
        else:
            return img, label
"""


@pytest.mark.timeout(60)
def test_a_method_the_getitem_calls_is_read_in_its_place_only_where_that_is_the_same(tmp_path):
    """`img = self.load(index)` is read as the method's statements, its arguments named as the
    caller's, where its only return is its last statement and it binds neither its arguments nor a
    name of the caller's, nor reads a local of the caller's (in its place, those would be other
    names); the return under the transform's condition is read as one return."""
    import linecache

    from fastdata.run._itemsource import item_source

    def read(load: str):
        text = INLINED.replace("{load}", load)
        filename = str(tmp_path / f"script{abs(hash(load))}.py")
        Path(filename).write_text(text)
        linecache.checkcache(filename)
        scope: dict = {}
        exec(compile(text, filename, "exec"), scope)
        cls = scope["Course"]
        return item_source(cls.__getitem__.__code__, ("Image",), (("load", cls.load.__code__, True),))

    for load in ("return Image.open(self.paths[i])",
                 '"""Its image."""\n        p = self.paths[i]\n        return Image.open(p)'):
        read_ = read(load)
        assert read_ is not None and (read_.source, read_.attribute, read_.tables) == ("element", "paths", ("table",))
        assert "load" not in read_.code.co_names and read_.code.co_names.count("transform") == 1
        assert read_.labels([Path("a/dog/1.jpg")], {"table": {"dog": 3}}) == [3]
    for load in ("i = i + 1\n        return Image.open(self.paths[i])",
                 "if i < 0:\n            return None\n        return Image.open(self.paths[i])",
                 "img = Image.open(self.paths[i])\n        return img", "return Image.open(name)",
                 "Image.open(self.paths[i])"):
        assert read(load) is None, load


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["L", "RGBA"])
def test_a_file_opened_as_it_is_in_another_mode_makes_the_batch_the_scripts_own_fetch(tv, tmp_path, mode,
                                                                                    monkeypatch):
    """A file list that opens its files as they are (no conversion) gets each batch decoded by
    fastdata only where every file opens as RGB: a grey JPEG or a PNG with alpha among them
    makes the batch the script's own fetch (its images as the files open them: 1 or 4 channels,
    the batches DataLoader's); the RGB batches beside them are fastdata's. With a Lambda that
    converts each to RGB first in its transform, every batch is fastdata's, as for a file list
    that converts (no file's mode asked), the batches DataLoader's."""
    import torchvision.transforms as T

    from fastdata.run import _torchvision

    paths, labels = [], []
    for k in range(12):
        odd = k >= 8  # (the last batch of 4: the files in `mode`)
        rgb = np.full((30 + k, 40, 3), (10 * k, 100, 55 + 50 * (k % 4)), np.uint8)
        image = Image.fromarray(rgb)
        if odd:
            image = image.convert(mode)
        paths.append(str(tmp_path / f"{k:02d}.{'png' if odd and mode == 'RGBA' else 'jpg'}"))
        image.save(paths[-1])
        labels.append(k % 4)
    dataset = AsIs(paths, labels, T.Compose([T.Resize((20, 16)), T.PILToTensor()]))
    loader = _served(dataset, batch_size=4)
    assert isinstance(loader._loader.dataset, rt.NativeFolder)
    got, want = list(loader), list(torch.utils.data.DataLoader(dataset, batch_size=4))
    assert [a.shape[1] for a, _ in got] == [3, 3, len(mode)]
    for (a, la), (b, lb) in zip(got, want, strict=True):
        assert torch.equal(a, b) and torch.equal(la, lb)
    loader._stop()
    asked = []
    monkeypatch.setattr(_torchvision, "first_not_rgb", lambda *a: asked.append(a))
    dataset.transform = T.Compose([T.Lambda(lambda x: x.convert("RGB")), T.Resize((20, 16)), T.PILToTensor()])
    loader = _served(dataset, batch_size=4, num_workers=0)  # (in this process: the files' modes asked here)
    assert isinstance(loader._loader.dataset, rt.NativeFolder) and loader._loader.num_workers == 0
    got, want = list(loader), list(torch.utils.data.DataLoader(dataset, batch_size=4))
    assert [a.shape[1] for a, _ in got] == [3, 3, 3] and not asked
    for (a, la), (b, lb) in zip(got, want, strict=True):
        assert torch.equal(a, b) and torch.equal(la, lb)
    loader._stop()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("batch", ["the script's own fetch", "fastdata's"])
def test_a_batch_that_does_not_collate_raises_the_scripts_error(tv, tmp_path, batch):
    """A batch that is the script's own fetch (a grey JPEG among RGB ones, opened as it is) whose
    samples do not collate (1 channel beside 3), or one fastdata decoded whose labels torch's
    collate refuses (None, as CLEVR's test split gives), raises in workers fastdata added what
    the script's own process raises (torch's stack error, not "Trying to resize storage ...";
    default_collate's TypeError), not in "Caught ... in DataLoader worker process k", and the
    pass goes on after it; in workers the script asked for, torch's worker error, as without
    fastdata."""
    import torchvision.transforms as T

    paths = []
    for k in range(12):
        image = Image.fromarray(np.full((24, 20, 3), (10 * k, 100, 55 + 50 * (k % 4)), np.uint8))
        paths.append(str(tmp_path / f"{k:02d}.jpg"))
        (image.convert("L") if k == 5 and batch != "fastdata's" else image).save(paths[-1])  # (one channel)
    labels = [k % 4 if batch != "fastdata's" or k // 4 != 1 else None for k in range(12)]  # (the second batch's)
    dataset = AsIs(paths, labels, T.Compose([T.Resize((20, 16)), T.PILToTensor()]))

    added = _served(dataset, batch_size=4)
    assert isinstance(added._loader.dataset, rt.NativeFolder) and added.num_workers >= 1
    got, want = steps(added), steps(torch.utils.data.DataLoader(dataset, batch_size=4))
    assert got == want and type(got[1]) is tuple and type(got[0]) is type(got[2]) is list, got
    assert "stack expects each tensor" in got[1][1] if batch != "fastdata's" else \
        got[1][0] is TypeError and "found <class 'NoneType'>" in got[1][1]
    assert "in DataLoader worker process" in steps(_served(dataset, batch_size=4, num_workers=2))[1][1]


@pytest.mark.timeout(120)
def test_a_file_it_cannot_read_makes_the_batch_the_scripts_own_fetch(tv, folder, tmp_path):
    """A missing file raises the script's own error (Pillow's FileNotFoundError), as without
    fastdata, and so does a label its mapping lacks (KeyError); paths fastdata does not take (bytes, which Pillow opens) give the script's own
    samples, the same batches."""
    paths, labels = _listing(folder)
    sized, _ = _transforms()
    missing = Files(paths[:5] + [str(tmp_path / "gone.jpg")], labels[:6], sized)
    loader = _served(missing, batch_size=6)
    with pytest.raises(FileNotFoundError, match="gone.jpg"):
        next(iter(loader))
    loader._stop()
    unmapped = Mapped(paths[:6], ["class0"] * 5 + ["class9"], {"class0": 0}, sized)
    loader = _served(unmapped, batch_size=6)
    with pytest.raises(KeyError, match="class9"):
        next(iter(loader))
    loader._stop()
    raw = Files([os.fsencode(p) for p in paths], labels, sized)
    loader = _served(raw, batch_size=8)
    for (a, la), (b, lb) in zip(loader, torch.utils.data.DataLoader(raw, batch_size=8), strict=True):
        assert torch.equal(a, b) and torch.equal(la, lb)
    loader._stop()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("form", ["csv", "prepared", "derived", "course"])
def test_an_unchanged_csv_script_under_fastdata_run(tv, folder, tmp_path, form):
    """tests/run_scripts/train_csv.py, a script that lists its images in a CSV file and reads
    them with its own Dataset, unchanged under `fastdata run`: served natively (the summary says
    so), every label its image's, the batches laid out as the plain script's; so too where it
    trains on the loader Hugging Face Accelerate's `prepare` makes from its own (the loader
    Accelerate makes within its own is served), and where its Dataset derives each label from
    the path or opens its images in a method of its own (its workers read the script's source
    too)."""
    prepared = form == "prepared"
    if prepared:
        pytest.importorskip("accelerate")
    runs = {}
    for plain in (True, False):
        out = tmp_path / f"out{plain}.json"
        command = [sys.executable, str(SCRIPTS / "train_csv.py"), str(folder), str(out),
                   *({"prepared": ["--accelerate"], "derived": ["--derived"], "course": ["--course"]}.get(form, []))]
        if not plain:
            command = [sys.executable, "-m", "fastdata", "run", "--", *command]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=tmp_path,
                              env=dict(os.environ, OMP_NUM_THREADS="1"))
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[plain] = json.loads(out.read_text()), proc.stderr
    (plain, _), (got, err) = runs[True], runs[False]
    name = {"derived": "ByName", "course": "ImageFolderCustom"}.get(form, "ImageCsv")
    assert f"served natively: {name} with RandomResizedCrop, RandomHorizontalFlip, ToTensor, Normalize" in err, err
    if prepared:  # (the script's loader, and the one Accelerate makes from it, made where the script calls prepare)
        assert "2 DataLoader(s): 2 served by fastdata (2 natively), 0 torch's own" in err, err
    assert got["wrong"] == plain["wrong"] == 0 and got["seen"] == plain["seen"] == 2 * 48
    assert got["layout"] == plain["layout"]
