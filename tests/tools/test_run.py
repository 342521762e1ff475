"""`fastdata run -- COMMAND`: unchanged scripts (tests/run_scripts/) run directly and under
`fastdata run`: the same batches and losses, the loaders served or fallen back as the run's
summary says, and --profile's reports valid against report.schema.json. Then what a script sees
of its DataLoader as torch's (signatures, DataLoader[T], its iterator, get_worker_info() in a
worker, timeout=0), the workers added only where /dev/shm holds them, and the signals sent to
`fastdata run` reaching the script."""

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
    proc = subprocess.run([sys.executable, "-m", "fastdata", "run", *flags, "--", sys.executable,
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


def test_a_loader_an_installed_library_makes_is_named_by_the_scripts_line(tmp_path):
    """The summary names the script's line that called the library (timm's create_loader, say),
    not the library's own file."""
    lib = tmp_path / "lib" / "site-packages"
    lib.mkdir(parents=True)
    (lib / "loaders.py").write_text("import torch\n\ndef make(ds):\n"
                                    "    return torch.utils.data.DataLoader(ds, batch_size=4)\n")
    script = tmp_path / "train.py"
    script.write_text(f"import sys, torch\nsys.path.insert(0, {str(lib)!r})\nimport loaders\n"
                      "loader = loaders.make(torch.utils.data.TensorDataset(torch.arange(8)))\n"
                      "print([b.tolist() for (b,) in loader])\n")
    proc = subprocess.run([sys.executable, "-m", "fastdata", "run", "--", sys.executable, str(script)],
                          capture_output=True, text=True, timeout=150, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "[[0, 1, 2, 3], [4, 5, 6, 7]]\n"
    (line,) = _summary(proc.stderr)
    assert line.split()[:2] == ["served", "train.py:4"], line


def test_pickled_copied_and_rebuilt(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "fastdata", "run", "--", sys.executable,
                           str(SCRIPTS / "rebuild_loader.py")], capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr
    copies = json.loads(proc.stdout)
    assert all(c["is_dataloader"] and c["same"] for c in copies.values()), copies
    assert copies["pickled"]["type"] == copies["rebuilt"]["type"] == copies["rebuilt_custom"]["type"] == "Served"
    assert copies["rebuilt_iterable"]["type"] == "DataLoader"  # an IterableDataset: torch's own
    assert {c["name"] for name, c in copies.items() if name != "fastdata.loader"} == {"DataLoader"}  # torch's name
    assert copies["fastdata.loader"]["type"] == "TorchLoader"  # not a DataLoader the hook made, still one
    assert any("DataLoader(Stream): an IterableDataset" in line for line in _summary(proc.stderr))


@pytest.mark.timeout(300)
def test_lightning_same_batches(tmp_path):
    pytest.importorskip("pytorch_lightning")
    want = _direct("train_lightning.py", tmp_path / "direct.json")
    got, err = _under_run("train_lightning.py", tmp_path / "run.json")
    assert got["ids"] == want["ids"] and len(want["ids"]) == 2 * 8
    assert got["losses"] == want["losses"]
    assert got["loader"] == "Served"
    assert all(line.startswith("served") for line in _summary(err)), err


@pytest.mark.timeout(400)
def test_a_lightning_checkpoint_taken_mid_epoch_resumes_as_without_fastdata(tmp_path):
    """A served loader has no state_dict, as torch's DataLoader: Lightning writes no loader state
    into a checkpoint taken mid-epoch under `fastdata run` (one with it would resume only under
    fastdata: "The CombinedLoader has 0 stateful loaders, but found 1 states"), and a resume
    under either restarts the epoch as the script does without fastdata, with Lightning's
    warning that the loader is not resumable."""
    pytest.importorskip("pytorch_lightning")
    run = (sys.executable, "-m", "fastdata", "run", "--")

    def fit(name: str, under_run: bool, *args: str) -> tuple[dict, str]:
        out = tmp_path / f"{name}.json"
        proc = subprocess.run([*(run if under_run else ()), sys.executable, str(SCRIPTS / "train_lightning.py"),
                               str(out), *args], capture_output=True, text=True, timeout=150)
        assert proc.returncode == 0, proc.stderr[-4000:]
        return json.loads(out.read_text()), proc.stderr

    for saved_by in ("plain", "run"):
        fit(f"save-{saved_by}", saved_by == "run", "--save", str(tmp_path / saved_by))
    mid = "epoch=0-step=3.ckpt"  # after batch 3 of the 8 of epoch 0
    want, err = fit("plain-plain", False, "--resume", str(tmp_path / "plain" / mid))
    assert "not resumable" in err and len(want["ids"]) == 2 * 8 - 3
    for saved_by, resumed_by in (("run", "plain"), ("run", "run"), ("plain", "run")):
        got, err = fit(f"{saved_by}-{resumed_by}", resumed_by == "run", "--resume", str(tmp_path / saved_by / mid))
        assert got["ids"] == want["ids"] and got["losses"] == want["losses"], (saved_by, resumed_by)
        assert "not resumable" in err, (saved_by, resumed_by)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_lightning_ddp_loader_from_the_hook_same_shares(tmp_path):
    """DDP on 2 CPU processes, the DataLoader made in train_dataloader(): Lightning records its
    arguments as it is made and rebuilds it with a DistributedSampler, which needs the served
    loader's `dataset` among them (it once crashed both ranks)."""
    pytest.importorskip("pytorch_lightning")

    def ranks(out: Path, run: tuple) -> tuple[list[dict], str]:
        proc = subprocess.run([*run, sys.executable, str(SCRIPTS / "train_lightning.py"), str(out), "ddp"],
                              capture_output=True, text=True, timeout=300,
                              env={**os.environ, "PYTHONWARNINGS": "ignore"})
        assert proc.returncode == 0, proc.stderr[-4000:]
        return [json.loads(Path(f"{out}.rank{r}").read_text()) for r in range(2)], proc.stderr

    want, _ = ranks(tmp_path / "direct.json", ())
    got, err = ranks(tmp_path / "run.json", (sys.executable, "-m", "fastdata", "run", "--"))
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
    # (copies are made ahead only with workers: the script asks for 2, since a dataset's own
    # __getitem__ keeps the default 0)
    want = _direct("train_plain.py", tmp_path / "direct.json", "--device", "cuda", "--workers", "2")
    got, err = _under_run("train_plain.py", tmp_path / "run.json", "--device", "cuda", "--workers", "2")
    assert got["ids"] == want["ids"] and got["losses"] == want["losses"]
    assert got["workers"] == 2
    (line,) = _summary(err)
    # batch 0 names the destination; each later batch of the 3 epochs x 6 is copied ahead, and
    # the script takes x and y from the copies (it keeps the ids on the host)
    assert _copied(line) == (2 * 17, 3 * 17), line
    no_copy, err = _under_run("train_plain.py", tmp_path / "off.json", "--device", "cuda", "--workers", "2",
                              flags=("--no-copy-ahead",))
    assert no_copy["losses"] == want["losses"] and "copied ahead" not in err


@pytest.mark.gpu
@pytest.mark.timeout(300)
def test_lightning_gpu_same_batches_copied_ahead(tmp_path):
    pytest.importorskip("pytorch_lightning")
    want = _direct("train_lightning.py", tmp_path / "direct.json", "gpu", "--workers", "2")
    got, err = _under_run("train_lightning.py", tmp_path / "run.json", "gpu", "--workers", "2")
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
    proc = subprocess.run([sys.executable, "-m", "fastdata", "run", "--", sys.executable, "-c", launcher,
                           sys.executable, str(SCRIPTS / "train_plain.py"), str(tmp_path / "run.json")],
                          capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr
    got = json.loads((tmp_path / "run.json").read_text())
    assert got["ids"] == want["ids"] and got["losses"] == want["losses"] and got["loader"] == "Served"
    assert (tmp_path / "site-ran").read_text() == "xxx"  # fastdata run, the launcher, the script
    (line,) = _summary(proc.stderr)
    assert line.startswith("served") and "train_plain.py:" in line


def test_a_module_a_folder_and_a_script_without_its_suffix_run_as_python_runs_them(tmp_path):
    """What torchrun runs with Python, fastdata run does: `-m MODULE` (its arguments, a --profile
    among them, are the module's), a folder with a __main__.py, a script that is not executable
    and has no .py; a missing .py is Python's to refuse, with its exit status."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "mod.py").write_text("import sys\nprint(sys.argv[1:], __name__, __spec__.name)\n")
    (tmp_path / "pkg" / "__main__.py").write_text("print('the folder runs')\n")
    (tmp_path / "noext").write_text("import sys\nprint('no suffix', sys.argv[1:])\n")
    for under, plain in ((["-m", "pkg.mod", "0", "--profile"], ["-m", "pkg.mod", "0", "--profile"]),
                         (["--", "-m", "pkg.mod", "1"], ["-m", "pkg.mod", "1"]),
                         (["noext", "a"], ["noext", "a"]), (["pkg"], ["pkg"]), (["missing.py"], ["missing.py"])):
        want = subprocess.run([sys.executable, *plain], cwd=tmp_path, capture_output=True, text=True, timeout=60)
        got = subprocess.run([sys.executable, "-m", "fastdata", "run", *under], cwd=tmp_path, capture_output=True,
                             text=True, timeout=60)
        assert (got.returncode, got.stdout) == (want.returncode, want.stdout), (under, got.stderr)
    assert want.returncode == 2 and not (tmp_path / "fastdata-run").exists()


@pytest.mark.parametrize("workers", [0, 2])
def test_a_child_forked_mid_pass_leaves_the_parents_pass_alone(tmp_path, workers):
    """A child forked during a pass makes a pass of its own over the same loader, then ends:
    the parent's pass goes on to its last batch, as under torch. The child's iter() took the
    parent's live pass (inherited) for its own and ended it: its workers, shared with the
    parent, stopped, and the parent waited for ever."""
    script = tmp_path / "fork_mid_pass.py"
    script.write_text(
        "import faulthandler, os, sys, torch\n"
        "faulthandler.dump_traceback_later(60, exit=True)\n"
        f"loader = torch.utils.data.DataLoader(list(range(48)), batch_size=4, num_workers={workers})\n"
        "for k, batch in enumerate(loader):\n"
        "    print('parent', batch.tolist(), flush=True)\n"
        "    if k == 0:\n"
        "        pid = os.fork()\n"
        "        if pid == 0:\n"
        "            print('child', sum(len(b) for b in loader), flush=True)\n"
        "            os._exit(0)\n"
        "        os.waitpid(pid, 0)\n"
        "print('done')\n")
    want = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    got = subprocess.run([sys.executable, "-m", "fastdata", "run", str(script)], capture_output=True, text=True,
                         timeout=120)
    assert want.returncode == 0 and want.stdout.count("parent") == 12 and "child 48" in want.stdout
    assert got.returncode == 0 and got.stdout == want.stdout, got.stderr[-3000:]
    assert "served" in _summary(got.stderr)[0]


def test_a_sitecustomize_the_script_imports_by_name_is_its_own(tmp_path, monkeypatch):
    """fastdata run's sitecustomize runs the one it shadows, which is then the module `import
    sitecustomize` gives the script, as without fastdata run (a script that used a helper of its
    environment's sitecustomize failed with AttributeError)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("def helper():\n    return 'helper of the environment'\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    script = tmp_path / "uses_site.py"
    script.write_text("import sitecustomize\nprint(sitecustomize.helper(), sitecustomize.__file__)\n")
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    under = subprocess.run([sys.executable, "-m", "fastdata", "run", str(script)], capture_output=True, text=True,
                           timeout=60)
    assert plain.returncode == 0 and under.returncode == 0, under.stderr
    assert under.stdout == plain.stdout == f"helper of the environment {site / 'sitecustomize.py'}\n"


def test_a_python_the_hook_cannot_load_in_imports_torch_under_w_error(tmp_path):
    """A process of the command whose Python has no fastdata (a tool in another environment)
    imports torch as it would without fastdata run, even where warnings are errors (pytest's
    filterwarnings, -W error): the hook says it is off in a line on stderr, not a warning."""
    code = "import sys; sys.modules['fastdata.run._hook'] = None; import torch; print('imported')"
    proc = subprocess.run([sys.executable, "-m", "fastdata", "run", "--", sys.executable, "-W", "error", "-c", code],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == "imported\n", proc.stderr
    assert f"fastdata run: the hook is off in {sys.executable}: ModuleNotFoundError: import of fastdata.run._hook " \
           "halted; None in sys.modules" in proc.stderr, proc.stderr


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


def test_profile_of_a_single_batch_says_why_there_is_no_report(tmp_path):
    """A step is timed from one batch to the next: a script that takes one batch gets no report,
    and the line says so (not that no batch was delivered)."""
    script = ("import torch\nds = torch.utils.data.TensorDataset(torch.zeros(8, 2))\n"
              "next(iter(torch.utils.data.DataLoader(ds, batch_size=4)))\n")
    proc = subprocess.run([sys.executable, "-m", "fastdata", "run", "--profile", "--out", str(tmp_path / "rep"),
                           "--", sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "no served loader delivered 2 batches (a step is timed from one batch to the next): no report" in \
        proc.stderr, proc.stderr


def test_exit_status_and_no_command(tmp_path):
    code = subprocess.run([sys.executable, "-m", "fastdata", "run", "--", sys.executable, "-c",
                           "raise SystemExit(3)"], capture_output=True, text=True, timeout=60)
    assert code.returncode == 3
    assert code.stderr.strip().splitlines()[-1] == "fastdata run: the command exited with status 3 before it made a " \
        "DataLoader"  # not the hook's hint: the command failed
    missing = subprocess.run([sys.executable, "-m", "fastdata", "run", sys.executable, str(tmp_path / "nope.py")],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "can't open file" in missing.stderr and "status 2" in missing.stderr
    fine = subprocess.run([sys.executable, "-m", "fastdata", "run", "--", sys.executable, "-c", "pass"],
                          capture_output=True, text=True, timeout=60)
    assert fine.returncode == 0 and "made no DataLoader" in fine.stderr
    none = subprocess.run([sys.executable, "-m", "fastdata", "run"], capture_output=True, text=True, timeout=60)
    assert none.returncode == 2 and "no command given" in none.stderr


def test_the_launcher_imports_neither_torch_nor_the_loader(monkeypatch):
    """`fastdata run`'s own process only starts the command and waits: torch's import (most of
    what it added to a command's start) is left to the command's processes, which import it as
    they would without fastdata, and the script's loaders are served."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "fastdata", "run", "--", sys.executable, "-c",
                           "import torch, sys; assert 'fastdata.run._hook' in sys.modules; "
                           "torch.utils.data.DataLoader(range(4)); print('ran')"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == "ran\n", proc.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "fastdata.cli" in imported
    assert not {"torch", "numpy", "fastdata.factory"} & imported, sorted(imported)
    import fastdata

    # the console script's form: sys.argv[0] the script, behind the interpreter in orig_argv
    monkeypatch.setattr(sys, "argv", ["/venv/bin/fastdata", "run", "--", "python", "train.py"])
    monkeypatch.setattr(sys, "orig_argv", ["/venv/bin/python3", *sys.argv])
    assert fastdata._needs_no_torch()
    for argv in (["/venv/bin/fastdata", "profile", "--help"], ["/venv/bin/fastdata-shard", "src", "-h"]):
        monkeypatch.setattr(sys, "argv", argv)  # a help page: its command's parser alone
        monkeypatch.setattr(sys, "orig_argv", ["/venv/bin/python3", *argv])
        assert fastdata._needs_no_torch(), argv
    for argv, orig in ((["/venv/bin/fastdata", "profile", "run"], None),  # another command
                       (["/venv/bin/fastdata", "--version"], None),  # it prints torch's version
                       (["/venv/bin/fastdata-profile", "-h", "--version"], None),
                       (["/venv/bin/fastdata", "profile", "--", "--help"], None),  # past `--`: no option
                       (["train.py", "run"], None),  # a script of another name
                       (["train.py", "--help"], None),
                       (["-c", "run"], ["python", "-c", "import fastdata", "run"]),
                       (["-m", "run"], ["python", "-m", "fastdata.cli", "run"])):
        monkeypatch.setattr(sys, "argv", argv)
        monkeypatch.setattr(sys, "orig_argv", orig or ["/venv/bin/python3", *argv])
        assert not fastdata._needs_no_torch(), argv


def test_a_script_named_alone_runs_with_this_python(tmp_path):
    """`fastdata run train.py ARGS` (no `python`, the script not executable) runs it as torchrun
    would, with the Python that runs fastdata: the hook is in, the arguments reach the script."""
    script = tmp_path / "train.py"
    script.write_text("import sys, torch, fastdata.run._hook as h\n"
                      "assert torch.utils.data.DataLoader is h.DataLoader\n"
                      "raise SystemExit(int(sys.argv[1]))\n")
    assert not os.access(script, os.X_OK)
    proc = subprocess.run([sys.executable, "-m", "fastdata", "run", str(script), "5"], capture_output=True,
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
    proc = subprocess.run([sys.executable, "-m", "fastdata", "run", "--", sys.executable,
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


@pytest.mark.parametrize("workers", [0, 2])
def test_a_look_at_a_batch_inside_the_loop_leaves_the_epoch_whole(tmp_path, workers):
    """`next(iter(train_loader))` inside `for ... in train_loader`: as with torch's, the loop
    goes on to the end of its epoch, in the same order and with the same losses."""
    want, got, lines = _both("train_loops.py", tmp_path / "run.json", tmp_path / "run.json", "--peek",
                             "--workers", str(workers))
    _same_run(want, got)
    assert got["peek_ids"] == want["peek_ids"] and len(want["peek_ids"]) == 2
    assert len(want["ids"]) == 2 * 6
    _each_once(want["ids"], 2, list(range(48)))
    assert got["loaders"] == ["Served"] and lines[0].startswith("served"), lines


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", ["ra", "numpy", "lazy", "buckets", "ends"])
def test_a_sampler_of_the_scripts_is_served_with_its_own_order_and_draws(tmp_path, kind, workers):
    """A sampler or batch_sampler of the script's (torchvision's references' repeated-augmentation
    sampler, a NumPy shuffle, draws from torch's RNG per index or at the end, buckets of varying
    size) is served: the same batches, losses and RNG streams as with torch's DataLoader, also
    with a look at a batch of a second iterator mid-epoch, whose first iterator goes on from its
    own sampler iterator (drawing its order again would draw another)."""
    want, got, lines = _both("train_samplers.py", tmp_path / "run.json", tmp_path / "run.json", kind, workers,
                             "--peek")
    for key in ("ids", "losses", "peeked", "after", "ends"):
        assert got[key] == want[key], key
    if kind == "ra":  # this rank's share of each index three times, 3 epochs of 25 samples
        assert len(want["ids"]) == 3 * 7 and len(sum(want["ids"], [])) == 75
    assert len(want["peeked"]) == 3 and want["ids"][:7] != want["ids"][7:14]
    (line,) = lines
    assert got["loader"] == "Served" and line.startswith("served"), line
    assert f"num_workers={workers} as the script set it" in line, line


@pytest.mark.gpu
@pytest.mark.timeout(300)
def test_cuda_non_blocking_loop_gpu_same_batches(tmp_path):
    want, got, lines = _both("train_loops.py", tmp_path / "run.json", tmp_path / "run.json", "--move", "cuda_nb",
                             "--val", "--workers", "2")
    _same_run(want, got)
    assert len(want["ids"]) == 2 * 6 and got["workers"] == [2, 2]
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


# -- what the script sees of its DataLoader, as torch's: signatures, DataLoader[T], its iterator,
# get_worker_info(), timeout=0, /dev/shm; and the signals sent to `fastdata run`.

SAME_AS_TORCH = '''
import inspect, sys
from typing import Any
import torch
from torch.utils.data import DataLoader, TensorDataset

cfg = {"batch_size": 4, "shuffle": False, "drop_last": True, "lr": 0.1}
kwargs = {k: v for k, v in cfg.items() if k in inspect.signature(DataLoader).parameters}

def count(loader: DataLoader[Any]) -> int:
    return sum(len(b[0]) for b in loader)

class Typed(DataLoader[int]):
    pass

ds = TensorDataset(torch.arange(10.0))
loader = DataLoader(ds, **kwargs)
it = iter(loader)
steps = len(it)
first = next(it)[0].tolist()
print(kwargs, steps, it._num_yielded, first, count(loader), [b[0].tolist() for b in Typed(ds, batch_size=3)],
      list(inspect.signature(loader.__init__).parameters)[:3], bool(it))

from abc import ABC, ABCMeta, abstractmethod

class Abstract(DataLoader, ABC):
    @abstractmethod
    def kind(self): ...

class Concrete(Abstract):
    def kind(self):
        return "concrete"

class Meta(DataLoader, metaclass=ABCMeta):
    pass

try:
    Abstract(ds)
except TypeError as e:
    print(e)
print(Concrete(ds, batch_size=5).kind(), [b[0].tolist() for b in Meta(ds, batch_size=5)],
      isinstance(Concrete(ds), DataLoader), issubclass(Meta, DataLoader), isinstance(Meta, ABCMeta))
'''


def test_a_script_sees_torchs_dataloader(tmp_path):
    """A config filtered by DataLoader's signature, `DataLoader[Any]` annotations, a subclass of
    `DataLoader[int]`, abstract subclasses (ABC, metaclass=ABCMeta), `len(iter(loader))` and
    `_num_yielded`: the same output as without fastdata."""
    script = tmp_path / "script.py"
    script.write_text(SAME_AS_TORCH)
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0, plain.stderr
    proc = subprocess.run([sys.executable, "-m", "fastdata", "run", str(script)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == plain.stdout and "'batch_size': 4" in plain.stdout
    lines = _summary(proc.stderr)
    assert lines[0].startswith("served") and "Typed(TensorDataset)" in lines[1] and "fell back" in lines[1], lines


def _hook():
    from fastdata.run import _hook

    return _hook


def test_iterator_len_and_count_are_torchs(monkeypatch):
    """len(iter(loader)) is its batch sampler's (or with batch_size=None its sampler's), and
    `_num_yielded` counts the batches handed out, not one whose dataset raised; with --profile,
    the length and the count too."""
    from torch.utils.data import DataLoader as TorchDataLoader

    hook = _hook()
    for kwargs in ({"batch_size": 4}, {"batch_size": 4, "drop_last": True}, {"batch_size": None}):
        ds = Flaky(13)
        mine, torchs = iter(hook.DataLoader(ds, **kwargs)), iter(TorchDataLoader(ds, **kwargs))
        assert len(mine) == len(torchs) and bool(mine) is bool(torchs), kwargs
        for it in (mine, torchs):
            ds.fail = set()
            next(it)
            ds.fail = {1, 4, 5, 6, 7}  # the second batch (samples 4 to 7), or with batch_size=None, sample 1
            with pytest.raises(ValueError, match="sample"):
                next(it)
            ds.fail = set()
            next(it)
        assert mine._num_yielded == torchs._num_yielded == 2, kwargs
    monkeypatch.setenv("FASTDATA_RUN_PROFILE", "1")
    timed = iter(hook.DataLoader(Flaky(10), batch_size=3))
    assert len(timed) == 4 and timed._num_yielded == 0
    next(timed)
    assert timed._num_yielded == 1
    empty = iter(hook.DataLoader(Flaky(2), batch_size=4, drop_last=True))
    assert len(empty) == 0 and not empty and len(list(empty)) == 0


class Flaky:
    """A map-style dataset whose samples in `fail` raise."""

    def __init__(self, n: int) -> None:
        self.n, self.fail = n, set()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        import torch

        if i in self.fail:
            raise ValueError(f"sample {i}")
        return torch.tensor([i])


class SlowFirst:
    """Each worker's first sample takes `delay` seconds (a cache built, a file indexed)."""

    def __init__(self, delay: float) -> None:
        self.delay, self.ready = delay, False

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> Any:
        import time

        import torch

        if not self.ready:
            time.sleep(self.delay)
            self.ready = True
        return torch.tensor([i])


@pytest.mark.timeout(120)
def test_timeout_0_waits_as_torchs(monkeypatch):
    """The script's timeout=0 (torch: wait as long as it takes) has no stall limit under fastdata
    run: a first batch slower than FASTDATA_STALL_TIMEOUT comes. A timeout the script set still
    holds, and fastdata.loader keeps its documented stall limit."""
    import fastdata

    hook = _hook()
    monkeypatch.setenv("FASTDATA_STALL_TIMEOUT", "0.5")
    loader = hook.DataLoader(SlowFirst(1.5), batch_size=4, num_workers=1)
    assert type(loader) is hook.Served and loader.timeout == 0
    assert [b.flatten().tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(RuntimeError, match="timed out after 0.5 seconds"):
        list(hook.DataLoader(SlowFirst(1.5), batch_size=4, num_workers=1, timeout=0.5))
    with pytest.raises(RuntimeError, match="FASTDATA_STALL_TIMEOUT=0.5"):
        list(fastdata.loader(SlowFirst(1.5), batch_size=4, num_workers=1))


class Folder:
    """A torchvision-like image folder (`samples`, `classes`, `target_transform`) of 8x8 JPEGs,
    its own samples CHW float tensors (as ToTensor's) for where they are not decoded natively."""

    def __init__(self, root: Path, n: int = 6) -> None:
        from PIL import Image

        self.classes, self.root, self.target_transform, self.samples = ["a", "b", "c"], str(root), None, []
        for i in range(n):
            path = root / f"{i}.jpg"
            Image.new("RGB", (12, 8), (40 * i, 0, 0)).save(path)
            self.samples.append((str(path), i % 3))
        self.targets = [t for _, t in self.samples]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> Any:
        import torch

        return torch.zeros(3, 8, 8), self.targets[i]


def _lowered(monkeypatch, geometry: tuple) -> Any:
    """The hook's `lower_any` (where it decides, and where it serves) made to lower a `Folder` with
    `geometry` (then ToTensor): no torchvision needed."""
    from fastdata.run import _decide
    from fastdata.run._torchvision import Lowering

    hook = _hook()
    lowering = Lowering(geometry, (), "bilinear", (("to", None, "div"),), "Resize, ToTensor")
    for module in (hook, _decide):
        monkeypatch.setattr(module, "lower_any", lambda ds: (lowering, "") if isinstance(ds, Folder) else (None, ""))
    return lowering


def _record_worker(path: str, worker_id: int) -> None:
    from torch.utils.data import get_worker_info

    ds = get_worker_info().dataset
    with open(path, "a") as f:
        f.write(f"{type(ds).__name__} {len(getattr(ds, 'classes', ()))}\n")


@pytest.mark.timeout(120)
def test_worker_info_dataset_is_the_scripts(tmp_path, monkeypatch):
    """In a worker of a natively served folder, get_worker_info().dataset is the script's
    dataset (its `classes`, its root), not fastdata's NativeFolder."""
    import functools

    from fastdata.run import _torchvision
    from fastdata.transforms import ops as fd

    hook = _hook()
    _lowered(monkeypatch, (fd.Resize((8, 8)),))
    record = tmp_path / "workers.txt"
    ds = Folder(tmp_path)
    loader = hook.DataLoader(ds, batch_size=2, num_workers=2,
                             worker_init_fn=functools.partial(_record_worker, str(record)))
    assert type(loader) is hook.Served and isinstance(loader._loader.dataset, _torchvision.NativeFolder)
    assert sorted(t for _, labels in loader for t in labels.tolist()) == sorted(ds.targets)
    assert record.read_text().splitlines() == ["Folder 3"] * 2


def test_a_natively_served_folder_is_profiled_as_fastdatas_decode(tmp_path, monkeypatch):
    """With --profile, a natively served folder's fetch (fastdata reads and decodes its files)
    is named as the decode it is, not as the script's __getitem__ (which it replaced): no "a
    cheaper __getitem__ would help" for code fastdata runs; the same loader not served natively
    keeps the Dataset's name."""
    import numpy as np
    from PIL import Image

    from fastdata.run import _decide, _torchvision
    from fastdata.run._profile import report
    from fastdata.transforms import ops as fd

    hook = _hook()
    monkeypatch.setenv("FASTDATA_RUN_PROFILE", "1")
    lowering = _lowered(monkeypatch, (fd.Resize((8, 8)),))
    monkeypatch.setattr(_torchvision, "lower", lambda ds: (lowering, ""))  # (where the fetch lowers it)
    folder = Folder(tmp_path, n=12)
    for path, _ in folder.samples:  # (noise of 512 px: the decode, not the batching, costs the most)
        Image.fromarray(np.random.default_rng(0).integers(0, 256, (512, 512, 3), np.uint8)).save(path)
    for want in ("decode", "dataset"):
        if want == "dataset":  # (not lowered: served as any Dataset)
            for module in (hook, _decide):
                monkeypatch.setattr(module, "lower_any", lambda ds: (None, ""))
        loader = hook.DataLoader(folder, batch_size=4, num_workers=0)
        assert sorted(t for _, labels in loader for t in labels.tolist()) == [0] * 4 + [1] * 4 + [2] * 4
        timing = loader._fastdata_timing.to_json()
        stages = timing["stages"]  # (on a loaded machine the read can cost the most: the wording is tested here)
        stages.update({k: min(v, stages["dataset"] / 4) for k, v in stages.items() if k not in ("dataset", "images")})
        # (a step that waits for the fetch's time: in-process, the wait is the loader's own)
        timing["wait_s"] = sum(v for k, v in timing["stages"].items() if k != "images")
        timing["compute_s"] = timing["wait_s"] / 10
        r = report(timing, "train.py:3 DataLoader(Folder)")
        assert want in r.stages and ({"decode", "dataset"} - {want}).isdisjoint(r.stages), r.stages
        said = " ".join([r.headline, r.explanation, *(a.text for a in r.advice)])
        if want == "decode":
            assert "__getitem__" not in said and "Dataset's" not in said, said
            assert "served natively: fastdata reads, decodes, crops and resizes the files" in r.explanation
            assert "JPEG decode, crop, resize costs the most" in r.headline and "smaller stored images" in r.headline, \
                r.headline
        else:
            assert "served natively" not in said, said


@pytest.mark.parametrize("free,workers", [(64 * 2**20, None), (2**40, "auto"), (None, "auto")],
                         ids=["64MB", "1TB", "no-dev-shm"])
def test_auto_workers_only_where_dev_shm_has_room(tmp_path, monkeypatch, free, workers):
    """A natively served folder the script left at num_workers=0 gets workers only where /dev/shm
    holds their batches (64 MB, Docker's default, does not hold 224 px batches of 64), else keeps
    the 0 and says why."""
    import multiprocessing

    from fastdata.run import _shm
    from fastdata.transforms import ops as fd

    if multiprocessing.get_start_method(allow_none=True) not in (None, "fork"):
        pytest.skip("workers are added only where they start by fork")
    hook = _hook()
    _lowered(monkeypatch, (fd.RandomResizedCrop(224),))
    monkeypatch.setattr(_shm, "shm_free", lambda: free)
    served, reason, got, _ = hook.decide((Folder(tmp_path),), {"batch_size": 64})
    assert served and got == workers, reason
    if workers is None:
        assert "num_workers=0 kept: /dev/shm has 64 MB free, and" in reason and "workers' batches would take" in reason


def test_a_shuffle_from_torchs_rng_keeps_the_scripts_zero_workers(tmp_path, monkeypatch):
    """torch draws a shuffle from its RNG at iter() with workers, at the first next() without: a
    script that draws between (a model made after iter(), zip of two loaders) would get other
    draws with workers. With a generator of the script's the shuffle draws from that."""
    import multiprocessing

    from fastdata.transforms import ops as fd

    if multiprocessing.get_start_method(allow_none=True) not in (None, "fork"):
        pytest.skip("workers are added only where they start by fork")
    hook = _hook()
    _lowered(monkeypatch, (fd.Resize((8, 8)),))
    ds = Folder(tmp_path)
    served, reason, got, _ = hook.decide((ds,), {"batch_size": 2, "shuffle": True})
    assert served and got is None and "num_workers=0 kept: shuffle=True without a generator" in reason, reason
    import torch

    served, _, got, _ = hook.decide((ds,), {"batch_size": 2, "shuffle": True, "generator": torch.Generator()})
    assert served and got == "auto"


def test_a_target_transform_keeps_the_scripts_zero_workers(tmp_path, monkeypatch):
    """A natively served folder with a target_transform keeps num_workers=0: the script's code
    may keep state (a count of the labels it saw), which in workers would stay there."""
    import multiprocessing

    from fastdata.transforms import ops as fd

    if multiprocessing.get_start_method(allow_none=True) not in (None, "fork"):
        pytest.skip("workers are added only where they start by fork")
    hook = _hook()
    _lowered(monkeypatch, (fd.Resize((8, 8)),))
    ds = Folder(tmp_path)
    served, _, got, _ = hook.decide((ds,), {"batch_size": 2})
    assert served and got == "auto"  # without one: workers
    ds.target_transform = lambda target: target
    served, reason, got, _ = hook.decide((ds,), {"batch_size": 2})
    assert served and got is None and "num_workers=0 kept: a target_transform of the script's" in reason, reason
    loader = hook.DataLoader(ds, batch_size=2)
    assert loader.num_workers == 0 and sorted(t for _, labels in loader for t in labels.tolist()) == sorted(ds.targets)


def test_dev_shm_room_is_shared_and_sized_by_the_images(tmp_path, monkeypatch):
    """Two folders that each fit in /dev/shm alone but not together: the second keeps its 0 (a
    loader made anew over the first counts the first's share once). The images' size comes from
    the transform (its padding too), else the first file (12x8 here), else no workers are added."""
    from fastdata.run import _shm
    from fastdata.run._crop import Pad
    from fastdata.run._torchvision import Lowering
    from fastdata.transforms import ops as fd

    (tmp_path / "a").mkdir()
    first, second = Folder(tmp_path / "a"), Folder(tmp_path)
    lowering = Lowering((fd.Resize((64, 64)),), (), "bilinear", (("to", None, "div"),), "Resize, ToTensor")
    call = {"batch_size": 64, "dataset": first}
    monkeypatch.setattr(_shm, "shm_free", lambda: 2**40)
    assert _shm.shm_room(call, lowering) == ""
    need = _shm._held[first]
    monkeypatch.setattr(_shm, "shm_free", lambda: need + need // 2)
    assert _shm.shm_room(call, lowering) == ""
    assert "for this loader" in _shm.shm_room({**call, "dataset": second}, lowering)
    assert _shm.image_size((fd.Resize(16),), first) == (16, 24)  # the shorter side (8 of 12x8) to 16
    assert _shm.image_size((fd.Resize(256), fd.CenterCrop(224)), object()) == (224, 224)  # no file read
    assert _shm.image_size((), first) == (8, 12)
    assert _shm.image_size((Pad((1, 2, 3, 4)), fd.Resize(16)), first) == (16, 18)  # (14, 16), then 14 to 16
    assert _shm.image_size((fd.CenterCrop(224), Pad((1, 2, 3, 4))), object()) == (230, 228)
    first.samples = []
    assert _shm.image_size((fd.Resize(16),), first) is None
    unknown = Lowering((fd.Resize(16),), (), "bilinear", (("to", None, "div"),), "Resize, ToTensor")
    assert "size could not be read" in _shm.shm_room(call, unknown)


SIGNALS = '''
import os, signal, sys, time
out = sys.argv[1]
def note(signum, frame):
    with open(out, "a") as f:
        f.write(signal.Signals(signum).name + "\\n")
    if signum == signal.SIGTERM:
        sys.exit(43)
    if signum == signal.SIGINT and sys.argv[2:] == ["ask-parent"]:
        os.kill(os.getppid(), signal.SIGUSR1)  # forwarded back, after any SIGINT forwarded before it
    if signum == signal.SIGUSR1 and sys.argv[2:] == ["ask-parent"]:
        sys.exit(7)
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(s, note)
with open(out, "a") as f:
    f.write("ready " + os.environ["FASTDATA_RUN_DIR"] + "\\n")
while True:
    time.sleep(0.05)
'''


def _lines_once(path: Path, proc: subprocess.Popen, n: int) -> list[str]:
    """The first `n` lines of `path` once there (a deadline, not a measure: no test hangs)."""
    import time

    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and proc.poll() is None:
        lines = path.read_text().splitlines() if path.exists() else []
        if len(lines) >= n:
            return lines
        time.sleep(0.02)
    raise AssertionError(f"{path} has {path.read_text() if path.exists() else 'nothing'}; exit {proc.poll()}")


def _end_group(proc: subprocess.Popen) -> None:
    """Kills what is left of `proc`'s process group (it leads one): the script too, should
    fastdata run have ended without it."""
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def _signals_at_their_defaults() -> None:
    """Run in the child before it execs: the signals these tests send at their defaults, as a
    process manager or a terminal starts a command. A test run under `nohup`, or as a shell's
    background job, would otherwise pass them on ignored, and fastdata run leaves an ignored
    signal ignored (`test_ignored_signals_stay_ignored`)."""
    import signal

    for signum in (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, signal.SIG_DFL)


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL", "KeyboardInterrupt", "exit 143"])
def test_a_script_a_signal_ends_ends_fastdata_run_by_that_signal(tmp_path, how):
    """A script ended by a signal (its own kill, the OOM killer's SIGKILL, or a Ctrl-C's
    KeyboardInterrupt left uncaught, which CPython ends by SIGINT): fastdata run is then ended by
    the same signal, so that its caller sees what it sees without fastdata (Popen's -N, a shell's
    loop stopping at a Ctrl-C), where an exit status of 128 + N is a normal exit. A script that
    exits with 143 exits so. Called from Python (`cli.main(argv)`), it returns 128 + N."""
    script = tmp_path / "ends.py"
    script.write_text("import os, signal, sys\n" + {
        "SIGTERM": "os.kill(os.getpid(), signal.SIGTERM)\n",
        "SIGKILL": "os.kill(os.getpid(), signal.SIGKILL)\n",
        "KeyboardInterrupt": "signal.signal(signal.SIGINT, signal.default_int_handler)\nraise KeyboardInterrupt\n",
        "exit 143": "sys.exit(143)\n"}[how])
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                           preexec_fn=_signals_at_their_defaults)
    served = subprocess.run([sys.executable, "-m", "fastdata", "run", str(script)], capture_output=True, text=True,
                            timeout=60, preexec_fn=_signals_at_their_defaults)
    want = {"SIGTERM": -15, "SIGKILL": -9, "KeyboardInterrupt": -2, "exit 143": 143}[how]
    assert plain.returncode == served.returncode == want, served.stderr
    ended = "exited with status 143" if how == "exit 143" else \
        f"was ended by signal {'SIGINT' if how == 'KeyboardInterrupt' else how}"
    assert f"fastdata run: the command {ended} before it made a DataLoader" in served.stderr, served.stderr
    called = subprocess.run([sys.executable, "-c", "import sys; from fastdata import cli; "
                             f"print('returned', cli.main(['run', {str(script)!r}]))"],
                            capture_output=True, text=True, timeout=60, preexec_fn=_signals_at_their_defaults)
    assert called.returncode == 0 and called.stdout.split() == ["returned", str(128 - want if want < 0 else want)]


@pytest.mark.timeout(200)
def test_signals_sent_to_fastdata_run_reach_the_script(tmp_path):
    """SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGINT and SIGTERM sent to `fastdata run`'s pid (as a
    process manager, a scheduler, `kill` send them): each reaches the script once, fastdata run
    waits for it and exits with its status, and its records folder is gone."""
    import signal

    script, out = tmp_path / "signals.py", tmp_path / "got.txt"
    script.write_text(SIGNALS)
    proc = subprocess.Popen([sys.executable, "-m", "fastdata", "run", str(script), str(out)],
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=_signals_at_their_defaults)
    try:
        records = _lines_once(out, proc, 1)[0].split(" ", 1)[1]
        sent = [signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT, signal.SIGTERM]
        for k, signum in enumerate(sent):
            os.kill(proc.pid, signum)
            if signum != signal.SIGTERM:
                _lines_once(out, proc, k + 2)
        assert proc.wait(timeout=60) == 43
    finally:
        _end_group(proc)
    assert out.read_text().splitlines()[1:] == [s.name for s in sent]
    assert not os.path.exists(records)


@pytest.mark.timeout(200)
def test_a_stopped_and_continued_fastdata_run_goes_on(tmp_path):
    """SIGSTOP and SIGCONT to fastdata run (a job suspended and resumed, a debugger's pause): it
    goes on waiting for the script, and forwards what comes after."""
    import signal
    import time

    script, out = tmp_path / "signals.py", tmp_path / "got.txt"
    script.write_text(SIGNALS)
    proc = subprocess.Popen([sys.executable, "-m", "fastdata", "run", str(script), str(out)],
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_signals_at_their_defaults)
    try:
        _lines_once(out, proc, 1)
        for _ in range(3):
            os.kill(proc.pid, signal.SIGSTOP)
            time.sleep(0.3)  # past the wait's 0.1 s
            os.kill(proc.pid, signal.SIGCONT)
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=60) == 43, proc.stderr.read()
    finally:
        _end_group(proc)
    assert out.read_text().splitlines()[1:] == ["SIGTERM"]


@pytest.mark.timeout(200)
def test_terminal_ctrl_c_reaches_the_script_once(tmp_path):
    """Ctrl-C at a terminal sends SIGINT to the foreground process group, fastdata run and the
    script alike: the script gets it once (fastdata run does not send it a second)."""
    script, out = tmp_path / "signals.py", tmp_path / "got.txt"
    script.write_text(SIGNALS)
    try:
        master, slave = os.openpty()
    except OSError as e:
        pytest.skip(f"no pseudo-terminal here: {e}")
    # fastdata run as a terminal's session leader and foreground group, the pty its terminal
    launcher = ("import fcntl, os, sys, termios; os.setsid(); fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
                "os.execv(sys.executable, [sys.executable, '-m', 'fastdata', 'run', *sys.argv[1:]])")
    proc = subprocess.Popen([sys.executable, "-c", launcher, str(script), str(out), "ask-parent"], stdin=slave,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=_signals_at_their_defaults)
    os.close(slave)
    try:
        _lines_once(out, proc, 1)
        os.write(master, b"\x03")
        assert proc.wait(timeout=60) == 7
    finally:
        _end_group(proc)
        os.close(master)
    assert out.read_text().splitlines()[1:] == ["SIGINT", "SIGUSR1"]


def test_ignored_signals_stay_ignored(tmp_path):
    """A command started ignoring SIGHUP and SIGINT (`nohup`, a shell's background job) ignores
    them under `fastdata run` as without it (fastdata run neither catches nor forwards them)."""
    script = tmp_path / "ignored.py"
    script.write_text("import signal\nprint([signal.getsignal(s) is signal.SIG_IGN for s in "
                      "(signal.SIGHUP, signal.SIGINT, signal.SIGTERM)])\n")
    launcher = ("import os, signal, sys; signal.signal(signal.SIGHUP, signal.SIG_IGN); "
                "signal.signal(signal.SIGINT, signal.SIG_IGN); "
                "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])")
    plain = subprocess.run([sys.executable, "-c", launcher, str(script)], capture_output=True, text=True, timeout=60)
    proc = subprocess.run([sys.executable, "-c", launcher, "-m", "fastdata", "run", str(script)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == plain.returncode == 0, proc.stderr
    assert proc.stdout == plain.stdout == "[True, True, False]\n"


def test_a_served_loader_has_no_state_methods_as_torchs_has_none():
    """Neither hasattr nor a runtime-checkable protocol (Lightning's `_Stateful`; Python 3.12
    looks the methods up with `inspect.getattr_static`) finds state methods on a served loader,
    as on torch's DataLoader; fastdata.loader's drop-in has them."""
    import inspect
    from typing import Protocol, runtime_checkable

    import torch

    import fastdata
    from fastdata.run._hook import DataLoader, Served

    @runtime_checkable
    class Stateful(Protocol):
        def state_dict(self) -> dict: ...

        def load_state_dict(self, state: dict) -> None: ...

    dataset = torch.utils.data.TensorDataset(torch.arange(40))
    served = DataLoader(dataset, batch_size=8)
    assert type(served) is Served
    for loader, has in ((torch.utils.data.DataLoader(dataset, batch_size=8), False), (served, False),
                        (fastdata.loader(dataset, batch_size=8), True)):
        assert isinstance(loader, Stateful) is has, type(loader)
        for name in ("state_dict", "load_state_dict"):
            assert hasattr(loader, name) is has, (type(loader), name)
            try:
                inspect.getattr_static(loader, name)
                assert has, (type(loader), name)
            except AttributeError:
                assert not has, (type(loader), name)


WORKER_WARNING = """
import os, torch
class Numbers(torch.utils.data.Dataset):
    def __len__(self): return 16
    def __getitem__(self, i): return torch.tensor([i])
def make(): return torch.utils.data.DataLoader(Numbers(), batch_size=4, num_workers=len(os.sched_getaffinity(0)) + 1)
train, val = make(), make()
for epoch in range(2):
    assert [int(x) for b in train for x in b] == list(range(16))
    assert [int(x) for b in val for x in b] == list(range(16))
"""


@pytest.mark.timeout(240)
@pytest.mark.parametrize("how", ["fastdata run", "fastdata.loader"])
def test_torchs_worker_count_warning_is_given_as_often_as_the_plain_script_gives_it(tmp_path, how):
    """torch warns of more workers than cores where a DataLoader is built and where a pass
    starts, once for each place under Python's default filters: under `fastdata run`, or with
    `fastdata.loader` in its place, where the loaders drive DataLoaders of their own, the
    warnings are those of the plain run, from torch's own lines."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    plain = subprocess.run([sys.executable, "-c", WORKER_WARNING], capture_output=True, text=True, timeout=120, env=env)
    command = ["-m", "fastdata", "run", "--", sys.executable, "-c", WORKER_WARNING] if how == "fastdata run" else \
        ["-c", "import fastdata\n" + WORKER_WARNING.replace("torch.utils.data.DataLoader(", "fastdata.loader(")]
    served = subprocess.run([sys.executable, *command], capture_output=True, text=True, timeout=120, env=env)
    assert plain.returncode == 0 and served.returncode == 0, (plain.stderr[-2000:], served.stderr[-2000:])
    given = [[line for line in p.stderr.splitlines() if "This DataLoader will create" in line] for p in (plain, served)]
    assert len(given[0]) == 2 and given[1] == given[0], given
