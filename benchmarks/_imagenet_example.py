"""A training script's data pipeline as the PyTorch ImageNet example writes it, unchanged in
shape: `ImageFolder` + RandomResizedCrop(224), RandomHorizontalFlip, ToTensor, Normalize,
`DataLoader(shuffle=True, batch_size=256, num_workers=..., pin_memory=True)`, a fresh iterator
(fresh workers) each epoch. `run_torchvision.py` times it plain and under `fastdata run`.

With `--split` it trains on 90% of the folder, as tutorials split one with `random_split`; with
`--join` on two folders joined (`train + extra`, a ConcatDataset: here the folder's even and odd
files, each an ImageFolder of its own); with `--wrap` on the 90% split given its transform by the
script's own Dataset class (`TransformedSubset`, the common answer for a split's own transforms);
with `--files` on the folder's files listed in a CSV file (path, label), read back by the script's
own Dataset class, which opens each path with Pillow (`ImageFiles`, as scripts with a CSV of their
images write it); with `--files read`, which reads each with torchvision.io's `read_image`, as the
PyTorch tutorial's CustomImageDataset does (`TensorFiles`), the transform v2's on the uint8 tensor
(RandomResizedCrop(224) antialiased, flip, ToDtype(float32, scale), Normalize); with `--files
named`, a CSV of each file's stem and its class's name, the script's class making the path in an
f-string, opening it as torchvision's pil_loader does (`with open(...)`) and mapping the class's
name to its number by a dict (`NamedFiles`, as Kaggle scripts write theirs); with `--files
derived`, the files linked into one folder, each named by its class first (`3_00000012.JPEG`),
globbed, the class derived from the name by the script's own line (`LabelledByName`, as scripts
for Kaggle's dogs and cats derive theirs); with `--files course`, the folder's files globbed by a
PyTorch course's much-copied `ImageFolderCustom`, which opens each in a method of its own, takes
the class from its folder's name and applies the transform in its return; with `--files food101`, torchvision's own `Food101` dataset, the folder's files laid out beside it as its
download lays out its images (hard links), as fine-tuning scripts train on it; with `--files pets`,
torchvision's `OxfordIIITPet` over them so; with `--files places365`, torchvision's `Places365` over
them so (its lists' md5 check, of files written here, the one line added); with `--files caltech101`,
torchvision's `Caltech101` over them so (its `__getitem__` imports scipy).
With `--recipe ta_wide`, `ra` or `augmix` the transform is torchvision's references' training
preset (`references/classification/presets.py`, v1) with that auto-augment policy and
`--random-erase 0.1`, as its recipes train: RandomResizedCrop(224, bilinear), flip,
TrivialAugmentWide, RandAugment or AugMix (bilinear, severity 3), PILToTensor, ConvertImageDtype(float),
Normalize, RandomErasing(0.1); with `--backend tensor` too, the preset's tensor backend
(PILToTensor first: the crop, the flip and the auto-augment on the uint8 tensor, torchvision's
tensor kernels). With `--mixup` the loader's collate_fn is the references' for
`--mixup-alpha 0.2 --cutmix-alpha 1.0`: default_collate, then MixUp or CutMix (transforms.v2).
With `--recipe rotate` it is the ImageNet example's with RandomRotation(15) after the flip, as
fine-tuning tutorials add it; with `--recipe rgb`, the example's with `Lambda(lambda x:
x.convert("RGB"))` first, as scripts put it for files that may be grey; with `--recipe crop`, Resize(256) then RandomCrop(224) in place of
RandomResizedCrop, as older and fine-grained recipes crop; with `--recipe eval`, the example's
validation loader (Resize(256), CenterCrop(224), ToTensor, Normalize; not shuffled); with `--recipe
tiny`, a Tiny ImageNet script's (its 64x64 images: RandomCrop(64, padding=4), flip, ToTensor,
Normalize); with `--recipe tiny_pad`, the same written as Pad(4), then RandomCrop(64) (either
padded in `--padding-mode`, constant by default); with `--recipe
simclr`, SimCLR's ImageNet augmentation (one view); with `--recipe moco`,
MoCo v1's augmentation in MoCo's `TwoCropsTransform` (two views of each image, the loop moving both,
as main_moco.py does); with `--recipe moco_v2`, MoCo v2's (main_moco.py --aug-plus: its own
GaussianBlur class, the flip after it); with `--recipe deit`, DeiT's main.py `build_transform`
(timm's `create_transform` with DeiT's defaults: bicubic, RandAugment rand-m9-mstd0.5-inc1,
RandomErasing 0.25 'pixel'; timm must be installed); with `--recipe timm_train`, timm's train.py
data path with its defaults: timm's `create_dataset` and `create_loader`
(RandomResizedCropAndInterpolation 'random', flip, ColorJitter(0.4), uint8 samples, timm's
fast_collate, persistent workers, its prefetcher normalizing on the device); with `--recipe
timm_deit`, the same with DeiT's augmentation as train.py's flags give it (`--aa
rand-m9-mstd0.5-inc1 --reprob 0.25 --mixup 0.8 --cutmix 1.0 --smoothing 0.1`: timm's RandAugment in
place of the ColorJitter, its FastCollateMixup as the collate_fn, the erasing in its prefetcher).
With `--ra-sampler` the loader's sampler is the references' `--ra-sampler` one (repeated
augmentation: each index three times, shuffled by seed + epoch; one replica here), as their
ResNet-50 and ViT recipes train (tests/run_scripts/train_samplers.py writes it as they do).
With `--arch resnet18` on a CUDA device it trains the model (bf16 autocast, channels_last, SGD)
as the step; with `--arch none` (the default without a GPU) the step is the copy to the device.
The last line printed is JSON: images/s of each epoch.

    python benchmarks/_imagenet_example.py DATA [--epochs 3] [--workers 2] [--arch none] [--split] [--join] [--wrap]
                                                [--files [{pil,read,named,derived,course,food101,pets,
                                                           places365}]]
                                                [--mixup]
                                                [--recipe {imagenet,ta_wide,ra,augmix,rotate,affine,crop,eval,tiny,
                                                           tiny_pad,simclr,moco,moco_v2,dino,deit,timm_train,
                                                           timm_deit}]
                                                [--ra-sampler]
"""

