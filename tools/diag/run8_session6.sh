# Session 6 run 8: direct entry point of the small-seq forward; THD end-load change under test.
export PATH=/opt/torch/.venv/bin:$PATH PYTHONPATH=$PWD PYTHONUNBUFFERED=1
MAX_JOBS=16 bash tools/gpu_check.sh --no-bench --tests "tests/test_small_seq_gpu.py tests/test_thd_gpu.py -rf"
for i in 1 2; do python3 tools/bench_small_seq.py --cases h1_d128_kv4 2>&1 | tail -1; done
python3 tools/profile_small_seq_host.py --calls 1000 > $OUT/host_profile.log 2>&1; head -14 $OUT/host_profile.log
