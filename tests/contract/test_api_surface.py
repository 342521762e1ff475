"""The public surface, named: a public name that disappears (or appears) fails here, on purpose."""

import inspect

import pytest

import fastdata

PUBLIC = ["DataError", "Loader", "__version__", "loader", "profile", "samplers", "transforms"]
TRANSFORMS = ["CenterCrop", "ColorJitter", "Compose", "CutMix", "IMAGENET_MEAN", "IMAGENET_STD", "LabelSmoothing",
              "MixUp", "Normalize", "RandAugment", "RandomHorizontalFlip",
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
    for name, says in (("generator", "for an image source; seed= takes its place"), ("in_order", "for an image source$"),
                       ("multiprocessing_context", "for an image source$")):
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{name}' {says}"):
            fastdata.loader(str(tmp_path), batch_size=1, **{name: None})


def _outcome(call):
    try:
        return [[t.tolist() for t in batch] for batch in call()]
    except Exception as e:  # noqa: BLE001 - the outcome compared is the exception's type
        return type(e).__name__


def test_a_call_written_for_dataloader_means_the_same(tmp_path):
    """DataLoader's positional arguments after batch_size, and its `dataset=` keyword, as
    DataLoader takes them (and refuses them); image mode refuses what DataLoader refuses of
    the keywords it shares, in DataLoader's words."""
    import torch
    from PIL import Image
    from torch.utils.data import DataLoader, TensorDataset

    ds = TensorDataset(torch.arange(10.0), torch.arange(10) % 3)
    calls = [lambda f: f(ds, 4, True, generator=torch.Generator().manual_seed(0)),
             lambda f: f(ds, 4, False, None, None, 0, None, False, True),  # ... drop_last=True by position
             lambda f: f(dataset=ds, batch_size=3),
             lambda f: f(ds, 4, True, shuffle=False),
             lambda f: f(ds, 4, *[None] * 12),
             lambda f: f(batch_size=3)]
    for call in calls:
        want = _outcome(lambda: call(DataLoader))
        assert _outcome(lambda: call(fastdata.loader)) == want
    assert isinstance(_outcome(lambda: calls[1](fastdata.loader)), list)  # the calls that succeed do succeed
    (tmp_path / "a").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "a" / "0.jpg")
    for kwargs, message in [({"timeout": -1}, "timeout option should be non-negative"),
                            ({"persistent_workers": True}, "persistent_workers option needs num_workers > 0"),
                            ({"persistent_workers": True, "num_workers": 0}, "needs num_workers > 0")]:
        with pytest.raises(ValueError, match=message):
            DataLoader(ds, **kwargs)
        with pytest.raises(ValueError, match=message):
            fastdata.loader(str(tmp_path), **kwargs)
    with pytest.raises(TypeError, match="'transform' .an image source's keyword, but list"):
        fastdata.loader([], transform=fastdata.transforms.imagenet_eval(8))
    compose = type("Compose", (), {"__module__": "torchvision.transforms.transforms"})  # torchvision's, by name
    with pytest.raises(TypeError, match=r"got torchvision.transforms.transforms.Compose: torchvision's transforms "
                                        r"run on a Dataset"):
        fastdata.loader(str(tmp_path), transform=compose())
