"""`fastdata run -- COMMAND`: unchanged scripts (tests/run_scripts/) run directly and under
`fastdata run`: the same batches and losses, the loaders served or fallen back as the run's
summary says, and --profile's reports valid against report.schema.json."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "run_scripts"
SCHEMA = Path(__file__).resolve().parents[2] / "fastdata" / "profiling" / "report.schema.json"


def _direct(script: str, out: Path, *args: str) -> dict:
    subprocess.run([sys.executable, str(SCRIPTS / script), str(out), *args], check=True, timeout=150,
                   capture_output=True)
    return json.loads(out.read_text())


def _under_run(script: str, out: Path, *args: str, flags: tuple = ()) -> tuple[dict, str]:
    """The script's JSON and `fastdata run`'s stderr."""
    proc = subprocess.run([sys.executable, "-m", "fastdata.cli", "run", *flags, "--", sys.executable,
                           str(SCRIPTS / script), str(out), *args], capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text()), proc.stderr


def _summary(stderr: str) -> list[str]:
    lines = stderr.splitlines()
    start = next(k for k, line in enumerate(lines) if line.startswith("fastdata run: "))
    return [line.strip() for line in lines[start + 1:] if line.startswith("  ")]


def test_plain_loop_same_batches_and_losses_served(tmp_path):
    want = _direct("train_plain.py", tmp_path / "direct.json")
    got, err = _under_run("train_plain.py", tmp_path / "run.json")
    assert got["ids"] == want["ids"] and len(want["ids"]) == 3 * 6
    assert got["losses"] == want["losses"]
    assert got["is_dataloader"] and got["loader"] == "Served"
    (line,) = _summary(err)
    assert line.startswith("served") and "train_plain.py:" in line and "DataLoader(Encoded)" in line, line
    # the script's own __getitem__: nothing outside it can tell that workers would change no batch
    assert "num_workers=0 kept: the dataset's own __getitem__ makes the samples" in line and got["workers"] == 0


@pytest.mark.parametrize("flag", ["--noisy", "--records"], ids=["random-draws", "a-file-opened-once"])
def test_a_datasets_own_getitem_keeps_no_workers(tmp_path, flag):
    """Random draws, or records read through one file object (whose offset forked workers would
    share): workers would change the batches, so the script's default 0 is kept."""
    want = _direct("train_plain.py", tmp_path / "direct.json", flag)
    got, err = _under_run("train_plain.py", tmp_path / "run.json", flag)
    assert got["ids"] == want["ids"] and got["losses"] == want["losses"]
    assert got["workers"] == 0
    (line,) = _summary(err)
    assert line.startswith("served") and "num_workers=0 kept: the dataset's own __getitem__" in line, line


@pytest.mark.parametrize("flag,loader,reason", [
    ("--subclass", "MyLoader(Encoded)", "a subclass of DataLoader (MyLoader)"),
    ("--iterable", "DataLoader(Stream)", "an IterableDataset"),
])
def test_falls_back_with_the_reason(tmp_path, flag, loader, reason):
    want = _direct("train_plain.py", tmp_path / "direct.json", flag)
    got, err = _under_run("train_plain.py", tmp_path / "run.json", flag)
    assert got["ids"] == want["ids"] and got["losses"] == want["losses"]
    assert got["loader"] == want["loader"] and got["workers"] == 0 and got["is_dataloader"]
    (line,) = _summary(err)
    assert line.startswith("fell back") and loader in line and reason in line, line


def test_pickled_copied_and_rebuilt(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "fastdata.cli", "run", "--", sys.executable,
                           str(SCRIPTS / "rebuild_loader.py")], capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr
    copies = json.loads(proc.stdout)
    assert all(c["is_dataloader"] and c["same"] for c in copies.values()), copies
    assert copies["pickled"]["type"] == copies["rebuilt"]["type"] == "Served"
    assert copies["rebuilt_custom"]["type"] == "DataLoader"  # a list as sampler: torch's own
    assert copies["fastdata.loader"]["type"] == "TorchLoader"  # not a DataLoader the hook made, still one
    assert any("a custom sampler (list)" in line for line in _summary(proc.stderr))


