"""fastdata._pillow: which Pillow is active, and that scripts/install.sh left Pillow-SIMD."""

from __future__ import annotations

import importlib.metadata
import os
import sys

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