import argparse
import csv
import glob
import importlib.util
import json
import os
import random
import time
from pathlib import Path

import torch
import torchvision
import torchvision.transforms as transforms
from PIL import Image, ImageFilter, ImageOps
from torchvision.io import read_image

ap = argparse.ArgumentParser()
ap.add_argument("data")
ap.add_argument("--epochs", type=int, default=3)
ap.add_argument("--workers", type=int, default=2)
ap.add_argument("--batch-size", type=int, default=256)
ap.add_argument("--arch", default="none")
ap.add_argument("--split", action="store_true")
ap.add_argument("--join", action="store_true")
ap.add_argument("--wrap", action="store_true")
ap.add_argument("--files", nargs="?", const="pil",
                choices=["pil", "read", "named", "derived", "course", "food101", "pets", "places365", "caltech101"])
ap.add_argument("--recipe", choices=["imagenet", "ta_wide", "ra", "augmix", "rotate", "affine", "crop", "eval",
                                     "tiny", "tiny_pad", "simclr", "moco", "moco_v2", "dino", "deit", "timm_train",
                                     "timm_deit", "rgb"],
                default="imagenet")
ap.add_argument("--mixup", action="store_true")
ap.add_argument("--ra-sampler", action="store_true")
ap.add_argument("--backend", choices=["pil", "tensor"], default="pil")
ap.add_argument("--padding-mode", default="constant")
args = ap.parse_args()

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])


class TwoCropsTransform:  # MoCo's (moco/loader.py), as it is written there
    """Take two random crops of one image as the query and key."""

    def __init__(self, base_transform):
        self.base_transform = base_transform

    def __call__(self, x):
        q = self.base_transform(x)
        k = self.base_transform(x)
        return [q, k]


