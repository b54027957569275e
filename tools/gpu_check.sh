#!/usr/bin/env bash
# On a GPU machine: clean build of the extension, GPU tests, benchmarks -- in one call.
# Prints a short table last; writes logs and JSON under $OUT when set (else build/gpu_check).
# Usage: bash tools/gpu_check.sh [--no-bench] [--no-thd-bench] [--no-small-seq-bench] [--no-tests] [--no-build]
#          [--keep-build] [--bench-cases a,b] [--tests "pytest args"] [--memcheck "pytest args"]
#          [--cp "bench_cp args"]...
# --no-bench skips the single-GPU benchmarks (small-seq, THD), --no-thd-bench / --no-small-seq-bench one of
# them; the THD one is followed by tools/diag/launch_ceiling.cu (what a kernel that maps nothing reaches at
# the THD launch sizes, same run; NVIDIA only) where nvcc is there; each --cp adds one
# tools/bench_cp.py run with those arguments (after the tests); --memcheck runs those GPU tests
# again under compute-sanitizer's memcheck (after the tests, before the benchmarks) with torch's
# caching allocator off, so that every tensor is its own allocation and a read past a tensor is
# a read past an allocation (the tiled tests' float64 oracle then runs on the CPU,
# ROCM_ATTN_TEST_ORACLE_DEVICE, so the sanitizer instruments only what it checks); --no-build
# reuses the extension already in rocm_attn/ (a previous call's on a still warm machine, or one
# carried in); --keep-build writes the built extension, stripped of debug information, as parts
# of at most 15 MiB under $OUT (ext_part_*: what comes back from a device call is at most 16 MiB
# a file), so that later calls of the same source need not build again: here,
#   cat <files_at>/ext_part_* > rocm_attn/_C.cpython-312-x86_64-linux-gnu.so
# then name that path in the call's carry and pass --no-build.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-build/gpu_check}
mkdir -p "$OUT"
export MAX_JOBS=${MAX_JOBS:-16} PYTHONUNBUFFERED=1
BENCH=1; THD_BENCH=1; SMALL_BENCH=1; TESTS=1; BUILD=1; KEEP_BUILD=0; CASES=""; TEST_ARGS="tests"
CP_RUNS=()
MEMCHECK_ARGS=""
while [ $# -gt 0 ]; do
  case "$1" in
    --no-bench) BENCH=0 ;;
    --no-tests) TESTS=0 ;;
    --no-thd-bench) THD_BENCH=0 ;;
    --no-small-seq-bench) SMALL_BENCH=0 ;;
    --no-build) BUILD=0 ;;
    --keep-build) KEEP_BUILD=1 ;;
    --cp) CP_RUNS+=("$2"); shift ;;
    --tests) TEST_ARGS="$2"; shift ;;
    --memcheck) MEMCHECK_ARGS="$2"; shift ;;
    --bench-cases) CASES="--cases $2"; shift ;;
  esac
  shift
done

python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
nvcc --version | tail -1
t0=$(date +%s)
build_rc=0
if [ $BUILD -eq 1 ]; then
  rm -rf build/cuda_src build/gen build/temp* rocm_attn/_C*.so
  ROCM_ATTN_PTXAS_VERBOSE=1 python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1
  build_rc=$?
fi
t1=$(date +%s)
echo "build rc=$build_rc in $((t1 - t0)) s"
if [ $build_rc -ne 0 ]; then grep -E "error|Error" "$OUT/build.log" | head -40; tail -20 "$OUT/build.log"; exit 1; fi
grep -E "spill stores|Used [0-9]+ registers" "$OUT/build.log" 2>/dev/null | sort | uniq -c | sort -rn | head -5
if [ $KEEP_BUILD -eq 1 ]; then
  ext=$(ls rocm_attn/_C*.so)
  strip --strip-debug -o build/ext_stripped.so "$ext" && split -b 15M build/ext_stripped.so "$OUT/ext_part_"
  echo "kept $ext as $(ls "$OUT"/ext_part_* | wc -l) parts of $(stat -c %s build/ext_stripped.so) bytes"
fi

python3 -m rocm_attn selftest 2>&1 | tee "$OUT/selftest.log"
test_rc=0
if [ $TESTS -eq 1 ]; then
  python3 -m pytest -m gpu -q -x --timeout=600 $TEST_ARGS > "$OUT/pytest_gpu.log" 2>&1
  test_rc=$?
  grep -E "passed|failed|error" "$OUT/pytest_gpu.log" | tail -3
  [ $test_rc -ne 0 ] && grep -E "^(FAILED|ERROR)|Error|assert" "$OUT/pytest_gpu.log" | head -30
fi

if [ -n "$MEMCHECK_ARGS" ]; then
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 ROCM_ATTN_TEST_ORACLE_DEVICE=cpu \
    compute-sanitizer --tool memcheck --error-exitcode 86 \
    python3 -m pytest -m gpu -q -p no:cacheprovider $MEMCHECK_ARGS > "$OUT/memcheck.log" 2>&1
  memcheck_rc=$?
  echo "memcheck rc=$memcheck_rc (86: sanitizer errors)"
  grep -E "ERROR SUMMARY|passed|failed|Invalid|out of bounds" "$OUT/memcheck.log" | head -20
  [ $memcheck_rc -ne 0 ] && test_rc=$memcheck_rc
fi

if [ $BENCH -eq 1 ]; then
  if [ $SMALL_BENCH -eq 1 ]; then
    python3 tools/bench_small_seq.py --json "$OUT/bench_small_seq.json" $CASES > "$OUT/bench_small_seq.log" 2>&1
    echo "bench rc=$?"
    sed -n '/copy bandwidth/,$p' "$OUT/bench_small_seq.log"
  fi
  if [ $THD_BENCH -eq 1 ]; then
    python3 tools/bench_thd.py --json "$OUT/bench_thd.json" > "$OUT/bench_thd.log" 2>&1
    echo "bench_thd rc=$?"
    tail -48 "$OUT/bench_thd.log"
    if command -v nvcc >/dev/null; then
      mkdir -p build
      if nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 -o build/launch_ceiling \
          tools/diag/launch_ceiling.cu; then
        build/launch_ceiling "$OUT/launch_ceiling.json" > "$OUT/launch_ceiling.log" 2>&1
        echo "launch_ceiling rc=$?"
        cat "$OUT/launch_ceiling.log"
      else
        echo "launch_ceiling: nvcc failed"
      fi
    fi
  fi
fi
i=0
for cp_args in ${CP_RUNS[@]+"${CP_RUNS[@]}"}; do
  i=$((i + 1))
  timeout "${CP_TIMEOUT:-300}" python3 tools/bench_cp.py --no-progress --json "$OUT/bench_cp_$i.json" $cp_args \
    > "$OUT/bench_cp_$i.log" 2>&1
  echo "bench_cp $i ($cp_args) rc=$?"
  sed -n '/ x[0-9]  /,$p' "$OUT/bench_cp_$i.log"
done
echo "gpu_check: build $((t1 - t0)) s, build_rc=$build_rc tests_rc=$test_rc"
exit $test_rc
