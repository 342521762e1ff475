"""fastdata-bench augment: a table of images/s per op and engine, JSON, a self-contained plot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fastdata import bench


def test_augment_table_json_and_plot(tmp_path, capsys):
    out, page = tmp_path / "b.json", tmp_path / "b.html"
    assert bench.main(["augment", "--images", "4", "--reps", "1", "--size", "32", "--no-pipeline", "-q",
                       "--json", str(out), "--plot", str(page)]) == 0
    report = json.loads(out.read_text())
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(report, json.loads((Path(bench.__file__).parent / "bench.schema.json").read_text()))
    assert report["schema"] == bench.SCHEMA and report["reps"] == 1 and report["size"] == 32
    assert report["engines"][0] == "pillow" and "Pillow" in report["pillow"]
    ops = report["ops"]
    assert set(ops) == {"RandomResizedCrop", "Resize", "CenterCrop", "RandomHorizontalFlip", "ColorJitter",
                        "TrivialAugment", "Normalize", "MixUp", "CutMix", "LabelSmoothing"}
    for op, row in ops.items():
        assert set(row) == set(report["engines"])
        assert all(v is None or v > 0 for v in row.values())
    # every op runs on the default install's engine: a batch op as the device stage runs it (torch)
    assert all(row["pillow"] for row in ops.values())
    if "kornia-cpu" in report["engines"]:
        assert all(row["kornia-cpu"] for row in ops.values())  # every op has a device lowering
    printed = capsys.readouterr().out
    assert "RandomResizedCrop" in printed and "images/s" in printed
    text = page.read_text()
    assert "<svg" in text and "<script" not in text and "http" not in text.replace("http://www.w3.org/2000/svg", "")
    # an axis: a labelled gridline at each power of ten around the figures, and its title
    import math

    rates = [v for row in ops.values() for v in row.values() if v]
    decades = range(math.floor(math.log10(min(rates))), math.ceil(math.log10(max(rates))) + 1)
    assert "images/s (log scale" in text and text.count("<line") >= len(decades) + 1
    assert all(f">{10 ** d:,}</text>" in text for d in decades)


def test_cli_help_and_bad_input():
    done = subprocess.run([sys.executable, "-m", "fastdata.bench", "augment", "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "--size" in done.stdout
    done = subprocess.run([sys.executable, "-m", "fastdata.bench", "augment", "--images", "0"], capture_output=True,
                          text=True)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "--images" in done.stderr


@pytest.mark.slow
def test_pipeline_rows(tmp_path):
    out = tmp_path / "b.json"
    assert bench.main(["augment", "--images", "2", "--reps", "1", "--size", "32", "-q", "--json", str(out),
                       "--pipeline-images", "64"]) == 0
    rows = json.loads(out.read_text())["pipeline"]
    # a placement row only where this machine has it: "gpu" needs a GPU (and Kornia)
    want = {"placement=cpu", "placement=gpu"} if torch.cuda.is_available() and bench.has("kornia") else {"placement=cpu"}
    assert set(rows) == want and all(v > 0 for v in rows.values())
