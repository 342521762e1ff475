"""fastdata.synthetic: the layout, the ImageNet-like sizes and qualities, determinism, the
manifest short-circuit, incremental regeneration, the ImageFolder file list and the CLI."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

pytest.importorskip("PIL")
from PIL import Image, JpegImagePlugin  # noqa: E402

from fastdata import synthetic  # noqa: E402
from fastdata.synthetic import make_file_list, make_imagenet_like  # noqa: E402

N, K = 40, 4

# libjpeg's base quantisation tables (ITU T.81 Annex K), scaled by quality as jpeg_set_quality
# does, to tell which quality a file was written with.
_LUMA = [16, 11, 10, 16, 24, 40, 51, 61, 12, 12, 14, 19, 26, 58, 60, 55, 14, 13, 16, 24, 40, 57, 69, 56,
         14, 17, 22, 29, 51, 87, 80, 62, 18, 22, 37, 56, 68, 109, 103, 77, 24, 35, 55, 64, 81, 104, 113, 92,
         49, 64, 78, 87, 103, 121, 120, 101, 72, 92, 95, 98, 112, 100, 103, 99]


def _quality_of(im) -> int | None:
    got = sorted(im.quantization[0])
    for q in range(1, 101):
        scale = 5000 // q if q < 50 else 200 - 2 * q
        if sorted(min(255, max(1, (v * scale + 50) // 100)) for v in _LUMA) == got:
            return q
    return None


def _files(root):
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name != synthetic.MANIFEST)


def _snapshot(root):
    """{relative path: (bytes, mtime_ns)} of every image under root."""
    return {p.relative_to(root).as_posix(): (p.read_bytes(), p.stat().st_mtime_ns) for p in _files(root)}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return make_imagenet_like(tmp_path_factory.mktemp("synthetic") / "data", n_images=N, n_classes=K, seed=0)


def test_layout(dataset):
    assert sorted(p.name for p in dataset.iterdir()) == [synthetic.MANIFEST] + [f"n{c:05d}" for c in range(K)]
    want = sorted(dataset / f"n{i % K:05d}" / f"{i:08d}.JPEG" for i in range(N))
    assert _files(dataset) == want
    manifest = json.loads((dataset / synthetic.MANIFEST).read_text())
    assert manifest["complete"] is True
    assert (manifest["n_images"], manifest["n_classes"], manifest["seed"]) == (N, K, 0)
    assert manifest["bytes"] == sum(p.stat().st_size for p in want)


def test_files_are_imagenet_like_jpegs(dataset):
    for p in _files(dataset):
        with Image.open(p) as im:
            assert im.format == "JPEG" and im.mode == "RGB", p
            assert JpegImagePlugin.get_sampling(im) == 2, f"{p}: not 4:2:0"
            assert 75 <= _quality_of(im) <= 95, p
            w, h = im.size
            assert 333 <= max(w, h) <= 1000 and min(w, h) >= round(333 * 2 / 3), (p, im.size)
            im.load()  # decodes cleanly


def test_size_and_quality_distribution():
    # The sizes and qualities are drawn before any pixel, so many draws are cheap: check the
    # ImageNet-like distribution the module docstring states.
    draws = np.array([synthetic._params(np.random.default_rng([0, i])) for i in range(4000)])
    w, h, q = draws.T
    assert 390 <= w.mean() <= 420 and 335 <= h.mean() <= 365, (w.mean(), h.mean())
    assert 0.66 <= np.mean(w > h) <= 0.74 and 0.17 <= np.mean(w < h) <= 0.23
    assert 0.02 <= np.mean(np.maximum(w, h) > 500) <= 0.04
    assert np.maximum(w, h).max() <= 1000
    assert set(q.tolist()) == set(range(75, 96))


def test_bytes_per_pixel_like_photos(dataset):
    # ImageNet's training JPEGs hold about 0.6-0.8 bytes per pixel (about 110 KB at a mean
    # near 470x390); decode time follows those bytes, so a set far outside 0.3-1.2 would make
    # decode-bound benchmarks unrepresentative (flat images decode much faster than photos:
    # 0.02 B/px for one colour at quality 95; noisier ones slower).
    sizes = [p.stat().st_size for p in _files(dataset)]
    pixels = []
    for p in _files(dataset):
        with Image.open(p) as im:
            pixels.append(im.size[0] * im.size[1])
    assert 0.3 <= sum(sizes) / sum(pixels) <= 1.2, sum(sizes) / sum(pixels)


def test_pixels_are_correlated_like_a_photo(dataset):
    # Not white noise (whose neighbouring pixels are uncorrelated): texture with most of its
    # energy at low frequencies.
    for p in _files(dataset)[:8]:
        with Image.open(p) as im:
            y = np.asarray(im.convert("L"), np.float64)
        assert np.corrcoef(y[:, :-1].ravel(), y[:, 1:].ravel())[0, 1] > 0.3, p


def test_deterministic(tmp_path, dataset):
    a = make_imagenet_like(tmp_path / "a", n_images=N, n_classes=K, seed=0, workers=2)
    assert {k: v[0] for k, v in _snapshot(a).items()} == {k: v[0] for k, v in _snapshot(dataset).items()}
    b = make_imagenet_like(tmp_path / "b", n_images=8, n_classes=K, seed=1, workers=1)
    for p in _files(b):
        assert p.read_bytes() != (a / p.relative_to(b)).read_bytes(), p


def test_manifest_short_circuits(tmp_path, monkeypatch):
    root = make_imagenet_like(tmp_path / "d", n_images=8, n_classes=2, workers=1)
    before = _snapshot(root)
    manifest = (root / synthetic.MANIFEST).stat().st_mtime_ns
    monkeypatch.setattr(synthetic, "_image", lambda *a: pytest.fail("regenerated an image"))
    assert make_imagenet_like(root, n_images=8, n_classes=2, workers=1) == root
    assert _snapshot(root) == before
    assert (root / synthetic.MANIFEST).stat().st_mtime_ns == manifest


def test_makes_only_what_is_missing(tmp_path):
    root = make_imagenet_like(tmp_path / "d", n_images=8, n_classes=2, workers=1)
    before = _snapshot(root)
    # More images: the first 8 are kept as they are.
    make_imagenet_like(root, n_images=12, n_classes=2, workers=1)
    after = _snapshot(root)
    assert len(after) == 12 and all(after[k] == v for k, v in before.items())
    # Other classes: the same images, moved; class folders past the last removed.
    fresh = _snapshot(make_imagenet_like(tmp_path / "fresh", n_images=10, n_classes=3, workers=1))
    make_imagenet_like(root, n_images=10, n_classes=3, workers=1)
    assert {k: v[0] for k, v in _snapshot(root).items()} == {k: v[0] for k, v in fresh.items()}
    make_imagenet_like(root, n_images=4, n_classes=1, workers=1)
    assert sorted(p.name for p in root.iterdir()) == [synthetic.MANIFEST, "n00000"]
    assert len(_files(root)) == 4
    # After a crash (an incomplete manifest, a missing image, a temporary file) only the
    # missing image is made.
    before = _snapshot(root)
    gone = root / "n00000" / "00000002.JPEG"
    gone.unlink()
    (root / "n00000" / ".00000002.JPEG.123.tmp").write_bytes(b"partial")
    manifest = json.loads((root / synthetic.MANIFEST).read_text())
    (root / synthetic.MANIFEST).write_text(json.dumps({**manifest, "complete": False}))
    make_imagenet_like(root, n_images=4, n_classes=1, workers=1)
    after = _snapshot(root)
    assert after.keys() == before.keys()
    assert after["n00000/00000002.JPEG"][0] == before["n00000/00000002.JPEG"][0]
    assert all(after[k] == v for k, v in before.items() if k != "n00000/00000002.JPEG")
    # Another seed: everything is made again.
    make_imagenet_like(root, n_images=4, n_classes=1, seed=1, workers=1)
    assert all(_snapshot(root)[k][0] != v[0] for k, v in before.items())


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match=r"`n_images` should be an integer >= 1, but got 0"):
        make_imagenet_like(tmp_path / "d", n_images=0)
    with pytest.raises(ValueError, match=r"`n_classes` should be at most `n_images` \(3\), but got 4"):
        make_imagenet_like(tmp_path / "d", n_images=3, n_classes=4)
    with pytest.raises(ValueError, match=r"`seed` should be an integer >= 0"):
        make_imagenet_like(tmp_path / "d", n_images=3, seed=-1)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match=r"`root` should be empty or hold a dataset made by make_imagenet_like"):
        make_imagenet_like(tmp_path / "mine", n_images=3, n_classes=1)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def test_file_list_labels_follow_folder_order(dataset):
    files = make_file_list(dataset)
    assert len(files) == N
    assert files == sorted(files)  # class folders and file names sort alike here
    for path, label in files:
        assert os.path.basename(os.path.dirname(path)) == f"n{label:05d}"
        assert int(os.path.basename(path)[:8]) % K == label


def test_file_list_follows_image_folder_rules(tmp_path):
    for rel in ["b/2.JPG", "b/1.png", "b/sub/0.jpeg", "b/notes.txt", "a/x.webp", "c/ignored.txt"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"")
    (tmp_path / "top.jpg").write_bytes(b"")  # files beside the class folders are not samples
    with pytest.raises(FileNotFoundError, match="Found no valid file for the classes c"):
        make_file_list(tmp_path)
    (tmp_path / "c" / "ignored.txt").rename(tmp_path / "c" / "y.bmp")
    root = str(tmp_path)
    assert make_file_list(tmp_path) == [
        (os.path.join(root, "a", "x.webp"), 0),
        (os.path.join(root, "b", "1.png"), 1),
        (os.path.join(root, "b", "2.JPG"), 1),
        (os.path.join(root, "b", "sub", "0.jpeg"), 1),
        (os.path.join(root, "c", "y.bmp"), 2),
    ]


def test_file_list_matches_torchvision(dataset):
    datasets = pytest.importorskip("torchvision.datasets")
    assert make_file_list(dataset) == datasets.ImageFolder(str(dataset)).samples


def test_cli(tmp_path, capsys):
    assert synthetic.main([str(tmp_path / "d"), "--images", "6", "--classes", "2", "--workers", "1"]) == 0
    out = capsys.readouterr()
    lines = out.out.splitlines()
    assert lines[0] == str(tmp_path / "d")
    assert lines[1].startswith("6 images in 2 classes") and "KB" in lines[1] and "ms/image" in lines[1]
    assert "6/6" in out.err  # the progress line
    synthetic.main([str(tmp_path / "d"), "--images", "6", "--classes", "2"])
    assert "already there" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        synthetic.main([str(tmp_path / "d"), "--images", "0"])