class TransformedSubset(torch.utils.data.Dataset):  # a split's own transform, as scripts write it
    def __init__(self, subset, transform=None):
        self.subset = subset
        self.transform = transform

    def __getitem__(self, index):
        x, y = self.subset[index]
        if self.transform:
            x = self.transform(x)
        return x, y

    def __len__(self):
        return len(self.subset)


class ImageFiles(torch.utils.data.Dataset):  # a CSV of image files, as scripts write it
    def __init__(self, csv_file, transform=None):
        with open(csv_file) as f:
            rows = list(csv.reader(f))
        self.image_paths = [path for path, _ in rows]
        self.labels = [int(label) for _, label in rows]
        self.transform = transform

    def __len__(self):
        return len(self.image_paths)

    def __getitem__(self, idx):
        image = Image.open(self.image_paths[idx]).convert("RGB")
        label = self.labels[idx]
        if self.transform:
            image = self.transform(image)
        return image, label


class TensorFiles(ImageFiles):  # the same, read as uint8 tensors
    def __getitem__(self, idx):
        img_path = self.image_paths[idx]
        image = read_image(img_path)
        label = self.labels[idx]
        if self.transform:
            image = self.transform(image)
        return image, label


class NamedFiles(torch.utils.data.Dataset):  # a CSV of file stems and class names, as Kaggle scripts write it
    def __init__(self, root, csv_file, transform=None):
        with open(csv_file) as f:
            rows = list(csv.reader(f))
        self.root = root
        self.ids = [stem for stem, _ in rows]
        self.names = [name for _, name in rows]
        self.class_to_idx = {name: k for k, name in enumerate(sorted(set(self.names)))}
        self.transform = transform

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, idx):
        label = self.class_to_idx[self.names[idx]]
        with open(f"{self.root}/{self.ids[idx]}.JPEG", "rb") as f:
            img = Image.open(f)
            img = img.convert("RGB")
        if self.transform is not None:
            img = self.transform(img)
        return img, label


class LabelledByName(torch.utils.data.Dataset):  # files whose class is in their name, as Kaggle's dogs and cats are
    def __init__(self, file_list, transform=None):
        self.file_list = file_list
        self.transform = transform

    def __len__(self):
        return len(self.file_list)

    def __getitem__(self, idx):
        img_path = self.file_list[idx]
        img = Image.open(img_path).convert("RGB")
        label = int(os.path.basename(img_path).split("_")[0])
        if self.transform:
            img = self.transform(img)
        return img, label


class ImageFolderCustom(torch.utils.data.Dataset):  # a PyTorch course's, as it writes it (its glob's extension ours)
    def __init__(self, targ_dir, transform=None):
        self.paths = list(Path(targ_dir).glob("*/*.JPEG"))
        self.transform = transform
        self.classes = sorted(entry.name for entry in os.scandir(targ_dir) if entry.is_dir())
        self.class_to_idx = {cls_name: i for i, cls_name in enumerate(self.classes)}

    def load_image(self, index: int) -> Image.Image:
        "Opens an image via a path and returns it."
        image_path = self.paths[index]
        return Image.open(image_path)

    def __len__(self) -> int:
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


class GaussianBlur(object):  # MoCo v2's (moco/loader.py), as it is written there
    """Gaussian blur augmentation in SimCLR https://arxiv.org/abs/2002.05709"""

    def __init__(self, sigma=[.1, 2.]):
        self.sigma = sigma

    def __call__(self, x):
        sigma = random.uniform(self.sigma[0], self.sigma[1])
        x = x.filter(ImageFilter.GaussianBlur(radius=sigma))
        return x


class DinoGaussianBlur(object):  # DINO's (dino/utils.py GaussianBlur), as it is written there
    """
    Apply Gaussian Blur to the PIL image.
    """
    def __init__(self, p=0.5, radius_min=0.1, radius_max=2.):
        self.prob = p
        self.radius_min = radius_min
        self.radius_max = radius_max

    def __call__(self, img):
        do_it = random.random() <= self.prob
        if not do_it:
            return img

        return img.filter(
            ImageFilter.GaussianBlur(
                radius=random.uniform(self.radius_min, self.radius_max)
            )
        )