@pytest.mark.timeout(300)
def test_lightning_same_batches(tmp_path):
    pytest.importorskip("pytorch_lightning")
    want = _direct("train_lightning.py", tmp_path / "direct.json")
    got, err = _under_run("train_lightning.py", tmp_path / "run.json")
    assert got["ids"] == want["ids"] and len(want["ids"]) == 2 * 8
    assert got["losses"] == want["losses"]
    assert got["loader"] == "Served"
    assert all(line.startswith("served") for line in _summary(err)), err


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_lightning_ddp_loader_from_the_hook_same_shares(tmp_path):
    """DDP on 2 CPU processes, the DataLoader made in train_dataloader(): Lightning records its
    arguments as it is made and rebuilds it with a DistributedSampler, which needs the served
    loader's `dataset` among them (it once crashed both ranks)."""
    pytest.importorskip("pytorch_lightning")

    def ranks(out: Path, run: tuple) -> tuple[list[dict], str]:
        for attempt in range(2):
            proc = subprocess.run([*run, sys.executable, str(SCRIPTS / "train_lightning.py"), str(out), "ddp"],
                                  capture_output=True, text=True, timeout=300,
                                  env={**os.environ, "PYTHONWARNINGS": "ignore"})
            # The reference run (no fastdata in it) gets one retry on gloo's abort at exit, a
            # flake of torch's own; the served run gets none.
            if run or proc.returncode != -6 or "terminate called without an active exception" not in proc.stderr:
                break
        assert proc.returncode == 0, proc.stderr[-4000:]
        return [json.loads(Path(f"{out}.rank{r}").read_text()) for r in range(2)], proc.stderr

    want, _ = ranks(tmp_path / "direct.json", ())
    got, err = ranks(tmp_path / "run.json", (sys.executable, "-m", "fastdata.cli", "run", "--"))
    for rank in range(2):
        assert got[rank]["ids"] == want[rank]["ids"] and got[rank]["losses"] == want[rank]["losses"], rank
        assert got[rank]["loader"] == "Served"
    for epoch in range(2):  # each epoch split in two disjoint halves
        halves = [{i for batch in got[r]["ids"][4 * epoch:4 * epoch + 4] for i in batch} for r in range(2)]
        assert not halves[0] & halves[1] and halves[0] | halves[1] == set(range(64)), epoch
    assert all(line.startswith("served") for line in _summary(err)), err


def _copied(line: str) -> tuple[int, int]:
    """(copies taken, copies made) from a summary line's copy-ahead clause."""
    m = re.search(r"copied ahead to cuda:0, ([\d,]+) of ([\d,]+) tensor copies taken", line)
    assert m, line
    return int(m[1].replace(",", "")), int(m[2].replace(",", ""))


@pytest.mark.gpu
@pytest.mark.timeout(300)
def test_gpu_same_batches_copied_ahead(tmp_path):
    want = _direct("train_plain.py", tmp_path / "direct.json", "--device", "cuda")
    got, err = _under_run("train_plain.py", tmp_path / "run.json", "--device", "cuda")
    assert got["ids"] == want["ids"] and got["losses"] == want["losses"]
    assert got["workers"] >= 1
    (line,) = _summary(err)
    # batch 0 names the destination; each later batch of the 3 epochs x 6 is copied ahead, and
    # the script takes x and y from the copies (it keeps the ids on the host)
    assert _copied(line) == (2 * 17, 3 * 17), line
    no_copy, err = _under_run("train_plain.py", tmp_path / "off.json", "--device", "cuda", flags=("--no-copy-ahead",))
    assert no_copy["losses"] == want["losses"] and "copied ahead" not in err


@pytest.mark.gpu
@pytest.mark.timeout(300)
def test_lightning_gpu_same_batches_copied_ahead(tmp_path):
    pytest.importorskip("pytorch_lightning")
    want = _direct("train_lightning.py", tmp_path / "direct.json", "gpu")
    got, err = _under_run("train_lightning.py", tmp_path / "run.json", "gpu")
    assert got["ids"] == want["ids"] and len(want["ids"]) == 2 * 8
    assert got["losses"] == want["losses"]
    # Lightning moves each batch before it takes the next (it takes one ahead only from a loader
    # without len()): batch 0 names the destination, and every tensor of each later batch is taken
    lines = _summary(err)
    assert all(line.startswith("served") for line in lines), err
    copied = [_copied(line) for line in lines if "copied ahead" in line]
    assert copied == [(3 * 15, 3 * 15)], err


