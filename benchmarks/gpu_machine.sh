#!/usr/bin/env bash
# The GPU checks on a lent GPU machine (issue 33) in one call: the device tool's machine has
# torch, torchvision, CMake, ninja and nanobind but no network, so the wheels it lacks travel
# with the working tree (in .whl, which git ignores).
#
#   bash benchmarks/gpu_machine.sh prepare        here: downloads the wheels for Python 3.12 into .whl
#                                                 (PYVER=3.11 for a check on this machine's Python)
#   bash benchmarks/gpu_machine.sh run [ARGS...]  there (carry .whl): installs them in /tmp/site,
#                                                 builds the native extension, runs the CUDA tests,
#                                                 then `benchmarks/gpu.py ARGS`; logs and JSON to $OUT
#
# `run` without CUDA does the same on the CPU (a check of this script, not figures). Its parts
# are bounded (the tests by TESTS_S, gpu.py by GPU_S seconds) so that a call ends inside the
# device's limit with what it has measured written.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=(webdataset==1.0.2 braceexpand==0.1.7 kornia==0.9.0 kornia_rs==0.2.0)
PY=${PY:-python3}

case "${1:-}" in
prepare)
    ver=${PYVER:-3.12}
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$ver" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl "${WHEELS[@]}"
    du -sh .whl
    ;;
run)
    shift
    out=${OUT:?set OUT: the folder whose files come back}
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
    cmake -S . -B build -G Ninja -DPython_EXECUTABLE="$(command -v "$PY")" -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build build >/dev/null
    cp build/_native*.so fastdata/
    "$PY" - <<'EOF' 2>&1 | tee "$out/machine.txt"
import os, torch, torchvision, fastdata, fastdata._native
print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, CUDA {torch.cuda.is_available()}"
      f"{' ' + torch.cuda.get_device_name() if torch.cuda.is_available() else ''}, {os.cpu_count()} CPUs, "
      f"fastdata from {os.path.dirname(fastdata.__file__)}")
EOF
    # What a CUDA device changes: the tests marked gpu, the forms of Tensor.to and .cuda under
    # fastdata run (against cuda:0 where it is), the drop-in's copy to the device.
    set +e
    { timeout -k 10 "${TESTS_S:-150}" "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/unit/test_kornia.py \
          tests/tools/test_run.py tests/tools/test_profiler.py
      timeout -k 10 "${TESTS_S:-150}" "$PY" -m pytest -q -p no:cacheprovider tests/tools/test_run_signatures.py
      timeout -k 10 "${TESTS_S:-150}" "$PY" -m pytest -q -p no:cacheprovider tests/backends/test_dropin.py \
          -k "device or cuda"; } > "$out/tests.log" 2>&1
    tail -n 3 "$out/tests.log"
    timeout -k 10 "${GPU_S:-420}" "$PY" benchmarks/gpu.py --json "$out/gpu.json" "$@" 2>&1 | tee "$out/gpu.log"
    echo "gpu.py: exit ${PIPESTATUS[0]}" | tee -a "$out/gpu.log"
    ;;
*)
    echo "usage: bash benchmarks/gpu_machine.sh prepare | run [gpu.py ARGS...]" >&2
    exit 2
    ;;
esac
