# Session 6 run 7: current build (THD bench, small-seq h1 x3, host profile), then the THD kernels
# of 1487d68 built in a second tree for the var64 grad_correction A/B.
export PATH=/opt/torch/.venv/bin:$PATH PYTHONPATH=$PWD PYTHONUNBUFFERED=1
MAX_JOBS=16 bash tools/gpu_check.sh --no-tests --bench-cases h1_d128_kv4
for i in 1 2; do python3 tools/bench_small_seq.py --cases h1_d128_kv4 2>&1 | tail -1; done
python3 tools/profile_small_seq_host.py --calls 1000 > $OUT/host_profile.log 2>&1; head -14 $OUT/host_profile.log
ROOT=$PWD
cd old1487 && (MAX_JOBS=16 python3 setup.py build_ext --inplace > $OUT/old_build.log 2>&1; echo old build rc=$?)
PYTHONPATH=$ROOT/old1487 python3 tools/bench_thd.py --no-progress --cases var64_cp4,b16_s4096_cp8 2>&1 | grep -E "grad|merge_sec|partition|read_half " | sed 's/^/OLD /'
