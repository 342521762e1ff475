"""Are the profiler's predictions right? Each piece of advice that predicts images/s is rerun.

    OMP_NUM_THREADS=1 python benchmarks/advice.py [--steps 20] [--step-ms 100] [--rounds 3] [--json PATH]

For each misconfigured start below, `fastdata.profile` measures it against a simulated step of
--step-ms and advises; every advised change that comes with a prediction ("num_workers=2:
about X images/s") is then applied and measured by fresh profiles in the same run, interleaved
with reruns of the start. The table gives prediction / median measurement for each (target:
within 15%), and the rate model's figure for the start itself next to its measurements.

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
from fastdata.backends.base import usable_cores
from fastdata.profiler import RateModel, profile
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--step-ms", type=float, default=100)
    ap.add_argument("--rounds", type=int, default=3, help="reruns of each config, interleaved")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    root = make_imagenet_like(HERE / "data" / "imagenet-like", n_images=2000, progress=True)
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
    def measure(kind: str, config: dict) -> float:
        return profile(make(kind, config), step_ms=args.step_ms, steps=args.steps).together_images_per_s

    rows = []
    for kind, config in starts:
        report = profile(make(kind, config), step_ms=args.step_ms, steps=args.steps)
        model = RateModel.of(report, usable_cores())
        own = model.rate(config["num_workers"]) if model else float("nan")
        print(f"{kind} {config}: measured {report.together_images_per_s:,.0f} images/s, the model gives {own:,.0f}; "
              f"stages {({k: round(v, 2) for k, v in report.stages.items()})}", file=sys.stderr)
        for a in report.advice:
            print(f"  - {a}", file=sys.stderr)
        # The reruns: the start and each advised change, interleaved over --rounds (this host's
        # throughput drifts by 10-20% between runs of one config); medians, and the start's
        # own spread as the noise floor.
        changes = [p["change"] for p in report.predictions]
        runs: dict[str, list[float]] = {}
        for _ in range(args.rounds):
            for change in [{}, *changes]:
                runs.setdefault(str(change), []).append(measure(kind, {**config, **change}))
        starts_measured = runs["{}"]
        rows.append({"start": kind, "from": config, "change": {}, "predicted": own, "measured": median(starts_measured),
                     "ratio": own / median(starts_measured), "spread": max(starts_measured) / min(starts_measured),
                     "runs": starts_measured})
        for p in report.predictions:
            measured = runs[str(p["change"])]
            rows.append({"start": kind, "from": config, "change": p["change"], "predicted": p["images_per_s"],
                         "measured": median(measured), "ratio": p["images_per_s"] / median(measured), "runs": measured})
            print(f"  rerun {p['change']}: predicted {p['images_per_s']:,.0f}, measured {measured}", file=sys.stderr)

    print(f"\n{'start':<28}{'change':<22}{'predicted':>10}{'measured':>10}{'ratio':>8}  runs")
    for r in rows:
        # a row without a change is the model's figure for the start itself; "spread" its runs' max/min
        spread = f"  spread {r['spread']:.2f}" if "spread" in r else ""
        print(f"{r['start'] + ' ' + str(r['from']):<28}{str(r['change'] or '(as is)'):<22}{r['predicted']:>10,.0f}"
              f"{r['measured']:>10,.0f}{r['ratio']:>8.2f}  {[round(x) for x in r['runs']]}{spread}")
    advised = [r for r in rows if r["change"]]
    within = sum(abs(r["ratio"] - 1) <= 0.15 for r in advised)
    print(f"\n{within} of {len(advised)} advised predictions within 15% of the rerun's median (target: all)")
    _common.write("advice", {"step_ms": args.step_ms, "steps": args.steps, "rows": rows, "within_15": within},
                  args.json)


if __name__ == "__main__":
    main()
