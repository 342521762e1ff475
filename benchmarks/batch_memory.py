"""How much memory reading a batch of large files takes: the peak resident memory of a loader's
process over one epoch, its batches read in parts (`fastdata.image.read.MAX_PART_BYTES`, 1 GiB)
against read whole (the limit set past the batch), each in a fresh process, in the same run.
Tests never assert on memory: this prints the ratio and writes benchmarks/results/batch_memory*.json.

--kind files (the default): --files sparse files of --mib MiB each (what a crafted dataset costs
nothing to hold on disk), which fail the image checks and are skipped (on_error="skip"), plus a
few real JPEGs; `fastdata.loader`, num_workers=0, batch --batch. Read whole, the batch's bytes
are all held at once (batch x size); in parts, at most the limit plus one file.

--kind shards: one WebDataset shard of --files samples, each a small JPEG member followed by a
hole to --mib MiB (a valid image: decoders stop at its end) and a label; the shard is sparse
too. A shuffle block is at most 256 MiB but for one batch of larger samples, which is then
read a part at a time.

--kind dali (where DALI is installed): --files JPEGs, each followed by a hole to --mib MiB (valid
images: decoders stop at their end), on the `dali` backend, num_workers=0 (DALI's one thread):
in parts each part is a DALI batch of its own, and DALI holds its prefetch queue's parts.

--kind served (in an environment with torchvision): an unchanged torchvision script under
`fastdata run` (ImageFolder, Resize and PILToTensor, a plain DataLoader), its folder served
natively, the files as the shard's samples; the peak counts the script's process and its workers.

    OMP_NUM_THREADS=1 python benchmarks/batch_memory.py [--kind files|shards|dali|served] [--files 32] [--mib 96]
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import _common

_LOADER = r"""
import json, resource, sys
import fastdata
from fastdata.image import read, read_shards
source, budget, batch, backend = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
if budget:
    read.MAX_PART_BYTES = read_shards.MAX_PART_BYTES = budget
loader = fastdata.loader(source, batch_size=batch, on_error="skip", transform=fastdata.transforms.imagenet_eval(64),
                         backend=backend)
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


def _jpeg(i: int) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (96, 96), (i, 0, 0)).save(out, "JPEG")
    return out.getvalue()


def _make(root: Path, kind: str, files: int, mib: int) -> str:
    """The data set; the source to load."""
    root.mkdir(parents=True)
    if kind == "shards":
        path = root / "big-000000.tar"
        with open(path, "wb") as f:
            for i in range(files):
                for name, payload, size in ((f"{i:06d}.jpg", _jpeg(i), mib << 20), (f"{i:06d}.cls", b"0", 1)):
                    info = tarfile.TarInfo(name)
                    info.size = size
                    f.write(info.tobuf(tarfile.USTAR_FORMAT) + payload)
                    f.seek(f.tell() + size - len(payload) + -size % 512)  # the rest of the member a hole
            f.write(bytes(1024))  # the archive's end
        return str(path)
    (root / "a").mkdir()
    for i in range(files):
        path = root / "a" / f"big{i:03d}.jpg"
        if kind in ("served", "dali"):
            path.write_bytes(_jpeg(i))
        with open(path, "ab") as f:
            f.truncate(mib << 20)  # sparse: no disk blocks, all zeros when read
    for i in range(4 if kind == "files" else 0):
        path = root / "a" / f"real{i}.jpg"
        path.write_bytes(_jpeg(40 * i))
    return str(root)


def _run(source: str, kind: str, budget: int, batch: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "script.py"
        script.write_text(_SERVED if kind == "served" else _LOADER)
        run = [sys.executable, "-m", "fastdata", "run", "--"] if kind == "served" else []
        backend = "dali" if kind == "dali" else "auto"
        done = subprocess.run([*run, sys.executable, str(script), source, str(budget), str(batch), backend],
                              capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise SystemExit(done.stderr)
    return json.loads(done.stdout.splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kind", choices=("files", "shards", "dali", "served"), default="files")
    ap.add_argument("--files", type=int, default=32)
    ap.add_argument("--mib", type=int, default=96)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        source = _make(Path(tmp) / "set", args.kind, args.files, args.mib)
        whole = _run(source, args.kind, (args.files + 8) * args.mib << 20, args.batch)
        parts = _run(source, args.kind, 0, args.batch)
    if args.kind == "files":
        same = whole["images"] == parts["images"] == 4 and whole["skipped"] == parts["skipped"] == args.files
    else:
        same = whole["images"] == parts["images"] == args.files and whole["skipped"] == parts["skipped"] == 0
        same = same and whole.get("native", True) and parts.get("native", True)
    assert same, (whole, parts)
    ratio = whole["peak_rss_mib"] / parts["peak_rss_mib"]
    what = {"files": "fastdata.loader, files", "shards": "fastdata.loader, a shard",
            "dali": "fastdata.loader, files, the dali backend",
            "served": "fastdata run, a torchvision folder served natively"}[args.kind]
    print(f"{what}: {args.files} samples of {args.mib} MiB, batch {args.batch}: peak memory read whole "
          f"{whole['peak_rss_mib']:,.0f} MiB, in parts {parts['peak_rss_mib']:,.0f} MiB ({ratio:.2f}x less)")
    name = "batch_memory" if args.kind == "files" else f"batch_memory_{args.kind}"
    _common.write(name, {"kind": args.kind, "files": args.files, "mib": args.mib, "batch": args.batch,
                         "whole": whole, "parts": parts, "ratio": ratio}, args.json)


if __name__ == "__main__":
    main()
