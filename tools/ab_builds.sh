#!/usr/bin/env bash
# A/B of two builds on one GPU machine, for kernel changes that no tuning value switches: builds
# a base source tree and this working tree side by side, then times ranking rows with each build
# in turn, ROUNDS times, so that both builds' numbers come from one card in one run (timings of
# one build move by up to ~10% between machines of a kind; repeats within a run by ~1%). Prints
# the comparison (tools/ranking_table.py --base) last; JSON and logs under $OUT.
#
# Usage, on the GPU machine: bash tools/ab_builds.sh BASE_DIR ROWS [bench_small_seq.py args]
#   BASE_DIR  the base revision's sources, made beforehand on a machine with the git history:
#               mkdir -p build/ab_base && git archive REV | tar -x -C build/ab_base
#             (build/ is ignored: name build/ab_base in the device call's carry)
#   ROWS      ranking rows, comma-separated (u4096_c128_kv256f_hkv2_d128,...)
#   ROUNDS    environment, default 2: base then new, this many times
# Default bench arguments: --no-anchors --fwd-only (add --ab NAME=VALUE etc. as needed;
# e.g. "--no-anchors" alone to time forward+backward too).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BASE=$(cd "$1" && pwd)
ROWS=$2
shift 2
BENCH_ARGS=("$@")
[ ${#BENCH_ARGS[@]} -eq 0 ] && BENCH_ARGS=(--no-anchors --fwd-only)
OUT=${OUT:-build/ab_builds}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-8}

build() {  # $1 source tree, $2 log name
  (cd "$1" && rm -rf build/cuda_src build/gen build/temp* rocm_attn/_C*.so &&
    python3 setup.py build_ext --inplace > "$OUT/$2.log" 2>&1)
}
build "$BASE" build_base & base_pid=$!
build "$ROOT" build_new & new_pid=$!
wait $base_pid; base_rc=$?
wait $new_pid; new_rc=$?
echo "builds: base rc=$base_rc, new rc=$new_rc"
if [ $base_rc -ne 0 ] || [ $new_rc -ne 0 ]; then
  tail -20 "$OUT/build_base.log" "$OUT/build_new.log"
  exit 1
fi

base_json=(); new_json=()
for round in $(seq "${ROUNDS:-2}"); do
  for which in base new; do
    tree=$ROOT; [ $which = base ] && tree=$BASE
    json="$OUT/${which}_$round.json"
    (cd "$tree" && PYTHONPATH="$tree" python3 tools/bench_small_seq.py --ranking --no-progress \
      --cases "$ROWS" "${BENCH_ARGS[@]}" --json "$json" > "$OUT/${which}_$round.txt" 2>&1)
    rc=$?
    echo "$which round $round: rc=$rc"
    [ $rc -ne 0 ] && { tail -20 "$OUT/${which}_$round.txt"; exit 1; }
    if [ $which = base ]; then base_json+=("$json"); else new_json+=("$json"); fi
  done
done
python3 tools/ranking_table.py --base "${base_json[@]}" -- "${new_json[@]}"
