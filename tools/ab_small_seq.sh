#!/usr/bin/env bash
# Quick A/B of small-seq launch settings on a GPU: one build, then the benchmark (kernels only,
# no anchors) once per value of ROCM_ATTN_SMALL_SEQ_GRID (or of the variable named by AB_VAR,
# e.g. AB_VAR=ROCM_ATTN_SMALL_SEQ_MMA) given on the command line.
# Usage: [AB_VAR=NAME] bash tools/ab_small_seq.sh "0 1 2 4" [cases]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-build/ab}
mkdir -p "$OUT"
export MAX_JOBS=${MAX_JOBS:-16} PYTHONUNBUFFERED=1
VAR=${AB_VAR:-ROCM_ATTN_SMALL_SEQ_GRID}
CASES=${2:-h8_d128_kv16,h8_d128_kv2-16,h1_d128_kv4,gqa_h8_hkv2_d128_kv16,h8_d64_kv16,h2_d512_kv16}
if [ ! -e rocm_attn/_C*.so ] 2>/dev/null || [ "${REBUILD:-1}" = 1 ]; then
  python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
fi
for g in $1; do
  echo "== $VAR=$g"
  env "$VAR=$g" python3 tools/bench_small_seq.py --no-anchors --cases "$CASES" \
    --json "$OUT/ab_${VAR}_$g.json" 2>&1 | tail -$(( $(echo "$CASES" | tr ',' '\n' | wc -l) + 1 ))
done
