#!/usr/bin/env bash
# Installs fastdata from this checkout, with its native extension, into the current Python,
# and ends with Pillow-SIMD as the active Pillow.
#   bash scripts/install.sh            fastdata, Kornia, the test tools and trainers, Pillow-SIMD;
#                                      DALI only where a CUDA GPU is found (nvidia-smi lists one)
#   bash scripts/install.sh --dali     DALI as well, GPU or not (it runs CPU-only pipelines)
#   bash scripts/install.sh --no-dali  no DALI, even with a GPU
#   bash scripts/install.sh --ray      Ray as well, for backend='ray' (the `ray` extra)
#   bash scripts/install.sh --bench    the peers benchmarks/peers.py times (SPDL, torchdata, FFmpeg)
# FASTDATA_DALI=1 or 0 does what --dali or --no-dali does. FASTDATA_AVX2=1 or 0 builds Pillow-SIMD
# with or without AVX2 whatever this CPU has (for an image built on one machine, run on another).
# PyTorch is installed only when missing, and pinned: a loose `torch` requirement would pull
# several GB of CUDA wheels on a machine whose local CPU wheel is 2.13.0.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
PILLOW_SIMD=12.1.1.post0

usage() { sed -n '4,11s/^# \{0,1\}//p' scripts/install.sh; }
dali=${FASTDATA_DALI:-auto}
bench=0
ray=0
for arg in "$@"; do
    case $arg in
        --dali) dali=1 ;;
        --bench) bench=1 ;;
        --no-dali) dali=0 ;;
        --ray) ray=1 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "install.sh: unknown argument '$arg'" >&2; usage >&2; exit 2 ;;
    esac
done
case $dali in
    1) dali_why="asked for" ;;
    0) dali_why="--no-dali" ;;
    auto|"")
        if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
            dali=1 dali_why="a CUDA GPU is present"
        else
            dali=0 dali_why="no CUDA GPU found"
        fi ;;
    *) echo "install.sh: FASTDATA_DALI should be 1, 0 or auto, but got '$dali'" >&2; exit 2 ;;
esac

# The requirements of one of pyproject.toml's extras, one a line: the pins live there only.
extra() {
    "$PY" - "$1" <<'EOF'
import sys
try:
    import tomllib
except ImportError:  # Python 3.10: tomli comes with scikit-build-core
    import tomli as tomllib
with open("pyproject.toml", "rb") as f:
    print("\n".join(tomllib.load(f)["project"]["optional-dependencies"][sys.argv[1]]))
EOF
}

