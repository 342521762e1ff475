"""A training script's loop over a torchvision ImageFolder, as scripts write it; run plain or
under `fastdata run` by tests/tools/test_run_torchvision.py.

    python train_torchvision.py DATA OUT.json {v1,v2,eval,lambda,timm,timm_train} {WORKERS,default,generator} [EPOCHS]

timm_train reads the folder as timm's train.py does: timm's create_dataset and create_loader
(interpolation 'random', its prefetcher normalizing the uint8 batches; WORKERS workers, 1 for
default).

Each image of class c has its blue channel at about 40 + 50c (tests/tools/test_run_torchvision.py
makes them): the script reads each sample's class back from its pixels and counts the samples
whose label disagrees, so a batch whose labels do not belong to its images is seen. OUT gets
the batches' dtype, shape, contiguity, sample count and that count.
"""

import json
import sys

import torch
import torchvision
import torchvision.transforms as T
import torchvision.transforms.v2 as v2

data, out, kind, workers = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]  # a count, "default", "generator"
epochs = int(sys.argv[5]) if len(sys.argv) > 5 else 2
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
transform = {
    "v1": T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)]),
    "v2": v2.Compose([v2.RandomResizedCrop(64), v2.RandomHorizontalFlip(), v2.ToImage(),
                      v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]),
    "eval": T.Compose([T.Resize(72), T.CenterCrop(64), T.PILToTensor()]),
    "lambda": T.Compose([T.RandomResizedCrop(64), T.ToTensor(), T.Lambda(lambda x: x * 2)]),
}.get(kind)
if kind == "timm":
    # timm's training transform, as DeiT's and ConvNeXt's main.py make theirs (without the colour ops,
    # so that the class stays readable): RandomResizedCropAndInterpolation, flip, MaybeToTensor, Normalize
    from timm.data import create_transform

    transform = create_transform(64, is_training=True, color_jitter=None, interpolation="bicubic")
if kind == "timm_train":
    from timm.data import create_dataset, create_loader

    dataset = create_dataset("", root=data, split="train", is_training=True)
    loader = create_loader(dataset, (3, 64, 64), 16, is_training=True, use_prefetcher=True, interpolation="random",
                           color_jitter=None, mean=MEAN, std=STD,
                           num_workers=1 if workers == "default" else int(workers), device=torch.device("cpu"))
else:
    dataset = torchvision.datasets.ImageFolder(data, transform)
    # "generator": the default count, the shuffle drawn from a generator of the script's
    given = {} if workers == "default" else {"generator": torch.Generator().manual_seed(0)} if workers == "generator" \
        else {"num_workers": int(workers)}
    loader = torch.utils.data.DataLoader(dataset, batch_size=16, shuffle=True, pin_memory=True, **given)

seen, wrong, layout = 0, 0, None
for epoch in range(epochs):
    for images, labels in loader:
        images = images.to("cpu", non_blocking=True)
        blue = images[:, 2].float()
        if kind in ("v1", "v2", "timm", "timm_train"):
            blue = blue * STD[2] + MEAN[2]
        elif kind == "lambda":
            blue = blue / 2
        if kind != "eval":
            blue = blue * 255
        guessed = ((blue.mean(dim=(1, 2)) - 55) / 50).round().long()
        wrong += int((guessed != labels).sum())
        seen += len(labels)
        layout = [str(images.dtype), list(images.shape[1:]), images.is_contiguous(), type(images).__name__,
                  str(labels.dtype)]
with open(out, "w") as f:
    json.dump({"seen": seen, "wrong": wrong, "layout": layout,
               "workers": getattr(loader, "loader", loader).num_workers}, f)  # (timm's prefetcher holds the loader)
