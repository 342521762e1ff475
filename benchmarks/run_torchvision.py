"""An unchanged torchvision training script, plain and under `fastdata run`, paired.

The script is `_imagenet_example.py`: the PyTorch ImageNet example's data pipeline (ImageFolder,
RandomResizedCrop 224, flip, ToTensor, Normalize, shuffle, batch 256, pin_memory, fresh workers
each epoch, `--workers` of them: one a core here) on the synthetic ImageNet-like set
(`fastdata.synthetic`, files in the page cache). Candidates, each in its own process, in ABBA
rounds so drift on a shared machine hits both alike:

- plain: `python _imagenet_example.py` with the Pillow this Python has (a user's: stock Pillow),
- fastdata run: `fastdata run -- python _imagenet_example.py` (the loader served natively),
- with `--simd-pil DIR`: plain again with Pillow-SIMD first on PYTHONPATH (DIR holds its `PIL`).

With `--split` the script trains on a `random_split` of the folder (90%), a tutorial's split: a
`Subset` of the ImageFolder, which `fastdata run` serves natively too (run_torchvision_split.json);
with `--join` on two ImageFolders joined, `train + extra` (the folder's even and odd files), a
`ConcatDataset`, served natively too (run_torchvision_join.json); with `--wrap` on the 90% split
given its transform by the script's own Dataset class, as scripts give a split's parts their own
transforms, served natively too (run_torchvision_wrap.json); with `--files` on the folder's files
listed in a CSV file, each opened by the script's own Dataset class with Pillow, as scripts with a
CSV of their images write it, served natively too (run_torchvision_files.json); with `--files read`
each read with torchvision.io's read_image, as the PyTorch tutorial's CustomImageDataset reads them,
the transform v2's on the tensor (run_torchvision_files_read.json); with `--files named`, each
named by an f-string of its stem, opened as torchvision's pil_loader opens it and its class's name
mapped to its number by a dict (run_torchvision_files_named.json); with `--files derived`, globbed
in one folder, each file named by its class first, the class derived from the name by the script's
own line (run_torchvision_files_derived.json); with `--files course`, by a PyTorch course's
ImageFolderCustom (a method of its own opens each file, the class its folder's, the transform in the
return: run_torchvision_files_course.json); with `--files food101`, by
torchvision's own Food101 dataset, the files laid out as its download lays them out
(run_torchvision_files_food101.json); with `--files pets`, by torchvision's OxfordIIITPet so
(run_torchvision_files_pets.json); with `--files places365`, by torchvision's Places365 so
(run_torchvision_files_places365.json); with `--files caltech101`, by torchvision's Caltech101 so (which
opens its files as they are: scripts give it `--recipe rgb`'s Lambda first; run_torchvision_files_caltech101_rgb.json).
With `--recipe ta_wide`, `ra` or `augmix` its transform is torchvision's references' training
preset with that auto-augment policy (bilinear) and RandomErasing(0.1) (..._ta_wide.json, ...),
with `--recipe rotate` the example's with RandomRotation(15) after the flip (..._rotate.json),
with `--recipe rgb` with `Lambda(lambda x: x.convert("RGB"))` first (..._rgb.json),
with `--recipe affine` with RandomAffine(10, translate=(0.1, 0.1), scale=(0.9, 1.1)) there (..._affine.json),
with `--recipe crop` with Resize(256) and RandomCrop(224) for its RandomResizedCrop (..._crop.json),
with `--recipe eval` the example's validation loader (Resize(256), CenterCrop(224), not shuffled; ..._eval.json),
with `--recipe tiny` a Tiny ImageNet script's (the set's images made 64x64 JPEGs: RandomCrop(64, padding=4), flip,
ToTensor, Normalize; ..._tiny.json; `--recipe tiny_pad` writes the crop Pad(4), RandomCrop(64), ..._tiny_pad.json;
`--padding-mode reflect` pads as NumPy reflects, ..._tiny_reflect.json),
with `--recipe simclr` SimCLR's ImageNet augmentation, one view: after the crop and flip,
RandomApply([ColorJitter(0.8, 0.8, 0.8, 0.2)], p=0.8), RandomGrayscale(0.2) and
RandomApply([GaussianBlur(23, (0.1, 2.0))], p=0.5) (..._simclr.json),
with `--recipe moco` MoCo v1's (RandomResizedCrop(224, scale=(0.2, 1)), RandomGrayscale(0.2),
ColorJitter(0.4, 0.4, 0.4, 0.4), flip, ToTensor, Normalize) in MoCo's TwoCropsTransform, two
views of each image (..._moco.json; images/s counts images, not views), with `--recipe moco_v2`
MoCo v2's (--aug-plus: RandomApply of ColorJitter(0.4, 0.4, 0.4, 0.1), RandomGrayscale, RandomApply
of MoCo's own GaussianBlur class, then the flip) in it (..._moco_v2.json), with `--recipe dino` DINO's
multi-crop (..._dino.json), with `--recipe deit` DeiT's main.py transform, timm's `create_transform`
(bicubic crop, flip, timm's RandAugment, ToTensor, Normalize, timm's RandomErasing; ..._deit.json),
with `--recipe timm_train` timm's train.py data path with its defaults (timm's dataset and loader:
a filter drawn per image, ColorJitter, fast_collate, persistent workers, its prefetcher;
..._timm_train.json), with `--recipe timm_deit` that path with DeiT's augmentation flags (timm's
RandAugment, its FastCollateMixup collate_fn, RandomErasing in its prefetcher; ..._timm_deit.json);
with `--backend tensor` (ta_wide, ra, augmix) the preset's tensor backend, PILToTensor first (..._tensor.json);
with `--mixup` the loader's collate_fn is the references' MixUp/CutMix one (`--use-v2`:
`mixup_cutmix(*default_collate(batch))`, a v2 RandomChoice of MixUp and CutMix; `..._mixup.json`),
which `fastdata run` collates and mixes natively.
With `--ra-sampler` its sampler is the references' repeated-augmentation one, a sampler of the
script's (`..._ra_sampler.json`).

Run it with a user's environment: the registry's torch and torchvision and fastdata installed
(.ci/run makes one). Prints each side's images/s (epoch 1, with the workers' start and first
sight of every file; epochs 2+) and the ratios with a bootstrap interval; writes JSON.

    OMP_NUM_THREADS=1 python benchmarks/run_torchvision.py [--images 2000] [--rounds 4] [--epochs 3]
                                          [--split] [--join] [--wrap] [--files [{pil,...,places365,caltech101}]]
                                          [--recipe {imagenet,ta_wide,ra,augmix,rotate,affine,crop,eval,tiny,tiny_pad,
                                                     simclr,moco,moco_v2,dino,deit,timm_train,timm_deit,rgb}]
                                          [--backend {pil,tensor}] [--padding-mode MODE] [--mixup]
                                          [--ra-sampler] [--json PATH]
"""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

