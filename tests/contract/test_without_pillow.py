"""fastdata where Pillow is not installed (a `pip install` of fastdata alone: Pillow is not among
its requirements, see `fastdata._optional.require_pillow`), emulated by tests/_no_pillow (its
sitecustomize, on PYTHONPATH): what needs no Pillow runs (`fastdata run` of a TensorDataset
script, JPEGs the native decoder takes), and what needs it stops at once with one line saying so
and how to install it, never as a file's error: on_error="skip" skips no file for it."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from _images import color_folder

NO_PILLOW = Path(__file__).resolve().parents[1] / "_no_pillow"
INSTALL = "pip install pillow"


def _run(args: list[str], **env: str) -> subprocess.CompletedProcess:
    paths = os.pathsep.join(p for p in (str(NO_PILLOW), os.environ.get("PYTHONPATH", "")) if p)
    full = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=paths, **env)
    return subprocess.run(args, capture_output=True, text=True, timeout=150, env=full)


def _python(code: str, *args: str) -> subprocess.CompletedProcess:
    return _run([sys.executable, "-c", textwrap.dedent(code), *args])


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return color_folder(tmp_path_factory.mktemp("nopil") / "images", classes=3, per_class=6, sides=(40, 90),
                        name=lambda i: f"{i}.jpg")


@pytest.mark.timeout(120)
def test_the_emulation_hides_pillow():
    proc = _python("import PIL")
    assert proc.returncode == 1 and "ModuleNotFoundError: No module named 'PIL'" in proc.stderr, proc.stderr


@pytest.mark.timeout(120)
def test_fastdata_run_serves_a_tensordataset_script(tmp_path):
    """The hook's modules import no Pillow, so `fastdata run` stays on ("the hook is off" would
    leave every script to torch) where there is none."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch
        ds = torch.utils.data.TensorDataset(torch.arange(20).float().view(20, 1), torch.arange(20))
        loader = torch.utils.data.DataLoader(ds, batch_size=4, shuffle=True, num_workers=2)
        print(sorted(int(y) for _, ys in loader for y in ys) == list(range(20)), type(loader).__module__)
    """))
    proc = _run([sys.executable, "-m", "fastdata", "run", "--", sys.executable, str(script)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[0] == "True" and proc.stdout.split()[1].startswith("fastdata"), proc.stdout
    assert "1 served by fastdata" in proc.stderr and "hook is off" not in proc.stderr, proc.stderr


@pytest.mark.timeout(150)
def test_jpegs_decode_natively_in_workers(folder):
    from fastdata import _codec

    if not _codec.AVAILABLE:
        pytest.skip("the native JPEG decoder is not built: without it every image is Pillow's")
    proc = _python("""
        import sys
        import fastdata
        from fastdata import transforms as T
        loader = fastdata.loader(sys.argv[1], batch_size=4, num_workers=2, device="cpu", shuffle=True,
                                 transform=T.Compose([T.RandomResizedCrop(16), T.RandomHorizontalFlip()]))
        labels, classes = [], []
        for images, ys in loader:
            labels += ys.tolist()
            classes += ((images[:, 0].float().mean(dim=(1, 2)) - 20) / 40).round().long().tolist()
        assert sorted(labels) == [c for c in range(3) for _ in range(6)] and labels == classes, (labels, classes)
        print("ok", loader.stats["skipped"])
    """, str(folder))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["ok", "0"], proc.stdout


@pytest.mark.timeout(150)
@pytest.mark.parametrize("workers", [0, 2])
def test_an_image_that_needs_pillow_is_not_skipped_as_a_bad_file(tmp_path, workers):
    """A PNG among the JPEGs, on_error="skip": the pass stops with the missing library and the
    file that needed it, rather than skipping every PNG as a file that "cannot decode", counted
    among the dataset's bad files."""
    root = color_folder(tmp_path / "images", classes=2, per_class=3, sides=(40, 60),
                        name=lambda i: f"{i}.png" if i == 1 else f"{i}.jpg")
    proc = _python("""
        import sys
        import fastdata
        from fastdata import transforms as T
        loader = fastdata.loader(sys.argv[1], batch_size=6, num_workers=int(sys.argv[2]), device="cpu",
                                 on_error="skip", transform=T.Compose([T.Resize((16, 16))]))
        for batch in loader:
            pass
        print("skipped", loader.stats["skipped"])
    """, str(root), str(workers))
    assert proc.returncode == 1 and "skipped" not in proc.stdout, (proc.stdout, proc.stderr[-3000:])
    last = proc.stderr.strip().splitlines()[-1]
    assert "ImportError: Pillow is not installed" in last and INSTALL in last, last
    assert "1.png" in last, last


@pytest.mark.timeout(120)
def test_a_pixel_op_on_the_cpu_says_so_when_the_loader_is_made(folder):
    proc = _python("""
        import sys
        import fastdata
        from fastdata import transforms as T
        try:
            fastdata.loader(sys.argv[1], batch_size=4, device="cpu",
                            transform=T.Compose([T.Resize((16, 16)), T.ColorJitter(0.4, 0.4)]))
        except ImportError as e:
            print(e)
    """, str(folder))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("Pillow is not installed") and "to run ColorJitter on the CPU" in proc.stdout \
        and INSTALL in proc.stdout and proc.stdout.count("\n") == 1, proc.stdout


@pytest.mark.timeout(150)
def test_commands_that_need_pillow_end_in_one_line(tmp_path):
    """The README's first command's source (the synthetic set is encoded with Pillow) and a
    shard of a PNG: exit 1, one line naming what needed Pillow and how to install it."""
    png = color_folder(tmp_path / "png", classes=1, per_class=2, sides=(40, 60), name=lambda i: f"{i}.png")
    runs = {
        "to encode the synthetic JPEGs": ["profile", "synthetic", "--step-ms", "100"],
        "to pack an image that is not a JPEG": ["shard", str(png), str(tmp_path / "out" / "train-%06d.tar")],
    }
    for what, args in runs.items():
        proc = _run([sys.executable, "-m", "fastdata", *args], FASTDATA_CACHE=str(tmp_path / "cache"))
        lines = [line for line in proc.stderr.splitlines() if "error:" in line]
        assert proc.returncode == 1 and len(lines) == 1, (args, proc.stderr[-3000:])
        assert "ImportError: Pillow is not installed" in lines[0] and what in lines[0] and INSTALL in lines[0], lines
    assert not (tmp_path / "cache" / "demo-imagenet-like").exists()  # nothing made before it stopped
