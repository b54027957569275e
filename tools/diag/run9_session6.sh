# Session 6 run 9: C++ autograd of the small-seq forward (Autograd kernel) replaces the Python one.
export PATH=/opt/torch/.venv/bin:$PATH PYTHONPATH=$PWD PYTHONUNBUFFERED=1
MAX_JOBS=16 bash tools/gpu_check.sh --no-bench --tests "tests/test_small_seq_gpu.py tests/test_common_gpu.py tests/test_mma_layouts.py tests/test_nn.py -rf"
grep -E "^(FAILED|ERROR)" $OUT/pytest_gpu.log | head -20; grep -B5 -A25 "^____" $OUT/pytest_gpu.log | head -80
for i in 1 2 3; do python3 tools/bench_small_seq.py --cases h1_d128_kv4 2>&1 | tail -1; done
python3 tools/profile_small_seq_host.py --calls 1000 > $OUT/host_profile.log 2>&1; head -14 $OUT/host_profile.log
