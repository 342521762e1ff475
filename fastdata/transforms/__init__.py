"""`fastdata.transforms`: one declarative augmentation pipeline that every backend runs.

    from fastdata import transforms as T
    T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.Normalize(T.IMAGENET_MEAN, T.IMAGENET_STD)])

Random parameters are a pure function of (seed, epoch, sample index), so a sample comes out
the same whatever the batch size, worker count or backend.
"""

from .ops import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    LabelSmoothing,
    MixUp,
    CenterCrop,
    ColorJitter,
    Compose,
    CutMix,
    Normalize,
    RandAugment,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
    TrivialAugment,
    imagenet_eval,
    imagenet_train,
)

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "LabelSmoothing",
    "MixUp",
    "CenterCrop",
    "ColorJitter",
    "Compose",
    "CutMix",
    "Normalize",
    "RandAugment",
    "RandomHorizontalFlip",
    "RandomResizedCrop",
    "Resize",
    "TrivialAugment",
    "imagenet_eval",
    "imagenet_train",
]
