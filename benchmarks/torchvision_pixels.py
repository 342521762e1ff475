"""How far `fastdata run`'s natively served torchvision pipelines are from torchvision's pixels.

For each configuration of an ImageFolder transform that fastdata lowers, batches are served
as `fastdata run` serves them (`fastdata.run._torchvision`: NativeFolder's __getitems__, the
collate layout, the main process's Finish), and each sample is recomputed with torchvision's
own functional ops on `pil_loader`'s image, with the crop box, flip and pixel-op parameters
fastdata drew (RandomResizedCrop: `F.resized_crop` with the box; Resize + CenterCrop:
torchvision's transform itself, which is deterministic; ColorJitter: `F.adjust_*` in the
planned order; TrivialAugmentWide: `_apply_op` with torchvision's own magnitude for the drawn
bin); then the script's own ToTensor/Normalize/... tail. Differences in uint8 levels (a
normalized output taken back as (x * std + mean) * 255): mean and max absolute, the share of
values more than 2 levels apart, the max of the samples whose box is under twice the output
(whole, and away from a 2-pixel border), and the mean apart for samples whose box is under /
at least twice the output (a JPEG is decoded at a reduced DCT scale then). Configuration viii
is image mode: `fastdata.loader(folder, transform=fastdata.transforms.imagenet_eval(224))`
against torchvision's Resize(256), CenterCrop(224), ToTensor, Normalize. On the synthetic
ImageNet-like set (`fastdata.synthetic`, 200 images, 4 classes).

Run it with a user's environment (torch, torchvision and stock Pillow from the registry,
fastdata installed):

    OMP_NUM_THREADS=1 python benchmarks/torchvision_pixels.py [--images 200] [--json PATH]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import _common
import numpy as np
import torch

HERE = Path(__file__).resolve().parent
SIZE = 224
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def configurations() -> list[dict]:
    """Each: name, op and interpolation (for the table), the script's transform, whether the
    crop runs on a tensor, the transform's deterministic tail, and how its output maps back to
    uint8 levels."""
    import torchvision.transforms as T
    import torchvision.transforms.v2 as v2
    from torchvision.transforms import InterpolationMode as I

    norm = T.Normalize(MEAN, STD)
    tail = [T.ToTensor(), norm]
    v2_tail = [v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]
    rrc, flip = T.RandomResizedCrop(SIZE), T.RandomHorizontalFlip()
    return [
        dict(name="i", op="RandomResizedCrop + flip, ToTensor, Normalize", interp="bilinear",
             transform=T.Compose([rrc, flip, *tail]), tail=tail, levels="normalized"),
        dict(name="ii", op="RandomResizedCrop, ToTensor", interp="bicubic",
             transform=T.Compose([T.RandomResizedCrop(SIZE, interpolation=I.BICUBIC), T.ToTensor()]),
             tail=[T.ToTensor()], levels="float"),
        dict(name="iii", op="RandomResizedCrop, PILToTensor", interp="nearest",
             transform=T.Compose([T.RandomResizedCrop(SIZE, interpolation=I.NEAREST), T.PILToTensor()]),
             tail=[T.PILToTensor()], levels="uint8"),
        dict(name="iv", op="Resize(256), CenterCrop(224), ToTensor, Normalize", interp="bilinear",
             transform=T.Compose([T.Resize(256), T.CenterCrop(SIZE), *tail]), tail=None, levels="normalized"),
        dict(name="v", op="v2: RandomResizedCrop + flip, ToImage, ToDtype, Normalize", interp="bilinear",
             transform=v2.Compose([v2.RandomResizedCrop(SIZE), v2.RandomHorizontalFlip(), v2.ToImage(), *v2_tail]),
             tail=[v2.ToImage(), *v2_tail], levels="normalized"),
        dict(name="vi", op="v2: ToImage, RandomResizedCrop (tensor) + flip, ToDtype, Normalize",
             interp="bilinear, antialias", transform=v2.Compose([v2.ToImage(), v2.RandomResizedCrop(SIZE),
                                                                 v2.RandomHorizontalFlip(), *v2_tail]),
             tail=v2_tail, tensor=True, levels="normalized"),
        dict(name="vii", op="i + ColorJitter(0.4, 0.4, 0.4, 0.1) + TrivialAugmentWide", interp="bilinear",
             transform=T.Compose([rrc, flip, T.ColorJitter(0.4, 0.4, 0.4, 0.1), T.TrivialAugmentWide(), *tail]),
             tail=tail, levels="normalized"),
        # image mode: fastdata.loader's own preset against the script's iv
        dict(name="viii", op="image mode: fastdata.loader(folder, transform=imagenet_eval(224)) against iv",
             interp="bilinear", transform=T.Compose([T.Resize(256), T.CenterCrop(SIZE), *tail]), tail=None,
             levels="normalized", image_mode=True),
    ]


def to_levels(x: torch.Tensor, kind: str) -> torch.Tensor:
    x = x.double()
    if kind == "normalized":
        std, mean = torch.tensor(STD, dtype=x.dtype).view(-1, 1, 1), torch.tensor(MEAN, dtype=x.dtype).view(-1, 1, 1)
        return (x * std + mean) * 255
    return x * 255 if kind == "float" else x


def torchvision_magnitude(name: str, magnitude: float) -> float:
    """torchvision's v1 TrivialAugmentWide (31 bins) magnitude for the (op, bin, sign) fastdata drew."""
    import torchvision.transforms as T

    from fastdata.transforms.plan import trivial_magnitude

    mags, _ = T.TrivialAugmentWide()._augmentation_space(31)[name]
    if mags.ndim == 0:
        return 0.0
    b = int(np.argmin([abs(trivial_magnitude(name, b, 31) - abs(magnitude)) for b in range(31)]))
    return math.copysign(float(mags[b]), magnitude) if magnitude else float(mags[b])