class Solarization(object):  # DINO's (dino/utils.py), as it is written there
    """
    Apply Solarization to the PIL image.
    """
    def __init__(self, p):
        self.p = p

    def __call__(self, img):
        if random.random() < self.p:
            return ImageOps.solarize(img)
        else:
            return img


class DataAugmentationDINO(object):  # DINO's (main_dino.py), as it is written there
    def __init__(self, global_crops_scale, local_crops_scale, local_crops_number):
        flip_and_color_jitter = transforms.Compose([
            transforms.RandomHorizontalFlip(p=0.5),
            transforms.RandomApply(
                [transforms.ColorJitter(brightness=0.4, contrast=0.4, saturation=0.2, hue=0.1)],
                p=0.8
            ),
            transforms.RandomGrayscale(p=0.2),
        ])
        normalize = transforms.Compose([
            transforms.ToTensor(),
            transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
        ])

        # first global crop
        self.global_transfo1 = transforms.Compose([
            transforms.RandomResizedCrop(224, scale=global_crops_scale, interpolation=Image.BICUBIC),
            flip_and_color_jitter,
            DinoGaussianBlur(1.0),
            normalize,
        ])
        # second global crop
        self.global_transfo2 = transforms.Compose([
            transforms.RandomResizedCrop(224, scale=global_crops_scale, interpolation=Image.BICUBIC),
            flip_and_color_jitter,
            DinoGaussianBlur(0.1),
            Solarization(0.2),
            normalize,
        ])
        # transformation for the local small crops
        self.local_crops_number = local_crops_number
        self.local_transfo = transforms.Compose([
            transforms.RandomResizedCrop(96, scale=local_crops_scale, interpolation=Image.BICUBIC),
            flip_and_color_jitter,
            DinoGaussianBlur(p=0.5),
            normalize,
        ])

    def __call__(self, image):
        crops = []
        crops.append(self.global_transfo1(image))
        crops.append(self.global_transfo2(image))
        for _ in range(self.local_crops_number):
            crops.append(self.local_transfo(image))
        return crops


if args.recipe in ("timm_train", "timm_deit"):  # made below, by timm
    transform = None
elif args.recipe == "deit":  # DeiT's main.py build_transform(is_train=True, args) with its defaults
    from timm.data import create_transform

    transform = create_transform(
        input_size=224,
        is_training=True,
        color_jitter=0.3,
        auto_augment='rand-m9-mstd0.5-inc1',
        interpolation='bicubic',
        re_prob=0.25,
        re_mode='pixel',
        re_count=1,
    )
elif args.recipe == "dino":  # DINO's multi-crop (main_dino.py's defaults): two global views and eight local ones
    transform = DataAugmentationDINO((0.4, 1.), (0.05, 0.4), 8)
