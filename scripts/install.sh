#!/usr/bin/env bash
# Installs fastdata from this checkout, with its native extension, into the current Python.
# PyTorch is installed only when missing, and pinned: a loose `torch` requirement would pull
# several GB of CUDA wheels on a machine whose local CPU wheel is 2.13.0.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -c "import torch" 2>/dev/null || "$PY" -m pip install -q "torch==2.13.0"
# The build needs no torch: scikit-build-core + nanobind compile csrc/ against raw buffers.
"$PY" -m pip install -q "scikit-build-core>=0.10" "nanobind>=2.0" "pytest>=7"
"$PY" -m pip install -q --no-build-isolation -e .
"$PY" -c "import fastdata, fastdata._collate as c; print(f'fastdata {fastdata.__version__} installed; native collation: {c.NATIVE}')"
