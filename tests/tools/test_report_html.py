"""The HTML report: rendered from a real profile's report.json, looked at in headless Chromium
(the screenshot must show the page: many colours, the verdict's badge, the timeline's bars),
self-contained (nothing to fetch), escaped, and whole when every optional field is empty. A
progressive-resizing loader's profile adds the rate at each size, marked input-bound below the
step's rate."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser

import numpy as np
import pytest
import torch
from _images import color_folder
from PIL import Image

import fastdata
from fastdata import transforms as T
from fastdata.profiling.html import BOUND, COMPUTE, STAGE, VERDICT_COLOURS, WAIT, render

HOSTILE = '<img src="http://example.com/x.png"> & <script>alert(1)</script>'
EXTERNAL = re.compile(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//|<script|@import|url\(""", re.IGNORECASE)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """A real profile of a small image folder against a 20 ms step, as report.json holds it."""
    folder = color_folder(tmp_path_factory.mktemp("imgs"), 3, 8, (20, 40), lambda i: f"{i:03d}.jpg")
    loader = fastdata.loader(str(folder), batch_size=8, transform=T.Compose([T.Resize(16), T.CenterCrop(16)]),
                             device="cpu")
    result = fastdata.profile(loader, step_ms=20, steps=8, warmup=1, source=HOSTILE)
    return json.loads(json.dumps(result.to_json()))  # what a saved report.json gives back


@pytest.fixture(scope="module")
def sized(tmp_path_factory):
    """A real profile of a loader whose output size follows the epoch, with the step's rate set
    between the slowest size's rate and the next, so one size is below it and the others above."""
    folder = color_folder(tmp_path_factory.mktemp("imgs"), 3, 8, (20, 40), lambda i: f"{i:03d}.jpg")
    schedule = T.Compose([T.RandomResizedCrop([(0, 8), (1, (12, 16)), (3, 32)])])
    loader = fastdata.loader(str(folder), batch_size=4, transform=schedule, device="cpu", seed=0)
    result = json.loads(json.dumps(fastdata.profile(loader, step_ms=20, steps=4, warmup=1).to_json()))
    rates = sorted(s["images_per_s"] for s in result["sizes"])
    assert [s["size"] for s in result["sizes"]] == [[8, 8], [12, 16], [32, 32]] and rates[0] < rates[1]
    result["rates"]["step_alone_images_per_s"] = (rates[0] + rates[1]) / 2
    return result


def text_of(page: str) -> str:
    """The page's text as a browser shows it (entities decoded, tags dropped)."""
    parser = HTMLParser()
    parts: list[str] = []
    parser.handle_data = parts.append
    parser.feed(page)
    return " ".join(parts)


def screenshot(page: str, tmp_path) -> np.ndarray:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium on PATH (Debian: apt-get install chromium)")
    html_file, png = tmp_path / "report.html", tmp_path / "report.png"
    html_file.write_text(page)
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
                    "--force-device-scale-factor=1", "--window-size=1280,2000",
                    f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={png}", html_file.as_uri()],
                   env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}, capture_output=True, timeout=90, check=False)
    assert png.exists(), "chromium wrote no screenshot"
    return np.asarray(Image.open(png).convert("RGB"))


def pixels_near(image: np.ndarray, colour: str, tolerance: int = 6) -> int:
    rgb = np.array([int(colour[i:i + 2], 16) for i in (1, 3, 5)])
    return int((np.abs(image.astype(int) - rgb).max(axis=2) <= tolerance).sum())


def test_page_in_chromium(report, tmp_path):
    image = screenshot(render(report), tmp_path)
    assert image.shape[:2] == (2000, 1280)
    flat = image.reshape(-1, 3)
    assert (flat < 250).any(axis=1).mean() > 0.05, "the screenshot is (nearly) all white"
    assert len(np.unique(flat, axis=0)) > 100, "too few colours for text, cards and charts"
    assert pixels_near(image, VERDICT_COLOURS[report["verdict"]]) > 2000, "no verdict badge in its colour"
    # the timeline: both parts of the stacked bars are drawn
    assert pixels_near(image, WAIT) > 500 and pixels_near(image, COMPUTE) > 5000


def test_self_contained_escaped_and_complete(report):
    page = render(report)
    assert not EXTERNAL.findall(page), "the page refers to something outside itself"
    text = text_of(page)
    assert HOSTILE in text  # the source, escaped: shown as written, not run
    rates = [v for v in report["rates"].values() if v is not None]
    assert len(rates) >= 3
    for v in rates:
        assert f"{v:,.0f}" in text, f"rate {v:,.0f} is not on the page"
    assert f"{100 * report['stall_fraction']:.0f}%" in text
    assert report["verdict"] in text and report["explanation"] in text
    for stage in report["stages"]:
        assert stage["name"] in text and stage["what"] in text
    assert report["environment"]["torch"] in text and report["environment"]["machine"] in text
    assert render(json.loads(json.dumps(report))) == page  # a saved report.json renders the same page
    assert "not timed" not in card_text(page, "Where an image's time goes")


def test_a_report_without_stages_says_why():
    """A torch DataLoader's stages are not timed: the page says so where the stage chart would be."""
    loader = torch.utils.data.DataLoader(torch.zeros(64, 3, 8, 8), batch_size=8)
    page = render(json.loads(json.dumps(fastdata.profile(loader, steps=2, warmup=1, confirm=0).to_json())))
    card = card_text(page, "Where an image's time goes")
    assert "Where an image's time goes not timed (only a fastdata loader" in card