elif args.recipe == "moco_v2":  # MoCo v2's augmentation (main_moco.py --aug-plus), two views of each image
    transform = TwoCropsTransform(transforms.Compose([
        transforms.RandomResizedCrop(224, scale=(0.2, 1.)),
        transforms.RandomApply([transforms.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8),
        transforms.RandomGrayscale(p=0.2),
        transforms.RandomApply([GaussianBlur([.1, 2.])], p=0.5),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        normalize,
    ]))
elif args.recipe == "moco":  # MoCo v1's augmentation (main_moco.py without --aug-plus), two views of each image
    transform = TwoCropsTransform(transforms.Compose([
        transforms.RandomResizedCrop(224, scale=(0.2, 1.0)),
        transforms.RandomGrayscale(p=0.2),
        transforms.ColorJitter(0.4, 0.4, 0.4, 0.4),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        normalize,
    ]))
elif args.recipe == "simclr":  # SimCLR's ImageNet augmentation (one view), in torchvision's ops
    transform = transforms.Compose([
        transforms.RandomResizedCrop(224),
        transforms.RandomHorizontalFlip(),
        transforms.RandomApply([transforms.ColorJitter(0.8, 0.8, 0.8, 0.2)], p=0.8),
        transforms.RandomGrayscale(p=0.2),
        transforms.RandomApply([transforms.GaussianBlur(23, sigma=(0.1, 2.0))], p=0.5),
        transforms.ToTensor(),
        normalize,
    ])
elif args.recipe in ("tiny", "tiny_pad"):  # a Tiny ImageNet script's, on 64x64 images
    transform = transforms.Compose([
        *([transforms.Pad(4, padding_mode=args.padding_mode), transforms.RandomCrop(64)] if args.recipe == "tiny_pad"
          else [transforms.RandomCrop(64, padding=4, padding_mode=args.padding_mode)]),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        normalize,
    ])
elif args.recipe == "eval":  # the example's val_loader transform
    transform = transforms.Compose([
        transforms.Resize(256),
        transforms.CenterCrop(224),
        transforms.ToTensor(),
        normalize,
    ])
elif args.recipe in ("imagenet", "rotate", "affine", "crop", "rgb"):
    transform = transforms.Compose([
        *([transforms.Lambda(lambda x: x.convert("RGB"))] if args.recipe == "rgb" else []),
        *([transforms.Resize(256), transforms.RandomCrop(224)] if args.recipe == "crop" else
          [transforms.RandomResizedCrop(224)]),
        transforms.RandomHorizontalFlip(),
        *([transforms.RandomRotation(15)] if args.recipe == "rotate" else []),
        *([transforms.RandomAffine(10, translate=(0.1, 0.1), scale=(0.9, 1.1))] if args.recipe == "affine" else []),
        transforms.ToTensor(),
        normalize,
    ])
else:
    bilinear = transforms.InterpolationMode.BILINEAR
    augment = {"ta_wide": lambda: transforms.TrivialAugmentWide(interpolation=bilinear),
               "ra": lambda: transforms.RandAugment(interpolation=bilinear, magnitude=9),
               "augmix": lambda: transforms.AugMix(interpolation=bilinear, severity=3)}[args.recipe]()
    tensor = args.backend == "tensor"  # (the preset's --backend)
    transform = transforms.Compose([
        *([transforms.PILToTensor()] if tensor else []),
        transforms.RandomResizedCrop(224, interpolation=bilinear, antialias=True),
        transforms.RandomHorizontalFlip(0.5),
        augment,
        *([] if tensor else [transforms.PILToTensor()]),
        transforms.ConvertImageDtype(torch.float),
        normalize,
        transforms.RandomErasing(p=0.1),
    ])
if args.recipe in ("timm_train", "timm_deit"):  # timm's train.py: create_dataset and create_loader, its defaults
    from timm.data import FastCollateMixup, create_dataset, create_loader

    deit = args.recipe == "timm_deit"  # (train.py with --aa rand-m9-mstd0.5-inc1 --reprob 0.25 --mixup 0.8 ...)
    dataset_train = create_dataset('', root=args.data, split='train', is_training=True, batch_size=args.batch_size)
    collate_fn = FastCollateMixup(mixup_alpha=0.8, cutmix_alpha=1.0, prob=1.0, switch_prob=0.5, mode='batch',
                                  label_smoothing=0.1, num_classes=len(dataset_train.reader.class_to_idx)) \
        if deit else None
    train_loader = create_loader(
        dataset_train, input_size=(3, 224, 224), batch_size=args.batch_size, is_training=True, no_aug=False,
        re_prob=0.25 if deit else 0., re_mode='pixel', re_count=1, scale=[0.08, 1.0], ratio=[3. / 4., 4. / 3.],
        hflip=0.5, vflip=0., color_jitter=0.4, auto_augment='rand-m9-mstd0.5-inc1' if deit else None,
        interpolation='random', mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), num_workers=args.workers,
        distributed=False, collate_fn=collate_fn, pin_memory=False, device=device, use_prefetcher=True,
        use_multi_epochs_loader=False, worker_seeding='all')
    train_sampler = None
