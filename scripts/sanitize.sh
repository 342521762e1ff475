#!/usr/bin/env bash
# Builds csrc/ with AddressSanitizer + UndefinedBehaviorSanitizer as a separate copy of the
# extension and runs the native tests against it; exits non-zero on any sanitizer report.
#
#   scripts/sanitize.sh [PYTEST ARGS...]     (default: the native tests, see `tests` below)
#
# The installed build is never touched: CMake configures into $SAN_DIR (default build/asan in
# this checkout, which git ignores: a build folder belongs to one source tree), the package's
# Python files are copied to $SAN_DIR/pkg/fastdata/ with the sanitized _native beside them, and
# the tests run with that folder first on the path. scripts/asan_sitecustomize.py, copied there as
# sitecustomize.py, runs first in every Python process started here (subprocesses included): it
# takes the editable install's import hook out (which would send `fastdata` to the checkout) and
# holds each fork until no other thread runs (this libasan's allocator is not fork-safe; the file
# says how). The script checks which _native was loaded.
# Python itself is not instrumented, so ASan's runtime is preloaded (gcc's, matching the
# build) and leak checking is off (the interpreter keeps memory until exit by design).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
dir=${SAN_DIR:-$root/build/asan}
py=$(command -v "${PYTHON:-python3}")
export OMP_NUM_THREADS=1

san="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
echo "sanitize.sh: building csrc/ with $san into $dir/build"
cmake -S "$root" -B "$dir/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPython_EXECUTABLE="$py" \
  -DCMAKE_C_FLAGS="$san" -DCMAKE_CXX_FLAGS="$san" -DCMAKE_MODULE_LINKER_FLAGS="$san" -DCMAKE_SHARED_LINKER_FLAGS="$san" \
  >"$dir.cmake.log" 2>&1 || { tail -30 "$dir.cmake.log"; exit 1; }
cmake --build "$dir/build" -j 2 >>"$dir.cmake.log" 2>&1 || { tail -40 "$dir.cmake.log"; exit 1; }
so=$(ls "$dir"/build/_native*.so)
symbols=$(nm -D "$so")
grep -q __asan_report <<<"$symbols" || { echo "sanitize.sh: $so has no ASan instrumentation" >&2; exit 1; }
grep -q __ubsan_handle <<<"$symbols" || { echo "sanitize.sh: $so has no UBSan instrumentation" >&2; exit 1; }

rm -rf "$dir/pkg"
mkdir -p "$dir/pkg"
cp -r fastdata "$dir/pkg/fastdata"
find "$dir/pkg/fastdata" \( -name '__pycache__' -o -name '*.so' \) -prune -exec rm -rf {} +
cp "$so" "$dir/pkg/fastdata/"
cp scripts/asan_sitecustomize.py "$dir/pkg/sitecustomize.py"
export PYTHONPATH="$dir/pkg${PYTHONPATH:+:$PYTHONPATH}"
# libstdc++ too: ASan intercepts __cxa_throw only when libstdc++ is loaded before it starts, and
# python does not link it (the first C++ exception thrown would stop ASan with a CHECK failure).
export LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libstdc++.so)"
export ASAN_OPTIONS=detect_leaks=0:halt_on_error=1:abort_on_error=0
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
cd "$dir/pkg"  # `python -m` puts the working folder first on sys.path: this copy, not the checkout
loaded=$("$py" -c "import fastdata._native as n, fastdata._collate as c; print(n.__file__ if c.NATIVE else 'none')")
echo "sanitize.sh: fastdata._native is $loaded"
if [ "$loaded" != "$dir/pkg/fastdata/$(basename "$so")" ]; then
  echo "sanitize.sh: the sanitized build is not the one loaded" >&2
  exit 1
fi

if [ $# -eq 0 ]; then
  set -- "$root/tests/unit/test_decode.py" "$root/tests/unit/test_collate.py" "$root/tests/robustness/test_fuzz.py" \
    "$root/tests/unit/test_index.py" "$root/tests/unit/test_fork.py" "$root/tests/robustness/test_hostile_decode.py" \
    "$root/tests/unit/test_batch_ops.py" "$root/tests/unit/test_color_jitter.py" "$root/tests/unit/test_geometry.py" \
    "$root/tests/unit/test_auto_augment.py" "$root/tests/unit/test_tensor_kernels.py" "$root/tests/unit/test_blur.py" \
    "$root/tests/unit/test_resize_images.py" \
    "$root/tests/backends/test_image_pil.py::test_read_files_gives_the_bytes_or_the_cause" \
    "$root/tests/robustness/test_hostile_shards.py::test_native_walk_gives_walk_tars_members" \
    -k "not test_fuzz_targets_run_clean"
fi
# --capture=sys: a report is written to file descriptor 2 as the process dies; pytest's default
# capture of the descriptor would swallow it.
"$py" -m pytest -q -p no:cacheprovider --capture=sys "$@"
