#!/usr/bin/env bash
# A/B of two builds on one GPU machine, for kernel changes that no tuning value switches: builds
# a base source tree and this working tree side by side, then times ranking rows with each build
# in turn, ROUNDS times, so that both builds' numbers come from one card in one run (timings of
# one build move by up to ~10% between machines of a kind; repeats within a run by ~1%). Prints
# the comparison (tools/ranking_table.py --base) last and into $OUT/ab.txt; JSON and logs under
# LOG_DIR (default $OUT).
#
# Usage, on the GPU machine: bash tools/ab_builds.sh BASE_DIR ROWS [bench_small_seq.py args]
#   BASE_DIR  the base revision's sources, made beforehand on a machine with the git history:
#               mkdir -p build/ab_base && git archive REV | tar -x -C build/ab_base
#             (build/ is ignored: name build/ab_base in the device call's carry)
#   ROWS      ranking rows, comma-separated (u4096_c128_kv256f_hkv2_d128,...)
#   ROUNDS    environment, default 2: base then new, this many times
#   PREBUILT  environment, default none: "base", "new" or "base,new", the trees whose extension
#             is already built and is not built again, e.g. one kept by an earlier device call
#             (tools/gpu_check.sh --keep-build: cat its ext_part_* into the tree's
#             rocm_attn/_C.cpython-312-x86_64-linux-gnu.so, beside a rocm_attn/_build_config.json
#             of {"backend": "cuda", "archs": ["sm_90a"], "kernels": []}, and carry both). A build
#             takes about three minutes of the device call; a change measured against the build
#             of the previous call needs only the new one.
#   LOG_DIR   environment, default $OUT: where the builds' logs and each round's JSON and text
#             go. A device call brings back at most 8 files of $OUT: point LOG_DIR elsewhere
#             (build/ab_logs) to get only the comparison, $OUT/ab.txt.
# Default bench arguments: --no-anchors --fwd-only (add --ab NAME=VALUE etc. as needed;
# e.g. "--no-anchors" alone to time forward+backward too).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BASE=$(cd "$1" && pwd) || { echo "no base tree at $1"; exit 2; }
ROWS=$2
shift 2
BENCH_ARGS=("$@")
[ ${#BENCH_ARGS[@]} -eq 0 ] && BENCH_ARGS=(--no-anchors --fwd-only)
OUT=${OUT:-build/ab_builds}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOGS=${LOG_DIR:-$OUT}
mkdir -p "$LOGS"
LOGS=$(cd "$LOGS" && pwd)
PREBUILT=${PREBUILT:-}
PREBUILT=${PREBUILT// /}  # "base, new" as "base,new"
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-8}

build() {  # $1 source tree, $2 base or new
  if [[ ",$PREBUILT," == *",$2,"* ]]; then
    ls "$1"/rocm_attn/_C*.so > /dev/null 2>&1 || { echo "$2: PREBUILT but no extension in $1" \
      > "$LOGS/build_$2.log"; return 1; }
    echo "$2: prebuilt extension, not built" > "$LOGS/build_$2.log"
    return 0
  fi
  (cd "$1" && rm -rf build/cuda_src build/gen build/temp* rocm_attn/_C*.so &&
    python3 setup.py build_ext --inplace > "$LOGS/build_$2.log" 2>&1)
}
build "$BASE" base & base_pid=$!
build "$ROOT" new & new_pid=$!
wait $base_pid; base_rc=$?
wait $new_pid; new_rc=$?
echo "builds: base rc=$base_rc, new rc=$new_rc (prebuilt: ${PREBUILT:-none})"
if [ $base_rc -ne 0 ] || [ $new_rc -ne 0 ]; then
  tail -n 20 "$LOGS/build_base.log" "$LOGS/build_new.log"
  exit 1
fi

base_json=(); new_json=()
for round in $(seq "${ROUNDS:-2}"); do
  for which in base new; do
    tree=$ROOT; [ $which = base ] && tree=$BASE
    json="$LOGS/${which}_$round.json"
    (cd "$tree" && PYTHONPATH="$tree" python3 tools/bench_small_seq.py --ranking --no-progress \
      --cases "$ROWS" "${BENCH_ARGS[@]}" --json "$json" > "$LOGS/${which}_$round.txt" 2>&1)
    rc=$?
    echo "$which round $round: rc=$rc"
    [ $rc -ne 0 ] && { tail -n 20 "$LOGS/${which}_$round.txt"; exit 1; }
    if [ $which = base ]; then base_json+=("$json"); else new_json+=("$json"); fi
  done
done
python3 tools/ranking_table.py --base "${base_json[@]}" -- "${new_json[@]}" | tee "$OUT/ab.txt"
