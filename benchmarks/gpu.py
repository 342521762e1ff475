"""The GPU checks in one run, on any CUDA machine (issue 33): 232 s on an H200 (all but `tune`).

It makes its own data (`--images` synthetic ImageNet-like JPEGs, `fastdata.synthetic`, and
their shards) and prints, with the ratios measured in the same run:

1. the loader alone, per backend (num_workers="auto", persistent workers, batch 256, the
   ImageNet training transform to bfloat16 on the GPU): fastdata `pil`, `wds` (and `dali` where
   installed) beside DataLoader + torchvision as the ImageNet example writes it (ImageFolder,
   RandomResizedCrop, flip, ToTensor, Normalize in the workers, pin_memory, non_blocking copy);
2. ResNet-18 and ResNet-50 (bfloat16 autocast, channels_last, SGD): the step alone on a cached
   batch, and a plain training loop fed by fastdata and by DataLoader + torchvision;
3. the worker sweep: the ResNet-18 loop at several worker counts, and where num_workers="auto"
   (what it resolves to here) stands against the best;
4. the profiler on that loop (`fastdata.profile` with the CLI's measured advice): its
   "together" against the plain loop's rate, its verdict and headline;
5. placement: the op-by-op parity table of the device lowering on CUDA (TF32 allowed, under
   autocast, as training scripts run) against the Pillow lowering, the whole ImageNet pipeline
   (RandomResizedCrop, flip, ColorJitter(0.4, 0.4, 0.4, 0.1), TrivialAugment, Normalize) with
   placement "gpu" against "cpu": the differences in normalized units and both rates;
6. a GPU decode without DALI (`nvjpeg_side.py`: torchvision's nvJPEG, the crop and resize on the
   GPU) alone and feeding both models, beside fastdata in the same run; and its decode alone;
7. with `--only ...,tune`: `fastdata profile ROOT --model torchvision.models:resnet18 --tune` as a
   user runs it (its own process, an empty HOME): its report, and the loop with the config it
   picked, measured in the sweep's rounds against the best worker count.

Each loop times epochs after a warm one (workers started, page cache and the JPEG index warm):
the steady state of persistent workers. Writes JSON (default benchmarks/results/gpu.json) after
each part, so that a run cut short keeps what it measured.

    python benchmarks/gpu.py [--images 8000] [--json PATH] [--models resnet18,resnet50]

On a lent GPU machine without network, `gpu_machine.sh` beside this file installs the wheels it
lacks, builds the extension and runs the CUDA tests, then this, in one call.

Without CUDA it runs on the CPU at the sizes given (a check of the script itself, not figures).
It is one file over 400 lines so that a lent machine's one call runs every part from it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _common
import numpy as np
import torch

import fastdata
from fastdata import _optional
from fastdata import transforms as T
from fastdata._cores import usable_cores
from fastdata._loader import resolve_workers
from fastdata.synthetic import make_file_list
from nvjpeg_side import NvjpegSide

HERE = Path(__file__).resolve().parent
SIZE = 224
T0 = time.perf_counter()


def say(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f} s] {msg}", file=sys.stderr, flush=True)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ----------------------------------------------------------------- the sides


def fastdata_loader(source: str, device, batch: int, workers, transform=None, **kw):
    spec = transform or T.Compose([T.RandomResizedCrop(SIZE), T.RandomHorizontalFlip(),
                                   T.Normalize(T.IMAGENET_MEAN, T.IMAGENET_STD)])
    return fastdata.loader(source, batch_size=batch, shuffle=True, num_workers=workers, persistent_workers=True,
                           transform=spec, dtype=torch.bfloat16, device=device, **kw)


class TorchvisionSide:
    """DataLoader + torchvision as the ImageNet example writes it; batches moved as it moves them."""

    def __init__(self, root: str, device, batch: int, workers: int) -> None:
        import torchvision
        import torchvision.transforms as tvt
        from torch.utils.data import DataLoader

        tf = tvt.Compose([tvt.RandomResizedCrop(SIZE), tvt.RandomHorizontalFlip(), tvt.ToTensor(),
                          tvt.Normalize(T.IMAGENET_MEAN, T.IMAGENET_STD)])
        dataset = torchvision.datasets.ImageFolder(root, tf)
        self.loader = DataLoader(dataset, batch_size=batch, shuffle=True, num_workers=workers,
                                 pin_memory=device.type == "cuda", persistent_workers=True)
        self.device = device

    def __iter__(self):
        for images, labels in self.loader:
            yield (images.to(self.device, non_blocking=True).contiguous(memory_format=torch.channels_last),
                   labels.to(self.device, non_blocking=True))

    def __len__(self) -> int:
        return len(self.loader)


def model_step(name: str, device: torch.device):
    import torchvision

    model = getattr(torchvision.models, name)().to(device, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step(batch):
        images, labels = batch[0], batch[1]
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def epochs_rate(loader, device, step=None, epochs: int = 2) -> float:
    """images/s over `epochs` epochs after a warm one, the step (if any) run on each batch, the
    GPU synchronized only at the ends (as a training loop runs)."""
    rates = []
    for e in range(epochs + 1):
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(e)
        sync(device)
        t, n = time.perf_counter(), 0
        for batch in loader:
            if step is not None:
                step(batch)
            n += len(batch[1])
        sync(device)
        if e:
            rates.append(n / (time.perf_counter() - t))
    return statistics.median(rates)


def step_alone(step, batch, device, steps: int) -> float:
    for _ in range(5):
        step(batch)
    sync(device)
    t = time.perf_counter()
    for _ in range(steps):
        step(batch)
    sync(device)
    return steps * len(batch[1]) / (time.perf_counter() - t)


def close(loader) -> None:
    """Persistent workers (which run ahead into the next epoch) stopped before the next side
    runs: fastdata's runner, or DataLoader's persistent iterator."""
    runner = getattr(loader, "_runner", None)
    if runner is not None:
        runner.shutdown()
    it = getattr(loader, "_iterator", None)
    if it is not None and hasattr(it, "_shutdown_workers"):
        it._shutdown_workers()
        loader._iterator = None


# ----------------------------------------------------------------- placement parity


def parity_table(root: str, device: torch.device, n: int = 64) -> list[dict]:
    """Each pixel op of the device lowering on `device` (TF32 allowed, under autocast) against
    the Pillow lowering with the same parameters: mean and max |difference| in uint8 levels and
    the share of values more than 1 level off."""
    from PIL import Image

    from fastdata.synthetic import make_file_list
    from fastdata.transforms import ColorJitter, TrivialAugment
    from fastdata.transforms import kornia as K
    from fastdata.transforms import pil as P
    from fastdata.transforms.plan import TRIVIAL_OPS, trivial_magnitude

    files = make_file_list(root)[:n]
    imgs = [np.asarray(Image.open(p).convert("RGB").resize((SIZE, SIZE))) for p, _ in files]
    batch = torch.from_numpy(np.stack(imgs)).permute(0, 3, 1, 2).contiguous()
    cases = []
    for name in TRIVIAL_OPS:
        rng = np.random.default_rng(TRIVIAL_OPS.index(name))
        params = []
        for _ in imgs:
            mag = trivial_magnitude(name, int(rng.integers(1, 31)), 31)
            signed = rng.random() < 0.5 and name not in ("Posterize", "Solarize")
            params.append({"op": name, "magnitude": -mag if signed else mag})
        cases.append((name, TrivialAugment(), params))
    for key, lo, hi in (("brightness", 0.6, 1.4), ("contrast", 0.6, 1.4), ("saturation", 0.6, 1.4),
                        ("hue", -0.1, 0.1)):
        rng = np.random.default_rng(1)
        params = [{"order": [0, 1, 2, 3], "brightness": 1.0, "contrast": 1.0, "saturation": 1.0, "hue": 0.0, key: v}
                  for v in rng.uniform(lo, hi, len(imgs))]
        cases.append((f"ColorJitter.{key}", ColorJitter(), params))
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    rows = []
    try:
        for name, op, params in cases:
            lower = P.color_jitter if isinstance(op, ColorJitter) else P.trivial_augment
            ref = np.stack([np.asarray(lower(Image.fromarray(a), p)) for a, p in zip(imgs, params)]).astype(int)
            with torch.autocast(device.type, dtype=torch.bfloat16):
                out = K.apply_pixel_ops(batch.to(device), [op], [params])
            diff = np.abs(out.permute(0, 2, 3, 1).cpu().numpy().astype(int) - ref)
            rows.append({"op": name, "mean_levels": float(diff.mean()), "max_levels": int(diff.max()),
                         "over_1_level": float((diff > 1).mean())})
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
    return rows


def placement_check(root: str, device, workers) -> dict:
    """The ImageNet pipeline with ColorJitter and TrivialAugment, placement "gpu" against "cpu":
    the same batches (same seed) compared in normalized units, and each one's rate alone."""
    spec = T.Compose([T.RandomResizedCrop(SIZE), T.RandomHorizontalFlip(), T.ColorJitter(0.4, 0.4, 0.4, 0.1),
                      T.TrivialAugment(), T.Normalize(T.IMAGENET_MEAN, T.IMAGENET_STD)])
    loaders = {p: fastdata.loader(root, batch_size=256, shuffle=True, num_workers=workers, persistent_workers=True,
                                  transform=spec, dtype=torch.float32, device=device, placement=p, seed=5)
               for p in ("cpu", "gpu")}
    diffs = []
    for (x, y), (u, v) in zip(loaders["cpu"], loaders["gpu"]):
        assert torch.equal(y, v)
        diffs.append((x - u).abs().flatten().cpu())
        if len(diffs) == 4:
            break
    d = torch.cat(diffs)
    out = {"mean_abs": float(d.mean()), "max_abs": float(d.max()), "share_over_0.1": float((d > 0.1).float().mean()),
           "images_per_s": {p: epochs_rate(ld, device, epochs=1) for p, ld in loaders.items()}}
    for ld in loaders.values():
        close(ld)
    return out


