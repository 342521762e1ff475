"""How workers start where the platform's default start method is forkserver (Linux from Python
3.14), emulated on this Python by tests/_py314 (its sitecustomize, on PYTHONPATH): an image
loader's workers fork, as on 3.13, so a script without a main guard runs once; a drop-in
loader's start as DataLoader's do (forkserver); neither fixes the default start method, which
the script may still set. And `own_start_method` form by form, here and under the emulation."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from _images import color_folder

PY314 = Path(__file__).resolve().parents[1] / "_py314"


def _python(code: str, *args: str, emulate: bool) -> subprocess.CompletedProcess:
    paths = ([str(PY314)] if emulate else []) + [os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(paths))
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=150, env=env)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return color_folder(tmp_path_factory.mktemp("start") / "images", classes=3, per_class=8, sides=(40, 90),
                        name=lambda i: f"{i}.jpg")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("emulate", [True, False])
def test_an_image_loader_script_without_a_main_guard_runs_once(folder, emulate):
    """Its workers fork (the main module is not run again), every image arrives with the label
    its red channel names, and the default start method is left unset."""
    code = textwrap.dedent("""
        import multiprocessing, sys
        import fastdata
        from fastdata import transforms as T
        print("main module run as", __name__, flush=True)
        loader = fastdata.loader(sys.argv[1], batch_size=5, num_workers=2, device="cpu",
                                 transform=T.Compose([T.Resize((16, 16))]))
        labels, classes = [], []
        for images, ys in loader:
            labels += ys.tolist()
            classes += ((images[:, 0].float().mean(dim=(1, 2)) - 20) / 40).round().long().tolist()
        assert sorted(labels) == [c for c in range(3) for _ in range(8)] and labels == classes, (labels, classes)
        print("unset", multiprocessing.get_start_method(allow_none=True) is None, flush=True)
    """)
    proc = _python(code, str(folder), emulate=emulate)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == ["main module run as __main__", "unset True"], proc.stdout


_DROPIN = textwrap.dedent("""
    import json, sys
    import torch
    import fastdata

    class Where(torch.utils.data.Dataset):  # each sample: its index, and whether the main module ran again here
        def __len__(self):
            return 6

        def __getitem__(self, i):
            return torch.tensor([i, sys.modules["__main__"].__name__ == "__mp_main__"])

    if __name__ == "__main__":
        got = [b.tolist() for b in fastdata.loader(Where(), batch_size=2, num_workers=2)]
        want = [b.tolist() for b in torch.utils.data.DataLoader(Where(), batch_size=2, num_workers=2)]
        print(json.dumps([got, want]))
""")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("emulate", [True, False])
def test_a_dropin_loaders_workers_start_as_dataloaders(tmp_path, emulate):
    """The drop-in's workers run the main module again exactly where DataLoader's do: under
    forkserver's default (they start by it), not under fork's."""
    script = tmp_path / "dropin.py"
    script.write_text(_DROPIN)
    proc = _python(f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')", emulate=emulate)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got, want = json.loads(proc.stdout)
    assert got == want == [[[i, int(emulate)], [i + 1, int(emulate)]] for i in range(0, 6, 2)], (got, want)


_FORMS = textwrap.dedent("""
    import json, multiprocessing
    from fastdata import _workers
    seen = {"none": _workers.own_start_method(), "unset": multiprocessing.get_start_method(allow_none=True)}
    multiprocessing.get_context()  # fixes the default as torch's first iter() with workers does
    seen["fixed"] = _workers.own_start_method()
    class Owner: pass
    owner = Owner()
    _workers.hold_threads(owner)
    seen["threads"] = _workers.own_start_method()
    _workers.release_threads(owner)
    multiprocessing.set_start_method("spawn", force=True)
    seen["spawn"] = _workers.own_start_method()
    print(json.dumps(seen))
""")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("emulate", [True, False])
def test_own_start_method_form_by_form(emulate):
    """fork where nothing else was chosen, the default forkserver included; forkserver while
    threads are live; spawn where the script set it; and looking does not fix the default."""
    proc = _python(_FORMS, emulate=emulate)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout) == {"none": "fork", "unset": None, "fixed": "fork", "threads": "forkserver",
                                       "spawn": "spawn"}
