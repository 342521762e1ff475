"""`tune` and the tune cache: the pick rule against the noise of the measurements, interleaved
runs of the finalists, what a cache entry records, its expiry, and what num_workers="auto"
applies and logs."""

from __future__ import annotations

import datetime
import importlib
import json
import logging
import os

import PIL
import pytest
import torch
from _images import color_folder

import fastdata
from fastdata import _optional
from fastdata import transforms as T
from fastdata._loader import resolve_workers
from fastdata.profiling.tune import Candidate, TuneResult, pick, tune
from fastdata.tunecache import cache_path, cached_tune, clear_tunes, list_tunes, machine_key, store_tune

tune_module = importlib.import_module("fastdata.profiling.tune")  # the name `tune` is the function too
SPEC = T.Compose([T.Resize(16), T.CenterCrop(16)])
SPACE = {"num_workers": [0, 1, 2], "prefetch_factor": [2], "backend": ["pil"], "placement": ["cpu"]}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return color_folder(tmp_path_factory.mktemp("imgs"), 3, 8, (20, 40), lambda i: f"{i:03d}.jpg")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTDATA_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("FASTDATA_TUNE_TTL_DAYS", raising=False)
    return tmp_path / "cache" / "tuned"


def cfg(workers: int, placement: str = "cpu", backend: str = "pil") -> dict:
    return {"num_workers": workers, "prefetch_factor": 2, "backend": backend, "placement": placement}


def cand(config: dict, *runs: float) -> Candidate:
    return Candidate(config, None, list(runs))


# -- the pick rule --------------------------------------------------------------------------

def test_pick_keeps_the_default_when_the_best_is_within_its_noise():
    # the case: 1 worker at 1,074 against the default's 1,073
    default, one = cand(cfg(2), 1060, 1073, 1085), cand(cfg(1), 1050, 1074, 1090)
    chosen, reason = pick([one, default], cfg(2))
    assert chosen is default
    assert reason.startswith("kept the default") and "1,074" in reason and "1,073" in reason


def test_pick_takes_a_clear_winner():
    default, four = cand(cfg(2), 1000, 1010, 1020), cand(cfg(4), 1300, 1310, 1320)
    chosen, reason = pick([default, four], cfg(2))
    assert chosen is four and reason.endswith("lies above the default's 1,010 images/s (1,000-1,020)")


def test_pick_prefers_the_simpler_of_two_within_noise():
    default, four = cand(cfg(2), 1000, 1010, 1020), cand(cfg(4), 1300, 1310, 1320)
    three = cand(cfg(3), 1280, 1300, 1330)
    chosen, reason = pick([four, three, default], cfg(2))
    assert chosen is three and "simplest config within the noise of the best" in reason
    # a simpler one within the noise of the best but not clearly above the default: the best
    default, three = cand(cfg(2), 1000, 1010, 1020), cand(cfg(3), 1015, 1200, 1305)
    chosen, reason = pick([four, three, default], cfg(2))
    assert chosen is four and "within the noise of both" in reason
    # cpu placement is simpler than gpu at the same workers
    gpu, cpu = cand(cfg(2, "gpu"), 1100, 1150, 1200), cand(cfg(2), 1090, 1120, 1160)
    assert pick([gpu, cpu])[0] is cpu


def test_pick_without_a_default():
    zero, one, two = cand(cfg(0), 500, 550, 600), cand(cfg(1), 900, 950, 1000), cand(cfg(2), 960, 1000, 1050)
    assert pick([two, one, zero])[0] is one
    one = cand(cfg(1), 900, 920, 950)
    chosen, reason = pick([two, one, zero])
    assert chosen is two and "lies above every simpler config's" in reason
    assert pick([two], None)[0] is two
    with pytest.raises(ValueError, match="default"):
        pick([two], cfg(3))


# -- tune with scripted rates: interleaving and the pick -------------------------------------

def _scripted(monkeypatch, rates: dict[int, list[float]]) -> list[dict]:
    """Makes tune's measurements of the finalists return `rates[num_workers][round]`, each
    from a real loader the factory made; the probe is measured for real (the rate model needs
    its stage costs). Returns the configs measured, in order."""
    real, calls, rounds = tune_module._rate, [], {}

    def rate(loader_factory, config, step, step_ms, steps, device):
        calls.append(dict(config))
        if len(calls) == 1:
            return real(loader_factory, config, step, step_ms, steps, device)
        loader = loader_factory(config)
        assert isinstance(loader, fastdata.Loader) and loader.num_workers == config["num_workers"]
        k = rounds[json.dumps(config)] = rounds.get(json.dumps(config), -1) + 1
        return rates[config["num_workers"]][k], None

    monkeypatch.setattr(tune_module, "_rate", rate)
    return calls


