# Session 6 run 14: merge/grad units in flight per lane (kMergeUnits) 2 (main) vs 4 vs 8, THD bench.
export PATH=/opt/torch/.venv/bin:$PATH PYTHONUNBUFFERED=1 MAX_JOBS=16
ROOT=$PWD
for t in . exp_u4 exp_u8; do
  cd $ROOT/$t && rm -rf build rocm_attn/_C*.so && python3 setup.py build_ext --inplace > $OUT/build_$(basename $t).log 2>&1
  echo "== $t build rc=$?"; grep -A1 "merge_kernel\|grad_kernel" $OUT/build_$(basename $t).log | grep Used | sort | uniq -c | head -4
  PYTHONPATH=$ROOT/$t python3 tools/bench_thd.py --no-progress --cases b16_s4096_cp2,b16_s4096_cp4,b16_s4096_cp8,var64_cp4 2>&1 | grep -E "merge|correction"
done
