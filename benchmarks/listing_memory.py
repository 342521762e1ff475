"""Memory at ImageNet scale: what a listing of 1.28M files costs each worker, fastdata against
DataLoader + an ImageFolder-like dataset, and `fastdata run` serving torchvision's ImageFolder.

A listing held as Python objects (torchvision's ImageFolder keeps a (path, label) tuple a
sample) is copied page by page into every forked worker as the worker reads it: each read
writes the objects' reference counts (PyTorch's issue 13246). fastdata keeps its paths as one
buffer (`fastdata.sources.Names`), which reads do not write; `fastdata run`'s workers read a
natively served ImageFolder's paths from such a listing too (`NativeFolder.list_for_workers`).
The "run" side needs torchvision (run it in a virtualenv that has it); without it, it is left out.

The folder: --images hard links (default ImageNet's 1,281,167) to 64x48 JPEGs, one a class, laid out
as ImageNet's train folder (1,000 classes, root/nXXXXXXXX/nXXXXXXXX_NNNNNNN.JPEG), so the
listing is ImageNet's size while the decode costs little. Each side runs in a process of its
own, --workers workers, shuffled batches of 256 resized to 32x32: after the first batch and
after --batches batches (by default 500, a tenth of an epoch: a shuffled read of a tenth of the
samples touches nearly every page of the listing), it records the Pss_Anon of the training
process and of each worker (smaps_rollup: a page the processes share counts a share in each).
The figure: how much each worker's Pss_Anon grew between the two, and the whole job's at the
end; the ratio is DataLoader's growth over fastdata's (floored at 1 MB).

    OMP_NUM_THREADS=1 python benchmarks/listing_memory.py [--images 1281167] [--batches 500] [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _common

SIDES = ("fastdata", "dataloader", "run")


def make_folder(root: Path, images: int) -> None:
    """ImageNet's train layout of `images` hard links to small JPEGs, one a class, its color the class's."""
    from PIL import Image

    classes = 1000
    for c in range(classes):
        source = root / f"source-{c}.jpg"  # one a class: a file takes at most 65,000 links (ext4)
        Image.new("RGB", (64, 48), (25 * (c % 10), 100, 200 - 15 * (c % 10))).save(source, quality=90)
        folder = root / "train" / f"n{c:08d}"
        folder.mkdir(parents=True, exist_ok=True)
        for j in range(images // classes + (c < images % classes)):
            os.link(source, folder / f"n{c:08d}_{j:07d}.JPEG")


def pss_anon_mb(pid: int) -> float:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss_Anon:"):
                return int(line.split()[1]) / 1024
    return 0.0


def workers_of(pid: int) -> list[int]:
    kids = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            kids += [int(k) for k in f.read().split()]
    return sorted(kids)


def child(side: str, root: str, batches: int, workers: int) -> None:
    import torch

    t = time.perf_counter()
    if side == "fastdata":
        import fastdata
        from fastdata import transforms as T

        loader = fastdata.loader(root, backend="pil", batch_size=256, shuffle=True, num_workers=workers,
                                 transform=T.Compose([T.Resize(32), T.CenterCrop(32)]))
        classes = loader.samples.classes
    elif side == "run":  # the hook fastdata run installs, on torchvision's own ImageFolder
        import torchvision
        import torchvision.transforms as TV

        from fastdata.run._hook import install

        install()
        dataset = torchvision.datasets.ImageFolder(root, TV.Compose([TV.Resize((32, 32)), TV.PILToTensor()]))
        classes = dataset.classes
        loader = torch.utils.data.DataLoader(dataset, batch_size=256, shuffle=True, num_workers=workers)
        assert type(loader._loader.dataset).__name__ == "NativeFolder", "not served natively"
    else:
        from PIL import Image

        classes = sorted(os.listdir(root))

        class Folder(torch.utils.data.Dataset):
            """ImageFolder's listing and __getitem__: a (path, label) tuple a sample."""

            def __init__(self) -> None:
                self.samples = [(os.path.join(root, c, name), label) for label, c in enumerate(classes)
                                for name in sorted(os.listdir(os.path.join(root, c)))]

            def __len__(self) -> int:
                return len(self.samples)

            def __getitem__(self, i: int):
                path, label = self.samples[i]
                with Image.open(path) as im:
                    image = im.convert("RGB").resize((32, 32))
                return torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8).view(32, 32, 3), label

        loader = torch.utils.data.DataLoader(Folder(), batch_size=256, shuffle=True, num_workers=workers)
    listed = time.perf_counter() - t
    it = iter(loader)
    me = os.getpid()
    points = []
    for k in range(batches):
        images, labels = next(it)
        # each image's red names its class (c % 10): the listing is read right
        want = torch.tensor([25 * (int(label) % 10) for label in labels], dtype=torch.float32)
        assert (images.float().flatten(1)[:, 0] - want).abs().max() < 8, "an image does not match its label"
        if k in (0, batches - 1):
            points.append({"main": pss_anon_mb(me), "workers": [pss_anon_mb(w) for w in workers_of(me)]})
    first, last = points
    print(json.dumps({"listed_s": listed, "samples": len(loader.dataset) if side != "fastdata" else len(loader.samples),
                      "classes": len(classes), "first": first, "last": last}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=1_281_167)
    ap.add_argument("--batches", type=int, default=500)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--root", default=None, help="where the folder is made (default: a temporary folder)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.root, args.batches, args.workers)
        return
    with tempfile.TemporaryDirectory(prefix="fastdata-listing-", dir=args.root) as tmp:
        root = Path(tmp)
        t = time.perf_counter()
        make_folder(root, args.images)
        print(f"{args.images:,} files made in {time.perf_counter() - t:.0f} s", file=sys.stderr)
        results = {}
        for side in SIDES:
            if side == "run" and subprocess.run([sys.executable, "-c", "import torchvision"]).returncode:
                print("run: left out (no torchvision in this Python)", file=sys.stderr)
                continue
            out = subprocess.run([sys.executable, __file__, "--child", side, "--root", str(root / "train"),
                                  "--batches", str(args.batches), "--workers", str(args.workers)],
                                 capture_output=True, text=True)
            if out.returncode != 0:
                raise SystemExit(f"{side} failed: {out.stderr.strip()[-2000:]}")
            results[side] = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"{args.images:,} files, {args.workers} workers, {args.batches} shuffled batches of 256; Pss_Anon, MB")
    print(f"{'':<12}{'listed in':>10}{'worker, batch 1':>17}{f'batch {args.batches}':>12}{'grew':>8}"
          f"{'job at the end':>16}")
    for side, r in results.items():
        r["worker_growth_mb"] = max(b - a for a, b in zip(r["first"]["workers"], r["last"]["workers"]))
        r["job_mb"] = r["last"]["main"] + sum(r["last"]["workers"])
        print(f"{side:<12}{r['listed_s']:>9.1f}s{max(r['first']['workers']):>17.0f}{max(r['last']['workers']):>12.0f}"
              f"{r['worker_growth_mb']:>8.0f}{r['job_mb']:>16.0f}")
    ratio = results["dataloader"]["worker_growth_mb"] / max(results["fastdata"]["worker_growth_mb"], 1.0)
    saved = results["dataloader"]["job_mb"] - results["fastdata"]["job_mb"]
    print(f"a worker's growth, DataLoader over fastdata: {ratio:.0f}x; the job's memory at the end: "
          f"{results['fastdata']['job_mb']:,.0f} MB with fastdata, {results['dataloader']['job_mb']:,.0f} with "
          f"DataLoader ({args.workers} workers)")
    if "run" in results:
        run = results["run"]
        print(f"fastdata run serving torchvision's ImageFolder: a worker grew {run['worker_growth_mb']:.0f} MB against "
              f"DataLoader's {results['dataloader']['worker_growth_mb']:.0f}; the job {run['job_mb']:,.0f} MB")
    _common.write("listing_memory", {"images": args.images, "batches": args.batches, "workers": args.workers,
                                     "sides": results, "growth_ratio": ratio, "job_mb_saved": saved,
                                     "figure": "Pss_Anon (MB) of each worker after the first batch and after "
                                               "--batches, and of the whole job at the end"}, args.json)


if __name__ == "__main__":
    main()