import _common

HERE = Path(__file__).resolve().parent


def _tiny(root: Path) -> Path:
    """The set's images as 64x64 JPEGs (Tiny ImageNet's size) in a folder beside it, made once."""
    from PIL import Image

    tiny = root.with_name(root.name + "-64")
    for path in sorted(root.glob("*/*.JPEG")):
        out = tiny / path.parent.name / path.name
        if not out.exists():
            out.parent.mkdir(parents=True, exist_ok=True)
            Image.open(path).convert("RGB").resize((64, 64), Image.Resampling.BICUBIC).save(out, quality=90)
    return tiny


# The --files that torchvision's own dataset classes read, by their class
TORCHVISIONS = {"food101": "Food101", "pets": "OxfordIIITPet", "places365": "Places365", "caltech101": "Caltech101"}


def main() -> int:
    ap = _common.rounds_parser(__doc__, rounds=4)
    ap.set_defaults(epochs=3)
    ap.add_argument("--workers", type=int, default=_common.WORKERS)
    ap.add_argument("--arch", default="none", help="the script's model (resnet18 on a GPU); none: the copy only")
    ap.add_argument("--simd-pil", default=None, metavar="DIR", help="a folder whose PIL is Pillow-SIMD")
    ap.add_argument("--split", action="store_true", help="train on a random_split of the folder (90%%)")
    ap.add_argument("--join", action="store_true", help="train on two ImageFolders joined (its even and odd files)")
    ap.add_argument("--wrap", action="store_true", help="train on the 90%% split given its transform by the script's "
                    "own Dataset class")
    ap.add_argument("--files", nargs="?", const="pil",
                    choices=["pil", "read", "named", "derived", "course", "food101", "pets", "places365", "caltech101"],
                    help="train on the folder's files listed in a CSV file, read by the script's own Dataset class "
                    "(with Pillow; read: with torchvision.io's read_image, the transform v2's on the tensor; "
                    "named: by an f-string of its stem, opened within `with open`, its class's name mapped by a dict; "
                    "derived: globbed in one folder, the class derived from each file's name by the script's line; "
                    "course: globbed by a PyTorch course's ImageFolderCustom); "
                    "food101, pets, places365, caltech101: laid out as Food101's (OxfordIIITPet's, Places365's, "
                    "Caltech101's) download, read by torchvision's class)")
    ap.add_argument("--recipe", choices=["imagenet", "ta_wide", "ra", "augmix", "rotate", "affine", "crop", "eval",
                                         "tiny", "tiny_pad", "simclr", "moco", "moco_v2", "dino", "deit", "timm_train",
                                         "timm_deit", "rgb"],
                    default="imagenet",
                    help="the script's transform: the ImageNet example's, or a torchvision references' recipe")
    ap.add_argument("--mixup", action="store_true", help="the references' MixUp/CutMix collate_fn")
    ap.add_argument("--ra-sampler", action="store_true", help="the references' repeated-augmentation sampler")
    ap.add_argument("--padding-mode", choices=["constant", "edge", "reflect", "symmetric"], default="constant",
                    help="the tiny recipes' padding_mode")
    ap.add_argument("--backend", choices=["pil", "tensor"], default="pil",
                    help="the references' preset backend (ta_wide, ra, augmix): tensor puts PILToTensor first")
    args = ap.parse_args()
    if args.backend == "tensor" and args.recipe not in ("ta_wide", "ra", "augmix"):
        ap.error("--backend tensor is the references' preset's: --recipe ta_wide, ra or augmix")
    if args.padding_mode != "constant" and not args.recipe.startswith("tiny"):
        ap.error("--padding-mode is the tiny recipes': --recipe tiny or tiny_pad")
    if args.epochs < 2:
        ap.error("--epochs should be at least 2: epoch 1 and the epochs after it are reported apart")
    import PIL
    import torchvision

    from fastdata.synthetic import make_imagenet_like

    root = make_imagenet_like(args.root, args.images, 10)
    if args.recipe.startswith("tiny"):
        root = _tiny(root)
    script = [sys.executable, str(HERE / "_imagenet_example.py"), str(root), "--epochs", str(args.epochs),
              "--workers", str(args.workers), "--arch", args.arch, "--recipe", args.recipe,
              *(["--split"] if args.split else []), *(["--join"] if args.join else []),
              *(["--wrap"] if args.wrap else []), *(["--files", args.files] if args.files else []),
              *(["--mixup"] if args.mixup else []),
              *(["--ra-sampler"] if args.ra_sampler else []), "--backend", args.backend,
              "--padding-mode", args.padding_mode]
    fastdata_cli = str(Path(sys.executable).with_name("fastdata"))
    commands = {"plain": script, "fastdata run": [fastdata_cli, "run", "--", *script]}
    if args.simd_pil:
        commands["plain, Pillow-SIMD"] = ["env", f"PYTHONPATH={args.simd_pil}", *script]
    _, reports = _common.process_rounds(commands, args.rounds)
    sides = _common.epoch_sides(reports)
    ratios = {}
    for base in [n for n in commands if n != "fastdata run"]:
        for part in ("epoch_1", "epochs_2_on"):
            fast, slow = sides["fastdata run"][part], sides[base][part]
            lo, hi = _common.ratio_ci([1 / x for x in slow], [1 / x for x in fast])
            ratios[f"{part} vs {base}"] = {"ratio": statistics.median(fast) / statistics.median(slow),
                                            "ci95": [lo, hi]}
    fresh = "persistent workers" if args.recipe.startswith("timm_") else "fresh each epoch"
    print(f"\n{args.images} images, batch 256, {args.workers} workers ({fresh}), {args.rounds} rounds ABBA, "
          f"Pillow {PIL.__version__}, torchvision {torchvision.__version__}, arch {args.arch}"
          + (", a random_split's 90%" if args.split else "") + (", two folders joined" if args.join else "")
          + (", the 90% split in the script's wrapper" if args.wrap else "")
          + (f", torchvision's {TORCHVISIONS[args.files]} over its files" if args.files in TORCHVISIONS else
             ", its files globbed in one folder, the class derived from each name" if args.files == "derived" else
             ", its files globbed by the course's ImageFolderCustom" if args.files == "course" else
             f", its files listed in a CSV file, read by the script's Dataset ({args.files})" if args.files else "")
          + f", recipe {args.recipe}"
          + (", MixUp/CutMix collate_fn" if args.mixup else "") + (", RASampler" if args.ra_sampler else "")
          + (", the tensor backend" if args.backend == "tensor" else "")
          + (f", padding_mode {args.padding_mode}" if args.padding_mode != "constant" else ""))
    for name, s in sides.items():
        print(f"  {name:<20} epoch 1 {s['epoch_1_median']:7.0f} img/s   epochs 2+ {s['epochs_2_on_median']:7.0f} img/s")
    for name, r in ratios.items():
        print(f"  fastdata run / {name:<34} {r['ratio']:.2f}x  (95% CI {r['ci95'][0]:.2f}-{r['ci95'][1]:.2f})")
    stem = "run_torchvision" + ("_split" if args.split else "") + ("_join" if args.join else "") \
        + ("_wrap" if args.wrap else "") \
        + ("_files" if args.files == "pil" else f"_files_{args.files}" if args.files else "") \
        + ("" if args.recipe == "imagenet" else f"_{args.recipe}") + ("_mixup" if args.mixup else "") \
        + ("_ra_sampler" if args.ra_sampler else "") + ("_tensor" if args.backend == "tensor" else "") \
        + ("" if args.padding_mode == "constant" else f"_{args.padding_mode}")
    _common.write(stem, {
        "images": args.images, "batch": 256, "workers": args.workers, "epochs": args.epochs, "rounds": args.rounds,
        "arch": args.arch, "split": args.split, "join": args.join, "wrap": args.wrap, "files": args.files,
        "recipe": args.recipe,
        "mixup": args.mixup,
        "ra_sampler": args.ra_sampler, "backend": args.backend, "padding_mode": args.padding_mode,
        "pillow": PIL.__version__,
        "torchvision": torchvision.__version__,
        "regime": ("persistent workers (timm's create_loader default)" if args.recipe.startswith("timm_") else
                   "fresh workers each epoch (the script's DataLoader default)") + ", files in the page cache",
        "sides": sides, "ratios": ratios}, args.json)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
