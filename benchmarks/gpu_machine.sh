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
# DALI's wheels (about 500 MB) exceed what one call carries (64 MiB), so they travel in parts,
# one call each, on a machine kept warm (it keeps /tmp between calls made within 30 s):
#
#   bash benchmarks/gpu_machine.sh dali-prepare   here: DALI and what it needs there, installed into
#                                                 a folder, as one xz-compressed tar (about 300 MB,
#                                                 against 510 MB of wheels) in parts of PART_MB (58)
#                                                 MiB: .dali/part-NN, SHA256SUMS (a few minutes)
#   bash benchmarks/gpu_machine.sh dali-part .dali/part-NN
#                                                 there (carry that part and .dali/SHA256SUMS): checks
#                                                 it and keeps it in /tmp/dali-parts
#
# and `run` (carrying .dali/SHA256SUMS too) installs DALI once every part is there.
#
# `run` without CUDA does the same on the CPU (a check of this script, not figures). The tests
# are bounded by TESTS_S (120; 0: none) seconds together and gpu.py by GPU_S (360), which with the build
# (about 15 s there) keeps a call inside the device's 600 s a command, with what it has measured
# written; its exit status is gpu.py's. With FIRST_S set, `run` first runs the README's first
# command's job (`fastdata profile synthetic --step-ms 100 --tune`, from an empty HOME) for at
# most FIRST_S seconds: what a newcomer on that machine meets (DALI's GPU path, where DALI came).
set -euo pipefail
# (paths given from another folder, before the cd)
OUT=${OUT:+$(realpath "$OUT")}
[ "${1:-}" = dali-part ] && set -- dali-part "$(realpath "${2:?the part to keep: .dali/part-NN}")"
cd "$(dirname "$0")/.."
WHEELS=(webdataset==1.0.2 braceexpand==0.1.7 kornia==0.9.0 kornia_rs==0.2.0)
PY=${PY:-python3}
# wheels for the lent machine's Python (PYVER, default 3.12) and glibc, as pip download and install take them
FOR_THERE=(--only-binary=:all: --python-version "${PYVER:-3.12}" --implementation cp
           --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
           --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)

case "${1:-}" in
prepare)
    "$PY" -m pip download -q --no-deps "${FOR_THERE[@]}" -d .whl "${WHEELS[@]}"
    du -sh .whl
    ;;
run)
    shift
    out=${OUT:?set OUT: the folder whose files come back}
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    if [ -f .dali/SHA256SUMS ] && [ ! -f /tmp/dali-site/installed ]; then
        sums=$PWD/.dali/SHA256SUMS
        if (cd /tmp/dali-parts 2>/dev/null && sha256sum -c --quiet "$sums"); then
            rm -rf /tmp/dali-site && mkdir -p /tmp/dali-site
            unxz="import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer)"
            (cd /tmp/dali-parts && cat $(awk '{print $2}' "$sums")) | "$PY" -c "$unxz" | tar -x -C /tmp/dali-site
            # After the machine's own site-packages (a .pth there), not before them as PYTHONPATH
            # would put it: DALI's CUDA 12 libraries must not shadow torch's. Its nvidia/__init__.py
            # would make `nvidia` a package of that folder alone: a namespace spans both.
            rm -f /tmp/dali-site/nvidia/__init__.py
            echo /tmp/dali-site > "$("$PY" -c 'import site; print(site.getsitepackages()[0])')/zz-dali-site.pth"
            touch /tmp/dali-site/installed
        else
            echo "DALI: not every part of .dali/SHA256SUMS is in /tmp/dali-parts: run without it"
        fi
    fi
    export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
    cmake -S . -B build -G Ninja -DPython_EXECUTABLE="$(command -v "$PY")" -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build build >/dev/null
    cp build/_native*.so fastdata/
    "$PY" - <<'EOF' 2>&1 | tee "$out/machine.txt"
