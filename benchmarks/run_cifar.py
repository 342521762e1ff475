"""An unchanged CIFAR-10, MNIST, FashionMNIST, STL10 or SVHN training script, plain and under `fastdata run`, paired.

The script is `_cifar_example.py`: the CIFAR-10 recipe (RandomCrop(32, padding=4), flip,
ToTensor, Normalize; batch 128, shuffle, 2 workers fresh each epoch), weiaicunzai's CIFAR-100
one (the same with RandomRotation(15); 4 workers), pytorch/examples' MNIST (ToTensor,
Normalize; batch 64, no workers, as its CPU arguments) or the PyTorch tutorial "Training a
Classifier" on CIFAR-10 (ToTensor, Normalize; batch 4, shuffle, 2 workers, and its training
step: there the main process's cost per batch from the workers is most of the loader's) or the
Lightning tutorial's SimCLR on STL10's unlabeled split (two views of each image, each through
flip, RandomResizedCrop(96), RandomApply(ColorJitter), RandomGrayscale, GaussianBlur(9), ToTensor,
Normalize; batch 256, a worker a core) or an SVHN recipe (RandomCrop(32, padding=4), ToTensor,
Normalize; batch 128, 2 workers fresh each epoch) or FashionMNIST made RGB for a 3-channel
network (Grayscale(num_output_channels=3), ToTensor, Normalize; batch 256, 2 workers fresh each
epoch) or CIFAR-10 upscaled for an ImageNet model (Resize(224), flip, ToTensor, Normalize; batch 64,
2 workers fresh each epoch; or in torchvision's v2 style: ToImage, RandomResizedCrop(224) on the
tensor, flip, ToDtype, Normalize), on synthetic files written here in the
datasets' own formats (CIFAR's pickled batches, MNIST's processed tensors, STL10's binary, SVHN's
MATLAB file, which needs scipy as SVHN does; the datasets hold them in memory). `fastdata run`
serves them natively (`fastdata.run._arrays`): the crop and flip on a batch's rows at once
instead of a PIL image per sample. Candidates run each in its own process, in ABBA rounds so
drift on a shared machine hits both alike.

Run it with a user's environment: the registry's torch and torchvision and fastdata installed
(.ci/run makes one). Prints each side's images/s (epoch 1; epochs 2+) and the ratios with a
bootstrap interval; writes JSON (run_cifar10.json, run_cifar100.json, run_mnist.json,
run_tutorial.json, run_stl10.json, run_svhn.json, run_fashion_rgb.json, run_cifar10_224.json,
run_cifar10_v2.json).

    OMP_NUM_THREADS=1 python benchmarks/run_cifar.py [--dataset {cifar10,...,cifar10_224,cifar10_v2}]
                                                     [--images 50000]
                                                     [--rounds 3] [--epochs 3] [--workers N] [--json PATH]
"""

from __future__ import annotations

import os
import pickle
import statistics
from functools import partial
import sys
from pathlib import Path

import _common
import numpy as np

HERE = Path(__file__).resolve().parent


