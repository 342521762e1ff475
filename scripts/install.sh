#!/usr/bin/env bash
# Installs fastdata from this checkout, with its native extension, into the current Python,
# and ends with Pillow-SIMD as the active Pillow.
# PyTorch is installed only when missing, and pinned: a loose `torch` requirement would pull
# several GB of CUDA wheels on a machine whose local CPU wheel is 2.13.0.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
PILLOW_SIMD=12.1.1.post0
"$PY" -c "import torch" 2>/dev/null || "$PY" -m pip install -q "torch==2.13.0"
# The build needs no torch: scikit-build-core + nanobind compile csrc/ against raw buffers.
# setuptools and pybind11 are Pillow-SIMD's build requirements (built without isolation below).
# pytest-timeout: no test may hang (the default limit is in pyproject.toml); atheris: the tar and
# index fuzzer (tests/test_fuzz.py, scripts/fuzz.sh); jsonschema: report.json against its schema.
# None requires torch or Pillow.
"$PY" -m pip install -q "scikit-build-core>=0.10" "nanobind>=2.0" "pytest>=7" "pytest-timeout>=2.3" "atheris>=2.3" \
    "jsonschema>=4.18" "setuptools>=77" "pybind11"
"$PY" -m pip install -q --no-build-isolation -e .
"$PY" -c "import fastdata, fastdata._collate as c; print(f'fastdata {fastdata.__version__} installed; native collation: {c.NATIVE}')"

# Kornia for the device stage's pixel ops (it requires torch, already here, and no Pillow).
"$PY" -m pip install -q "kornia==0.9.0"

# The trainers tests/test_frameworks.py runs fastdata under (Lightning's Trainer and Fabric,
# Accelerate); pinned, and requiring neither a torch other than the one here nor Pillow.
"$PY" -m pip install -q "pytorch-lightning==2.6.6" "accelerate==1.15.0"

# Debian's Chromium, headless, for the profile report's browser test (tests/test_report_html.py,
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

# NVIDIA DALI for the `dali` backend (about 430 MB; it runs CPU-only pipelines where there is no
# GPU, so the backend is tested everywhere). It requires no torch and no Pillow.
DALI=nvidia-dali-cuda120==2.4.0
if "$PY" -c "import nvidia.dali" 2>/dev/null; then
    echo "DALI $("$PY" -c 'import nvidia.dali as d; print(d.__version__)') already installed"
elif "$PY" -m pip install -q "$DALI"; then
    echo "DALI installed ($DALI)"
else
    echo "warning: installing $DALI failed; backend='dali' will say it is missing, and its tests skip" >&2
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
    # -mavx2 turns on Pillow-SIMD's AVX2 paths (only where the CPU has AVX2); no wheel cache,
    # so that no wheel built with other flags is reused.
    cc="cc"
    grep -qw avx2 /proc/cpuinfo 2>/dev/null && cc="cc -mavx2"
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