def _make(folder):
    def make(config):
        return fastdata.loader(str(folder), batch_size=4, transform=SPEC, device="cpu", **config)
    return make


def test_tune_interleaves_and_keeps_the_default_within_noise(folder, monkeypatch):
    calls = _scripted(monkeypatch, {0: [995, 1030, 1010], 1: [990, 1040, 1012], 2: [1000, 1005, 1001]})
    result = tune(_make(folder), space=SPACE, step_ms=1, steps=3, repeats=3, default=cfg(2), progress=False)
    finalists = [c.config for c in result.candidates]
    assert cfg(2) in finalists and len(finalists) in (2, 3)
    assert calls[1:] == finalists * 3  # round after round, each finalist once a round
    assert result.chosen == cfg(2) and result.reason.startswith("kept the default")
    assert [len(c.runs) for c in result.candidates] == [3] * len(finalists)
    assert [len(p.runs) for p in result.probes] == [1] and result.probes[0].config == calls[0]
    assert any(c.predicted for c in result.candidates)


def test_tune_picks_a_clear_winner_over_the_default(folder, monkeypatch):
    calls = _scripted(monkeypatch, {0: [1000, 1040, 1020], 1: [1010, 1050, 1030], 2: [800, 810, 805]})
    result = tune(_make(folder), space=SPACE, step_ms=1, steps=3, repeats=3, default=cfg(2), progress=False)
    others = [c.config for c in result.candidates if c.config != cfg(2)]
    assert result.chosen == min(others, key=lambda c: c["num_workers"])  # both beat the default: the simpler
    assert len(calls) == 1 + 3 * len(result.candidates)


def test_tune_measures_the_best_prediction_with_workers_at_each_prefetch_factor(folder, monkeypatch):
    """The rate model predicts alike for every prefetch_factor, so the search's prefetch values
    are measured, not ranked: here 4 batches ahead is scripted to be clearly faster, and is
    picked."""
    real, measured = tune_module._rate, []

    def rate(loader_factory, config, step, step_ms, steps, device):
        measured.append(dict(config))
        if len(measured) == 1:
            return real(loader_factory, config, step, step_ms, steps, device)
        loader_factory(config)
        return (1500.0 if config["num_workers"] and config["prefetch_factor"] == 4 else 1000.0) + len(measured), None

    monkeypatch.setattr(tune_module, "_rate", rate)
    predictions = []
    result = tune(_make(folder), space={**SPACE, "prefetch_factor": [2, 4]}, step_ms=1, steps=3, repeats=3,
                  default=cfg(2), progress=False, predictions=predictions)
    pooled = next(c for c, _ in predictions if c["num_workers"])
    finalists = [c.config for c in result.candidates]
    assert {**pooled, "prefetch_factor": 2} in finalists and {**pooled, "prefetch_factor": 4} in finalists
    assert result.chosen == {**pooled, "prefetch_factor": 4} and "lies above the default's" in result.reason


def test_tune_measures_for_real(folder):
    predictions: list = []
    space = {"num_workers": [0, 1], "prefetch_factor": [2], "backend": ["pil"], "placement": ["cpu"]}
    result = tune(_make(folder), space=space, step_ms=1, steps=3, repeats=2, default=cfg(1), progress=False,
                  predictions=predictions)
    configs = [c.config for c in result.candidates]
    assert sorted(c["num_workers"] for c in configs) == [0, 1]  # the default is a finalist already: once
    assert result.chosen in configs
    for c in result.candidates:
        assert len(c.runs) == 2 and all(r > 0 for r in c.runs) and c.low <= c.median <= c.high
    assert len(predictions) == 2 and all(p > 0 for _, p in predictions)
    doc = json.loads(json.dumps(result.to_json()))
    assert set(doc) == {"chosen", "reason", "candidates", "probes"} and doc["chosen"] == result.chosen
    first = doc["candidates"][0]
    assert set(first) == {"config", "predicted_images_per_s", "runs_images_per_s", "median_images_per_s",
                          "interval_images_per_s"}
    assert first["interval_images_per_s"] == [min(first["runs_images_per_s"]), max(first["runs_images_per_s"])]
    assert len(doc["probes"]) == 1 and doc["probes"][0]["predicted_images_per_s"] is None


