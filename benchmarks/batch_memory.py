"""How much memory reading a batch of large files takes: the peak resident memory of a loader's
process over one epoch, its batches read in parts (`fastdata.image.read.MAX_PART_BYTES`, 1 GiB)
against read whole (the limit set past the batch), each in a fresh process, in the same run.

The files are --files sparse files of --mib MiB each (what a crafted dataset costs nothing to
hold on disk), which fail the image checks and are skipped (on_error="skip"), plus a few real
JPEGs; num_workers=0, batch --batch. Read whole, the batch's bytes are all held at once
(batch x size); in parts, at most the limit plus one file. Tests never assert on memory: this
prints the ratio and writes benchmarks/results/batch_memory.json.

With --served (in an environment with torchvision): an unchanged torchvision script under
`fastdata run` (ImageFolder, Resize and PILToTensor, a plain DataLoader), its folder served
natively; each file is a small JPEG followed by a hole to --mib MiB (a valid image: decoders
stop at its end), so no sample fails; the peak counts the script's process and its workers.

    OMP_NUM_THREADS=1 python benchmarks/batch_memory.py [--files 32] [--mib 96] [--batch 32] [--served]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import _common

_ONE = r"""
import json, resource, sys
import fastdata
from fastdata.image import read
root, budget, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if budget:
    read.MAX_PART_BYTES = budget
loader = fastdata.loader(root, batch_size=batch, on_error="skip", transform=fastdata.transforms.imagenet_eval(64))
images = sum(len(y) for _, y in loader)
print(json.dumps({"images": images, "skipped": loader.stats["skipped"],
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

_SERVED = r"""
import json, resource, sys
import torch, torchvision.transforms as T
from torchvision.datasets import ImageFolder
from fastdata.run import _torchvision
root, budget, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if budget:
    _torchvision.MAX_PART_BYTES = budget
loader = torch.utils.data.DataLoader(ImageFolder(root, T.Compose([T.Resize((64, 64)), T.PILToTensor()])),
                                     batch_size=batch)
images = sum(len(y) for _, y in loader)
peak = max(resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
print(json.dumps({"images": images, "skipped": 0, "peak_rss_mib": peak / 1024,
                  "native": type(getattr(loader, "_loader", loader).dataset).__name__ == "NativeFolder"}))
"""


def _make(root: Path, files: int, mib: int, served: bool) -> None:
    from PIL import Image

    (root / "a").mkdir(parents=True)
    for i in range(files):
        path = root / "a" / f"big{i:03d}.jpg"
        if served:
            Image.new("RGB", (96, 96), (i, 0, 0)).save(path)
        with open(path, "ab") as f:
            f.truncate(mib << 20)  # sparse: no disk blocks, all zeros when read
    for i in range(0 if served else 4):
        Image.new("RGB", (96, 96), (40 * i, 0, 0)).save(root / "a" / f"real{i}.jpg")


def _run(root: Path, budget: int, batch: int, served: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "script.py"
        script.write_text(_SERVED if served else _ONE)
        run = [sys.executable, "-m", "fastdata.cli", "run", "--"] if served else []
        done = subprocess.run([*run, sys.executable, str(script), str(root), str(budget), str(batch)],
                              capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise SystemExit(done.stderr)
    return json.loads(done.stdout.splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=32)
    ap.add_argument("--mib", type=int, default=96)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--served", action="store_true", help="a torchvision script under fastdata run")
    ap.add_argument("--json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "set"
        _make(root, args.files, args.mib, args.served)
        whole = _run(root, (args.files + 8) * args.mib << 20, args.batch, args.served)
        parts = _run(root, 0, args.batch, args.served)
    if args.served:
        same = whole["images"] == parts["images"] == args.files and whole["native"] and parts["native"]
    else:
        same = whole["images"] == parts["images"] == 4 and whole["skipped"] == parts["skipped"] == args.files
    assert same, (whole, parts)
    ratio = whole["peak_rss_mib"] / parts["peak_rss_mib"]
    what = "fastdata run, a torchvision folder served natively" if args.served else "fastdata.loader"
    print(f"{what}: {args.files} files of {args.mib} MiB, batch {args.batch}: peak memory read whole "
          f"{whole['peak_rss_mib']:,.0f} MiB, in parts {parts['peak_rss_mib']:,.0f} MiB ({ratio:.2f}x less)")
    _common.write("batch_memory_served" if args.served else "batch_memory",
                  {"files": args.files, "mib": args.mib, "batch": args.batch, "whole": whole, "parts": parts,
                   "ratio": ratio}, args.json)


if __name__ == "__main__":
    main()