else:
    train_dataset = torchvision.datasets.ImageFolder(args.data, None if args.wrap else transform)
    if args.join:
        def odd(path):  # every other file of each class (the set puts file i in class i % 10)
            return int(Path(path).stem) // 10 % 2 == 1

        train_dataset = torchvision.datasets.ImageFolder(args.data, transform, is_valid_file=lambda p: not odd(p)) \
            + torchvision.datasets.ImageFolder(args.data, transform, is_valid_file=odd)
    if args.split or args.wrap:
        train_dataset, _ = torch.utils.data.random_split(train_dataset, [0.9, 0.1],
                                                         generator=torch.Generator().manual_seed(42))
    if args.wrap:
        train_dataset = TransformedSubset(train_dataset, transform)
    if args.files == "pets":  # the same files as OxfordIIITPet's download lays them out, beside the folder
        pets = Path(args.data).with_name(Path(args.data).name + "-pets") / "oxford-iiit-pet"
        rows = []
        for path, y in train_dataset.samples:
            image_id = f"{train_dataset.classes[y]}_{Path(path).stem}"  # (its class: the id's part before the last _)
            rows.append(f"{image_id} {y + 1} {y % 2 + 1} 1\n")
            if not (pets / "images" / f"{image_id}.jpg").exists():
                (pets / "images").mkdir(parents=True, exist_ok=True)
                os.link(path, pets / "images" / f"{image_id}.jpg")
        (pets / "annotations").mkdir(exist_ok=True)
        (pets / "annotations" / "trainval.txt").write_text("".join(rows))
        train_dataset = torchvision.datasets.OxfordIIITPet(pets.parent, transform=transform)
    elif args.files == "food101":  # the same files as Food101's download lays them out, beside the folder
        food = Path(args.data).with_name(Path(args.data).name + "-food101")
        meta = {}
        for path, _ in train_dataset.samples:
            name = f"{Path(path).parent.name}/{Path(path).stem}"
            meta.setdefault(Path(path).parent.name, []).append(name)
            if not (food / "food-101" / "images" / f"{name}.jpg").exists():
                (food / "food-101" / "images" / name).parent.mkdir(parents=True, exist_ok=True)
                os.link(path, food / "food-101" / "images" / f"{name}.jpg")
        (food / "food-101" / "meta").mkdir(exist_ok=True)
        (food / "food-101" / "meta" / "train.json").write_text(json.dumps(meta))
        train_dataset = torchvision.datasets.Food101(food, transform=transform)
    elif args.files == "places365":  # the same files as Places365's download lays them out, beside the folder
        places = Path(args.data).with_name(Path(args.data).name + "-places365")
        rows = []
        for path, y in train_dataset.samples:
            name = f"/{Path(path).parent.name}/{Path(path).name}"
            rows.append(f"{name} {y}\n")
            if not (places / "data_large_standard" / name[1:]).exists():
                (places / "data_large_standard" / name[1:]).parent.mkdir(parents=True, exist_ok=True)
                os.link(path, places / "data_large_standard" / name[1:])
        (places / "categories_places365.txt").write_text("".join(f"/c/{c} {y}\n"
                                                                  for y, c in enumerate(train_dataset.classes)))
        (places / "places365_train_standard.txt").write_text("".join(rows))
        torchvision.datasets.Places365._check_integrity = lambda self, *args: True  # (synthetic lists: not its md5)
        train_dataset = torchvision.datasets.Places365(places, transform=transform)
    elif args.files == "caltech101":  # the same files as Caltech101's download lays them out, beside the folder
        caltech = Path(args.data).with_name(Path(args.data).name + "-caltech101")
        (caltech / "caltech101" / "101_ObjectCategories" / "BACKGROUND_Google").mkdir(parents=True, exist_ok=True)
        numbers = {}
        for path, y in train_dataset.samples:
            numbers[y] = numbers.get(y, 0) + 1
            at = caltech / "caltech101" / "101_ObjectCategories" / train_dataset.classes[y] / \
                f"image_{numbers[y]:04d}.jpg"
            if not at.exists():
                at.parent.mkdir(parents=True, exist_ok=True)
                os.link(path, at)
        train_dataset = torchvision.datasets.Caltech101(caltech, transform=transform)
    elif args.files == "course":  # the folder's files, globbed by the course's class
        train_dataset = ImageFolderCustom(args.data, transform)
    elif args.files == "derived":  # the same files in one folder beside it, each named by its class first, globbed
        flat = Path(args.data).with_name(Path(args.data).name + "-flat")
        flat.mkdir(exist_ok=True)
        for path, y in train_dataset.samples:
            if not (flat / f"{y}_{Path(path).name}").exists():
                os.link(path, flat / f"{y}_{Path(path).name}")
        train_dataset = LabelledByName(sorted(glob.glob(os.path.join(flat, "*.JPEG"))), transform)
    elif args.files:  # the same files and labels, listed in a CSV file beside the folder
        listing = Path(args.data).with_suffix(".csv")
        with open(listing, "w", newline="") as f:
            if args.files == "named":  # (each file's stem under the folder, its class's name)
                csv.writer(f).writerows((os.path.splitext(os.path.relpath(path, args.data))[0],
                                         train_dataset.classes[y]) for path, y in train_dataset.samples)
            else:
                csv.writer(f).writerows(train_dataset.samples)
        if args.files == "read":
            import torchvision.transforms.v2 as v2

            transform = v2.Compose([v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip(),
                                    v2.ToDtype(torch.float32, scale=True), v2.Normalize(normalize.mean, normalize.std)])
        train_dataset = NamedFiles(args.data, listing, transform) if args.files == "named" else \
            (TensorFiles if args.files == "read" else ImageFiles)(listing, transform)
    if args.mixup:
        import torchvision.transforms.v2 as v2

        classes = len(train_dataset.classes)
        mixup_cutmix = v2.RandomChoice([v2.MixUp(alpha=0.2, num_classes=classes),
                                        v2.CutMix(alpha=1.0, num_classes=classes)])

        from torch.utils.data.dataloader import default_collate

        def mixup_collate(batch):  # (the references' collate_fn)
            return mixup_cutmix(*default_collate(batch))
    train_sampler = None
    if args.ra_sampler:
        spec = importlib.util.spec_from_file_location(
            "train_samplers", Path(__file__).resolve().parents[1] / "tests" / "run_scripts" / "train_samplers.py")
        samplers = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(samplers)
        train_sampler = samplers.RASampler(train_dataset, num_replicas=1, rank=0)
    train_loader = torch.utils.data.DataLoader(
        train_dataset, batch_size=args.batch_size, shuffle=train_sampler is None and args.recipe != "eval",
        num_workers=args.workers,
        pin_memory=True, sampler=train_sampler, collate_fn=mixup_collate if args.mixup else None)

model = None
if args.arch != "none":
    model = torchvision.models.__dict__[args.arch]().to(device).to(memory_format=torch.channels_last)
    criterion = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9, weight_decay=1e-4)

rates = []
for epoch in range(args.epochs):
    if train_sampler is not None:
        train_sampler.set_epoch(epoch)
    start, seen = time.perf_counter(), 0
    for images, target in train_loader:
        views = images if args.recipe in ("moco", "moco_v2", "dino") else [images]  # (each view of the image)
        views = [x.to(device, non_blocking=True) for x in views]
        target = target.to(device, non_blocking=True)
        if model is not None:
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = sum(criterion(model(x.contiguous(memory_format=torch.channels_last)), target) for x in views)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        seen += len(target)
    if device.type == "cuda":
        torch.cuda.synchronize()
    rates.append(seen / (time.perf_counter() - start))
print(json.dumps({"images_per_s": rates}))
