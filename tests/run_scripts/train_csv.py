"""A training script whose images are listed in a CSV file, read by its own Dataset class as
such scripts write it; run plain or under `fastdata run` by tests/tools/test_run_filelist.py.

    python train_csv.py DATA OUT.json [--accelerate | --derived | --course]

It lists DATA's JPEGs (an ImageFolder's layout, class c in the folder class{c}) in a CSV file
of (path, label) rows, reads them back with the csv module and trains two epochs on them with
the ImageNet example's transform. Each image of class c has its blue channel at about 40 + 50c:
the script reads each sample's class back from its pixels and counts the samples whose label
disagrees. OUT gets the sample count, that count and the batches' layout. With --accelerate it
trains on the loader Hugging Face Accelerate's `prepare` gives for it (on the CPU), as scripts
written for Accelerate do. With --derived it lists no labels: its Dataset (`ByName`) globs the
files and derives each label from the path, as scripts for Kaggle's dogs and cats do. With --course
its Dataset (`ImageFolderCustom`) is written as a much-copied PyTorch course writes it: a method of
its own opens each image, the label is its folder's, the transform applied in the return.
"""

import csv
import glob
import json
import os
import sys
from pathlib import Path

import torchvision.transforms as T
from PIL import Image
from torch.utils.data import DataLoader, Dataset

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


class ImageCsv(Dataset):
    def __init__(self, csv_file, transform=None):
        with open(csv_file) as f:
            rows = list(csv.reader(f))
        self.paths = [row[0] for row in rows]
        self.labels = [int(row[1]) for row in rows]
        self.transform = transform

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, idx):
        img_path = self.paths[idx]
        image = Image.open(img_path).convert("RGB")
        label = self.labels[idx]
        if self.transform:
            image = self.transform(image)
        return image, label


class ByName(Dataset):
    def __init__(self, root, transform=None):
        self.files = sorted(glob.glob(os.path.join(root, "*", "*.jpg")))
        self.transform = transform

    def __len__(self):
        return len(self.files)

    def __getitem__(self, idx):
        path = self.files[idx]
        image = Image.open(path).convert("RGB")
        label = os.path.basename(os.path.dirname(path))
        label = int(label[len("class"):]) if label.startswith("class") else -1
        if self.transform:
            image = self.transform(image)
        return image, label


class ImageFolderCustom(Dataset):
    def __init__(self, targ_dir, transform=None):
        self.paths = sorted(Path(targ_dir).glob("*/*.jpg"))
        self.transform = transform
        self.classes = sorted(entry.name for entry in os.scandir(targ_dir) if entry.is_dir())
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}

    def load_image(self, index: int) -> Image.Image:
        "Opens an image via a path and returns it."
        image_path = self.paths[index]
        return Image.open(image_path)

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, index: int):
        "Returns one sample of data, data and label (X, y)."
        img = self.load_image(index)
        class_name = self.paths[index].parent.name  # expects path in data_folder/class_name/image.jpeg
        class_idx = self.class_to_idx[class_name]
        if self.transform:
            return self.transform(img), class_idx
        else:
            return img, class_idx


def main():
    data, out = Path(sys.argv[1]), sys.argv[2]
    with open("images.csv", "w", newline="") as f:
        csv.writer(f).writerows([str(p), p.parent.name[len("class"):]] for p in sorted(data.rglob("*.jpg")))
    transform = T.Compose([T.RandomResizedCrop(64, scale=(0.5, 1.0)), T.RandomHorizontalFlip(), T.ToTensor(),
                           T.Normalize(MEAN, STD)])
    dataset = ByName(data, transform) if "--derived" in sys.argv else ImageFolderCustom(data, transform) \
        if "--course" in sys.argv else ImageCsv("images.csv", transform)
    loader = DataLoader(dataset, batch_size=16, shuffle=True, num_workers=2)
    if "--accelerate" in sys.argv:
        from accelerate import Accelerator

        loader = Accelerator(cpu=True).prepare(loader)
    seen, wrong, layout = 0, 0, None
    for epoch in range(2):
        for images, labels in loader:
            blue = (images[:, 2] * STD[2] + MEAN[2]) * 255
            guessed = ((blue.mean(dim=(1, 2)) - 55) / 50).round().long()
            wrong += int((guessed != labels).sum())
            seen += len(labels)
            layout = [str(images.dtype), list(images.shape[1:]), images.is_contiguous(), str(labels.dtype)]
    with open(out, "w") as f:
        json.dump({"seen": seen, "wrong": wrong, "layout": layout}, f)


if __name__ == "__main__":
    main()
