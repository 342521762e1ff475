"""fastdata-demo: medians with their spread, every figure within the machine's ceiling (or
flagged and a non-zero exit), the same batches as DataLoader; `fastdata.ceiling` on a real
image loader."""

from __future__ import annotations

import math
import multiprocessing
import re

import pytest
import torch

import fastdata
from _images import color_folder
from fastdata import demo, transforms as T
from fastdata.ceiling import MARGIN, ceiling, within

ROW = re.compile(r"^(?P<name>\S.*?)\s+(?P<median>\d+)\s+(?P<lo>\d+)\.\.(?P<hi>\d+)\s+(?P<ceiling>\d+)$")
RUN = re.compile(r"^\s+run \d+/\d+: (.*)$")
CELL = re.compile(r"(\S.*?)\s+(\d+) img/s")


def _rows(out: str) -> list[dict]:
    return [{k: (v if k == "name" else int(v)) for k, v in m.groupdict().items()}
            for m in map(ROW.match, out.splitlines()) if m]


def test_demo_reports_medians_within_the_ceiling(tmp_path, capsys):
    before = {p.pid for p in multiprocessing.active_children()}
    code = demo.main(["--samples", "256", "--batch-size", "32", "--images", "64", "--epochs", "2", "--repeats", "2",
                      "--workers", "2", "--data", str(tmp_path / "data")])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    rows = _rows(out)
    assert [r["name"] for r in rows] == ["torch DataLoader", "fastdata.loader", "DataLoader + Pillow",
                                         "fastdata.loader (pil)"]
    assert out.count("median") == 2 and out.count("min..max") == 2
    for r in rows:
        assert r["lo"] <= r["median"] <= r["hi"] <= r["ceiling"] * MARGIN, r
    limits = {r["name"]: r["ceiling"] for r in rows}
    runs = [m.group(1) for m in map(RUN.match, err.splitlines()) if m]
    assert len(runs) == 4  # two runs of each part
    for line in runs:
        cells = CELL.findall(line)
        assert len(cells) == 2, line
        for name, rate in cells:
            assert int(rate) <= limits[name.strip()] * MARGIN, line
    assert "same batches as DataLoader: yes" in out
    assert len(re.findall(r"speedup \d+\.\d+x \(paired runs \d+\.\d+\.\.\d+\.\d+x\)", out)) == 2
    assert "not a valid measurement" not in out + err
    assert not {p.pid for p in multiprocessing.active_children()} - before  # every run's workers are gone


def test_an_impossible_figure_is_flagged_not_printed():
    flagged = demo.side_row("fastdata.loader", [900.0, 1_000_000.0], 1000.0)
    assert "above the machine's ceiling of 1000 images/s: not a valid measurement" in flagged
    assert "1000000" not in flagged and "900" not in flagged
    assert "not a valid" in demo.run_cell("fastdata.loader", 1251.0, 1000.0)
    row = ROW.match(demo.side_row("fastdata.loader", [900.0, 1100.0, 1000.0], 1000.0))
    assert row and (row["median"], row["lo"], row["hi"], row["ceiling"]) == ("1000", "900", "1100", "1000")
    assert within(1250.0, 1000.0) and not within(1251.0, 1000.0)


def test_demo_exits_nonzero_when_a_figure_is_above_the_ceiling(monkeypatch, capsys):
    monkeypatch.setattr(demo, "ceiling", lambda make, batches: 1.0)  # a machine that makes 1 image/s
    code = demo.main(["--samples", "64", "--batch-size", "32", "--images", "0", "--epochs", "1", "--repeats", "1",
                      "--workers", "0"])
    out, err = capsys.readouterr()
    assert code == 1
    assert out.count("(above the machine's ceiling of 1 images/s: not a valid measurement)") == 2
    assert not _rows(out) and "img/s" not in err
    assert "speedup: none" in out and "same batches as DataLoader: yes" in out


def test_ceiling_of_an_image_loader(tmp_path):
    root = color_folder(tmp_path / "imgs", 2, 8, (40, 80), lambda i: f"{i:03d}.jpg")
    asked = []

    def make(workers):
        asked.append(workers)
        return fastdata.loader(str(root), batch_size=4, transform=T.Compose([T.RandomResizedCrop(32)]),
                               device="cpu", num_workers=workers)

    limit = ceiling(make, batches=3, cores=2)  # 4 batches an epoch: the count goes on into a second pass
    assert asked == [0]
    assert 0 < limit and math.isfinite(limit)


def test_ceiling_needs_batches_past_the_warmup_and_reads_the_batch_size():
    with pytest.raises(ValueError, match="too few batches"):  # a one-shot iterable: no second pass to count
        ceiling(lambda workers: iter([torch.zeros(4, 3)] * 2), batches=2)