# -- the cache ------------------------------------------------------------------------------

def _result(chosen: dict) -> dict:
    return TuneResult(chosen, "a clear winner", [cand(chosen, 900, 910, 920)], [cand(cfg(2), 800)]).to_json()


def _rewrite(path, **changes) -> None:
    entry = json.loads(path.read_text())
    entry.update(changes)
    path.write_text(json.dumps(entry))


def test_an_entry_records_what_when_where(folder, cache):
    result = _result(cfg(1))
    path = store_tune(str(folder), SPEC, 4, result)
    assert path == cache_path(str(folder), SPEC, 4) and path.parent == cache
    entry = json.loads(path.read_text())
    assert entry["loader"] == cfg(1) and entry["tune"] == result
    created = datetime.datetime.fromisoformat(entry["created"])
    assert created.utcoffset() == datetime.timedelta(0)
    assert abs(datetime.datetime.now(datetime.timezone.utc) - created) < datetime.timedelta(minutes=5)
    assert datetime.datetime.fromisoformat(entry["expires"]) - created == datetime.timedelta(days=30)
    assert entry["machine"] == machine_key()
    v = entry["versions"]
    assert v["torch"] == torch.__version__ and v["pillow"]["version"] == PIL.__version__
    assert v["fastdata"] == fastdata.__version__ and isinstance(v["pillow"]["simd"], bool) and v["python"]
    assert entry["source"] == os.path.abspath(folder) and entry["batch_size"] == 4
    assert cached_tune(str(folder), SPEC, 4) == {**entry, "path": str(path)}
    assert cached_tune(str(folder), SPEC, 8) is None  # another batch size


def test_an_entry_expires(folder, cache, monkeypatch, caplog):
    monkeypatch.setenv("FASTDATA_TUNE_TTL_DAYS", "2")
    path = store_tune(str(folder), SPEC, 4, _result(cfg(1)))
    entry = json.loads(path.read_text())
    expires = datetime.datetime.fromisoformat(entry["expires"])
    assert expires - datetime.datetime.fromisoformat(entry["created"]) == datetime.timedelta(days=2)
    assert cached_tune(str(folder), SPEC, 4) is not None
    _rewrite(path, expires=(datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=1)).isoformat())
    with caplog.at_level(logging.DEBUG, logger="fastdata"):
        assert cached_tune(str(folder), SPEC, 4) is None
    assert any("expired" in r.getMessage() and str(path) in r.getMessage() for r in caplog.records)
    monkeypatch.setenv("FASTDATA_TUNE_TTL_DAYS", "0")  # expires as it is made
    store_tune(str(folder), SPEC, 4, _result(cfg(1)))
    assert cached_tune(str(folder), SPEC, 4) is None
    monkeypatch.setenv("FASTDATA_TUNE_TTL_DAYS", "soon")
    with pytest.raises(ValueError, match="FASTDATA_TUNE_TTL_DAYS"):
        store_tune(str(folder), SPEC, 4, _result(cfg(1)))


@pytest.mark.parametrize("change, why", [
    ({"machine": "a bigger machine, 64 cores, no GPU"}, "another machine"),
    ({"versions": {"torch": "0.1"}}, "torch 0.1"),
    ({"loader": "garbage"}, "unreadable"),
    ({"expires": None}, "no valid expiry"),
])
def test_a_foreign_entry_is_ignored(folder, cache, caplog, change, why):
    path = store_tune(str(folder), SPEC, 4, _result(cfg(1)))
    if "versions" in change:
        change = {"versions": {**json.loads(path.read_text())["versions"], **change["versions"]}}
    _rewrite(path, **change)
    with caplog.at_level(logging.DEBUG, logger="fastdata"):
        assert cached_tune(str(folder), SPEC, 4) is None
        loader = fastdata.loader(str(folder), batch_size=4, transform=SPEC, num_workers="auto")
    assert loader.num_workers == 0  # untuned "auto" without persistent workers: the decode in process
    assert any(r.levelno == logging.DEBUG and why in r.getMessage() for r in caplog.records), caplog.text
    assert not any(r.levelno >= logging.INFO and "tuned config" in r.getMessage() for r in caplog.records)
    [listed] = list_tunes()
    assert not listed["valid"] and why in listed["why_not"] and listed["path"] == str(path)