import os, torch, torchvision, fastdata, fastdata._native
from fastdata import _optional
print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, CUDA {torch.cuda.is_available()}"
      f"{' ' + torch.cuda.get_device_name() if torch.cuda.is_available() else ''}, {os.cpu_count()} CPUs, "
      f"fastdata from {os.path.dirname(fastdata.__file__)}, DALI: "
      f"{_optional.has('dali') or _optional.missing('dali', 'backend dali')}")
EOF
    # What a CUDA device changes: the forms of Tensor.to and .cuda under fastdata run (against
    # cuda:0 where it is), the drop-in's copy to the device (seconds, so first), then the tests
    # marked gpu (DALI's GPU decode among them, where DALI came; about 80 s on an H200);
    # TESTS_S seconds for them all, then gpu.py's GPU_S.
    set +e
    if [ "${TESTS_S:-120}" -gt 0 ]; then
        timeout -k 10 "${TESTS_S:-120}" bash -c '
            "$0" -m pytest -q -p no:cacheprovider tests/tools/test_run_signatures.py; echo "signatures: exit $?"
            "$0" -m pytest -q -p no:cacheprovider tests/backends/test_dropin.py -k "device or cuda"
            echo "drop-in on the device: exit $?"
            "$0" -m pytest -q -p no:cacheprovider -m gpu tests/unit/test_kornia.py tests/tools/test_run.py \
                tests/tools/test_profiler.py tests/backends/test_dali.py; echo "tests marked gpu: exit $?"' \
            "$PY" > "$out/tests.log" 2>&1
        echo "tests: exit $?" >> "$out/tests.log"
        grep -E "passed|failed|error|exit" "$out/tests.log"
    fi
    if [ "${FIRST_S:-0}" -gt 0 ]; then
        HOME=$(mktemp -d) timeout -k 10 "$FIRST_S" "$PY" -m fastdata profile synthetic --step-ms 100 --tune \
            > "$out/first.log" 2>&1
        echo "the README's first command: exit $?" | tee -a "$out/first.log"
        tail -25 "$out/first.log"
    fi
    timeout -k 10 "${GPU_S:-360}" "$PY" benchmarks/gpu.py --json "$out/gpu.json" "$@" 2>&1 | tee "$out/gpu.log"
    code=${PIPESTATUS[0]}
    echo "gpu.py: exit $code" | tee -a "$out/gpu.log"
    exit "$code"
    ;;
dali-prepare)
    pin=$("$PY" -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['dali'])")
    rm -rf .dali && mkdir -p .dali/wheels .dali/site
    "$PY" -m pip download -q "${FOR_THERE[@]}" -d .dali/wheels "$pin"
    # (the machine has these)
    rm -f .dali/wheels/{numpy,packaging,pyyaml,PyYAML,six,typing_extensions,wheel}-*.whl
    # Installed here for that Python (pip unpacks wheels for another platform with --target),
    # and xz takes a third less than the wheels' zip: fewer parts, fewer calls of device time.
    "$PY" -m pip install -q --no-deps --no-compile "${FOR_THERE[@]}" --target .dali/site .dali/wheels/*.whl
    tar -cf - -C .dali/site . | xz -T0 -6 | split -b "${PART_MB:-58}M" -d -a 2 - .dali/part-
    rm -rf .dali/wheels .dali/site
    (cd .dali && sha256sum part-* > SHA256SUMS)
    ls -la .dali
    ;;
dali-part)
    part=$2
    (cd "$(dirname "$part")" && grep " $(basename "$part")\$" SHA256SUMS | sha256sum -c --quiet -)
    mkdir -p /tmp/dali-parts && cp "$part" /tmp/dali-parts/
    echo "kept $(basename "$part"); /tmp/dali-parts: $(ls /tmp/dali-parts | tr '\n' ' ')"
    ;;
*)
    echo "usage: bash benchmarks/gpu_machine.sh prepare | run [gpu.py ARGS...] | dali-prepare | dali-part PART" >&2
    exit 2
    ;;
esac