def write_cifar(root: Path, images: int) -> None:
    """CIFAR-10's files (`cifar-10-batches-py`: 5 training batches, a test batch, the meta)."""
    d = root / "cifar-10-batches-py"
    if (d / "batches.meta").exists() and (d / f"{images}.made").exists():
        return
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    per = -(-images // 5)
    for k, name in enumerate([f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]):
        n = per if k < 5 else min(per, 10000)
        data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        with open(d / name, "wb") as f:
            pickle.dump({"data": data, "labels": rng.integers(0, 10, n).tolist()}, f)
    with open(d / "batches.meta", "wb") as f:
        pickle.dump({"label_names": [f"class{i}" for i in range(10)]}, f)
    (d / f"{images}.made").touch()


def write_cifar100(root: Path, images: int) -> None:
    """CIFAR-100's files (`cifar-100-python`: train, test, meta)."""
    d = root / "cifar-100-python"
    if (d / f"{images}.made").exists():
        return
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for name, n in (("train", images), ("test", min(images, 10000))):
        labels = rng.integers(0, 100, n).tolist()
        with open(d / name, "wb") as f:
            pickle.dump({"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), "fine_labels": labels,
                         "coarse_labels": [x // 5 for x in labels]}, f)
    with open(d / "meta", "wb") as f:
        pickle.dump({"fine_label_names": [f"class{i}" for i in range(100)]}, f)
    (d / f"{images}.made").touch()


def write_mnist(root: Path, images: int, name: str = "MNIST") -> None:
    """MNIST's processed tensors (`MNIST/processed/training.pt`, `test.pt`), which it loads as they are
    (FashionMNIST's so under `name`)."""
    import torch

    d = root / name / "processed"
    if (d / f"{images}.made").exists():
        return
    d.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    for name, n in (("training.pt", images), ("test.pt", min(images, 10000))):
        torch.save((torch.randint(0, 256, (n, 28, 28), dtype=torch.uint8, generator=g),
                    torch.randint(0, 10, (n,), generator=g)), d / name)
    (d / f"{images}.made").touch()


def write_stl10(root: Path, images: int) -> None:
    """STL10's unlabeled split (`stl10_binary/unlabeled_X.bin`: 3x96x96 uint8 images)."""
    d = root / "stl10_binary"
    if (d / f"{images}.made").exists():
        return
    d.mkdir(parents=True, exist_ok=True)
    np.random.default_rng(0).integers(0, 256, (images, 3, 96, 96), dtype=np.uint8).tofile(d / "unlabeled_X.bin")
    (d / f"{images}.made").touch()


def write_svhn(root: Path, images: int) -> None:
    """SVHN's training split (`train_32x32.mat`: X of 32x32x3xN uint8, y of N labels 1-10, 10 for 0)."""
    import scipy.io

    if (root / f"svhn-{images}.made").exists():
        return
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    scipy.io.savemat(root / "train_32x32.mat", {"X": rng.integers(0, 256, (32, 32, 3, images), dtype=np.uint8),
                                                "y": rng.integers(1, 11, (images, 1), dtype=np.uint8)})
    (root / f"svhn-{images}.made").touch()


def main() -> int:
    ap = _common.rounds_parser(__doc__, rounds=3)
    ap.set_defaults(epochs=3, images=50000, root=str(_common.RESULTS.parent / "data" / "small-images"))
    ap.add_argument("--dataset", choices=["cifar10", "cifar100", "mnist", "tutorial", "stl10", "svhn", "fashion_rgb",
                                          "cifar10_224", "cifar10_v2"],
                    default="cifar10")
    ap.add_argument("--workers", type=int, default=None,
                    help="the recipe's: 2 for CIFAR-10, the tutorial, SVHN and FashionMNIST, 4 for CIFAR-100, 0 for "
                         "MNIST, the cores for STL10")
    args = ap.parse_args()
    if args.epochs < 2:
        ap.error("--epochs should be at least 2: epoch 1 and the epochs after it are reported apart")
    import torch
    import torchvision

    root = Path(args.root)
    {"cifar10": write_cifar, "cifar100": write_cifar100, "mnist": write_mnist,
     "tutorial": write_cifar, "stl10": write_stl10, "svhn": write_svhn,
     "fashion_rgb": partial(write_mnist, name="FashionMNIST"),
     "cifar10_224": write_cifar, "cifar10_v2": write_cifar}[args.dataset](root, args.images)
    workers = args.workers if args.workers is not None else {"cifar10": 2, "cifar100": 4, "mnist": 0, "tutorial": 2,
                                                             "stl10": os.cpu_count(), "svhn": 2,
                                                             "fashion_rgb": 2, "cifar10_224": 2,
                                                             "cifar10_v2": 2}[args.dataset]
    script = [sys.executable, str(HERE / "_cifar_example.py"), str(root), "--dataset", args.dataset,
              "--epochs", str(args.epochs), "--workers", str(workers)]
    fastdata_cli = str(Path(sys.executable).with_name("fastdata"))
    commands = {"plain": script, "fastdata run": [fastdata_cli, "run", "--", *script]}
    _, reports = _common.process_rounds(commands, args.rounds)
    sides = _common.epoch_sides(reports)
    ratios = {}
    for part in ("epoch_1", "epochs_2_on"):
        fast, slow = sides["fastdata run"][part], sides["plain"][part]
        lo, hi = _common.ratio_ci([1 / x for x in slow], [1 / x for x in fast])
        ratios[part] = {"ratio": statistics.median(fast) / statistics.median(slow), "ci95": [lo, hi]}
    batch = {"mnist": 64, "tutorial": 4, "stl10": 256, "fashion_rgb": 256, "cifar10_224": 64,
             "cifar10_v2": 64}.get(args.dataset, 128)
    print(f"\n{args.dataset}, {args.images} images in memory, batch {batch}, {workers} workers"
          f"{' (fresh each epoch)' if workers else ''}, {args.rounds} rounds ABBA, torch {torch.__version__}, "
          f"torchvision {torchvision.__version__}")
    for name, s in sides.items():
        print(f"  {name:<14} epoch 1 {s['epoch_1_median']:7.0f} img/s   epochs 2+ {s['epochs_2_on_median']:7.0f} img/s")
    for part, r in ratios.items():
        print(f"  fastdata run / plain, {part:<12} {r['ratio']:.2f}x  (95% CI {r['ci95'][0]:.2f}-{r['ci95'][1]:.2f})")
    _common.write(f"run_{args.dataset}", {
        "dataset": args.dataset, "images": args.images, "batch": batch, "workers": workers, "epochs": args.epochs,
        "rounds": args.rounds, "torch": torch.__version__, "torchvision": torchvision.__version__,
        "regime": "the dataset in memory (as torchvision loads it), " + (
            "fresh workers each epoch (the script's)" if workers else "no workers (the script's)") + (
            "; the step: the tutorial's training step on the CPU" if args.dataset == "tutorial" else
            "; the step: the copy to the device" + ("; two views of each image, images/s counts images"
                                                    if args.dataset == "stl10" else "")),
        "sides": sides, "ratios": ratios}, args.json)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
