"""fastdata-profile --tune against an exhaustive sweep of the same space, in one run.

The pipeline starts misconfigured: 0 workers, every augmentation on the CPU (RandomResizedCrop,
flip, ColorJitter, TrivialAugment, Normalize), the default prefetch. The consumer is a simulated
training step of --step-ms. The space: num_workers {0, 1, 2, ...up to the cores}, prefetch_factor
{2, 4}, backend {pil}, placement {cpu, gpu}. `tune` (probes with stage timing, a rate model,
the best predictions and the default measured, interleaved, 3 times each) and a sweep that measures every config use the same measurement
(`fastdata.profile` with the step, --steps batches). Prints each config's prediction next to its
sweep measurement, both winners, and the time each search took; writes JSON.
Targets: the tuned config reaches >= 90% of the sweep's best (both as the sweep measured them;
tune's own median for its pick is printed too), in <= 1/4 of the sweep's time.

    OMP_NUM_THREADS=1 python benchmarks/tuner.py [--images 1000] [--step-ms 100] [--steps 6] [--json PATH]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import _common
import torch

import fastdata
from fastdata import transforms as T
from fastdata._cores import usable_cores
from fastdata.profiling import profile, tune
from fastdata.synthetic import make_imagenet_like

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=1000)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--step-ms", type=float, default=100)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    root = make_imagenet_like(HERE / "data" / "imagenet-like", n_images=2000, progress=True)
    spec = T.Compose([T.RandomResizedCrop(160), T.RandomHorizontalFlip(), T.ColorJitter(0.4, 0.4, 0.4, 0.1),
                      T.TrivialAugment(), T.Normalize()])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cores = usable_cores()
    space = {"num_workers": sorted({0, 1, *[w for w in (2, 4, 8) if w <= cores], cores}), "prefetch_factor": [2, 4],
             "backend": ["pil"], "placement": ["cpu", "gpu"]}

    def make(config: dict):
        w = config["num_workers"]
        extra = {"prefetch_factor": config["prefetch_factor"], "persistent_workers": True} if w else {}
        return fastdata.loader(str(root), batch_size=args.batch_size, shuffle=True, num_workers=w, transform=spec,
                               device=device, backend=config["backend"], placement=config["placement"], **extra)

    def measure(config: dict) -> float:
        report = profile(make(config), step_ms=args.step_ms, steps=args.steps, warmup=2, device=device, confirm=0)
        return report.together_images_per_s

    start = {"num_workers": 0, "prefetch_factor": 2, "backend": "pil", "placement": "cpu"}
    print(f"misconfigured start {start}: {measure(start):,.0f} images/s", file=sys.stderr)

    t = time.perf_counter()
    predictions: list = []
    result = tune(make, space=space, step_ms=args.step_ms, steps=args.steps, device=device, predictions=predictions,
                  default={"num_workers": cores, "prefetch_factor": 2, "backend": "pil", "placement": "cpu"})
    tune_s = time.perf_counter() - t
    best = result.chosen
    tuned_rate = next(c.median for c in result.candidates if c.config == best)
    print(f"tune: {result.reason}", file=sys.stderr)

    t = time.perf_counter()
    sweep = []
    keys = list(space)
    for values in itertools.product(*(space[k] for k in keys)):
        config = dict(zip(keys, values))
        sweep.append((config, measure(config)))
        print(f"  sweep {config}: {sweep[-1][1]:,.0f} images/s", file=sys.stderr)
    sweep_s = time.perf_counter() - t
    sweep_best, sweep_rate = max(sweep, key=lambda cr: cr[1])

    predicted = {json.dumps(c, sort_keys=True): p for c, p in predictions}
    print(f"\n{'config':<78}{'predicted':>11}{'measured':>10}")
    for config, rate in sweep:
        print(f"{json.dumps(config):<78}{predicted[json.dumps(config, sort_keys=True)]:>11,.0f}{rate:>10,.0f}")
    # The tuned config's throughput as the sweep measured it (one measurement per config, taken
    # alike for all), against the sweep's best; and, apart, tune's own measurement of its pick,
    # taken minutes away from the sweep's on a drifting host.
    in_sweep = next(rate for config, rate in sweep if config == best)
    print(f"\ntune:  {json.dumps(best)}: {tuned_rate:,.0f} images/s in {tune_s:.0f} s (the sweep measured it "
          f"at {in_sweep:,.0f})")
    print(f"sweep: {json.dumps(sweep_best)}: {sweep_rate:,.0f} images/s in {sweep_s:.0f} s")
    print(f"tuned config / sweep best, both as the sweep measured them: {in_sweep / sweep_rate:.2f} (target >= 0.90); "
          f"tune's own measurement / sweep best: {tuned_rate / sweep_rate:.2f}; "
          f"tuning time / sweep time: {tune_s / sweep_s:.2f} (target <= 0.25)")
    _common.write("tuner", {"space": space, "step_ms": args.step_ms, "tuned": best, "tuned_images_per_s": tuned_rate,
                            "tuned_in_sweep_images_per_s": in_sweep, "tune_s": tune_s, "sweep_best": sweep_best,
                            "sweep_images_per_s": sweep_rate, "sweep_s": sweep_s, "sweep": sweep,
                            "predictions": predictions, "ratio": in_sweep / sweep_rate,
                            "ratio_own_measurement": tuned_rate / sweep_rate, "time_ratio": tune_s / sweep_s}, args.json)


if __name__ == "__main__":
    main()
