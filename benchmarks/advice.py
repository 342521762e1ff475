"""Are the profiler's predictions right? Each piece of advice that predicts images/s is rerun.

    OMP_NUM_THREADS=1 python benchmarks/advice.py [--steps 20] [--step-ms 100] [--rounds 3] [--json PATH]

For each misconfigured start below, `fastdata.profile` measures it against a simulated step of
--step-ms and advises. Then, over --rounds, the start is profiled afresh and each advised change
that comes with a prediction ("num_workers=2: about X images/s") is predicted from that profile
by the advice's own arithmetic and measured by a fresh profile right after it: a shared host's
throughput drifts between minutes, so a prediction is held to the rerun next to the profile it
came from. The table gives the medians over the rounds and the median of the rounds' ratios
prediction / rerun (target: within 15%), the rate model's figure for the start itself next to
its own measurement, and what the first profile's advice printed against the reruns' median.
The host's speed also moves within a round (the same decode can cost much more CPU a minute
later), so each advised change also gets the ratio adjusted for it: the prediction scaled by
the CPU an image took in the start's profile over the rerun's (both profiles time their
stages).

The starts (2,000 synthetic ImageNet-like JPEGs, batch 64):
- image mode, `pil`, RandomResizedCrop(160) + flip + ColorJitter + TrivialAugment + Normalize,
  with 0 workers and with 1;
- drop-in mode: a map-style Dataset that decodes with Pillow and crops (a user's own code),
  with 0 workers.
"""

from __future__ import annotations

import argparse
import sys
from statistics import median
from pathlib import Path

import _common
import numpy as np
import torch
from PIL import Image

import fastdata
from fastdata import transforms as T
from fastdata._cores import usable_cores
from fastdata.profiling import RateModel, profile
from fastdata.synthetic import make_imagenet_like

HERE = Path(__file__).resolve().parent


class PillowFolder(torch.utils.data.Dataset):
    """A user's Dataset: Pillow decode, a centre crop, HWC uint8 as CHW, the class label."""

    def __init__(self, root: Path) -> None:
        self.files = sorted(root.glob("*/*.JPEG"))
        classes = sorted({f.parent.name for f in self.files})
        self.labels = [classes.index(f.parent.name) for f in self.files]

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        with Image.open(self.files[i]) as im:
            im.draft("RGB", (320, 320))
            im = im.convert("RGB").resize((160, 160), Image.BILINEAR)
        return torch.from_numpy(np.asarray(im)).permute(2, 0, 1), self.labels[i]


def _row(kind: str, config: dict, change: dict, predicted: list[float], measured: list[float]) -> dict:
    """A table row: the medians over the rounds, and the median of each round's ratio."""
    ratios = [p / m for p, m in zip(predicted, measured)]
    return {"start": kind, "from": config, "change": change, "predicted": median(predicted),
            "measured": median(measured), "ratio": median(ratios), "ratios": ratios,
            "spread": max(measured) / min(measured), "runs": measured, "predictions": predicted}


