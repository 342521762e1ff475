"""Does `fastdata-profile --tune` pick on noise? The README's first command, run --runs times in
a row, then every configuration it picked measured again, side by side.

Each run is `fastdata-profile synthetic --step-ms 100 --tune --out DIR` as a user runs it (the
synthetic set made once, under this benchmark's own HOME; an empty tune cache each run, so no
run reuses another's pick). Its pick and the median and interval the tune measured for it come
from DIR/config.json. Then the distinct picks are measured again, interleaved over --rounds
rounds, each measurement `fastdata.profile` with the same 100 ms step and transform (a fresh
loader each time). Target: the picks' medians within 10% of each other (max / min <= 1.10).

    OMP_NUM_THREADS=1 python benchmarks/tune_repeat.py [--runs 5] [--rounds 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _common

import fastdata
from fastdata import transforms as T
from fastdata.profiling import profile

HERE = Path(__file__).resolve().parent
HOME = HERE / "data" / "tune-home"
CACHE = HOME / ".cache" / "fastdata"  # fastdata's cache: the synthetic set, made by the first run, and the tunes


def _tune_once(k: int) -> dict:
    shutil.rmtree(CACHE / "tuned", ignore_errors=True)  # no run reuses another's pick
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "HOME": str(HOME), "FASTDATA_CACHE": str(CACHE), "OMP_NUM_THREADS": "1"}
        t = time.perf_counter()
        done = subprocess.run(["fastdata-profile", "synthetic", "--step-ms", "100", "--tune", "--out", tmp], env=env,
                              capture_output=True, text=True, timeout=1800)
        seconds = time.perf_counter() - t
        if done.returncode != 0:
            raise SystemExit(f"run {k}: fastdata-profile failed:\n{done.stderr[-3000:]}")
        tuned = json.loads((Path(tmp) / "config.json").read_text())
    outcome = tuned["tune"]
    chosen = outcome["chosen"]
    # the candidate measured for the pick (its config carries prefetch_factor even with 0 workers)
    mine = next(c for c in outcome["candidates"]
                if {k: v for k, v in c["config"].items() if k in chosen} == chosen)
    print(f"run {k + 1}: {json.dumps(chosen)}: tune measured {mine['median_images_per_s']:,.0f} images/s "
          f"({mine['interval_images_per_s'][0]:,.0f}-{mine['interval_images_per_s'][1]:,.0f}) in {seconds:.0f} s; "
          f"{outcome['reason']}", file=sys.stderr)
    return {"chosen": chosen, "tune_median": mine["median_images_per_s"], "tune_interval": mine["interval_images_per_s"],
            "reason": outcome["reason"], "seconds": seconds, "candidates": outcome["candidates"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    runs = [_tune_once(k) for k in range(args.runs)]

    source = str(CACHE / "demo-imagenet-like")
    transform = T.imagenet_train(224)
    picks = {json.dumps(r["chosen"], sort_keys=True): r["chosen"] for r in runs}

    def measure(config: dict) -> float:
        w = config.get("num_workers", 0)
        extra = {"persistent_workers": True} if w else {}
        loader = fastdata.loader(source, batch_size=256, shuffle=True, transform=transform, device="cpu",
                                 **config, **extra)
        return profile(loader, step_ms=100, steps=15, warmup=2, confirm=0).together_images_per_s

    again: dict[str, list[float]] = {key: [] for key in picks}
    for r in range(args.rounds):
        for key in (list(picks) if r % 2 == 0 else list(reversed(picks))):
            again[key].append(measure(picks[key]))
            print(f"  round {r + 1}: {key}: {again[key][-1]:,.0f} images/s", file=sys.stderr)
    medians = {key: statistics.median(v) for key, v in again.items()}
    spread = max(medians.values()) / min(medians.values())

    print(f"\n{'run':<5}{'pick':<72}{'tune median':>12}{'measured again':>16}")
    for k, r in enumerate(runs):
        key = json.dumps(r["chosen"], sort_keys=True)
        print(f"{k + 1:<5}{json.dumps(r['chosen']):<72}{r['tune_median']:>12,.0f}{medians[key]:>16,.0f}")
    print(f"\n{len(picks)} distinct pick(s) in {args.runs} runs; measured again ({args.rounds} interleaved rounds), "
          f"the best pick's median / the worst's: {spread:.3f} (target <= 1.10)")
    _common.write("tune_repeat", {"runs": runs, "again": again, "medians": medians, "spread": spread}, args.json)


if __name__ == "__main__":
    main()