def test_list_and_clear(folder, cache):
    assert list_tunes() == [] and clear_tunes() == 0
    a = store_tune(str(folder), SPEC, 4, _result(cfg(1)))
    b = store_tune(str(folder), SPEC, 8, _result(cfg(0)))
    (cache / "torn.json").write_text("{")
    listed = {e["path"]: e for e in list_tunes()}
    assert set(listed) == {str(a), str(b), str(cache / "torn.json")}
    assert listed[str(a)]["valid"] and listed[str(a)]["why_not"] is None and listed[str(a)]["loader"] == cfg(1)
    assert listed[str(b)]["batch_size"] == 8
    assert not listed[str(cache / "torn.json")]["valid"]
    assert clear_tunes() == 3
    assert list_tunes() == [] and cached_tune(str(folder), SPEC, 4) is None


def test_auto_applies_the_cached_tune_and_says_so(folder, cache, caplog):
    path = store_tune(str(folder), SPEC, 4, _result({"num_workers": 1, "prefetch_factor": 3, "placement": "cpu"}))
    created = json.loads(path.read_text())["created"]
    with caplog.at_level(logging.INFO, logger="fastdata"):
        tuned = fastdata.loader(str(folder), batch_size=4, transform=SPEC, num_workers="auto")
    assert tuned.num_workers == 1
    [line] = [r.getMessage() for r in caplog.records if "tuned config" in r.getMessage()]
    assert str(path) in line and created in line and "num_workers=1" in line and "prefetch_factor=3" in line
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="fastdata"):
        given = fastdata.loader(str(folder), batch_size=4, transform=SPEC, num_workers=0, placement="cpu")
    assert given.num_workers == 0 and not any("tuned config" in r.getMessage() for r in caplog.records)
    other = fastdata.loader(str(folder), batch_size=8, transform=SPEC, num_workers="auto")  # another batch size
    assert other.num_workers == 0  # untuned
    persistent = fastdata.loader(str(folder), batch_size=8, transform=SPEC, num_workers="auto", persistent_workers=True)
    assert persistent.num_workers == resolve_workers("auto") != 1


def test_auto_applies_the_tuned_backend_and_persistent_workers_as_measured(folder, cache, caplog):
    """The tune measured its pick with that backend and with workers that persist: a loader left
    at backend="auto" (and persistent_workers unset) gets both; one that names another backend
    gets nothing of it, with a line saying why."""
    path = store_tune(str(folder), SPEC, 4, _result({"num_workers": 1, "prefetch_factor": 2, "backend": "pil",
                                                      "placement": "cpu"}))
    with caplog.at_level(logging.INFO, logger="fastdata"):
        tuned = fastdata.loader(str(folder), batch_size=4, transform=SPEC, num_workers="auto")
    assert tuned.backend == "pil" and tuned.num_workers == 1 and tuned.persistent_workers
    [line] = [r.getMessage() for r in caplog.records if "tuned config" in r.getMessage()]
    assert "backend='pil'" in line and "persistent_workers=True" in line
    fresh = fastdata.loader(str(folder), batch_size=4, transform=SPEC, num_workers="auto", persistent_workers=False)
    assert fresh.num_workers == 1 and not fresh.persistent_workers  # what the script says stays
    _rewrite(path, loader={"num_workers": 1, "prefetch_factor": 2, "backend": "dali", "placement": "cpu"})
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="fastdata"):
        named = fastdata.loader(str(folder), batch_size=4, transform=SPEC, num_workers="auto", backend="pil")
    assert named.backend == "pil" and named.num_workers == 0  # untuned: auto without persistent workers
    # (where DALI is missing, the entry is passed over before the backends are compared)
    why = "is for backend 'dali', not 'pil': not applied" if _optional.has("dali") else \
        "it chose backend 'dali', which is not installed here"
    assert any(why in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]


def test_a_tune_measured_for_another_target_device_is_not_applied(folder, cache, caplog):
    """A tune keeps the target device it measured for (`--device`): on the same machine, a loader
    for another target takes none of it, as its backend and placement were measured elsewhere."""
    path = store_tune(str(folder), SPEC, 4, {**_result(cfg(1)), "device": "cpu"})
    assert fastdata.loader(str(folder), batch_size=4, transform=SPEC, num_workers="auto", device="cpu").num_workers == 1
    entry = json.loads(path.read_text())
    _rewrite(path, tune={**entry["tune"], "device": "cuda"})
    with caplog.at_level(logging.INFO, logger="fastdata"):
        other = fastdata.loader(str(folder), batch_size=4, transform=SPEC, num_workers="auto", device="cpu")
    assert other.num_workers == 0
    assert any("is for a 'cuda' target, not 'cpu': not applied" in r.getMessage() for r in caplog.records)
