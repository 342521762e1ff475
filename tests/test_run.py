"""`fastdata run -- COMMAND`: unchanged scripts (tests/run_scripts/) run directly and under
`fastdata run`: the same batches and losses, the loaders served or fallen back as the run's
summary says, and --profile's reports valid against report.schema.json."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent / "run_scripts"
SCHEMA = Path(__file__).resolve().parent.parent / "fastdata" / "profiling" / "report.schema.json"


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
    # samples a function of the index: workers change no batch, so the default 0 became 'auto'
    assert "num_workers='auto'" in line and got["workers"] >= 1


def test_random_draws_in_getitem_keep_no_workers(tmp_path):
    want = _direct("train_plain.py", tmp_path / "direct.json", "--noisy")
    got, err = _under_run("train_plain.py", tmp_path / "run.json", "--noisy")
    assert got["ids"] == want["ids"] and got["losses"] == want["losses"]
    assert got["workers"] == 0
    (line,) = _summary(err)
    assert line.startswith("served") and "num_workers=0 kept: the dataset draws from a global RNG" in line, line


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
    assert "made no DataLoader" in code.stderr
    none = subprocess.run([sys.executable, "-m", "fastdata.cli", "run"], capture_output=True, text=True, timeout=60)
    assert none.returncode == 2 and "no command given" in none.stderr