def reference(img, box, flip: bool, pixel: list, interp, tensor: bool, tail: list) -> torch.Tensor:
    """torchvision's output for one sample: the crop `box` (left, top, w, h) resized, flipped,
    the pixel ops with fastdata's parameters, then the transform's tail."""
    import torchvision.transforms.functional as F
    import torchvision.transforms.v2.functional as F2
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms.autoaugment import _apply_op

    left, top, w, h = box
    if tensor:
        img = F2.resized_crop(F2.to_image(img), top, left, h, w, [SIZE, SIZE], interpolation=interp, antialias=True)
        img = F2.horizontal_flip(img) if flip else img
    else:
        img = F.resized_crop(img, top, left, h, w, [SIZE, SIZE], interpolation=interp)
        img = F.hflip(img) if flip else img
    adjust = (F.adjust_brightness, F.adjust_contrast, F.adjust_saturation, F.adjust_hue)
    for kind, p in pixel:
        if kind == "jitter":
            for k in p["order"]:
                img = adjust[k](img, p[("brightness", "contrast", "saturation", "hue")[k]])
        else:
            img = _apply_op(img, p["op"], torchvision_magnitude(p["op"], p["magnitude"]),
                            InterpolationMode.NEAREST, None)
    for op in tail:
        img = op(img)
    return img


def served_by_loader(ds, batch: int):
    """Batches of fastdata.loader(the folder, transform=imagenet_eval(224)), as the `measure` loop
    takes them: (images, None) a batch, with the geometry planned for them."""
    import fastdata
    import fastdata.transforms as fd

    loader = fastdata.loader(ds.root, batch_size=batch, transform=fd.imagenet_eval(SIZE), device="cpu",
                             num_workers=0)
    assert [p for p, _ in ds.samples] == list(loader.samples.paths), "the loader lists the folder otherwise"
    return iter(loader)