def test_tune_flags_and_skipped(report):
    chosen = {"backend": "pil", "num_workers": 2, "prefetch_factor": 2}

    def candidate(workers, runs, predicted):
        return {"config": {**chosen, "num_workers": workers}, "predicted_images_per_s": predicted,
                "runs_images_per_s": runs, "median_images_per_s": sorted(runs)[len(runs) // 2],
                "interval_images_per_s": [min(runs), max(runs)]}

    tuned = dict(report, tune={"chosen": chosen, "reason": "2 workers beat 1 by more than the <noise>", "seconds": 42.0,
                               "candidates": [candidate(1, [1050.0, 1074.0, 1061.0], 839.0),
                                              candidate(2, [1290.0, 1310.0, 1302.0], 1311.0)],
                               "probes": [candidate(2, [1273.0], None)]},
                 flags=["loader alone 109,144 images/s is above the machine's ceiling of 1,400"],
                 skipped={"count": 3, "examples": [{"path": "a/<b>.jpg", "cause": "truncated JPEG"}]})
    page = render(tuned)
    text = text_of(page)
    assert not EXTERNAL.findall(page)
    for figure in ("1,302 (1,290–1,310)", "1,061 (1,050–1,074)", "predicted 839", "1,273"):
        assert figure in text, figure
    assert "2 workers beat 1 by more than the <noise>" in text and "chosen" in text
    assert page.count('fill="#eaf6ee"') == 1  # one row highlighted: the finalist, not the probe sharing its config
    assert "109,144 images/s is above the machine's ceiling" in text
    assert "3 files skipped" in text and "a/<b>.jpg" in text
    assert text.index("not valid measurements") < text.index(report["explanation"])  # flags come first


def test_skipped_files_once_each_with_their_counts(report):
    """Schema /2: the distinct files, each once with the times it was skipped (the epochs)."""
    page = render(dict(report, skipped={"count": 7, "files": 2, "examples": [
        {"path": "a/bad.jpg", "cause": "truncated JPEG", "count": 6},
        {"path": "b/text.jpg", "cause": "not an image", "count": 1}]}))
    text = text_of(page)
    assert "2 files skipped (7 times)" in text and "3 files skipped" not in text
    assert text.count("a/bad.jpg") == 1 and text.count("b/text.jpg") == 1
    assert "file cause times a/bad.jpg truncated JPEG 6 b/text.jpg not an image 1" in text


@pytest.mark.parametrize("empty", ["nulls", "missing"])
def test_every_optional_field_empty(empty):
    report = {"schema": "fastdata.profile.report/3", "created": None, "source": None, "verdict": None,
              "explanation": None, "first_change": None, "headline": None, "config": None, "batch_size": None,
              "rates": {"loader_alone_images_per_s": None, "step_alone_images_per_s": None,
                        "together_images_per_s": None, "ceiling_images_per_s": None},
              "stall_fraction": None, "stages": [], "steps": [], "advice": [], "tune": None,
              "skipped": {"count": 0, "files": 0, "examples": []}, "flags": [], "environment": None, "sizes": None}
    page = render(report if empty == "nulls" else {})
    assert page.startswith("<!doctype html>") and page.rstrip().endswith("</html>")
    assert not EXTERNAL.findall(page)
    text = text_of(page)
    assert "loader only" in text and "nothing to change" in text and "None" not in text
    assert SIZES not in text


SIZES = "Rate at each size of the schedule"


def card_text(page: str, title: str) -> str:
    """The text of the card with this title ("" when the page has none)."""
    return next((text_of(part) for part in page.split("<section")[1:] if f"<h2>{title}</h2>" in part), "")


def test_rate_at_each_size(sized, report):
    card = card_text(render(sized), SIZES)
    step = sized["rates"]["step_alone_images_per_s"]
    assert f"step {step:,.0f} images/s" in card
    # each size's label ("from epoch E, WxH") in the schedule's order, then each one's figure
    labels = re.findall(r"from epoch (\d+), (\d+)×(\d+)", card)
    assert labels == [(str(s["epoch"]), str(s["size"][1]), str(s["size"][0])) for s in sized["sizes"]]
    figures = re.findall(r"(?<![\d,])(?<!step )(\d[\d,]*) images/s( · input-bound)?", card)
    assert figures == [(f"{s['images_per_s']:,.0f}", " · input-bound" if s["images_per_s"] < step else "")
                       for s in sized["sizes"]]
    assert 0 < sum(bool(b) for _, b in figures) < len(figures)  # one size below the step's rate, one above
    assert SIZES not in text_of(render(report)) and report["sizes"] == []  # a fixed size: no such card


def test_rate_at_each_size_without_a_step(sized):
    alone = dict(sized, rates=dict(sized["rates"], step_alone_images_per_s=None),
                 sizes=[dict(sized["sizes"][0], size=None), *sized["sizes"][1:]])
    card = card_text(render(alone), SIZES)
    assert "from epoch 0, ?" in card and "from epoch 3, 32×32" in card
    for s in sized["sizes"]:
        assert f"{s['images_per_s']:,.0f} images/s" in card
    assert "input-bound" not in card and "step " not in card  # nothing to be bound against


def test_rate_at_each_size_in_chromium(sized, tmp_path):
    # a short page (no timeline, no stages) so the card is on screen; against the same page
    # without sizes, the card adds both kinds of bar and the step's dashed line
    short = dict(sized, steps=[], stages=[])
    (tmp_path / "with").mkdir(), (tmp_path / "without").mkdir()
    with_card = screenshot(render(short), tmp_path / "with")
    without = screenshot(render(dict(short, sizes=[])), tmp_path / "without")
    assert pixels_near(with_card, BOUND) - pixels_near(without, BOUND) > 300, "no input-bound bar"
    assert pixels_near(with_card, STAGE) - pixels_near(without, STAGE) > 2000, "no bar for the sizes that keep up"
    assert pixels_near(with_card, COMPUTE) - pixels_near(without, COMPUTE) > 100, "no line at the step's rate"