def _cpu(report) -> float:
    """CPU ms an image of the loader's own stages (dataset or decode, transforms, collate): how
    fast the host runs this work at the time of the profile."""
    return sum(report.stages.get(k, 0.0) for k in ("dataset", "decode", "cpu_transforms", "collate"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--step-ms", type=float, default=100)
    ap.add_argument("--rounds", type=int, default=3, help="reruns of each config, interleaved")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    root = make_imagenet_like(HERE / "data" / "imagenet-like", n_images=2000, progress=True)
    # Read every file once, so that the first profile does not meet a cold page cache that its
    # reruns will not (its "read" stage would then predict an I/O-bound loader).
    for f in root.rglob("*.JPEG"):
        f.read_bytes()
    spec = T.Compose([T.RandomResizedCrop(160), T.RandomHorizontalFlip(), T.ColorJitter(0.4, 0.4, 0.4, 0.1),
                      T.TrivialAugment(), T.Normalize()])
    dataset = PillowFolder(root)

    def make(kind: str, config: dict):
        w = config["num_workers"]
        extra = {"prefetch_factor": 2, "persistent_workers": True} if w else {}
        if kind == "image":
            return fastdata.loader(str(root), batch_size=64, shuffle=True, transform=spec, device="cpu",
                                   **config, **extra)
        return fastdata.loader(dataset, batch_size=64, shuffle=True, device="cpu", **config, **extra)

    starts = [("image", {"num_workers": 0}), ("image", {"num_workers": 1}), ("dropin", {"num_workers": 0})]
    def measure(kind: str, config: dict) -> tuple[float, float]:
        report = profile(make(kind, config), step_ms=args.step_ms, steps=args.steps, confirm=0)
        return report.together_images_per_s, _cpu(report)

    cores = usable_cores()
    rows = []
    for kind, config in starts:
        report = profile(make(kind, config), step_ms=args.step_ms, steps=args.steps, confirm=0)
        print(f"{kind} {config}: measured {report.together_images_per_s:,.0f} images/s; "
              f"stages {({k: round(v, 2) for k, v in report.stages.items()})}", file=sys.stderr)
        for a in report.advice:
            print(f"  - {a.text}", file=sys.stderr)
        # The reruns, over --rounds: the start profiled afresh, its advice's predictions
        # recomputed from that profile (the advice's own arithmetic: RateModel.rate), then each
        # advised change measured right after it. A shared host's throughput drifts between
        # minutes, so each prediction is held to the measurement taken next to the
        # profile it came from; the table gives the medians of the rounds.
        predictions = [a for a in report.advice if a.predicted_images_per_s is not None]
        changes = [a.change for a in predictions]
        assert all(set(c) == {"num_workers"} for c in changes), changes  # no GPU here: no placement advice
        own, measured_start = [], []
        predicted: dict[str, list[float]] = {str(c): [] for c in changes}
        measured: dict[str, list[float]] = {str(c): [] for c in changes}
        drift: dict[str, list[float]] = {str(c): [] for c in changes}
        for k in range(args.rounds):
            again = profile(make(kind, config), step_ms=args.step_ms, steps=args.steps, confirm=0)
            model = RateModel.of(again, cores)
            own.append(model.rate(config["num_workers"]))
            measured_start.append(again.together_images_per_s)
            for c in changes:
                predicted[str(c)].append(model.rate(c["num_workers"]))
                rate, cpu = measure(kind, {**config, **c})
                measured[str(c)].append(rate)
                drift[str(c)].append(cpu / _cpu(again))
                print(f"  round {k + 1}: {c} predicted {predicted[str(c)][-1]:,.0f}, measured {rate:,.0f} "
                      f"(CPU an image in the workers: {drift[str(c)][-1]:.2f}x the start's)", file=sys.stderr)
        rows.append(_row(kind, config, {}, own, measured_start))
        for prediction in predictions:
            c = prediction.change
            row = _row(kind, config, c, predicted[str(c)], measured[str(c)])
            adjusted = [p / d / m for p, d, m in zip(predicted[str(c)], drift[str(c)], measured[str(c)])]
            rows.append({**row, "first_advice": prediction.predicted_images_per_s,  # the figure the first profile printed
                         "cpu_drift": drift[str(c)], "ratio_drift_adjusted": median(adjusted)})

    print(f"\n{'start':<28}{'change':<22}{'predicted':>10}{'measured':>10}{'ratio':>8}  runs")
    for r in rows:
        # a row without a change is the model's figure for the start itself; "spread" its runs' max/min
        spread = f"  spread {r['spread']:.2f}"
        print(f"{r['start'] + ' ' + str(r['from']):<28}{str(r['change'] or '(as is)'):<22}{r['predicted']:>10,.0f}"
              f"{r['measured']:>10,.0f}{r['ratio']:>8.2f}  {[round(x) for x in r['runs']]}{spread}")
    advised = [r for r in rows if r["change"]]
    within = sum(abs(r["ratio"] - 1) <= 0.15 for r in advised)
    for r in advised:
        print(f"{r['start']} {r['from']} -> {r['change']}: the first profile advised {r['first_advice']:,.0f} "
              f"images/s, {r['first_advice'] / r['measured']:.2f} of the reruns' median; the rounds' ratios "
              f"{[round(x, 2) for x in r['ratios']]}; adjusted for the host's speed (the CPU an image took in "
              f"each rerun against its start: {[round(x, 2) for x in r['cpu_drift']]}): "
              f"{r['ratio_drift_adjusted']:.2f}")
    print(f"\n{within} of {len(advised)} advised predictions within 15% (median over the rounds of prediction / "
          f"the rerun next to it; target: all)")
    _common.write("advice", {"step_ms": args.step_ms, "steps": args.steps, "rows": rows, "within_15": within},
                  args.json)


if __name__ == "__main__":
    main()
