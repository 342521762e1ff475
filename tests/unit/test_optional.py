"""DALI, Ray, Kornia and the `nvidia` namespace are optional: the probes for them cannot raise
(fastdata/_optional.py), and every command runs without them, saying in one line what it left
out and the command that adds it.

The commands run in processes whose `sitecustomize` hides the packages (a None in sys.modules is
what an import of a missing package meets), in two configurations users have: no `nvidia`
package at all (a CPU-only torch), and the `nvidia` namespace of torch's CUDA build without DALI.
The README's test command also runs with none of them installed in CI's first pass."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from _images import color_folder
from fastdata import _optional

HIDDEN = {
    "no nvidia package": ["nvidia", "ray", "kornia"],
    "nvidia namespace without DALI": ["nvidia.dali", "ray", "kornia"],
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return color_folder(tmp_path_factory.mktemp("imgs"), 2, 24, (40, 56), lambda i: f"{i:03d}.jpg")


def _env(tmp_path: Path, case: str) -> dict:
    site, namespace = tmp_path / "site", tmp_path / "namespace"
    site.mkdir()
    hide = "".join(f"sys.modules[{name!r}] = None\n" for name in HIDDEN[case])
    (site / "sitecustomize.py").write_text(f"import sys\n{hide}")
    path = [str(site)]
    if "namespace" in case:  # the `nvidia` namespace package that torch's CUDA build brings
        (namespace / "nvidia" / "cublas").mkdir(parents=True)
        (namespace / "nvidia" / "cublas" / "__init__.py").write_text("")
        path.append(str(namespace))
    home = tmp_path / "home"
    home.mkdir()
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path + [os.environ.get("PYTHONPATH", "")]), "HOME": str(home),
            "FASTDATA_CACHE": str(home / "cache"), "OMP_NUM_THREADS": "1"}


def _run(argv: list[str], env: dict, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "fastdata.cli", *argv], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, f"fastdata {' '.join(argv)}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.mark.parametrize("case", sorted(HIDDEN))
def test_the_hiding_is_what_a_missing_package_does(tmp_path, case):
    code = ("import importlib.util\n"
            "try:\n    importlib.util.find_spec('nvidia.dali')\nexcept ModuleNotFoundError:\n    print('raises')\n"
            "else:\n    print('none' if importlib.util.find_spec('nvidia.dali') is None else 'found')\n"
            "from fastdata import _optional\nprint(_optional.has('dali'), _optional.has('ray'), _optional.has('kornia'))")
    done = subprocess.run([sys.executable, "-c", code], env=_env(tmp_path, case), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    # with no `nvidia` at all the standard probe raises (the bug this guards); ours says False
    assert done.stdout.split("\n")[:2] == ["raises" if case == "no nvidia package" else "none", "False False False"]


def test_a_probe_cannot_raise(monkeypatch):
    def broken(name, *a):
        raise ValueError(f"{name}.__spec__ is None")  # what find_spec raises for a half-imported module

    monkeypatch.setattr(importlib.util, "find_spec", broken)
    assert not _optional.has("dali") and not _optional.has("ray") and not _optional.has("kornia")
    with pytest.raises(RuntimeError, match=r"^backend 'ray': Ray is not installed; .*--ray.* adds it$"):
        _optional.require("ray", "backend 'ray'")


@pytest.mark.timeout(400)
@pytest.mark.parametrize("case", sorted(HIDDEN))
def test_profile_tune_without_the_optional_parts(tmp_path, folder, case):
    done = _run(["profile", str(folder), "--step-ms", "5", "--steps", "4", "--batch-size", "8", "--size", "32",
                 "--device", "cpu", "--tune"], _env(tmp_path, case), tmp_path, timeout=380)
    assert "verdict:" in done.stdout and "tuned:" in done.stdout, done.stdout
    assert "not tried: backend dali: NVIDIA DALI is not installed; bash scripts/install.sh --dali" in done.stderr
    assert '"backend": "pil"' in done.stdout.split("tuned:")[1].splitlines()[0]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", sorted(HIDDEN))
def test_bench_augment_without_the_optional_parts(tmp_path, case):
    done = _run(["bench", "augment", "--images", "4", "--reps", "1", "--size", "32", "--pipeline-images", "16"],
                _env(tmp_path, case), tmp_path)
    cuda = torch.cuda.is_available()  # (a GPU engine is named only where a GPU is)
    assert f"not measured: {'engines dali-cpu, dali-gpu' if cuda else 'engine dali-cpu'}: NVIDIA DALI is not " \
           "installed" in done.stderr
    assert f"not measured: {'engines kornia-cpu, kornia-cuda' if cuda else 'engine kornia-cpu'}: Kornia is not " \
           "installed" in done.stderr
    header = next(line for line in done.stdout.splitlines() if line.startswith("op "))
    assert header.split() == ["op", "pillow"]
    assert "ImageNet training pipeline, placement=cpu" in done.stdout and "placement=gpu" not in done.stdout


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", sorted(HIDDEN))
def test_demo_and_run_without_the_optional_parts(tmp_path, case):
    env = _env(tmp_path, case)
    done = _run(["demo", "--samples", "64", "--batch-size", "16", "--epochs", "1", "--repeats", "1", "--workers", "0",
                 "--images", "20", "--data", str(tmp_path / "demo")], env, tmp_path)
    assert "DataLoader" in done.stdout
    script = tmp_path / "train.py"
    script.write_text("import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n"
                      "data = TensorDataset(torch.arange(32.0).view(16, 2), torch.arange(16))\n"
                      "print(sum(int(y.sum()) for _, y in DataLoader(data, batch_size=4, shuffle=True)))\n")
    done = _run(["run", "--", sys.executable, str(script)], env, tmp_path)
    assert done.stdout.strip() == str(sum(range(16)))
    assert "served" in done.stderr, done.stderr


@pytest.mark.parametrize("case", sorted(HIDDEN))
def test_naming_a_missing_part_says_what_adds_it(tmp_path, folder, case):
    code = (f"import fastdata\nfrom fastdata import transforms as T\n"
            f"for kw in (dict(backend='dali'), dict(backend='ray'),\n"
            f"           dict(placement='gpu', transform=T.Compose([T.Resize(8), T.CenterCrop(8), T.ColorJitter(0.4)]))):\n"
            f"    try:\n        fastdata.loader({str(folder)!r}, 4, device='cpu', **kw)\n"
            f"    except RuntimeError as e:\n        print(e)\n")
    done = subprocess.run([sys.executable, "-c", code], env=_env(tmp_path, case), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "backend 'dali': NVIDIA DALI is not installed; bash scripts/install.sh --dali (or pip install '.[dali]' in fastdata's checkout) adds it",
        "backend 'ray': Ray is not installed; bash scripts/install.sh --ray (or pip install '.[ray]' in fastdata's checkout) adds it",
        "placement='gpu': Kornia is not installed; pip install '.[gpu]' in fastdata's checkout adds it"]
