"""report.json against its published schema, and the command's early, one-line errors."""

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fastdata
from _images import color_folder
from fastdata import transforms as T
from fastdata.errors import error_line

jsonschema = pytest.importorskip("jsonschema")
# the module, which `fastdata profile --tune` imports its search from when it runs (the package's
# name `tune` is the function)
_TUNE = importlib.import_module("fastdata.profiling.tune")
SCHEMA = json.loads((Path(fastdata.__file__).parent / "profiling" / "report.schema.json").read_text())
SMALL = T.Compose([T.Resize(16), T.CenterCrop(16)])


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return color_folder(tmp_path_factory.mktemp("imgs"), 3, 8, (20, 40), lambda i: f"{i:03d}.jpg")


@pytest.fixture(scope="module")
def bad_folder(tmp_path_factory):
    root = color_folder(tmp_path_factory.mktemp("bad"), 2, 8, (20, 40), lambda i: f"{i:03d}.jpg")
    (root / "class0" / "zz_truncated.jpg").write_bytes((root / "class0" / "000.jpg").read_bytes()[:200])
    (root / "class1" / "zz_text.jpg").write_text("not an image")
    return root


def _cli(*args, home=None):
    code = "import sys; from fastdata.profiling.cli import main; sys.exit(main())"
    env = {**os.environ, "OMP_NUM_THREADS": "1", **({"HOME": str(home)} if home else {})}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=300)


def test_the_schema_is_a_valid_json_schema():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


@pytest.mark.parametrize("step_ms", [5.0, None])
def test_a_real_report_follows_the_schema(folder, step_ms):
    loader = fastdata.loader(str(folder), batch_size=8, transform=SMALL, device="cpu", num_workers=1)
    report = fastdata.profile(loader, step_ms=step_ms, steps=10, warmup=1).to_json()
    jsonschema.validate(report, SCHEMA)
    assert report["schema"] == "fastdata.profile.report/3"
    assert report["skipped"] == {"count": 0, "files": 0, "examples": []}
    if step_ms is None:
        assert report["verdict"] is None and report["rates"]["together_images_per_s"] is None
    else:
        assert report["verdict"] in ("input-bound", "compute-bound", "balanced")
        assert len(report["steps"]) == 10 and all(s["compute_ms"] >= 4.0 for s in report["steps"])
    assert {s["name"] for s in report["stages"]} >= {"read", "decode", "collate"}
    assert sum(s["bound"] for s in report["stages"]) == 1
    rates = report["rates"]
    assert rates["ceiling_images_per_s"] > 0 and not report["flags"], report["flags"]
    assert report["environment"]["torch"] == torch.__version__


def test_a_rate_above_the_ceiling_is_flagged():
    from fastdata.profiling import Report
    from fastdata.profiling.model import check_ceiling

    # 1 ms of decode CPU an image on 2 cores: at most 2,000 images/s
    report = Report("x", 64, 9000.0, None, None, None, None, "", [], {"device": "cpu", "num_workers": 2},
                    stages={"decode": 1.0})
    check_ceiling(report, steps=30, cores=2)
    assert report.ceiling_images_per_s == pytest.approx(2000)
    (flag,) = report.flags
    assert "9,000 images/s is above this pipeline's ceiling on 2 cores (2,000)" in flag
    fine = Report("x", 64, 2100.0, None, None, None, None, "", [], {"device": "cpu", "num_workers": 2},
                  stages={"decode": 1.0})
    check_ceiling(fine, steps=30, cores=2)
    assert not fine.flags


def test_the_printed_report_shows_brackets_as_they_are():
    """The source's name and the advice reach the terminal as they are: rich would take
    `[ray]` for markup (and a `[/b]` in a folder's name for a tag it cannot close)."""
    import io

    from rich.console import Console

    from fastdata.profiling import Report
    from fastdata.profiling.report import Advice

    report = Report("/data/set[v2]/x[/b]", 64, 900.0, 1000.0, 800.0, 0.2, "input-bound", "the step waited", [],
                    {"device": "cpu", "num_workers": 2},
                    advice=[Advice("2 more nodes (backend='ray': pip install 'fastdata[ray]')")])
    out = io.StringIO()
    report.print(Console(file=out, width=200))
    text = out.getvalue()
    assert "/data/set[v2]/x[/b]" in text and "pip install 'fastdata[ray]'" in text, text


