"""fastdata._pillow: which Pillow is active, that scripts/install.sh left Pillow-SIMD, and that
Pillow-SIMD's output is stock Pillow's (the reference of the parity tables) op by op."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import _pillow_ops
import numpy as np
import pytest

from fastdata import _pillow


def _provider(version: str) -> str | None:
    """The installed distribution providing `PIL` whose version is the imported one, by
    importlib.metadata alone."""
    names = importlib.metadata.packages_distributions().get("PIL", [])
    found = {name.lower().replace("_", "-") for name in names if importlib.metadata.version(name) == version}
    assert len(found) <= 1, f"two distributions of PIL {version}: {found}"
    return found.pop() if found else None


def test_info_agrees_with_metadata():
    PIL = pytest.importorskip("PIL")
    info = _pillow.pillow_info()
    assert set(info) == {"distribution", "version", "simd", "libjpeg_turbo"}
    assert info["version"] == PIL.__version__
    assert info["distribution"] == _provider(PIL.__version__)
    assert info["simd"] is (info["distribution"] == "pillow-simd")
    from PIL import features

    assert info["libjpeg_turbo"] is bool(features.check_feature("libjpeg_turbo"))


def test_description_names_the_version():
    PIL = pytest.importorskip("PIL")
    assert PIL.__version__ in _pillow.PILLOW
    assert _pillow.PILLOW.startswith("Pillow-SIMD " if _pillow.pillow_info()["simd"] else "Pillow ")


def test_without_pil(monkeypatch):
    monkeypatch.setitem(sys.modules, "PIL", None)  # makes `import PIL` raise ImportError
    info = _pillow.pillow_info()
    assert info == {"distribution": None, "version": None, "simd": False, "libjpeg_turbo": False}
    assert _pillow._describe(info) == "Pillow is not installed"


def test_descriptions():
    simd = {"distribution": "pillow-simd", "version": "12.1.1.post0", "simd": True, "libjpeg_turbo": True}
    assert _pillow._describe(simd) == "Pillow-SIMD 12.1.1.post0 (libjpeg-turbo)"
    stock = {"distribution": "pillow", "version": "13.0.0", "simd": False, "libjpeg_turbo": True}
    assert _pillow._describe(stock) == "Pillow 13.0.0 (stock; install pillow-simd for ~30% faster resize)"


@pytest.mark.skipif(os.environ.get("FASTDATA_ALLOW_STOCK_PILLOW") == "1",
                    reason="FASTDATA_ALLOW_STOCK_PILLOW=1: stock Pillow is allowed")
def test_install_left_pillow_simd_active():
    # CI runs scripts/install.sh, which must end with Pillow-SIMD active: this proves it did
    # (and that nothing installed after it brought stock Pillow back).
    info = _pillow.pillow_info()
    assert info["simd"], (
        f"Pillow-SIMD should be the active Pillow after scripts/install.sh, but got {_pillow.PILLOW} "
        f"(run scripts/install.sh, or set FASTDATA_ALLOW_STOCK_PILLOW=1 to allow stock Pillow)")
    assert info["libjpeg_turbo"], "Pillow-SIMD should be built against libjpeg-turbo"


# Pillow-SIMD against stock Pillow of the same release, per op of the Pillow lowering, in uint8
# levels: (largest mean, largest difference). Most ops are bit-exact; Color, saturation and the
# decodes with a resize move a small share of values by one level, from rounding.
STOCK_PARITY = (0.03, 1)


def test_pillow_simd_matches_stock_pillow(tmp_path):
    stock = _pillow.stock_pillow_path()
    if stock is None:
        pytest.skip("no stock Pillow beside the active one (scripts/install.sh puts one in .stock-pillow/)")
    if not _pillow.pillow_info()["simd"]:
        pytest.skip("the active Pillow is stock Pillow: nothing to compare")
    from PIL import Image

    from fastdata.synthetic import make_file_list, make_imagenet_like

    make_imagenet_like(tmp_path / "photos", n_images=8, n_classes=2, workers=1)
    files = [str(p) for p, _ in make_file_list(tmp_path / "photos")]
    images = np.stack([np.asarray(Image.open(f).convert("RGB").resize((72, 56))) for f in files])
    np.savez(tmp_path / "in.npz", images=images)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(stock), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, str(Path(_pillow_ops.__file__)), str(tmp_path / "in.npz"),
                    str(tmp_path / "stock.npz"), *files], check=True, env=env, timeout=300)
    theirs = np.load(tmp_path / "stock.npz")
    assert str(theirs["pillow"]).startswith("Pillow 12") and "stock" in str(theirs["pillow"])  # it ran stock Pillow
    ours = _pillow_ops.outputs(images, [Path(f).read_bytes() for f in files])
    assert set(ours) == set(theirs.files) - {"pillow"}
    for op, mine in ours.items():
        diff = np.abs(mine.astype(int) - theirs[op].astype(int))
        assert diff.mean() <= STOCK_PARITY[0] and diff.max() <= STOCK_PARITY[1], (op, diff.mean(), diff.max())
        if op != "Identity" and mine.shape == images.shape:
            assert np.abs(mine.astype(int) - images.astype(int)).mean() > 1, op  # the op does something
