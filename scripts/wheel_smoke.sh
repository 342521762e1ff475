#!/usr/bin/env bash
# Builds fastdata's wheel from this checkout and smoke-tests it in a fresh virtualenv, from a
# folder outside the checkout (so the checkout's `fastdata` cannot be the one imported):
#   1. the wheel with its native extension: `import fastdata` without Pillow, native collation
#      on, a drop-in loader over a TensorDataset gives DataLoader's batches, and (with Pillow
#      added) an image loader over a JPEG folder written here gives labels matching the pixels;
#   2. the pure-Python wheel a machine without a C++ compiler gets (built with CXX=/bin/false):
#      `import fastdata` warns once, naming how to get the native extension, and the drop-in
#      loader still gives DataLoader's batches.
# Needs the build requirements (scikit-build-core, nanobind) in the current Python, as after
# scripts/install.sh. The virtualenv gets this Python's torch build, pinned to its exact version
# (a local CPU wheel stays a CPU wheel), so nothing fetches a CUDA build.
#   bash scripts/wheel_smoke.sh        (KEEP=1 keeps the work folder and prints its path)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
start=$SECONDS
work=$(mktemp -d "${TMPDIR:-/tmp}/fastdata-wheel-smoke.XXXXXX")
if [ -n "${KEEP:-}" ]; then echo "work folder: $work"; else trap 'rm -rf "$work"' EXIT; fi
# OMP_NUM_THREADS: the smoke test's torch ops are tiny; PYTHONPATH: nothing of the checkout's.
export OMP_NUM_THREADS=1
unset PYTHONPATH

# Build folders under $work: the checkout's build/ belongs to its editable install.
echo "building the wheels"
"$PY" -m pip wheel -q --no-deps --no-build-isolation -C build-dir="$work/build-native" . -w "$work/native"
CXX=/bin/false "$PY" -m pip wheel -q --no-deps --no-build-isolation -C build-dir="$work/build-pure" . -w "$work/pure" \
    >"$work/pure.log" 2>&1 || { cat "$work/pure.log" >&2; exit 1; }
native=$(echo "$work"/native/fastdata-*.whl)
pure=$(echo "$work"/pure/fastdata-*.whl)
case $native in *-py3-none-any.whl) echo "error: $native has no native extension" >&2; exit 1 ;; esac
case $pure in *-py3-none-any.whl) ;; *) echo "error: $pure is not the pure-Python wheel" >&2; exit 1 ;; esac
listing=$("$PY" -m zipfile -l "$native")
for f in fastdata/py.typed fastdata/_native dist-info/licenses/LICENSE; do
    grep -q "$f" <<<"$listing" || { echo "error: $native lacks $f" >&2; exit 1; }
done

echo "a fresh virtualenv with torch $("$PY" -c 'import torch; print(torch.__version__)')"
"$PY" -m venv "$work/venv"
V=$work/venv/bin/python
"$V" -m pip install -q "torch==$("$PY" -c 'import torch; print(torch.__version__)')" numpy
"$V" -m pip install -q "$native"

cat >"$work/smoke_dropin.py" <<'EOF'
"""Import, native collation as built, and a drop-in loader over a TensorDataset (DataLoader's
batches, with and without workers). argv[1]: "native" or "pure"."""
import importlib.util
import sys
import warnings
from pathlib import Path

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import fastdata
    from fastdata import _collate

import torch
from torch.utils.data import DataLoader, TensorDataset

kind = sys.argv[1]
where = Path(fastdata.__file__).resolve()
assert Path(sys.prefix).resolve() in where.parents, f"fastdata imported from {where}, not the venv"
assert importlib.util.find_spec("PIL") is None or kind == "pure", "Pillow is in the venv already"
ours = [w for w in caught if "fastdata" in str(w.message)]
if kind == "native":
    assert _collate.NATIVE, "the wheel's native extension did not load"
    assert not ours, [str(w.message) for w in ours]
else:
    assert not _collate.NATIVE
    assert len(ours) == 1, [str(w.message) for w in ours]
    message = str(ours[0].message)
    assert "scripts/install.sh" in message and "C++17" in message, message

n = 40
x = torch.arange(n * 3 * 64 * 64, dtype=torch.float32).reshape(n, 3, 64, 64)
ds = TensorDataset(x, torch.arange(n))
for workers in (0, 2):
    got = list(fastdata.loader(ds, batch_size=16, num_workers=workers))
    want = list(DataLoader(ds, batch_size=16, num_workers=workers))
    assert len(got) == len(want) == 3
    for (a, b), (c, d) in zip(got, want):
        assert a.dtype == c.dtype and torch.equal(a, c) and torch.equal(b, d)
print(f"{kind} wheel: fastdata {fastdata.__version__} from {where.parent}, native collation "
      f"{_collate.NATIVE}, drop-in batches equal to DataLoader's")
EOF

cat >"$work/smoke_images.py" <<'EOF'
"""An image loader over a folder of flat-color JPEGs: red names the class, green the image, so
every row of every batch must agree with its label, and each image comes once an epoch."""
import sys
from pathlib import Path

import torch
from PIL import Image

import fastdata
from fastdata import transforms as T

root = Path(sys.argv[1])
classes, per_class = 3, 5
for c in range(classes):
    (root / f"class{c}").mkdir(parents=True)
    for i in range(per_class):
        Image.new("RGB", (40 + 3 * i, 30 + 2 * c), (40 * c + 20, 12 * i + 10, 77)).save(
            root / f"class{c}" / f"{i:02d}.jpg", quality=95)

loader = fastdata.loader(str(root), batch_size=4, shuffle=True, transform=T.Compose([T.CenterCrop(24)]),
                         num_workers=2)
seen = []
for images, labels in loader:
    assert images.dtype == torch.uint8 and images.shape[1:] == (3, 24, 24), images.shape
    x = images.float()
    red, green = x[:, 0].mean((1, 2)), x[:, 1].mean((1, 2))
    cls, idx = torch.round((red - 20) / 40).long(), torch.round((green - 10) / 12).long()
    assert torch.equal(cls, labels), (cls, labels)
    seen += list(zip(cls.tolist(), idx.tolist()))
assert sorted(seen) == [(c, i) for c in range(classes) for i in range(per_class)], seen
print(f"image loader ({loader.backend} backend): {len(seen)} JPEGs, labels match their pixels")
EOF

cd "$work"
"$V" smoke_dropin.py native
# Stock Pillow only here, to write the JPEGs (fastdata does not require Pillow): a throwaway venv.
"$V" -m pip install -q pillow
"$V" smoke_images.py "$work/images"
"$V" -m pip install -q --force-reinstall --no-deps "$pure"
"$V" smoke_dropin.py pure
echo "wheel smoke test passed in $((SECONDS - start)) s"
