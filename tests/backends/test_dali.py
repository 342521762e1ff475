"""The `dali` backend on the CPU (DALI runs CPU-only pipelines without a GPU), and its GPU decode
where a CUDA device is (marked gpu): the same batches as `pil` (and as `wds` over shards), the
same crop windows, resume, rank splits, and bad files caught before DALI sees them or isolated
after it failed. Images are flat colors that name their sample (see _images.py), so each image
says which sample it is."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from _images import color_folder, png_chunk
from PIL import Image

import fastdata
from fastdata import DataError
from fastdata import transforms as T
from fastdata.image.record import EntropyCheck
from fastdata.shard import write_shards

pytestmark = pytest.mark.dali

CLASSES, PER_CLASS = 3, 12
N = CLASSES * PER_CLASS
SIZE = 16
FLAT = T.Compose([T.Resize(SIZE), T.CenterCrop(SIZE)])
ALL = sorted((c, i) for c in range(CLASSES) for i in range(PER_CLASS))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return color_folder(tmp_path_factory.mktemp("imgs"), CLASSES, PER_CLASS, (20, 48), lambda i: f"{i:03d}.jpg")


@pytest.fixture(scope="module")
def pattern(folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("shards")
    write_shards(folder, out / "train-%06d.tar", max_count=10, workers=1)
    return str(out / "train-{000000..000003}.tar")


def _ids(images, labels):
    px = images[:, :, SIZE // 2, SIZE // 2].to(torch.int64)
    c = ((px[:, 0] - 20).float() / 40).round().long()
    i = ((px[:, 1] - 10).float() / 12).round().long()
    assert torch.equal(c, labels)
    return list(zip(c.tolist(), i.tolist()))


def _epoch(loader):
    return [_ids(x, y) for x, y in loader]


def _load(source, **kw):
    kw.setdefault("transform", FLAT)
    kw.setdefault("batch_size", 8)
    kw.setdefault("backend", "dali")
    return fastdata.loader(source, **kw)


# DALI decodes on the CPU, or with device="cuda" on the GPU (nvJPEG, the GPU's JPEG engine where
# it has one): the GPU path is what the `dali` backend is for, and runs only where CUDA is
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", DEVICES)
def test_same_batches_as_pil(folder, device):
    dali = _load(str(folder), shuffle=True, seed=4, device=device)
    pil = _load(str(folder), shuffle=True, seed=4, backend="pil")
    assert dali.backend == "dali" and len(dali) == len(pil) == 5
    for (x, y), (u, v) in zip(dali, pil):
        assert x.device.type == device
        x, y = x.cpu(), y.cpu()
        assert x.shape == u.shape and x.dtype == torch.uint8
        assert x.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(y, v)
        assert (x.float() - u.float()).abs().max() <= 2  # flat colors: only rounding differs
    assert sorted(s for b in _epoch(dali) for s in b) == ALL
    assert dali.stats["samples"] == 2 * N and dali.stats["batches"] == 10


@pytest.mark.parametrize("device", DEVICES)
def test_crop_windows_match_pil(tmp_path, device):
    """RandomResizedCrop + flip on images with structure: dali crops the window pil crops."""
    rng = np.random.default_rng(0)
    for k in range(12):
        x = np.linspace(0, 255, 96)[None, :, None] * np.ones((80, 1, 1))
        y = np.linspace(0, 255, 80)[:, None, None] * np.ones((1, 96, 1))
        a = np.concatenate([x, y, np.full((80, 96, 1), 40.0 * (k % 6))], axis=2)
        noise = rng.integers(-2, 3, a.shape)
        img = Image.fromarray(np.clip(a + noise, 0, 255).astype(np.uint8))
        (tmp_path / f"c{k % 2}").mkdir(exist_ok=True)
        img.save(tmp_path / f"c{k % 2}" / f"{k}.jpg", quality=95)
    rrc = T.Compose([T.RandomResizedCrop(32, scale=(0.2, 1.0)), T.RandomHorizontalFlip()])
    dali = _load(str(tmp_path), transform=rrc, batch_size=6, seed=1, device=device)
    pil = _load(str(tmp_path), transform=rrc, batch_size=6, seed=1, backend="pil")
    for (x, _), (u, _) in zip(dali, pil):
        diff = (x.cpu().float() - u.float()).abs()
        assert diff.mean() < 2.5, diff.mean()  # resampling differences only: a wrong window is off by tens


@pytest.mark.parametrize("device", DEVICES)
def test_normalized_output(folder, device):
    norm = T.Compose([T.Resize(SIZE), T.CenterCrop(SIZE), T.Normalize([0.5] * 3, [0.25] * 3)])
    for dtype in (torch.float32, torch.bfloat16):
        x, y = next(iter(_load(str(folder), transform=norm, dtype=dtype, device=device)))
        assert x.device.type == y.device.type == device
        x, y = x.cpu(), y.cpu()
        u, v = next(iter(_load(str(folder), transform=norm, dtype=dtype, backend="pil")))
        assert x.dtype == dtype and x.shape == (8, 3, SIZE, SIZE) and torch.equal(y, v)
        assert (x.float() - u.float()).abs().max() < 0.05


@pytest.mark.parametrize("device", DEVICES)
def test_shards(pattern, folder, device):
    dali = _load(pattern, shuffle=True, device=device)
    wds = _load(pattern, shuffle=True, backend="wds")
    assert dali.backend == "dali" and len(dali) == len(wds)
    assert _epoch(dali) == _epoch(wds)


@pytest.mark.parametrize("world,drop_last", [(2, False), (3, True)])
def test_ranks(folder, world, drop_last):
    shares = [[s for b in _epoch(_load(str(folder), shuffle=True, rank=r, world_size=world, drop_last=drop_last))
               for s in b] for r in range(world)]
    assert len({len(s) for s in shares}) == 1
    flat = [s for share in shares for s in share]
    if drop_last:
        assert len(set(flat)) == len(flat)
    else:
        assert set(flat) == set(ALL)


@pytest.mark.parametrize("device", DEVICES)
def test_epochs_and_resume(folder, device):
    a = _load(str(folder), shuffle=True, num_workers=2, device=device)
    e0, e1 = _epoch(a), _epoch(a)
    assert e0 != e1 and sorted(s for b in e1 for s in b) == ALL
    b = _load(str(folder), shuffle=True, device=device)
    b.set_epoch(1)
    assert _epoch(b) == e1
    for k in (1, 3):
        first = _load(str(folder), shuffle=True, device=device)
        it = iter(first)
        for _ in range(k):
            next(it)
        state = first.state_dict()
        del it
        second = _load(str(folder), shuffle=True, device=device)
        second.load_state_dict(state)
        assert _epoch(second) + _epoch(second) == (e0 + e1)[k:]
    left = _load(str(folder), shuffle=True, device=device)  # left early, then a new epoch: a fresh pipeline
    next(iter(left))
    left.set_epoch(1)
    assert _epoch(left) == e1


def _bad_files(tmp_path, folder):
    pairs = [(str(folder / f"class{c}" / f"{i:03d}.jpg"), c) for c in range(CLASSES) for i in range(PER_CLASS)]
    good = open(pairs[0][0], "rb").read()
    (tmp_path / "empty.jpg").write_bytes(b"")
    (tmp_path / "truncated.jpg").write_bytes(good[: len(good) * 6 // 10])
    (tmp_path / "text.jpg").write_bytes(b"not an image\n" * 30)
    bad = [str(tmp_path / n) for n in ("empty.jpg", "truncated.jpg", "text.jpg")]
    for k, path in enumerate(bad):
        pairs.insert(4 + 9 * k, (path, 0))
    return pairs, bad


@pytest.mark.parametrize("device", DEVICES)
def test_bad_files_raise_naming_the_file(tmp_path, folder, device):
    pairs, bad = _bad_files(tmp_path, folder)
    with pytest.raises(DataError, match=r"empty.jpg: empty file \(backend 'dali'\)"):
        _epoch(_load(pairs, device=device))


@pytest.mark.parametrize("device", DEVICES)
def test_bad_files_skipped(tmp_path, folder, device):
    pairs, bad = _bad_files(tmp_path, folder)
    loader = _load(pairs, shuffle=True, on_error="skip", device=device)
    flat = [s for b in _epoch(loader) for s in b]
    assert sorted(flat) == ALL  # every good sample exactly once
    assert loader.stats["skipped"] == 3 and {e["path"] for e in loader.stats["errors"]} == set(bad)


def test_dali_is_fed_full_batches(tmp_path, folder, monkeypatch):
    # A short batch (the epoch's last; one with samples left out) is filled up to the batch size,
    # so that DALI's buffers keep one shape: what comes out is the batch's own samples only.
    from fastdata.image.dali import DaliDecoders

    fed = []
    copy_out = DaliDecoders._copy_out
    monkeypatch.setattr(DaliDecoders, "_copy_out",
                        lambda self, images, n, size, pooled: fed.append((len(images), n))
                        or copy_out(self, images, n, size, pooled))
    pairs, bad = _bad_files(tmp_path, folder)
    loader = _load(pairs, shuffle=True, on_error="skip")
    batches = [(len(y), s) for y, s in ((y, _ids(x, y)) for x, y in loader)]
    assert sorted(s for _, b in batches for s in b) == ALL and loader.stats["skipped"] == 3
    assert [n for n, _ in batches] == [n for _, n in fed]
    assert {m for m, _ in fed} == {8} and sum(n for _, n in fed) == N  # N = 36: the last batch is short


def _no_quantization_table(path) -> bytes:
    """A JPEG whose header parses and whose end marker is there, but without its DQT segment:
    the structural checks pass, and decoding fails (in DALI and in Pillow)."""
    raw = open(path, "rb").read()
    out, i = bytearray(raw[:2]), 2
    while raw[i + 1] != 0xDA:
        length = int.from_bytes(raw[i + 2:i + 4], "big")
        if raw[i + 1] != 0xDB:
            out += raw[i:i + 2 + length]
        i += 2 + length
    return bytes(out + raw[i:])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_sample_dali_fails_on_is_isolated(tmp_path, folder, on_error, device, monkeypatch):
    # The native entropy check would refuse this file before DALI sees it; without it, the file
    # reaches DALI as any file the checks miss would.
    monkeypatch.setattr(EntropyCheck, "__call__", lambda self, index, datas, checked: checked)
    pairs = [(str(folder / f"class{c}" / f"{i:03d}.jpg"), c) for c in range(CLASSES) for i in range(PER_CLASS)]
    culprit = tmp_path / "no-dqt.jpg"
    culprit.write_bytes(_no_quantization_table(pairs[0][0]))
    with pytest.raises(OSError):
        Image.open(culprit).load()
    pairs.insert(19, (str(culprit), 0))
    loader = _load(pairs, on_error=on_error, device=device)
    if on_error == "raise":
        with pytest.raises(DataError, match="no-dqt.jpg"):
            _epoch(loader)
        return
    flat = [s for b in _epoch(loader) for s in b]
    assert sorted(flat) == ALL and loader.stats["skipped"] == 1
    assert loader.stats["errors"][0]["path"] == str(culprit)
    assert "cannot decode" in loader.stats["errors"][0]["cause"]  # found after DALI failed, not by the checks
    assert sorted(s for b in _epoch(loader) for s in b) == ALL  # and the next epoch leaves it out up front


def test_pixel_ops_are_refused(folder):
    with pytest.raises(ValueError, match="ColorJitter.*backend 'pil'"):
        _load(str(folder), transform=T.Compose([T.Resize(SIZE), T.CenterCrop(SIZE), T.ColorJitter(0.4)]))


def test_without_dali_the_error_names_the_package(folder, monkeypatch):
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)  # import fails as if not installed
    with pytest.raises(RuntimeError, match=r"backend 'dali': NVIDIA DALI is not installed; bash scripts/install.sh --dali \(or pip install '\.\[dali\]' in fastdata's checkout\) adds it"):
        _load(str(folder))


def test_auto_picks_dali_only_for_a_cuda_target(folder):
    assert _load(str(folder), backend="auto", device="cpu").backend == "pil"


def test_hw_decoder_load(folder):
    assert _load(str(folder), hw_decoder_load=0.9).hw_decoder_load == 0.9
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        _load(str(folder), hw_decoder_load=1.5)
    with pytest.raises(ValueError, match="backend 'pil' was picked"):
        _load(str(folder), hw_decoder_load=0.9, backend="pil")


def test_stage_timing(folder):
    loader = _load(str(folder))
    report = fastdata.profile(loader, steps=3, warmup=1)
    assert {"read", "decode", "collate", "deliver"} <= set(report.stages)
    assert report.stages["read"] > 0 and report.stages["decode"] >= 0
    assert loader.stats["stages"]["images"] >= 4 * 8
    fresh = _load(str(folder))
    loader.set_epoch(7)
    fresh.set_epoch(7)
    assert _epoch(loader) == _epoch(fresh)  # timing off again, and the batches unchanged


@pytest.mark.parametrize("device", DEVICES)
def test_formats_other_than_jpeg_are_pillows_pixels_as_on_pil(tmp_path, device):
    """DALI decodes the JPEGs; a PNG, TIFF or PGM comes out as Pillow decodes it, as on the
    other backends (DALI scales a 16-bit PNG, a PGM's value range and a TIFF's orientation
    otherwise), in its place among the JPEGs, with its label; one Pillow cannot decode fails
    naming it, or is left out with on_error="skip"."""
    h, w = 48, 64
    grad = np.zeros((h, w, 3), np.uint8)
    grad[..., 0], grad[..., 1], grad[..., 2] = np.arange(w)[None] * 4, np.arange(h)[:, None] * 5, 90
    Image.fromarray(grad[:, :48]).save(tmp_path / "orient3.tif", tiffinfo={274: 3})
    Image.fromarray(grad[..., 0].astype(np.uint16) * 257).save(tmp_path / "gray16.png")
    (tmp_path / "max100.pgm").write_bytes(b"P5\n64 48\n100\n" + (grad[..., 0] // 3).tobytes())
    Image.fromarray(grad).save(tmp_path / "a.jpg", quality=95)
    Image.fromarray(255 - grad).save(tmp_path / "b.jpg", quality=95)
    names = ["a.jpg", "orient3.tif", "b.jpg", "gray16.png", "max100.pgm"]
    pairs = [(str(tmp_path / n), k) for k, n in enumerate(names)]
    batches = {}
    for backend in ("pil", "dali"):
        loader = fastdata.loader(pairs, batch_size=5, backend=backend, num_workers=0,
                                 device=device if backend == "dali" else "cpu",
                                 transform=T.Compose([T.Resize((32, 32))]))
        (x, y), = list(loader)
        batches[backend] = x.cpu(), y.cpu()
    assert batches["dali"][1].tolist() == batches["pil"][1].tolist() == list(range(5))
    diff = (batches["dali"][0].int() - batches["pil"][0].int()).abs().amax(dim=(1, 2, 3))
    assert diff[[1, 3, 4]].tolist() == [0, 0, 0] and int(diff.max()) <= 8, diff  # JPEGs: DALI's resize
    # whole chunks, with their CRCs, but no zlib stream in the IDAT: only the decode tells
    ihdr = (48).to_bytes(4, "big") + (32).to_bytes(4, "big") + bytes([8, 2, 0, 0, 0])
    (tmp_path / "cut.png").write_bytes(b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr)
                                       + png_chunk(b"IDAT", b"no zlib stream here" * 4) + png_chunk(b"IEND", b""))
    bad = pairs[:2] + [(str(tmp_path / "cut.png"), 9)] + pairs[2:]
    loader = fastdata.loader(bad, batch_size=6, backend="dali", num_workers=0, device=device, on_error="skip",
                             transform=T.Compose([T.Resize((32, 32))]))
    (x, y), = list(loader)
    assert y.tolist() == list(range(5)) and torch.equal(x.cpu(), batches["dali"][0])
    assert loader.stats["skipped"] == 1