"$PY" -c "import torch" 2>/dev/null || "$PY" -m pip install -q "torch==2.13.0"
# The build needs no torch: scikit-build-core + nanobind compile csrc/ against raw buffers.
# setuptools and pybind11 are Pillow-SIMD's build requirements (built without isolation below).
"$PY" -m pip install -q "scikit-build-core>=0.10" "nanobind>=2.0" "setuptools>=77" "pybind11"
# CMake and Ninja: scikit-build-core names the PyPI wheels it needs (none where the system has both).
mapfile -t build_tools < <("$PY" -c "import sys
from scikit_build_core.build import get_requires_for_build_editable as requires
sys.stdout.writelines(r + '\n' for r in requires())")
[ ${#build_tools[@]} -eq 0 ] || "$PY" -m pip install -q "${build_tools[@]}"
# fastdata, with the extras the README's test command needs: the test tools, Kornia for the device
# stage's pixel ops, and the trainers tests/contract/test_frameworks.py runs fastdata under. Without a
# working C++17 compiler the build falls back to pure Python, and `import fastdata` says so.
"$PY" -m pip install -q --no-build-isolation -e ".[test,gpu,frameworks]"
"$PY" -c "import fastdata, fastdata._collate as c; print(f'fastdata {fastdata.__version__} installed; native collation: {c.NATIVE}')"

# Debian's Chromium, headless, for the profile report's browser test (tests/tools/test_report_html.py,
# which skips without it): installed only where apt-get runs as root.
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    if DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1 || \
       { apt-get update -q >/dev/null 2>&1 && \
         DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1; }; then
        echo "chromium installed (for the report's browser test)"
    else
        echo "warning: could not install chromium; the report's browser test skips" >&2
    fi
fi

# NVIDIA DALI for the `dali` backend: about 1 GB of wheels (DALI with its nvJPEG, nvImageCodec,
# nvCOMP, nvJPEG2k and nvTIFF), so only where it can use a GPU or when asked. It requires no torch
# and no Pillow; without it backend='dali' says it is missing, and its tests skip.
mapfile -t dali_reqs < <(extra dali)
[ ${#dali_reqs[@]} -gt 0 ] || { echo "error: no 'dali' extra read from pyproject.toml" >&2; exit 1; }
dali_version() { "$PY" -c "import nvidia.dali as d; print(d.__version__)" 2>/dev/null; }
if [ "$dali" = 1 ]; then
    if "$PY" -m pip install -q "${dali_reqs[@]}"; then
        echo "DALI $(dali_version) installed ($dali_why)"
    elif [ "$dali_why" = "asked for" ]; then
        echo "error: installing ${dali_reqs[*]} failed" >&2
        exit 1
    else
        echo "warning: installing ${dali_reqs[*]} failed; backend='dali' is not available" >&2
    fi
elif v=$(dali_version); then
    echo "DALI $v already installed"
else
    echo "DALI not installed ($dali_why; about 1 GB): bash scripts/install.sh --dali adds backend='dali'"
fi

# Ray for backend='ray', only when asked (the `ray` extra; its tests skip without it).
if [ "$ray" = 1 ]; then
    mapfile -t ray_reqs < <(extra ray)
    [ ${#ray_reqs[@]} -gt 0 ] || { echo "error: no 'ray' extra read from pyproject.toml" >&2; exit 1; }
    "$PY" -m pip install -q "${ray_reqs[@]}"
    echo "Ray installed: ${ray_reqs[*]}"
fi

# The peers of benchmarks/peers.py, only when asked: SPDL decodes with FFmpeg's shared libraries
# (Debian's, installed where apt-get runs as root; without them its side is skipped).
if [ "$bench" = 1 ]; then
    mapfile -t bench_reqs < <(extra bench)
    "$PY" -m pip install -q "${bench_reqs[@]}"
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
            libavfilter8 libavformat59 libavdevice59 libswscale6 >/dev/null 2>&1 || \
            echo "warning: could not install FFmpeg's libraries; benchmarks/peers.py skips SPDL" >&2
    fi
    echo "benchmark peers installed: ${bench_reqs[*]}"
fi

# Pillow-SIMD, last: it and stock Pillow both install the `PIL` package, so anything installed
# after it that requires `pillow` (torchvision, say) puts stock Pillow's files over it.
simd_active() {
    "$PY" - "$PILLOW_SIMD" <<'EOF'
import importlib.metadata as m, sys
def version(name):
    try:
        return m.version(name)
    except m.PackageNotFoundError:
        return None
try:
    import PIL
    from PIL import Image  # the compiled core loads
except ImportError:
    sys.exit(1)
want = sys.argv[1]
sys.exit(0 if PIL.__version__ == want and version("pillow-simd") == want and version("pillow") is None else 1)
EOF
}
if simd_active; then
    echo "Pillow-SIMD $PILLOW_SIMD already active"
else
    # Its setup.py needs the zlib and libjpeg headers; the system's libjpeg is libjpeg-turbo.
    missing=()
    [ -e /usr/include/zlib.h ] || missing+=(zlib1g-dev)
    [ -e /usr/include/jpeglib.h ] || missing+=(libjpeg-dev)
    if [ ${#missing[@]} -gt 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null || true
    fi
    # Uninstalling one of the two deletes the `PIL` files the other may be relying on: start clean.
    "$PY" -m pip uninstall -q -y pillow pillow-simd 2>/dev/null || true
    # -mavx2 turns on Pillow-SIMD's AVX2 paths (by default only where this CPU has AVX2); no wheel
    # cache, so that no wheel built with other flags is reused.
    cc="cc"
    case ${FASTDATA_AVX2:-auto} in
        1) cc="cc -mavx2" ;;
        0) ;;
        *) grep -qw avx2 /proc/cpuinfo 2>/dev/null && cc="cc -mavx2" ;;
    esac
    log=$(mktemp)
    if CC="$cc" "$PY" -m pip install --no-cache-dir --no-binary pillow-simd --no-build-isolation --no-deps \
            "pillow-simd==$PILLOW_SIMD" >"$log" 2>&1 && simd_active; then
        echo "Pillow-SIMD $PILLOW_SIMD built with CC=\"$cc\""
    else
        tail -n 20 "$log" >&2
        echo "warning: building Pillow-SIMD $PILLOW_SIMD failed (output above); installing stock Pillow instead" >&2
        "$PY" -m pip uninstall -q -y pillow-simd 2>/dev/null || true
        "$PY" -m pip install -q pillow
    fi
    rm -f "$log"
fi
# Pillow builds the codecs whose headers it finds: without libwebp's or libtiff's, WebP files and
# compressed TIFFs are refused as unreadable (stock Pillow's wheels carry both).
"$PY" - <<'EOF'
from PIL import features
codecs = (("WebP", "webp", "libwebp-dev"), ("compressed TIFF", "libtiff", "libtiff-dev"))
lost = [f"{name} ({pkg})" for name, key, pkg in codecs if not features.check(key)]
if lost:
    print("note: this Pillow reads no " + ", no ".join(lost) + "; to build them in, install those headers, "
          "then `pip uninstall -y pillow-simd` and run this script again")
EOF

# Stock Pillow of the same release, beside it and not over it (pip --target into .stock-pillow/,
# never imported unless put on PYTHONPATH): the reference the parity tests hold Pillow-SIMD to,
# and the baseline benchmarks/imagenet_cpu.py runs.
STOCK_PILLOW=${PILLOW_SIMD%.post*}
if [ -e .stock-pillow/PIL/__init__.py ] && PYTHONPATH=.stock-pillow "$PY" -c \
        "import PIL, sys; sys.exit(PIL.__version__ != '$STOCK_PILLOW')" 2>/dev/null; then
    echo "stock Pillow $STOCK_PILLOW already in .stock-pillow/"
elif rm -rf .stock-pillow && "$PY" -m pip install -q --no-deps --target .stock-pillow "pillow==$STOCK_PILLOW"; then
    echo "stock Pillow $STOCK_PILLOW put in .stock-pillow/ (for the parity tests and baselines)"
else
    echo "warning: could not put stock Pillow in .stock-pillow/; its parity tests skip" >&2
fi
"$PY" -c "from fastdata._pillow import PILLOW; print(f'active Pillow: {PILLOW}')"
