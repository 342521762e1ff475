"""The public surface, named: a public name that disappears (or appears) fails here, on purpose."""

import inspect

import fastdata

PUBLIC = ["DataError", "Loader", "__version__", "loader", "profile", "transforms"]
TRANSFORMS = ["CenterCrop", "ColorJitter", "Compose", "CutMix", "IMAGENET_MEAN", "IMAGENET_STD", "LabelSmoothing",
              "MixUp", "Normalize", "RandomHorizontalFlip",
              "RandomResizedCrop", "Resize", "TrivialAugment", "imagenet_eval", "imagenet_train"]
LOADER_METHODS = ["load_state_dict", "set_epoch", "state_dict"]


def test_public_names():
    assert sorted(fastdata.__all__) == PUBLIC
    for name in PUBLIC:
        assert hasattr(fastdata, name)


def test_loader_object_surface():
    for name in LOADER_METHODS:
        assert callable(getattr(fastdata.Loader, name))
    params = inspect.signature(fastdata.loader).parameters
    assert list(params)[:2] == ["source", "batch_size"]
    assert params["batch_size"].default == 1


def test_data_error_is_a_runtime_error():
    err = fastdata.DataError("cannot decode a.jpg: truncated", path="a.jpg")
    assert isinstance(err, RuntimeError) and err.path == "a.jpg" and "a.jpg" in str(err)


def test_transforms_surface():
    assert sorted(fastdata.transforms.__all__) == sorted(TRANSFORMS)