def measure(root: Path, config: dict, batch: int) -> dict:
    from PIL import Image
    from torchvision.datasets import ImageFolder
    from torchvision.datasets.folder import pil_loader
    from torchvision.transforms import InterpolationMode

    import fastdata.transforms as fd
    from fastdata.run._layout import Finish
    from fastdata.run._torchvision import NativeFolder, lower
    from fastdata.transforms.plan import plan_geometry, plan_pixels

    ds = ImageFolder(str(root), config["transform"])
    own = served_by_loader(ds, batch) if config.get("image_mode") else None
    lowering, why = lower(ds)
    if lowering is None:
        raise SystemExit(f"{config['name']}: not lowered ({why})")
    nf = NativeFolder(ds, lowering)
    finish = Finish(lowering, slots=2, pin=False, forks=False)
    interp = InterpolationMode(lowering.resample)
    diffs, shrinks = [], []
    for b, start in enumerate(range(0, len(ds), batch)):
        indices = list(range(start, min(start + batch, len(ds))))
        torch.manual_seed(1000 + b)
        if own is not None:
            images = next(own)[0].contiguous()
        else:
            images, _ = finish(nf.__getitems__(indices).collate_into(None))
            images = images.clone()
        places = np.arange(len(indices), dtype=np.int64)  # (fastdata run keys a sample's draws by its place in the batch)
        paths = [ds.samples[i][0] for i in indices]
        sizes = np.array([Image.open(p).size for p in paths])
        seed = nf.decoder.seed
        g = plan_geometry(nf.decoder.geometry, seed, 0, places, sizes[:, 0], sizes[:, 1])
        plans = plan_pixels(nf.decoder.pixel_ops, seed, 0, places) if nf.decoder.pixel_ops else []
        want = []
        for k, path in enumerate(paths):
            img = pil_loader(path)
            if config["tail"] is None:  # deterministic: torchvision's own transform
                want.append(ds.transform(img))
                continue
            x0, y0, x1, y1 = (int(v) for v in g.boxes[k])
            pixel = [("jitter" if isinstance(op, fd.ColorJitter) else "trivial", plan[k])
                     for op, plan in zip(nf.decoder.pixel_ops, plans)]
            want.append(reference(img, (x0, y0, x1 - x0, y1 - y0), bool(g.flips[k]), pixel, interp,
                                  config.get("tensor", False), config["tail"]))
        want = torch.stack(want)
        diffs.append((to_levels(images, config["levels"]) - to_levels(want, config["levels"])).abs())
        box_w, box_h = g.boxes[:, 2] - g.boxes[:, 0], g.boxes[:, 3] - g.boxes[:, 1]
        shrinks.append(np.minimum(box_w / g.sizes[:, 0], box_h / g.sizes[:, 1]))
    d = torch.cat(diffs)
    shrink = np.concatenate(shrinks)
    reduced = torch.from_numpy(shrink >= 2)
    per_sample = d.flatten(1).mean(1)
    return {
        "op": config["op"], "interpolation": config["interp"], "samples": len(d), "values": d.numel(),
        "mean_abs": float(d.mean()), "max_abs": float(d.max()),
        "share_over_2": float((d > 2).double().mean()),
        "interior_max_abs": float(d[:, :, 2:-2, 2:-2].max()),
        "interior_mean_abs": float(d[:, :, 2:-2, 2:-2].mean()),
        "interior_max_abs_box_under_2x": float(d[~reduced][:, :, 2:-2, 2:-2].max()) if (~reduced).any() else None,
        "max_abs_box_under_2x": float(d[~reduced].max()) if (~reduced).any() else None,
        "samples_box_2x": int(reduced.sum()),
        "mean_abs_box_under_2x": float(per_sample[~reduced].mean()) if (~reduced).any() else None,
        "mean_abs_box_2x": float(per_sample[reduced].mean()) if reduced.any() else None,
        "samples_identical": int((d.flatten(1).amax(1) == 0).sum()),
        "worst_samples_mean_abs": sorted((float(x) for x in per_sample), reverse=True)[:5],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=200)
    ap.add_argument("--classes", type=int, default=4)
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--root", default=str(HERE / "data" / "imagenet-like-200"))
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import PIL
    import torchvision

    from fastdata.synthetic import make_imagenet_like

    root = make_imagenet_like(args.root, args.images, args.classes)
    results = {}
    for config in configurations():
        results[config["name"]] = measure(root, config, args.batch)
        print(f"  {config['name']}: done", file=sys.stderr)

    def num(x, fmt):
        return "-" if x is None else format(x, fmt)

    print(f"\n{args.images} images (synthetic ImageNet-like), torch {torch.__version__}, torchvision "
          f"{torchvision.__version__}, Pillow {PIL.__version__}; served vs torchvision, uint8 levels\n")
    print("| configuration (op, interpolation) | mean abs | max abs | share > 2 levels | max abs, box < 2x "
          "(interior) | mean abs, box < 2x | mean abs, box >= 2x (samples) |")
    print("|---|---|---|---|---|---|---|")
    for name, r in results.items():
        under = f"{num(r['max_abs_box_under_2x'], '.0f')} ({num(r['interior_max_abs_box_under_2x'], '.0f')})"
        print(f"| {name}: {r['op']} ({r['interpolation']}) | {r['mean_abs']:.3f} | {r['max_abs']:.0f} | "
              f"{100 * r['share_over_2']:.2f}% | {under} | {num(r['mean_abs_box_under_2x'], '.3f')} | "
              f"{num(r['mean_abs_box_2x'], '.3f')} ({r['samples_box_2x']}) |")
    _common.write("torchvision_pixels", {
        "images": args.images, "classes": args.classes, "batch": args.batch, "size": SIZE,
        "torchvision": torchvision.__version__, "pillow": PIL.__version__,
        "levels": "uint8 levels; a normalized output taken back as (x * std + mean) * 255",
        "interior": "away from a 2-pixel border of the 224x224 output",
        "box_2x": "samples whose box is at least twice the output on both axes: a JPEG decoded at a reduced DCT scale",
        "configurations": results}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
