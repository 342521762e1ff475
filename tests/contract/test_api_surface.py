"""The public surface, named: a public name that disappears (or appears) fails here, on purpose."""

import inspect

import pytest

import fastdata

PUBLIC = ["DataError", "Loader", "__version__", "loader", "profile", "samplers", "transforms"]
TRANSFORMS = ["CenterCrop", "ColorJitter", "Compose", "CutMix", "IMAGENET_MEAN", "IMAGENET_STD", "LabelSmoothing",
              "MixUp", "Normalize", "RandomHorizontalFlip",
              "RandomResizedCrop", "Resize", "TrivialAugment", "imagenet_eval", "imagenet_train"]
LOADER_METHODS = ["load_state_dict", "set_epoch", "state_dict"]
SAMPLERS = ["CurriculumSampler", "RepeatFactorSampler", "WeightedSampler"]
SAMPLER_METHODS = ["indices", "load_state_dict", "set_epoch", "state_dict"]


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


def test_samplers_surface():
    import torch

    assert sorted(fastdata.samplers.__all__) == SAMPLERS
    for name in SAMPLERS:
        cls = getattr(fastdata.samplers, name)
        assert issubclass(cls, torch.utils.data.Sampler)
        for method in SAMPLER_METHODS:
            assert callable(getattr(cls, method))


IMAGE_KEYWORDS = ["backend", "channels_last", "config", "device", "drop_last", "dtype", "hw_decoder_load", "num_workers",
                  "on_error", "persistent_workers", "pin_memory", "placement", "prefetch_factor", "rank", "sampler",
                  "seed", "shuffle", "timeout", "transform", "world_size"]


def test_every_keyword_is_accepted(tmp_path):
    """A keyword that disappears (or appears) from either mode fails here: image mode's own,
    and in drop-in mode every DataLoader keyword plus `device`."""
    import torch
    from PIL import Image

    from fastdata import factory

    assert sorted(factory._IMAGE_KEYWORDS) == IMAGE_KEYWORDS
    (tmp_path / "a").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "a" / "0.jpg")
    for name in IMAGE_KEYWORDS:  # each is taken (not refused as unknown) by the image factory
        value = {"backend": "pil", "config": None, "device": "cpu", "dtype": torch.float32, "placement": "cpu",
                 "on_error": "raise", "transform": None, "hw_decoder_load": None,
                 "sampler": fastdata.samplers.WeightedSampler([1.0])}.get(name)
        if name == "hw_decoder_load" or name == "config":
            continue  # dali-only / a file: covered by their own tests
        kwargs = {name: value} if value is not None else {}
        fastdata.loader(str(tmp_path), batch_size=1, **kwargs)
    dropin = set(inspect.signature(torch.utils.data.DataLoader.__init__).parameters) - {"self", "dataset"}
    assert set(factory._DROPIN_KEYWORDS) == dropin | {"device"}
    with pytest.raises(TypeError, match="unexpected keyword argument 'shuffel'"):
        fastdata.loader(torch.utils.data.TensorDataset(torch.zeros(2)), shuffel=True)
