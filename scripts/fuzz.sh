#!/usr/bin/env bash
# Fuzzes fastdata's native core and its tar/index readers (harnesses in csrc/fuzz/).
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]
#
# SECONDS per target (default 300). Targets (default: all):
#   decode          csrc/decode.cpp (resample.cpp, entropy.cpp, index.cpp, structure.cpp) under libFuzzer + ASan + UBSan (the
#                   kernels this CPU picks), each input's pixels and errors compared with libjpeg's
#                   own Huffman decoder's
#   decode-sse41    the same with FASTDATA_DECODE_SIMD=sse4.1 (the SSE4.1 kernels)
#   decode-generic  the same with FASTDATA_DECODE_SIMD=none (the plain C++ kernels)
#   collate         csrc/collate.cpp under libFuzzer + ASan + UBSan
#   tar             the tar and index readers (Python) under atheris
# Needs clang (apt-get install clang: libFuzzer comes with it), libjpeg-turbo's headers, and
# atheris (pip install atheris) for the tar target.
#
# Builds into $FUZZ_DIR (default /tmp/fastdata-fuzz), where each target's corpus grows from run
# to run (corpus/<target>/), seeded with real images and shards (csrc/fuzz/seeds.py) and the
# checked-in inputs (tests/fuzz_corpus/<target>/). A crash, sanitizer report, failed check or
# hang (an input over 20 s) stops the target, leaves the input in $FUZZ_DIR/crashes/ and makes
# this script exit 1 after the other targets ran. To keep one: fix the cause, then add the input
# (minimized with `<fuzzer> -minimize_crash=1 -runs=10000 INPUT`, for the native targets) to
# tests/fuzz_corpus/<target>/ under a name that says what it is; tests/robustness/test_fuzz.py replays it.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

seconds=${1:-300}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(decode decode-sse41 decode-generic collate tar)
dir=${FUZZ_DIR:-/tmp/fastdata-fuzz}
cxx=${CXX_FUZZ:-clang++}
export OMP_NUM_THREADS=1
mkdir -p "$dir/bin" "$dir/crashes" "$dir/logs"

if ! command -v "$cxx" >/dev/null; then
  echo "fuzz.sh: $cxx not found; install clang (apt-get install clang)" >&2
  exit 2
fi

# -O1 keeps the sanitizers' reports readable and the SIMD kernels (chosen at run time) in.
flags=(-std=c++17 -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined
       -fno-sanitize-recover=undefined -I"$root/csrc")
build() {  # build NAME SOURCES... [LIBS...]
  local name=$1
  shift
  echo "fuzz.sh: building $name"
  "$cxx" "${flags[@]}" "$@" -lpthread -o "$dir/bin/$name.tmp"
  mv "$dir/bin/$name.tmp" "$dir/bin/$name"
}
need_native() { [[ " ${targets[*]} " == *" $1"* ]]; }
need_native decode && build decode_fuzzer csrc/fuzz/decode_fuzzer.cpp csrc/decode.cpp csrc/resample.cpp csrc/entropy.cpp \
  csrc/index.cpp csrc/structure.cpp -ljpeg
need_native collate && build collate_fuzzer csrc/fuzz/collate_fuzzer.cpp csrc/collate.cpp

python3 csrc/fuzz/seeds.py "$dir/seeds"

failed=0
for target in "${targets[@]}"; do
  base=${target%%-*}
  corpus=$dir/corpus/$base
  mkdir -p "$corpus"
  extra=()
  [ -d "$dir/seeds/$base" ] && extra+=("$dir/seeds/$base")
  [ -d "tests/fuzz_corpus/$base" ] && extra+=("tests/fuzz_corpus/$base")
  case $target in
    decode) cmd=("$dir/bin/decode_fuzzer" -max_len=65536) ;;
    decode-sse41) cmd=(env FASTDATA_DECODE_SIMD=sse4.1 "$dir/bin/decode_fuzzer" -max_len=65536) ;;
    decode-generic) cmd=(env FASTDATA_DECODE_SIMD=none "$dir/bin/decode_fuzzer" -max_len=65536) ;;
    collate) cmd=("$dir/bin/collate_fuzzer" -max_len=256) ;;
    tar) mkdir -p "$dir/scratch"
         cmd=(env FASTDATA_FUZZ_SCRATCH="$dir/scratch" python3 csrc/fuzz/tar_fuzzer.py -max_len=16384) ;;
    *) echo "fuzz.sh: unknown target $target (decode, decode-sse41, decode-generic, collate, tar)" >&2; exit 2 ;;
  esac
  log=$dir/logs/$target.log
  echo "fuzz.sh: $target for ${seconds}s (log: $log)"
  # The corpus folder first: new inputs go there, the seed folders are only read.
  if "${cmd[@]}" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2560 -print_final_stats=1 \
      -artifact_prefix="$dir/crashes/$target-" "$corpus" "${extra[@]}" >"$log" 2>&1; then
    runs=$(grep -o 'Done [0-9]* runs in [0-9]* second' "$log" | tail -1 || true)
    echo "$target: clean (${runs:-no summary}; corpus $(ls "$corpus" | wc -l) inputs)"
  else
    failed=1
    echo "$target: FAILED; the input is in $dir/crashes/, the end of the log:"
    grep -v -E '^#[0-9]+\s+(NEW|REDUCE|pulse|RELOAD)' "$log" | tail -60
  fi
done
exit $failed