def test_grandchild_and_the_shadowed_sitecustomize(tmp_path, monkeypatch):
    # the script two processes down (as torchrun's ranks are), and a sitecustomize already on
    # PYTHONPATH, which must still run
    site = tmp_path / "site"
    site.mkdir()
    # (one that was on PYTHONPATH already is run by the test's, which shadows it)
    prior = [Path(p) / "sitecustomize.py" for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    prior = [p for p in prior if p.exists()][:1]
    (site / "sitecustomize.py").write_text(f"open({str(tmp_path / 'site-ran')!r}, 'a').write('x')\n" +
                                           "".join(f"exec(open({str(p)!r}).read())\n" for p in prior))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    want = _direct("train_plain.py", tmp_path / "direct.json")
    (tmp_path / "site-ran").unlink()
    launcher = "import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]))"
    proc = subprocess.run([sys.executable, "-m", "fastdata.cli", "run", "--", sys.executable, "-c", launcher,
                           sys.executable, str(SCRIPTS / "train_plain.py"), str(tmp_path / "run.json")],
                          capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr
    got = json.loads((tmp_path / "run.json").read_text())
    assert got["ids"] == want["ids"] and got["losses"] == want["losses"] and got["loader"] == "Served"
    assert (tmp_path / "site-ran").read_text() == "xxx"  # fastdata run, the launcher, the script
    (line,) = _summary(proc.stderr)
    assert line.startswith("served") and "train_plain.py:" in line


@pytest.mark.parametrize("noisy", [(), ("--noisy",)], ids=["workers", "in-process"])
def test_profile_writes_a_valid_report(tmp_path, noisy):
    jsonschema = pytest.importorskip("jsonschema")
    _, err = _under_run("train_plain.py", tmp_path / "run.json", *noisy,
                        flags=("--profile", "--out", str(tmp_path / "rep")))
    report = json.loads((tmp_path / "rep" / "loader-1" / "report.json").read_text())
    jsonschema.validate(report, json.loads(SCHEMA.read_text()))
    assert (tmp_path / "rep" / "loader-1" / "report.html").stat().st_size > 0
    assert report["verdict"] in ("input-bound", "compute-bound", "balanced")
    # every step is timed: a for loop's next() after an epoch's last batch ends that step
    assert len(report["steps"]) == 3 * 6
    assert sum(s["epoch_start"] for s in report["steps"]) == 3
    names = {s["name"] for s in report["stages"]}
    assert {"dataset", "collate", "consumer_wait"} <= names, names
    assert 0 <= report["stall_fraction"] <= 1
    assert "report in" in err and "loader-1" in err


def test_exit_status_and_no_command(tmp_path):
    code = subprocess.run([sys.executable, "-m", "fastdata.cli", "run", "--", sys.executable, "-c",
                           "raise SystemExit(3)"], capture_output=True, text=True, timeout=60)
    assert code.returncode == 3
    assert code.stderr.strip().splitlines()[-1] == "fastdata run: the command exited with status 3 before it made a " \
        "DataLoader"  # not the hook's hint: the command failed
    missing = subprocess.run([sys.executable, "-m", "fastdata.cli", "run", sys.executable, str(tmp_path / "nope.py")],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "can't open file" in missing.stderr and "status 2" in missing.stderr
    fine = subprocess.run([sys.executable, "-m", "fastdata.cli", "run", "--", sys.executable, "-c", "pass"],
                          capture_output=True, text=True, timeout=60)
    assert fine.returncode == 0 and "made no DataLoader" in fine.stderr
    none = subprocess.run([sys.executable, "-m", "fastdata.cli", "run"], capture_output=True, text=True, timeout=60)
    assert none.returncode == 2 and "no command given" in none.stderr


def test_a_script_named_alone_runs_with_this_python(tmp_path):
    """`fastdata run train.py ARGS` (no `python`, the script not executable) runs it as torchrun
    would, with the Python that runs fastdata: the hook is in, the arguments reach the script."""
    script = tmp_path / "train.py"
    script.write_text("import sys, torch, fastdata.run._hook as h\n"
                      "assert torch.utils.data.DataLoader is h.DataLoader\n"
                      "raise SystemExit(int(sys.argv[1]))\n")
    assert not os.access(script, os.X_OK)
    proc = subprocess.run([sys.executable, "-m", "fastdata.cli", "run", str(script), "5"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 5, proc.stderr


# -- unchanged scripts as users write them: the ImageNet example's loop, two loaders, a loader rebuilt each epoch,
# the ways a loop moves its batches. Each runs directly and under `fastdata run`: the same batches
# (ids read back from what the script trained on) and the same losses, bit for bit.

def _both(script: str, out: Path, *args: Any) -> tuple[dict, dict, list[str]]:
    """The script's JSON (written to `out`, which its arguments name) run directly and under
    `fastdata run`, and the run's summary lines."""
    direct = out.with_name(out.stem + "-direct.json")
    mine = [str(direct) if a == str(out) else a for a in map(str, args)]
    plain = subprocess.run([sys.executable, str(SCRIPTS / script), *mine], capture_output=True, text=True, timeout=150)
    assert plain.returncode == 0, plain.stderr
    proc = subprocess.run([sys.executable, "-m", "fastdata.cli", "run", "--", sys.executable,
                           str(SCRIPTS / script), *map(str, args)], capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr
    return json.loads(direct.read_text()), json.loads(out.read_text()), _summary(proc.stderr)


def _same_run(want: dict, got: dict) -> None:
    for key in ("ids", "losses", "val_ids", "val_losses", "val_acc1"):
        assert got.get(key) == want.get(key), key


def _each_once(ids: list[list[int]], epochs: int, every: list[int]) -> None:
    """Each epoch's batches hold every sample once."""
    per = len(ids) // epochs
    for e in range(epochs):
        assert sorted(sum(ids[e * per:(e + 1) * per], [])) == every, ids


@pytest.fixture(scope="module")
def imagenet_folder(tmp_path_factory):
    """data/train: 3 classes x 8 JPEGs, data/val: 3 x 4; 20 to 39 px a side, red and green as
    tests/_images.py's colors (its class and number), blue dark on the left half and bright on
    the right (which way up it is)."""
    import numpy as np
    from PIL import Image

    here = str(Path(__file__).resolve().parents[1])
    if here not in sys.path:
        sys.path.insert(0, here)
    from _images import color

    root = tmp_path_factory.mktemp("imagenet")
    rng = np.random.default_rng(0)
    for split, per_class in (("train", 8), ("val", 4)):
        for c in range(3):
            (root / split / f"class{c}").mkdir(parents=True)
            for i in range(per_class):
                w, h = (int(v) for v in rng.integers(20, 40, size=2))
                pixels = np.empty((h, w, 3), np.uint8)
                pixels[...] = color(c, i)
                pixels[:, :w // 2, 2], pixels[:, w // 2:, 2] = 30, 220
                Image.fromarray(pixels).save(root / split / f"class{c}" / f"{i:03d}.jpg", quality=95, subsampling=0)
    return root


@pytest.mark.parametrize("workers", [2, 0])
def test_imagenet_example_loop_same_batches(tmp_path, imagenet_folder, workers):
    out = tmp_path / "run.json"
    want, got, lines = _both("train_imagenet_style.py", out, imagenet_folder, "-j", workers, "-b", 8,
                             "--epochs", 2, "--seed", 0, "--out", out)
    _same_run(want, got)
    # the random flips, drawn in the workers (seeded as torch seeds them) or in the script's
    # process between its steps' dropout draws
    assert got["flips"] == want["flips"] and 0 < sum(sum(want["flips"], [])) < 2 * 24, want["flips"]
    assert len(want["ids"]) == 2 * 3 and len(want["val_ids"]) == 2 * 2 and len(want["val_acc1"]) == 2
    _each_once(want["ids"], 2, [100 * c + i for c in range(3) for i in range(8)])
    assert want["val_ids"][:2] == [[0, 1, 2, 3, 100, 101, 102, 103], [200, 201, 202, 203]]
    assert want["loaders"] == ["DataLoader"] * 2 and got["loaders"] == ["Served"] * 2
    assert got["is_dataloader"] == [True, True] and got["workers"] == want["workers"] == [workers] * 2
    # train and val, made on two lines of main_worker: both served, with the workers set by -j
    assert len(lines) == 2, lines
    assert len({line.split()[1] for line in lines}) == 2, lines
    for line in lines:
        assert line.startswith("served") and "train_imagenet_style.py:" in line, line
        assert f"DataLoader(ImageFolder): native collation; num_workers={workers} as the script set it" in line, line


@pytest.mark.parametrize("move,workers", [("to", None), ("to_nb", 2)], ids=["to-default-workers", "to_nb-2-workers"])
def test_train_and_val_loaders_same_batches(tmp_path, move, workers):
    args = ("--move", move, "--val") + (("--workers", str(workers)) if workers is not None else ())
    want, got, lines = _both("train_loops.py", tmp_path / "run.json", tmp_path / "run.json", *args)
    _same_run(want, got)
    assert len(want["ids"]) == 2 * 6 and len(want["val_ids"]) == 2 * 3
    _each_once(want["ids"], 2, list(range(48)))
    assert sum(want["val_ids"][:3], []) == list(range(1000, 1020))
    assert got["loaders"] == ["Served"] * 2 and got["is_dataloader"] == [True, True]
    assert len(lines) == 2, lines
    for line in lines:
        assert line.startswith("served") and "train_loops.py:" in line and "DataLoader(Encoded)" in line, line
        if workers is None:  # left at the default: kept, the dataset's own __getitem__ makes the samples
            assert "num_workers=0 kept" in line, line
        else:
            assert f"num_workers={workers} as the script set it" in line, line
    if workers is None:
        assert want["workers"] == got["workers"] == [0, 0]
    else:
        assert got["workers"] == want["workers"] == [workers] * 2


@pytest.mark.parametrize("workers", [0, 2, None], ids=["0-workers", "2-workers", "default-workers"])
def test_loader_rebuilt_every_epoch_same_batches(tmp_path, workers):
    args = ("--rebuild",) + (("--workers", str(workers)) if workers is not None else ())
    want, got, lines = _both("train_loops.py", tmp_path / "run.json", tmp_path / "run.json", *args)
    _same_run(want, got)
    assert len(want["ids"]) == 2 * 6
    _each_once(want["ids"], 2, list(range(48)))
    assert want["ids"][:6] != want["ids"][6:]  # each epoch's new loader shuffles anew
    assert got["distinct"] == want["distinct"] == 2 and got["loaders"] == ["Served"] * 2
    # one line for the two loaders, made alike on one line of the script
    (line,) = lines
    assert line.startswith("served") and "train_loops.py:" in line and "DataLoader(Encoded) (x2)" in line, line
    if workers is None:
        assert "num_workers=0 kept" in line and got["workers"] == [0, 0], line
    else:
        assert f"num_workers={workers} as the script set it" in line and got["workers"] == [workers] * 2, line


@pytest.mark.gpu
@pytest.mark.timeout(300)
def test_cuda_non_blocking_loop_gpu_same_batches(tmp_path):
    want, got, lines = _both("train_loops.py", tmp_path / "run.json", tmp_path / "run.json", "--move", "cuda_nb",
                             "--val")
    _same_run(want, got)
    assert len(want["ids"]) == 2 * 6 and min(got["workers"]) >= 1
    assert len(lines) == 2 and all(line.startswith("served") for line in lines), lines
    # batch 0 of each loader names the destination; each later batch's x and y (not its ids)
    # are taken from the copies: train 12 batches, val 2 x 3
    assert [_copied(line) for line in lines] == [(2 * 11, 3 * 11), (2 * 5, 3 * 5)], lines


@pytest.mark.gpu
@pytest.mark.timeout(300)
def test_imagenet_example_loop_gpu_same_batches(tmp_path, imagenet_folder):
    out = tmp_path / "run.json"
    want, got, lines = _both("train_imagenet_style.py", out, imagenet_folder, "-j", 2, "--gpu", 0, "--seed", 0,
                             "--out", out)
    _same_run(want, got)
    assert len(lines) == 2 and all(line.startswith("served") for line in lines), lines
    # the example's images.cuda(args.gpu, non_blocking=True): batch 0 names the destination,
    # both tensors of each later batch are taken (train 2 x 3 batches, val 2 x 2)
    assert [_copied(line) for line in lines] == [(2 * 5, 2 * 5), (2 * 3, 2 * 3)], lines