def nvjpeg_rate(root: str, n: int = 2048, batch: int = 256) -> float | None:
    try:
        from torchvision.io import decode_jpeg, read_file
    except ImportError:
        return None

    data = [read_file(p) for p, _ in make_file_list(root)[:n]]
    decode_jpeg(data[:batch], device="cuda")
    torch.cuda.synchronize()
    t = time.perf_counter()
    for i in range(0, len(data), batch):
        decode_jpeg(data[i:i + batch], device="cuda")
    torch.cuda.synchronize()
    return len(data) / (time.perf_counter() - t)


def cli_tune(root: str, device: torch.device, model: str, batch: int) -> dict:
    """`fastdata profile ROOT --model MODEL --tune` (`module:callable`), in a process of its own
    with an empty HOME (its tune kept there, not where this script's "auto" loaders would read
    it): the report's rates, verdict and headline, and the config the tune picked."""
    with tempfile.TemporaryDirectory() as home:
        out = Path(home) / "report"
        proc = subprocess.run([sys.executable, "-m", "fastdata", "profile", root, "--model", model,
                               "--device", device.type, "--batch-size", str(batch),
                               "--tune", "--out", str(out)], env={**os.environ, "HOME": home},
                              capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(f"fastdata profile --tune: exit {proc.returncode}: {proc.stderr[-3000:]}")
        report = json.loads((out / "report.json").read_text())
        config = json.loads((out / "config.json").read_text())
    return {"chosen": config["loader"], "tune_seconds": config["tune"]["seconds"], "rates": report["rates"],
            "verdict": report["verdict"], "headline": report["headline"]}


# ----------------------------------------------------------------- the run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=8000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--models", default="resnet18,resnet50")
    ap.add_argument("--steps", type=int, default=20, help="steps of the step-alone timing and the profile's windows")
    ap.add_argument("--root", default=str(HERE / "data" / "gpu-imagenet-like"))
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the sweep and the profile, interleaved")
    ap.add_argument("--only", default="alone,training,sweep,placement",
                    help="the parts to run (nvJPEG runs with placement; tune, with sweep)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    only = set(args.only.split(","))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    cores = usable_cores()
    auto = resolve_workers("auto", device)
    models = args.models.split(",")
    out: dict = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "cores": cores,
                 "images": args.images, "batch": args.batch, "auto_workers": auto}
    shards = Path(args.root + "-shards")
    _common.make_shards(args.root, shards, args.images)
    pattern = str(shards / f"train-{{000000..{len(list(shards.glob('train-*.tar'))) - 1:06d}}}.tar")
    say(f"data: {args.images} images in {args.root}; {cores} cores, num_workers='auto' -> {auto}; {out['device']}")

    # 1. the loader alone, per backend
    tv = TorchvisionSide(args.root, device, args.batch, auto) if {"alone", "training"} & only else None
    files = make_file_list(args.root)
    nvj = {f"torchvision nvJPEG{' ahead' if a else ''}": NvjpegSide(files, device, args.batch, auto, ahead=a)
           for a in (False, True)} if tv is not None else {}
    if "alone" in only:
        alone = {}
        backends = {"pil": args.root, "wds": pattern}
        if _optional.has("dali"):
            backends["dali"] = args.root
        for backend, source in backends.items():
            loader = fastdata_loader(source, device, args.batch, "auto", backend=backend)
            alone[f"fastdata {backend}"] = epochs_rate(loader, device)
            close(loader)
            say(f"alone: fastdata {backend}: {alone[f'fastdata {backend}']:,.0f} images/s")
        for name, side in nvj.items():
            alone[name] = epochs_rate(side, device)
            say(f"alone: {name}: {alone[name]:,.0f} images/s")
        alone["DataLoader + torchvision"] = epochs_rate(tv, device)
        say(f"alone: DataLoader + torchvision: {alone['DataLoader + torchvision']:,.0f} images/s")
        out["loader_alone"] = alone
        _common.write("gpu", out, args.json)  # (after each part: a run cut short keeps what it measured)

    # 2. step alone and together
    if "training" in only:
        training = {}
        loader = fastdata_loader(args.root, device, args.batch, "auto")
        cached = next(iter(loader))
        for name in models:
            step = model_step(name, device)
            row = {"step_alone": step_alone(step, cached, device, args.steps)}
            row["fastdata"] = epochs_rate(loader, device, step)
            row["DataLoader + torchvision"] = epochs_rate(tv, device, step)
            row.update({name: epochs_rate(side, device, step) for name, side in nvj.items()})
            row["fastdata_of_step"] = row["fastdata"] / row["step_alone"]
            row["ratio_vs_dataloader"] = row["fastdata"] / row["DataLoader + torchvision"]
            training[name] = row
            say(f"{name}: step alone {row['step_alone']:,.0f}; fastdata {row['fastdata']:,.0f} "
                f"({row['fastdata_of_step']:.2f} of the step); DataLoader + torchvision "
                f"{row['DataLoader + torchvision']:,.0f}; {row['ratio_vs_dataloader']:.2f}x; "
                + "; ".join(f"{n} {row[n]:,.0f} (fastdata {row['fastdata'] / row[n]:.2f}x)" for n in nvj))
        close(loader)
        out["training"] = training
        _common.write("gpu", out, args.json)

    if tv is not None:
        close(tv.loader)
        for side in nvj.values():
            close(side.loader)

    # 3 and 4. the worker sweep (ResNet-18) and the profiler on the same loop, interleaved in
    # rounds (ABBA), each measurement with a fresh loader: one epoch's figure swings by a third
    # here (the workers and the training thread share every core)
    if "sweep" in only:
        tuned = cli_tune(args.root, device, f"torchvision.models:{models[0]}", args.batch) if "tune" in only else None
        if tuned is not None:
            out["tune"] = tuned
            say(f"fastdata profile --tune: together {tuned['rates']['together_images_per_s']:,.0f} images/s, "
                f"{tuned['verdict']}; picked {tuned['chosen']} in {tuned['tune_seconds']:.0f} s")
        step = model_step(models[0], device)

        def rebuild(change):
            return fastdata_loader(args.root, device, args.batch, change.get("num_workers", "auto"),
                                   **{k: v for k, v in change.items() if k != "num_workers"})

        reports = []

        def plain(w, **kw):
            loader = fastdata_loader(args.root, device, args.batch, w, **kw)
            rate = epochs_rate(loader, device, step)
            close(loader)
            return rate

        def profiled():
            loader = rebuild({})
            reports.append(fastdata.profile(loader, step, steps=max(args.steps, 30), device=device, rebuild=rebuild))
            close(loader)
            return reports[-1].together_images_per_s

        counts = sorted({max(1, cores // 2), max(1, cores - 4), max(1, cores - 2), max(1, cores - 1), cores})
        runs = {**{w: (lambda w=w: plain(w)) for w in counts}, "profile": profiled}
        if tuned is not None and tuned["chosen"]["num_workers"]:  # (the sides here all have persistent workers)
            chosen = tuned["chosen"]
            runs["tuned"] = lambda: plain(chosen["num_workers"],
                                          **{k: v for k, v in chosen.items() if k != "num_workers"})
        rates = {k: [] for k in runs}
        for r in range(args.rounds):
            for k in (list(runs) if r % 2 == 0 else reversed(list(runs))):
                rates[k].append(runs[k]())
                what = {"profile": "profiled, together", "tuned": "with the tune's config"}.get(k, f"with {k} workers")
                say(f"round {r + 1}: {models[0]} {what}: {rates[k][-1]:,.0f} images/s")
        sweep = {w: statistics.median(rates[w]) for w in counts}
        best = max(sweep, key=sweep.get)
        out["sweep"] = {"model": models[0], "images_per_s": sweep, "runs": {str(k): v for k, v in rates.items()},
                        "best": best, "auto": auto, "auto_of_best": sweep[auto] / sweep[best]}
        say(f"sweep (medians of {args.rounds}): " + ", ".join(f"{w}: {r:,.0f}" for w, r in sweep.items())
            + f"; best {best} workers; auto ({auto}) gives {out['sweep']['auto_of_best']:.3f} of it")
        if "tuned" in rates:
            out["tune"]["loop"] = statistics.median(rates["tuned"])
            out["tune"]["loop_of_best"] = out["tune"]["loop"] / sweep[best]
            say(f"the tune's config: {out['tune']['loop']:,.0f} images/s, {out['tune']['loop_of_best']:.3f} of the "
                f"best worker count; fastdata profile's together {tuned['rates']['together_images_per_s']:,.0f}")
        together = statistics.median(rates["profile"])
        report = reports[-1]
        out["profile"] = {"together": together, "plain_loop": sweep[auto], "together_of_plain": together / sweep[auto],
                          "loader_alone": report.loader_images_per_s, "step_alone": report.step_images_per_s,
                          "verdicts": [r.verdict for r in reports], "headline": report.headline,
                          "advice": [a.text for a in report.advice], "ceiling": report.ceiling_images_per_s}
        print(report)
        say(f"profile: together {together:,.0f} (median of {args.rounds}) against the plain loop's "
            f"{sweep[auto]:,.0f} ({out['profile']['together_of_plain']:.2f}); verdicts {out['profile']['verdicts']}")
        _common.write("gpu", out, args.json)

    # 5. placement
    if "placement" not in only:
        return
    out["parity"] = parity_table(args.root, device)
    say("parity of the device lowering on " + device.type + " against Pillow (uint8 levels):")
    for row in out["parity"]:
        print(f"  {row['op']:<24} mean {row['mean_levels']:.4f}  max {row['max_levels']:>3}  "
              f"over 1 level {100 * row['over_1_level']:.3f}%")
    out["placement"] = placement_check(args.root, device, "auto")
    p = out["placement"]
    say(f"placement gpu vs cpu: mean {p['mean_abs']:.4f}, max {p['max_abs']:.3f} normalized units, "
        f"{100 * p['share_over_0.1']:.3f}% over 0.1; rates cpu {p['images_per_s']['cpu']:,.0f}, "
        f"gpu {p['images_per_s']['gpu']:,.0f} ({p['images_per_s']['gpu'] / p['images_per_s']['cpu']:.2f}x)")

    _common.write("gpu", out, args.json)

    # 6. nvJPEG
    if device.type == "cuda":
        out["nvjpeg_decode"] = nvjpeg_rate(args.root)
        say(f"torchvision nvJPEG decode alone: {out['nvjpeg_decode'] or 0:,.0f} images/s")
    _common.write("gpu", out, args.json)


if __name__ == "__main__":
    main()