def test_the_verdict_is_a_word_and_the_advice_objects(tmp_path):
    class Slow(torch.utils.data.Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            import time
            time.sleep(0.002)
            return torch.full((3, 8, 8), i % 256, dtype=torch.uint8), i % 10

    def rebuild(change):
        workers = change.get("num_workers", 0)
        return fastdata.loader(Slow(), batch_size=8, num_workers=workers, persistent_workers=workers > 0)

    report = fastdata.profile(rebuild({}), step_ms=2, steps=4, warmup=1, rebuild=rebuild)
    data = report.to_json()
    jsonschema.validate(data, SCHEMA)
    assert data["verdict"] == "input-bound" and "waited for data" in data["explanation"]
    first = data["first_change"]
    assert first is not None and first["change"] and first["confidence"] == "measured"
    assert first in data["advice"] and data["headline"] == first["text"]
    report.write(tmp_path)
    assert json.loads((tmp_path / "report.json").read_text()) == json.loads(json.dumps(data))


def _tune_measuring(winner_rate: float, kept: bool = False):
    """`tune` with its measurements stubbed: 3 runs of the default around 1,000 images/s and of
    another worker count around `winner_rate`, the pick tune.pick makes of them."""
    from fastdata.profiling.tune import Candidate, TuneResult, pick

    def tune(make, *, space, default, **kwargs):
        other = Candidate({**default, "num_workers": 0 if default["num_workers"] else 1}, None,
                          [winner_rate - 100, winner_rate, winner_rate + 100])
        base = Candidate(dict(default), None, [900.0, 1000.0, 1100.0])
        chosen, reason = pick([other, base], default, default["backend"])
        return TuneResult(dict(chosen.config), reason, [other, base], [])
    return tune


def test_a_report_is_written_before_it_is_printed(folder, tmp_path, monkeypatch, capsys):
    """`--out` is written before the report is printed: a print that fails (rich missing, a
    closed pipe) costs the command's exit status, not its measuring."""
    from fastdata.profiling import Report, cli

    def no_terminal(self):
        raise ModuleNotFoundError("No module named 'rich'")

    monkeypatch.setenv("FASTDATA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(Report, "print", no_terminal)
    out = tmp_path / "out"
    assert cli.main([str(folder), "--step-ms", "5", "--steps", "3", "--batch-size", "8", "--size", "16",
                     "--out", str(out)]) != 0
    assert "No module named 'rich'" in capsys.readouterr().err
    jsonschema.validate(json.loads((out / "report.json").read_text()), SCHEMA)
    assert (out / "report.html").stat().st_size > 0


def test_a_tune_winner_is_the_first_change(folder, tmp_path, monkeypatch, capsys):
    """A config the tune measured above the default beyond the noise is the one change to make
    first: in the headline, report.json's first_change, the HTML page and the printed report."""
    import html

    from fastdata.profiling import cli

    monkeypatch.setenv("FASTDATA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(_TUNE, "tune", _tune_measuring(20000.0))  # above any rate of a 5 ms step of 8 images
    out = tmp_path / "out"
    assert cli.main([str(folder), "--step-ms", "5", "--steps", "3", "--batch-size", "8", "--size", "16", "--tune",
                     "--out", str(out), "--debug"]) == 0
    data = json.loads((out / "report.json").read_text())
    jsonschema.validate(data, SCHEMA)
    first = data["first_change"]
    assert first is not None and first["confidence"] == "measured" and first["predicted_images_per_s"] == 20000
    default = data["tune"]["default"]  # the untuned config the tune measured against
    assert first["change"] == {"num_workers": 0 if default["num_workers"] else 1} and first in data["advice"]
    assert data["headline"] == first["text"] and "the tune measured 20,000 images/s (19,900-20,100)" in first["text"]
    assert html.escape(first["text"]) in (out / "report.html").read_text()
    printed = capsys.readouterr().out
    assert printed.index("tuned: ") < printed.index("first: ") and "the tune measured 20,000" in printed


def test_the_tune_tries_placement_gpu_only_where_the_batch_goes_to_a_gpu(folder, tmp_path, monkeypatch, capsys):
    """On a CPU device, placement "gpu" runs Kornia on the CPU (a twin for tests, several times
    slower than Pillow's ops): the tune leaves it out of its search and says why."""
    from fastdata.profiling import cli

    (tmp_path / "jittered.py").write_text("from fastdata import transforms as T\n"
                                          "def make():\n    return T.Compose([T.RandomResizedCrop(16), "
                                          "T.ColorJitter(0.4, 0.4, 0.4)])\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("FASTDATA_CACHE", str(tmp_path / "cache"))
    spaces = []
    measuring = _tune_measuring(20000.0)
    monkeypatch.setattr(_TUNE, "tune", lambda make, *, space, **kw: spaces.append(space) or measuring(make, space=space,
                                                                                                      **kw))
    assert cli.main([str(folder), "--step-ms", "5", "--steps", "3", "--batch-size", "8", "--transform",
                     "jittered:make", "--device", "cpu", "--tune"]) == 0
    [space] = spaces
    assert space["placement"] == ["cpu"]
    assert "not tried: placement gpu: the device is 'cpu' (the pixel ops go to the GPU only where there is one)" \
        in capsys.readouterr().err


def test_a_change_the_tune_kept_the_default_over_is_not_the_first():
    """The profile's own check measured a change as a gain; the tune measured it too, within the
    noise of the default, and kept the default: the report advises no change first."""
    from fastdata.profiling import Report
    from fastdata.profiling.report import Advice

    default = {"num_workers": 2, "prefetch_factor": 2, "backend": "pil", "placement": "cpu"}

    def candidate(config, runs):
        return {"config": config, "predicted_images_per_s": None, "runs_images_per_s": runs,
                "median_images_per_s": runs[1], "interval_images_per_s": [runs[0], runs[-1]]}

    report = Report("x", 8, 900.0, 2000.0, 800.0, 0.5, "input-bound", "", [], {"num_workers": 2},
                    advice=[Advice("num_workers=0 instead of 2: measured 1,100 images/s against 800 now",
                                   {"num_workers": 0}, 1100.0, "measured")])
    assert report.first_change is not None
    report.add_tune({"chosen": default, "default": default, "reason": "kept the default", "probes": [],
                     "candidates": [candidate({**default, "num_workers": 0}, [950.0, 1050.0, 1150.0]),
                                    candidate(default, [900.0, 1000.0, 1100.0])]})
    assert report.first_change is None and report.headline.startswith("input bounds the step")
    assert "the tune measured it too and picked num_workers=2" in report.advice[0].text


def test_on_error_skip_counts_the_bad_files(bad_folder, tmp_path):
    done = _cli(str(bad_folder), "--step-ms", "2", "--steps", "3", "--batch-size", "4", "--size", "16",
                "--workers", "0", "--on-error", "skip", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    jsonschema.validate(report, SCHEMA)
    skipped = report["skipped"]
    assert skipped["count"] >= 1
    assert {Path(e["path"]).name for e in skipped["examples"]} <= {"zz_truncated.jpg", "zz_text.jpg"}
    assert skipped["files"] == len(skipped["examples"]) == len({e["path"] for e in skipped["examples"]})
    assert sum(e["count"] for e in skipped["examples"]) == skipped["count"]
    for name in ("zz_truncated.jpg", "zz_text.jpg"):
        assert done.stderr.count(name) <= 1, done.stderr


@pytest.fixture(scope="module")
def one_bad(tmp_path_factory):
    """8 good JPEGs and one corrupt one: a batch of 4 makes 3 batches an epoch."""
    root = color_folder(tmp_path_factory.mktemp("one_bad"), 2, 4, (20, 40), lambda i: f"{i:03d}.jpg")
    (root / "class1" / "002_corrupt.jpg").write_bytes((root / "class1" / "000.jpg").read_bytes()[:250])
    return root


def test_a_file_skipped_each_epoch_is_named_once_and_counted(one_bad, tmp_path):
    """Over many epochs the corrupt file is left out each time: the run names it once (stderr),
    the summary says 1 file and how many times, report.json lists it once with that count."""
    done = _cli(str(one_bad), "--step-ms", "1", "--steps", "8", "--batch-size", "4", "--size", "16",
                "--workers", "0", "--on-error", "skip", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("002_corrupt.jpg") == 1, done.stderr
    assert "skipped " in done.stderr and "Traceback" not in done.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    jsonschema.validate(report, SCHEMA)
    skipped = report["skipped"]
    (entry,) = skipped["examples"]
    assert entry["path"] == str(one_bad / "class1" / "002_corrupt.jpg") and "truncated" in entry["cause"]
    # warm-up, the loader alone, the step alone's warm-up and the run together: well over 3 epochs
    assert skipped["files"] == 1 and entry["count"] == skipped["count"] >= 3, skipped
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("skipped:")]
    assert line == f"skipped: 1 file that could not be read, left out {skipped['count']} times in all " \
                   "(each epoch reads a file again)", done.stdout
    assert "002_corrupt.jpg" not in done.stdout  # named once: on stderr, as it was first left out


def test_a_skipped_file_is_named_once_in_python_too(one_bad, caplog):
    import logging

    loader = fastdata.loader(str(one_bad), batch_size=4, transform=SMALL, device="cpu", num_workers=0,
                             on_error="skip")
    with caplog.at_level(logging.WARNING, logger="fastdata"):
        report = fastdata.profile(loader, step_ms=1, steps=8, warmup=1)
    assert sum("002_corrupt.jpg" in r.getMessage() for r in caplog.records) == 1
    data = report.to_json()
    jsonschema.validate(data, SCHEMA)
    assert data["skipped"]["files"] == 1 and data["skipped"]["count"] >= 3
    assert data["skipped"]["count"] == data["skipped"]["examples"][0]["count"] <= loader.stats["skipped"]
    assert str(report).count("skipped: 1 file that could not be read") == 1


def test_a_bad_file_stops_the_profile_in_one_line_naming_it(bad_folder):
    done = _cli(str(bad_folder), "--step-ms", "2", "--steps", "20", "--batch-size", "4", "--size", "16",
                "--workers", "2")
    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()[-1:]
    assert line.startswith("fastdata-profile: error: DataError: cannot read") and "zz_" in line, done.stderr
    # the way past it, as this command spells it (in Python: on_error="skip")
    assert line.endswith("; to leave unreadable samples out and go on, pass --on-error skip"), line
    assert "on_error" not in line
    assert "Traceback" not in done.stderr and " object at 0x" not in done.stderr


def test_a_source_whose_samples_are_all_left_out_gets_no_verdict(tmp_path):
    """Every file bad, with --on-error skip: nothing was measured, so no verdict and no report:
    one line that says so and names the first file, exit 1."""
    (tmp_path / "set" / "c").mkdir(parents=True)
    (tmp_path / "set" / "c" / "empty.jpg").write_bytes(b"")
    (tmp_path / "set" / "c" / "text.jpg").write_text("not an image")
    done = _cli(str(tmp_path / "set"), "--step-ms", "10", "--steps", "2", "--batch-size", "4", "--size", "16",
                "--workers", "0", "--on-error", "skip", "--out", str(tmp_path / "out"))
    assert done.returncode == 1, done.stdout
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("fastdata-profile: error: DataError: no sample could be read: the ") and "left out" in line
    assert "empty.jpg: empty file" in line or "text.jpg: not a readable image" in line, line
    assert "verdict" not in done.stdout and not (tmp_path / "out" / "report.json").exists()


@pytest.mark.parametrize("args,says", [
    (["--step-ms", "-5"], "--step-ms: should be a number > 0"),
    (["--step-ms", "0"], "--step-ms: should be a number > 0"),
    (["--steps", "0"], "--steps: should be an integer >= 1"),
    (["--batch-size", "x"], "--batch-size: should be an integer >= 1"),
    (["--workers", "-1"], "--workers: should be 'auto' or an integer >= 0"),
    (["--out", "/proc/nope/report", "--step-ms", "5"], "--out '/proc/nope/report' cannot be written"),
    (["--device", "cuda", "--step-ms", "5"], "use --device cpu"),
    (["--transform", "nope:thing", "--step-ms", "5"], "--transform should be"),
    (["--on-error", "ignore"], "argument --on-error: invalid choice"),
    (["--model", "os:getcwd"], "--model os:getcwd should return a torch.nn.Module, but returned str"),
    (["--model", "torch.nn:Flatten"], "--model torch.nn:Flatten has no parameters to train"),
])
def test_arguments_are_refused_before_anything_is_made_or_measured(tmp_path, args, says):
    """'synthetic' would make 2,000 images under HOME before a profile: a refused argument
    must leave HOME empty, and nothing may have been measured."""
    if "--device" in args and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    done = _cli("synthetic", *args, home=tmp_path)
    assert done.returncode in (1, 2)
    assert says in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert "profiling" not in done.stderr and not any(tmp_path.iterdir())


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("source", ["images", "dataset"])
def test_a_cuda_device_without_cuda_fails_when_the_loader_is_built(folder, source):
    data = str(folder) if source == "images" else torch.utils.data.TensorDataset(torch.zeros(4, 2))
    with pytest.raises(ValueError, match=r"device='cuda', but this machine has no CUDA device.*use device='cpu'"):
        fastdata.loader(data, batch_size=2, device="cuda")


def test_causes_carry_no_object_reprs_nor_worker_tracebacks():
    import io

    from PIL import Image, UnidentifiedImageError

    with pytest.raises(UnidentifiedImageError) as e:
        Image.open(io.BytesIO(b"nothing"))
    assert " at 0x" in str(e.value) and error_line(e.value) == "UnidentifiedImageError: cannot identify image file"
    wrapped = ValueError("Caught ValueError in DataLoader worker process 0.\nOriginal Traceback (most recent call "
                         "last):\n  File \"x.py\", line 1, in f\nValueError: label 12 out of range")
    assert error_line(wrapped) == "ValueError: label 12 out of range"
